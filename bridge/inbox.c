/* inbox.c - call_soon_threadsafe: the one channel from threads into a loop.
 *
 * Any thread posts a callback (or a completion node, which cannot fail);
 * the loop runs them.  Posts go into an array under a mutex (no node, no
 * allocation per post: the array grows in amortised steps and is reused by
 * double buffering), completions into an intrusive list.  The loop is woken
 * through an eventfd (a pipe where there is none) that is written only when
 * the loop is not already awake:
 *
 *   `woken` (under mu) means "a drain of the queue is guaranteed to come":
 *   an eventfd write is on its way, a drain step is scheduled, or a drain
 *   is running and will look at the queue again under mu before it ends.
 *   A poster sets it and writes the eventfd only if it was clear.  The
 *   drain clears it only under mu, after finding the queue empty.  The
 *   eventfd is read at the start of the event callback, before the queue is
 *   looked at, so a write that lands while the loop drains stays readable
 *   and only costs an extra, empty drain (TESTING.md 2.1).
 *
 * The loop drains in steps of at most FERRY__DRAIN_BATCH items.  The first
 * step runs directly in the eventfd's callback (no timer, no allocation per
 * wakeup: a completion wakes its task in the same poll).  Whatever is left
 * over runs in further steps, each a zero-delay ferry_call_later()
 * callback, so I/O and timers are polled between steps: a flood of posts
 * cannot starve them.  The blocked-loop detector times the loop's own
 * steps; the items of a direct drain run outside them, so drain() times
 * each of those itself and reports it as the loop does.
 *
 * Staying awake a little, when the loop has nothing else to run (no ready
 * task, no timer due, not stopping), so that busy posters need no wakeup:
 *   - gather(): a small batch from a poster on another CPU: wait about a
 *     microsecond before taking the next one (fewer lock and buffer
 *     handovers, which cost the poster cache misses);
 *   - yield_to_waker(): the queue is empty and the thread that last had to
 *     wake us runs on our CPU: give it the CPU once, then look again;
 *   - ferry__inbox_spin() (pool.c's flush, when a spinning worker took a
 *     task's job): poll for the completion instead of sleeping in epoll;
 *     `spinning` (under mu) tells posters to leave the drain to it rather
 *     than write the eventfd.
 * The first two keep `woken` set and look at the queue again under mu
 * before clearing it; the third decides under mu too, so in every case a
 * post either finds a drain that will see it or writes the eventfd.
 *
 * Closing (ferry_loop_free): refuse posts, then run every accepted post and
 * wait for every reserved completion (jobs submitted to run their callback
 * on this loop), then free the events.  The inbox memory and the eventfd
 * live until the last reference goes (the loop's, and ferry_inbox_get's).
 *
 * Lock order: see bridge_int.h; this file takes ferry_inbox.mu only and
 * never calls out while holding it.
 */
#define _GNU_SOURCE 1           /* sched_getcpu */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>

#include <event2/event.h>

#include "bridge_int.h"
#include "wakefd.h"

/* Items run per drain step before I/O and timers get a turn. */
#define FERRY__DRAIN_BATCH 1024

struct post {
    ferry_cb cb;   /* callback */
    void    *arg;  /* its argument */
};

