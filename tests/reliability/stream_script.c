/* stream_script.c - run a script of fragments and reads (stream_script.h)
 * on a real stream and check every result against a reference: a plain
 * byte queue of what the peer wrote and the reader has not consumed.
 *
 * The peer is the test itself, writing to the other end of a socketpair
 * with plain write(), so what it wrote is in the socket before the next
 * read runs.  The fragments written between two reads go out as one
 * write() just before the second: the reader cannot tell them apart, and a
 * socket that holds many small writes fills long before their bytes do.  Each read runs in a task of its own; the loop gets a few
 * turns, and a read still waiting then is cancelled: it waited although
 * the reference says the data it needs never comes, or it was wrong.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ferry/ferry.h"
#include "stream_script.h"

/* What the peer may write in one script: far below a socketpair's buffer,
 * so that the peer's blocking write() never waits. */
#define PEER_MAX 65536

static ferry_loop *loop;

struct ctx {
    ferry_stream  *s;
    unsigned char  delim[4];
    size_t         dlen;
    unsigned char  ref[PEER_MAX]; /* written, not yet consumed: ref[0, len) */
    size_t         len;
    size_t         written;       /* bytes the peer wrote in all */
    size_t         pending;       /* of ref, the last ones, not yet written */
    bool           eof;           /* the peer ended its side */
    /* the op the task runs, and what it returned */
    int            op;
    size_t         arg;
    int            rc;
    size_t         n;
    unsigned char  out[512];
    char          *why;
    size_t         whylen;
    int            failed;
};

