/* ferry/stream.h - buffered byte streams for tasks, over any connected file
 * descriptor (TCP and Unix sockets, pipes, socketpairs), and the sockets
 * that make them: listen, accept, connect.
 *
 * A stream belongs to the loop it was opened on and is used by that loop's
 * tasks (Go's net.Conn with bufio, asyncio's StreamReader/StreamWriter,
 * Trio's SocketStream).  Reads are buffered: the stream reads from the fd in
 * large chunks into a buffer of its own, so that reading a line or a small
 * header costs no system call each.
 *
 * Every call that may wait is a suspension point: it honours cancellation
 * and deadline scopes like every other (ferry/task.h).
 *
 * Reads are all or nothing.  A read that returns an error consumed nothing:
 * bytes that arrived before a read was cancelled or timed out stay in the
 * stream for the next read, so a retry loses nothing.  To hold a whole
 * frame, the buffer grows up to what the call asks for (n bytes for
 * ferry_stream_read_exactly(), `max` for ferry_stream_read_until()) and
 * goes back to its configured size once it has been emptied.  Two
 * exceptions, each with the count in an out-parameter: the end of the
 * stream in the middle of a frame (-ENODATA: the partial frame is handed
 * over and consumed, as nothing more can follow it), and discarding.
 *
 * Writes are not: a write that is cancelled, times out or fails reports
 * in *written how many bytes went out (as Trio's send_all and Go's Write
 * do).
 *
 * No write raises SIGPIPE: sockets are written with MSG_NOSIGNAL, other
 * descriptors with SIGPIPE blocked on the calling thread around the write
 * (a SIGPIPE that the write raised is then taken back); the process's
 * disposition is never changed.  A peer that has gone away is -EPIPE or
 * -ECONNRESET.
 *
 * One reader and one writer at a time: a task that calls a read function
 * while another task is inside one on the same stream gets -EBUSY (and the
 * same for writes).  One task may read while another writes.
 *
 * Closing.  ferry_stream_close() closes the descriptor at once, so its
 * number may be reused by the next open, socket() or accept() (by a new
 * stream too), and wakes the tasks waiting inside calls on the stream:
 * they return -EBADF.  The stream's memory is freed when the last of them
 * has left; from then on the pointer is dangling, so make sure that no
 * task calls the stream after it is closed (tell them first, or use
 * ferry_stream_shutdown() to end the peer's reads).  A call that starts
 * while woken tasks are still leaving gets -EBADF.
 *
 * Freeing the loop: ferry_loop_free() cancels every task and waits for
 * them, then closes and frees every stream and listener of the loop that is
 * still open (their descriptors included).  Pointers to them are then
 * dangling.
 *
 * The descriptor.  A stream is the only user of its descriptor: it makes it
 * non-blocking, keeps it registered with the loop (edge-triggered, once,
 * for as long as the stream is open) and closes it.  Do not wait on it with
 * ferry_wait_fd(), read or write it directly, or close it yourself.
 *
 * Everything here belongs to one loop and runs on that loop's thread; a
 * call from another thread, or from a task of another loop, gets -EPERM.
 */
#ifndef FERRY_STREAM_H
#define FERRY_STREAM_H

#include <stddef.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "ferry/loop.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Streams ---------------------------------------------------------- */

typedef struct ferry_stream ferry_stream;

/* Default size of a stream's read buffer: 64 KiB. */
#define FERRY_STREAM_BUFFER_DEFAULT ((size_t)64 * 1024)

/*
 * ferry_stream_opts.flags:
 *   FERRY_STREAM_NAGLE  TCP only: leave Nagle's algorithm on.  Streams that
 *                       ferry makes from TCP sockets (accepted, connected)
 *                       set TCP_NODELAY by default, so that small writes
 *                       (a request, a reply) leave at once; ferry_stream_open()
 *                       leaves the socket's option as it is either way.
 */
#define FERRY_STREAM_NAGLE 0x1u

typedef struct ferry_stream_opts {
    /* Size of the read buffer in bytes; 0 means FERRY_STREAM_BUFFER_DEFAULT.
     * It is allocated at the first read that needs it.  Reads of at least
     * this many bytes into an empty buffer go straight into the caller's
     * memory, with no copy. */
    size_t   read_buffer;
    /* FERRY_STREAM_* flags; 0 for none. */
    unsigned flags;
} ferry_stream_opts;

