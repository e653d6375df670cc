/* test_redis.c - ferry_redis (redis.h): commands from tasks against a real
 * redis-server started by each test (redis_server.c), replies in order to
 * their own callers, a reply that comes after its caller gave up, the
 * server killed and restarted under a connection.
 *
 * No cr_assert inside task bodies: tasks record what they saw into
 * variables, and the test asserts on the main stack after tu_run().
 */
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/event.h>

#include <criterion/criterion.h>

#include "ferry/redis.h"
#define REDIS_SUITE test_redis
#include "redis_fixture.h"
#include "testutil.h"

#define T(name) \
    Test(redis, name, .init = redis_setup, .fini = redis_teardown, .timeout = 20.)

/* A Lua script that keeps the server busy for ARGV[1] milliseconds (by the
 * server's clock), then returns ARGV[2]. */
static const char busy_lua[] =
    "local t = redis.call('TIME') "
    "local stop = t[1] * 1000000 + t[2] + ARGV[1] * 1000 "
    "repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] >= stop "
    "return ARGV[2]";

static int connect_srv(ferry_redis **r)
{
    return ferry_redis_connect(r, "127.0.0.1", g_srv.port, NULL);
}

/* ---- round trips -------------------------------------------------------- */

static int g_rc[16];
static char g_str[8][64];
static long long g_int[8];

static int roundtrip_main(void *arg)
{
    ferry_redis *r;
    redisReply *rep;
    const char *argv[] = { "SET", "bin", "a\0b" };
    size_t lens[] = { 3, 3, 3 };

    (void)arg;
    g_rc[0] = connect_srv(&r);
    if (g_rc[0])
        return 0;
    g_rc[1] = ferry_redis_command(r, &rep, "SET %s %s", "k", "v");
    if (rep) {
        snprintf(g_str[0], sizeof(g_str[0]), "%s", rep->str);
        ferry_redis_reply_free(rep);
    }
    g_rc[2] = ferry_redis_commandv(r, &rep, 3, argv, lens);
    ferry_redis_reply_free(rep);
    g_rc[3] = ferry_redis_command(r, &rep, "STRLEN bin");
    if (rep) {
        g_int[0] = rep->integer;
        ferry_redis_reply_free(rep);
    }
    /* An error reply is a reply. */
    g_rc[4] = ferry_redis_command(r, &rep, "INCR k");
    if (rep) {
        g_int[1] = rep->type;
        ferry_redis_reply_free(rep);
    }
    g_rc[5] = ferry_redis_command(r, &rep, "SUBSCRIBE ch");
    g_int[2] = rep == NULL;
    g_int[3] = ferry_redis_client_id(r);
    g_rc[6] = ferry_redis_command(r, &rep, "GET k");
    if (rep) {
        snprintf(g_str[1], sizeof(g_str[1]), "%s", rep->str);
        ferry_redis_reply_free(rep);
    }
    ferry_redis_close(r);
    return 0;
}

T(command_roundtrip)
{
    cr_assert_eq(tu_run(roundtrip_main, NULL), 0);
    cr_assert_eq(g_rc[0], 0, "connect: %d", g_rc[0]);
    cr_assert_eq(g_rc[1], 0);
    cr_assert_str_eq(g_str[0], "OK");
    cr_assert_eq(g_rc[2], 0);
    cr_assert_eq(g_rc[3], 0);
    cr_assert_eq(g_int[0], 3, "binary value of 3 bytes, got %lld", g_int[0]);
    cr_assert_eq(g_rc[4], 0, "an error reply comes back as a reply: %d", g_rc[4]);
    cr_assert_eq(g_int[1], REDIS_REPLY_ERROR);
    cr_assert_eq(g_rc[5], -ENOTSUP, "SUBSCRIBE refused: %d", g_rc[5]);
    cr_assert(g_int[2]);
    cr_assert_gt(g_int[3], 0, "CLIENT ID known");
    cr_assert_eq(g_rc[6], 0);
    cr_assert_str_eq(g_str[1], "v");
}

/* ---- many tasks on one connection --------------------------------------- */

