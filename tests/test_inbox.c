/* test_inbox.c - posting into a loop from other threads (bridge.h: the
 * inbox, ferry_loop_call_soon_threadsafe, ferry_loop_stop_threadsafe):
 * order, one wakeup per burst, a post racing the drain, timers not starved
 * by a flood, posts accepted before a loop is freed run and later ones are
 * refused, a failed eventfd write, a queue that cannot grow, a loop
 * attached to an application's base, bad arguments.
 *
 * No cr_assert inside task bodies or callbacks: they record, the test body
 * asserts after the loop returned.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <poll.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/thread.h>
#include <criterion/criterion.h>

#include "testutil.h"
#include "fault.h"
#include "wakefd.h"
#include "ferry/bridge.h"

/* Tests on tu_loop, and tests that make their own loops. */
#define T(name) Test(inbox, name, .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
#define TL(name) Test(inbox, name, .init = tu_alloc_setup, .fini = tu_loop_teardown, .timeout = 30.)

static void noop_cb(void *arg)
{
    (void)arg;
}

static void set_flag(void *arg)
{
    *(int *)arg += 1;
}

static int job42(void *arg)
{
    (void)arg;
    return 42;
}

/* ---- order, wakeups, fairness ------------------------------------------ */

#define ORDER_N 10000

static int order_seen[ORDER_N];
static int order_count;
static bool order_wrong_thread;

static void order_cb(void *arg)
{
    intptr_t i = (intptr_t)arg;
    if (!ferry_loop_is_current(tu_loop))
        order_wrong_thread = true;
    order_seen[order_count++] = (int)i;
    if (order_count == ORDER_N)
        ferry_loop_stop(tu_loop);
}

static void *order_poster(void *arg)
{
    (void)arg;
    for (intptr_t i = 0; i < ORDER_N; i++)
        while (ferry_loop_call_soon_threadsafe(tu_loop, order_cb, (void *)i) != 0)
            sched_yield();
    return NULL;
}

T(posts_from_a_thread_run_on_the_loop_in_order)
{
    pthread_t t = tu_start_thread(order_poster, NULL);
    ferry_loop_run(tu_loop, FERRY_RUN_FOREVER);
    pthread_join(t, NULL);
    cr_assert_eq(order_count, ORDER_N);
    cr_assert(!order_wrong_thread);
    for (int i = 0; i < ORDER_N; i++)
        cr_assert_eq(order_seen[i], i, "position %d holds %d", i, order_seen[i]);
}

static atomic_int burst_ran;
static void burst_cb(void *arg) { (void)arg; atomic_fetch_add(&burst_ran, 1); }

static void *burst_poster(void *arg)
{
    intptr_t n = (intptr_t)arg;
    for (intptr_t i = 0; i < n; i++)
        if (ferry_loop_call_soon_threadsafe(tu_loop, burst_cb, NULL) != 0)
            return (void *)1;
    return NULL;
}

T(burst_while_loop_sleeps_costs_one_eventfd_write)
{
    ferry_inbox_stats st;
    void *bad;
    pthread_t t = tu_start_thread(burst_poster, (void *)(intptr_t)100000);

    pthread_join(t, &bad);
    cr_assert_null(bad);
    cr_assert_eq(ferry_loop_inbox_stats_get(tu_loop, &st), 0);
    cr_assert_eq(st.posts, 100000);
    cr_assert_eq(st.wakeups, 1, "wakeups %llu", (unsigned long long)st.wakeups);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(atomic_load(&burst_ran), 100000);
    cr_assert_eq(ferry_loop_inbox_stats_get(tu_loop, &st), 0);
    cr_assert_eq(st.run, 100000);
    /* Drained in bounded batches, not in one go. */
    cr_assert_leq(st.max_batch, 1024);
    cr_assert_geq(st.drains, 1);
}

static int timer_fired_at;   /* callbacks run before the timer fired */
static int flood_ran;
static void flood_cb(void *arg) { (void)arg; flood_ran++; }
static void flood_timer_cb(void *arg) { (void)arg; timer_fired_at = flood_ran; }

