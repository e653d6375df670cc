/* blocking_call.c - a blocking C call wrapped for tasks: ferry_to_thread()
 * runs it on a pool thread and suspends only the calling task.
 *
 * A ticker task ticks every 10 ms, so we can see whether the loop is
 * alive.  slow_library_call() stands for any blocking C API (a driver, a
 * synchronous SDK): it sleeps 100 ms.  Called straight from a task it
 * freezes the whole loop; through ferry_to_thread() the ticker keeps
 * going.  Real file I/O (write, fsync, read back a temp file) goes the same
 * way.  A job still queued when its task is cancelled never runs; a running
 * one cannot be interrupted, but ferry_to_thread_abandon() stops waiting for
 * it at the deadline and hands its last step to a cleanup callback.
 */
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "examples.h"

static ferry_pool *pool;
static int ticks;
static bool ticking;

static int ticker(void *arg)
{
    while (ticking) {
        if (ferry_sleep(FERRY_MSEC(10)))
            return 0;
        ticks++;
    }
    return 0;
}

static void sleep_ms(int ms)
{
    nanosleep(&(struct timespec){ .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L }, NULL);
}

/* A blocking C API: 100 ms without returning. */
static int slow_library_call(void *arg)
{
    sleep_ms(100);
    return 0;
}

/* File I/O on a pool thread: write 4 MiB to a temp file, fsync, read it
 * back and compare.  Returns 0 or a negative errno. */
struct file_job {
    size_t size;
    double ms;
};

static int file_roundtrip(void *arg)
{
    struct file_job *job = arg;
    const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char path[512];
    unsigned char *buf = malloc(job->size), *back = malloc(job->size);
    int64_t t0 = ferry_now();
    int rc = 0, fd;

    snprintf(path, sizeof path, "%s/ferry-example-XXXXXX", dir);
    if (!buf || !back || (fd = mkstemp(path)) < 0) {
        free(buf);
        free(back);
        return -EIO;
    }
    unlink(path);
    for (size_t i = 0; i < job->size; i++)
        buf[i] = (unsigned char)(i * 31 + 7);
    if (write(fd, buf, job->size) != (ssize_t)job->size || fsync(fd) ||
        pread(fd, back, job->size, 0) != (ssize_t)job->size ||
        memcmp(buf, back, job->size) != 0)
        rc = -EIO;
    close(fd);
    free(buf);
    free(back);
    job->ms = (double)(ferry_now() - t0) / 1e6;
    return rc;
}

/* The last line from ferry's diagnostics (the blocked-loop detector). */
static char last_log[200];
static void keep_log(int level, const char *msg, void *ctx)
{
    snprintf(last_log, sizeof last_log, "%s", msg);
}

/* ---- queued jobs that are cancelled ------------------------------------ */

static atomic_int queued_ran;
static int counted_job(void *arg)
{
    atomic_fetch_add(&queued_ran, 1);
    return 0;
}

static int queued_task(void *arg)
{
    return ferry_to_thread(arg, counted_job, NULL);
}

static int blocker_task(void *arg)
{
    return ferry_to_thread(arg, slow_library_call, NULL);
}

/* ---- abandoning a running job at a deadline ---------------------------- */

struct abandoned {
    ferry_loop *loop;        /* where to report the end */
    ferry_event *ended;      /* set on the loop when the job has ended */
    int64_t      end;        /* when cleanup ran (written on the pool thread) */
    int          status;     /* what cleanup was given: the job's, or -ECANCELED */
};

static void set_ended(void *arg)        /* on the loop */
{
    struct abandoned *a = arg;
    ferry_event_set(a->ended);
}

static void abandoned_cleanup(void *arg, int status)    /* on the pool thread */
{
    struct abandoned *a = arg;
    a->end = ferry_now();
    a->status = status;
    ferry_loop_call_soon_threadsafe(a->loop, set_ended, a);
}

