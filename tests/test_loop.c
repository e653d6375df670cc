/* test_loop.c - the loop: callbacks, timers, attaching to an event_base,
 * fd and signal waits, fairness, freeing with live tasks, ferry_run. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <event2/event.h>
#include <criterion/criterion.h>

#include "testutil.h"
#include "ferry/bridge.h"

#define T(name) Test(loop, name, .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)

static int order[16], norder;

static void push_order(void *arg)
{
    order[norder++] = (int)(intptr_t)arg;
}

static void push_and_schedule(void *arg)
{
    push_order(arg);
    ferry_call_soon(tu_loop, push_order, (void *)(intptr_t)((intptr_t)arg + 10));
}

T(call_soon_runs_in_order_and_later_ones_in_the_next_turn)
{
    ferry_loop_stats st;

    ferry_call_soon(tu_loop, push_and_schedule, (void *)1);
    ferry_call_soon(tu_loop, push_order, (void *)2);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_ONCE), 0);
    cr_assert_eq(norder, 2);
    cr_assert_eq(order[0], 1);
    cr_assert_eq(order[1], 2);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(norder, 3);
    cr_assert_eq(order[2], 11);
    cr_assert_eq(ferry_loop_stats_get(tu_loop, &st), 0);
    cr_assert_geq(st.turns, 2);
}

T(call_later_fires_in_deadline_order_and_cancel_prevents_it)
{
    ferry_timer *t2;
    int64_t t0 = ferry_now();

    ferry_call_later(tu_loop, tu_ms(30), push_order, (void *)3, NULL);
    ferry_call_later(tu_loop, tu_ms(10), push_order, (void *)1, NULL);
    ferry_call_later(tu_loop, tu_ms(20), push_order, (void *)2, &t2);
    ferry_call_later(tu_loop, tu_ms(20), push_order, (void *)4, NULL);
    cr_assert_eq(ferry_timer_cancel(t2), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(norder, 3);
    cr_assert_eq(order[0], 1);
    cr_assert_eq(order[1], 4);
    cr_assert_eq(order[2], 3);
    /* A timer never fires before its delay: the last one waited all of it. */
    cr_assert_geq(ferry_now() - t0, tu_ms(30));
    cr_assert_eq(ferry_timer_cancel(NULL), -EINVAL);
}

/* ---- fairness: a task that keeps yielding cannot starve timers ------ */

static int timer_fired;
static void set_flag(void *arg)
{
    *(int *)arg = 1;
}

static int spin_yield(void *arg)
{
    long n = 0;
    while (!timer_fired && n < 50000000) {
        ferry_yield();
        n++;
    }
    return timer_fired ? 0 : -1;
}

T(yielding_task_does_not_starve_timers)
{
    ferry_task *t;
    int st = -5;

    ferry_call_later(tu_loop, tu_ms(5), set_flag, &timer_fired, NULL);
    ferry_task_spawn(&t, tu_loop, spin_yield, NULL, NULL);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(ferry_task_try_join(t, &st), 0);
    cr_assert_eq(st, 0);
}

/* A task alone yields without queueing itself (task.c), but each yield is
 * still a turn and a step, a callback posted before it runs before it
 * returns, and a stop requested before it ends the run at the yield. */
static void set_int(void *arg)
{
    *(int *)arg = 1;
}

static int lone_yielder(void *arg)
{
    ferry_loop_stats a, b;
    int flag = 0;

    (void)arg;
    if (ferry_loop_stats_get(tu_loop, &a))
        return -1;
    for (int i = 0; i < 1000; i++)
        if (ferry_yield())
            return -2;
    if (ferry_loop_stats_get(tu_loop, &b))
        return -3;
    if (b.turns - a.turns < 1000 || b.steps - a.steps < 1000)
        return -4;
    ferry_call_soon(tu_loop, set_int, &flag);
    if (ferry_yield() || !flag)
        return -5;
    flag = 0;
    ferry_loop_stop(tu_loop);
    if (ferry_yield())
        return -6;
    return 7;               /* reached only in the second run */
}

T(lone_task_yield_is_a_turn)
{
    ferry_task *t;
    int st = 0;

    cr_assert_eq(ferry_task_spawn(&t, tu_loop, lone_yielder, NULL, NULL), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(ferry_task_try_join(t, &st), -EAGAIN, "the run did not stop at the yield");
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(ferry_task_try_join(t, &st), 0);
    cr_assert_eq(st, 7);
}

/* ---- fd and signal waits ------------------------------------------ */

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

T(wait_fd_readable_and_writable)
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

T(wait_fd_deadline)
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
    int c = ferry_wait_signal(0);
    return (a == -EINVAL && b == -EINVAL && c == -EINVAL) ? 0 : -1;
}

