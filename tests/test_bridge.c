/* test_bridge.c - ferry/bridge.h: the inbox (call_soon_threadsafe), thread
 * pools and to_thread, calling into a loop from threads, the mixed
 * channel, and the blocked-loop detector.
 *
 * No cr_assert inside task bodies or callbacks: they record, the test body
 * asserts after the loop returned.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "testutil.h"
#include "fault.h"
#include "ferry/bridge.h"

/* ---- helpers -------------------------------------------------------- */

/* Log lines captured through ferry_set_log(). */
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char log_buf[4096];
static int log_lines;

static void capture_log(int level, const char *msg, void *ctx)
{
    (void)level; (void)ctx;
    pthread_mutex_lock(&log_mu);
    log_lines++;
    strncat(log_buf, msg, sizeof log_buf - strlen(log_buf) - 2);
    strcat(log_buf, "\n");
    pthread_mutex_unlock(&log_mu);
}

static void log_capture_start(void)
{
    log_buf[0] = 0;
    log_lines = 0;
    ferry_set_log(capture_log, NULL);
}

static void log_capture_stop(void)
{
    ferry_set_log(NULL, NULL);
}

/* ==== inbox ============================================================= */

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

Test(inbox, posts_from_a_thread_run_on_the_loop_in_order,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
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

Test(inbox, burst_while_loop_sleeps_costs_one_eventfd_write,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    ferry_inbox_stats st;
    void *bad;
    pthread_t t = tu_start_thread(burst_poster, (void *)(intptr_t)100000);

    pthread_join(t, &bad);
    cr_assert_null(bad);
    cr_assert_eq(ferry_loop_inbox_stats(tu_loop, &st), 0);
    cr_assert_eq(st.posts, 100000);
    cr_assert_eq(st.wakeups, 1, "wakeups %llu", (unsigned long long)st.wakeups);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(atomic_load(&burst_ran), 100000);
    cr_assert_eq(ferry_loop_inbox_stats(tu_loop, &st), 0);
    cr_assert_eq(st.run, 100000);
    /* Drained in bounded batches, not in one go. */
    cr_assert_leq(st.max_batch, 1024);
    cr_assert_geq(st.drains, 1);
}

static int timer_fired_at;   /* callbacks run before the timer fired */
static int flood_ran;
static void flood_cb(void *arg) { (void)arg; flood_ran++; }
static void flood_timer_cb(void *arg) { (void)arg; timer_fired_at = flood_ran; }

Test(inbox, flood_of_posts_does_not_starve_timers,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
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

Test(inbox, post_racing_the_drain_still_runs,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    ferry_inbox_stats before, after;

    for (int round = 0; round < 200; round++) {
        race_ran = 0;
        cr_assert_eq(ferry_loop_inbox_stats(tu_loop, &before), 0);
        cr_assert_eq(ferry_loop_call_soon_threadsafe(tu_loop, race_outer_cb, NULL), 0);
        /* RUN_DEFAULT would block forever on a stranded post (pending). */
        cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
        cr_assert_eq(race_ran, 2, "round %d", round);
        cr_assert_eq(ferry_loop_inbox_stats(tu_loop, &after), 0);
        /* The inner post needed no eventfd write: the drain picked it up. */
        cr_assert_eq(after.wakeups, before.wakeups);
    }
}

static atomic_int late_ran;
static void late_cb(void *arg) { (void)arg; atomic_fetch_add(&late_ran, 1); }

Test(inbox, accepted_posts_run_when_the_loop_is_freed_later_ones_refused, .timeout = 30.)
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
    ferry_inbox_release(ib);
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

Test(inbox, stop_from_another_thread,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
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

Test(inbox, bad_arguments)
{
    ferry_inbox *ib;
    cr_assert_eq(ferry_loop_call_soon_threadsafe(NULL, late_cb, NULL), -EINVAL);
    cr_assert_eq(ferry_inbox_get(&ib, NULL), -EINVAL);
    cr_assert_eq(ferry_inbox_post(NULL, late_cb, NULL), -EINVAL);
    cr_assert_eq(ferry_loop_stop_threadsafe(NULL), -EINVAL);
}

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

Test(inbox, failed_eventfd_write_is_reported_and_the_post_still_runs,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    ferry_inbox_stats st;
    void *bad;
    pthread_t t;

    /* Grow both buffers of the queue (it is double-buffered), drain. */
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(ferry_loop_call_soon_threadsafe(tu_loop, efd_cb, NULL), 0);
        cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    }
    log_capture_start();
    t = tu_start_thread(efd_poster, NULL);
    pthread_join(t, &bad);
    cr_assert_null(bad);
    cr_assert_eq(ferry__fault_hits(), 1);
    cr_assert_str_eq(ferry__fault_last_site(), "eventfd write");
    ferry__fault_reset();
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    log_capture_stop();
    cr_assert_eq(atomic_load(&efd_ran), 3);
    cr_assert_eq(ferry_loop_inbox_stats(tu_loop, &st), 0);
    cr_assert_eq(st.write_errors, 1);
    cr_assert_eq(log_lines, 1);
    cr_assert(strstr(log_buf, "eventfd write"), "log: %s", log_buf);
}

/* ==== pool: to_thread ================================================== */

static pthread_t job_thread;
static int job_ret42(void *arg)
{
    (void)arg;
    job_thread = pthread_self();
    return 42;
}

static int to_thread_basic_task(void *arg)
{
    ferry_pool *p = arg;
    return ferry_to_thread(p, job_ret42, NULL);
}

Test(pool, to_thread_returns_the_status_from_a_pool_thread,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    ferry_pool *p;
    ferry_pool_stats st;

    cr_assert_eq(ferry_pool_new(&p, &(ferry_pool_opts){ .threads = 2 }), 0);
    cr_assert_eq(tu_run(to_thread_basic_task, p), 42);
    cr_assert(!pthread_equal(job_thread, pthread_self()));
    cr_assert_eq(ferry_pool_stats_get(p, &st), 0);
    cr_assert_eq(st.threads, 2);
    cr_assert_eq(st.completed, 1);
    cr_assert_eq(st.queued, 0);
    cr_assert_eq(st.running, 0);
    ferry_pool_free(p);
    /* The default pool too. */
    cr_assert_eq(tu_run(to_thread_basic_task, NULL), 42);
    cr_assert_not_null(ferry_pool_default());
}

/* Jobs that wait for each other: each returns 0 once all GANG have
 * started, -ETIMEDOUT if they did not within 20 s (they would all have to
 * run at once). */
enum { GANG = 4 };
static pthread_mutex_t gang_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gang_cv = PTHREAD_COND_INITIALIZER;
static int gang_in;

static int gang_job(void *arg)
{
    struct timespec ts;
    int rc = 0;

    (void)arg;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 20;
    pthread_mutex_lock(&gang_mu);
    if (++gang_in == GANG)
        pthread_cond_broadcast(&gang_cv);
    while (gang_in < GANG && rc == 0)
        rc = pthread_cond_timedwait(&gang_cv, &gang_mu, &ts);
    pthread_mutex_unlock(&gang_mu);
    return gang_in >= GANG ? 0 : -ETIMEDOUT;
}

static int noop_job(void *arg)
{
    (void)arg;
    return 0;
}

static int gang_member(void *arg)
{
    return ferry_to_thread(arg, gang_job, NULL);
}

/* A long run of short jobs: the pool learns that one thread is enough.
 * Returns 0, or 1000 + the first error. */
static int offload_short_jobs(ferry_pool *p)
{
    int rc;

    for (int i = 0; i < 2000; i++)
        if ((rc = ferry_to_thread(p, noop_job, NULL)))
            return 1000 + rc;
    return 0;
}

/* Join the gang's tasks: 0 if every job returned 0, 1 if one did not,
 * 3000 + the first join error. */
static int join_gang(ferry_task **t)
{
    int rc, st, bad = 0;

    for (int i = 0; i < GANG; i++) {
        if ((rc = ferry_task_join(t[i], &st)))
            return 3000 + rc;
        bad |= st != 0;
    }
    return bad;
}

static int short_then_gang_main(void *arg)
{
    ferry_pool *p = arg;
    ferry_task *t[GANG];
    int rc;

    if ((rc = offload_short_jobs(p)))
        return rc;
    /* Then jobs that block until all of them run, offloaded in one turn. */
    for (int i = 0; i < GANG; i++)
        if ((rc = ferry_task_spawn(&t[i], NULL, gang_member, p, NULL)))
            return 2000 + rc;
    return join_gang(t);
}

Test(pool, slow_jobs_after_short_ones_still_spread_over_the_threads,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 60.)
{
    ferry_pool *p;
    ferry_pool_stats st;

    cr_assert_eq(ferry_pool_new(&p, &(ferry_pool_opts){ .threads = GANG }), 0);
    cr_assert_eq(tu_run(short_then_gang_main, p), 0);
    cr_assert_eq(gang_in, GANG);
    cr_assert_eq(ferry_pool_stats_get(p, &st), 0);
    cr_assert_eq(st.completed, 2000 + GANG);
    /* Usually the short jobs kept the pool on one thread and the checker
     * found the blocked ones waiting (st.stalled > 0); a short job slowed
     * by preemption may have spread them first.  Either way all ran. */
    ferry_pool_free(p);
}

/* The same, but each gang job is offloaded alone while the ones before it
 * block on their workers, after the pool has been idle (the checker then
 * sleeps long): workers are running jobs and the average says "short", yet
 * each new job must start (enough_workers_locked() in pool.c wakes a
 * thread for a job queued behind nothing; the checker is the fallback). */
static int gang_count(void)
{
    int n;

    pthread_mutex_lock(&gang_mu);
    n = gang_in;
    pthread_mutex_unlock(&gang_mu);
    return n;
}

static int staggered_gang_main(void *arg)
{
    ferry_pool *p = arg;
    ferry_task *t[GANG];
    int rc;

    if ((rc = offload_short_jobs(p)))
        return rc;
    if ((rc = ferry_sleep(tu_ms(20))))
        return 1500 + rc;
    for (int i = 0; i < GANG; i++) {
        if ((rc = ferry_task_spawn(&t[i], NULL, gang_member, p, NULL)))
            return 2000 + rc;
        while (gang_count() < i + 1)
            if ((rc = ferry_sleep(FERRY_MSEC(1))))
                return 2500 + rc;
    }
    return join_gang(t);
}

Test(pool, slow_jobs_offloaded_while_one_runs_all_start,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 60.)
{
    ferry_pool *p;
    ferry_pool_stats st;

    cr_assert_eq(ferry_pool_new(&p, &(ferry_pool_opts){ .threads = GANG }), 0);
    cr_assert_eq(tu_run(staggered_gang_main, p), 0);
    cr_assert_eq(gang_count(), GANG);
    cr_assert_eq(ferry_pool_stats_get(p, &st), 0);
    cr_assert_eq(st.completed, 2000 + GANG);
    cr_assert_eq(st.running, 0);
    ferry_pool_free(p);
}

Test(pool, to_thread_outside_a_task_is_eperm)
{
    cr_assert_eq(ferry_to_thread(NULL, job_ret42, NULL), -EPERM);
    cr_assert_eq(ferry_pool_new(NULL, NULL), -EINVAL);
}

/* A gate a job blocks on until the test opens it. */
static atomic_int gate;
static atomic_int gate_entered;
static int gated_job(void *arg)
{
    atomic_fetch_add(&gate_entered, 1);
    tu_spin_until(&gate);
    return arg ? *(int *)arg : 7;
}

static int ticks;
static int ticker_task(void *arg)
{
    (void)arg;
    while (!atomic_load(&gate_entered))
        if (ferry_yield())
            return -1;
    for (int i = 0; i < 100; i++) {
        ticks++;
        ferry_yield();
    }
    atomic_store(&gate, 1);
    return 0;
}

static int suspend_main(void *arg)
{
    ferry_task *t;
    int st;
    (void)arg;
    ferry_task_spawn(&t, NULL, ticker_task, NULL, NULL);
    st = ferry_to_thread(NULL, gated_job, NULL);
    ferry_task_join(t, NULL);
    return st;
}

Test(pool, to_thread_suspends_the_task_not_the_loop,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    cr_assert_eq(tu_run(suspend_main, NULL), 7);
    cr_assert_eq(ticks, 100);
}

/* Backpressure: one thread, capacity one. */
struct bp {
    ferry_pool *p;
    int rc[3];
    bool done[3];
    ferry_pool_stats seen;   /* while the third waited */
    bool third_waited;
};

static int bp_job(void *arg) { (void)arg; return 0; }

struct bp_arg { struct bp *b; int i; };

static int bp_worker2(void *arg)
{
    struct bp_arg *a = arg;
    a->b->rc[a->i] = ferry_to_thread(a->b->p, a->i == 0 ? gated_job : bp_job, NULL);
    a->b->done[a->i] = true;
    return 0;
}

static int bp_main(void *arg)
{
    struct bp *b = arg;
    struct bp_arg a[3] = { { b, 0 }, { b, 1 }, { b, 2 } };
    ferry_task *t[3];

    ferry_task_spawn(&t[0], NULL, bp_worker2, &a[0], NULL);
    tu_task_wait_flag(&gate_entered);                  /* job 0 runs */
    ferry_task_spawn(&t[1], NULL, bp_worker2, &a[1], NULL);
    ferry_yield();                                  /* job 1 queued: full */
    ferry_task_spawn(&t[2], NULL, bp_worker2, &a[2], NULL);
    for (int i = 0; i < 10; i++)
        ferry_yield();
    ferry_pool_stats_get(b->p, &b->seen);
    b->third_waited = !b->done[2] && ferry_task_state(t[2]) == FERRY_TASK_WAITING;
    atomic_store(&gate, 1);
    for (int i = 0; i < 3; i++)
        ferry_task_join(t[i], NULL);
    return 0;
}

Test(pool, full_queue_makes_the_task_wait,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    struct bp b = {0};
    cr_assert_eq(ferry_pool_new(&b.p, &(ferry_pool_opts){ .threads = 1, .capacity = 1 }), 0);
    cr_assert_eq(tu_run(bp_main, &b), 0);
    cr_assert(b.third_waited);
    cr_assert_eq(b.seen.queued, 1);
    cr_assert_eq(b.seen.running, 1);
    cr_assert_eq(b.rc[0], 7);
    cr_assert_eq(b.rc[1], 0);
    cr_assert_eq(b.rc[2], 0);
    ferry_pool_free(b.p);
}

/* Cancellation while queued: the job never runs. */
static atomic_int never_ran;
static int never_job(void *arg) { (void)arg; atomic_store(&never_ran, 1); return 0; }

struct cq { ferry_pool *p; int rc_queued; int rc_running; ferry_pool_stats st; };

static int cq_queued(void *arg)
{
    struct cq *c = arg;
    c->rc_queued = ferry_to_thread(c->p, never_job, NULL);
    return 0;
}

static int cq_running(void *arg)
{
    struct cq *c = arg;
    c->rc_running = ferry_to_thread(c->p, gated_job, NULL);
    return 0;
}

static int cq_main(void *arg)
{
    struct cq *c = arg;
    ferry_task *r, *q;
    ferry_task_spawn(&r, NULL, cq_running, c, NULL);
    tu_task_wait_flag(&gate_entered);
    ferry_task_spawn(&q, NULL, cq_queued, c, NULL);
    ferry_yield();
    ferry_yield();
    ferry_task_cancel(q);           /* queued: removed */
    ferry_task_cancel(r);           /* running: waited for (default) */
    ferry_task_join(q, NULL);
    ferry_pool_stats_get(c->p, &c->st);
    atomic_store(&gate, 1);
    ferry_task_join(r, NULL);
    return 0;
}

Test(pool, cancel_while_queued_never_runs_while_running_is_waited_for,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    struct cq c = {0};
    cr_assert_eq(ferry_pool_new(&c.p, &(ferry_pool_opts){ .threads = 1 }), 0);
    cr_assert_eq(tu_run(cq_main, &c), 0);
    ferry_pool_free(c.p);
    cr_assert_eq(c.rc_queued, -ECANCELED);
    cr_assert_eq(c.st.cancelled, 1);
    cr_assert_eq(c.st.queued, 0);
    cr_assert_eq(atomic_load(&never_ran), 0);
    cr_assert_eq(c.rc_running, 7, "a job that ran reports its status");
}

/* Abandon: the task leaves at once; the job keeps its thread; cleanup gets
 * the late status. */
static atomic_int cleanup_status = -1;
static atomic_int a_ended;
static int abandon_job(void *arg)
{
    (void)arg;
    atomic_fetch_add(&gate_entered, 1);
    tu_spin_until(&gate);
    atomic_store(&a_ended, 1);
    return 99;
}
static void abandon_cleanup(void *arg, int status)
{
    (void)arg;
    atomic_store(&cleanup_status, status);
}

static atomic_int b_saw_a_ended = -1;
static int b_job(void *arg)
{
    (void)arg;
    atomic_store(&b_saw_a_ended, atomic_load(&a_ended));
    return 5;
}

struct ab { ferry_pool *p; int rc_a, rc_b; size_t max_running; ferry_pool_stats mid; };

static int ab_a(void *arg)
{
    struct ab *s = arg;
    s->rc_a = ferry_to_thread_abandon(s->p, abandon_job, NULL, abandon_cleanup);
    return 0;
}
static int ab_b(void *arg)
{
    struct ab *s = arg;
    s->rc_b = ferry_to_thread(s->p, b_job, NULL);
    return 0;
}

static int ab_main(void *arg)
{
    struct ab *s = arg;
    ferry_task *a, *b;
    ferry_task_spawn(&a, NULL, ab_a, s, NULL);
    tu_task_wait_flag(&gate_entered);
    ferry_task_cancel(a);
    ferry_task_join(a, NULL);                 /* returns without the job */
    ferry_task_spawn(&b, NULL, ab_b, s, NULL);
    for (int i = 0; i < 20; i++)
        ferry_yield();
    ferry_pool_stats_get(s->p, &s->mid);     /* b queued behind the abandoned job */
    atomic_store(&gate, 1);
    ferry_task_join(b, NULL);
    return 0;
}

Test(pool, abandoned_job_keeps_its_slot_and_cleanup_gets_the_late_status,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    struct ab s = {0};
    cr_assert_eq(ferry_pool_new(&s.p, &(ferry_pool_opts){ .threads = 1 }), 0);
    cr_assert_eq(tu_run(ab_main, &s), 0);
    ferry_pool_free(s.p);                     /* waits for the abandoned job */
    cr_assert_eq(s.rc_a, -ECANCELED);
    cr_assert_eq(s.mid.running, 1);
    cr_assert_eq(s.mid.abandoned, 1);
    cr_assert_eq(s.mid.queued, 1);
    cr_assert_eq(atomic_load(&b_saw_a_ended), 1, "b started before the abandoned job ended");
    cr_assert_eq(s.rc_b, 5);
    cr_assert_eq(atomic_load(&cleanup_status), 99);
}

/* Freeing a pool with jobs queued and running. */
struct pf { ferry_pool *p; int rc[4]; atomic_int returned; };
struct pf_arg { struct pf *s; int i; };

static int pf_worker(void *arg)
{
    struct pf_arg *a = arg;
    a->s->rc[a->i] = ferry_to_thread(a->s->p, a->i == 0 ? gated_job : never_job, NULL);
    atomic_fetch_add(&a->s->returned, 1);
    return 0;
}

static void *pf_freer(void *arg)
{
    struct pf *s = arg;
    ferry_pool_stats st;
    do {
        usleep(200);
        ferry_pool_stats_get(s->p, &st);
    } while (st.queued < 3 || st.running < 1);
    ferry_pool_free(s->p);                   /* blocks until job 0 ends */
    return NULL;
}

static int pf_main(void *arg)
{
    struct pf *s = arg;
    struct pf_arg a[4];
    ferry_task *t[4];
    pthread_t freer;

    for (int i = 0; i < 4; i++) {
        a[i] = (struct pf_arg){ s, i };
        ferry_task_spawn(&t[i], NULL, pf_worker, &a[i], NULL);
        if (i == 0)
            tu_task_wait_flag(&gate_entered);
    }
    pthread_create(&freer, NULL, pf_freer, s);
    /* The three queued waiters are completed with -ECANCELED while the
     * running job still blocks the pool's free. */
    while (atomic_load(&s->returned) < 3)
        ferry_sleep(FERRY_USEC(200));
    atomic_store(&gate, 1);
    for (int i = 0; i < 4; i++)
        ferry_task_join(t[i], NULL);
    pthread_join(freer, NULL);
    return 0;
}

Test(pool, free_cancels_queued_jobs_and_waits_for_running_ones,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    struct pf s = {0};
    cr_assert_eq(ferry_pool_new(&s.p, &(ferry_pool_opts){ .threads = 1 }), 0);
    cr_assert_eq(tu_run(pf_main, &s), 0);
    cr_assert_eq(s.rc[0], 7);
    for (int i = 1; i < 4; i++)
        cr_assert_eq(s.rc[i], -ECANCELED, "job %d: %d", i, s.rc[i]);
    cr_assert_eq(atomic_load(&never_ran), 0);
}

/* An application that drives the loop one pass at a time: a job that a
 * task offloads during ferry_loop_run(FERRY_RUN_ONCE) is with the pool when
 * the call returns, and starts without another pass. */
static int once_offload(void *arg)
{
    return ferry_to_thread(arg, gated_job, NULL);
}

Test(pool, job_offloaded_in_a_run_once_pass_reaches_the_pool_before_it_returns,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    ferry_pool *p;
    ferry_pool_stats st;
    ferry_task *t;
    int64_t deadline;
    int status = -1;

    cr_assert_eq(ferry_pool_new(&p, &(ferry_pool_opts){ .threads = 1 }), 0);
    cr_assert_eq(ferry_task_spawn(&t, tu_loop, once_offload, p, NULL), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_ONCE), 0);   /* the task offloads */
    cr_assert_eq(ferry_pool_stats_get(p, &st), 0);
    cr_assert_eq(st.queued + st.running, 1, "after the pass the pool has %zu queued, "
                 "%zu running, want the job", st.queued, st.running);
    deadline = ferry_now() + tu_ms(5000);
    while (!atomic_load(&gate_entered) && ferry_now() < deadline)
        usleep(200);
    cr_assert(atomic_load(&gate_entered), "the job did not start without another pass");
    atomic_store(&gate, 1);
    while (ferry_task_try_join(t, &status) == -EAGAIN)
        ferry_loop_run(tu_loop, FERRY_RUN_ONCE);
    cr_assert_eq(status, 7);
    ferry_pool_free(p);
}

/* A job of ferry_to_thread_abandon() still queued when its pool is freed
 * never runs: the call returns -ECANCELED and the cleanup gets `arg`,
 * exactly once. */
struct fa {
    ferry_pool *p;
    int         rc_running;   /* the job that holds the only thread */
    int         rc_queued;    /* the abandon-variant job queued behind it */
    atomic_int  returned;     /* the queued one's call returned */
    atomic_int  cleanups;     /* cleanup calls */
    atomic_int  cleanup_status;
    atomic_int  cleanup_arg_ok;
};

static struct fa fa_state;

static void fa_cleanup(void *arg, int status)
{
    atomic_fetch_add(&fa_state.cleanups, 1);
    atomic_store(&fa_state.cleanup_status, status);
    atomic_store(&fa_state.cleanup_arg_ok, arg == &fa_state);
}

static int fa_running(void *arg)
{
    struct fa *s = arg;
    s->rc_running = ferry_to_thread(s->p, gated_job, NULL);
    return 0;
}

static int fa_queued(void *arg)
{
    struct fa *s = arg;
    s->rc_queued = ferry_to_thread_abandon(s->p, never_job, s, fa_cleanup);
    atomic_store(&s->returned, 1);
    return 0;
}

static void *fa_freer(void *arg)
{
    struct fa *s = arg;
    ferry_pool_stats st;

    do {
        usleep(200);
        ferry_pool_stats_get(s->p, &st);
    } while (st.queued < 1 || st.running < 1);
    ferry_pool_free(s->p);                   /* blocks until the running job ends */
    return NULL;
}

static int fa_main(void *arg)
{
    struct fa *s = arg;
    ferry_task *a, *b;
    pthread_t freer;

    ferry_task_spawn(&a, NULL, fa_running, s, NULL);
    tu_task_wait_flag(&gate_entered);
    ferry_task_spawn(&b, NULL, fa_queued, s, NULL);
    freer = tu_start_thread(fa_freer, s);
    tu_task_wait_flag(&s->returned);         /* completed by the free, not run */
    atomic_store(&gate, 1);
    ferry_task_join(a, NULL);
    ferry_task_join(b, NULL);
    pthread_join(freer, NULL);
    return 0;
}

Test(pool, abandon_variant_job_dropped_by_pool_free_gets_its_cleanup,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    struct fa *s = &fa_state;

    cr_assert_eq(ferry_pool_new(&s->p, &(ferry_pool_opts){ .threads = 1 }), 0);
    cr_assert_eq(tu_run(fa_main, s), 0);
    cr_assert_eq(s->rc_running, 7);
    cr_assert_eq(s->rc_queued, -ECANCELED);
    cr_assert_eq(atomic_load(&never_ran), 0);
    cr_assert_eq(atomic_load(&s->cleanups), 1, "cleanup ran %d times, want once",
                 atomic_load(&s->cleanups));
    cr_assert_eq(atomic_load(&s->cleanup_status), -ECANCELED);
    cr_assert(atomic_load(&s->cleanup_arg_ok));
}

/* ==== pool: submit from plain threads ================================== */

static atomic_int sub_fn_ran;
static int sub_done_ran;
static int sub_done_sum;
static bool sub_done_off_loop;

static int sub_job(void *arg)
{
    atomic_fetch_add(&sub_fn_ran, 1);
    return (int)(intptr_t)arg;
}

static int sub_done(void *arg, int status)
{
    if (!ferry_loop_is_current(tu_loop))
        sub_done_off_loop = true;
    sub_done_ran++;
    sub_done_sum += status;
    return (intptr_t)arg == 1 ? -EIO : 0;     /* the first one fails */
}

struct sub { ferry_pool *p; int n; int rc_bad; };

static void *sub_thread(void *arg)
{
    struct sub *s = arg;
    for (intptr_t i = 1; i <= s->n; i++)
        if (ferry_pool_submit(s->p, sub_job, (void *)i, tu_loop, sub_done, (void *)i) != 0)
            s->rc_bad++;
    return NULL;
}

Test(pool, submit_from_a_thread_completes_on_the_loop_and_a_failing_callback_stops_nothing,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    struct sub s = { .n = 100 };
    ferry_pool_stats st;
    pthread_t t;

    cr_assert_eq(ferry_pool_new(&s.p, &(ferry_pool_opts){ .threads = 3 }), 0);
    log_capture_start();
    t = tu_start_thread(sub_thread, &s);
    pthread_join(t, NULL);
    cr_assert_eq(s.rc_bad, 0);
    /* Nothing else keeps the loop running: the reservations do. */
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    log_capture_stop();
    cr_assert_eq(atomic_load(&sub_fn_ran), 100);
    cr_assert_eq(sub_done_ran, 100);
    cr_assert_eq(sub_done_sum, 100 * 101 / 2);
    cr_assert(!sub_done_off_loop);
    cr_assert_eq(ferry_pool_stats_get(s.p, &st), 0);
    cr_assert_eq(st.callback_errors, 1);
    cr_assert_eq(st.completed, 100);
    cr_assert(strstr(log_buf, "completion callback failed"));
    ferry_pool_free(s.p);
}

/* A job in flight when its loop is freed: free waits for it; the completion
 * runs before the loop is gone and never after. */
static atomic_int inflight_done;
static int inflight_done_cb(void *arg, int status)
{
    (void)arg;
    atomic_store(&inflight_done, status);
    return 0;
}

static void *gate_opener(void *arg)
{
    (void)arg;
    tu_spin_until(&gate_entered);
    usleep(20000);
    atomic_store(&gate, 1);
    return NULL;
}

Test(pool, loop_freed_with_a_job_in_flight_waits_for_its_completion, .timeout = 30.)
{
    ferry_loop *loop;
    ferry_pool *p;
    pthread_t t;
    int seven = 7;

    cr_assert_eq(ferry_pool_new(&p, &(ferry_pool_opts){ .threads = 1 }), 0);
    cr_assert_eq(ferry_loop_new(&loop, NULL), 0);
    cr_assert_eq(ferry_pool_submit(p, gated_job, &seven, loop, inflight_done_cb, NULL), 0);
    t = tu_start_thread(gate_opener, NULL);
    ferry_loop_free(loop);
    cr_assert_eq(atomic_load(&inflight_done), 7);
    pthread_join(t, NULL);
    ferry_pool_free(p);
    cr_assert_eq(tu_leaks(), 0);
}

/* An abandoned job outlives its task and its loop: the cleanup runs on the
 * pool thread and never touches the loop. */
static int abandon_then_leave(void *arg)
{
    return ferry_to_thread_abandon(arg, abandon_job, NULL, abandon_cleanup);
}

Test(pool, abandoned_job_outlives_its_loop, .timeout = 30.)
{
    ferry_loop *loop;
    ferry_pool *p;
    ferry_task *t;
    int st = 0;

    cr_assert_eq(ferry_pool_new(&p, &(ferry_pool_opts){ .threads = 1 }), 0);
    cr_assert_eq(ferry_loop_new(&loop, NULL), 0);
    cr_assert_eq(ferry_task_spawn(&t, loop, abandon_then_leave, p, NULL), 0);
    while (!atomic_load(&gate_entered))
        ferry_loop_run(loop, FERRY_RUN_ONCE);
    cr_assert_eq(ferry_task_cancel(t), 0);
    cr_assert_eq(ferry_loop_run(loop, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(ferry_task_try_join(t, &st), 0);
    cr_assert_eq(st, -ECANCELED);
    ferry_loop_free(loop);
    atomic_store(&gate, 1);
    ferry_pool_free(p);
    cr_assert_eq(atomic_load(&cleanup_status), 99);
}

/* thread -> loop -> the same full pool (Trio #810): a clear error. */
static int reentry_inner(void *arg)
{
    return ferry_to_thread(arg, job_ret42, NULL);
}

static int reentry_job(void *arg)
{
    int st = 0;
    /* Well inside the test's timeout: a hang fails here, not by a kill. */
    int rc = ferry_loop_run_task_sync(tu_loop, reentry_inner, arg, tu_ms(5000), &st);
    return rc ? rc : st;
}

static int reentry_main(void *arg)
{
    return ferry_to_thread(arg, reentry_job, arg);
}

Test(pool, reentry_into_the_same_full_pool_is_edeadlk_not_a_hang,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    ferry_pool *p;
    int rc;
    /* Which half failed matters (CI saw one run wait out the 20 s):
     * -ETIMEDOUT in the first means the inner job was queued although the
     * only thread was blocked; in the second, the idle thread was not woken. */
    cr_assert_eq(ferry_pool_new(&p, &(ferry_pool_opts){ .threads = 1 }), 0);
    rc = tu_run(reentry_main, p);
    cr_assert_eq(rc, -EDEADLK, "1-thread pool: %d, want -EDEADLK", rc);
    ferry_pool_free(p);
    /* With a free thread it makes progress. */
    cr_assert_eq(ferry_pool_new(&p, &(ferry_pool_opts){ .threads = 2 }), 0);
    rc = tu_run(reentry_main, p);
    cr_assert_eq(rc, 42, "2-thread pool: %d, want 42", rc);
    ferry_pool_free(p);
}

/*
 * Every thread of a pool blocked in a call into another loop that runs a
 * plain callback (run_sync, or a future of call_threadsafe): such a call
 * never waits on the pool, so a job offloaded meanwhile is queued, not
 * refused with -EDEADLK, and runs once the threads come back.
 */
struct blk {
    ferry_pool *p;
    ferry_loop *other;        /* made and run by blk_loop_thread */
    bool        via_future;   /* call_threadsafe + future_wait, else run_sync */
    atomic_int  ready;        /* `other` exists */
    atomic_int  go;           /* `other` may run */
    atomic_int  njobs;        /* jobs that took a pool thread */
    atomic_int  task_done;    /* the task's to_thread returned */
    int         rc_job[2];    /* each job's result (3 when the call worked) */
    int         rc_task;      /* the task's to_thread */
};

static int ret3(void *arg)
{
    (void)arg;
    return 3;
}

static int blk_job(void *arg)
{
    struct blk *b = arg;
    int i = atomic_fetch_add(&b->njobs, 1), st = -1, rc;
    ferry_future *f;

    if (b->via_future) {
        rc = ferry_loop_call_threadsafe(b->other, ret3, NULL, &f);
        if (rc == 0) {
            rc = ferry_future_wait(f, FERRY_NEVER, &st);
            ferry_future_free(f);
        }
    } else {
        rc = ferry_loop_run_sync(b->other, ret3, NULL, FERRY_NEVER, &st);
    }
    b->rc_job[i] = rc ? rc : st;
    return 0;
}

static void *blk_loop_thread(void *arg)
{
    struct blk *b = arg;

    if (ferry_loop_new(&b->other, NULL) != 0)
        return (void *)1;
    atomic_store(&b->ready, 1);
    tu_spin_until(&b->go);
    ferry_loop_run(b->other, FERRY_RUN_DEFAULT);   /* runs both requests */
    ferry_loop_free(b->other);
    return NULL;
}

/* Lets the other loop run once the task's job is queued (or refused). */
static int blk_opener(void *arg)
{
    struct blk *b = arg;
    ferry_pool_stats st;

    do {
        ferry_sleep(FERRY_USEC(200));
        ferry_pool_stats_get(b->p, &st);
    } while (st.queued < 1 && !atomic_load(&b->task_done));
    atomic_store(&b->go, 1);
    return 0;
}

static int blk_main(void *arg)
{
    struct blk *b = arg;
    ferry_inbox_stats st;
    ferry_task *opener;

    /* Both pool threads are inside their call once it posted its request. */
    do {
        ferry_sleep(FERRY_USEC(200));
        ferry_loop_inbox_stats(b->other, &st);
    } while (st.posts < 2);
    ferry_task_spawn(&opener, NULL, blk_opener, b, NULL);
    b->rc_task = ferry_to_thread(b->p, ret3, NULL);
    atomic_store(&b->task_done, 1);
    ferry_task_join(opener, NULL);
    return 0;
}

static void blk_run(struct blk *b)
{
    pthread_t lt;
    void *res;

    cr_assert_eq(ferry_pool_new(&b->p, &(ferry_pool_opts){ .threads = 2 }), 0);
    lt = tu_start_thread(blk_loop_thread, b);
    tu_spin_until(&b->ready);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(ferry_pool_submit(b->p, blk_job, b, NULL, NULL, NULL), 0);
    cr_assert_eq(tu_run(blk_main, b), 0);
    pthread_join(lt, &res);
    ferry_pool_free(b->p);
    cr_assert_null(res);
    cr_assert_eq(b->rc_task, 3, "job offloaded while the threads ran plain callbacks "
                 "in a loop: %d, want 3", b->rc_task);
    cr_assert_eq(b->rc_job[0], 3);
    cr_assert_eq(b->rc_job[1], 3);
}

Test(pool, threads_blocked_in_run_sync_do_not_refuse_jobs,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    static struct blk b;

    blk_run(&b);
}

Test(pool, threads_waiting_on_a_plain_callback_future_do_not_refuse_jobs,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    static struct blk b = { .via_future = true };

    blk_run(&b);
}

Test(pool, size_comes_from_the_environment)
{
    ferry_pool *p;
    ferry_pool_stats st;
    setenv("FERRY_POOL_SIZE", "3", 1);
    cr_assert_eq(ferry_pool_new(&p, NULL), 0);
    cr_assert_eq(ferry_pool_stats_get(p, &st), 0);
    cr_assert_eq(st.threads, 3);
    ferry_pool_free(p);
    unsetenv("FERRY_POOL_SIZE");
    cr_assert_eq(ferry_pool_new(&p, NULL), 0);
    cr_assert_eq(ferry_pool_stats_get(p, &st), 0);
    cr_assert_geq(st.threads, 4);
    ferry_pool_free(p);
}

Test(pool, failed_thread_creation_leaves_nothing_behind)
{
    ferry_pool *p = NULL;
    int rc = -1;
    /* Fail each counted point in turn until creation succeeds. */
    for (unsigned long n = 1; n < 50; n++) {
        ferry__fault_arm(n, false);
        rc = ferry_pool_new(&p, &(ferry_pool_opts){ .threads = 3 });
        ferry__fault_reset();
        if (rc == 0)
            break;
        cr_assert_eq(rc, -ENOMEM);
        cr_assert_null(p);
    }
    cr_assert_eq(rc, 0);
    ferry_pool_free(p);
    cr_assert_eq(tu_leaks(), 0);
}

/* ==== from a thread into the loop ====================================== */

static int double_it(void *arg)
{
    intptr_t v = (intptr_t)arg;
    if (ferry_yield())
        return -1;
    return (int)(v * 2);
}

struct rs { atomic_int bad; atomic_int finished; int per; };

static void *rs_thread(void *arg)
{
    struct rs *r = arg;
    for (int i = 0; i < r->per; i++) {
        int st = -1;
        int rc = (i & 1)
            ? ferry_loop_run_task_sync(tu_loop, double_it, (void *)(intptr_t)i, FERRY_NEVER, &st)
            : ferry_loop_run_sync(tu_loop, double_it, (void *)(intptr_t)i, FERRY_NEVER, &st);
        /* run_sync runs a plain callback: ferry_yield() there is -EPERM. */
        if (rc != 0 || st != ((i & 1) ? i * 2 : -1))
            atomic_fetch_add(&r->bad, 1);
    }
    if (atomic_fetch_add(&r->finished, 1) + 1 == 8)
        ferry_loop_stop_threadsafe(tu_loop);
    return NULL;
}

Test(fromthread, run_in_loop_from_eight_threads_at_once,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    struct rs r = { .per = 200 };
    pthread_t t[8];

    for (int i = 0; i < 8; i++)
        t[i] = tu_start_thread(rs_thread, &r);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_FOREVER), 0);
    for (int i = 0; i < 8; i++)
        pthread_join(t[i], NULL);
    cr_assert_eq(atomic_load(&r.bad), 0);
}

static int deadlk_rc1, deadlk_rc2;
static int deadlk_task(void *arg)
{
    ferry_future *f = NULL;
    (void)arg;
    deadlk_rc1 = ferry_loop_run_task_sync(tu_loop, double_it, NULL, FERRY_NEVER, NULL);
    deadlk_rc2 = ferry_loop_spawn_threadsafe(tu_loop, double_it, NULL, NULL, &f);
    return 0;
}

Test(fromthread, from_the_loop_thread_is_edeadlk,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    cr_assert_eq(ferry_loop_run_sync(tu_loop, double_it, NULL, 0, NULL), -EDEADLK);
    cr_assert_eq(tu_run(deadlk_task, NULL), 0);
    cr_assert_eq(deadlk_rc1, -EDEADLK);
    cr_assert_eq(deadlk_rc2, -EDEADLK);
}

static atomic_int sleeper_rc = 1;
static atomic_int sleeper_started;
static int long_sleeper(void *arg)
{
    (void)arg;
    atomic_store(&sleeper_started, 1);
    int rc = ferry_sleep(FERRY_SEC(100));
    atomic_store(&sleeper_rc, rc);
    return rc;
}

static atomic_int timeout_rc = 1;
static void *timeout_thread(void *arg)
{
    (void)arg;
    atomic_store(&timeout_rc, ferry_loop_run_task_sync(tu_loop, long_sleeper, NULL,
                                                      tu_ms(50), NULL));
    return NULL;
}

/* Wait for the thread's call to return, not for the sleeper to end: on a
 * slow build (valgrind) the timeout can pass before the loop started the
 * task, and then the cancel makes sure it never runs at all (it used to
 * wait here for a sleeper_rc that never came: a 600 s hang).  The cancel
 * was posted before the call returned; tu_run() keeps the loop running
 * until it has been delivered and the sleeper (if it started) ended. */
static int timeout_main(void *arg)
{
    pthread_t t;
    (void)arg;
    pthread_create(&t, NULL, timeout_thread, NULL);
    while (atomic_load(&timeout_rc) == 1)
        ferry_sleep(FERRY_MSEC(1));
    pthread_join(t, NULL);     /* it has returned already */
    return 0;
}

Test(fromthread, timeout_cancels_the_task,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    cr_assert_eq(tu_run(timeout_main, NULL), 0);
    cr_assert_eq(atomic_load(&timeout_rc), -ETIMEDOUT);
    if (atomic_load(&sleeper_started))
        cr_assert_eq(atomic_load(&sleeper_rc), -ECANCELED);   /* cancelled while running */
    else
        cr_assert_eq(atomic_load(&sleeper_rc), 1);            /* cancelled before it ran */
}

static atomic_int closed_rc = 1;
static void *closed_thread(void *arg)
{
    atomic_store(&closed_rc, ferry_loop_run_task_sync(arg, double_it, NULL, FERRY_NEVER, NULL));
    return NULL;
}

Test(fromthread, loop_closing_under_a_waiting_thread_gives_eshutdown, .timeout = 30.)
{
    ferry_loop *loop;
    ferry_inbox_stats st;
    pthread_t t;

    cr_assert_eq(ferry_loop_new(&loop, NULL), 0);
    t = tu_start_thread(closed_thread, loop);
    do {
        usleep(200);
        ferry_loop_inbox_stats(loop, &st);
    } while (st.posts < 1);                 /* the request is accepted */
    ferry_loop_free(loop);                  /* never ran the loop */
    pthread_join(t, NULL);
    cr_assert_eq(atomic_load(&closed_rc), -ESHUTDOWN);
}

/*
 * A request whose task the loop spawned but had not started when it was
 * freed: the body never runs, and the waiting thread learns why (-ESHUTDOWN)
 * instead of waiting forever.
 */
struct unstarted {
    ferry_loop  *loop;
    bool         via_future;  /* spawn_threadsafe + future_wait, else run_task_sync */
    atomic_int   done;        /* the thread's wait returned */
    int          rc;          /* its result */
    int          st;          /* the status it got */
};

static atomic_int unstarted_ran;

static int unstarted_body(void *arg)
{
    (void)arg;
    atomic_store(&unstarted_ran, 1);
    return 3;
}

static void *unstarted_thread(void *arg)
{
    struct unstarted *u = arg;
    ferry_future *f;

    if (u->via_future) {
        u->rc = ferry_loop_spawn_threadsafe(u->loop, unstarted_body, NULL, NULL, &f);
        if (u->rc == 0) {
            u->rc = ferry_future_wait(f, FERRY_NEVER, &u->st);
            ferry_future_free(f);
        }
    } else {
        u->rc = ferry_loop_run_task_sync(u->loop, unstarted_body, NULL, FERRY_NEVER, &u->st);
    }
    atomic_store(&u->done, 1);
    return NULL;
}

/* Start the thread and wait until the loop has accepted its request. */
static pthread_t unstarted_start(struct unstarted *u)
{
    ferry_inbox_stats st;
    pthread_t t = tu_start_thread(unstarted_thread, u);

    do {
        usleep(200);
        cr_assert_eq(ferry_loop_inbox_stats(u->loop, &st), 0);
    } while (st.posts < 1);
    return t;
}

/* After ferry_loop_free(): the thread's wait returns within a while. */
static void unstarted_check(struct unstarted *u, pthread_t t, int want_rc, int want_st)
{
    int64_t deadline = ferry_now() + tu_ms(5000);

    while (!atomic_load(&u->done) && ferry_now() < deadline)
        usleep(500);
    cr_assert(atomic_load(&u->done), "the thread still waits for a task that never runs");
    pthread_join(t, NULL);
    cr_assert_eq(atomic_load(&unstarted_ran), 0);
    cr_assert_eq(u->rc, want_rc);
    if (want_rc == 0)
        cr_assert_eq(u->st, want_st);
}

static void noop(void *arg)
{
    (void)arg;
}

/* One pass: a turn (the callback), then a poll that takes the request and
 * spawns its task, which would start in the next turn; then the free. */
static void unstarted_run_once_then_free(struct unstarted *u)
{
    ferry_loop_stats ls;
    pthread_t t;

    cr_assert_eq(ferry_loop_new(&u->loop, NULL), 0);
    t = unstarted_start(u);
    cr_assert_eq(ferry_call_soon(u->loop, noop, NULL), 0);
    cr_assert_eq(ferry_loop_run(u->loop, FERRY_RUN_ONCE), 0);
    cr_assert_eq(ferry_loop_stats_get(u->loop, &ls), 0);
    cr_assert_eq(ls.live_tasks, 1, "the request's task was not spawned by the pass");
    ferry_loop_free(u->loop);
    if (u->via_future)
        unstarted_check(u, t, 0, -ESHUTDOWN);
    else
        unstarted_check(u, t, -ESHUTDOWN, 0);
}

Test(fromthread, run_task_sync_for_a_task_spawned_but_not_started_when_the_loop_is_freed,
     .timeout = 30.)
{
    static struct unstarted u;

    unstarted_run_once_then_free(&u);
}

Test(fromthread, future_of_a_task_spawned_but_not_started_when_the_loop_is_freed,
     .timeout = 30.)
{
    static struct unstarted u = { .via_future = true };

    unstarted_run_once_then_free(&u);
}

static void *future_thread(void *arg)
{
    ferry_future *f;
    int st = 0;
    intptr_t bad = 0;

    (void)arg;
    if (ferry_loop_spawn_threadsafe(tu_loop, long_sleeper, NULL,
                                    &(ferry_task_opts){ .name = "fut" }, &f))
        return (void *)1;
    bad |= ferry_future_wait(f, 0, &st) != -ETIMEDOUT;
    bad |= ferry_future_wait(f, FERRY_MSEC(10), &st) != -ETIMEDOUT;
    bad |= ferry_future_done(f);
    /* Cancel a task that is running (sleeping), not one the loop has not
     * started yet: that one would never run and sleeper_rc would stay 1
     * (seen under valgrind, where 10 ms can pass before the loop turns). */
    tu_spin_until(&sleeper_started);
    bad |= ferry_future_cancel(f) != 0;
    bad |= ferry_future_wait(f, FERRY_NEVER, &st) != 0;
    bad |= st != -ECANCELED;
    bad |= !ferry_future_done(f);
    ferry_future_free(f);
    ferry_loop_stop_threadsafe(tu_loop);
    return (void *)bad;
}

Test(fromthread, future_wait_timed_wait_cancel,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    void *bad;
    pthread_t t = tu_start_thread(future_thread, NULL);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_FOREVER), 0);
    pthread_join(t, &bad);
    cr_assert_null(bad);
    cr_assert_eq(atomic_load(&sleeper_rc), -ECANCELED);
}

