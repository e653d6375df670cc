/* redis_int.h - what redis.c offers the rest of the Redis part.
 * Loop thread only.
 */
#ifndef FERRY_REDIS_INT_H
#define FERRY_REDIS_INT_H

#include "ferry/redis.h"

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

#endif /* FERRY_REDIS_INT_H */
