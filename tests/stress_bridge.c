/* stress_bridge.c - threads and tasks over every entry point of the bridge,
 * counting every item and callback end to end: zero lost, zero duplicated.
 *
 * Iteration counts are multiplied by FERRY_STRESS_SCALE (default 1) so the
 * same tests run, smaller, under TSan and valgrind.  Nothing here asserts a
 * duration.  No cr_assert inside tasks or callbacks.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "testutil.h"
#include "ferry/bridge.h"

/* xorshift, per caller */
static unsigned rnd(unsigned *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

/* ==== 4 threads x 250,000 posts ======================================== */

#define NPOST 4

static long post_n;
static long post_next[NPOST];       /* loop thread: next expected sequence */
static long post_disorder;          /* loop thread */
static long post_total;             /* loop thread */

struct post_item { int thread; long seq; };

static void post_cb(void *arg)
{
    uintptr_t v = (uintptr_t)arg;
    int t = (int)(v & 3);
    long seq = (long)(v >> 2);
    if (seq != post_next[t])
        post_disorder++;
    post_next[t] = seq + 1;
    if (++post_total == NPOST * post_n)
        ferry_loop_stop(tu_loop);
}

static void *post_thread(void *arg)
{
    uintptr_t t = (uintptr_t)arg;
    for (long i = 0; i < post_n; i++) {
        int rc;
        while ((rc = ferry_loop_call_soon_threadsafe(tu_loop, post_cb,
                                                     (void *)(((uintptr_t)i << 2) | t))) == -ENOMEM)
            sched_yield();
        if (rc)
            return (void *)1;
    }
    return NULL;
}

Test(stress_bridge, four_threads_post_250k_each_nothing_lost_or_reordered,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 60.)
{
    pthread_t t[NPOST];
    ferry_inbox_stats st;
    void *bad;

    post_n = tu_scaled(250000);
    for (uintptr_t i = 0; i < NPOST; i++)
        t[i] = tu_start_thread(post_thread, (void *)i);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_FOREVER), 0);
    for (int i = 0; i < NPOST; i++) {
        pthread_join(t[i], &bad);
        cr_assert_null(bad);
    }
    cr_assert_eq(post_total, NPOST * post_n);
    cr_assert_eq(post_disorder, 0);
    for (int i = 0; i < NPOST; i++)
        cr_assert_eq(post_next[i], post_n);
    cr_assert_eq(ferry_loop_inbox_stats_get(tu_loop, &st), 0);
    cr_assert_eq(st.posts, (uint64_t)(NPOST * post_n));
    cr_assert_eq(st.run, (uint64_t)(NPOST * post_n));
    cr_assert_lt(st.wakeups, st.posts / 2, "wakeups %llu for %llu posts",
                 (unsigned long long)st.wakeups, (unsigned long long)st.posts);
    cr_log_info("4 x %ld posts: %llu eventfd writes, %llu drains, max batch %zu",
                post_n, (unsigned long long)st.wakeups, (unsigned long long)st.drains,
                st.max_batch);
}

/* ==== single-item rounds: a post racing the drain is never stranded ==== */

static pthread_mutex_t pp_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pp_cv = PTHREAD_COND_INITIALIZER;
static long pp_acked;

static void pp_cb(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&pp_mu);
    pp_acked++;
    pthread_cond_signal(&pp_cv);
    pthread_mutex_unlock(&pp_mu);
}

static void *pp_thread(void *arg)
{
    long rounds = (long)(intptr_t)arg, stranded = 0;
    for (long i = 0; i < rounds && !stranded; i++) {
        struct timespec ts;
        ferry_loop_call_soon_threadsafe(tu_loop, pp_cb, NULL);
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 5;
        pthread_mutex_lock(&pp_mu);
        while (pp_acked <= i)
            if (pthread_cond_timedwait(&pp_cv, &pp_mu, &ts) == ETIMEDOUT) {
                stranded++;          /* the loop slept with our post queued */
                break;
            }
        pthread_mutex_unlock(&pp_mu);
    }
    ferry_loop_stop_threadsafe(tu_loop);
    return (void *)(intptr_t)stranded;
}

Test(stress_bridge, single_item_rounds_never_strand_a_post,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 120.)
{
    long rounds = tu_scaled(200000);
    void *stranded;
    pthread_t t = tu_start_thread(pp_thread, (void *)(intptr_t)rounds);

    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_FOREVER), 0);
    pthread_join(t, &stranded);
    cr_assert_null(stranded);
    cr_assert_eq(pp_acked, rounds);
}

/* ==== to_thread cancelled at random moments ============================ */

