/* stream_int.h - the stream structure and its transport seam, shared by
 * io/stream.c (buffering, waiting, closing), io/socket.c (listen, accept,
 * connect) and any transport built on a stream (TLS).
 * Loop thread only.
 */
#ifndef FERRY_STREAM_INT_H
#define FERRY_STREAM_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <event2/event.h>
#include <event2/event_struct.h>

#include "ferry_int.h"
#include "ferry/stream.h"

/* ---- What a loop keeps for its streams and listeners ------------------ */

/*
 * A stream or listener that a loop closes if it is still open when the
 * loop is freed (the netloop's part, ioreg.c).
 */
struct ferry__ioobj {
    struct ferry__link link;                 /* in the loop's list while open */
    void (*destroy)(struct ferry__ioobj *o); /* close and free */
};

/* A loop's streams and listeners, and (on Linux) the epoll set their
 * descriptors are registered in (ioreg.c): made at the first
 * registration, freed with the loop. */
struct ferry__uring;

struct ferry__netloop {
    struct ferry__loop_part part; /* in the loop's parts (ioreg.c) */
    struct ferry__link ioobjs;    /* open streams and listeners */
    int epfd;                     /* the epoll set, or -1 */
    struct event ev;              /* epfd's registration with the base */
    bool ev_added;                /* ev is added */
    struct ferry__uring *uring;   /* the loop's io_uring (uring.c), or NULL:
                                   * streams and listeners use epoll */
};

/* Enter an open object into its loop's list (the loop has a netloop: its
 * registration made it); take it out when it closes. */
void ferry__ioobj_add(ferry_loop *loop, struct ferry__ioobj *o);
void ferry__ioobj_del(struct ferry__ioobj *o);


/* ---- The transport seam -------------------------------------------------- */

/*
 * How a stream moves bytes (the top of stream.c says why it is a seam).
 * Each function is called on the loop thread with the stream open.
 *
 *   recv(s, buf, len, want)  read up to len (> 0) bytes into buf: the count
 *                            (> 0), 0 at the end of the stream, -EAGAIN when
 *                            it must wait (*want: FERRY_READ or FERRY_WRITE,
 *                            the readiness it waits for), or a negative errno;
 *   send(s, iov, n, want)    write from the n (1..FERRY__IOV_BATCH) buffers:
 *                            the count (> 0), -EAGAIN with *want, or a
 *                            negative errno;
 *   shutdown(s)              end the write direction: 0 or a negative errno;
 *   close(s)                 release what the transport holds and close
 *                            s->fd; cannot fail;
 *   flush(s, want)           optional (NULL: nothing to do): send what the
 *                            transport holds of the bytes its send() has
 *                            counted: 0 once nothing is left, -EAGAIN with
 *                            *want, or a negative errno.  A write calls it
 *                            before it returns, so that a transport may
 *                            count bytes as sent once they are its own to
 *                            send (TLS: once encrypted), as the kernel counts
 *                            what its socket buffer took.
 *
 * `drains`: a recv that returns less than len, or a send that takes less
 * than it was offered, has found the descriptor empty or full, so the
 * stream may clear that readiness without trying again (true for the
 * kernel's sockets and pipes with edge-triggered epoll; false for a
 * transport with buffers of its own, where the descriptor's state says
 * nothing about what is left to read).
 *
 * The readable bit (reg.ready) is what makes a read call recv: while it
 * is clear, a read waits for the descriptor's next edge.  A transport
 * with buffers of its own that reads the descriptor outside recv (the TLS
 * handshake) must set the bit when it is done if it may hold input: the
 * edge for bytes it took may never come, since epoll drops an edge whose
 * descriptor is no longer readable when it looks.
 */
struct ferry__stream_io {
    ssize_t (*recv)(ferry_stream *s, void *buf, size_t len, int *want);
    ssize_t (*send)(ferry_stream *s, const struct iovec *iov, int n, int *want);
    int (*shutdown)(ferry_stream *s);
    void (*close)(ferry_stream *s);
    int (*flush)(ferry_stream *s, int *want);
    bool drains;
};

/* The most buffers one send() of the seam is given. */
#define FERRY__IOV_BATCH 64

/* The transports of the kernel's descriptors: sockets (recv, sendmsg with
 * MSG_NOSIGNAL, shutdown) and everything else (read, writev with SIGPIPE
 * blocked around it). */
extern const struct ferry__stream_io ferry__sock_io;
extern const struct ferry__stream_io ferry__pipe_io;

/* ---- A descriptor's registration with the loop ---------------------------- */

/*
 * One registration per descriptor for as long as it is open (ioreg.c has
 * the reasons): readiness bits that the loop's event sets and system calls
 * clear, and two wait queues.  Waiters carry the readiness they wait for
 * in their `n` (FERRY_READ, FERRY_WRITE).
 */
