/* ferry/sync.h - lock, semaphore, event and condition for tasks.
 *
 * Everything here belongs to one loop and runs on that loop's thread.  A
 * primitive binds to the loop that first uses it; using it from another
 * thread, or from a task of another loop, returns -EPERM.  Once that loop
 * is freed, any thread may destroy the primitive (its storage can then be
 * given back).  To reach a loop from another thread, see ferry/bridge.h.
 *
 * Every call that suspends is a cancellation point, also when it does not
 * need to wait: a cancelled task gets -ECANCELED from an uncontended
 * acquire.  Deadlines come from the task's scopes (ferry_scope_enter()):
 * inside a scope whose deadline has passed, a wait returns -ETIMEDOUT.
 * A suspending call that returns an error had no effect: no permit taken,
 * the lock not held.  Waiting allocates nothing.
 *
 * All-zero storage is a valid, unlocked lock, a semaphore of value 0, a
 * clear event and a condition over its own lock, so static, calloc'd and
 * FERRY_*_INIT objects agree.  The storage is the caller's; none of these
 * allocate.
 */
#ifndef FERRY_SYNC_H
#define FERRY_SYNC_H

#include <stdbool.h>
#include <stdint.h>

#include "ferry/detail.h"
#include "ferry/task.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Lock ----------------------------------------------------------- */

typedef struct ferry_lock ferry_lock;

/*
 * A mutual-exclusion lock held by one task at a time (asyncio.Lock), with
 * FIFO handoff: release gives the lock to the longest waiting task, and a
 * newcomer never overtakes a queued waiter.  Not recursive.  A task that
 * ends while holding the lock breaks it: every waiter and every later
 * acquirer gets -EOWNERDEAD (Trio's broken lock, a robust pthread mutex).
 * The task is gone by then, so ferry logs its name and the lock's address
 * when the lock breaks (FERRY_LOG_ERROR, see ferry_set_log()), and
 * ferry_loop_dump() lists the loop's broken locks until they are destroyed.
 */
struct ferry_lock {
    /* private: use the functions below */
    struct ferry__waitq     waiters; /* tasks in ferry_lock_acquire() */
    struct ferry_task      *owner;   /* holder, NULL when free */
    ferry_loop             *loop;    /* bound at first use */
    struct ferry__link      held;    /* in its loop's list of held locks while owned */
    bool                    broken;  /* the owner ended while holding it */
};

/* All-zero is an unlocked lock: static, calloc'd and FERRY_LOCK_INIT agree. */
#define FERRY_LOCK_INIT {0}

/*
 * Initialise (or re-initialise after ferry_lock_destroy()) an unlocked,
 * unbound lock.
 * Thread: any.  Suspends: no.  Returns: 0; -EINVAL (NULL).
 */
int ferry_lock_init(ferry_lock *lock);

/*
 * Check that nobody holds or waits for the lock and unbind it; a broken
 * lock with no waiters can be destroyed (and then initialised again).
 * Thread: the bound loop's; any if never used or once that loop is freed.
 * Suspends: no.
 * Returns: 0; -EBUSY (held or waited for: nothing changed); -EPERM;
 * -EINVAL (NULL).
 */
int ferry_lock_destroy(ferry_lock *lock);

/*
 * Wait until the lock is free, then take it for the calling task.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns:  0           held by the caller;
 *           -ECANCELED, -ETIMEDOUT   not held, nothing changed;
 *           -EDEADLK    the caller already holds it;
 *           -EOWNERDEAD the lock is broken (a holder ended holding it);
 *           -EPERM      not on the bound loop's thread, or not in a task;
 *           -EINVAL     NULL.
 */
int ferry_lock_acquire(ferry_lock *lock);

/*
 * Take the lock if it is free and nobody waits for it.
 * Thread: loop, in a task.  Suspends: no (not a cancellation point).
 * Returns: 0 (held); -EAGAIN (held or waited for); -EDEADLK; -EOWNERDEAD;
 * -EPERM; -EINVAL.
 */
int ferry_lock_try_acquire(ferry_lock *lock);

/*
 * Release the lock held by the calling task; the longest waiting task, if
 * any, holds it next.
 * Thread: loop, in the holding task.  Suspends: no.
 * Returns: 0; -EPERM (the caller does not hold it, or wrong thread or
 * loop); -EINVAL (NULL).
 */
int ferry_lock_release(ferry_lock *lock);

/* Thread: loop.  Suspends: no.
 * Returns: true if some task holds the lock (also while broken). */
bool ferry_lock_locked(const ferry_lock *lock);

/* ---- Semaphore ------------------------------------------------------ */

typedef struct ferry_sem ferry_sem;