#define NPIPE 16
static ferry_redis *g_r;
static int g_mismatch;

static int pipe_task(void *arg)
{
    int id = (int)(intptr_t)arg;
    char key[16], val[16];
    redisReply *rep;

    snprintf(key, sizeof(key), "k%d", id);
    snprintf(val, sizeof(val), "v%d", id);
    for (int i = 0; i < 20; i++) {
        if (ferry_redis_command(g_r, &rep, "SET %s %s", key, val) != 0) {
            g_mismatch++;
            continue;
        }
        ferry_redis_reply_free(rep);
        if (ferry_redis_command(g_r, &rep, "GET %s", key) != 0 ||
            rep->type != REDIS_REPLY_STRING || strcmp(rep->str, val) != 0)
            g_mismatch++;
        ferry_redis_reply_free(rep);
    }
    return 0;
}

static int pipeline_main(void *arg)
{
    ferry_task *t[NPIPE];

    (void)arg;
    g_rc[0] = connect_srv(&g_r);
    if (g_rc[0])
        return 0;
    for (int i = 0; i < NPIPE; i++)
        t[i] = tu_spawn(pipe_task, (void *)(intptr_t)i);
    for (int i = 0; i < NPIPE; i++)
        tu_join(t[i]);
    ferry_redis_close(g_r);
    return 0;
}

T(tasks_get_their_own_replies)
{
    cr_assert_eq(tu_run(pipeline_main, NULL), 0);
    cr_assert_eq(g_rc[0], 0);
    cr_assert_eq(g_mismatch, 0, "%d replies went to the wrong task or failed", g_mismatch);
}

/* ---- a reply after its caller gave up ----------------------------------- */

static int g_late_calls;
static char g_late_str[32];

static void late_fn(ferry_redis *r, redisReply *reply, void *arg)
{
    (void)r;
    g_late_calls++;
    snprintf(g_late_str, sizeof(g_late_str), "%s|%s", (const char *)arg,
             reply && reply->type == REDIS_REPLY_STRING ? reply->str : "?");
}

static int late_main(void *arg)
{
    ferry_redis *r;
    redisReply *rep = NULL;
    ferry_scope sc;
    const char *argv[] = { "EVAL", busy_lua, "0", "300", "slow" };

    (void)arg;
    g_rc[0] = connect_srv(&r);
    if (g_rc[0])
        return 0;
    ferry_scope_enter(&sc, ferry_now() + FERRY_MSEC(50), 0);
    g_rc[1] = ferry_redis_commandv_late(r, &rep, 5, argv, NULL, late_fn, "tag");
    g_int[0] = rep == NULL;
    ferry_scope_exit(&sc);
    /* The next caller gets its own reply, not the slow one. */
    g_rc[2] = ferry_redis_command(r, &rep, "ECHO %s", "next");
    if (rep) {
        snprintf(g_str[0], sizeof(g_str[0]), "%s", rep->str);
        ferry_redis_reply_free(rep);
    }
    g_int[1] = g_late_calls;
    ferry_redis_close(r);
    return 0;
}

T(late_reply_goes_to_late_fn_not_next_caller)
{
    cr_assert_eq(tu_run(late_main, NULL), 0);
    cr_assert_eq(g_rc[0], 0);
    cr_assert_eq(g_rc[1], -ETIMEDOUT, "slow command: %d", g_rc[1]);
    cr_assert(g_int[0]);
    cr_assert_eq(g_rc[2], 0);
    cr_assert_str_eq(g_str[0], "next", "the next caller got '%s'", g_str[0]);
    cr_assert_eq(g_int[1], 1, "late function called %lld times", g_int[1]);
    cr_assert_str_eq(g_late_str, "tag|slow");
}

/* ---- cancelled while waiting -------------------------------------------- */

static int slow_task(void *arg)
{
    redisReply *rep = NULL;
    const char *argv[] = { "EVAL", busy_lua, "0", (const char *)arg, "slow" };
    int rc = ferry_redis_commandv(g_r, &rep, 5, argv, NULL);

    ferry_redis_reply_free(rep);
    return rc;
}

