/* stress_bugs.c - three bugs that a plain run never shows and schedule
 * fuzzing finds, each with its fix.
 *
 *     stress_bugs cache|condvar|counter [--fixed]
 *
 * Exit status 0 when the scenario's own check held, 1 when it failed (with
 * a line saying what went wrong), 2 on a usage error.  Run plainly, every
 * variant passes: the loop runs ready tasks in FIFO order and a free lock
 * never suspends, so the interleaving that breaks the buggy variants never
 * happens.  Under FERRY_FUZZ=SEED (or the ferry-fuzz runner) the order of
 * ready tasks is drawn from the seed, free locks and available elements
 * sometimes suspend anyway, and pool jobs sometimes start late: the buggy
 * variants fail within a few seeds, the fixed ones never do.
 *
 *   cache    a cache filled after a suspension without checking again
 *            whether another task filled it meanwhile: the expensive fetch
 *            runs twice for one key.  Fixed: check again under the lock.
 *   condvar  a condition wait without a predicate loop: a notified consumer
 *            assumes an element is there, but another task may take it
 *            between the notification and the consumer's turn.  Fixed:
 *            wait in a loop until the predicate holds.
 *   counter  a counter that a task increments with a suspension point
 *            between its read and its write (a lock nobody else takes),
 *            and that a pool job's completion increments too: when the
 *            completion runs while the task is suspended there, an
 *            update is lost.  Fixed: read after the suspension point.
 */
#include <stdio.h>
#include <string.h>

#include "ferry/ferry.h"

static bool fixed;

/* ---- cache ----------------------------------------------------------- */

#define CACHE_KEYS  4
#define CACHE_TASKS 8

static struct {
    bool       have[CACHE_KEYS];
    int        value[CACHE_KEYS];
    int        fetches[CACHE_KEYS];   /* the expensive fetches made per key */
    ferry_lock db;                    /* one connection to the backend */
} cache;                              /* all-zero: empty, the lock free */

/* The backend's answer; a real one would do I/O while holding `db`. */
static int fetch(int key)
{
    cache.fetches[key]++;
    return key * 10;
}

static int cache_user(void *arg)
{
    int key = (int)(intptr_t)arg % CACHE_KEYS;
    int rc;

    if (cache.have[key])
        return 0;
    /* A free lock does not suspend in a plain run, so nothing can happen
     * between the check above and the fill below... unless it does. */
    rc = ferry_lock_acquire(&cache.db);
    if (rc)
        return rc;
    if (!fixed || !cache.have[key]) {     /* the fix: check again */
        cache.value[key] = fetch(key);
        cache.have[key] = true;
    }
    ferry_lock_release(&cache.db);
    return 0;
}

static int run_cache(void *arg)
{
    ferry_task *t[CACHE_TASKS];
    int bad = 0;

    (void)arg;
    for (int i = 0; i < CACHE_TASKS; i++)
        if (ferry_task_spawn(&t[i], NULL, cache_user, (void *)(intptr_t)i, NULL))
            return 1;
    for (int i = 0; i < CACHE_TASKS; i++)
        ferry_task_join(t[i], NULL);
    for (int k = 0; k < CACHE_KEYS; k++) {
        if (cache.fetches[k] != 1) {
            printf("cache: key %d fetched %d times (expected once)\n", k, cache.fetches[k]);
            bad = 1;
        }
    }
    return bad;
}

/* ---- condvar --------------------------------------------------------- */

#define COND_ROUNDS 8

static struct {
    ferry_cond cond;      /* over its own lock */
    int        count;     /* elements waiting */
    bool       closed;    /* the producer is done */
    int        consumed;  /* elements taken, by either consumer */
    int        empty_wakes; /* the consumer woke to nothing and took it anyway */
} cv;

/* Waits for an element, then takes it. */
static int consumer(void *arg)
{
    (void)arg;
    ferry_lock_acquire(ferry_cond_lock(&cv.cond));
    if (fixed) {
        while (cv.count == 0 && !cv.closed)
            ferry_cond_wait(&cv.cond);
    } else if (cv.count == 0 && !cv.closed) {
        ferry_cond_wait(&cv.cond);        /* the bug: "woken means there is one" */
        if (cv.count == 0)
            cv.empty_wakes++;             /* it would take an element that is not there */
    }
    if (cv.count > 0) {
        cv.count--;
        cv.consumed++;
    }
    ferry_lock_release(ferry_cond_lock(&cv.cond));
    return 0;
}

