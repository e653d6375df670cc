/* test_pool.c - thread pools (bridge.h): ferry_to_thread() and its
 * abandon variant, ferry_pool_submit() from plain threads and from the
 * loop's thread, a full queue (backpressure, -EAGAIN), cancellation while
 * queued or running, deadlines, a pool or a loop freed with jobs in
 * flight, waking enough workers, re-entry into a full pool, the pool's
 * size, bad arguments and allocation failures.
 *
 * No cr_assert inside task bodies: they record, the test body asserts
 * after the loop returned.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "testutil.h"
#include "fault.h"
#include "ferry/bridge.h"

/* Tests on tu_loop, and tests that make their own loops (or none). */
#define T(name, ...) \
    Test(pool, name, .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30., ##__VA_ARGS__)
#define TL(name, ...) \
    Test(pool, name, .init = tu_alloc_setup, .fini = tu_loop_teardown, .timeout = 30., ##__VA_ARGS__)

static int job42(void *arg)
{
    (void)arg;
    return 42;
}

/* ---- to_thread ----------------------------------------------------------- */

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

T(to_thread_returns_the_status_from_a_pool_thread)
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

T(slow_jobs_after_short_ones_still_spread_over_the_threads, .timeout = 60.)
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

T(slow_jobs_offloaded_while_one_runs_all_start, .timeout = 60.)
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

TL(to_thread_outside_a_task_is_eperm)
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

T(to_thread_suspends_the_task_not_the_loop)
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

T(full_queue_makes_the_task_wait)
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

T(cancel_while_queued_never_runs_while_running_is_waited_for)
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

T(abandoned_job_keeps_its_slot_and_cleanup_gets_the_late_status)
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

T(free_cancels_queued_jobs_and_waits_for_running_ones)
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

T(job_offloaded_in_a_run_once_pass_reaches_the_pool_before_it_returns)
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

T(abandon_variant_job_dropped_by_pool_free_gets_its_cleanup)
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

/* ---- submit from plain threads -------------------------------------------- */

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

T(submit_from_a_thread_completes_on_the_loop_and_a_failing_callback_stops_nothing)
{
    struct sub s = { .n = 100 };
    ferry_pool_stats st;
    pthread_t t;

    cr_assert_eq(ferry_pool_new(&s.p, &(ferry_pool_opts){ .threads = 3 }), 0);
    tu_log_capture_start();
    t = tu_start_thread(sub_thread, &s);
    pthread_join(t, NULL);
    cr_assert_eq(s.rc_bad, 0);
    /* Nothing else keeps the loop running: the reservations do. */
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT), 0);
    tu_log_capture_stop();
    cr_assert_eq(atomic_load(&sub_fn_ran), 100);
    cr_assert_eq(sub_done_ran, 100);
    cr_assert_eq(sub_done_sum, 100 * 101 / 2);
    cr_assert(!sub_done_off_loop);
    cr_assert_eq(ferry_pool_stats_get(s.p, &st), 0);
    cr_assert_eq(st.callback_errors, 1);
    cr_assert_eq(st.completed, 100);
    cr_assert(strstr(tu_log_text(), "completion callback failed"), "log: %s", tu_log_text());
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

TL(loop_freed_with_a_job_in_flight_waits_for_its_completion)
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

TL(abandoned_job_outlives_its_loop)
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

T(reentry_into_the_same_full_pool_is_edeadlk_not_a_hang)
{
    ferry_pool *p;
    int rc;
    /* Which half failed matters: -ETIMEDOUT in the first means the inner
     * job was queued although the only thread was blocked; in the second,
     * the idle thread was not woken. */
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
        ferry_loop_inbox_stats_get(b->other, &st);
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

T(threads_blocked_in_run_sync_do_not_refuse_jobs)
{
    static struct blk b;

    blk_run(&b);
}

T(threads_waiting_on_a_plain_callback_future_do_not_refuse_jobs)
{
    static struct blk b = { .via_future = true };

    blk_run(&b);
}

TL(size_comes_from_the_environment)
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

TL(failed_thread_creation_leaves_nothing_behind)
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

/* ---- arguments, the pool's size ------------------------------------------ */

static int to_thread_bad[4];
static int bad_args_task(void *arg)
{
    ferry_pool *p = arg;
    to_thread_bad[0] = ferry_to_thread(p, NULL, NULL);
    to_thread_bad[1] = ferry_to_thread_abandon(p, NULL, NULL, NULL);
    to_thread_bad[2] = ferry_pool_submit(p, NULL, NULL, NULL, NULL, NULL);
    to_thread_bad[3] = ferry_to_thread(p, job42, NULL);
    return 0;
}

T(bad_arguments_are_einval_and_to_thread_outside_a_task_is_eperm)
{
    ferry_pool *p;
    ferry_pool_stats st;

    cr_assert_eq(ferry_pool_new(NULL, NULL), -EINVAL);
    cr_assert_eq(ferry_pool_new(&p, &(ferry_pool_opts){ .threads = 2, .capacity = 3,
                                                        .stack_size = 256 * 1024 }), 0);
    cr_assert_eq(ferry_pool_stats_get(p, NULL), -EINVAL);
    cr_assert_eq(ferry_pool_stats_get(p, &st), 0);
    cr_assert_eq(st.threads, 2);
    cr_assert_eq(st.capacity, 3);
    /* Outside a task. */
    cr_assert_eq(ferry_to_thread(p, job42, NULL), -EPERM);
    cr_assert_eq(ferry_to_thread_abandon(p, job42, NULL, NULL), -EPERM);
    cr_assert_eq(tu_run(bad_args_task, p), 0);
    cr_assert_eq(to_thread_bad[0], -EINVAL);
    cr_assert_eq(to_thread_bad[1], -EINVAL);
    cr_assert_eq(to_thread_bad[2], -EINVAL);
    cr_assert_eq(to_thread_bad[3], 42);
    ferry_pool_free(p);
    /* NULL and the default pool are ignored by free; NULL means default. */
    ferry_pool_free(NULL);
    ferry_pool_free(ferry_pool_default());
    cr_assert_eq(ferry_pool_stats_get(NULL, &st), 0);
    cr_assert_geq(st.threads, 1);
}

TL(bad_pool_size_in_the_environment_falls_back_to_the_default)
{
    ferry_pool *p;
    ferry_pool_stats st;
    const char *bad[] = { "0", "abc", "-3", "" };

    for (unsigned i = 0; i < sizeof bad / sizeof *bad; i++) {
        setenv("FERRY_POOL_SIZE", bad[i], 1);
        cr_assert_eq(ferry_pool_new(&p, NULL), 0);
        cr_assert_eq(ferry_pool_stats_get(p, &st), 0);
        cr_assert_geq(st.threads, 1, "FERRY_POOL_SIZE=%s", bad[i]);
        ferry_pool_free(p);
    }
    unsetenv("FERRY_POOL_SIZE");
}

/* ---- completions on the pool thread, a full queue, deadlines ------------- */

/* Submit with a completion on the pool thread (loop NULL), and allocation
 * failure at submit: -ENOMEM, done never called. */
static atomic_int done_calls, done_status;
static int on_done(void *arg, int status)
{
    (void)arg;
    atomic_store(&done_status, status);
    atomic_fetch_add(&done_calls, 1);
    return 0;
}

TL(submit_with_done_on_the_pool_thread_and_enomem)
{
    ferry_pool *p;
    ferry_pool_stats st;

    cr_assert_eq(ferry_pool_new(&p, &(ferry_pool_opts){ .threads = 1 }), 0);
    ferry__fault_arm(1, false);
    cr_assert_eq(ferry_pool_submit(p, job42, NULL, NULL, on_done, NULL), -ENOMEM);
    ferry__fault_reset();
    cr_assert_eq(ferry_pool_submit(p, job42, NULL, NULL, on_done, NULL), 0);
    cr_assert_eq(ferry_pool_submit(p, job42, NULL, NULL, NULL, NULL), 0);   /* no done */
    while (1) {
        cr_assert_eq(ferry_pool_stats_get(p, &st), 0);
        if (st.completed == 2)
            break;
        usleep(100);
    }
    ferry_pool_free(p);
    cr_assert_eq(atomic_load(&done_calls), 1);
    cr_assert_eq(atomic_load(&done_status), 42);
}

/* A plain thread blocks for room in a full queue; the pool being freed
 * wakes it with -ESHUTDOWN, and the queued job completes with -ECANCELED. */
static ferry_pool *room_pool;
static atomic_int room_rc = 1;
static void *room_thread(void *arg)
{
    (void)arg;
    atomic_store(&room_rc, ferry_pool_submit(room_pool, job42, NULL, NULL, on_done, NULL));
    return NULL;
}

struct freer { ferry_pool *p; atomic_int done; };
static void *free_thread(void *arg)
{
    struct freer *f = arg;
    ferry_pool_free(f->p);
    atomic_store(&f->done, 1);
    return NULL;
}

TL(thread_waiting_for_room_gets_eshutdown_when_the_pool_is_freed)
{
    ferry_pool_stats st;
    struct freer fr = {0};
    pthread_t t, tf;

    cr_assert_eq(ferry_pool_new(&room_pool, &(ferry_pool_opts){ .threads = 1, .capacity = 1 }), 0);
    cr_assert_eq(ferry_pool_submit(room_pool, gated_job, NULL, NULL, NULL, NULL), 0);
    tu_spin_until(&gate_entered);
    cr_assert_eq(ferry_pool_submit(room_pool, job42, NULL, NULL, on_done, NULL), 0);  /* fills */
    t = tu_start_thread(room_thread, NULL);
    /* It cannot get in until the pool stops: nothing leaves the queue. */
    usleep(1000);
    cr_assert_eq(atomic_load(&room_rc), 1);
    cr_assert_eq(ferry_pool_stats_get(room_pool, &st), 0);
    cr_assert_eq(st.queued, 1);
    cr_assert_eq(st.running, 1);
    fr.p = room_pool;
    tf = tu_start_thread(free_thread, &fr);
    pthread_join(t, NULL);                      /* woken by the free */
    cr_assert_eq(atomic_load(&room_rc), -ESHUTDOWN);
    cr_assert_eq(atomic_load(&fr.done), 0);     /* still waits for the gate job */
    atomic_store(&gate, 1);
    pthread_join(tf, NULL);
    cr_assert_eq(atomic_load(&done_calls), 1);  /* the queued one, never ran */
    cr_assert_eq(atomic_load(&done_status), -ECANCELED);
}

/* On the loop's thread a full queue is -EAGAIN, not a blocked loop; a task
 * waiting for room is cancelled cleanly; stats add up. */
static int eagain_rc, room_task_rc = 1, stats_ok;
static ferry_pool_stats mid;
static int room_waiter(void *arg)
{
    room_task_rc = ferry_to_thread(arg, job42, NULL);
    return 0;
}

static int eagain_main(void *arg)
{
    ferry_pool *p = arg;
    ferry_task *w;
    int rc;

    rc = ferry_pool_submit(p, gated_job, NULL, tu_loop, on_done, NULL);
    if (rc)
        return rc;
    if ((rc = tu_task_wait_flag(&gate_entered)) != 0)
        return rc;
    if ((rc = ferry_pool_submit(p, job42, NULL, tu_loop, on_done, NULL)) != 0)
        return rc;                            /* the queue is full now */
    eagain_rc = ferry_pool_submit(p, job42, NULL, tu_loop, on_done, NULL);
    if ((rc = ferry_task_spawn(&w, tu_loop, room_waiter, p, NULL)) != 0)
        return rc;
    for (int i = 0; i < 5; i++)
        ferry_yield();                         /* it waits for room */
    ferry_pool_stats_get(p, &mid);
    ferry_task_cancel(w);
    ferry_task_join(w, NULL);
    atomic_store(&gate, 1);
    while (atomic_load(&done_calls) < 2)
        if ((rc = ferry_sleep(FERRY_USEC(200))) != 0)
            return rc;
    stats_ok = 1;
    return 0;
}

T(full_queue_on_the_loop_thread_is_eagain_and_a_room_waiter_cancels)
{
    ferry_pool *p;
    ferry_pool_stats st;

    cr_assert_eq(ferry_pool_new(&p, &(ferry_pool_opts){ .threads = 1, .capacity = 1 }), 0);
    cr_assert_eq(tu_run(eagain_main, p), 0);
    cr_assert_eq(stats_ok, 1);
    cr_assert_eq(eagain_rc, -EAGAIN);
    cr_assert_eq(room_task_rc, -ECANCELED);
    cr_assert_eq(mid.queued, 1);
    cr_assert_eq(mid.running, 1);
    cr_assert_eq(ferry_pool_stats_get(p, &st), 0);
    cr_assert_eq(st.queued, 0);
    cr_assert_eq(st.running, 0);
    cr_assert_eq(st.completed, 2);
    cr_assert_eq(st.cancelled, 1);     /* the cancelled room waiter's job */
    cr_assert_eq(atomic_load(&done_status), 42);
    ferry_pool_free(p);
}

/* A deadline that passes while the job is queued: -ETIMEDOUT, never ran. */
static int deadline_rc = 1, deadline_rc2 = 1;

static int deadline_main(void *arg)
{
    ferry_pool *p = arg;
    ferry_scope sc;
    int rc;

    if ((rc = ferry_pool_submit(p, gated_job, NULL, tu_loop, NULL, NULL)) != 0)
        return rc;
    if ((rc = tu_task_wait_flag(&gate_entered)) != 0)
        return rc;
    ferry_scope_enter(&sc, ferry_now() + FERRY_MSEC(2), 0);
    deadline_rc = ferry_to_thread(p, never_job, NULL);
    ferry_scope_exit(&sc);
    ferry_scope_enter(&sc, ferry_now() + FERRY_MSEC(2), 0);
    deadline_rc2 = ferry_to_thread_abandon(p, never_job, NULL, NULL);
    ferry_scope_exit(&sc);
    atomic_store(&gate, 1);
    return 0;
}

T(deadline_while_queued_is_etimedout_and_the_job_never_runs)
{
    ferry_pool *p;
    ferry_pool_stats st;

    cr_assert_eq(ferry_pool_new(&p, &(ferry_pool_opts){ .threads = 1 }), 0);
    cr_assert_eq(tu_run(deadline_main, p), 0);
    cr_assert_eq(deadline_rc, -ETIMEDOUT);
    cr_assert_eq(deadline_rc2, -ETIMEDOUT);
    ferry_pool_free(p);
    cr_assert_eq(atomic_load(&never_ran), 0);
    (void)st;
}

/* to_thread while the pool is being freed: the queued job is cancelled
 * (-ECANCELED, never ran), the next call is refused (-ESHUTDOWN). */
static int stop_rcs[8], nstop;
static int stopping_main(void *arg)
{
    struct freer *fr = arg;
    int rc;

    (void)fr;
    do {
        rc = ferry_to_thread(fr->p, never_job, NULL);
        stop_rcs[nstop++] = rc;
    } while (rc != -ESHUTDOWN && nstop < 8);
    rc = ferry_pool_submit(fr->p, job42, NULL, tu_loop, on_done, NULL);
    stop_rcs[nstop++ % 8] = rc;
    atomic_store(&gate, 1);     /* now the free may finish */
    return 0;
}

T(to_thread_into_a_pool_being_freed)
{
    struct freer fr = {0};
    pthread_t tf;

    cr_assert_eq(ferry_pool_new(&fr.p, &(ferry_pool_opts){ .threads = 1 }), 0);
    cr_assert_eq(ferry_pool_submit(fr.p, gated_job, NULL, NULL, NULL, NULL), 0);
    tu_spin_until(&gate_entered);
    tf = tu_start_thread(free_thread, &fr);
    cr_assert_eq(tu_run(stopping_main, &fr), 0);
    pthread_join(tf, NULL);
    cr_assert_geq(nstop, 2);
    /* Before the free got in: queued, then cancelled; after: refused. */
    for (int i = 0; i < nstop - 2; i++)
        cr_assert_eq(stop_rcs[i], -ECANCELED, "call %d: %d", i, stop_rcs[i]);
    cr_assert_eq(stop_rcs[nstop - 2], -ESHUTDOWN);
    cr_assert_eq(stop_rcs[nstop - 1], -ESHUTDOWN);     /* submit too */
    cr_assert_eq(atomic_load(&never_ran), 0);
}

/* to_thread and to_thread_abandon with allocation failures at each point:
 * the call fails with -ENOMEM (fn never ran) or succeeds with fn's status. */
static int fault_rcs[2][40];
static int fault_main(void *arg)
{
    for (unsigned long n = 1; n <= 40; n++) {
        ferry__fault_arm(n, false);
        fault_rcs[0][n - 1] = ferry_to_thread(arg, job42, NULL);
        ferry__fault_arm(n, false);
        fault_rcs[1][n - 1] = ferry_to_thread_abandon(arg, job42, NULL, NULL);
        ferry__fault_reset();
    }
    return 0;
}

T(to_thread_under_allocation_failure, .timeout = 60.)
{
    ferry_pool *p;
    int enomem = 0;

    cr_assert_eq(ferry_pool_new(&p, &(ferry_pool_opts){ .threads = 1 }), 0);
    cr_assert_eq(tu_run(fault_main, p), 0);
    for (int k = 0; k < 2; k++)
        for (int n = 0; n < 40; n++) {
            cr_assert(fault_rcs[k][n] == 42 || fault_rcs[k][n] == -ENOMEM,
                      "%d/%d: %d", k, n + 1, fault_rcs[k][n]);
            enomem += fault_rcs[k][n] == -ENOMEM;
        }
    cr_assert_gt(enomem, 0);
    cr_assert_eq(fault_rcs[0][39], 42);
    ferry_pool_free(p);
}

/* ---- Freeing a pool that leaves abandoned jobs ------------------------- */

/*
 * A job abandoned by its task (deadline) blocks until released.
 * ferry_pool_free_ex(FERRY_POOL_FREE_LEAVE_ABANDONED) returns while it
 * still blocks; released afterwards, the job ends, its cleanup runs once on
 * the job's own thread, and the thread and the pool's memory go away.
 */
static atomic_int leave_release, leave_cleanups, leave_started;
static atomic_int leave_same_thread = -1;
static pthread_t leave_job_thread;

static int leave_blocking_job(void *arg)
{
    (void)arg;
    leave_job_thread = pthread_self();
    atomic_store(&leave_started, 1);
    while (!atomic_load(&leave_release))
        usleep(1000);
    return 17;
}

static void leave_cleanup(void *arg, int status)
{
    (void)arg;
    atomic_store(&leave_same_thread,
                 status == 17 && pthread_equal(pthread_self(), leave_job_thread) ? 1 : 0);
    atomic_fetch_add(&leave_cleanups, 1);
}

static int leave_rc;

static int leave_main(void *arg)
{
    ferry_scope sc;

    ferry_scope_enter(&sc, ferry_now() + tu_ms(20), 0);
    leave_rc = ferry_to_thread_abandon(arg, leave_blocking_job, NULL, leave_cleanup);
    ferry_scope_exit(&sc);
    return 0;
}

static int proc_threads(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    int n = -1;

    if (!f)
        return -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Threads: %d", &n) == 1)
            break;
    fclose(f);
    return n;
}

/* Counted after one thread has come and gone, so that a runtime's own
 * helper thread (ThreadSanitizer starts one at the first pthread_create())
 * is already there. */
static void *warm_thread(void *arg)
{
    return arg;
}

T(free_leaving_abandoned_jobs_returns_before_they_end)
{
    ferry_pool *p;
    int before, waited = 0;
    long live;

    pthread_join(tu_start_thread(warm_thread, NULL), NULL);
    before = proc_threads();
    live = ferry__alloc_live();
    cr_assert_eq(ferry_pool_new(&p, &(ferry_pool_opts){ .threads = 3 }), 0);
    cr_assert_eq(ferry_pool_free_ex(p, 0x80), -EINVAL);
    cr_assert_eq(tu_run(leave_main, p), 0);
    cr_assert_eq(leave_rc, -ETIMEDOUT);
    cr_assert_eq(atomic_load(&leave_started), 1);
    cr_assert_eq(ferry_pool_free_ex(p, FERRY_POOL_FREE_LEAVE_ABANDONED), 0);
    /* Returned with the job still blocked: its cleanup has not run. */
    cr_assert_eq(atomic_load(&leave_cleanups), 0);
    cr_assert_eq(proc_threads(), before + 1, "only the abandoned job's thread is left");
    atomic_store(&leave_release, 1);
    while (proc_threads() != before && waited++ < 5000)
        usleep(1000);
    cr_assert_eq(proc_threads(), before, "the abandoned job's thread did not exit");
    cr_assert_eq(atomic_load(&leave_cleanups), 1);
    cr_assert_eq(atomic_load(&leave_same_thread), 1);
    cr_assert_eq(tu_alloc_settle(live), 0);
    cr_assert_eq(ferry_pool_free_ex(NULL, FERRY_POOL_FREE_LEAVE_ABANDONED), 0);
}

/* ---- jobs waiting beyond the queue's capacity when the pool is freed -------- */

/* A pool of one thread and a queue of one: job 0 runs, job 1 is queued,
 * jobs 2 and 3 wait for room.  Freeing the pool completes the queued job
 * with -ECANCELED and refuses the two that never got into the queue with
 * -ESHUTDOWN; none of them runs. */
static int of_worker(void *arg)
{
    struct pf_arg *a = arg;

    a->s->rc[a->i] = ferry_to_thread(a->s->p, a->i == 0 ? gated_job : never_job, NULL);
    atomic_fetch_add(&a->s->returned, 1);
    return 0;
}

static void *of_freer(void *arg)
{
    struct pf *s = arg;

    ferry_pool_free(s->p);                   /* blocks until job 0 ends */
    return NULL;
}

static int of_main(void *arg)
{
    struct pf *s = arg;
    struct pf_arg a[4];
    ferry_task *t[4];
    pthread_t freer;
    ferry_pool_stats st;

    for (int i = 0; i < 4; i++) {
        a[i] = (struct pf_arg){ s, i };
        ferry_task_spawn(&t[i], NULL, of_worker, &a[i], NULL);
        if (i == 0)
            tu_task_wait_flag(&gate_entered);
    }
    /* Until job 1 holds the queue's one place (jobs 2 and 3 reach the
     * pool at the end of the same turn, behind it). */
    do {
        ferry_sleep(FERRY_USEC(200));
        ferry_pool_stats_get(s->p, &st);
    } while (st.queued < 1);
    pthread_create(&freer, NULL, of_freer, s);
    while (atomic_load(&s->returned) < 3)
        ferry_sleep(FERRY_USEC(200));
    atomic_store(&gate, 1);
    for (int i = 0; i < 4; i++)
        ferry_task_join(t[i], NULL);
    pthread_join(freer, NULL);
    return 0;
}

T(free_refuses_jobs_waiting_for_room_and_cancels_the_queued_one)
{
    struct pf s = {0};

    cr_assert_eq(ferry_pool_new(&s.p, &(ferry_pool_opts){ .threads = 1, .capacity = 1 }), 0);
    cr_assert_eq(tu_run(of_main, &s), 0);
    cr_assert_eq(s.rc[0], 7);
    cr_assert_eq(s.rc[1], -ECANCELED, "the queued job: %d", s.rc[1]);
    cr_assert_eq(s.rc[2], -ESHUTDOWN, "job 2: %d", s.rc[2]);
    cr_assert_eq(s.rc[3], -ESHUTDOWN, "job 3: %d", s.rc[3]);
    cr_assert_eq(atomic_load(&never_ran), 0);
}

/* ---- options a pool refuses, the default pool shut down from its own job ---- */

static int shutdown_default_job(void *arg)
{
    (void)arg;
    return ferry_pool_default_shutdown(0);
}

static int shutdown_default_task(void *arg)
{
    (void)arg;
    return ferry_to_thread(NULL, shutdown_default_job, NULL);
}

T(too_many_threads_or_a_stack_too_small_is_einval_and_default_shutdown_from_its_job_edeadlk)
{
    ferry_pool *p = (ferry_pool *)1;
    ferry_pool_stats st;

    cr_assert_eq(ferry_pool_new(&p, &(ferry_pool_opts){ .threads = 5000 }), -EINVAL);
    cr_assert_null(p);
    cr_assert_eq(ferry_pool_new(&p, &(ferry_pool_opts){ .threads = 1, .stack_size = 1 }),
                 -EINVAL);
    cr_assert_null(p);
    /* Nothing done: the default pool still runs jobs. */
    cr_assert_eq(tu_run(shutdown_default_task, NULL), -EDEADLK);
    cr_assert_eq(tu_run(to_thread_basic_task, NULL), 42);
    cr_assert_eq(ferry_pool_default_shutdown(0), 0);
    cr_assert_eq(ferry_pool_stats_get(NULL, &st), 0);   /* a new default pool */
    cr_assert_eq(ferry_pool_default_shutdown(0), 0);
}

/* The default pool cannot be started (no memory): the calls that would
 * use it are -ENOMEM and leave nothing behind; with memory, it starts. */
TL(default_pool_that_cannot_start_is_enomem)
{
    ferry_pool_stats st;

    ferry__fault_arm(1, true);
    cr_assert_null(ferry_pool_default());
    cr_assert_eq(ferry_pool_stats_get(NULL, &st), -ENOMEM);
    cr_assert_eq(ferry_pool_submit(NULL, job42, NULL, NULL, on_done, NULL), -ENOMEM);
    cr_assert_gt(ferry__fault_hits(), 0);
    ferry__fault_reset();
    cr_assert_eq(tu_leaks(), 0);
    cr_assert_eq(atomic_load(&done_calls), 0);
    cr_assert_eq(ferry_pool_stats_get(NULL, &st), 0);
    cr_assert_geq(st.threads, 1);
    cr_assert_eq(ferry_pool_default_shutdown(0), 0);
}