/* ==== mixed channel ==================================================== */

Test(chan, try_operations_and_bounds)
{
    ferry_chan *ch;
    void *v;
    cr_assert_eq(ferry_chan_new(&ch, 0), -EINVAL);
    cr_assert_eq(ferry_chan_new(&ch, 2), 0);
    cr_assert_eq(ferry_chan_try_recv(ch, &v), -EAGAIN);
    cr_assert_eq(ferry_chan_try_send(ch, (void *)1), 0);
    cr_assert_eq(ferry_chan_try_send(ch, (void *)2), 0);
    cr_assert_eq(ferry_chan_try_send(ch, (void *)3), -EAGAIN);
    cr_assert_eq(ferry_chan_send_blocking(ch, (void *)3, FERRY_MSEC(5)), -ETIMEDOUT);
    cr_assert_eq(ferry_chan_len(ch), 2);
    cr_assert_eq(ferry_chan_try_recv(ch, &v), 0);
    cr_assert_eq(v, (void *)1);
    cr_assert_eq(ferry_chan_close(ch), 0);
    cr_assert_eq(ferry_chan_try_send(ch, (void *)4), -ESHUTDOWN);
    cr_assert_eq(ferry_chan_recv_blocking(ch, &v, FERRY_NEVER), 0);   /* drains */
    cr_assert_eq(v, (void *)2);
    cr_assert_eq(ferry_chan_recv_blocking(ch, &v, FERRY_NEVER), -ESHUTDOWN);
    cr_assert_eq(ferry_chan_send(ch, NULL), -EPERM);                  /* not a task */
    ferry_chan_free(ch);
}

