/* test_fuzz.c - schedule fuzzing (ferry_loop_opts.fuzz_seed, FERRY_FUZZ):
 * the order of ready tasks is drawn from the seed and replays with it,
 * callbacks keep their order, free locks and available elements suspend
 * now and then, and without fuzzing the order is FIFO.
 *
 * No cr_assert inside task bodies (see testutil.h).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <criterion/criterion.h>

#include "fault.h"
#include "testutil.h"

/* Tests that make their own loops. */
#define TL(suite, name) \
    Test(suite, name, .init = tu_alloc_setup, .fini = tu_loop_teardown, .timeout = 60.)

/* ---- a trace of task steps ------------------------------------------- */

#define NTASKS 8
#define NSTEPS 6
#define TRACE_MAX (NTASKS * NSTEPS + 64)

static int trace[TRACE_MAX];
static int ntrace;
static int body_errors;

static void record(int v)
{
    if (ntrace < TRACE_MAX)
        trace[ntrace++] = v;
}

/* Records its number, then yields, NSTEPS times. */
static int stepper(void *arg)
{
    for (int i = 0; i < NSTEPS; i++) {
        record((int)(intptr_t)arg);
        if (ferry_yield())
            body_errors++;
    }
    return 0;
}

static int spawn_steppers(void *arg)
{
    ferry_task *t[NTASKS];

    (void)arg;
    for (int i = 0; i < NTASKS; i++)
        if (ferry_task_spawn(&t[i], NULL, stepper, (void *)(intptr_t)i, NULL))
            body_errors++;
    for (int i = 0; i < NTASKS; i++)
        if (ferry_task_join(t[i], NULL))
            body_errors++;
    return 0;
}

/* Run spawn_steppers on a new loop with these options; the trace is in
 * trace[0..ntrace). */
static void run_traced(const ferry_loop_opts *o)
{
    ferry_loop *loop;

    ntrace = 0;
    body_errors = 0;
    cr_assert_eq(ferry_loop_new(&loop, o), 0);
    cr_assert_eq(tu_run_on(loop, spawn_steppers, NULL), 0);
    ferry_loop_free(loop);
    cr_assert_eq(body_errors, 0);
    cr_assert_eq(ntrace, NTASKS * NSTEPS);
}

TL(fuzz, off_is_fifo)
{
    run_traced(NULL);
    /* Round after round, every task once, in the order of their spawns. */
    for (int i = 0; i < ntrace; i++)
        cr_expect_eq(trace[i], i % NTASKS, "step %d: task %d ran, FIFO gives %d", i, trace[i],
                     i % NTASKS);
}

TL(fuzz, same_seed_same_order_other_seed_other_order)
{
    ferry_loop_opts o = { .fuzz_seed = 42 };
    int first[TRACE_MAX], differ = 0, unlike_fifo = 0;

    run_traced(&o);
    memcpy(first, trace, sizeof first);
    for (int i = 0; i < ntrace; i++)
        unlike_fifo += trace[i] != i % NTASKS;
    cr_expect_gt(unlike_fifo, 0, "seed 42 ran the tasks in FIFO order");

    /* Replay: the same seed gives the same steps. */
    run_traced(&o);
    for (int i = 0; i < ntrace; i++)
        cr_expect_eq(trace[i], first[i], "replay of seed 42 differs at step %d", i);

    /* Other seeds give other orders (each one could match by chance with
     * a probability far below 1e-30). */
    for (uint64_t seed = 1; seed <= 3; seed++) {
        o.fuzz_seed = seed;
        run_traced(&o);
        differ = 0;
        for (int i = 0; i < ntrace; i++)
            differ += trace[i] != first[i];
        cr_expect_gt(differ, 0, "seed %llu ran the same steps as seed 42",
                     (unsigned long long)seed);
    }
}

/* ---- callbacks keep their order ---------------------------------------- */

