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

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fault.h"

#include "loop_int.h"
#include "sig_int.h"
#include "sync_int.h"

struct ferry_sigsub {
    ferry_loop *loop;                /* NULL once its loop was freed */
    struct ferry__link link;         /* in the port's subs while loop is set */
    struct ferry__waitq waiters;     /* tasks in ferry_sigsub_recv() */
    uint64_t mask;                   /* the signals subscribed to */
    uint64_t count;                  /* deliveries counted, not received */
    uint64_t reserved;               /* of those, promised to woken waiters */
    uint64_t pending[FERRY__NSIG];   /* deliveries counted, per signal */
    unsigned char ring[FERRY__NSIG]; /* the signals with pending > 0, in
                                               * the order they are received */
    unsigned char head;              /* first of ring */
    unsigned char len;               /* signals in ring */
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
        ring_push(sub, signum); /* to the back: others get their turn */
    return signum;
}

/* ---- the dump on a signal ------------------------------------------------ */

static void dump_now(struct ferry__sigport *port)
{
    if (!port->dump_file)
        return;
    ferry_loop_dump(port->loop, port->dump_file);
    fflush(port->dump_file);
}

/* The port outlives every queued dump: it goes with the loop's parts,
 * after the loop's last turns ran its callbacks, and turns the dump off
 * first. */
static void dump_cb(void *arg)
{
    struct ferry__sigport *port = arg;

    port->dump_queued = false;
    dump_now(port);
}

/* The dump's signal came: dump between two turns, or now if the callback
 * cannot be queued (no memory), rather than not at all. */
static void dump_requested(struct ferry__sigport *port)
{
    if (port->dump_queued)
        return;
    if (ferry_call_soon(port->loop, dump_cb, port) == 0)
        port->dump_queued = true;
    else
        dump_now(port);
}

/* Turn the dump off: no more deliveries for it, and its stream closed.  A
 * queued callback finds no stream and prints nothing. */
static void dump_off(struct ferry__sigport *port)
{
    if (!port || !port->dump_signum)
        return;
    ferry__sig_del(port->loop, port->dump_signum, false);
    fclose(port->dump_file);
    port->dump_file = NULL;
    port->dump_signum = 0;
}

int ferry_loop_dump_on_signal(ferry_loop *loop, int signum, int fd)
{
    struct ferry__sigport *port;
    FILE *f;
    int dfd, rc;

    if (!loop)
        loop = ferry_loop_current();
    rc = ferry__loop_check(loop);
    if (rc)
        return rc;
    if (signum == 0) {
        dump_off(ferry__sigport_of(loop));
        return 0;
    }
    if (!ferry__sig_valid(signum) || fd < 0)
        return -EINVAL;
    dfd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dfd < 0)
        return errno == EBADF ? -EBADF : -ENOMEM;
    f = ferry__fault_point("dump fdopen") ? NULL : fdopen(dfd, "w");
    if (!f) {
        close(dfd);
        return -ENOMEM;
    }
    /* Deliveries counted so far belong to what was subscribed then. */
    ferry__sig_collect(loop);
    rc = ferry__sig_add(loop, signum);
    if (rc) {
        fclose(f);
        return rc;
    }
    port = ferry__sigport_of(loop);
    dump_off(port);
    port->dump_signum = signum;
    port->dump_file = f;
    return 0;
}

/* A signal's number from "10", "USR1" or "SIGUSR1"; 0 if none. */
static int signal_number(const char *s)
{
    char *end;
    long n;

    if (strncmp(s, "SIG", 3) == 0)
        s += 3;
    n = strtol(s, &end, 10);
    if (end != s)
        return *end == 0 && n > 0 && n < NSIG ? (int)n : 0;
    for (int i = 1; i < NSIG; i++) {
        const char *name = sigabbrev_np(i);

        if (name && strcmp(name, s) == 0)
            return i;
    }
    return 0;
}

void ferry__signal_loop_start(ferry_loop *loop)
{
    const char *s = getenv("FERRY_DUMP_SIGNAL");
    int signum, rc;

    if (!s || !*s)
        return;
    signum = signal_number(s);
    rc = signum ? ferry_loop_dump_on_signal(loop, signum, STDERR_FILENO) : -EINVAL;
    if (rc)
        ferry__log(FERRY_LOG_WARN, "FERRY_DUMP_SIGNAL=%s ignored: %s", s,
                   rc == -EINVAL ? "not a signal a subscription may take" : strerror(-rc));
}

void ferry__sig_deliver(ferry_loop *loop, int signum, uint64_t n)
{
    struct ferry__link *l;
    uint64_t bit = ferry__sig_bit(signum);

    struct ferry__sigport *port = ferry__sigport_of(loop);

    if (signum == port->dump_signum)
        dump_requested(port);
    ferry__list_foreach(l, &port->subs) {
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
    rc = ferry__loop_arg(&loop);
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

    /* First: a delivery collected below must not queue a dump that no
     * turn would run. */
    dump_off(port);
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