/*
 * Where each job was when its task's call returned -ECANCELED, from what
 * the call returned and what the job itself recorded:
 *   RC_NOT_RUN   ferry_to_thread(), or ferry_to_thread_abandon() whose
 *                cleanup had already run with -ECANCELED (bridge.h: only
 *                for a job that never started; an abandoned job's cleanup
 *                gets fn's status, which is never negative here): fn
 *                must never run, not even later;
 *   RC_RUNNING   ferry_to_thread_abandon(), fn had started;
 *   RC_UNSEEN    ferry_to_thread_abandon(), no cleanup yet and fn not
 *                started: the pool took the job but fn had not reached its
 *                first line.  Then fn must be the very next job its pool
 *                thread starts after the call returned: a thread that
 *                started or ended another job first had not taken this one
 *                yet, so the job was still queued when its task was
 *                cancelled.
 */
enum { RC_NONE = 0, RC_NOT_RUN, RC_RUNNING, RC_UNSEEN };
enum { RC_THREADS = 4, RC_MAXW = 8 };

struct rc_state {
    ferry_pool  *pool;
    long         n;
    atomic_char *ran;       /* per job: fn ran (times) */
    atomic_char *cleaned;   /* per job: abandon cleanup ran (times, +100 if a wrong status) */
    atomic_int  *clean_status; /* per job: the status cleanup got */
    int         *slot;      /* per job: the pool thread fn ran on (written there) */
    unsigned    *entry;     /* per job: that thread's wseq when fn began */
    int         *rc;        /* per task: the call's result */
    char        *when;      /* per task: RC_*, noted when the call returned -ECANCELED */
    unsigned    *snap;      /* per task: every thread's wseq when the call returned */
    bool        *returned;  /* loop thread: the task's call has returned */
    bool        *cancelled; /* loop thread: cancelled while its call had not returned */
    ferry_task **tasks;
    long         done;      /* loop thread: tasks of the current wave done */
    long         lo, hi;    /* loop thread: the current wave */
    unsigned     seed;
    /* Per pool thread: +1 when fn begins and +1 when it ends, so it is odd
     * inside fn and counts the job starts and ends of that thread. */
    atomic_uint  wseq[RC_MAXW];
    atomic_int   nthreads;
    /* Closed at the start of each wave, opened by the canceller after its
     * first cancels: until then fn holds its pool thread, so that those
     * cancels find calls still queued or waiting for room however fast
     * the pool threads run against the loop's thread. */
    atomic_bool  gate;
};
static struct rc_state rcs;
static _Thread_local int rc_wslot = -1;

static int rc_job(void *arg)
{
    long i = (long)(intptr_t)arg;

    if (rc_wslot < 0)
        rc_wslot = atomic_fetch_add(&rcs.nthreads, 1) % RC_MAXW;
    rcs.slot[i] = rc_wslot;
    rcs.entry[i] = atomic_fetch_add(&rcs.wseq[rc_wslot], 1);
    if (atomic_fetch_add(&rcs.ran[i], 1) != 0) {
        atomic_fetch_add(&rcs.wseq[rc_wslot], 1);
        return -999;                               /* ran twice */
    }
    while (!atomic_load(&rcs.gate))
        usleep(10);
    if (i % 3 == 0)
        usleep(50);
    atomic_fetch_add(&rcs.wseq[rc_wslot], 1);
    return (int)(i % 1000);
}

static void rc_cleanup(void *arg, int status)
{
    long i = (long)(intptr_t)arg;

    atomic_store(&rcs.clean_status[i], status);
    /* fn's late status, or -ECANCELED when it never ran. */
    if (status == (int)(i % 1000) || (status == -ECANCELED && !atomic_load(&rcs.ran[i])))
        atomic_fetch_add(&rcs.cleaned[i], 1);
    else
        atomic_fetch_add(&rcs.cleaned[i], 100);   /* wrong status */
}

/* The call of task i returned -ECANCELED: note where its job was. */
static void rc_note_cancelled(long i)
{
    bool started;
    int w;

    /* The threads first, then fn's flag: a job whose fn had not begun
     * when the flag was read had not begun at the snapshot either. */
    for (w = 0; w < RC_MAXW; w++)
        rcs.snap[i * RC_MAXW + w] = atomic_load(&rcs.wseq[w]);
    started = atomic_load(&rcs.ran[i]) != 0;
    if (!(i & 1) ||
        (atomic_load(&rcs.cleaned[i]) && atomic_load(&rcs.clean_status[i]) == -ECANCELED))
        rcs.when[i] = RC_NOT_RUN;
    else
        rcs.when[i] = started ? RC_RUNNING : RC_UNSEEN;
}

static int rc_task(void *arg)
{
    long i = (long)(intptr_t)arg;
    for (unsigned y = rnd(&rcs.seed) % 4; y; y--)
        ferry_yield();
    rcs.rc[i] = (i & 1)
        ? ferry_to_thread_abandon(rcs.pool, rc_job, (void *)(intptr_t)i, rc_cleanup)
        : ferry_to_thread(rcs.pool, rc_job, (void *)(intptr_t)i);
    if (rcs.rc[i] == -ECANCELED)
        rc_note_cancelled(i);
    rcs.returned[i] = true;
    rcs.done++;
    return 0;
}