static void fail(struct ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void fail(struct ctx *c, const char *fmt, ...)
{
    va_list ap;

    if (c->failed++)
        return;
    va_start(ap, fmt);
    vsnprintf(c->why, c->whylen, fmt, ap);
    va_end(ap);
}

static int op_task(void *arg)
{
    struct ctx *c = arg;
    ferry_scope sc;

    c->n = 0;
    switch (c->op) {
    case 1:
        c->rc = ferry_stream_read_until(c->s, c->delim, c->dlen, c->out, c->arg, &c->n);
        break;
    case 2:
        c->rc = ferry_stream_read_exactly(c->s, c->out, c->arg, &c->n);
        break;
    case 3:
        c->rc = ferry_stream_read(c->s, c->out, c->arg, &c->n);
        break;
    case 4:
        c->rc = ferry_stream_discard(c->s, c->arg, &c->n);
        break;
    default:
        ferry_scope_enter(&sc, ferry_now() - 1, 0);
        c->rc = ferry_stream_read_until(c->s, c->delim, c->dlen, c->out, c->arg, &c->n);
        ferry_scope_exit(&sc);
        break;
    }
    return 0;
}

/* Run c->op in a task: a few turns, then cancelled if it still waits. */
static void run_op(struct ctx *c)
{
    ferry_task *t;
    int st;

    if (ferry_task_spawn(&t, loop, op_task, c, NULL) != 0) {
        fail(c, "spawn failed");
        return;
    }
    for (int i = 0; i < 4 && ferry_task_try_join(t, &st) == -EAGAIN; i++)
        ferry_loop_run(loop, FERRY_RUN_ONCE);
    if (ferry_task_try_join(t, &st) == -EAGAIN) {
        ferry_task_cancel(t);
        while (ferry_task_try_join(t, &st) == -EAGAIN)
            ferry_loop_run(loop, FERRY_RUN_ONCE);
    }
}

/* The reference consumes k bytes. */
static void ref_take(struct ctx *c, size_t k)
{
    memmove(c->ref, c->ref + k, c->len - k);
    c->len -= k;
}

/* Where the first delimiter ends within ref[0, lim), or 0. */
static size_t ref_line(const struct ctx *c, size_t lim)
{
    for (size_t i = 0; i + c->dlen <= lim; i++)
        if (memcmp(c->ref + i, c->delim, c->dlen) == 0)
            return i + c->dlen;
    return 0;
}

static void expect(struct ctx *c, int rc, size_t n, bool data)
{
    if (c->rc != rc || c->n != n) {
        fail(c, "op %d(%zu) with %zu bytes to read%s: returned %d with %zu bytes, the reference "
             "says %d with %zu", c->op, c->arg, c->len, c->eof ? " and the end" : "", c->rc, c->n,
             rc, n);
        return;
    }
    if (data && n && memcmp(c->out, c->ref, n) != 0) {
        fail(c, "op %d(%zu): the %zu bytes returned are not the next ones", c->op, c->arg, n);
        return;
    }
    ref_take(c, n);
}

static void check(struct ctx *c, size_t buffered)
{
    size_t line, n;

    switch (c->op) {
    case 1:
        if (c->dlen > c->arg) {
            expect(c, -EINVAL, 0, false);
        } else if ((line = ref_line(c, c->len < c->arg ? c->len : c->arg)) != 0) {
            expect(c, 0, line, true);
        } else if (c->len >= c->arg) {
            expect(c, -EMSGSIZE, 0, false);
        } else if (c->eof) {
            expect(c, -ENODATA, c->len, true);
        } else {
            expect(c, -ECANCELED, 0, false);
        }
        break;
    case 2:
        if (c->len >= c->arg)
            expect(c, 0, c->arg, true);
        else if (c->eof)
            expect(c, -ENODATA, c->len, true);
        else
            expect(c, -ECANCELED, 0, false);
        break;
    case 3:
        if (c->len) {
            /* At least one byte and at most max: what the buffer held, or
             * what one read of the socket gave. */
            n = buffered ? (buffered < c->arg ? buffered : c->arg) : c->n;
            if (!buffered && (c->n == 0 || c->n > c->arg || c->n > c->len))
                n = c->len < c->arg ? c->len : c->arg;
            expect(c, 0, n, true);
        } else if (c->eof) {
            expect(c, 0, 0, false);
        } else {
            expect(c, -ECANCELED, 0, false);
        }
        break;
    case 4:
        if (c->len >= c->arg)
            expect(c, 0, c->arg, false);
        else
            expect(c, c->eof ? -ENODATA : -ECANCELED, c->len, false);
        break;
    default:
        expect(c, c->dlen > c->arg ? -EINVAL : -ETIMEDOUT, 0, false);
        break;
    }
}

/* The peer writes b[0, n) (what fits in PEER_MAX): kept for flush(). */
static void peer_write(struct ctx *c, const unsigned char *b, size_t n)
{
    if (c->eof)
        return;
    if (n > PEER_MAX - c->written)
        n = PEER_MAX - c->written;
    if (n > PEER_MAX - c->len)
        n = PEER_MAX - c->len;
    memcpy(c->ref + c->len, b, n);
    c->len += n;
    c->written += n;
    c->pending += n;
}

/* Write what the peer wrote since the last flush. */
static void flush(struct ctx *c, int fd)
{
    if (c->pending &&
        write(fd, c->ref + c->len - c->pending, c->pending) != (ssize_t)c->pending)
        fail(c, "the peer's write failed");
    c->pending = 0;
}

int stream_script_run(const uint8_t *data, size_t size, char *why, size_t whylen)
{
    static struct ctx c;
    ferry_stream_opts o = { 0 };
    size_t i;
    int sp[2];

    if (!loop && ferry_loop_new(&loop, NULL) != 0) {
        snprintf(why, whylen, "ferry_loop_new failed");
        return -1;
    }
    memset(&c, 0, sizeof c);
    c.why = why;
    c.whylen = whylen;
    if (size < 2)
        return 0;
    if (size > STREAM_SCRIPT_MAX)
        size = STREAM_SCRIPT_MAX;
    if (data[0] < 192)
        o.read_buffer = 1 + data[0] % 64;
    c.dlen = 1 + data[1] % 4;
    i = 2;
    for (size_t k = 0; k < c.dlen; k++)
        c.delim[k] = i < size ? data[i++] : '\n';
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) != 0) {
        snprintf(why, whylen, "socketpair failed");
        return -1;
    }
    if (ferry_stream_open(&c.s, loop, sp[0], &o) != 0) {
        snprintf(why, whylen, "ferry_stream_open failed");
        close(sp[0]);
        close(sp[1]);
        return -1;
    }
    while (i + 1 < size && !c.failed) {
        int op = data[i] % 8;
        size_t a = data[i + 1], buffered;

        i += 2;
        if (op == 0) {
            size_t n = a < size - i ? a : size - i;
            peer_write(&c, data + i, n);
            i += n;
            continue;
        }
        if (op == 7) {
            unsigned char rep[255];
            for (size_t k = 0; k < a; k++)
                rep[k] = c.delim[k % c.dlen];
            peer_write(&c, rep, a);
            continue;
        }
        flush(&c, sp[1]);
        if (op == 5) {
            if (!c.eof)
                shutdown(sp[1], SHUT_WR);
            c.eof = true;
            continue;
        }
        c.op = op;
        c.arg = op == 2 || op == 4 ? a : a + 1;
        buffered = ferry_stream_buffered(c.s);
        run_op(&c);
        check(&c, buffered);
        if (ferry_stream_buffered(c.s) > c.len)
            fail(&c, "after op %d: %zu bytes buffered, %zu not yet read", op,
                 ferry_stream_buffered(c.s), c.len);
    }
    ferry_stream_close(c.s);
    close(sp[1]);
    return c.failed ? -1 : 0;
}
