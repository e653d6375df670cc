/* stress_stream.c - a model-based stress test of streams (ferry/stream.h).
 *
 * Pairs of streams on one loop, over socketpairs, TCP loopback connections
 * and pipes, each with a known byte sequence of lines (most short, some
 * longer than a reader's maximum).  A writer task sends it in random
 * fragments (down to one byte, sometimes as several buffers), with random
 * pauses, under random deadlines; a reader task consumes it with random
 * reads of every kind (some, exactly, until a newline, discard), under
 * random deadlines.  A chaos task cancels readers and writers at random
 * moments; each is started again where the model says it left off.
 *
 * The model: the sequence, how far the writer got (the sum of *written,
 * also from cut and cancelled writes) and how far the reader got.  Every
 * read that succeeds must return the next bytes of the sequence (a line
 * must end at the first newline); one that fails with -ECANCELED,
 * -ETIMEDOUT or -EMSGSIZE must have consumed nothing (-EMSGSIZE only where
 * no newline ends within the maximum); the end comes only after the last
 * byte.  So every byte sent is read once, in order.
 *
 * Seeded: FERRY_STRESS_SEED=N repeats a run; the seed is printed on
 * failure.  FERRY_STRESS_SCALE scales the amount of data.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "testutil.h"

#define NPAIRS 6

struct pair {
    int            id;
    ferry_stream  *r, *w;       /* the reader's and the writer's streams */
    unsigned char *data;        /* the sequence */
    size_t         total;
    size_t         sent;        /* bytes the writer got out, by *written */
    size_t         inflight;    /* bytes of the write the writer is inside */
    size_t         got;         /* bytes the reader consumed */
    bool           wdone;       /* the writer sent all and closed its end */
    bool           rdone;       /* the reader saw the end after the last byte */
    ferry_task    *reader, *writer;
    uint64_t       rng;
    unsigned long  ops, cuts, cancels, msgsize, restarts;
    unsigned long  cuts_kept;   /* cut reads that left bytes in the stream */
    unsigned long  wcuts;       /* cut or cancelled writes that had sent bytes */
};

static struct pair pairs[NPAIRS];
static uint64_t g_seed;
static int g_failed;
static char g_why[512];
static bool g_stop;

static uint64_t next(uint64_t *s)
{
    /* xorshift64* */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ULL;
}

static size_t below(uint64_t *s, size_t n)
{
    return n ? (size_t)(next(s) % n) : 0;
}

