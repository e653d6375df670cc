/* test_redis_queue.c - the durable queue of ferry/redis_queue.h against a
 * real redis-server started by each test (redis_server.c): put, get and
 * ack, trimming, consumers of one group, a consumer process killed between
 * get and ack, cancelled gets, and a blocked get beside other tasks.
 *
 * No cr_assert inside task bodies: tasks record what they saw into
 * variables, and the test asserts on the main stack after tu_run().
 */
#include <errno.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "ferry/redis_queue.h"
#define REDIS_SUITE test_redis_queue
#include "redis_fixture.h"
#include "testutil.h"

extern char **environ;

#define T(name) \
    Test(redis_queue, name, .init = redis_setup, .fini = redis_teardown, .timeout = 30.)

static int g_rc[16];
static long long g_int[16];
static char g_str[4][64];
static ferry_redis *g_conn;
static ferry_redis_queue *g_q;

/* Connect g_conn and open g_q as `consumer` of group "g" on stream "s". */
static int open_q(const char *consumer)
{
    int rc = ferry_redis_connect(&g_conn, "127.0.0.1", g_srv.port, NULL);

    if (rc)
        return rc;
    rc = ferry_redis_queue_open(&g_q, g_conn, "s", "g", consumer);
    if (rc) {
        ferry_redis_close(g_conn);
        g_conn = NULL;
    }
    return rc;
}

static void close_q(void)
{
    ferry_redis_queue_close(g_q);
    g_q = NULL;
    ferry_redis_close(g_conn);
    g_conn = NULL;
}

/* ---- put, get, ack ------------------------------------------------------ */

static char g_put_id[FERRY_REDIS_ID_MAX];

static int roundtrip_main(void *arg)
{
    static const char payload[] = { 'a', '\0', 'b', 'c' };
    ferry_redis_item *it = NULL;

    (void)arg;
    g_rc[0] = open_q("c1");
    if (g_rc[0])
        return 0;
    g_rc[1] = ferry_redis_queue_put(g_q, payload, sizeof(payload), 0, g_put_id);
    g_rc[2] = ferry_redis_queue_get(g_q, &it, FERRY_SEC(2));
    if (it != NULL) {
        snprintf(g_str[0], sizeof(g_str[0]), "%s", it->id);
        g_int[0] = (long long)it->len;
        g_int[1] = memcmp(it->data, payload, sizeof(payload)) == 0 && it->data[it->len] == '\0';
        g_int[2] = it->deliveries;
        g_rc[3] = ferry_redis_queue_ack(g_q, it->id);
        g_rc[4] = ferry_redis_queue_ack(g_q, it->id);
        ferry_redis_item_free(it);
    }
    /* Nothing left: no wait with timeout 0. */
    g_rc[5] = ferry_redis_queue_get(g_q, &it, 0);
    g_int[3] = it == NULL;
    close_q();
    return 0;
}

T(put_get_ack_roundtrip)
{
    cr_assert_eq(tu_run(roundtrip_main, NULL), 0);
    cr_assert_eq(g_rc[0], 0, "open: %d", g_rc[0]);
    cr_assert_eq(g_rc[1], 0, "put: %d", g_rc[1]);
    cr_assert_eq(g_rc[2], 0, "get: %d", g_rc[2]);
    cr_assert_str_eq(g_str[0], g_put_id, "got id %s, put %s", g_str[0], g_put_id);
    cr_assert_eq(g_int[0], 4, "payload of 4 bytes, got %lld", g_int[0]);
    cr_assert(g_int[1], "payload bytes differ");
    cr_assert_eq(g_int[2], 1, "deliveries %lld", g_int[2]);
    cr_assert_eq(g_rc[3], 0, "ack: %d", g_rc[3]);
    cr_assert_eq(g_rc[4], -ENOENT, "second ack: %d", g_rc[4]);
    cr_assert_eq(g_rc[5], -EAGAIN, "get on an empty queue: %d", g_rc[5]);
    cr_assert(g_int[3]);
    cr_assert_eq(tu_redis_query(&g_srv, NULL, 0, "XPENDING s g - + 10"), 0,
                 "nothing pending after the ack");
}

/* ---- maxlen ------------------------------------------------------------- */

