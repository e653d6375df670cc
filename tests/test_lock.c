/* test_lock.c - ferry_lock (sync.h): FIFO hand-over without barging,
 * waiters cancelled while queued or after their grant, deadlines, misuse,
 * a lock broken by an owner that ended holding it, and how the log and
 * the dump name who broke it.
 *
 * No cr_assert inside task bodies: tasks record what they saw into
 * variables, and the test asserts on the main stack after tu_run().
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "testutil.h"

#define T(suite, name) \
    Test(suite, name, .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 10.)

static ferry_lock g_lock;
static struct tu_order g_order;
static int g_holders, g_max_holders;
static int g_rc[16];

/* Acquire, log, hold across a few switches, release. */
static int lock_worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    int rc = ferry_lock_acquire(&g_lock);

    g_rc[id] = rc;
    if (rc)
        return rc;
    tu_order_add(&g_order, id);
    if (++g_holders > g_max_holders)
        g_max_holders = g_holders;
    ferry_yield();
    ferry_yield();
    g_holders--;
    return ferry_lock_release(&g_lock);
}

static int lock_basic_main(void *arg)
{
    int *r = arg;

    r[0] = ferry_lock_locked(&g_lock);
    r[1] = ferry_lock_release(&g_lock);          /* unlocked: -EPERM */
    r[2] = ferry_lock_acquire(&g_lock);
    r[3] = ferry_lock_locked(&g_lock);
    r[4] = ferry_lock_acquire(&g_lock);          /* re-acquire: -EDEADLK */
    r[5] = ferry_lock_try_acquire(&g_lock);      /* -EDEADLK too */
    r[6] = ferry_lock_destroy(&g_lock);          /* held: -EBUSY */
    r[7] = ferry_lock_release(&g_lock);
    r[8] = ferry_lock_locked(&g_lock);
    r[9] = ferry_lock_try_acquire(&g_lock);
    r[10] = ferry_lock_release(&g_lock);
    r[11] = ferry_lock_destroy(&g_lock);
    return 0;
}

T(lock, basic_and_misuse_errors)
{
    int r[12];

    cr_assert_eq(ferry_lock_init(&g_lock), 0);
    cr_assert_eq(tu_run(lock_basic_main, r), 0);
    cr_assert_eq(r[0], false);
    cr_assert_eq(r[1], -EPERM);
    cr_assert_eq(r[2], 0);
    cr_assert_eq(r[3], true);
    cr_assert_eq(r[4], -EDEADLK);
    cr_assert_eq(r[5], -EDEADLK);
    cr_assert_eq(r[6], -EBUSY);
    cr_assert_eq(r[7], 0);
    cr_assert_eq(r[8], false);
    cr_assert_eq(r[9], 0);
    cr_assert_eq(r[10], 0);
    cr_assert_eq(r[11], 0);
    cr_assert_eq(ferry_lock_init(NULL), -EINVAL);
    cr_assert_eq(ferry_lock_acquire(NULL), -EINVAL);
    cr_assert_eq(ferry_lock_release(NULL), -EINVAL);
    cr_assert_eq(ferry_lock_destroy(NULL), -EINVAL);
}

static int release_other(void *arg)
{
    return ferry_lock_release(&g_lock);
}

static int lock_release_by_other_main(void *arg)
{
    int *r = arg;

    ferry_lock_acquire(&g_lock);
    *r = tu_join(tu_spawn(release_other, NULL));
    r[1] = ferry_lock_locked(&g_lock);
    ferry_lock_release(&g_lock);
    return 0;
}

T(lock, release_by_non_holder_is_eperm)
{
    int r[2];

    cr_assert_eq(tu_run(lock_release_by_other_main, r), 0);
    cr_assert_eq(r[0], -EPERM);
    cr_assert_eq(r[1], true, "a failed release must leave the lock held");
}

/* The seed's race: check, await, act.  Without the lock updates are lost. */
static int g_counter;

static int incr_unlocked(void *arg)
{
    int cur = g_counter;
    ferry_yield();
    g_counter = cur + 1;
    return 0;
}

