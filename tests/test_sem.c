/* test_sem.c - ferry_sem (sync.h): counting and bounded semaphores,
 * weighted FIFO acquires without barging, permits granted to a waiter that
 * is cancelled before it runs, the count's limits, and the total of a
 * bounded semaphore raised and lowered (a capacity limiter).
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

static ferry_sem g_sem;
static struct tu_order g_order;
static int g_rc[16];
static int g_counter;
static int g_go;

static int g_inside, g_max_inside;

static int sem_worker(void *arg)
{
    int rc = ferry_sem_acquire(&g_sem);

    if (rc)
        return rc;
    if (++g_inside > g_max_inside)
        g_max_inside = g_inside;
    for (int i = 0; i < 3; i++)
        ferry_yield();
    g_inside--;
    return ferry_sem_release(&g_sem);
}

static int sem_limit_main(void *arg)
{
    ferry_task *t[10];
    int bad = 0;

    for (int i = 0; i < 10; i++)
        t[i] = tu_spawn(sem_worker, NULL);
    for (int i = 0; i < 10; i++)
        bad += tu_join(t[i]) != 0;
    return bad;
}

T(sem, limits_concurrency)
{
    g_inside = g_max_inside = 0;
    ferry_sem_init(&g_sem, 3, 0);
    cr_assert_eq(tu_run(sem_limit_main, NULL), 0);
    cr_assert_eq(g_max_inside, 3);
    cr_assert_eq(ferry_sem_value(&g_sem), 3);
    cr_assert_eq(ferry_sem_destroy(&g_sem), 0);
}

static int sem_basic_main(void *arg)
{
    int *r = arg;

    r[0] = ferry_sem_try_acquire(&g_sem);
    r[1] = ferry_sem_try_acquire(&g_sem);
    r[2] = ferry_sem_try_acquire(&g_sem);          /* -EAGAIN */
    r[3] = (int)ferry_sem_value(&g_sem);
    r[4] = ferry_sem_release_n(&g_sem, 2);
    r[5] = ferry_sem_release(&g_sem);              /* above the bound */
    r[6] = (int)ferry_sem_value(&g_sem);
    r[7] = ferry_sem_acquire_n(&g_sem, 0);
    r[8] = ferry_sem_acquire_n(&g_sem, 3);         /* above the bound */
    r[9] = ferry_sem_release_n(&g_sem, 0);
    r[10] = ferry_sem_acquire_n(&g_sem, 2);
    r[11] = ferry_sem_release_n(&g_sem, 3);        /* 0 + 3 > 2 */
    r[12] = (int)ferry_sem_value(&g_sem);
    return 0;
}

T(sem, bounded_try_and_errors)
{
    int r[13];
    ferry_sem s = FERRY_SEM_BOUNDED_INIT(2);

    g_sem = s;
    cr_assert_eq(tu_run(sem_basic_main, r), 0);
    cr_assert_eq(r[0], 0);
    cr_assert_eq(r[1], 0);
    cr_assert_eq(r[2], -EAGAIN);
    cr_assert_eq(r[3], 0);
    cr_assert_eq(r[4], 0);
    cr_assert_eq(r[5], -EOVERFLOW);
    cr_assert_eq(r[6], 2, "a failed release must change nothing");
    cr_assert_eq(r[7], -EINVAL);
    cr_assert_eq(r[8], -EINVAL);
    cr_assert_eq(r[9], -EINVAL);
    cr_assert_eq(r[10], 0);
    cr_assert_eq(r[11], -EOVERFLOW);
    cr_assert_eq(r[12], 0);
    cr_assert_eq(ferry_sem_init(&g_sem, 1, 42), -EINVAL);
    cr_assert_eq(ferry_sem_init(NULL, 1, 0), -EINVAL);
}

static uint64_t g_want[8];

static int sem_n_worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    int rc = ferry_sem_acquire_n(&g_sem, g_want[id]);

    g_rc[id] = rc;
    if (rc == 0)
        tu_order_add(&g_order, id);
    return rc;
}