/* Waits on the server until another connection pushes to the list. */
static int blocked_task(void *arg)
{
    redisReply *rep = NULL;
    int rc = ferry_redis_command(g_r, &rep, "BLPOP %s 0", (const char *)arg);

    ferry_redis_reply_free(rep);
    return rc;
}

/* Whether the server holds a client in a blocking command. */
static bool server_blocks_a_client(ferry_redis *r)
{
    redisReply *rep = NULL;
    bool yes = false;

    if (ferry_redis_command(r, &rep, "INFO clients") == 0 && rep->str != NULL)
        yes = strstr(rep->str, "blocked_clients:0") == NULL &&
              strstr(rep->str, "blocked_clients:") != NULL;
    ferry_redis_reply_free(rep);
    return yes;
}

/* The caller is cancelled while its command is on the server, and the
 * reply cannot come before the test lets it (a BLPOP that waits for a
 * push): the outcome does not depend on how late this task runs on a
 * loaded machine.  (A script that keeps the server busy for a while did:
 * a sleep that overshot it let the reply in before the cancel.) */
static int cancel_main(void *arg)
{
    ferry_redis *other = NULL;
    redisReply *rep = NULL;
    ferry_task *t;

    (void)arg;
    g_rc[0] = connect_srv(&g_r);
    if (g_rc[0])
        return 0;
    g_rc[3] = connect_srv(&other);
    if (g_rc[3]) {
        ferry_redis_close(g_r);
        return 0;
    }
    t = tu_spawn(blocked_task, "cancel-list");
    g_rc[4] = -ETIMEDOUT;
    for (int i = 0; i < 5000 && g_rc[4]; i++) {
        if (server_blocks_a_client(other))
            g_rc[4] = 0;
        else
            ferry_sleep(FERRY_MSEC(1));
    }
    ferry_task_cancel(t);
    g_rc[1] = tu_join(t);
    /* The late reply to the BLPOP, then the next caller's own. */
    g_rc[5] = ferry_redis_command(other, &rep, "RPUSH %s %s", "cancel-list", "late");
    ferry_redis_reply_free(rep);
    rep = NULL;
    g_rc[2] = ferry_redis_command(g_r, &rep, "ECHO %s", "after");
    if (rep) {
        snprintf(g_str[0], sizeof(g_str[0]), "%s", rep->str);
        ferry_redis_reply_free(rep);
    }
    ferry_redis_close(other);
    ferry_redis_close(g_r);
    return 0;
}

T(cancelled_caller_returns_at_once)
{
    cr_assert_eq(tu_run(cancel_main, NULL), 0);
    cr_assert_eq(g_rc[0], 0);
    cr_assert_eq(g_rc[3], 0);
    cr_assert_eq(g_rc[4], 0, "the server never held the BLPOP");
    cr_assert_eq(g_rc[1], -ECANCELED, "%d", g_rc[1]);
    cr_assert_eq(g_rc[5], 0);
    cr_assert_eq(g_rc[2], 0);
    cr_assert_str_eq(g_str[0], "after");
}

/* ---- the server killed and restarted ------------------------------------ */

static int g_errs[64];
static int g_nerrs;
static int64_t g_longest;

static int restart_main(void *arg)
{
    ferry_redis_opts o = { .retry_min = FERRY_MSEC(20), .retry_max = FERRY_MSEC(100) };
    redisReply *rep = NULL;
    ferry_task *t;
    int rc;

    (void)arg;
    g_rc[0] = ferry_redis_connect(&g_r, "127.0.0.1", g_srv.port, &o);
    if (g_rc[0])
        return 0;
    /* A command in flight when the server dies. */
    t = tu_spawn(slow_task, "2000");
    ferry_sleep(FERRY_MSEC(50));
    tu_redis_kill(&g_srv);
    g_rc[1] = tu_join(t);
    /* While it is down: errors, each at once. */
    for (int i = 0; i < 10; i++) {
        int64_t t0 = ferry_now();

        rc = ferry_redis_command(g_r, &rep, "PING");
        if (ferry_now() - t0 > g_longest)
            g_longest = ferry_now() - t0;
        if (g_nerrs < 64)
            g_errs[g_nerrs++] = rc;
        ferry_redis_reply_free(rep);
        ferry_sleep(FERRY_MSEC(10));
    }
    g_rc[2] = tu_redis_start(&g_srv);
    /* Back: a command succeeds within the back-off. */
    g_rc[3] = -1;
    for (int i = 0; i < 100 && g_rc[3] != 0; i++) {
        g_rc[3] = ferry_redis_command(g_r, &rep, "SET %s %s", "back", "yes");
        ferry_redis_reply_free(rep);
        rep = NULL;
        if (g_rc[3])
            ferry_sleep(FERRY_MSEC(20));
    }
    g_int[0] = ferry_redis_connected(g_r);
    ferry_redis_close(g_r);
    return 0;
}

