/* ferry/bridge.h - the border between a loop and threads.
 *
 * Everything that crosses threads goes through the functions here:
 *
 *   - posting a callback into a loop from any thread (call_soon_threadsafe),
 *     and stopping a loop from any thread;
 *   - thread pools: a task hands a blocking call to a pool and suspends
 *     (ferry_to_thread), or a plain thread submits a job whose completion
 *     runs on a chosen loop (ferry_pool_submit);
 *   - a foreign thread runs a function or a task on a loop and blocks for
 *     its status (ferry_loop_run_sync, ferry_loop_run_task_sync), or keeps a
 *     thread-side future for it;
 *   - a bounded channel between threads and tasks (ferry_chan).
 *
 * Errors are negative errno values.  -ESHUTDOWN always means "refused,
 * nothing happened": the loop, pool or channel is closing or closed.  In a
 * process forked from the one that made a loop, every call here that
 * reaches that loop (through the loop pointer or an inbox taken before the
 * fork) returns -ESHUTDOWN: the child's copy never runs (docs/fork.md).
 *
 * Lifetimes.  A function that takes a `ferry_loop *` from another thread
 * requires that ferry_loop_free() has not returned for that loop: ferry
 * cannot check a pointer to freed memory.  Threads that may outlive the loop
 * hold a ferry_inbox instead: it is reference-counted, and posting through
 * it after the loop closed returns -ESHUTDOWN.
 */
#ifndef FERRY_BRIDGE_H
#define FERRY_BRIDGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/loop.h"
#include "ferry/task.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Posting into a loop ---------------------------------------------- */

/*
 * Run cb(arg) on `loop`'s thread in a later turn.  Callbacks posted by one
 * thread run in the order posted.  A post that returned 0 always runs, also
 * when the loop is being freed (ferry_loop_free() runs it before it
 * returns).  Posting allocates nothing per call (the queue's storage grows
 * in amortised steps and is reused).  The loop is woken through an eventfd
 * that is written only when the loop is not already awake.
 * Thread: any, the loop's own included.  Suspends: no.
 * Returns: 0; -ESHUTDOWN (the loop is closed, nothing queued); -ENOMEM
 * (the queue could not grow, nothing queued); -EINVAL (loop or cb NULL).
 * Owns: `arg` stays the caller's; ferry only passes it to cb.
 */
int ferry_loop_call_soon_threadsafe(ferry_loop *loop, ferry_cb cb, void *arg);

/*
 * Make ferry_loop_run() on `loop` return, as ferry_loop_stop() does, from
 * any thread.  Several calls before the loop sees them count as one.
 * Allocates nothing.
 * Thread: any.  Suspends: no.
 * Returns: 0; -ESHUTDOWN (loop closed); -EINVAL.
 */
int ferry_loop_stop_threadsafe(ferry_loop *loop);

/*
 * A counted handle on a loop's inbox: the queue that
 * ferry_loop_call_soon_threadsafe() posts into.  Unlike the loop pointer it
 * stays valid after the loop is freed; posts then return -ESHUTDOWN.
 */
typedef struct ferry_inbox ferry_inbox;

/*
 * Take a reference on `loop`'s inbox.
 * Thread: any (the loop must not be freed yet).  Suspends: no.
 * Owns: the caller holds one reference; give it back with
 * ferry_inbox_unref().  The last reference frees the inbox.
 * Returns: 0; -ESHUTDOWN (loop already closed); -EINVAL.
 */
int ferry_inbox_get(ferry_inbox **out /* OUT */, ferry_loop *loop);

/*
 * Exactly ferry_loop_call_soon_threadsafe() on the inbox's loop; -ESHUTDOWN
 * once that loop has closed (or been freed).
 * Thread: any.  Suspends: no.  Returns: as ferry_loop_call_soon_threadsafe().
 */
int ferry_inbox_post(ferry_inbox *inbox, ferry_cb cb, void *arg);

/* Drop one reference.  NULL is ignored.  Thread: any.  Suspends: no. */
void ferry_inbox_unref(ferry_inbox *inbox);

/* Deprecated: the earlier name of ferry_inbox_unref() (`_release` is the
 * primitives' verb for unlocking), kept for programs written against it.
 * Thread: any.  Suspends: no. */
