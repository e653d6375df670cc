/* ioreg.c - the descriptors of a loop's streams and listeners: one
 * registration each for its whole life, readiness bits, and the waits of
 * the tasks that use them; the list of what a loop has open, closed with
 * the loop (the loop's "streams" part); and ferry_wait_fd(), a task's
 * one-shot wait on any descriptor.
 * Loop thread only.
 *
 * Registration.  A descriptor is registered once, when the stream opens,
 * for reading and writing, edge-triggered, and unregistered when it
 * closes.  An edge only records readiness in two bits and wakes a task
 * waiting for one of them.  A call tries its system call first and waits
 * only when the call says EAGAIN (which clears the bit), so a wait costs no
 * epoll_ctl: ferry_wait_fd()'s add and delete per wait cost two.
 * Edge-triggered, because a level-triggered registration that stays would
 * report a writable socket on every poll, and a readable one as long as
 * its reader is busy elsewhere.  Where:
 *   - on Linux, in an epoll set of the loop's own (EPOLLET), whose
 *     descriptor is one event of the loop's base (netloop_cb());
 *   - elsewhere, as a libevent event (EV_READ|EV_WRITE|EV_PERSIST|EV_ET);
 *   - on a base without edge-triggered events (poll, select: a loop
 *     attached to an application's base, off Linux), as a level-triggered
 *     libevent event that is registered while a task waits, for what it
 *     waits for.
 * The epoll set is there for one reason: libevent reports EPOLLHUP and
 * EPOLLERR as plain readability (and drops EPOLLRDHUP with them), and the
 * stream needs them apart to skip a system call per read (next).
 *
 * Readiness after a short transfer.  A send that takes less than it was
 * offered has filled the socket's buffer: the writable bit is cleared
 * without trying again, and the next edge comes when the peer has made
 * room (epoll queues an edge for every wakeup of the descriptor after the
 * poll that reported the last one).  A read that returns less than it
 * asked for has emptied the descriptor too, and clears the readable bit
 * the same way (Tokio does this), so a request-reply exchange costs one
 * read per message and not a second one that says EAGAIN.  That is only
 * safe when nothing that brings no new edge is left behind: the end of
 * the stream or an error (a reset) that arrived before the poll that
 * reported the data is still pending after the short read, and only the
 * poll could have told.  So it is done only in the epoll set, and only
 * until epoll has reported EPOLLHUP, EPOLLERR or EPOLLRDHUP for the
 * descriptor (`hup`, sticky): from then on reads go on until EAGAIN or the
 * end.  Through libevent a reader always reads until EAGAIN.
 */
#include "loop_only.h"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#ifdef __linux__
#include <sys/epoll.h>
#endif
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "loop_int.h"
#include "stream_int.h"

/* ---- the loop's streams and listeners ------------------------------------ */

bool ferry__io_use_libevent;

static void netloop_free(struct ferry__loop_part *part);

/* The loop's part for its streams and listeners. */
static const struct ferry__part_ops netloop_ops = { "streams", NULL, netloop_free };

static struct ferry__netloop *netloop_of(const ferry_loop *loop)
{
    struct ferry__loop_part *p = ferry__loop_part_find(loop, &netloop_ops);

    return p ? ferry__container_of(p, struct ferry__netloop, part) : NULL;
}

void ferry__ioobj_add(ferry_loop *loop, struct ferry__ioobj *o)
{
    ferry__list_push_back(&netloop_of(loop)->ioobjs, &o->link);
}

void ferry__ioobj_del(struct ferry__ioobj *o)
{
    if (ferry__link_linked(&o->link))
        ferry__list_remove(&o->link);
}

/* ferry_loop_free(), once every task has ended: close and free every
 * stream and listener of the loop that is still open, then the netloop. */
static void netloop_free(struct ferry__loop_part *part)
{
    struct ferry__netloop *net = ferry__container_of(part, struct ferry__netloop, part);
    struct ferry__link *l;

    while ((l = ferry__list_pop_front(&net->ioobjs)) != NULL) {
        struct ferry__ioobj *o = ferry__container_of(l, struct ferry__ioobj, link);
        o->destroy(o);
    }
#ifdef FERRY_HAVE_URING
    if (net->uring)
        ferry__uring_free(net->uring);
#endif
    if (net->ev_added)
        event_del(&net->ev);
    if (net->epfd >= 0)
        close(net->epfd);
    ferry__loop_part_del(&net->part);
    ferry__free(net);
}