struct cx { ferry_chan *ch; int n; long sum; int count; int rc; };

static void *cx_thread_sender(void *arg)
{
    struct cx *c = arg;
    for (intptr_t i = 1; i <= c->n; i++)
        if (ferry_chan_send_blocking(c->ch, (void *)i, FERRY_NEVER))
            return (void *)1;
    return NULL;
}

static int cx_task_recv(void *arg)
{
    struct cx *c = arg;
    void *v;
    for (int i = 0; i < c->n; i++) {
        c->rc = ferry_chan_recv(c->ch, &v);
        if (c->rc)
            return c->rc;
        if ((intptr_t)v != i + 1)
            return -1000 - i;          /* FIFO */
        c->sum += (intptr_t)v;
        c->count++;
    }
    return 0;
}

Test(chan, thread_sends_task_receives_in_order_through_a_small_buffer,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    struct cx c = { .n = 5000 };
    void *bad;
    pthread_t t;

    cr_assert_eq(ferry_chan_new(&c.ch, 4), 0);
    t = tu_start_thread(cx_thread_sender, &c);
    cr_assert_eq(tu_run(cx_task_recv, &c), 0);
    pthread_join(t, &bad);
    cr_assert_null(bad);
    cr_assert_eq(c.count, 5000);
    cr_assert_eq(c.sum, 5000L * 5001 / 2);
    ferry_chan_free(c.ch);
}

