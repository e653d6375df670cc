/* test_uring_fallback.c - a loop asked for io_uring that cannot have it
 * (docs/io_uring.md): it serves with epoll, says why once in the log and
 * in its statistics, and nothing else changes.
 *
 * The ctest runs this program under deny_uring (a seccomp filter that
 * fails the io_uring calls with EPERM, as containers' default profiles
 * do) with FERRY_IO=uring; a test that sets FERRY_IO itself does so before
 * its loop makes its first stream, which is when the loop reads it.
 *
 * No cr_assert inside task bodies (see testutil.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "ferry/features.h"
#include "testutil.h"
#include "uring_nr.h"

#define T(name) \
    Test(uring_fallback, name, .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 30.)

/* Does this process run where io_uring_setup is denied with EPERM? */
static bool uring_denied(void)
{
    unsigned char params[512] = { 0 };

    return syscall(__NR_io_uring_setup, 1, params) < 0 && errno == EPERM;
}

/* An echo through the loop: a listener, CONNS connections, each sending
 * its message and reading it back through a task of the listener's. */
#define CONNS 3

static struct {
    int rc_listen, rc_connect[CONNS], rc_accept[CONNS], rc_echo[CONNS];
    char back[CONNS][16];
    size_t got[CONNS];
} g;

static ferry_listener *L;

static int serve_one(void *arg)
{
    ferry_stream *s = arg;
    char buf[16];
    size_t n;

    while (ferry_stream_read(s, buf, sizeof buf, &n) == 0 && n > 0)
        if (ferry_stream_write(s, buf, n, NULL) != 0)
            break;
    ferry_stream_close(s);
    return 0;
}

static int acceptor(void *arg)
{
    ferry_task *t[CONNS];

    (void)arg;
    for (int i = 0; i < CONNS; i++) {
        ferry_stream *s;

        g.rc_accept[i] = ferry_listener_accept(L, &s, NULL);
        t[i] = NULL;
        if (g.rc_accept[i] == 0 && ferry_task_spawn(&t[i], NULL, serve_one, s, NULL) != 0)
            ferry_stream_close(s);
    }
    for (int i = 0; i < CONNS; i++)
        if (t[i])
            ferry_task_join(t[i], NULL);
    return 0;
}

static int echo_main(void *arg)
{
    ferry_stream *s[CONNS] = { NULL };
    ferry_scope scope;
    ferry_task *acc;

    (void)arg;
    g.rc_listen = ferry_tcp_listen(&L, NULL, "127.0.0.1", 0, NULL);
    if (g.rc_listen)
        return 0;
    ferry_scope_enter(&scope, ferry_now() + tu_ms(10000), 0);
    ferry_task_spawn(&acc, NULL, acceptor, NULL, NULL);
    for (int i = 0; i < CONNS; i++) {
        char msg[16];

        snprintf(msg, sizeof msg, "echo %d", i);
        g.rc_connect[i] = ferry_tcp_connect(&s[i], "127.0.0.1", ferry_listener_port(L), NULL);
        if (g.rc_connect[i])
            continue;
        g.rc_echo[i] = ferry_stream_write(s[i], msg, strlen(msg), NULL);
        if (g.rc_echo[i] == 0)
            g.rc_echo[i] = ferry_stream_read_exactly(s[i], g.back[i], strlen(msg), &g.got[i]);
    }
    for (int i = 0; i < CONNS; i++)
        if (s[i])
            ferry_stream_close(s[i]);
    ferry_task_join(acc, NULL);
    ferry_scope_exit(&scope);
    ferry_listener_close(L);
    return 0;
}

/* Run the echo on tu_loop and check that every byte came back. */
static void echo_ok(void)
{
    memset(&g, 0, sizeof g);
    cr_assert_eq(tu_run(echo_main, NULL), 0);
    cr_assert_eq(g.rc_listen, 0, "listen: %d", g.rc_listen);
    for (int i = 0; i < CONNS; i++) {
        char want[16];

        snprintf(want, sizeof want, "echo %d", i);
        cr_assert_eq(g.rc_connect[i], 0, "connect %d: %d", i, g.rc_connect[i]);
        cr_assert_eq(g.rc_accept[i], 0, "accept %d: %d", i, g.rc_accept[i]);
        cr_assert_eq(g.rc_echo[i], 0, "echo %d: %d", i, g.rc_echo[i]);
        cr_assert_eq(g.got[i], strlen(want));
        cr_assert_arr_eq(g.back[i], want, strlen(want));
    }
}