void ferry_inbox_release(ferry_inbox *inbox);

/* Counters of a loop's inbox. */
typedef struct ferry_inbox_stats {
    uint64_t posts;        /* callbacks accepted (user posts and completions) */
    uint64_t wakeups;      /* eventfd writes made to wake the loop */
    uint64_t write_errors; /* eventfd writes that failed (each was logged) */
    uint64_t drains;       /* batches the loop took from the queue */
    uint64_t run;          /* callbacks and completions run on the loop */
    size_t   max_batch;    /* largest number run in one drain callback */
} ferry_inbox_stats;

/*
 * Read the counters of `loop`'s inbox (or of `inbox`).
 * Thread: any.  Suspends: no.  Returns: 0; -EINVAL; -ESHUTDOWN (loop
 * closed; the inbox variant still reports).
 */
int ferry_loop_inbox_stats_get(ferry_loop *loop, ferry_inbox_stats *out /* OUT */);
int ferry_inbox_stats_get(ferry_inbox *inbox, ferry_inbox_stats *out /* OUT */);

/* Deprecated: the earlier name of ferry_loop_inbox_stats_get(), kept for
 * programs written against it.
 * Thread: any.  Suspends: no.  Returns: as ferry_loop_inbox_stats_get(). */
int ferry_loop_inbox_stats(ferry_loop *loop, ferry_inbox_stats *out /* OUT */);

/* ---- Thread pools ------------------------------------------------------ */

/*
 * A fixed set of threads running blocking calls, fed by a bounded FIFO
 * submission queue.  Several pools may coexist (slow jobs in one pool do
 * not starve fast ones in another).
 */
typedef struct ferry_pool ferry_pool;

typedef struct ferry_pool_opts {
    /* Number of threads; 0 means FERRY_POOL_SIZE from the environment,
     * else max(4, number of CPUs). */
    unsigned threads;
    /* Jobs that may wait in the queue; 0 means 4096. */
    size_t capacity;
    /* Stack size of each thread, bytes; 0 means the system default. */
    size_t stack_size;
} ferry_pool_opts;

/* A job: runs on a pool thread; its return value is the job's status. */
typedef int (*ferry_job_fn)(void *arg);

/*
 * Start a pool.  Its threads start with every signal blocked except those
 * a fault raises, so they never take a signal meant for the process
 * (ferry/signal.h): a job's raise() stays pending on its thread, and a
 * program a job starts inherits that mask unless it is given another.
 * Thread: any.  Suspends: no.
 * Owns: the caller; free with ferry_pool_free().
 * Returns: 0; -ENOMEM (memory or a thread could not be made; nothing left
 * behind); -EINVAL.
 */
int ferry_pool_new(ferry_pool **out /* OUT */, const ferry_pool_opts *opts);

/*
 * Stop a pool: refuse new jobs (-ESHUTDOWN), complete every queued job with
 * -ECANCELED to its waiter or completion callback (they never run), wake
 * tasks waiting for queue room with -ESHUTDOWN, wait for running jobs
 * (abandoned ones included) to end, join the threads, free.  Nothing is
 * silently dropped.  NULL and the default pool are ignored.
 * Thread: any but the pool's own threads.  Blocks while jobs run.  A
 * task's waiter on this loop is woken when its loop runs next.
 */
void ferry_pool_free(ferry_pool *pool);

/* ferry_pool_free_ex() flags. */
#define FERRY_POOL_FREE_LEAVE_ABANDONED 0x1u

/*
 * ferry_pool_free(), and with FERRY_POOL_FREE_LEAVE_ABANDONED it does not
 * wait for abandoned jobs (ferry_to_thread_abandon() whose task left, a
 * stuck lookup): their threads are left to finish them on their own, run
 * each cleanup there exactly once and exit (detached).  Everything else is
 * as ferry_pool_free(): queued jobs complete with -ECANCELED, running jobs
 * that someone waits for are waited for, the other threads exit before the
 * call returns.  The pool's memory goes with the last of its threads;
 * `pool` must not be used once the call began.
 * Thread: any but the pool's own threads.  Suspends: no (blocks while jobs
 * that are not abandoned run).
 * Returns: 0 (also for NULL and the default pool, which are ignored);
 * -EINVAL (an unknown flag: nothing done).
 */
