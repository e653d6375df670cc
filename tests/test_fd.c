/* test_fd.c - waits on file descriptors (ferry_wait_fd() of task.h) and the
 * rule task.h gives for closing an fd that a task waits on.
 *
 * No cr_assert inside task bodies (see testutil.h).
 */
#include <errno.h>
#include <stdint.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "testutil.h"

#define T(suite, name) \
    Test(suite, name, .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 10.)

static int g_old[2], g_new[2];
static int g_stale_rc, g_new_rc, g_new_rev, g_same_number;

static int stale_waiter(void *arg)
{
    (void)arg;
    g_stale_rc = ferry_wait_fd(g_old[0], FERRY_READ, NULL);
    return 0;
}

/* Waits on the new pipe's read end, bounded so that a lost wake fails the
 * test at once instead of hanging it. */
static int new_waiter(void *arg)
{
    ferry_scope s;

    (void)arg;
    ferry_scope_enter(&s, ferry_now() + tu_ms(2000), 0);
    g_new_rc = ferry_wait_fd(g_new[0], FERRY_READ, &g_new_rev);
    ferry_scope_exit(&s);
    return 0;
}

/* The remedy task.h prescribes: wake the waiter and let it return, then
 * close.  The fd's number, reused at once, must then wake a new waiter:
 * the stale wait left nothing registered behind. */
static int close_after_the_waiter_left_main(void *arg)
{
    ferry_task *stale, *fresh;

    (void)arg;
    ferry_task_spawn(&stale, NULL, stale_waiter, NULL, NULL);
    ferry_yield();                               /* it waits on g_old[0] */
    ferry_task_cancel(stale);
    ferry_task_join(stale, NULL);
    close(g_old[0]);
    close(g_old[1]);
    if (pipe(g_new) != 0)
        return -1;
    if (g_new[0] != g_old[0]) {                  /* make the number the same */
        if (dup2(g_new[0], g_old[0]) < 0)
            return -2;
        close(g_new[0]);
        g_new[0] = g_old[0];
    }
    g_same_number = 1;
    ferry_task_spawn(&fresh, NULL, new_waiter, NULL, NULL);
    ferry_yield();                               /* it waits on the same number */
    if (write(g_new[1], "x", 1) != 1)
        return -3;
    ferry_task_join(fresh, NULL);
    return 0;
}

T(fd, waiter_gone_before_close_lets_the_reused_number_wake)
{
    g_stale_rc = g_new_rc = 1;
    g_new_rev = 0;
    cr_assert_eq(pipe(g_old), 0);
    cr_assert_eq(tu_run(close_after_the_waiter_left_main, NULL), 0);
    cr_assert_eq(g_same_number, 1);
    cr_assert_eq(g_stale_rc, -ECANCELED);
    cr_assert_eq(g_new_rc, 0, "the wait on the reused fd number returned %d", g_new_rc);
    cr_assert_eq(g_new_rev, FERRY_READ);
    close(g_new[0]);
    close(g_new[1]);
}
