/* test_clock.c - the virtual clock (ferry_loop_opts.virtual_clock): time
 * jumps to the next deadline when the loop would otherwise block, by the
 * exact amount, in deadline order; sleeps, semaphore and event waits
 * under scope deadlines, select's deadline case and descriptor waits with
 * a deadline all follow it; a task waiting for a pool job, and a job
 * whose completion will run on the loop, hold it; a
 * job's deadline is handed to its thread in real time; other threads read
 * the real clock; ferry_loop_advance() moves it by hand; ferry_run() takes
 * it from FERRY_VIRTUAL_CLOCK.
 *
 * Each test sleeps or waits for minutes or hours of virtual time: without
 * the virtual clock it ends at the test's timeout.
 *
 * No cr_assert inside task bodies: tasks record what they saw into
 * variables, and the test asserts on the main stack after tu_run().
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <event2/event.h>

#include "clock.h"
#include "testutil.h"

#define T(suite, name) \
    Test(suite, name, .init = tu_vclock_setup, .fini = tu_loop_teardown, .timeout = 20.)

#define HOUR FERRY_SEC(3600)
#define MIN  FERRY_SEC(60)

/* Real time a test took: far below what it waited in virtual time. */
#define REAL_LIMIT FERRY_SEC(10)

static int64_t g_t0, g_t1, g_real;
static int g_rc;

static int sleep_hour(void *arg)
{
    (void)arg;
    g_t0 = ferry_now();
    g_rc = ferry_sleep(HOUR);
    g_t1 = ferry_now();
    return 0;
}

T(clock, sleep_one_hour)
{
    int64_t r0 = ferry__now_real();

    cr_assert_eq(tu_run(sleep_hour, NULL), 0);
    g_real = ferry__now_real() - r0;
    cr_assert_eq(g_rc, 0);
    cr_assert_eq(g_t1 - g_t0, HOUR, "virtual time slept: %lld ns", (long long)(g_t1 - g_t0));
    cr_assert_lt(g_real, REAL_LIMIT, "took %lld ms of real time", (long long)(g_real / 1000000));
}

/* Ten sleepers with different durations, started in another order than
 * they end. */
static int64_t g_wake_at[10];
static struct tu_order g_order;

static int sleeper(void *arg)
{
    int i = (int)(intptr_t)arg;
    int64_t start = ferry_now();

    if (ferry_sleep((int64_t)((i * 7) % 10 + 1) * MIN) == 0) {
        g_wake_at[i] = ferry_now() - start;
        tu_order_add(&g_order, i);
    }
    return 0;
}

static int sleepers_main(void *arg)
{
    ferry_task *t[10];
    int bad = 0;

    (void)arg;
    for (int i = 0; i < 10; i++)
        t[i] = tu_spawn(sleeper, (void *)(intptr_t)i);
    for (int i = 0; i < 10; i++)
        bad += tu_join(t[i]) != 0;
    return bad;
}

T(clock, wake_in_deadline_order)
{
    for (int round = 0; round < 2; round++) {
        memset(&g_order, 0, sizeof g_order);
        memset(g_wake_at, 0, sizeof g_wake_at);
        cr_assert_eq(tu_run(sleepers_main, NULL), 0);
        cr_assert_eq(g_order.n, 10);
        for (int k = 0; k < 10; k++) {
            int i = g_order.who[k];
            /* Task i slept ((i * 7) % 10 + 1) minutes: k + 1 minutes. */
            cr_assert_eq((i * 7) % 10, k, "round %d: woke %d-th: task %d", round, k, i);
            cr_assert_eq(g_wake_at[i], (int64_t)(k + 1) * MIN,
                         "round %d: task %d woke after %lld ns", round, i,
                         (long long)g_wake_at[i]);
        }
    }
}

/* A semaphore with no permit, acquired under a 30-minute scope. */
static int sem_timeout_main(void *arg)
{
    ferry_sem sem;
    ferry_scope sc;

    (void)arg;
    ferry_sem_init(&sem, 0, 0);
    g_t0 = ferry_now();
    ferry_scope_enter(&sc, g_t0 + 30 * MIN, 0);
    g_rc = ferry_sem_acquire(&sem);
    g_t1 = ferry_now();
    ferry_scope_exit(&sc);
    ferry_sem_destroy(&sem);
    return 0;
}