int ferry_pool_free_ex(ferry_pool *pool, unsigned flags);

/*
 * The process-wide default pool, started on first use with the default
 * options (see ferry_pool_opts).  It lives until
 * ferry_pool_default_shutdown() (which ferry_run() calls as it ends); the
 * next use after that starts a new default pool.
 * Thread: any.  Returns: the pool, or NULL if it could not be started.
 */
ferry_pool *ferry_pool_default(void);

/*
 * Shut the default pool down (asyncio's loop.shutdown_default_executor()):
 * it stops being the default at once, then is freed as ferry_pool_free_ex()
 * frees a pool with `flags` (0 or FERRY_POOL_FREE_LEAVE_ABANDONED): queued
 * jobs complete with -ECANCELED, running ones are waited for (abandoned
 * ones too, unless the flag leaves them to finish on their own), the
 * threads are joined and its memory is given back.  A later use of the
 * default pool (NULL pool argument, ferry_pool_default()) starts a new
 * one.  No other thread may be using the old one, or hold the pointer
 * ferry_pool_default() returned, during or after the call: a program calls
 * this when its threads are done with the default pool (ferry_run() calls
 * it, leaving abandoned jobs such as a stuck name lookup, after its loop
 * is freed, when no other loop of the process is alive).
 * Thread: any but the default pool's own threads.  Suspends: no (blocks
 * while jobs run).
 * Returns: 0 (shut down, or there was none); -EDEADLK (called from a
 * thread of the default pool: nothing done); -EINVAL (an unknown flag).
 */
int ferry_pool_default_shutdown(unsigned flags);

/*
 * Run fn(arg) on a thread of `pool` (NULL: the default pool) and suspend
 * the calling task (not the loop) until it ends.  If the submission queue
 * is full the task waits for room (backpressure).
 *
 * Cancellation (and deadlines) while the job is still queued removes it:
 * it never runs and the call returns -ECANCELED (or -ETIMEDOUT).  A job
 * that has started cannot be interrupted: the call keeps waiting, shielded,
 * until fn returns, and then returns fn's status (the job ran: the call
 * took effect; the task's next suspension point reports the cancellation).
 * To stop waiting for a running job, use ferry_to_thread_abandon().
 *
 * Allocates nothing: the job lives on the task's stack.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: fn's status; -ECANCELED, -ETIMEDOUT (never ran: cancelled while
 * queued, or queued when the pool was freed); -ESHUTDOWN (the pool is
 * being freed; never queued); -EDEADLK (never ran: every thread of the
 * pool is blocked waiting for a task on a loop, at submission or while
 * the job waited in the queue, as with a pool job that calls
 * ferry_loop_run_task_sync() whose task offloads to the same pool; a
 * warning is logged.  A thread waiting for a plain callback, in
 * ferry_loop_run_sync() or on the future of ferry_loop_call_threadsafe(),
 * does not count: a callback cannot wait on a pool); -EPERM; -EINVAL (fn
 * NULL); -ENOMEM (the default pool could not be started).
 * Owns: `arg` stays the caller's; it must outlive the call.
 */
int ferry_to_thread(ferry_pool *pool, ferry_job_fn fn, void *arg);

/* Receives the late status of an abandoned job, on the pool thread. */
typedef void (*ferry_job_cleanup)(void *arg, int status);

/*
 * As ferry_to_thread(), but if the task is cancelled (or its deadline
 * passes) while fn runs, the call returns -ECANCELED (or -ETIMEDOUT) at
 * once and abandons the job: fn keeps running and keeps its pool thread
 * until it really ends (the pool never runs more threads than its size),
 * then cleanup(arg, status) runs on that pool thread with fn's status.  If
 * the interruption comes while the job is still queued, fn never runs and
 * cleanup(arg, -ECANCELED or -ETIMEDOUT) runs at once, on the calling task,
 * before the call returns; so does cleanup(arg, -ECANCELED) when the pool
 * is freed while the job is queued.  If the job completes normally,
 * cleanup is not called.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: as ferry_to_thread(); -ENOMEM (the job's state could not be
 * allocated; fn never ran, cleanup not called).
 * Owns: `arg` stays the caller's while the call waits and after any return
 * but -ECANCELED and -ETIMEDOUT.  After those two, cleanup(arg, status) is
 * the last use of `arg` (it has run, or will run exactly once), so fn
 * itself should not return -ECANCELED or -ETIMEDOUT.  cleanup may be NULL.
 */
