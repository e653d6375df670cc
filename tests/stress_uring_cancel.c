/* stress_uring_cancel.c - cancellation raced against completion on the
 * io_uring backend (FERRY_IO=uring, docs/io_uring.md), with schedule
 * fuzzing on.
 *
 * Connections (socketpairs and TCP loopback) carry a known byte sequence
 * of short lines.  Each round picks one: a reader task starts a read of a
 * random kind (some, exactly n, a line), the peer writes the next bytes
 * of the sequence with a plain write(2) at a random point, and the reader
 * is cancelled at another random point, before, while or after the
 * kernel's receive completes into the stream.  A read that succeeds must
 * return the next bytes of the sequence; one that is cancelled must have
 * consumed nothing.  At the end every connection is drained: every byte
 * written arrived exactly once, in order.  Then the streams close with
 * receives in flight, and the process must hold the descriptors it held
 * before.
 *
 * FERRY_URING_ROUNDS sets the rounds (default 400000, scaled by
 * FERRY_STRESS_SCALE; the run prints how many it made), FERRY_STRESS_SEED
 * repeats a run (the seed also seeds the schedule fuzzing; it is printed
 * on failure).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "testutil.h"

#define NCONN 6
#define LINE  17 /* a line: 16 letters and a newline */

struct conn {
    ferry_stream *s;  /* the stream's end */
    int peer;         /* the peer's end, written with write(2) */
    size_t sent;      /* bytes of the sequence the peer wrote */
    size_t got;       /* bytes of it the stream's reads returned */
    ferry_task *reader;
    int kind;         /* the reader's call: 0 some, 1 exactly, 2 a line */
    size_t want;      /* its size */
    int rc;           /* its result */
    size_t n;         /* bytes it returned */
    char buf[4096];
};

static struct conn conns[NCONN];
static uint64_t g_seed, g_rng;
static unsigned long g_rounds, g_bad, g_cancelled, g_completed;
static char g_why[256];

static uint32_t rnd(uint32_t below)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng % below);
}

static char seq_at(size_t i)
{
    return i % LINE == LINE - 1 ? '\n' : (char)('a' + i % 26);
}

static void bad(const char *why, const struct conn *c)
{
    if (!g_bad++)
        snprintf(g_why, sizeof g_why,
                 "%s (connection %d, got %zu, sent %zu, call %d, rc %d, n %zu: %.*s)", why,
                 (int)(c - conns), c->got, c->sent, c->kind, c->rc, c->n, (int)c->n, c->buf);
}

/* A read's bytes must be the next of the sequence. */
static void check(struct conn *c)
{
    for (size_t i = 0; i < c->n; i++)
        if (c->buf[i] != seq_at(c->got + i)) {
            bad("a byte out of sequence", c);
            return;
        }
    if (c->kind == 2 && c->n && c->buf[c->n - 1] != '\n')
        bad("a line that does not end at its newline", c);
    c->got += c->n;
    if (c->got > c->sent)
        bad("more bytes than were written", c);
}

static int reader_task(void *arg)
{
    struct conn *c = arg;

    c->n = 0;
    switch (c->kind) {
    case 0:
        c->rc = ferry_stream_read(c->s, c->buf, c->want, &c->n);
        break;
    case 1:
        c->rc = ferry_stream_read_exactly(c->s, c->buf, c->want, NULL);
        if (c->rc == 0)
            c->n = c->want;
        break;
    default:
        c->rc = ferry_stream_read_until(c->s, "\n", 1, c->buf, sizeof c->buf, &c->n);
        break;
    }
    return 0;
}

/* The peer writes up to `len` next bytes, keeping what is in flight
 * bounded (a plain, non-blocking write). */
static void peer_write(struct conn *c, size_t len)
{
    char b[2048];
    ssize_t k;

    if (c->sent - c->got > 32768)
        return;
    if (len > sizeof b)
        len = sizeof b;
    for (size_t i = 0; i < len; i++)
        b[i] = seq_at(c->sent + i);
    k = write(c->peer, b, len);
    if (k > 0)
        c->sent += (size_t)k;
}

static void yields(unsigned n)
{
    while (n--)
        ferry_yield();
}

static void one_round(void)
{
    struct conn *c = &conns[rnd(NCONN)];
    size_t avail = c->sent - c->got;

    c->kind = (int)rnd(3);
    c->want = 1 + rnd(c->kind == 1 ? 200 : (uint32_t)sizeof c->buf);
    if (c->kind == 1 && c->want > avail + 2048)
        c->want = avail + 1; /* reachable by the next write */
    c->rc = 1; /* stays so if the task is cancelled before it first runs */
    c->n = 0;
    c->reader = tu_spawn(reader_task, c);
    yields(rnd(3));
    peer_write(c, 1 + rnd(600));
    yields(rnd(4));
    ferry_task_cancel(c->reader);
    tu_join(c->reader);
    c->reader = NULL;
    if (c->rc == 0) {
        g_completed++;
        check(c);
    } else if (c->rc == -ECANCELED || c->rc == 1) {
        g_cancelled++;
    } else {
        bad("a read failed", c);
    }
}