static int incr_locked(void *arg)
{
    int rc = ferry_lock_acquire(&g_lock);
    if (rc)
        return rc;
    int cur = g_counter;
    ferry_yield();
    g_counter = cur + 1;
    return ferry_lock_release(&g_lock);
}

static int race_main(void *arg)
{
    ferry_task *t[20];
    int bad = 0;

    for (int i = 0; i < 20; i++)
        t[i] = tu_spawn((ferry_task_fn)arg, NULL);
    for (int i = 0; i < 20; i++)
        bad += tu_join(t[i]) != 0;
    return bad;
}

T(lock, check_await_act_loses_updates_without_lock_not_with_it)
{
    g_counter = 0;
    cr_assert_eq(tu_run(race_main, (void *)incr_unlocked), 0);
    cr_assert_lt(g_counter, 20, "without the lock some increments must be lost");
    g_counter = 0;
    cr_assert_eq(tu_run(race_main, (void *)incr_locked), 0);
    cr_assert_eq(g_counter, 20);
}

static int try_then_acquire(void *arg)
{
    int id = (int)(intptr_t)arg;

    g_rc[id + 8] = ferry_lock_try_acquire(&g_lock);
    return lock_worker(arg);
}

static int fifo_main(void *arg)
{
    ferry_task *t[5];

    ferry_lock_acquire(&g_lock);
    for (int i = 1; i <= 3; i++)
        t[i] = tu_spawn(lock_worker, (void *)(intptr_t)i);
    tu_settle();
    ferry_lock_release(&g_lock);
    /* The lock is handed to 1; a newcomer must not overtake 2 and 3. */
    t[4] = tu_spawn(try_then_acquire, (void *)(intptr_t)4);
    for (int i = 1; i <= 4; i++)
        tu_join(t[i]);
    return 0;
}

T(lock, fifo_handoff_no_barging)
{
    memset(&g_order, 0, sizeof g_order);
    g_max_holders = 0;
    cr_assert_eq(tu_run(fifo_main, NULL), 0);
    cr_assert_eq(g_rc[12], -EAGAIN, "try_acquire must not barge past waiters");
    cr_assert_eq(g_order.n, 4);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(g_order.who[i], i + 1);
    cr_assert_eq(g_max_holders, 1);
    cr_assert_not(ferry_lock_locked(&g_lock));
}

static int middle_cancel_main(void *arg)
{
    ferry_task *t[4];

    ferry_lock_acquire(&g_lock);
    for (int i = 1; i <= 3; i++)
        t[i] = tu_spawn(lock_worker, (void *)(intptr_t)i);
    tu_settle();
    ferry_task_cancel(t[2]);
    tu_settle();
    ferry_lock_release(&g_lock);
    for (int i = 1; i <= 3; i++)
        tu_join(t[i]);
    return 0;
}

T(lock, middle_waiter_cancelled_while_queued)
{
    memset(&g_order, 0, sizeof g_order);
    cr_assert_eq(tu_run(middle_cancel_main, NULL), 0);
    cr_assert_eq(g_rc[2], -ECANCELED);
    cr_assert_eq(g_order.n, 2);
    cr_assert_eq(g_order.who[0], 1);
    cr_assert_eq(g_order.who[1], 3);
    cr_assert_not(ferry_lock_locked(&g_lock));
}

static int granted_cancel_main(void *arg)
{
    ferry_task *t[4];

    ferry_lock_acquire(&g_lock);
    for (int i = 1; i <= 3; i++)
        t[i] = tu_spawn(lock_worker, (void *)(intptr_t)i);
    tu_settle();
    /* Release hands the lock to 1; cancel 1 before it runs. */
    ferry_lock_release(&g_lock);
    ferry_task_cancel(t[1]);
    for (int i = 1; i <= 3; i++)
        tu_join(t[i]);
    return 0;
}

T(lock, waiter_cancelled_after_grant_passes_it_on)
{
    memset(&g_order, 0, sizeof g_order);
    g_max_holders = 0;
    cr_assert_eq(tu_run(granted_cancel_main, NULL), 0);
    cr_assert_eq(g_rc[1], -ECANCELED);
    cr_assert_eq(g_rc[2], 0);
    cr_assert_eq(g_rc[3], 0);
    cr_assert_eq(g_order.n, 2);
    cr_assert_eq(g_order.who[0], 2);
    cr_assert_eq(g_order.who[1], 3);
    cr_assert_eq(g_max_holders, 1);
    cr_assert_not(ferry_lock_locked(&g_lock));
}

