/* test_fd.c - waits on file descriptors (ferry_wait_fd() of task.h):
 * readiness, a deadline, bad input and the errors that wait for nothing,
 * and the rule task.h gives for closing an fd that a task waits on.
 *
 * No cr_assert inside task bodies (see testutil.h).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "testutil.h"
#include "fault.h"

#define T(suite, name) \
    Test(suite, name, .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 10.)

/* libevent's allocations go through the fault hook too, so that a test can
 * fail the registration of a wait. */
__attribute__((constructor)) static void route_libevent(void)
{
    tu_libevent_fault_hook(NULL);
}

/* ---- readiness and deadlines ------------------------------------------- */

static int pipefd[2];
static char got[8];

static int reader(void *arg)
{
    int rev = 0, rc = ferry_wait_fd(pipefd[0], FERRY_READ, &rev);
    if (rc)
        return rc;
    if (!(rev & FERRY_READ))
        return -100;
    return read(pipefd[0], got, sizeof got) > 0 ? 0 : -101;
}

static int writer(void *arg)
{
    ferry_sleep(tu_ms(5));
    int rc = ferry_wait_fd(pipefd[1], FERRY_WRITE, NULL);
    if (rc)
        return rc;
    return write(pipefd[1], "hi", 2) == 2 ? 0 : -102;
}

static int fd_main(void *arg)
{
    ferry_task *r, *w;
    int sr = 1, sw = 1;

    ferry_task_spawn(&r, NULL, reader, NULL, NULL);
    ferry_task_spawn(&w, NULL, writer, NULL, NULL);
    ferry_task_join(r, &sr);
    ferry_task_join(w, &sw);
    return sr || sw ? -1 : 0;
}

T(fd, waits_for_readable_and_writable)
{
    cr_assert_eq(pipe(pipefd), 0);
    cr_assert_eq(tu_run(fd_main, NULL), 0);
    cr_assert_str_eq(got, "hi");
    close(pipefd[0]);
    close(pipefd[1]);
}

static int fd_cancel_main(void *arg)
{
    ferry_scope s;
    int rc;

    ferry_scope_enter(&s, ferry_now() + tu_ms(5), 0);
    rc = ferry_wait_fd(pipefd[0], FERRY_READ, NULL);
    ferry_scope_exit(&s);
    return rc;
}

T(fd, wait_ends_at_its_scope_deadline)
{
    cr_assert_eq(pipe(pipefd), 0);
    cr_assert_eq(tu_run(fd_cancel_main, NULL), -ETIMEDOUT);
    cr_assert_eq(ferry_wait_fd(-1, FERRY_READ, NULL), -EPERM);
    close(pipefd[0]);
    close(pipefd[1]);
}

static int bad_fd_main(void *arg)
{
    int a = ferry_wait_fd(-1, FERRY_READ, NULL);
    int b = ferry_wait_fd(0, 0, NULL);

    (void)arg;
    return (a == -EINVAL && b == -EINVAL) ? 0 : -1;
}

T(fd, wait_bad_input_is_einval)
{
    cr_assert_eq(tu_run(bad_fd_main, NULL), 0);
}

static int wait_rc[4];

static int wait_errors_task(void *arg)
{
    int file_fd = *(int *)arg, p[2];

    wait_rc[0] = ferry_wait_fd(0, 4, NULL);        /* unknown event bit */
    wait_rc[1] = ferry_wait_fd(file_fd, FERRY_READ, NULL);   /* epoll refuses files */
    /* libevent cannot allocate the registration. */
    if (pipe(p) == 0) {
        ferry__fault_arm(1, true);
        wait_rc[2] = ferry_wait_fd(p[0], FERRY_READ, NULL);
        ferry__fault_reset();
        close(p[0]);
        close(p[1]);
    }
    ferry_task_cancel(ferry_task_current());
    wait_rc[3] = ferry_wait_fd(0, FERRY_READ, NULL);   /* cancelled: at once */
    return ferry_sleep(INT64_MAX);                 /* longer than the clock: also at once */
}

T(fd, wait_errors_wait_for_nothing)
{
    FILE *f = tmpfile();
    int fd;

    cr_assert_not_null(f);
    fd = fileno(f);
    cr_assert_eq(tu_run(wait_errors_task, &fd), -ECANCELED);
    fclose(f);
    cr_assert_eq(wait_rc[0], -EINVAL);
    cr_assert_eq(wait_rc[1], -ENOMEM, "a regular file: %d", wait_rc[1]);
    cr_assert_eq(wait_rc[2], -ENOMEM);
    cr_assert_eq(wait_rc[3], -ECANCELED);
}

/* ---- closing an fd a task waits on ------------------------------------- */

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
