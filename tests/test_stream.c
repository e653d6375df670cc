/* test_stream.c - buffered streams (ferry/stream.h): every call's contract
 * and bad input, all-or-nothing reads under cancellation and deadlines,
 * writes that report what went out, backpressure, closing while tasks
 * wait (and the descriptor's number reused at once), SIGPIPE, resets, the
 * end of the stream mid-frame, and the level-triggered fallback.
 *
 * Most tests run over a socketpair: sp[0] belongs to the stream, the test
 * plays the peer on sp[1] with plain system calls.  Every read that a
 * broken stream could leave hanging runs under a deadline scope, so the
 * test reports -ETIMEDOUT instead of hitting the runner's timeout.  No
 * cr_assert inside task bodies (see testutil.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <event2/event.h>
#include <criterion/criterion.h>

#include "testutil.h"
#include "stream_int.h"

/* FERRY_TEST_IO_LIBEVENT=1 (a second ctest run): every stream registered
 * through libevent instead of the loop's epoll set. */
__attribute__((constructor)) static void io_path(void)
{
    if (getenv("FERRY_TEST_IO_LIBEVENT"))
        ferry__io_use_libevent = true;
}

#define T(name) Test(stream, name, .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)

/* ---- helpers --------------------------------------------------------------- */

static int sp[2];            /* sp[0]: the stream's; sp[1]: the peer's */
static ferry_stream *S;      /* the stream over sp[0] */

static void pair(const ferry_stream_opts *opts)
{
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
    cr_assert_eq(ferry_stream_open(&S, tu_loop, sp[0], opts), 0);
}

/* The peer writes `s` (blocking, small). */
static void peer_put(const char *s)
{
    size_t len = strlen(s);
    cr_assert_eq(write(sp[1], s, len), (ssize_t)len);
}

/* Same, from a task (no cr_assert there). */
static int task_put(const char *s)
{
    size_t len = strlen(s);
    return write(sp[1], s, len) == (ssize_t)len ? 0 : -1;
}

/* Everything the peer can read now, without waiting. */
static size_t peer_drain(char *buf, size_t max)
{
    size_t got = 0;
    ssize_t k;

    while (got < max && (k = recv(sp[1], buf + got, max - got, MSG_DONTWAIT)) > 0)
        got += (size_t)k;
    return got;
}

static ferry_scope g_scope;

static void bound(int64_t ms)
{
    ferry_scope_enter(&g_scope, ferry_now() + tu_ms(ms), 0);
}

static void unbound(void)
{
    ferry_scope_exit(&g_scope);
}

/* A task that sleeps `ms`, then the peer writes `text`. */
struct later {
    int64_t     ms;
    const char *text;
    int         rc;
};

static int later_task(void *arg)
{
    struct later *l = arg;

    l->rc = ferry_sleep(tu_ms(l->ms));
    if (l->rc == 0)
        l->rc = task_put(l->text);
    return 0;
}

/* ---- open ---------------------------------------------------------------------- */

static void *open_from_thread(void *arg)
{
    ferry_stream *s = (ferry_stream *)1;
    *(int *)arg = ferry_stream_open(&s, NULL, sp[0], NULL);
    return s == NULL ? arg : NULL;
}

T(open_refuses_what_is_not_a_stream)
{
    char path[] = "/tmp/ferry-stream-XXXXXX";
    ferry_stream *s = (ferry_stream *)1;
    int fd, udp, dead[2], rc = 0;
    pthread_t th;
    void *ret;

    cr_assert_eq(ferry_stream_open(NULL, tu_loop, 0, NULL), -EINVAL);
    cr_assert_eq(ferry_stream_open(&s, tu_loop, -1, NULL), -EINVAL);
    cr_assert_null(s, "*out is NULL after an error");
    fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    unlink(path);
    cr_assert_eq(ferry_stream_open(&s, tu_loop, fd, NULL), -EINVAL, "a regular file");
    close(fd);
    fd = open("/", O_RDONLY | O_DIRECTORY);
    cr_assert_eq(ferry_stream_open(&s, tu_loop, fd, NULL), -EINVAL, "a directory");
    close(fd);
    udp = socket(AF_INET, SOCK_DGRAM, 0);
    cr_assert_eq(ferry_stream_open(&s, tu_loop, udp, NULL), -EINVAL, "a datagram socket");
    close(udp);
    cr_assert_eq(pipe(dead), 0);
    close(dead[0]);
    close(dead[1]);
    cr_assert_eq(ferry_stream_open(&s, tu_loop, dead[0], NULL), -EBADF, "a closed descriptor");
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
    cr_assert_eq(ferry_stream_open(&s, tu_loop, sp[0], &(ferry_stream_opts){ .flags = 0x100 }),
                 -EINVAL, "an unknown flag");
    cr_assert_eq(fcntl(sp[0], F_GETFL) & O_NONBLOCK, 0, "an error leaves the descriptor as it was");
    th = tu_start_thread(open_from_thread, &rc);
    pthread_join(th, &ret);
    cr_assert_eq(rc, -EINVAL, "from a thread without a loop: %d", rc);
    cr_assert_not_null(ret, "*out is NULL after -EINVAL");
    close(sp[0]);
    close(sp[1]);
}

/* epoll refuses /dev/null (it cannot be polled): -EINVAL, not -ENOMEM. */
T(open_of_a_descriptor_epoll_refuses_is_einval)
{
    ferry_stream *s;
    int fd = open("/dev/null", O_RDWR);

    cr_assert_geq(fd, 0);
    cr_assert_eq(ferry_stream_open(&s, tu_loop, fd, NULL), -EINVAL);
    cr_assert_eq(fcntl(fd, F_GETFD) >= 0, 1, "the descriptor stays open, the caller's");
    close(fd);
}

/* ---- reads --------------------------------------------------------------------- */

static struct {
    int    rc[8];
    size_t n[8];
    char   buf[8][256];
    size_t buffered[8];
} g;

static int lines_task(void *arg)
{
    (void)arg;
    bound(5000);
    for (int i = 0; i < 3; i++) {
        g.rc[i] = ferry_stream_read_until(S, "\n", 1, g.buf[i], sizeof g.buf[i], &g.n[i]);
        g.buffered[i] = ferry_stream_buffered(S);
    }
    unbound();
    return 0;
}

/* Three lines written at once: one read of the descriptor takes them all,
 * and the next lines come out of the buffer. */
T(lines_come_from_one_read_of_the_descriptor)
{
    memset(&g, 0, sizeof g);
    pair(NULL);
    peer_put("alpha\nbe\ngamma!\n");
    cr_assert_eq(tu_run(lines_task, NULL), 0);
    cr_assert_eq(g.rc[0], 0);
    cr_assert_eq(g.n[0], 6);
    cr_assert_eq(memcmp(g.buf[0], "alpha\n", 6), 0);
    cr_assert_eq(g.buffered[0], 10, "after the first line, the other two are buffered");
    cr_assert_eq(g.rc[1], 0);
    cr_assert_eq(g.n[1], 3);
    cr_assert_eq(memcmp(g.buf[1], "be\n", 3), 0);
    cr_assert_eq(g.rc[2], 0);
    cr_assert_eq(g.n[2], 7);
    cr_assert_eq(memcmp(g.buf[2], "gamma!\n", 7), 0);
    cr_assert_eq(g.buffered[2], 0);
    cr_assert_eq(ferry_stream_close(S), 0);
    close(sp[1]);
}

