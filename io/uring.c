/* uring.c - the io_uring backend of a loop's streams and listeners
 * (FERRY_IO=uring, docs/io_uring.md).
 * Loop thread only.
 *
 * One ring per loop, made with its first stream or listener (ioreg.c
 * chooses), and issued from the loop's thread only.  Its descriptor is
 * one read event of the loop's base, so the loop's one wait wakes for
 * completions as for timers, the inbox and the other loops; the loop's
 * io_prepoll hook hands the kernel what a turn queued, in one system call
 * for all streams, and takes in what completed.
 *
 * Receiving.  A stream's receive is a multishot recv that picks its
 * buffer from the loop's provided buffer ring when bytes arrive, so idle
 * connections hold no buffer.  Filled buffers queue on the stream (linked
 * through the loop's per-buffer `next`, so a completion allocates
 * nothing); the seam's recv copies out of them and gives each buffer back
 * at once.  A stream holding CONN_CAP unread buffers has its receive
 * cancelled until its reader drains it, so one busy peer cannot take every
 * buffer.  A receive that finds the ring empty (ENOBUFS) waits in the
 * loop's starved list until buffers come back.  The receive is armed by
 * the stream's first read, and again after it ended.
 *
 * Cancel safety.  The kernel hands bytes to the stream, not to a reader:
 * a read that is cancelled leaves them queued for the next read, and the
 * receive stays armed.  Likewise accepted descriptors queue in the
 * listener.  Nothing the kernel has completed is lost or delivered twice.
 *
 * Sending.  The seam's send copies into the stream's own buffer and queues
 * one SEND; a short send resubmits the rest; flush says EAGAIN until the
 * kernel has taken every byte, so a write returns when its bytes are in
 * the socket, as with epoll.  A large write with nothing in flight is
 * tried with a direct send(2) first (the bulk rule, docs/io_uring.md).
 *
 * Closing.  A closed stream's receive and send are cancelled, its queued
 * buffers go back, and its descriptor is closed at once (the kernel holds
 * the file until its operations end).  The state stays, as an orphan,
 * until the kernel has answered every operation; the ring's end waits for
 * them.
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

#include "loop_int.h"
#include "stream_int.h"

/* What a completion's user_data names, in the low bits of the object's
 * address (user_data 0: a cancel's own completion, ignored). */
enum { OP_RECV = 1, OP_SEND = 2, OP_ACCEPT = 3, OP_MASK = 7 };

#define NBUFS        512         /* receive buffers per loop: 2 MiB in all */
#define BUFSZ        4096        /* bytes per receive buffer */
#define BGID         0           /* the buffer group of the loop's ring */
#define CONN_CAP     8           /* unread buffers a stream may hold */
#define ACC_CAP      16          /* accepted descriptors a listener queues */
#define SEND_MAX     (64 * 1024) /* bytes one SEND of a stream carries */
#define SEND_DIRECT  (64 * 1024) /* a write this large tries send(2) first */
#define RING_ENTRIES 256         /* submission queue entries */
#define CQ_ENTRIES   4096        /* completion queue entries */
#define NO_BUF       0xffff      /* end of a stream's buffer queue */
/* An accept's flag (kernel 6.10): wait for a connection before taking a
 * descriptor, so that running out of descriptors is reported only with a
 * connection queued, as accept4() reports it.  liburing 2.3 predates it. */
#define ACCEPT_POLL_FIRST (1U << 2)

struct ferry__uring {
    struct io_uring ring;         /* the ring */
    ferry_loop *loop;             /* its loop */
    struct event ev;              /* the ring's descriptor in the base */
    bool ev_added;                /* ev is added */
    bool defer;                   /* IORING_SETUP_DEFER_TASKRUN: completions
                                   * are posted only when asked for */
    bool no_poll_first;           /* the kernel refused ACCEPT_POLL_FIRST */
    struct io_uring_buf_ring *br; /* the provided buffer ring (mapped) */
    size_t br_bytes;              /* its mapping's size */
    char *bufs;                   /* NBUFS buffers of BUFSZ */
    uint16_t next[NBUFS];         /* next buffer in a stream's queue */
    uint32_t blen[NBUFS];         /* bytes in a queued buffer */
    unsigned nadd;                /* buffers given back since the last advance */
    unsigned pending;             /* prepared entries not yet submitted */
    unsigned inflight;            /* operations the kernel has not ended */
    struct ferry__link starved;   /* streams whose receive found no buffer */
    struct ferry__link orphans;   /* closed objects with operations in flight */
};

