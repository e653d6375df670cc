/* sync.c - lock, semaphore, event and condition.
 * Loop thread only.
 *
 * Each primitive waits through the shared wait queue (ferry_int.h).  The
 * window every one of them must close is "granted but not yet run": a
 * waiter is handed the lock, permits or a notification, and is cancelled
 * (or its deadline passes) before it runs.  ferry__wait() then returns an
 * error with the waiter's state GRANTED, and the code after each wait below
 * passes what it was given to the next waiter, so nothing is lost and
 * nothing is granted twice.
 */
#include "loop_only.h"

#include <string.h>

#include "loop_int.h" /* the inline entry checks */
#include "sync_int.h"
#include "wait_int.h"

/*
 * A primitive may be destroyed on its loop's thread, on any thread if it
 * was never used, and on any thread once its loop has been freed: nothing
 * of that loop is left to race with, and the primitive's memory must be
 * given back.  A pointer to a freed loop must not be read, so whether the
 * loop still lives is asked of the set of live loops, by address.
 *
 * The corner accepted: a loop made later at the freed loop's address looks
 * like the primitive's loop.  The destroy then follows the new loop's rule
 * (it succeeds on that loop's thread, -EPERM elsewhere) until that loop is
 * freed in turn; the primitive holds nothing of either loop by then (its
 * loop's tasks all ended before the loop was freed), so succeeding on that
 * thread is harmless.
 */
int ferry__bound_here(ferry_loop *bound, ferry_loop **live)
{
    ferry_loop *l = bound;

    if (live)
        *live = NULL;
    if (bound == NULL)
        return 0;
    if (ferry__bind_inline(&l) == 0) {
        if (live)
            *live = bound;
        return 0;
    }
    return ferry__loops_live(bound) ? -EPERM : 0;
}

/* ---- Lock ----------------------------------------------------------- */

/*
 * Who holds what.  A held lock is on its loop's list of held locks, and
 * each task counts the locks it holds; when a task ends with a count above
 * zero, ferry__task_locks_died() finds its locks on that list and breaks
 * them.  A lock handed from one task to the next stays on the list, so a
 * contended handoff costs two counter updates, no list operation, and
 * touches nothing of the new holder beyond the cache line the grant writes
 * anyway.
 */

/* Make `t` the holder of the free lock. */
static void lock_take(ferry_lock *lock, struct ferry_task *t)
{
    lock->owner = t;
    t->locks++;
    ferry__list_push_back(&t->loop->held_locks, &lock->held);
}

/* The holder lets go: the first waiting task holds the lock next (FIFO
 * handoff, so no newcomer can overtake it), or the lock is free. */
static void lock_pass(ferry_lock *lock)
{
    struct ferry__waiter *w;

    lock->owner->locks--;
    w = ferry__first_waiting(&lock->waiters);
    if (w) {
        lock->owner = w->task;
        w->task->locks++;
        ferry__grant(w, 0);
    } else {
        lock->owner = NULL;
        ferry__list_remove(&lock->held);
    }
}

void ferry__lock_forget(ferry_loop *loop, const void *lock)
{
    for (unsigned i = 0; i < loop->nbroken; i++) {
        if (loop->broken[i].lock == lock) {
            memmove(&loop->broken[i], &loop->broken[i + 1],
                    (loop->nbroken - i - 1) * sizeof loop->broken[0]);
            loop->nbroken--;
            return;
        }
    }
}

/* Keep the lock `t` broke for the dump: the most recent FERRY__BROKEN_KEPT,
 * so that locks freed without ferry_lock_destroy() cannot grow the loop.
 * An older entry at the same address (a lock initialised again without
 * being destroyed) is replaced. */