static void fail(struct pair *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void fail(struct pair *p, const char *fmt, ...)
{
    va_list ap;
    int k;

    if (g_failed++)
        return;
    k = snprintf(g_why, sizeof g_why, "seed %" PRIu64 ", pair %d (got %zu, sent %zu of %zu): ",
                 g_seed, p->id, p->got, p->sent, p->total);
    va_start(ap, fmt);
    vsnprintf(g_why + k, sizeof g_why - (size_t)k, fmt, ap);
    va_end(ap);
}

/* The sequence: lines of 1..40 bytes mostly, some of up to 300 and a few
 * of up to 3000 (longer than most maxima: -EMSGSIZE), each ending in a
 * newline; the bytes are random otherwise, without newlines. */
static void make_data(struct pair *p, size_t total)
{
    size_t i = 0;

    p->data = malloc(total);
    cr_assert_not_null(p->data);
    while (i < total) {
        size_t r = below(&p->rng, 100), len;
        len = r < 70 ? 1 + below(&p->rng, 40) : r < 95 ? 1 + below(&p->rng, 300)
                                                     : 1 + below(&p->rng, 3000);
        for (size_t k = 0; k + 1 < len && i < total; k++) {
            unsigned char c = (unsigned char)next(&p->rng);
            p->data[i++] = c == '\n' ? 'n' : c;
        }
        if (i < total)
            p->data[i++] = '\n';
    }
    p->total = total;
}

static bool has_newline(const unsigned char *b, size_t n)
{
    return memchr(b, '\n', n) != NULL;
}

/* Enter a deadline scope of 0..2 ms half of the time. */
static bool maybe_deadline(struct pair *p, ferry_scope *sc)
{
    if (below(&p->rng, 2))
        return false;
    ferry_scope_enter(sc, ferry_now() + (int64_t)below(&p->rng, 2000000), 0);
    return true;
}

/* ---- the reader ---------------------------------------------------------- */

/* Check a read that returned rc with n bytes at buf: advance the model. */
static void check_read(struct pair *p, int kind, int rc, const unsigned char *buf, size_t n,
                       size_t asked)
{
    const unsigned char *want = p->data + p->got;
    size_t left = p->total - p->got;

    if (rc == -ECANCELED || rc == -ETIMEDOUT) {
        if (n && kind != 3)
            fail(p, "op %d returned %d but handed over %zu bytes", kind, rc, n);
        if (kind == 3)      /* discard: the count is consumed */
            p->got += n;
        p->cuts++;
        if (kind != 3 && ferry_stream_buffered(p->r) > 0)
            p->cuts_kept++;
        return;
    }
    if (rc == -EMSGSIZE) {
        if (kind != 2 || n)
            fail(p, "op %d: -EMSGSIZE with %zu bytes", kind, n);
        else if (left < asked || has_newline(want, asked))
            fail(p, "-EMSGSIZE although a newline ends within %zu bytes (%zu left)", asked, left);
        p->msgsize++;
        return;
    }
    if (rc == -ENODATA) {
        /* The end: the rest came, and no more. */
        if (!p->wdone || n != left || (kind != 3 && memcmp(buf, want, n) != 0))
            fail(p, "op %d: -ENODATA with %zu bytes, %zu left%s", kind, n, left,
                 p->wdone ? "" : ", the writer not done");
        else if (kind == 2 && has_newline(want, n))
            fail(p, "read_until: -ENODATA with a newline in the %zu bytes", n);
        p->got += n;
        if (p->got == p->total)
            p->rdone = true;
        return;
    }
    if (rc != 0) {
        fail(p, "op %d returned %d", kind, rc);
        return;
    }
    if (kind == 0 && n == 0) {
        /* read at the end */
        if (!p->wdone || left)
            fail(p, "read returned the end with %zu bytes left", left);
        p->rdone = true;
        return;
    }
    if (n > left || (kind != 3 && memcmp(buf, want, n) != 0)) {
        fail(p, "op %d returned %zu bytes that are not the next ones", kind, n);
        return;
    }
    if (kind == 1 && n != asked)
        fail(p, "read_exactly(%zu) returned %zu", asked, n);
    if (kind == 2 && (want[n - 1] != '\n' || has_newline(want, n - 1) || n > asked))
        fail(p, "read_until returned %zu bytes that are not one line within %zu", n, asked);
    if (kind == 3 && n != asked)
        fail(p, "discard(%zu) dropped %zu", asked, n);
    p->got += n;
}

static int reader_task(void *arg)
{
    struct pair *p = arg;
    unsigned char *buf = malloc(8192);

    while (buf && !p->rdone && !g_failed && !g_stop) {
        ferry_scope sc;
        bool dl = maybe_deadline(p, &sc);
        int kind = (int)below(&p->rng, 4), rc;
        size_t n = 0, asked = 0;

        switch (kind) {
        case 0:
            asked = 1 + below(&p->rng, below(&p->rng, 2) ? 16 : 8192);
            rc = ferry_stream_read(p->r, buf, asked, &n);
            break;
        case 1:
            asked = 1 + below(&p->rng, below(&p->rng, 2) ? 16 : 4000);
            rc = ferry_stream_read_exactly(p->r, buf, asked, &n);
            break;
        case 2:
            asked = 1 + below(&p->rng, below(&p->rng, 4) ? 400 : 4000);
            rc = ferry_stream_read_until(p->r, "\n", 1, buf, asked, &n);
            break;
        default:
            asked = 1 + below(&p->rng, 300);
            if (asked > p->total - p->got && !below(&p->rng, 2))
                asked = p->total - p->got ? p->total - p->got : 1;
            rc = ferry_stream_discard(p->r, asked, &n);
            break;
        }
        if (dl)
            ferry_scope_exit(&sc);
        p->ops++;
        check_read(p, kind, rc, buf, n, asked);
        if (ferry_stream_buffered(p->r) > p->sent + p->inflight - p->got)
            fail(p, "%zu bytes buffered, more than sent and not read", ferry_stream_buffered(p->r));
        if (rc == -ECANCELED)
            break;      /* cancelled: the driver starts a new reader */
        if (below(&p->rng, 16) == 0)
            ferry_sleep((int64_t)below(&p->rng, 2000000));   /* a slow reader */
    }
    free(buf);
    return 0;
}

/* ---- the writer ---------------------------------------------------------- */

static int writer_task(void *arg)
{
    struct pair *p = arg;

    while (p->sent < p->total && !g_failed && !g_stop) {
        size_t left = p->total - p->sent, frag, written = 0, r = below(&p->rng, 10);
        ferry_scope sc;
        bool dl;
        int rc;

        frag = r < 4 ? 1 + below(&p->rng, 8) : r < 8 ? 1 + below(&p->rng, 300)
                                                  : 1 + below(&p->rng, 20000);
        if (frag > left)
            frag = left;
        dl = maybe_deadline(p, &sc);
        p->inflight = frag;
        if (frag > 3 && below(&p->rng, 3) == 0) {
            /* Three buffers, the middle one maybe empty. */
            size_t a = below(&p->rng, frag), b = below(&p->rng, 2) ? 0 : below(&p->rng, frag - a);
            struct iovec iov[3] = {
                { p->data + p->sent, a },
                { p->data + p->sent + a, b },
                { p->data + p->sent + a + b, frag - a - b },
            };
            rc = ferry_stream_writev(p->w, iov, 3, &written);
        } else {
            rc = ferry_stream_write(p->w, p->data + p->sent, frag, &written);
        }
        p->inflight = 0;
        if (dl)
            ferry_scope_exit(&sc);
        if (written > frag)
            fail(p, "write of %zu reported %zu written", frag, written);
        p->sent += written;
        if (rc && written)
            p->wcuts++;
        if (rc == 0 && written != frag)
            fail(p, "write of %zu returned 0 with %zu written", frag, written);
        if (rc == -ECANCELED)
            return 0;   /* the driver starts a new writer */
        if (rc && rc != -ETIMEDOUT)
            fail(p, "write returned %d", rc);
        if (below(&p->rng, 3) == 0)
            ferry_sleep((int64_t)below(&p->rng, 500000));
        else if (below(&p->rng, 4) == 0)
            ferry_yield();
    }
    if (p->sent == p->total && !p->wdone) {
        ferry_stream_close(p->w);
        p->w = NULL;
        p->wdone = true;
    }
    return 0;
}

/* ---- chaos and the driver --------------------------------------------- */

static int chaos_task(void *arg)
{
    uint64_t *rng = arg;

    while (!g_stop) {
        struct pair *p = &pairs[below(rng, NPAIRS)];
        if (ferry_sleep((int64_t)below(rng, 2000000)) != 0)
            return 0;
        if (below(rng, 2) && p->reader && !p->rdone) {
            ferry_task_cancel(p->reader);
            p->cancels++;
        } else if (p->writer && !p->wdone) {
            ferry_task_cancel(p->writer);
            p->cancels++;
        }
    }
    return 0;
}

/* Restart the reader or writer of `p` if it ended early (cancelled). */
static void restart(struct pair *p, ferry_task **t, ferry_task_fn fn, bool done)
{
    if (*t && ferry_task_try_join(*t, NULL) == 0) {
        *t = NULL;
        if (!done && !g_failed) {
            p->restarts++;
            ferry_task_spawn(t, NULL, fn, p, NULL);
        }
    }
}

static int driver(void *arg)
{
    uint64_t chaos_rng = g_seed * 7 + 1;
    int64_t until = ferry_now() + tu_ms(60000);
    ferry_task *chaos;
    bool all;

    (void)arg;
    for (int i = 0; i < NPAIRS; i++) {
        ferry_task_spawn(&pairs[i].reader, NULL, reader_task, &pairs[i], NULL);
        ferry_task_spawn(&pairs[i].writer, NULL, writer_task, &pairs[i], NULL);
    }
    ferry_task_spawn(&chaos, NULL, chaos_task, &chaos_rng, NULL);
    do {
        ferry_sleep(FERRY_MSEC(1));
        all = true;
        for (int i = 0; i < NPAIRS; i++) {
            struct pair *p = &pairs[i];
            restart(p, &p->writer, writer_task, p->wdone);
            restart(p, &p->reader, reader_task, p->rdone);
            all &= p->rdone;
        }
        if (ferry_now() > until && !g_failed)
            fail(&pairs[0], "not done after 60 s (scaled): a read or write hangs");
    } while (!all && !g_failed);
    g_stop = true;
    ferry_task_cancel(chaos);
    ferry_task_join(chaos, NULL);
    for (int i = 0; i < NPAIRS; i++) {
        if (pairs[i].reader)
            ferry_task_cancel(pairs[i].reader), ferry_task_join(pairs[i].reader, NULL);
        if (pairs[i].writer)
            ferry_task_cancel(pairs[i].writer), ferry_task_join(pairs[i].writer, NULL);
    }
    return 0;
}

/* Small kernel buffers, so that writers often find them full. */
static void small_buffers(int fd)
{
    int sz = 4096;

    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
}

/* Two connected descriptors: kind 0 a socketpair, 1 TCP over loopback, 2 a
 * pipe (fds[0] the read end). */
static void connect_pair(int kind, int fds[2])
{
    if (kind == 0) {
        cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    } else if (kind == 1) {
        tu_tcp_pair(fds);
    } else {
        cr_assert_eq(pipe2(fds, O_CLOEXEC), 0);
        fcntl(fds[1], F_SETPIPE_SZ, 4096);
        return;
    }
    small_buffers(fds[0]);
    small_buffers(fds[1]);
}

Test(stress_stream, every_byte_is_read_once_in_order, .init = tu_loop_setup,
     .fini = tu_loop_teardown, .timeout = 600.)
{
    static const size_t bufs[] = { 16, 100, 4096, 0 };
    const char *e = getenv("FERRY_STRESS_SEED"), *sc = getenv("FERRY_STRESS_SCALE");
    double scale = sc ? atof(sc) : 1.0;
    size_t total = (size_t)(300000 * (scale > 0 && scale <= 1 ? scale : 1.0));
    unsigned long ops = 0, cuts = 0, cancels = 0, msgsize = 0, restarts = 0, kept = 0, wcuts = 0;

    if (total < 20000)
        total = 20000;
    g_seed = e ? strtoull(e, NULL, 10) : (uint64_t)ferry_now() ^ (uint64_t)getpid() << 20;
    if (!g_seed)
        g_seed = 1;
    g_failed = 0;
    g_stop = false;
    for (int i = 0; i < NPAIRS; i++) {
        struct pair *p = &pairs[i];
        int fds[2];

        memset(p, 0, sizeof *p);
        p->id = i;
        p->rng = g_seed + (uint64_t)i * 0x9e3779b97f4a7c15ULL;
        make_data(p, total);
        connect_pair(i % 3, fds);
        cr_assert_eq(ferry_stream_open(&p->r, tu_loop, fds[0],
                                       &(ferry_stream_opts){ .read_buffer = bufs[i % 4] }), 0);
        cr_assert_eq(ferry_stream_open(&p->w, tu_loop, fds[1], NULL), 0);
    }
    cr_assert_eq(tu_run(driver, NULL), 0);
    for (int i = 0; i < NPAIRS; i++) {
        struct pair *p = &pairs[i];
        ops += p->ops;
        cuts += p->cuts;
        cancels += p->cancels;
        msgsize += p->msgsize;
        restarts += p->restarts;
        kept += p->cuts_kept;
        wcuts += p->wcuts;
        if (!g_failed && (p->got != p->total || !p->rdone))
            fail(p, "ended with %zu of %zu bytes read", p->got, p->total);
        ferry_stream_close(p->r);
        if (p->w)
            ferry_stream_close(p->w);
        free(p->data);
    }
    fprintf(stderr, "stress_stream: seed %" PRIu64 ": %d pairs x %zu bytes, %lu reads "
            "(%lu cut by a deadline or cancelled, %lu of them with bytes left in the stream; "
            "%lu -EMSGSIZE), %lu writes cut after sending some, %lu cancels, %lu restarts\n",
            g_seed, NPAIRS, total, ops, cuts, kept, msgsize, wcuts, cancels, restarts);
    cr_assert_eq(g_failed, 0, "%s (FERRY_STRESS_SEED=%" PRIu64 " repeats it)", g_why, g_seed);
    cr_assert_gt(kept, 0, "no read was ever cut with bytes in the stream: the test tests less "
                 "than it says");
    cr_assert_gt(msgsize, 0, "no line was ever too long");
    cr_assert_gt(wcuts, 0, "no write was ever cut after sending some");
    cr_assert_gt(cancels, 0);
}