struct ferry_inbox {
    pthread_mutex_t      mu;         /* guards the fields marked "mu" */
    pthread_cond_t       idle;       /* close() waits here for reserved completions */
    struct post         *q;          /* mu: posts not yet taken by the loop, FIFO */
    size_t               qlen;       /* mu */
    size_t               qcap;       /* mu */
    struct ferry__cnode *chead;      /* mu: completions not yet taken, FIFO */
    struct ferry__cnode **ctail;     /* mu */
    size_t               reserved;   /* mu: completions promised by jobs in flight */
    bool                 woken;      /* mu: a drain is guaranteed to come (see top) */
    bool                 closed;     /* mu: posts are refused */
    bool                 ev_gone;    /* mu: ev was freed: no event_active() any more */
    bool                 closer_waits; /* mu: close() sleeps on `idle` */
    bool                 stop_queued;/* mu: stop_node is in the completion list */
    bool                 spinning;   /* mu: the loop waits in ferry__inbox_spin() */
    bool                 spin_kicked;/* mu: a poster found it waiting: the drain is owed */
    atomic_bool          kick;       /* spin_kicked, published: set by posters (under mu),
                                      * cleared (under mu) and polled by the loop */
    atomic_int           waker_cpu;  /* CPU of the last thread that wrote the eventfd:
                                      * set by posters, read by the loop (a hint) */
    uint64_t             posts;      /* mu: accepted posts and completions */
    uint64_t             wakeups;    /* mu: eventfd writes */
    uint64_t             write_errors; /* mu: failed eventfd writes */
    uint64_t             drains;     /* mu: batches taken by the loop */
    uint64_t             run;        /* mu: items run (added once per step) */
    size_t               max_batch;  /* mu: most items run in one step */
    struct ferry__cnode  stop_node;  /* posted by ferry_loop_stop_threadsafe() */
    atomic_uint          refs;       /* the loop's (dropped by close) + ferry_inbox_get's */
    struct ferry__wakefd fd;         /* eventfd or pipe, -1 if none (attached base); wfd
                                      * written under mu; closed by the last ref */
    const void          *owner;      /* identity of the loop's thread; set once */
    ferry_loop          *loop;       /* set once; used on the loop thread, and by
                                      * ferry__loop_is_fork_copy() under mu while
                                      * not closed */

    /* loop thread only */
    struct event        *ev;         /* EV_READ|EV_PERSIST on fd.rfd */
    ferry_timer         *step;       /* the scheduled drain step, or NULL */
    struct post         *lq;         /* posts taken from q, being run */
    size_t               lhead;      /* next to run in lq */
    size_t               llen;       /* items in lq */
    size_t               lcap;       /* capacity of lq */
    struct ferry__cnode *lc;         /* completions taken, being run */
    struct ferry__link   closers;    /* struct ferry__closer, run by close() */
    bool                 draining;   /* inside drain() */
    bool                 closing;    /* close() has begun */

    /* Room for the per-loop state of other parts of the bridge (the
     * pools' list of jobs to hand over), sized by ferry__inbox_new()'s
     * caller; all-zero at first.  Loop thread only. */
    max_align_t          ext[];
};

/* Its address identifies the calling thread. */
static _Thread_local char tls_token;

/* ==== any thread ======================================================= */

static bool on_loop_thread(const struct ferry_inbox *ib)
{
    return ib->owner == &tls_token;
}

/* Requires mu.  True once posts are refused: the loop has closed, or this
 * is a forked child, whose copy of the loop never runs and whose eventfd
 * is the parent's (docs/fork.md).  While the inbox is not closed the loop
 * exists, and so does the page of its fork mark. */
static bool refused_locked(const struct ferry_inbox *ib)
{
    return ib->closed || ferry__loop_is_fork_copy(ib->loop);
}

/*
 * Make sure a drain comes.  Requires mu; sets nothing but counters.
 * Returns 0 or the errno of a failed eventfd write (the caller logs it
 * after unlocking; the loop was woken through libevent instead).
 */
static int wake_locked(struct ferry_inbox *ib)
{
    int err;

    if (on_loop_thread(ib)) {
        /* No system call: activate the event (its callback schedules a
         * drain step), unless a drain is running: it re-checks the queue
         * under mu before it ends.  close() drains until empty itself. */
        if (!ib->draining && !ib->ev_gone)
            event_active(ib->ev, EV_READ, 1);
        return 0;
    }
    if (ib->spinning) {
        /* The loop polls `kick` in ferry__inbox_spin() and drains when it
         * sees it, or when it stops waiting (under mu): no system call. */
        ib->spin_kicked = true;
        atomic_store_explicit(&ib->kick, true, memory_order_release);
        return 0;
    }
    ib->wakeups++;
    atomic_store_explicit(&ib->waker_cpu, sched_getcpu(), memory_order_relaxed);
    if (ib->fd.wfd < 0) {
        /* Attached base: libevent's own (coalescing) notification. */
        if (!ib->ev_gone)
            event_active(ib->ev, EV_READ, 1);
        return 0;
    }
    err = ferry__fault_point("eventfd write") ? EIO : ferry__wakefd_write(ib->fd.wfd);
    if (!err)
        return 0;
    ib->write_errors++;
    /* Wake through libevent's own notification instead (thread-safe once
     * evthread_use_pthreads() ran).  The event exists until close() has
     * refused new posts and run the old ones. */
    if (!ib->ev_gone)
        event_active(ib->ev, EV_READ, 1);
    return err;
}

