/* stream.c - buffered streams over connected descriptors: reading into a
 * buffer of the stream's own, writing from the caller's memory, waiting for
 * readiness (ioreg.c), closing while tasks wait.
 * Loop thread only.
 *
 * The transport seam (struct ferry__stream_io, stream_int.h).  Everything
 * that moves bytes, half-closes, flushes or closes goes through its
 * functions, so that a transport with buffers of its own (TLS: OpenSSL
 * between the stream's buffer and the descriptor, tls.c) reuses every call
 * here: the buffering, the line reader, cancellation, the waits, the
 * close.  The kernel's own transports, sockets and pipes, are in
 * stream_fd.c.  A transport's recv or send
 * says which readiness it waits for (a TLS read may need the socket to be
 * writable), and whether a short transfer means the descriptor is drained.
 *
 * Closing.  ferry_stream_close() marks the stream closed, unregisters the
 * descriptor (before close(2): libevent counts events per descriptor
 * number, and a number closed while registered would keep a new
 * descriptor with that number from ever being registered), wakes the
 * reader and the writer with -EBADF and closes the descriptor at once.
 * Woken tasks look only at the flag, never at the descriptor, whose number
 * may already belong to a new stream.  The memory stays until the last
 * task inside a call has left (`inside`).
 */
#include "loop_only.h"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#ifdef __linux__
#include <sys/epoll.h>
#endif
#include <time.h>
#include <unistd.h>

#include "loop_int.h"
#include "stream_int.h"
#include "select_int.h"

/* ---- open, close, free ---------------------------------------------------- */

static void stream_free(ferry_stream *s)
{
    ferry__free(s->buf);
    ferry__free(s);
}

/* Closed: unregister, wake, close the descriptor; the memory stays. */
static void stream_shut(ferry_stream *s)
{
    ferry__ioobj_del(&s->obj);
    ferry__ioreg_close(&s->reg);
    s->io->close(s);
    s->reg.fd = -1;
}

void ferry__stream_destroy(ferry_stream *s)
{
    stream_shut(s);
    stream_free(s);
}

void ferry__stream_unref(ferry_stream *s)
{
    if (--s->inside == 0 && s->reg.closed)
        stream_free(s);
}

/* The loop is being freed: no task is left inside a call. */
static void stream_destroy_obj(struct ferry__ioobj *o)
{
    ferry__stream_destroy(ferry__container_of(o, ferry_stream, obj));
}

int ferry__stream_make(ferry_stream **out, ferry_loop *loop, int fd,
                       const struct ferry__stream_io *io, uint8_t ready,
                       const ferry_stream_opts *opts)
{
    ferry_stream *s = ferry__calloc(1, sizeof *s);
    int rc;

    if (!s)
        return -ENOMEM;
    s->io = io;
    s->bufsize = opts && opts->read_buffer ? opts->read_buffer : FERRY_STREAM_BUFFER_DEFAULT;
    /* A connected socket goes to the loop's io_uring if it has one; one
     * still connecting waits for its connection on epoll first
     * (ferry__stream_to_ring()). */
    if (io == &ferry__sock_io && ready == (FERRY_READ | FERRY_WRITE))
        rc = ferry__ioreg_open_ring(&s->reg, loop, fd, ready);
    else
        rc = ferry__ioreg_open(&s->reg, loop, fd, ready);
    if (rc == 1) {
        rc = ferry__uring_stream_attach(s);
        if (rc)
            ferry__ioreg_close(&s->reg);
    }
    if (rc) {
        ferry__free(s);
        return rc;
    }
    s->obj.destroy = stream_destroy_obj;
    ferry__ioobj_add(loop, &s->obj);
    *out = s;
    return 0;
}

int ferry__stream_to_ring(ferry_stream *s)
{
    int rc;

    if (s->io != &ferry__sock_io || !ferry__ioreg_to_ring(&s->reg))
        return 0;
    rc = ferry__uring_stream_attach(s);
    if (rc)
        ferry__ioreg_close(&s->reg);
    return rc;
}

