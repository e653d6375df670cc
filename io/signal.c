/* signal.c - signal subscriptions: the deliveries counted for each, and
 * the tasks that wait to receive them.
 * Loop thread only.
 *
 * base/sigtab.c counts deliveries per signal, process-wide, and the loop's
 * port (sigport.c) hands the loop what it has not seen yet
 * (ferry__sig_deliver()), when the handler wakes it and whenever a receive
 * or a new subscription asks (ferry__sig_collect(), which reads counters
 * only).  Here each
 * subscription adds those to its own per-signal counts.
 *
 * Hand-over by reservation, as the queue does: a delivery stays counted in
 * the subscription until the waiter it was promised to runs (`reserved`
 * counts such promises).  A waiter cancelled after the promise gives it
 * back to the next waiter, so a cancelled receive took nothing and no
 * delivery is lost or received twice.
 */
#include "loop_only.h"

#include <string.h>

#include "loop_int.h"
#include "sig_int.h"
#include "sync_int.h"

struct ferry_sigsub {
    ferry_loop         *loop;                 /* NULL once its loop was freed */
    struct ferry__link  link;                 /* in the port's subs while loop is set */
    struct ferry__waitq waiters;              /* tasks in ferry_sigsub_recv() */
    uint64_t            mask;                 /* the signals subscribed to */
    uint64_t            count;                /* deliveries counted, not received */
    uint64_t            reserved;             /* of those, promised to woken waiters */
    uint64_t            pending[FERRY__NSIG]; /* deliveries counted, per signal */
    unsigned char       ring[FERRY__NSIG];    /* the signals with pending > 0, in
                                               * the order they are received */
    unsigned char       head;                 /* first of ring */
    unsigned char       len;                  /* signals in ring */
};

/* ---- a subscription's counts --------------------------------------------- */

static void ring_push(ferry_sigsub *sub, int signum)
{
    sub->ring[(sub->head + sub->len) % FERRY__NSIG] = (unsigned char)signum;
    sub->len++;
}

/* Promise the deliveries nobody was promised to the waiters, first come
 * first served. */
static void serve(ferry_sigsub *sub)
{
    struct ferry__waiter *w;

    while (sub->count > sub->reserved && (w = ferry__first_waiting(&sub->waiters))) {
        sub->reserved++;
        ferry__grant(w, 0);
    }
}

/* Take the next delivery (one is available). */
static int take(ferry_sigsub *sub)
{
    int signum = sub->ring[sub->head];

    sub->head = (unsigned char)((sub->head + 1) % FERRY__NSIG);
    sub->len--;
    sub->count--;
    if (--sub->pending[signum])
        ring_push(sub, signum);    /* to the back: others get their turn */
    return signum;
}

void ferry__sig_deliver(ferry_loop *loop, int signum, uint64_t n)
{
    struct ferry__link *l;
    uint64_t bit = ferry__sig_bit(signum);

    ferry__list_foreach(l, &ferry__sigport_of(loop)->subs) {
        ferry_sigsub *sub = ferry__container_of(l, ferry_sigsub, link);
        if (!(sub->mask & bit))
            continue;
        if (!sub->pending[signum])
            ring_push(sub, signum);
        sub->pending[signum] += n;
        sub->count += n;
        serve(sub);
    }
}

/* ---- for select ----------------------------------------------------------- */

struct ferry__waitq *ferry__sigsub_waitq(ferry_sigsub *sub)
{
    return &sub->waiters;
}

int ferry__sigsub_try(ferry_sigsub *sub, int *signum)
{
    ferry__sig_collect(sub->loop);
    if (sub->count <= sub->reserved)
        return -EAGAIN;
    *signum = take(sub);
    return 0;
}

void ferry__sigsub_claim(ferry_sigsub *sub, int *signum)
{
    sub->reserved--;
    *signum = take(sub);
}

void ferry__sigsub_unclaim(ferry_sigsub *sub)
{
    sub->reserved--;
    serve(sub);
}

/* ---- the API ---------------------------------------------------------------- */

