/* test_curl.c - HTTP through libcurl for tasks (ferry/curl.h), against the
 * HTTP/1.1 server of tests/http_server.c, a process of its own on
 * 127.0.0.1 at a free port (so that this process's descriptors are only
 * the client's).  Replays the libcurl event-loop bugs: a callback that
 * re-enters (curl #8286), a socket closed after REMOVE and its number
 * reused (#9799), an idle connection that must not keep the loop busy
 * (#14280).
 *
 * No cr_assert inside task bodies: tasks record what they saw, and the
 * test asserts on the main stack after tu_run().
 */
#include <errno.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "ferry/curl.h"
#include "testutil.h"

extern char **environ;

static pid_t srv_pid;
static int srv_port;

static void srv_start(void)
{
    char *argv[] = { (char *)HTTP_SERVER, NULL };
    posix_spawn_file_actions_t fa;
    char line[32];
    int p[2];
    ssize_t n;

    cr_assert_eq(pipe(p), 0);
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    posix_spawn_file_actions_addclose(&fa, p[0]);
    cr_assert_eq(posix_spawn(&srv_pid, HTTP_SERVER, &fa, NULL, argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    close(p[1]);
    n = read(p[0], line, sizeof line - 1);
    close(p[0]);
    cr_assert_gt(n, 0, "http_server did not start");
    line[n] = '\0';
    srv_port = atoi(line);
    cr_assert_gt(srv_port, 0);
}

static void setup(void)
{
    srv_start();
    tu_loop_setup();
}

/* For a test that makes its own loops. */
static void setup_no_loop(void)
{
    srv_start();
    tu_alloc_setup();
}

static void teardown(void)
{
    tu_loop_teardown();
    if (srv_pid > 0) {
        kill(srv_pid, SIGKILL);
        waitpid(srv_pid, NULL, 0);
    }
}

#define T(suite, name) \
    Test(suite, name, .init = setup, .fini = teardown, .timeout = 30.)

static void url(char *buf, size_t cap, const char *path)
{
    snprintf(buf, cap, "http://127.0.0.1:%d%s", srv_port, path);
}

/* A body of /size/N is 'a'..'z' repeated. */
static bool body_ok(const char *b, size_t len, size_t want)
{
    if (len != want)
        return false;
    for (size_t i = 0; i < len; i++)
        if (b[i] != (char)('a' + i % 26))
            return false;
    return true;
}

/* ---- bodies ------------------------------------------------------------ */

struct bodies {
    int rc_hello, rc_big, rc_post, rc_404, rc_partial, rc_after;
    long st_hello, st_404;
    bool hello_ok, big_ok, post_ok, after_ok;
    CURLcode code_partial;
};

static int bodies_main(void *arg)
{
    struct bodies *r = arg;
    ferry_curl_result res;
    char u[128];
    char *post = malloc(50000);

    url(u, sizeof u, "/hello");
    r->rc_hello = ferry_curl_get(u, &res, NULL);
    r->st_hello = res.status;
    r->hello_ok = r->rc_hello == 0 && res.len == 11 && strcmp(res.body, "hello world") == 0;
    ferry_curl_result_release(&res);

    url(u, sizeof u, "/size/300000");
    r->rc_big = ferry_curl_get(u, &res, NULL);
    r->big_ok = r->rc_big == 0 && body_ok(res.body, res.len, 300000);
    ferry_curl_result_release(&res);

    for (int i = 0; i < 50000; i++)
        post[i] = (char)(i * 7);
    url(u, sizeof u, "/echo");
    r->rc_post = ferry_curl_post(u, post, 50000, "application/x-test", &res, NULL);
    r->post_ok = r->rc_post == 0 && res.len == 50000 && memcmp(res.body, post, 50000) == 0;
    ferry_curl_result_release(&res);
    free(post);

    url(u, sizeof u, "/nothing-here");
    r->rc_404 = ferry_curl_get(u, &res, NULL);
    r->st_404 = res.status;
    ferry_curl_result_release(&res);

    /* The server announces 100 bytes, sends 10 and closes. */
    url(u, sizeof u, "/close");
    r->rc_partial = ferry_curl_get(u, &res, &r->code_partial);
    ferry_curl_result_release(&res);

    url(u, sizeof u, "/trickle/40");
    r->rc_after = ferry_curl_get(u, &res, NULL);
    r->after_ok = r->rc_after == 0 && body_ok(res.body, res.len, 40);
    ferry_curl_result_release(&res);
    return 0;
}

T(curl, get_post_bodies_and_curl_errors)
{
    struct bodies r;

    memset(&r, 0, sizeof r);
    cr_assert_eq(tu_run(bodies_main, &r), 0);
    cr_assert_eq(r.rc_hello, 0);
    cr_assert_eq(r.st_hello, 200);
    cr_assert(r.hello_ok);
    cr_assert(r.big_ok, "rc %d", r.rc_big);
    cr_assert(r.post_ok, "rc %d", r.rc_post);
    cr_assert_eq(r.rc_404, 0);
    cr_assert_eq(r.st_404, 404);
    cr_assert_eq(r.rc_partial, -EIO);
    cr_assert_eq(r.code_partial, CURLE_PARTIAL_FILE, "%d", r.code_partial);
    cr_assert(r.after_ok, "a trickled body after the broken one: rc %d", r.rc_after);
}

/* ---- many transfers, few connections --------------------------------- */

#define NCONC 100
static long g_connects;
static int g_wrong;

static size_t discard(char *d, size_t s, size_t n, void *arg)
{
    size_t *len = arg;

    (void)d;
    *len += s * n;
    return s * n;
}

static int conc_task(void *arg)
{
    CURL *e = curl_easy_init();
    char u[128];
    size_t len = 0;

    (void)arg;
    if (!e)
        return -ENOMEM;
    url(u, sizeof u, "/size/1000");
    curl_easy_setopt(e, CURLOPT_URL, u);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &len);
    for (int i = 0; i < 3; i++) {
        long nc = 0;

        len = 0;
        if (ferry_curl_perform(e, NULL) != 0 || len != 1000)
            g_wrong++;
        curl_easy_getinfo(e, CURLINFO_NUM_CONNECTS, &nc);
        g_connects += nc;
    }
    curl_easy_cleanup(e);
    return 0;
}

static int conc_main(void *arg)
{
    ferry_task *t[NCONC];
    CURLM *m;

    (void)arg;
    if (ferry_curl_multi(ferry_loop_current(), &m) != 0)
        return -1;
    curl_multi_setopt(m, CURLMOPT_MAX_HOST_CONNECTIONS, 8L);
    /* Keep all 8 in the cache: its default size follows the number of
     * transfers added, so it shrinks as they end and may close one that a
     * later transfer then has to open again. */
    curl_multi_setopt(m, CURLMOPT_MAXCONNECTS, 8L);
    for (int i = 0; i < NCONC; i++)
        t[i] = tu_spawn(conc_task, NULL);
    for (int i = 0; i < NCONC; i++)
        tu_join(t[i]);
    return 0;
}

T(curl, concurrent_transfers_share_connections)
{
    cr_assert_eq(tu_run(conc_main, NULL), 0);
    cr_assert_eq(g_wrong, 0);
    cr_log_info("%d transfers, %ld new connections", NCONC * 3, g_connects);
    cr_assert_leq(g_connects, 8, "%ld connections for %d transfers", g_connects, NCONC * 3);
    cr_assert_geq(g_connects, 1);
}

/* ---- cancellation and deadlines ---------------------------------------- */

struct cancel_res {
    int rc_cancel, rc_deadline, rc_reuse;
    CURLcode code_cancel;
    int64_t cancel_took, deadline_took;
    size_t reuse_len;
};
static CURL *g_easy;
static struct cancel_res *g_cr;

static int never_task(void *arg)
{
    (void)arg;
    g_cr->rc_cancel = ferry_curl_perform(g_easy, &g_cr->code_cancel);
    return 0;
}

static int cancel_main(void *arg)
{
    struct cancel_res *r = arg;
    ferry_scope sc;
    ferry_task *t;
    char u[128];
    int64_t t0;

    g_cr = r;
    g_easy = curl_easy_init();
    url(u, sizeof u, "/never");
    curl_easy_setopt(g_easy, CURLOPT_URL, u);
    curl_easy_setopt(g_easy, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_setopt(g_easy, CURLOPT_WRITEDATA, &r->reuse_len);
    t = tu_spawn(never_task, NULL);
    ferry_sleep(FERRY_MSEC(50));
    t0 = ferry_now();
    ferry_task_cancel(t);
    tu_join(t);
    r->cancel_took = ferry_now() - t0;

    t0 = ferry_now();
    ferry_scope_enter(&sc, t0 + FERRY_MSEC(50), 0);
    r->rc_deadline = ferry_curl_perform(g_easy, NULL);
    ferry_scope_exit(&sc);
    r->deadline_took = ferry_now() - t0;

    /* The same handle, reused. */
    url(u, sizeof u, "/size/777");
    curl_easy_setopt(g_easy, CURLOPT_URL, u);
    r->reuse_len = 0;
    r->rc_reuse = ferry_curl_perform(g_easy, NULL);
    curl_easy_cleanup(g_easy);
    return 0;
}

T(curl, cancel_and_deadline_return_at_once_and_handle_is_reusable)
{
    struct cancel_res r;

    memset(&r, 0, sizeof r);
    cr_assert_eq(tu_run(cancel_main, &r), 0);
    cr_assert_eq(r.rc_cancel, -ECANCELED);
    cr_assert_eq(r.code_cancel, CURLE_ABORTED_BY_CALLBACK);
    cr_assert_eq(r.rc_deadline, -ETIMEDOUT);
    cr_log_info("cancel returned after %.2f ms, deadline (50 ms) after %.2f ms",
                (double)r.cancel_took / 1e6, (double)r.deadline_took / 1e6);
    /* The server never answers: anything but "at once" would be a hang. */
    cr_assert_lt(r.cancel_took, FERRY_SEC(2));
    cr_assert_lt(r.deadline_took, FERRY_SEC(2));
    cr_assert_eq(r.rc_reuse, 0);
    cr_assert_eq(r.reuse_len, 777);
}

/* ---- random cancellation of 200 transfers ------------------------------ */

#define NRAND 200
struct rnd {
    CURL  *e;
    size_t want, len;
    char  *buf;
    int    rc;
    bool   wrong;
};
static struct rnd g_rnd[NRAND];

static size_t keep(char *d, size_t s, size_t n, void *arg)
{
    struct rnd *x = arg;
    size_t k = s * n;

    if (x->len + k > x->want) {
        x->wrong = true;
        return 0;
    }
    memcpy(x->buf + x->len, d, k);
    x->len += k;
    return k;
}

static int rnd_task(void *arg)
{
    struct rnd *x = arg;

    x->rc = ferry_curl_perform(x->e, NULL);
    if (x->rc == 0 && !body_ok(x->buf, x->len, x->want))
        x->wrong = true;
    return 0;
}

static int rnd_main(void *arg)
{
    ferry_task *t[NRAND];
    char u[128];

    (void)arg;
    srand(25);
    for (int i = 0; i < NRAND; i++) {
        struct rnd *x = &g_rnd[i];
        int kind = rand() % 3;

        x->want = 1000 + (size_t)i;
        x->buf = malloc(x->want);
        x->e = curl_easy_init();
        if (kind == 0)
            snprintf(u, sizeof u, "http://127.0.0.1:%d/size/%zu", srv_port, x->want);
        else if (kind == 1)
            snprintf(u, sizeof u, "http://127.0.0.1:%d/trickle/%zu", srv_port, x->want = 5 + (size_t)(i % 10));
        else
            snprintf(u, sizeof u, "http://127.0.0.1:%d/slow/%d", srv_port, rand() % 30), x->want = 4;
        curl_easy_setopt(x->e, CURLOPT_URL, u);
        curl_easy_setopt(x->e, CURLOPT_WRITEFUNCTION, keep);
        curl_easy_setopt(x->e, CURLOPT_WRITEDATA, x);
        t[i] = tu_spawn(rnd_task, x);
    }
    for (int k = 0; k < NRAND / 2; k++) {
        ferry_sleep(FERRY_USEC(rand() % 400));
        ferry_task_cancel(t[rand() % NRAND]);
    }
    for (int i = 0; i < NRAND; i++)
        tu_join(t[i]);
    return 0;
}

/* The slow endpoint's body is "slow", not the pattern. */
static bool rnd_ok(const struct rnd *x)
{
    if (x->rc != 0)
        return true;
    if (x->want == 4)
        return x->len == 4 && memcmp(x->buf, "slow", 4) == 0;
    return !x->wrong;
}

T(curl, random_cancellation_leaks_nothing_and_answers_right)
{
    int before = tu_open_fds(), after, done = 0, cancelled = 0;

    cr_assert_eq(tu_run(rnd_main, NULL), 0);
    for (int i = 0; i < NRAND; i++) {
        struct rnd *x = &g_rnd[i];

        if (x->rc == 0)
            done++;
        else if (x->rc == -ECANCELED)
            cancelled++;
        else
            cr_assert_fail("transfer %d: %d", i, x->rc);
        cr_assert(rnd_ok(x), "transfer %d answered wrong", i);
        curl_easy_cleanup(x->e);
        free(x->buf);
    }
    cr_log_info("%d done, %d cancelled", done, cancelled);
    cr_assert_gt(cancelled, 0);
    cr_assert_gt(done, 0);
    /* The loop's multi handle, with its connection cache, goes with it:
     * every descriptor it had must be closed. */
    ferry_loop_free(tu_loop);
    tu_loop = NULL;
    after = tu_open_fds();
    cr_assert_leq(after, before, "descriptors before %d, after %d", before, after);
}

/* ---- the curl issues replayed ----------------------------------------- */

/* #8286: a callback of curl that calls back in is refused, and the
 * transfer it runs in is not disturbed. */
static int g_inner_rc = 1;
static size_t reenter(char *d, size_t s, size_t n, void *arg)
{
    size_t *len = arg;

    if (g_inner_rc == 1) {
        CURL *other = curl_easy_init();
        g_inner_rc = ferry_curl_perform(other, NULL);
        curl_easy_cleanup(other);
    }
    (void)d;
    *len += s * n;
    return s * n;
}

static int reenter_main(void *arg)
{
    int *rc = arg;
    CURL *e = curl_easy_init();
    size_t len = 0;
    char u[128];

    url(u, sizeof u, "/size/5000");
    curl_easy_setopt(e, CURLOPT_URL, u);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, reenter);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &len);
    rc[0] = ferry_curl_perform(e, NULL);
    rc[1] = (int)len;
    curl_easy_cleanup(e);
    return 0;
}