int ferry_to_thread_abandon(ferry_pool *pool, ferry_job_fn fn, void *arg,
                            ferry_job_cleanup cleanup);

/*
 * Completion of a submitted job: status is fn's, or -ECANCELED if the job
 * never ran (its pool was freed).  A non-zero return is logged and counted
 * (ferry_pool_stats.callback_errors); later jobs are not affected.
 */
typedef int (*ferry_job_done)(void *done_arg, int status);

/*
 * Queue fn(arg) on `pool` (NULL: the default pool) from any thread.  When
 * it ends, done(done_arg, status) runs on `loop`'s thread (loop not NULL)
 * or on the pool thread (loop NULL).  A job submitted to a loop keeps that
 * loop from finishing FERRY_RUN_DEFAULT, and ferry_loop_free() waits for it,
 * so the completion never reaches a freed loop.  If the queue is full the
 * calling thread blocks for room; on a loop's thread it returns -EAGAIN
 * instead (tasks use ferry_to_thread()).
 * Thread: any.  Suspends: no (blocks a thread while the queue is full).
 * Returns: 0 (done will be called exactly once); -EAGAIN; -ESHUTDOWN (pool
 * or loop closed); -EDEADLK (see ferry_to_thread); -ENOMEM; -EINVAL.  On
 * an error nothing was queued and done is not called.
 * Owns: `arg` and `done_arg` stay the caller's; the call to done is ferry's
 * last use of both.
 */
int ferry_pool_submit(ferry_pool *pool, ferry_job_fn fn, void *arg,
                      ferry_loop *loop, ferry_job_done done, void *done_arg);

/* Counters of a pool. */
typedef struct ferry_pool_stats {
    unsigned threads;         /* pool size */
    size_t   capacity;        /* submission queue capacity */
    size_t   queued;          /* jobs waiting now */
    size_t   running;         /* jobs running now, abandoned ones included */
    size_t   abandoned;       /* of `running`: abandoned by their task */
    uint64_t completed;       /* jobs whose fn returned */
    uint64_t cancelled;       /* jobs removed from the queue, never run */
    uint64_t callback_errors; /* completion callbacks that returned non-zero */
    uint64_t stalled;         /* queued jobs found waiting behind busy threads
                               * while others slept, and started by one of those */
} ferry_pool_stats;

/* Thread: any.  Returns: 0; -EINVAL; -ENOMEM (default pool not started). */
int ferry_pool_stats_get(ferry_pool *pool, ferry_pool_stats *out /* OUT */);

/* ---- From a thread into a loop ---------------------------------------- */

/*
 * A thread-side handle on a result computed on a loop: asyncio's
 * concurrent.futures.Future from run_coroutine_threadsafe().
 */
typedef struct ferry_future ferry_future;

/*
 * Run fn(arg) on `loop`: as a new task (ferry_loop_spawn_threadsafe, name
 * from `opts`) or as a plain callback (ferry_loop_call_threadsafe, which
 * must not suspend).  Returns at once with a future for fn's status.
 * Thread: any but `loop`'s own.  Suspends: no.
 * Returns: 0; -EDEADLK (called on the loop's thread: waiting on the result
 * would block the loop that must compute it); -ESHUTDOWN (loop closed);
 * -ENOMEM; -EINVAL.
 * Owns: the caller owns *out; free it with ferry_future_free().  `arg`
 * stays the caller's and must outlive fn.
 */
int ferry_loop_spawn_threadsafe(ferry_loop *loop, ferry_task_fn fn, void *arg,
                                const ferry_task_opts *opts,
                                ferry_future **out /* OUT */);
int ferry_loop_call_threadsafe(ferry_loop *loop, ferry_task_fn fn, void *arg,
                               ferry_future **out /* OUT */);

