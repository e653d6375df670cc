/* stress_watchdog.c - cross-thread stress of the posting channel
 * (call_soon_threadsafe over the eventfd), each test under a progress
 * watchdog that fails it after 5 s without progress instead of letting CI
 * hang (a lost wakeup, on the channel or at shutdown, shows up as a stall,
 * not as a wrong sum).
 *
 *   - {1, 2, 4, 8} producers x 1,000,000 posts: every post runs exactly
 *     once, the sum of the values is exact;
 *   - single-item ping-pong, 200,000 rounds x 10: one post, wait for it to
 *     run, next (a post racing the drain must not be stranded);
 *   - a post racing the loop's close, 10,000 times: each post either runs
 *     or returns -ESHUTDOWN, never both, never neither.
 *
 * FERRY_STRESS_SCALE (in (0, 1], default 1: tu_scaled()) scales the counts
 * for slow builds; FERRY_TEST_TIME_MULT scales the watchdog's 5 s.
 */
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "testutil.h"

/* ---- the watchdog --------------------------------------------------------- */

static atomic_ulong progress;       /* bumped by every unit of work */
static atomic_bool  wd_stop;
static pthread_t    wd_thread;
static const char  *wd_name;
static char         wd_state[256];  /* what the test is doing, for the report */

static void *watchdog(void *arg)
{
    int64_t limit = tu_ms(5000), quiet = 0;
    unsigned long last = atomic_load(&progress);

    (void)arg;
    while (!atomic_load(&wd_stop)) {
        struct timespec ts = { 0, 50 * 1000 * 1000 };
        unsigned long now;
        nanosleep(&ts, NULL);
        now = atomic_load(&progress);
        if (now != last) {
            last = now;
            quiet = 0;
            continue;
        }
        quiet += FERRY_MSEC(50);
        if (quiet >= limit) {
            fprintf(stderr, "watchdog: %s made no progress for %.1f s (progress %lu; %s)\n",
                    wd_name, (double)quiet / 1e9, now, wd_state);
            fflush(stderr);
            _exit(3);
        }
    }
    return NULL;
}

static void wd_start(const char *name)
{
    wd_name = name;
    atomic_store(&wd_stop, false);
    cr_assert_eq(pthread_create(&wd_thread, NULL, watchdog, NULL), 0);
}

static void wd_end(void)
{
    atomic_store(&wd_stop, true);
    pthread_join(wd_thread, NULL);
}

/* Each test makes its own loops. */
#define T(name, secs) \
    Test(stress_watchdog, name, .init = tu_alloc_setup, .fini = tu_loop_teardown, .timeout = (secs))

/* ---- many producers -------------------------------------------------------- */

struct prod {
    ferry_loop *loop;
    int         id;
    long        n;
    long        refused;   /* posts that returned an error (must stay 0) */
};

static uint64_t sum_ran;      /* loop thread only */
static long     n_ran;        /* loop thread only */
static long     n_expected;
static ferry_loop *g_loop;

static void add_cb(void *arg)
{
    sum_ran += (uint64_t)(uintptr_t)arg;
    n_ran++;
    atomic_fetch_add_explicit(&progress, 1, memory_order_relaxed);
    if (n_ran == n_expected)
        ferry_loop_stop(g_loop);
}

static void *producer(void *arg)
{
    struct prod *p = arg;

    for (long i = 1; i <= p->n; i++) {
        uintptr_t v = (uintptr_t)(i + (long)p->id * 10000000L);
        int rc;
        while ((rc = ferry_loop_call_soon_threadsafe(p->loop, add_cb, (void *)v)) == -ENOMEM)
            sched_yield();
        if (rc)
            p->refused++;
    }
    return NULL;
}

