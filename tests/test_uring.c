/* test_uring.c - the io_uring backend of streams and listeners
 * (FERRY_IO=uring, docs/io_uring.md): that it is really in use, that it
 * falls back to epoll when it cannot be set up, its cancel-safety
 * contract (a cancelled read, line read or accept leaves what the kernel
 * completed for the next call), close with operations in flight (no
 * descriptor or memory left), the cap on receive buffers per connection,
 * and -ENOMEM where it allocates.
 *
 * Each test sets FERRY_IO=uring itself before its loop's first stream:
 * the backend is chosen then.  No cr_assert inside task bodies
 * (testutil.h).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <linux/io_uring.h>

#include <criterion/criterion.h>

#include "fault.h"
#include "testutil.h"
#include "stream_int.h"

/* Can this process make a ring at all?  Where the machine denies io_uring
 * (io_uring_disabled, a container's seccomp profile), the loop falls back
 * to epoll by design, so the backend's own tests have nothing to test and
 * skip; the *_uring suites then run on epoll, and test_uring_fallback
 * covers that case. */
static int machine_denies_uring(void)
{
    struct io_uring_params p;
    long fd;

    memset(&p, 0, sizeof p);
    fd = syscall(__NR_io_uring_setup, 1, &p);
    if (fd < 0)
        return errno;
    close((int)fd);
    return 0;
}

static void uring_setup(void)
{
    int err = machine_denies_uring();

    if (err) {
        cr_log_warn("io_uring cannot be set up on this machine (%s): the backend's "
                    "tests skip, and the *_uring suites run on the epoll fallback",
                    strerror(err));
        cr_skip_test("io_uring unavailable: %s", strerror(err));
    }
    setenv("FERRY_IO", "uring", 1);
    tu_loop_setup();
}

#define T(name) Test(uring, name, .init = uring_setup, .fini = tu_loop_teardown, .timeout = 30.)

/* ---- helpers --------------------------------------------------------------- */

static int sp[2];       /* sp[0]: the stream's; sp[1]: the peer's */
static ferry_stream *S; /* the stream over sp[0] */

static struct {
    int rc[8];
    size_t n[8];
    char buf[8][256];
} g;

static void pair(void)
{
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
    cr_assert_eq(ferry_stream_open(&S, tu_loop, sp[0], NULL), 0);
}

static ferry_loop_stats stats(void)
{
    ferry_loop_stats st;

    ferry_loop_stats_get(tu_loop, &st);
    return st;
}

/* Let the loop poll until it has reaped more than `before` completions
 * (a bounded number of turns: no sleeping). */
static void until_completions(uint64_t before)
{
    for (int i = 0; i < 20000 && stats().io_completions <= before; i++)
        ferry_yield();
}

/* ---- the backend in use, and the fallback ---------------------------------- */

static int echo_task(void *arg)
{
    (void)arg;
    if (write(sp[1], "ping", 4) != 4)
        return -1;
    g.rc[0] = ferry_stream_read_exactly(S, g.buf[0], 4, NULL);
    g.rc[1] = ferry_stream_write(S, "pong", 4, NULL);
    return 0;
}

T(the_backend_is_io_uring_and_completes_operations)
{
    ferry_loop_stats st;

    memset(&g, 0, sizeof g);
    pair();
    cr_assert_eq(tu_run(echo_task, NULL), 0);
    cr_assert_eq(g.rc[0], 0);
    cr_assert_eq(memcmp(g.buf[0], "ping", 4), 0);
    cr_assert_eq(g.rc[1], 0);
    cr_assert_eq(read(sp[1], g.buf[1], 4), 4);
    cr_assert_eq(memcmp(g.buf[1], "pong", 4), 0);
    st = stats();
    cr_assert_str_eq(st.io_backend, "io_uring", "fell back: %s",
                     st.io_fallback ? st.io_fallback : "?");
    cr_assert_null(st.io_fallback);
    cr_assert_gt(st.io_completions, 0);
    cr_assert_gt(st.io_submits, 0);
    cr_assert_eq(S->reg.mode, FERRY__IO_URING);
    ferry_stream_close(S);
    close(sp[1]);
}