T(flood_of_posts_does_not_starve_timers)
{
    pthread_t t = tu_start_thread(burst_poster, (void *)(intptr_t)0);
    pthread_join(t, NULL);
    for (int i = 0; i < 50000; i++)
        cr_assert_eq(ferry_loop_call_soon_threadsafe(tu_loop, flood_cb, NULL), 0);
    timer_fired_at = -1;
    cr_assert_eq(ferry_call_later(tu_loop, 0, flood_timer_cb, NULL, NULL), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(flood_ran, 50000);
    cr_assert_geq(timer_fired_at, 0);
    cr_assert_lt(timer_fired_at, 50000, "timer waited for the whole flood");
}

/* A post that lands while the loop is draining (after it took the queue,
 * before it looked again) must run without any further wakeup. */
static int race_ran;
static void race_inner_cb(void *arg) { (void)arg; race_ran++; }

static void *race_poster(void *arg)
{
    (void)arg;
    ferry_loop_call_soon_threadsafe(tu_loop, race_inner_cb, NULL);
    return NULL;
}

static void race_outer_cb(void *arg)
{
    pthread_t t;
    (void)arg;
    /* We are inside the drain: the queue was swapped out, `woken` is set. */
    pthread_create(&t, NULL, race_poster, NULL);
    pthread_join(t, NULL);
    race_ran++;
}

T(post_racing_the_drain_still_runs)
{
    ferry_inbox_stats before, after;

    for (int round = 0; round < 200; round++) {
        race_ran = 0;
        cr_assert_eq(ferry_loop_inbox_stats_get(tu_loop, &before), 0);
        cr_assert_eq(ferry_loop_call_soon_threadsafe(tu_loop, race_outer_cb, NULL), 0);
        /* RUN_DEFAULT would block forever on a stranded post (pending). */
        cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
        cr_assert_eq(race_ran, 2, "round %d", round);
        cr_assert_eq(ferry_loop_inbox_stats_get(tu_loop, &after), 0);
        /* The inner post needed no eventfd write: the drain picked it up. */
        cr_assert_eq(after.wakeups, before.wakeups);
    }
}

static atomic_int late_ran;
static void late_cb(void *arg) { (void)arg; atomic_fetch_add(&late_ran, 1); }

TL(accepted_posts_run_when_the_loop_is_freed_later_ones_refused)
{
    ferry_loop *loop;
    ferry_inbox *ib;

    cr_assert_eq(ferry_loop_new(&loop, NULL), 0);
    cr_assert_eq(ferry_inbox_get(&ib, loop), 0);
    for (int i = 0; i < 1000; i++)
        cr_assert_eq(ferry_inbox_post(ib, late_cb, NULL), 0);
    ferry_loop_free(loop);                    /* never ran: the posts run here */
    cr_assert_eq(atomic_load(&late_ran), 1000);
    cr_assert_eq(ferry_inbox_post(ib, late_cb, NULL), -ESHUTDOWN);
    ferry_inbox_unref(ib);
    cr_assert_eq(atomic_load(&late_ran), 1000);
    cr_assert_eq(tu_leaks(), 0);
}

static void *stopper(void *arg)
{
    atomic_int *running = arg;
    tu_spin_until(running);
    for (int i = 0; i < 3; i++)                /* several count as one */
        if (ferry_loop_stop_threadsafe(tu_loop) != 0)
            return (void *)1;
    return NULL;
}

static void mark_running(void *arg) { atomic_store((atomic_int *)arg, 1); }

T(stop_from_another_thread)
{
    atomic_int running = 0;
    void *bad;
    pthread_t t;

    cr_assert_eq(ferry_call_soon(tu_loop, mark_running, &running), 0);
    t = tu_start_thread(stopper, &running);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_FOREVER), 0);   /* returns */
    pthread_join(t, &bad);
    cr_assert_null(bad);
    /* A stop posted after the loop had run the first one is still
     * pending: it ends this run at once. */
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
}