static void cb_record(void *arg)
{
    record(100 + (int)(intptr_t)arg);
}

static int spawn_mixed(void *arg)
{
    ferry_task *t[NTASKS];

    (void)arg;
    /* Callbacks and tasks queued in one batch, interleaved. */
    for (int i = 0; i < NTASKS; i++) {
        if (ferry_task_spawn(&t[i], NULL, stepper, (void *)(intptr_t)i, NULL))
            body_errors++;
        if (ferry_call_soon(ferry_loop_current(), cb_record, (void *)(intptr_t)i))
            body_errors++;
    }
    for (int i = 0; i < NTASKS; i++)
        if (ferry_task_join(t[i], NULL))
            body_errors++;
    return 0;
}

TL(fuzz, callbacks_keep_their_order)
{
    ferry_loop_opts o = { .fuzz_seed = 7 };
    ferry_loop *loop;
    int next_cb = 0, tasks_unlike_fifo = 0, task_steps = 0;

    ntrace = 0;
    body_errors = 0;
    cr_assert_eq(ferry_loop_new(&loop, &o), 0);
    cr_assert_eq(tu_run_on(loop, spawn_mixed, NULL), 0);
    ferry_loop_free(loop);
    cr_assert_eq(body_errors, 0);
    for (int i = 0; i < ntrace; i++) {
        if (trace[i] >= 100) {
            cr_expect_eq(trace[i], 100 + next_cb, "callback %d ran where %d was due",
                         trace[i] - 100, next_cb);
            next_cb++;
        } else {
            tasks_unlike_fifo += trace[i] != task_steps % NTASKS;
            task_steps++;
        }
    }
    cr_expect_eq(next_cb, NTASKS);
    cr_expect_gt(tasks_unlike_fifo, 0, "the tasks ran in FIFO order under fuzzing");
}

/* ---- spurious suspensions -------------------------------------------- */

static ferry_lock free_lock;
static ferry_queue fullq;
static ferry_sem sem;
static ferry_event set_ev;
static bool suspended[4];  /* the task's step ended during each call */

/* The loop's step count: it goes up when the running task suspends and
 * is resumed, and only then. */
static uint64_t steps_now(void)
{
    ferry_loop_stats st;

    if (ferry_loop_stats_get(ferry_loop_current(), &st))
        body_errors++;
    return st.steps;
}

/* Each call below cannot suspend in a plain run: the lock is free, the
 * queue holds an element, the semaphore has a permit, the event is set. */
static int calls_that_need_not_suspend(void *arg)
{
    int item = 1, out, bad = 0;
    uint64_t before;

    (void)arg;
    bad |= ferry_event_set(&set_ev);
    before = steps_now();
    bad |= ferry_lock_acquire(&free_lock);
    suspended[0] = steps_now() != before;
    bad |= ferry_lock_release(&free_lock);

    bad |= ferry_queue_try_put(&fullq, &item);
    before = steps_now();
    bad |= ferry_queue_get(&fullq, &out);
    suspended[1] = steps_now() != before;

    before = steps_now();
    bad |= ferry_sem_acquire(&sem);
    suspended[2] = steps_now() != before;

    before = steps_now();
    bad |= ferry_event_wait(&set_ev);
    suspended[3] = steps_now() != before;
    return bad;
}

static void run_points(const ferry_loop_opts *o)
{
    ferry_loop *loop;

    body_errors = 0;
    memset(suspended, 0, sizeof suspended);
    ferry_lock_init(&free_lock);
    cr_assert_eq(ferry_queue_init(&fullq, sizeof(int), 4, FERRY_QUEUE_FIFO, NULL, NULL), 0);
    cr_assert_eq(ferry_sem_init(&sem, 1, 0), 0);
    cr_assert_eq(ferry_event_init(&set_ev), 0);
    cr_assert_eq(ferry_loop_new(&loop, o), 0);
    cr_assert_eq(tu_run_on(loop, calls_that_need_not_suspend, NULL), 0);
    cr_assert_eq(ferry_queue_destroy(&fullq), 0);
    ferry_lock_destroy(&free_lock);
    ferry_sem_destroy(&sem);
    ferry_event_destroy(&set_ev);
    ferry_loop_free(loop);
    cr_assert_eq(body_errors, 0);
}

