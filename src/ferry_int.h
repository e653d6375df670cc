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

/* What a loop still holds (ferry__loop_leftovers()). */
struct ferry__leftovers {
    size_t tasks;       /* tasks not yet ended */
    size_t callbacks;   /* callbacks and fired timers in the run queue */
    size_t timers;      /* timers armed: ferry_timer and the tasks' own */
    bool   posts;       /* posts from threads (or completions) not yet run */
};

/*
 * Count what `loop` still holds, for a test's teardown: a loop about to be
 * freed after a test that awaited everything it started holds nothing.
 * Thread: loop.  Suspends: no.  Returns: 0; -EPERM; -EINVAL.
 */
int ferry__loop_leftovers(ferry_loop *loop, struct ferry__leftovers *out /* OUT */);

#endif /* FERRY_INT_H */
