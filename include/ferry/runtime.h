/* ferry/runtime.h - a runtime of N loops on N threads, and the calls
 * between them.
 *
 * A runtime is N ordinary loops, one per thread, started and stopped as
 * one: loop 0 on the thread that makes the runtime, loops 1 to N-1 on
 * threads of their own.  Everything of ferry/loop.h, ferry/task.h and the
 * primitives still belongs to one loop: a lock, a queue, a stream or a
 * task of loop 1 used from a task of loop 2 gives -EPERM, as between any
 * two loops.  The ways across are the cross-loop call below, futures of
 * tasks spawned on another loop (ferry_runtime_spawn(), awaited with
 * ferry_future_await() or in ferry_select()), the mixed channel
 * (ferry_chan, ferry/bridge.h) and, for blocking work, the pools, which
 * every loop shares.
 *
 * docs/runtime.md tells the whole contract and how it works.
 */
#ifndef FERRY_RUNTIME_H
#define FERRY_RUNTIME_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "ferry/bridge.h"
#include "ferry/loop.h"
#include "ferry/stream.h"
#include "ferry/task.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ferry_runtime ferry_runtime;

/* The most loops a runtime may have. */
#define FERRY_RUNTIME_MAX_LOOPS 1024

typedef struct ferry_runtime_opts {
    /* Number of loops; 0 means FERRY_LOOPS from the environment if set,
     * else the number of CPUs this process may run on (its affinity mask,
     * sched_getaffinity()).  At most FERRY_RUNTIME_MAX_LOOPS. */
    unsigned loops;
    /* Pin loop i's thread to the i-th CPU of the affinity mask (counted
     * modulo their number).  Loop 0's thread is the caller's: it gets its
     * own mask back when ferry_runtime_free() returns. */
    bool pin;
    /* Calls in flight from one loop to another (ferry_runtime_call())
     * before a further caller on the first loop waits for one of them to
     * end; 0 means 128. */
    unsigned call_cap;
    /* The options of every loop.  `base` must be NULL: each loop makes its
     * own.  A fuzzing seed is mixed with the loop's index, so the loops
     * draw different schedules from one seed. */
    ferry_loop_opts loop;
} ferry_runtime_opts;

/*
 * Make a runtime: loop 0 on the calling thread (as ferry_loop_new()
 * makes a loop), loops 1 to N-1 each on a new thread that runs it until
 * ferry_runtime_free().  Loops 1 to N-1 run from the start: calls and
 * spawns reach them at once.  Loop 0 runs inside ferry_runtime_run() and
 * ferry_runtime_free(); calls to it wait until then.  On an error nothing
 * is left: no thread, no loop.
 * Thread: any, not in a task.  Suspends: no.
 * Owns: the caller; free with ferry_runtime_free() on the same thread.
 * Returns: 0; -ENOMEM (memory, a loop or a thread could not be made);
 * -EINVAL (more than FERRY_RUNTIME_MAX_LOOPS loops, opts->loop.base set,
 * other bad loop options; pinning to a CPU the kernel refused); -EMFILE,
 * -ENFILE (no descriptor for a loop); -EPERM (called from a task).
 */
int ferry_runtime_new(ferry_runtime **out /* OUT */, const ferry_runtime_opts *opts);

/*
 * Run main(arg) as a task named "main" on loop 0 and run loop 0 until it
 * ends (ferry_run()'s way), then store its status in *status.  The other
 * loops keep running, and tasks left on loop 0 stay as they are, for a
 * later run or ferry_runtime_free().  May be called again.
 * Thread: loop 0's (the one that made the runtime), not in a task and not
 * inside ferry_loop_run().  Suspends: no (blocks the thread).
 * Returns: 0 (main ran, *status set if not NULL); -ESHUTDOWN
 * (ferry_runtime_stop() was called: main not started); -ENOMEM (main could
 * not be spawned); -EPERM (another thread, in a task, or already running);
 * -EINVAL.
 */
int ferry_runtime_run(ferry_runtime *rt, ferry_task_fn main, void *arg,
                      int *status /* OUT, optional */);