static int rc_canceller(void *arg)
{
    int sent = 0;

    (void)arg;
    while (rcs.done < rcs.hi - rcs.lo) {
        long i = rcs.lo + (long)(rnd(&rcs.seed) % (unsigned)(rcs.hi - rcs.lo));
        if (rnd(&rcs.seed) % 3 == 0) {
            if (!rcs.returned[i])
                rcs.cancelled[i] = true;
            ferry_task_cancel(rcs.tasks[i]);
            if (++sent == 3)
                atomic_store(&rcs.gate, true);
        }
        if (rnd(&rcs.seed) % 2)
            ferry_yield();
        else
            ferry_sleep(FERRY_USEC(20));
    }
    return 0;
}

static int rc_main(void *arg)
{
    ferry_task *c;
    (void)arg;
    /* Waves of 1,000 live tasks keep TSan's shadow and the stack mappings
     * small. */
    for (rcs.lo = 0; rcs.lo < rcs.n; rcs.lo = rcs.hi) {
        rcs.hi = rcs.lo + 1000 < rcs.n ? rcs.lo + 1000 : rcs.n;
        rcs.done = 0;
        atomic_store(&rcs.gate, false);
        for (long i = rcs.lo; i < rcs.hi; i++)
            if (ferry_task_spawn(&rcs.tasks[i], NULL, rc_task, (void *)(intptr_t)i, NULL))
                return -1;
        ferry_task_spawn(&c, NULL, rc_canceller, NULL, NULL);
        for (long i = rcs.lo; i < rcs.hi; i++)
            ferry_task_join(rcs.tasks[i], NULL);
        ferry_task_join(c, NULL);
        atomic_store(&rcs.gate, true);
    }
    return 0;
}

Test(stress_bridge, to_thread_cancelled_at_random_moments_exact_accounting,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 120.)
{
    long ok = 0, not_run = 0, abandoned = 0, unseen = 0, waited = 0;
    ferry_pool_stats st;

    rcs.n = tu_scaled(20000);
    rcs.seed = 12345;
    rcs.ran = calloc((size_t)rcs.n, 1);
    rcs.cleaned = calloc((size_t)rcs.n, 1);
    rcs.clean_status = calloc((size_t)rcs.n, sizeof(atomic_int));
    rcs.slot = calloc((size_t)rcs.n, sizeof(int));
    rcs.entry = calloc((size_t)rcs.n, sizeof(unsigned));
    rcs.rc = calloc((size_t)rcs.n, sizeof(int));
    rcs.when = calloc((size_t)rcs.n, 1);
    rcs.snap = calloc((size_t)rcs.n * RC_MAXW, sizeof(unsigned));
    rcs.returned = calloc((size_t)rcs.n, sizeof(bool));
    rcs.cancelled = calloc((size_t)rcs.n, sizeof(bool));
    rcs.tasks = calloc((size_t)rcs.n, sizeof(ferry_task *));
    cr_assert(rcs.ran && rcs.cleaned && rcs.clean_status && rcs.slot && rcs.entry && rcs.rc &&
              rcs.when && rcs.snap && rcs.returned && rcs.cancelled && rcs.tasks);
    cr_assert_eq(ferry_pool_new(&rcs.pool, &(ferry_pool_opts){ .threads = RC_THREADS,
                                                               .capacity = 64 }), 0);
    cr_assert_eq(tu_run(rc_main, NULL), 0);
    ferry_pool_free(rcs.pool);          /* waits for abandoned jobs: cleanups are in */
    cr_assert_leq(atomic_load(&rcs.nthreads), RC_MAXW);

    for (long i = 0; i < rcs.n; i++) {
        int r = rcs.rc[i];
        char didrun = atomic_load(&rcs.ran[i]), clean = atomic_load(&rcs.cleaned[i]);
        cr_assert_leq(didrun, 1, "job %ld ran %d times", i, didrun);
        if (r == (int)(i % 1000)) {
            ok++;
            waited += rcs.cancelled[i];
            cr_assert_eq(didrun, 1, "job %ld: status without a run", i);
            cr_assert_eq(clean, 0, "job %ld: cleanup after a normal return", i);
            continue;
        }
        cr_assert(r == -ECANCELED, "job %ld: rc %d", i, r);
        switch (rcs.when[i]) {
        case RC_NOT_RUN:
            cr_assert_eq(didrun, 0, "job %ld: its %s returned -ECANCELED before it started%s, "
                         "yet fn ran later", i, (i & 1) ? "ferry_to_thread_abandon" :
                         "ferry_to_thread", (i & 1) ? " (cleanup had run)" : "");
            /* The abandon variant's cleanup got arg at once. */
            cr_assert_eq(clean, (i & 1) ? 1 : 0, "job %ld never ran; cleanup %d", i, clean);
            not_run++;
            break;
        case RC_RUNNING:
        case RC_UNSEEN:
            cr_assert(i & 1, "job %ld: ferry_to_thread returned -ECANCELED for a running job", i);
            cr_assert_eq(didrun, 1, "job %ld: abandoned while running, but fn never ran", i);
            if (rcs.when[i] == RC_UNSEEN) {
                int w = rcs.slot[i];
                unsigned at = rcs.snap[i * RC_MAXW + w];
                cr_assert_leq(rcs.entry[i], at,
                              "job %ld was still queued when its task was cancelled, yet ran: "
                              "its pool thread started or finished a job %u times between "
                              "the call's -ECANCELED and fn", i, rcs.entry[i] - at);
                unseen++;
            }
            cr_assert_eq(clean, 1, "job %ld: abandoned; cleanup %d (status %d)", i, clean,
                         atomic_load(&rcs.clean_status[i]));
            abandoned++;
            break;
        default:
            cr_assert_fail("job %ld: -ECANCELED not noted", i);
        }
    }
    cr_assert_eq(ferry_pool_stats_get(NULL, &st), 0);   /* default pool untouched */
    cr_assert_eq(ok + abandoned + not_run, rcs.n);
    /* What the test is for: cancellations that caught a job still queued. */
    cr_assert_gt(not_run, 0);
    cr_log_info("%ld jobs: %ld returned (%ld of them with a cancel sent during the call), "
                "%ld cancelled before running, %ld abandoned while running (%ld before fn's "
                "first line)",
                rcs.n, ok, waited, not_run, abandoned, unseen);
    free(rcs.ran); free(rcs.cleaned); free(rcs.clean_status); free(rcs.slot); free(rcs.entry);
    free(rcs.rc); free(rcs.when); free(rcs.snap); free(rcs.returned); free(rcs.cancelled);
    free(rcs.tasks);
}