/* bpo-32734: cancel the first waiter and release in the same step. */
static int cancel_release_race_main(void *arg)
{
    ferry_task *t[4];

    ferry_lock_acquire(&g_lock);
    for (int i = 1; i <= 3; i++)
        t[i] = tu_spawn(lock_worker, (void *)(intptr_t)i);
    tu_settle();
    ferry_task_cancel(t[1]);
    ferry_lock_release(&g_lock);
    for (int i = 1; i <= 3; i++)
        tu_join(t[i]);
    return 0;
}

T(lock, cancel_then_release_in_one_step_grants_once)
{
    memset(&g_order, 0, sizeof g_order);
    g_max_holders = 0;
    cr_assert_eq(tu_run(cancel_release_race_main, NULL), 0);
    cr_assert_eq(g_rc[1], -ECANCELED);
    cr_assert_eq(g_max_holders, 1, "two tasks held the lock at once");
    cr_assert_eq(g_order.n, 2);
    cr_assert_eq(g_order.who[0], 2);
    cr_assert_eq(g_order.who[1], 3);
}

static int lock_with_deadline(void *arg)
{
    ferry_scope s;
    int id = (int)(intptr_t)arg;

    ferry_scope_enter(&s, ferry_now() + tu_ms(20), 0);
    g_rc[id] = ferry_lock_acquire(&g_lock);
    ferry_scope_exit(&s);
    if (g_rc[id] == 0) {
        tu_order_add(&g_order, id);
        ferry_lock_release(&g_lock);
    }
    return 0;
}

static int deadline_main(void *arg)
{
    ferry_task *a, *b;

    ferry_lock_acquire(&g_lock);
    a = tu_spawn(lock_with_deadline, (void *)(intptr_t)1);
    b = tu_spawn(lock_worker, (void *)(intptr_t)2);
    ferry_sleep(tu_ms(60));
    g_rc[3] = ferry_lock_locked(&g_lock);
    ferry_lock_release(&g_lock);
    tu_join(a);
    tu_join(b);
    return 0;
}

T(lock, deadline_expires_while_queued)
{
    memset(&g_order, 0, sizeof g_order);
    cr_assert_eq(tu_run(deadline_main, NULL), 0);
    cr_assert_eq(g_rc[1], -ETIMEDOUT);
    cr_assert_eq(g_rc[2], 0);
    cr_assert_eq(g_rc[3], true);
    cr_assert_eq(g_order.n, 1);
    cr_assert_eq(g_order.who[0], 2);
}

static int self_cancel_acquire(void *arg)
{
    int *r = arg;

    ferry_task_cancel(ferry_task_current());
    r[0] = ferry_lock_acquire(&g_lock);
    r[1] = ferry_lock_locked(&g_lock);
    return 0;
}

T(lock, uncontended_acquire_is_a_cancellation_point)
{
    int r[2] = { 1, 1 };

    ferry_lock_init(&g_lock);
    cr_assert_eq(tu_run(self_cancel_acquire, r), 0);
    cr_assert_eq(r[0], -ECANCELED);
    cr_assert_eq(r[1], false);
}

static int die_holding(void *arg)
{
    return ferry_lock_acquire(&g_lock);    /* ends without releasing */
}

static int broken_main(void *arg)
{
    int *r = arg;
    ferry_task *holder, *w1, *w2;

    holder = tu_spawn(die_holding, NULL);
    ferry_yield();
    w1 = tu_spawn(lock_worker, (void *)(intptr_t)1);
    w2 = tu_spawn(lock_worker, (void *)(intptr_t)2);
    r[0] = tu_join(holder);
    r[1] = tu_join(w1);
    r[2] = tu_join(w2);
    r[3] = ferry_lock_acquire(&g_lock);
    r[4] = ferry_lock_try_acquire(&g_lock);
    r[5] = ferry_lock_locked(&g_lock);
    r[6] = ferry_lock_destroy(&g_lock);
    r[7] = ferry_lock_init(&g_lock);
    r[8] = ferry_lock_acquire(&g_lock);
    r[9] = ferry_lock_release(&g_lock);
    return 0;
}