/*
 * Make a stream of `fd`, a connected socket of type SOCK_STREAM, a pipe, a
 * FIFO or a character device that epoll accepts (a terminal), on `loop`
 * (NULL: the loop of the calling thread).  The descriptor is made
 * non-blocking (which its other users, if it is shared, see too).
 * Thread: loop (in a task or not).  Suspends: no.
 * Owns: on success the stream owns `fd` and the caller owns *out: close it
 * with ferry_stream_close().  On an error `fd` stays the caller's, open.
 * Returns: 0; -EINVAL (out NULL, fd negative, a regular file or a
 * directory, a socket that is not SOCK_STREAM, a descriptor epoll refuses,
 * or a bad opts->flags, or loop NULL on a thread without a loop); -EBADF
 * (fd not open); -EPERM (not on the loop's thread); -ENOMEM.
 */
int ferry_stream_open(ferry_stream **out /* OUT */, ferry_loop *loop, int fd,
                      const ferry_stream_opts *opts);

/*
 * Read at least one byte and at most `max`: what the buffer holds, or else
 * what one read of the descriptor gives (waiting until there is some).
 * At the end of the stream, returns 0 with *n = 0.
 * Thread: loop, in a task of the stream's loop.  Suspends: yes.
 * Returns: 0 (*n bytes at buf; 0 at the end of the stream);
 * -ECANCELED, -ETIMEDOUT (nothing consumed, *n = 0); -EBADF (closed);
 * -EBUSY (another task is reading); -ECONNRESET and the other errors of
 * recv(2)/read(2), negated (bytes already buffered stay readable);
 * -ENOMEM (no read buffer); -EPERM; -EINVAL (s, buf or n NULL, max 0).
 */
int ferry_stream_read(ferry_stream *s, void *buf, size_t max, size_t *n /* OUT */);

/*
 * Read exactly `n` bytes into buf, waiting as long as it takes.  The
 * buffer grows to n bytes if it is smaller, so that an interrupted call
 * keeps what it got in the stream.
 * Thread: loop, in a task of the stream's loop.  Suspends: yes.
 * Returns: 0 (*got = n; n 0 returns at once); -ENODATA (the stream ended
 * first: the *got < n bytes that came are at buf and consumed; *got 0 is
 * an end at a frame boundary); -ECANCELED, -ETIMEDOUT, -ECONNRESET and
 * the other errors of ferry_stream_read() (nothing consumed, *got = 0);
 * -ENOMEM (the buffer could not grow: nothing consumed); -EBADF; -EBUSY;
 * -EPERM; -EINVAL (s or buf NULL).
 */
int ferry_stream_read_exactly(ferry_stream *s, void *buf, size_t n,
                              size_t *got /* OUT, optional */);

/*
 * Read up to and including the first occurrence of the `dlen`-byte
 * delimiter `delim` (a line reader with "\n" or "\r\n"), if it ends within
 * the first `max` bytes.  A longer frame is an error, never a truncation:
 * -EMSGSIZE, and the bytes stay in the stream; skip them with
 * ferry_stream_discard() or read them with ferry_stream_read().  The buffer
 * grows up to `max` bytes if a frame needs it.
 * Thread: loop, in a task of the stream's loop.  Suspends: yes.
 * Returns: 0 (*n bytes at buf, the delimiter last); -EMSGSIZE (no
 * delimiter ends within `max` bytes: nothing consumed, *n = 0);
 * -ENODATA (the stream ended before a delimiter: the *n bytes that came
 * are at buf and consumed; *n 0 is an end at a frame boundary);
 * -ECANCELED, -ETIMEDOUT, -ECONNRESET and the other errors of
 * ferry_stream_read() (nothing consumed, *n = 0); -ENOMEM; -EBADF; -EBUSY;
 * -EPERM; -EINVAL (s, delim, buf or n NULL, dlen 0, max 0, dlen > max).
 */
