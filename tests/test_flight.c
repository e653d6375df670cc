/* test_flight.c - singleflight and per-key locks.
 *
 * No cr_assert inside task bodies (see testutil.h).
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "testutil.h"
#include "fault.h"
#include "htab.h"

#define T(suite, name) \
    Test(suite, name, .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 20.)

static const ferry_task_opts small_stack = { .name = "caller", .stack_size = FERRY_STACK_MIN };

static ferry_task *spawn(ferry_task_fn fn, void *arg)
{
    return tu_spawn_opts(fn, arg, &small_stack);
}

/* ---- Singleflight --------------------------------------------------- */

static ferry_flight g_f;
static ferry_event g_go;
static int g_calls;
static int g_fail_with;        /* fn returns this when non-zero */

/* The shared work: waits for `go`, then writes 7 * key digit. */
static int fetch(void *arg, void *out, size_t size)
{
    const char *key = arg;
    int rc;

    g_calls++;
    rc = ferry_event_wait(&g_go);
    if (rc)
        return rc;
    if (g_fail_with)
        return g_fail_with;
    *(int *)out = 7 * (key[1] - '0');
    return 0;
}

static const char *const keys10[10] = { "k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7", "k8", "k9" };

struct caller {
    const char *key;
    int         rc;
    int         out;
};

static int caller_task(void *arg)
{
    struct caller *c = arg;

    c->out = -1;
    c->rc = ferry_flight_do(&g_f, c->key, strlen(c->key), fetch, (void *)c->key,
                            &c->out, sizeof c->out);
    return 0;
}

#define NCALLERS 10000
static struct caller g_callers[NCALLERS];
static ferry_task *g_tasks[NCALLERS];

static int many_main(void *arg)
{
    int n = *(int *)arg;

    for (int i = 0; i < n; i++) {
        g_callers[i].key = keys10[i % 10];
        g_tasks[i] = spawn(caller_task, &g_callers[i]);
        if (g_tasks[i] == NULL)
            return -ENOMEM;
    }
    tu_settle();
    ferry_event_set(&g_go);
    for (int i = 0; i < n; i++)
        tu_join(g_tasks[i]);
    return 0;
}

T(flight, ten_thousand_callers_on_ten_keys_make_ten_calls)
{
    int n = NCALLERS;

    g_calls = 0;
    ferry_event_init(&g_go);
    ferry_flight_init(&g_f);
    cr_assert_eq(tu_run(many_main, &n), 0);
    cr_assert_eq(g_calls, 10);
    for (int i = 0; i < n; i++) {
        cr_assert_eq(g_callers[i].rc, 0);
        cr_assert_eq(g_callers[i].out, 7 * (i % 10), "caller %d got %d", i, g_callers[i].out);
    }
    cr_assert_eq(ferry_flight_count(&g_f), 0);
    cr_assert_eq(ferry_flight_destroy(&g_f), 0);
}

static int error_main(void *arg)
{
    int n = 30;

    return many_main(&n);
}

T(flight, leader_error_reaches_every_waiter)
{
    g_calls = 0;
    g_fail_with = -EIO;
    ferry_event_init(&g_go);
    ferry_flight_init(&g_f);
    cr_assert_eq(tu_run(error_main, NULL), 0);
    g_fail_with = 0;
    cr_assert_eq(g_calls, 10);
    for (int i = 0; i < 30; i++) {
        cr_assert_eq(g_callers[i].rc, -EIO);
        cr_assert_eq(g_callers[i].out, -1, "a failed call must not write `out`");
    }
    cr_assert_eq(ferry_flight_count(&g_f), 0);
    /* The next call for a key runs the function again. */
    g_calls = 0;
    ferry_event_init(&g_go);
    cr_assert_eq(tu_run(error_main, NULL), 0);
    cr_assert_eq(g_calls, 10);
    cr_assert_eq(g_callers[13].rc, 0);
    cr_assert_eq(g_callers[13].out, 21);
    cr_assert_eq(ferry_flight_destroy(&g_f), 0);
}

static int handover_main(void *arg)
{
    int *r = arg;
    ferry_task *t[3];

    for (int i = 0; i < 3; i++) {
        g_callers[i].key = "k5";
        t[i] = spawn(caller_task, &g_callers[i]);
    }
    tu_settle();
    r[0] = g_calls;                   /* 1: the leader */
    ferry_task_cancel(t[0]);          /* cancel the leader */
    tu_settle();
    r[1] = g_calls;                   /* 2: a waiter took over */
    r[2] = (int)ferry_flight_count(&g_f);
    ferry_event_set(&g_go);
    for (int i = 0; i < 3; i++)
        tu_join(t[i]);
    return 0;
}

