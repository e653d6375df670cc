/* mixed_channel.c - threads and tasks on one bounded channel (Python's
 * janus): tasks suspend, threads block, both feel the bound.
 *
 * Two directions:
 *   - 4 plain threads produce 10,000 jobs with ferry_chan_send_blocking(),
 *     3 tasks consume them with ferry_chan_recv() (a thread-based source
 *     feeding async handlers);
 *   - 3 tasks produce 3,000 results with ferry_chan_send(), 2 threads
 *     consume them with ferry_chan_recv_blocking() (async code feeding a
 *     blocking sink).
 * Every item is received exactly once (the sums match), and the channel of
 * 16 never holds more than 16.  ferry_chan_close() ends both sides: sends
 * are refused with -ESHUTDOWN, receivers drain what is left, then get
 * -ESHUTDOWN.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "examples.h"

#define CAP        16
#define TH_PROD    4
#define PER_THREAD 2500
#define TASK_CONS  3
#define TASK_PROD  3
#define PER_TASK   1000
#define TH_CONS    2

static ferry_chan *jobs, *results;
static atomic_int full_waits;     /* thread sends that found the channel full */
static atomic_long th_sum, th_count;
static size_t max_len;            /* loop thread only */
static long task_sum, task_count; /* loop thread only */

/* ---- threads ----------------------------------------------------------- */

static void *thread_producer(void *arg)
{
    long base = (long)(intptr_t)arg * PER_THREAD;
    for (long i = 1; i <= PER_THREAD; i++) {
        void *item = (void *)(intptr_t)(base + i);
        if (ferry_chan_try_send(jobs, item) == -EAGAIN) {
            atomic_fetch_add(&full_waits, 1);
            ferry_chan_send_blocking(jobs, item, FERRY_NEVER);   /* blocks this thread */
        }
    }
    return NULL;
}

static void *thread_consumer(void *arg)
{
    void *item;
    while (ferry_chan_recv_blocking(results, &item, FERRY_NEVER) == 0) {
        atomic_fetch_add(&th_sum, (long)(intptr_t)item);
        atomic_fetch_add(&th_count, 1);
    }
    return NULL;                  /* -ESHUTDOWN: closed and drained */
}

/* ---- tasks ------------------------------------------------------------- */

static int task_consumer(void *arg)
{
    void *item;
    int rc;
    while ((rc = ferry_chan_recv(jobs, &item)) == 0) {
        size_t len = ferry_chan_len(jobs);
        if (len > max_len)
            max_len = len;
        task_sum += (long)(intptr_t)item;
        task_count++;
    }
    return rc == -ESHUTDOWN ? 0 : rc;
}

static int task_producer(void *arg)
{
    long base = (long)(intptr_t)arg * PER_TASK;
    for (long i = 1; i <= PER_TASK; i++) {
        int rc = ferry_chan_send(results, (void *)(intptr_t)(base + i));
        if (rc)
            return rc;
    }
    return 0;
}

static int join_thread(void *arg)
{
    return pthread_join(*(pthread_t *)arg, NULL);
}

static int main_task(void *arg)
{
    pthread_t prod[TH_PROD], cons[TH_CONS];
    ferry_group group;
    int bad = 0;

    /* Threads -> tasks. */
    int64_t t0 = ferry_now();
    ferry_group_init(&group);
    for (int i = 0; i < TASK_CONS; i++)
        ferry_group_spawn(&group, task_consumer, NULL, NULL);
    for (int i = 0; i < TH_PROD; i++)
        pthread_create(&prod[i], NULL, thread_producer, (void *)(intptr_t)i);
    for (int i = 0; i < TH_PROD; i++)
        ferry_to_thread(NULL, join_thread, &prod[i]);   /* waiting for a thread blocks: pool */
    ferry_chan_close(jobs);                             /* consumers drain, then end */
    bad |= ferry_group_wait(&group) != 0;
    long n = TH_PROD * PER_THREAD;
    printf("  %d threads -> %d tasks: %ld of %ld items received, sum %s, channel of %d "
           "held at most %zu, senders found it full %d times, %.0f ms\n",
           TH_PROD, TASK_CONS, task_count, n, task_sum == n * (n + 1) / 2 ? "exact" : "WRONG",
           CAP, max_len, atomic_load(&full_waits), ms_since(t0));
    bad |= task_count != n || task_sum != n * (n + 1) / 2 || max_len > CAP;

    int after_close = ferry_chan_try_send(jobs, (void *)1);
    void *item;
    int drained = ferry_chan_recv(jobs, &item);
    printf("  after close: send -> %s, receive on the drained channel -> %s\n",
           errname(after_close), errname(drained));
    bad |= after_close != -ESHUTDOWN || drained != -ESHUTDOWN;

    /* Tasks -> threads. */
    t0 = ferry_now();
    for (int i = 0; i < TH_CONS; i++)
        pthread_create(&cons[i], NULL, thread_consumer, NULL);
    ferry_group_init(&group);
    for (int i = 0; i < TASK_PROD; i++)
        ferry_group_spawn(&group, task_producer, (void *)(intptr_t)i, NULL);
    bad |= ferry_group_wait(&group) != 0;
    ferry_chan_close(results);
    for (int i = 0; i < TH_CONS; i++)
        ferry_to_thread(NULL, join_thread, &cons[i]);
    n = TASK_PROD * PER_TASK;
    printf("  %d tasks -> %d threads: %ld of %ld items received, sum %s, %.0f ms\n",
           TASK_PROD, TH_CONS, atomic_load(&th_count), n,
           atomic_load(&th_sum) == n * (n + 1) / 2 ? "exact" : "WRONG", ms_since(t0));
    bad |= atomic_load(&th_count) != n || atomic_load(&th_sum) != n * (n + 1) / 2;
    return bad;
}

int ex_mixed_channel(void)
{
    if (ferry_chan_new(&jobs, CAP) || ferry_chan_new(&results, CAP))
        return 1;
    int rc = ferry_run(main_task, NULL);
    ferry_chan_free(jobs);
    ferry_chan_free(results);
    return rc == 0 ? 0 : 1;
}

#ifndef FERRY_DEMO
int main(void)
{
    return ex_mixed_channel();
}
#endif