static int split_delim_task(void *arg)
{
    struct later l1 = { 20, "two words\r", 1 }, l2 = { 40, "\nnext\r\n", 1 };
    ferry_task *t1, *t2;

    (void)arg;
    ferry_task_spawn(&t1, NULL, later_task, &l1, NULL);
    ferry_task_spawn(&t2, NULL, later_task, &l2, NULL);
    bound(5000);
    g.rc[0] = ferry_stream_read_until(S, "\r\n", 2, g.buf[0], sizeof g.buf[0], &g.n[0]);
    g.rc[1] = ferry_stream_read_until(S, "\r\n", 2, g.buf[1], sizeof g.buf[1], &g.n[1]);
    unbound();
    ferry_task_join(t1, NULL);
    ferry_task_join(t2, NULL);
    g.rc[2] = l1.rc | l2.rc;
    return 0;
}

/* A two-byte delimiter split over two writes, the stream's reader waiting
 * in between. */
T(a_delimiter_split_across_arrivals_is_found)
{
    memset(&g, 0, sizeof g);
    pair(NULL);
    peer_put("one ");
    cr_assert_eq(tu_run(split_delim_task, NULL), 0);
    cr_assert_eq(g.rc[2], 0);
    cr_assert_eq(g.rc[0], 0, "first line: %d", g.rc[0]);
    cr_assert_eq(g.n[0], 15);
    cr_assert_eq(memcmp(g.buf[0], "one two words\r\n", 15), 0);
    cr_assert_eq(g.rc[1], 0);
    cr_assert_eq(g.n[1], 6);
    cr_assert_eq(memcmp(g.buf[1], "next\r\n", 6), 0);
    ferry_stream_close(S);
    close(sp[1]);
}

static int overlong_task(void *arg)
{
    size_t d = 0;

    (void)arg;
    bound(5000);
    g.rc[0] = ferry_stream_read_until(S, "\n", 1, g.buf[0], 8, &g.n[0]);
    g.buffered[0] = ferry_stream_buffered(S);
    /* Skip the long line: what was looked at, then up to its end. */
    g.rc[1] = ferry_stream_discard(S, 8, &d);
    g.n[1] = d;
    g.rc[2] = ferry_stream_read_until(S, "\n", 1, g.buf[2], sizeof g.buf[2], &g.n[2]);
    g.rc[3] = ferry_stream_read_until(S, "\n", 1, g.buf[3], 8, &g.n[3]);
    /* A frame of exactly the maximum, delimiter included. */
    g.rc[4] = ferry_stream_read_until(S, "\n", 1, g.buf[4], 8, &g.n[4]);
    unbound();
    return 0;
}

T(a_line_over_the_maximum_is_emsgsize_and_stays_in_the_stream)
{
    memset(&g, 0, sizeof g);
    pair(NULL);
    peer_put("0123456789abc\nok\n1234567\n");
    cr_assert_eq(tu_run(overlong_task, NULL), 0);
    cr_assert_eq(g.rc[0], -EMSGSIZE, "got %d", g.rc[0]);
    cr_assert_eq(g.n[0], 0);
    cr_assert_eq(g.buffered[0], 25, "nothing consumed");
    cr_assert_eq(g.rc[1], 0);
    cr_assert_eq(g.n[1], 8);
    cr_assert_eq(g.rc[2], 0);
    cr_assert_eq(g.n[2], 6);
    cr_assert_eq(memcmp(g.buf[2], "89abc\n", 6), 0);
    cr_assert_eq(g.rc[3], 0);
    cr_assert_eq(memcmp(g.buf[3], "ok\n", 3), 0);
    cr_assert_eq(g.rc[4], 0, "a frame of exactly max bytes: %d", g.rc[4]);
    cr_assert_eq(g.n[4], 8);
    ferry_stream_close(S);
    close(sp[1]);
}

static int grow_task(void *arg)
{
    static char big[3000];

    (void)arg;
    bound(5000);
    g.rc[0] = ferry_stream_read_until(S, "\n", 1, big, sizeof big, &g.n[0]);
    g.buf[0][0] = big[0];
    g.buf[0][1] = big[2047];
    g.rc[1] = ferry_stream_read_exactly(S, big, 2500, &g.n[1]);
    g.buf[1][0] = big[2499];
    unbound();
    return 0;
}

/* A buffer of 16 bytes grows to hold a frame of 2 KiB, then shrinks back. */
T(the_buffer_grows_to_hold_a_frame)
{
    char line[2049], block[2500];

    memset(&g, 0, sizeof g);
    memset(line, 'x', sizeof line);
    line[0] = 'a';
    line[2047] = 'z';
    line[2048] = '\n';
    memset(block, 'y', sizeof block);
    block[2499] = 'e';
    pair(&(ferry_stream_opts){ .read_buffer = 16 });
    cr_assert_eq(write(sp[1], line, sizeof line), (ssize_t)sizeof line);
    cr_assert_eq(write(sp[1], block, sizeof block), (ssize_t)sizeof block);
    cr_assert_eq(tu_run(grow_task, NULL), 0);
    cr_assert_eq(g.rc[0], 0, "%d", g.rc[0]);
    cr_assert_eq(g.n[0], 2049);
    cr_assert_eq(g.buf[0][0], 'a');
    cr_assert_eq(g.buf[0][1], 'z');
    cr_assert_eq(g.rc[1], 0, "%d", g.rc[1]);
    cr_assert_eq(g.n[1], 2500);
    cr_assert_eq(g.buf[1][0], 'e');
    ferry_stream_close(S);
    close(sp[1]);
}

static int bad_reads_task(void *arg)
{
    char b[8];
    size_t n;
    struct iovec iov[2] = { { NULL, 1 }, { b, 1 } };
    int i = 0;

    (void)arg;
    g.rc[i++] = ferry_stream_read(NULL, b, 8, &n);
    g.rc[i++] = ferry_stream_read(S, NULL, 8, &n);
    g.rc[i++] = ferry_stream_read(S, b, 0, &n);
    g.rc[i++] = ferry_stream_read(S, b, 8, NULL);
    g.rc[i++] = ferry_stream_read_until(S, "abc", 3, b, 2, &n);     /* delimiter longer than max */
    g.rc[i++] = ferry_stream_read_until(S, "", 0, b, 8, &n);
    g.rc[i++] = ferry_stream_read_until(S, NULL, 1, b, 8, &n);
    g.rc[i++] = ferry_stream_writev(S, iov, 2, &n);               /* NULL base, length 1 */
    g.n[0] = (size_t)i;
    g.n[1] = (size_t)ferry_stream_writev(S, iov, -1, NULL);
    g.n[2] = (size_t)ferry_stream_writev(S, iov, IOV_MAX + 1, NULL);
    g.n[3] = (size_t)ferry_stream_write(S, NULL, 1, NULL);
    g.n[4] = (size_t)ferry_stream_read_exactly(S, NULL, 1, NULL);
    g.n[5] = (size_t)ferry_stream_read_exactly(S, b, 0, &n);     /* nothing to read: done */
    return 0;
}