T(wait_bad_input_is_einval)
{
    cr_assert_eq(tu_run(bad_fd_main, NULL), 0);
}

static int sig_main(void *arg)
{
    return ferry_wait_signal(SIGUSR1);
}

static void raise_usr1(void *arg)
{
    raise(SIGUSR1);
}

T(wait_signal_wakes_on_delivery)
{
    ferry_call_later(tu_loop, tu_ms(5), raise_usr1, NULL, NULL);
    cr_assert_eq(tu_run(sig_main, NULL), 0);
}

/* ---- attached to an application's event_base ---------------------- */

static int app_ticks, task_steps;
static char trace[64];
static int ntrace;

static void app_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    struct event *ev = *(struct event **)arg;
    struct timeval tv = { 0, 1000 };
    if (ntrace < 60)
        trace[ntrace++] = 'A';
    if (++app_ticks < 20)
        event_add(ev, &tv);
}

static int attached_task(void *arg)
{
    for (int i = 0; i < 20; i++) {
        if (ntrace < 60)
            trace[ntrace++] = 'T';
        task_steps++;
        ferry_sleep(FERRY_USEC(700));
    }
    return 0;
}

Test(loop, attached_to_application_base_interleaves, .timeout = 30.)
{
    struct event_base *base = event_base_new();
    ferry_loop *loop;
    struct event *ev;
    struct timeval tv = { 0, 1000 };
    int alternations = 0;

    cr_assert_not_null(base);
    cr_assert_eq(ferry_loop_new(&loop, &(ferry_loop_opts){ .base = base }), 0);
    cr_assert_eq(ferry_loop_base(loop), base);
    ev = evtimer_new(base, app_timer_cb, &ev);
    event_add(ev, &tv);
    cr_assert_eq(ferry_task_spawn(NULL, loop, attached_task, NULL, NULL), 0);
    event_base_dispatch(base);     /* the application's own loop */
    cr_assert_eq(app_ticks, 20);
    cr_assert_eq(task_steps, 20);
    for (int i = 1; i < ntrace; i++)
        alternations += trace[i] != trace[i - 1];
    cr_assert_geq(alternations, 10, "no interleaving: %.*s", ntrace, trace);
    event_free(ev);
    ferry_loop_free(loop);
    event_base_free(base);
}

/* ---- the application's event_base and libevent's locks ------------ */

/* A base the application made before ferry set libevent's thread support
 * up: this constructor runs before the library's (constructors with a
 * priority run before those without). */
static struct event_base *early_base;

__attribute__((constructor(101))) static void make_early_base(void)
{
    early_base = event_base_new();
}

Test(loop, attached_base_made_before_ferry_set_libevent_up_is_refused, .timeout = 30.)
{
    ferry_loop *loop = (ferry_loop *)&loop;

    cr_assert_not_null(early_base);
    cr_assert_eq(ferry_loop_new(&loop, &(ferry_loop_opts){ .base = early_base }), -EINVAL,
                 "a base without libevent's lock was accepted: other threads' wakeups "
                 "would never reach it");
    cr_assert_null(loop);
}

Test(loop, attached_base_made_without_lock_is_refused, .timeout = 30.)
{
    struct event_config *cfg = event_config_new();
    struct event_base *base;
    ferry_loop *loop = (ferry_loop *)&loop;

    cr_assert_not_null(cfg);
    cr_assert_eq(event_config_set_flag(cfg, EVENT_BASE_FLAG_NOLOCK), 0);
    base = event_base_new_with_config(cfg);
    event_config_free(cfg);
    cr_assert_not_null(base);
    cr_assert_eq(ferry_loop_new(&loop, &(ferry_loop_opts){ .base = base }), -EINVAL);
    cr_assert_null(loop);
    /* The application's base is untouched and still runs. */
    cr_assert_eq(event_base_loop(base, EVLOOP_NONBLOCK), 1);
    event_base_free(base);
}

/*
 * The usual order: the application makes its base (here first thing in the
 * process, before any ferry call), then attaches a loop to it.  Wakeups
 * from other threads reach the loop while the application's dispatch
 * sleeps: a pool job's completion, and a post.
 */
