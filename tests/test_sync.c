/* test_sync.c - what sync.h says of all its primitives (lock, semaphore,
 * event, condition): each belongs to the loop that first uses it, and
 * another thread or loop gets -EPERM; destroy is refused (-EBUSY) while a
 * task waits or was woken and has not run, allowed once the bound loop is
 * freed; NULL and invalid arguments are -EINVAL and change nothing.
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

/* ---- NULL and invalid arguments ------------------------------------- */

static int nulls_rc[32], nnulls, nbools;
static bool nulls_bool[8];

static int nulls_task(void *arg)
{
    ferry_sem sem;
    ferry_cond cond = FERRY_COND_INIT;
    int i = 0, b = 0;

    (void)arg;
    /* lock */
    nulls_rc[i++] = ferry_lock_init(NULL);
    nulls_rc[i++] = ferry_lock_destroy(NULL);
    nulls_rc[i++] = ferry_lock_acquire(NULL);
    nulls_rc[i++] = ferry_lock_try_acquire(NULL);
    nulls_rc[i++] = ferry_lock_release(NULL);
    nulls_bool[b++] = ferry_lock_locked(NULL);
    /* semaphore */
    nulls_rc[i++] = ferry_sem_init(NULL, 1, 0);
    nulls_rc[i++] = ferry_sem_init(&sem, 1, 0x40);
    nulls_rc[i++] = ferry_sem_destroy(NULL);
    nulls_rc[i++] = ferry_sem_acquire_n(NULL, 1);
    nulls_rc[i++] = ferry_sem_try_acquire_n(NULL, 1);
    nulls_rc[i++] = ferry_sem_release_n(NULL, 1);
    nulls_bool[b++] = ferry_sem_value(NULL) != 0;
    /* event */
    nulls_rc[i++] = ferry_event_init(NULL);
    nulls_rc[i++] = ferry_event_destroy(NULL);
    nulls_rc[i++] = ferry_event_set(NULL);
    nulls_rc[i++] = ferry_event_clear(NULL);
    nulls_rc[i++] = ferry_event_wait(NULL);
    nulls_bool[b++] = ferry_event_is_set(NULL);
    /* condition */
    nulls_rc[i++] = ferry_cond_init(NULL, NULL);
    nulls_rc[i++] = ferry_cond_destroy(NULL);
    nulls_rc[i++] = ferry_cond_wait(NULL);
    nulls_rc[i++] = ferry_cond_wait_for(&cond, NULL, NULL);
    nulls_rc[i++] = ferry_cond_notify(NULL, 1);
    nulls_bool[b++] = ferry_cond_lock(NULL) != NULL;
    nnulls = i;
    nbools = b;
    return 0;
}

T(sync, every_primitive_refuses_null_and_invalid_arguments)
{
    cr_assert_eq(tu_run(nulls_task, NULL), 0);
    cr_assert_eq(nnulls, 21);
    cr_assert_eq(nbools, 4);
    tu_assert_einval_and_false(nulls_rc, nnulls, nulls_bool, nbools);
}

/* ---- Wrong thread, wrong loop (every primitive) --------------------- */

static ferry_lock g_lock;
static ferry_sem g_sem;
static ferry_event g_ev;
static ferry_cond g_cond;

static int bind_all(void *arg)
{
    ferry_lock_acquire(&g_lock);
    ferry_lock_release(&g_lock);
    ferry_sem_release(&g_sem);
    ferry_sem_acquire(&g_sem);
    ferry_event_clear(&g_ev);
    ferry_lock_acquire(ferry_cond_lock(&g_cond));
    ferry_cond_notify_all(&g_cond);
    ferry_lock_release(ferry_cond_lock(&g_cond));
    return 0;
}