T(clock, sem_deadline)
{
    cr_assert_eq(tu_run(sem_timeout_main, NULL), 0);
    cr_assert_eq(g_rc, -ETIMEDOUT);
    cr_assert_eq(g_t1 - g_t0, 30 * MIN, "timed out after %lld ns", (long long)(g_t1 - g_t0));
}

/* An event nobody sets, under nested scopes: the inner, earlier deadline
 * fires; then the outer one. */
static int64_t g_t2;
static int g_rc2;

static int scope_main(void *arg)
{
    ferry_event ev;
    ferry_scope outer, inner;

    (void)arg;
    ferry_event_init(&ev);
    g_t0 = ferry_now();
    ferry_scope_enter(&outer, g_t0 + 2 * HOUR, 0);
    ferry_scope_enter(&inner, g_t0 + 10 * MIN, 0);
    g_rc = ferry_event_wait(&ev);
    g_t1 = ferry_now();
    ferry_scope_exit(&inner);
    g_rc2 = ferry_event_wait(&ev);
    g_t2 = ferry_now();
    ferry_scope_exit(&outer);
    ferry_event_destroy(&ev);
    return 0;
}

T(clock, scope_deadlines)
{
    cr_assert_eq(tu_run(scope_main, NULL), 0);
    cr_assert_eq(g_rc, -ETIMEDOUT);
    cr_assert_eq(g_t1 - g_t0, 10 * MIN);
    cr_assert_eq(g_rc2, -ETIMEDOUT);
    cr_assert_eq(g_t2 - g_t0, 2 * HOUR);
}

/* select: the deadline case wins over an event set later than it. */
static int select_main(void *arg)
{
    ferry_event ev;
    ferry_case c[2];

    (void)arg;
    ferry_event_init(&ev);
    g_t0 = ferry_now();
    c[0] = FERRY_CASE_EVENT_INIT(&ev);
    c[1] = FERRY_CASE_DEADLINE_INIT(g_t0 + 45 * MIN);
    g_rc = ferry_select(c, 2, 0);
    g_t1 = ferry_now();
    ferry_event_destroy(&ev);
    return 0;
}

T(clock, select_deadline_case)
{
    cr_assert_eq(tu_run(select_main, NULL), 0);
    cr_assert_eq(g_rc, 1);
    cr_assert_eq(g_t1 - g_t0, 45 * MIN);
}

/* A descriptor wait does not hold the clock: with no data its deadline
 * fires by virtual time; data that a task writes first wins. */
static int g_sv[2];

static int writer(void *arg)
{
    (void)arg;
    if (ferry_sleep(2 * MIN) == 0 && write(g_sv[1], "x", 1) != 1)
        return -1;
    return 0;
}

static int fd_main(void *arg)
{
    ferry_scope sc;
    ferry_task *w;

    (void)arg;
    g_t0 = ferry_now();
    ferry_scope_enter(&sc, g_t0 + 5 * MIN, 0);
    g_rc = ferry_wait_fd(g_sv[0], FERRY_READ, NULL);
    ferry_scope_exit(&sc);
    g_t1 = ferry_now();
    w = tu_spawn(writer, NULL);
    ferry_scope_enter(&sc, g_t1 + 5 * MIN, 0);
    g_rc2 = ferry_wait_fd(g_sv[0], FERRY_READ, NULL);
    ferry_scope_exit(&sc);
    g_t2 = ferry_now();
    return tu_join(w);
}

T(clock, fd_wait_deadline)
{
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, g_sv), 0);
    cr_assert_eq(tu_run(fd_main, NULL), 0);
    close(g_sv[0]);
    close(g_sv[1]);
    cr_assert_eq(g_rc, -ETIMEDOUT);
    cr_assert_eq(g_t1 - g_t0, 5 * MIN);
    cr_assert_eq(g_rc2, 0);
    cr_assert_eq(g_t2 - g_t1, 2 * MIN);
}