T(a_post_from_the_loop_thread_keeps_default_run_going_until_it_ran)
{
    int ran = 0;

    cr_assert_eq(ferry_loop_call_soon_threadsafe(tu_loop, set_flag, &ran), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(ran, 1);
}

/* ---- failures -------------------------------------------------------------- */

static atomic_int efd_ran;
static void efd_cb(void *arg) { (void)arg; atomic_fetch_add(&efd_ran, 1); }
static void *efd_poster(void *arg)
{
    (void)arg;
    /* The queue has room already, so the only counted point on this path
     * is the eventfd write. */
    ferry__fault_arm(1, false);
    if (ferry_loop_call_soon_threadsafe(tu_loop, efd_cb, NULL) != 0)
        return (void *)1;
    return NULL;
}

T(failed_eventfd_write_is_reported_and_the_post_still_runs)
{
    ferry_inbox_stats st;
    void *bad;
    pthread_t t;

    /* Grow both buffers of the queue (it is double-buffered), drain. */
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(ferry_loop_call_soon_threadsafe(tu_loop, efd_cb, NULL), 0);
        cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    }
    tu_log_capture_start();
    t = tu_start_thread(efd_poster, NULL);
    pthread_join(t, &bad);
    cr_assert_null(bad);
    cr_assert_eq(ferry__fault_hits(), 1);
    cr_assert_str_eq(ferry__fault_last_site(), "eventfd write");
    ferry__fault_reset();
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    tu_log_capture_stop();
    cr_assert_eq(atomic_load(&efd_ran), 3);
    cr_assert_eq(ferry_loop_inbox_stats_get(tu_loop, &st), 0);
    cr_assert_eq(st.write_errors, 1);
    cr_assert_eq(tu_log_lines(), 1, "log: %s", tu_log_text());
    cr_assert(strstr(tu_log_text(), "eventfd write"), "log: %s", tu_log_text());
}

T(bad_arguments_are_einval)
{
    ferry_inbox *ib = NULL;
    ferry_inbox_stats st;

    cr_assert_eq(ferry_loop_call_soon_threadsafe(NULL, noop_cb, NULL), -EINVAL);
    cr_assert_eq(ferry_loop_call_soon_threadsafe(tu_loop, NULL, NULL), -EINVAL);
    cr_assert_eq(ferry_inbox_post(NULL, noop_cb, NULL), -EINVAL);
    cr_assert_eq(ferry_inbox_get(NULL, tu_loop), -EINVAL);
    cr_assert_eq(ferry_inbox_get(&ib, NULL), -EINVAL);
    cr_assert_eq(ferry_loop_stop_threadsafe(NULL), -EINVAL);
    cr_assert_eq(ferry_inbox_stats_get(NULL, &st), -EINVAL);
    cr_assert_eq(ferry_loop_inbox_stats_get(NULL, &st), -EINVAL);
    cr_assert_eq(ferry_loop_inbox_stats_get(tu_loop, NULL), -EINVAL);
    cr_assert_eq(ferry_inbox_get(&ib, tu_loop), 0);
    cr_assert_eq(ferry_inbox_post(ib, NULL, NULL), -EINVAL);
    cr_assert_eq(ferry_inbox_stats_get(ib, NULL), -EINVAL);
    ferry_inbox_unref(ib);
    ferry_inbox_unref(NULL);
}

/* The earlier names, kept for programs written against them, do what the
 * current ones do: the stats agree, and the reference taken is given back
 * (the teardown finds nothing left). */
T(earlier_names_still_work)
{
    ferry_inbox_stats a, b;
    ferry_inbox *ib = NULL;

    cr_assert_eq(ferry_loop_call_soon_threadsafe(tu_loop, noop_cb, NULL), 0);
    cr_assert_eq(ferry_loop_inbox_stats(tu_loop, &a), 0);
    cr_assert_eq(ferry_loop_inbox_stats_get(tu_loop, &b), 0);
    cr_assert_eq(a.posts, b.posts);
    cr_assert_geq(a.posts, 1);
    cr_assert_eq(ferry_loop_inbox_stats(NULL, &a), -EINVAL);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(ferry_loop_inbox_stats(tu_loop, &a), 0);
    cr_assert_eq(a.run, b.run + 1);
    cr_assert_eq(ferry_inbox_get(&ib, tu_loop), 0);
    ferry_inbox_release(ib);
}