int ferry_stream_read_until(ferry_stream *s, const void *delim, size_t dlen, void *buf,
                            size_t max, size_t *n /* OUT */);

/*
 * Consume and drop the next `n` bytes, waiting for them as needed (after
 * -EMSGSIZE, or to skip a body).  Not all or nothing: an interrupted call
 * has dropped *discarded bytes.
 * Thread: loop, in a task of the stream's loop.  Suspends: yes.
 * Returns: 0 (*discarded = n); -ENODATA (the stream ended first);
 * -ECANCELED, -ETIMEDOUT, -ECONNRESET and the other errors of
 * ferry_stream_read(); -ENOMEM; -EBADF; -EBUSY; -EPERM; -EINVAL (s NULL);
 * *discarded, if not NULL, says how many bytes were dropped on every return.
 */
int ferry_stream_discard(ferry_stream *s, size_t n, size_t *discarded /* OUT, optional */);

/*
 * Write all `len` bytes of buf: the write is tried at once, and waits only
 * while the descriptor cannot take more (backpressure: a peer that does not
 * read keeps the writer waiting; bound it with a deadline scope).  Bytes
 * are written from buf directly, with no copy.
 * Thread: loop, in a task of the stream's loop.  Suspends: yes.
 * Returns: 0 (*written = len); -ECANCELED, -ETIMEDOUT (*written bytes went
 * out); -EPIPE, -ECONNRESET (the peer has gone: it closed, or reset the
 * connection) and the other errors of send(2)/write(2), negated; -EBADF;
 * -EBUSY (another task is writing); -EPERM; -EINVAL (s NULL, buf NULL
 * with len > 0).  *written, if not NULL, is set on every return.
 */
int ferry_stream_write(ferry_stream *s, const void *buf, size_t len,
                       size_t *written /* OUT, optional */);

/*
 * ferry_stream_write() of the `iovcnt` buffers at iov, in order, with as
 * few system calls as the descriptor allows (sendmsg(2), writev(2)).
 * Thread: loop, in a task of the stream's loop.  Suspends: yes.
 * Returns: as ferry_stream_write(), *written counting over all buffers;
 * -EINVAL also for iov NULL with iovcnt > 0, iovcnt negative or above
 * IOV_MAX, or a NULL iov_base with a non-zero iov_len.
 */
int ferry_stream_writev(ferry_stream *s, const struct iovec *iov, int iovcnt,
                        size_t *written /* OUT, optional */);

/*
 * Half-close: tell the peer that nothing more will be written (shutdown
 * with SHUT_WR), so that its reads see the end of the stream; reading goes
 * on.  Not a cancellation point, so that cleanup code can call it.
 * Thread: loop, in a task of the stream's loop or a callback of that loop.
 * Suspends: no.
 * Returns: 0; -ENOTSOCK (not a socket: close the stream instead); -EBUSY
 * (a task is inside a write on the stream); -EBADF (closed); -ENOTCONN and
 * the other errors of shutdown(2), negated; -EPERM; -EINVAL (NULL).
 */
int ferry_stream_shutdown(ferry_stream *s);

/*
 * Close the stream and its descriptor (see "Closing" above): tasks waiting
 * inside calls on it return -EBADF, and the memory is freed once they have
 * left.  Bytes not yet read are dropped.  Not a cancellation point.
 * Thread: loop, in a task of the stream's loop or a callback of that loop.
 * Suspends: no.
 * Returns: 0; -EBADF (already closed, while tasks woken by that close are
 * still leaving); -EPERM; -EINVAL (NULL).
 */
int ferry_stream_close(ferry_stream *s);

/*
 * The stream's descriptor, for socket options and addresses
 * (getsockopt(2), getpeername(2)); the stream keeps owning it.
 * Thread: loop.  Suspends: no.
 * Returns: the descriptor; -EBADF (closed); -EINVAL (NULL); -ENOTSOCK (a
 * stream with no descriptor: the simulated network's, ferry/sim.h).
 */
int ferry_stream_fd(const ferry_stream *s);

/*
 * How many bytes the stream has read from its descriptor and not yet
 * handed to a reader: what a read can take without waiting.
 * Thread: loop.  Suspends: no.
 * Returns: the number of bytes; 0 for NULL or a closed stream.
 */