/* The kernel has the multishot receive's byte cap (Linux 6.17). */
static bool kernel_has_capped_multishot(void)
{
    struct utsname u;
    int major = 0, minor = 0;

    if (uname(&u) != 0 || sscanf(u.release, "%d.%d", &major, &minor) != 2)
        return false;
    return major > 6 || (major == 6 && minor >= 17);
}

#define PINGS 200

static int pingpong_task(void *arg)
{
    char b[8];

    (void)arg;
    for (int i = 0; i < PINGS; i++) {
        if (write(sp[1], "ping", 4) != 4)
            return -1;
        g.rc[0] = ferry_stream_read_exactly(S, b, 4, NULL);
        if (g.rc[0] || memcmp(b, "ping", 4) != 0)
            return -2;
        g.n[0]++;
    }
    return 0;
}

/* Where the kernel caps a multishot receive, one receive stays armed from
 * one message to the next: far fewer receives are armed than messages
 * arrive.  Elsewhere none is multishot, and the stream reads the same. */
T(one_multishot_receive_serves_many_messages)
{
    ferry_loop_stats st;

    memset(&g, 0, sizeof g);
    pair();
    cr_assert_eq(tu_run(pingpong_task, NULL), 0);
    cr_assert_eq(g.n[0], PINGS);
    st = stats();
    if (kernel_has_capped_multishot()) {
        cr_assert_gt(st.io_recv_multishot, 0);
        /* 800 bytes fit under one receive's cap: the few more are
         * re-arms after a receive the kernel ended on its own. */
        cr_assert_lt(st.io_recv_multishot, PINGS / 10, "%llu receives armed for %d messages",
                     (unsigned long long)st.io_recv_multishot, PINGS);
    } else {
        cr_assert_eq(st.io_recv_multishot, 0);
    }
    cr_assert_eq(st.io_bufs_held, 0, "every byte was read: no buffer held");
    ferry_stream_close(S);
    close(sp[1]);
}

Test(uring, without_the_variable_the_loop_uses_epoll, .fini = tu_loop_teardown, .timeout = 30.)
{
    ferry_loop_stats st;

    unsetenv("FERRY_IO");
    tu_loop_setup();
    memset(&g, 0, sizeof g);
    pair();
    st = stats();
    cr_assert_str_eq(st.io_backend, "epoll");
    cr_assert_null(st.io_fallback);
    cr_assert_eq(S->reg.mode, FERRY__IO_EPOLL);
    cr_assert_eq(tu_run(echo_task, NULL), 0);
    cr_assert_eq(g.rc[0], 0);
    cr_assert_eq(stats().io_completions, 0);
    ferry_stream_close(S);
    close(sp[1]);
}

/* The ring cannot be made (here: no memory for it): the loop says why in
 * its statistics and works on epoll. */
T(a_ring_that_cannot_be_made_falls_back_to_epoll)
{
    ferry_loop_stats st;
    unsigned long nth;
    int rc = -ENOMEM;

    memset(&g, 0, sizeof g);
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
    /* Fail the first fault point inside the ring's setup: the points
     * before it (the netloop) fail the open with -ENOMEM first. */
    for (nth = 1; nth < 10; nth++) {
        ferry__fault_arm(nth, false);
        rc = ferry_stream_open(&S, tu_loop, sp[0], NULL);
        if (ferry__fault_hits() && ferry__fault_last_site() &&
            strcmp(ferry__fault_last_site(), "uring_setup") == 0)
            break;
        cr_assert_eq(rc, -ENOMEM, "point %lu: %d", nth, rc);
    }
    ferry__fault_reset();
    cr_assert_eq(rc, 0, "the open went on without the ring: %d", rc);
    st = stats();
    cr_assert_str_eq(st.io_backend, "epoll");
    cr_assert_not_null(st.io_fallback);
    cr_assert_eq(st.io_fallback_err, ENOMEM);
    cr_assert_eq(S->reg.mode, FERRY__IO_EPOLL);
    cr_assert_eq(tu_run(echo_task, NULL), 0);
    cr_assert_eq(g.rc[0], 0);
    ferry_stream_close(S);
    close(sp[1]);
}