/* A callback accepted before ferry_loop_free() runs during it; from there
 * every entry point that needs an open loop refuses with -ESHUTDOWN. */
static int closing_rc[6];
static int closing_ran;
static void during_free_cb(void *arg)
{
    ferry_loop *loop = arg;
    ferry_inbox *ib = NULL;
    ferry_inbox_stats st;

    closing_ran++;
    closing_rc[0] = ferry_loop_call_soon_threadsafe(loop, noop_cb, NULL);
    closing_rc[1] = ferry_loop_stop_threadsafe(loop);
    closing_rc[2] = ferry_inbox_get(&ib, loop);
    closing_rc[3] = ferry_loop_inbox_stats_get(loop, &st);
    closing_rc[4] = ferry_pool_submit(NULL, job42, NULL, loop, NULL, NULL);
}

TL(a_closing_loop_refuses_with_eshutdown_and_the_inbox_outlives_it)
{
    ferry_loop *loop;
    ferry_inbox *ib;
    ferry_inbox_stats st;

    cr_assert_eq(ferry_loop_new(&loop, NULL), 0);
    cr_assert_eq(ferry_inbox_get(&ib, loop), 0);
    cr_assert_eq(ferry_loop_call_soon_threadsafe(loop, during_free_cb, loop), 0);
    ferry_loop_free(loop);                   /* runs the accepted post */
    cr_assert_eq(closing_ran, 1);
    for (int i = 0; i < 5; i++) {
        /* ferry_loop_inbox_stats_get() still reports while the loop is being
         * freed (the inbox is closed but still attached): 0 or -ESHUTDOWN. */
        if (i == 3 && closing_rc[i] == 0)
            continue;
        cr_assert_eq(closing_rc[i], -ESHUTDOWN, "call %d: %d", i, closing_rc[i]);
    }
    /* The inbox handle stays valid: posts are refused, stats still read. */
    cr_assert_eq(ferry_inbox_post(ib, noop_cb, NULL), -ESHUTDOWN);
    cr_assert_eq(ferry_inbox_stats_get(ib, &st), 0);
    cr_assert_geq(st.posts, 1);
    cr_assert_geq(st.run, 1);
    ferry_inbox_unref(ib);
}

/* The queue cannot grow: -ENOMEM and nothing queued; every post accepted
 * before still runs, once. */
static int grown_runs;
static void count_cb(void *arg) { (void)arg; grown_runs++; }

T(post_that_cannot_grow_the_queue_is_enomem)
{
    int accepted = 0, rc = 0;
    ferry_inbox_stats st;

    ferry_set_log(NULL, NULL);
    ferry__fault_arm(1, true);
    for (int i = 0; i < 100000; i++) {
        rc = ferry_loop_call_soon_threadsafe(tu_loop, count_cb, NULL);
        if (rc)
            break;
        accepted++;
    }
    ferry__fault_reset();
    cr_assert_eq(rc, -ENOMEM);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(grown_runs, accepted);
    cr_assert_eq(ferry_loop_inbox_stats_get(tu_loop, &st), 0);
    cr_assert_eq(st.posts, (uint64_t)accepted);
}

/* ---- the blocked-loop detector, an attached base --------------------------- */

/* A callback posted from a thread that blocks the loop past the threshold
 * is reported by the blocked-loop detector ("by a callback"). */
static void blocking_cb(void *arg)
{
    (void)arg;
    usleep(30000);          /* 30 ms: always longer than the 5 ms threshold */
}

static void *post_blocking(void *arg)
{
    (void)arg;
    ferry_loop_call_soon_threadsafe(tu_loop, blocking_cb, NULL);
    return NULL;
}

