/* sync_int.h - what the primitives share between their files: the lock's
 * task-level core (used by the condition and the per-key locks) and small
 * wait-queue helpers.
 * Loop thread only.
 */
#ifndef FERRY_SYNC_INT_H
#define FERRY_SYNC_INT_H

#include "ferry_int.h"
#include "ferry/sync.h"

/*
 * The first waiter of `q` that is still WAITING (a waiter woken by
 * cancellation or a deadline may stay linked until it runs), or NULL.
 */
static inline struct ferry__waiter *ferry__first_waiting(struct ferry__waitq *q)
{
    struct ferry__link *l;

    ferry__list_foreach(l, &q->head) {
        struct ferry__waiter *w = ferry__container_of(l, struct ferry__waiter, link);
        if (w->state == FERRY__W_WAITING)
            return w;
    }
    return NULL;
}

/*
 * Bind check for destroy functions: 0 if `bound` is NULL (never used), is
 * the loop of this thread, or has been freed (any thread may destroy then);
 * -EPERM if it is a live loop of another thread (or not this thread's
 * current one).  *live (if `live` is not NULL) is set to `bound` when it
 * is this thread's live loop, else NULL: only then may the destroy touch
 * the loop.
 */
int ferry__bound_here(ferry_loop *bound, ferry_loop **live /* OUT, optional */);

/*
 * ferry_lock_acquire() / ferry_lock_release() for the task `self` that the
 * caller has already checked with ferry__enter_task() (the lock is not
 * bound yet: these bind it).  Same returns.
 */
int ferry__lock_acquire_task(ferry_lock *lock, struct ferry_task *self);
int ferry__lock_try_acquire_task(ferry_lock *lock, struct ferry_task *self);
int ferry__lock_release_task(ferry_lock *lock, struct ferry_task *self);

/* True if nobody holds (unbroken) or waits for the lock: it may be freed. */
bool ferry__lock_idle(const ferry_lock *lock);

#endif /* FERRY_SYNC_INT_H */