int ferry_stream_open(ferry_stream **out, ferry_loop *loop, int fd, const ferry_stream_opts *opts)
{
    const struct ferry__stream_io *io = &ferry__pipe_io;
    struct stat st;
    int rc, fl;

    if (!out)
        return -EINVAL;
    *out = NULL;
    if (fd < 0 || (opts && (opts->flags & ~FERRY_STREAM_NAGLE)))
        return -EINVAL;
    rc = ferry__loop_arg(&loop);
    if (rc)
        return rc;
    if (fstat(fd, &st) != 0)
        return -errno;
    if (S_ISREG(st.st_mode) || S_ISDIR(st.st_mode))
        return -EINVAL;
    if (S_ISSOCK(st.st_mode)) {
        int type = 0;
        socklen_t len = sizeof type;
        if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0)
            return -errno;
        if (type != SOCK_STREAM)
            return -EINVAL;
        io = &ferry__sock_io;
    }
    fl = fcntl(fd, F_GETFL);
    if (fl < 0)
        return -errno;
    if (!(fl & O_NONBLOCK) && fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0)
        return -errno;
    rc = ferry__stream_make(out, loop, fd, io, FERRY_READ | FERRY_WRITE, opts);
    if (rc && !(fl & O_NONBLOCK))
        fcntl(fd, F_SETFL, fl); /* an error leaves the descriptor as it was */
    return rc;
}

/* The caller may use `s` here: a task of its loop, or the loop's thread
 * outside tasks. */
static int on_loop(const ferry_stream *s)
{
    ferry_task *self = ferry__self();

    if (self)
        return self->loop == s->reg.loop ? 0 : -EPERM;
    return ferry__loop_check(s->reg.loop);
}

/* The checks of a call that neither reads nor writes: -EINVAL, -EPERM,
 * -EBADF (closed), or 0. */
static int usable(ferry_stream *s)
{
    int rc;

    if (!s)
        return -EINVAL;
    rc = on_loop(s);
    if (rc)
        return rc;
    return s->reg.closed ? -EBADF : 0;
}

int ferry_stream_close(ferry_stream *s)
{
    int rc = usable(s);

    if (rc)
        return rc;
    stream_shut(s);
    if (!s->inside)
        stream_free(s);
    return 0;
}

int ferry_stream_shutdown(ferry_stream *s)
{
    int rc = usable(s);

    if (rc)
        return rc;
    if (s->writing)
        return -EBUSY;
    return s->io->shutdown(s);
}

int ferry_stream_fd(const ferry_stream *s)
{
    if (!s)
        return -EINVAL;
    if (s->reg.closed)
        return -EBADF;
    return s->reg.fd < 0 ? -ENOTSOCK : s->reg.fd;
}

size_t ferry_stream_buffered(const ferry_stream *s)
{
    return s && !s->reg.closed ? s->w - s->r : 0;
}

/* ---- entering and leaving a call ------------------------------------------ */

/* A task enters a read (busy = &s->reading) or write call: the checks every
 * such call makes, in the order the header promises, then it counts as
 * inside. */
static inline int stream_enter(ferry_stream *s, ferry_task **self, bool *busy)
{
    int rc = ferry__enter_task_inline(self);

    if (rc)
        return rc;
    if (s->reg.loop != (*self)->loop)
        return -EPERM;
    if (s->reg.closed)
        return -EBADF;
    if (*busy)
        return -EBUSY;
    rc = ferry__check_inline(*self);
    if (rc)
        return rc;
    *busy = true;
    s->inside++;
    return 0;
}

/* The last task to leave a closed stream frees it. */
static inline void stream_leave(ferry_stream *s, bool *busy)
{
    *busy = false;
    if (--s->inside == 0 && s->reg.closed)
        stream_free(s);
}

/* ---- the read buffer ------------------------------------------------------ */

/* Drop `k` buffered bytes.  An emptied buffer starts over at its beginning,
 * and one that grew for a large frame is given back (the next read
 * allocates the configured size again). */
static void consume(ferry_stream *s, size_t k)
{
    s->r += k;
    if (s->r == s->w) {
        s->r = s->w = 0;
        if (s->cap > s->bufsize) {
            ferry__free(s->buf);
            s->buf = NULL;
            s->cap = 0;
        }
    }
}

/*
 * Make room to hold `need` bytes from the first unread one on (at least
 * one more than are buffered), moving the unread bytes to the front or
 * growing the buffer (doubling, but never beyond `limit` unless `need`
 * is more).  Returns: 0; -ENOMEM (nothing changed).
 */
static int make_room(ferry_stream *s, size_t need, size_t limit)
{
    size_t have = s->w - s->r, cap;
    char *p;

    if (need <= have)
        need = have + 1;
    if (s->cap - s->r >= need)
        return 0;
    if (s->cap >= need) {
        memmove(s->buf, s->buf + s->r, have);
        s->r = 0;
        s->w = have;
        return 0;
    }
    cap = need > s->bufsize ? need : s->bufsize;
    if (s->cap && s->cap <= SIZE_MAX / 2 && s->cap * 2 > cap)
        cap = s->cap * 2 < limit ? s->cap * 2 : (limit > cap ? limit : cap);
    p = s->buf ? ferry__realloc(s->buf, cap) : ferry__malloc(cap);
    if (!p)
        return -ENOMEM;
    if (s->r) {
        memmove(p, p + s->r, have);
        s->r = 0;
        s->w = have;
    }
    s->buf = p;
    s->cap = cap;
    return 0;
}