T(flight, leader_cancellation_hands_over_to_a_waiter)
{
    int r[3];

    g_calls = 0;
    ferry_event_init(&g_go);
    ferry_flight_init(&g_f);
    cr_assert_eq(tu_run(handover_main, r), 0);
    cr_assert_eq(r[0], 1);
    cr_assert_eq(r[1], 2);
    cr_assert_eq(r[2], 1);
    cr_assert_eq(g_callers[0].rc, -ECANCELED);
    cr_assert_eq(g_callers[1].rc, 0, "the waiters are not cancelled with the leader");
    cr_assert_eq(g_callers[1].out, 35);
    cr_assert_eq(g_callers[2].rc, 0);
    cr_assert_eq(g_callers[2].out, 35);
    cr_assert_eq(g_calls, 2);
    cr_assert_eq(ferry_flight_count(&g_f), 0);
    cr_assert_eq(ferry_flight_destroy(&g_f), 0);
}

/* The leader, once its fn was cancelled, cancels the waiter it handed the
 * lead to: that waiter has been granted but has not run. */
static ferry_task *g_next_leader;

static int leader_then_cancel_next(void *arg)
{
    caller_task(arg);
    ferry_task_cancel(g_next_leader);
    return 0;
}

static int lead_cancel_main(void *arg)
{
    ferry_task *t[3];

    for (int i = 0; i < 3; i++)
        g_callers[i].key = "k4";
    t[0] = spawn(leader_then_cancel_next, &g_callers[0]);
    tu_settle();
    t[1] = g_next_leader = spawn(caller_task, &g_callers[1]);
    t[2] = spawn(caller_task, &g_callers[2]);
    tu_settle();
    ferry_task_cancel(t[0]);
    tu_settle();
    ferry_event_set(&g_go);
    for (int i = 0; i < 3; i++)
        tu_join(t[i]);
    return 0;
}

T(flight, lead_handed_to_a_cancelled_waiter_passes_on)
{
    g_calls = 0;
    ferry_event_init(&g_go);
    ferry_flight_init(&g_f);
    cr_assert_eq(tu_run(lead_cancel_main, NULL), 0);
    cr_assert_eq(g_callers[0].rc, -ECANCELED);
    cr_assert_eq(g_callers[1].rc, -ECANCELED);
    cr_assert_eq(g_callers[1].out, -1);
    cr_assert_eq(g_callers[2].rc, 0);
    cr_assert_eq(g_callers[2].out, 28);
    cr_assert_eq(g_calls, 2, "the cancelled second leader must not have run fn");
    cr_assert_eq(ferry_flight_count(&g_f), 0);
    cr_assert_eq(ferry_flight_destroy(&g_f), 0);
}

static int lone_leader_cancel_main(void *arg)
{
    ferry_task *t;

    g_callers[0].key = "k1";
    t = spawn(caller_task, &g_callers[0]);
    tu_settle();
    ferry_task_cancel(t);
    tu_join(t);
    return (int)ferry_flight_count(&g_f);
}

T(flight, cancelled_leader_without_waiters_removes_the_call)
{
    g_calls = 0;
    ferry_event_init(&g_go);
    ferry_flight_init(&g_f);
    cr_assert_eq(tu_run(lone_leader_cancel_main, NULL), 0);
    cr_assert_eq(g_callers[0].rc, -ECANCELED);
    cr_assert_eq(ferry_flight_destroy(&g_f), 0);
}

static int deadline_caller(void *arg)
{
    ferry_scope s;

    ferry_scope_enter(&s, ferry_now() + tu_ms(10), 0);
    caller_task(arg);
    ferry_scope_exit(&s);
    return 0;
}

static int waiter_leaves_main(void *arg)
{
    ferry_task *t[3];

    for (int i = 0; i < 3; i++)
        g_callers[i].key = "k3";
    t[0] = spawn(caller_task, &g_callers[0]);
    tu_settle();
    t[1] = spawn(deadline_caller, &g_callers[1]);   /* a waiter that times out */
    t[2] = spawn(caller_task, &g_callers[2]);
    tu_settle();
    ferry_task_cancel(t[2]);                        /* a waiter cancelled */
    tu_join(t[1]);
    tu_join(t[2]);
    ferry_event_set(&g_go);
    tu_join(t[0]);
    return 0;
}