static int weighted_fifo_main(void *arg)
{
    int *r = arg;
    ferry_task *big, *small;

    g_want[1] = 5;
    g_want[2] = 1;
    big = tu_spawn(sem_n_worker, (void *)(intptr_t)1);
    tu_settle();
    small = tu_spawn(sem_n_worker, (void *)(intptr_t)2);
    tu_settle();
    ferry_sem_release_n(&g_sem, 1);
    tu_settle();
    r[0] = g_order.n;                              /* small must not barge: 0 */
    r[1] = ferry_sem_try_acquire(&g_sem);        /* -EAGAIN: waiters first */
    ferry_sem_release_n(&g_sem, 4);
    tu_settle();
    r[2] = g_order.n;                              /* big got 5: 1 */
    ferry_sem_release_n(&g_sem, 1);
    tu_join(big);
    tu_join(small);
    r[3] = (int)ferry_sem_value(&g_sem);
    return 0;
}

T(sem, weighted_fifo_without_barging)
{
    int r[4];

    memset(&g_order, 0, sizeof g_order);
    ferry_sem_init(&g_sem, 0, 0);
    cr_assert_eq(tu_run(weighted_fifo_main, r), 0);
    cr_assert_eq(r[0], 0);
    cr_assert_eq(r[1], -EAGAIN);
    cr_assert_eq(r[2], 1);
    cr_assert_eq(g_order.n, 2);
    cr_assert_eq(g_order.who[0], 1);
    cr_assert_eq(g_order.who[1], 2);
    cr_assert_eq(r[3], 0);
}

static int head_cancel_main(void *arg)
{
    int *r = arg;
    ferry_task *t[4];

    g_want[1] = 5;
    g_want[2] = 1;
    g_want[3] = 1;
    for (int i = 1; i <= 3; i++) {
        t[i] = tu_spawn(sem_n_worker, (void *)(intptr_t)i);
        tu_settle();
    }
    r[0] = g_order.n;               /* 0: the head blocks everyone */
    ferry_task_cancel(t[1]);
    /* No release: the small ones behind the cancelled head fit now. */
    tu_join(t[1]);
    tu_join(t[2]);
    tu_join(t[3]);
    r[1] = (int)ferry_sem_value(&g_sem);
    return 0;
}

T(sem, cancelled_head_lets_smaller_waiters_proceed)
{
    int r[2];

    memset(&g_order, 0, sizeof g_order);
    ferry_sem_init(&g_sem, 2, 0);
    cr_assert_eq(tu_run(head_cancel_main, r), 0);
    cr_assert_eq(r[0], 0);
    cr_assert_eq(g_rc[1], -ECANCELED);
    cr_assert_eq(g_rc[2], 0);
    cr_assert_eq(g_rc[3], 0);
    cr_assert_eq(r[1], 0);
}

static int sem_granted_cancel_main(void *arg)
{
    int *r = arg;
    ferry_task *t[4];

    for (int i = 1; i <= 3; i++) {
        g_want[i] = 2;
        t[i] = tu_spawn(sem_n_worker, (void *)(intptr_t)i);
    }
    tu_settle();
    ferry_task_cancel(t[2]);          /* the middle one, while queued */
    ferry_sem_release_n(&g_sem, 2);   /* granted to 1 ... */
    ferry_task_cancel(t[1]);          /* ... cancelled before it runs */
    for (int i = 1; i <= 3; i++)
        tu_join(t[i]);
    r[0] = (int)ferry_sem_value(&g_sem);
    r[1] = ferry_sem_destroy(&g_sem);
    return 0;
}

T(sem, permits_granted_to_cancelled_waiter_reach_the_third)
{
    int r[2];

    memset(&g_order, 0, sizeof g_order);
    ferry_sem_init(&g_sem, 0, 0);
    cr_assert_eq(tu_run(sem_granted_cancel_main, r), 0);
    cr_assert_eq(g_rc[1], -ECANCELED);
    cr_assert_eq(g_rc[2], -ECANCELED);
    cr_assert_eq(g_rc[3], 0);
    cr_assert_eq(g_order.n, 1);
    cr_assert_eq(g_order.who[0], 3);
    cr_assert_eq(r[0], 0, "the 2 permits are held by 3");
    cr_assert_eq(r[1], 0);
}

/* A bounded semaphore counts the permits granted to a waiter that has not
 * run yet: a release that would make them, with the available ones, more
 * than the bound is refused, so that the waiter's cancellation cannot give
 * them back above it. */