static void log_write_error(int err)
{
    if (err)
        ferry__log(FERRY_LOG_ERROR,
                   "call_soon_threadsafe: waking the loop failed: eventfd write: %s; "
                   "woken through libevent instead", strerror(err));
}

static int grow_locked(struct ferry_inbox *ib)
{
    size_t ncap = ib->qcap ? ib->qcap * 2 : 256;
    struct post *nq;

    if (ncap < ib->qcap || ncap > SIZE_MAX / sizeof *nq)
        return -ENOMEM;
    nq = ferry__realloc(ib->q, ncap * sizeof *nq);
    if (!nq)
        return -ENOMEM;
    ib->q = nq;
    ib->qcap = ncap;
    return 0;
}

int ferry__inbox_post(struct ferry_inbox *ib, ferry_cb cb, void *arg)
{
    int err = 0;

    pthread_mutex_lock(&ib->mu);
    if (refused_locked(ib)) {
        pthread_mutex_unlock(&ib->mu);
        return -ESHUTDOWN;
    }
    if (ib->qlen == ib->qcap && grow_locked(ib)) {
        pthread_mutex_unlock(&ib->mu);
        return -ENOMEM;
    }
    ib->q[ib->qlen].cb = cb;
    ib->q[ib->qlen].arg = arg;
    ib->qlen++;
    ib->posts++;
    if (!ib->woken) {
        ib->woken = true;
        err = wake_locked(ib);
    }
    pthread_mutex_unlock(&ib->mu);
    log_write_error(err);
    return 0;
}

/* Requires mu. */
static int complete_locked(struct ferry_inbox *ib, struct ferry__cnode *n)
{
    n->next = NULL;
    *ib->ctail = n;
    ib->ctail = &n->next;
    ib->posts++;
    if (!ib->woken) {
        ib->woken = true;
        return wake_locked(ib);
    }
    return 0;
}

void ferry__inbox_complete(struct ferry_inbox *ib, struct ferry__cnode *n)
{
    int err;

    pthread_mutex_lock(&ib->mu);
    err = complete_locked(ib, n);
    pthread_mutex_unlock(&ib->mu);
    log_write_error(err);
}

int ferry__inbox_reserve(struct ferry_inbox *ib)
{
    int rc = 0;

    pthread_mutex_lock(&ib->mu);
    if (refused_locked(ib))
        rc = -ESHUTDOWN;
    else
        ib->reserved++;
    pthread_mutex_unlock(&ib->mu);
    return rc;
}

void ferry__inbox_unreserve(struct ferry_inbox *ib)
{
    pthread_mutex_lock(&ib->mu);
    ib->reserved--;
    if (ib->closer_waits)
        pthread_cond_signal(&ib->idle);
    pthread_mutex_unlock(&ib->mu);
}

void ferry__inbox_complete_reserved(struct ferry_inbox *ib, struct ferry__cnode *n)
{
    int err;

    pthread_mutex_lock(&ib->mu);
    ib->reserved--;
    err = complete_locked(ib, n);
    if (ib->closer_waits)
        pthread_cond_signal(&ib->idle);
    pthread_mutex_unlock(&ib->mu);
    log_write_error(err);
}

void ferry__inbox_complete_chain(struct ferry_inbox *ib, struct ferry__cnode *first,
                                 struct ferry__cnode *last, size_t n, size_t reserved)
{
    int err = 0;

    last->next = NULL;
    pthread_mutex_lock(&ib->mu);
    ib->reserved -= reserved;
    *ib->ctail = first;
    ib->ctail = &last->next;
    ib->posts += n;
    if (!ib->woken) {
        ib->woken = true;
        err = wake_locked(ib);
    }
    if (reserved && ib->closer_waits)
        pthread_cond_signal(&ib->idle);
    pthread_mutex_unlock(&ib->mu);
    log_write_error(err);
}