/* Read what is left, under a deadline: every byte written arrives. */
static void drain(struct conn *c)
{
    ferry_scope sc;

    ferry_scope_enter(&sc, ferry_now() + tu_ms(10000), 0);
    while (c->got < c->sent && !g_bad) {
        c->kind = 0;
        c->want = sizeof c->buf;
        reader_task(c);
        if (c->rc) {
            bad("the drain failed", c);
            break;
        }
        check(c);
    }
    ferry_scope_exit(&sc);
}

static int main_task(void *arg)
{
    unsigned long rounds = *(unsigned long *)arg;

    for (g_rounds = 0; g_rounds < rounds && !g_bad; g_rounds++)
        one_round();
    for (int i = 0; i < NCONN; i++)
        drain(&conns[i]);
    /* Close with receives in flight: a read armed on each, then the close. */
    for (int i = 0; i < NCONN; i++) {
        conns[i].kind = 0;
        conns[i].want = 10;
        conns[i].reader = tu_spawn(reader_task, &conns[i]);
    }
    yields(3);
    for (int i = 0; i < NCONN; i++) {
        ferry_stream_close(conns[i].s);
        tu_join(conns[i].reader);
    }
    return 0;
}

Test(stress_uring_cancel, cancellation_races_completion_and_no_byte_is_lost,
     .init = tu_alloc_setup, .fini = tu_loop_teardown, .timeout = 600.)
{
    const char *e = getenv("FERRY_STRESS_SEED"), *r = getenv("FERRY_URING_ROUNDS");
    unsigned long rounds = r ? strtoul(r, NULL, 10) : (unsigned long)tu_scaled(400000);
    ferry_loop_opts opts = { 0 };
    ferry_loop_stats st;
    ferry_loop *loop;
    int before, fds[2];

    g_seed = e ? strtoull(e, NULL, 10) : (uint64_t)ferry_now() ^ (uint64_t)getpid() << 20;
    if (!g_seed)
        g_seed = 1;
    g_rng = g_seed;
    setenv("FERRY_IO", "uring", 0); /* FERRY_IO=epoll: the same run on epoll */
    opts.fuzz_seed = g_seed;
    cr_assert_eq(ferry_loop_new(&loop, &opts), 0);
    /* The ring is made with the first stream; count the descriptors after. */
    for (int i = 0; i < NCONN; i++) {
        if (i % 2)
            tu_tcp_pair(fds);
        else
            cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
        memset(&conns[i], 0, sizeof conns[i]);
        conns[i].peer = fds[1];
        cr_assert_eq(ferry_stream_open(&conns[i].s, loop, fds[0], NULL), 0);
        if (i == 0)
            before = tu_open_fds() - 2;
    }
    ferry_loop_stats_get(loop, &st);
    /* Where the machine denies io_uring the race runs on the fallback (a
     * check of epoll's cancel safety); where it allows it, the ring must
     * be in use, or this test would prove nothing about it. */
    if (strcmp(getenv("FERRY_IO"), "uring") == 0 && st.io_fallback_err != EPERM &&
        st.io_fallback_err != ENOSYS)
        cr_assert_str_eq(st.io_backend, "io_uring", "fell back: %s",
                         st.io_fallback ? st.io_fallback : "?");
    else if (strcmp(st.io_backend, "io_uring") != 0)
        fprintf(stderr, "stress_uring_cancel: io_uring denied here (%s): the race runs on epoll\n",
                st.io_fallback ? st.io_fallback : "?");
    cr_assert_eq(tu_run_on(loop, main_task, &rounds), 0);
    cr_assert_eq(g_bad, 0, "seed %llu, round %lu: %s", (unsigned long long)g_seed, g_rounds,
                 g_why);
    for (int i = 0; i < NCONN; i++) {
        cr_assert_eq(conns[i].got, conns[i].sent, "seed %llu", (unsigned long long)g_seed);
        close(conns[i].peer);
    }
    cr_assert_eq(tu_open_fds(), before, "descriptors left (seed %llu)", (unsigned long long)g_seed);
    ferry_loop_free(loop);
    fprintf(stderr,
            "stress_uring_cancel: seed %llu: %lu rounds, %lu reads completed, %lu cancelled\n",
            (unsigned long long)g_seed, g_rounds, g_completed, g_cancelled);
}