static int bounded_pending_main(void *arg)
{
    int *r = arg;
    ferry_task *b;

    r[0] = ferry_sem_acquire_n(&g_sem, 2);      /* 1 left of 3 */
    g_want[1] = 2;
    b = tu_spawn(sem_n_worker, (void *)(intptr_t)1);
    ferry_yield();                               /* b waits for 2 */
    r[1] = ferry_sem_release(&g_sem);            /* a release by a non-holder: 2 free, granted to b */
    r[2] = (int)ferry_sem_value(&g_sem);
    r[3] = ferry_sem_release_n(&g_sem, 2);       /* 0 free + 2 granted + 2 > 3 */
    ferry_task_cancel(b);                        /* before b runs: it gives the 2 back */
    r[4] = tu_join(b);
    r[5] = (int)ferry_sem_value(&g_sem);
    return 0;
}

T(sem, bounded_counts_permits_granted_but_not_taken)
{
    int r[6];
    ferry_sem s = FERRY_SEM_BOUNDED_INIT(3);

    g_sem = s;
    cr_assert_eq(tu_run(bounded_pending_main, r), 0);
    cr_assert_eq(r[0], 0);
    cr_assert_eq(r[1], 0);
    cr_assert_eq(r[2], 0, "the 2 free permits went to the waiter");
    cr_assert_eq(r[3], -EOVERFLOW);
    cr_assert_eq(r[4], -ECANCELED);
    cr_assert_eq(r[5], 2, "never above the bound of 3");
}

static int sem_deadline_worker(void *arg)
{
    ferry_scope s;

    ferry_scope_enter(&s, ferry_now() + tu_ms(10), 0);
    g_rc[0] = ferry_sem_acquire_n(&g_sem, 2);
    ferry_scope_exit(&s);
    return 0;
}

static int sem_deadline_main(void *arg)
{
    int *r = arg;

    tu_join(tu_spawn(sem_deadline_worker, NULL));
    r[0] = (int)ferry_sem_value(&g_sem);
    ferry_task_cancel(ferry_task_current());
    r[1] = ferry_sem_acquire(&g_sem);   /* uncontended, but cancelled */
    r[2] = (int)ferry_sem_value(&g_sem);
    return 0;
}

T(sem, deadline_while_queued_and_cancelled_uncontended)
{
    int r[3];

    ferry_sem_init(&g_sem, 1, 0);
    cr_assert_eq(tu_run(sem_deadline_main, r), 0);
    cr_assert_eq(g_rc[0], -ETIMEDOUT);
    cr_assert_eq(r[0], 1);
    cr_assert_eq(r[1], -ECANCELED);
    cr_assert_eq(r[2], 1);
}

/* Random weighted acquires, releases and cancellations: after quiescence
 * permits available + held == initial (docs/testing.md: permit leak). */
#define CHAOS_TASKS 40
static uint64_t g_held;

static int chaos_sem_worker(void *arg)
{
    uint64_t n = (uint64_t)(intptr_t)arg;

    for (int round = 0; round < 5; round++) {
        if (ferry_sem_acquire_n(&g_sem, n) != 0)
            return 0;
        g_held += n;
        if (g_held > 7)
            g_counter = -1000;             /* over-granted */
        ferry_yield();
        g_held -= n;
        ferry_sem_release_n(&g_sem, n);
    }
    return 0;
}

static int chaos_sem_main(void *arg)
{
    ferry_task *t[CHAOS_TASKS];
    unsigned seed = (unsigned)(intptr_t)arg;

    for (int i = 0; i < CHAOS_TASKS; i++)
        t[i] = tu_spawn(chaos_sem_worker, (void *)(intptr_t)(1 + rand_r(&seed) % 4));
    for (int step = 0; step < 30; step++) {
        ferry_task_cancel(t[rand_r(&seed) % CHAOS_TASKS]);
        for (int k = rand_r(&seed) % 3; k >= 0; k--)
            ferry_yield();
    }
    for (int i = 0; i < CHAOS_TASKS; i++)
        tu_join(t[i]);
    return 0;
}

T(sem, permits_conserved_under_random_cancellation)
{
    for (int seed = 1; seed <= 200; seed++) {
        ferry_sem_init(&g_sem, 7, 0);
        g_held = 0;
        g_counter = 0;
        cr_assert_eq(tu_run(chaos_sem_main, (void *)(intptr_t)seed), 0);
        cr_assert_eq(g_counter, 0, "more than 7 permits held at once (seed %d)", seed);
        cr_assert_eq(g_held, 0);
        cr_assert_eq(ferry_sem_value(&g_sem), 7, "permits leaked (seed %d)", seed);
        cr_assert_eq(ferry_sem_destroy(&g_sem), 0);
    }
}