T(flight, waiter_leaving_does_not_stop_the_call)
{
    g_calls = 0;
    ferry_event_init(&g_go);
    ferry_flight_init(&g_f);
    cr_assert_eq(tu_run(waiter_leaves_main, NULL), 0);
    cr_assert_eq(g_callers[1].rc, -ETIMEDOUT);
    cr_assert_eq(g_callers[1].out, -1);
    cr_assert_eq(g_callers[2].rc, -ECANCELED);
    cr_assert_eq(g_callers[0].rc, 0);
    cr_assert_eq(g_callers[0].out, 21);
    cr_assert_eq(g_calls, 1);
    cr_assert_eq(ferry_flight_destroy(&g_f), 0);
}

static int leader_deadline_main(void *arg)
{
    ferry_task *t[2];

    g_callers[0].key = g_callers[1].key = "k2";
    t[0] = spawn(deadline_caller, &g_callers[0]);   /* leader with a deadline */
    tu_settle();
    t[1] = spawn(caller_task, &g_callers[1]);
    ferry_sleep(tu_ms(30));
    ferry_event_set(&g_go);
    tu_join(t[0]);
    tu_join(t[1]);
    return 0;
}

T(flight, leader_deadline_hands_over)
{
    g_calls = 0;
    ferry_event_init(&g_go);
    ferry_flight_init(&g_f);
    cr_assert_eq(tu_run(leader_deadline_main, NULL), 0);
    cr_assert_eq(g_callers[0].rc, -ETIMEDOUT);
    cr_assert_eq(g_callers[1].rc, 0);
    cr_assert_eq(g_callers[1].out, 14);
    cr_assert_eq(g_calls, 2);
    cr_assert_eq(ferry_flight_destroy(&g_f), 0);
}

static int g_inner_rc;

static int recursive_fn(void *arg, void *out, size_t size)
{
    g_inner_rc = ferry_flight_do(&g_f, "r", 1, recursive_fn, NULL, NULL, 0);
    return 5;
}

static int plain_fn(void *arg, void *out, size_t size)
{
    if (size)
        memset(out, 0xab, size);
    return ferry_event_wait(&g_go);
}

static int mismatch_caller(void *arg)
{
    long big;
    return ferry_flight_do(&g_f, "m", 1, plain_fn, NULL, &big, sizeof big);
}

static int flight_errors_main(void *arg)
{
    int *r = arg, small;
    ferry_task *lead;

    r[0] = ferry_flight_do(&g_f, "r", 1, recursive_fn, NULL, NULL, 0);
    r[1] = ferry_flight_do(NULL, "x", 1, plain_fn, NULL, NULL, 0);
    r[2] = ferry_flight_do(&g_f, NULL, 1, plain_fn, NULL, NULL, 0);
    r[3] = ferry_flight_do(&g_f, "x", 1, NULL, NULL, NULL, 0);
    r[4] = ferry_flight_do(&g_f, "x", 1, plain_fn, NULL, NULL, 4);
    lead = spawn(mismatch_caller, NULL);
    tu_settle();
    r[5] = ferry_flight_do(&g_f, "m", 1, plain_fn, NULL, &small, sizeof small);
    r[6] = ferry_flight_destroy(&g_f);              /* in flight: -EBUSY */
    ferry_event_set(&g_go);
    r[7] = tu_join(lead);
    /* The empty key is a key. */
    r[8] = ferry_flight_do(&g_f, NULL, 0, plain_fn, NULL, &small, sizeof small);
    return 0;
}

T(flight, errors)
{
    int r[9];

    ferry_event_init(&g_go);
    ferry_flight_init(&g_f);
    cr_assert_eq(tu_run(flight_errors_main, r), 0);
    cr_assert_eq(g_inner_rc, -EDEADLK);
    cr_assert_eq(r[0], 5);
    cr_assert_eq(r[1], -EINVAL);
    cr_assert_eq(r[2], -EINVAL);
    cr_assert_eq(r[3], -EINVAL);
    cr_assert_eq(r[4], -EINVAL);
    cr_assert_eq(r[5], -EINVAL);
    cr_assert_eq(r[6], -EBUSY);
    cr_assert_eq(r[7], 0);
    cr_assert_eq(r[8], 0);
    cr_assert_eq(ferry_flight_destroy(&g_f), 0);
}

static int quick_fn(void *arg, void *out, size_t size)
{
    g_calls++;
    *(int *)out = (int)(intptr_t)arg;
    return 0;
}

static int distinct_caller(void *arg)
{
    char key[32];
    int out = -1, i = (int)(intptr_t)arg;

    snprintf(key, sizeof key, "burst-%d", i);
    if (ferry_flight_do(&g_f, key, strlen(key), fetch, key, &out, sizeof out) != 0)
        return 1;
    return 0;
}

