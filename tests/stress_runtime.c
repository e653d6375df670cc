/* stress_runtime.c - cross-loop calls from many tasks on every loop of a
 * runtime, cancelled and timed out at random, with schedule fuzzing on;
 * then the same while the runtime is freed under them.
 *
 * Every call has a record: fn marks it started and ended; the caller
 * writes down what the call returned and whether fn had ended by then.
 * At the end, for every call: returned 0 exactly when fn ran to its end
 * (and its end came before the call returned: no task left running for
 * nobody), with fn's own status; any other return means fn never started,
 * not even later.  Nothing leaks (the fixture's allocation count).
 *
 * Seeded: FERRY_STRESS_SEED=N repeats a run's choices (the threads'
 * timing never repeats); the seed is printed with every failure.
 * FERRY_STRESS_SCALE scales the number of calls.  No cr_assert inside
 * tasks.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "testutil.h"
#include "ferry/ferry.h"

#define NLOOPS   3
#define WORKERS  6

struct rec {
    atomic_int started;          /* fn began */
    atomic_int ended;            /* fn is returning: `ret` is set */
    int        ret;              /* what fn returned */
    int        rc, status;       /* what the call returned, and *status */
    int        ended_at_return;  /* `ended` when the call returned */
    bool       returned;         /* the caller got its answer */
};

static struct rec *recs;
static long        nrecs;
static atomic_long next_rec;
static uint64_t    g_seed;
static bool        g_shielded;   /* second test: callers go on while loops stop */
static atomic_long outcomes[4];  /* ran, ran and was interrupted, never ran, shut down */
static atomic_long late_calls;   /* calls of the last callers beyond the records */
static atomic_long late_bad;     /* of them, those that broke the contract */
static atomic_long shutdowns;    /* last callers that were told -ESHUTDOWN */

static uint64_t next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ULL;
}

static unsigned below(uint64_t *s, unsigned n)
{
    return (unsigned)(next(s) % n);
}

/* What fn does, and how the caller is interrupted. */
struct plan {
    struct rec *r;
    int         kind;     /* 0 return, 1 yield a few times, 2 short sleep, 3 long sleep */
    unsigned    n;        /* yields, or the sleep's microseconds */
    unsigned    target;
    unsigned    flags;
    int64_t     deadline; /* the caller's scope, or FERRY_NEVER */
};

static int fn_body(void *arg, void **result)
{
    struct plan *p = arg;
    int rc = 0;

    atomic_store(&p->r->started, 1);
    *result = p;
    switch (p->kind) {
    case 1:
        for (unsigned i = 0; i < p->n && !rc; i++)
            rc = ferry_yield();
        break;
    case 2:
        rc = ferry_sleep(FERRY_USEC(p->n));
        break;
    case 3:
        rc = ferry_sleep(FERRY_MSEC(50));
        break;
    default:
        break;
    }
    /* A status that says which call it is and how its waits went. */
    p->r->ret = (int)((p->r - recs) * 4) + (rc == -ECANCELED ? 1 : rc == -ETIMEDOUT ? 2 : 0);
    atomic_store(&p->r->ended, 1);
    return p->r->ret;
}

static const char *verdict(const struct rec *r);

/* The caller: one call, in a child task of its own (cancelled at random
 * by the worker). */
static int caller(void *arg)
{
    struct plan *p = arg;
    ferry_scope sc, sh;
    void *res = NULL;
    int st = -77777, rc;

    if (g_shielded)
        ferry_scope_enter(&sh, FERRY_NEVER, FERRY_SCOPE_SHIELD);
    if (p->deadline != FERRY_NEVER)
        ferry_scope_enter(&sc, p->deadline, 0);
    rc = ferry_runtime_call(NULL, p->target, fn_body, p, p->flags, &st, &res);
    p->r->ended_at_return = atomic_load(&p->r->ended);
    if (p->deadline != FERRY_NEVER)
        ferry_scope_exit(&sc);
    if (g_shielded)
        ferry_scope_exit(&sh);
    p->r->rc = rc;
    p->r->status = rc == 0 ? st : -77777;
    p->r->returned = true;
    if (rc == 0 && res != p)
        p->r->status = -88888;       /* the result did not come back */
    return 0;
}

struct worker { unsigned loop, id; long calls; };