static int sem_destroy_busy_main(void *arg)
{
    int *r = arg;
    ferry_task *t;

    g_want[1] = 1;
    t = tu_spawn(sem_n_worker, (void *)(intptr_t)1);
    tu_settle();
    r[0] = ferry_sem_destroy(&g_sem);   /* a waiter */
    ferry_sem_release(&g_sem);
    r[1] = ferry_sem_destroy(&g_sem);   /* granted, not run yet */
    tu_join(t);
    r[2] = ferry_sem_destroy(&g_sem);
    return 0;
}

T(sem, destroy_with_waiters_is_ebusy)
{
    int r[3];

    ferry_sem_init(&g_sem, 0, 0);
    cr_assert_eq(tu_run(sem_destroy_busy_main, r), 0);
    cr_assert_eq(r[0], -EBUSY);
    cr_assert_eq(r[1], -EBUSY);
    cr_assert_eq(r[2], 0);
}

/* An unbounded semaphore holds at most UINT64_MAX permits, counting those
 * granted to a waiter that has not run yet: the waiter's cancellation
 * gives them back, and they must not wrap the count then. */
static int sem_wrap_main(void *arg)
{
    int64_t *r = arg;
    const uint64_t half = UINT64_C(1) << 63;
    ferry_task *b;

    g_want[1] = half;
    b = tu_spawn(sem_n_worker, (void *)(intptr_t)1);
    ferry_yield();                                  /* b waits for 2^63 */
    r[0] = ferry_sem_release_n(&g_sem, half);       /* granted to b, not run */
    r[1] = ferry_sem_release_n(&g_sem, half);       /* 2^63 granted + 2^63 wraps */
    r[2] = ferry_sem_release_n(&g_sem, half - 1);   /* up to UINT64_MAX: fits */
    r[3] = ferry_sem_release_n(&g_sem, 1);          /* one more wraps */
    r[4] = (int64_t)(ferry_sem_value(&g_sem) == half - 1);
    ferry_task_cancel(b);                           /* gives the 2^63 back */
    r[5] = tu_join(b);
    r[6] = (int64_t)(ferry_sem_value(&g_sem) == UINT64_MAX);
    r[7] = ferry_sem_try_acquire_n(&g_sem, UINT64_MAX);
    r[8] = ferry_sem_release_n(&g_sem, half);
    r[9] = ferry_sem_release_n(&g_sem, half);       /* 2^63 + 2^63 wraps */
    r[10] = (int64_t)(ferry_sem_value(&g_sem) == half);
    return 0;
}

T(sem, unbounded_count_never_wraps)
{
    int64_t r[11];

    ferry_sem_init(&g_sem, 0, 0);
    cr_assert_eq(tu_run(sem_wrap_main, r), 0);
    cr_assert_eq(r[0], 0);
    cr_assert_eq(r[1], -EOVERFLOW, "2^63 granted + 2^63 released: %lld", (long long)r[1]);
    cr_assert_eq(r[2], 0);
    cr_assert_eq(r[3], -EOVERFLOW, "UINT64_MAX + 1: %lld", (long long)r[3]);
    cr_assert_eq(r[4], 1, "a refused release must change nothing");
    cr_assert_eq(r[5], -ECANCELED);
    cr_assert_eq(r[6], 1, "the grant given back must not wrap the count");
    cr_assert_eq(r[7], 0);
    cr_assert_eq(r[8], 0);
    cr_assert_eq(r[9], -EOVERFLOW);
    cr_assert_eq(r[10], 1);
    cr_assert_eq(ferry_sem_destroy(&g_sem), 0);
}

/* ---- the count's limits -------------------------------------------------- */

static int sem_rc[8];