static int foreign_calls(int *r)
{
    int n = 0;

    r[n++] = ferry_lock_acquire(&g_lock);
    r[n++] = ferry_lock_try_acquire(&g_lock);
    r[n++] = ferry_lock_release(&g_lock);
    r[n++] = ferry_lock_destroy(&g_lock);
    r[n++] = ferry_sem_acquire(&g_sem);
    r[n++] = ferry_sem_try_acquire(&g_sem);
    r[n++] = ferry_sem_release(&g_sem);
    r[n++] = ferry_sem_destroy(&g_sem);
    r[n++] = ferry_event_set(&g_ev);
    r[n++] = ferry_event_clear(&g_ev);
    r[n++] = ferry_event_wait(&g_ev);
    r[n++] = ferry_event_destroy(&g_ev);
    r[n++] = ferry_cond_wait(&g_cond);
    r[n++] = ferry_cond_notify(&g_cond, 1);
    r[n++] = ferry_cond_destroy(&g_cond);
    return n;
}

T(sync, other_thread_or_other_loop_gets_eperm)
{
    ferry_lock_init(&g_lock);
    ferry_sem_init(&g_sem, 1, 0);
    ferry_event_init(&g_ev);
    ferry_cond_init(&g_cond, NULL);
    cr_assert_eq(tu_run(bind_all, NULL), 0);
    tu_assert_eperm_elsewhere(foreign_calls);
    cr_assert_eq(ferry_sem_value(&g_sem), 1);
}

/* ---- Destroy once the bound loop is freed (every primitive) ---------- */

/* Bind every primitive to the loop running it, then hold the lock and the
 * condition's lock and wait on the semaphore (value 0) until the loop is
 * freed: its cancellation breaks both locks and takes the waiter out. */
static int bind_then_wait(void *arg)
{
    (void)arg;
    ferry_event_clear(&g_ev);
    ferry_lock_acquire(&g_lock);
    ferry_lock_acquire(ferry_cond_lock(&g_cond));
    ferry_cond_notify_all(&g_cond);
    return ferry_sem_acquire(&g_sem);
}

static int foreign_destroys(int *r)
{
    int n = 0;

    r[n++] = ferry_lock_destroy(&g_lock);
    r[n++] = ferry_sem_destroy(&g_sem);
    r[n++] = ferry_event_destroy(&g_ev);
    r[n++] = ferry_cond_destroy(&g_cond);
    return n;
}

static int g_nforeign;

static void *thread_destroys(void *arg)
{
    g_nforeign = foreign_destroys(arg);
    return NULL;
}

T(sync, destroy_after_the_bound_loop_is_freed)
{
    int r[8];
    ferry_loop *loop2;

    ferry_lock_init(&g_lock);
    ferry_sem_init(&g_sem, 0, 0);
    ferry_event_init(&g_ev);
    ferry_cond_init(&g_cond, NULL);
    cr_assert_eq(ferry_loop_new(&loop2, NULL), 0);
    cr_assert_eq(ferry_task_spawn(NULL, loop2, bind_then_wait, NULL, NULL), 0);
    cr_assert_eq(ferry_loop_run(loop2, FERRY_RUN_ONCE), 0);

    /* The loop lives on this thread: another thread may not destroy. */
    memset(r, 0, sizeof r);
    tu_on_thread(thread_destroys, r);
    for (int i = 0; i < g_nforeign; i++)
        cr_assert_eq(r[i], -EPERM, "destroy %d from a thread while the loop lives: %d", i, r[i]);
    cr_assert(ferry_lock_locked(&g_lock));

    ferry_loop_free(loop2);
    /* Gone: this thread (whose own loop is another) and any other may. */
    cr_assert_eq(ferry_lock_destroy(&g_lock), 0, "lock");
    cr_assert_eq(ferry_sem_destroy(&g_sem), 0, "semaphore");
    memset(r, 0xff, sizeof r);
    tu_on_thread(thread_destroys, r);
    cr_assert_eq(r[0], 0, "lock, destroyed twice");
    cr_assert_eq(r[1], 0, "semaphore, destroyed twice");
    cr_assert_eq(r[2], 0, "event from a thread: %d", r[2]);
    cr_assert_eq(r[3], 0, "condition from a thread: %d", r[3]);
    cr_assert_not(ferry_lock_locked(&g_lock));
}

/* ---- destroy while in use ------------------------------------------------ */

static ferry_sem busy_sem;
static ferry_event busy_ev;
static ferry_lock shared_lock;
static ferry_cond busy_cond;
static int destroy_rc[10], waiter_rc[3] = { 1, 1, 1 };