static int distinct_main(void *arg)
{
    int n = *(int *)arg, bad = 0;
    char key[32];

    /* Sequential distinct keys. */
    for (int i = 0; i < n; i++) {
        int out = -1;
        snprintf(key, sizeof key, "key-%d", i);
        if (ferry_flight_do(&g_f, key, strlen(key), quick_fn, (void *)(intptr_t)i,
                            &out, sizeof out) != 0 || out != i)
            bad++;
    }
    /* A burst of distinct keys in flight at once grows the table. */
    for (int i = 0; i < 2000; i++)
        g_tasks[i] = spawn(distinct_caller, (void *)(intptr_t)i);
    tu_settle();
    if (ferry_flight_count(&g_f) != 2000)
        bad += 1000000;
    ferry_event_set(&g_go);
    for (int i = 0; i < 2000; i++)
        bad += tu_join(g_tasks[i]) != 0;
    return bad;
}

T(flight, memory_returns_to_baseline_after_distinct_keys)
{
    int n = (int)(100000 * tu_stress_scale());

    g_calls = 0;
    ferry_event_init(&g_go);
    ferry_flight_init(&g_f);
    cr_assert_eq(tu_run(distinct_main, &n), 0);
    cr_assert_eq(g_calls, n + 2000);
    cr_assert_eq(ferry_flight_count(&g_f), 0);
    cr_assert_leq(g_f.calls.cap, HTAB_MIN_SLOTS, "the table did not shrink back");
    cr_assert_eq(ferry_flight_destroy(&g_f), 0);
    cr_assert_eq(g_f.calls.cap, 0);
}

/* ---- NULL and invalid arguments -------------------------------------- */

static int nulls_rc[8], nnulls, nbools;
static bool nulls_bool[8];

static int flight_nulls_task(void *arg)
{
    ferry_flight f = FERRY_FLIGHT_INIT;
    int i = 0, b = 0;

    (void)arg;
    nulls_rc[i++] = ferry_flight_init(NULL);
    nulls_rc[i++] = ferry_flight_destroy(NULL);
    nulls_bool[b++] = ferry_flight_count(NULL) != 0;
    nnulls = i;
    /* Nothing was bound by the refusals. */
    nulls_bool[b++] = f.loop != NULL;
    nbools = b;
    return 0;
}

T(flight, refuses_null_arguments_and_binds_nothing)
{
    cr_assert_eq(tu_run(flight_nulls_task, NULL), 0);
    cr_assert_eq(nnulls, 2);
    cr_assert_eq(nbools, 2);
    tu_assert_einval_and_false(nulls_rc, nnulls, nulls_bool, nbools);
}

static ferry_flight pair_f = FERRY_FLIGHT_INIT;
static int flight_rc[2] = { 1, 1 }, pair_calls;

static int yield_then(void *arg, void *out, size_t out_size)
{
    (void)out; (void)out_size;
    pair_calls++;
    ferry_yield();                 /* the second caller joins meanwhile */
    return (int)(intptr_t)arg;
}

struct pair_caller {
    int idx;      /* where its result goes */
    int status;   /* what fn returns if it leads */
};

static int flight_caller(void *arg)
{
    struct pair_caller *c = arg;

    flight_rc[c->idx] = ferry_flight_do(&pair_f, "key", 3, yield_then,
                                        (void *)(intptr_t)c->status, NULL, 0);
    return 0;
}