static void lock_keep_broken(ferry_loop *loop, const ferry_lock *lock, const ferry_task *t)
{
    struct ferry__broken_lock *b;

    ferry__lock_forget(loop, lock);
    if (loop->nbroken == FERRY__BROKEN_KEPT) {
        memmove(&loop->broken[0], &loop->broken[1],
                (FERRY__BROKEN_KEPT - 1) * sizeof loop->broken[0]);
        loop->nbroken--;
        loop->broken_dropped++;
    }
    b = &loop->broken[loop->nbroken++];
    b->lock = lock;
    b->task_id = t->id;
    memcpy(b->name, t->name, sizeof b->name);
}

void ferry__lock_dump_broken(ferry_loop *loop, FILE *out)
{
    if (loop->nbroken == 0)
        return;
    fprintf(out, "ferry: %u broken lock(s)", loop->nbroken);
    if (loop->broken_dropped)
        fprintf(out, " (and %llu earlier, not kept)", (unsigned long long)loop->broken_dropped);
    fprintf(out, "\n");
    for (unsigned i = 0; i < loop->nbroken; i++)
        fprintf(out, "  lock %p broken by task #%llu '%s'\n", loop->broken[i].lock,
                (unsigned long long)loop->broken[i].task_id, loop->broken[i].name);
}

/*
 * Its holder ended: break the lock and wake every waiter with -EOWNERDEAD;
 * later acquirers get it too.  The holder is gone by the time anyone sees
 * that error, so its name is logged now and kept for the dump.
 */
static void lock_owner_died(ferry_lock *lock)
{
    ferry_task *t = lock->owner;

    ferry__log(FERRY_LOG_ERROR,
               "task #%llu '%s' ended holding lock %p: the lock is broken, "
               "its waiters and later acquirers get -EOWNERDEAD",
               (unsigned long long)t->id, t->name, (void *)lock);
    lock_keep_broken(t->loop, lock, t);
    t->locks--;
    lock->owner = NULL;
    lock->broken = true;
    ferry__list_remove(&lock->held);
    ferry__waitq_grant_all(&lock->waiters, -EOWNERDEAD);
}

void ferry__task_locks_died(ferry_task *t)
{
    struct ferry__link *l, *tmp;

    ferry__list_foreach_safe(l, tmp, &t->loop->held_locks) {
        ferry_lock *lock = ferry__container_of(l, ferry_lock, held);

        if (lock->owner == t) {
            lock_owner_died(lock);
            if (t->locks == 0)
                return;
        }
    }
}

bool ferry__lock_idle(const ferry_lock *lock)
{
    return lock->owner == NULL && ferry__waitq_empty(&lock->waiters);
}

int ferry_lock_init(ferry_lock *lock)
{
    if (lock == NULL)
        return -EINVAL;
    memset(lock, 0, sizeof(*lock));
    return 0;
}

int ferry_lock_destroy(ferry_lock *lock)
{
    ferry_loop *live;
    int rc;

    if (lock == NULL)
        return -EINVAL;
    rc = ferry__bound_here(lock->loop, &live);
    if (rc)
        return rc;
    if (!ferry__lock_idle(lock))
        return -EBUSY;
    if (lock->broken && live)
        ferry__lock_forget(live, lock);
    memset(lock, 0, sizeof(*lock));
    return 0;
}

/* The bodies of ferry__lock_acquire_task() and ferry__lock_release_task(),
 * inlined into ferry_lock_acquire() and ferry_lock_release(). */
static inline __attribute__((always_inline)) int lock_acquire(ferry_lock *lock,
                                                              struct ferry_task *self)
{
    struct ferry__waiter w;
    int rc;

    rc = ferry__bind_task(&lock->loop, self);
    if (rc)
        return rc;
    if (lock->broken)
        return -EOWNERDEAD;
    if (lock->owner == self)
        return -EDEADLK;
    if (lock->owner == NULL) {
        /* Free means nobody waits: lock_pass() never leaves a waiter
         * behind a free lock.  Still a cancellation point. */
        rc = ferry__check_inline(self);
        if (rc)
            return rc;
        lock_take(lock, self);
        return 0;
    }
    /* ferry__wait() checks for cancellation first. */
    ferry__waiter_init(&w, self, "lock", lock);
    rc = ferry__wait_inline(&lock->waiters, &w, FERRY_NEVER);
    if (rc != 0 && w.state == FERRY__W_GRANTED && w.result == 0) {
        /* Handed the lock, then cancelled before running: we hold it, and
         * must give it to the next waiter (bpo-27585). */
        lock_pass(lock);
    }
    return rc;
}