/* Adds one element, then later closes. */
static int producer(void *arg)
{
    (void)arg;
    ferry_lock_acquire(ferry_cond_lock(&cv.cond));
    cv.count++;
    ferry_cond_notify(&cv.cond, 1);
    ferry_lock_release(ferry_cond_lock(&cv.cond));
    ferry_yield();
    ferry_lock_acquire(ferry_cond_lock(&cv.cond));
    cv.closed = true;
    ferry_cond_notify_all(&cv.cond);
    ferry_lock_release(ferry_cond_lock(&cv.cond));
    return 0;
}

/* Does something else first, then takes an element if one is there. */
static int poller(void *arg)
{
    (void)arg;
    ferry_yield();
    ferry_lock_acquire(ferry_cond_lock(&cv.cond));
    if (cv.count > 0) {
        cv.count--;
        cv.consumed++;
    }
    ferry_lock_release(ferry_cond_lock(&cv.cond));
    return 0;
}

static int run_condvar(void *arg)
{
    ferry_task_fn fns[3] = { consumer, producer, poller };
    ferry_task *t[3];

    (void)arg;
    for (int r = 0; r < COND_ROUNDS; r++) {
        ferry_cond_init(&cv.cond, NULL);
        cv.count = 0;
        cv.closed = false;
        cv.consumed = 0;
        for (int i = 0; i < 3; i++)
            if (ferry_task_spawn(&t[i], NULL, fns[i], NULL, NULL))
                return 1;
        for (int i = 0; i < 3; i++)
            ferry_task_join(t[i], NULL);
        ferry_cond_destroy(&cv.cond);
        if (cv.empty_wakes || cv.consumed != 1) {
            printf("condvar: round %d: the consumer woke to an empty queue %d time(s), "
                   "%d element(s) consumed of 1\n", r, cv.empty_wakes, cv.consumed);
            return 1;
        }
    }
    return 0;
}

/* ---- counter --------------------------------------------------------- */

#define COUNTER_ROUNDS 5000

static struct {
    long       count;       /* events counted, by the task and by the job */
    ferry_lock lock;        /* the stats lock the task takes on each count */
    ferry_event job_done;
} ctr;

/* The pool job: the work itself is elsewhere; what matters is that its
 * completion, on the loop, counts one event too. */
static int count_job(void *arg)
{
    (void)arg;
    return 0;
}

static int count_done(void *arg, int status)
{
    (void)arg; (void)status;
    ctr.count++;
    return ferry_event_set(&ctr.job_done);
}

static int run_counter(void *arg)
{
    int rc;

    (void)arg;
    rc = ferry_pool_submit(NULL, count_job, NULL, ferry_loop_current(), count_done, NULL);
    if (rc)
        return 1;
    for (int r = 0; r < COUNTER_ROUNDS; r++) {
        if (fixed) {
            ferry_lock_acquire(&ctr.lock);
            ctr.count++;                  /* the fix: read and write with no suspension between */
        } else {
            long v = ctr.count;
            /* The bug: the lock is free (no other task takes it), so this
             * never suspends in a plain run and nothing can run between
             * the read and the write... */
            ferry_lock_acquire(&ctr.lock);
            ctr.count = v + 1;
        }
        ferry_lock_release(&ctr.lock);
    }
    ferry_event_wait(&ctr.job_done);
    if (ctr.count != COUNTER_ROUNDS + 1) {
        printf("counter: counted %ld, expected %d (an update was lost)\n", ctr.count,
               COUNTER_ROUNDS + 1);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    ferry_task_fn fn = NULL;

    if (argc == 3 && strcmp(argv[2], "--fixed") == 0)
        fixed = true;
    else if (argc != 2)
        argc = 0;
    if (argc >= 2) {
        if (strcmp(argv[1], "cache") == 0)
            fn = run_cache;
        else if (strcmp(argv[1], "condvar") == 0)
            fn = run_condvar;
        else if (strcmp(argv[1], "counter") == 0)
            fn = run_counter;
    }
    if (!fn) {
        fprintf(stderr, "usage: stress_bugs cache|condvar|counter [--fixed]\n");
        return 2;
    }
    return ferry_run(fn, NULL) == 0 ? 0 : 1;
}