static struct event_base *wk_base;
static ferry_loop *wk_loop;
static atomic_int wk_watchdog;      /* the application's timer fired first */
static atomic_int wk_dispatching;   /* the dispatch runs (set from inside it) */
static int wk_job_rc = -1;
static int wk_posted_ran;

static void wk_watchdog_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd; (void)what; (void)arg;
    atomic_store(&wk_watchdog, 1);
    event_base_loopbreak(wk_base);
}

static void wk_started_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd; (void)what; (void)arg;
    atomic_store(&wk_dispatching, 1);
}

static int wk_slow_job(void *arg)
{
    (void)arg;
    usleep(20000);          /* the dispatch is asleep in epoll by then */
    return 5;
}

static int wk_task(void *arg)
{
    wk_job_rc = ferry_to_thread(arg, wk_slow_job, NULL);
    event_base_loopbreak(wk_base);
    return 0;
}

static void wk_posted(void *arg)
{
    (void)arg;
    wk_posted_ran = 1;
    event_base_loopbreak(wk_base);
}

static void *wk_poster(void *arg)
{
    (void)arg;
    tu_spin_until(&wk_dispatching);
    usleep(20000);
    if (ferry_loop_call_soon_threadsafe(wk_loop, wk_posted, NULL) != 0)
        return (void *)1;
    return NULL;
}

Test(loop, attached_base_made_before_the_first_ferry_call_gets_wakeups_from_threads,
     .timeout = 30.)
{
    struct timeval zero = { 0, 0 }, wd = { 0, 0 };
    struct event *watchdog;
    ferry_pool *pool;
    pthread_t t;
    void *res;

    wk_base = event_base_new();
    cr_assert_not_null(wk_base);
    cr_assert_eq(ferry_loop_new(&wk_loop, &(ferry_loop_opts){ .base = wk_base }), 0);
    cr_assert_eq(ferry_pool_new(&pool, &(ferry_pool_opts){ .threads = 1 }), 0);
    wd.tv_sec = (time_t)(tu_ms(3000) / 1000000000);
    watchdog = evtimer_new(wk_base, wk_watchdog_cb, NULL);
    cr_assert_not_null(watchdog);

    /* A task's job completes on a pool thread. */
    cr_assert_eq(evtimer_add(watchdog, &wd), 0);
    cr_assert_eq(ferry_task_spawn(NULL, wk_loop, wk_task, pool, NULL), 0);
    cr_assert_eq(event_base_dispatch(wk_base), 0);
    cr_assert_eq(atomic_load(&wk_watchdog), 0, "the job's completion did not wake the "
                 "application's dispatch (it ran when the watchdog fired)");
    cr_assert_eq(wk_job_rc, 5);

    /* Another thread posts while the dispatch sleeps. */
    cr_assert_eq(event_base_once(wk_base, -1, EV_TIMEOUT, wk_started_cb, NULL, &zero), 0);
    t = tu_start_thread(wk_poster, NULL);
    cr_assert_eq(event_base_dispatch(wk_base), 0);
    pthread_join(t, &res);
    cr_assert_null(res);
    cr_assert_eq(atomic_load(&wk_watchdog), 0, "the post did not wake the application's "
                 "dispatch (it ran when the watchdog fired)");
    cr_assert_eq(wk_posted_ran, 1);

    event_free(watchdog);
    ferry_pool_free(pool);
    ferry_loop_free(wk_loop);
    event_base_free(wk_base);
}

/* The lowest descriptor numbers a process could open next, n of them;
 * returns the highest. */
static int next_fds(int *fds, int n)
{
    for (int i = 0; i < n; i++)
        fds[i] = dup(2);
    for (int i = 0; i < n; i++)
        close(fds[i]);
    return fds[n - 1];
}

static void noop_cb_for_fds(void *arg)
{
    (void)arg;
}

/* Descriptors open now. */
static int open_fds(void)
{
    int n = 0;

    for (int fd = 0; fd < 4096; fd++)
        n += fcntl(fd, F_GETFD) != -1;
    return n;
}

/*
 * With k more descriptors allowed than libevent needs for a base (fewer
 * make libevent exit the process), a loop with its own base is made or
 * fails with -EMFILE (ferry's timerfd or eventfd), and leaves no
 * descriptor behind.
 */