/*
 * Ask the runtime to stop: the main task of a running ferry_runtime_run()
 * is cancelled (its cancellation reaches whatever it awaits: calls,
 * ferry_runtime_on_all()), and later runs return -ESHUTDOWN.  Returns at
 * once; ferry_runtime_run() returns once main has ended.  Several calls
 * count as one.  Allocates nothing.
 * Thread: any, until ferry_runtime_free() begins.  Suspends: no.
 * Returns: 0; -EINVAL (rt NULL).
 */
int ferry_runtime_stop(ferry_runtime *rt);

/*
 * Stop every loop and free the runtime: on every loop at once, every live
 * task is cancelled and waited for, the callbacks already accepted run
 * and the loop is freed, as ferry_loop_free() does (a task that ignores
 * its cancellation holds the return); then the threads are joined.  Calls
 * between loops that are stopping end as docs/runtime.md says: a task
 * waiting for a call is cancelled, and the call still waits for the
 * remote task's end; a call that reaches a loop after its tasks were
 * cancelled returns -ESHUTDOWN.  The default pool is left alone (see
 * ferry_run_loops()).  NULL is ignored.
 * Thread: loop 0's, not in a task and not inside ferry_runtime_run().
 * Suspends: no (blocks the thread until every loop has ended).
 */
void ferry_runtime_free(ferry_runtime *rt);

/*
 * ferry_run() for N loops: make a runtime of `loops` loops (0: as
 * ferry_runtime_opts.loops = 0), run main(arg) on loop 0 until it ends,
 * log each task still alive on any loop (one FERRY_LOG_WARN line each, as
 * ferry_run() does), free the runtime, and, when no other loop is alive in
 * the process, shut the default pool down
 * (FERRY_POOL_FREE_LEAVE_ABANDONED).  With FERRY_VIRTUAL_CLOCK=1 in the
 * environment every loop has a virtual clock of its own.
 * Thread: any, not in a task.  Suspends: no (blocks the thread).
 * Returns: main's status; as ferry_runtime_new() if the runtime could not
 * be made; -ENOMEM if main could not be spawned; -EINVAL (main NULL).
 */
int ferry_run_loops(unsigned loops, ferry_task_fn main, void *arg);

/* ---- Which loop ------------------------------------------------------- */

/* Thread: any.  Suspends: no.
 * Returns: the runtime of the loop current on the calling thread
 * (ferry_loop_current()), or NULL if that loop is in no runtime. */
ferry_runtime *ferry_runtime_current(void);

/* Thread: any.  Suspends: no.
 * Returns: the number of loops of `rt` (NULL: the caller's runtime); 0 if
 * there is none. */
unsigned ferry_runtime_size(const ferry_runtime *rt);

/*
 * The index of `loop` (NULL: the loop current on the calling thread) in
 * `rt` (NULL: that loop's runtime), from 0 to ferry_runtime_size() - 1.
 * Thread: any.  Suspends: no.
 * Returns: the index; -ENOENT (the loop is not one of rt's, or there is no
 * such loop or runtime).
 */
int ferry_runtime_index(const ferry_runtime *rt, const ferry_loop *loop);

/*
 * Loop `index` of `rt` (NULL: the caller's runtime).  The pointer stays
 * valid until ferry_runtime_free() begins; other threads use it only as
 * ferry/bridge.h allows (calls and spawns of this header do not need it).
 * Thread: any.  Suspends: no.
 * Returns: the loop; NULL if there is no such runtime or index.
 */
ferry_loop *ferry_runtime_loop(ferry_runtime *rt, unsigned index);

/* ---- The cross-loop call ---------------------------------------------- */

/*
 * The function a call runs on the target loop.  Its return value is its
 * own status, which ferry never interprets; *result (NULL when fn starts)
 * is handed back to the caller as it is.
 */
typedef int (*ferry_call_fn)(void *arg, void **result /* OUT */);

/* ferry_runtime_call() flags. */
#define FERRY_CALL_CALLBACK 0x1u  /* run fn as a plain callback (it must not
                                   * suspend), not as a task */

