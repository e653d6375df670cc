/* ferry/redis.h - Redis for tasks: a connection whose commands suspend the
 * calling task until the reply, and a semaphore and lock shared by every
 * process that names the same key.
 *
 * Built as its own library (ferry_redis, pkg-config ferry-redis) when
 * hiredis was found: FERRY_HAVE_REDIS in ferry/features.h says so.  The
 * client is hiredis (0.14 or later, RESP2) driven by events on the loop's
 * own event_base, so a task waiting for a reply holds no thread and other
 * tasks run meanwhile.
 *
 * Everything here belongs to the loop whose task made the connection and
 * runs on that loop's thread.
 *
 * Replies.  A command's reply is a hiredis redisReply, the caller's to
 * free with ferry_redis_reply_free().  An error reply of the server
 * (REDIS_REPLY_ERROR: WRONGTYPE, NOSCRIPT, ...) is a reply like any other:
 * the call returns 0 and the caller looks at reply->type.  A negative
 * return always means that no reply came.
 *
 * Order.  Commands sent on one connection are executed by the server in the
 * order they were sent, and their replies come back in that order; tasks
 * that share a connection pipeline their commands.  A command that blocks
 * on the server (BLPOP, XREADGROUP ... BLOCK, WAIT) holds every later
 * command of its connection until it returns: give such commands a
 * connection of their own (ferry_redis_connect_like()).  SUBSCRIBE,
 * PSUBSCRIBE, their UNSUBSCRIBE and MONITOR change the connection's
 * protocol and are refused.
 *
 * Cancellation and deadlines.  Every command is a cancellation point and
 * honours the deadlines of the caller's scopes.  A caller that gives up
 * returns at once; the command may already have been sent, and then the
 * server runs it anyway: unlike the primitives of ferry/sync.h, an
 * interrupted command is not "all or nothing".  Its reply, when it comes,
 * is consumed and freed by ferry (or handed to the caller's late function,
 * ferry_redis_commandv_late()), never to the next caller.  A reply that had
 * already arrived when the caller was interrupted is returned (0): the
 * caller then sees the interruption at its next suspension point.
 *
 * Connection loss.  When the connection drops, every command waiting for a
 * reply returns -ECONNRESET (it may or may not have run on the server).
 * The next command makes a new connection; while that connection is being
 * made, commands are queued on it.  If the server cannot be reached, the
 * commands return the attempt's error (-ECONNREFUSED, or -ETIMEDOUT when
 * it did not answer within ferry_redis_opts.connect_timeout), and while the
 * back-off after a failed attempt runs (opts.retry_min doubling up to
 * opts.retry_max) commands fail at once with that same error: no call
 * hangs on a server that is down.  Nothing of the old connection (CLIENT
 * ID, loaded scripts, ...) carries over to the new one.  A server that
 * stops answering without closing the connection (a stopped process, a
 * network that drops everything) is not detected: commands then wait for
 * their callers' deadlines.
 */
#ifndef FERRY_REDIS_H
#define FERRY_REDIS_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#include "ferry/task.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Connection ------------------------------------------------------ */

typedef struct ferry_redis ferry_redis;

typedef struct ferry_redis_opts {
    /* How long one connection attempt may take (TCP connect); 0: 5 s. */
    int64_t connect_timeout;
    /* Back-off after a failed attempt: no new attempt for retry_min, then
     * twice as long after each failure, up to retry_max; a connection made
     * resets it.  0: 100 ms and 2 s. */
    int64_t retry_min;
    int64_t retry_max;
} ferry_redis_opts;

/*
 * Connect to the server at `host` and `port`, and wait until the
 * connection is made and the server has answered a PING, within
 * opts.connect_timeout.  `host` is an IP address, a name (resolved once, here,
 * with ferry_getaddrinfo(); reconnections use the address found), or the
 * path of a Unix socket if it starts with '/' (then `port` is ignored).
 * `opts` may be NULL (defaults) and is copied.
 * Thread: loop, in a task.  Suspends: yes.
 * Owns:   the caller; close with ferry_redis_close().
 * Returns: 0 and *out; -ECONNREFUSED or another connect error (nothing
 * left open); -ETIMEDOUT (no connection or no answer to the PING within
 * opts.connect_timeout, or a deadline of the caller passed); -ECANCELED; -ENOMEM; FERRY_EAI_* (the
 * name did not resolve, see ferry/resolve.h); -EINVAL (bad arguments or
 * options); -EPERM (not in a task).
 */