/* ---- registration --------------------------------------------------------- */

/* Grant the waiters of `q` that wait for one of `bits`.  Granting a case
 * of a select unlinks its siblings, which may include the saved next
 * node: the walk then starts again from the head. */
static void wake(struct ferry__waitq *q, uint8_t bits)
{
    struct ferry__link *l, *tmp;

again:
    ferry__list_foreach_safe(l, tmp, &q->head) {
        struct ferry__waiter *w = ferry__container_of(l, struct ferry__waiter, link);
        if (w->n & bits) {
            bool sel = w->sel != NULL;

            ferry__grant(w, 0);
            if (sel)
                goto again;
        }
    }
}

/* The loop reported `bits` (FERRY_READ|FERRY_WRITE) for the descriptor,
 * or a transport without one (FERRY__IO_NONE) made them true. */
void ferry__ioreg_ready(struct ferry__ioreg *g, uint8_t bits)
{
    g->ready |= bits;
    wake(&g->rq, bits);
    wake(&g->wq, bits);
    if (g->mode == FERRY__IO_LT)
        ferry__ioreg_lt_update(g, 0);
}

#ifdef __linux__
/*
 * The loop's epoll set.  Its descriptor is one persistent, level-triggered
 * read event of the loop's base: when any descriptor of the set has an
 * edge, the base's poll reports it and this drains the set without
 * waiting.  Registering in a set of ferry's own instead of through
 * libevent costs one more epoll_wait() per poll that finds streams ready,
 * and gives what libevent does not pass on: EPOLLHUP, EPOLLERR and
 * EPOLLRDHUP apart from readability.  With those a short read can clear
 * the readable bit safely (the top of the file).
 */
static void netloop_cb(evutil_socket_t fd, short what, void *arg)
{
    struct epoll_event evs[64];
    int n, rounds = 0;

    (void)what;
    (void)arg;
    do {
        n = epoll_wait(fd, evs, 64, 0);
        for (int i = 0; i < n; i++) {
            struct ferry__ioreg *g = evs[i].data.ptr;
            uint32_t m = evs[i].events;
            uint8_t bits = 0;

            if (m & (EPOLLHUP | EPOLLERR | EPOLLRDHUP)) {
                g->hup = true;
                bits |= FERRY_READ;
                if (m & (EPOLLHUP | EPOLLERR))
                    bits |= FERRY_WRITE;
            }
            if (m & EPOLLIN)
                bits |= FERRY_READ;
            if (m & EPOLLOUT)
                bits |= FERRY_WRITE;
            ferry__ioreg_ready(g, bits);
        }
    } while (n == 64 && ++rounds < 4);
}

/* The loop's epoll set, made at the first registration.  Returns: 0;
 * -ENOMEM; -EMFILE, -ENFILE. */
static int epoll_set(ferry_loop *loop)
{
    struct ferry__netloop *net = netloop_of(loop);

    if (net->epfd >= 0)
        return 0;
    if (ferry__fault_point("epoll_create"))
        return -ENOMEM;
    net->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (net->epfd < 0)
        return -errno;
    event_assign(&net->ev, loop->base, net->epfd, EV_READ | EV_PERSIST, netloop_cb, net);
    if (event_add(&net->ev, NULL) != 0) {
        close(net->epfd);
        net->epfd = -1;
        return -ENOMEM;
    }
    net->ev_added = true;
    return 0;
}
#endif

static void ioreg_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    ferry__ioreg_ready(
        arg, (uint8_t)((what & EV_READ ? FERRY_READ : 0) | (what & EV_WRITE ? FERRY_WRITE : 0)));
}

/* What the waiters of `q` wait for, as libevent's EV_READ|EV_WRITE. */
static short waited(const struct ferry__waitq *q)
{
    const struct ferry__link *l;
    short ev = 0;

    ferry__list_foreach(l, &q->head) {
        const struct ferry__waiter *w = ferry__container_of(l, struct ferry__waiter, link);
        ev |= (short)((w->n & FERRY_READ ? EV_READ : 0) | (w->n & FERRY_WRITE ? EV_WRITE : 0));
    }
    return ev;
}