/* How a descriptor is registered (ioreg.c). */
enum {
    FERRY__IO_EPOLL = 0, /* in the loop's epoll set, edge-triggered, once */
    FERRY__IO_ET,        /* a libevent event, edge-triggered, once */
    FERRY__IO_LT,        /* a libevent event, level-triggered, while a task waits */
    FERRY__IO_NONE,      /* no descriptor: the transport reports readiness
                          * itself (ferry__ioreg_ready(), the simulated
                          * network of sim.c) */
    FERRY__IO_URING,     /* a descriptor whose I/O goes through the loop's
                          * io_uring (uring.c): its completions report
                          * readiness, as for FERRY__IO_NONE */
};

struct ferry__ioreg {
    ferry_loop *loop;       /* the loop it belongs to; never changes */
    int fd;                 /* the descriptor, -1 once closed */
    uint8_t ready;          /* FERRY_READ|FERRY_WRITE: no EAGAIN (nor a
                                     * drained short transfer) since the last
                                     * event that reported it */
    uint8_t mode;           /* FERRY__IO_* */
    uint8_t lt_events;      /* FERRY__IO_LT: EV_READ|EV_WRITE registered now */
    bool closed;            /* closed: waiters were woken with -EBADF */
    bool hup;               /* the peer hung up, reset or shut down its
                                     * side, or an error is pending (epoll said
                                     * so): read until EAGAIN, never stop at a
                                     * short read */
    struct ferry__waitq rq; /* readers (a stream's one reader, a
                                     * listener's accepting tasks) */
    struct ferry__waitq wq; /* a stream's writer (or connecting task) */
    struct event ev;        /* the libevent event (FERRY__IO_ET, _LT) */
};

/* Register descriptors through libevent even where the loop's epoll set
 * could take them (tests of the portable path).  Read when a descriptor
 * is registered. */
extern bool ferry__io_use_libevent;

/*
 * Register `fd` (non-blocking) with `loop`, assuming readiness `ready` until
 * a system call says otherwise; `fd` -1 registers no descriptor
 * (FERRY__IO_NONE).  `g` must not move while registered.
 * Returns: 0; -ENOMEM; -EINVAL (epoll refuses the descriptor); -EMFILE,
 * -ENFILE (no descriptor for the loop's epoll set).
 */
int ferry__ioreg_open(struct ferry__ioreg *g, ferry_loop *loop, int fd, uint8_t ready);

/*
 * Wait in `q` (g->rq or g->wq) until the loop reports the readiness `want`
 * (FERRY_READ or FERRY_WRITE) for the descriptor; the caller has found that
 * bit clear.  `what` and `obj` are for ferry_loop_dump().
 * Returns: 0; -ECANCELED, -ETIMEDOUT; -EBADF (closed meanwhile: the
 * descriptor must not be touched); -ENOMEM (level-triggered mode could not
 * register).
 */
int ferry__ioreg_wait(struct ferry__ioreg *g, ferry_task *self, struct ferry__waitq *q, int want,
                      const char *what, const void *obj);

/*
 * As ferry__ioreg_open(), but where the loop uses io_uring for its streams
 * and listeners (FERRY_IO=uring, uring.c), register `fd` in mode
 * FERRY__IO_URING instead; the caller then attaches it to the ring.
 * Returns: 1 registered for io_uring; else as ferry__ioreg_open().
 */
int ferry__ioreg_open_ring(struct ferry__ioreg *g, ferry_loop *loop, int fd, uint8_t ready);

/* Move a descriptor registered in the loop's epoll set to mode
 * FERRY__IO_URING if the loop uses io_uring.  Returns: true if moved. */
bool ferry__ioreg_to_ring(struct ferry__ioreg *g);

/* The loop's io_uring, or NULL (epoll). */
struct ferry__uring *ferry__ioreg_uring(ferry_loop *loop);

/* Set readiness `bits` and wake the waiters for them: the loop's events
 * for a descriptor, the transport itself for FERRY__IO_NONE. */
void ferry__ioreg_ready(struct ferry__ioreg *g, uint8_t bits);

/* Mark closed, unregister, and wake every waiter with -EBADF; the caller
 * then closes the descriptor. */
void ferry__ioreg_close(struct ferry__ioreg *g);

/* Level-triggered mode (a base without edge-triggered events): register
 * what the waiters wait for, plus `extra` (EV_READ|EV_WRITE) for a task
 * about to wait, e.g. a select's case.  Returns: 0; -ENOMEM. */
int ferry__ioreg_lt_update(struct ferry__ioreg *g, short extra);

/* ---- The stream ------------------------------------------------------------ */

struct ferry_stream {
    struct ferry__ioreg reg;           /* descriptor, readiness, waiters */
    struct ferry__ioobj obj;           /* in loop->ioobjs while open */
    bool eof;                          /* the transport said end of stream */
    bool reading;                      /* a task is inside a read call */
    bool writing;                      /* a task is inside a write call */
    int rerr;                          /* read error kept for later reads, or 0 */
    unsigned inside;                   /* tasks inside calls: freed at 0 once closed */
    char *buf;                         /* read buffer, or NULL until needed */
    size_t cap;                        /* its size */
    size_t r;                          /* first unread byte */
    size_t w;                          /* end of the bytes read */
    size_t bufsize;                    /* configured size of the buffer */
    const struct ferry__stream_io *io; /* how bytes move */
    void *io_ctx;                      /* the transport's own state */
    struct ferry__uconn *ring;         /* the io_uring transport's state (uring.c),
                                        * also under a transport on top (TLS),
                                        * or NULL */
};