static int sem_waiter(void *arg)
{
    (void)arg;
    waiter_rc[0] = ferry_sem_acquire(&busy_sem);
    return 0;
}

static int ev_waiter(void *arg)
{
    (void)arg;
    waiter_rc[1] = ferry_event_wait(&busy_ev);
    return 0;
}

static int cond_waiter(void *arg)
{
    (void)arg;
    ferry_lock_acquire(&shared_lock);
    waiter_rc[2] = ferry_cond_wait(&busy_cond);
    ferry_lock_release(&shared_lock);
    return 0;
}

static int destroy_busy_main(void *arg)
{
    ferry_task *t[3];
    int i = 0;

    (void)arg;
    ferry_cond_init(&busy_cond, &shared_lock);
    ferry_task_spawn(&t[0], NULL, sem_waiter, NULL, NULL);
    ferry_task_spawn(&t[1], NULL, ev_waiter, NULL, NULL);
    ferry_task_spawn(&t[2], NULL, cond_waiter, NULL, NULL);
    ferry_yield();                                     /* all three wait */
    destroy_rc[i++] = ferry_sem_destroy(&busy_sem);    /* a waiter */
    destroy_rc[i++] = ferry_event_destroy(&busy_ev);
    destroy_rc[i++] = ferry_cond_destroy(&busy_cond);
    /* Woken but not yet run: still busy. */
    ferry_sem_release(&busy_sem);
    ferry_event_set(&busy_ev);
    ferry_lock_acquire(&shared_lock);
    ferry_cond_notify(&busy_cond, 1);
    ferry_lock_release(&shared_lock);
    destroy_rc[i++] = ferry_sem_destroy(&busy_sem);
    destroy_rc[i++] = ferry_cond_destroy(&busy_cond);
    for (int k = 0; k < 3; k++)
        ferry_task_join(t[k], NULL);
    destroy_rc[i++] = ferry_sem_destroy(&busy_sem);
    destroy_rc[i++] = ferry_event_destroy(&busy_ev);
    destroy_rc[i++] = ferry_cond_destroy(&busy_cond);
    destroy_rc[i++] = ferry_lock_destroy(&shared_lock);
    return i;
}

T(sync, destroy_of_a_primitive_with_waiters_or_woken_waiters_is_ebusy)
{
    cr_assert_eq(tu_run(destroy_busy_main, NULL), 9);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(destroy_rc[i], -EBUSY, "destroy %d returned %d", i, destroy_rc[i]);
    for (int i = 5; i < 9; i++)
        cr_assert_eq(destroy_rc[i], 0, "destroy %d returned %d", i, destroy_rc[i]);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(waiter_rc[i], 0, "waiter %d returned %d", i, waiter_rc[i]);
}

/* ---- destroy from a thread other than the bound loop's ------------------ */

static ferry_lock fl_lock;
static ferry_cond own_cond;     /* its own lock used directly, the condition never */
static int foreign_rc[3] = { 1, 1, 1 };

static int bind_task(void *arg)
{
    (void)arg;
    ferry_lock_acquire(&fl_lock);
    ferry_lock_release(&fl_lock);
    ferry_lock_acquire(ferry_cond_lock(&own_cond));
    ferry_lock_release(ferry_cond_lock(&own_cond));
    return 0;
}

static void *bound_elsewhere_destroys(void *arg)
{
    (void)arg;
    foreign_rc[0] = ferry_lock_destroy(&fl_lock);
    foreign_rc[1] = ferry_cond_destroy(&own_cond);
    foreign_rc[2] = ferry_lock_try_acquire(&fl_lock);
    return NULL;
}

T(sync, destroy_from_a_thread_other_than_the_bound_loops_is_eperm)
{
    cr_assert_eq(tu_run(bind_task, NULL), 0);
    tu_on_thread(bound_elsewhere_destroys, NULL);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(foreign_rc[i], -EPERM, "call %d returned %d", i, foreign_rc[i]);
    /* Still bound and usable here. */
    cr_assert_eq(ferry_lock_destroy(&fl_lock), 0);
    cr_assert_eq(ferry_cond_destroy(&own_cond), 0);
}
