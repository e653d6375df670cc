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
 * Returns true when the eventfd must be written: the caller does it with
 * wake_write() after releasing mu, so that the loop it wakes does not run
 * into the mutex still held (a futex wait and a second wakeup of the
 * poster).  A reference taken here keeps the inbox and its eventfd alive
 * until then, also if the loop closes meanwhile.
 */
static bool wake_locked(struct ferry_inbox *ib)
{
    if (ferry__inbox_on_loop_thread(ib)) {
        /* No system call: activate the event (its callback schedules a
         * drain step), unless a drain is running: it re-checks the queue
         * under mu before it ends.  close() drains until empty itself. */
        if (!ib->draining && !ib->ev_gone)
            event_active(ib->ev, EV_READ, 1);
        return false;
    }
    if (ib->spinning) {
        /* The loop polls `kick` in ferry__inbox_spin() and drains when it
         * sees it, or when it stops waiting (under mu): no system call. */
        ib->spin_kicked = true;
        atomic_store_explicit(&ib->kick, true, memory_order_release);
        return false;
    }
    ib->wakeups++;
    atomic_store_explicit(&ib->waker_cpu, sched_getcpu(), memory_order_relaxed);
    if (ib->fd.wfd < 0) {
        /* Attached base: libevent's own (coalescing) notification. */
        if (!ib->ev_gone)
            event_active(ib->ev, EV_READ, 1);
        return false;
    }
    /* The loop holds its reference until its close has taken mu for the
     * last time, so one taken under mu cannot be the first after the last. */
    atomic_fetch_add_explicit(&ib->refs, 1, memory_order_relaxed);
    return true;
}

/*
 * The eventfd write that wake_locked() asked for; mu not held.  `woken`
 * was set under mu before, so a drain that runs before the write lands
 * takes the post, and the write costs an empty drain at worst.  If the
 * write fails, the loop is woken through libevent's own notification
 * instead (thread-safe once evthread_use_pthreads() ran; the event exists
 * until close() has refused new posts and run the old ones).
 */
static void wake_write(struct ferry_inbox *ib)
{
    int err = ferry__fault_point("eventfd write") ? EIO : ferry__wakefd_write(ib->fd.wfd);

    if (err) {
        pthread_mutex_lock(&ib->mu);
        ib->write_errors++;
        if (!ib->ev_gone)
            event_active(ib->ev, EV_READ, 1);
        pthread_mutex_unlock(&ib->mu);
        ferry__log(FERRY_LOG_ERROR,
                   "call_soon_threadsafe: waking the loop failed: eventfd write: %s; "
                   "woken through libevent instead",
                   strerror(err));
    }
    ferry_inbox_unref(ib);
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
    bool write = false;

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
    if (ib->fuzz_waits)
        pthread_cond_signal(&ib->idle);
    if (!ib->woken) {
        ib->woken = true;
        write = wake_locked(ib);
    }
    pthread_mutex_unlock(&ib->mu);
    if (write)
        wake_write(ib);
    return 0;
}

/* Requires mu.  A close waiting for reserved or expected completions
 * (inbox_loop.c) looks at the queue again once one has come.  Returns as
 * wake_locked(). */
static bool complete_locked(struct ferry_inbox *ib, struct ferry__cnode *n)
{
    n->next = NULL;
    *ib->ctail = n;
    ib->ctail = &n->next;
    ib->posts++;
    if (ib->closer_waits || ib->fuzz_waits)
        pthread_cond_signal(&ib->idle);
    if (!ib->woken) {
        ib->woken = true;
        return wake_locked(ib);
    }
    return false;
}

void ferry__inbox_complete(struct ferry_inbox *ib, struct ferry__cnode *n)
{
    bool write;

    pthread_mutex_lock(&ib->mu);
    write = complete_locked(ib, n);
    pthread_mutex_unlock(&ib->mu);
    if (write)
        wake_write(ib);
}

int ferry__inbox_post_node(struct ferry_inbox *ib, struct ferry__cnode *n)
{
    bool write;

    pthread_mutex_lock(&ib->mu);
    if (ferry__inbox_refused_locked(ib)) {
        pthread_mutex_unlock(&ib->mu);
        return -ESHUTDOWN;
    }
    write = complete_locked(ib, n);
    pthread_mutex_unlock(&ib->mu);
    if (write)
        wake_write(ib);
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
    bool write;

    pthread_mutex_lock(&ib->mu);
    ib->reserved--;
    write = complete_locked(ib, n);
    if (ib->closer_waits)
        pthread_cond_signal(&ib->idle);
    pthread_mutex_unlock(&ib->mu);
    if (write)
        wake_write(ib);
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
    struct ferry_inbox *ib;

    if (!loop)
        loop = ferry_loop_current();
    if (!loop || !cb)
        return -EINVAL;
    ib = ferry__inbox_of(loop);
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

    if (!out)
        return -EINVAL;
    *out = NULL;
    if (!loop)
        loop = ferry_loop_current();
    if (!loop)
        return -EINVAL;
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
    struct ferry_inbox *ib;
    bool write = false;
    int rc = 0;

    if (!loop)
        loop = ferry_loop_current();
    if (!loop)
        return -EINVAL;
    ib = ferry__inbox_of(loop);
    if (!ib)
        return -ESHUTDOWN;
    pthread_mutex_lock(&ib->mu);
    if (ferry__inbox_refused_locked(ib)) {
        rc = -ESHUTDOWN;
    } else if (!ib->stop_queued) {
        ib->stop_queued = true;
        ib->stop_node.fn = stop_run;
        write = complete_locked(ib, &ib->stop_node);
    }
    pthread_mutex_unlock(&ib->mu);
    if (write)
        wake_write(ib);
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
    struct ferry_inbox *ib;

    if (!loop)
        loop = ferry_loop_current();
    if (!loop || !out)
        return -EINVAL;
    ib = ferry__inbox_of(loop);
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