/*
 * Make a stream of `fd` (non-blocking already; the stream owns it on
 * success) on `loop`, with the transport `io` and initial readiness
 * `ready`.  Nothing is checked: ferry_stream_open() and socket.c check first.
 * Returns: 0; -ENOMEM, -EINVAL (fd stays the caller's).
 */
int ferry__stream_make(ferry_stream **out, ferry_loop *loop, int fd,
                       const struct ferry__stream_io *io, uint8_t ready,
                       const ferry_stream_opts *opts);

/* A socket stream that was connecting is connected: move it to the
 * loop's io_uring if it has one.  Returns: 0; -ENOMEM (the stream is
 * closed then, and the caller destroys it). */
int ferry__stream_to_ring(ferry_stream *s);

/* Close and free a stream that no task is inside (error paths of socket.c). */
void ferry__stream_destroy(ferry_stream *s);

/* A task that counted itself in s->inside leaves (a transport's own
 * waiting call, as the TLS handshake): the last one to leave a closed
 * stream frees it. */
void ferry__stream_unref(ferry_stream *s);

/* ---- Connecting (socket.c) --------------------------------------------------- */

struct addrinfo;

/*
 * Connect to the addresses of `list` in turn (ferry_tcp_connect() after
 * resolving), the first that answers winning; with a deadline, each
 * attempt but the last gets its share of the time left (socket.c).
 * Returns: as ferry_tcp_connect(), for the last address tried.
 */
int ferry__connect_list(ferry_stream **out, ferry_task *self, const struct addrinfo *list,
                        const ferry_stream_opts *opts);

/* Shortest share of the time left that a connect attempt gets when a host
 * has more addresses to try; tests lower it.  Loop thread. */
extern int64_t ferry__connect_attempt_min;

/*
 * Stream cases (stream.c).  `want` is FERRY_READ or FERRY_WRITE.
 *   poll:   the readiness now without waiting (FERRY_READ: bytes buffered,
 *           the end or an error reached, or read now into the buffer;
 *           FERRY_WRITE: no EAGAIN since the loop last said writable),
 *           0 not ready, -EBADF closed, -EPERM another loop's stream,
 *           -ENOMEM no buffer;
 *   arm:    link `w` for `want` and count the select as inside the stream
 *           (0, or -ENOMEM with nothing linked);
 *   disarm: after `w` was unlinked: stop waiting, and free the stream if
 *           it was closed meanwhile and nobody else is inside.
 */
int ferry__stream_sel_poll(ferry_stream *s, struct ferry_task *self, int want);
int ferry__stream_sel_arm(ferry_stream *s, struct ferry__waiter *w, int want);
void ferry__stream_sel_disarm(ferry_stream *s, struct ferry__waiter *w);

/* ---- The io_uring backend (uring.c) ------------------------------------------ */

struct ferry__uacc;

#ifdef FERRY_HAVE_URING
/*
 * Make the loop's ring (FERRY_IO=uring): 0 and *out, or a negative errno
 * with *why saying what failed (the loop then uses epoll).
 */
int ferry__uring_new(struct ferry__uring **out, ferry_loop *loop, const char **why);

/* Free the ring once every stream and listener is closed: waits for the
 * kernel to answer what is still in flight. */
void ferry__uring_free(struct ferry__uring *u);

/* Give a socket stream registered in mode FERRY__IO_URING its transport.
 * Returns: 0; -ENOMEM. */
int ferry__uring_stream_attach(ferry_stream *s);

/* Give a listener's descriptor, registered in mode FERRY__IO_URING, its
 * accept queue.  Returns: 0; -ENOMEM. */
int ferry__uring_listen(struct ferry__uacc **out, struct ferry__ioreg *g);

/* The next accepted descriptor: >= 0, -EAGAIN (none yet: wait for
 * FERRY_READ on the listener), or the kernel's error for an accept. */
int ferry__uring_accept(struct ferry__uacc *a);

/* The listener closes: cancel its accept, close the queued descriptors. */
void ferry__uring_listen_close(struct ferry__uacc *a);
#else
static inline int ferry__uring_stream_attach(ferry_stream *s)
{
    (void)s;
    return -ENOSYS;
}
static inline int ferry__uring_listen(struct ferry__uacc **out, struct ferry__ioreg *g)
{
    (void)out;
    (void)g;
    return -ENOSYS;
}
static inline int ferry__uring_accept(struct ferry__uacc *a)
{
    (void)a;
    return -ENOSYS;
}
static inline void ferry__uring_listen_close(struct ferry__uacc *a)
{
    (void)a;
}
#endif

#endif /* FERRY_STREAM_INT_H */
