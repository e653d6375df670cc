/* pipeline.c - producer and consumers over a bounded queue: backpressure,
 * sentinel shutdown, task_done and join.
 *
 * The seed (asyncio):
 *
 *     async def process_all(items, workers=10):
 *         queue = asyncio.Queue(maxsize=100)
 *         async def worker():
 *             while (item := await queue.get()) is not None:
 *                 try:
 *                     await handle(item)
 *                 finally:
 *                     queue.task_done()
 *         async with asyncio.TaskGroup() as tg:
 *             for _ in range(workers):
 *                 tg.create_task(worker())
 *             async for item in items:
 *                 await queue.put(item)
 *             for _ in range(workers):
 *                 await queue.put(None)   # one end signal per consumer
 *
 * The producer is faster than the consumers, so put waits: it runs at the
 * consumers' pace instead of piling items up in memory.
 */
#include <stdio.h>

#include "examples.h"

#define ITEMS     1000
#define WORKERS   10
#define MAXSIZE   100
#define SENTINEL  (-1)               /* None */

static ferry_queue queue = FERRY_QUEUE_INIT(sizeof(int), MAXSIZE);
static long handled, sum;
static int busy, peak_busy;

static int handle(int item)
{
    if (++busy > peak_busy)
        peak_busy = busy;
    int rc = ferry_sleep(FERRY_MSEC(1));        /* some I/O per item */
    busy--;
    handled++;
    sum += item;
    return rc;
}

static int worker(void *arg)
{
    int item, rc;

    for (;;) {
        rc = ferry_queue_get(&queue, &item);
        if (rc == -ESHUTDOWN)
            return 0;                           /* the queue was shut down */
        if (rc)
            return rc;
        if (item == SENTINEL) {
            ferry_queue_task_done(&queue);      /* the end signal counts too */
            return 0;
        }
        rc = handle(item);
        ferry_queue_task_done(&queue);          /* finally: queue.task_done() */
        if (rc)
            return rc;
    }
}

/* The seed's process_all(): returns the group's status. */
static int process_all(int nitems, size_t *max_size, int *put_waits)
{
    ferry_group tg;
    int rc, sentinel = SENTINEL;

    ferry_group_init(&tg);
    for (int i = 0; i < WORKERS; i++)
        ferry_group_spawn(&tg, worker, NULL, NULL);
    for (int item = 1; item <= nitems; item++) {
        if (ferry_queue_full(&queue))
            ++*put_waits;                       /* this put will wait for a consumer */
        rc = ferry_queue_put(&queue, &item);
        if (rc)
            break;
        if (ferry_queue_size(&queue) > *max_size)
            *max_size = ferry_queue_size(&queue);
    }
    for (int i = 0; i < WORKERS; i++)
        ferry_queue_put(&queue, &sentinel);
    return ferry_group_wait(&tg);
}

static int by_value(const void *a, const void *b, void *arg)
{
    return *(const int *)a - *(const int *)b;
}

static int main_task(void *arg)
{
    size_t max_size = 0;
    int put_waits = 0, bad = 0;
    int64_t t0 = ferry_now();

    int rc = process_all(ITEMS, &max_size, &put_waits);
    printf("  %d items, %d workers, queue of %d: %ld handled (sum %s), %.0f ms\n",
           ITEMS, WORKERS, MAXSIZE, handled,
           sum == (long)ITEMS * (ITEMS + 1) / 2 ? "correct" : "WRONG", ms_since(t0));
    printf("  backpressure: the queue never held more than %zu, the producer waited "
           "%d times, at most %d items in work at once\n", max_size, put_waits, peak_busy);
    bad |= rc != 0 || handled != ITEMS || sum != (long)ITEMS * (ITEMS + 1) / 2 ||
           max_size > MAXSIZE || put_waits == 0 || peak_busy > WORKERS;

    /* task_done and join: wait until every item is processed, not only put;
     * then end the workers with Python 3.13's shutdown instead of sentinels. */
    ferry_group tg;
    handled = 0;
    ferry_group_init(&tg);
    for (int i = 0; i < WORKERS; i++)
        ferry_group_spawn(&tg, worker, NULL, NULL);
    for (int item = 1; item <= 200; item++)
        ferry_queue_put(&queue, &item);
    long at_last_put = handled;
    ferry_queue_join(&queue);
    long at_join = handled;
    ferry_queue_shutdown(&queue, false);
    rc = ferry_group_wait(&tg);
    printf("  join: 200 items put (%ld handled when the last put returned), "
           "join returned with %ld handled\n", at_last_put, at_join);
    bad |= rc != 0 || at_join != 200 || at_last_put == 200;
    ferry_queue_destroy(&queue);

    /* Queue(maxsize=2): the third put_nowait is QueueFull. */
    ferry_queue small;
    int one = 1;
    ferry_queue_init(&small, sizeof(int), 2, FERRY_QUEUE_FIFO, NULL, NULL);
    ferry_queue_try_put(&small, &one);
    ferry_queue_try_put(&small, &one);
    int third = ferry_queue_try_put(&small, &one);
    printf("  Queue(maxsize=2): third try_put -> %s (QueueFull)\n", errname(third));
    bad |= third != -EAGAIN;
    ferry_queue_destroy(&small);

    /* LifoQueue and PriorityQueue. */
    ferry_queue lifo, prio;
    int in[] = { 3, 1, 2 }, out[3][3];
    ferry_queue_init(&lifo, sizeof(int), 0, FERRY_QUEUE_LIFO, NULL, NULL);
    ferry_queue_init(&prio, sizeof(int), 0, FERRY_QUEUE_PRIORITY, by_value, NULL);
    for (int i = 0; i < 3; i++) {
        ferry_queue_put(&lifo, &in[i]);
        ferry_queue_put(&prio, &in[i]);
    }
    for (int i = 0; i < 3; i++) {
        out[0][i] = in[i];
        ferry_queue_get(&lifo, &out[1][i]);
        ferry_queue_get(&prio, &out[2][i]);
    }
    printf("  put 3 1 2 -> LIFO gives %d %d %d, priority gives %d %d %d\n",
           out[1][0], out[1][1], out[1][2], out[2][0], out[2][1], out[2][2]);
    bad |= out[1][0] != 2 || out[1][2] != 3 || out[2][0] != 1 || out[2][2] != 3;
    ferry_queue_destroy(&lifo);
    ferry_queue_destroy(&prio);
    return bad;
}

int ex_pipeline(void)
{
    return ferry_run(main_task, NULL) == 0 ? 0 : 1;
}

#ifndef FERRY_DEMO
int main(void)
{
    return ex_pipeline();
}
#endif
