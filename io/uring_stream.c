/* uring_stream.c - the io_uring transport of a stream (struct
 * ferry__stream_io, stream_int.h; docs/io_uring.md).
 * Loop thread only.
 *
 * Receiving.  A stream's reader that finds nothing arms a multishot
 * receive, which stays armed from one message to the next; each
 * completion brings one buffer, picked from the loop's provided buffer
 * ring when bytes arrive, so a waiting connection holds no buffer.  A
 * stream holds at most about RECV_HOLD buffers: once it holds them, its
 * receive is cancelled until its reader has taken them, and the kernel
 * caps the bytes one multishot receive takes (RECV_LIMIT), so that the
 * kernel cannot fill more before the cancel runs.  One busy peer cannot
 * take the others' buffers.  Where the kernel has no such cap, receives
 * are of one buffer each.  Completed buffers queue on the stream (linked
 * through the loop's per-buffer `next`, so a completion allocates
 * nothing); the seam's recv copies out of them and gives each buffer back
 * at once.  A receive that finds the ring empty (ENOBUFS) waits in the
 * loop's starved list until buffers come back.  After a receive that
 * filled its buffer, once nothing is armed, the next read takes the rest
 * straight from the socket (no receive in flight can overtake it); a
 * stream whose read took a buffer's worth or more that way then waits for
 * its next bytes as epoll does (a POLLIN through the ring) and reads them
 * straight from the socket too: a stream that moves bulk costs one system
 * call per read, as with epoll, and not a round through the ring per
 * 4 KiB (the bulk rule).
 *
 * Sending.  The seam's send copies into a send buffer, which the stream
 * holds only until the kernel has taken its bytes, and queues one SEND;
 * a short send resubmits the rest; flush says EAGAIN until the kernel
 * has taken every byte, so a write returns when its bytes are in
 * the socket, as with epoll.  A large write goes straight to the socket
 * with send(2), and waits for room through the ring when it is full,
 * without copying (the bulk rule, docs/io_uring.md).
 *
 * Closing.  A closed stream's receive and send are cancelled, its queued
 * buffers go back, and its descriptor is closed at once (the kernel holds
 * the file until its operations end).
 */
/* Without loop_only.h: liburing's inline functions use <stdatomic.h> for
 * the rings it shares with the kernel, and the poison would reject them.
 * This file itself uses neither atomics nor threads. */
#include <errno.h>
#include <liburing.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "uring_int.h"

/* Memcheck cannot see the kernel write a provided buffer: a completion
 * tells it, where its header is there (no effect outside valgrind). */
#if defined(__has_include)
#if __has_include(<valgrind/memcheck.h>)
#include <valgrind/memcheck.h>
#define KERNEL_WROTE(p, n) VALGRIND_MAKE_MEM_DEFINED(p, n)
#endif
#endif
#ifndef KERNEL_WROTE
#define KERNEL_WROTE(p, n) ((void)(p), (void)(n))
#endif

/* A stream holds a send buffer only while its bytes are on their way, so
 * that an idle connection holds none; the loop keeps some of each size,
 * enough for many connections sending at once, so that a stream writing
 * again does not allocate again (a freed buffer's pages come back as
 * faults at its next use). */
static char *sbuf_get(struct ferry__uring *u, size_t cap)
{
    int k = cap == SBUF_SMALL ? 0 : 1;
    char *p = u->sfree[k];

    if (p) {
        memcpy(&u->sfree[k], p, sizeof u->sfree[k]);
        u->nsfree[k]--;
        return p;
    }
    return ferry__malloc(cap);
}

static void sbuf_put(struct ferry__uring *u, char *p, size_t cap)
{
    int k = cap == SBUF_SMALL ? 0 : 1;

    if (!p)
        return;
    if (u->nsfree[k] >= (k ? SBUF_KEEP_LARGE : SBUF_KEEP)) {
        ferry__free(p);
        return;
    }
    memcpy(p, &u->sfree[k], sizeof u->sfree[k]);
    u->sfree[k] = p;
    u->nsfree[k]++;
}

void ferry__uring_sbufs_fini(struct ferry__uring *u)
{
    for (int k = 0; k < 2; k++) {
        while (u->sfree[k]) {
            char *p = u->sfree[k];

            memcpy(&u->sfree[k], p, sizeof u->sfree[k]);
            ferry__free(p);
        }
        u->nsfree[k] = 0;
    }
}