/* ==== pool destroyed with jobs queued and running ====================== */

#define PD_TASKS 30
struct pd { ferry_pool *p; int rc[PD_TASKS]; atomic_int ran; };
struct pd_arg { struct pd *s; int i; };

static int pd_job(void *arg)
{
    struct pd *s = arg;
    atomic_fetch_add(&s->ran, 1);
    usleep(100);
    return 1;
}

static int pd_task(void *arg)
{
    struct pd_arg *a = arg;
    a->s->rc[a->i] = ferry_to_thread(a->s->p, pd_job, a->s);
    return 0;
}

static void *pd_freer(void *arg)
{
    struct pd *s = arg;
    ferry_pool_stats st;
    do {
        sched_yield();
        ferry_pool_stats_get(s->p, &st);
    } while (st.queued + st.running + st.completed + st.cancelled < PD_TASKS);
    ferry_pool_free(s->p);
    return NULL;
}

static int pd_main(void *arg)
{
    struct pd *s = arg;
    struct pd_arg a[PD_TASKS];
    ferry_task *t[PD_TASKS];
    pthread_t freer;

    for (int i = 0; i < PD_TASKS; i++) {
        a[i] = (struct pd_arg){ s, i };
        ferry_task_spawn(&t[i], NULL, pd_task, &a[i], NULL);
    }
    pthread_create(&freer, NULL, pd_freer, s);
    for (int i = 0; i < PD_TASKS; i++)
        ferry_task_join(t[i], NULL);
    pthread_join(freer, NULL);
    return 0;
}

Test(stress_bridge, pool_freed_with_jobs_queued_and_running,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 120.)
{
    long rounds = tu_scaled(100), total_cancelled = 0;

    for (long r = 0; r < rounds; r++) {
        struct pd s = {0};
        int ok = 0, cancelled = 0;
        cr_assert_eq(ferry_pool_new(&s.p, &(ferry_pool_opts){ .threads = 2, .capacity = 64 }), 0);
        cr_assert_eq(tu_run(pd_main, &s), 0);
        for (int i = 0; i < PD_TASKS; i++) {
            if (s.rc[i] == 1)
                ok++;
            else if (s.rc[i] == -ECANCELED)
                cancelled++;
            else
                cr_assert_fail("round %ld task %d: rc %d", r, i, s.rc[i]);
        }
        cr_assert_eq(ok, atomic_load(&s.ran), "round %ld", r);
        cr_assert_eq(ok + cancelled, PD_TASKS);
        total_cancelled += cancelled;
    }
    cr_log_info("%ld rounds, %ld queued jobs cancelled by the free", rounds, total_cancelled);
}

/* ==== loop closed while threads are still posting ====================== */

#define NCLOSE 4
static atomic_long close_ran[NCLOSE];
static atomic_int close_started;

static void close_cb(void *arg) { atomic_fetch_add(&close_ran[(intptr_t)arg], 1); }

struct close_arg { ferry_inbox *ib; int i; long accepted; };