int ferry_sigsub_new(ferry_sigsub **out, ferry_loop *loop, const int *signums, size_t n)
{
    ferry_sigsub *sub;
    uint64_t mask = 0, done = 0;
    int rc;

    if (!out)
        return -EINVAL;
    *out = NULL;
    if (!loop && !(loop = ferry_loop_current()))
        return -EPERM;
    rc = ferry__loop_check(loop);
    if (rc)
        return rc;
    if (!signums || n == 0)
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        if (!ferry__sig_valid(signums[i]))
            return -EINVAL;
        mask |= ferry__sig_bit(signums[i]);
    }
    sub = ferry__calloc(1, sizeof *sub);
    if (!sub)
        return -ENOMEM;
    /* What the loop counted before now belongs to the subscriptions that
     * existed then. */
    ferry__sig_collect(loop);
    for (uint64_t m = mask; m; m &= m - 1) {
        int signum = __builtin_ctzll(m) + 1;
        rc = ferry__sig_add(loop, signum);
        if (rc)
            goto err_undo;
        done |= ferry__sig_bit(signum);
    }
    sub->loop = loop;
    sub->mask = mask;
    ferry__list_push_back(&ferry__sigport_of(loop)->subs, &sub->link);
    *out = sub;
    return 0;

err_undo:
    for (uint64_t m = done; m; m &= m - 1)
        ferry__sig_del(loop, __builtin_ctzll(m) + 1, false);
    ferry__free(sub);
    return rc;
}

int ferry_sigsub_recv(ferry_sigsub *sub, int *signum)
{
    struct ferry__waiter w;
    ferry_task *self;
    int rc;

    if (!sub || !signum)
        return -EINVAL;
    rc = ferry__enter_task_inline(&self);
    if (rc)
        return rc;
    if (sub->loop != self->loop)
        return -EPERM;
    rc = ferry__check_inline(self);
    if (rc)
        return rc;
    if (ferry__sigsub_try(sub, signum) == 0)
        return 0;
    ferry__waiter_init(&w, self, "signal", sub);
    rc = ferry__wait(ferry__sigsub_waitq(sub), &w, FERRY_NEVER);
    if (w.state != FERRY__W_GRANTED)
        return rc;
    if (rc) {
        /* Cancelled after the promise: the delivery goes to the next
         * waiter, or stays for the next receive. */
        ferry__sigsub_unclaim(sub);
        return rc;
    }
    ferry__sigsub_claim(sub, signum);
    return 0;
}

int ferry_sigsub_try_recv(ferry_sigsub *sub, int *signum)
{
    int rc;

    if (!sub || !signum)
        return -EINVAL;
    if (!sub->loop)
        return -EPERM;
    rc = ferry__loop_check(sub->loop);
    if (rc)
        return rc;
    return ferry__sigsub_try(sub, signum);
}

/* End `sub`'s subscription to each of its signals and unlink it. */
static void sub_end(ferry_sigsub *sub, bool merge)
{
    ferry_loop *loop = sub->loop;

    ferry__list_remove(&sub->link);
    for (uint64_t m = sub->mask; m; m &= m - 1) {
        int signum = __builtin_ctzll(m) + 1;
        ferry__sig_del(loop, signum, !merge && sub->pending[signum] > 0);
    }
    sub->loop = NULL;
}

int ferry__sigsub_release(ferry_sigsub *sub, bool merge)
{
    int rc;

    if (!sub)
        return 0;
    if (sub->loop) {
        rc = ferry__loop_check(sub->loop);
        if (rc)
            return rc;
        if (!ferry__waitq_empty(&sub->waiters) || sub->reserved)
            return -EBUSY;
        /* Merged deliveries are the ones counted so far; later ones are
         * judged by ferry__sig_del(). */
        if (!merge)
            ferry__sig_collect(sub->loop);
        sub_end(sub, merge);
    }
    ferry__free(sub);
    return 0;
}

int ferry_sigsub_free(ferry_sigsub *sub)
{
    return ferry__sigsub_release(sub, false);
}

void ferry__signal_loop_free(struct ferry__sigport *port)
{
    struct ferry__link *l, *tmp;

    ferry__sig_collect(port->loop);
    ferry__list_foreach_safe(l, tmp, &port->subs)
        sub_end(ferry__container_of(l, ferry_sigsub, link), false);
    ferry__sig_port_free(port);
}

/* A subscription that lives for one wait (ferry/signal.h has the rules):
 * every loop waiting for the signal gets its own count of each delivery. */
int ferry_wait_signal(int signum)
{
    ferry_sigsub *sub;
    ferry_task *self;
    int rc = ferry__enter_task_inline(&self), got;

    if (rc)
        return rc;
    if (!ferry__sig_valid(signum))
        return -EINVAL;
    rc = ferry__check_inline(self);
    if (rc)
        return rc;
    rc = ferry_sigsub_new(&sub, self->loop, &signum, 1);
    if (rc)
        return rc;
    rc = ferry_sigsub_recv(sub, &got);
    /* Received: more deliveries during the wait merge into this one.  Not
     * received: one that came is raised again for the old disposition. */
    ferry__sigsub_release(sub, rc == 0);
    return rc;
}