/* What streams and listeners share: their operations in flight. */
struct uobj {
    struct ferry__link link; /* in starved (streams) or orphans */
    unsigned ops;            /* operations in flight */
    bool closed;             /* the stream or listener closed: an orphan */
    bool is_acc;             /* a listener (struct ferry__uacc) */
};

struct ferry__uconn {
    struct uobj o; /* first: user_data points here */
    struct ferry__uring *u;
    ferry_stream *s;     /* the stream, NULL once closed */
    int fd;              /* the descriptor */
    uint16_t head, tail; /* queued buffers, oldest first */
    unsigned nq;         /* how many */
    uint32_t off;        /* bytes of the head already read */
    bool armed;          /* the multishot receive is in flight */
    bool capped;         /* its cancel (the cap) is queued */
    bool starved;        /* in u->starved */
    bool eof;            /* the peer's end came after the queue */
    int rerr;            /* a receive error after the queue, or 0 */
    char *sbuf;          /* bytes of the SEND in flight */
    size_t scap;         /* sbuf's size */
    size_t slen, soff;   /* bytes in sbuf, bytes the kernel took */
    char *qbuf;          /* bytes written while a SEND is in flight: the
                          * next SEND */
    size_t qcap, qlen;   /* qbuf's size, bytes in it */
    bool sending;        /* a SEND is in flight */
    bool shut;           /* shutdown asked for while sending */
    int werr;            /* a send error for the next write, or 0 */
};

struct ferry__uacc {
    struct uobj o; /* first: user_data points here */
    struct ferry__uring *u;
    struct ferry__ioreg *g; /* the listener's registration, NULL once closed */
    int fd;                 /* the listening descriptor */
    bool armed;             /* an ACCEPT is in flight */
    int err;                /* an accept's error for the next call, or 0 */
    int fds[ACC_CAP];       /* accepted descriptors, oldest at head */
    unsigned head, n;       /* ring position and count */
};

/* ---- submission and completion ---------------------------------------------- */

static void submit(struct ferry__uring *u)
{
    int rc;

    do
        rc = u->defer ? io_uring_submit_and_get_events(&u->ring) : io_uring_submit(&u->ring);
    while (rc == -EINTR);
    u->loop->stats.io_submits++;
    u->pending = 0;
}

/* A submission queue entry; the queue is handed over first if it is full.
 * NULL only if the kernel took none of it. */
static struct io_uring_sqe *sqe_get(struct ferry__uring *u)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);

    if (!sqe) {
        submit(u);
        sqe = io_uring_get_sqe(&u->ring);
    }
    if (sqe)
        u->pending++;
    return sqe;
}

/* Queue a cancel of the operation `ud`; its own completion is ignored. */
static void cancel(struct ferry__uring *u, uint64_t ud)
{
    struct io_uring_sqe *sqe = sqe_get(u);

    if (!sqe)
        return;
    io_uring_prep_cancel64(sqe, ud, 0);
    io_uring_sqe_set_data64(sqe, 0);
}

static void conn_free_bufs(struct ferry__uconn *c)
{
    ferry__free(c->sbuf);
    ferry__free(c->qbuf);
}

static void op_start(struct ferry__uring *u, struct uobj *o)
{
    o->ops++;
    u->inflight++;
}

/* An operation of `o` ended: an orphan with none left is freed. */
static void op_end(struct ferry__uring *u, struct uobj *o)
{
    o->ops--;
    u->inflight--;
    if (o->closed && !o->ops) {
        ferry__list_remove(&o->link);
        if (!o->is_acc)
            conn_free_bufs((struct ferry__uconn *)(void *)o);
        ferry__free(o);
    }
}