static void *close_thread(void *arg)
{
    struct close_arg *c = arg;
    int rc;
    atomic_fetch_add(&close_started, 1);
    while ((rc = ferry_inbox_post(c->ib, close_cb, (void *)(intptr_t)c->i)) != -ESHUTDOWN) {
        if (rc == 0)
            c->accepted++;
        else if (rc != -ENOMEM)
            return (void *)1;
    }
    ferry_inbox_unref(c->ib);
    return NULL;
}

Test(stress_bridge, loop_closed_while_threads_are_still_posting,
     .init = tu_alloc_setup, .fini = tu_loop_teardown, .timeout = 120.)
{
    long rounds = tu_scaled(20);

    for (long r = 0; r < rounds; r++) {
        struct close_arg c[NCLOSE];
        pthread_t t[NCLOSE];
        ferry_loop *loop;
        void *bad;

        cr_assert_eq(ferry_loop_new(&loop, NULL), 0);
        atomic_store(&close_started, 0);
        for (int i = 0; i < NCLOSE; i++) {
            atomic_store(&close_ran[i], 0);
            c[i] = (struct close_arg){ .i = i };
            cr_assert_eq(ferry_inbox_get(&c[i].ib, loop), 0);
            t[i] = tu_start_thread(close_thread, &c[i]);
        }
        while (atomic_load(&close_started) < NCLOSE)
            sched_yield();
        for (int k = 0; k < 50; k++)
            ferry_loop_run(loop, FERRY_RUN_ONCE);
        ferry_loop_free(loop);               /* threads still posting */
        for (int i = 0; i < NCLOSE; i++) {
            pthread_join(t[i], &bad);
            cr_assert_null(bad);
            cr_assert_eq(atomic_load(&close_ran[i]), c[i].accepted,
                         "round %ld thread %d: %ld accepted, %ld ran", r, i,
                         c[i].accepted, atomic_load(&close_ran[i]));
        }
    }
}

/* ==== run-in-loop from 8 threads ======================================= */

static int add_one(void *arg)
{
    if (ferry_yield())
        return -1;
    return (int)(intptr_t)arg + 1;
}

static atomic_int rl_bad, rl_finished;
static long rl_per;

static void *rl_thread(void *arg)
{
    (void)arg;
    for (long i = 0; i < rl_per; i++) {
        int st = 0;
        if (ferry_loop_run_task_sync(tu_loop, add_one, (void *)(intptr_t)i, FERRY_NEVER, &st) ||
            st != i + 1)
            atomic_fetch_add(&rl_bad, 1);
    }
    if (atomic_fetch_add(&rl_finished, 1) + 1 == 8)
        ferry_loop_stop_threadsafe(tu_loop);
    return NULL;
}

Test(stress_bridge, run_task_sync_from_eight_threads,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 120.)
{
    pthread_t t[8];
    rl_per = tu_scaled(5000);
    for (int i = 0; i < 8; i++)
        t[i] = tu_start_thread(rl_thread, NULL);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_FOREVER), 0);
    for (int i = 0; i < 8; i++)
        pthread_join(t[i], NULL);
    cr_assert_eq(atomic_load(&rl_bad), 0);
}

/* ==== mixed channel: 4 thread producers -> 4 task consumers, reverse ==== */

struct mx {
    ferry_chan  *ch;
    long         per;          /* items per producer */
    atomic_char *seen;         /* per item */
    atomic_long  received;
    atomic_long  dup;
    atomic_int   prod_done;    /* thread producers finished */
};

static void mx_take(struct mx *m, void *v)
{
    long id = (long)(intptr_t)v - 1;
    if (atomic_fetch_add(&m->seen[id], 1) != 0)
        atomic_fetch_add(&m->dup, 1);
    atomic_fetch_add(&m->received, 1);
}

struct mx_arg { struct mx *m; int k; };

static void *mx_thread_producer(void *arg)
{
    struct mx_arg *a = arg;
    for (long i = 0; i < a->m->per; i++)
        if (ferry_chan_send_blocking(a->m->ch, (void *)(intptr_t)(a->k * a->m->per + i + 1),
                                     FERRY_NEVER))
            return (void *)1;
    atomic_fetch_add(&a->m->prod_done, 1);
    return NULL;
}

static int mx_task_consumer(void *arg)
{
    struct mx *m = arg;
    void *v;
    int rc;
    while ((rc = ferry_chan_recv(m->ch, &v)) == 0)
        mx_take(m, v);
    return rc == -ESHUTDOWN ? 0 : rc;
}

static int mx_task_producer(void *arg)
{
    struct mx_arg *a = arg;
    for (long i = 0; i < a->m->per; i++) {
        int rc = ferry_chan_send(a->m->ch, (void *)(intptr_t)(a->k * a->m->per + i + 1));
        if (rc)
            return rc;
    }
    return 0;
}

