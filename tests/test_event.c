/* test_event.c - ferry_event (sync.h): a set wakes every waiter present,
 * even if cleared before they run; waits under a deadline scope.
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

static ferry_event g_ev;
static int g_rc[16];

static int ev_waiter(void *arg)
{
    int id = (int)(intptr_t)arg;

    g_rc[id] = ferry_event_wait(&g_ev);
    return 0;
}

static int event_main(void *arg)
{
    int *r = arg;
    ferry_task *t[4];

    for (int i = 1; i <= 3; i++)
        t[i] = tu_spawn(ev_waiter, (void *)(intptr_t)i);
    tu_settle();
    r[0] = ferry_event_destroy(&g_ev);       /* waiters: -EBUSY */
    ferry_event_set(&g_ev);
    ferry_event_clear(&g_ev);                /* before they run */
    for (int i = 1; i <= 3; i++)
        tu_join(t[i]);
    r[1] = ferry_event_is_set(&g_ev);
    ferry_event_set(&g_ev);
    r[2] = ferry_event_wait(&g_ev);          /* set: at once */
    ferry_task_cancel(ferry_task_current());
    r[3] = ferry_event_wait(&g_ev);          /* set, but cancelled */
    r[4] = ferry_event_destroy(&g_ev);
    return 0;
}

T(event, set_wakes_all_present_even_if_cleared_before_they_run)
{
    int r[5];

    for (int i = 0; i < 4; i++)
        g_rc[i] = 1;
    ferry_event_init(&g_ev);
    cr_assert_eq(tu_run(event_main, r), 0);
    cr_assert_eq(r[0], -EBUSY);
    for (int i = 1; i <= 3; i++)
        cr_assert_eq(g_rc[i], 0);
    cr_assert_eq(r[1], false);
    cr_assert_eq(r[2], 0);
    cr_assert_eq(r[3], -ECANCELED);
    cr_assert_eq(r[4], 0);
}

/* The seed's poll loop: a pause that a stop event interrupts. */
static int g_polls;

static int poll_loop(void *arg)
{
    while (!ferry_event_is_set(&g_ev)) {
        ferry_scope s;
        int rc;

        g_polls++;
        ferry_scope_enter(&s, ferry_now() + tu_ms(5), 0);
        rc = ferry_event_wait(&g_ev);
        ferry_scope_exit(&s);
        if (rc != 0 && rc != -ETIMEDOUT)
            return rc;
    }
    return 0;
}

static int poll_main(void *arg)
{
    ferry_task *t = tu_spawn(poll_loop, NULL);

    ferry_sleep(tu_ms(30));
    ferry_event_set(&g_ev);
    return tu_join(t);
}

T(event, wait_with_deadline_scope_and_stop_event)
{
    g_polls = 0;
    ferry_event_init(&g_ev);
    cr_assert_eq(tu_run(poll_main, NULL), 0);
    cr_assert_gt(g_polls, 1, "the 5 ms pause must time out at least once");
}