T(slow_threadsafe_callback_is_reported)
{
    ferry_loop_stats ls;

    cr_assert_eq(ferry_loop_set_slow_threshold(tu_loop, FERRY_MSEC(5)), 0);
    tu_log_capture_start();
    tu_on_thread(post_blocking, NULL);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    tu_log_capture_stop();
    cr_assert_geq(tu_log_lines(), 1);
    cr_assert(strstr(tu_log_text(), "callback"), "log: %s", tu_log_text());
    cr_assert_eq(ferry_loop_stats_get(tu_loop, &ls), 0);
    cr_assert_geq(ls.slow_steps, 1);
}

/* A loop attached to an application's event_base is woken through
 * libevent's own notification (no eventfd of ferry's): posts from a thread
 * run, in order, exactly once. */

static int att_seen[100], att_n;
static void att_cb(void *arg) { att_seen[att_n++] = (int)(intptr_t)arg; }
static ferry_loop *att_loop;
static void *att_poster(void *arg)
{
    (void)arg;
    for (intptr_t i = 0; i < 100; i++)
        if (ferry_loop_call_soon_threadsafe(att_loop, att_cb, (void *)i) != 0)
            return (void *)1;
    ferry_loop_stop_threadsafe(att_loop);
    return NULL;
}

TL(attached_base_posts_run_in_order)
{
    struct event_base *base;
    ferry_inbox_stats st;
    pthread_t t;
    void *res;

    evthread_use_pthreads();
    base = event_base_new();
    cr_assert_not_null(base);
    cr_assert_eq(ferry_loop_new(&att_loop, &(ferry_loop_opts){ .base = base }), 0);
    t = tu_start_thread(att_poster, NULL);
    cr_assert_eq(ferry_loop_run(att_loop, FERRY_RUN_FOREVER), 0);
    pthread_join(t, &res);
    cr_assert_null(res);
    while (att_n < 100)
        ferry_loop_run(att_loop, FERRY_RUN_ONCE);
    for (int i = 0; i < 100; i++)
        cr_assert_eq(att_seen[i], i);
    cr_assert_eq(ferry_loop_inbox_stats_get(att_loop, &st), 0);
    cr_assert_eq(st.write_errors, 0);
    ferry_loop_free(att_loop);
    event_base_free(base);
}

/* ---- the wake descriptor: a full counter, a bad descriptor, no descriptor left ---- */

static bool readable(int fd)
{
    struct pollfd p = { .fd = fd, .events = POLLIN };

    return poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

TL(wakefd_full_counter_is_a_wake_a_bad_fd_its_errno_and_no_descriptor_emfile)
{
    struct ferry__wakefd w;
    struct rlimit old, low;
    int fds[64], nfd = 0;
    uint64_t max = UINT64_MAX - 1;

    cr_assert_eq(ferry__wakefd_open(&w), 0);
    /* The counter at its largest: a write would block, and the read end
     * is readable, so it counts as done. */
    cr_assert_eq(write(w.wfd, &max, sizeof max), (ssize_t)sizeof max);
    cr_assert_eq(ferry__wakefd_write(w.wfd), 0);
    cr_assert(readable(w.rfd));
    ferry__wakefd_drain(w.rfd);
    cr_assert_not(readable(w.rfd));
    ferry__wakefd_close(&w);
    cr_assert_eq(w.rfd, -1);
    cr_assert_eq(w.wfd, -1);
    cr_assert_eq(ferry__wakefd_write(-1), EBADF);

    /* Every descriptor the limit allows in use: -EMFILE, both ends -1. */
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &old), 0);
    low = old;
    low.rlim_cur = 64;
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
    while (nfd < 64 && (fds[nfd] = dup(0)) >= 0)
        nfd++;
    cr_assert_lt(nfd, 64);
    w.rfd = w.wfd = 7;
    cr_assert_eq(ferry__wakefd_open(&w), -EMFILE);
    cr_assert_eq(w.rfd, -1);
    cr_assert_eq(w.wfd, -1);
    while (nfd > 0)
        close(fds[--nfd]);
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &old), 0);
    cr_assert_eq(ferry__wakefd_open(&w), 0);
    ferry__wakefd_close(&w);
}