/* ---- cancel safety ----------------------------------------------------------- */

static int reader_task(void *arg)
{
    (void)arg;
    g.rc[0] = ferry_stream_read(S, g.buf[0], sizeof g.buf[0], &g.n[0]);
    return 0;
}

/* The bytes arrive and are completed into the stream while its reader is
 * being cancelled: whichever wins, they reach a read exactly once. */
static int cancelled_read_main(void *arg)
{
    ferry_task *r;
    uint64_t before;
    size_t got = 0, n;

    (void)arg;
    r = tu_spawn(reader_task, NULL);
    tu_settle(); /* the reader waits, its receive armed */
    before = stats().io_completions;
    if (write(sp[1], "abcdef", 6) != 6)
        return -1;
    until_completions(before); /* the kernel has answered: bytes queued */
    ferry_task_cancel(r);
    tu_join(r);
    if (g.rc[0] == 0) {
        memcpy(g.buf[2], g.buf[0], g.n[0]);
        got = g.n[0];
    }
    while (got < 6) {
        ferry_scope sc;

        ferry_scope_enter(&sc, ferry_now() + tu_ms(5000), 0);
        g.rc[1] = ferry_stream_read(S, g.buf[2] + got, sizeof g.buf[2] - got, &n);
        ferry_scope_exit(&sc);
        if (g.rc[1])
            break;
        got += n;
    }
    g.n[2] = got;
    return 0;
}

T(a_cancelled_read_leaves_the_completed_bytes_for_the_next_read)
{
    memset(&g, 0, sizeof g);
    pair();
    cr_assert_eq(tu_run(cancelled_read_main, NULL), 0);
    cr_assert(g.rc[0] == -ECANCELED || g.rc[0] == 0, "the reader: %d", g.rc[0]);
    cr_assert_eq(g.rc[1], 0, "the next read: %d", g.rc[1]);
    cr_assert_eq(g.n[2], 6);
    cr_assert_eq(memcmp(g.buf[2], "abcdef", 6), 0);
    ferry_stream_close(S);
    close(sp[1]);
}

static int line_task(void *arg)
{
    (void)arg;
    g.rc[0] = ferry_stream_read_until(S, "\n", 1, g.buf[0], sizeof g.buf[0], &g.n[0]);
    return 0;
}

/* A line read cancelled with half a line in: the half stays, and the
 * next line read returns the whole line. */
static int cancelled_line_main(void *arg)
{
    ferry_task *r;
    ferry_scope sc;
    uint64_t before;

    (void)arg;
    r = tu_spawn(line_task, NULL);
    tu_settle();
    before = stats().io_completions;
    if (write(sp[1], "hel", 3) != 3)
        return -1;
    until_completions(before);
    tu_settle(); /* the reader has taken "hel" and waits for the rest */
    ferry_task_cancel(r);
    tu_join(r);
    if (write(sp[1], "lo\nnext\n", 8) != 8)
        return -1;
    ferry_scope_enter(&sc, ferry_now() + tu_ms(5000), 0);
    g.rc[1] = ferry_stream_read_until(S, "\n", 1, g.buf[1], sizeof g.buf[1], &g.n[1]);
    g.rc[2] = ferry_stream_read_until(S, "\n", 1, g.buf[2], sizeof g.buf[2], &g.n[2]);
    ferry_scope_exit(&sc);
    return 0;
}

T(a_cancelled_line_read_keeps_the_half_line)
{
    memset(&g, 0, sizeof g);
    pair();
    cr_assert_eq(tu_run(cancelled_line_main, NULL), 0);
    cr_assert_eq(g.rc[0], -ECANCELED, "the first line read: %d", g.rc[0]);
    cr_assert_eq(g.rc[1], 0, "%d", g.rc[1]);
    cr_assert_eq(g.n[1], 6);
    cr_assert_eq(memcmp(g.buf[1], "hello\n", 6), 0);
    cr_assert_eq(g.rc[2], 0);
    cr_assert_eq(g.n[2], 5);
    cr_assert_eq(memcmp(g.buf[2], "next\n", 5), 0);
    ferry_stream_close(S);
    close(sp[1]);
}

