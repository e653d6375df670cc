/* condition.c - a condition with a predicate: consumers wait until a batch
 * is ready, a producer notifies on every change.
 *
 * The seed (asyncio):
 *
 *     async with cond:
 *         await cond.wait_for(lambda: len(buffer) > 0)
 *     ...
 *     async with cond:
 *         buffer.append(item)
 *         cond.notify()
 *
 * A condition is for a state richer than a flag.  Here each consumer waits
 * for a whole batch: "at least 5 items, or the producer is finished".
 * ferry_cond_wait_for() releases the lock while it waits, re-checks the
 * predicate after every notification, and returns holding the lock with
 * the predicate true.
 */
#include <stdio.h>

#include "examples.h"

#define ITEMS     100
#define BATCH     5
#define CONSUMERS 2

static ferry_cond cond = FERRY_COND_INIT;   /* over its own lock */
static int buffer[ITEMS], len;
static bool finished;
static int checks_true, checks_false, batches, taken, short_batches;

/* Called by wait_for with the lock held. */
static bool batch_ready(void *arg)
{
    bool ready = len >= BATCH || finished;
    if (ready)
        checks_true++;
    else
        checks_false++;
    return ready;
}

static int consumer(void *arg)
{
    ferry_lock *lock = ferry_cond_lock(&cond);

    for (;;) {
        int rc = ferry_lock_acquire(lock);            /* async with cond: */
        if (rc)
            return rc;
        rc = ferry_cond_wait_for(&cond, batch_ready, NULL);
        if (rc) {
            ferry_lock_release(lock);
            return rc;
        }
        if (len == 0) {                               /* finished and drained */
            ferry_lock_release(lock);
            return 0;
        }
        int n = len < BATCH ? len : BATCH;
        len -= n;                                     /* take a batch */
        taken += n;
        batches++;
        if (n < BATCH)
            short_batches++;
        ferry_lock_release(lock);
        ferry_yield();                                /* process it */
    }
}

static int producer(void *arg)
{
    ferry_lock *lock = ferry_cond_lock(&cond);

    for (int i = 0; i < ITEMS; i++) {
        int rc = ferry_lock_acquire(lock);
        if (rc)
            return rc;
        buffer[len++] = i;                            /* buffer.append(item) */
        ferry_cond_notify(&cond, 1);                  /* cond.notify() */
        ferry_lock_release(lock);
        ferry_yield();
    }
    ferry_lock_acquire(lock);
    finished = true;
    ferry_cond_notify_all(&cond);
    ferry_lock_release(lock);
    return 0;
}

static int main_task(void *arg)
{
    ferry_group group;

    ferry_group_init(&group);
    for (int i = 0; i < CONSUMERS; i++)
        ferry_group_spawn(&group, consumer, NULL, NULL);
    ferry_group_spawn(&group, producer, NULL, NULL);
    int rc = ferry_group_wait(&group);
    printf("  %d items appended one at a time, %d consumers waiting for batches of %d: "
           "%d items taken in %d batches (%d short)\n",
           ITEMS, CONSUMERS, BATCH, taken, batches, short_batches);
    printf("  the predicate was checked %d times: %d times false (the consumer went back to waiting), "
           "%d times true (%d batches, %d end signals)\n", checks_true + checks_false,
           checks_false, checks_true, batches, checks_true - batches);
    return rc || checks_true != batches + CONSUMERS || taken != ITEMS || batches != ITEMS / BATCH || short_batches != 0;
}

int ex_condition(void)
{
    return ferry_run(main_task, NULL) == 0 ? 0 : 1;
}

#ifndef FERRY_DEMO
int main(void)
{
    return ex_condition();
}
#endif
