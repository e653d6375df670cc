/* ferry/loop.h - the event loop: run, stop, call_soon, call_later, time.
 *
 * A loop runs on one thread: the thread that created it.  Every function
 * here that takes a loop must be called on that thread, otherwise it
 * returns -EPERM.  To reach a loop from another thread, see ferry/bridge.h.
 *
 * A NULL loop.  Every call of ferry that takes a loop argument takes NULL
 * for the calling thread's current loop (ferry_loop_current(): the loop
 * running on this thread, or else the first one made on it and not yet
 * freed), and returns -EINVAL (NULL for a call that returns a pointer) on
 * a thread that has none.  This holds for the calls that any thread may
 * make too (ferry/bridge.h): there NULL is the caller's own loop, which a
 * call that waits for a loop refuses with -EDEADLK.  Three calls differ:
 * ferry_loop_free(NULL) does nothing, ferry_loop_is_current(NULL) is
 * false, and ferry_pool_submit()'s `loop` NULL means the job's completion
 * runs on the pool thread (ferry/bridge.h).
 */
#ifndef FERRY_LOOP_H
#define FERRY_LOOP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/version.h"

#ifdef __cplusplus
extern "C" {
#endif

struct event_base;

typedef struct ferry_loop ferry_loop;
typedef struct ferry_timer ferry_timer;
typedef void (*ferry_cb)(void *arg);

/* ---- Version --------------------------------------------------------- */

/*
 * The version of the library running (FERRY_VERSION of the build it came
 * from), to compare with the FERRY_VERSION the program was compiled with
 * (ferry/version.h).
 * Thread: any.  Suspends: no.
 * Returns: "MAJOR.MINOR.PATCH", a static string.
 */
const char *ferry_version(void);

/*
 * Thread: any.  Suspends: no.
 * Returns: the running library's FERRY_VERSION_NUMBER (MAJOR * 10000 +
 * MINOR * 100 + PATCH).
 */
int ferry_version_number(void);

/* ---- Time ------------------------------------------------------------ */

/* Monotonic nanoseconds.  Durations and deadlines are int64_t nanoseconds. */
#define FERRY_NSEC(n) ((int64_t)(n))
#define FERRY_USEC(n) ((int64_t)(n) * 1000)
#define FERRY_MSEC(n) ((int64_t)(n) * 1000000)
#define FERRY_SEC(n)  ((int64_t)(n) * 1000000000)
/* A deadline that never passes. */
#define FERRY_NEVER   INT64_MAX

/*
 * The monotonic clock (CLOCK_MONOTONIC) in nanoseconds, or, on the thread
 * of a loop with a virtual clock (ferry_loop_opts.virtual_clock), that
 * loop's virtual time: the loop current on the thread (the one running,
 * else the one last run or made there) decides.  Every deadline and
 * timeout of a task is on this clock.  On other threads it is the real
 * clock, and their timeouts run in real time.
 * Thread: any.  Suspends: no.  Returns: the time now, in nanoseconds.
 */
int64_t ferry_now(void);

/* ---- Loop ------------------------------------------------------------ */

typedef struct ferry_loop_opts {
    /* An event_base the application already runs, or NULL to let the loop
     * create and own one.  An attached loop drives its tasks from events of
     * its own in that base, interleaved with the application's events.
     *
     * Other threads (pool jobs ending, posts) wake the loop through that
     * base, which takes libevent's lock on the base: libevent gives a base
     * one only if it is made while thread callbacks are installed.  ferry
     * installs them itself (its own, on pthreads) when the program starts,
     * so a base made in main() has its lock, and evthread_use_pthreads() is
     * not needed (called anyway, libevent keeps ferry's callbacks and
     * prints that they cannot be changed).  A base without its lock is
     * refused with -EINVAL: one made before ferry's setup (in a constructor
     * that ran first, or before a library linking ferry was loaded), or
     * with EVENT_BASE_FLAG_NOLOCK; make the base after the first ferry call
     * instead.  If the application installed libevent thread callbacks of
     * its own before ferry's setup, ferry keeps them and cannot check a
     * base (it logs a warning once): make the base after installing them,
     * as libevent requires. */
    struct event_base *base;
    /* Default stack size of tasks, in bytes; 0 means FERRY_STACK_DEFAULT. */
    size_t stack_size;
    /* Number of free stacks kept for reuse; 0 means 1024.  Free stacks
     * above it give their memory back when the loop next waits, or about
     * 100 ms later while it stays busy. */
    size_t stack_cache;
    /* I/O and timers are polled at least once every this many task steps;
     * 0 means 128. */
    unsigned io_interval;
    /* A virtual clock, for tests of timeouts: the loop's time (ferry_now()
     * on its thread, every deadline, sleep and ferry_call_later()) starts
     * at the real time when the loop is made and stands still while tasks
     * run.  When the loop would block, it first polls without blocking;
     * if nothing became ready, no task waits for a pool job
     * (ferry_to_thread() and its variants, room in a pool's queue) and no
     * post, completion or job callback from another thread is pending,
     * its time jumps to the earliest deadline and that timer fires.  A
     * task waiting for a descriptor or a signal does not stop a jump: a
     * read with a deadline times out at once, in real time, if no data is
     * there when the loop falls idle.  A call from a thread into the loop
     * (ferry_loop_call_soon_threadsafe(), ferry_loop_run_sync(), a channel
     * send that wakes a task) stops jumps from when it is made until the
     * loop has run it, not before: the loop cannot know that it will come.
     * Other threads' ferry_now() and timeouts stay on the real clock.  Not
     * with `base` (-EINVAL): only ferry_loop_run() can jump. */
    bool virtual_clock;
    /* Schedule fuzzing, for tests (docs/fuzzing.md): not 0 turns it on with
     * this seed.  Ready tasks then run in an order drawn from the seed,
     * suspension points that would not suspend sometimes do, and pool
     * threads and posters sleep short random whiles.  FERRY_FUZZ=SEED[,P]
     * in the environment overrides both fuzz fields.  0 means off. */
    uint64_t fuzz_seed;
    /* With fuzz_seed: the probability, from 0 to 1, of each spurious
     * suspension and each delay on a thread; 0 means 0.1, and a negative
     * value means none (only the order of ready tasks is drawn).  Above 1
     * is -EINVAL. */
    double fuzz_prob;
} ferry_loop_opts;

/*
 * Create a loop bound to the calling thread.  On an error nothing is left
 * allocated or open.
 * Thread: any, not in a task.  Suspends: no.
 * Owns:   the caller; free with ferry_loop_free().
 * Returns: 0; -ENOMEM (out of memory, also when libevent could not give
 * the loop's own base its lock); -EINVAL (bad opts, or opts->base has no
 * lock: see ferry_loop_opts.base); -EMFILE, -ENFILE (no descriptor left
 * for the loop's timerfd or eventfd); -EPERM (called from a task).
 */
int ferry_loop_new(ferry_loop **out /* OUT */, const ferry_loop_opts *opts);

/*
 * Cancel every live task, let each finish its cleanup, run every accepted
 * callback (also those posted from other threads), then free the loop.  An
 * attached event_base is left to its owner.  NULL is ignored.
 * Thread: loop, not in a task.  A task that ignores cancellation forever
 * keeps this call from returning.
 */
void ferry_loop_free(ferry_loop *loop);

/* ferry_loop_run() modes. */
enum {
    FERRY_RUN_DEFAULT = 0, /* until stopped, or no task, callback, timer or reference is left */
    FERRY_RUN_FOREVER = 1, /* until ferry_loop_stop() */
    FERRY_RUN_ONCE    = 2, /* one turn: run what is ready, poll I/O without blocking */
};

/*
 * Run the loop on the calling thread.
 * Thread: loop, not in a task.  Returns: 0; -EPERM (wrong thread, or called
 * from inside the loop); -EINVAL (bad mode).
 */
int ferry_loop_run(ferry_loop *loop, int mode);

/*
 * Make ferry_loop_run() return after the current turn.  From another
 * thread, use ferry_loop_stop_threadsafe() (ferry/bridge.h).
 * Thread: loop.  Returns: 0; -EPERM.
 */
int ferry_loop_stop(ferry_loop *loop);

/*
 * Keep FERRY_RUN_DEFAULT running although nothing else is left (a server
 * waiting for connections, a loop fed by other threads).  Counted.
 * Thread: loop.  Returns: 0; -EPERM; -EINVAL (unref below zero).
 */
int ferry_loop_ref(ferry_loop *loop);
int ferry_loop_unref(ferry_loop *loop);

/* The loop's event_base (owned by the loop unless it was attached).
 * Thread: loop.  Suspends: no.
 * Returns: the base; NULL from another thread. */
struct event_base *ferry_loop_base(ferry_loop *loop);

/* Thread: any.  Suspends: no.
 * Returns: the loop that runs on the calling thread, or NULL. */
ferry_loop *ferry_loop_current(void);

/* Thread: any.  Suspends: no.
 * Returns: true when called on the thread that owns `loop`. */
bool ferry_loop_is_current(const ferry_loop *loop);

/*
 * Run cb(arg) on the loop in a later turn.  Callbacks run in the order they
 * were scheduled; one may schedule more, which run in the next turn.
 * `loop` NULL: the current loop (the rule above).
 * Thread: loop.  Returns: 0; -EPERM; -ENOMEM (nothing scheduled);
 * -EINVAL (cb NULL, or loop NULL and no current loop).
 */
int ferry_call_soon(ferry_loop *loop, ferry_cb cb, void *arg);

/*
 * Run cb(arg) once, `delay` nanoseconds from now (0 or less: next turn).
 * `out`, if not NULL, receives a handle for ferry_timer_cancel(); the
 * handle is valid until the callback has started or the timer is cancelled.
 * `loop` NULL: the current loop (the rule above).
 * Thread: loop.  Returns: 0; -EPERM; -ENOMEM; -EINVAL (cb NULL, or loop
 * NULL and no current loop).
 */
int ferry_call_later(ferry_loop *loop, int64_t delay, ferry_cb cb, void *arg,
                     ferry_timer **out /* OUT, optional */);

/*
 * Move a virtual clock forward by `duration` nanoseconds (0 or more) by
 * hand, as if that much time had passed, and make ready what is due by
 * then; the loop's own jumps go on as before.
 * Thread: loop.  Suspends: no.
 * Returns: 0; -EPERM (wrong thread); -EINVAL (loop NULL, no virtual
 * clock, or duration negative).
 */
int ferry_loop_advance(ferry_loop *loop, int64_t duration);

/*
 * Cancel a timer that has not fired: its callback never runs and the handle
 * is freed.  Thread: loop.  Returns: 0; -EPERM; -EINVAL (NULL).
 */
int ferry_timer_cancel(ferry_timer *timer);

/* ---- Diagnostics ----------------------------------------------------- */

/* Severity of a log line. */
enum { FERRY_LOG_WARN = 1, FERRY_LOG_ERROR = 2 };

/* Receives ferry's diagnostics (blocked loop, stack overflow, failed
 * eventfd write).  Default: one line on stderr. */
typedef void (*ferry_log_fn)(int level, const char *msg, void *ctx);

/* Replace the log hook process-wide; NULL restores stderr.
 * Thread: any, but set it before loops run. */
void ferry_set_log(ferry_log_fn fn, void *ctx);

/*
 * Report every task step or callback that runs longer than `threshold`
 * nanoseconds (0 turns the detector off), with the task's name.  Default:
 * 100 ms in builds without NDEBUG, off otherwise.
 * Thread: loop.  Returns: 0; -EPERM; -EINVAL (negative).
 */
int ferry_loop_set_slow_threshold(ferry_loop *loop, int64_t threshold);

/* Counters of one loop. */
typedef struct ferry_loop_stats {
    uint64_t turns;        /* scheduler turns run */
    uint64_t steps;        /* task steps and callbacks run */
    uint64_t polls;        /* I/O polls made */
    uint64_t slow_steps;   /* steps over the slow threshold */
    size_t   live_tasks;   /* tasks not yet finished */
    size_t   stacks_cached;/* free stacks kept for reuse */
    uint64_t handoffs;     /* of the steps, those begun without the scheduler:
                            * a task handing the CPU straight to the next
                            * task of the turn, or a lone task going on after
                            * a yield.  Never while a stop is pending or the
                            * blocked-loop detector times steps. */
    /* How the loop's streams and listeners do their I/O (docs/io_uring.md):
     * "epoll", "io_uring", or NULL before the loop's first stream or
     * listener. */
    const char *io_backend;
    /* Why io_uring was asked for (FERRY_IO=uring) and the loop uses epoll:
     * a short reason, or NULL. */
    const char *io_fallback;
    int      io_fallback_err;  /* the errno of that reason, or 0 */
    uint64_t io_submits;       /* io_uring: submission system calls made */
    uint64_t io_completions;   /* io_uring: completions reaped */
    uint64_t io_buf_empty;     /* io_uring: receives that found no free
                                * buffer in the loop's buffer ring */
    uint64_t io_recv_multishot; /* io_uring: multishot receives armed (0
                                 * where the kernel has no capped ones) */
    uint64_t io_bufs_held;     /* io_uring: receive buffers the streams
                                * hold now, their bytes not yet read */
    uint64_t io_accept_multishot; /* io_uring: multishot accepts armed */
} ferry_loop_stats;

/* Copy the loop's counters to *out.
 * Thread: loop.  Suspends: no.  Returns: 0; -EPERM; -EINVAL. */
int ferry_loop_stats_get(ferry_loop *loop, ferry_loop_stats *out /* OUT */);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_LOOP_H */