static ferry_listener *L;

static int acceptor_task(void *arg)
{
    ferry_stream *s = NULL;

    (void)arg;
    g.rc[0] = ferry_listener_accept(L, &s, NULL);
    if (s)
        ferry_stream_close(s);
    return 0;
}

/* A connection accepted by the kernel while the accepting task is being
 * cancelled: the next accept gets it, with its bytes. */
static int cancelled_accept_main(void *arg)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    ferry_stream *s = NULL;
    ferry_task *r;
    ferry_scope sc;
    uint64_t before;
    int c;

    (void)arg;
    a.sin_port = htons((uint16_t)ferry_listener_port(L));
    r = tu_spawn(acceptor_task, NULL);
    tu_settle();
    before = stats().io_completions;
    c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a) != 0 || write(c, "hi", 2) != 2)
        return -1;
    until_completions(before);
    ferry_task_cancel(r);
    tu_join(r);
    ferry_scope_enter(&sc, ferry_now() + tu_ms(5000), 0);
    if (g.rc[0] == -ECANCELED) {
        g.rc[1] = ferry_listener_accept(L, &s, NULL);
        if (!g.rc[1])
            g.rc[2] = ferry_stream_read_exactly(s, g.buf[2], 2, NULL);
        if (s)
            ferry_stream_close(s);
    }
    ferry_scope_exit(&sc);
    close(c);
    return 0;
}

T(a_cancelled_accept_leaves_the_connection_for_the_next_accept)
{
    memset(&g, 0, sizeof g);
    cr_assert_eq(ferry_tcp_listen(&L, tu_loop, "127.0.0.1", 0, NULL), 0);
    cr_assert_eq(tu_run(cancelled_accept_main, NULL), 0);
    if (g.rc[0] == -ECANCELED) {
        cr_assert_eq(g.rc[1], 0, "the next accept: %d", g.rc[1]);
        cr_assert_eq(g.rc[2], 0);
        cr_assert_eq(memcmp(g.buf[2], "hi", 2), 0);
    } else {
        cr_assert_eq(g.rc[0], 0, "the accept won the race: %d", g.rc[0]);
    }
    ferry_listener_close(L);
}

#define BURSTN 100

static int burst_main(void *arg)
{
    bool *seen = arg;

    for (int i = 0; i < BURSTN; i++) {
        ferry_stream *s = NULL;
        uint32_t k;

        g.rc[0] = ferry_listener_accept(L, &s, NULL);
        if (g.rc[0])
            return 0;
        g.rc[1] = ferry_stream_read_exactly(s, &k, sizeof k, NULL);
        ferry_stream_close(s);
        if (g.rc[1] || k >= BURSTN || seen[k])
            return -1;
        seen[k] = true;
        g.n[0]++;
    }
    return 0;
}

/* A backlog of connections queued before the first accept: the kernel
 * takes them all at once, past the listener's queue (which grows), and
 * every one is accepted, once, with its bytes; one multishot accept (a
 * few) served them all. */
T(a_backlog_of_connections_is_accepted_whole)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    static bool seen[BURSTN];
    int c[BURSTN];
    ferry_loop_stats st;

    memset(&g, 0, sizeof g);
    memset(seen, 0, sizeof seen);
    cr_assert_eq(ferry_tcp_listen(&L, tu_loop, "127.0.0.1", 0, NULL), 0);
    a.sin_port = htons((uint16_t)ferry_listener_port(L));
    for (uint32_t i = 0; i < BURSTN; i++) {
        c[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        cr_assert_geq(c[i], 0);
        cr_assert_eq(connect(c[i], (struct sockaddr *)&a, sizeof a), 0);
        cr_assert_eq(write(c[i], &i, sizeof i), (ssize_t)sizeof i);
    }
    cr_assert_eq(tu_run(burst_main, seen), 0);
    cr_assert_eq(g.rc[0], 0, "accept: %d", g.rc[0]);
    cr_assert_eq(g.n[0], BURSTN);
    st = stats();
    cr_assert_gt(st.io_accept_multishot, 0);
    cr_assert_lt(st.io_accept_multishot, BURSTN / 10, "%llu accepts armed for %d connections",
                 (unsigned long long)st.io_accept_multishot, BURSTN);
    for (int i = 0; i < BURSTN; i++)
        close(c[i]);
    ferry_listener_close(L);
}