int ferry_redis_connect(ferry_redis **out /* OUT */, const char *host, int port,
                        const ferry_redis_opts *opts);

/*
 * A second connection to the same server with the same options as `r`
 * (for commands that block on the server).  Waits until it is made.
 * Thread: loop, in a task.  Suspends: yes.
 * Owns:   the caller; close with ferry_redis_close().
 * Returns: as ferry_redis_connect().
 */
int ferry_redis_connect_like(ferry_redis **out /* OUT */, const ferry_redis *r);

/*
 * Close the connection and free `r`.  Commands queued and not yet written
 * (ferry_redis_send(), a permit's release) are written first if the socket
 * takes them at once, without waiting for their replies.  Tasks still
 * waiting for replies on it return -ESHUTDOWN.  Close every connection before its loop is freed, and
 * never from inside a late function (ferry_redis_late_fn).  NULL is
 * ignored.
 * Thread: loop (in a task or not).  Suspends: no.
 */
void ferry_redis_close(ferry_redis *r);

/*
 * Send a command given as a printf-like format (hiredis's: %s a C string,
 * %b a binary string given as a pointer and a size_t length, %d, %lld...;
 * every %-argument is one argument of the command, spaces separate the
 * others) and wait for its reply.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: 0 and *reply, the caller's to free with ferry_redis_reply_free()
 *          (an error reply of the server too);
 *          -ECANCELED, -ETIMEDOUT: the caller was interrupted; the command
 *          may have run on the server (see above);
 *          -ECONNRESET: the connection dropped before the reply came;
 *          -ECONNREFUSED or another connect error, -ETIMEDOUT: no
 *          connection could be made (or the back-off of a failed attempt
 *          runs); the command was not sent;
 *          -ESHUTDOWN: ferry_redis_close() was called meanwhile;
 *          -ENOTSUP: a subscribe or MONITOR command;
 *          -ENOMEM: out of memory, or a format hiredis refused; -EINVAL:
 *          r or reply NULL; -EPERM: not in a task of r's loop.
 *          On every return but 0, *reply is NULL.
 */
int ferry_redis_command(ferry_redis *r, redisReply **reply /* OUT */, const char *fmt, ...);

/* ferry_redis_command() with a va_list.
 * Thread: loop, in a task.  Suspends: yes.  Returns: as ferry_redis_command(). */
int ferry_redis_vcommand(ferry_redis *r, redisReply **reply /* OUT */, const char *fmt,
                         va_list ap);

/*
 * Send a command given as `argc` arguments (argv[i] of argvlen[i] bytes;
 * argvlen NULL: each argv[i] is a C string) and wait for its reply.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: as ferry_redis_command(); -EINVAL also for argc < 1.
 */
int ferry_redis_commandv(ferry_redis *r, redisReply **reply /* OUT */, int argc,
                         const char **argv, const size_t *argvlen);

/*
 * Called once for a command whose caller gave up, when its reply comes:
 * `reply` is the reply (NULL if the connection dropped or was closed
 * first, or if the caller was interrupted before the command was sent, in
 * which case the call comes at once, in the caller's task), which ferry
 * frees after the call; `arg` is the one given with the command and is the
 * function's from then on.  It runs on the loop's thread, usually outside
 * any task: it must not suspend, but it may send commands with
 * ferry_redis_send() (to undo what the command did, for instance).
 */
typedef void (*ferry_redis_late_fn)(ferry_redis *r, redisReply *reply, void *arg);

/*
 * ferry_redis_commandv(), and if the caller gives up before the reply,
 * late(r, reply, late_arg) when it comes.  If the call returns without
 * having given up (0, or an error that means no reply can come), `late` is
 * never called and `late_arg` stays the caller's.  `late` NULL: as
 * ferry_redis_commandv().
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: as ferry_redis_commandv(); with -ECANCELED and -ETIMEDOUT,
 * `late` has been called or will be, exactly once.
 */
int ferry_redis_commandv_late(ferry_redis *r, redisReply **reply /* OUT */, int argc,
                              const char **argv, const size_t *argvlen,
                              ferry_redis_late_fn late, void *late_arg);