T(bad_input_is_einval)
{
    char b[8];
    size_t n = 7;

    memset(&g, 0, sizeof g);
    pair(NULL);
    cr_assert_eq(tu_run(bad_reads_task, NULL), 0);
    for (size_t i = 0; i < g.n[0]; i++)
        cr_assert_eq(g.rc[i], -EINVAL, "call %zu returned %d", i, g.rc[i]);
    for (int i = 1; i <= 4; i++)
        cr_assert_eq((int)g.n[i], -EINVAL, "call %d returned %d", i, (int)g.n[i]);
    cr_assert_eq((int)g.n[5], 0, "read_exactly of 0 bytes");
    /* Outside a task. */
    cr_assert_eq(ferry_stream_read(S, b, sizeof b, &n), -EPERM);
    cr_assert_eq(n, 0);
    cr_assert_eq(ferry_stream_write(S, "x", 1, NULL), -EPERM);
    cr_assert_eq(ferry_stream_close(NULL), -EINVAL);
    n = 7;
    cr_assert_eq(ferry_stream_discard(NULL, 1, &n), -EINVAL);
    cr_assert_eq(n, 0);
    cr_assert_eq(ferry_stream_shutdown(NULL), -EINVAL);
    cr_assert_eq(ferry_stream_fd(NULL), -EINVAL);
    cr_assert_eq(ferry_stream_buffered(NULL), 0);
    cr_assert_eq(ferry_stream_fd(S), sp[0]);
    ferry_stream_close(S);
    close(sp[1]);
}

static int eof_task(void *arg)
{
    (void)arg;
    bound(5000);
    g.rc[0] = ferry_stream_read_exactly(S, g.buf[0], 10, &g.n[0]);
    g.rc[1] = ferry_stream_read_until(S, "\n", 1, g.buf[1], 100, &g.n[1]);
    g.rc[2] = ferry_stream_read(S, g.buf[2], 100, &g.n[2]);
    g.rc[3] = ferry_stream_read(S, g.buf[3], 100, &g.n[3]);
    g.rc[4] = ferry_stream_read_exactly(S, g.buf[4], 10, &g.n[4]);
    g.rc[5] = ferry_stream_read_until(S, "\n", 1, g.buf[5], 100, &g.n[5]);
    unbound();
    return 0;
}

/* The peer closes in the middle of frames: -ENODATA with the partial
 * length and the partial bytes; at the end, plain reads give 0. */
T(the_end_of_the_stream_mid_frame_is_enodata_with_the_partial_length)
{
    memset(&g, 0, sizeof g);
    pair(NULL);
    peer_put("0123456789half a line");
    close(sp[1]);
    cr_assert_eq(tu_run(eof_task, NULL), 0);
    cr_assert_eq(g.rc[0], 0);
    cr_assert_eq(memcmp(g.buf[0], "0123456789", 10), 0);
    cr_assert_eq(g.rc[1], -ENODATA, "read_until at the end: %d", g.rc[1]);
    cr_assert_eq(g.n[1], 11);
    cr_assert_eq(memcmp(g.buf[1], "half a line", 11), 0);
    cr_assert_eq(g.rc[2], 0);
    cr_assert_eq(g.n[2], 0, "read at the end: 0 bytes");
    cr_assert_eq(g.rc[3], 0);
    cr_assert_eq(g.n[3], 0, "and again");
    cr_assert_eq(g.rc[4], -ENODATA);
    cr_assert_eq(g.n[4], 0, "an end at a frame boundary");
    cr_assert_eq(g.rc[5], -ENODATA);
    cr_assert_eq(g.n[5], 0);
    ferry_stream_close(S);
}

static int exactly_eof_task(void *arg)
{
    (void)arg;
    bound(5000);
    g.rc[0] = ferry_stream_read_exactly(S, g.buf[0], 10, &g.n[0]);
    unbound();
    return 0;
}

T(read_exactly_at_the_end_mid_frame_hands_over_the_partial_bytes)
{
    memset(&g, 0, sizeof g);
    pair(NULL);
    peer_put("abcd");
    shutdown(sp[1], SHUT_WR);
    cr_assert_eq(tu_run(exactly_eof_task, NULL), 0);
    cr_assert_eq(g.rc[0], -ENODATA, "%d", g.rc[0]);
    cr_assert_eq(g.n[0], 4);
    cr_assert_eq(memcmp(g.buf[0], "abcd", 4), 0);
    ferry_stream_close(S);
    close(sp[1]);
}

/* ---- all or nothing: cancellation and deadlines at every read --------------- */

/* Each read kind waits for more than has come, is cut by a deadline, and
 * must have consumed nothing; after the rest arrives, a retry gets every
 * byte in order. */
enum { K_READ_EXACTLY, K_READ_UNTIL, K_READ_SOME };

static int cut_read_task(void *arg)
{
    int kind = *(int *)arg;
    ferry_scope sc;

    ferry_scope_enter(&sc, ferry_now() + tu_ms(50), 0);
    if (kind == K_READ_EXACTLY)
        g.rc[0] = ferry_stream_read_exactly(S, g.buf[0], 10, &g.n[0]);
    else if (kind == K_READ_UNTIL)
        g.rc[0] = ferry_stream_read_until(S, "\n", 1, g.buf[0], 100, &g.n[0]);
    else
        g.rc[0] = ferry_stream_read(S, g.buf[0], 100, &g.n[0]);
    ferry_scope_exit(&sc);
    g.buffered[0] = ferry_stream_buffered(S);
    if (task_put(kind == K_READ_SOME ? "more" : "56789\n") != 0)
        g.rc[7] = -1;
    bound(5000);
    if (kind == K_READ_EXACTLY)
        g.rc[1] = ferry_stream_read_exactly(S, g.buf[1], 10, &g.n[1]);
    else if (kind == K_READ_UNTIL)
        g.rc[1] = ferry_stream_read_until(S, "\n", 1, g.buf[1], 100, &g.n[1]);
    else
        g.rc[1] = ferry_stream_read(S, g.buf[1], 100, &g.n[1]);
    unbound();
    return 0;
}