/* Close wakes a receiving task, a receiving thread and a sending task. */
struct cl { ferry_chan *full, *empty; int rc_trecv, rc_tsend; atomic_int rc_threcv; };

static int cl_recv(void *arg) { struct cl *c = arg; void *v; c->rc_trecv = ferry_chan_recv(c->empty, &v); return 0; }
static int cl_send(void *arg) { struct cl *c = arg; c->rc_tsend = ferry_chan_send(c->full, (void *)2); return 0; }
static void *cl_thread(void *arg)
{
    struct cl *c = arg;
    void *v;
    atomic_store(&c->rc_threcv, ferry_chan_recv_blocking(c->empty, &v, FERRY_NEVER));
    return NULL;
}

static int cl_main(void *arg)
{
    struct cl *c = arg;
    ferry_task *a, *b;
    pthread_t t;
    pthread_create(&t, NULL, cl_thread, c);
    ferry_task_spawn(&a, NULL, cl_recv, c, NULL);
    ferry_task_spawn(&b, NULL, cl_send, c, NULL);
    for (int i = 0; i < 5; i++)
        ferry_yield();
    ferry_sleep(FERRY_MSEC(5));   /* let the thread block */
    ferry_chan_close(c->empty);
    ferry_chan_close(c->full);
    ferry_task_join(a, NULL);
    ferry_task_join(b, NULL);
    pthread_join(t, NULL);
    return 0;
}