TL(fuzz, free_lock_and_available_element_suspend_at_probability_one)
{
    ferry_loop_opts o = { .fuzz_seed = 3, .fuzz_prob = 1.0 };
    const char *what[4] = { "free lock", "queue get", "semaphore", "set event" };

    run_points(&o);
    for (int i = 0; i < 4; i++)
        cr_expect(suspended[i], "%s: the call did not suspend at probability 1", what[i]);
}

TL(fuzz, no_spurious_suspension_when_off)
{
    const char *what[4] = { "free lock", "queue get", "semaphore", "set event" };

    run_points(NULL);
    for (int i = 0; i < 4; i++)
        cr_expect(!suspended[i], "%s: the call suspended without fuzzing", what[i]);
}

/* ---- options and the environment ------------------------------------- */

TL(fuzz, probability_above_one_is_einval)
{
    ferry_loop_opts o = { .fuzz_seed = 1, .fuzz_prob = 1.5 };
    ferry_loop *loop = NULL;

    cr_expect_eq(ferry_loop_new(&loop, &o), -EINVAL);
    cr_expect_null(loop);
}

TL(fuzz, environment_overrides_the_options)
{
    ferry_loop_opts o = { .fuzz_seed = 42 };
    ferry_loop_opts by_env = { .fuzz_seed = 9 };
    int want[TRACE_MAX];

    run_traced(&o);
    memcpy(want, trace, sizeof want);
    /* The process's first loop under FERRY_FUZZ=42 draws as seed 42 does,
     * whatever its options say. */
    setenv("FERRY_FUZZ", "42", 1);
    run_traced(&by_env);
    unsetenv("FERRY_FUZZ");
    for (int i = 0; i < ntrace; i++)
        cr_expect_eq(trace[i], want[i], "FERRY_FUZZ=42 differs from seed 42 at step %d", i);
}

/* What ferry logged during a test. */
static char logged[4][256];
static int nlogged;

static void log_hook(int level, const char *msg, void *ctx)
{
    (void)level; (void)ctx;
    if (nlogged < 4)
        snprintf(logged[nlogged], sizeof logged[0], "%s", msg);
    nlogged++;
}

TL(fuzz, environment_invalid_value_is_off_and_logged)
{
    const char *bad[] = { "x", "-3", "5,", "5,2", "5,0.5x", "99999999999999999999999" };

    ferry_set_log(log_hook, NULL);
    nlogged = 0;
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        setenv("FERRY_FUZZ", bad[b], 1);
        run_traced(NULL);
        for (int i = 0; i < ntrace; i++)
            cr_expect_eq(trace[i], i % NTASKS, "FERRY_FUZZ=%s: not FIFO at step %d", bad[b], i);
    }
    unsetenv("FERRY_FUZZ");
    ferry_set_log(NULL, NULL);
    /* One warning for the process, not one per loop. */
    cr_expect_eq(nlogged, 1);
    cr_expect(strstr(logged[0], "FERRY_FUZZ=x ignored") != NULL, "logged: %s", logged[0]);
}