/*
 * Run fn(arg) on loop `index` of `rt` (NULL: the caller's runtime) and
 * suspend the calling task, not its loop, until fn has ended there.
 * fn runs as a new task named "call" (with FERRY_CALL_CALLBACK: as a plain
 * callback on that loop's thread).  On the caller's own loop it runs
 * inline: in the calling task (with FERRY_CALL_CALLBACK likewise), after
 * the cancellation point, with nothing posted.
 *
 * Cancellation and deadlines reach fn.  fn's task runs inside a scope
 * with the caller's deadline (the earliest of its scopes, kept in time
 * left if a loop has a virtual clock).  If the caller is cancelled, or a
 * deadline of its scopes passes, before fn started, fn never runs and the
 * call returns -ECANCELED or -ETIMEDOUT.  If fn's task has started, it is
 * cancelled on its loop and the call waits, shielded, until fn has ended:
 * no task is left running for nobody, and `arg` is never used after the
 * call returns.  A plain callback that has started cannot be interrupted:
 * the call waits for it.  The caller's cancellation is then reported by
 * its next suspension point.
 *
 * Backpressure.  At most ferry_runtime_opts.call_cap calls run from one
 * loop to another at once; a further caller on that loop waits (in this
 * call, a cancellation point) until one of them ends.  A call allocates
 * nothing: its state lives on the caller's stack, and it reaches the
 * other loop through that loop's inbox.
 *
 * fn's status and result come back apart from ferry's: the call returns 0
 * exactly when fn ran to its end, and then *status is fn's return value
 * and *result (if not NULL) what fn stored.  Any other return means fn
 * never ran.
 *
 * Thread: loop, in a task of one of rt's loops.  Suspends: yes.
 * Returns: 0 (fn ran; *status and *result set); -ECANCELED, -ETIMEDOUT
 * (fn never ran: the caller was interrupted before fn started, or while
 * waiting for room); -ESHUTDOWN (fn never ran: the target loop was
 * stopping or stopped before fn started, also when its task had been
 * spawned); -ENOMEM (fn's task could not be made there); -EPERM (not in a
 * task of a loop of rt); -EINVAL (index out of range, fn or status NULL,
 * an unknown flag).  *status and *result are left alone unless the call
 * returns 0.
 * Owns: `arg` stays the caller's; it must outlive the call.
 */
int ferry_runtime_call(ferry_runtime *rt, unsigned index, ferry_call_fn fn, void *arg,
                       unsigned flags, int *status /* OUT */,
                       void **result /* OUT, optional */);

/*
 * Start fn(arg) as a task on loop `index` of `rt` (NULL: the caller's
 * runtime; `opts` for its name and stack, flags ignored) and return at
 * once with a future for its status: a task awaits it with
 * ferry_future_await() or in ferry_select() (FERRY_CASE_FUTURE), a thread
 * waits with ferry_future_wait(); ferry_future_cancel() cancels the task.
 * Also on the caller's own loop.  Unlike ferry_runtime_call(), nothing
 * waits for the task: it runs on until it ends or its loop is freed, which
 * cancels it.
 * Thread: any.  Suspends: no.
 * Returns: 0; -ESHUTDOWN (the loop is closed); -ENOMEM; -EINVAL.
 * Owns: the caller owns *out; free it with ferry_future_free().  `arg`
 * stays the caller's and must outlive fn.
 */
int ferry_runtime_spawn(ferry_runtime *rt, unsigned index, ferry_task_fn fn, void *arg,
                        const ferry_task_opts *opts, ferry_future **out /* OUT */);

/*
 * Run fn(arg) as a task on every loop of `rt` (NULL: the caller's runtime)
 * at once, through ferry_runtime_call(), and wait until all have ended: a
 * server's accept loop per core.  fn learns its loop with
 * ferry_runtime_index(NULL, NULL).  A fn that returns a non-zero status
 * stops nothing; if fn cannot run on one loop (-ESHUTDOWN, -ENOMEM), or
 * the caller is cancelled or times out, fn is cancelled on every loop and
 * the call returns once every one of them has ended.
 * Thread: loop, in a task of one of rt's loops.  Suspends: yes.
 * Returns: 0 (fn ran on every loop; statuses[i], if `statuses` is not
 * NULL, is its status on loop i); -ECANCELED, -ETIMEDOUT (the caller was
 * interrupted); -ESHUTDOWN, -ENOMEM (fn could not run on a loop); -EPERM;
 * -EINVAL (fn NULL).  On an error `statuses` is left alone.
 * Owns: `arg` stays the caller's; every loop's fn shares it.
 */
int ferry_runtime_on_all(ferry_runtime *rt, ferry_task_fn fn, void *arg,
                         int *statuses /* OUT, optional: one per loop */);

/* ---- Load, statistics, dump ------------------------------------------- */

