/* test_cond.c - ferry_cond (sync.h): wait for a predicate, notify n or
 * all, a notification to a cancelled waiter passed on, every return
 * holding the lock (timeout, cancellation), a lock shared by two
 * conditions and broken by a task that ended holding it.
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

static ferry_cond g_cond;
static ferry_lock g_lock;
static struct tu_order g_order;
static int g_rc[16];

static int g_items;

static bool have_items(void *arg)
{
    return g_items > 0;
}

static int consumer(void *arg)
{
    int id = (int)(intptr_t)arg, rc;
    ferry_lock *l = ferry_cond_lock(&g_cond);

    ferry_lock_acquire(l);
    rc = ferry_cond_wait_for(&g_cond, have_items, NULL);
    g_rc[id] = rc;
    if (rc == 0) {
        g_items--;
        tu_order_add(&g_order, id);
    }
    /* Held on every return but -EOWNERDEAD: releasing proves it. */
    g_rc[id + 8] = ferry_lock_release(l);
    return 0;
}

static int cond_main(void *arg)
{
    int *r = arg;
    ferry_task *t[5];
    ferry_lock *l = ferry_cond_lock(&g_cond);

    r[0] = ferry_cond_wait(&g_cond);             /* lock not held */
    r[1] = ferry_cond_notify(&g_cond, 1);
    for (int i = 1; i <= 4; i++)
        t[i] = tu_spawn(consumer, (void *)(intptr_t)i);
    tu_settle();
    ferry_lock_acquire(l);
    g_items = 2;
    r[2] = ferry_cond_notify(&g_cond, 2);        /* wakes 1 and 2 */
    r[3] = ferry_cond_destroy(&g_cond);          /* busy */
    ferry_lock_release(l);
    tu_settle();
    r[4] = g_order.n;
    ferry_lock_acquire(l);
    g_items = 1;
    r[5] = ferry_cond_notify_all(&g_cond);       /* 3 and 4; one finds none */
    ferry_lock_release(l);
    tu_settle();
    ferry_lock_acquire(l);
    g_items = 1;
    r[6] = ferry_cond_notify_all(&g_cond);
    ferry_lock_release(l);
    for (int i = 1; i <= 4; i++)
        tu_join(t[i]);
    r[7] = ferry_cond_destroy(&g_cond);
    return 0;
}

T(cond, wait_for_predicate_notify_n_and_all)
{
    int r[8];

    memset(&g_order, 0, sizeof g_order);
    ferry_cond_init(&g_cond, NULL);
    cr_assert_eq(tu_run(cond_main, r), 0);
    cr_assert_eq(r[0], -EPERM);
    cr_assert_eq(r[1], -EPERM);
    cr_assert_eq(r[2], 2);
    cr_assert_eq(r[3], -EBUSY);
    cr_assert_eq(r[4], 2);
    cr_assert_eq(r[5], 2);
    cr_assert_eq(r[6], 1);
    cr_assert_eq(g_order.n, 4);
    cr_assert_eq(g_order.who[0], 1);
    cr_assert_eq(g_order.who[1], 2);
    for (int i = 1; i <= 4; i++) {
        cr_assert_eq(g_rc[i], 0);
        cr_assert_eq(g_rc[i + 8], 0);
    }
    cr_assert_eq(r[7], 0);
}

static int cond_waiter(void *arg)
{
    int id = (int)(intptr_t)arg;
    ferry_lock *l = ferry_cond_lock(&g_cond);

    ferry_lock_acquire(l);
    g_rc[id] = ferry_cond_wait(&g_cond);
    if (g_rc[id] == 0)
        tu_order_add(&g_order, id);
    g_rc[id + 8] = ferry_lock_release(l);
    return 0;
}

static int cond_granted_cancel_main(void *arg)
{
    ferry_task *t[4];
    ferry_lock *l = ferry_cond_lock(&g_cond);

    for (int i = 1; i <= 3; i++)
        t[i] = tu_spawn(cond_waiter, (void *)(intptr_t)i);
    tu_settle();
    ferry_task_cancel(t[2]);        /* middle one, while waiting */
    ferry_lock_acquire(l);
    ferry_cond_notify(&g_cond, 1);  /* notifies 1 ... */
    ferry_task_cancel(t[1]);        /* ... which is cancelled before running */
    ferry_lock_release(l);
    for (int i = 1; i <= 3; i++)
        tu_join(t[i]);
    return 0;
}

T(cond, notification_to_cancelled_waiter_passes_on)
{
    memset(&g_order, 0, sizeof g_order);
    ferry_cond_init(&g_cond, NULL);
    cr_assert_eq(tu_run(cond_granted_cancel_main, NULL), 0);
    cr_assert_eq(g_rc[1], -ECANCELED);
    cr_assert_eq(g_rc[2], -ECANCELED);
    cr_assert_eq(g_rc[3], 0, "the notification must reach the third waiter");
    for (int i = 1; i <= 3; i++)
        cr_assert_eq(g_rc[i + 8], 0, "waiter %d did not hold the lock on return", i);
    cr_assert_eq(g_order.n, 1);
    cr_assert_eq(g_order.who[0], 3);
    cr_assert_eq(ferry_cond_destroy(&g_cond), 0);
}