/* Two callers of one key; the leader's fn returns `status`. */
static void flight_pair(int status)
{
    struct pair_caller c[2] = { { 0, status }, { 1, status } };
    ferry_task *t[2];

    pair_calls = 0;
    flight_rc[0] = flight_rc[1] = 1;
    for (int i = 0; i < 2; i++)
        cr_assert_eq(ferry_task_spawn(&t[i], tu_loop, flight_caller, &c[i], NULL), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(ferry_task_try_join(t[i], NULL), 0);
}

T(flight, without_a_result_buffer_shares_the_status)
{
    flight_pair(0);
    cr_assert_eq(pair_calls, 1);
    cr_assert_eq(flight_rc[0], 0);
    cr_assert_eq(flight_rc[1], 0);
    cr_assert_eq(ferry_flight_count(&pair_f), 0);
    cr_assert_eq(ferry_flight_destroy(&pair_f), 0);
}

T(flight, leader_timing_out_on_its_own_fails_the_waiters_too)
{
    /* fn returns -ETIMEDOUT although its task was neither cancelled nor
     * past a deadline: the waiter is not handed the lead, it shares the
     * failure. */
    flight_pair(-ETIMEDOUT);
    cr_assert_eq(pair_calls, 1);
    cr_assert_eq(flight_rc[0], -ETIMEDOUT);
    cr_assert_eq(flight_rc[1], -ETIMEDOUT);
    cr_assert_eq(ferry_flight_count(&pair_f), 0);
    cr_assert_eq(ferry_flight_destroy(&pair_f), 0);
}

/* ---- Per-key locks -------------------------------------------------- */

static ferry_keylock g_kl;
static int g_rc[16];
static int g_order[16], g_norder;

struct kl_arg {
    int         id;
    const char *key;
};

static int kl_worker(void *arg)
{
    struct kl_arg *a = arg;
    int rc = ferry_keylock_acquire(&g_kl, a->key, strlen(a->key));

    g_rc[a->id] = rc;
    if (rc)
        return rc;
    g_order[g_norder++] = a->id;
    ferry_yield();
    ferry_yield();
    return ferry_keylock_release(&g_kl, a->key, strlen(a->key));
}

static int kl_basic_main(void *arg)
{
    int *r = arg;

    r[0] = ferry_keylock_acquire(&g_kl, "usd", 3);
    r[1] = ferry_keylock_acquire(&g_kl, "eur", 3);   /* other key: independent */
    r[2] = ferry_keylock_acquire(&g_kl, "usd", 3);   /* -EDEADLK */
    r[3] = ferry_keylock_try_acquire(&g_kl, "usd", 3);
    r[4] = ferry_keylock_locked(&g_kl, "usd", 3);
    r[5] = (int)ferry_keylock_count(&g_kl);
    r[6] = ferry_keylock_release(&g_kl, "gbp", 3);   /* unknown: -EPERM */
    r[7] = ferry_keylock_destroy(&g_kl);             /* held: -EBUSY */
    r[8] = ferry_keylock_release(&g_kl, "usd", 3);
    r[9] = ferry_keylock_release(&g_kl, "usd", 3);   /* not held: -EPERM */
    r[10] = ferry_keylock_release(&g_kl, "eur", 3);
    r[11] = (int)ferry_keylock_count(&g_kl);
    r[12] = ferry_keylock_locked(&g_kl, "usd", 3);
    r[13] = ferry_keylock_acquire(&g_kl, NULL, 2);
    r[14] = ferry_keylock_try_acquire(&g_kl, "", 0);
    r[15] = ferry_keylock_release(&g_kl, NULL, 0);
    return 0;
}

T(keylock, basic_independence_and_misuse)
{
    int r[16];

    ferry_keylock_init(&g_kl);
    cr_assert_eq(tu_run(kl_basic_main, r), 0);
    cr_assert_eq(r[0], 0);
    cr_assert_eq(r[1], 0);
    cr_assert_eq(r[2], -EDEADLK);
    cr_assert_eq(r[3], -EDEADLK);
    cr_assert_eq(r[4], true);
    cr_assert_eq(r[5], 2);
    cr_assert_eq(r[6], -EPERM);
    cr_assert_eq(r[7], -EBUSY);
    cr_assert_eq(r[8], 0);
    cr_assert_eq(r[9], -EPERM);
    cr_assert_eq(r[10], 0);
    cr_assert_eq(r[11], 0);
    cr_assert_eq(r[12], false);
    cr_assert_eq(r[13], -EINVAL);
    cr_assert_eq(r[14], 0);
    cr_assert_eq(r[15], 0);
    cr_assert_eq(ferry_keylock_count(&g_kl), 0);
    cr_assert_eq(ferry_keylock_destroy(&g_kl), 0);
}

static int kl_handoff_main(void *arg)
{
    struct kl_arg a[5];
    ferry_task *t[5];

    for (int i = 1; i <= 4; i++)
        a[i] = (struct kl_arg){ .id = i, .key = "rate" };
    ferry_keylock_acquire(&g_kl, "rate", 4);
    for (int i = 1; i <= 4; i++)
        t[i] = spawn(kl_worker, &a[i]);
    tu_settle();
    ferry_task_cancel(t[3]);                 /* queued */
    tu_settle();
    ferry_keylock_release(&g_kl, "rate", 4); /* handed to 1 ... */
    ferry_task_cancel(t[1]);                 /* ... cancelled before running */
    for (int i = 1; i <= 4; i++)
        tu_join(t[i]);
    return (int)ferry_keylock_count(&g_kl);
}

T(keylock, handoff_survives_cancelled_waiters_and_frees_the_key)
{
    g_norder = 0;
    ferry_keylock_init(&g_kl);
    cr_assert_eq(tu_run(kl_handoff_main, NULL), 0);
    cr_assert_eq(g_rc[1], -ECANCELED);
    cr_assert_eq(g_rc[3], -ECANCELED);
    cr_assert_eq(g_rc[2], 0);
    cr_assert_eq(g_rc[4], 0);
    cr_assert_eq(g_norder, 2);
    cr_assert_eq(g_order[0], 2);
    cr_assert_eq(g_order[1], 4);
    cr_assert_eq(ferry_keylock_destroy(&g_kl), 0);
}

static int kl_die_holding(void *arg)
{
    return ferry_keylock_acquire(&g_kl, "k", 1);
}

/* 1 if the loop's dump lists a broken lock, 0 if not, -1 on error. */
static int dump_lists_broken(void)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    int found;

    if (f == NULL)
        return -1;
    ferry_loop_dump(ferry_loop_current(), f);
    fclose(f);
    found = buf && strstr(buf, "broken by task #") != NULL;
    free(buf);
    return found;
}