/*
 * A figure per loop that any thread may read, for spreading work over the
 * loops (the less loaded of two loops): what it counts is up to the code
 * that adds to it, such as the connections a loop serves.  It starts at 0.
 * Thread: any.  Suspends: no.
 * Returns: 0; -EINVAL (no such runtime or index).
 */
int ferry_runtime_load_add(ferry_runtime *rt, unsigned index, int64_t delta);

/* Thread: any.  Suspends: no.
 * Returns: loop `index`'s figure (a relaxed snapshot); 0 if there is no
 * such runtime or index. */
int64_t ferry_runtime_load(const ferry_runtime *rt, unsigned index);

/* Counters of one loop of a runtime, or of all of them added up. */
typedef struct ferry_runtime_stats {
    ferry_loop_stats loop;     /* ferry_loop_stats_get() of the loop (sums) */
    uint64_t calls_out;        /* calls its tasks made to other loops */
    uint64_t calls_in;         /* calls from other loops that reached it */
    uint64_t calls_inline;     /* calls to its own loop, run inline */
    uint64_t call_waits;       /* calls that waited for room (call_cap) */
    int64_t  load;             /* ferry_runtime_load() */
} ferry_runtime_stats;

/* The whole runtime in ferry_runtime_stats_get() and ferry_runtime_dump(). */
#define FERRY_RUNTIME_ALL (-1)

/*
 * Read the counters of loop `index` of `rt` (NULL: the caller's runtime),
 * or with FERRY_RUNTIME_ALL the sums over every loop.  Each loop copies
 * its own counters on its thread (a call from a task; from loop 0's
 * thread outside a task, ferry_loop_run_sync() to the other loops).
 * Thread: loop, in a task of one of rt's loops; or loop 0's thread, not in
 * a task and not inside ferry_runtime_run().  Suspends: yes (in a task).
 * Returns: 0; -ECANCELED, -ETIMEDOUT; -ESHUTDOWN (a loop is stopping);
 * -ENOMEM; -EPERM (another thread); -EINVAL.
 */
int ferry_runtime_stats_get(ferry_runtime *rt, int index, ferry_runtime_stats *out /* OUT */);

/*
 * ferry_loop_dump() of loop `index` of `rt` (NULL: the caller's
 * runtime), or of every loop in turn with FERRY_RUNTIME_ALL, each under a
 * line naming the loop ("loop 1 of 4"), then a line with the runtime's
 * live tasks.  Each loop prints on its own thread.
 * Thread: as ferry_runtime_stats_get().  Suspends: yes (in a task).
 * Returns: the number of tasks printed; the errors of
 * ferry_runtime_stats_get().
 */
int ferry_runtime_dump(ferry_runtime *rt, int index, FILE *out);

/* ---- Listening on every loop ------------------------------------------ */

/*
 * A TCP port served by every loop of a runtime.  Two ways to spread the
 * connections (ferry_runtime_listen_opts.mode):
 *
 *   FERRY_SPREAD_REUSEPORT  one listening socket per loop, all bound with
 *                           SO_REUSEPORT: the kernel picks the socket, and
 *                           so the loop, by a hash of the connection's
 *                           addresses.  No hand-over, but the hash is lumpy
 *                           for a few long-lived connections, and a loop
 *                           that is stalled keeps receiving its share.
 *   FERRY_SPREAD_BALANCED   one socket, accepted on one loop (`acceptor`),
 *                           which hands each new connection to the less
 *                           loaded of two loops: the first candidate goes
 *                           round the loops in turn, the second is drawn at
 *                           random among the others, and the load is
 *                           ferry_runtime_load(), which counts the open
 *                           connections of each loop.  The descriptor
 *                           travels before any I/O; the stream is opened on
 *                           the loop that serves it.  With a load that only
 *                           grows (no connection closes) this deals the
 *                           connections out exactly evenly; as they close,
 *                           the random candidate steers new ones to the
 *                           loops that have fewest.
 *
 * FERRY_SPREAD_CPU steers by the CPU that received the connection, where
 * the kernel can: in reuseport mode a classic-BPF program
 * (SO_ATTACH_REUSEPORT_CBPF) picks socket (CPU mod loops), which is loop
 * i for CPU i when the runtime pins its loops (ferry_runtime_opts.pin) to
 * CPUs numbered from 0; in balanced mode the first candidate is that
 * loop (SO_INCOMING_CPU of the accepted socket).  Where the kernel refuses,
 * the spreading goes on without it, as if the flag were not set.
 */