/*
 * Send a command without waiting: its reply is dropped.  Fit for a late
 * function or a callback.  A connection that is down is not reconnected
 * for it.
 * Thread: loop (in a task or not).  Suspends: no.
 * Returns: 0 (queued; whether it reaches the server is not known);
 * -ENOTCONN (no connection now, nothing sent); -ENOTSUP; -ENOMEM; -EINVAL;
 * -EPERM (not on r's loop's thread).
 */
int ferry_redis_send(ferry_redis *r, int argc, const char **argv, const size_t *argvlen);

/*
 * Free a reply given by ferry_redis_command*() (freeReplyObject()).  NULL is
 * ignored.
 * Thread: any.  Suspends: no.
 */
void ferry_redis_reply_free(redisReply *reply);

/* Thread: loop.  Suspends: no.
 * Returns: true while a connection is made and up (false while down or
 * while connecting). */
bool ferry_redis_connected(const ferry_redis *r);

/*
 * The server's id of the current connection (CLIENT ID), to unblock a
 * command blocked on it from another connection (CLIENT UNBLOCK id).
 * Thread: loop.  Suspends: no.
 * Returns: the id; 0 when not connected or not known yet.
 */
int64_t ferry_redis_client_id(const ferry_redis *r);

/* ---- Semaphore and lock across processes -------------------------------- */

/*
 * A semaphore of `limit` permits shared by every process (and every
 * connection) that names the same key on the same server; a lock is the
 * case limit 1.  The state lives on the server and changes only in Lua
 * scripts, atomically: keys "{key}:holders" (a sorted set of the holders'
 * tokens by lease expiry, server time), "{key}:fences" (a hash of the
 * holders' fencing tokens), "{key}:queue" (waiters by arrival ticket),
 * "{key}:alive" (waiters by heartbeat expiry), "{key}:ticket" and
 * "{key}:fence" (counters).  Every process naming the key runs the scripts
 * of the same version of this part.  docs/redis.md describes the scripts.
 *
 * Order.  A permit that comes free goes to the first waiter in arrival
 * order, so no waiter is passed by one that came later, in any process.
 *
 * Waiting.  The script that frees a permit (a release; or any script that
 * finds a lease or a waiter's heartbeat run out) grants it to the first
 * waiter at once and tells it on its connection's wake channel: one more
 * connection per ferry_redis, subscribed when one of its tasks first has
 * to wait and kept until ferry_redis_close().  A waiter thus holds the
 * permit about one round trip after the release reaches the server.  While
 * the channel is subscribed a waiter polls only every opts.poll_max, as a
 * heartbeat.  When the channel is lost (its connection dropped, or the
 * server refused SUBSCRIBE), every waiter polls at once and then every
 * opts.poll_min, doubling up to opts.poll_max, and the channel is made
 * again with the connection's back-off; once it is subscribed again,
 * every waiter polls once more.  A lease that ran out is found by the
 * next poll of any waiter, within poll_max.  With opts.poll_only there is
 * no channel: a waiter polls every poll_min, doubling up to poll_max, and
 * at once when a task of the same handle releases a permit.
 *
 * Leases.  A permit is a lease of opts.lease: while it is held, ferry
 * renews it every lease/3 from the loop.  A permit granted by another's
 * script is leased until the waiter's heartbeat would have run out, and
 * ferry renews it within half that time: a waiter that died gives it back
 * within waiter_ttl.  A process that dies (or a loop that stops running)
 * holding a permit gives it back when the lease runs out.  A waiter is
 * forgotten opts.waiter_ttl after its last poll, so a dead waiter does not
 * hold up the queue.  If a renewal finds the lease gone (it ran out while
 * the loop was stalled or the server was unreachable), the permit is lost:
 * ferry_redis_permit_held() turns false and ferry_redis_permit_release()
 * returns -ESTALE.  Another process may hold the permit by then: a lease
 * is not a guarantee.  What protects a resource is the fencing token:
 * every grant carries a number greater than every earlier grant's of the
 * same key (ferry_redis_permit_fence()); pass it to the resource, and have
 * the resource refuse a token lower than the highest it has seen.
 */
