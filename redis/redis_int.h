/* redis_int.h - what redis.c offers the rest of the Redis part.
 * Loop thread only.
 */
#ifndef FERRY_REDIS_INT_H
#define FERRY_REDIS_INT_H

#include <stdint.h>

#include "ferry/redis.h"
#include "ferry/sync.h"

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
    const char  *token;   /* the name the messages for it carry */
    int64_t      value;   /* > 0: what a message for it carried; 0 before */
    ferry_event *ev;      /* set by a message for it, and each time the
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