T(curl, callback_reentering_curl_is_refused)
{
    int rc[2] = { -1, 0 };

    cr_assert_eq(tu_run(reenter_main, rc), 0);
    cr_assert(g_inner_rc == -EPERM || g_inner_rc == -EDEADLK, "inner call: %d", g_inner_rc);
    cr_assert_eq(rc[0], 0);
    cr_assert_eq(rc[1], 5000);
}

/* #9799: curl removes a socket when a transfer ends and brings it back
 * for the next; a socket it closes after REMOVE gets its number reused by
 * the next connection. */
static int g_socks[8], g_nsocks;
static int note_sock(void *arg, curl_socket_t s, curlsocktype purpose)
{
    (void)arg;
    (void)purpose;
    if (g_nsocks < 8)
        g_socks[g_nsocks++] = (int)s;
    return CURL_SOCKOPT_OK;
}

struct reuse_res { int rc_seq, rc_broken, rc_next; long seq_connects; int seq_ok; };

static int reuse_main(void *arg)
{
    struct reuse_res *r = arg;
    CURL *e = curl_easy_init();
    size_t len;
    char u[128];

    curl_easy_setopt(e, CURLOPT_SOCKOPTFUNCTION, note_sock);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &len);
    url(u, sizeof u, "/size/100");
    curl_easy_setopt(e, CURLOPT_URL, u);
    for (int i = 0; i < 20; i++) {
        long nc = 0;

        len = 0;
        if (ferry_curl_perform(e, NULL) == 0 && len == 100)
            r->seq_ok++;
        curl_easy_getinfo(e, CURLINFO_NUM_CONNECTS, &nc);
        r->seq_connects += nc;
    }
    /* The server breaks the connection: curl removes the socket, closes
     * it, and the next connection gets the same number. */
    url(u, sizeof u, "/close");
    curl_easy_setopt(e, CURLOPT_URL, u);
    r->rc_broken = ferry_curl_perform(e, NULL);
    url(u, sizeof u, "/size/100");
    curl_easy_setopt(e, CURLOPT_URL, u);
    len = 0;
    r->rc_next = ferry_curl_perform(e, NULL);
    if (len != 100)
        r->rc_next = -99;
    curl_easy_cleanup(e);
    return 0;
}