/*
 * Read from the transport into dst[0, len), waiting while there is nothing.
 * Returns: the count (> 0); 0 at the end of the stream (s->eof); a read
 * error (kept in s->rerr for later reads); -ECANCELED, -ETIMEDOUT, -EBADF,
 * -ENOMEM from the wait.
 */
static ssize_t pull(ferry_stream *s, ferry_task *self, void *dst, size_t len)
{
    int want = FERRY_READ, rc;
    ssize_t k;

    if (len > SSIZE_MAX)
        len = SSIZE_MAX;
    for (;;) {
        if (s->eof)
            return 0;
        if (s->rerr)
            return s->rerr;
        if (s->reg.ready & want) {
            k = s->io->recv(s, dst, len, &want);
            if (k > 0) {
                /* A short read emptied the descriptor (the top of the
                 * file says when that may be trusted). */
                if ((size_t)k < len && s->io->drains && !s->reg.hup &&
                    s->reg.mode == FERRY__IO_EPOLL)
                    s->reg.ready &= (uint8_t)~FERRY_READ;
                return k;
            }
            if (k == 0) {
                s->eof = true;
                return 0;
            }
            if (k != -EAGAIN) {
                s->rerr = (int)k;
                return k;
            }
            s->reg.ready &= (uint8_t)~want;
        }
        rc = ferry__ioreg_wait(&s->reg, self, &s->reg.rq, want, "stream read", s);
        if (rc)
            return rc;
    }
}

/* pull() into the free space of the buffer. */
static ssize_t fill(ferry_stream *s, ferry_task *self)
{
    ssize_t k = pull(s, self, s->buf + s->w, s->cap - s->w);

    if (k > 0)
        s->w += (size_t)k;
    return k;
}

/* Hand `k` buffered bytes to buf and consume them. */
static void take(ferry_stream *s, void *buf, size_t k)
{
    if (k)
        memcpy(buf, s->buf + s->r, k);
    consume(s, k);
}

/* ---- reads ------------------------------------------------------------------ */

int ferry_stream_read(ferry_stream *s, void *buf, size_t max, size_t *n)
{
    ferry_task *self;
    size_t have;
    ssize_t k;
    int rc;

    if (n)
        *n = 0;
    if (!s || !buf || !max || !n)
        return -EINVAL;
    rc = stream_enter(s, &self, &s->reading);
    if (rc)
        return rc;
    if (s->w == s->r) {
        if (max >= s->bufsize) {
            /* Large enough for a whole buffer: straight into the caller's
             * memory.  Still all or nothing: the bytes are the caller's
             * only when the call returns them. */
            k = pull(s, self, buf, max);
            if (k > 0)
                *n = (size_t)k;
            rc = k < 0 ? (int)k : 0;
            goto out;
        }
        rc = make_room(s, 1, s->bufsize);
        if (rc)
            goto out;
        k = fill(s, self);
        if (k <= 0) {
            rc = (int)k;
            goto out;
        }
    }
    have = s->w - s->r;
    *n = have < max ? have : max;
    take(s, buf, *n);
out:
    stream_leave(s, &s->reading);
    return rc;
}

int ferry_stream_read_exactly(ferry_stream *s, void *buf, size_t n, size_t *got)
{
    ferry_task *self;
    ssize_t k;
    int rc;

    if (got)
        *got = 0;
    if (!s || !buf)
        return -EINVAL;
    rc = stream_enter(s, &self, &s->reading);
    if (rc)
        return rc;
    while (s->w - s->r < n) {
        if (s->eof) {
            size_t have = s->w - s->r;
            take(s, buf, have);
            if (got)
                *got = have;
            rc = -ENODATA;
            goto out;
        }
        rc = make_room(s, n, n);
        if (rc)
            goto out;
        k = fill(s, self);
        if (k < 0) {
            rc = (int)k;
            goto out;
        }
    }
    take(s, buf, n);
    if (got)
        *got = n;
out:
    stream_leave(s, &s->reading);
    return rc;
}