static void cut_read(int kind)
{
    memset(&g, 0, sizeof g);
    pair(&(ferry_stream_opts){ .read_buffer = 64 });
    if (kind != K_READ_SOME)
        peer_put("01234");
    cr_assert_eq(tu_run(cut_read_task, &kind), 0);
    cr_assert_eq(g.rc[7], 0);
    cr_assert_eq(g.rc[0], -ETIMEDOUT, "the cut read returned %d", g.rc[0]);
    cr_assert_eq(g.n[0], 0, "and reported %zu bytes", g.n[0]);
    cr_assert_eq(g.buffered[0], kind == K_READ_SOME ? 0u : 5u, "bytes kept in the stream");
    cr_assert_eq(g.rc[1], 0, "the retry returned %d", g.rc[1]);
    if (kind == K_READ_SOME) {
        cr_assert_eq(g.n[1], 4);
        cr_assert_eq(memcmp(g.buf[1], "more", 4), 0);
    } else {
        cr_assert_eq(g.n[1], kind == K_READ_UNTIL ? 11u : 10u);
        cr_assert_eq(memcmp(g.buf[1], "0123456789", 10), 0, "got '%.10s'", g.buf[1]);
    }
    ferry_stream_close(S);
    close(sp[1]);
}

T(a_read_exactly_cut_by_a_deadline_keeps_its_bytes) { cut_read(K_READ_EXACTLY); }
T(a_read_until_cut_by_a_deadline_keeps_its_bytes) { cut_read(K_READ_UNTIL); }
T(a_read_cut_by_a_deadline_consumes_nothing) { cut_read(K_READ_SOME); }

static int cancel_reader(void *arg)
{
    (void)arg;
    g.rc[0] = ferry_stream_read_until(S, "\n", 1, g.buf[0], 100, &g.n[0]);
    g.rc[1] = ferry_stream_read(S, g.buf[1], 100, &g.n[1]);    /* level-triggered */
    return 0;
}

static int cancel_main(void *arg)
{
    ferry_task *t;

    (void)arg;
    ferry_task_spawn(&t, NULL, cancel_reader, NULL, NULL);
    ferry_yield();
    ferry_yield();
    task_put("par");
    ferry_sleep(tu_ms(20));         /* the reader takes "par" in and waits again */
    ferry_task_cancel(t);
    ferry_task_join(t, NULL);
    g.buffered[0] = ferry_stream_buffered(S);
    task_put("tial\n");
    bound(5000);
    g.rc[2] = ferry_stream_read_until(S, "\n", 1, g.buf[2], 100, &g.n[2]);
    unbound();
    return 0;
}

T(a_cancelled_read_keeps_its_bytes_and_later_reads_stay_cancelled)
{
    memset(&g, 0, sizeof g);
    pair(NULL);
    cr_assert_eq(tu_run(cancel_main, NULL), 0);
    cr_assert_eq(g.rc[0], -ECANCELED);
    cr_assert_eq(g.n[0], 0);
    cr_assert_eq(g.rc[1], -ECANCELED, "a cancelled task's next read: %d", g.rc[1]);
    cr_assert_eq(g.buffered[0], 3);
    cr_assert_eq(g.rc[2], 0);
    cr_assert_eq(g.n[2], 8);
    cr_assert_eq(memcmp(g.buf[2], "partial\n", 8), 0);
    ferry_stream_close(S);
    close(sp[1]);
}

static int expired_task(void *arg)
{
    ferry_scope sc;
    size_t w = 9;

    (void)arg;
    ferry_scope_enter(&sc, ferry_now() - 1, 0);
    g.rc[0] = ferry_stream_read(S, g.buf[0], 100, &g.n[0]);
    g.rc[1] = ferry_stream_read_until(S, "\n", 1, g.buf[1], 100, &g.n[1]);
    g.rc[2] = ferry_stream_read_exactly(S, g.buf[2], 1, &g.n[2]);
    g.rc[3] = ferry_stream_discard(S, 1, &g.n[3]);
    g.rc[4] = ferry_stream_write(S, "x", 1, &w);
    g.n[4] = w;
    ferry_scope_exit(&sc);
    g.buffered[0] = ferry_stream_buffered(S);
    return 0;
}

/* Every call is a cancellation point, also with the data at hand. */
T(every_call_honours_a_deadline_that_has_passed)
{
    char b[8];

    memset(&g, 0, sizeof g);
    pair(NULL);
    peer_put("ready\n");
    cr_assert_eq(tu_run(expired_task, NULL), 0);
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(g.rc[i], -ETIMEDOUT, "call %d returned %d", i, g.rc[i]);
        cr_assert_eq(g.n[i], 0);
    }
    cr_assert_eq(peer_drain(b, sizeof b), 0, "the write wrote nothing");
    ferry_stream_close(S);
    close(sp[1]);
}

/* ---- writes ------------------------------------------------------------------- */

static char *g_big;
#define BIG ((size_t)8 << 20)

static int backpressure_task(void *arg)
{
    ferry_scope sc;

    (void)arg;
    ferry_scope_enter(&sc, ferry_now() + tu_ms(100), 0);
    g.rc[0] = ferry_stream_write(S, g_big, BIG, &g.n[0]);
    ferry_scope_exit(&sc);
    return 0;
}

/* A peer that never reads: the writer waits, a deadline cuts it, and
 * *written is exactly what the peer then finds. */
T(a_peer_that_never_reads_holds_the_writer_until_its_deadline)
{
    char *back;
    size_t got;

    memset(&g, 0, sizeof g);
    g_big = malloc(BIG);
    back = malloc(BIG);
    cr_assert(g_big && back);
    for (size_t i = 0; i < BIG; i++)
        g_big[i] = (char)(i * 7 + i / 251);
    pair(NULL);
    cr_assert_eq(tu_run(backpressure_task, NULL), 0);
    cr_assert_eq(g.rc[0], -ETIMEDOUT, "%d", g.rc[0]);
    cr_assert_gt(g.n[0], 0, "some bytes went out");
    cr_assert_lt(g.n[0], BIG, "not all of them");
    got = peer_drain(back, BIG);
    cr_assert_eq(got, g.n[0], "the peer found %zu bytes, *written said %zu", got, g.n[0]);
    cr_assert_eq(memcmp(back, g_big, got), 0);
    ferry_stream_close(S);
    close(sp[1]);
    free(g_big);
    free(back);
}

static int cancelled_writer(void *arg)
{
    (void)arg;
    g.rc[0] = ferry_stream_write(S, g_big, BIG, &g.n[0]);
    return 0;
}

static int cancel_write_main(void *arg)
{
    ferry_task *t;

    (void)arg;
    ferry_task_spawn(&t, NULL, cancelled_writer, NULL, NULL);
    ferry_sleep(tu_ms(30));
    ferry_task_cancel(t);
    ferry_task_join(t, NULL);
    return 0;
}

T(a_cancelled_write_reports_the_bytes_that_went_out)
{
    char *back = malloc(BIG);
    size_t got;

    memset(&g, 0, sizeof g);
    g_big = malloc(BIG);
    cr_assert(g_big && back);
    memset(g_big, 'w', BIG);
    pair(NULL);
    cr_assert_eq(tu_run(cancel_write_main, NULL), 0);
    cr_assert_eq(g.rc[0], -ECANCELED);
    cr_assert_gt(g.n[0], 0);
    got = peer_drain(back, BIG);
    cr_assert_eq(got, g.n[0], "the peer found %zu bytes, *written said %zu", got, g.n[0]);
    ferry_stream_close(S);
    close(sp[1]);
    free(g_big);
    free(back);
}

