/* uring.c - the io_uring backend of a loop's streams and listeners
 * (FERRY_IO=uring, docs/io_uring.md): the ring, its submissions and
 * completions, and listeners.  The stream transport is in uring_stream.c.
 * Loop thread only.
 *
 * One ring per loop, made with its first stream or listener (ioreg.c
 * chooses), and issued from the loop's thread only.  Its descriptor is
 * one read event of the loop's base, so the loop's one wait wakes for
 * completions as for timers, the inbox and the other loops; the loop's
 * io_prepoll hook hands the kernel what a turn queued, in one system call
 * for all streams, and takes in what completed.
 *
 * Cancel safety.  The kernel hands bytes to the stream and descriptors to
 * the listener, not to a waiting task: a read or accept that is cancelled
 * leaves them queued for the next call, and the operation stays armed.
 * Nothing the kernel has completed is lost or delivered twice.
 *
 * Objects with operations in flight.  A stream or listener that closes
 * cancels its operations; its state stays, as an orphan, until the kernel
 * has answered every one (struct uobj counts them), and the ring's end
 * waits for them before the memory they point at goes.
 */
/* Without loop_only.h: liburing's inline functions use <stdatomic.h> for
 * the rings it shares with the kernel, and the poison would reject them.
 * This file itself uses neither atomics nor threads. */
#include <errno.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "uring_int.h"

/* ---- submission and completion ---------------------------------------------- */

void ferry__uring_submit(struct ferry__uring *u)
{
    int rc;

    do
        rc = io_uring_submit(&u->ring);
    while (rc == -EINTR);
    u->loop->stats.io_submits++;
    /* What the kernel did not take (its completion queue overflowing)
     * stays queued for the next submission. */
    u->pending = io_uring_sq_ready(&u->ring);
}

/* A submission queue entry; the queue is handed over first if it is full.
 * NULL only if the kernel took none of it. */
struct io_uring_sqe *ferry__uring_sqe(struct ferry__uring *u)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);

    if (!sqe) {
        ferry__uring_submit(u);
        sqe = io_uring_get_sqe(&u->ring);
    }
    if (sqe)
        u->pending++;
    return sqe;
}

/* Queue a cancel of the operation `ud`; its own completion is ignored. */
void ferry__uring_cancel(struct ferry__uring *u, uint64_t ud)
{
    struct io_uring_sqe *sqe = ferry__uring_sqe(u);

    if (!sqe)
        return;
    io_uring_prep_cancel64(sqe, ud, 0);
    io_uring_sqe_set_data64(sqe, 0);
}

void ferry__uring_op_start(struct ferry__uring *u, struct uobj *o)
{
    o->ops++;
    u->inflight++;
}

/* An operation of `o` ended: an orphan with none left is freed. */
void ferry__uring_op_end(struct ferry__uring *u, struct uobj *o)
{
    o->ops--;
    u->inflight--;
    if (o->closed && !o->ops) {
        ferry__list_remove(&o->link);
        if (!o->is_acc)
            ferry__uring_conn_free_bufs((struct ferry__uconn *)(void *)o);
        ferry__free(o);
    }
}

/* Give buffer `bid` back to the ring (visible at ferry__uring_buf_commit()). */
void ferry__uring_buf_give(struct ferry__uring *u, uint16_t bid)
{
    io_uring_buf_ring_add(u->br, u->bufs + (size_t)bid * BUFSZ, BUFSZ, bid,
                          io_uring_buf_ring_mask(NBUFS), (int)u->nadd++);
}

/* Publish the buffers given back, and let starved streams receive again,
 * one per buffer. */
void ferry__uring_buf_commit(struct ferry__uring *u)
{
    struct ferry__link *l;
    unsigned n = u->nadd;

    if (!n)
        return;
    io_uring_buf_ring_advance(u->br, (int)n);
    u->nadd = 0;
    while (n-- && (l = ferry__list_pop_front(&u->starved)) != NULL) {
        struct ferry__uconn *c = ferry__container_of(l, struct ferry__uconn, o.link);

        c->starved = false;
        if (!c->armed && !c->nq)
            ferry__uring_recv_arm(c);
    }
}

static void accept_done(struct ferry__uring *u, struct ferry__uacc *a,
                        const struct io_uring_cqe *cqe);