size_t ferry_stream_buffered(const ferry_stream *s);

/* ---- Listening and accepting ------------------------------------------- */

typedef struct ferry_listener ferry_listener;

/*
 * ferry_listen_opts.flags:
 *   FERRY_LISTEN_NO_REUSEADDR  do not set SO_REUSEADDR (set by default, so
 *                              that a restarted server can bind its port
 *                              while old connections linger in TIME_WAIT);
 *   FERRY_LISTEN_REUSEPORT     set SO_REUSEPORT (several listeners, on
 *                              several loops or processes, share the port);
 *   FERRY_LISTEN_V6ONLY        an IPv6 listener takes IPv6 connections only
 *                              (by default the any-address listener takes
 *                              IPv4 ones too).
 */
#define FERRY_LISTEN_NO_REUSEADDR 0x1u
#define FERRY_LISTEN_REUSEPORT    0x2u
#define FERRY_LISTEN_V6ONLY       0x4u

typedef struct ferry_listen_opts {
    /* Queue of connections not yet accepted; 0 means SOMAXCONN. */
    int               backlog;
    /* FERRY_LISTEN_* flags; 0 for none. */
    unsigned          flags;
    /* Options of the accepted streams (TCP_NODELAY is on unless
     * FERRY_STREAM_NAGLE). */
    ferry_stream_opts stream;
} ferry_listen_opts;

/*
 * Listen for TCP connections on `host` (a numeric IPv4 or IPv6 address;
 * NULL: every address, IPv6 and IPv4 on one socket where the system has
 * IPv6, IPv4 only otherwise) and `port` (0: the system picks a free one,
 * see ferry_listener_port()), on `loop` (NULL: the loop of the calling
 * thread).
 * Thread: loop (in a task or not).  Suspends: no.
 * Owns: the caller owns *out; close it with ferry_listener_close().
 * Returns: 0; -EADDRINUSE, -EACCES, -EADDRNOTAVAIL and the other errors
 * of socket(2), bind(2) and listen(2), negated; -EINVAL (out NULL, port
 * outside 0..65535, a host that is not a numeric address, a bad flag or
 * backlog, loop NULL on a thread without a loop); -EPERM; -ENOMEM;
 * -EMFILE, -ENFILE.
 */
int ferry_tcp_listen(ferry_listener **out /* OUT */, ferry_loop *loop, const char *host,
                     int port, const ferry_listen_opts *opts);

/*
 * Listen on the Unix socket at `path`; a path that starts with '@' names a
 * socket in Linux's abstract namespace (the '@' stands for the leading NUL
 * byte), which needs no file.  A socket file is created (an existing file
 * at `path` is -EADDRINUSE, not replaced) and removed again by
 * ferry_listener_close().
 * Thread: loop (in a task or not).  Suspends: no.
 * Owns: the caller owns *out; close it with ferry_listener_close().
 * Returns: 0; -EINVAL (out or path NULL, path empty or longer than a
 * sockaddr_un holds, FERRY_LISTEN_REUSEPORT or V6ONLY, a bad backlog,
 * loop NULL on a thread without a loop);
 * -EADDRINUSE, -EACCES, -ENOENT and the other errors of socket(2),
 * bind(2) and listen(2), negated; -EPERM; -ENOMEM; -EMFILE, -ENFILE.
 */
int ferry_unix_listen(ferry_listener **out /* OUT */, ferry_loop *loop, const char *path,
                      const ferry_listen_opts *opts);

/*
 * Wait for the next connection and make a stream of it.  Several tasks may
 * accept on one listener at a time.  When the process or system is out of
 * descriptors (EMFILE, ENFILE), the connections waiting in the queue are
 * accepted and closed at once (their peers see the connection end) with
 * one descriptor that each listener keeps in reserve for this, and the
 * call returns the error: the loop does not spin on a queue it cannot
 * empty, and the caller decides whether to wait and try again.
 * Thread: loop, in a task of the listener's loop.  Suspends: yes.
 * Owns: the caller owns *out; close it with ferry_stream_close().
 * Returns: 0 (*out, and the peer's address in *peer if not NULL);
 * -ECANCELED, -ETIMEDOUT (no connection taken); -EMFILE, -ENFILE (as
 * above); -EBADF (the listener was closed); -ENOMEM (the connection was
 * accepted and closed); the other errors of accept4(2), negated; -EPERM;
 * -EINVAL (l or out NULL).
 */