/* Give buffer `bid` back to the ring (visible at buf_commit()). */
static void buf_give(struct ferry__uring *u, uint16_t bid)
{
    io_uring_buf_ring_add(u->br, u->bufs + (size_t)bid * BUFSZ, BUFSZ, bid,
                          io_uring_buf_ring_mask(NBUFS), (int)u->nadd++);
}

static int recv_arm(struct ferry__uconn *c);

/* Publish the buffers given back, and let starved streams receive again,
 * one per buffer. */
static void buf_commit(struct ferry__uring *u)
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
        if (!c->armed && c->nq < CONN_CAP)
            recv_arm(c);
    }
}

/* The stream's multishot receive into the loop's buffer ring.
 * Returns: 0; -ENOMEM (no queue entry). */
static int recv_arm(struct ferry__uconn *c)
{
    struct io_uring_sqe *sqe = sqe_get(c->u);

    if (!sqe)
        return -ENOMEM;
    io_uring_prep_recv_multishot(sqe, c->fd, NULL, 0, 0);
    sqe->flags |= IOSQE_BUFFER_SELECT;
    sqe->buf_group = BGID;
    io_uring_sqe_set_data64(sqe, (uint64_t)(uintptr_t)c | OP_RECV);
    c->armed = true;
    c->capped = false;
    op_start(c->u, &c->o);
    return 0;
}

static void recv_done(struct ferry__uring *u, struct ferry__uconn *c,
                      const struct io_uring_cqe *cqe)
{
    int res = cqe->res;

    if (res > 0 && (cqe->flags & IORING_CQE_F_BUFFER)) {
        uint16_t bid = (uint16_t)(cqe->flags >> IORING_CQE_BUFFER_SHIFT);

        if (!c->s) {
            buf_give(u, bid);
        } else {
            u->blen[bid] = (uint32_t)res;
            u->next[bid] = NO_BUF;
            if (c->nq)
                u->next[c->tail] = bid;
            else
                c->head = bid;
            c->tail = bid;
            c->nq++;
            if (c->nq >= CONN_CAP && c->armed && !c->capped && (cqe->flags & IORING_CQE_F_MORE)) {
                cancel(u, (uint64_t)(uintptr_t)c | OP_RECV);
                c->capped = true;
            }
        }
    } else if (res == 0) {
        /* A reset that a send took first (its error is the socket's one
         * pending error) ends the reads with the reset too, as the epoll
         * backend's reader would have seen it. */
        if (c->werr == -ECONNRESET)
            c->rerr = -ECONNRESET;
        else
            c->eof = true;
    } else if (res == -ENOBUFS) {
        u->loop->stats.io_buf_empty++;
        if (c->s && !c->starved) {
            c->starved = true;
            ferry__list_push_back(&u->starved, &c->o.link);
        }
    } else if (res < 0 && res != -ECANCELED) {
        c->rerr = res;
    }
    if (cqe->flags & IORING_CQE_F_MORE)
        goto out;
    c->armed = false;
    c->capped = false;
    if (!c->s) {
        op_end(u, &c->o);
        return;
    }
    op_end(u, &c->o);
    /* A receive that ended with room left (the kernel may end one at any
     * time) goes on; a capped or starved one waits for its reader or for
     * buffers. */
    if (!c->eof && !c->rerr && !c->starved && c->nq < CONN_CAP)
        recv_arm(c);
out:
    if (c->s)
        ferry__ioreg_ready(&c->s->reg, FERRY_READ);
}

static int send_sqe(struct ferry__uconn *c)
{
    struct io_uring_sqe *sqe = sqe_get(c->u);

    if (!sqe)
        return -ENOMEM;
    io_uring_prep_send(sqe, c->fd, c->sbuf + c->soff, c->slen - c->soff, MSG_NOSIGNAL);
    io_uring_sqe_set_data64(sqe, (uint64_t)(uintptr_t)c | OP_SEND);
    c->sending = true;
    op_start(c->u, &c->o);
    return 0;
}