static void run_producers(int nprod)
{
    struct prod p[8];
    pthread_t th[8];
    uint64_t want = 0;
    long per = tu_scaled(1000000) / nprod;

    cr_assert_eq(ferry_loop_new(&g_loop, NULL), 0);
    sum_ran = 0;
    n_ran = 0;
    n_expected = per * nprod;
    snprintf(wd_state, sizeof wd_state, "%d producers x %ld posts", nprod, per);
    wd_start("producers");
    ferry_loop_ref(g_loop);
    for (int i = 0; i < nprod; i++) {
        p[i] = (struct prod){ g_loop, i, per, 0 };
        for (long k = 1; k <= per; k++)
            want += (uint64_t)(k + (long)i * 10000000L);
        cr_assert_eq(pthread_create(&th[i], NULL, producer, &p[i]), 0);
    }
    while (n_ran < n_expected)
        ferry_loop_run(g_loop, FERRY_RUN_FOREVER);   /* stopped by the last callback */
    for (int i = 0; i < nprod; i++) {
        pthread_join(th[i], NULL);
        cr_expect_eq(p[i].refused, 0, "producer %d: %ld posts refused", i, p[i].refused);
    }
    ferry_loop_unref(g_loop);
    ferry_loop_run(g_loop, FERRY_RUN_ONCE);
    wd_end();
    cr_assert_eq(n_ran, n_expected, "%ld callbacks ran, %ld posted", n_ran, n_expected);
    cr_assert_eq(sum_ran, want, "sum %llu, expected %llu", (unsigned long long)sum_ran,
                 (unsigned long long)want);
    {
        ferry_inbox_stats st;
        cr_assert_eq(ferry_loop_inbox_stats_get(g_loop, &st), 0);
        cr_assert_geq(st.run, (uint64_t)n_expected);
        /* Coalescing: far fewer eventfd writes than posts. */
        cr_expect_lt(st.wakeups, (uint64_t)n_expected / 2 + 100,
                     "%llu wakeups for %ld posts", (unsigned long long)st.wakeups, n_expected);
    }
    ferry_loop_free(g_loop);
    cr_assert_eq(tu_leaks(), 0, "LeakSanitizer found leaks");
}

T(producers_1_exact_sum, 300.) { run_producers(1); }
T(producers_2_exact_sum, 300.) { run_producers(2); }
T(producers_4_exact_sum, 300.) { run_producers(4); }
T(producers_8_exact_sum, 300.) { run_producers(8); }

/* ---- ping-pong ----------------------------------------------------------------- */

struct pingpong {
    ferry_loop *loop;
    sem_t       ack;
    long        rounds;
    long        expect;     /* value the next callback must see (loop thread) */
    long        bad;        /* out-of-order values (loop thread) */
    int         post_err;
};

static void ping_cb(void *arg)
{
    struct pingpong *pp = *(struct pingpong **)arg;
    long v = ((long *)arg)[1];

    if (v != pp->expect)
        pp->bad++;
    pp->expect = v + 1;
    atomic_fetch_add_explicit(&progress, 1, memory_order_relaxed);
    sem_post(&pp->ack);
}

static void stop_cb(void *arg)
{
    ferry_loop_stop(arg);
}

static void *pinger(void *arg)
{
    struct pingpong *pp = arg;
    void *msg[2] = { pp, NULL };

    for (long i = 0; i < pp->rounds; i++) {
        msg[1] = (void *)i;
        pp->post_err = ferry_loop_call_soon_threadsafe(pp->loop, ping_cb, msg);
        if (pp->post_err)
            break;
        while (sem_wait(&pp->ack) != 0)
            ;
    }
    ferry_loop_call_soon_threadsafe(pp->loop, stop_cb, pp->loop);
    return NULL;
}