static int sem_limits_task(void *arg)
{
    ferry_sem sem = FERRY_SEM_INIT(UINT64_MAX - 1);
    ferry_sem bounded = FERRY_SEM_BOUNDED_INIT(2);

    (void)arg;
    sem_rc[0] = ferry_sem_release_n(&sem, 2);           /* would wrap */
    sem_rc[1] = ferry_sem_release_n(&sem, 0);
    sem_rc[2] = ferry_sem_try_acquire_n(&sem, 0);
    sem_rc[3] = ferry_sem_try_acquire_n(&bounded, 3);   /* above the bound: never */
    sem_rc[4] = ferry_sem_acquire_n(&bounded, 3);
    sem_rc[5] = ferry_sem_release(&bounded);            /* above the bound */
    sem_rc[6] = ferry_sem_release_n(&sem, 1);           /* exactly UINT64_MAX */
    sem_rc[7] = ferry_sem_value(&sem) == UINT64_MAX && ferry_sem_value(&bounded) == 2;
    return 0;
}

T(sem, refuses_wrapping_zero_and_unsatisfiable_counts)
{
    cr_assert_eq(tu_run(sem_limits_task, NULL), 0);
    cr_assert_eq(sem_rc[0], -EOVERFLOW);
    cr_assert_eq(sem_rc[1], -EINVAL);
    cr_assert_eq(sem_rc[2], -EINVAL);
    cr_assert_eq(sem_rc[3], -EINVAL);
    cr_assert_eq(sem_rc[4], -EINVAL);
    cr_assert_eq(sem_rc[5], -EOVERFLOW);
    cr_assert_eq(sem_rc[6], 0);
    cr_assert_eq(sem_rc[7], 1, "a refused call changed the count");
}

/* ---- Semaphore total (a capacity limiter) ---------------------------- */

/* Acquire n = g_want[id], log, hold until g_go >= id, release. */
static int sem_holder(void *arg)
{
    int id = (int)(intptr_t)arg;
    int rc = ferry_sem_acquire_n(&g_sem, g_want[id]);

    g_rc[id] = rc;
    if (rc)
        return rc;
    tu_order_add(&g_order, id);
    while (g_go < id)
        ferry_yield();
    return ferry_sem_release_n(&g_sem, g_want[id]);
}

/* Raising the total grants the waiters at the head that fit, in FIFO order,
 * and no waiter behind one that does not fit; the bound moves with it. */
static int raise_main(void *arg)
{
    int *r = arg;
    ferry_task *t[5];

    g_want[1] = 1;                               /* 1 and 2 hold the 2 permits */
    g_want[2] = 1;
    g_want[3] = 1;
    g_want[4] = 2;                               /* 3, 4, 5 wait, in this order */
    g_want[5] = 1;
    for (int i = 0; i < 5; i++)
        t[i] = tu_spawn(sem_holder, (void *)(intptr_t)(i + 1));
    tu_settle();
    r[0] = g_order.n;                              /* 2: the holders */
    r[1] = ferry_sem_set_total(&g_sem, 4);       /* 2 more: 3 gets 1, 4 does not fit */
    tu_settle();
    r[2] = g_order.n;                              /* 3 */
    r[3] = (int)ferry_sem_value(&g_sem);         /* 1 left, held back for 4 */
    r[4] = ferry_sem_set_total(&g_sem, 5);       /* 2 free: 4 gets both */
    tu_settle();
    r[5] = g_order.n;                              /* 4: 5 still waits */
    g_go = 5;                                    /* everyone releases */
    for (int i = 0; i < 5; i++)
        tu_join(t[i]);
    r[6] = (int)ferry_sem_value(&g_sem);         /* 5: the new bound */
    r[7] = ferry_sem_release(&g_sem);            /* above it */
    r[8] = ferry_sem_try_acquire_n(&g_sem, 5);   /* as much as the total: fine */
    r[9] = ferry_sem_try_acquire_n(&g_sem, 6);   /* more: never */
    r[10] = ferry_sem_release_n(&g_sem, 5);
    return 0;
}

T(sem, raising_the_total_grants_waiters_in_fifo_order)
{
    int r[11];

    memset(&g_order, 0, sizeof g_order);
    g_go = 0;
    ferry_sem_init(&g_sem, 2, FERRY_SEM_BOUNDED);
    cr_assert_eq(tu_run(raise_main, r), 0);
    cr_assert_eq(r[0], 2);
    cr_assert_eq(r[1], 0);
    cr_assert_eq(r[2], 3, "one more permit-holder after the raise: %d", r[2]);
    cr_assert_eq(r[3], 1);
    cr_assert_eq(r[4], 0);
    cr_assert_eq(r[5], 4);
    cr_assert_eq(g_order.n, 5);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(g_order.who[i], i + 1, "FIFO: position %d went to %d", i, g_order.who[i]);
    cr_assert_eq(r[6], 5);
    cr_assert_eq(r[7], -EOVERFLOW);
    cr_assert_eq(r[8], 0);
    cr_assert_eq(r[9], -EINVAL);
    cr_assert_eq(r[10], 0);
    cr_assert_eq(ferry_sem_destroy(&g_sem), 0);
}