/* The harness itself: this program runs where io_uring is denied, or the
 * tests below prove nothing. */
T(runs_where_io_uring_is_denied)
{
    cr_assert(uring_denied(), "run this program under deny_uring (tests/CMakeLists.txt)");
    cr_assert_str_eq(getenv("FERRY_IO") ? getenv("FERRY_IO") : "", "uring",
                     "run this program with FERRY_IO=uring");
}

/* Streams and listeners work as they do on epoll. */
T(denied_loop_serves)
{
    cr_assert(uring_denied());
    echo_ok();
}

#ifdef FERRY_HAVE_URING
/* What the log hook saw: lines that speak of FERRY_IO, and the last. */
static int log_lines;
static char log_last[256];

static void count_log(int level, const char *msg, void *ctx)
{
    (void)level;
    (void)ctx;
    if (strstr(msg, "FERRY_IO")) {
        log_lines++;
        snprintf(log_last, sizeof log_last, "%s", msg);
    }
}

/* The statistics name the backend in use and why it is not io_uring; the
 * log says so once for the loop, however many streams it makes. */
T(denied_loop_says_why_once)
{
    ferry_loop_stats st;

    cr_assert(uring_denied());
    ferry_set_log(count_log, NULL);
    echo_ok();
    echo_ok();
    ferry_set_log(NULL, NULL);
    cr_assert_eq(ferry_loop_stats_get(tu_loop, &st), 0);
    cr_assert_not_null(st.io_backend);
    cr_assert_str_eq(st.io_backend, "epoll");
    cr_assert_not_null(st.io_fallback, "no reason in the statistics");
    cr_assert_neq(st.io_fallback[0], '\0');
#if FERRY_HAVE_URING
    cr_assert_eq(st.io_fallback_err, EPERM, "io_fallback_err %d (%s)", st.io_fallback_err,
                 st.io_fallback);
#else
    cr_assert_eq(st.io_fallback_err, ENOSYS, "io_fallback_err %d (%s)", st.io_fallback_err,
                 st.io_fallback);
#endif
    cr_assert_eq(log_lines, 1, "%d log lines about FERRY_IO; last: %s", log_lines, log_last);
    cr_assert(strstr(log_last, st.io_fallback), "the log line '%s' does not give the reason '%s'",
              log_last, st.io_fallback);
}

/* Each loop decides for itself: a second loop says it once more. */
Test(uring_fallback, each_loop_says_why, .init = tu_alloc_setup, .fini = tu_loop_teardown,
     .timeout = 30.)
{
    ferry_loop_stats st;

    ferry_set_log(count_log, NULL);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(ferry_loop_new(&tu_loop, NULL), 0);
        echo_ok();
        cr_assert_eq(ferry_loop_stats_get(tu_loop, &st), 0);
        ferry_loop_free(tu_loop);
        tu_loop = NULL;
        cr_assert_str_eq(st.io_backend, "epoll");
        cr_assert_not_null(st.io_fallback);
    }
    ferry_set_log(NULL, NULL);
    cr_assert_eq(log_lines, 2, "%d log lines about FERRY_IO for two loops", log_lines);
}

/* FERRY_IO=epoll is no fallback: nothing to say. */
Test(uring_fallback, epoll_asked_is_no_fallback, .init = tu_alloc_setup, .fini = tu_loop_teardown,
     .timeout = 30.)
{
    ferry_loop_stats st;

    cr_assert_eq(setenv("FERRY_IO", "epoll", 1), 0);
    ferry_set_log(count_log, NULL);
    cr_assert_eq(ferry_loop_new(&tu_loop, NULL), 0);
    echo_ok();
    ferry_set_log(NULL, NULL);
    cr_assert_eq(ferry_loop_stats_get(tu_loop, &st), 0);
    ferry_loop_free(tu_loop);
    tu_loop = NULL;
    cr_assert_str_eq(st.io_backend, "epoll");
    cr_assert_null(st.io_fallback);
    cr_assert_eq(st.io_fallback_err, 0);
    cr_assert_eq(log_lines, 0, "a log line without a fallback: %s", log_last);
}
#endif