T(restart_gives_errors_then_recovery)
{
    cr_assert_eq(tu_run(restart_main, NULL), 0);
    cr_assert_eq(g_rc[0], 0);
    cr_assert_eq(g_rc[1], -ECONNRESET, "in flight when the server died: %d", g_rc[1]);
    for (int i = 0; i < g_nerrs; i++)
        cr_assert(g_errs[i] == -ECONNREFUSED || g_errs[i] == -ECONNRESET,
                  "command %d while down: %d", i, g_errs[i]);
    cr_assert_lt(g_longest, tu_ms(1000), "a command while down took %lld ns",
                 (long long)g_longest);
    cr_assert_eq(g_rc[2], 0, "restart: %d", g_rc[2]);
    cr_assert_eq(g_rc[3], 0, "after the restart: %d", g_rc[3]);
    cr_assert(g_int[0]);
    cr_assert_eq(tu_redis_query(&g_srv, NULL, 0, "EXISTS back"), 1);
}

/* ---- no server ---------------------------------------------------------- */

static int refused_main(void *arg)
{
    ferry_redis *r = NULL;

    (void)arg;
    g_rc[0] = ferry_redis_connect(&r, "127.0.0.1", g_srv.port, NULL);
    g_int[0] = r == NULL;
    return 0;
}

T(connect_refused)
{
    tu_redis_kill(&g_srv);
    cr_assert_eq(tu_run(refused_main, NULL), 0);
    cr_assert_eq(g_rc[0], -ECONNREFUSED, "%d", g_rc[0]);
    cr_assert(g_int[0]);
}

/* ---- close writes what was sent without waiting -------------------------- */

static int send_close_main(void *arg)
{
    ferry_redis *r;
    const char *argv[] = { "SET", "sent", "before-close" };

    (void)arg;
    g_rc[0] = connect_srv(&r);
    if (g_rc[0])
        return 0;
    g_rc[1] = ferry_redis_send(r, 3, argv, NULL);
    ferry_redis_close(r);
    return 0;
}

T(close_writes_commands_sent_without_waiting)
{
    long long found = 0;

    cr_assert_eq(tu_run(send_close_main, NULL), 0);
    cr_assert_eq(g_rc[0], 0);
    cr_assert_eq(g_rc[1], 0);
    /* The server runs what it read before it saw the connection close. */
    for (int i = 0; i < 50 && found != 1; i++) {
        found = tu_redis_query(&g_srv, NULL, 0, "EXISTS sent");
        if (found != 1)
            usleep(20 * 1000);
    }
    cr_assert_eq(found, 1, "the command sent just before the close reached the server");
}

/* ---- a server that accepts but never answers ----------------------------- */

static int g_silent_port;

static int silent_main(void *arg)
{
    ferry_redis_opts o = { .connect_timeout = FERRY_MSEC(100) };
    ferry_redis *r = NULL;
    ferry_scope outer;

    (void)arg;
    ferry_scope_enter(&outer, ferry_now() + tu_ms(3000), 0);
    g_rc[0] = ferry_redis_connect(&r, "127.0.0.1", g_silent_port, &o);
    g_int[0] = ferry_scope_fired(&outer);
    ferry_scope_exit(&outer);
    g_int[1] = r == NULL;
    return 0;
}