static void send_done(struct ferry__uring *u, struct ferry__uconn *c, int res)
{
    bool orphan = c->s == NULL;

    c->sending = false;
    if (res > 0)
        c->soff += (size_t)res;
    else if (res < 0 && !c->werr)
        c->werr = res == -ECANCELED ? -EPIPE : res;
    else if (res == 0)
        c->werr = -EPIPE;
    if (!orphan && !c->werr && c->soff == c->slen && c->qlen) {
        /* The bytes written meanwhile go next. */
        char *p = c->sbuf;
        size_t cap = c->scap;

        c->sbuf = c->qbuf;
        c->scap = c->qcap;
        c->slen = c->qlen;
        c->soff = 0;
        c->qbuf = p;
        c->qcap = cap;
        c->qlen = 0;
    }
    if (c->werr)
        c->qlen = 0;
    if (!orphan && !c->werr && c->soff < c->slen && send_sqe(c) != 0)
        c->werr = -ENOMEM;
    if (!orphan && !c->sending && c->shut)
        shutdown(c->fd, SHUT_WR);
    op_end(u, &c->o);
    if (!orphan)
        ferry__ioreg_ready(&c->s->reg, FERRY_WRITE);
}

static void accept_done(struct ferry__uring *u, struct ferry__uacc *a, int res);

/* Take in every completion posted. */
static void reap(struct ferry__uring *u)
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
            recv_done(u, p, cqe);
            break;
        case OP_SEND:
            send_done(u, p, cqe->res);
            break;
        case OP_ACCEPT:
            accept_done(u, p, cqe->res);
            break;
        default:
            break;
        }
    }
    io_uring_cq_advance(&u->ring, n);
    u->loop->stats.io_completions += n;
    buf_commit(u);
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
        submit(u);
        reap(u);
    }
    reap(u);
}

/* The ring's descriptor is readable: completions are posted, or (with
 * deferred task running) waiting to be. */
static void ring_cb(evutil_socket_t fd, short what, void *arg)
{
    struct ferry__uring *u = arg;

    (void)fd;
    (void)what;
    if (u->defer || u->pending)
        submit(u);
    reap(u);
}

/* ---- the ring --------------------------------------------------------------- */

/* Set up the ring: single issuer with cooperative task running where the
 * kernel has them, else plain.  Not IORING_SETUP_DEFER_TASKRUN: with it the
 * ring's descriptor did not wake the base's poll for completions that
 * were waiting to be posted, and the stream suites hung in their waits. */
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
    u->defer = (p.flags & IORING_SETUP_DEFER_TASKRUN) != 0;
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
        buf_give(u, (uint16_t)i);
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
    sqe = sqe_get(u);
    if (sqe) {
        io_uring_prep_cancel64(sqe, 0, IORING_ASYNC_CANCEL_ANY);
        io_uring_sqe_set_data64(sqe, 0);
    }
    for (int i = 0; i < 100 && u->inflight; i++) {
        struct io_uring_cqe *cqe;

        submit(u);
        reap(u);
        if (u->inflight)
            io_uring_wait_cqe_timeout(&u->ring, &cqe, &ts);
    }
    reap(u);
    io_uring_queue_exit(&u->ring);
    while ((l = ferry__list_pop_front(&u->orphans)) != NULL) {
        struct uobj *o = ferry__container_of(l, struct uobj, link);

        if (!o->is_acc)
            conn_free_bufs((struct ferry__uconn *)(void *)o);
        ferry__free(o);
    }
    if (u->ev_added)
        event_del(&u->ev);
    if (u->loop->io_prepoll == prepoll)
        u->loop->io_prepoll = NULL;
    bufs_fini(u);
    ferry__free(u);
}

/* ---- streams ---------------------------------------------------------------- */

