/* gdb_target.c - the program tests/gdb_check.sh runs under gdb: a loop
 * with tasks in every state, stopped in gdb_target_stopped() with
 * them in place.
 *
 * The main task holds a lock and spawns tasks that then wait on it, on a
 * queue get, on a sleep, in a select, on an event at the bottom of a deep
 * recursion (so that its stack use is large), on the join of another
 * task; one yields without end (ready), one has ended (not listed), one
 * has not started yet.  A second thread runs a loop of its own, whose task
 * waits on a pipe.  A third thread runs a runtime of two loops
 * (ferry/runtime.h): a task of its loop 0 waits in a call to loop 1, whose
 * task sleeps.  It prints ferry_loop_dump() to stdout, so that the
 * check can compare gdb's figures with it, calls the stop function, prints
 * the dump again (gdb's reading must not have changed it), then lets every
 * task end and exits 0 (gdb continues it to the end).
 */
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "ferry/ferry.h"

/* Levels of recursion of the deep task, each with a frame of over 1 KiB. */
enum { DEEP_LEVELS = 256 };

static ferry_lock lock;
static ferry_queue queue = FERRY_QUEUE_INIT(sizeof(int), 4);
static ferry_queue sel_queue = FERRY_QUEUE_INIT(sizeof(int), 4);
static ferry_event go;
static volatile int stop_yielding;

/* A second thread runs a loop of its own (thread_main), whose task
 * in_thread2 waits for the pipe to be readable; the thread posts
 * `thread_ready` once both of its tasks wait. */
static int pipefd[2] = { -1, -1 };
static sem_t thread_ready;

static int in_thread2(void *arg)
{
    (void)arg;
    return ferry_wait_fd(pipefd[0], FERRY_READ, NULL) < 0 ? -1 : 0;
}

/* A callback: it runs once the loop's tasks have suspended. */
static void thread_settled(void *arg)
{
    (void)arg;
    sem_post(&thread_ready);
}

static int thread_main(void *arg)
{
    ferry_task *t;
    int status = -1;

    (void)arg;
    if (ferry_task_spawn(&t, NULL, in_thread2, NULL, &(ferry_task_opts){ .name = "in_thread2" }))
        return -1;
    ferry_yield();
    if (ferry_call_soon(ferry_loop_current(), thread_settled, NULL) || ferry_task_join(t, &status))
        return -1;
    return status;
}

static void *thread_fn(void *arg)
{
    (void)arg;
    return (void *)(intptr_t)ferry_run(thread_main, NULL);
}

/* The third thread's runtime: rt_caller, a task of its loop 0, waits in
 * a call to loop 1, where the call's task sleeps; the runtime's main task
 * posts `rt_ready` once both wait, then waits for rt_pipe. */
static int rt_pipe[2] = { -1, -1 };
static sem_t rt_ready;
static int rt_remote_started;

static int rt_remote(void *arg, void **result)
{
    (void)arg;
    (void)result;
    __atomic_store_n(&rt_remote_started, 1, __ATOMIC_RELEASE);
    return ferry_sleep(FERRY_SEC(3600)) == -ECANCELED ? 0 : -1;
}

static int rt_caller(void *arg)
{
    int st = -1, rc;

    (void)arg;
    rc = ferry_runtime_call(NULL, 1, rt_remote, NULL, 0, &st, NULL);
    return rc ? rc : st;
}

static void rt_settled(void *arg)
{
    (void)arg;
    sem_post(&rt_ready);
}

static int rt_main(void *arg)
{
    ferry_task *t;
    int status = -1;

    (void)arg;
    if (ferry_task_spawn(&t, NULL, rt_caller, NULL, &(ferry_task_opts){ .name = "rt_caller" }))
        return -1;
    while (!__atomic_load_n(&rt_remote_started, __ATOMIC_ACQUIRE))
        ferry_sleep(FERRY_MSEC(1));
    if (ferry_call_soon(ferry_loop_current(), rt_settled, NULL) ||
        ferry_wait_fd(rt_pipe[0], FERRY_READ, NULL) < 0)
        return -1;
    /* Cancelling the caller cancels the call's task on loop 1. */
    if (ferry_task_cancel(t) || ferry_task_join(t, &status))
        return -1;
    return status;
}

static void *rt_thread_fn(void *arg)
{
    ferry_runtime *rt;
    int st = -1;

    (void)arg;
    if (ferry_runtime_new(&rt, &(ferry_runtime_opts){ .loops = 2 }))
        return (void *)1;
    if (ferry_runtime_run(rt, rt_main, NULL, &st))
        st = -1;
    ferry_runtime_free(rt);
    return (void *)(intptr_t)st;
}

/* Where gdb stops the program.  noinline and with a side effect, so that
 * the call stays a call with its own frame. */
__attribute__((noinline)) void gdb_target_stopped(void);
__attribute__((noinline)) void gdb_target_stopped(void)
{
    __asm__ volatile("" ::: "memory");
}

static int waits_on_lock(void *arg)
{
    int rc = ferry_lock_acquire(&lock);

    (void)arg;
    return rc ? rc : ferry_lock_release(&lock);
}

static int waits_on_queue(void *arg)
{
    int item;

    (void)arg;
    return ferry_queue_get(&queue, &item);
}

static int sleeper(void *arg)
{
    (void)arg;
    return ferry_sleep(FERRY_SEC(3600));
}