T(curl, socket_removed_closed_and_reused_keeps_working)
{
    struct reuse_res r;

    memset(&r, 0, sizeof r);
    cr_assert_eq(tu_run(reuse_main, &r), 0);
    cr_assert_eq(r.seq_ok, 20);
    cr_assert_eq(r.seq_connects, 1, "keep-alive: one connection for 20 transfers, got %ld",
                 r.seq_connects);
    cr_assert_eq(r.rc_broken, -EIO);
    cr_assert_eq(r.rc_next, 0);
    cr_assert_eq(g_nsocks, 2);
    cr_assert_eq(g_socks[0], g_socks[1], "the second socket got another number: %d, %d",
                 g_socks[0], g_socks[1]);
}

/* #14280: idle connections in the cache, one kept open by the server and
 * one it closed, do not keep the loop polling. */
static int idle_main(void *arg)
{
    uint64_t *polls = arg;
    ferry_loop_stats a, b;
    ferry_curl_result res;
    char u[128];

    url(u, sizeof u, "/hello");
    ferry_curl_get(u, &res, NULL);
    ferry_curl_result_release(&res);
    url(u, sizeof u, "/bye");
    ferry_curl_get(u, &res, NULL);
    ferry_curl_result_release(&res);
    ferry_loop_stats_get(ferry_loop_current(), &a);
    ferry_sleep(FERRY_MSEC(200));
    ferry_loop_stats_get(ferry_loop_current(), &b);
    *polls = b.polls - a.polls;
    return 0;
}