Test(loop, new_reports_a_descriptor_limit_as_emfile, .timeout = 30.)
{
    struct rlimit old, lim;
    struct event_base *probe;
    int fds[32], first, base_fds, rc, emfile = 0;
    bool made = false;

    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &old), 0);
    base_fds = open_fds();
    probe = event_base_new();
    cr_assert_not_null(probe);
    base_fds = open_fds() - base_fds;
    event_base_free(probe);
    cr_assert_lt(base_fds + 8, 32);
    next_fds(fds, 1);
    first = fds[0];
    for (int k = 0; k < 8 && !made; k++) {
        ferry_loop *loop = NULL;

        lim = old;
        lim.rlim_cur = (rlim_t)next_fds(fds, base_fds + k) + 1;
        cr_assert_eq(setrlimit(RLIMIT_NOFILE, &lim), 0);
        rc = ferry_loop_new(&loop, NULL);
        cr_assert_eq(setrlimit(RLIMIT_NOFILE, &old), 0);
        cr_assert(rc == 0 || rc == -EMFILE, "%d descriptors more than a base needs: %d", k, rc);
        emfile += rc == -EMFILE;
        if (rc == 0) {
            made = true;
            ferry_loop_free(loop);
        } else {
            cr_assert_null(loop);
        }
        next_fds(fds, 1);
        cr_assert_eq(fds[0], first, "%d more descriptors: a descriptor was left open", k);
    }
    cr_assert(made);
    cr_assert_gt(emfile, 0, "no descriptor limit was reported as -EMFILE");
}

/* A loop attached to an application's base opens no descriptor: it is
 * woken through the base. */
Test(loop, attached_loop_needs_no_descriptor, .timeout = 30.)
{
    struct event_base *base = event_base_new();
    struct rlimit old, lim;
    ferry_loop *loop = NULL;
    int fds[1], rc;

    cr_assert_not_null(base);
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &old), 0);
    lim = old;
    lim.rlim_cur = (rlim_t)next_fds(fds, 1);   /* not even one more */
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &lim), 0);
    rc = ferry_loop_new(&loop, &(ferry_loop_opts){ .base = base });
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &old), 0);
    cr_assert_eq(rc, 0, "with no descriptor left: %d", rc);
    cr_assert_eq(ferry_call_soon(loop, noop_cb_for_fds, NULL), 0);
    cr_assert_eq(ferry_loop_run(loop, FERRY_RUN_DEFAULT), 0);
    ferry_loop_free(loop);
    event_base_free(base);
}

/* ---- freeing a loop with live tasks ----------------------------- */

static int cleanups;

static int cleanup_after_cancel(void *arg)
{
    int rc = ferry_sleep(FERRY_SEC(100));
    if (rc == -ECANCELED)
        cleanups++;
    return rc;
}

Test(loop, free_with_live_tasks_cancels_them_and_runs_cleanup, .timeout = 30.)
{
    ferry_loop *loop;

    cr_assert_eq(ferry_loop_new(&loop, NULL), 0);
    for (int i = 0; i < 100; i++)
        cr_assert_eq(ferry_task_spawn(NULL, loop, cleanup_after_cancel, NULL, NULL), 0);
    cr_assert_eq(ferry_loop_run(loop, FERRY_RUN_ONCE), 0);
    ferry_loop_free(loop);
    cr_assert_eq(cleanups, 100);
    cr_assert_eq(tu_leaks(), 0);
}

/* ---- run, stop, ref, dump ---------------------------------------- */

static int run_main(void *arg)
{
    ferry_sleep(FERRY_MSEC(1));
    return 77;
}

Test(loop, ferry_run_returns_main_status, .timeout = 30.)
{
    cr_assert_eq(ferry_run(run_main, NULL), 77);
    cr_assert_eq(ferry_run(NULL, NULL), -EINVAL);
    cr_assert_eq(tu_leaks(), 0);
}

static void stop_cb(void *arg)
{
    ferry_loop_stop(tu_loop);
}

/* ---- a task running a second loop ---------------------------------------- */

static int inner_yields;
static int inner_cb_yield = 1;

static int inner_task(void *arg)
{
    ferry_lock *lk = arg;
    int rc = ferry_lock_acquire(lk);

    if (rc == 0)
        rc = ferry_yield();
    if (rc == 0)
        inner_yields++;
    ferry_lock_release(lk);
    return rc;
}

static int outer_marker;
static int outer_marker_at_spawn = -1, inner_cb_spawn = -1;

static int mark_outer(void *arg)
{
    (void)arg;
    outer_marker = 1;
    return 0;
}