void ferry__uring_conn_free_bufs(struct ferry__uconn *c)
{
    sbuf_put(c->u, c->sbuf, c->scap);
    sbuf_put(c->u, c->qbuf, c->qcap);
    c->sbuf = c->qbuf = NULL;
    c->scap = c->qcap = 0;
}

/* The stream's receive from the loop's buffer ring: a multishot one,
 * which stays armed from one message to the next, capped by the kernel
 * at RECV_LIMIT bytes; where the kernel has no such cap (it refuses the
 * entry: recv_done()), a receive of one buffer.  Returns: 0; -ENOMEM (no
 * queue entry). */
int ferry__uring_recv_arm(struct ferry__uconn *c)
{
    struct ferry__uring *u = c->u;
    struct io_uring_sqe *sqe = ferry__uring_sqe(u);

    if (!sqe)
        return -ENOMEM;
    io_uring_prep_recv(sqe, c->fd, NULL, BUFSZ, 0);
    sqe->flags |= IOSQE_BUFFER_SELECT;
    sqe->buf_group = BGID;
    c->mshot = !u->no_mshot;
    if (c->mshot) {
        sqe->ioprio |= IORING_RECV_MULTISHOT;
        /* The cap's field (optlen) shares its place with file_index,
         * which liburing 2.3 names. */
        sqe->file_index = RECV_LIMIT;
        u->loop->stats.io_recv_multishot++;
    }
    io_uring_sqe_set_data64(sqe, (uint64_t)(uintptr_t)c | OP_RECV);
    c->armed = true;
    ferry__uring_op_start(u, &c->o);
    return 0;
}