static int selector(void *arg)
{
    int item;
    ferry_case cases[] = { FERRY_CASE_GET_INIT(&sel_queue, &item), FERRY_CASE_EVENT_INIT(&go) };

    (void)arg;
    return ferry_select(cases, 2, 0) < 0 ? -1 : 0;
}

static __attribute__((noinline)) int recurse(int n)
{
    volatile char pad[1024];
    int rc;

    pad[0] = (char)n;
    if (n == 0)
        return ferry_event_wait(&go);
    rc = recurse(n - 1);
    return rc + pad[0] - (char)n;
}

static int deep(void *arg)
{
    (void)arg;
    return recurse(DEEP_LEVELS);
}

/* Joins the sleeper, which main_task cancels at the end. */
static int joiner(void *arg)
{
    int status;

    return ferry_task_join(arg, &status);
}

static int finished(void *arg)
{
    (void)arg;
    return 0;
}

static int yielder(void *arg)
{
    (void)arg;
    while (!stop_yielding)
        ferry_yield();
    return 0;
}

static int fresh(void *arg)
{
    (void)arg;
    return 0;
}

static int main_task(void *arg)
{
    ferry_task *t[9];
    int rc = 0, n = 0, item = 1;

    (void)arg;
    if (ferry_lock_init(&lock) || ferry_event_init(&go) || ferry_lock_acquire(&lock))
        return 1;
    if (ferry_task_spawn(&t[n++], NULL, waits_on_lock, NULL,
                         &(ferry_task_opts){ .name = "waits_on_lock" }) ||
        ferry_task_spawn(&t[n++], NULL, waits_on_queue, NULL,
                         &(ferry_task_opts){ .name = "waits_on_queue" }) ||
        ferry_task_spawn(&t[n++], NULL, sleeper, NULL, &(ferry_task_opts){ .name = "sleeper" }) ||
        ferry_task_spawn(&t[n++], NULL, selector, NULL, &(ferry_task_opts){ .name = "selector" }) ||
        ferry_task_spawn(&t[n++], NULL, deep, NULL,
                         &(ferry_task_opts){ .name = "deep", .stack_size = 1024 * 1024 }) ||
        ferry_task_spawn(&t[n++], NULL, joiner, t[2], &(ferry_task_opts){ .name = "joiner" }) ||
        ferry_task_spawn(&t[n++], NULL, finished, NULL, &(ferry_task_opts){ .name = "finished" }) ||
        ferry_task_spawn(&t[n++], NULL, yielder, NULL, &(ferry_task_opts){ .name = "yielder" }))
        return 1;
    /* Two turns: every task has reached its suspension point (or ended). */
    ferry_yield();
    ferry_yield();
    /* The other thread's tasks wait too (blocking this thread a moment;
     * a minute means it failed). */
    {
        struct timespec until;

        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 60;
        while (sem_timedwait(&thread_ready, &until) != 0)
            if (errno != EINTR)
                return 1;
        while (sem_timedwait(&rt_ready, &until) != 0)
            if (errno != EINTR)
                return 1;
    }
    if (ferry_task_spawn(&t[n++], NULL, fresh, NULL, &(ferry_task_opts){ .name = "fresh" }))
        return 1;
    if (ferry_loop_dump(ferry_loop_current(), stdout) < 0)
        return 1;
    fflush(stdout);
    gdb_target_stopped();
    /* Once more: what gdb read must not have changed the figures (reading
     * a page of a stack never touched would make it resident). */
    printf("gdb_target: the dump again\n");
    if (ferry_loop_dump(ferry_loop_current(), stdout) < 0)
        return 1;
    fflush(stdout);

    /* Let everything end. */
    stop_yielding = 1;
    if (write(pipefd[1], "x", 1) != 1 || write(rt_pipe[1], "x", 1) != 1)
        return 1;
    if (ferry_lock_release(&lock) || ferry_queue_put(&queue, &item) || ferry_event_set(&go) ||
        ferry_task_cancel(t[2]))
        return 1;
    for (int i = 0; i < n; i++) {
        int status = 0;

        if (i == 2)
            continue;     /* the sleeper is the joiner's to join */
        if (ferry_task_join(t[i], &status) || status != 0)
            rc = 1;
    }
    ferry_event_destroy(&go);
    ferry_lock_destroy(&lock);
    ferry_queue_destroy(&queue);
    ferry_queue_destroy(&sel_queue);
    return rc;
}

int main(void)
{
    pthread_t th, rt_th;
    void *thread_rc = NULL, *rt_rc = NULL;
    int rc;

    if (pipe(pipefd) != 0 || sem_init(&thread_ready, 0, 0) != 0 || pipe(rt_pipe) != 0 ||
        sem_init(&rt_ready, 0, 0) != 0 || pthread_create(&th, NULL, thread_fn, NULL) != 0 ||
        pthread_create(&rt_th, NULL, rt_thread_fn, NULL) != 0)
        return 1;
    rc = ferry_run(main_task, NULL);
    if (pthread_join(th, &thread_rc) != 0 || thread_rc != NULL)
        rc = rc ? rc : -1;
    if (pthread_join(rt_th, &rt_rc) != 0 || rt_rc != NULL)
        rc = rc ? rc : -2;
    if (rc != 0) {
        fprintf(stderr, "gdb_target: %d\n", rc);
        return 1;
    }
    printf("gdb_target: done\n");
    return 0;
}