void ferry__uring_reap(struct ferry__uring *u)
{
    struct io_uring_cqe *cqe;
    unsigned head, n = 0;

    io_uring_for_each_cqe(&u->ring, head, cqe)
    {
        uint64_t ud = cqe->user_data;
        void *p = (void *)(uintptr_t)(ud & ~(uint64_t)OP_MASK);

        n++;
        switch (ud & OP_MASK) {
        case OP_RECV:
            ferry__uring_recv_done(u, p, cqe);
            break;
        case OP_SEND:
            ferry__uring_send_done(u, p, cqe->res);
            break;
        case OP_ACCEPT:
            accept_done(u, p, cqe);
            break;
        case OP_POLL:
        case OP_POLLIN:
            ferry__uring_poll_done(u, p, (unsigned)(ud & OP_MASK));
            break;
        default:
            break;
        }
    }
    io_uring_cq_advance(&u->ring, n);
    u->loop->stats.io_completions += n;
    ferry__uring_buf_commit(u);
}

/* Before every poll of the loop (loop->io_prepoll): hand over what the
 * turn queued, in one system call, and take in what completed; what that
 * queued (receives armed again, the rest of short sends) goes too. */
static void prepoll(ferry_loop *loop)
{
    struct ferry__uring *u = ferry__ioreg_uring(loop);

    if (!u)
        return;
    for (int i = 0; i < 4 && u->pending; i++) {
        ferry__uring_submit(u);
        ferry__uring_reap(u);
    }
    ferry__uring_reap(u);
}

/* The ring's descriptor is readable: completions are posted. */
static void ring_cb(evutil_socket_t fd, short what, void *arg)
{
    struct ferry__uring *u = arg;

    (void)fd;
    (void)what;
    if (u->pending)
        ferry__uring_submit(u);
    ferry__uring_reap(u);
}

/* ---- the ring --------------------------------------------------------------- */

/* Set up the ring: single issuer with cooperative task running where the
 * kernel has them, else plain.  Not IORING_SETUP_DEFER_TASKRUN: with it the
 * kernel's side of completions runs only inside an io_uring_enter that asks
 * for completions, a few dozen items a call, and the loop waits in its
 * base, not in the ring (docs/io_uring.md). */
static int ring_init(struct ferry__uring *u)
{
    static const unsigned tries[] = {
        IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_COOP_TASKRUN,
        IORING_SETUP_COOP_TASKRUN,
        0,
    };
    struct io_uring_params p;
    int rc = -EINVAL;

    for (size_t i = 0; i < sizeof tries / sizeof tries[0]; i++) {
        memset(&p, 0, sizeof p);
        p.flags = tries[i] | IORING_SETUP_CQSIZE;
        p.cq_entries = CQ_ENTRIES;
        rc = io_uring_queue_init_params(RING_ENTRIES, &u->ring, &p);
        if (rc != -EINVAL)
            break;
    }
    if (rc)
        return rc;
    if (!(p.features & IORING_FEAT_NODROP)) {
        io_uring_queue_exit(&u->ring);
        return -ENOTSUP;
    }
    return 0;
}

/* The opcodes the backend relies on.  Returns: 0; -ENOTSUP; -ENOMEM. */
static int probe(struct ferry__uring *u)
{
    static const int ops[] = { IORING_OP_RECV, IORING_OP_SEND, IORING_OP_ACCEPT,
                               IORING_OP_ASYNC_CANCEL, IORING_OP_PROVIDE_BUFFERS };
    struct io_uring_probe *pr = io_uring_get_probe_ring(&u->ring);
    int rc = 0;

    if (!pr)
        return -ENOMEM;
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (!io_uring_opcode_supported(pr, ops[i]))
            rc = -ENOTSUP;
    io_uring_free_probe(pr);
    return rc;
}

/* The provided buffer ring.  Returns: 0; a negative errno. */
static int bufs_init(struct ferry__uring *u)
{
    struct io_uring_buf_reg reg;
    void *m;
    int rc;

    u->bufs = ferry__malloc((size_t)NBUFS * BUFSZ);
    if (!u->bufs)
        return -ENOMEM;
    u->br_bytes = (size_t)NBUFS * sizeof(struct io_uring_buf);
    m = mmap(NULL, u->br_bytes, PROT_READ | PROT_WRITE, MAP_ANONYMOUS | MAP_PRIVATE, -1, 0);
    if (m == MAP_FAILED)
        return -ENOMEM;
    u->br = m;
    memset(&reg, 0, sizeof reg);
    reg.ring_addr = (uint64_t)(uintptr_t)m;
    reg.ring_entries = NBUFS;
    reg.bgid = BGID;
    rc = io_uring_register_buf_ring(&u->ring, &reg, 0);
    if (rc)
        return rc;
    io_uring_buf_ring_init(u->br);
    for (unsigned i = 0; i < NBUFS; i++)
        ferry__uring_buf_give(u, (uint16_t)i);
    io_uring_buf_ring_advance(u->br, (int)u->nadd);
    u->nadd = 0;
    return 0;
}