int ferry__ioreg_lt_update(struct ferry__ioreg *g, short extra)
{
    short want = (short)(waited(&g->rq) | waited(&g->wq) | extra);

    if (want == g->lt_events)
        return 0;
    if (g->lt_events)
        event_del(&g->ev);
    g->lt_events = 0;
    if (!want)
        return 0;
    event_assign(&g->ev, g->loop->base, g->fd, (short)(want | EV_PERSIST), ioreg_cb, g);
    if (event_add(&g->ev, NULL) != 0)
        return -ENOMEM;
    g->lt_events = (uint8_t)want;
    return 0;
}

/*
 * The backend of a loop's streams and listeners, chosen when its netloop
 * is made: io_uring when the environment asks for it (FERRY_IO=uring) and
 * a ring can be set up, epoll otherwise.  A loop that asked and could not
 * have it says why once, in the log and in its statistics, and goes on
 * with epoll: nothing else changes.
 */
static void choose_backend(ferry_loop *loop, struct ferry__netloop *net)
{
    const char *env = getenv("FERRY_IO"), *why = "built without io_uring";
    int err = ENOSYS;

    loop->stats.io_backend = "epoll";
    if (!env || strcmp(env, "uring") != 0)
        return;
#ifdef FERRY_HAVE_URING
    /* The turn's queued work is handed over before the loop's own polls;
     * an application's dispatch of its base makes none of those. */
    if (!loop->own_base) {
        why = "the loop runs on an application's event base";
        err = ENOTSUP;
        goto out;
    }
    err = -ferry__uring_new(&net->uring, loop, &why);
    if (err == 0) {
        loop->stats.io_backend = "io_uring";
        return;
    }
out:
#endif
    loop->stats.io_fallback = why;
    loop->stats.io_fallback_err = err;
    ferry__log(FERRY_LOG_WARN, "FERRY_IO=uring: %s (%s); the loop uses epoll", why, strerror(err));
}

struct ferry__uring *ferry__ioreg_uring(ferry_loop *loop)
{
    struct ferry__netloop *net = netloop_of(loop);

    return net ? net->uring : NULL;
}

/* The loop's netloop, made at its first registration.  Returns: it, or
 * NULL (no memory). */
static struct ferry__netloop *netloop_get(ferry_loop *loop)
{
    struct ferry__netloop *net = netloop_of(loop);

    if (net)
        return net;
    net = ferry__calloc(1, sizeof *net);
    if (!net)
        return NULL;
    net->epfd = -1;
    ferry__loop_part_add(loop, &net->part, &netloop_ops);
    choose_backend(loop, net);
    return net;
}

int ferry__ioreg_open_ring(struct ferry__ioreg *g, ferry_loop *loop, int fd, uint8_t ready)
{
    struct ferry__netloop *net = netloop_get(loop);

    if (!net)
        return -ENOMEM;
    if (!net->uring || fd < 0)
        return ferry__ioreg_open(g, loop, fd, ready);
    memset(g, 0, sizeof *g);
    g->loop = loop;
    g->fd = fd;
    g->ready = ready;
    g->mode = FERRY__IO_URING;
    return 1;
}

bool ferry__ioreg_to_ring(struct ferry__ioreg *g)
{
    struct ferry__netloop *net = netloop_of(g->loop);

    if (!net || !net->uring || g->mode != FERRY__IO_EPOLL)
        return false;
#ifdef __linux__
    epoll_ctl(net->epfd, EPOLL_CTL_DEL, g->fd, NULL);
#endif
    g->mode = FERRY__IO_URING;
    g->ready = FERRY_READ | FERRY_WRITE;
    g->hup = false;
    return true;
}