static struct iovec g_iov[200];

static int writev_task(void *arg)
{
    (void)arg;
    bound(5000);
    g.rc[0] = ferry_stream_writev(S, g_iov, 200, &g.n[0]);
    g.rc[1] = ferry_stream_writev(S, NULL, 0, &g.n[1]);
    g.rc[2] = ferry_stream_write(S, "", 0, &g.n[2]);
    unbound();
    return 0;
}

/* More buffers than one sendmsg() takes, empty ones among them. */
T(writev_writes_every_buffer_in_order)
{
    static char src[200][3];
    char back[1000], want[1000];
    size_t len = 0;

    memset(&g, 0, sizeof g);
    for (int i = 0; i < 200; i++) {
        snprintf(src[i], sizeof src[i], "%02d", i % 100);
        g_iov[i].iov_base = src[i];
        g_iov[i].iov_len = i % 7 == 3 ? 0 : 2;
        memcpy(want + len, src[i], g_iov[i].iov_len);
        len += g_iov[i].iov_len;
    }
    pair(NULL);
    cr_assert_eq(tu_run(writev_task, NULL), 0);
    cr_assert_eq(g.rc[0], 0);
    cr_assert_eq(g.n[0], len);
    cr_assert_eq(g.rc[1], 0);
    cr_assert_eq(g.rc[2], 0);
    cr_assert_eq(peer_drain(back, sizeof back), len);
    cr_assert_eq(memcmp(back, want, len), 0);
    ferry_stream_close(S);
    close(sp[1]);
}

static int big_writev_task(void *arg)
{
    struct iovec iov[3] = { { g_big, BIG / 2 }, { g_big + BIG / 2, 1 }, { g_big + BIG / 2 + 1, BIG / 2 - 1 } };

    (void)arg;
    bound(10000);
    g.rc[0] = ferry_stream_writev(S, iov, 3, &g.n[0]);
    unbound();
    return 0;
}

static int big_both_main(void *arg)
{
    ferry_stream *peer;
    ferry_task *t;

    if (ferry_stream_open(&peer, NULL, sp[1], NULL) != 0)
        return -1;
    ferry_task_spawn(&t, NULL, big_writev_task, NULL, NULL);
    bound(10000);
    g.rc[1] = ferry_stream_read_exactly(peer, arg, BIG, &g.n[1]);
    unbound();
    ferry_task_join(t, NULL);
    ferry_stream_close(peer);
    return 0;
}

/* A vectored write larger than the socket takes, read back by a stream on
 * the other end: partial sends continue in the right buffer. */
T(a_large_writev_resumes_inside_a_buffer)
{
    char *back = malloc(BIG);

    memset(&g, 0, sizeof g);
    g_big = malloc(BIG);
    cr_assert(g_big && back);
    for (size_t i = 0; i < BIG; i++)
        g_big[i] = (char)(i % 251);
    pair(NULL);
    cr_assert_eq(tu_run(big_both_main, back), 0);
    cr_assert_eq(g.rc[0], 0, "writev: %d", g.rc[0]);
    cr_assert_eq(g.n[0], BIG);
    cr_assert_eq(g.rc[1], 0, "read_exactly: %d", g.rc[1]);
    cr_assert_eq(memcmp(back, g_big, BIG), 0);
    ferry_stream_close(S);
    free(g_big);
    free(back);
}

/* ---- one reader, one writer ----------------------------------------------------- */

static int busy_reader(void *arg)
{
    (void)arg;
    g.rc[0] = ferry_stream_read(S, g.buf[0], 100, &g.n[0]);
    return 0;
}

static int busy_writer(void *arg)
{
    (void)arg;
    g.rc[1] = ferry_stream_write(S, g_big, BIG, &g.n[1]);
    return 0;
}

static int busy_main(void *arg)
{
    ferry_task *r, *w;
    size_t n = 5;

    (void)arg;
    ferry_task_spawn(&r, NULL, busy_reader, NULL, NULL);
    ferry_task_spawn(&w, NULL, busy_writer, NULL, NULL);
    ferry_sleep(tu_ms(20));          /* both wait: nothing to read, no room */
    g.rc[2] = ferry_stream_read(S, g.buf[2], 100, &g.n[2]);
    g.rc[3] = ferry_stream_read_until(S, "\n", 1, g.buf[3], 100, &g.n[3]);
    g.rc[4] = ferry_stream_write(S, "x", 1, &n);
    g.n[4] = n;
    g.rc[5] = ferry_stream_shutdown(S);
    ferry_task_cancel(w);
    ferry_task_join(w, NULL);
    task_put("hi");
    ferry_task_join(r, NULL);
    return 0;
}

T(a_second_reader_or_writer_is_ebusy)
{
    memset(&g, 0, sizeof g);
    g_big = malloc(BIG);
    cr_assert_not_null(g_big);
    memset(g_big, 1, BIG);
    pair(NULL);
    cr_assert_eq(tu_run(busy_main, NULL), 0);
    cr_assert_eq(g.rc[2], -EBUSY);
    cr_assert_eq(g.rc[3], -EBUSY);
    cr_assert_eq(g.rc[4], -EBUSY);
    cr_assert_eq(g.n[4], 0);
    cr_assert_eq(g.rc[5], -EBUSY, "shutdown while a write is inside");
    cr_assert_eq(g.rc[1], -ECANCELED);
    cr_assert_eq(g.rc[0], 0, "the reader, beside the writer: %d", g.rc[0]);
    cr_assert_eq(g.n[0], 2);
    ferry_stream_close(S);
    close(sp[1]);
    free(g_big);
}

/* ---- closing while tasks wait ------------------------------------------------- */

static int old_fd, new_fd;

static int close_reader(void *arg)
{
    (void)arg;
    g.rc[0] = ferry_stream_read(S, g.buf[0], 100, &g.n[0]);
    return 0;
}

static int close_writer(void *arg)
{
    (void)arg;
    g.rc[1] = ferry_stream_write(S, g_big, BIG, &g.n[1]);
    return 0;
}

static int close_main(void *arg)
{
    ferry_stream *s2, *old = S;
    ferry_task *r, *w;
    int sp2[2];

    (void)arg;
    ferry_task_spawn(&r, NULL, close_reader, NULL, NULL);
    ferry_task_spawn(&w, NULL, close_writer, NULL, NULL);
    ferry_sleep(tu_ms(20));
    g.rc[2] = ferry_stream_close(S);
    /* The woken tasks have not run yet: the stream is closed, not freed. */
    g.rc[3] = ferry_stream_read(old, g.buf[3], 10, &g.n[3]);
    g.rc[4] = ferry_stream_close(old);
    g.rc[5] = ferry_stream_fd(old);
    /* The number is free at once: the next socket takes it. */
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp2) != 0)
        return -1;
    new_fd = sp2[0];
    if (ferry_stream_open(&s2, NULL, sp2[0], NULL) != 0)
        return -2;
    ferry_task_join(r, NULL);
    ferry_task_join(w, NULL);
    /* The new stream on the reused number works both ways. */
    bound(5000);
    if (write(sp2[1], "fresh", 5) != 5)
        return -3;
    g.rc[6] = ferry_stream_read_exactly(s2, g.buf[6], 5, &g.n[6]);
    g.rc[7] = ferry_stream_write(s2, "back", 4, NULL);
    unbound();
    ferry_stream_close(s2);
    g.n[7] = (size_t)read(sp2[1], g.buf[7], sizeof g.buf[7]);
    close(sp2[1]);
    return 0;
}