TL(fuzz, environment_seed_and_probability_each_loop_its_own_seed)
{
    int first[TRACE_MAX], differ = 0;

    ferry_set_log(log_hook, NULL);
    nlogged = 0;
    setenv("FERRY_FUZZ", "11,0.25", 1);
    run_traced(NULL);
    memcpy(first, trace, sizeof first);
    run_traced(NULL);
    unsetenv("FERRY_FUZZ");
    ferry_set_log(NULL, NULL);
    for (int i = 0; i < ntrace; i++)
        differ += trace[i] != first[i];
    cr_expect_gt(differ, 0, "the process's second loop drew the same order as its first");
    cr_expect_eq(nlogged, 2);
    cr_expect_str_eq(logged[0], "schedule fuzzing on, seed 11 (FERRY_FUZZ=11,0.25 replays "
                                "the loop's choices and when the pool jobs its tasks wait "
                                "for come back; not when other threads post)");
    cr_expect_str_eq(logged[1], "schedule fuzzing on, seed 11, loop 2 of the process "
                                "(FERRY_FUZZ=11,0.25 replays the loop's choices and when the "
                                "pool jobs its tasks wait for come back; not when other "
                                "threads post)");
}

/* ---- threads ----------------------------------------------------------- */

#define NPOSTS 100

static int posted_order[NPOSTS];
static int nposted;
static ferry_loop *post_loop;
static atomic_int thread_errors;

static void post_cb(void *arg)
{
    if (nposted < NPOSTS)
        posted_order[nposted] = (int)(intptr_t)arg;
    nposted++;
}

static int64_t posting_ns;  /* how long the poster took for its posts */

static void *poster(void *arg)
{
    int64_t t0 = ferry_now();

    (void)arg;
    for (int i = 0; i < NPOSTS; i++)
        if (ferry_loop_call_soon_threadsafe(post_loop, post_cb, (void *)(intptr_t)i))
            atomic_fetch_add(&thread_errors, 1);
    posting_ns = ferry_now() - t0;
    return NULL;
}

static int job_add(void *arg)
{
    (*(int *)arg)++;
    return 0;
}

static int posts_and_jobs(void *arg)
{
    pthread_t th;
    int v = 0, bad = 0;

    (void)arg;
    if (pthread_create(&th, NULL, poster, NULL))
        return -1;
    /* Jobs delayed before they start and before they complete. */
    for (int i = 0; i < 20; i++)
        bad |= ferry_to_thread(NULL, job_add, &v);
    while (nposted < NPOSTS)
        ferry_sleep(FERRY_MSEC(1));
    pthread_join(th, NULL);
    return bad ? bad : v == 20 ? 0 : -2;
}

TL(fuzz, posts_from_a_thread_keep_their_order_under_delays)
{
    ferry_loop_opts o = { .fuzz_seed = 5, .fuzz_prob = 1.0 };

    nposted = 0;
    cr_assert_eq(ferry_loop_new(&post_loop, &o), 0);
    cr_assert_eq(tu_run_on(post_loop, posts_and_jobs, NULL), 0);
    ferry_loop_free(post_loop);
    ferry_pool_default_shutdown(0);
    cr_assert_eq(atomic_load(&thread_errors), 0);
    cr_assert_eq(nposted, NPOSTS);
    for (int i = 0; i < NPOSTS; i++)
        cr_expect_eq(posted_order[i], i, "post %d ran in place %d", posted_order[i], i);
    /* At probability 1 the poster sleeps before each post, from 1 us to
     * 2 ms, spread over the orders of magnitude: one sleep in six is over
     * 1 ms, so 100 posts take under 1 ms with a chance of (5/6)^100, about
     * 1e-8. */
    cr_expect_geq(posting_ns, FERRY_MSEC(1), "no delay seen: %d posts in %lld ns", NPOSTS,
                  (long long)posting_ns);
}

/* ---- no memory for the shuffle ------------------------------------------ */

static int spawn_then_fail_allocations(void *arg)
{
    ferry_task *t[NTASKS];

    (void)arg;
    for (int i = 0; i < NTASKS; i++)
        if (ferry_task_spawn(&t[i], NULL, stepper, (void *)(intptr_t)i, NULL))
            body_errors++;
    ferry__fault_arm(1, true);
    for (int i = 0; i < NTASKS; i++)
        if (ferry_task_join(t[i], NULL))
            body_errors++;
    ferry__fault_reset();
    return 0;
}