int ferry__ioreg_open(struct ferry__ioreg *g, ferry_loop *loop, int fd, uint8_t ready)
{
    struct ferry__netloop *net;
    int rc;

    memset(g, 0, sizeof *g);
    g->loop = loop;
    g->fd = fd;
    g->ready = ready;
    net = netloop_get(loop);
    if (!net)
        return -ENOMEM;
    if (fd < 0) {
        g->mode = FERRY__IO_NONE;
        return 0;
    }
#ifdef __linux__
    if (!ferry__io_use_libevent) {
        struct epoll_event ev;

        rc = epoll_set(loop);
        if (rc)
            return rc;
        memset(&ev, 0, sizeof ev);
        ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
        ev.data.ptr = g;
        if (epoll_ctl(net->epfd, EPOLL_CTL_ADD, fd, &ev) != 0)
            return errno == EPERM ? -EINVAL : errno == EBADF ? -EBADF : -ENOMEM;
        g->mode = FERRY__IO_EPOLL;
        return 0;
    }
#endif
    if (!(event_base_get_features(loop->base) & EV_FEATURE_ET)) {
        g->mode = FERRY__IO_LT;
        return 0;
    }
    g->mode = FERRY__IO_ET;
    event_assign(&g->ev, loop->base, fd, EV_READ | EV_WRITE | EV_PERSIST | EV_ET, ioreg_cb, g);
    errno = 0;
    rc = event_add(&g->ev, NULL);
    if (rc != 0) {
        /* epoll_ctl() refuses a descriptor it cannot poll with EPERM;
         * anything else is libevent running out of memory. */
        return errno == EPERM ? -EINVAL : -ENOMEM;
    }
    return 0;
}

int ferry__ioreg_wait(struct ferry__ioreg *g, ferry_task *self, struct ferry__waitq *q, int want,
                      const char *what, const void *obj)
{
    struct ferry__waiter w;
    int rc;

    if (g->mode == FERRY__IO_LT) {
        rc = ferry__ioreg_lt_update(g, (short)(want & FERRY_READ ? EV_READ : EV_WRITE));
        if (rc)
            return rc;
    }
    ferry__waiter_init(&w, self, what, obj);
    w.n = (uint64_t)want;
    rc = ferry__wait(q, &w, FERRY_NEVER);
    if (g->closed)
        return -EBADF;
    if (g->mode == FERRY__IO_LT)
        ferry__ioreg_lt_update(g, 0);
    return rc;
}

void ferry__ioreg_close(struct ferry__ioreg *g)
{
    g->closed = true;
    switch (g->mode) {
#ifdef __linux__
    case FERRY__IO_EPOLL:
        /* Before close(2): an epoll set keeps a descriptor that another
         * process or a dup() still holds open, and would go on reporting
         * it under its number. */
        epoll_ctl(netloop_of(g->loop)->epfd, EPOLL_CTL_DEL, g->fd, NULL);
        break;
#endif
    case FERRY__IO_ET:
        event_del(&g->ev);
        break;
    default:
        if (g->lt_events)
            event_del(&g->ev);
        g->lt_events = 0;
        break;
    }
    ferry__waitq_grant_all(&g->rq, -EBADF);
    ferry__waitq_grant_all(&g->wq, -EBADF);
}

/* ---- ferry_wait_fd(): a one-shot wait on any descriptor ---------------------- */

static void io_cb(evutil_socket_t fd, short what, void *arg)
{
    struct ferry__waiter *w = arg;

    (void)fd;
    w->n = (uint64_t)(((what & EV_READ) ? FERRY_READ : 0) | ((what & EV_WRITE) ? FERRY_WRITE : 0) |
                      ((what & EV_SIGNAL) ? 1 : 0));
    ferry__grant(w, 0);
}

int ferry_wait_fd(int fd, int events, int *revents)
{
    struct ferry__waiter w;
    struct event ev;
    ferry_task *self;
    short what = 0;
    int rc = ferry__enter_task_inline(&self);

    if (rc)
        return rc;
    if (fd < 0 || !events || (events & ~(FERRY_READ | FERRY_WRITE)))
        return -EINVAL;
    rc = ferry__check_inline(self);
    if (rc)
        return rc;
    if (events & FERRY_READ)
        what |= EV_READ;
    if (events & FERRY_WRITE)
        what |= EV_WRITE;
    ferry__waiter_init(&w, self, events & FERRY_WRITE ? "fd write" : "fd read",
                       (const void *)(intptr_t)fd);
    if (event_assign(&ev, self->loop->base, fd, what, io_cb, &w) != 0)
        return -EINVAL;
    if (event_add(&ev, NULL) != 0)
        return -ENOMEM;
    rc = ferry__wait(NULL, &w, FERRY_NEVER);
    event_del(&ev);
    if (rc == 0 && revents)
        *revents = (int)w.n;
    return rc;
}