static int kl_broken_main(void *arg)
{
    int *r = arg;
    struct kl_arg a = { .id = 1, .key = "k" };
    ferry_task *h, *w;

    h = spawn(kl_die_holding, NULL);
    ferry_yield();
    w = spawn(kl_worker, &a);
    r[0] = tu_join(h);
    r[1] = tu_join(w);
    r[2] = ferry_keylock_acquire(&g_kl, "k", 1);
    r[3] = ferry_keylock_locked(&g_kl, "k", 1);
    r[4] = ferry_keylock_acquire(&g_kl, "other", 5);
    r[5] = ferry_keylock_destroy(&g_kl);             /* "other" held */
    r[6] = ferry_keylock_release(&g_kl, "other", 5);
    r[8] = dump_lists_broken();                      /* "k" */
    r[7] = ferry_keylock_destroy(&g_kl);             /* broken "k" is freed */
    r[9] = dump_lists_broken();                      /* and forgotten */
    return 0;
}

T(keylock, holder_ending_breaks_the_key)
{
    int r[10];

    ferry_keylock_init(&g_kl);
    cr_assert_eq(tu_run(kl_broken_main, r), 0);
    cr_assert_eq(r[0], 0);
    cr_assert_eq(r[1], -EOWNERDEAD);
    cr_assert_eq(r[2], -EOWNERDEAD);
    cr_assert_eq(r[3], true);
    cr_assert_eq(r[4], 0);
    cr_assert_eq(r[5], -EBUSY);
    cr_assert_eq(r[6], 0);
    cr_assert_eq(r[7], 0);
    cr_assert_eq(r[8], 1, "the dump lists the broken key's lock");
    cr_assert_eq(r[9], 0, "the dump still lists a destroyed keylock's lock");
    cr_assert_eq(ferry_keylock_count(&g_kl), 0);
}

#define KL_BATCH 1000

static int kl_million_main(void *arg)
{
    int n = *(int *)arg, bad = 0;
    size_t peak = 0;
    char key[32];

    for (int base = 0; base < n; base += KL_BATCH) {
        for (int i = base; i < base + KL_BATCH; i++) {
            int len = snprintf(key, sizeof key, "k%d", i);
            bad += ferry_keylock_acquire(&g_kl, key, (size_t)len) != 0;
        }
        if (ferry_keylock_count(&g_kl) > peak)
            peak = ferry_keylock_count(&g_kl);
        for (int i = base; i < base + KL_BATCH; i++) {
            int len = snprintf(key, sizeof key, "k%d", i);
            bad += ferry_keylock_release(&g_kl, key, (size_t)len) != 0;
        }
    }
    return bad ? bad : (int)peak;
}

T(keylock, memory_returns_to_baseline_after_a_million_keys)
{
    int n = (int)(1000000 * tu_stress_scale()) / KL_BATCH * KL_BATCH;

    ferry_keylock_init(&g_kl);
    cr_assert_eq(tu_run(kl_million_main, &n), KL_BATCH, "every batch held at once");
    cr_assert_eq(ferry_keylock_count(&g_kl), 0);
    cr_assert_leq(g_kl.keys.cap, HTAB_MIN_SLOTS, "the table did not shrink back");
    cr_assert_eq(ferry_keylock_destroy(&g_kl), 0);
    cr_assert_eq(g_kl.keys.cap, 0);
    cr_assert_eq(tu_leaks(), 0);
}

/* The seed's per-key cache: re-check under the key's lock. */
static int g_cache[3], g_cached[3], g_fetches;

static int get_rate(void *arg)
{
    int cur = (int)(intptr_t)arg % 3, rc;
    char key[2] = { (char)('a' + cur), 0 };

    if (g_cached[cur])
        return 0;
    rc = ferry_keylock_acquire(&g_kl, key, 1);
    if (rc)
        return rc;
    if (!g_cached[cur]) {
        g_fetches++;
        ferry_sleep(tu_ms(1));              /* fetch_rate() */
        g_cache[cur] = 100 + cur;
        g_cached[cur] = 1;
    }
    return ferry_keylock_release(&g_kl, key, 1);
}