T(close_wakes_the_waiting_tasks_and_the_number_is_reused_at_once)
{
    memset(&g, 0, sizeof g);
    g_big = malloc(BIG);
    cr_assert_not_null(g_big);
    memset(g_big, 2, BIG);
    pair(NULL);
    old_fd = sp[0];
    cr_assert_eq(tu_run(close_main, NULL), 0);
    cr_assert_eq(g.rc[2], 0);
    cr_assert_eq(g.rc[0], -EBADF, "the waiting reader got %d", g.rc[0]);
    cr_assert_eq(g.rc[1], -EBADF, "the waiting writer got %d", g.rc[1]);
    cr_assert_gt(g.n[1], 0, "the writer reports what went out before");
    cr_assert_eq(g.rc[3], -EBADF, "a call while woken tasks are leaving");
    cr_assert_eq(g.rc[4], -EBADF, "a second close");
    cr_assert_eq(g.rc[5], -EBADF);
    cr_assert_eq(new_fd, old_fd, "the test needs the number reused (got %d, closed %d)", new_fd,
                 old_fd);
    cr_assert_eq(g.rc[6], 0, "read on the reused number: %d", g.rc[6]);
    cr_assert_eq(memcmp(g.buf[6], "fresh", 5), 0);
    cr_assert_eq(g.rc[7], 0);
    cr_assert_eq(g.n[7], 4);
    close(sp[1]);
    free(g_big);
}

/* Closing from a callback (not a task) wakes the waiter too. */
static void close_cb(void *arg)
{
    g.rc[2] = ferry_stream_close(arg);
}

static int cb_close_main(void *arg)
{
    (void)arg;
    ferry_call_later(tu_loop, tu_ms(20), close_cb, S, NULL);
    g.rc[0] = ferry_stream_read(S, g.buf[0], 100, &g.n[0]);
    return 0;
}

T(close_from_a_callback_wakes_the_reader)
{
    memset(&g, 0, sizeof g);
    pair(NULL);
    cr_assert_eq(tu_run(cb_close_main, NULL), 0);
    cr_assert_eq(g.rc[2], 0);
    cr_assert_eq(g.rc[0], -EBADF);
    close(sp[1]);
}

static int leftover_task(void *arg)
{
    (void)arg;
    return ferry_stream_read(S, g.buf[0], 10, &g.n[0]);
}

/* ferry_loop_free() closes the streams left open, after cancelling the
 * task waiting on one of them; the descriptors are closed (and the
 * teardown finds nothing leaked). */
T(freeing_the_loop_closes_the_streams_left_open)
{
    ferry_stream *s2;
    int sp2[2];

    pair(NULL);
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp2), 0);
    cr_assert_eq(ferry_stream_open(&s2, tu_loop, sp2[0], NULL), 0);
    cr_assert_eq(ferry_task_spawn(NULL, tu_loop, leftover_task, NULL, NULL), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, FERRY_RUN_ONCE), 0);
    ferry_loop_free(tu_loop);
    tu_loop = NULL;
    cr_assert_eq(fcntl(sp[0], F_GETFD), -1, "the stream's descriptor was closed");
    cr_assert_eq(fcntl(sp2[0], F_GETFD), -1);
    close(sp[1]);
    close(sp2[1]);
}

/* ---- SIGPIPE, resets, half-close ------------------------------------------------- */

static volatile sig_atomic_t pipe_hits;

static void count_pipe(int sig)
{
    (void)sig;
    pipe_hits++;
}

static int pipe_write_task(void *arg)
{
    (void)arg;
    g.rc[0] = ferry_stream_write(S, "lost", 4, &g.n[0]);
    g.rc[1] = ferry_stream_write(S, "lost", 4, &g.n[1]);
    return 0;
}

static bool sigpipe_pending(void)
{
    sigset_t p;
    sigpending(&p);
    return sigismember(&p, SIGPIPE) == 1;
}

static bool sigpipe_blocked(void)
{
    sigset_t m;
    pthread_sigmask(SIG_BLOCK, NULL, &m);
    return sigismember(&m, SIGPIPE) == 1;
}

/* A pipe whose reader is gone: -EPIPE, no SIGPIPE delivered nor left
 * pending, the signal mask as it was.  With the default disposition a
 * SIGPIPE would kill the test. */
T(a_pipe_whose_reader_is_gone_gives_epipe_and_no_sigpipe)
{
    int p[2];

    memset(&g, 0, sizeof g);
    signal(SIGPIPE, SIG_DFL);
    cr_assert_eq(pipe(p), 0);
    close(p[0]);
    cr_assert_eq(ferry_stream_open(&S, tu_loop, p[1], NULL), 0);
    cr_assert_eq(tu_run(pipe_write_task, NULL), 0);
    cr_assert_eq(g.rc[0], -EPIPE, "%d", g.rc[0]);
    cr_assert_eq(g.rc[1], -EPIPE);
    cr_assert_eq(g.n[0], 0);
    cr_assert_not(sigpipe_pending());
    cr_assert_not(sigpipe_blocked(), "SIGPIPE left blocked");
    cr_assert_eq(ferry_stream_shutdown(S), -ENOTSOCK);
    ferry_stream_close(S);
}

/* An application that blocks SIGPIPE and has one pending keeps it: the
 * stream takes back only the signal its own write raised. */
T(a_sigpipe_the_application_had_pending_stays_pending)
{
    sigset_t set;
    int p[2];

    memset(&g, 0, sizeof g);
    signal(SIGPIPE, count_pipe);
    pipe_hits = 0;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    raise(SIGPIPE);
    cr_assert(sigpipe_pending());
    cr_assert_eq(pipe(p), 0);
    close(p[0]);
    cr_assert_eq(ferry_stream_open(&S, tu_loop, p[1], NULL), 0);
    cr_assert_eq(tu_run(pipe_write_task, NULL), 0);
    cr_assert_eq(g.rc[0], -EPIPE);
    cr_assert(sigpipe_pending(), "the application's SIGPIPE was taken");
    cr_assert(sigpipe_blocked(), "the application's mask was changed");
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    cr_assert_eq(pipe_hits, 1, "one SIGPIPE, the application's: %d", (int)pipe_hits);
    signal(SIGPIPE, SIG_DFL);
    ferry_stream_close(S);
}