void ferry__inbox_ref(struct ferry_inbox *ib)
{
    atomic_fetch_add_explicit(&ib->refs, 1, memory_order_relaxed);
}

void ferry_inbox_release(struct ferry_inbox *ib)
{
    if (!ib)
        return;
    if (atomic_fetch_sub_explicit(&ib->refs, 1, memory_order_acq_rel) != 1)
        return;
    /* Last reference: the loop has closed (it held one until then), so no
     * thread posts and no event refers to the descriptors. */
    ferry__wakefd_close(&ib->fd);
    pthread_cond_destroy(&ib->idle);
    pthread_mutex_destroy(&ib->mu);
    ferry__free(ib->q);
    ferry__free(ib->lq);
    ferry__free(ib);
}

struct ferry_inbox *ferry__inbox_of(ferry_loop *loop)
{
    return loop ? ferry__loop_bridge(loop) : NULL;
}

ferry_loop *ferry__inbox_loop(const struct ferry_inbox *ib)
{
    return ib->loop;
}

int ferry_loop_call_soon_threadsafe(ferry_loop *loop, ferry_cb cb, void *arg)
{
    struct ferry_inbox *ib = ferry__inbox_of(loop);

    if (!loop || !cb)
        return -EINVAL;
    if (!ib)
        return -ESHUTDOWN;
    return ferry__inbox_post(ib, cb, arg);
}

int ferry_inbox_post(ferry_inbox *ib, ferry_cb cb, void *arg)
{
    if (!ib || !cb)
        return -EINVAL;
    return ferry__inbox_post(ib, cb, arg);
}

int ferry_inbox_get(ferry_inbox **out, ferry_loop *loop)
{
    struct ferry_inbox *ib;
    int rc = 0;

    if (!out || !loop)
        return -EINVAL;
    *out = NULL;
    ib = ferry__inbox_of(loop);
    if (!ib)
        return -ESHUTDOWN;
    pthread_mutex_lock(&ib->mu);
    if (refused_locked(ib))
        rc = -ESHUTDOWN;
    else
        ferry__inbox_ref(ib);
    pthread_mutex_unlock(&ib->mu);
    if (!rc)
        *out = ib;
    return rc;
}

static void stop_run(struct ferry__cnode *n)
{
    struct ferry_inbox *ib = ferry__container_of(n, struct ferry_inbox, stop_node);

    pthread_mutex_lock(&ib->mu);
    ib->stop_queued = false;
    pthread_mutex_unlock(&ib->mu);
    ferry_loop_stop(ib->loop);
}

int ferry_loop_stop_threadsafe(ferry_loop *loop)
{
    struct ferry_inbox *ib = ferry__inbox_of(loop);
    int rc = 0, err = 0;

    if (!loop)
        return -EINVAL;
    if (!ib)
        return -ESHUTDOWN;
    pthread_mutex_lock(&ib->mu);
    if (refused_locked(ib)) {
        rc = -ESHUTDOWN;
    } else if (!ib->stop_queued) {
        ib->stop_queued = true;
        ib->stop_node.fn = stop_run;
        err = complete_locked(ib, &ib->stop_node);
    }
    pthread_mutex_unlock(&ib->mu);
    log_write_error(err);
    return rc;
}

int ferry_inbox_stats_get(ferry_inbox *ib, ferry_inbox_stats *out)
{
    if (!ib || !out)
        return -EINVAL;
    pthread_mutex_lock(&ib->mu);
    out->posts = ib->posts;
    out->wakeups = ib->wakeups;
    out->write_errors = ib->write_errors;
    out->drains = ib->drains;
    out->run = ib->run;
    out->max_batch = ib->max_batch;
    pthread_mutex_unlock(&ib->mu);
    return 0;
}

int ferry_loop_inbox_stats(ferry_loop *loop, ferry_inbox_stats *out)
{
    struct ferry_inbox *ib = ferry__inbox_of(loop);

    if (!loop || !out)
        return -EINVAL;
    if (!ib)
        return -ESHUTDOWN;
    return ferry_inbox_stats_get(ib, out);
}

/* ==== loop thread ====================================================== */

bool ferry__inbox_closing(const struct ferry_inbox *ib)
{
    return ib->closing;
}

