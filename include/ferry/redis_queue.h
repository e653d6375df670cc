/* ferry/redis_queue.h - a durable work queue on a Redis stream, shared by
 * every process that names the same stream and group.
 *
 * Part of the Redis library (ferry_redis, FERRY_HAVE_REDIS in
 * ferry/features.h); see ferry/redis.h for the connection it runs on.
 *
 * An item is one entry of the stream (XADD), its payload in the field "d".
 * Consumers read through a consumer group (XREADGROUP): each item goes to
 * one consumer of the group, and it stays in the group's pending list,
 * with the consumer that took it, until that consumer acknowledges it
 * (XACK).  An item that a consumer took and never acknowledged (its
 * process died between get and ack, say) is not lost: once it has been
 * pending for a while, another consumer takes it over with
 * ferry_redis_queue_reclaim() (XAUTOCLAIM) and processes it.  Delivery is
 * therefore at least once: a consumer that dies after the work but before
 * the ack has its item done twice.  Each item carries the number of times
 * it was delivered, so a consumer can set aside (dead-letter) an item that
 * keeps killing its workers.
 *
 * A queue has two connections: the one given to ferry_redis_queue_open()
 * (puts, acks, reclaims, shared with anything else the caller does on it)
 * and one of its own, made like it, for the blocking reads, which hold
 * their connection on the server until they return.  A task blocked in
 * ferry_redis_queue_get() holds no thread: other tasks run meanwhile.
 *
 * Everything here belongs to the loop of the given connection and runs on
 * that loop's thread.  Requires Redis 6.2 or later (XAUTOCLAIM).
 */
#ifndef FERRY_REDIS_QUEUE_H
#define FERRY_REDIS_QUEUE_H

#include <stddef.h>
#include <stdint.h>

#include "ferry/redis.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ferry_redis_queue ferry_redis_queue;

/* Room for a stream entry id ("<ms>-<seq>", two 64-bit numbers) and its
 * NUL. */
#define FERRY_REDIS_ID_MAX 48

/* One item taken from the queue: the caller's, freed with
 * ferry_redis_item_free(). */
typedef struct ferry_redis_item {
    /* The entry's id in the stream, NUL-terminated: what ack takes. */
    char id[FERRY_REDIS_ID_MAX];
    /* How many times the group has delivered it, this time included: 1
     * for an item read for the first time, more for a reclaimed one. */
    int64_t deliveries;
    /* The payload: len bytes, followed by a NUL that is not counted.  An
     * entry added by someone else without a field "d" gives the value of
     * its first field. */
    size_t len;
    char  *data;
    /* private */
    struct ferry_redis_item *next_;
} ferry_redis_item;

/*
 * Open the queue on the stream `key` for the consumer `consumer` of the
 * group `group`: create the group if it does not exist (with the stream if
 * needed; a new group starts at the beginning of the stream, so items put
 * before any consumer came are delivered too), and make the queue's own
 * connection for blocking reads, like `conn`.  `consumer` NULL: the
 * host's name and the process id ("host:pid").  Give a consumer a name
 * that stays the same across restarts where there is one: items a consumer
 * took stay pending under its name.
 * `conn` must stay open as long as the queue.
 * Thread: loop of conn, in a task.  Suspends: yes.
 * Owns:   the caller; close with ferry_redis_queue_close().
 * Returns: 0 and *out; -EPROTO (the server refused: `key` holds something
 *          else than a stream, say); the errors of ferry_redis_command()
 *          and ferry_redis_connect_like(); -ENOMEM; -EINVAL (NULL or empty
 *          names); -EPERM.  Nothing is left open on error (the group may
 *          have been created).
 */
int ferry_redis_queue_open(ferry_redis_queue **out /* OUT */, ferry_redis *conn, const char *key,
                           const char *group, const char *consumer);

/*
 * Close the queue's own connection and free `q`.  Items read for a get
 * that gave up and not handed out yet stay pending in the group (see
 * ferry_redis_queue_get()).  Does not close the connection given to open.
 * A get still waiting on `q` returns -ESHUTDOWN.  NULL is ignored.
 * Thread: loop.  Suspends: no.
 */
