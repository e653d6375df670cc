/* ferry/watch.h - a kit for driving callback-style C libraries on a loop.
 *
 * Libraries such as libcurl (multi_socket), c-ares, libssh2 or libpq do no
 * I/O waiting of their own: they say which descriptors they want watched,
 * for what, and when they next want a call for their timeouts, and expect
 * to be told when a descriptor is ready or the time has come.  A watch
 * turns those two kinds of callback into registrations on the loop and one
 * loop timer, and calls the adapter's driver back on the loop:
 *
 *   library's socket callback  -> ferry_watch_fd() / ferry_watch_fd_remove()
 *   library's timer callback   -> ferry_watch_timer()
 *   descriptor ready           -> ops->ready(w, fd, events, arg)
 *   timer due                  -> ops->timeout(w, arg)
 *
 * The rules that make it safe, which each library's users learnt the hard
 * way (docs/watch.md has the stories):
 *   - ferry_watch_fd(), _fd_remove() and _timer() only record; they never
 *     call the driver.  So a library callback that calls them never finds
 *     itself re-entered.  The driver is called only from the loop (an
 *     event or the timer), never from inside another driver call, and a
 *     zero timeout runs in a later turn, not at once.
 *   - ferry_watch_fd_remove() unregisters at once, so a library that
 *     closes the descriptor right after, and opens a new one that gets the
 *     same number, starts from a clean registration.  Each registration
 *     has a generation: nothing the old one armed reaches the new one.
 *   - A descriptor that the loop reports ready again and again while the
 *     library consumes nothing from it (a connection that has gone idle,
 *     or been closed by its peer, and is still watched) is parked: no
 *     longer watched until the library states its interest again, or for
 *     a back-off that doubles up to a second.  It costs a few wake-ups,
 *     not a core.
 *
 * An operation a task waits for (a transfer, a query) is a ferry_watch_op
 * on the task's stack: the task suspends in ferry_watch_op_wait(), the
 * driver completes it with ferry_watch_op_done().
 *
 * A watch belongs to one loop and everything here runs on that loop's
 * thread.  A watch made with a key is found again with ferry_watch_get(),
 * so an adapter keeps one library instance per loop; a watch still alive
 * when its loop is freed gets ops->teardown() and is freed with the loop.
 */
#ifndef FERRY_WATCH_H
#define FERRY_WATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "ferry/detail.h"
#include "ferry/loop.h"

/* ---- Watch ---------------------------------------------------------- */

typedef struct ferry_watch ferry_watch;

/* The adapter's side of a watch.  Each is called on the loop's thread,
 * outside any task (they must not suspend), never from inside another
 * call of the same watch. */
typedef struct ferry_watch_ops {
    /* `fd` is ready: `events` holds FERRY_READ and/or FERRY_WRITE, what
     * the library asked for and the loop saw.  Required. */
    void (*ready)(ferry_watch *w, int fd, int events, void *arg);
    /* The time set with ferry_watch_timer() has come.  Required. */
    void (*timeout)(ferry_watch *w, void *arg);
    /* The loop is being freed with the watch alive: free the library's
     * state (its callbacks may still call this watch's functions), but not
     * the watch, which ferry frees after.  Optional. */
    void (*teardown)(ferry_watch *w, void *arg);
} ferry_watch_ops;

/* Counters of a watch, for tests and diagnostics. */
typedef struct ferry_watch_stats {
    uint64_t ready_calls;    /* ops->ready() calls */
    uint64_t timeout_calls;  /* ops->timeout() calls */
    uint64_t parks;          /* times a descriptor was parked (see the top) */
    uint64_t stale;          /* readiness dropped because its registration was
                              * removed or replaced first */
    unsigned fds;            /* descriptors registered now */
    unsigned parked;         /* of those, parked now */
} ferry_watch_stats;

/*
 * Make a watch on `loop`.  With `key` not NULL (any address the adapter
 * owns, such as a static variable), ferry_watch_get(loop, key) finds it,
 * and there can be only one such watch per loop and key.  `arg` is passed
 * to every op.
 * Thread: loop.  Suspends: no.  Owns: the caller; free with
 * ferry_watch_free(), or leave it to ferry_loop_free().
 * Returns: 0; -ENOMEM (nothing made); -EEXIST (a watch with that key
 * exists); -EINVAL (ops incomplete); -EPERM (not on the loop's thread).
 */
int ferry_watch_new(ferry_watch **out /* OUT */, ferry_loop *loop, const void *key,
                    const ferry_watch_ops *ops, void *arg);