static int cache_main(void *arg)
{
    ferry_task *t[30];
    int bad = 0;

    for (int i = 0; i < 30; i++)
        t[i] = spawn(get_rate, (void *)(intptr_t)i);
    for (int i = 0; i < 30; i++)
        bad += tu_join(t[i]) != 0;
    return bad;
}

T(keylock, per_key_cache_fetches_once_per_key)
{
    g_fetches = 0;
    memset(g_cached, 0, sizeof g_cached);
    ferry_keylock_init(&g_kl);
    cr_assert_eq(tu_run(cache_main, NULL), 0);
    cr_assert_eq(g_fetches, 3);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(g_cache[i], 100 + i);
    cr_assert_eq(ferry_keylock_count(&g_kl), 0);
    cr_assert_eq(ferry_keylock_destroy(&g_kl), 0);
}

static int keylock_nulls_task(void *arg)
{
    ferry_keylock kl = FERRY_KEYLOCK_INIT;
    int i = 0, b = 0;

    (void)arg;
    nulls_rc[i++] = ferry_keylock_init(NULL);
    nulls_rc[i++] = ferry_keylock_destroy(NULL);
    nulls_rc[i++] = ferry_keylock_acquire(NULL, "k", 1);
    nulls_rc[i++] = ferry_keylock_try_acquire(&kl, NULL, 1);
    nulls_rc[i++] = ferry_keylock_release(&kl, NULL, 1);
    nulls_bool[b++] = ferry_keylock_count(NULL) != 0;
    nulls_bool[b++] = ferry_keylock_locked(NULL, "k", 1);
    nulls_bool[b++] = ferry_keylock_locked(&kl, NULL, 1);
    nulls_bool[b++] = ferry_keylock_locked(&kl, "k", 1);   /* no such key */
    nulls_bool[b++] = ferry_keylock_locked(&kl, NULL, 0);  /* the empty key, not held */
    nnulls = i;
    /* Nothing was bound or allocated by the refusals. */
    nulls_bool[b++] = kl.loop != NULL || kl.keys.cap != 0;
    nbools = b;
    return 0;
}

T(keylock, refuses_null_arguments_and_binds_nothing)
{
    cr_assert_eq(tu_run(keylock_nulls_task, NULL), 0);
    cr_assert_eq(nnulls, 5);
    cr_assert_eq(nbools, 6);
    tu_assert_einval_and_false(nulls_rc, nnulls, nulls_bool, nbools);
}

static ferry_keylock thief_kl = FERRY_KEYLOCK_INIT;
static int kl_rc[4] = { 1, 1, 1, 1 };
static ferry_event kl_go;

static int key_holder(void *arg)
{
    (void)arg;
    ferry_keylock_acquire(&thief_kl, "k", 1);
    ferry_event_wait(&kl_go);
    return ferry_keylock_release(&thief_kl, "k", 1);
}

static int key_thief(void *arg)
{
    (void)arg;
    kl_rc[0] = ferry_keylock_release(&thief_kl, "k", 1);     /* held by another task */
    kl_rc[1] = ferry_keylock_release(&thief_kl, "nope", 4);  /* nobody's */
    kl_rc[2] = ferry_keylock_locked(&thief_kl, "k", 1);
    kl_rc[3] = (int)ferry_keylock_count(&thief_kl);
    return ferry_event_set(&kl_go);
}