/* A pool job holds the clock: the job sleeps 50 ms of real time while
 * another task sleeps an hour of virtual time and a deadline of one
 * second hangs over the job's task. */
static atomic_int g_seq;
static int g_job_end, g_sleeper_end;
static int64_t g_job_vtime;

static int slow_job(void *arg)
{
    (void)arg;
    usleep(50 * 1000);
    return 7;
}

static int hour_sleeper(void *arg)
{
    (void)arg;
    if (ferry_sleep(HOUR) == 0)
        g_sleeper_end = atomic_fetch_add(&g_seq, 1) + 1;
    return 0;
}

static int job_main(void *arg)
{
    ferry_scope sc;
    ferry_task *s;

    (void)arg;
    s = tu_spawn(hour_sleeper, NULL);
    ferry_yield();     /* the sleeper's timer is armed */
    g_t0 = ferry_now();
    ferry_scope_enter(&sc, g_t0 + FERRY_SEC(1), 0);
    g_rc = ferry_to_thread(NULL, slow_job, NULL);
    ferry_scope_exit(&sc);
    g_job_end = atomic_fetch_add(&g_seq, 1) + 1;
    g_job_vtime = ferry_now() - g_t0;
    return tu_join(s);
}

T(clock, pool_job_holds_clock)
{
    atomic_store(&g_seq, 0);
    g_job_end = g_sleeper_end = 0;
    cr_assert_eq(tu_run(job_main, NULL), 0);
    cr_assert_eq(g_rc, 7, "to_thread returned %d", g_rc);
    cr_assert_eq(g_job_vtime, 0, "virtual time moved by %lld ns during the job",
                 (long long)g_job_vtime);
    cr_assert_eq(g_job_end, 1);
    cr_assert_eq(g_sleeper_end, 2);
}

/* A job submitted with its completion on the loop holds the clock until
 * the completion has run, though no task waits for it. */
static int g_done_seq;
static int64_t g_done_vtime;

static int job_done(void *arg, int status)
{
    (void)arg;
    g_done_seq = atomic_fetch_add(&g_seq, 1) + 1;
    g_done_vtime = ferry_now() - g_t0;
    return status == 7 ? 0 : -1;
}

static int submit_main(void *arg)
{
    ferry_task *s;

    (void)arg;
    s = tu_spawn(hour_sleeper, NULL);
    g_t0 = ferry_now();
    g_rc = ferry_pool_submit(NULL, slow_job, NULL, tu_loop, job_done, NULL);
    return tu_join(s);
}

T(clock, submitted_job_holds_clock)
{
    atomic_store(&g_seq, 0);
    g_done_seq = g_sleeper_end = 0;
    cr_assert_eq(tu_run(submit_main, NULL), 0);
    cr_assert_eq(g_rc, 0);
    cr_assert_eq(g_done_vtime, 0, "the completion ran %lld ns of virtual time later",
                 (long long)g_done_vtime);
    cr_assert_eq(g_done_seq, 1);
    cr_assert_eq(g_sleeper_end, 2);
}

/* ferry_job_deadline() on the pool thread is on the real clock: after an
 * hour of virtual time, a one-minute deadline is about a minute of real
 * time away, not an hour and a minute. */
static int64_t g_left;

static int deadline_job(void *arg, void **result)
{
    (void)arg; (void)result;
    g_left = ferry_job_deadline() - ferry_now();
    return 0;
}

static int job_deadline_main(void *arg)
{
    ferry_job job = { .fn = deadline_job };
    ferry_scope sc;
    int st = -1;

    (void)arg;
    if (ferry_sleep(HOUR) != 0)
        return -1;
    ferry_scope_enter(&sc, ferry_now() + MIN, 0);
    g_rc = ferry_to_thread_ex(NULL, &job, &st, NULL);
    ferry_scope_exit(&sc);
    return st;
}