static int cond_timeout_waiter(void *arg)
{
    ferry_scope s;
    ferry_lock *l = ferry_cond_lock(&g_cond);

    ferry_lock_acquire(l);
    ferry_scope_enter(&s, ferry_now() + tu_ms(10), 0);
    g_rc[1] = ferry_cond_wait(&g_cond);
    ferry_scope_exit(&s);
    g_rc[2] = ferry_lock_locked(l);
    g_rc[3] = ferry_lock_release(l);   /* 0 only if we hold it */
    return 0;
}

static int cond_timeout_main(void *arg)
{
    ferry_task *t = tu_spawn(cond_timeout_waiter, NULL);
    ferry_lock *l = ferry_cond_lock(&g_cond);

    tu_settle();
    /* Hold the lock past the waiter's deadline: it must wait for the lock
     * (shielded) and return holding it. */
    ferry_lock_acquire(l);
    ferry_sleep(tu_ms(40));
    ferry_lock_release(l);
    tu_join(t);
    return 0;
}

T(cond, timeout_returns_holding_the_lock)
{
    ferry_cond_init(&g_cond, NULL);
    cr_assert_eq(tu_run(cond_timeout_main, NULL), 0);
    cr_assert_eq(g_rc[1], -ETIMEDOUT);
    cr_assert_eq(g_rc[2], true);
    cr_assert_eq(g_rc[3], 0);
}

static ferry_cond g_cond2;

static int shared_waiter(void *arg)
{
    ferry_cond *c = arg;

    ferry_lock_acquire(&g_lock);
    int rc = ferry_cond_wait(c);
    ferry_lock_release(&g_lock);
    return rc;
}

static int die_in_cond_holder(void *arg)
{
    ferry_lock_acquire(&g_lock);
    ferry_cond_notify_all(&g_cond);
    return 0;                          /* ends holding the shared lock */
}

static int shared_lock_main(void *arg)
{
    int *r = arg;
    ferry_task *a, *b;

    a = tu_spawn(shared_waiter, &g_cond);
    b = tu_spawn(shared_waiter, &g_cond2);
    tu_settle();
    ferry_lock_acquire(&g_lock);
    r[0] = ferry_cond_notify_all(&g_cond2);   /* wakes only b */
    ferry_lock_release(&g_lock);
    r[1] = tu_join(b);
    /* a is woken by a task that then ends holding the shared lock. */
    tu_join(tu_spawn(die_in_cond_holder, NULL));
    r[2] = tu_join(a);
    return 0;
}

T(cond, shared_lock_and_broken_lock)
{
    int r[3];

    ferry_lock_init(&g_lock);
    ferry_cond_init(&g_cond, &g_lock);
    ferry_cond_init(&g_cond2, &g_lock);
    cr_assert_eq(tu_run(shared_lock_main, r), 0);
    cr_assert_eq(r[0], 1);
    cr_assert_eq(r[1], 0);
    cr_assert_eq(r[2], -EOWNERDEAD);
    cr_assert(ferry_cond_lock(&g_cond) == &g_lock);
}

static int cond_cancel_waiter(void *arg)
{
    ferry_lock *l = ferry_cond_lock(&g_cond);

    ferry_lock_acquire(l);
    g_rc[1] = ferry_cond_wait(&g_cond);
    g_rc[2] = ferry_lock_release(l);
    return 0;
}

static int cond_cancel_main(void *arg)
{
    ferry_task *t = tu_spawn(cond_cancel_waiter, NULL);
    ferry_lock *l = ferry_cond_lock(&g_cond);

    tu_settle();
    ferry_lock_acquire(l);
    ferry_task_cancel(t);          /* cancelled while we hold the lock */
    tu_settle();
    ferry_lock_release(l);
    tu_join(t);
    return 0;
}

T(cond, cancelled_wait_returns_holding_the_lock)
{
    ferry_cond_init(&g_cond, NULL);
    cr_assert_eq(tu_run(cond_cancel_main, NULL), 0);
    cr_assert_eq(g_rc[1], -ECANCELED);
    cr_assert_eq(g_rc[2], 0);
    cr_assert_eq(tu_leaks(), 0);
}

/* ---- preconditions ------------------------------------------------------ */

static int cond_rc[4] = { 1, 1, 1, 1 };
static int pred_calls;

static bool count_pred(void *arg)
{
    (void)arg;
    pred_calls++;
    return true;
}

static int cond_pre_task(void *arg)
{
    ferry_cond c = FERRY_COND_INIT;

    (void)arg;
    cond_rc[0] = ferry_cond_wait_for(&c, count_pred, NULL);   /* lock not held */
    ferry_lock_acquire(ferry_cond_lock(&c));
    ferry_task_cancel(ferry_task_current());
    cond_rc[1] = ferry_cond_wait_for(&c, count_pred, NULL);   /* cancelled: pred not called */
    cond_rc[2] = ferry_lock_locked(ferry_cond_lock(&c));      /* still held */
    ferry_lock_release(ferry_cond_lock(&c));
    cond_rc[3] = ferry_cond_destroy(&c);
    return 0;
}

T(cond, wait_for_checks_the_lock_and_cancellation_before_the_predicate)
{
    cr_assert_eq(tu_run(cond_pre_task, NULL), 0);
    cr_assert_eq(cond_rc[0], -EPERM);
    cr_assert_eq(cond_rc[1], -ECANCELED);
    cr_assert_eq(cond_rc[2], 1);
    cr_assert_eq(cond_rc[3], 0);
    cr_assert_eq(pred_calls, 0);
}