/* The first occurrence of delim[0, dlen) in p[0, len), or NULL. */
static const char *find(const char *p, size_t len, const void *delim, size_t dlen)
{
    if (dlen == 1)
        return memchr(p, *(const unsigned char *)delim, len);
    return memmem(p, len, delim, dlen);
}

int ferry_stream_read_until(ferry_stream *s, const void *delim, size_t dlen, void *buf, size_t max,
                            size_t *n)
{
    ferry_task *self;
    size_t scan = 0; /* bytes from s->r on that cannot begin the delimiter */
    ssize_t k;
    int rc;

    if (n)
        *n = 0;
    if (!s || !delim || !dlen || !buf || !max || !n || dlen > max)
        return -EINVAL;
    rc = stream_enter(s, &self, &s->reading);
    if (rc)
        return rc;
    for (;;) {
        size_t have = s->w - s->r, lim = have < max ? have : max;

        if (lim >= dlen && lim > scan) {
            const char *p = find(s->buf + s->r + scan, lim - scan, delim, dlen);
            if (p) {
                *n = (size_t)(p - (s->buf + s->r)) + dlen;
                take(s, buf, *n);
                break;
            }
            /* Searched: what is left can begin a delimiter that ends
             * beyond lim. */
            scan = lim - dlen + 1;
        }
        if (have >= max) {
            rc = -EMSGSIZE;
            break;
        }
        if (s->eof) {
            take(s, buf, have);
            *n = have;
            rc = -ENODATA;
            break;
        }
        rc = make_room(s, have + 1, max);
        if (rc)
            break;
        k = fill(s, self);
        if (k < 0) {
            rc = (int)k;
            break;
        }
    }
    stream_leave(s, &s->reading);
    return rc;
}

int ferry_stream_discard(ferry_stream *s, size_t n, size_t *discarded)
{
    ferry_task *self;
    size_t done = 0;
    ssize_t k;
    int rc;

    if (discarded)
        *discarded = 0;
    if (!s)
        return -EINVAL;
    rc = stream_enter(s, &self, &s->reading);
    if (rc)
        return rc;
    while (done < n) {
        size_t have = s->w - s->r;
        if (have) {
            size_t d = have < n - done ? have : n - done;
            consume(s, d);
            done += d;
            continue;
        }
        if (s->eof) {
            rc = -ENODATA;
            break;
        }
        rc = make_room(s, 1, s->bufsize);
        if (rc)
            break;
        k = fill(s, self);
        if (k < 0) {
            rc = (int)k;
            break;
        }
    }
    if (discarded)
        *discarded = done;
    stream_leave(s, &s->reading);
    return rc;
}

/* ---- writes ----------------------------------------------------------------- */

/*
 * Write all of iov[0, iovcnt) (empty buffers are skipped), trying first
 * and waiting only on EAGAIN.  *done counts the bytes that went out.
 */
static int push(ferry_stream *s, ferry_task *self, const struct iovec *iov, int iovcnt,
                size_t *done)
{
    struct iovec win[FERRY__IOV_BATCH];
    size_t total = 0, off = 0; /* off: bytes of iov[i] already written */
    int i = 0, want = FERRY_WRITE, rc;

    for (;;) {
        size_t offered = 0;
        int nw = 0;
        ssize_t k;

        while (i < iovcnt && iov[i].iov_len == off) {
            i++;
            off = 0;
        }
        if (i == iovcnt)
            break;
        if (s->reg.ready & want) {
            for (int j = i; j < iovcnt && nw < FERRY__IOV_BATCH; j++) {
                size_t skip = j == i ? off : 0, len = iov[j].iov_len - skip;
                if (!len)
                    continue;
                if (len > (size_t)SSIZE_MAX - offered)
                    len = (size_t)SSIZE_MAX - offered;
                win[nw].iov_base = (char *)iov[j].iov_base + skip;
                win[nw].iov_len = len;
                nw++;
                offered += len;
                if (offered == (size_t)SSIZE_MAX)
                    break;
            }
            k = s->io->send(s, win, nw, &want);
            if (k > 0) {
                size_t left = (size_t)k;
                total += left;
                while (left) {
                    size_t room = iov[i].iov_len - off;
                    if (left < room) {
                        off += left;
                        break;
                    }
                    left -= room;
                    i++;
                    off = 0;
                }
                /* A short send filled the socket's buffer (see the top of
                 * the file): wait for room without trying again. */
                if ((size_t)k < offered && s->io->drains)
                    s->reg.ready &= (uint8_t)~FERRY_WRITE;
                continue;
            }
            if (k != -EAGAIN) {
                *done = total;
                return (int)k;
            }
            s->reg.ready &= (uint8_t)~want;
        }
        rc = ferry__ioreg_wait(&s->reg, self, &s->reg.wq, want, "stream write", s);
        if (rc) {
            *done = total;
            return rc;
        }
    }
    *done = total;
    /* A transport with a buffer of its own sends what it holds before the
     * write returns (the seam in stream_int.h). */
    while (s->io->flush && (rc = s->io->flush(s, &want)) != 0) {
        if (rc != -EAGAIN)
            return rc;
        s->reg.ready &= (uint8_t)~want;
        rc = ferry__ioreg_wait(&s->reg, self, &s->reg.wq, want, "stream write", s);
        if (rc)
            return rc;
    }
    return 0;
}