int ferry__lock_try_acquire_task(ferry_lock *lock, struct ferry_task *self)
{
    int rc;

    rc = ferry__bind_task(&lock->loop, self);
    if (rc)
        return rc;
    if (lock->broken)
        return -EOWNERDEAD;
    if (lock->owner == self)
        return -EDEADLK;
    if (lock->owner != NULL)
        return -EAGAIN;
    lock_take(lock, self);
    return 0;
}

static inline __attribute__((always_inline)) int lock_release(ferry_lock *lock,
                                                              struct ferry_task *self)
{
    int rc;

    if (lock->loop == NULL)
        return -EPERM; /* never used, so not held */
    rc = ferry__bind_task(&lock->loop, self);
    if (rc)
        return rc;
    if (lock->owner != self)
        return -EPERM;
    lock_pass(lock);
    return 0;
}

int ferry__lock_acquire_task(ferry_lock *lock, struct ferry_task *self)
{
    return lock_acquire(lock, self);
}

int ferry__lock_release_task(ferry_lock *lock, struct ferry_task *self)
{
    return lock_release(lock, self);
}

int ferry_lock_acquire(ferry_lock *lock)
{
    struct ferry_task *self;
    int rc;

    if (lock == NULL)
        return -EINVAL;
    rc = ferry__enter_task_inline(&self);
    if (rc)
        return rc;
    ferry__fuzz_point(self);
    return lock_acquire(lock, self);
}

int ferry_lock_try_acquire(ferry_lock *lock)
{
    struct ferry_task *self;
    int rc;

    if (lock == NULL)
        return -EINVAL;
    rc = ferry__enter_task_inline(&self);
    if (rc)
        return rc;
    return ferry__lock_try_acquire_task(lock, self);
}

int ferry_lock_release(ferry_lock *lock)
{
    struct ferry_task *self;
    int rc;

    if (lock == NULL)
        return -EINVAL;
    rc = ferry__enter_task_inline(&self);
    if (rc)
        return rc;
    return lock_release(lock, self);
}

bool ferry_lock_locked(const ferry_lock *lock)
{
    return lock != NULL && (lock->owner != NULL || lock->broken);
}

/* ---- Semaphore ------------------------------------------------------ */

/*
 * Serve waiters from the head while their whole request fits.  Stops at the
 * first that does not fit: no barging past a large head request.
 */
static void sem_serve(ferry_sem *sem)
{
    struct ferry__waiter *w;

    while ((w = ferry__first_waiting(&sem->waiters)) != NULL && w->n <= sem->value) {
        sem->value -= w->n;
        sem->pending += w->n;
        ferry__grant(w, 0);
    }
}

/*
 * Permits come back (a release, or a grant handed back by a waiter that was
 * cancelled before it ran): they first pay off the permits out above a
 * lowered total, then become available to the waiters at the head.
 */
static inline void sem_put(ferry_sem *sem, uint64_t n)
{
    if (__builtin_expect(sem->debt != 0, 0)) {
        uint64_t paid = n < sem->debt ? n : sem->debt;

        sem->debt -= paid;
        n -= paid;
    }
    sem->value += n;
    sem_serve(sem);
}

int ferry_sem_init(ferry_sem *sem, uint64_t value, unsigned flags)
{
    if (sem == NULL || (flags & ~(unsigned)FERRY_SEM_BOUNDED))
        return -EINVAL;
    memset(sem, 0, sizeof(*sem));
    sem->value = value;
    if (flags & FERRY_SEM_BOUNDED) {
        sem->bounded = true;
        sem->max = value;
    }
    return 0;
}