T(connect_to_a_silent_server_times_out)
{
    struct sockaddr_in a;
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    /* Listening, so the TCP connect succeeds, but never accepting or
     * answering. */
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    cr_assert_eq(listen(fd, 8), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    g_silent_port = ntohs(a.sin_port);
    cr_assert_eq(tu_run(silent_main, NULL), 0);
    close(fd);
    cr_assert_eq(g_rc[0], -ETIMEDOUT, "%d", g_rc[0]);
    cr_assert_not(g_int[0], "the connect's own timeout ended it, not the caller's deadline");
    cr_assert(g_int[1]);
}

/* ---- a late function when the caller gave up before sending -------------- */

static int early_main(void *arg)
{
    ferry_redis *r;
    redisReply *rep = NULL;
    const char *argv[] = { "SET", "early", "x" };

    (void)arg;
    g_rc[0] = connect_srv(&r);
    if (g_rc[0])
        return 0;
    ferry_task_cancel(ferry_task_current());
    g_rc[1] = ferry_redis_commandv_late(r, &rep, 3, argv, NULL, late_fn, "early");
    g_int[0] = g_late_calls;
    ferry_redis_close(r);
    return 0;
}

T(late_fn_called_when_given_up_before_sending)
{
    cr_assert_eq(tu_run(early_main, NULL), 0);
    cr_assert_eq(g_rc[0], 0);
    cr_assert_eq(g_rc[1], -ECANCELED, "%d", g_rc[1]);
    cr_assert_eq(g_int[0], 1, "late function called %lld times", g_int[0]);
    cr_assert_str_eq(g_late_str, "early|?");
    cr_assert_eq(tu_redis_query(&g_srv, NULL, 0, "EXISTS early"), 0, "nothing was sent");
}

/* ---- a command's write needs no write event ------------------------------ */

static int incr_task(void *arg)
{
    ferry_redis *r = arg;
    redisReply *rep = NULL;
    int rc = 0;

    for (int i = 0; i < 20 && rc == 0; i++) {
        rc = ferry_redis_command(r, &rep, "INCR %s", "counted");
        ferry_redis_reply_free(rep);
        rep = NULL;
    }
    return rc;
}

static int write_event_main(void *arg)
{
    struct event_base *base = ferry_loop_base(ferry_loop_current());
    ferry_task *t[4];
    ferry_redis *r;

    (void)arg;
    g_rc[0] = connect_srv(&r);
    if (g_rc[0])
        return 0;
    /* At rest the loop's own events and the connection's read event are
     * added; the most ever added starts again from there. */
    g_int[0] = event_base_get_num_events(base, EVENT_BASE_COUNT_ADDED);
    event_base_get_max_events(base, EVENT_BASE_COUNT_ADDED, 1);
    for (int i = 0; i < 4; i++)
        t[i] = tu_spawn(incr_task, r);
    for (int i = 0; i < 4; i++)
        g_rc[1 + i] = tu_join(t[i]);
    g_int[1] = event_base_get_max_events(base, EVENT_BASE_COUNT_ADDED, 0);
    g_int[2] = event_base_get_num_events(base, EVENT_BASE_COUNT_ADDED);
    ferry_redis_close(r);
    return 0;
}

T(commands_add_no_write_event)
{
    char count[16];

    cr_assert_eq(tu_run(write_event_main, NULL), 0);
    cr_assert_eq(g_rc[0], 0, "connect: %d", g_rc[0]);
    for (int i = 1; i <= 4; i++)
        cr_assert_eq(g_rc[i], 0, "task %d: %d", i, g_rc[i]);
    cr_assert_eq(tu_redis_query(&g_srv, count, sizeof(count), "GET counted"), 2);
    cr_assert_str_eq(count, "80");
    /* libevent counts an event that is both added and active twice.  The
     * socket always took the commands at once, so during them the count
     * rose only by the read event being active while it ran: no write
     * event was added (or made active). */
    cr_assert_leq(g_int[1], g_int[0] + 1,
                  "events counted at most during the commands: %lld, at rest: %lld", g_int[1],
                  g_int[0]);
    cr_assert_eq(g_int[2], g_int[0], "events added after the commands: %lld, at rest: %lld",
                 g_int[2], g_int[0]);
}

/* ---- SIGPIPE from a peer that stopped reading --------------------------- */

/*
 * A peer on a Unix socket that answers the connection's first commands,
 * then shuts its reading side: the client's next write fails with EPIPE
 * and raises SIGPIPE, while the client sees nothing to read.
 */
static int g_peer_listen = -1;
static int g_peer_shut;
static int g_peer_done;

static void *peer_main(void *arg)
{
    static const char answers[] = ":7\r\n+PONG\r\n";
    char buf[512];
    size_t got = 0;
    ssize_t n;
    int fd;

    (void)arg;
    fd = accept(g_peer_listen, NULL, NULL);
    if (fd < 0)
        return NULL;
    buf[0] = '\0';
    while (strstr(buf, "PING") == NULL && got < sizeof(buf) - 1) {
        n = read(fd, buf + got, sizeof(buf) - 1 - got);
        if (n <= 0)
            break;
        got += (size_t)n;
        buf[got] = '\0';
    }
    if (write(fd, answers, sizeof(answers) - 1) < 0)
        perror("peer write");
    shutdown(fd, SHUT_RD);
    __atomic_store_n(&g_peer_shut, 1, __ATOMIC_RELEASE);
    while (!__atomic_load_n(&g_peer_done, __ATOMIC_ACQUIRE))
        usleep(1000);
    close(fd);
    return NULL;
}

static int sigpipe_main(void *arg)
{
    const char *path = arg;
    ferry_redis *r = NULL;
    redisReply *rep = NULL;
    sigset_t pending;

    g_rc[0] = ferry_redis_connect(&r, path, 0, NULL);
    if (g_rc[0])
        return 0;
    for (int i = 0; i < 2000 && !__atomic_load_n(&g_peer_shut, __ATOMIC_ACQUIRE); i++)
        ferry_sleep(FERRY_MSEC(1));
    g_int[0] = __atomic_load_n(&g_peer_shut, __ATOMIC_ACQUIRE);
    g_rc[1] = ferry_redis_command(r, &rep, "PING");
    ferry_redis_reply_free(rep);
    sigemptyset(&pending);
    sigpending(&pending);
    g_int[1] = sigismember(&pending, SIGPIPE);
    ferry_redis_close(r);
    return 0;
}

static void check_sigpipe(void (*disposition)(int))
{
    struct sockaddr_un a;
    pthread_t th;

    cr_assert_neq(signal(SIGPIPE, disposition), SIG_ERR);
    memset(&a, 0, sizeof(a));
    a.sun_family = AF_UNIX;
    snprintf(a.sun_path, sizeof(a.sun_path), "/tmp/ferry-test-redis-pipe-%d.sock", (int)getpid());
    unlink(a.sun_path);
    g_peer_listen = socket(AF_UNIX, SOCK_STREAM, 0);
    cr_assert_geq(g_peer_listen, 0);
    cr_assert_eq(bind(g_peer_listen, (struct sockaddr *)&a, sizeof(a)), 0);
    cr_assert_eq(listen(g_peer_listen, 4), 0);
    cr_assert_eq(pthread_create(&th, NULL, peer_main, NULL), 0);
    cr_assert_eq(tu_run(sigpipe_main, a.sun_path), 0);
    __atomic_store_n(&g_peer_done, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    close(g_peer_listen);
    unlink(a.sun_path);
    cr_assert_eq(g_rc[0], 0, "connect: %d", g_rc[0]);
    cr_assert(g_int[0], "the peer shut its reading side");
    /* The process is alive to get here; the command learns the loss. */
    cr_assert_eq(g_rc[1], -ECONNRESET, "the command after the peer stopped reading: %d", g_rc[1]);
    cr_assert_eq(g_int[1], 0, "no SIGPIPE left pending");
}

T(write_to_a_peer_that_stopped_reading_raises_no_sigpipe)
{
    check_sigpipe(SIG_DFL);
}

T(write_to_a_peer_that_stopped_reading_with_sigpipe_ignored)
{
    check_sigpipe(SIG_IGN);
}