/*
 * A counting semaphore (asyncio.Semaphore), optionally bounded
 * (asyncio.BoundedSemaphore: releasing above the initial value fails), with
 * weighted acquire and release of n permits (Go's semaphore.Weighted,
 * Tokio's acquire_many).  Waiters are served strictly in FIFO order without
 * barging: a large request at the head is not starved by small ones behind
 * it, and when the head leaves (cancelled, timed out) the ones behind it
 * that fit proceed at once.  An acquire takes all its permits at once or
 * none, so a cancelled acquire holds nothing.
 *
 * A bounded semaphore has a total: the permits available plus those out
 * (taken, or granted to waiters that have not run yet).  It starts as the
 * initial value, and ferry_sem_set_total() changes it while tasks hold and
 * wait (Trio's CapacityLimiter.total_tokens).  An unbounded semaphore has
 * no total, only a count, which never passes UINT64_MAX.
 */
struct ferry_sem {
    /* private: use the functions below */
    struct ferry__waitq waiters; /* tasks in ferry_sem_acquire_n(); w->n = permits */
    ferry_loop         *loop;    /* bound at first use */
    uint64_t            value;   /* permits available now */
    uint64_t            max;     /* the total when `bounded` */
    bool                bounded; /* release above `max` (value + pending) returns -EOVERFLOW */
    uint64_t            pending; /* permits granted to waiters that have not resumed yet */
    uint64_t            debt;    /* permits out above a lowered total: permits that
                                  * come back pay it off before `value` grows */
};

/* A semaphore holding `v` permits; all-zero is one holding 0. */
#define FERRY_SEM_INIT(v)         { .value = (v) }
/* A bounded semaphore holding `v` permits, never more. */
#define FERRY_SEM_BOUNDED_INIT(v) { .value = (v), .max = (v), .bounded = true }

/* ferry_sem_init() flags. */
enum { FERRY_SEM_BOUNDED = 1 };

/*
 * Initialise an unbound semaphore with `value` permits; with
 * FERRY_SEM_BOUNDED, `value` is also the most it may ever hold.
 * Thread: any.  Suspends: no.  Returns: 0; -EINVAL (NULL, unknown flags).
 */
int ferry_sem_init(ferry_sem *sem, uint64_t value, unsigned flags);

/*
 * Check that nobody waits and unbind.
 * Thread: the bound loop's; any if never used or once that loop is freed.
 * Suspends: no.
 * Returns: 0; -EBUSY (waiters, or woken waiters not yet run); -EPERM;
 * -EINVAL.
 */
int ferry_sem_destroy(ferry_sem *sem);

/*
 * Take `n` permits, waiting (in FIFO order) until they are all available.
 * ferry_sem_acquire() takes one.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: 0 (n permits taken); -ECANCELED, -ETIMEDOUT (none taken);
 * -EPERM; -EINVAL (NULL, n == 0, or n above the bound of a bounded
 * semaphore: it could never be satisfied).
 */
int ferry_sem_acquire_n(ferry_sem *sem, uint64_t n);
int ferry_sem_acquire(ferry_sem *sem);

/*
 * Take `n` permits if they are available now and nobody waits before us.
 * Thread: loop (task or callback).  Suspends: no (not a cancellation point).
 * Returns: 0; -EAGAIN (would wait); -EPERM; -EINVAL.
 */
int ferry_sem_try_acquire_n(ferry_sem *sem, uint64_t n);
int ferry_sem_try_acquire(ferry_sem *sem);

/*
 * Give back `n` permits and wake the waiters at the head that now fit.
 * Any task or callback of the loop may release (permits have no owner).
 * While more permits are out than a lowered total, the permits released
 * first make up that excess and wake no one.
 * Thread: loop (task or callback).  Suspends: no.
 * Returns: 0; -EOVERFLOW (nothing released: bounded, and the permits
 * available plus those granted to waiters that have not resumed yet would
 * exceed the total; or unbounded, and they would pass UINT64_MAX, so that
 * a granted waiter that is cancelled and hands its permits back can never
 * wrap the count); -EPERM; -EINVAL (NULL, n == 0).
 */
int ferry_sem_release_n(ferry_sem *sem, uint64_t n);
int ferry_sem_release(ferry_sem *sem);

/*
 * Change the total of a bounded semaphore (its bound) while tasks hold and
 * wait.  Raising it adds the difference to the permits available and wakes
 * the waiters at the head that now fit, in FIFO order.  Lowering it takes
 * the difference from the permits available; when fewer are available,
 * the rest is taken from the permits out as they come back: releases (and
 * grants handed back by cancelled waiters) admit no one until fewer
 * permits are out than the new total, and a waiter for n gets in once n
 * more fit under it.  Waiters keep their places.
 * Thread: loop (task or callback).  Suspends: no.
 * Returns: 0; -EINVAL (NULL; total == 0; the semaphore is unbounded: it
 * has no total); -EBUSY (a waiting acquire asks for more than `total` and
 * could never get in: nothing changed); -EPERM.
 */
int ferry_sem_set_total(ferry_sem *sem, uint64_t total);

/* Thread: loop.  Suspends: no.  Returns: the permits available now. */
uint64_t ferry_sem_value(const ferry_sem *sem);

/* ---- Event ---------------------------------------------------------- */

typedef struct ferry_event ferry_event;