#define NTRIM 300

static int trim_main(void *arg)
{
    (void)arg;
    g_rc[0] = open_q("c1");
    if (g_rc[0])
        return 0;
    for (int i = 0; i < 50 && g_rc[1] == 0; i++)
        g_rc[1] = ferry_redis_queue_put(g_q, "x", 1, 0, NULL);
    g_int[0] = tu_redis_query(&g_srv, NULL, 0, "XLEN s");
    for (int i = 0; i < NTRIM && g_rc[2] == 0; i++)
        g_rc[2] = ferry_redis_queue_put(g_q, "y", 1, 10, NULL);
    g_rc[3] = ferry_redis_queue_put(g_q, "last", 4, 10, g_put_id);
    close_q();
    return 0;
}

T(maxlen_trims)
{
    long long len;

    cr_assert_eq(tu_run(trim_main, NULL), 0);
    cr_assert_eq(g_rc[0], 0, "open: %d", g_rc[0]);
    cr_assert_eq(g_rc[1], 0);
    cr_assert_eq(g_int[0], 50, "maxlen 0 trims nothing: %lld entries", g_int[0]);
    cr_assert_eq(g_rc[2], 0);
    cr_assert_eq(g_rc[3], 0);
    len = tu_redis_query(&g_srv, NULL, 0, "XLEN s");
    cr_assert(len >= 10 && len < NTRIM, "%d puts with maxlen 10 left %lld entries", NTRIM + 51,
              len);
    /* The newest entry stays. */
    cr_assert_eq(tu_redis_query(&g_srv, NULL, 0, "XRANGE s %s %s", g_put_id, g_put_id), 1);
}

/* ---- two consumers ------------------------------------------------------ */

#define NTWO 20
static ferry_redis_queue *g_q2;
static int g_seen[NTWO];
static int g_by[2];
static int g_bad;

static int consume_task(void *arg)
{
    int who = (int)(intptr_t)arg;
    ferry_redis_queue *q = who == 0 ? g_q : g_q2;
    ferry_redis_item *it;
    int rc;

    while ((rc = ferry_redis_queue_get(q, &it, FERRY_MSEC(200))) == 0) {
        int i = atoi(it->data);

        if (i < 0 || i >= NTWO)
            g_bad++;
        else
            g_seen[i]++;
        g_by[who]++;
        if (ferry_redis_queue_ack(q, it->id) != 0)
            g_bad++;
        ferry_redis_item_free(it);
    }
    if (rc != -EAGAIN)
        g_bad++;
    return 0;
}

static int two_main(void *arg)
{
    char buf[16];
    ferry_task *a, *b;

    (void)arg;
    g_rc[0] = open_q("c1");
    if (g_rc[0])
        return 0;
    g_rc[1] = ferry_redis_queue_open(&g_q2, g_conn, "s", "g", "c2");
    if (g_rc[1] == 0) {
        for (int i = 0; i < NTWO; i++) {
            snprintf(buf, sizeof(buf), "%d", i);
            if (ferry_redis_queue_put(g_q, buf, strlen(buf), 0, NULL) != 0)
                g_bad++;
        }
        a = tu_spawn(consume_task, (void *)(intptr_t)0);
        b = tu_spawn(consume_task, (void *)(intptr_t)1);
        tu_join(a);
        tu_join(b);
        ferry_redis_queue_close(g_q2);
    }
    close_q();
    return 0;
}

T(two_consumers_get_distinct_items)
{
    cr_assert_eq(tu_run(two_main, NULL), 0);
    cr_assert_eq(g_rc[0], 0);
    cr_assert_eq(g_rc[1], 0);
    cr_assert_eq(g_bad, 0);
    for (int i = 0; i < NTWO; i++)
        cr_assert_eq(g_seen[i], 1, "item %d delivered %d times", i, g_seen[i]);
    cr_assert_eq(g_by[0] + g_by[1], NTWO);
    cr_assert(g_by[0] > 0 && g_by[1] > 0, "one consumer got everything: %d and %d", g_by[0],
              g_by[1]);
}

/* ---- a consumer process killed between get and ack --------------------- */