/* Lowering the total below the permits out admits no one until fewer
 * permits are out than the new total; the waiters keep their order, a
 * waiter cancelled while queued or after its grant changes nothing of
 * that, and the bound comes down too. */
static int lower_main(void *arg)
{
    int *r = arg;
    ferry_task *t[8];

    for (int i = 1; i <= 7; i++)
        g_want[i] = 1;
    /* 1..4 hold the 4 permits; 5, 6, 7 wait. */
    for (int i = 1; i <= 7; i++)
        t[i] = tu_spawn(sem_holder, (void *)(intptr_t)i);
    tu_settle();
    r[0] = g_order.n;                              /* 4 */
    r[1] = ferry_sem_set_total(&g_sem, 2);       /* 4 out, total 2 */
    r[2] = (int)ferry_sem_value(&g_sem);         /* 0 */
    ferry_task_cancel(t[6]);                     /* leaves the queue */
    g_go = 1;                                    /* 1 releases: 3 out */
    tu_settle();
    r[3] = g_order.n;                              /* still 4 */
    g_go = 2;                                    /* 2 out: not fewer than 2 */
    tu_settle();
    r[4] = g_order.n;                              /* still 4 */
    r[5] = (int)ferry_sem_value(&g_sem);         /* 0 */
    g_go = 3;                                    /* 1 out: 5 gets in */
    tu_settle();
    r[6] = g_order.n;                              /* 5 */
    r[7] = g_order.who[4];                       /* 5, not 7 */
    g_go = 4;                                    /* 5 holds: 1 out, 7 gets in */
    tu_settle();
    r[8] = g_order.n;
    g_go = 7;
    for (int i = 1; i <= 7; i++)
        tu_join(t[i]);
    r[9] = (int)ferry_sem_value(&g_sem);         /* 2: the new total */
    r[10] = ferry_sem_release(&g_sem);           /* above it */
    r[11] = ferry_sem_try_acquire_n(&g_sem, 3);  /* more than the total */
    return 0;
}

T(sem, lowering_the_total_admits_no_one_until_under_it)
{
    int r[12];

    memset(&g_order, 0, sizeof g_order);
    memset(g_rc, 0, sizeof g_rc);
    g_go = 0;
    ferry_sem_init(&g_sem, 4, FERRY_SEM_BOUNDED);
    cr_assert_eq(tu_run(lower_main, r), 0);
    cr_assert_eq(r[0], 4);
    cr_assert_eq(r[1], 0);
    cr_assert_eq(r[2], 0);
    cr_assert_eq(r[3], 4, "3 out of a total of 2, yet %d in", r[3]);
    cr_assert_eq(r[4], 4, "2 out of a total of 2, yet %d in", r[4]);
    cr_assert_eq(r[5], 0);
    cr_assert_eq(r[6], 5);
    cr_assert_eq(r[7], 5);
    cr_assert_eq(r[8], 6);
    cr_assert_eq(g_order.who[5], 7);
    cr_assert_eq(g_rc[6], -ECANCELED);
    cr_assert_eq(r[9], 2);
    cr_assert_eq(r[10], -EOVERFLOW);
    cr_assert_eq(r[11], -EINVAL);
    cr_assert_eq(ferry_sem_destroy(&g_sem), 0);
}

/* A grant handed back by a waiter cancelled before it ran, after the total
 * was lowered, pays off the permits out above the total first. */