/* A socket peer that has gone: -EPIPE or -ECONNRESET, no SIGPIPE. */
T(a_socket_whose_peer_is_gone_gives_epipe_and_no_sigpipe)
{
    memset(&g, 0, sizeof g);
    signal(SIGPIPE, SIG_DFL);
    pair(NULL);
    close(sp[1]);
    cr_assert_eq(tu_run(pipe_write_task, NULL), 0);
    cr_assert(g.rc[0] == -EPIPE || g.rc[0] == -ECONNRESET, "%d", g.rc[0]);
    cr_assert(g.rc[1] == -EPIPE || g.rc[1] == -ECONNRESET, "%d", g.rc[1]);
    cr_assert_not(sigpipe_pending());
    ferry_stream_close(S);
}

static void reset(int fd)
{
    struct linger lg = { 1, 0 };
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(fd);
}

static int reset_read_task(void *arg)
{
    (void)arg;
    bound(5000);
    g.rc[0] = ferry_stream_read_exactly(S, g.buf[0], 100, &g.n[0]);
    g.buffered[0] = ferry_stream_buffered(S);
    g.rc[1] = ferry_stream_read(S, g.buf[1], 100, &g.n[1]);
    g.rc[3] = ferry_stream_read(S, g.buf[3], 100, &g.n[3]);
    unbound();
    return 0;
}

static int reset_writer(void *arg)
{
    (void)arg;
    bound(5000);
    g.rc[2] = ferry_stream_write(S, g_big, BIG, &g.n[2]);
    unbound();
    return 0;
}

static int reset_main(void *arg)
{
    ferry_task *w;

    (void)arg;
    ferry_task_spawn(&w, NULL, reset_writer, NULL, NULL);
    ferry_sleep(tu_ms(20));     /* the writer waits: the peer does not read */
    reset(sp[1]);
    reset_read_task(NULL);
    ferry_task_join(w, NULL);
    return 0;
}

/* A peer that resets mid-write and mid-read: -ECONNRESET (or -EPIPE for
 * the write), no hang, no signal. */
T(a_peer_that_resets_gives_econnreset)
{
    memset(&g, 0, sizeof g);
    signal(SIGPIPE, SIG_DFL);
    g_big = malloc(BIG);
    cr_assert_not_null(g_big);
    memset(g_big, 3, BIG);
    tu_tcp_pair(sp);
    cr_assert_eq(ferry_stream_open(&S, tu_loop, sp[0], NULL), 0);
    cr_assert_eq(write(sp[1], "partial", 7), 7);
    cr_assert_eq(tu_run(reset_main, NULL), 0);
    cr_assert(g.rc[2] == -ECONNRESET || g.rc[2] == -EPIPE, "the writer got %d", g.rc[2]);
    cr_assert_gt(g.n[2], 0);
    cr_assert_eq(g.rc[0], -ECONNRESET, "the reader got %d", g.rc[0]);
    cr_assert_eq(g.n[0], 0);
    cr_assert_eq(g.buffered[0], 7, "the bytes before the reset stay readable");
    cr_assert_eq(g.rc[1], 0);
    cr_assert_eq(g.n[1], 7);
    cr_assert_eq(memcmp(g.buf[1], "partial", 7), 0);
    cr_assert_eq(g.rc[3], -ECONNRESET, "then the error again: %d", g.rc[3]);
    cr_assert_not(sigpipe_pending());
    ferry_stream_close(S);
    free(g_big);
}

/* The peer writes a little and then resets or closes, both before the
 * loop polls: one poll reports the data and the end together.  The data
 * comes in a short read; the reset (or the end) must still reach the next
 * read, although no new edge will come for it. */
static int hangup_reader(void *arg)
{
    (void)arg;
    g.rc[0] = ferry_stream_read(S, g.buf[0], 100, &g.n[0]);
    ferry_scope_enter(&g_scope, ferry_now() + tu_ms(1000), 0);
    g.rc[1] = ferry_stream_read(S, g.buf[1], 100, &g.n[1]);
    ferry_scope_exit(&g_scope);
    return 0;
}

static int hangup_main(void *arg)
{
    bool rst = *(bool *)arg;
    ferry_task *r;

    ferry_task_spawn(&r, NULL, hangup_reader, NULL, NULL);
    ferry_yield();
    ferry_yield();          /* the reader waits: it found nothing */
    if (write(sp[1], "abc", 3) != 3)
        g.rc[7] = -1;
    if (rst)
        reset(sp[1]);
    else
        close(sp[1]);
    ferry_task_join(r, NULL);
    return 0;
}

static void hangup(bool rst)
{
    memset(&g, 0, sizeof g);
    tu_tcp_pair(sp);
    cr_assert_eq(ferry_stream_open(&S, tu_loop, sp[0], NULL), 0);
    cr_assert_eq(tu_run(hangup_main, &rst), 0);
    cr_assert_eq(g.rc[7], 0);
    cr_assert_eq(g.rc[0], 0);
    cr_assert_eq(g.n[0], 3);
    if (rst) {
        cr_assert_eq(g.rc[1], -ECONNRESET, "the read after the data: %d", g.rc[1]);
    } else {
        cr_assert_eq(g.rc[1], 0, "the read after the data: %d", g.rc[1]);
        cr_assert_eq(g.n[1], 0, "the end of the stream");
    }
    ferry_stream_close(S);
}

T(data_and_a_reset_in_one_poll_both_reach_the_reader) { hangup(true); }
T(data_and_the_end_in_one_poll_both_reach_the_reader) { hangup(false); }

static int half_close_task(void *arg)
{
    (void)arg;
    bound(5000);
    g.rc[0] = ferry_stream_write(S, "request", 7, NULL);
    g.rc[1] = ferry_stream_shutdown(S);
    g.rc[2] = ferry_stream_read_until(S, "\n", 1, g.buf[2], 100, &g.n[2]);
    g.rc[3] = ferry_stream_write(S, "more", 4, NULL);
    unbound();
    return 0;
}

static void *half_close_peer(void *arg)
{
    char buf[64];
    size_t got = 0;
    ssize_t k;

    (void)arg;
    while ((k = read(sp[1], buf + got, sizeof buf - got)) > 0)
        got += (size_t)k;
    g.n[0] = got;         /* the loop thread reads it after the join */
    if (write(sp[1], "answer\n", 7) != 7)
        g.n[0] = 0;
    return NULL;
}

/* Half-close: the peer reads to its end of stream, then answers. */
T(shutdown_ends_the_peers_reads_and_reading_goes_on)
{
    pthread_t th;

    memset(&g, 0, sizeof g);
    signal(SIGPIPE, SIG_DFL);
    pair(NULL);
    th = tu_start_thread(half_close_peer, NULL);
    cr_assert_eq(tu_run(half_close_task, NULL), 0);
    pthread_join(th, NULL);
    cr_assert_eq(g.rc[0], 0);
    cr_assert_eq(g.rc[1], 0);
    cr_assert_eq(g.n[0], 7, "the peer read %zu bytes to its end of stream", g.n[0]);
    cr_assert_eq(g.rc[2], 0);
    cr_assert_eq(memcmp(g.buf[2], "answer\n", 7), 0);
    cr_assert_eq(g.rc[3], -EPIPE, "a write after shutdown: %d", g.rc[3]);
    ferry_stream_close(S);
    close(sp[1]);
}