static void inner_cb(void *arg)
{
    ferry_task_opts eager = { .flags = FERRY_SPAWN_EAGER };

    (void)arg;
    /* A callback of the inner loop is not a task, though it runs on the
     * outer task's stack. */
    inner_cb_yield = ferry_yield();
    /* Nor can it make the outer task step aside for an eager spawn: the
     * new task of the outer loop runs later, the usual way. */
    inner_cb_spawn = ferry_task_spawn(NULL, tu_loop, mark_outer, NULL, &eager);
    outer_marker_at_spawn = outer_marker;
}

static int outer_task(void *arg)
{
    ferry_loop *inner = arg;
    ferry_lock lk = FERRY_LOCK_INIT;
    ferry_task *t;
    int rc, st = -1;

    /* The callback first: it runs before any task of the inner loop. */
    if ((rc = ferry_call_soon(inner, inner_cb, NULL)) ||
        (rc = ferry_task_spawn(&t, inner, inner_task, &lk, NULL)) ||
        (rc = ferry_loop_run(inner, FERRY_RUN_DEFAULT)) ||
        (rc = ferry_task_try_join(t, &st)))
        return 2000 + rc;
    if (st != 0)
        return 3000 + st;
    /* Back in the outer task: still a task of the outer loop. */
    if ((rc = ferry_yield()))
        return 4000 + rc;
    return ferry_task_current() ? 0 : -5000;
}

T(a_task_can_run_another_loop_and_is_itself_again_after)
{
    ferry_loop *inner;
    int rc;

    /* Made before the outer loop runs (a task cannot make a loop). */
    cr_assert_eq(ferry_loop_new(&inner, NULL), 0);
    rc = tu_run(outer_task, inner);
    ferry_loop_free(inner);
    cr_assert_eq(rc, 0, "rc %d", rc);
    cr_assert_eq(inner_yields, 1);
    cr_assert_eq(inner_cb_yield, -EPERM);
    cr_assert_eq(inner_cb_spawn, 0);
    cr_assert_eq(outer_marker_at_spawn, 0);
    cr_assert_eq(outer_marker, 1);
}

T(ref_keeps_default_run_alive_until_stopped)
{
    cr_assert_eq(ferry_loop_ref(tu_loop), 0);
    ferry_call_later(tu_loop, tu_ms(5), stop_cb, NULL, NULL);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(ferry_loop_unref(tu_loop), 0);
    cr_assert_eq(ferry_loop_unref(tu_loop), -EINVAL);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
}

static int dump_sleeper(void *arg)
{
    return ferry_sleep(FERRY_SEC(100));
}

T(dump_lists_live_tasks_with_state)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ferry_task *t;

    ferry_task_spawn(&t, tu_loop, dump_sleeper, NULL, &(ferry_task_opts){ .name = "napper" });
    ferry_loop_run(tu_loop, FERRY_RUN_ONCE);
    cr_assert_eq(ferry_loop_dump(tu_loop, f), 1);
    fclose(f);
    cr_assert(strstr(buf, "napper") && strstr(buf, "waiting") && strstr(buf, "sleep"),
              "dump was: %s", buf);
    free(buf);
    cr_assert_eq(tu_cancel_join(t), -ECANCELED);
}

/* ---- blocked-loop detector ---------------------------------------- */

static char logged[512];
static int nlogged;

static void capture_log(int level, const char *msg, void *ctx)
{
    nlogged++;
    snprintf(logged, sizeof logged, "%s", msg);
}

static int blocker(void *arg)
{
    usleep(200 * 1000);        /* the mistake: a blocking call on the loop */
    return 0;
}

static int polite(void *arg)
{
    for (int i = 0; i < 100; i++)
        ferry_sleep(FERRY_USEC(100));
    return 0;
}

T(blocked_loop_detector_names_the_task)
{
    ferry_set_log(capture_log, NULL);
    cr_assert_eq(ferry_loop_set_slow_threshold(tu_loop, FERRY_MSEC(100)), 0);
    ferry_task_spawn(NULL, tu_loop, polite, NULL, &(ferry_task_opts){ .name = "polite" });
    ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT);
    cr_assert_eq(nlogged, 0, "false report: %s", logged);
    ferry_task_spawn(NULL, tu_loop, blocker, NULL, &(ferry_task_opts){ .name = "sleepy-io" });
    ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT);
    ferry_set_log(NULL, NULL);
    cr_assert_eq(nlogged, 1);
    cr_assert(strstr(logged, "sleepy-io"), "log was: %s", logged);
    cr_assert_eq(ferry_loop_set_slow_threshold(tu_loop, -1), -EINVAL);
}