static int lower_granted_main(void *arg)
{
    int *r = arg;
    ferry_task *t[6];

    for (int i = 1; i <= 5; i++)
        g_want[i] = 1;
    for (int i = 1; i <= 4; i++)                 /* 1..3 hold; 4 waits */
        t[i] = tu_spawn(sem_holder, (void *)(intptr_t)i);
    tu_settle();
    r[0] = (int)ferry_sem_value(&g_sem);         /* 0 */
    g_go = 1;                                    /* 1 releases: 4 is granted */
    while (ferry_task_state(t[4]) != FERRY_TASK_READY)
        ferry_yield();                           /* 4 has not run yet */
    r[1] = g_order.n;                              /* 3 */
    r[2] = ferry_sem_set_total(&g_sem, 1);       /* 3 out (4's grant too), total 1 */
    ferry_task_cancel(t[4]);                     /* 4 hands its permit back */
    r[3] = tu_join(t[4]);
    t[5] = tu_spawn(sem_holder, (void *)(intptr_t)5);
    tu_settle();
    r[4] = g_order.n;                              /* 3: 2 out of 1 */
    g_go = 2;
    tu_settle();
    r[5] = g_order.n;                              /* 3: 1 out of 1 */
    g_go = 3;
    tu_settle();
    r[6] = g_order.n;                              /* 4: 5 is in */
    g_go = 5;
    for (int i = 1; i <= 5; i++)
        if (i != 4)
            tu_join(t[i]);
    r[7] = (int)ferry_sem_value(&g_sem);
    return 0;
}

T(sem, grant_given_back_after_lowering_pays_off_first)
{
    int r[8];

    memset(&g_order, 0, sizeof g_order);
    g_go = 0;
    ferry_sem_init(&g_sem, 3, FERRY_SEM_BOUNDED);
    cr_assert_eq(tu_run(lower_granted_main, r), 0);
    cr_assert_eq(r[0], 0);
    cr_assert_eq(r[1], 3);
    cr_assert_eq(r[2], 0);
    cr_assert_eq(r[3], -ECANCELED);
    cr_assert_eq(r[4], 3, "2 out of a total of 1, yet %d in", r[4]);
    cr_assert_eq(r[5], 3, "1 out of a total of 1, yet %d in", r[5]);
    cr_assert_eq(r[6], 4);
    cr_assert_eq(g_order.who[3], 5);
    cr_assert_eq(r[7], 1);
    cr_assert_eq(ferry_sem_destroy(&g_sem), 0);
}

static int set_total_errors_main(void *arg)
{
    int *r = arg;
    ferry_task *t;
    ferry_sem unb = FERRY_SEM_INIT(3);

    r[0] = ferry_sem_set_total(NULL, 1);
    r[1] = ferry_sem_set_total(&unb, 5);         /* an unbounded one has no total */
    r[2] = (int)ferry_sem_value(&unb);
    r[3] = ferry_sem_set_total(&g_sem, 0);
    r[10] = ferry_sem_acquire(&g_sem);           /* 2 left */
    g_want[1] = 3;
    t = tu_spawn(sem_n_worker, (void *)(intptr_t)1);   /* waits for 3 of 3 */
    tu_settle();
    r[4] = ferry_sem_set_total(&g_sem, 2);       /* the waiter could never get in */
    r[5] = (int)ferry_sem_value(&g_sem);         /* unchanged: 2 */
    r[6] = ferry_sem_release(&g_sem);            /* the bound is still 3: 3 get in */
    tu_join(t);
    r[7] = ferry_sem_release_n(&g_sem, 3);
    r[8] = ferry_sem_set_total(&g_sem, 3);       /* the same: nothing to do */
    r[9] = (int)ferry_sem_value(&g_sem);
    return 0;
}

static void *set_total_thread(void *arg)
{
    *(int *)arg = ferry_sem_set_total(&g_sem, 4);
    return NULL;
}

T(sem, set_total_bad_input)
{
    int r[11], rt = 0;

    ferry_sem_init(&g_sem, 3, FERRY_SEM_BOUNDED);
    cr_assert_eq(tu_run(set_total_errors_main, r), 0);
    cr_assert_eq(r[0], -EINVAL);
    cr_assert_eq(r[1], -EINVAL);
    cr_assert_eq(r[2], 3);
    cr_assert_eq(r[3], -EINVAL);
    cr_assert_eq(r[4], -EBUSY);
    cr_assert_eq(r[5], 2);
    cr_assert_eq(r[6], 0);
    cr_assert_eq(r[7], 0);
    cr_assert_eq(r[8], 0);
    cr_assert_eq(r[9], 3);
    cr_assert_eq(r[10], 0);
    tu_on_thread(set_total_thread, &rt);
    cr_assert_eq(rt, -EPERM);
    cr_assert_eq(ferry_sem_value(&g_sem), 3);
}