#define NKILL 10
#define NHELD 3
static char g_ids[NKILL][FERRY_REDIS_ID_MAX];
static char g_held[NHELD][FERRY_REDIS_ID_MAX];
static int g_acked[NKILL];
static int64_t g_deliv[NKILL];
static int g_nacked;

static int id_index(const char *id)
{
    for (int i = 0; i < NKILL; i++) {
        if (strcmp(g_ids[i], id) == 0)
            return i;
    }
    return -1;
}

static int survivor_main(void *arg)
{
    int64_t end = ferry_now() + tu_ms(5000);
    ferry_redis_item *it;
    int rc;

    (void)arg;
    g_rc[0] = open_q("survivor");
    if (g_rc[0])
        return 0;
    while (g_nacked < NKILL && ferry_now() < end) {
        rc = ferry_redis_queue_reclaim(g_q, FERRY_MSEC(100), 10);
        if (rc < 0)
            g_bad++;
        while ((rc = ferry_redis_queue_get(g_q, &it, FERRY_MSEC(50))) == 0) {
            int i = id_index(it->id);

            if (i < 0) {
                g_bad++;
            } else {
                g_deliv[i] = it->deliveries;
                if (ferry_redis_queue_ack(g_q, it->id) == 0) {
                    g_acked[i]++;
                    g_nacked++;
                } else {
                    g_bad++;
                }
            }
            ferry_redis_item_free(it);
        }
        if (rc != -EAGAIN)
            g_bad++;
    }
    close_q();
    return 0;
}