Test(chan, close_wakes_every_waiter,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    struct cl c = { .rc_threcv = 1 };
    void *v;
    cr_assert_eq(ferry_chan_new(&c.full, 1), 0);
    cr_assert_eq(ferry_chan_new(&c.empty, 1), 0);
    cr_assert_eq(ferry_chan_try_send(c.full, (void *)1), 0);
    cr_assert_eq(tu_run(cl_main, &c), 0);
    cr_assert_eq(c.rc_trecv, -ESHUTDOWN);
    cr_assert_eq(c.rc_tsend, -ESHUTDOWN);
    cr_assert_eq(atomic_load(&c.rc_threcv), -ESHUTDOWN);
    cr_assert_eq(ferry_chan_try_recv(c.full, &v), 0);   /* the item is not lost */
    cr_assert_eq(v, (void *)1);
    ferry_chan_free(c.full);
    ferry_chan_free(c.empty);
}

/* A receiver woken by a send and cancelled before it runs passes the wake
 * on: the other receiver gets the item (no swallowed wakeup). */
struct pw { ferry_chan *ch; ferry_task *a, *b; int rc_a, rc_b; void *got_b; };
static struct pw *pw_cur;

static int pw_a(void *arg) { struct pw *p = arg; void *v; p->rc_a = ferry_chan_recv(p->ch, &v); return 0; }
static int pw_b(void *arg) { struct pw *p = arg; p->rc_b = ferry_chan_recv(p->ch, &p->got_b); return 0; }