static void *mx_thread_consumer(void *arg)
{
    struct mx *m = arg;
    void *v;
    int rc;
    while ((rc = ferry_chan_recv_blocking(m->ch, &v, FERRY_NEVER)) == 0)
        mx_take(m, v);
    return rc == -ESHUTDOWN ? NULL : (void *)1;
}

static int mx_threads_to_tasks(void *arg)
{
    struct mx *m = arg;
    struct mx_arg a[4];
    pthread_t prod[4];
    ferry_group g;
    int rc;

    ferry_group_init(&g);
    for (int i = 0; i < 4; i++)
        ferry_group_spawn(&g, mx_task_consumer, m, NULL);
    for (int k = 0; k < 4; k++) {
        a[k] = (struct mx_arg){ m, k };
        pthread_create(&prod[k], NULL, mx_thread_producer, &a[k]);
    }
    while (atomic_load(&m->prod_done) < 4)  /* the consumers need the loop */
        ferry_sleep(FERRY_USEC(200));
    for (int k = 0; k < 4; k++)
        pthread_join(prod[k], NULL);
    ferry_chan_close(m->ch);
    rc = ferry_group_wait(&g);
    return rc;
}

static int mx_tasks_to_threads(void *arg)
{
    struct mx *m = arg;
    struct mx_arg a[4];
    pthread_t cons[4];
    ferry_group g;
    int rc;

    for (int k = 0; k < 4; k++)
        pthread_create(&cons[k], NULL, mx_thread_consumer, m);
    ferry_group_init(&g);
    for (int k = 0; k < 4; k++) {
        a[k] = (struct mx_arg){ m, k };
        ferry_group_spawn(&g, mx_task_producer, &a[k], NULL);
    }
    rc = ferry_group_wait(&g);
    ferry_chan_close(m->ch);
    for (int k = 0; k < 4; k++)
        pthread_join(cons[k], NULL);
    return rc;
}

static void mx_run(ferry_task_fn fn)
{
    struct mx m = {0};
    m.per = tu_scaled(50000);
    m.seen = calloc((size_t)(4 * m.per), 1);
    cr_assert_eq(ferry_chan_new(&m.ch, 16), 0);
    cr_assert_eq(tu_run(fn, &m), 0);
    cr_assert_eq(atomic_load(&m.dup), 0);
    cr_assert_eq(atomic_load(&m.received), 4 * m.per);
    for (long i = 0; i < 4 * m.per; i++)
        cr_assert_eq(atomic_load(&m.seen[i]), 1, "item %ld", i);
    ferry_chan_free(m.ch);
    free(m.seen);
}

Test(stress_bridge, chan_four_thread_producers_four_task_consumers,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 120.)
{
    mx_run(mx_threads_to_tasks);
}

Test(stress_bridge, chan_four_task_producers_four_thread_consumers,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 120.)
{
    mx_run(mx_tasks_to_threads);
}

/* ==== selects over thread-fed channels, under deadlines and cancels ===== */

/*
 * Six tasks loop on ferry_select() inside scopes whose deadlines are 0 to
 * 300 us away: receives from a channel a thread feeds and gets from a
 * queue a task feeds, sends to a channel a thread drains and puts into a
 * queue a task drains, or all four at once.  Another task cancels one of
 * them now and then and starts a replacement.  Every item is counted end to
 * end.  A checker task watches every select: with such deadlines one that
 * has not returned after 250 of the checker's 20 ms rounds never will (it
 * is then cancelled, to see whether that ends it), and the test process
 * exits with a report instead of waiting for the test's timeout.
 */

#define SX_TASKS 6
#define SX_ROUNDS_STUCK 250

struct sx {
    ferry_chan  *in;           /* fed by a thread */
    ferry_chan  *out;          /* drained by a thread */
    ferry_queue  qin;          /* fed by a task */
    ferry_queue  qout;         /* drained by a task */
    ferry_event  done_ev;      /* every item of `in` and `qin` received */
    long         per;          /* items the feeders send, each */
    /* loop thread only */
    bool         done;
    bool         stop_chaos;
    bool         stop_checker;
    long         issued;       /* ids handed to sends and puts */
    long         got_in, got_qin, sent_out, sent_qout;
    uint64_t     sum_in, sum_qin, sum_out, sum_qout;
    long         calls, timedout, cancelled, cancels, bad;
    long         rounds;       /* the checker's */
    long         since[SX_TASKS];  /* round the task's select began, -1 */
    ferry_task  *task[SX_TASKS];
    /* the drainers */
    long         drained_out, drained_qout;
    uint64_t     dsum_out, dsum_qout;
};

struct sx_slot { struct sx *m; int i; };

static void *sx_feed_thread(void *arg)
{
    struct sx *m = arg;

    for (long i = 1; i <= m->per; i++)
        if (ferry_chan_send_blocking(m->in, (void *)(intptr_t)i, FERRY_NEVER))
            return (void *)1;
    return NULL;
}