TL(fuzz, shuffle_without_memory_keeps_the_order)
{
    ferry_loop_opts o = { .fuzz_seed = 42, .fuzz_prob = -1 };
    ferry_loop *loop;

    ntrace = 0;
    body_errors = 0;
    cr_assert_eq(ferry_loop_new(&loop, &o), 0);
    cr_assert_eq(tu_run_on(loop, spawn_then_fail_allocations, NULL), 0);
    ferry_loop_free(loop);
    cr_assert_eq(body_errors, 0);
    cr_assert_eq(ntrace, NTASKS * NSTEPS);
    for (int i = 0; i < ntrace; i++)
        cr_expect_eq(trace[i], i % NTASKS, "step %d: task %d ran, FIFO gives %d", i, trace[i],
                     i % NTASKS);
}

/* ---- thread completions replay ------------------------------------------ */

#define RTASKS 6
#define RROUNDS 5
#define RTRACE_MAX (RTASKS * RROUNDS * 3 + 16)

static int rtrace[RTRACE_MAX];
static int nrtrace;

static void rrecord(int v)
{
    if (nrtrace < RTRACE_MAX)
        rtrace[nrtrace++] = v;
}

/* A short job whose length varies from call to call and thread to thread. */
static int short_job(void *arg)
{
    static atomic_uint calls;
    unsigned n = atomic_fetch_add(&calls, 1) % 7;
    volatile unsigned sink = 0;

    (void)arg;
    for (unsigned i = 0; i < 2000u * n; i++)
        sink += i;
    return 0;
}

/* Offloads a job and yields, RROUNDS times, recording each step. */
static int offloader(void *arg)
{
    ferry_pool *pool = *(ferry_pool **)arg;
    int id = (int)(intptr_t)((ferry_pool **)arg)[1];

    for (int i = 0; i < RROUNDS; i++) {
        rrecord(id);
        if (ferry_to_thread(pool, short_job, NULL))
            body_errors++;
        rrecord(100 + id);
        if (ferry_yield())
            body_errors++;
    }
    return 0;
}

static int spawn_offloaders(void *arg)
{
    ferry_task *t[RTASKS];
    void *args[RTASKS][2];

    for (int i = 0; i < RTASKS; i++) {
        args[i][0] = *(ferry_pool **)arg;
        args[i][1] = (void *)(intptr_t)i;
        if (ferry_task_spawn(&t[i], NULL, offloader, args[i], NULL))
            body_errors++;
    }
    for (int i = 0; i < RTASKS; i++)
        if (ferry_task_join(t[i], NULL))
            body_errors++;
    return 0;
}

/* One run of the offloaders under `seed`; its trace is in rtrace. */
static void run_offloaders(uint64_t seed)
{
    ferry_loop_opts o = { .fuzz_seed = seed };
    ferry_pool_opts po = { .threads = 4 };
    ferry_pool *pool;
    ferry_loop *loop;

    nrtrace = 0;
    body_errors = 0;
    cr_assert_eq(ferry_pool_new(&pool, &po), 0);
    cr_assert_eq(ferry_loop_new(&loop, &o), 0);
    cr_assert_eq(tu_run_on(loop, spawn_offloaders, &pool), 0);
    ferry_loop_free(loop);
    ferry_pool_free(pool);
    cr_assert_eq(body_errors, 0);
    cr_assert_eq(nrtrace, RTASKS * RROUNDS * 2);
}

/* Tasks wait for pool jobs whose lengths and thread delays vary from run
 * to run: under one seed the loop's schedule (who ran when, and where each
 * completion came in) is the same every time. */
