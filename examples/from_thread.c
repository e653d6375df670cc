/* from_thread.c - plain threads calling into a loop: call_soon_threadsafe,
 * run_coroutine_threadsafe (blocking for the result), futures, and a job
 * submitted from a thread whose completion runs on the loop.
 *
 * From the seed: asyncio's primitives do not protect against threads; a
 * thread hands its result to the loop with call_soon_threadsafe.  In ferry
 * the loop-side state below (a counter, a lock, a queue) is touched only on
 * the loop's thread, so it needs no mutex: the threads reach it through the
 * bridge.  Calling the loop-side API from a thread is refused with -EPERM;
 * blocking on the loop from its own thread is refused with -EDEADLK.
 */
#include <pthread.h>
#include <stdio.h>

#include "examples.h"

#define THREADS 4
#define POSTS   10000

static ferry_loop *loop;
static long counter;                               /* loop thread only */
static ferry_queue orders = FERRY_QUEUE_INIT(sizeof(int), 8);   /* loop thread only */

/* ---- call_soon_threadsafe ---------------------------------------------- */

static void bump(void *arg)                        /* runs on the loop */
{
    counter++;
}

static void *poster(void *arg)
{
    int *failed = arg;
    for (int i = 0; i < POSTS; i++)
        if (ferry_loop_call_soon_threadsafe(loop, bump, NULL))
            ++*failed;
    return NULL;
}

/* ---- run a task on the loop from a thread ------------------------------ */

/* A task: it may suspend (here: wait for room in the queue). */
static int place_order(void *arg)
{
    return ferry_queue_put(&orders, arg);
}

struct client {
    int id;
    int rc, status;          /* of ferry_loop_run_task_sync(), and of the task */
    int direct;              /* ferry_queue_try_put() called from this thread */
};

static void *client_thread(void *arg)
{
    struct client *c = arg;
    c->direct = ferry_queue_try_put(&orders, &c->id);       /* wrong side: refused */
    c->rc = ferry_loop_run_task_sync(loop, place_order, &c->id, FERRY_SEC(5), &c->status);
    return NULL;
}

/* ---- a future ---------------------------------------------------------- */

static int slow_answer(void *arg)
{
    int rc = ferry_sleep(FERRY_MSEC(30));
    return rc ? rc : 42;
}

struct future_demo {
    int first_look, rc, status;
};

static void *future_thread(void *arg)
{
    struct future_demo *d = arg;
    ferry_future *fut;
    int status;

    d->rc = ferry_loop_spawn_threadsafe(loop, slow_answer, NULL, NULL, &fut);
    if (d->rc)
        return NULL;
    d->first_look = ferry_future_wait(fut, 0, &status);     /* only look */
    d->rc = ferry_future_wait(fut, FERRY_SEC(5), &d->status);
    ferry_future_free(fut);
    return NULL;
}

/* ---- a job submitted from a thread, completed on the loop --------------- */

static int square(void *arg)                       /* on a pool thread */
{
    int *n = arg;
    *n *= *n;
    return 0;
}

static int squared_on_loop;
static int square_done(void *arg, int status)      /* on the loop */
{
    squared_on_loop = *(int *)arg;
    return 0;
}

/* ---- the loop side ----------------------------------------------------- */

/* Waiting for a thread to end is a blocking call: it goes to the pool. */
static int join_thread(void *arg)
{
    return pthread_join(*(pthread_t *)arg, NULL);
}

static int main_task(void *arg)
{
    pthread_t th[THREADS];
    int failed[THREADS] = { 0 }, bad = 0;
    ferry_inbox_stats before, after;

    /* 1. Four threads post 10,000 callbacks each. */
    ferry_loop_inbox_stats_get(loop, &before);
    for (int i = 0; i < THREADS; i++)
        pthread_create(&th[i], NULL, poster, &failed[i]);
    for (int i = 0; i < THREADS; i++)
        ferry_to_thread(NULL, join_thread, &th[i]);
    ferry_yield();                                 /* let the last batch run */
    while (counter < THREADS * POSTS && ferry_sleep(FERRY_MSEC(1)) == 0)
        ;
    ferry_loop_inbox_stats_get(loop, &after);
    printf("  call_soon_threadsafe: %d threads x %d posts -> counter %ld (no mutex), "
           "%llu eventfd wakeups, %llu drains\n", THREADS, POSTS, counter,
           (unsigned long long)(after.wakeups - before.wakeups),
           (unsigned long long)(after.drains - before.drains));
    bad |= counter != THREADS * POSTS || failed[0] || failed[1] || failed[2] || failed[3];

    /* 2. Threads run a task on the loop and block for its status. */
    struct client c[THREADS];
    for (int i = 0; i < THREADS; i++) {
        c[i] = (struct client){ .id = 100 + i };
        pthread_create(&th[i], NULL, client_thread, &c[i]);
    }
    for (int i = 0; i < THREADS; i++)
        ferry_to_thread(NULL, join_thread, &th[i]);
    int ok = 0, refused = 0, got, sum = 0;
    for (int i = 0; i < THREADS; i++) {
        ok += c[i].rc == 0 && c[i].status == 0;
        refused += c[i].direct == -EPERM;
    }
    while (ferry_queue_try_get(&orders, &got) == 0)
        sum += got;
    printf("  run_task_sync from %d threads: %d tasks ran and returned 0, queue got ids "
           "summing to %d, the queue called directly from a thread: %d x -EPERM\n",
           THREADS, ok, sum, refused);
    bad |= ok != THREADS || sum != 100 + 101 + 102 + 103 || refused != THREADS;

    /* 3. A future, and the same call from the loop's own thread. */
    struct future_demo d;
    pthread_create(&th[0], NULL, future_thread, &d);
    ferry_to_thread(NULL, join_thread, &th[0]);
    int status, self = ferry_loop_run_task_sync(loop, slow_answer, NULL, FERRY_SEC(1), &status);
    printf("  future: first look %s, then status %d, run_task_sync on the loop's own "
           "thread: %s\n", errname(d.first_look), d.status, errname(self));
    bad |= d.rc != 0 || d.first_look != -ETIMEDOUT || d.status != 42 || self != -EDEADLK;

    /* 4. A job submitted from a plain thread, its completion on the loop. */
    static int n = 12;
    ferry_pool_submit(NULL, square, &n, loop, square_done, &n);
    while (squared_on_loop == 0 && ferry_sleep(FERRY_MSEC(1)) == 0)
        ;
    printf("  pool_submit: 12 squared on a pool thread, the completion saw %d on the loop\n",
           squared_on_loop);
    bad |= squared_on_loop != 144;
    return bad;
}

int ex_from_thread(void)
{
    ferry_task *main;
    int status = -1;

    if (ferry_loop_new(&loop, NULL))
        return 1;
    if (ferry_task_spawn(&main, loop, main_task, NULL, &(ferry_task_opts){ .name = "main" }) == 0) {
        ferry_loop_run(loop, FERRY_RUN_DEFAULT);
        if (ferry_task_try_join(main, &status))
            status = -1;
    }
    ferry_queue_destroy(&orders);
    ferry_loop_free(loop);
    return status == 0 ? 0 : 1;
}

#ifndef FERRY_DEMO
int main(void)
{
    return ex_from_thread();
}
#endif