/* Requires mu. */
static void account_locked(struct ferry_inbox *ib, size_t n)
{
    ib->run += n;
    if (n > ib->max_batch)
        ib->max_batch = n;
}

/*
 * The blocked-loop detector for an item that ran outside the loop's steps
 * (a direct drain): the loop reports it as it reports a slow callback of
 * its own.  Returns the time the next item starts.
 */
static int64_t check_slow(struct ferry_inbox *ib, int64_t t0)
{
    int64_t t1 = ferry_now(), slow = ferry__loop_slow_threshold(ib->loop);

    if (slow && t1 - t0 > slow)
        ferry__loop_report_slow(ib->loop, t1 - t0, slow, NULL);
    return t1;
}

static bool yield_to_waker(struct ferry_inbox *ib);
static void gather(struct ferry_inbox *ib);
#define GATHER_MIN 64

/*
 * Run up to `budget` items.  Completions first (they wake tasks), then
 * posts in order.  `timed`: the caller is not a step of the loop, so each
 * item is timed here while the loop's detector is on.  Returns true if
 * items are left over: `woken` stays set and the caller schedules another
 * step.
 */
static bool drain(struct ferry_inbox *ib, size_t budget, bool timed, bool may_yield)
{
    size_t n = 0;
    bool left = true;
    int64_t t0 = 0;

    ib->draining = true;
    if (timed && ferry__loop_slow_threshold(ib->loop))
        t0 = ferry_now();
    for (;;) {
        while (ib->lc && n < budget) {
            struct ferry__cnode *c = ib->lc;
            ib->lc = c->next;
            c->fn(c);
            n++;
            if (t0)
                t0 = check_slow(ib, t0);
        }
        while (ib->lhead < ib->llen && n < budget) {
            struct post p = ib->lq[ib->lhead++];
            p.cb(p.arg);
            n++;
            if (t0)
                t0 = check_slow(ib, t0);
        }
        if (ib->lc || ib->lhead < ib->llen) {
            pthread_mutex_lock(&ib->mu);
            break;                      /* budget spent */
        }
        if (may_yield && ib->llen && ib->llen < GATHER_MIN && n < budget)
            gather(ib);
        ib->lhead = ib->llen = 0;

        pthread_mutex_lock(&ib->mu);
        if (!ib->chead && !ib->qlen && may_yield && n < budget) {
            may_yield = false;
            pthread_mutex_unlock(&ib->mu);
            yield_to_waker(ib);         /* `woken` stays set meanwhile */
            pthread_mutex_lock(&ib->mu);
        }
        if (!ib->chead && !ib->qlen) {
            ib->woken = false;          /* only here, under mu, queue empty */
            left = false;
            break;
        }
        /* Take everything in O(1): the list, and the array by swapping
         * buffers (the emptied one goes back to the posters). */
        ib->lc = ib->chead;
        ib->chead = NULL;
        ib->ctail = &ib->chead;
        {
            struct post *tq = ib->lq;
            size_t tcap = ib->lcap;
            ib->lq = ib->q;
            ib->lcap = ib->qcap;
            ib->llen = ib->qlen;
            ib->q = tq;
            ib->qcap = tcap;
            ib->qlen = 0;
        }
        ib->drains++;
        if (n >= budget)
            break;
        pthread_mutex_unlock(&ib->mu);
    }
    account_locked(ib, n);
    pthread_mutex_unlock(&ib->mu);
    ib->draining = false;
    return left;
}

static void schedule_step(struct ferry_inbox *ib);

/*
 * A drain took a small batch of posts and is about to take the next one.
 * If the thread that posts them runs on another CPU, wait a moment
 * without touching anything it writes, so that the next batch is larger:
 * each time the loop takes the lock and swaps the buffers, the poster's
 * next post misses the cache on the lock, the queue and its counters.
 * Loop thread, mu not held.
 */
static void gather(struct ferry_inbox *ib)
{
    int64_t t0;

    if (sched_getcpu() == atomic_load_explicit(&ib->waker_cpu, memory_order_relaxed) ||
        !ferry__inbox_loop_idle(ib, FERRY_USEC(2)))
        return;
    t0 = ferry_now();
    for (unsigned i = 1; (i & 15) || ferry_now() - t0 < FERRY_USEC(1); i++)
        ferry__cpu_relax();
}