typedef struct ferry_runtime_listener ferry_runtime_listener;

enum {
    FERRY_SPREAD_REUSEPORT = 0,
    FERRY_SPREAD_BALANCED  = 1,
};

#define FERRY_SPREAD_CPU 0x1u   /* steer by the receiving CPU, see above */

typedef struct ferry_runtime_listen_opts {
    /* FERRY_SPREAD_*; 0 is FERRY_SPREAD_REUSEPORT. */
    int               mode;
    /* FERRY_SPREAD_CPU or 0. */
    unsigned          flags;
    /* Balanced mode: the loop that accepts; 0 is loop 0. */
    unsigned          acceptor;
    /* Queue of connections not yet accepted, per socket; 0 means SOMAXCONN. */
    int               backlog;
    /* Balanced mode: the seed of the random candidates; 0: from the clock. */
    uint64_t          seed;
    /* Options of the connections' streams (TCP_NODELAY is on unless
     * FERRY_STREAM_NAGLE). */
    ferry_stream_opts stream;
} ferry_runtime_listen_opts;

/*
 * Serves one connection: runs as a task named "conn" on the loop the
 * connection was given to.  The stream is that loop's; ferry closes it
 * when fn returns.  The return value is counted as a failure when not 0
 * (ferry_group_failures() of a server's connections) and stops nothing.
 */
typedef int (*ferry_conn_fn)(ferry_stream *s, void *arg);

/*
 * Make the listening sockets of a port for every loop of `rt` (NULL: the
 * caller's runtime): one per loop in reuseport mode, one in balanced mode.
 * `host` and `port` as for ferry_tcp_listen() (port 0: the system picks
 * one, the same for every socket; see ferry_runtime_listener_port()).
 * Connections queue from now on; they are served by
 * ferry_runtime_listener_serve().
 * Thread: any.  Suspends: no.
 * Owns: the caller owns *out; free it with ferry_runtime_listener_free().
 * Returns: 0; -EADDRINUSE, -EACCES and the other errors of socket(2),
 * bind(2) and listen(2), negated; -EINVAL (out NULL, no runtime, port
 * outside 0..65535, a host that is not a numeric address, an unknown
 * mode or flag, acceptor out of range, a bad backlog); -ENOMEM; -EMFILE,
 * -ENFILE.  On an error nothing is left open.
 */
int ferry_runtime_listen(ferry_runtime_listener **out /* OUT */, ferry_runtime *rt,
                         const char *host, int port, const ferry_runtime_listen_opts *opts);

/*
 * The port the listener is bound to.
 * Thread: any.  Suspends: no.
 * Returns: the port; -EINVAL (NULL).
 */
int ferry_runtime_listener_port(const ferry_runtime_listener *l);

/*
 * Serve the port on every loop until the caller is cancelled or its
 * deadline passes: each connection is a task running fn(stream, arg) on
 * its loop, and counts 1 in that loop's ferry_runtime_load() from the
 * moment it is given to the loop until its stream is closed.  On the way
 * out every loop stops accepting, cancels its connections' tasks and
 * waits for them to end; a connection that was on its way to a loop, or
 * reaches one that is stopping, is closed (no descriptor is left open).
 * The sockets stay open: a later serve takes the connections queued
 * meanwhile.
 * Thread: loop, in a task of one of rt's loops.  Suspends: yes.
 * Returns: -ECANCELED, -ETIMEDOUT (the ordinary end, every connection
 * closed); -EBUSY (the listener is being served already); -ESHUTDOWN
 * (a loop is stopping); -ENOMEM; -EPERM (not in a task of rt's loops);
 * -EINVAL (l or fn NULL).
 * Owns: `arg` stays the caller's; every connection's fn shares it.
 */
int ferry_runtime_listener_serve(ferry_runtime_listener *l, ferry_conn_fn fn, void *arg);

/*
 * Close the listening sockets and free the listener.  Not while
 * ferry_runtime_listener_serve() runs.  NULL is ignored.
 * Thread: any.  Suspends: no.
 */
void ferry_runtime_listener_free(ferry_runtime_listener *l);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_RUNTIME_H */
