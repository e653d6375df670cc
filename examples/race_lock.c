/* race_lock.c - check, suspend, act: the race inside one thread, and the
 * lock that closes it.
 *
 * The seed (asyncio):
 *
 *     async def increment():
 *         global value
 *         async with lock:
 *             current = value
 *             await asyncio.sleep(0)
 *             value = current + 1
 *
 * Code between two suspension points runs without interruption; a race
 * needs a suspension point between the read and the write.  ferry_yield()
 * plays asyncio.sleep(0).  A ferry_lock is for one loop's tasks: it is not
 * recursive (a second acquire is -EDEADLK instead of a hang) and a thread
 * that is not the loop's gets -EPERM instead of silent corruption.
 */
#include <pthread.h>
#include <stdio.h>

#include "examples.h"

#define N 100

static int value;
static ferry_lock lock = FERRY_LOCK_INIT;

/* No suspension point between read and write: atomic for other tasks. */
static int increment_plain(void *arg)
{
    int current = value;
    value = current + 1;
    return 0;
}

/* A suspension point between read and write, no lock: other tasks run at
 * ferry_yield() and read the same old value. */
static int increment_racy(void *arg)
{
    int current = value;                /* check */
    int rc = ferry_yield();             /* await asyncio.sleep(0) */
    value = current + 1;                /* act on a stale read */
    return rc;
}

/* The same under the lock. */
static int increment_locked(void *arg)
{
    int rc = ferry_lock_acquire(&lock); /* async with lock: */
    if (rc)
        return rc;
    int current = value;
    rc = ferry_yield();
    value = current + 1;
    ferry_lock_release(&lock);
    return rc;
}

/* Run N copies of fn concurrently in a task group; return updates lost. */
static int run_n(ferry_task_fn fn)
{
    ferry_group group;
    int rc;

    value = 0;
    ferry_group_init(&group);
    for (int i = 0; i < N; i++) {
        rc = ferry_group_spawn(&group, fn, NULL, NULL);
        if (rc)
            return -1;
    }
    rc = ferry_group_wait(&group);      /* async with TaskGroup(): ... */
    return rc ? -1 : N - value;
}

static void *other_thread(void *arg)
{
    *(int *)arg = ferry_lock_acquire(&lock);
    return NULL;
}

static int main_task(void *arg)
{
    int plain = run_n(increment_plain);
    int racy = run_n(increment_racy);
    int locked = run_n(increment_locked);

    printf("  no suspension point between read and write: %d of %d updates lost\n", plain, N);
    printf("  ferry_yield() between read and write, no lock: %d of %d updates lost\n", racy, N);
    printf("  same, inside ferry_lock_acquire/release:       %d of %d updates lost\n", locked, N);

    /* Not recursive: asyncio would hang here; ferry says so. */
    ferry_lock_acquire(&lock);
    int again = ferry_lock_acquire(&lock);
    ferry_lock_release(&lock);
    printf("  second acquire by the holder: %s\n", errname(again));

    /* Not a thread lock: another thread is refused. */
    pthread_t th;
    int from_thread = 0;
    pthread_create(&th, NULL, other_thread, &from_thread);
    pthread_join(th, NULL);
    printf("  acquire from another thread: %s\n", errname(from_thread));

    return !(plain == 0 && racy > 0 && locked == 0 && again == -EDEADLK &&
             from_thread == -EPERM);
}

int ex_race_lock(void)
{
    return ferry_run(main_task, NULL) == 0 ? 0 : 1;
}

#ifndef FERRY_DEMO
int main(void)
{
    return ex_race_lock();
}
#endif