T(keylock, release_by_a_task_that_does_not_hold_the_key_is_eperm)
{
    ferry_task *h, *t;
    int st = 1;

    cr_assert_eq(ferry_task_spawn(&h, tu_loop, key_holder, NULL, NULL), 0);
    cr_assert_eq(ferry_task_spawn(&t, tu_loop, key_thief, NULL, NULL), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(ferry_task_try_join(h, &st), 0);
    cr_assert_eq(st, 0, "the holder's release failed: %d", st);
    cr_assert_eq(ferry_task_try_join(t, NULL), 0);
    cr_assert_eq(kl_rc[0], -EPERM);
    cr_assert_eq(kl_rc[1], -EPERM);
    cr_assert_eq(kl_rc[2], 1);
    cr_assert_eq(kl_rc[3], 1, "a failed release made or dropped a key");
    cr_assert_eq(ferry_keylock_count(&thief_kl), 0);
    cr_assert_eq(ferry_keylock_destroy(&thief_kl), 0);
}

static int kl_nomem_rc[3] = { 1, 1, 1 };

static int keylock_nomem_task(void *arg)
{
    ferry_keylock k = FERRY_KEYLOCK_INIT;

    (void)arg;
    ferry__fault_arm(1, true);
    kl_nomem_rc[0] = ferry_keylock_try_acquire(&k, "k", 1);
    ferry__fault_reset();
    kl_nomem_rc[1] = (int)ferry_keylock_count(&k);
    kl_nomem_rc[2] = ferry_keylock_try_acquire(&k, "k", 1);
    ferry_keylock_release(&k, "k", 1);
    return ferry_keylock_destroy(&k);
}

T(keylock, try_acquire_without_memory_is_enomem_and_makes_no_key)
{
    cr_assert_eq(tu_run(keylock_nomem_task, NULL), 0);
    cr_assert_eq(kl_nomem_rc[0], -ENOMEM);
    cr_assert_eq(kl_nomem_rc[1], 0);
    cr_assert_eq(kl_nomem_rc[2], 0);
}

/* ---- Wrong thread, wrong loop --------------------------------------- */

static int bind_both(void *arg)
{
    int out;

    ferry_keylock_acquire(&g_kl, "held", 4);   /* stays held by main */
    return ferry_flight_do(&g_f, "x", 1, quick_fn, NULL, &out, sizeof out);
}

static int foreign_flight(int *r)
{
    int n = 0, out;

    r[n++] = ferry_flight_do(&g_f, "x", 1, quick_fn, NULL, &out, sizeof out);
    r[n++] = ferry_flight_destroy(&g_f);
    r[n++] = ferry_keylock_acquire(&g_kl, "x", 1);
    r[n++] = ferry_keylock_try_acquire(&g_kl, "x", 1);
    r[n++] = ferry_keylock_release(&g_kl, "held", 4);
    r[n++] = ferry_keylock_destroy(&g_kl);
    return n;
}

T(flight, other_thread_or_other_loop_gets_eperm)
{
    g_calls = 0;
    ferry_flight_init(&g_f);
    ferry_keylock_init(&g_kl);
    cr_assert_eq(tu_run(bind_both, NULL), 0);
    cr_assert_eq(g_calls, 1);
    tu_assert_eperm_elsewhere(foreign_flight);
    cr_assert_eq(g_calls, 1);
    /* "held" broke when main ended holding it; destroy frees it. */
    cr_assert(ferry_keylock_locked(&g_kl, "held", 4));
    cr_assert_eq(ferry_keylock_destroy(&g_kl), 0);
    cr_assert_eq(ferry_flight_destroy(&g_f), 0);
}

/* ---- Destroy once the bound loop is freed --------------------------- */

static int bind_both_and_wait(void *arg)
{
    int out;

    (void)arg;
    ferry_keylock_acquire(&g_kl, "held", 4);   /* breaks when the loop is freed */
    ferry_flight_do(&g_f, "x", 1, quick_fn, NULL, &out, sizeof out);
    return ferry_sleep(FERRY_NEVER);
}

static int g_rt[2];

static void *thread_destroy_flight(void *arg)
{
    (void)arg;
    g_rt[0] = ferry_flight_destroy(&g_f);
    g_rt[1] = ferry_keylock_destroy(&g_kl);
    return NULL;
}

T(flight, destroy_after_the_bound_loop_is_freed)
{
    ferry_loop *loop2;

    g_calls = 0;
    ferry_flight_init(&g_f);
    ferry_keylock_init(&g_kl);
    cr_assert_eq(ferry_loop_new(&loop2, NULL), 0);
    cr_assert_eq(ferry_task_spawn(NULL, loop2, bind_both_and_wait, NULL, NULL), 0);
    cr_assert_eq(ferry_loop_run(loop2, FERRY_RUN_ONCE), 0);
    cr_assert_eq(g_calls, 1);

    g_rt[0] = g_rt[1] = 1;
    tu_on_thread(thread_destroy_flight, NULL);
    cr_assert_eq(g_rt[0], -EPERM, "flight from a thread while the loop lives: %d", g_rt[0]);
    cr_assert_eq(g_rt[1], -EPERM, "keylock from a thread while the loop lives: %d", g_rt[1]);

    ferry_loop_free(loop2);
    cr_assert_eq(ferry_keylock_count(&g_kl), 1, "the broken key stays");
    cr_assert_eq(ferry_flight_destroy(&g_f), 0, "flight, this thread");
    ferry_flight_init(&g_f);
    g_rt[0] = g_rt[1] = 1;
    tu_on_thread(thread_destroy_flight, NULL);
    cr_assert_eq(g_rt[0], 0);
    cr_assert_eq(g_rt[1], 0, "keylock from a thread once the loop is freed: %d", g_rt[1]);
    cr_assert_eq(ferry_keylock_count(&g_kl), 0);
}
