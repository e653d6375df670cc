/* redis_int.h - what the files of the Redis part share: the connection's
 * structure, what redis.c offers the rest (sending with a callback), the
 * events of redis_io.c, the wake channel of redis_wake.c.
 * Loop thread only.
 */
#ifndef FERRY_REDIS_INT_H
#define FERRY_REDIS_INT_H

#include <stdbool.h>
#include <stdint.h>

#include <event2/event.h>
#include <hiredis/async.h>

#include "ferry/redis.h"
#include "ferry/sync.h"

struct ferry__redis_waiter;

/* The wake channel (redis_int.h): a subscriber connection of its own. */
struct ferry__redis_wake {
    redisAsyncContext *ac;                    /* the subscriber; NULL while there is none */
    bool up;                                  /* ac's SUBSCRIBE was confirmed */
    uint64_t epoch;                           /* subscriptions confirmed so far */
    int64_t retry_at;                         /* no new attempt before this time */
    int64_t backoff;                          /* the wait after the next failed attempt */
    ferry_timer *timer;                       /* ends an attempt that takes too long, or
                                   * starts the next one after a back-off */
    struct ferry__redis_waiter *first, *last; /* registered, oldest first */
    char id[64];                              /* the channel's name after "ferry-wake:" */
};

struct ferry_redis {
    ferry_loop *loop;              /* the loop whose task made it */
    struct event_base *base;       /* that loop's base */
    redisAsyncContext *ac;         /* the context; NULL while down */
    char *host;                    /* IP address (or Unix socket path) */
    int port;                      /* TCP port; unused for a Unix socket */
    bool unix_path;                /* host is a Unix socket's path */
    bool closing;                  /* ferry_redis_close() is freeing it */
    ferry_redis_opts opts;         /* with the defaults filled in */
    int err;                       /* error of the last failed attempt; 0 after a success */
    int64_t retry_at;              /* no new attempt before this time */
    int64_t backoff;               /* the wait after the next failed attempt */
    ferry_timer *connect_timer;    /* ends an attempt that takes too long */
    int64_t client_id;             /* CLIENT ID of the current connection; 0 unknown */
    struct ferry__redis_wake wake; /* the wake channel of its waiters */
};

/* Drive `ac` by events on `base`, the base of `loop` (redis_io.c).
 * Returns: 0; -ENOMEM (nothing attached). */
int ferry__redis_io_attach(redisAsyncContext *ac, ferry_loop *loop, struct event_base *base);

/* hiredis's write of what `ac` has queued, with SIGPIPE blocked on this
 * thread around it unless `pipe_ignored`; `flush_only`: one write, without
 * hiredis's handling of the result, for a context about to be freed
 * (redis_io.c). */
void ferry__redis_write_quietly(redisAsyncContext *ac, bool pipe_ignored, bool flush_only);

/* The wake channel's name, drawn when the connection is made
 * (redis_wake.c). */
void ferry__redis_wake_init(ferry_redis *r);

/* Cancel the wake channel's timer, if one runs (redis_wake.c). */
void ferry__redis_wake_stop_timer(struct ferry__redis_wake *wk);

/* Gets the reply of a command sent with ferry__redis_send_cb(): the reply
 * (freed by ferry after the call) or NULL if the connection dropped or was
 * closed first.  Runs outside any task; must not suspend. */
typedef void (*ferry__redis_reply_fn)(ferry_redis *r, redisReply *reply, void *arg);

/*
 * Send a command without waiting; fn(r, reply, arg) is called once with its
 * reply.  Starts a connection attempt if there is none (as a command
 * does).  Thread: loop.  Suspends: no.
 * Returns: 0 (fn will be called); -ENOTCONN or the error of the last
 * connection attempt (nothing sent; fn not called); -ENOMEM; -EINVAL.
 */
int ferry__redis_send_cb(ferry_redis *r, int argc, const char **argv, const size_t *argvlen,
                         ferry__redis_reply_fn fn, void *arg);

/* The loop `r` belongs to.  Thread: any.  Suspends: no. */
ferry_loop *ferry__redis_loop(const ferry_redis *r);

/* ---- The wake channel ------------------------------------------------------
 *
 * A connection whose tasks wait for something the server will push keeps
 * one more connection to the same server, subscribed to one channel,
 * "ferry-wake:" followed by ferry__redis_wake_id(r), made when the first
 * waiter registers and again after it is lost (with the back-off of
 * ferry_redis_opts).  A message on it is "VALUE TOKEN": it goes to the
 * registered waiter with that token.  Messages sent while the channel is
 * not subscribed are lost; a waiter learns of that from the epoch.
 */

/* A task waiting for a pushed message; lives on the task's stack. */
struct ferry__redis_waiter {
    struct ferry__redis_waiter *prev, *next; /* on the connection's list */
    const char *token;                       /* the name the messages for it carry */
    int64_t value;                           /* > 0: what a message for it carried; 0 before */
    ferry_event *ev;                         /* set by a message for it, and each time the
                           * channel is subscribed or lost */
};

/* The name of r's wake channel after "ferry-wake:" (no ':' in it).
 * Thread: loop.  Suspends: no.  Returns: the name, valid while r is. */
const char *ferry__redis_wake_id(const ferry_redis *r);

/* Register `w` (token and ev set, value 0) for messages.
 * Thread: loop.  Suspends: no. */
void ferry__redis_wake_add(ferry_redis *r, struct ferry__redis_waiter *w);

/* Start the subscription if there is none, none is on its way and no
 * back-off runs.  Thread: loop.  Suspends: no. */
void ferry__redis_wake_want(ferry_redis *r);

/* Unregister `w`.  Thread: loop.  Suspends: no. */
void ferry__redis_wake_del(ferry_redis *r, struct ferry__redis_waiter *w);

/*
 * The number of the subscription now in place: it changes each time the
 * channel is subscribed again, so a waiter whose last check was sent
 * while the epoch was E, and that sees E still, has missed no message.
 * Thread: loop.  Suspends: no.
 * Returns: the epoch (> 0) while subscribed; 0 while not.
 */
uint64_t ferry__redis_wake_epoch(const ferry_redis *r);

#endif /* FERRY_REDIS_INT_H */