/*
 * Block until the future is done, at most `timeout` nanoseconds
 * (FERRY_NEVER: no limit; 0: only look), then store fn's status in *status
 * (or why fn never ran: -ECANCELED, -ESHUTDOWN (the loop was freed before
 * fn started, also when its task had been spawned already), -ENOMEM).
 * Thread: any but the loop's own.  Suspends: no (blocks the thread).
 * Returns: 0 (done, *status set); -ETIMEDOUT (not done yet; nothing
 * changed); -EDEADLK (on the loop's thread); -EINVAL.
 */
int ferry_future_wait(ferry_future *fut, int64_t timeout, int *status /* OUT */);

/*
 * ferry_future_wait() for a task: suspend the calling task (not its loop)
 * until the future is done, then store the status in *status as
 * ferry_future_wait() does.  Any number of tasks, of any loops, may await
 * one future.  Awaiting only waits: a task cancelled (or whose deadline
 * passes) while it awaits stops waiting and leaves the future as it was,
 * its task still running; to end that task, ferry_future_cancel() it and
 * await again (ferry_runtime_call() is the call that cancels its remote
 * task and waits for it by itself).  On the loop the future's task runs on
 * too.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: 0 (done, *status set if not NULL); -ECANCELED, -ETIMEDOUT
 * (not waited to the end; nothing changed); -EPERM (not in a task);
 * -EINVAL.
 */
int ferry_future_await(ferry_future *fut, int *status /* OUT, optional */);

/* Thread: any.  Suspends: no.
 * Returns: true once the result is in; false before, and for NULL. */
bool ferry_future_done(ferry_future *fut);

/*
 * Cancel the task behind the future (ferry_task_cancel() on the loop); if
 * it has not started yet it never runs and the status becomes -ECANCELED.
 * A plain callback that has not run yet is skipped the same way; one that
 * has started cannot be interrupted.  The future still completes: wait for
 * it, or free it.
 * Thread: any.  Suspends: no.  Returns: 0; -EINVAL; -ENOMEM.
 */
int ferry_future_cancel(ferry_future *fut);

/* Give the future back; the loop side lets go of it when fn ends.
 * Thread: any.  NULL is ignored. */
void ferry_future_free(ferry_future *fut);

/*
 * Trio's from_thread.run / asyncio's run_coroutine_threadsafe().result():
 * run fn(arg) on `loop` as a task (run_task_sync) or a plain callback
 * (run_sync), block up to `timeout` (FERRY_NEVER: no limit) and store fn's
 * status in *status.  On timeout, fn that has not started never runs and
 * the call returns at once; fn that has started is cancelled (a task; a
 * plain callback cannot be interrupted) and the call waits for it to end,
 * so `arg` is never used after the call returns.
 * Thread: any but the loop's own.  Suspends: no (blocks the thread).
 * Returns: 0 (*status is fn's); -ETIMEDOUT; -EDEADLK (on the loop's
 * thread); -ESHUTDOWN (loop closed or freed before fn started, fn never
 * ran); -ENOMEM; -EINVAL.
 */
int ferry_loop_run_task_sync(ferry_loop *loop, ferry_task_fn fn, void *arg,
                             int64_t timeout, int *status /* OUT, optional */);
int ferry_loop_run_sync(ferry_loop *loop, ferry_task_fn fn, void *arg,
                        int64_t timeout, int *status /* OUT, optional */);

/* ---- Mixed channel: threads and tasks --------------------------------- */

/*
 * A bounded FIFO shared by threads and tasks (Python's janus), of pointers
 * (ferry_chan_new(): the calls below that take a `void *` item) or of
 * elements of any size copied in and out, as ferry_queue does
 * (ferry_chan_new_elem() and the *_elem calls, which take a pointer to the
 * element).  The pointer calls are the element calls for elements that
 * are a `void *`: they work on any channel whose elements have that size,
 * and refuse others with -EINVAL.  Every rule below holds for both:
 * tasks send and receive suspending, threads blocking with a timeout; both
 * sides feel the bound.  Tasks of several loops may use one channel.
 * ferry_chan_close() wakes everyone: sends then fail with -ESHUTDOWN,
 * receives drain what is left and then fail with -ESHUTDOWN.  Every item
 * that a send accepted (returned 0) is received exactly once, or is still
 * in the channel.
 */