TL(fuzz, completions_from_pool_threads_replay_with_the_seed)
{
    int first[RTRACE_MAX], nfirst, differ = 0;

    for (uint64_t seed = 11; seed <= 12; seed++) {
        run_offloaders(seed);
        memcpy(first, rtrace, sizeof rtrace);
        nfirst = nrtrace;
        for (int run = 1; run < 8; run++) {
            run_offloaders(seed);
            if (nrtrace != nfirst || memcmp(first, rtrace, (size_t)nfirst * sizeof *rtrace))
                differ++;
        }
    }
    cr_expect_eq(differ, 0, "%d of 14 runs took another schedule than the first of their seed",
                 differ);
}

/* A job that outlasts the poll's wait for threads' work. */
static int long_job(void *arg)
{
    struct timespec ts = { 0, 80 * 1000 * 1000 };

    (void)arg;
    nanosleep(&ts, NULL);
    return 7;
}

static int yielder(void *arg)
{
    (void)arg;
    for (int i = 0; i < 200; i++)
        if (ferry_yield())
            body_errors++;
    return 0;
}

static int long_and_short(void *arg)
{
    ferry_pool *pool = arg;
    ferry_task *y;
    int rc;

    if (ferry_task_spawn(&y, NULL, yielder, NULL, NULL))
        body_errors++;
    rc = ferry_to_thread(pool, long_job, NULL);
    if (rc != 7)
        body_errors++;
    /* Waits for threads' work are counted again from here on. */
    if (ferry_to_thread(pool, short_job, NULL))
        body_errors++;
    if (ferry_task_join(y, NULL))
        body_errors++;
    return 0;
}

/* A job longer than the poll waits for still completes, and the loop does
 * not stall on it. */
TL(fuzz, a_job_longer_than_the_wait_completes)
{
    ferry_loop_opts o = { .fuzz_seed = 3 };
    ferry_pool_opts po = { .threads = 2 };
    ferry_pool *pool;
    ferry_loop *loop;

    body_errors = 0;
    cr_assert_eq(ferry_pool_new(&pool, &po), 0);
    cr_assert_eq(ferry_loop_new(&loop, &o), 0);
    cr_assert_eq(tu_run_on(loop, long_and_short, pool), 0);
    ferry_loop_free(loop);
    ferry_pool_free(pool);
    cr_assert_eq(body_errors, 0);
}

/* Tasks cancelled while they wait for pool jobs, whose completions may be
 * held by the loop at that moment: each ends with its job's status or
 * -ECANCELED, and nothing is left behind. */
static int offload_forever(void *arg)
{
    ferry_pool *pool = arg;
    int rc;

    for (;;) {
        rc = ferry_to_thread(pool, short_job, NULL);
        if (rc == -ECANCELED)
            return 0;
        if (rc != 0) {
            body_errors++;
            return rc;
        }
    }
}

static int cancel_offloaders(void *arg)
{
    ferry_task *t[RTASKS];

    for (int i = 0; i < RTASKS; i++)
        if (ferry_task_spawn(&t[i], NULL, offload_forever, arg, NULL))
            body_errors++;
    for (int i = 0; i < RTASKS; i++) {
        for (int k = 0; k < 3 + i; k++)
            if (ferry_yield())
                body_errors++;
        ferry_task_cancel(t[i]);
    }
    for (int i = 0; i < RTASKS; i++)
        if (ferry_task_join(t[i], NULL))
            body_errors++;
    return 0;
}

TL(fuzz, tasks_cancelled_while_their_completion_is_held_end_cleanly)
{
    ferry_pool_opts po = { .threads = 4 };
    ferry_pool *pool;

    body_errors = 0;
    cr_assert_eq(ferry_pool_new(&pool, &po), 0);
    for (uint64_t seed = 1; seed <= 20; seed++) {
        ferry_loop_opts o = { .fuzz_seed = seed };
        ferry_loop *loop;

        cr_assert_eq(ferry_loop_new(&loop, &o), 0);
        cr_assert_eq(tu_run_on(loop, cancel_offloaders, pool), 0);
        ferry_loop_free(loop);
    }
    ferry_pool_free(pool);
    cr_assert_eq(body_errors, 0);
}
