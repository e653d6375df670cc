/* test_attach.c - a loop attached to an application's event_base
 * (ferry_loop_opts.base): the application's dispatch runs ferry's turns,
 * a bounded number per kick; the base must have libevent's lock; wakeups
 * from other threads reach it without a descriptor of ferry's; running or
 * freeing the loop from its own callbacks is refused; a failed
 * ferry_loop_new() leaves the base as it was.
 *
 * No cr_assert inside task bodies (see testutil.h).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/resource.h>
#include <unistd.h>

#include <event2/event.h>
#include <criterion/criterion.h>

#include "testutil.h"
#include "fault.h"
#include "ferry/bridge.h"

#define T(name) Test(attach, name, .init = tu_alloc_setup, .fini = tu_loop_teardown, .timeout = 30.)

/* libevent's allocations go through the fault hook too, so that a test can
 * fail them (as tests/fault_sites.c does). */
__attribute__((constructor)) static void route_libevent(void)
{
    tu_libevent_fault_hook(NULL);
}

static void set_flag(void *arg)
{
    *(int *)arg += 1;
}

static void noop_cb(void *arg)
{
    (void)arg;
}

/* ---- the application's dispatch runs the loop ------------------------- */

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

T(task_steps_interleave_with_the_application_s_events)
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

T(base_made_before_ferry_set_libevent_up_is_refused)
{
    ferry_loop *loop = (ferry_loop *)&loop;

    cr_assert_not_null(early_base);
    cr_assert_eq(ferry_loop_new(&loop, &(ferry_loop_opts){ .base = early_base }), -EINVAL,
                 "a base without libevent's lock was accepted: other threads' wakeups "
                 "would never reach it");
    cr_assert_null(loop);
}

T(base_made_without_lock_is_refused)
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

T(base_made_before_the_first_ferry_call_gets_wakeups_from_threads)
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

/* A loop attached to an application's base opens no descriptor: it is
 * woken through the base. */
T(loop_needs_no_descriptor)
{
    struct event_base *base = event_base_new();
    struct rlimit old, lim;
    ferry_loop *loop = NULL;
    int next, rc;

    cr_assert_not_null(base);
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &old), 0);
    next = dup(2);                            /* the lowest number free */
    cr_assert_geq(next, 0);
    close(next);
    lim = old;
    lim.rlim_cur = (rlim_t)next;               /* not even one more */
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &lim), 0);
    rc = ferry_loop_new(&loop, &(ferry_loop_opts){ .base = base });
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &old), 0);
    cr_assert_eq(rc, 0, "with no descriptor left: %d", rc);
    cr_assert_eq(ferry_call_soon(loop, noop_cb, NULL), 0);
    cr_assert_eq(ferry_loop_run(loop, FERRY_RUN_DEFAULT), 0);
    ferry_loop_free(loop);
    event_base_free(base);
}

/* ---- kicks, and running or freeing from the loop's own callbacks ---- */

static int attached_yields;

static int yielder(void *arg)
{
    (void)arg;
    for (int i = 0; i < 20; i++) {
        if (ferry_yield())
            return -1;
        attached_yields++;
    }
    return 0;
}

T(loop_runs_a_bounded_number_of_steps_per_kick)
{
    struct event_base *base = event_base_new();
    ferry_loop_stats st;
    ferry_task *t[3];
    ferry_loop *l;
    int status;

    cr_assert_not_null(base);
    cr_assert_eq(ferry_loop_new(&l, &(ferry_loop_opts){ .base = base, .io_interval = 2 }), 0);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(ferry_task_spawn(&t[i], l, yielder, NULL, NULL), 0);
    cr_assert_eq(event_base_dispatch(base), 1, "dispatch ended with events left");
    cr_assert_eq(attached_yields, 60);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(ferry_task_try_join(t[i], &status), 0);
        cr_assert_eq(status, 0);
    }
    cr_assert_eq(ferry_loop_stats_get(l, &st), 0);
    cr_assert_geq(st.steps, 63);
    ferry_loop_free(l);
    event_base_free(base);
    cr_assert_eq(tu_leaks(), 0);
}

