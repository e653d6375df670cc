/* stress_conns.c - 10,000 connections open at once, each served by a task
 * of its own on one loop, echoing lines; a slow peer that sends a byte
 * every 100 ms holds nothing else up; everything is given back.
 *
 * The clients run in a forked child with plain blocking sockets (each side
 * needs a descriptor per connection, and one process could not hold both
 * ends under the usual hard limit); the slow peer is a task of the test's
 * own loop, a client of the same server.  The soft limit on descriptors is
 * raised to the hard one first; the test is skipped, saying so, where the
 * hard limit is too low.  FERRY_STRESS_SCALE scales the number of
 * connections in slow builds (at least 100).
 *
 * The slow peer connects first and sends one byte of a line every 100 ms.
 * Then the child opens every other connection (they are all open at once
 * from then until the end), sends a line on each and reads its echo, and
 * reports; only then does the slow peer end its line and read its echo.
 * A server that let the slow connection hold anything up would never
 * answer the others (the child's alarm ends the test).  The
 * parent checks how many connection tasks were alive at once, that each
 * ended at the end of its stream, and (the teardown) that no allocation is
 * left.
 */
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "testutil.h"

/* What the child reports through its pipe. */
struct result {
    int  connected;      /* connections made */
    int  echoed;         /* connections whose echo came back right */
    char why[200];       /* the first thing that went wrong */
};

static int g_n;                  /* fast connections */
static int g_port;
static ferry_listener *g_lis;
static int g_live, g_peak, g_accepted, g_ended, g_bad_end;

/* ---- the server (this process) ---------------------------------------------- */

static int conn_task(void *arg)
{
    ferry_stream *s = arg;
    char line[4096];
    size_t n = 0;
    int rc;

    if (++g_live > g_peak)
        g_peak = g_live;
    for (;;) {
        rc = ferry_stream_read_until(s, "\n", 1, line, sizeof line, &n);
        if (rc)
            break;
        rc = ferry_stream_write(s, line, n, NULL);
        if (rc)
            break;
    }
    if (rc != -ENODATA || n != 0)
        g_bad_end++;
    ferry_stream_close(s);
    g_live--;
    g_ended++;
    return 0;
}

static int acceptor_task(void *arg)
{
    (void)arg;
    for (;;) {
        ferry_stream *s;
        int rc = ferry_listener_accept(g_lis, &s, NULL);

        if (rc == -ECANCELED)
            return 0;
        if (rc) {
            g_bad_end++;
            ferry_sleep(FERRY_MSEC(1));
            continue;
        }
        g_accepted++;
        if (ferry_task_spawn(NULL, NULL, conn_task, s, NULL) != 0) {
            g_bad_end++;
            ferry_stream_close(s);
        }
    }
}

/* ---- the slow peer (a task here) and the clients (the forked child) ------- */

static bool g_slow_stop;
static int g_slow_sent, g_slow_rc;
static bool g_slow_ok;

static int slow_task(void *arg)
{
    ferry_stream *s;
    char got[4096];
    size_t n = 0;

    (void)arg;
    g_slow_rc = ferry_tcp_connect(&s, "127.0.0.1", g_port, NULL);
    if (g_slow_rc)
        return 0;
    while (!g_slow_stop && g_slow_sent < 2000) {
        if ((g_slow_rc = ferry_stream_write(s, "s", 1, NULL)) != 0)
            break;
        g_slow_sent++;
        ferry_sleep(FERRY_MSEC(100));
    }
    if (!g_slow_rc)
        g_slow_rc = ferry_stream_write(s, "\n", 1, NULL);
    if (!g_slow_rc)
        g_slow_rc = ferry_stream_read_until(s, "\n", 1, got, sizeof got, &n);
    g_slow_ok = !g_slow_rc && n == (size_t)g_slow_sent + 1;
    for (size_t j = 0; g_slow_ok && j + 1 < n; j++)
        g_slow_ok = got[j] == 's';
    ferry_stream_close(s);
    return 0;
}

static int connect_to(int port)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* Read a line of at most max bytes (blocking). */
static ssize_t read_line(int fd, char *buf, size_t max)
{
    size_t got = 0;

    while (got < max) {
        ssize_t k = read(fd, buf + got, 1);
        if (k <= 0)
            return -1;
        if (buf[got++] == '\n')
            return (ssize_t)got;
    }
    return -1;
}

static void client(int n, int port, struct result *r)
{
    int *fds = calloc((size_t)n, sizeof *fds);
    char want[32], got[64];
    ssize_t k;
    int i, len;

    if (!fds) {
        snprintf(r->why, sizeof r->why, "out of memory");
        return;
    }
    for (i = 0; i < n; i++) {
        if ((fds[i] = connect_to(port)) < 0) {
            snprintf(r->why, sizeof r->why, "connect %d: %s", i, strerror(errno));
            return;
        }
        r->connected++;
    }
    for (i = 0; i < n; i++) {
        len = snprintf(want, sizeof want, "hello %d\n", i);
        if (write(fds[i], want, (size_t)len) != len) {
            snprintf(r->why, sizeof r->why, "write %d: %s", i, strerror(errno));
            break;
        }
    }
    for (i = 0; i < n && !r->why[0]; i++) {
        len = snprintf(want, sizeof want, "hello %d\n", i);
        k = read_line(fds[i], got, sizeof got);
        if (k != len || memcmp(got, want, (size_t)len) != 0)
            snprintf(r->why, sizeof r->why, "connection %d: echo %zd bytes, not '%.*s'", i, k,
                     len - 1, want);
        else
            r->echoed++;
    }
    for (i = 0; i < n; i++)
        close(fds[i]);
    free(fds);
}