static void pw_cancel_a(void *arg) { (void)arg; ferry_task_cancel(pw_cur->a); }

static void *pw_thread(void *arg)
{
    struct pw *p = arg;
    /* Both land in one drain: the wake of a (a completion), then the
     * cancel of a (a post). */
    ferry_chan_try_send(p->ch, (void *)77);
    ferry_loop_call_soon_threadsafe(tu_loop, pw_cancel_a, NULL);
    return NULL;
}

static void pw_block(void *arg)
{
    pthread_t t;
    pthread_create(&t, NULL, pw_thread, arg);
    pthread_join(t, NULL);
}

static int pw_main(void *arg)
{
    struct pw *p = arg;
    ferry_task_spawn(&p->a, NULL, pw_a, p, NULL);
    ferry_yield();
    ferry_task_spawn(&p->b, NULL, pw_b, p, NULL);
    ferry_yield();
    ferry_yield();
    ferry_call_soon(tu_loop, pw_block, p);
    ferry_task_join(p->a, NULL);
    ferry_task_join(p->b, NULL);
    return 0;
}

Test(chan, cancelled_woken_receiver_passes_the_wake_on,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    struct pw p = {0};
    pw_cur = &p;
    cr_assert_eq(ferry_chan_new(&p.ch, 1), 0);
    cr_assert_eq(tu_run(pw_main, &p), 0);
    cr_assert_eq(p.rc_a, -ECANCELED);
    cr_assert_eq(p.rc_b, 0);
    cr_assert_eq(p.got_b, (void *)77);
    cr_assert_eq(ferry_chan_len(p.ch), 0);
    ferry_chan_free(p.ch);
}