/*
 * A drain has emptied the queue and is about to tell posters to wake the
 * loop again.  If the thread that last had to wake us runs on this very
 * CPU and the loop has nothing else to run, give it the CPU once first
 * (`woken` stays set, so it posts without waking us) and look again: a
 * thread that floods the loop from the same CPU then fills a large batch
 * in its time slice, instead of being preempted by the loop's wakeup after
 * every few posts (an eventfd write and two context switches each).  The
 * loop could not have run on that CPU meanwhile anyway.  Returns true if
 * the CPU was given up.  Loop thread, mu not held.
 */
static bool yield_to_waker(struct ferry_inbox *ib)
{
    if (sched_getcpu() != atomic_load_explicit(&ib->waker_cpu, memory_order_relaxed) ||
        !ferry__inbox_loop_idle(ib, 0))
        return false;
    sched_yield();
    return true;
}

bool ferry__inbox_loop_idle(const struct ferry_inbox *ib, int64_t horizon)
{
    return !ib->closing && ferry__loop_idle(ib->loop, horizon);
}

int ferry__inbox_spin(struct ferry_inbox *ib, int64_t budget,
                      bool (*give_up)(void *arg, int64_t waited), void *arg)
{
    int64_t t0, now;
    bool kicked;
    int rc = FERRY__SPIN_TIMEOUT;

    pthread_mutex_lock(&ib->mu);
    if (ib->woken || ib->closed) {
        pthread_mutex_unlock(&ib->mu);
        return FERRY__SPIN_GAVE_UP;    /* a drain is on its way already */
    }
    ib->spinning = true;
    atomic_store_explicit(&ib->kick, false, memory_order_relaxed);
    pthread_mutex_unlock(&ib->mu);
    t0 = ferry_now();
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(&ib->kick, memory_order_acquire))
            break;
        if ((i & 31) == 0) {
            now = ferry_now();
            if (now - t0 >= budget)
                break;
            if (give_up && give_up(arg, now - t0)) {
                rc = FERRY__SPIN_GAVE_UP;
                break;
            }
        }
        ferry__cpu_relax();
    }
    pthread_mutex_lock(&ib->mu);
    ib->spinning = false;
    kicked = ib->spin_kicked;
    ib->spin_kicked = false;
    pthread_mutex_unlock(&ib->mu);
    if (!kicked)
        return rc;
    /* A poster set `woken` and left the drain to us: do it now (this runs
     * inside a step of the loop, which the detector times as a whole). */
    if (drain(ib, FERRY__DRAIN_BATCH, false, false))
        schedule_step(ib);
    return FERRY__SPIN_KICKED;
}

static void step_cb(void *arg)
{
    struct ferry_inbox *ib = arg;

    ib->step = NULL;
    if (drain(ib, FERRY__DRAIN_BATCH, false, true))
        schedule_step(ib);
}

/* Schedule a drain step as a zero-delay timer of the loop: it runs after
 * the next poll of I/O and timers.  If that cannot be allocated, drain at
 * once instead (correct, only less fair). */
static void schedule_step(struct ferry_inbox *ib)
{
    if (ib->step || ib->closing)
        return;
    if (ferry_call_later(ib->loop, 0, step_cb, ib, &ib->step) != 0) {
        ib->step = NULL;
        if (!ib->draining)
            while (drain(ib, FERRY__DRAIN_BATCH, true, false))
                ;
    }
}

static void event_cb(evutil_socket_t fd, short what, void *arg)
{
    struct ferry_inbox *ib = arg;

    (void)what;
    /* Read first: a write that lands after this keeps the fd readable. */
    if (fd >= 0)
        ferry__wakefd_drain(fd);
    if (ib->draining || ib->step)
        return;                 /* a drain will look at the queue again */
    /* A loop attached to an application's base runs this inside the
     * application's dispatch, not inside ferry_loop_run(): keep the items
     * in steps of the loop there, where the loop's rules hold. */
    if (fd < 0) {
        schedule_step(ib);
        return;
    }
    if (drain(ib, FERRY__DRAIN_BATCH, true, true))
        schedule_step(ib);
}