static void bufs_fini(struct ferry__uring *u)
{
    if (u->br)
        munmap(u->br, u->br_bytes);
    ferry__free(u->bufs);
}

int ferry__uring_new(struct ferry__uring **out, ferry_loop *loop, const char **why)
{
    struct ferry__uring *u;
    int rc;

    *out = NULL;
    if (ferry__fault_point("uring_setup")) {
        *why = "no memory for the ring";
        return -ENOMEM;
    }
    u = ferry__calloc(1, sizeof *u);
    if (!u) {
        *why = "no memory for the ring";
        return -ENOMEM;
    }
    u->loop = loop;
    rc = ring_init(u);
    if (rc) {
        *why = rc == -ENOMEM   ? "io_uring_setup: locked memory limit"
               : rc == -EPERM  ? "io_uring_setup: not permitted (io_uring_disabled or seccomp)"
               : rc == -ENOSYS ? "io_uring_setup: not in this kernel"
                               : "io_uring_setup failed";
        ferry__free(u);
        return rc;
    }
    rc = probe(u);
    if (rc) {
        *why = "the kernel lacks an io_uring operation";
        goto err_ring;
    }
    rc = bufs_init(u);
    if (rc) {
        *why = "no provided buffer ring";
        goto err_bufs;
    }
    event_assign(&u->ev, loop->base, u->ring.ring_fd, EV_READ | EV_PERSIST, ring_cb, u);
    if (event_add(&u->ev, NULL) != 0) {
        rc = -ENOMEM;
        *why = "no memory for the ring's event";
        goto err_bufs;
    }
    u->ev_added = true;
    loop->io_prepoll = prepoll;
    *out = u;
    return 0;

err_bufs:
    bufs_fini(u);
err_ring:
    io_uring_queue_exit(&u->ring);
    ferry__free(u);
    return rc;
}

void ferry__uring_free(struct ferry__uring *u)
{
    struct ferry__link *l;
    struct io_uring_sqe *sqe;
    struct __kernel_timespec ts = { .tv_sec = 0, .tv_nsec = 10 * 1000 * 1000 };

    /* Every stream and listener is closed: cancel what is left (sends to
     * peers that stopped reading) and wait for the kernel's answers, a
     * bounded time, before the buffers they point at go. */
    sqe = ferry__uring_sqe(u);
    if (sqe) {
        io_uring_prep_cancel64(sqe, 0, IORING_ASYNC_CANCEL_ANY);
        io_uring_sqe_set_data64(sqe, 0);
    }
    for (int i = 0; i < 100 && u->inflight; i++) {
        struct io_uring_cqe *cqe;

        ferry__uring_submit(u);
        ferry__uring_reap(u);
        if (u->inflight)
            io_uring_wait_cqe_timeout(&u->ring, &cqe, &ts);
    }
    ferry__uring_reap(u);
    io_uring_queue_exit(&u->ring);
    while ((l = ferry__list_pop_front(&u->orphans)) != NULL) {
        struct uobj *o = ferry__container_of(l, struct uobj, link);

        if (!o->is_acc)
            ferry__uring_conn_free_bufs((struct ferry__uconn *)(void *)o);
        ferry__free(o);
    }
    if (u->ev_added)
        event_del(&u->ev);
    if (u->loop->io_prepoll == prepoll)
        u->loop->io_prepoll = NULL;
    bufs_fini(u);
    ferry__uring_sbufs_fini(u);
    ferry__free(u);
}


/* ---- listeners ---------------------------------------------------------------- */

/* The listener's accept: a multishot one, which stays armed from one
 * connection to the next, where the kernel has it, else one accept. */
