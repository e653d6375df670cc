/* ferry_int.h - what the files of src/ share beyond the loop's structure:
 * the foundations of base/ they use, the wait queue every primitive waits
 * through (its public half is port/loop_port.h), binding a primitive to
 * its loop, and what a loop still holds.
 *
 * Loop thread only, except what base/ declares (any thread).
 */
#ifndef FERRY_INT_H
#define FERRY_INT_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/loop.h"
#include "ferry/task.h"

#include "alloc.h"
#include "clock.h"
#include "list.h"
#include "log.h"
#include "loops.h"
#include "port/loop_port.h"

/* ---- Wait queue ------------------------------------------------------- */

/* The waiter, ferry__wait(), ferry__grant() and the task entry checks are
 * in port/loop_port.h: bridge/ parks tasks on them too. */

/*
 * Bind a primitive to the current loop at its first use: *bound NULL is set
 * to the current loop; a different loop, or no loop on this thread, gives
 * -EPERM.
 */
int ferry__bind(ferry_loop **bound);

static inline bool ferry__waitq_empty(const struct ferry__waitq *q)
{
    return ferry__list_empty(&q->head);
}

static inline struct ferry__waiter *ferry__waitq_first(const struct ferry__waitq *q)
{
    struct ferry__link *l = ferry__list_first(&q->head);
    return l ? ferry__container_of(l, struct ferry__waiter, link) : NULL;
}

/* Grant every waiter present now; returns how many. */
size_t ferry__waitq_grant_all(struct ferry__waitq *q, int result);

/* ---- Parts of a loop added by the layers above -------------------------- */

/*
 * The loop knows its own parts by name (loop_int.h); the I/O layer (io/)
 * keeps its per-loop state (streams and listeners, signal subscriptions,
 * the resolver) in parts it adds to the loop at their first use, so that
 * the loop frees what it never named and a loop that did no I/O carries
 * none.  A part is embedded in the subsystem's own structure.
 */
struct ferry__loop_part;

struct ferry__part_ops {
    const char *name; /* for messages: "streams", "signals", "resolver" */
    /*
     * While the loop ends, after every task was cancelled: true while the
     * part still owes callbacks that only polling brings (the scheduler
     * goes on polling until every part says false).  May be NULL.
     */
    bool (*closing)(struct ferry__loop_part *part);
    /* Free the part and all it holds, once every task has ended; called
     * once, newest part first, before the loop's event_base goes, with the
     * part still in the loop (its own code may still find it), which it
     * leaves with ferry__loop_part_del() before its memory goes. */
    void (*free)(struct ferry__loop_part *part);
};

struct ferry__loop_part {
    struct ferry__link link;           /* in the loop's list of parts */
    const struct ferry__part_ops *ops; /* what the part is */
    ferry_loop *loop;                  /* the loop it belongs to */
};

/* Add `part` (zeroed by its owner) to `loop`; it then belongs to the loop
 * until ferry__loop_parts_free().  Allocates nothing. */
void ferry__loop_part_add(ferry_loop *loop, struct ferry__loop_part *part,
                          const struct ferry__part_ops *ops);

/* Take `part` out of its loop (its owner frees it). */
void ferry__loop_part_del(struct ferry__loop_part *part);

/* The loop's part made with `ops`, or NULL if it has none yet. */
struct ferry__loop_part *ferry__loop_part_find(const ferry_loop *loop,
                                               const struct ferry__part_ops *ops);

/* ferry_loop_free(): does a part still owe callbacks (its closing hook)? */
bool ferry__loop_parts_closing(ferry_loop *loop);

/* ferry_loop_free(): free every part, newest first. */
void ferry__loop_parts_free(ferry_loop *loop);

/* What a loop still holds (ferry__loop_leftovers()). */
struct ferry__leftovers {
    size_t tasks;     /* tasks not yet ended */
    size_t callbacks; /* callbacks and fired timers in the run queue */
    size_t timers;    /* timers armed: ferry_timer and the tasks' own */
    bool posts;       /* posts from threads (or completions) not yet run */
};

/*
 * Count what `loop` still holds, for a test's teardown: a loop about to be
 * freed after a test that awaited everything it started holds nothing.
 * Thread: loop.  Suspends: no.  Returns: 0; -EPERM; -EINVAL.
 */
int ferry__loop_leftovers(ferry_loop *loop, struct ferry__leftovers *out /* OUT */);

#endif /* FERRY_INT_H */