T(loop_run_directly_ignores_its_pending_kick_and_a_stale_tick)
{
    struct event_base *base = event_base_new();
    ferry_timer *tm;
    ferry_loop *l;
    int ran = 0, fired = 0;

    cr_assert_not_null(base);
    cr_assert_eq(ferry_loop_new(&l, &(ferry_loop_opts){ .base = base }), 0);
    /* Outside ferry_loop_run, a callback activates the kick event. */
    cr_assert_eq(ferry_call_soon(l, set_flag, &ran), 0);
    /* ferry_loop_run() runs it and then polls the base, where the kick is
     * still active: it must not run a turn inside the turn. */
    cr_assert_eq(ferry_loop_run(l, FERRY_RUN_ONCE), 0);
    cr_assert_eq(ran, 1);
    cr_assert_eq(event_base_loop(base, EVLOOP_NONBLOCK), 1);
    cr_assert_eq(ran, 1);
    /* A timer cancelled after it armed the base's tick: the tick fires,
     * finds nothing and disarms, and the application's dispatch ends. */
    cr_assert_eq(ferry_call_later(l, FERRY_MSEC(1), set_flag, &fired, &tm), 0);
    cr_assert_eq(ferry_timer_cancel(tm), 0);
    cr_assert_eq(event_base_dispatch(base), 1);
    cr_assert_eq(fired, 0);
    ferry_loop_free(l);
    event_base_free(base);
    cr_assert_eq(tu_leaks(), 0);
}

static ferry_loop *att;
static int att_rc[2] = { 1, 1 };

static void reenter_attached(void *arg)
{
    att_rc[0] = ferry_loop_run(att, FERRY_RUN_ONCE);   /* inside a turn of the dispatch */
    ferry_loop_free(att);                              /* ignored */
    att_rc[1] = ferry_call_soon(att, set_flag, arg);
}

T(loop_refuses_run_and_free_from_its_own_callbacks)
{
    struct event_base *base = event_base_new();
    ferry_loop *first;
    int later = 0;

    cr_assert_not_null(base);
    cr_assert_eq(ferry_loop_new(&first, NULL), 0);
    cr_assert_eq(ferry_loop_new(&att, &(ferry_loop_opts){ .base = base }), 0);
    ferry_loop_free(first);
    cr_assert_null(ferry_loop_current(), "the thread has no current loop now");
    cr_assert_eq(ferry_call_soon(att, reenter_attached, &later), 0);
    cr_assert_eq(event_base_dispatch(base), 1);
    cr_assert_eq(att_rc[0], -EPERM);
    cr_assert_eq(att_rc[1], 0, "the loop was freed from its own callback");
    cr_assert_eq(later, 1);
    cr_assert_eq(ferry_loop_current(), att, "the dispatch made it current");
    ferry_loop_free(att);
    event_base_free(base);
    cr_assert_eq(tu_leaks(), 0);
}

/* ---- a failed ferry_loop_new() ------------------------------------------ */

T(loop_new_undoes_everything_on_failure_and_leaves_the_base_working)
{
    struct event_base *base;
    ferry_loop *l;
    unsigned long n, hits;
    int rc, enomem = 0;

    cr_assert_eq(ferry_loop_new(&l, NULL), 0);   /* one-time setup done */
    ferry_loop_free(l);
    base = event_base_new();
    cr_assert_not_null(base);
    for (n = 1; n < 1000; n++) {
        ferry__fault_arm(n, false);
        l = (ferry_loop *)&n;
        rc = ferry_loop_new(&l, &(ferry_loop_opts){ .base = base });
        hits = ferry__fault_hits();
        ferry__fault_reset();
        if (rc == 0) {
            cr_assert_eq(ferry_loop_base(l), base);
            cr_assert_eq(tu_run_on(l, tu_ret42, NULL), 42);
            ferry_loop_free(l);
            if (hits == 0)
                break;
        } else {
            cr_assert_eq(rc, -ENOMEM, "point %lu: %d", n, rc);
            cr_assert_null(l);
            enomem++;
        }
        /* The application's base is intact and still dispatches. */
        cr_assert_eq(event_base_loop(base, EVLOOP_NONBLOCK), 1);
    }
    cr_assert_lt(n, 1000);
    cr_assert_gt(enomem, 2);
    event_base_free(base);
    cr_assert_eq(tu_leaks(), 0);
}