int ferry_listener_accept(ferry_listener *l, ferry_stream **out /* OUT */,
                          struct sockaddr_storage *peer /* OUT, optional */);

/*
 * The port a TCP listener is bound to (the one the system picked for 0).
 * Thread: loop.  Suspends: no.
 * Returns: the port; -EAFNOSUPPORT (a Unix socket); -EBADF (closed);
 * -EINVAL (NULL).
 */
int ferry_listener_port(const ferry_listener *l);

/*
 * The listening descriptor, for socket options; the listener keeps owning
 * it.  Thread: loop.  Suspends: no.
 * Returns: the descriptor; -EBADF (closed); -EINVAL (NULL).
 */
int ferry_listener_fd(const ferry_listener *l);

/*
 * Stop listening: close the descriptor (and remove the socket file of a
 * Unix listener), wake the tasks waiting in ferry_listener_accept() with
 * -EBADF, and free the listener once they have left.  Streams accepted
 * from it stay open.  Not a cancellation point.
 * Thread: loop, in a task of the listener's loop or a callback of that
 * loop.  Suspends: no.
 * Returns: 0; -EBADF (already closed); -EPERM; -EINVAL (NULL).
 */
int ferry_listener_close(ferry_listener *l);

/* ---- Connecting -------------------------------------------------------- */

/*
 * Connect to TCP `port` on `host`, a host name or a numeric IPv4 or IPv6
 * address, and make a stream of the connection on the calling task's loop.
 * A name is resolved with ferry_getaddrinfo() (ferry/resolve.h: the loop's
 * resolver; a numeric host needs no lookup), within the caller's deadline.
 * When a host stands for several addresses they are tried in turn, in the
 * order of the resolver's list (IPv4 first); with a deadline
 * scope around the call, each attempt but the last gets an equal share of
 * the time left, and at least 2 seconds (Go's rule), so that one address
 * that does not answer cannot use up the whole deadline.  TCP_NODELAY is
 * set unless opts->flags has FERRY_STREAM_NAGLE.
 * Thread: loop, in a task.  Suspends: yes.
 * Owns: the caller owns *out; close it with ferry_stream_close().
 * Returns: 0; -ECONNREFUSED, -ENETUNREACH, -EHOSTUNREACH, -ETIMEDOUT (the
 * system gave up) and the other errors of connect(2), negated, of the last
 * address tried; -ECANCELED, -ETIMEDOUT (the caller's deadline, during
 * the lookup or the attempts); FERRY_EAI_* (ferry/resolve.h: the name could not
 * be resolved) and the other errors of ferry_getaddrinfo(); -EPERM;
 * -ENOMEM; -EMFILE, -ENFILE; -EINVAL (out or host NULL, port outside
 * 1..65535, a bad flag).  On an error nothing is left open.
 */
int ferry_tcp_connect(ferry_stream **out /* OUT */, const char *host, int port,
                      const ferry_stream_opts *opts);

/*
 * Connect to the Unix socket at `path` ('@' first: the abstract namespace,
 * as for ferry_unix_listen()) and make a stream of the connection on the
 * calling task's loop.
 * Thread: loop, in a task.  Suspends: yes.
 * Owns: the caller owns *out; close it with ferry_stream_close().
 * Returns: 0; -ENOENT, -ECONNREFUSED, -EACCES and the other errors of
 * connect(2), negated; -EAGAIN (the listener's queue is full: Linux does
 * not wait for room on a non-blocking Unix socket); -ECANCELED,
 * -ETIMEDOUT; -EPERM; -ENOMEM; -EMFILE, -ENFILE; -EINVAL (out or path
 * NULL, path empty or too long, a bad flag).
 */
int ferry_unix_connect(ferry_stream **out /* OUT */, const char *path,
                       const ferry_stream_opts *opts);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_STREAM_H */
