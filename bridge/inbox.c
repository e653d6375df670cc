/* inbox.c - call_soon_threadsafe: the one channel from threads into a
 * loop, the posting side.  inbox_int.h has how the inbox works.
 * Any thread.
 *
 * Lock order: see bridge_int.h; the inbox takes ferry_inbox.mu only and
 * never calls out while holding it.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>

#include <event2/event.h>

#include "fuzz.h"
#include "inbox_int.h"

_Thread_local char ferry__inbox_token;

/*
 * Make sure a drain comes.  Requires mu; sets nothing but counters.
 * Returns 0 or the errno of a failed eventfd write (the caller logs it
 * after unlocking; the loop was woken through libevent instead).
 */
static int wake_locked(struct ferry_inbox *ib)
{
    int err;

    if (ferry__inbox_on_loop_thread(ib)) {
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
    if (ferry__inbox_refused_locked(ib)) {
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

/* Requires mu.  A close waiting for reserved or expected completions
 * (inbox_loop.c) looks at the queue again once one has come. */
static int complete_locked(struct ferry_inbox *ib, struct ferry__cnode *n)
{
    n->next = NULL;
    *ib->ctail = n;
    ib->ctail = &n->next;
    ib->posts++;
    if (ib->closer_waits)
        pthread_cond_signal(&ib->idle);
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

int ferry__inbox_post_node(struct ferry_inbox *ib, struct ferry__cnode *n)
{
    int err;

    pthread_mutex_lock(&ib->mu);
    if (ferry__inbox_refused_locked(ib)) {
        pthread_mutex_unlock(&ib->mu);
        return -ESHUTDOWN;
    }
    err = complete_locked(ib, n);
    pthread_mutex_unlock(&ib->mu);
    log_write_error(err);
    return 0;
}

void ferry__inbox_expect(struct ferry_inbox *ib)
{
    pthread_mutex_lock(&ib->mu);
    ib->reserved++;
    pthread_mutex_unlock(&ib->mu);
}

int ferry__inbox_reserve(struct ferry_inbox *ib)
{
    int rc = 0;

    pthread_mutex_lock(&ib->mu);
    if (ferry__inbox_refused_locked(ib))
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

static void inbox_ref(struct ferry_inbox *ib)
{
    atomic_fetch_add_explicit(&ib->refs, 1, memory_order_relaxed);
}

void ferry_inbox_unref(struct ferry_inbox *ib)
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
    /* Schedule fuzzing: the posts of a burst may arrive spread out. */
    ferry__fuzz_delay();
    return ferry__inbox_post(ib, cb, arg);
}

int ferry_inbox_post(ferry_inbox *ib, ferry_cb cb, void *arg)
{
    if (!ib || !cb)
        return -EINVAL;
    ferry__fuzz_delay();
    return ferry__inbox_post(ib, cb, arg);
}

int ferry__inbox_ref(struct ferry_inbox *ib)
{
    int rc = 0;

    pthread_mutex_lock(&ib->mu);
    if (ferry__inbox_refused_locked(ib))
        rc = -ESHUTDOWN;
    else
        inbox_ref(ib);
    pthread_mutex_unlock(&ib->mu);
    return rc;
}

int ferry_inbox_get(ferry_inbox **out, ferry_loop *loop)
{
    struct ferry_inbox *ib;
    int rc;

    if (!out || !loop)
        return -EINVAL;
    *out = NULL;
    ib = ferry__inbox_of(loop);
    if (!ib)
        return -ESHUTDOWN;
    rc = ferry__inbox_ref(ib);
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
    if (ferry__inbox_refused_locked(ib)) {
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

int ferry_loop_inbox_stats_get(ferry_loop *loop, ferry_inbox_stats *out)
{
    struct ferry_inbox *ib = ferry__inbox_of(loop);

    if (!loop || !out)
        return -EINVAL;
    if (!ib)
        return -ESHUTDOWN;
    return ferry_inbox_stats_get(ib, out);
}

/* The names before ferry_inbox_unref() and ferry_loop_inbox_stats_get(),
 * kept for programs written against them (ferry/bridge.h). */
void ferry_inbox_release(struct ferry_inbox *ib)
{
    ferry_inbox_unref(ib);
}

int ferry_loop_inbox_stats(ferry_loop *loop, ferry_inbox_stats *out)
{
    return ferry_loop_inbox_stats_get(loop, out);
}

bool ferry__inbox_on_loop(const struct ferry_inbox *ib)
{
    return ferry__inbox_on_loop_thread(ib);
}