static int worker(void *arg)
{
    struct worker *w = arg;
    uint64_t rng = g_seed ^ ((uint64_t)(w->loop * WORKERS + w->id + 1) * 0x9e3779b97f4a7c15ULL);
    struct plan p;
    ferry_task *t;

    for (long i = 0; i < w->calls; i++) {
        long id = atomic_fetch_add(&next_rec, 1);
        unsigned how;

        if (id >= nrecs)
            break;
        p.r = &recs[id];
        p.target = below(&rng, NLOOPS);
        p.flags = below(&rng, 4) == 0 ? FERRY_CALL_CALLBACK : 0;
        p.kind = p.flags ? 0 : (int)below(&rng, 4);
        p.n = p.kind == 1 ? 1 + below(&rng, 5) : below(&rng, 400);
        how = below(&rng, 3);
        p.deadline = how == 1 ? ferry_now() + FERRY_USEC(below(&rng, 600)) : FERRY_NEVER;
        if (ferry_task_spawn(&t, NULL, caller, &p, NULL) != 0) {
            p.r->rc = -99999;
            p.r->returned = true;
            continue;
        }
        if (how == 2) {
            /* Cancel it after a random while: before the request went,
             * while it waits, while fn runs, or after it returned. */
            unsigned k = below(&rng, 4);
            if (k == 0)
                ferry_yield();
            else if (k == 1)
                ferry_sleep(FERRY_USEC(below(&rng, 300)));
            ferry_task_cancel(t);
        }
        /* Joined shielded: a cancelled worker still waits for its child,
         * whose record lives in this frame. */
        {
            ferry_scope sh;
            ferry_scope_enter(&sh, FERRY_NEVER, FERRY_SCOPE_SHIELD);
            ferry_task_join(t, NULL);
            ferry_scope_exit(&sh);
        }
        /* Cancelled before it first ran: it never made the call. */
        if (!p.r->returned) {
            p.r->rc = -99999;
            p.r->returned = true;
        }
        if (ferry_task_cancelled(ferry_task_current()))
            break;
    }
    if (g_shielded) {
        /* The runtime is being freed: one last caller, shielded, goes on
         * calling another loop until that loop says it has stopped. */
        ferry_scope sh;

        ferry_scope_enter(&sh, FERRY_NEVER, FERRY_SCOPE_SHIELD);
        do {
            long id = atomic_fetch_add(&next_rec, 1);
            struct rec late;

            /* Past the records (a slow build), each call is checked here. */
            memset(&late, 0, sizeof late);
            p = (struct plan){ .r = id < nrecs ? &recs[id] : &late,
                               .target = (w->loop + 1) % NLOOPS, .deadline = FERRY_NEVER };
            caller(&p);
            if (p.r == &late) {
                atomic_fetch_add(&late_calls, 1);
                if (verdict(&late))
                    atomic_fetch_add(&late_bad, 1);
            }
        } while (p.r->rc != -ESHUTDOWN);
        atomic_fetch_add(&shutdowns, 1);
        ferry_scope_exit(&sh);
    }
    return 0;
}

static int loop_main(void *arg)
{
    long calls = *(long *)arg;
    struct worker w[WORKERS];
    ferry_group g;
    unsigned loop = (unsigned)ferry_runtime_index(NULL, NULL);

    ferry_group_init(&g);
    for (unsigned i = 0; i < WORKERS; i++) {
        w[i] = (struct worker){ .loop = loop, .id = i, .calls = calls };
        ferry_group_spawn(&g, worker, &w[i], NULL);
    }
    return ferry_group_wait(&g);
}

static int run_main(void *arg)
{
    int st[NLOOPS];

    return ferry_runtime_on_all(NULL, loop_main, arg, st);
}

/* The loops are stopped under the calls: main starts the workers of
 * every loop and returns a moment later. */
static int free_main(void *arg)
{
    ferry_future *f;

    for (unsigned i = 0; i < NLOOPS; i++)
        if (ferry_runtime_spawn(NULL, i, loop_main, arg, NULL, &f) == 0)
            ferry_future_free(f);
    return ferry_sleep(tu_ms(60));
}

static void setup_records(long n)
{
    const char *s = getenv("FERRY_STRESS_SEED");

    g_seed = s ? strtoull(s, NULL, 10) : 20240924;
    if (!g_seed)
        g_seed = 1;
    nrecs = n;
    recs = calloc((size_t)n, sizeof *recs);
    cr_assert_not_null(recs);
    atomic_store(&next_rec, 0);
    for (int i = 0; i < 4; i++)
        atomic_store(&outcomes[i], 0);
    atomic_store(&late_calls, 0);
    atomic_store(&late_bad, 0);
    atomic_store(&shutdowns, 0);
}