int ferry_sem_destroy(ferry_sem *sem)
{
    int rc;

    if (sem == NULL)
        return -EINVAL;
    rc = ferry__bound_here(sem->loop, NULL);
    if (rc)
        return rc;
    if (!ferry__waitq_empty(&sem->waiters) || sem->pending)
        return -EBUSY;
    sem->loop = NULL;
    return 0;
}

int ferry_sem_acquire_n(ferry_sem *sem, uint64_t n)
{
    struct ferry_task *self;
    struct ferry__waiter w;
    int rc;

    if (sem == NULL)
        return -EINVAL;
    rc = ferry__enter_task_inline(&self);
    if (rc)
        return rc;
    ferry__fuzz_point(self);
    rc = ferry__bind_task(&sem->loop, self);
    if (rc)
        return rc;
    if (n == 0 || (sem->bounded && n > sem->max))
        return -EINVAL;
    rc = ferry__check_inline(self);
    if (rc)
        return rc;
    if (sem->value >= n && ferry__first_waiting(&sem->waiters) == NULL) {
        sem->value -= n;
        return 0;
    }
    ferry__waiter_init(&w, self, "semaphore", sem);
    w.n = n;
    rc = ferry__wait(&sem->waiters, &w, FERRY_NEVER);
    if (w.state == FERRY__W_GRANTED) {
        sem->pending -= n;
        if (rc != 0) {
            /* Granted, then cancelled before running: give the permits
             * back to whoever waits next, or they are lost.  Releases
             * keep room for them, so they cannot wrap the count. */
            sem_put(sem, n);
        }
    } else if (rc != 0) {
        /* Left the queue: if we were the head, the smaller requests
         * behind us may fit now, and nobody else would look. */
        sem_serve(sem);
    }
    return rc;
}

int ferry_sem_acquire(ferry_sem *sem)
{
    return ferry_sem_acquire_n(sem, 1);
}

int ferry_sem_try_acquire_n(ferry_sem *sem, uint64_t n)
{
    int rc;

    if (sem == NULL)
        return -EINVAL;
    rc = ferry__bind_inline(&sem->loop);
    if (rc)
        return rc;
    if (n == 0 || (sem->bounded && n > sem->max))
        return -EINVAL;
    if (sem->value < n || ferry__first_waiting(&sem->waiters) != NULL)
        return -EAGAIN;
    sem->value -= n;
    return 0;
}

int ferry_sem_try_acquire(ferry_sem *sem)
{
    return ferry_sem_try_acquire_n(sem, 1);
}

int ferry_sem_release_n(ferry_sem *sem, uint64_t n)
{
    int rc;

    if (sem == NULL)
        return -EINVAL;
    rc = ferry__bind_inline(&sem->loop);
    if (rc)
        return rc;
    if (n == 0)
        return -EINVAL;
    /* Unbounded: the count may not pass UINT64_MAX, the permits granted
     * to waiters that have not run yet included, so that a grant handed
     * back by a cancelled waiter cannot wrap it.  value + pending never
     * exceeds UINT64_MAX, so the difference does not wrap. */
    if (!sem->bounded && n > UINT64_MAX - sem->value - sem->pending)
        return -EOVERFLOW;
    /* Bounded: at most the permits out may come back, less those granted
     * to waiters that have not run yet: only their waiter gives them back,
     * when it is cancelled.  The permits out are the total plus the debt
     * less the permits available; the sum cannot overflow, since the total
     * and the debt together never exceed the largest total set. */
    if (sem->bounded && n > sem->max + sem->debt - sem->value - sem->pending)
        return -EOVERFLOW;
    sem_put(sem, n);
    return 0;
}