static ssize_t conn_recv(ferry_stream *s, void *buf, size_t len, int *want)
{
    struct ferry__uconn *c = s->ring;
    struct ferry__uring *u = c->u;
    size_t got = 0;

    while (got < len && c->nq) {
        uint16_t bid = c->head;
        size_t k = u->blen[bid] - c->off;

        if (k > len - got)
            k = len - got;
        memcpy((char *)buf + got, u->bufs + (size_t)bid * BUFSZ + c->off, k);
        got += k;
        c->off += (uint32_t)k;
        if (c->off == u->blen[bid]) {
            c->head = u->next[bid];
            c->nq--;
            c->off = 0;
            buf_give(u, bid);
        }
    }
    buf_commit(u);
    if (!c->armed && !c->capped && !c->starved && !c->eof && !c->rerr && c->nq < CONN_CAP &&
        recv_arm(c) != 0 && !got)
        return -ENOMEM;
    if (got)
        return (ssize_t)got;
    if (c->eof)
        return 0;
    if (c->rerr)
        return c->rerr;
    *want = FERRY_READ;
    return -EAGAIN;
}

/* A large write with nothing in flight: straight to the socket, as the
 * epoll backend does (the bulk rule).  Returns: the count, -EAGAIN (go
 * through the ring), or a negative errno. */