typedef struct ferry_chan ferry_chan;

/*
 * Thread: any.  Owns: the caller; free with ferry_chan_free().
 * Returns: 0; -ENOMEM; -EINVAL (capacity 0).
 */
int ferry_chan_new(ferry_chan **out /* OUT */, size_t capacity);

/*
 * A channel of `capacity` elements of `elem_size` bytes each.  In
 * ferry_select(), its send case copies the element `buf` points to and its
 * receive case copies into `buf`.
 * Thread: any.  Owns: the caller; free with ferry_chan_free().
 * Returns: 0; -ENOMEM; -EINVAL (capacity or elem_size 0, or too large).
 */
int ferry_chan_new_elem(ferry_chan **out /* OUT */, size_t capacity, size_t elem_size);

/*
 * The element calls: as ferry_chan_send(), ferry_chan_recv(), the
 * blocking and the try calls below, with the element copied from `item`
 * (send) or into `out` (receive; untouched unless 0 is returned).
 * Thread: as the pointer call of the same name.  Suspends: likewise.
 * Returns: as the pointer call; -EINVAL also for `item` or `out` NULL.
 */
int ferry_chan_send_elem(ferry_chan *ch, const void *item);
int ferry_chan_recv_elem(ferry_chan *ch, void *out /* OUT */);
int ferry_chan_send_elem_blocking(ferry_chan *ch, const void *item, int64_t timeout);
int ferry_chan_recv_elem_blocking(ferry_chan *ch, void *out /* OUT */, int64_t timeout);
int ferry_chan_try_send_elem(ferry_chan *ch, const void *item);
int ferry_chan_try_recv_elem(ferry_chan *ch, void *out /* OUT */);

/* Free a channel nobody waits on any more (close it and let the waiters
 * return first).  Items still inside are the caller's business: they are
 * dropped.  NULL is ignored.  Thread: any. */
void ferry_chan_free(ferry_chan *ch);

/* Refuse further sends and wake every waiter.  Idempotent.
 * Thread: any.  Returns: 0; -EINVAL. */
int ferry_chan_close(ferry_chan *ch);

/*
 * Send from a task: wait while the channel is full.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: 0 (queued); -ECANCELED, -ETIMEDOUT (not queued); -ESHUTDOWN
 * (closed, not queued); -EPERM; -EINVAL.
 */
int ferry_chan_send(ferry_chan *ch, void *item);

/*
 * Receive from a task: wait while the channel is empty.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: 0 (*item set); -ECANCELED, -ETIMEDOUT (nothing taken);
 * -ESHUTDOWN (closed and empty); -EPERM; -EINVAL.
 */
int ferry_chan_recv(ferry_chan *ch, void **item /* OUT */);

/*
 * Send or receive from a plain thread, blocking up to `timeout` ns
 * (FERRY_NEVER: no limit; 0: do not wait).
 * Thread: any thread that does not run a loop (on a loop's thread a wait
 * would block the tasks that could end it: -EDEADLK unless timeout is 0).
 * Suspends: no (blocks the thread).
 * Returns: 0; -EAGAIN (timeout 0 and full / empty: the try-call's answer,
 * nothing sent / taken); -ETIMEDOUT (a positive timeout passed, nothing
 * sent / taken); -ESHUTDOWN; -EDEADLK; -EINVAL.
 */
int ferry_chan_send_blocking(ferry_chan *ch, void *item, int64_t timeout);
int ferry_chan_recv_blocking(ferry_chan *ch, void **item /* OUT */, int64_t timeout);

/*
 * Send or receive without waiting, from anywhere.
 * Thread: any.  Suspends: no.
 * Returns: 0; -EAGAIN (full / empty); -ESHUTDOWN (closed; for recv: and
 * empty); -EINVAL.
 */
int ferry_chan_try_send(ferry_chan *ch, void *item);
int ferry_chan_try_recv(ferry_chan *ch, void **item /* OUT */);

/* Thread: any.  Suspends: no.
 * Returns: the items in the channel now (a snapshot); 0 for NULL. */
size_t ferry_chan_len(ferry_chan *ch);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_BRIDGE_H */