T(curl, idle_connections_do_not_spin_the_loop)
{
    uint64_t polls = 0;

    cr_assert_eq(tu_run(idle_main, &polls), 0);
    cr_log_info("polls over 200 ms idle: %llu", (unsigned long long)polls);
    cr_assert_lt(polls, 50, "%llu polls in 200 ms of idle", (unsigned long long)polls);
}

/* A runtime of two loops: each loop performs with a multi handle of its
 * own (libcurl handles are not thread-safe). */
static int rt_get(void *arg, void **result)
{
    ferry_curl_result res;
    CURLM *m = NULL;
    int rc;

    (void)arg;
    rc = ferry_curl_get((const char *)arg, &res, NULL);
    if (rc == 0 && strcmp(res.body, "hello world") != 0)
        rc = -EPROTO;
    ferry_curl_result_release(&res);
    ferry_curl_multi(ferry_loop_current(), &m);
    *result = m;
    return rc;
}

struct rt_res { int rc0, rc1, call; void *m0, *m1; };

static int rt_main(void *arg)
{
    struct rt_res *r = arg;
    char u[128];

    url(u, sizeof u, "/hello");
    r->rc0 = rt_get(u, &r->m0);
    r->call = ferry_runtime_call(ferry_runtime_current(), 1, rt_get, u, 0, &r->rc1, &r->m1);
    return 0;
}

Test(curl, each_loop_of_a_runtime_has_its_own_multi_handle, .init = setup_no_loop,
     .fini = teardown, .timeout = 30.)
{
    struct rt_res r;

    memset(&r, 0, sizeof r);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    cr_assert_eq(ferry_run_loops(2, rt_main, &r), 0);
    cr_assert_eq(r.call, 0);
    cr_assert_eq(r.rc0, 0);
    cr_assert_eq(r.rc1, 0);
    cr_assert_not_null(r.m0);
    cr_assert_not_null(r.m1);
    cr_assert_neq(r.m0, r.m1);
    curl_global_cleanup();
}