void ferry__uring_recv_done(struct ferry__uring *u, struct ferry__uconn *c,
                            const struct io_uring_cqe *cqe)
{
    int res = cqe->res;
    bool last = !(cqe->flags & IORING_CQE_F_MORE), again = false;

    if (last)
        c->armed = c->stopping = false;
    if (res > 0 && (cqe->flags & IORING_CQE_F_BUFFER)) {
        uint16_t bid = (uint16_t)(cqe->flags >> IORING_CQE_BUFFER_SHIFT);

        if (!c->s) {
            ferry__uring_buf_give(u, bid);
        } else {
            KERNEL_WROTE(u->bufs + (size_t)bid * BUFSZ, (size_t)res);
            u->blen[bid] = (uint32_t)res;
            u->next[bid] = NO_BUF;
            if (c->nq)
                u->next[c->tail] = bid;
            else
                c->head = bid;
            c->tail = bid;
            c->nq++;
            u->loop->stats.io_bufs_held++;
            /* A full buffer: more is probably waiting in the socket. */
            c->more = res == BUFSZ;
            /* The stream holds its share of the loop's buffers: the
             * receive stops until its reader has taken them, so that a
             * peer whose reader is slow cannot take the others'.  The
             * kernel's cap bounds what it fills before the cancel runs. */
            if (!last && !c->stopping && c->nq >= RECV_HOLD) {
                ferry__uring_cancel(u, (uint64_t)(uintptr_t)c | OP_RECV);
                c->stopping = true;
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
    } else if (res == -EINVAL && c->mshot && !u->no_mshot) {
        /* A kernel without the multishot receive's cap: receives of one
         * buffer from now on, this one too. */
        u->no_mshot = true;
        again = true;
    } else if (res == -ENOBUFS) {
        u->loop->stats.io_buf_empty++;
        if (c->s && !c->starved) {
            c->starved = true;
            ferry__list_push_back(&u->starved, &c->o.link);
        }
    } else if (res < 0 && res != -ECANCELED) {
        c->rerr = res;
    }
    if (!c->s) {
        if (last)
            ferry__uring_op_end(u, &c->o); /* an orphan: may free c */
        return;
    }
    if (last)
        ferry__uring_op_end(u, &c->o);
    if (again && !c->armed && ferry__uring_recv_arm(c) != 0)
        c->rerr = -ENOMEM;
    ferry__ioreg_ready(&c->s->reg, FERRY_READ);
}

static int send_sqe(struct ferry__uconn *c)
{
    struct io_uring_sqe *sqe = ferry__uring_sqe(c->u);

    if (!sqe)
        return -ENOMEM;
    io_uring_prep_send(sqe, c->fd, c->sbuf + c->soff, c->slen - c->soff, MSG_NOSIGNAL);
    io_uring_sqe_set_data64(sqe, (uint64_t)(uintptr_t)c | OP_SEND);
    c->sending = true;
    ferry__uring_op_start(c->u, &c->o);
    return 0;
}

void ferry__uring_send_done(struct ferry__uring *u, struct ferry__uconn *c, int res)
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
    /* Buffers with nothing left to send go back to the loop: an idle
     * connection holds none. */
    if (!c->sending) {
        sbuf_put(u, c->sbuf, c->scap);
        c->sbuf = NULL;
        c->scap = c->slen = c->soff = 0;
    }
    if (!c->qlen) {
        sbuf_put(u, c->qbuf, c->qcap);
        c->qbuf = NULL;
        c->qcap = 0;
    }
    ferry__uring_op_end(u, &c->o);
    if (!orphan)
        ferry__ioreg_ready(&c->s->reg, FERRY_WRITE);
}


/* ---- streams ---------------------------------------------------------------- */

/* After a full buffer, the rest straight from the socket (no receive is
 * in flight, so nothing can overtake it): a stream moving bulk reads as
 * with epoll, one system call per read.  Returns: the count (0: the end),
 * -EAGAIN, or a negative errno. */
static ssize_t recv_direct(struct ferry__uconn *c, char *buf, size_t len)
{
    ssize_t k;

    c->more = false;
    do
        k = recv(c->fd, buf, len, MSG_DONTWAIT);
    while (k < 0 && errno == EINTR);
    if (k >= 0) {
        c->more = (size_t)k == len;
        c->bulk = k >= BUFSZ;
        return k;
    }
    return errno == EAGAIN || errno == EWOULDBLOCK ? -EAGAIN : -errno;
}

/* Wait for the socket through the ring, as epoll does: for bytes
 * (OP_POLLIN), for a stream moving bulk, whose reader then takes them
 * straight from the socket a read's worth at a time rather than a buffer
 * of the ring at a time; or for room (OP_POLL), after a bulk write found
 * the socket full.  Returns: 0; -ENOMEM. */
static int poll_arm(struct ferry__uconn *c, unsigned op)
{
    struct io_uring_sqe *sqe = ferry__uring_sqe(c->u);

    if (!sqe)
        return -ENOMEM;
    io_uring_prep_poll_add(sqe, c->fd, op == OP_POLLIN ? POLLIN | POLLRDHUP : POLLOUT);
    io_uring_sqe_set_data64(sqe, (uint64_t)(uintptr_t)c | op);
    if (op == OP_POLLIN)
        c->pollin = true;
    else
        c->polling = true;
    ferry__uring_op_start(c->u, &c->o);
    return 0;
}

void ferry__uring_poll_done(struct ferry__uring *u, struct ferry__uconn *c, unsigned op)
{
    ferry_stream *s = c->s;

    if (op == OP_POLLIN) {
        c->pollin = false;
        /* Readable, at its end, or in error: the reader's next recv(2)
         * says which. */
        c->more = true;
    } else {
        c->polling = false;
    }
    ferry__uring_op_end(u, &c->o); /* an orphan (no stream): may free c */
    if (s)
        ferry__ioreg_ready(&s->reg, op == OP_POLLIN ? FERRY_READ : FERRY_WRITE);
}

/* The stream's next bytes: waited for as epoll does for a stream moving
 * bulk, received through the buffer ring otherwise. */
static int read_arm(struct ferry__uconn *c)
{
    return c->bulk ? poll_arm(c, OP_POLLIN) : ferry__uring_recv_arm(c);
}

static ssize_t conn_recv(ferry_stream *s, void *buf, size_t len, int *want)
{
    struct ferry__uconn *c = s->ring;
    struct ferry__uring *u = c->u;
    size_t got = 0;
    ssize_t k;

    while (got < len && c->nq) {
        uint16_t bid = c->head;
        size_t n = u->blen[bid] - c->off;

        if (n > len - got)
            n = len - got;
        memcpy((char *)buf + got, u->bufs + (size_t)bid * BUFSZ + c->off, n);
        got += n;
        c->off += (uint32_t)n;
        if (c->off == u->blen[bid]) {
            c->head = u->next[bid];
            c->nq--;
            c->off = 0;
            u->loop->stats.io_bufs_held--;
            ferry__uring_buf_give(u, bid);
        }
    }
    ferry__uring_buf_commit(u);
    c->reads = true;
    if (c->nq || c->armed || c->pollin || c->starved || c->eof || c->rerr)
        goto out;
    if (c->more && got < len) {
        k = recv_direct(c, (char *)buf + got, len - got);
        if (k > 0)
            got += (size_t)k;
        else if (k == 0 && c->werr == -ECONNRESET)
            c->rerr = -ECONNRESET;
        else if (k == 0)
            c->eof = true;
        else if (k != -EAGAIN)
            c->rerr = (int)k;
        if (k != -EAGAIN)
            goto out;
    }
    /* Nothing left here: the next bytes come through the ring. */
    if (!c->more && read_arm(c) != 0 && !got)
        return -ENOMEM;
out:
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
 * *len used; NULL: none yet), growing it.  Returns: the count; -ENOMEM. */
static ssize_t append(struct ferry__uring *u, char **buf, size_t *cap, size_t *len,
                      const struct iovec *iov, int n, size_t max)
{
    size_t total = 0, at = *len;

    for (int i = 0; i < n && total < max; i++)
        total += iov[i].iov_len < max - total ? iov[i].iov_len : max - total;
    if (*cap < at + total) {
        size_t want = at + total <= SBUF_SMALL ? SBUF_SMALL : SEND_MAX;
        char *p = sbuf_get(u, want);

        if (!p)
            return -ENOMEM;
        if (at)
            memcpy(p, *buf, at);
        sbuf_put(u, *buf, *cap);
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
        return append(c->u, &c->qbuf, &c->qcap, &c->qlen, iov, n, SEND_MAX - c->qlen);
    }
    for (int i = 0; i < n; i++)
        total += iov[i].iov_len;
    if (total >= SEND_DIRECT) {
        /* Bulk: the socket's own buffer is the send buffer, as with
         * epoll; when it is full, wait for room rather than copy. */
        k = c->polling ? -EAGAIN : send_direct(c, iov, n);
        if (k == -ECONNRESET)
            c->werr = (int)k; /* the reset is the reads' too (recv_done()) */
        if (k != -EAGAIN)
            return k;
        if (!c->polling && poll_arm(c, OP_POLL) != 0)
            return -ENOMEM;
        *want = FERRY_WRITE;
        return -EAGAIN;
    }
    c->slen = c->soff = 0;
    k = append(c->u, &c->sbuf, &c->scap, &c->slen, iov, n, SEND_MAX);
    if (k < 0)
        return k;
    rc = send_sqe(c);
    if (rc)
        return rc;
    /* A stream that reads will most likely read the answer to this: its
     * receive goes to the kernel with the send, in the same submission,
     * instead of a turn later (the bytes it brings wait in the stream). */
    if (c->reads && !c->armed && !c->pollin && !c->nq && !c->more && !c->starved && !c->eof &&
        !c->rerr)
        read_arm(c);
    return k;
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
        ferry__uring_buf_give(u, c->head);
        c->head = u->next[c->head];
        c->nq--;
        u->loop->stats.io_bufs_held--;
    }
    ferry__uring_buf_commit(u);
    if (c->armed)
        ferry__uring_cancel(u, (uint64_t)(uintptr_t)c | OP_RECV);
    if (c->sending)
        ferry__uring_cancel(u, (uint64_t)(uintptr_t)c | OP_SEND);
    if (c->polling)
        ferry__uring_cancel(u, (uint64_t)(uintptr_t)c | OP_POLL);
    if (c->pollin)
        ferry__uring_cancel(u, (uint64_t)(uintptr_t)c | OP_POLLIN);
    /* Hand over now what names the descriptor by its number, before the
     * number goes: the kernel looks an entry's descriptor up when it takes
     * it, and from then on holds the file itself until the operation
     * ends, so the number may be closed and reused at once. */
    if (u->pending)
        ferry__uring_submit(u);
    close(c->fd);
    if (!c->o.ops) {
        ferry__uring_conn_free_bufs(c);
        ferry__free(c);
        return;
    }
    c->o.closed = true;
    ferry__list_push_back(&u->orphans, &c->o.link);
    ferry__uring_reap(u);
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