int ferry_sem_set_total(ferry_sem *sem, uint64_t total)
{
    struct ferry__link *l;
    uint64_t cut, taken;
    int rc;

    if (sem == NULL)
        return -EINVAL;
    rc = ferry__bind_inline(&sem->loop);
    if (rc)
        return rc;
    if (!sem->bounded || total == 0)
        return -EINVAL;
    /* Every waiting request fits the total, as ferry_sem_acquire_n()
     * demands of a new one: a waiter at the head that never could get in
     * would block everyone behind it. */
    ferry__list_foreach(l, &sem->waiters.head) {
        struct ferry__waiter *w = ferry__container_of(l, struct ferry__waiter, link);

        if (w->state == FERRY__W_WAITING && w->n > total)
            return -EBUSY;
    }
    if (total >= sem->max) {
        uint64_t added = total - sem->max;

        sem->max = total;
        sem_put(sem, added);
        return 0;
    }
    /* Lowering: take what is available, owe the rest. */
    cut = sem->max - total;
    taken = cut < sem->value ? cut : sem->value;
    sem->max = total;
    sem->value -= taken;
    sem->debt += cut - taken;
    return 0;
}

int ferry_sem_release(ferry_sem *sem)
{
    return ferry_sem_release_n(sem, 1);
}

uint64_t ferry_sem_value(const ferry_sem *sem)
{
    return sem ? sem->value : 0;
}

/* ---- Event ---------------------------------------------------------- */

int ferry_event_init(ferry_event *ev)
{
    if (ev == NULL)
        return -EINVAL;
    memset(ev, 0, sizeof(*ev));
    return 0;
}

int ferry_event_destroy(ferry_event *ev)
{
    int rc;

    if (ev == NULL)
        return -EINVAL;
    rc = ferry__bound_here(ev->loop, NULL);
    if (rc)
        return rc;
    if (!ferry__waitq_empty(&ev->waiters))
        return -EBUSY;
    ev->loop = NULL;
    return 0;
}

int ferry_event_set(ferry_event *ev)
{
    int rc;

    if (ev == NULL)
        return -EINVAL;
    rc = ferry__bind_inline(&ev->loop);
    if (rc)
        return rc;
    ev->set = true;
    /* Woken waiters return 0 whatever the flag is when they run. */
    ferry__waitq_grant_all(&ev->waiters, 0);
    return 0;
}

int ferry_event_clear(ferry_event *ev)
{
    int rc;

    if (ev == NULL)
        return -EINVAL;
    rc = ferry__bind_inline(&ev->loop);
    if (rc)
        return rc;
    ev->set = false;
    return 0;
}

bool ferry_event_is_set(const ferry_event *ev)
{
    return ev != NULL && ev->set;
}

int ferry_event_wait(ferry_event *ev)
{
    struct ferry_task *self;
    struct ferry__waiter w;
    int rc;

    if (ev == NULL)
        return -EINVAL;
    rc = ferry__enter_task_inline(&self);
    if (rc)
        return rc;
    ferry__fuzz_point(self);
    rc = ferry__bind_task(&ev->loop, self);
    if (rc)
        return rc;
    rc = ferry__check_inline(self);
    if (rc || ev->set)
        return rc;
    ferry__waiter_init(&w, self, "event", ev);
    /* A set seen by a waiter that is then cancelled before running is
     * nobody else's: every waiter got its own wake-up. */
    return ferry__wait(&ev->waiters, &w, FERRY_NEVER);
}

/* ---- Condition ------------------------------------------------------ */

static ferry_lock *cond_lock(ferry_cond *cond)
{
    return cond->lock ? cond->lock : &cond->own;
}

/* Wake up to `n` waiting tasks; returns how many. */
static unsigned cond_wake(ferry_cond *cond, unsigned n)
{
    struct ferry__waiter *w;
    unsigned woken = 0;

    while (woken < n && (w = ferry__first_waiting(&cond->waiters)) != NULL) {
        cond->pending++;
        ferry__grant(w, 0);
        woken++;
    }
    return woken;
}