bool ferry__inbox_pending(void *ctx)
{
    struct ferry_inbox *ib = ctx;
    bool p;

    if (ib->lc || ib->lhead < ib->llen || ib->step)
        return true;
    pthread_mutex_lock(&ib->mu);
    p = ib->chead || ib->qlen || ib->reserved;
    pthread_mutex_unlock(&ib->mu);
    return p;
}

void ferry__inbox_closer_add(struct ferry_inbox *ib, struct ferry__closer *c)
{
    ferry__list_push_back(&ib->closers, &c->link);
}

void ferry__inbox_closer_del(struct ferry__closer *c)
{
    ferry__list_remove(&c->link);
}

void ferry__inbox_close(void *ctx)
{
    struct ferry_inbox *ib = ctx;
    struct ferry__link *l;

    ib->closing = true;
    while ((l = ferry__list_pop_front(&ib->closers)) != NULL) {
        struct ferry__closer *c = ferry__container_of(l, struct ferry__closer, link);
        c->fn(c);
    }
    if (ib->step) {
        ferry_timer_cancel(ib->step);
        ib->step = NULL;
    }
    pthread_mutex_lock(&ib->mu);
    ib->closed = true;
    pthread_mutex_unlock(&ib->mu);
    for (;;) {
        while (drain(ib, SIZE_MAX, true, false))
            ;
        pthread_mutex_lock(&ib->mu);
        if (!ib->chead && !ib->qlen) {
            if (!ib->reserved) {
                ib->ev_gone = true;
                pthread_mutex_unlock(&ib->mu);
                break;
            }
            ib->closer_waits = true;
            pthread_cond_wait(&ib->idle, &ib->mu);
            ib->closer_waits = false;
        }
        pthread_mutex_unlock(&ib->mu);
    }
    event_free(ib->ev);
    ib->ev = NULL;
    /* The loop keeps the pointer: threads that still reach it find a
     * closed inbox (valid until the last reference goes). */
    ferry_inbox_release(ib);
}

int ferry__inbox_new(struct ferry_inbox **out, ferry_loop *loop, struct event_base *base,
                     bool own_base, size_t ext_size)
{
    struct ferry_inbox *ib;
    int rc;

    ib = ferry__calloc(1, sizeof *ib + ext_size);
    if (!ib)
        return -ENOMEM;
    ib->ctail = &ib->chead;
    ib->owner = &tls_token;
    ib->loop = loop;
    atomic_init(&ib->refs, 1);
    atomic_init(&ib->kick, false);
    atomic_init(&ib->waker_cpu, -1);
    /* A loop with its own base watches an eventfd.  One attached to an
     * application's event_base has none: it is woken through event_active()
     * on an event that is never added, because a registered eventfd would
     * keep the application's event_base_dispatch() running forever. */
    ib->fd.rfd = ib->fd.wfd = -1;
    if (own_base) {
        rc = ferry__wakefd_open(&ib->fd);
        if (rc)
            goto err_free;
    }
    if (pthread_mutex_init(&ib->mu, NULL)) {
        rc = -ENOMEM;
        goto err_close;
    }
    rc = ferry__cond_init(&ib->idle);
    if (rc)
        goto err_mutex;
    ib->ev = ib->fd.rfd >= 0
        ? event_new(base, ib->fd.rfd, EV_READ | EV_PERSIST, event_cb, ib)
        : event_new(base, -1, 0, event_cb, ib);
    if (!ib->ev) {
        rc = -ENOMEM;
        goto err_cond;
    }
    if (ib->fd.rfd >= 0 && event_add(ib->ev, NULL) < 0) {
        rc = -ENOMEM;
        goto err_event;
    }
    *out = ib;
    return 0;

err_event:
    event_free(ib->ev);
err_cond:
    pthread_cond_destroy(&ib->idle);
err_mutex:
    pthread_mutex_destroy(&ib->mu);
err_close:
    ferry__wakefd_close(&ib->fd);
err_free:
    ferry__free(ib);
    return rc;
}

/* ==== cross-thread wakes of one task =================================== */

bool ferry__inbox_on_loop(const struct ferry_inbox *ib)
{
    return on_loop_thread(ib);
}

void *ferry__inbox_ext(struct ferry_inbox *ib)
{
    return ib->ext;
}
