/* inbox_loop.c - the loop's side of its inbox: making it, draining what
 * threads posted, staying awake briefly for more, and closing it.
 * inbox_int.h has how the inbox works.
 * Loop thread.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>

#include <event2/event.h>

#include "inbox_int.h"

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
    int64_t t1 = ferry__now_real(), slow = ferry__loop_slow_threshold(ib->loop);

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
        t0 = ferry__now_real();
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
            break; /* budget spent */
        }
        if (may_yield && ib->llen && ib->llen < GATHER_MIN && n < budget)
            gather(ib);
        ib->lhead = ib->llen = 0;

        pthread_mutex_lock(&ib->mu);
        if (!ib->chead && !ib->qlen && may_yield && n < budget) {
            may_yield = false;
            pthread_mutex_unlock(&ib->mu);
            yield_to_waker(ib); /* `woken` stays set meanwhile */
            pthread_mutex_lock(&ib->mu);
        }
        if (!ib->chead && !ib->qlen) {
            ib->woken = false; /* only here, under mu, queue empty */
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
    t0 = ferry__now_real();
    for (unsigned i = 1; (i & 15) || ferry__now_real() - t0 < FERRY_USEC(1); i++)
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

    if (ib->fuzz)
        return FERRY__SPIN_GAVE_UP; /* completions come in at polls only */
    pthread_mutex_lock(&ib->mu);
    if (ib->woken || ib->closed) {
        pthread_mutex_unlock(&ib->mu);
        return FERRY__SPIN_GAVE_UP; /* a drain is on its way already */
    }
    ib->spinning = true;
    atomic_store_explicit(&ib->kick, false, memory_order_relaxed);
    pthread_mutex_unlock(&ib->mu);
    t0 = ferry__now_real();
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(&ib->kick, memory_order_acquire))
            break;
        if ((i & 31) == 0) {
            now = ferry__now_real();
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
    if (ib->draining || ib->step || ib->fuzz)
        return; /* a drain will look at the queue again */
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

/* How long a poll under fuzzing waits for the threads' work that tasks
 * wait for: far above a short job's time (and the threads' fuzzing
 * delays), short enough that work which never comes back by itself (it
 * waits for this loop) costs one such wait until it does. */
#define FUZZ_WAIT_NS FERRY_MSEC(50)

void ferry__inbox_held_begin(struct ferry__task_wake *x)
{
    if (x->ib->fuzz) {
        x->counted = true;
        x->ib->held++;
    }
}

/* A held wake stops counting: granted, or its wait ended. */
static void held_drop(struct ferry__task_wake *x)
{
    struct ferry_inbox *ib = x->ib;

    if (x->parked) {
        struct ferry__cnode **p = &ib->parked;

        while (*p != &x->cn)
            p = &(*p)->next;
        *p = x->cn.next;
        x->parked = false;
        ib->nparked--;
    }
    x->counted = false;
    if (--ib->held == 0)
        ib->fuzz_late = false;
}

void ferry__inbox_held_end(struct ferry__task_wake *x)
{
    if (x->counted)
        held_drop(x);
}

bool ferry__inbox_held_park(struct ferry__task_wake *x)
{
    struct ferry_inbox *ib = x->ib;
    uint64_t id = ferry__task_number(x->w.task);
    struct ferry__cnode **p = &ib->parked;

    if (ib->fuzz_late || ib->closing)
        return false;
    /* In task order: the order of arrival is the threads'. */
    while (*p &&
           ferry__task_number(ferry__container_of(*p, struct ferry__task_wake, cn)->w.task) <= id)
        p = &(*p)->next;
    x->cn.next = *p;
    *p = &x->cn;
    x->parked = true;
    ib->nparked++;
    return true;
}

/* Wait, on the loop thread, until something is in the queue or until
 * `until` (real clock).  Returns false once `until` has passed. */
static bool wait_arrival(struct ferry_inbox *ib, int64_t until)
{
    bool in_time = true;

    pthread_mutex_lock(&ib->mu);
    ib->fuzz_waits = true;
    while (!ib->chead && !ib->qlen && in_time)
        in_time = ferry__cond_wait_until(&ib->idle, &ib->mu, until) != ETIMEDOUT;
    ib->fuzz_waits = false;
    pthread_mutex_unlock(&ib->mu);
    return in_time;
}

/* Grant parked wakes in task order, each now or later as the seed says
 * (ferry__loop_fuzz_hold() grants while the loop has nothing else to
 * run).  Returns true if some stay parked. */
static bool unpark(struct ferry_inbox *ib, bool all)
{
    struct ferry__cnode *n = ib->parked, *next;

    for (; n; n = next) {
        struct ferry__task_wake *x = ferry__container_of(n, struct ferry__task_wake, cn);

        next = n->next;
        if (!all && ferry__loop_fuzz_hold(ib->loop))
            continue;
        held_drop(x);
        ferry__grant(&x->w, x->result);
    }
    return ib->nparked != 0;
}

void ferry__inbox_fuzz_deliver(void *ctx)
{
    struct ferry_inbox *ib = ctx;
    int64_t until;
    bool left;

    if (!ib->fuzz || ib->draining || ib->closing)
        return;
    if (ib->held > ib->nparked && !ib->fuzz_late) {
        /* The jobs this turn offloaded go to their threads now, or the
         * wait below would wait for jobs that no thread has. */
        ferry__pool_handover(ib);
    }
    until = ferry__now_real() + FUZZ_WAIT_NS;
    for (;;) {
        left = drain(ib, FERRY__DRAIN_BATCH, true, false);
        if (ib->held == ib->nparked || ib->fuzz_late)
            break;
        if (!left && !wait_arrival(ib, until))
            ib->fuzz_late = true; /* one more drain, then go on */
        else if (left && ferry__now_real() >= until)
            ib->fuzz_late = true;
    }
    /* Come back at the next poll for what is left, even if nothing new
     * writes the eventfd (`woken` may stay set meanwhile). */
    if (unpark(ib, ib->fuzz_late) || left)
        event_active(ib->ev, EV_READ, 1);
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
    ferry_inbox_unref(ib);
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
    ib->owner = &ferry__inbox_token;
    ib->loop = loop;
    ib->fuzz = own_base && ferry__loop_fuzzed(loop);
    ib->fork_mark = ferry__loop_fork_mark(loop);
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
    ib->ev = ib->fd.rfd >= 0 ? event_new(base, ib->fd.rfd, EV_READ | EV_PERSIST, event_cb, ib)
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

void *ferry__inbox_ext(struct ferry_inbox *ib)
{
    return ib->ext;
}