static void *sx_drain_thread(void *arg)
{
    struct sx *m = arg;
    void *v;
    int rc;

    while ((rc = ferry_chan_recv_blocking(m->out, &v, FERRY_NEVER)) == 0) {
        m->drained_out++;
        m->dsum_out += (uint64_t)(intptr_t)v;
    }
    return rc == -ESHUTDOWN ? NULL : (void *)1;
}

static int sx_feed_task(void *arg)
{
    struct sx *m = arg;

    for (long i = 1; i <= m->per; i++) {
        int v = (int)i, rc = ferry_queue_put(&m->qin, &v);
        if (rc)
            return rc;
    }
    return 0;
}

static int sx_drain_task(void *arg)
{
    struct sx *m = arg;
    int v, rc;

    while ((rc = ferry_queue_get(&m->qout, &v)) == 0) {
        m->drained_qout++;
        m->dsum_qout += (uint64_t)v;
    }
    return rc == -ESHUTDOWN ? 0 : rc;
}

static int sx_selector(void *arg)
{
    struct sx_slot *sl = arg;
    struct sx *m = sl->m;
    unsigned seed = 0x9e3779b9u ^ (unsigned)(sl->i * 7919 + m->cancels * 104729 + 1);
    long out_id = 0, qout_id = 0;

    while (!m->done) {
        void *got = NULL;
        int qv = 0, qput, rc, n = 0;
        ferry_case c[4];
        unsigned shape = rnd(&seed) % 3;
        ferry_scope sc;

        if (!out_id)
            out_id = ++m->issued;
        if (!qout_id)
            qout_id = ++m->issued;
        qput = (int)qout_id;
        if (shape != 1) {
            c[n++] = FERRY_CASE_RECV_INIT(m->in, &got);
            c[n++] = FERRY_CASE_GET_INIT(&m->qin, &qv);
        }
        if (shape != 0) {
            c[n++] = FERRY_CASE_SEND_INIT(m->out, (void *)(intptr_t)out_id);
            c[n++] = FERRY_CASE_PUT_INIT(&m->qout, &qput);
        }
        ferry_scope_enter(&sc, ferry_now() + FERRY_USEC(rnd(&seed) % 301), 0);
        m->since[sl->i] = m->rounds;
        rc = ferry_select(c, (size_t)n, 0);
        m->since[sl->i] = -1;
        ferry_scope_exit(&sc);
        m->calls++;
        if (rc == -ECANCELED) {
            m->cancelled++;
            return 0;
        }
        if (rc == -ETIMEDOUT) {
            m->timedout++;
            continue;
        }
        if (rc < 0 || c[rc].result != 0) {
            m->bad++;
            return rc < 0 ? rc : c[rc].result;
        }
        switch (c[rc].kind) {
        case FERRY_CASE_CHAN_RECV:
            m->got_in++;
            m->sum_in += (uint64_t)(intptr_t)got;
            break;
        case FERRY_CASE_QUEUE_GET:
            m->got_qin++;
            m->sum_qin += (uint64_t)qv;
            break;
        case FERRY_CASE_CHAN_SEND:
            m->sent_out++;
            m->sum_out += (uint64_t)out_id;
            out_id = 0;
            break;
        default:
            m->sent_qout++;
            m->sum_qout += (uint64_t)qout_id;
            qout_id = 0;
            break;
        }
        if (m->got_in == m->per && m->got_qin == m->per && !m->done) {
            m->done = true;
            ferry_event_set(&m->done_ev);
        }
    }
    return 0;
}

static int sx_join(ferry_task *t)
{
    int st = -99999;

    return ferry_task_join(t, &st) ? -99998 : st;
}

/* Cancels a random selector every 0-2 ms and starts another in its place. */
static int sx_chaos(void *arg)
{
    struct sx_slot *sl = arg;
    struct sx *m = sl[0].m;
    unsigned seed = 12345;

    while (!m->stop_chaos) {
        int i = (int)(rnd(&seed) % SX_TASKS), st;

        if (ferry_sleep(FERRY_USEC(rnd(&seed) % 2000)))
            return -1;
        if (m->stop_chaos)
            break;
        ferry_task_cancel(m->task[i]);
        st = sx_join(m->task[i]);
        m->task[i] = NULL;
        if (st != 0)
            m->bad++;
        m->cancels++;
        if (ferry_task_spawn(&m->task[i], NULL, sx_selector, &sl[i], NULL))
            return -1;
    }
    return 0;
}

/* A select that has not returned after SX_ROUNDS_STUCK rounds never
 * will: report it, cancel it, say whether that ended it, and end the
 * process (the loop cannot finish with the task stuck in it). */