/* Thread: loop.  Suspends: no.
 * Returns: the watch of `loop` made with `key`; NULL if there is none
 * (or off the loop's thread). */
ferry_watch *ferry_watch_get(ferry_loop *loop, const void *key);

/* Thread: any.  Suspends: no.  Returns: the loop of `w`. */
ferry_loop *ferry_watch_loop(const ferry_watch *w);

/* Thread: any.  Suspends: no.  Returns: the `arg` `w` was made with (the
 * adapter's state for the loop, found again with ferry_watch_get()). */
void *ferry_watch_arg(const ferry_watch *w);

/*
 * Unregister every descriptor, stop the timer and free the watch (ops are
 * not called).  Called from inside one of its own ops, the watch is freed
 * when that op returns and no op is called meanwhile.  NULL is a no-op.
 * Thread: loop.  Suspends: no.
 */
void ferry_watch_free(ferry_watch *w);

/*
 * The library wants `fd` watched for `events` (FERRY_READ, FERRY_WRITE,
 * both, or 0: keep the descriptor known but do not watch it).  The first
 * call for a descriptor registers it; later ones change what is watched
 * and wake it from parking.  Safe from inside the library's callbacks.
 * Thread: loop.  Suspends: no.
 * Returns: 0; -ENOMEM (nothing changed); -EINVAL (fd < 0 or unknown bits);
 * -EBADF (the loop refuses the descriptor).
 */
int ferry_watch_fd(ferry_watch *w, int fd, int events);

/*
 * The library no longer uses `fd` (it may close it next, or keep it idle
 * and bring it back later): unregister it now.  Unknown descriptors are
 * ignored.  Safe from inside the library's callbacks.
 * Thread: loop.  Suspends: no.  Returns: 0; -EINVAL (fd < 0).
 */
int ferry_watch_fd_remove(ferry_watch *w, int fd);

/*
 * The library wants ops->timeout() in `delay` nanoseconds (0: in a later
 * turn, never at once); a negative delay clears the timer.  Replaces the
 * previous time.  Safe from inside the library's callbacks.
 * Thread: loop.  Suspends: no.
 * Returns: 0; -ENOMEM (the timer could not be set; the old one is gone).
 */
int ferry_watch_timer(ferry_watch *w, int64_t delay);

/*
 * Tell the watch that the library did useful work on the descriptor being
 * delivered (moved bytes, finished an operation): it is not spinning.
 * Optional; the watch also measures what the library consumed.
 * Thread: loop.  Suspends: no.
 */
void ferry_watch_progress(ferry_watch *w);

/* Thread: loop.  Suspends: no.
 * Returns: true while one of w's ops runs (the library is being driven:
 * do not call into it). */
bool ferry_watch_busy(const ferry_watch *w);

/* Thread: loop.  Suspends: no.  Returns: 0; -EINVAL. */
int ferry_watch_stats_get(const ferry_watch *w, ferry_watch_stats *out /* OUT */);

/* ---- Operation ------------------------------------------------------ */

/* One operation a task waits for.  Lives where the task can reach it
 * (usually its stack) until ferry_watch_op_wait() has returned. */
typedef struct ferry_watch_op {
    /* private: use the functions below */
    struct ferry__waitq waiters;  /* the task waiting for it */
    int                 result;   /* ferry_watch_op_done()'s result */
    bool                done;     /* completed */
} ferry_watch_op;

/* All-zero is a pending operation. */
#define FERRY_WATCH_OP_INIT {0}

/* Thread: any.  Suspends: no. */
void ferry_watch_op_init(ferry_watch_op *op);

/*
 * Wait until the driver completes `op`.  An operation completed before
 * the task was woken by a cancellation or deadline counts as completed.
 * Thread: loop, in a task.  Suspends: yes (not if already done).
 * Returns: 0 (done: read ferry_watch_op_result()); -ECANCELED,
 * -ETIMEDOUT (not done: the caller withdraws the operation from the
 * library before its storage goes); -EPERM (not in a task).
 */
int ferry_watch_op_wait(ferry_watch_op *op);

/*
 * Complete `op` with `result` and wake its task.  Completing twice keeps
 * the first result.  Thread: loop.  Suspends: no.
 */
void ferry_watch_op_done(ferry_watch_op *op, int result);

/* Thread: loop.  Suspends: no.  Returns: whether `op` is done. */
bool ferry_watch_op_is_done(const ferry_watch_op *op);

/* Thread: loop.  Suspends: no.  Returns: the result `op` was completed
 * with (0 while pending). */
int ferry_watch_op_result(const ferry_watch_op *op);

#endif /* FERRY_WATCH_H */