/* ---- closing with operations in flight -------------------------------------- */

#define NCLOSE 8

static ferry_stream *cs[NCLOSE];
static int cpeer[NCLOSE];

static int blocked_writer(void *arg)
{
    static char big[1 << 20];
    ferry_stream *s = arg;

    ferry_stream_write(s, big, sizeof big, NULL);
    return 0;
}

static int close_in_flight_main(void *arg)
{
    ferry_task *t[2 * NCLOSE];

    (void)arg;
    for (int i = 0; i < NCLOSE; i++) {
        t[2 * i] = tu_spawn(blocked_writer, cs[i]);
        t[2 * i + 1] = NULL;
    }
    tu_settle(); /* receives armed by nobody, sends in flight */
    for (int i = 0; i < NCLOSE; i++)
        ferry_stream_close(cs[i]);
    for (int i = 0; i < NCLOSE; i++)
        tu_join(t[2 * i]);
    return 0;
}

T(close_with_operations_in_flight_leaves_no_descriptor)
{
    static char b[65536];
    int before, fds[2];

    memset(&g, 0, sizeof g);
    pair(); /* the ring exists before the count */
    before = tu_open_fds();
    for (int i = 0; i < NCLOSE; i++) {
        tu_tcp_pair(fds);
        cpeer[i] = fds[1];
        cr_assert_eq(ferry_stream_open(&cs[i], tu_loop, fds[0], NULL), 0);
    }
    cr_assert_eq(tu_run(close_in_flight_main, NULL), 0);
    /* The peers see the end: the kernel let go of every socket. */
    for (int i = 0; i < NCLOSE; i++) {
        ssize_t k;

        do
            k = read(cpeer[i], b, sizeof b);
        while (k > 0);
        cr_assert_eq(k, 0, "peer %d: %zd", i, k);
        close(cpeer[i]);
    }
    cr_assert_eq(tu_open_fds(), before);
    ferry_stream_close(S);
    close(sp[1]);
}

/* ---- the cap on buffers per connection ---------------------------------------- */

static int flood_main(void *arg)
{
    ferry_stream *quiet = arg;
    ferry_scope sc;
    uint64_t before;
    char c;

    /* The flooded stream's receive is armed by a read of one byte; its
     * reader then stops reading. */
    ferry_scope_enter(&sc, ferry_now() + tu_ms(5000), 0);
    g.rc[0] = ferry_stream_read(S, &c, 1, &g.n[0]);
    /* Polls, for the flooded stream to take buffers if it could. */
    for (int i = 0; i < 5; i++) {
        before = stats().io_completions;
        until_completions(before);
    }
    g.n[2] = stats().io_bufs_held;
    g.rc[1] = ferry_stream_read_exactly(quiet, g.buf[1], 5, NULL);
    ferry_scope_exit(&sc);
    return 0;
}

/* One peer fills its socket (megabytes on loopback) while the stream's
 * reader reads nothing: the stream holds at most its cap of the loop's
 * buffers, no receive finds the ring empty, and another connection still
 * receives. */
T(a_flooding_peer_cannot_take_every_buffer)
{
    static char chunk[65536];
    ferry_stream *quiet;
    int fds[2], q[2], fl;
    size_t sent = 0;
    ssize_t k;

    memset(&g, 0, sizeof g);
    tu_tcp_pair(fds);
    sp[1] = fds[1];
    cr_assert_eq(ferry_stream_open(&S, tu_loop, fds[0], NULL), 0);
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, q), 0);
    cr_assert_eq(ferry_stream_open(&quiet, tu_loop, q[0], NULL), 0);
    fl = fcntl(sp[1], F_GETFL);
    fcntl(sp[1], F_SETFL, fl | O_NONBLOCK);
    while ((k = write(sp[1], chunk, sizeof chunk)) > 0)
        sent += (size_t)k;
    cr_assert_gt(sent, 2u << 20, "the flood fits the buffers: %zu bytes", sent);
    cr_assert_eq(write(q[1], "quiet", 5), 5);
    cr_assert_eq(tu_run(flood_main, quiet), 0);
    cr_assert_eq(g.rc[0], 0);
    cr_assert_eq(g.rc[1], 0, "the other connection: %d", g.rc[1]);
    cr_assert_eq(memcmp(g.buf[1], "quiet", 5), 0);
    cr_assert_eq(stats().io_buf_empty, 0, "a receive found the ring empty");
    cr_assert_leq(g.n[2], 2, "the flooded stream holds %zu buffers", g.n[2]);
    ferry_stream_close(quiet);
    close(q[1]);
    ferry_stream_close(S);
    close(sp[1]);
}