/* ---- pipes --------------------------------------------------------------------------- */

static ferry_stream *g_in, *g_out;

static int pipe_writer(void *arg)
{
    (void)arg;
    for (int i = 0; i < 1000 && g.rc[1] == 0; i++) {
        char line[32];
        int len = snprintf(line, sizeof line, "line %d\n", i);
        g.rc[1] = ferry_stream_write(g_out, line, (size_t)len, NULL);
    }
    ferry_stream_close(g_out);
    return 0;
}

static int pipe_main(void *arg)
{
    ferry_task *w;
    char line[32];
    size_t n;
    int rc;

    (void)arg;
    ferry_task_spawn(&w, NULL, pipe_writer, NULL, NULL);
    bound(10000);
    while ((rc = ferry_stream_read_until(g_in, "\n", 1, line, sizeof line, &n)) == 0) {
        char want[32];
        int len = snprintf(want, sizeof want, "line %d\n", (int)g.n[0]);
        if ((size_t)len != n || memcmp(line, want, n) != 0)
            g.rc[2] = -1;
        g.n[0]++;
    }
    unbound();
    g.rc[0] = rc;
    g.n[1] = n;
    ferry_task_join(w, NULL);
    return 0;
}

/* Two streams over the ends of a pipe (a pipe's buffer is 64 KiB: the
 * writer waits for the reader). */
T(a_pipe_carries_lines_to_its_end)
{
    int p[2];

    memset(&g, 0, sizeof g);
    cr_assert_eq(pipe(p), 0);
    cr_assert_eq(ferry_stream_open(&g_in, tu_loop, p[0], &(ferry_stream_opts){ .read_buffer = 100 }), 0);
    cr_assert_eq(ferry_stream_open(&g_out, tu_loop, p[1], NULL), 0);
    cr_assert_eq(tu_run(pipe_main, NULL), 0);
    cr_assert_eq(g.rc[1], 0);
    cr_assert_eq(g.rc[2], 0, "a line came out wrong");
    cr_assert_eq(g.n[0], 1000);
    cr_assert_eq(g.rc[0], -ENODATA);
    cr_assert_eq(g.n[1], 0, "the end at a line boundary");
    ferry_stream_close(g_in);
}

/* ---- another loop, another thread ----------------------------------------------------- */

static int foreign_calls(int *r)
{
    char b[4];
    size_t n;
    int i = 0;

    r[i++] = ferry_stream_read(S, b, sizeof b, &n);
    r[i++] = ferry_stream_read_exactly(S, b, 1, &n);
    r[i++] = ferry_stream_read_until(S, "\n", 1, b, sizeof b, &n);
    r[i++] = ferry_stream_discard(S, 1, &n);
    r[i++] = ferry_stream_write(S, "x", 1, &n);
    r[i++] = ferry_stream_writev(S, &(struct iovec){ b, 1 }, 1, &n);
    r[i++] = ferry_stream_shutdown(S);
    r[i++] = ferry_stream_close(S);
    return i;
}

static int foreign_task(void *arg)
{
    *(int *)arg = foreign_calls((int *)arg + 1);
    return 0;
}

static void *foreign_thread(void *arg)
{
    ferry_loop *loop2;
    int *r = arg;

    /* A task of a loop of its own. */
    if (ferry_loop_new(&loop2, NULL) != 0)
        return NULL;
    ferry_task_spawn(NULL, loop2, foreign_task, r, NULL);
    ferry_loop_run(loop2, FERRY_RUN_DEFAULT);
    ferry_loop_free(loop2);
    /* And the thread itself. */
    r[20] = foreign_calls(r + 21);
    return NULL;
}

T(a_stream_used_from_another_loop_or_thread_is_eperm)
{
    int r[40];
    pthread_t th;

    memset(r, 0, sizeof r);
    pair(NULL);
    th = tu_start_thread(foreign_thread, r);
    pthread_join(th, NULL);
    cr_assert_eq(r[0], 8, "the other loop's task ran %d calls", r[0]);
    for (int i = 1; i <= r[0]; i++)
        cr_assert_eq(r[i], -EPERM, "call %d from another loop's task returned %d", i, r[i]);
    cr_assert_eq(r[20], 8);
    for (int i = 21; i < 21 + r[20]; i++)
        cr_assert_eq(r[i], -EPERM, "call %d from another thread returned %d", i - 21, r[i]);
    cr_assert_eq(ferry_stream_fd(S), sp[0], "still open");
    ferry_stream_close(S);
    close(sp[1]);
}

/* ---- the level-triggered fallback ------------------------------------------------------ */

static int lt_main(void *arg)
{
    ferry_task *t;
    (void)arg;

    /* Reads that wait, a write that waits on a full socket, a close that
     * wakes a waiter: the paths that register and unregister. */
    ferry_task_spawn(&t, NULL, later_task, &(struct later){ 20, "slow\n", 0 }, NULL);
    bound(5000);
    g.rc[0] = ferry_stream_read_until(S, "\n", 1, g.buf[0], 100, &g.n[0]);
    unbound();
    ferry_task_join(t, NULL);
    {
        ferry_scope sc;
        ferry_scope_enter(&sc, ferry_now() + tu_ms(50), 0);
        g.rc[1] = ferry_stream_write(S, g_big, BIG, &g.n[1]);
        ferry_scope_exit(&sc);
    }
    return 0;
}

/* A loop attached to a poll() base (no edge-triggered events). */
Test(stream, a_base_without_edge_triggering_uses_the_level_triggered_fallback, .timeout = 30.)
{
    struct event_config *cfg = event_config_new();
    struct event_base *base;
    char *back = malloc(BIG);
    size_t got;

    memset(&g, 0, sizeof g);
    g_big = malloc(BIG);
    cr_assert(g_big && back && cfg);
    memset(g_big, 5, BIG);
    event_config_avoid_method(cfg, "epoll");
    event_config_avoid_method(cfg, "select");
    base = event_base_new_with_config(cfg);
    event_config_free(cfg);
    cr_assert_not_null(base);
    cr_assert_str_eq(event_base_get_method(base), "poll");
    cr_assert_eq(ferry_loop_new(&tu_loop, &(ferry_loop_opts){ .base = base }), 0);
    ferry__io_use_libevent = true;   /* else the loop's epoll set takes it */
    pair(NULL);
    cr_assert_eq(tu_run(lt_main, NULL), 0);
    cr_assert_eq(g.rc[0], 0, "read: %d", g.rc[0]);
    cr_assert_eq(memcmp(g.buf[0], "slow\n", 5), 0);
    cr_assert_eq(g.rc[1], -ETIMEDOUT);
    got = peer_drain(back, BIG);
    cr_assert_eq(got, g.n[1]);
    ferry_stream_close(S);
    ferry_loop_free(tu_loop);
    tu_loop = NULL;
    event_base_free(base);
    close(sp[1]);
    free(g_big);
    free(back);
}