static int accept_arm(struct ferry__uacc *a)
{
    struct ferry__uring *u = a->u;
    struct io_uring_sqe *sqe = ferry__uring_sqe(u);

    if (!sqe)
        return -ENOMEM;
    a->mshot = !u->no_mshot_accept;
    if (a->mshot) {
        io_uring_prep_multishot_accept(sqe, a->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        u->loop->stats.io_accept_multishot++;
    } else {
        io_uring_prep_accept(sqe, a->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    }
    if (!u->no_poll_first)
        sqe->ioprio |= ACCEPT_POLL_FIRST;
    io_uring_sqe_set_data64(sqe, (uint64_t)(uintptr_t)a | OP_ACCEPT);
    a->armed = true;
    ferry__uring_op_start(u, &a->o);
    return 0;
}

/* Queue descriptor `fd`, growing the queue: the kernel may accept a whole
 * backlog before the multishot accept's cancel runs, and an accepted
 * connection has nowhere else to go.  Returns: 0; -ENOMEM (fd closed). */
static int accept_queue(struct ferry__uacc *a, int fd)
{
    if (a->n == a->cap) {
        unsigned cap = 2 * a->cap;
        int *p = ferry__malloc(cap * sizeof *p);

        if (!p) {
            close(fd);
            return -ENOMEM;
        }
        for (unsigned i = 0; i < a->n; i++)
            p[i] = a->fds[(a->head + i) % a->cap];
        ferry__free(a->fds);
        a->fds = p;
        a->cap = cap;
        a->head = 0;
    }
    a->fds[(a->head + a->n++) % a->cap] = fd;
    return 0;
}

static void accept_done(struct ferry__uring *u, struct ferry__uacc *a,
                        const struct io_uring_cqe *cqe)
{
    int res = cqe->res;
    bool last = !(cqe->flags & IORING_CQE_F_MORE);

    if (last)
        a->armed = a->stopping = false;
    if (res >= 0) {
        if (!a->g)
            close(res);
        else if (accept_queue(a, res) != 0)
            a->err = -ENOMEM;
        /* Enough queued: the kernel's backlog holds the rest, as it does
         * for a listener on epoll that is not accepting. */
        if (a->g && !last && !a->stopping && a->n >= ACC_CAP) {
            ferry__uring_cancel(u, (uint64_t)(uintptr_t)a | OP_ACCEPT);
            a->stopping = true;
        }
    } else if (res == -EINVAL && !u->no_poll_first) {
        u->no_poll_first = true; /* an older kernel: armed again without */
    } else if (res == -EINVAL && a->mshot && !u->no_mshot_accept) {
        u->no_mshot_accept = true; /* older still: single accepts */
    } else if (res != -ECANCELED && a->g) {
        a->err = res;
    }
    if (!a->g) {
        if (last)
            ferry__uring_op_end(u, &a->o); /* an orphan: may free a */
        return;
    }
    if (last) {
        ferry__uring_op_end(u, &a->o);
        if (!a->err && a->n < ACC_CAP)
            accept_arm(a);
    }
    ferry__ioreg_ready(a->g, FERRY_READ);
}

int ferry__uring_listen(struct ferry__uacc **out, struct ferry__ioreg *g)
{
    struct ferry__uacc *a;

    if (ferry__fault_point("uring_listen"))
        return -ENOMEM;
    a = ferry__calloc(1, sizeof *a);
    if (!a)
        return -ENOMEM;
    a->fds = ferry__malloc(ACC_CAP * sizeof *a->fds);
    if (!a->fds) {
        ferry__free(a);
        return -ENOMEM;
    }
    a->cap = ACC_CAP;
    a->o.is_acc = true;
    a->u = ferry__ioreg_uring(g->loop);
    a->g = g;
    a->fd = g->fd;
    *out = a;
    return 0;
}

int ferry__uring_accept(struct ferry__uacc *a)
{
    int fd, rc;

    if (a->n) {
        fd = a->fds[a->head];
        a->head = (a->head + 1) % a->cap;
        a->n--;
        if (!a->armed && !a->err && a->n < ACC_CAP)
            accept_arm(a);
        return fd;
    }
    if (a->err) {
        rc = a->err;
        a->err = 0;
        return rc;
    }
    if (!a->armed && accept_arm(a) != 0)
        return -ENOMEM;
    return -EAGAIN;
}

void ferry__uring_listen_close(struct ferry__uacc *a)
{
    struct ferry__uring *u = a->u;

    a->g = NULL;
    while (a->n) {
        close(a->fds[a->head]);
        a->head = (a->head + 1) % a->cap;
        a->n--;
    }
    ferry__free(a->fds);
    a->fds = NULL;
    a->cap = 0;
    if (!a->o.ops) {
        ferry__free(a);
        return;
    }
    ferry__uring_cancel(u, (uint64_t)(uintptr_t)a | OP_ACCEPT);
    a->o.closed = true;
    ferry__list_push_back(&u->orphans, &a->o.link);
    /* The kernel holds the listening socket until the accept's cancel has
     * run: the port is free again once this returns. */
    ferry__uring_submit(u);
    ferry__uring_reap(u);
}