/*
 * A flag tasks can wait for (asyncio.Event).  Setting it wakes every task
 * waiting at that moment, even if it is cleared again before they run.
 */
struct ferry_event {
    /* private: use the functions below */
    struct ferry__waitq waiters; /* tasks in ferry_event_wait() */
    ferry_loop         *loop;    /* bound at first use */
    bool                set;     /* the flag */
};

/* All-zero is a clear event. */
#define FERRY_EVENT_INIT {0}

/* Initialise a clear, unbound event.
 * Thread: any.  Suspends: no.  Returns: 0; -EINVAL. */
int ferry_event_init(ferry_event *ev);

/*
 * Check that nobody waits and unbind.
 * Thread: the bound loop's; any if never used or once that loop is freed.
 * Suspends: no.
 * Returns: 0; -EBUSY (waiters); -EPERM; -EINVAL.
 */
int ferry_event_destroy(ferry_event *ev);

/*
 * Set the flag and wake every waiting task.
 * Thread: loop (task or callback).  Suspends: no.
 * Returns: 0; -EPERM; -EINVAL.
 */
int ferry_event_set(ferry_event *ev);

/* Clear the flag.
 * Thread: loop (task or callback).  Suspends: no.  Returns: 0; -EPERM; -EINVAL. */
int ferry_event_clear(ferry_event *ev);

/* Thread: loop.  Suspends: no.  Returns: true if the flag is set. */
bool ferry_event_is_set(const ferry_event *ev);

/*
 * Wait until the flag is set (return at once if it is).  For a timeout,
 * wrap the call in a deadline scope.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: 0 (the flag was set); -ECANCELED; -ETIMEDOUT; -EPERM; -EINVAL.
 */
int ferry_event_wait(ferry_event *ev);

/* ---- Condition ------------------------------------------------------ */

typedef struct ferry_cond ferry_cond;

/*
 * A condition variable over a lock (asyncio.Condition): its own lock, or
 * one shared with other conditions or code.  Waiting releases the lock and
 * holds it again on every return, also on cancellation and timeout (the
 * re-acquire is shielded), except -EOWNERDEAD (the lock broke meanwhile).
 * A notification given to a task that is cancelled before it runs passes
 * to the next waiter.
 */
struct ferry_cond {
    /* private: use the functions below */
    struct ferry__waitq waiters; /* tasks in ferry_cond_wait() */
    ferry_loop         *loop;    /* bound at first use */
    ferry_lock         *lock;    /* the shared lock, NULL: `own` */
    ferry_lock          own;     /* used when `lock` is NULL */
    size_t              pending; /* notified waiters that have not resumed yet */
};

/* All-zero is a condition over its own lock. */
#define FERRY_COND_INIT {0}

/*
 * Initialise an unbound condition over `lock`, or over a lock of its own
 * when `lock` is NULL.  A shared lock must outlive the condition.
 * Thread: any.  Suspends: no.  Returns: 0; -EINVAL (cond NULL).
 */
int ferry_cond_init(ferry_cond *cond, ferry_lock *lock);

/*
 * Check that nobody waits (and that its own lock is free) and unbind.
 * Thread: the bound loop's; any if never used or once that loop is freed.
 * Suspends: no.
 * Returns: 0; -EBUSY; -EPERM; -EINVAL.
 */
int ferry_cond_destroy(ferry_cond *cond);

/*
 * The lock of the condition: acquire and release it with ferry_lock_*().
 * Thread: any.  Suspends: no.
 * Returns: the shared lock or the condition's own; NULL only for NULL.
 */
ferry_lock *ferry_cond_lock(ferry_cond *cond);

/*
 * Release the lock, wait for a notification, hold the lock again.
 * Requires: the caller holds the lock.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: 0 (notified; lock held);
 *          -ECANCELED, -ETIMEDOUT (not notified, or the notification was
 *          passed on; lock held again);
 *          -EOWNERDEAD (the lock broke while waiting; NOT held);
 *          -EPERM (the caller does not hold the lock; wrong thread or loop);
 *          -EINVAL.
 */
int ferry_cond_wait(ferry_cond *cond);

/* A predicate for ferry_cond_wait_for(), called with the lock held. */
typedef bool (*ferry_cond_pred)(void *arg);

/*
 * Wait until pred(arg) is true: checks it, then waits and re-checks after
 * every notification.  A cancellation point even when the predicate is
 * already true.  Requires: the caller holds the lock.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: 0 (pred true; lock held); otherwise as ferry_cond_wait().
 */
int ferry_cond_wait_for(ferry_cond *cond, ferry_cond_pred pred, void *arg);

/*
 * Wake up to `n` waiting tasks (ferry_cond_notify_all(): every one).  They
 * run once the caller has released the lock.
 * Requires: the caller holds the lock.
 * Thread: loop, in a task.  Suspends: no.
 * Returns: the number of tasks woken (0 or more); -EPERM; -EINVAL.
 */
int ferry_cond_notify(ferry_cond *cond, unsigned n);
int ferry_cond_notify_all(ferry_cond *cond);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_SYNC_H */