int ferry_stream_write(ferry_stream *s, const void *buf, size_t len, size_t *written)
{
    struct iovec iov;
    ferry_task *self;
    size_t done = 0;
    int rc;

    if (written)
        *written = 0;
    if (!s || (!buf && len))
        return -EINVAL;
    rc = stream_enter(s, &self, &s->writing);
    if (rc)
        return rc;
    iov.iov_base = (void *)(uintptr_t)buf;
    iov.iov_len = len;
    rc = push(s, self, &iov, 1, &done);
    if (written)
        *written = done;
    stream_leave(s, &s->writing);
    return rc;
}

int ferry_stream_writev(ferry_stream *s, const struct iovec *iov, int iovcnt, size_t *written)
{
    ferry_task *self;
    size_t done = 0, sum = 0;
    int rc;

    if (written)
        *written = 0;
    if (!s || iovcnt < 0 || iovcnt > IOV_MAX || (!iov && iovcnt))
        return -EINVAL;
    for (int i = 0; i < iovcnt; i++) {
        if ((!iov[i].iov_base && iov[i].iov_len) || iov[i].iov_len > SIZE_MAX - sum)
            return -EINVAL;
        sum += iov[i].iov_len;
    }
    rc = stream_enter(s, &self, &s->writing);
    if (rc)
        return rc;
    rc = push(s, self, iov, iovcnt, &done);
    if (written)
        *written = done;
    stream_leave(s, &s->writing);
    return rc;
}

/* ---- for select (select_int.h) ------------------------------------------- */

int ferry__stream_sel_poll(ferry_stream *s, ferry_task *self, int want)
{
    int got = want;
    ssize_t k;
    int rc;

    if (s->reg.loop != self->loop)
        return -EPERM;
    if (s->reg.closed)
        return -EBADF;
    if (want == FERRY_WRITE)
        return s->reg.ready & FERRY_WRITE ? FERRY_WRITE : 0;
    if (s->w > s->r || s->eof || s->rerr)
        return FERRY_READ;
    /* A reader inside a call may be waiting to fill the buffer's free
     * space: filling it here would be overwritten.  Its readiness wakes
     * the select as well. */
    if (!(s->reg.ready & FERRY_READ) || s->reading)
        return 0;
    rc = make_room(s, 1, s->bufsize);
    if (rc)
        return rc;
    k = s->io->recv(s, s->buf + s->w, s->cap - s->w, &got);
    if (k > 0) {
        s->w += (size_t)k;
        return FERRY_READ;
    }
    if (k == 0) {
        s->eof = true;
        return FERRY_READ;
    }
    if (k != -EAGAIN) {
        s->rerr = (int)k;
        return FERRY_READ;
    }
    s->reg.ready &= (uint8_t)~got;
    return 0;
}

int ferry__stream_sel_arm(ferry_stream *s, struct ferry__waiter *w, int want)
{
    struct ferry__waitq *q = want == FERRY_READ ? &s->reg.rq : &s->reg.wq;
    int rc;

    if (s->reg.mode == FERRY__IO_LT) {
        rc = ferry__ioreg_lt_update(&s->reg, (short)(want == FERRY_READ ? EV_READ : EV_WRITE));
        if (rc)
            return rc;
    }
    w->n = (uint64_t)want;
    w->data = s;
    /* Counted as inside a call, so a close during the wait leaves the
     * stream for ferry__stream_sel_disarm() to free. */
    s->inside++;
    ferry__list_push_back(&q->head, &w->link);
    return 0;
}

void ferry__stream_sel_disarm(ferry_stream *s, struct ferry__waiter *w)
{
    w->data = NULL;
    if (s->reg.mode == FERRY__IO_LT && !s->reg.closed)
        ferry__ioreg_lt_update(&s->reg, 0);
    if (--s->inside == 0 && s->reg.closed)
        stream_free(s);
}