T(lock, owner_ending_while_holding_breaks_it)
{
    int r[10];

    ferry_lock_init(&g_lock);
    cr_assert_eq(tu_run(broken_main, r), 0);
    cr_assert_eq(r[0], 0);
    cr_assert_eq(r[1], -EOWNERDEAD);
    cr_assert_eq(r[2], -EOWNERDEAD);
    cr_assert_eq(r[3], -EOWNERDEAD);
    cr_assert_eq(r[4], -EOWNERDEAD);
    cr_assert_eq(r[5], true);
    cr_assert_eq(r[6], 0, "a broken lock without waiters can be destroyed");
    cr_assert_eq(r[7], 0);
    cr_assert_eq(r[8], 0);
    cr_assert_eq(r[9], 0);
}

/* A task that ends holding two locks, one taken free and one handed over
 * by a release, breaks exactly those two: a lock another task holds on
 * the same loop stays whole. */
static ferry_lock g_l1, g_l2, g_l3;
static int g_go;

static int hold_l1_then_hand_l3(void *arg)
{
    int rc;

    (void)arg;
    if ((rc = ferry_lock_acquire(&g_l1)) || (rc = ferry_lock_acquire(&g_l3)))
        return rc;
    while (!g_go)
        ferry_yield();
    if ((rc = ferry_lock_release(&g_l3)))      /* to the waiting task */
        return rc;
    while (g_go != 2)
        ferry_yield();
    return ferry_lock_release(&g_l1);
}

static int take_l2_and_l3_then_end(void *arg)
{
    int rc;

    (void)arg;
    if ((rc = ferry_lock_acquire(&g_l2)))
        return rc;
    return ferry_lock_acquire(&g_l3);           /* ends holding both */
}

static int two_broken_main(void *arg)
{
    int *r = arg;
    ferry_task *a, *b;

    a = tu_spawn(hold_l1_then_hand_l3, NULL);
    ferry_yield();
    b = tu_spawn(take_l2_and_l3_then_end, NULL);
    ferry_yield();
    g_go = 1;
    r[0] = tu_join(b);
    r[1] = ferry_lock_try_acquire(&g_l2);
    r[2] = ferry_lock_try_acquire(&g_l3);
    r[3] = ferry_lock_try_acquire(&g_l1);       /* a holds it */
    g_go = 2;
    r[4] = tu_join(a);
    r[5] = ferry_lock_acquire(&g_l1);
    r[6] = ferry_lock_release(&g_l1);
    return 0;
}

T(lock, owner_ending_with_two_locks_breaks_those_only)
{
    int r[7];

    ferry_lock_init(&g_l1);
    ferry_lock_init(&g_l2);
    ferry_lock_init(&g_l3);
    cr_assert_eq(tu_run(two_broken_main, r), 0);
    cr_assert_eq(r[0], 0);
    cr_assert_eq(r[1], -EOWNERDEAD);
    cr_assert_eq(r[2], -EOWNERDEAD, "a lock handed over by a release breaks too");
    cr_assert_eq(r[3], -EAGAIN);
    cr_assert_eq(r[4], 0);
    cr_assert_eq(r[5], 0);
    cr_assert_eq(r[6], 0);
}

static int destroy_with_waiter_main(void *arg)
{
    int *r = arg;
    ferry_task *t;

    ferry_lock_acquire(&g_lock);
    t = tu_spawn(lock_worker, (void *)(intptr_t)1);
    tu_settle();
    ferry_lock_release(&g_lock);
    /* 1 was handed the lock and has not run yet. */
    r[0] = ferry_lock_destroy(&g_lock);
    tu_join(t);
    r[1] = ferry_lock_destroy(&g_lock);
    return 0;
}

T(lock, destroy_with_waiters_is_ebusy)
{
    int r[2];

    ferry_lock_init(&g_lock);
    cr_assert_eq(tu_run(destroy_with_waiter_main, r), 0);
    cr_assert_eq(r[0], -EBUSY);
    cr_assert_eq(r[1], 0);
}

/* ---- Who broke a lock: the log line and the dump --------------------- */