T(clock, job_deadline_is_real)
{
    cr_assert_eq(tu_run(job_deadline_main, NULL), 0);
    cr_assert_eq(g_rc, 0);
    cr_assert(g_left > 0 && g_left <= MIN, "the job had %lld ms left",
              (long long)(g_left / 1000000));
}

/* Other threads read the real clock. */
static void *read_clock(void *arg)
{
    *(int64_t *)arg = ferry_now();
    return NULL;
}

T(clock, other_threads_real)
{
    int64_t there = 0, here, r0 = ferry__now_real();

    cr_assert_eq(tu_run(sleep_hour, NULL), 0);
    here = ferry_now();
    tu_on_thread(read_clock, &there);
    cr_assert_eq(here, g_t1);
    cr_assert(there >= r0 && there < r0 + REAL_LIMIT, "a thread read %lld ns past the start",
              (long long)(there - r0));
}

/* ferry_loop_advance(): by hand, from the loop's thread outside a run,
 * and from a task, where the blocked-loop detector must not take the hour
 * for a step that blocked. */
static int g_fired;

static void count_cb(void *arg)
{
    (void)arg;
    g_fired++;
}

static int advance_main(void *arg)
{
    (void)arg;
    g_t0 = ferry_now();
    g_rc = ferry_loop_advance(tu_loop, HOUR);
    g_t1 = ferry_now();
    return 0;
}

T(clock, advance)
{
    int64_t t0 = ferry_now();

    g_fired = 0;
    cr_assert_eq(ferry_loop_advance(tu_loop, -1), -EINVAL);
    cr_assert_eq(ferry_call_later(tu_loop, 10 * MIN, count_cb, NULL, NULL), 0);
    cr_assert_eq(ferry_loop_advance(tu_loop, 10 * MIN - 1), 0);
    cr_assert_eq(ferry_now() - t0, 10 * MIN - 1);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_ONCE), 0);
    cr_assert_eq(g_fired, 0);
    cr_assert_eq(ferry_loop_advance(tu_loop, 1), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_ONCE), 0);
    cr_assert_eq(g_fired, 1);

    ferry_loop_set_slow_threshold(tu_loop, FERRY_MSEC(100));
    tu_log_capture_start();
    cr_assert_eq(tu_run(advance_main, NULL), 0);
    tu_log_capture_stop();
    cr_assert_eq(g_rc, 0);
    cr_assert_eq(g_t1 - g_t0, HOUR);
    cr_assert_eq(tu_log_lines(), 0, "logged: %s", tu_log_text());
}

T(clock, advance_needs_virtual_clock)
{
    ferry_loop *real;

    cr_assert_eq(ferry_loop_new(&real, NULL), 0);
    cr_assert_eq(ferry_loop_advance(real, 1), -EINVAL);
    /* NULL is this thread's current loop (loop.h; test_loop.c tests a
     * thread without one). */
    ferry_loop_free(real);
}

/* Only a loop that runs its own base can jump. */
Test(clock, attached_base_refused, .init = tu_alloc_setup, .fini = tu_loop_teardown)
{
    struct event_base *base = event_base_new();
    ferry_loop *loop = NULL;

    cr_assert_not_null(base);
    cr_assert_eq(ferry_loop_new(&loop, &(ferry_loop_opts){ .base = base, .virtual_clock = true }),
                 -EINVAL);
    cr_assert_null(loop);
    event_base_free(base);
}

/* ferry_run() under FERRY_VIRTUAL_CLOCK=1. */
Test(clock, ferry_run_env, .init = tu_alloc_setup, .fini = tu_loop_teardown, .timeout = 20.)
{
    int64_t r0 = ferry__now_real();

    setenv("FERRY_VIRTUAL_CLOCK", "1", 1);
    cr_assert_eq(ferry_run(sleep_hour, NULL), 0);
    unsetenv("FERRY_VIRTUAL_CLOCK");
    cr_assert_eq(g_rc, 0);
    cr_assert_eq(g_t1 - g_t0, HOUR);
    cr_assert_lt(ferry__now_real() - r0, REAL_LIMIT);
}