T(killed_consumer_loses_nothing)
{
    char port[16], n[16], line[128];
    char *argv[] = { REDIS_QUEUE_WORKER, port, "s", "g", "victim", n, NULL };
    posix_spawn_file_actions_t fa;
    int fds[2], nheld = 0, status;
    bool held = false;
    pid_t pid;
    FILE *out;

    for (int i = 0; i < NKILL; i++) {
        snprintf(line, sizeof(line), "item-%d", i);
        cr_assert_gt(tu_redis_query(&g_srv, g_ids[i], sizeof(g_ids[i]), "XADD s * d %s", line), 0);
    }
    snprintf(port, sizeof(port), "%d", g_srv.port);
    snprintf(n, sizeof(n), "%d", NHELD);
    cr_assert_eq(pipe(fds), 0);
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    cr_assert_eq(posix_spawn(&pid, REDIS_QUEUE_WORKER, &fa, NULL, argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    out = fdopen(fds[0], "r");
    cr_assert_not_null(out);
    while (!held && fgets(line, sizeof(line), out) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        if (strncmp(line, "got ", 4) == 0 && nheld < NHELD)
            snprintf(g_held[nheld++], sizeof(g_held[0]), "%s", line + 4);
        else if (strcmp(line, "held") == 0)
            held = true;
        else
            break;
    }
    /* The worker holds its items, pending under its name: kill it. */
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    fclose(out);
    cr_assert(held, "the worker did not take its items (last line: %s)", line);
    cr_assert_eq(nheld, NHELD);
    cr_assert_eq(tu_redis_query(&g_srv, NULL, 0, "XPENDING s g - + 100 victim"), NHELD);

    cr_assert_eq(tu_run(survivor_main, NULL), 0);
    cr_assert_eq(g_rc[0], 0, "open: %d", g_rc[0]);
    cr_assert_eq(g_bad, 0);
    cr_assert_eq(g_nacked, NKILL, "%d of %d items acknowledged", g_nacked, NKILL);
    for (int i = 0; i < NKILL; i++)
        cr_assert_eq(g_acked[i], 1, "item %d acknowledged %d times", i, g_acked[i]);
    for (int i = 0; i < NHELD; i++) {
        int k = id_index(g_held[i]);

        cr_assert_geq(k, 0, "the worker got an unknown id %s", g_held[i]);
        cr_assert_eq(g_deliv[k], 2, "held item %s: deliveries %lld", g_held[i],
                     (long long)g_deliv[k]);
    }
    cr_assert_eq(tu_redis_query(&g_srv, NULL, 0, "XPENDING s g - + 100"), 0);
}

/* ---- cancelled gets ----------------------------------------------------- */

static int blocked_get_task(void *arg)
{
    ferry_redis_item *it = NULL;
    int rc = ferry_redis_queue_get(g_q, &it, -1);

    (void)arg;
    g_int[8] = it != NULL;
    ferry_redis_item_free(it);
    return rc;
}

/* Wait until the server has `n` clients blocked (the get's read is
 * there). */
static int wait_blocked(int n)
{
    int64_t end = ferry_now() + tu_ms(2500);
    char want[32];
    redisReply *rep;

    snprintf(want, sizeof(want), "blocked_clients:%d\r", n);
    while (ferry_now() < end) {
        if (ferry_redis_command(g_conn, &rep, "INFO clients") != 0)
            return -1;
        if (rep->type == REDIS_REPLY_STRING && strstr(rep->str, want) != NULL) {
            ferry_redis_reply_free(rep);
            return 0;
        }
        ferry_redis_reply_free(rep);
        ferry_sleep(FERRY_MSEC(5));
    }
    return -ETIMEDOUT;
}

/*
 * A get blocked on the server, then in one step: an item put through the
 * other connection (sent before the get's end request, so the server hands
 * the item to the read) and the get cancelled.  The item comes back after
 * the get gave up.
 */
static int cancel_with_item_in_flight(void)
{
    const char *xadd[] = { "XADD", "s", "*", "d", "in-flight" };
    redisReply *rep = NULL;
    ferry_task *t;
    int rc;

    t = tu_spawn(blocked_get_task, NULL);
    rc = wait_blocked(1);
    if (rc) {
        tu_cancel_join(t);
        return rc;
    }
    rc = ferry_redis_send(g_conn, 5, xadd, NULL);
    ferry_task_cancel(t);
    g_rc[9] = tu_join(t);
    /* A round trip on the connection that carried the put and the end
     * request: both have run on the server when it is answered, and the
     * item is pending under the cancelled get's consumer. */
    if (rc == 0)
        rc = ferry_redis_command(g_conn, &rep, "PING");
    ferry_redis_reply_free(rep);
    g_int[9] = tu_redis_query(&g_srv, NULL, 0, "XPENDING s g - + 10 c1");
    return rc;
}

static int cancel_next_get_main(void *arg)
{
    ferry_redis_item *it = NULL;
    redisReply *rep = NULL;
    ferry_task *t;

    (void)arg;
    g_rc[0] = open_q("c1");
    if (g_rc[0])
        return 0;
    g_rc[1] = cancel_with_item_in_flight();
    g_rc[2] = ferry_redis_queue_get(g_q, &it, FERRY_SEC(2));
    if (it != NULL) {
        snprintf(g_str[0], sizeof(g_str[0]), "%s", it->data);
        g_int[0] = it->deliveries;
        g_rc[3] = ferry_redis_queue_ack(g_q, it->id);
        ferry_redis_item_free(it);
    }
    /* A new get blocks and times out as asked. */
    g_rc[4] = ferry_redis_queue_get(g_q, &it, FERRY_MSEC(50));
    /* A get cancelled with no item coming: the server ends its read
     * (else the read would hold the queue's connection). */
    t = tu_spawn(blocked_get_task, NULL);
    g_rc[5] = wait_blocked(1);
    ferry_task_cancel(t);
    g_rc[6] = tu_join(t);
    g_rc[7] = ferry_redis_command(g_conn, &rep, "PING");
    ferry_redis_reply_free(rep);
    g_rc[8] = wait_blocked(0);
    close_q();
    return 0;
}

T(cancelled_get_item_goes_to_next_get)
{
    cr_assert_eq(tu_run(cancel_next_get_main, NULL), 0);
    cr_assert_eq(g_rc[0], 0, "open: %d", g_rc[0]);
    cr_assert_eq(g_rc[1], 0, "set-up: %d", g_rc[1]);
    cr_assert_eq(g_rc[9], -ECANCELED, "the cancelled get: %d", g_rc[9]);
    cr_assert_eq(g_int[9], 1, "pending under the cancelled get's consumer: %lld", g_int[9]);
    cr_assert_not(g_int[8], "the cancelled get returned an item");
    cr_assert_eq(g_rc[2], 0, "the next get: %d", g_rc[2]);
    cr_assert_str_eq(g_str[0], "in-flight");
    cr_assert_eq(g_int[0], 1);
    cr_assert_eq(g_rc[3], 0);
    cr_assert_eq(g_rc[4], -EAGAIN, "%d", g_rc[4]);
    cr_assert_eq(g_rc[5], 0);
    cr_assert_eq(g_rc[6], -ECANCELED, "%d", g_rc[6]);
    cr_assert_eq(g_rc[7], 0);
    cr_assert_eq(g_rc[8], 0, "the cancelled get's read still blocks on the server: %d", g_rc[8]);
}

static int cancel_reclaim_main(void *arg)
{
    ferry_redis_item *it = NULL;

    (void)arg;
    g_rc[0] = open_q("c1");
    if (g_rc[0])
        return 0;
    g_rc[1] = cancel_with_item_in_flight();
    /* Closed before any get took the item back. */
    ferry_redis_queue_close(g_q);
    g_rc[2] = ferry_redis_queue_open(&g_q, g_conn, "s", "g", "c2");
    if (g_rc[2] == 0) {
        g_rc[3] = ferry_redis_queue_get(g_q, &it, 0);
        ferry_sleep(FERRY_MSEC(60));
        g_rc[4] = ferry_redis_queue_reclaim(g_q, FERRY_MSEC(50), 10);
        g_rc[5] = ferry_redis_queue_get(g_q, &it, 0);
        if (it != NULL) {
            snprintf(g_str[0], sizeof(g_str[0]), "%s", it->data);
            g_int[0] = it->deliveries;
            g_rc[6] = ferry_redis_queue_ack(g_q, it->id);
            ferry_redis_item_free(it);
        }
    }
    close_q();
    return 0;
}

T(cancelled_get_item_reclaimed_after_close)
{
    cr_assert_eq(tu_run(cancel_reclaim_main, NULL), 0);
    cr_assert_eq(g_rc[0], 0, "open: %d", g_rc[0]);
    cr_assert_eq(g_rc[1], 0, "set-up: %d", g_rc[1]);
    cr_assert_eq(g_rc[9], -ECANCELED, "the cancelled get: %d", g_rc[9]);
    cr_assert_eq(g_int[9], 1, "pending under the cancelled get's consumer: %lld", g_int[9]);
    cr_assert_eq(g_rc[2], 0);
    cr_assert_eq(g_rc[3], -EAGAIN, "the item is no new item: %d", g_rc[3]);
    cr_assert_eq(g_rc[4], 1, "reclaimed %d", g_rc[4]);
    cr_assert_eq(g_rc[5], 0, "get after the reclaim: %d", g_rc[5]);
    cr_assert_str_eq(g_str[0], "in-flight");
    cr_assert_eq(g_int[0], 2, "deliveries %lld", g_int[0]);
    cr_assert_eq(g_rc[6], 0);
    cr_assert_eq(tu_redis_query(&g_srv, NULL, 0, "XPENDING s g - + 10"), 0);
}

/* ---- a blocked get beside other tasks ----------------------------------- */

static bool g_get_done;

static int long_get_task(void *arg)
{
    ferry_redis_item *it = NULL;
    int rc;

    (void)arg;
    rc = ferry_redis_queue_get(g_q, &it, -1);
    if (it != NULL)
        snprintf(g_str[1], sizeof(g_str[1]), "%s", it->data);
    ferry_redis_item_free(it);
    g_get_done = true;
    return rc;
}

static int other_task(void *arg)
{
    ferry_redis_item *it = NULL;
    redisReply *rep = NULL;
    ferry_scope sc;

    (void)arg;
    /* A timer fires while the get waits on the server. */
    g_rc[1] = ferry_sleep(FERRY_MSEC(20));
    g_int[1] = !g_get_done;
    /* Commands on the other connection go through, well before the
     * server would end the get's read on its own. */
    ferry_scope_enter(&sc, ferry_now() + tu_ms(1000), 0);
    g_rc[2] = ferry_redis_command(g_conn, &rep, "SET %s %s", "k", "v");
    ferry_redis_reply_free(rep);
    g_rc[3] = ferry_redis_command(g_conn, &rep, "GET %s", "k");
    if (rep != NULL && rep->type == REDIS_REPLY_STRING)
        snprintf(g_str[0], sizeof(g_str[0]), "%s", rep->str);
    ferry_redis_reply_free(rep);
    ferry_scope_exit(&sc);
    /* A second get on the same queue meanwhile is refused. */
    g_rc[4] = ferry_redis_queue_get(g_q, &it, FERRY_MSEC(10));
    g_int[2] = !g_get_done;
    /* Only the item ends the get, which has no time limit. */
    g_rc[6] = ferry_redis_queue_put(g_q, "wake", 4, 0, NULL);
    return 0;
}

static int beside_main(void *arg)
{
    ferry_task *a, *b;

    (void)arg;
    g_rc[0] = open_q("c1");
    if (g_rc[0])
        return 0;
    a = tu_spawn(long_get_task, NULL);
    b = tu_spawn(other_task, NULL);
    tu_join(b);
    g_rc[5] = tu_join(a);
    close_q();
    return 0;
}

T(blocked_get_lets_other_tasks_run)
{
    cr_assert_eq(tu_run(beside_main, NULL), 0);
    cr_assert_eq(g_rc[0], 0, "open: %d", g_rc[0]);
    cr_assert_eq(g_rc[1], 0);
    cr_assert(g_int[1], "the timer fired only after the get returned");
    cr_assert_eq(g_rc[2], 0);
    cr_assert_eq(g_rc[3], 0);
    cr_assert_str_eq(g_str[0], "v");
    cr_assert_eq(g_rc[4], -EBUSY, "a second get: %d", g_rc[4]);
    cr_assert(g_int[2], "the commands went through only after the get returned");
    cr_assert_eq(g_rc[6], 0, "put: %d", g_rc[6]);
    cr_assert_eq(g_rc[5], 0, "the blocked get: %d", g_rc[5]);
    cr_assert_str_eq(g_str[1], "wake");
}

/* ---- closed under a waiting get ---------------------------------------- */

static int close_under_get_main(void *arg)
{
    ferry_task *t;

    (void)arg;
    g_rc[0] = open_q("c1");
    if (g_rc[0])
        return 0;
    t = tu_spawn(blocked_get_task, NULL);
    g_rc[1] = wait_blocked(1);
    ferry_redis_queue_close(g_q);
    g_q = NULL;
    g_rc[2] = tu_join(t);
    g_rc[3] = wait_blocked(0);
    close_q();
    return 0;
}

T(close_ends_a_waiting_get)
{
    cr_assert_eq(tu_run(close_under_get_main, NULL), 0);
    cr_assert_eq(g_rc[0], 0, "open: %d", g_rc[0]);
    cr_assert_eq(g_rc[1], 0);
    cr_assert_eq(g_rc[2], -ESHUTDOWN, "the waiting get: %d", g_rc[2]);
    cr_assert_not(g_int[8]);
    cr_assert_eq(g_rc[3], 0, "a read still blocks on the server: %d", g_rc[3]);
}

/* ---- the group lost on the server --------------------------------------- */

static int nogroup_main(void *arg)
{
    ferry_redis_item *it = NULL;

    (void)arg;
    g_rc[0] = open_q("c1");
    if (g_rc[0])
        return 0;
    g_int[0] = tu_redis_query(&g_srv, NULL, 0, "XGROUP DESTROY s g");
    g_rc[1] = ferry_redis_queue_put(g_q, "again", 5, 0, NULL);
    g_rc[2] = ferry_redis_queue_get(g_q, &it, FERRY_SEC(1));
    if (it != NULL) {
        snprintf(g_str[0], sizeof(g_str[0]), "%s", it->data);
        ferry_redis_item_free(it);
    }
    close_q();
    return 0;
}

T(get_makes_a_lost_group_again)
{
    cr_assert_eq(tu_run(nogroup_main, NULL), 0);
    cr_assert_eq(g_rc[0], 0, "open: %d", g_rc[0]);
    cr_assert_eq(g_int[0], 1, "group destroyed: %lld", g_int[0]);
    cr_assert_eq(g_rc[1], 0);
    cr_assert_eq(g_rc[2], 0, "get: %d", g_rc[2]);
    cr_assert_str_eq(g_str[0], "again");
}