/* What is wrong with a call, or NULL. */
static const char *verdict(const struct rec *r)
{
    if (!r->returned)
        return "the call never returned";
    if (r->rc == -99999)
        return atomic_load(&r->started) ? "fn ran for a caller that never called" : NULL;
    if (r->rc == 0 && !atomic_load(&r->started))
        return "returned 0 but fn never ran";
    if (r->rc == 0 && !r->ended_at_return)
        return "returned before fn's end";
    if (r->rc == 0 && r->status != r->ret)
        return "fn's status lost";
    if (r->rc != 0 && atomic_load(&r->started))
        return "fn ran although the call said it never did";
    if (r->rc != 0 && r->rc != -ECANCELED && r->rc != -ETIMEDOUT &&
        !(r->rc == -ESHUTDOWN && g_shielded))
        return "an unexpected error";
    return NULL;
}

/* The invariants, over every call made. */
static void check_records(void)
{
    long made = atomic_load(&next_rec);
    long bad = 0;

    if (made > nrecs)
        made = nrecs;
    for (long i = 0; i < made; i++) {
        struct rec *r = &recs[i];
        const char *why = verdict(r);

        if (!why && r->rc == -99999)
            continue;                               /* its caller never ran */
        if (why) {
            if (bad++ < 5)
                cr_log_error("seed %" PRIu64 ": call %ld: %s (rc %d, status %d, ret %d, "
                             "started %d, ended at return %d)", g_seed, i, why, r->rc,
                             r->status, r->ret, atomic_load(&r->started), r->ended_at_return);
            continue;
        }
        if (r->rc == 0)
            atomic_fetch_add(&outcomes[(r->ret & 3) ? 1 : 0], 1);
        else
            atomic_fetch_add(&outcomes[r->rc == -ESHUTDOWN ? 3 : 2], 1);
    }
    cr_log_info("seed %" PRIu64 ": %ld calls: %ld ran, %ld ran and were interrupted, %ld "
                "never ran, %ld shut down; %ld more checked at once", g_seed, made,
                atomic_load(&outcomes[0]), atomic_load(&outcomes[1]),
                atomic_load(&outcomes[2]), atomic_load(&outcomes[3]),
                atomic_load(&late_calls));
    cr_expect_eq(bad, 0, "seed %" PRIu64 ": %ld calls broke the contract", g_seed, bad);
    cr_expect_eq(atomic_load(&late_bad), 0, "seed %" PRIu64 ": %ld late calls broke the "
                 "contract", g_seed, atomic_load(&late_bad));
    free(recs);
    recs = NULL;
}

static ferry_runtime *make_fuzzed(void)
{
    ferry_runtime_opts o = { .loops = NLOOPS, .call_cap = 4 };
    ferry_runtime *rt;

    /* FERRY_FUZZ in the environment overrides this seed. */
    o.loop.fuzz_seed = g_seed;
    cr_assert_eq(ferry_runtime_new(&rt, &o), 0);
    return rt;
}

Test(stress_runtime, random_cancellation_of_calls_from_every_loop,
     .init = tu_alloc_setup, .fini = tu_loop_teardown, .timeout = 600.)
{
    long per = tu_scaled(300);
    ferry_runtime *rt;
    int st = -1;

    setup_records(per * WORKERS * NLOOPS);
    g_shielded = false;
    rt = make_fuzzed();
    cr_expect_eq(ferry_runtime_run(rt, run_main, &per, &st), 0);
    ferry_runtime_free(rt);
    cr_expect_eq(st, 0, "on_all: %d", st);
    cr_expect_eq(atomic_load(&next_rec), nrecs, "every call was made");
    check_records();
    cr_expect_gt(atomic_load(&outcomes[1]) + atomic_load(&outcomes[2]), 0,
                 "some calls were interrupted");
}

Test(stress_runtime, runtime_freed_under_calls_answers_every_caller,
     .init = tu_alloc_setup, .fini = tu_loop_teardown, .timeout = 600.)
{
    long per = tu_scaled(100000);     /* more than they can make: freed under them */
    ferry_runtime *rt;
    int st = -1;

    setup_records(per);
    g_shielded = true;
    rt = make_fuzzed();
    cr_expect_eq(ferry_runtime_run(rt, free_main, &per, &st), 0);
    ferry_runtime_free(rt);
    check_records();
    cr_expect_eq(atomic_load(&shutdowns), NLOOPS * WORKERS,
                 "every last caller was told -ESHUTDOWN: %ld", atomic_load(&shutdowns));
}
