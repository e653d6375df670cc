/* stream_fd.c - the kernel's transports of a stream (struct
 * ferry__stream_io, stream_int.h): sockets and pipes, their system calls
 * as the seam reports them.  stream.c picks one when a stream opens.
 * Loop thread only.
 */
#include "loop_only.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include "loop_int.h"
#include "stream_int.h"

/* A system call's result as the seam reports it: the count, -EAGAIN with
 * the readiness to wait for in *want, or -err.  `err` is errno as the
 * call left it (read before anything else may change it). */
static inline ssize_t io_result(ssize_t k, int err, int wait_for, int *want)
{
    if (k >= 0)
        return k;
    if (err == EAGAIN || err == EWOULDBLOCK) {
        *want = wait_for;
        return -EAGAIN;
    }
    return -err;
}

static ssize_t sock_recv(ferry_stream *s, void *buf, size_t len, int *want)
{
    ssize_t k;

    do
        k = recv(s->reg.fd, buf, len, 0);
    while (k < 0 && errno == EINTR);
    return io_result(k, errno, FERRY_READ, want);
}

static ssize_t sock_send(ferry_stream *s, const struct iovec *iov, int n, int *want)
{
    ssize_t k;

    do {
        if (n == 1) {
            k = send(s->reg.fd, iov[0].iov_base, iov[0].iov_len, MSG_NOSIGNAL);
        } else {
            struct msghdr m = { .msg_iov = (struct iovec *)(uintptr_t)iov,
                                .msg_iovlen = (size_t)n };
            k = sendmsg(s->reg.fd, &m, MSG_NOSIGNAL);
        }
    } while (k < 0 && errno == EINTR);
    return io_result(k, errno, FERRY_WRITE, want);
}

static int sock_shutdown(ferry_stream *s)
{
    return shutdown(s->reg.fd, SHUT_WR) == 0 ? 0 : -errno;
}

static void fd_close(ferry_stream *s)
{
    /* Linux releases the descriptor even when close() reports EINTR, so it
     * is never retried (the number may already be someone else's). */
    close(s->reg.fd);
}

static ssize_t pipe_recv(ferry_stream *s, void *buf, size_t len, int *want)
{
    ssize_t k;

    do
        k = read(s->reg.fd, buf, len);
    while (k < 0 && errno == EINTR);
    return io_result(k, errno, FERRY_READ, want);
}

/*
 * A write to a pipe whose reader has gone raises SIGPIPE, and there is no
 * MSG_NOSIGNAL for write(2).  As libpq does: block SIGPIPE on this thread
 * around the write and, if the write failed with EPIPE, take back the
 * SIGPIPE it raised (unless one was already pending before, which is the
 * application's), then unblock it again if it was not blocked before.  The
 * process's disposition is never touched, so other threads and other
 * libraries see no change.
 */
static ssize_t pipe_send(ferry_stream *s, const struct iovec *iov, int n, int *want)
{
    static const struct timespec zero = { 0, 0 };
    sigset_t pipe_set, old, pending;
    bool was_pending = false, was_blocked;
    ssize_t k;
    int err;

    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
    was_blocked = sigismember(&old, SIGPIPE) == 1;
    if (was_blocked && sigpending(&pending) == 0)
        was_pending = sigismember(&pending, SIGPIPE) == 1;
    do {
        k = writev(s->reg.fd, iov, n);
    } while (k < 0 && errno == EINTR);
    err = errno;
    if (k < 0 && err == EPIPE && !was_pending) {
        while (sigtimedwait(&pipe_set, NULL, &zero) < 0 && errno == EINTR)
            ;
    }
    if (!was_blocked)
        pthread_sigmask(SIG_UNBLOCK, &pipe_set, NULL);
    return io_result(k, err, FERRY_WRITE, want);
}

static int pipe_shutdown(ferry_stream *s)
{
    (void)s;
    return -ENOTSOCK;
}

const struct ferry__stream_io ferry__sock_io = {
    .recv = sock_recv,
    .send = sock_send,
    .shutdown = sock_shutdown,
    .close = fd_close,
    .drains = true,
};

const struct ferry__stream_io ferry__pipe_io = {
    .recv = pipe_recv,
    .send = pipe_send,
    .shutdown = pipe_shutdown,
    .close = fd_close,
    .drains = true,
};