static ssize_t send_direct(struct ferry__uconn *c, const struct iovec *iov, int n)
{
    struct msghdr m = { .msg_iov = (struct iovec *)(uintptr_t)iov, .msg_iovlen = (size_t)n };
    ssize_t k;

    do
        k = sendmsg(c->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (k < 0 && errno == EINTR);
    if (k >= 0)
        return k > 0 ? k : -EAGAIN;
    return errno == EAGAIN || errno == EWOULDBLOCK ? -EAGAIN : -errno;
}

/* Copy up to `max` bytes of iov[0, n) to the end of *buf (of *cap bytes,
 * *len used), growing it.  Returns: the count; -ENOMEM. */
static ssize_t append(char **buf, size_t *cap, size_t *len, const struct iovec *iov, int n,
                      size_t max)
{
    size_t total = 0, at = *len;

    for (int i = 0; i < n && total < max; i++)
        total += iov[i].iov_len < max - total ? iov[i].iov_len : max - total;
    if (*cap < at + total) {
        size_t want = at + total < 4096 ? 4096 : SEND_MAX;
        char *p = ferry__realloc(*buf, want);

        if (!p)
            return -ENOMEM;
        *buf = p;
        *cap = want;
    }
    for (int i = 0; i < n && *len - at < total; i++) {
        size_t left = total - (*len - at);
        size_t k = iov[i].iov_len < left ? iov[i].iov_len : left;

        memcpy(*buf + *len, iov[i].iov_base, k);
        *len += k;
    }
    return (ssize_t)total;
}

static ssize_t conn_send(ferry_stream *s, const struct iovec *iov, int n, int *want)
{
    struct ferry__uconn *c = s->ring;
    size_t total = 0;
    ssize_t k;
    int rc;

    if (c->werr)
        return c->werr;
    if (c->sending) {
        /* Behind the SEND in flight, up to one more buffer's worth, but
         * not for a write call: its count must be of bytes the kernel
         * took, should it be cancelled (a transport on top sending
         * outside a write, TLS answering while it reads or shutting
         * down, may queue them). */
        if (c->qlen >= SEND_MAX || s->writing) {
            *want = FERRY_WRITE;
            return -EAGAIN;
        }
        return append(&c->qbuf, &c->qcap, &c->qlen, iov, n, SEND_MAX - c->qlen);
    }
    for (int i = 0; i < n; i++)
        total += iov[i].iov_len;
    if (total >= SEND_DIRECT) {
        k = send_direct(c, iov, n);
        if (k != -EAGAIN)
            return k;
    }
    c->slen = c->soff = 0;
    k = append(&c->sbuf, &c->scap, &c->slen, iov, n, SEND_MAX);
    if (k < 0)
        return k;
    rc = send_sqe(c);
    return rc ? rc : k;
}

static int conn_flush(ferry_stream *s, int *want)
{
    struct ferry__uconn *c = s->ring;

    if (c->sending) {
        *want = FERRY_WRITE;
        return -EAGAIN;
    }
    return c->werr;
}

static int conn_shutdown(ferry_stream *s)
{
    struct ferry__uconn *c = s->ring;

    /* After the bytes in flight, which a write under a transport of its
     * own (TLS) may have left. */
    if (c->sending) {
        c->shut = true;
        return 0;
    }
    return shutdown(c->fd, SHUT_WR) == 0 ? 0 : -errno;
}

static void conn_close(ferry_stream *s)
{
    struct ferry__uconn *c = s->ring;
    struct ferry__uring *u = c->u;

    s->ring = NULL;
    c->s = NULL;
    if (c->starved) {
        ferry__list_remove(&c->o.link);
        c->starved = false;
    }
    while (c->nq) {
        buf_give(u, c->head);
        c->head = u->next[c->head];
        c->nq--;
    }
    buf_commit(u);
    if (c->armed && !c->capped)
        cancel(u, (uint64_t)(uintptr_t)c | OP_RECV);
    if (c->sending)
        cancel(u, (uint64_t)(uintptr_t)c | OP_SEND);
    /* Hand over now what names the descriptor by its number, before the
     * number goes: the kernel looks an entry's descriptor up when it takes
     * it, and from then on holds the file itself until the operation
     * ends, so the number may be closed and reused at once. */
    if (u->pending)
        submit(u);
    close(c->fd);
    if (!c->o.ops) {
        conn_free_bufs(c);
        ferry__free(c);
        return;
    }
    c->o.closed = true;
    ferry__list_push_back(&u->orphans, &c->o.link);
    reap(u);
}

static const struct ferry__stream_io uring_io = {
    .recv = conn_recv,
    .send = conn_send,
    .shutdown = conn_shutdown,
    .close = conn_close,
    .flush = conn_flush,
    .drains = false,
};

int ferry__uring_stream_attach(ferry_stream *s)
{
    struct ferry__uconn *c;

    if (ferry__fault_point("uring_conn"))
        return -ENOMEM;
    c = ferry__calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    c->u = ferry__ioreg_uring(s->reg.loop);
    c->s = s;
    c->fd = s->reg.fd;
    s->ring = c;
    s->io = &uring_io;
    return 0;
}

/* ---- listeners ---------------------------------------------------------------- */

static int accept_arm(struct ferry__uacc *a)
{
    struct io_uring_sqe *sqe = sqe_get(a->u);

    if (!sqe)
        return -ENOMEM;
    io_uring_prep_accept(sqe, a->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (!a->u->no_poll_first)
        sqe->ioprio |= ACCEPT_POLL_FIRST;
    io_uring_sqe_set_data64(sqe, (uint64_t)(uintptr_t)a | OP_ACCEPT);
    a->armed = true;
    op_start(a->u, &a->o);
    return 0;
}

static void accept_done(struct ferry__uring *u, struct ferry__uacc *a, int res)
{
    a->armed = false;
    if (res >= 0) {
        /* The queue has room: an accept is armed only then. */
        if (a->g)
            a->fds[(a->head + a->n++) % ACC_CAP] = res;
        else
            close(res);
    } else if (res == -EINVAL && !u->no_poll_first) {
        u->no_poll_first = true; /* an older kernel: armed again without */
    } else if (res != -ECANCELED && a->g) {
        a->err = res;
    }
    if (!a->g) {
        op_end(u, &a->o);
        return;
    }
    op_end(u, &a->o);
    if (!a->err && a->n < ACC_CAP)
        accept_arm(a);
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
        a->head = (a->head + 1) % ACC_CAP;
        a->n--;
        if (!a->armed && !a->err)
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
        a->head = (a->head + 1) % ACC_CAP;
        a->n--;
    }
    if (!a->o.ops) {
        ferry__free(a);
        return;
    }
    cancel(u, (uint64_t)(uintptr_t)a | OP_ACCEPT);
    a->o.closed = true;
    ferry__list_push_back(&u->orphans, &a->o.link);
    /* The kernel holds the listening socket until the accept's cancel has
     * run: the port is free again once this returns. */
    submit(u);
    reap(u);
}