int ferry_cond_init(ferry_cond *cond, ferry_lock *lock)
{
    if (cond == NULL)
        return -EINVAL;
    memset(cond, 0, sizeof(*cond));
    cond->lock = lock;
    return 0;
}

int ferry_cond_destroy(ferry_cond *cond)
{
    ferry_loop *own_live = NULL;
    int rc;

    if (cond == NULL)
        return -EINVAL;
    rc = ferry__bound_here(cond->loop, NULL);
    if (rc)
        return rc;
    if (cond->lock == NULL) {
        rc = ferry__bound_here(cond->own.loop, &own_live);
        if (rc)
            return rc;
        if (!ferry__lock_idle(&cond->own))
            return -EBUSY;
    }
    if (!ferry__waitq_empty(&cond->waiters) || cond->pending)
        return -EBUSY;
    cond->loop = NULL;
    if (cond->lock == NULL) {
        if (cond->own.broken && own_live)
            ferry__lock_forget(own_live, &cond->own);
        memset(&cond->own, 0, sizeof(cond->own));
    }
    return 0;
}

ferry_lock *ferry_cond_lock(ferry_cond *cond)
{
    return cond ? cond_lock(cond) : NULL;
}

/* Checks shared by the condition's functions: in a task of the bound loop,
 * holding the lock. */
static int cond_enter(ferry_cond *cond, struct ferry_task **self)
{
    ferry_lock *lock;
    int rc;

    if (cond == NULL)
        return -EINVAL;
    rc = ferry__enter_task_inline(self);
    if (rc)
        return rc;
    rc = ferry__bind_task(&cond->loop, *self);
    if (rc)
        return rc;
    lock = cond_lock(cond);
    if (lock->owner != *self || lock->loop != cond->loop)
        return -EPERM;
    return 0;
}

int ferry_cond_wait(ferry_cond *cond)
{
    struct ferry_task *self;
    struct ferry__waiter w;
    ferry_scope shield;
    ferry_lock *lock;
    int rc, rc2;

    rc = cond_enter(cond, &self);
    if (rc)
        return rc;
    /* A task cancelled already returns with the lock held, untouched. */
    rc = ferry__check_inline(self);
    if (rc)
        return rc;
    lock = cond_lock(cond);
    ferry__waiter_init(&w, self, "condition", cond);
    ferry__lock_release_task(lock, self);
    rc = ferry__wait(&cond->waiters, &w, FERRY_NEVER);
    if (w.state == FERRY__W_GRANTED) {
        cond->pending--;
        if (rc != 0) {
            /* Notified, then cancelled before running: the notification
             * goes to another waiter (gh-112202). */
            cond_wake(cond, 1);
        }
    }
    /* Hold the lock again on every return, also when cancelled or past a
     * deadline: the re-acquire cannot be interrupted. */
    ferry_scope_enter(&shield, FERRY_NEVER, FERRY_SCOPE_SHIELD);
    rc2 = ferry__lock_acquire_task(lock, self);
    ferry_scope_exit(&shield);
    return rc2 ? rc2 : rc;
}

int ferry_cond_wait_for(ferry_cond *cond, ferry_cond_pred pred, void *arg)
{
    struct ferry_task *self;
    int rc;

    if (pred == NULL)
        return -EINVAL;
    rc = cond_enter(cond, &self);
    if (rc)
        return rc;
    rc = ferry__check_inline(self);
    while (rc == 0 && !pred(arg))
        rc = ferry_cond_wait(cond);
    return rc;
}

int ferry_cond_notify(ferry_cond *cond, unsigned n)
{
    struct ferry_task *self;
    unsigned woken;
    int rc;

    rc = cond_enter(cond, &self);
    if (rc)
        return rc;
    woken = cond_wake(cond, n);
    return woken > (unsigned)INT32_MAX ? INT32_MAX : (int)woken;
}

int ferry_cond_notify_all(ferry_cond *cond)
{
    return ferry_cond_notify(cond, ~0u);
}