/* ---- the test ------------------------------------------------------------------- */

static int main_task(void *arg)
{
    struct result *r = arg;
    ferry_stream *res;
    ferry_task *acc, *slow;
    int64_t until;
    pid_t pid;
    int p[2], st;
    size_t got = 0;

    if (ferry_tcp_listen(&g_lis, NULL, "127.0.0.1", 0,
                         &(ferry_listen_opts){ .stream.read_buffer = 256 }) != 0)
        return -1;
    g_port = ferry_listener_port(g_lis);
    ferry_task_spawn(&acc, NULL, acceptor_task, NULL, NULL);
    ferry_task_spawn(&slow, NULL, slow_task, NULL, NULL);
    while (g_slow_sent == 0 && g_slow_rc == 0)
        ferry_sleep(FERRY_MSEC(1));
    if (pipe(p) != 0)
        return -2;
    pid = fork();
    if (pid < 0)
        return -3;
    if (pid == 0) {
        struct result cr;
        memset(&cr, 0, sizeof cr);
        close(p[0]);
        alarm((unsigned)(60 * tu_time_mult()));
        client(g_n, g_port, &cr);
        if (write(p[1], &cr, sizeof cr) != (ssize_t)sizeof cr)
            _exit(3);
        _exit(0);
    }
    close(p[1]);
    /* The child's report, read through a stream: the loop serves the
     * connections meanwhile. */
    if (ferry_stream_open(&res, NULL, p[0], NULL) != 0)
        return -4;
    ferry_stream_read_exactly(res, r, sizeof *r, &got);
    ferry_stream_close(res);
    if (got != sizeof *r)
        snprintf(r->why, sizeof r->why, "the child ended without a report (killed by its alarm?)");
    /* Every other connection was answered while the slow line was still
     * coming: now it ends. */
    g_slow_stop = true;
    ferry_task_join(slow, NULL);
    /* The child closed every connection: each task sees the end. */
    until = ferry_now() + tu_ms(60000);
    while (g_ended < g_accepted && ferry_now() < until)
        ferry_sleep(FERRY_MSEC(10));
    ferry_task_cancel(acc);
    ferry_task_join(acc, NULL);
    ferry_listener_close(g_lis);
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return 0;
}

Test(stress_conns, ten_thousand_connections_echo_and_a_slow_peer_holds_nothing_up,
     .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 900.)
{
    const char *sc = getenv("FERRY_STRESS_SCALE");
    double scale = sc ? atof(sc) : 1.0;
    struct rlimit rl, old;
    struct result r;

    g_n = (int)(10000 * (scale > 0 && scale <= 1 ? scale : 1.0));
    if (g_n < 100)
        g_n = 100;
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &old), 0);
    rl = old;
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < (rlim_t)g_n + 200)
        cr_skip_test("the hard limit on descriptors is %llu: %d connections need %d",
                     (unsigned long long)rl.rlim_max, g_n, g_n + 200);
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY ? (rlim_t)g_n + 1000 : rl.rlim_max;
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
    memset(&r, 0, sizeof r);
    g_live = g_peak = g_accepted = g_ended = g_bad_end = 0;
    g_slow_stop = g_slow_ok = false;
    g_slow_sent = g_slow_rc = 0;
    cr_assert_eq(tu_run(main_task, &r), 0);
    setrlimit(RLIMIT_NOFILE, &old);
    fprintf(stderr, "stress_conns: %d connections: %d made, %d echoed, peak %d tasks at once, "
            "the slow peer sent %d bytes meanwhile\n", g_n + 1, r.connected + 1, r.echoed, g_peak,
            g_slow_sent);
    cr_assert_eq(r.why[0], 0, "%s", r.why);
    cr_assert_eq(r.connected, g_n);
    cr_assert_eq(r.echoed, g_n);
    cr_assert_eq(g_slow_rc, 0, "the slow peer: %d", g_slow_rc);
    cr_assert(g_slow_ok, "the slow line's echo (%d bytes) did not come back right", g_slow_sent);
    cr_assert_eq(g_accepted, g_n + 1);
    cr_assert_eq(g_peak, g_n + 1, "connection tasks alive at once: %d", g_peak);
    cr_assert_eq(g_ended, g_accepted, "%d of %d connection tasks ended", g_ended, g_accepted);
    cr_assert_eq(g_bad_end, 0, "%d connections did not end at the end of their stream", g_bad_end);
}