static int read_one(void *arg)
{
    char c;

    (void)arg;
    g.rc[0] = ferry_stream_read_exactly(S, &c, 1, NULL);
    return 0;
}

static int poll_a_while(void *arg)
{
    (void)arg;
    for (int i = 0; i < 5; i++)
        until_completions(stats().io_completions);
    g.n[2] = stats().io_bufs_held;
    return 0;
}

/* A stream whose reader has stopped keeps its receive armed (a multishot
 * one, where the kernel caps them); a flood then fills two of the loop's
 * buffers (one with single receives) and no more. */
T(a_stream_nobody_reads_holds_at_most_two_buffers)
{
    static char chunk[65536];
    size_t sent = 0;
    ssize_t k;

    memset(&g, 0, sizeof g);
    pair();
    cr_assert_eq(write(sp[1], "x", 1), 1);
    cr_assert_eq(tu_run(read_one, NULL), 0);
    cr_assert_eq(g.rc[0], 0);
    fcntl(sp[1], F_SETFL, fcntl(sp[1], F_GETFL) | O_NONBLOCK);
    while ((k = write(sp[1], chunk, sizeof chunk)) > 0)
        sent += (size_t)k;
    cr_assert_gt(sent, 65536u);
    cr_assert_eq(tu_run(poll_a_while, NULL), 0);
    cr_assert_geq(g.n[2], 1, "the armed receive took nothing");
    cr_assert_leq(g.n[2], 2, "the stream holds %zu buffers", g.n[2]);
    cr_assert_eq(stats().io_buf_empty, 0);
    ferry_stream_close(S);
    close(sp[1]);
    cr_assert_eq(stats().io_bufs_held, 0, "a closed stream gave its buffers back");
}

/* ---- -ENOMEM ------------------------------------------------------------------ */

/* Every fault point of opening a stream and a listener on a loop that has
 * its ring fails the call with -ENOMEM, leaves the descriptor the
 * caller's, and leaks nothing (the teardown counts). */
T(opening_on_the_ring_fails_cleanly_without_memory)
{
    ferry_listener *l = NULL;
    unsigned long nth;
    int rc = -ENOMEM, fds[2];

    pair(); /* the ring is made */
    cr_assert_str_eq(stats().io_backend, "io_uring");
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    for (nth = 1; nth < 20; nth++) {
        ferry_stream *s;

        ferry__fault_arm(nth, false);
        rc = ferry_stream_open(&s, tu_loop, fds[0], NULL);
        if (!ferry__fault_hits()) {
            cr_assert_eq(rc, 0);
            ferry_stream_close(s);
            break;
        }
        cr_assert_eq(rc, -ENOMEM, "point %lu: %d", nth, rc);
        cr_assert_geq(fcntl(fds[0], F_GETFD), 0, "the descriptor stays the caller's");
    }
    ferry__fault_reset();
    cr_assert_gt(nth, 1, "no fault point was reached");
    for (nth = 1; nth < 20; nth++) {
        ferry__fault_arm(nth, false);
        rc = ferry_tcp_listen(&l, tu_loop, "127.0.0.1", 0, NULL);
        if (!ferry__fault_hits()) {
            cr_assert_eq(rc, 0);
            ferry_listener_close(l);
            break;
        }
        cr_assert_eq(rc, -ENOMEM, "listen, point %lu: %d", nth, rc);
    }
    ferry__fault_reset();
    close(fds[1]);
    ferry_stream_close(S);
    close(sp[1]);
}
