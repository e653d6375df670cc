/* uring_int.h - the io_uring backend's state, shared by io/uring.c (the
 * ring, submission and completion, listeners) and io/uring_stream.c (the
 * stream transport).
 * Loop thread only.
 */
#ifndef FERRY_URING_INT_H
#define FERRY_URING_INT_H

#include <liburing.h>

#include "loop_int.h"
#include "stream_int.h"

/* What a completion's user_data names, in the low bits of the object's
 * address (user_data 0: a cancel's own completion, ignored). */
enum { OP_RECV = 1, OP_SEND = 2, OP_ACCEPT = 3, OP_POLL = 4, OP_POLLIN = 5, OP_MASK = 7 };

#define NBUFS        512         /* receive buffers per loop: 2 MiB in all */
#define BUFSZ        4096        /* bytes per receive buffer */
#define BGID         0           /* the buffer group of the loop's ring */
#define SEND_MAX     (64 * 1024) /* bytes one SEND of a stream carries */
#define SEND_DIRECT  (64 * 1024) /* a write this large tries send(2) first */
#define RING_ENTRIES 256         /* submission queue entries */
#define CQ_ENTRIES   4096        /* completion queue entries */
#define NO_BUF       0xffff      /* end of a stream's buffer queue */
/* Accepted descriptors queued after which a listener's multishot accept
 * stops. */
#define ACC_CAP 16
/* Buffers a stream's multishot receive may fill before it is cancelled,
 * and the bytes one takes at most (the kernel's cap). */
#define RECV_HOLD  2
#define RECV_LIMIT (RECV_HOLD * BUFSZ)
/* Send buffers: the small size, and how many of each size a loop keeps
 * for reuse. */
#define SBUF_SMALL      4096
#define SBUF_KEEP       512
#define SBUF_KEEP_LARGE 8
/* An accept's flag (kernel 6.10): wait for a connection before taking a
 * descriptor, so that running out of descriptors is reported only with a
 * connection queued, as accept4() reports it.  liburing 2.3 predates it. */
#define ACCEPT_POLL_FIRST (1U << 2)

struct ferry__uring {
    struct io_uring ring;         /* the ring */
    ferry_loop *loop;             /* its loop */
    struct event ev;              /* the ring's descriptor in the base */
    bool ev_added;                /* ev is added */
    bool no_poll_first;           /* the kernel refused ACCEPT_POLL_FIRST */
    bool no_mshot;                /* the kernel refused a capped multishot
                                   * receive: single receives */
    bool no_mshot_accept;         /* the kernel refused a multishot accept */
    struct io_uring_buf_ring *br; /* the provided buffer ring (mapped) */
    size_t br_bytes;              /* its mapping's size */
    char *bufs;                   /* NBUFS buffers of BUFSZ */
    uint16_t next[NBUFS];         /* next buffer in a stream's queue */
    uint32_t blen[NBUFS];         /* bytes in a queued buffer */
    unsigned nadd;                /* buffers given back since the last advance */
    unsigned pending;             /* prepared entries not yet submitted */
    unsigned inflight;            /* operations the kernel has not ended */
    void *sfree[2];               /* send buffers kept for reuse, small
                                   * and SEND_MAX ones, each holding the
                                   * next one's address */
    unsigned nsfree[2];           /* how many */
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
    bool armed;          /* a receive is in flight */
    bool mshot;          /* it is a multishot one */
    bool stopping;       /* its cancel is queued (the stream holds its
                          * share of buffers) */
    bool more;           /* the last receive filled its buffer: read the
                          * socket directly next (recv_direct()) */
    bool bulk;           /* the last read straight from the socket took
                          * a buffer's worth or more: the next bytes are
                          * waited for as with epoll (POLLIN), and read
                          * straight from the socket too */
    bool pollin;         /* that wait is in flight */
    bool reads;          /* the stream has been read: a send arms its
                          * receive too */
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
    bool polling;        /* a wait for room (POLL_ADD) is in flight */
    bool shut;           /* shutdown asked for while sending */
    int werr;            /* a send error for the next write, or 0 */
};

struct ferry__uacc {
    struct uobj o; /* first: user_data points here */
    struct ferry__uring *u;
    struct ferry__ioreg *g; /* the listener's registration, NULL once closed */
    int fd;                 /* the listening descriptor */
    bool armed;             /* an ACCEPT is in flight */
    bool mshot;             /* it is a multishot one */
    bool stopping;          /* its cancel is queued (ACC_CAP reached) */
    int err;                /* an accept's error for the next call, or 0 */
    int *fds;               /* accepted descriptors, a ring, oldest at head */
    unsigned head, n, cap;  /* ring position, count and size */
};

/* ---- uring.c ---- */

/* Hand the kernel the queued entries. */
void ferry__uring_submit(struct ferry__uring *u);

/* A submission queue entry, the queue handed over first if it is full;
 * NULL only if the kernel took none of it. */
struct io_uring_sqe *ferry__uring_sqe(struct ferry__uring *u);

/* Queue a cancel of the operation `ud`; its own completion is ignored. */
void ferry__uring_cancel(struct ferry__uring *u, uint64_t ud);

/* An operation of `o` starts, ends (an orphan with none left is freed). */
void ferry__uring_op_start(struct ferry__uring *u, struct uobj *o);
void ferry__uring_op_end(struct ferry__uring *u, struct uobj *o);

/* Give buffer `bid` back to the ring; publish what was given back (and
 * let starved streams receive again). */
void ferry__uring_buf_give(struct ferry__uring *u, uint16_t bid);
void ferry__uring_buf_commit(struct ferry__uring *u);

/* Take in every completion posted. */
void ferry__uring_reap(struct ferry__uring *u);

/* ---- uring_stream.c ---- */

/* Queue the stream's receive of one buffer.  Returns: 0; -ENOMEM. */
int ferry__uring_recv_arm(struct ferry__uconn *c);

/* A completion of the stream's receive, of its send. */
void ferry__uring_recv_done(struct ferry__uring *u, struct ferry__uconn *c,
                            const struct io_uring_cqe *cqe);
void ferry__uring_send_done(struct ferry__uring *u, struct ferry__uconn *c, int res);
/* A completion of the stream's wait for bytes (OP_POLLIN) or room (OP_POLL). */
void ferry__uring_poll_done(struct ferry__uring *u, struct ferry__uconn *c, unsigned op);

/* Give a stream state's send buffers back to the loop. */
void ferry__uring_conn_free_bufs(struct ferry__uconn *c);

/* Free the send buffers the loop keeps. */
void ferry__uring_sbufs_fini(struct ferry__uring *u);

#endif /* FERRY_URING_INT_H */