/* ==== blocked-loop detector ============================================ */

static int blocking_task(void *arg)
{
    (void)arg;
    usleep(200000);             /* the blocking call someone forgot to offload */
    return 0;
}

static int polite_task(void *arg)
{
    (void)arg;
    for (int i = 0; i < 100; i++)
        ferry_yield();
    return ferry_to_thread(NULL, bp_job, NULL);
}

Test(slow, blocking_call_in_a_task_is_reported_with_its_name,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    cr_assert_eq(ferry_loop_set_slow_threshold(tu_loop, FERRY_MSEC(100)), 0);
    log_capture_start();
    cr_assert_eq(ferry_task_spawn(NULL, tu_loop, blocking_task, NULL,
                                  &(ferry_task_opts){ .name = "fetch_rates" }), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    log_capture_stop();
    cr_assert_eq(log_lines, 1, "log: %s", log_buf);
    cr_assert(strstr(log_buf, "fetch_rates"), "log: %s", log_buf);
}

/* The threshold is scaled for slow builds: under valgrind all threads
 * share one lock, so a step of a few microseconds can take 100 ms of wall
 * time while the pool's threads run.  The default pool is started before
 * the loop so that its thread creation is not inside a task step. */
Test(slow, normal_run_reports_nothing,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)
{
    cr_assert_not_null(ferry_pool_default());
    cr_assert_eq(ferry_loop_set_slow_threshold(tu_loop, tu_ms(100)), 0);
    log_capture_start();
    for (int i = 0; i < 10; i++)
        cr_assert_eq(ferry_task_spawn(NULL, tu_loop, polite_task, NULL, NULL), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    log_capture_stop();
    cr_assert_eq(log_lines, 0, "log: %s", log_buf);
}