static int main_task(void *arg)
{
    ferry_task *tick;
    int bad = 0, rc;

    ticking = true;
    ferry_task_spawn(&tick, NULL, ticker, NULL, &(ferry_task_opts){ .name = "ticker" });
    ferry_sleep(FERRY_MSEC(25));

    /* 1. The blocking call straight on the loop. */
    ferry_set_log(keep_log, NULL);
    int before = ticks;
    int64_t t0 = ferry_now();
    slow_library_call(NULL);
    double ms = ms_since(t0);
    int on_loop = ticks - before;                /* before the yield lets the ticker run */
    ferry_yield();                               /* end this step: the detector reports it */
    ferry_set_log(NULL, NULL);
    ferry_loop_stats st;
    ferry_loop_stats_get(ferry_loop_current(), &st);
    printf("  called on the loop:    %3.0f ms call, the ticker ticked %2d times, "
           "slow steps detected: %llu\n", ms, on_loop, (unsigned long long)st.slow_steps);
    printf("                         ferry's log: %s\n", last_log);

    /* 2. The same call through the pool. */
    before = ticks;
    t0 = ferry_now();
    rc = ferry_to_thread(pool, slow_library_call, NULL);
    ms = ms_since(t0);
    int on_pool = ticks - before;
    printf("  via ferry_to_thread(): %3.0f ms call, the ticker ticked %2d times\n", ms, on_pool);
    bad |= rc != 0 || on_loop != 0 || on_pool < 1 || st.slow_steps < 1;

    /* 3. Real file I/O on the pool. */
    struct file_job job = { .size = 4u << 20 };
    before = ticks;
    rc = ferry_to_thread(pool, file_roundtrip, &job);
    printf("  file I/O on the pool:  4 MiB written, fsync'd, read back: %s in %.1f ms\n",
           rc == 0 ? "identical" : "FAILED", job.ms);
    bad |= rc != 0;

    /* 4. Jobs cancelled while queued never run. */
    ferry_pool *one;
    ferry_pool_new(&one, &(ferry_pool_opts){ .threads = 1 });
    ferry_task *blocker, *queued[10];
    ferry_task_spawn(&blocker, NULL, blocker_task, one, NULL);
    ferry_yield();                               /* the blocker takes the only thread */
    for (int i = 0; i < 10; i++)
        ferry_task_spawn(&queued[i], NULL, queued_task, one, NULL);
    ferry_sleep(FERRY_MSEC(20));
    int cancelled = 0, status;
    for (int i = 0; i < 10; i++)
        ferry_task_cancel(queued[i]);
    for (int i = 0; i < 10; i++) {
        ferry_task_join(queued[i], &status);
        cancelled += status == -ECANCELED;
    }
    ferry_task_join(blocker, &status);
    ferry_pool_stats ps;
    ferry_pool_stats_get(one, &ps);
    printf("  10 queued jobs cancelled: %d calls returned -ECANCELED, %d jobs ran, "
           "pool counted %llu cancelled\n", cancelled, atomic_load(&queued_ran),
           (unsigned long long)ps.cancelled);
    bad |= cancelled != 10 || atomic_load(&queued_ran) != 0 || ps.cancelled != 10 || status != 0;
    ferry_pool_free(one);

    /* 5. A running job abandoned at a 30 ms deadline. */
    ferry_event ended = FERRY_EVENT_INIT;
    struct abandoned *a = &(struct abandoned){ .loop = ferry_loop_current(), .ended = &ended };
    ferry_scope deadline;
    t0 = ferry_now();
    ferry_scope_enter(&deadline, t0 + FERRY_MSEC(30), 0);
    rc = ferry_to_thread_abandon(pool, slow_library_call, a, abandoned_cleanup);
    ferry_scope_exit(&deadline);
    int64_t t_ret = ferry_now();
    double returned = ms_since(t0);
    ferry_event_wait(&ended);                    /* posted by the cleanup from the pool */
    /* On a busy machine the pool's thread may not have taken the job by
     * the deadline: then it never runs, and its cleanup says so. */
    if (a->status == -ECANCELED)
        printf("  abandoned at a 30 ms deadline: returned %s after %.0f ms, the job never "
               "started: its cleanup ran with -ECANCELED\n", errname(rc), returned);
    else
        printf("  abandoned at a 30 ms deadline: returned %s after %.0f ms, the job ended "
               "and its cleanup ran after %.0f ms\n", errname(rc), returned,
               (double)(a->end - t0) / 1e6);
    bad |= rc != -ETIMEDOUT ||
           (a->status != -ECANCELED && (a->status != 0 || a->end < t_ret));

    ticking = false;
    ferry_task_join(tick, NULL);
    return bad;
}

int ex_blocking_call(void)
{
    ferry_loop *loop;
    ferry_task *main;
    int status = -1;

    /* ferry_run() spelled out, to set the blocked-loop detector first. */
    if (ferry_pool_new(&pool, &(ferry_pool_opts){ .threads = 2 }))
        return 1;
    if (ferry_loop_new(&loop, NULL) == 0) {
        ferry_loop_set_slow_threshold(loop, FERRY_MSEC(50));
        if (ferry_task_spawn(&main, loop, main_task, NULL, &(ferry_task_opts){ .name = "main" }) == 0) {
            ferry_loop_run(loop, FERRY_RUN_DEFAULT);
            if (ferry_task_try_join(main, &status))
                status = -1;
        }
        ferry_loop_free(loop);
    }
    ferry_pool_free(pool);
    return status == 0 ? 0 : 1;
}

#ifndef FERRY_DEMO
int main(void)
{
    return ex_blocking_call();
}
#endif