typedef struct ferry_redis_sem ferry_redis_sem;
typedef struct ferry_redis_permit ferry_redis_permit;

typedef struct ferry_redis_sem_opts {
    /* A permit's lease; 0: 10 s; at least 30 ms (whole milliseconds). */
    int64_t lease;
    /* Polling while waiting (see "Waiting" above); 0: 5 ms and 100 ms. */
    int64_t poll_min;
    int64_t poll_max;
    /* How long the server keeps a waiter that stopped polling; 0: 1 s or
     * 4 * poll_max, whichever is longer.  At least 2 * poll_max. */
    int64_t waiter_ttl;
    /* No wake channel: a waiter learns of its permit only by polling, every
     * poll_min doubling up to poll_max (for a server that refuses
     * SUBSCRIBE, or to compare). */
    bool poll_only;
} ferry_redis_sem_opts;

/*
 * A handle on the semaphore `key` with `limit` permits (every process
 * naming the key must give the same limit), used through the connection
 * `r`, which must outlive it.  Nothing is sent to the server here.
 * Thread: loop.  Suspends: no.
 * Owns:   the caller; free with ferry_redis_sem_free().
 * Returns: 0 and *out; -ENOMEM; -EINVAL (NULL or empty key, limit 0,
 * bad options); -EPERM (not on r's loop's thread).
 */
int ferry_redis_sem_new(ferry_redis_sem **out /* OUT */, ferry_redis *r, const char *key,
                        unsigned limit, const ferry_redis_sem_opts *opts);

/* ferry_redis_sem_new() with limit 1: a lock across processes.
 * Thread: loop.  Suspends: no.  Returns: as ferry_redis_sem_new(). */
int ferry_redis_lock_new(ferry_redis_sem **out /* OUT */, ferry_redis *r, const char *key,
                         const ferry_redis_sem_opts *opts);

/*
 * Free the handle.  NULL is ignored.
 * Thread: loop.  Suspends: no.
 * Returns: 0; -EBUSY (a permit of it is held or a task is acquiring:
 * nothing freed).
 */
int ferry_redis_sem_free(ferry_redis_sem *s);

/*
 * Wait for a permit, in arrival order across processes.  The wait
 * suspends the task, never the thread.  An acquire that is cancelled or
 * whose deadline passes removes its waiter (and a permit granted to it
 * that it has not heard of yet, which then goes to the next waiter) from
 * the server: the removal is sent on the connection at once and runs after
 * any poll still in flight; if the connection is down, the server forgets
 * the waiter after waiter_ttl (and a permit granted to it when its lease
 * runs out).
 * Thread: loop, in a task.  Suspends: yes.
 * Owns:   *out is the caller's; give it back with
 *         ferry_redis_permit_release().
 * Returns: 0 and *out, held; -ECANCELED, -ETIMEDOUT; the connection's
 * errors (ferry_redis_command()); -EPROTO (an unexpected reply, such as
 * an error of the server: a key of another type); -ENOMEM; -EINVAL;
 * -EPERM.  On every return but 0, *out is NULL and nothing is held.
 */
int ferry_redis_sem_acquire(ferry_redis_sem *s, ferry_redis_permit **out /* OUT */);

/*
 * Give the permit back and free `p`.  The release is sent on the
 * connection without waiting for the server's answer, so it works in a
 * cancelled task too; on the server it hands the permit to the first
 * waiter.  If the connection is down, the lease runs out instead.
 * Thread: loop (in a task or not).  Suspends: no.
 * Returns: 0; -ESTALE (the lease was lost before the release: another
 * holder may have had the permit meanwhile); -ENOTCONN (not sent: the
 * lease runs out on the server); -EINVAL (NULL).  `p` is freed in every
 * case but -EINVAL.
 */
int ferry_redis_permit_release(ferry_redis_permit *p);

/* Thread: loop.  Suspends: no.
 * Returns: the permit's fencing token (> 0); 0 for NULL. */
int64_t ferry_redis_permit_fence(const ferry_redis_permit *p);

/* Thread: loop.  Suspends: no.
 * Returns: false once ferry knows the lease is lost (a renewal found it
 * gone, or it ran out by the local clock without a renewal), else true. */
bool ferry_redis_permit_held(const ferry_redis_permit *p);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_REDIS_H */