T(ping_pong_single_item_rounds, 600.)
{
    long rounds = tu_scaled(200000);

    wd_start("ping-pong");
    for (int rep = 0; rep < 10; rep++) {
        struct pingpong pp = { .rounds = rounds };
        pthread_t th;

        snprintf(wd_state, sizeof wd_state, "repetition %d of 10, %ld rounds", rep + 1, rounds);
        cr_assert_eq(ferry_loop_new(&pp.loop, NULL), 0);
        sem_init(&pp.ack, 0, 0);
        ferry_loop_ref(pp.loop);
        cr_assert_eq(pthread_create(&th, NULL, pinger, &pp), 0);
        ferry_loop_run(pp.loop, FERRY_RUN_FOREVER);
        pthread_join(th, NULL);
        ferry_loop_unref(pp.loop);
        ferry_loop_free(pp.loop);
        sem_destroy(&pp.ack);
        cr_assert_eq(pp.post_err, 0, "a post failed: %d", pp.post_err);
        cr_assert_eq(pp.expect, rounds, "repetition %d: %ld rounds done of %ld", rep, pp.expect,
                     rounds);
        cr_assert_eq(pp.bad, 0, "repetition %d: %ld out of order", rep, pp.bad);
    }
    wd_end();
    cr_assert_eq(tu_leaks(), 0, "LeakSanitizer found leaks");
}

/* ---- a post racing the close ------------------------------------------------------ */

struct racer {
    ferry_inbox *ib;
    long         accepted;   /* posts that returned 0 */
    int          last_rc;    /* the error that ended the run */
    atomic_int   started;
};

static long raced_ran;   /* loop thread (the main thread here) */

static void race_cb(void *arg)
{
    (void)arg;
    raced_ran++;
}

static void *race_poster(void *arg)
{
    struct racer *r = arg;
    int rc;

    atomic_store(&r->started, 1);
    while ((rc = ferry_inbox_post(r->ib, race_cb, NULL)) == 0 || rc == -ENOMEM) {
        if (rc == 0)
            r->accepted++;
        if ((r->accepted & 1023) == 0)
            atomic_fetch_add_explicit(&progress, 1, memory_order_relaxed);
        /* Let the closing thread in now and then: under valgrind (one thread
         * at a time, long time slices) an unbounded flood made ferry_loop_free
         * run hundreds of thousands of posts, past the test's time limit. */
        if ((r->accepted & 255) == 0)
            sched_yield();
    }
    r->last_rc = rc;
    return NULL;
}

T(post_racing_loop_close, 600.)
{
    long iters = tu_scaled(10000), bad_rc = 0, mismatch = 0, first_bad = -1;

    wd_start("post vs close");
    for (long i = 0; i < iters; i++) {
        struct racer r = { 0 };
        ferry_loop *loop;
        pthread_t th;

        snprintf(wd_state, sizeof wd_state, "iteration %ld of %ld", i + 1, iters);
        cr_assert_eq(ferry_loop_new(&loop, NULL), 0);
        cr_assert_eq(ferry_inbox_get(&r.ib, loop), 0);
        raced_ran = 0;
        cr_assert_eq(pthread_create(&th, NULL, race_poster, &r), 0);
        /* Let some posts in first, sometimes none. */
        if (i % 3 == 0)
            while (!atomic_load(&r.started))
                sched_yield();
        for (long k = 0; k < (i % 7); k++)
            ferry_loop_run(loop, FERRY_RUN_ONCE);
        ferry_loop_free(loop);   /* runs every accepted post, refuses the rest */
        pthread_join(th, NULL);
        ferry_inbox_unref(r.ib);
        atomic_fetch_add_explicit(&progress, 1, memory_order_relaxed);
        if (r.last_rc != -ESHUTDOWN && !bad_rc++)
            fprintf(stderr, "post vs close: iteration %ld: the poster stopped with %d\n", i,
                    r.last_rc);
        if (raced_ran != r.accepted && first_bad < 0)
            first_bad = i;
        if (raced_ran != r.accepted)
            mismatch++;
    }
    wd_end();
    cr_assert_eq(bad_rc, 0, "%ld runs ended with an error other than -ESHUTDOWN", bad_rc);
    cr_assert_eq(mismatch, 0, "%ld of %ld runs: accepted posts != posts run (first: %ld)",
                 mismatch, iters, first_bad);
    cr_assert_eq(tu_leaks(), 0, "LeakSanitizer found leaks");
}