static ferry_lock g_many[18];

/* Ends holding the locks 0..n-1 of g_many. */
static int take_and_end(void *arg)
{
    int n = (int)(intptr_t)arg;

    for (int i = 0; i < n; i++)
        if (ferry_lock_acquire(&g_many[i]))
            return -1;
    return 0;
}

static int break_by(const char *name, int n)
{
    ferry_task *t;
    ferry_task_opts o = { .name = name };

    if (ferry_task_spawn(&t, NULL, take_and_end, (void *)(intptr_t)n, &o))
        return -99;
    return tu_join(t);
}

static int broken_name_main(void *arg)
{
    int *r = arg;

    r[0] = break_by("careless", 1);
    r[1] = ferry_lock_acquire(&g_many[0]);        /* -EOWNERDEAD */
    return 0;
}

/* The dump of tu_loop as a string (the caller frees it). */
static char *dump_string(int *ntasks)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);

    cr_assert_not_null(f);
    *ntasks = ferry_loop_dump(tu_loop, f);
    fclose(f);
    return buf;
}

T(lock, broken_lock_names_the_task_in_the_log_and_the_dump)
{
    char want[128], *dump;
    int r[2], ntasks;

    for (int i = 0; i < 18; i++)
        ferry_lock_init(&g_many[i]);
    tu_log_capture_start();
    cr_assert_eq(tu_run(broken_name_main, r), 0);
    tu_log_capture_stop();
    cr_assert_eq(r[0], 0);
    cr_assert_eq(r[1], -EOWNERDEAD);
    cr_assert_eq(tu_log_lines(), 1, "one line when the lock broke, %d logged", tu_log_lines());
    cr_assert_eq(tu_log_level(0), FERRY_LOG_ERROR);
    snprintf(want, sizeof want, "lock %p", (void *)&g_many[0]);
    cr_assert(strstr(tu_log_text(), "'careless'") && strstr(tu_log_text(), want),
              "the log line names the task and the lock: \"%s\"", tu_log_text());

    dump = dump_string(&ntasks);
    cr_assert_eq(ntasks, 0);
    snprintf(want, sizeof want, "lock %p broken by task #", (void *)&g_many[0]);
    cr_assert(strstr(dump, want) && strstr(dump, "'careless'"),
              "the dump lists the broken lock and who broke it:\n%s", dump);
    free(dump);

    /* Destroyed, it is forgotten. */
    cr_assert_eq(ferry_lock_destroy(&g_many[0]), 0);
    dump = dump_string(&ntasks);
    cr_assert_null(strstr(dump, "broken"), "a destroyed lock is still listed:\n%s", dump);
    free(dump);
}

static int many_broken_main(void *arg)
{
    (void)arg;
    return break_by("hoarder", 18);
}

T(lock, dump_keeps_the_last_broken_locks)
{
    char want[128], *dump;
    int ntasks;

    for (int i = 0; i < 18; i++)
        ferry_lock_init(&g_many[i]);
    tu_log_capture_start();
    cr_assert_eq(tu_run(many_broken_main, NULL), 0);
    tu_log_capture_stop();
    cr_assert_eq(tu_log_lines(), 18, "every broken lock is logged");
    dump = dump_string(&ntasks);
    cr_assert(strstr(dump, "16 broken lock(s) (and 2 earlier, not kept)"), "%s", dump);
    for (int i = 2; i < 18; i++) {
        snprintf(want, sizeof want, "lock %p broken by task #", (void *)&g_many[i]);
        cr_assert(strstr(dump, want), "lock %d missing:\n%s", i, dump);
    }
    free(dump);
    /* A destroyed lock in the middle is forgotten, the others stay. */
    cr_assert_eq(ferry_lock_destroy(&g_many[9]), 0);
    dump = dump_string(&ntasks);
    cr_assert(strstr(dump, "15 broken lock(s)"), "%s", dump);
    snprintf(want, sizeof want, "lock %p ", (void *)&g_many[9]);
    cr_assert_null(strstr(dump, want), "%s", dump);
    snprintf(want, sizeof want, "lock %p ", (void *)&g_many[17]);
    cr_assert(strstr(dump, want), "%s", dump);
    free(dump);
}