static int sx_checker(void *arg)
{
    struct sx *m = arg;

    while (!m->stop_checker) {
        ferry_sleep(FERRY_MSEC(20));
        m->rounds++;
        for (int i = 0; i < SX_TASKS; i++) {
            ferry_task *t = m->task[i];

            if (!t || m->since[i] < 0 || m->rounds - m->since[i] < SX_ROUNDS_STUCK)
                continue;
            fprintf(stderr, "selector %d: one ferry_select() under a deadline of at most "
                    "300 us has not returned for %ld rounds of 20 ms (%ld selects, %ld "
                    "cancels so far)\n", i, m->rounds - m->since[i], m->calls, m->cancels);
            ferry_task_cancel(t);
            ferry_sleep(tu_ms(1000));
            fprintf(stderr, "selector %d: cancelled 1 s ago, %s\n", i,
                    ferry_task_state(t) == FERRY_TASK_DONE ? "ended" : "still waiting");
            fflush(stderr);
            _exit(3);
        }
    }
    return 0;
}

static int sx_main(void *arg)
{
    struct sx *m = arg;
    struct sx_slot sl[SX_TASKS];
    ferry_task *feeder, *drainer, *chaos, *checker;
    pthread_t feed_th, drain_th;
    void *th_rc;
    int rc = 0;

    for (int i = 0; i < SX_TASKS; i++) {
        sl[i] = (struct sx_slot){ m, i };
        m->since[i] = -1;
    }
    feed_th = tu_start_thread(sx_feed_thread, m);
    drain_th = tu_start_thread(sx_drain_thread, m);
    if (ferry_task_spawn(&feeder, NULL, sx_feed_task, m, NULL) ||
        ferry_task_spawn(&drainer, NULL, sx_drain_task, m, NULL) ||
        ferry_task_spawn(&checker, NULL, sx_checker, m, NULL))
        return -1;
    for (int i = 0; i < SX_TASKS; i++)
        if (ferry_task_spawn(&m->task[i], NULL, sx_selector, &sl[i], NULL))
            return -1;
    if (ferry_task_spawn(&chaos, NULL, sx_chaos, sl, NULL))
        return -1;
    ferry_event_wait(&m->done_ev);
    m->stop_chaos = true;
    if (sx_join(chaos) != 0)
        rc = -2;
    for (int i = 0; i < SX_TASKS; i++)
        if (sx_join(m->task[i]) != 0)
            rc = -3;
    m->stop_checker = true;
    if (sx_join(checker) != 0 || sx_join(feeder) != 0)
        rc = -4;
    ferry_queue_shutdown(&m->qout, false);
    if (sx_join(drainer) != 0)
        rc = -5;
    ferry_chan_close(m->out);
    pthread_join(drain_th, &th_rc);
    if (th_rc)
        rc = -6;
    pthread_join(feed_th, &th_rc);
    if (th_rc)
        rc = -7;
    return rc;
}

Test(stress_bridge, selects_over_thread_fed_chans_under_deadlines_and_cancels_all_return,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 300.)
{
    struct sx m = {0};
    uint64_t want;

    m.per = tu_scaled(50000);
    want = (uint64_t)m.per * (uint64_t)(m.per + 1) / 2;
    cr_assert_eq(ferry_chan_new(&m.in, 4), 0);
    cr_assert_eq(ferry_chan_new(&m.out, 4), 0);
    cr_assert_eq(ferry_queue_init(&m.qin, sizeof(int), 4, FERRY_QUEUE_FIFO, NULL, NULL), 0);
    cr_assert_eq(ferry_queue_init(&m.qout, sizeof(int), 4, FERRY_QUEUE_FIFO, NULL, NULL), 0);
    cr_assert_eq(ferry_event_init(&m.done_ev), 0);
    cr_assert_eq(tu_run(sx_main, &m), 0);
    cr_log_info("%ld selects: %ld timed out, %ld cancelled (%ld cancels); "
                "%ld + %ld received, %ld + %ld sent", m.calls, m.timedout, m.cancelled,
                m.cancels, m.got_in, m.got_qin, m.sent_out, m.sent_qout);
    cr_assert_eq(m.bad, 0);
    cr_assert_eq(m.got_in, m.per);
    cr_assert_eq(m.sum_in, want);
    cr_assert_eq(m.got_qin, m.per);
    cr_assert_eq(m.sum_qin, want);
    cr_assert_eq(m.drained_out, m.sent_out);
    cr_assert_eq(m.dsum_out, m.sum_out);
    cr_assert_eq(m.drained_qout, m.sent_qout);
    cr_assert_eq(m.dsum_qout, m.sum_qout);
    cr_assert_gt(m.timedout, 0);
    cr_assert_gt(m.cancelled, 0);
    cr_assert_eq(ferry_chan_len(m.in), 0);
    ferry_event_destroy(&m.done_ev);
    cr_assert_eq(ferry_queue_destroy(&m.qin), 0);
    cr_assert_eq(ferry_queue_destroy(&m.qout), 0);
    ferry_chan_free(m.out);
    ferry_chan_free(m.in);
}