void ferry_redis_queue_close(ferry_redis_queue *q);

/*
 * Append an item of `len` bytes (any bytes) to the stream.  `maxlen` > 0
 * trims the stream to about that many entries, oldest first (XADD MAXLEN
 * ~: whole blocks of entries go, so a few more may stay).  Trimming drops
 * entries whether or not they were read and acknowledged: a maxlen too
 * small for the backlog loses items.  0: no trimming.  `id`, if not NULL,
 * receives the new entry's id.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: 0; -EPROTO (the server refused); the errors of
 *          ferry_redis_command() (with -ECANCELED, -ETIMEDOUT and
 *          -ECONNRESET the item may have been added); -EINVAL; -EPERM.
 */
int ferry_redis_queue_put(ferry_redis_queue *q, const void *data, size_t len, size_t maxlen,
                          char id[FERRY_REDIS_ID_MAX] /* OUT */);

/*
 * Take the next item for this consumer: one reclaimed or left over by a
 * get that gave up, if there is one, else the oldest item no consumer of
 * the group has had yet, waiting for one to be put for up to `timeout`
 * nanoseconds (0: do not wait; negative: wait without limit).  The item
 * stays pending in the group under this consumer until it is acknowledged.
 * One task at a time gets from a queue: open a queue per consumer task.
 *
 * A get interrupted while the server holds its read (cancelled, or a
 * deadline of the caller's) returns at once and asks the server to end
 * the read.  If the server had already handed it an item, that item is
 * kept in `q` and the next get returns it; if `q` is closed first, the
 * item stays pending in the group under this consumer, where a reclaim
 * finds it.  No item is lost either way.
 *
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: 0 and *item (the caller's: ferry_redis_item_free());
 *          -EAGAIN: no item within `timeout`;
 *          -ECANCELED, -ETIMEDOUT: interrupted (see above);
 *          -ESHUTDOWN: the queue was closed meanwhile;
 *          -EBUSY: another task is in a get on `q`;
 *          -EPROTO: the server refused (the group was deleted and could
 *          not be created again, say);
 *          the other errors of ferry_redis_command(); -ENOMEM (an item
 *          read stays pending in the group); -EINVAL; -EPERM.
 *          On every return but 0, *item is NULL.
 */
int ferry_redis_queue_get(ferry_redis_queue *q, ferry_redis_item **item /* OUT */,
                          int64_t timeout);

/*
 * Acknowledge the item with id `id`: it leaves the group's pending list
 * for good.  Any consumer of the group may acknowledge any item.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: 0 (acknowledged now); -ENOENT (not pending: acknowledged
 *          before, or trimmed away); -EPROTO; the errors of
 *          ferry_redis_command(); -EINVAL; -EPERM.
 */
int ferry_redis_queue_ack(ferry_redis_queue *q, const char *id);

/*
 * Take over up to `max` items of the group that have been pending (under
 * any consumer, this one included) for at least `min_idle` nanoseconds
 * without being acknowledged (XAUTOCLAIM), and keep them in `q`: the next
 * gets return them, before new items, with their delivery counts.  Call
 * it now and then from a consumer (every few seconds, with a min_idle
 * longer than any item should take to process) so that items of dead
 * consumers get done.  Entries deleted or trimmed from the stream while
 * pending are dropped from the pending list by the server (Redis 7).
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: the number of items taken over (0 or more); -EPROTO; the errors
 *          of ferry_redis_command() (interrupted, the items the server
 *          took over stay pending under this consumer, for a later
 *          reclaim); -ENOMEM (items taken over but not kept stay pending
 *          under this consumer too); -EINVAL (max < 1, min_idle < 0);
 *          -EPERM.
 */
int ferry_redis_queue_reclaim(ferry_redis_queue *q, int64_t min_idle, int max);

/*
 * Free an item returned by ferry_redis_queue_get().  NULL is ignored.
 * Thread: any.  Suspends: no.
 */
void ferry_redis_item_free(ferry_redis_item *item);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_REDIS_QUEUE_H */
