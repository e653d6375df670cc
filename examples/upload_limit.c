/* upload_limit.c - a semaphore as a limit on concurrent work, not a mutex.
 *
 * The seed (asyncio):
 *
 *     _s3_slots = asyncio.Semaphore(5)
 *
 *     async def upload(key: str, data: bytes) -> None:
 *         async with _s3_slots:
 *             await s3.put_object(Bucket=BUCKET, Key=key, Body=data)
 *
 * put_object() here is a blocking C call (a 20 ms sleep standing in for a
 * synchronous SDK) run on a pool of 16 threads with ferry_to_thread().  The
 * number of uploads running at once is counted on the pool threads
 * themselves.  Without the semaphore only the pool size limits it; with it,
 * never more than 5 run.  A bounded semaphore (BoundedSemaphore) catches an
 * extra release.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

#include "examples.h"

#define UPLOADS   50
#define LIMIT     5
#define THREADS   16
#define UPLOAD_MS 20

static ferry_pool *pool;
static ferry_sem s3_slots = FERRY_SEM_BOUNDED_INIT(LIMIT);

/* Counted on the pool threads: the truth about concurrency. */
static atomic_int running, peak;

/* Runs on a pool thread: a blocking call. */
static int put_object(void *arg)
{
    int now = atomic_fetch_add(&running, 1) + 1;
    int seen = atomic_load(&peak);
    while (now > seen && !atomic_compare_exchange_weak(&peak, &seen, now))
        ;
    nanosleep(&(struct timespec){ .tv_nsec = UPLOAD_MS * 1000000L }, NULL);
    atomic_fetch_sub(&running, 1);
    return 0;
}

static int upload_unlimited(void *arg)
{
    return ferry_to_thread(pool, put_object, arg);
}

static int upload(void *arg)
{
    int rc = ferry_sem_acquire(&s3_slots);          /* async with _s3_slots: */
    if (rc)
        return rc;
    rc = ferry_to_thread(pool, put_object, arg);    /* await s3.put_object(...) */
    ferry_sem_release(&s3_slots);
    return rc;
}

static int run_uploads(ferry_task_fn fn, double *ms)
{
    ferry_group group;
    int64_t t0 = ferry_now();

    atomic_store(&peak, 0);
    ferry_group_init(&group);
    for (int i = 0; i < UPLOADS; i++)
        ferry_group_spawn(&group, fn, NULL, NULL);
    int rc = ferry_group_wait(&group);
    *ms = ms_since(t0);
    return rc ? -1 : atomic_load(&peak);
}

static int main_task(void *arg)
{
    double ms_free, ms_limited;
    int peak_free = run_uploads(upload_unlimited, &ms_free);
    int peak_limited = run_uploads(upload, &ms_limited);

    printf("  %d uploads of %d ms on a pool of %d threads\n", UPLOADS, UPLOAD_MS, THREADS);
    printf("  without a semaphore: at most %2d at once, %3.0f ms\n", peak_free, ms_free);
    printf("  Semaphore(%d):        at most %2d at once, %3.0f ms\n", LIMIT, peak_limited,
           ms_limited);

    /* BoundedSemaphore: one release too many is an error, not a new permit. */
    int extra = ferry_sem_release(&s3_slots);
    printf("  bounded semaphore released once too often: %s, value still %llu\n",
           errname(extra), (unsigned long long)ferry_sem_value(&s3_slots));

    return peak_free <= LIMIT || peak_limited < 1 || peak_limited > LIMIT ||
           extra != -EOVERFLOW || ferry_sem_value(&s3_slots) != LIMIT;
}

int ex_upload_limit(void)
{
    if (ferry_pool_new(&pool, &(ferry_pool_opts){ .threads = THREADS }))
        return 1;
    int rc = ferry_run(main_task, NULL);
    ferry_pool_free(pool);
    return rc == 0 ? 0 : 1;
}

#ifndef FERRY_DEMO
int main(void)
{
    return ex_upload_limit();
}
#endif
