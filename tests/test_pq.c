/* test_pq.c - ferry_pq (pq.h) against a real PostgreSQL server, which
 * tests/pg_cluster.sh starts and names in FERRY_PQ_CONNINFO: parameters
 * and results, a pipeline of 1,000 inserts, COPY both ways, LISTEN/NOTIFY
 * to a waiting task and through select, a deadline that cancels the query
 * on the server, random cancellation through the pool, and backends
 * killed under the pool.
 *
 * No cr_assert inside task bodies: tasks record what they saw into
 * variables, and the test asserts on the main stack after tu_run().
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "ferry/ferry.h"
#include "ferry/pq.h"
#include "ferry/select.h"
#include "testutil.h"

static const char *g_conninfo;

static void pq_setup(void)
{
    g_conninfo = getenv("FERRY_PQ_CONNINFO");
    if (!g_conninfo || !*g_conninfo) {
        fprintf(stderr, "test_pq: SKIPPED: FERRY_PQ_CONNINFO not set "
                        "(run through tests/pg_cluster.sh, as ctest does)\n");
        cr_skip_test("no PostgreSQL server");
    }
    tu_loop_setup();
}

#define T(name, secs) \
    Test(pq, name, .init = pq_setup, .fini = tu_loop_teardown, .timeout = secs)

/* What a task saw, checked on the main stack. */
static int g_rc[16];
static char g_str[8][128];
static long g_num[16];

/* One value of a one-row result as a number; -1 when not there. */
static long first_num(PGresult *r)
{
    if (!r || PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) < 1 ||
        PQgetisnull(r, 0, 0))
        return -1;
    return atol(PQgetvalue(r, 0, 0));
}

/* Run a query expected to give one number (as first_num()); -100 - errno
 * on a failed call. */
static long query_num(ferry_pq *c, const char *sql)
{
    PGresult *r;
    long v;
    int rc = ferry_pq_query(c, &r, sql, 0, NULL);

    if (rc)
        return -100 + rc;
    v = first_num(r);
    PQclear(r);
    return v;
}

/* ---- parameters and results ---------------------------------------- */

static int params_main(void *arg)
{
    const char *vals[] = { "40", "2", "it's \"quoted\"", NULL };
    char err[256] = "";
    ferry_pq_opts opts = { .errbuf = err, .errbuf_len = sizeof(err) };
    ferry_pq *c, *bad;
    PGresult *r;

    (void)arg;
    g_rc[0] = ferry_pq_connect(&c, g_conninfo, NULL);
    if (g_rc[0])
        return 0;
    g_rc[1] = ferry_pq_query(c, &r, "SELECT $1::int + $2::int, $3::text, $4::text IS NULL", 4, vals);
    if (!g_rc[1]) {
        g_num[0] = PQresultStatus(r);
        g_num[1] = first_num(r);
        snprintf(g_str[0], sizeof(g_str[0]), "%s", PQgetvalue(r, 0, 1));
        snprintf(g_str[1], sizeof(g_str[1]), "%s", PQgetvalue(r, 0, 2));
        PQclear(r);
    }
    /* A server error is a result, and the connection goes on. */
    g_rc[2] = ferry_pq_query(c, &r, "SELECT 1/0", 0, NULL);
    if (!g_rc[2]) {
        g_num[2] = PQresultStatus(r);
        snprintf(g_str[2], sizeof(g_str[2]), "%s", PQresultErrorField(r, PG_DIAG_SQLSTATE));
        PQclear(r);
    }
    g_rc[3] = ferry_pq_exec(c, "SELECT nonsense FROM nowhere");
    g_rc[4] = ferry_pq_exec(c, "CREATE TEMP TABLE t (a int); INSERT INTO t VALUES (7)");
    g_num[3] = query_num(c, "SELECT a FROM t");
    /* Binary results. */
    g_rc[5] = ferry_pq_query_params(c, &r, "SELECT 258::int4", 0, NULL, NULL, NULL, NULL, 1);
    if (!g_rc[5]) {
        const unsigned char *b = (const unsigned char *)PQgetvalue(r, 0, 0);

        g_num[4] = PQgetlength(r, 0, 0) == 4 ? (b[2] << 8 | b[3]) : -1;
        PQclear(r);
    }
    g_num[5] = ferry_pq_ok(c);
    /* Prepared once, run twice; a preparation the server refuses. */
    g_rc[7] = ferry_pq_prepare(c, &r, "add", "SELECT $1::int + $2::int", 2, NULL);
    g_num[7] = r ? PQresultStatus(r) : -1;
    PQclear(r);
    g_rc[8] = ferry_pq_query_prepared(c, &r, "add", 2, vals, NULL, NULL, 0);
    g_num[8] = first_num(r);
    PQclear(r);
    vals[0] = "-2";
    g_rc[9] = ferry_pq_query_prepared(c, &r, "add", 2, vals, NULL, NULL, 0);
    g_num[9] = first_num(r);
    PQclear(r);
    g_rc[10] = ferry_pq_prepare(c, &r, "bad", "SELEKT 1", 0, NULL);
    g_num[10] = r ? PQresultStatus(r) : -1;
    PQclear(r);
    g_rc[11] = ferry_pq_query_prepared(c, &r, NULL, 0, NULL, NULL, NULL, 0);
    ferry_pq_free(c);
    /* A server that is not there: refused, with libpq's message. */
    g_rc[6] = ferry_pq_connect(&bad, "host=127.0.0.1 port=1 connect_timeout=5", &opts);
    g_num[6] = bad == NULL;
    snprintf(g_str[3], sizeof(g_str[3]), "%s", err);
    return 0;
}

T(params_and_results, 20.)
{
    cr_assert_eq(tu_run(params_main, NULL), 0);
    cr_assert_eq(g_rc[0], 0, "connect: %d", g_rc[0]);
    cr_assert_eq(g_rc[1], 0);
    cr_expect_eq(g_num[0], PGRES_TUPLES_OK);
    cr_expect_eq(g_num[1], 42);
    cr_expect_str_eq(g_str[0], "it's \"quoted\"");
    cr_expect_str_eq(g_str[1], "t");
    cr_expect_eq(g_rc[2], 0);
    cr_expect_eq(g_num[2], PGRES_FATAL_ERROR);
    cr_expect_str_eq(g_str[2], "22012");
    cr_expect_eq(g_rc[3], -EIO);
    cr_expect_eq(g_rc[4], 0);
    cr_expect_eq(g_num[3], 7);
    cr_expect_eq(g_rc[5], 0);
    cr_expect_eq(g_num[4], 258);
    cr_expect_eq(g_num[5], 1);
    cr_expect_eq(g_rc[6], -ECONNREFUSED);
    cr_expect_eq(g_num[6], 1);
    cr_expect_neq(g_str[3][0], '\0', "no message for the failed connect");
    cr_expect_eq(g_rc[7], 0);
    cr_expect_eq(g_num[7], PGRES_COMMAND_OK);
    cr_expect_eq(g_rc[8], 0);
    cr_expect_eq(g_num[8], 42);
    cr_expect_eq(g_rc[9], 0);
    cr_expect_eq(g_num[9], 0);
    cr_expect_eq(g_rc[10], 0);
    cr_expect_eq(g_num[10], PGRES_FATAL_ERROR);
    cr_expect_eq(g_rc[11], -EINVAL);
}

/* ---- pipeline -------------------------------------------------------- */

static int pipeline_main(void *arg)
{
    ferry_pq *c;
    PGresult *r;
    int ok = 0, syncs = 0, other = 0;

    (void)arg;
    g_rc[0] = ferry_pq_connect(&c, g_conninfo, NULL);
    if (g_rc[0])
        return 0;
    g_rc[1] = ferry_pq_exec(c, "CREATE TEMP TABLE p (i int, s text)");
    g_rc[2] = ferry_pq_pipeline_enter(c);
    g_rc[3] = ferry_pq_query(c, &r, "SELECT 1", 0, NULL);   /* not in pipeline mode */
    for (int i = 0; i < 1000 && !g_rc[4]; i++) {
        char num[16], txt[32];
        const char *vals[] = { num, txt };

        snprintf(num, sizeof(num), "%d", i);
        snprintf(txt, sizeof(txt), "row %d", i);
        g_rc[4] = ferry_pq_send(c, "INSERT INTO p VALUES ($1, $2)", 2, NULL, vals, NULL, NULL, 0);
    }
    g_rc[5] = ferry_pq_sync(c);
    for (;;) {
        int rc = ferry_pq_recv(c, &r);

        if (rc) {
            g_rc[6] = rc;
            break;
        }
        if (PQresultStatus(r) == PGRES_COMMAND_OK)
            ok++;
        else if (PQresultStatus(r) == PGRES_PIPELINE_SYNC)
            syncs++;
        else
            other++;
        PQclear(r);
    }
    g_num[0] = ok;
    g_num[1] = syncs;
    g_num[2] = other;
    /* A second batch: one preparation, 500 executions of it. */
    g_rc[8] = ferry_pq_send_prepare(c, "ins", "INSERT INTO p VALUES ($1, $2)", 2, NULL);
    for (int i = 1000; i < 1500 && !g_rc[9]; i++) {
        char num[16], txt[32];
        const char *vals[] = { num, txt };

        snprintf(num, sizeof(num), "%d", i);
        snprintf(txt, sizeof(txt), "row %d", i);
        g_rc[9] = ferry_pq_send_prepared(c, "ins", 2, vals, NULL, NULL, 0);
    }
    g_rc[10] = ferry_pq_sync(c);
    ok = 0;
    while (ferry_pq_recv(c, &r) == 0) {
        ok += PQresultStatus(r) == PGRES_COMMAND_OK;
        PQclear(r);
    }
    g_num[5] = ok;
    g_rc[7] = ferry_pq_pipeline_exit(c);
    g_num[3] = query_num(c, "SELECT count(*) FROM p");
    g_num[4] = query_num(c, "SELECT sum(i) FROM p WHERE s = 'row ' || i");
    ferry_pq_free(c);
    return 0;
}

T(pipeline_of_1000_inserts, 20.)
{
    cr_assert_eq(tu_run(pipeline_main, NULL), 0);
    cr_assert_eq(g_rc[0], 0);
    cr_expect_eq(g_rc[1], 0);
    cr_expect_eq(g_rc[2], 0);
    cr_expect_eq(g_rc[3], -EBUSY);
    cr_expect_eq(g_rc[4], 0);
    cr_expect_eq(g_rc[5], 0);
    cr_expect_eq(g_rc[6], -ENODATA);
    cr_expect_eq(g_num[0], 1000);
    cr_expect_eq(g_num[1], 1);
    cr_expect_eq(g_num[2], 0);
    cr_expect_eq(g_rc[7], 0);
    cr_expect_eq(g_rc[8], 0);
    cr_expect_eq(g_rc[9], 0);
    cr_expect_eq(g_rc[10], 0);
    cr_expect_eq(g_num[5], 501);
    cr_expect_eq(g_num[3], 1500);
    cr_expect_eq(g_num[4], 1499L * 1500 / 2);
}

/* ---- COPY ------------------------------------------------------------ */

static int copy_main(void *arg)
{
    ferry_pq *c;
    PGresult *r;
    char line[64];
    size_t got = 0, bad = 0;

    (void)arg;
    g_rc[0] = ferry_pq_connect(&c, g_conninfo, NULL);
    if (g_rc[0])
        return 0;
    ferry_pq_exec(c, "CREATE TEMP TABLE cp (i int, s text)");
    g_rc[1] = ferry_pq_copy_start(c, &r, "COPY cp FROM STDIN");
    g_num[0] = r ? PQresultStatus(r) : -1;
    PQclear(r);
    for (int i = 0; i < 5000 && !g_rc[2]; i++) {
        int n = snprintf(line, sizeof(line), "%d\tline %d\\twith tab\n", i, i);

        g_rc[2] = ferry_pq_copy_put(c, line, (size_t)n);
    }
    g_rc[3] = ferry_pq_copy_end(c, NULL, &r);
    g_num[1] = r ? PQresultStatus(r) : -1;
    PQclear(r);
    g_rc[4] = ferry_pq_copy_start(c, &r, "COPY (SELECT * FROM cp ORDER BY i) TO STDOUT");
    g_num[2] = r ? PQresultStatus(r) : -1;
    PQclear(r);
    for (;;) {
        char *buf;
        size_t len;
        int rc = ferry_pq_copy_get(c, &buf, &len);

        if (rc) {
            g_rc[5] = rc;
            break;
        }
        snprintf(line, sizeof(line), "%zu\tline %zu\\twith tab\n", got, got);
        if (len != strlen(line) || memcmp(buf, line, len) != 0)
            bad++;
        got++;
        PQfreemem(buf);
    }
    g_rc[6] = ferry_pq_copy_end(c, NULL, &r);
    g_num[3] = r ? PQresultStatus(r) : -1;
    snprintf(g_str[0], sizeof(g_str[0]), "%s", r ? PQcmdTuples(r) : "");
    PQclear(r);
    g_num[4] = (long)got;
    g_num[5] = (long)bad;
    /* An aborted COPY IN leaves the table as it was and the connection idle. */
    ferry_pq_copy_start(c, &r, "COPY cp FROM STDIN");
    PQclear(r);
    ferry_pq_copy_put(c, "9999\tx\n", 7);
    g_rc[7] = ferry_pq_copy_end(c, "changed my mind", &r);
    g_num[6] = r ? PQresultStatus(r) : -1;
    PQclear(r);
    g_num[7] = query_num(c, "SELECT count(*) FROM cp");
    ferry_pq_free(c);
    return 0;
}

T(copy_in_and_out_round_trip, 20.)
{
    cr_assert_eq(tu_run(copy_main, NULL), 0);
    cr_assert_eq(g_rc[0], 0);
    cr_expect_eq(g_rc[1], 0);
    cr_expect_eq(g_num[0], PGRES_COPY_IN);
    cr_expect_eq(g_rc[2], 0);
    cr_expect_eq(g_rc[3], 0);
    cr_expect_eq(g_num[1], PGRES_COMMAND_OK);
    cr_expect_eq(g_rc[4], 0);
    cr_expect_eq(g_num[2], PGRES_COPY_OUT);
    cr_expect_eq(g_rc[5], -ENODATA);
    cr_expect_eq(g_rc[6], 0);
    cr_expect_eq(g_num[3], PGRES_COMMAND_OK, "status %ld", g_num[3]);
    cr_expect_str_eq(g_str[0], "5000");
    cr_expect_eq(g_num[4], 5000);
    cr_expect_eq(g_num[5], 0, "%ld rows came back different", g_num[5]);
    cr_expect_eq(g_rc[7], 0);
    cr_expect_eq(g_num[6], PGRES_FATAL_ERROR);
    cr_expect_eq(g_num[7], 5000);
}

/* ---- LISTEN/NOTIFY ----------------------------------------------------- */

static int notifier_main(void *arg)
{
    ferry_pq *c;

    (void)arg;
    g_rc[8] = ferry_pq_connect(&c, g_conninfo, NULL);
    if (g_rc[8])
        return 0;
    ferry_sleep(tu_ms(50));
    g_rc[9] = ferry_pq_exec(c, "NOTIFY jobs, 'first'");
    ferry_sleep(tu_ms(50));
    g_rc[10] = ferry_pq_exec(c, "SELECT pg_notify('jobs', 'second')");
    ferry_pq_free(c);
    return 0;
}

static int notify_main(void *arg)
{
    static const char *const chans[] = { "jobs", "other" };
    ferry_pq_listener *l;
    ferry_pq *c;
    PGnotify *n = NULL;
    ferry_scope scope;
    ferry_task *t;
    int64_t t0;

    (void)arg;
    /* Straight on a connection: nothing comes within the deadline. */
    g_rc[0] = ferry_pq_connect(&c, g_conninfo, NULL);
    if (g_rc[0])
        return 0;
    ferry_pq_exec(c, "LISTEN quiet");
    t0 = ferry_now();
    ferry_scope_enter(&scope, ferry_now() + FERRY_MSEC(100), 0);
    g_rc[1] = ferry_pq_notify_recv(c, &n);
    ferry_scope_exit(&scope);
    g_num[0] = (ferry_now() - t0) / 1000000;
    g_num[1] = ferry_pq_ok(c);
    ferry_pq_free(c);

    g_rc[2] = ferry_pq_listener_new(&l, g_conninfo, chans, 2, 0);
    if (g_rc[2])
        return 0;
    t = tu_spawn(notifier_main, NULL);
    ferry_scope_enter(&scope, ferry_now() + tu_ms(5000), 0);
    g_rc[3] = ferry_pq_listener_recv(l, &n);
    if (!g_rc[3]) {
        snprintf(g_str[0], sizeof(g_str[0]), "%s:%s", n->relname, n->extra);
        PQfreemem(n);
    }
    {
        ferry_case cases[] = {
            FERRY_CASE_GET_INIT(ferry_pq_listener_queue(l), &n),
            FERRY_CASE_DEADLINE_INIT(ferry_now() + tu_ms(4000)),
        };

        g_rc[4] = ferry_select(cases, 2, 0);
        if (g_rc[4] == 0 && cases[0].result == 0) {
            snprintf(g_str[1], sizeof(g_str[1]), "%s:%s", n->relname, n->extra);
            PQfreemem(n);
        }
    }
    ferry_scope_exit(&scope);
    tu_join(t);
    g_rc[5] = ferry_pq_listener_status(l);
    /* The listener's backend killed: its queue is shut down, and says why. */
    g_rc[6] = ferry_pq_connect(&c, g_conninfo, NULL);
    if (!g_rc[6]) {
        g_num[2] = query_num(c, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                "WHERE query = 'LISTEN \"other\"'");
        ferry_pq_free(c);
    }
    ferry_scope_enter(&scope, ferry_now() + tu_ms(5000), 0);
    g_rc[7] = ferry_pq_listener_recv(l, &n);
    ferry_scope_exit(&scope);
    g_rc[11] = ferry_pq_listener_status(l);
    ferry_pq_listener_free(l);
    return 0;
}

T(notify_reaches_a_waiting_task, 20.)
{
    cr_assert_eq(tu_run(notify_main, NULL), 0);
    cr_assert_eq(g_rc[0], 0);
    cr_expect_eq(g_rc[1], -ETIMEDOUT);
    cr_expect_geq(g_num[0], 90);
    cr_expect_eq(g_num[1], 1);
    cr_assert_eq(g_rc[2], 0);
    cr_expect_eq(g_rc[3], 0);
    cr_expect_str_eq(g_str[0], "jobs:first");
    cr_expect_eq(g_rc[4], 0);
    cr_expect_str_eq(g_str[1], "jobs:second");
    cr_expect_eq(g_rc[5], 0);
    cr_expect_eq(g_rc[8], 0);
    cr_expect_eq(g_rc[9], 0);
    cr_expect_eq(g_rc[10], 0);
    cr_expect_eq(g_rc[6], 0);
    cr_expect_eq(g_num[2], 1, "terminated %ld listeners", g_num[2]);
    cr_expect_eq(g_rc[7], -ESHUTDOWN);
    cr_expect_eq(g_rc[11], -ECONNRESET);
}

/* ---- a deadline cancels the query on the server ------------------------ */

/* How many queries other than the caller's run now on the server. */
static long others_active(ferry_pq *c)
{
    return query_num(c, "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
                        "AND pid <> pg_backend_pid() AND backend_type = 'client backend'");
}

/* Wait until `n` queries other than the caller's run on the server (at
 * most 10 s, scaled): a loaded machine may take a while to start them.
 * Returns how many ran when it stopped waiting. */
static long wait_active(ferry_pq *c, long n)
{
    int64_t end = ferry_now() + tu_ms(10000);
    long got;

    while ((got = others_active(c)) < n && ferry_now() < end)
        ferry_sleep(FERRY_MSEC(10));
    return got;
}

static int sleeper_main(void *arg)
{
    ferry_pq *c = arg;
    PGresult *r = NULL;

    g_rc[6] = ferry_pq_query(c, &r, "SELECT pg_sleep(10)", 0, NULL);
    PQclear(r);
    return 0;
}

static int deadline_main(void *arg)
{
    ferry_pq *c, *watch;
    ferry_scope scope;
    PGresult *r = NULL;
    ferry_task *t;
    int64_t t0;

    (void)arg;
    g_rc[0] = ferry_pq_connect(&c, g_conninfo, NULL);
    if (g_rc[0] || (g_rc[0] = ferry_pq_connect(&watch, g_conninfo, NULL)))
        return 0;
    t0 = ferry_now();
    ferry_scope_enter(&scope, ferry_now() + FERRY_MSEC(200), 0);
    g_rc[1] = ferry_pq_query(c, &r, "SELECT pg_sleep(10)", 0, NULL);
    ferry_scope_exit(&scope);
    g_num[0] = (ferry_now() - t0) / 1000000;
    g_num[1] = r == NULL;
    g_num[2] = others_active(watch);
    g_num[3] = ferry_pq_ok(c);
    g_num[4] = query_num(c, "SELECT 41 + 1");

    /* The same with ferry_task_cancel() from another task. */
    t = tu_spawn(sleeper_main, c);
    g_num[5] = wait_active(watch, 1);
    t0 = ferry_now();
    ferry_task_cancel(t);
    g_rc[2] = tu_join(t);
    g_num[6] = (ferry_now() - t0) / 1000000;
    g_num[7] = others_active(watch);
    g_rc[3] = ferry_pq_ok(c) ? (int)query_num(c, "SELECT 43") : -1;
    /* Freed while the server works for it (psycopg #608): the work is
     * cancelled, not left to run to its end. */
    ferry_pq_pipeline_enter(c);
    ferry_pq_send(c, "SELECT pg_sleep(10)", 0, NULL, NULL, NULL, NULL, 0);
    ferry_pq_sync(c);
    g_num[8] = wait_active(watch, 1);
    ferry_pq_free(c);
    for (int i = 0; i < 50 && (g_num[9] = others_active(watch)) != 0; i++)
        ferry_sleep(tu_ms(20));
    ferry_pq_free(watch);
    return 0;
}

T(deadline_cancels_the_query_on_the_server, 20.)
{
    cr_assert_eq(tu_run(deadline_main, NULL), 0);
    cr_assert_eq(g_rc[0], 0);
    cr_expect_eq(g_rc[1], -ETIMEDOUT);
    /* Back within the deadline plus the cleanup's bound (2 s; a cancel
     * round trip takes a few ms on an idle machine). */
    cr_expect_geq(g_num[0], 190);
    cr_expect_lt(g_num[0], 200 + tu_ms(2500) / 1000000, "took %ld ms", g_num[0]);
    cr_expect_eq(g_num[1], 1);
    cr_expect_eq(g_num[2], 0, "%ld queries still run on the server", g_num[2]);
    cr_expect_eq(g_num[3], 1);
    cr_expect_eq(g_num[4], 42);
    cr_expect_eq(g_num[5], 1, "the second sleep was not running (%ld)", g_num[5]);
    cr_expect_eq(g_rc[6], -ECANCELED);
    cr_expect_eq(g_rc[2], 0);
    cr_expect_lt(g_num[6], tu_ms(2500) / 1000000, "cancel took %ld ms", g_num[6]);
    cr_expect_eq(g_num[7], 0);
    cr_expect_eq(g_rc[3], 43);
    cr_expect_eq(g_num[8], 1, "the pipelined sleep was not running (%ld)", g_num[8]);
    cr_expect_eq(g_num[9], 0, "the sleep of a freed connection still runs");
}

/* ---- random cancellation through the pool -------------------------------- */

#define RC_TASKS 20
#define RC_EACH  10

static ferry_pq_pool *g_pool;
static long g_done, g_cancelled, g_wrong, g_other;

/* One query through the pool: the answer must be the question. */
static int one_query(void *arg)
{
    long want = (long)(intptr_t)arg;
    char num[16], ms[16];
    const char *vals[] = { num, ms };
    ferry_pq *c;
    PGresult *r = NULL;
    int rc;

    snprintf(num, sizeof(num), "%ld", want);
    snprintf(ms, sizeof(ms), "%.3f", (double)(want % 13) / 1000.0);
    rc = ferry_pq_pool_acquire(g_pool, &c);
    if (!rc) {
        rc = ferry_pq_query(c, &r, "SELECT $1::int FROM pg_sleep($2::float8)", 2, vals);
        ferry_pq_pool_release(g_pool, c);
    }
    if (rc == -ECANCELED || rc == -ETIMEDOUT)
        g_cancelled++;
    else if (rc)
        g_other++;
    else if (first_num(r) != want)
        g_wrong++;
    else
        g_done++;
    PQclear(r);
    return 0;
}

static int canceller_main(void *arg)
{
    long id = (long)(intptr_t)arg;

    for (long i = 0; i < RC_EACH; i++) {
        long q = id * 1000 + i;
        ferry_task *t = tu_spawn(one_query, (void *)(intptr_t)q);

        ferry_sleep(tu_ms(rand() % 40));
        ferry_task_cancel(t);
        tu_join(t);
    }
    return 0;
}

/* Descriptors open in the process now. */
static long count_fds(void)
{
    long n = 0;

    for (int fd = 0; fd < 4096; fd++)
        if (fcntl(fd, F_GETFD) != -1)
            n++;
    return n;
}

static int random_cancel_main(void *arg)
{
    ferry_task *t[RC_TASKS];
    ferry_pq_pool_stats st;
    ferry_pq *c, *warm[6];
    long fds = count_fds();

    (void)arg;
    srand(25);
    g_rc[0] = ferry_pq_pool_new(&g_pool, g_conninfo, 6, NULL);
    if (g_rc[0])
        return 0;
    /* The pool is filled first: a backend's start can take longer than
     * the longest wait before a cancel (20 ms and more on a loaded
     * machine), and an acquire cancelled while it connects drops the
     * connection, so that a cold pool might never answer at all.  The
     * race under test is a cancel against a query. */
    for (int i = 0; i < 6; i++)
        if ((g_rc[0] = ferry_pq_pool_acquire(g_pool, &warm[i])) != 0)
            return 0;
    for (int i = 0; i < 6; i++)
        ferry_pq_pool_release(g_pool, warm[i]);
    for (long i = 0; i < RC_TASKS; i++)
        t[i] = tu_spawn(canceller_main, (void *)(intptr_t)(i + 1));
    for (int i = 0; i < RC_TASKS; i++)
        tu_join(t[i]);
    ferry_pq_pool_stats_get(g_pool, &st);
    g_num[0] = (long)st.open;
    g_num[1] = (long)st.idle;
    g_rc[1] = ferry_pq_pool_acquire(g_pool, &c);
    if (!g_rc[1]) {
        /* A connection the cleanup closed (past its bound, on a loaded
         * machine) leaves its backend running until it notices: give it
         * the rest of its query (at most 12 ms) and a little more. */
        for (int i = 0; i < 20 && (g_num[2] = others_active(c)) != 0; i++)
            ferry_sleep(tu_ms(10));
        g_num[3] = query_num(c, "SELECT 5");
        ferry_pq_pool_release(g_pool, c);
    }
    g_rc[2] = ferry_pq_pool_free(g_pool);
    g_num[4] = count_fds() - fds;
    return 0;
}

T(random_cancellation_leaves_no_connection_busy, 30.)
{
    cr_assert_eq(tu_run(random_cancel_main, NULL), 0);
    cr_assert_eq(g_rc[0], 0);
    cr_expect_eq(g_done + g_cancelled + g_other + g_wrong, RC_TASKS * RC_EACH);
    cr_expect_eq(g_wrong, 0, "%ld wrong answers", g_wrong);
    cr_expect_eq(g_other, 0, "%ld other errors", g_other);
    cr_expect_gt(g_cancelled, 0);
    cr_expect_gt(g_done, 0);
    cr_expect_leq(g_num[0], 6);
    cr_expect_eq(g_num[0], g_num[1], "open %ld, idle %ld", g_num[0], g_num[1]);
    cr_expect_eq(g_rc[1], 0);
    cr_expect_eq(g_num[2], 0, "%ld queries still run on the server", g_num[2]);
    cr_expect_eq(g_num[3], 5);
    cr_expect_eq(g_rc[2], 0);
    cr_expect_eq(g_num[4], 0, "%ld descriptors more than before", g_num[4]);
    fprintf(stderr, "random cancellation: %ld answered, %ld cancelled\n", g_done, g_cancelled);
}

/* ---- backends killed under the pool ------------------------------------- */

static int victim_main(void *arg)
{
    int i = (int)(intptr_t)arg;
    ferry_pq *c;
    PGresult *r = NULL;
    int rc = ferry_pq_pool_acquire(g_pool, &c);

    if (rc) {
        g_rc[i] = rc;
        return 0;
    }
    rc = ferry_pq_query(c, &r, "SELECT pg_sleep(5)", 0, NULL);
    /* Either libpq's error result for the loss, or the loss itself. */
    g_rc[i] = rc ? rc : (PQresultStatus(r) == PGRES_FATAL_ERROR ? 1 : 2);
    g_num[i] = ferry_pq_ok(c);
    PQclear(r);
    ferry_pq_pool_release(g_pool, c);
    return 0;
}

static int killed_main(void *arg)
{
    char conninfo[256];
    ferry_task *t[3];
    ferry_pq *watch, *c[3];
    ferry_pq_pool_stats st;
    int64_t t0;

    (void)arg;
    /* The pool's connections are named, so that what the test kills and
     * counts is theirs and not a backend of an earlier test still exiting. */
    snprintf(conninfo, sizeof(conninfo), "%s application_name=killed_pool", g_conninfo);
    g_rc[7] = ferry_pq_connect(&watch, g_conninfo, NULL);
    if (g_rc[7] || (g_rc[7] = ferry_pq_pool_new(&g_pool, conninfo, 3, NULL)))
        return 0;
    for (int i = 0; i < 3; i++)
        t[i] = tu_spawn(victim_main, (void *)(intptr_t)i);
    wait_active(watch, 3);
    t0 = ferry_now();
    g_num[4] = query_num(watch, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                "WHERE application_name = 'killed_pool' AND state = 'active'");
    for (int i = 0; i < 3; i++)
        tu_join(t[i]);
    g_num[5] = (ferry_now() - t0) / 1000000;
    /* Recovery: the pool makes new connections. */
    for (int i = 0; i < 3; i++) {
        g_rc[8 + i] = ferry_pq_pool_acquire(g_pool, &c[i]);
        g_num[8 + i] = g_rc[8 + i] ? -1 : query_num(c[i], "SELECT 6 * 7");
    }
    /* Idle connections whose backends die are replaced at acquire. */
    for (int i = 0; i < 3; i++)
        if (!g_rc[8 + i])
            ferry_pq_pool_release(g_pool, c[i]);
    g_num[6] = query_num(watch, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                "WHERE application_name = 'killed_pool'");
    ferry_sleep(tu_ms(100));
    g_rc[11] = ferry_pq_pool_acquire(g_pool, &c[0]);
    g_num[11] = g_rc[11] ? -1 : query_num(c[0], "SELECT 7");
    if (!g_rc[11])
        ferry_pq_pool_release(g_pool, c[0]);
    ferry_pq_pool_stats_get(g_pool, &st);
    g_num[7] = (long)st.closed;
    g_rc[12] = ferry_pq_pool_free(g_pool);
    ferry_pq_free(watch);
    return 0;
}

T(killed_backends_give_errors_then_recovery, 30.)
{
    cr_assert_eq(tu_run(killed_main, NULL), 0);
    cr_assert_eq(g_rc[7], 0);
    cr_expect_eq(g_num[4], 3, "terminated %ld backends", g_num[4]);
    for (int i = 0; i < 3; i++) {
        cr_expect(g_rc[i] == 1 || g_rc[i] == -ECONNRESET, "victim %d: %d", i, g_rc[i]);
        cr_expect_eq(g_num[i], 0);
        cr_expect_eq(g_rc[8 + i], 0);
        cr_expect_eq(g_num[8 + i], 42);
    }
    cr_expect_lt(g_num[5], tu_ms(3000) / 1000000, "the victims took %ld ms after the kill", g_num[5]);
    cr_expect_eq(g_num[6], 3);
    cr_expect_eq(g_rc[11], 0);
    cr_expect_eq(g_num[11], 7);
    cr_expect_geq(g_num[7], 6, "closed %ld", g_num[7]);
    cr_expect_eq(g_rc[12], 0);
}

/* ---- interrupted pipeline and COPY --------------------------------------- */

static int pipeline_cancel_main(void *arg)
{
    ferry_pq *c, *watch;
    ferry_scope scope;
    PGresult *r = NULL;
    char *row;
    size_t len;
    int64_t t0;

    (void)arg;
    g_rc[0] = ferry_pq_connect(&c, g_conninfo, NULL);
    if (g_rc[0] || (g_rc[0] = ferry_pq_connect(&watch, g_conninfo, NULL)))
        return 0;
    /* A batch whose first query is quick, the second sleeps; a second
     * batch not synced.  The server sends results at a sync, so the wait
     * for the first batch's results times out. */
    g_rc[1] = ferry_pq_pipeline_enter(c);
    ferry_pq_send(c, "SELECT 1", 0, NULL, NULL, NULL, NULL, 0);
    ferry_pq_send(c, "SELECT pg_sleep(10)", 0, NULL, NULL, NULL, NULL, 0);
    ferry_pq_sync(c);
    ferry_pq_send(c, "SELECT 3", 0, NULL, NULL, NULL, NULL, 0);
    t0 = ferry_now();
    ferry_scope_enter(&scope, ferry_now() + FERRY_MSEC(300), 0);
    g_rc[2] = ferry_pq_recv(c, &r);
    ferry_scope_exit(&scope);
    g_num[1] = (ferry_now() - t0) / 1000000;
    g_num[2] = ferry_pq_ok(c);
    g_num[3] = others_active(watch);
    g_num[4] = query_num(c, "SELECT 44");

    /* A COPY TO STDOUT whose rows keep coming for 10 s (the server sends
     * them 8 KiB at a time). */
    g_rc[3] = ferry_pq_copy_start(c, &r, "COPY (SELECT i, repeat('x', 200), pg_sleep(0.001) "
                                         "FROM generate_series(1, 10000) i) TO STDOUT");
    g_num[5] = r ? PQresultStatus(r) : -1;
    PQclear(r);
    t0 = ferry_now();
    ferry_scope_enter(&scope, ferry_now() + FERRY_MSEC(300), 0);
    for (;;) {
        g_rc[4] = ferry_pq_copy_get(c, &row, &len);
        if (g_rc[4])
            break;
        g_num[8]++;
        PQfreemem(row);
    }
    ferry_scope_exit(&scope);
    g_num[6] = (ferry_now() - t0) / 1000000;
    g_num[7] = others_active(watch);
    g_rc[5] = ferry_pq_ok(c) ? (int)query_num(c, "SELECT 45") : -1;
    ferry_pq_free(watch);
    ferry_pq_free(c);
    return 0;
}

T(interrupted_pipeline_and_copy_are_cancelled, 20.)
{
    cr_assert_eq(tu_run(pipeline_cancel_main, NULL), 0);
    cr_assert_eq(g_rc[0], 0);
    cr_expect_eq(g_rc[1], 0);
    cr_expect_eq(g_rc[2], -ETIMEDOUT, "rc %d after %ld ms", g_rc[2], g_num[1]);
    cr_expect_lt(g_num[1], 300 + tu_ms(2500) / 1000000, "took %ld ms", g_num[1]);
    cr_expect_eq(g_num[2], 1);
    cr_expect_eq(g_num[3], 0, "%ld queries still run on the server", g_num[3]);
    cr_expect_eq(g_num[4], 44);
    cr_expect_eq(g_rc[3], 0);
    cr_expect_eq(g_num[5], PGRES_COPY_OUT);
    cr_expect_eq(g_rc[4], -ETIMEDOUT);
    cr_expect_gt(g_num[8], 0, "no row came before the deadline");
    cr_expect_lt(g_num[6], 300 + tu_ms(2500) / 1000000, "took %ld ms", g_num[6]);
    cr_expect_eq(g_num[7], 0, "%ld queries still run on the server", g_num[7]);
    cr_expect_eq(g_rc[5], 45);
}

/* ---- a server that stops answering (psycopg #1371) ------------------------ */

/* A TCP proxy in front of the server that, once `stall` is set, stops
 * forwarding bytes and leaves every connection open, new ones included:
 * what a load balancer in front of a failed server does.  The cancel
 * request then goes unanswered too. */
struct proxy {
    int lfd;             /* listening socket */
    int port;            /* its port */
    int pg_port;         /* the real server's */
    bool stall;          /* forward nothing from now on */
    int fds[64];         /* every socket it made, closed at the end */
    int nfds;            /* how many */
    ferry_task *tasks[64]; /* its acceptor and pumps, cancelled at the end */
    int ntasks;          /* how many */
};

struct pump {
    struct proxy *p;   /* its proxy, for `stall` */
    int from, to;      /* bytes read from `from` are written to `to` */
};

static struct pump g_pumps[32];
static int g_npumps;

static int pump_main(void *arg)
{
    struct pump *pu = arg;
    char buf[8192];

    for (;;) {
        ssize_t n = read(pu->from, buf, sizeof(buf));

        if (n == 0 || (n < 0 && errno != EAGAIN))
            return 0;
        if (n < 0) {
            if (ferry_wait_fd(pu->from, FERRY_READ, NULL))
                return 0;
            continue;
        }
        if (pu->p->stall)
            continue;   /* stranded: read and dropped, never answered */
        for (ssize_t off = 0; off < n;) {
            ssize_t w = write(pu->to, buf + off, (size_t)(n - off));

            if (w < 0 && errno != EAGAIN)
                return 0;
            if (w < 0) {
                if (ferry_wait_fd(pu->to, FERRY_WRITE, NULL))
                    return 0;
                continue;
            }
            off += w;
        }
    }
}

static int acceptor_main(void *arg)
{
    struct proxy *p = arg;

    for (;;) {
        struct sockaddr_in sa = { .sin_family = AF_INET,
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                                  .sin_port = htons((uint16_t)p->pg_port) };
        int cfd = accept4(p->lfd, NULL, NULL, SOCK_NONBLOCK), sfd;

        if (cfd < 0) {
            if (ferry_wait_fd(p->lfd, FERRY_READ, NULL))
                return 0;
            continue;
        }
        p->fds[p->nfds++] = cfd;
        if (p->stall || g_npumps + 2 > 32 || p->nfds > 60)
            continue;   /* kept open, never answered */
        sfd = socket(AF_INET, SOCK_STREAM, 0);
        if (sfd < 0 || connect(sfd, (struct sockaddr *)&sa, sizeof(sa)) != 0)
            return -1;
        fcntl(sfd, F_SETFL, O_NONBLOCK);
        p->fds[p->nfds++] = sfd;
        g_pumps[g_npumps] = (struct pump){ p, cfd, sfd };
        p->tasks[p->ntasks++] = tu_spawn(pump_main, &g_pumps[g_npumps++]);
        g_pumps[g_npumps] = (struct pump){ p, sfd, cfd };
        p->tasks[p->ntasks++] = tu_spawn(pump_main, &g_pumps[g_npumps++]);
    }
}

static int proxy_start(struct proxy *p)
{
    struct sockaddr_in sa = { .sin_family = AF_INET,
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof(sa);
    const char *port = strstr(g_conninfo, "port=");

    memset(p, 0, sizeof(*p));
    p->pg_port = port ? atoi(port + 5) : 5432;
    p->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (p->lfd < 0 || bind(p->lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        listen(p->lfd, 16) != 0 || getsockname(p->lfd, (struct sockaddr *)&sa, &len) != 0)
        return -1;
    p->port = ntohs(sa.sin_port);
    p->tasks[p->ntasks++] = tu_spawn(acceptor_main, p);
    return 0;
}

static void proxy_stop(struct proxy *p)
{
    for (int i = 0; i < p->ntasks; i++) {
        ferry_task_cancel(p->tasks[i]);
        tu_join(p->tasks[i]);
    }
    for (int i = 0; i < p->nfds; i++)
        close(p->fds[i]);
    close(p->lfd);
}

static int stalled_main(void *arg)
{
    ferry_pq_opts opts = { .cleanup_timeout = FERRY_MSEC(300) };
    struct proxy p;
    char conninfo[128];
    ferry_scope scope;
    ferry_pq *c;
    PGresult *r = NULL;
    int64_t t0;

    (void)arg;
    g_rc[0] = proxy_start(&p);
    if (g_rc[0])
        return 0;
    snprintf(conninfo, sizeof(conninfo), "host=127.0.0.1 port=%d user=ferry dbname=postgres",
             p.port);
    g_rc[1] = ferry_pq_connect(&c, conninfo, &opts);
    if (!g_rc[1]) {
        g_num[0] = query_num(c, "SELECT 8");
        p.stall = true;
        t0 = ferry_now();
        ferry_scope_enter(&scope, ferry_now() + FERRY_MSEC(200), 0);
        g_rc[2] = ferry_pq_query(c, &r, "SELECT 9", 0, NULL);
        ferry_scope_exit(&scope);
        g_num[1] = (ferry_now() - t0) / 1000000;
        g_num[2] = ferry_pq_conn(c) == NULL;
        g_rc[3] = ferry_pq_query(c, &r, "SELECT 10", 0, NULL);
        PQclear(r);
        ferry_pq_free(c);
    }
    /* Closing the stranded sockets lets the abandoned cancel request end. */
    proxy_stop(&p);
    return 0;
}

T(a_server_that_stops_answering_gives_the_caller_back, 20.)
{
    cr_assert_eq(tu_run(stalled_main, NULL), 0);
    cr_assert_eq(g_rc[0], 0);
    cr_assert_eq(g_rc[1], 0, "connect through the proxy: %d", g_rc[1]);
    cr_expect_eq(g_num[0], 8);
    cr_expect_eq(g_rc[2], -ETIMEDOUT);
    /* The deadline, then the bounded cleanup, then closed. */
    cr_expect_geq(g_num[1], 190);
    cr_expect_lt(g_num[1], 500 + tu_ms(1000) / 1000000, "took %ld ms", g_num[1]);
    cr_expect_eq(g_num[2], 1, "the connection was not closed");
    cr_expect_eq(g_rc[3], -ECONNRESET);
}

/* ---- one task at a time, the pool's wait, calls from outside a task -------- */

static ferry_pq *g_shared;

static int second_user_main(void *arg)
{
    PGresult *r = NULL;

    (void)arg;
    g_rc[2] = ferry_pq_query(g_shared, &r, "SELECT 1", 0, NULL);
    PQclear(r);
    return 0;
}

static int busy_main(void *arg)
{
    ferry_pq_pool *p;
    ferry_pq *held, *other = NULL;
    ferry_scope scope;
    PGresult *r = NULL;
    ferry_task *t;
    char *buf;
    size_t len;
    int64_t t0;

    (void)arg;
    g_rc[0] = ferry_pq_connect(&g_shared, g_conninfo, NULL);
    if (g_rc[0])
        return 0;
    /* A second task on a connection in use is refused, and the first
     * call goes on undisturbed. */
    t = tu_spawn(second_user_main, NULL);
    g_rc[1] = ferry_pq_query(g_shared, &r, "SELECT pg_sleep(0.1), 5", 0, NULL);
    g_num[0] = r && PQntuples(r) == 1 ? atol(PQgetvalue(r, 0, 1)) : -1;
    PQclear(r);
    tu_join(t);
    /* Calls that do not fit the connection's state. */
    g_rc[3] = ferry_pq_recv(g_shared, &r);
    g_rc[4] = ferry_pq_copy_put(g_shared, "x", 1);
    g_rc[5] = ferry_pq_copy_get(g_shared, &buf, &len);
    g_rc[6] = ferry_pq_sync(g_shared);
    g_rc[7] = ferry_pq_pipeline_exit(g_shared);
    g_rc[8] = ferry_pq_exec(g_shared, "COPY (SELECT 1) TO STDOUT");
    g_num[1] = ferry_pq_ok(g_shared);
    /* The pool: a second acquire waits for the one connection, up to its
     * deadline; freeing a pool with a connection lent is refused. */
    g_rc[9] = ferry_pq_pool_new(&p, g_conninfo, 1, NULL);
    if (g_rc[9])
        return 0;
    g_rc[10] = ferry_pq_pool_acquire(p, &held);
    t0 = ferry_now();
    ferry_scope_enter(&scope, ferry_now() + FERRY_MSEC(100), 0);
    g_rc[11] = ferry_pq_pool_acquire(p, &other);
    ferry_scope_exit(&scope);
    g_num[2] = (ferry_now() - t0) / 1000000;
    g_num[3] = other == NULL;
    g_rc[12] = ferry_pq_pool_free(p);
    /* Given back inside a transaction: closed, not lent again. */
    ferry_pq_exec(held, "BEGIN");
    ferry_pq_pool_release(p, held);
    g_rc[13] = ferry_pq_pool_acquire(p, &held);
    if (!g_rc[13]) {
        g_num[4] = PQtransactionStatus(ferry_pq_conn(held)) == PQTRANS_IDLE;
        ferry_pq_pool_release(p, held);
    }
    {
        ferry_pq_pool_stats st;

        ferry_pq_pool_stats_get(p, &st);
        g_num[5] = (long)st.made;
        g_num[6] = (long)st.closed;
    }
    g_rc[14] = ferry_pq_pool_free(p);
    return 0;
}

static int free_shared_main(void *arg)
{
    (void)arg;
    ferry_pq_free(g_shared);
    return 0;
}

T(one_task_at_a_time_and_the_pool_waits, 20.)
{
    PGresult *r = (PGresult *)1;
    ferry_pq *none = (ferry_pq *)1;

    cr_assert_eq(tu_run(busy_main, NULL), 0);
    cr_assert_eq(g_rc[0], 0);
    cr_expect_eq(g_rc[1], 0);
    cr_expect_eq(g_num[0], 5);
    cr_expect_eq(g_rc[2], -EBUSY);
    cr_expect_eq(g_rc[3], -EBUSY);
    cr_expect_eq(g_rc[4], -EBUSY);
    cr_expect_eq(g_rc[5], -EBUSY);
    cr_expect_eq(g_rc[6], -EBUSY);
    cr_expect_eq(g_rc[7], 0);
    cr_expect_eq(g_rc[8], -EINVAL);
    cr_expect_eq(g_num[1], 1, "the refused COPY left the connection busy");
    cr_expect_eq(g_rc[9], 0);
    cr_expect_eq(g_rc[10], 0);
    cr_expect_eq(g_rc[11], -ETIMEDOUT);
    cr_expect_geq(g_num[2], 95);
    cr_expect_eq(g_num[3], 1);
    cr_expect_eq(g_rc[12], -EBUSY);
    cr_expect_eq(g_rc[13], 0);
    cr_expect_eq(g_num[4], 1);
    cr_expect_eq(g_num[5], 2);
    cr_expect_eq(g_num[6], 1);
    cr_expect_eq(g_rc[14], 0);
    /* Outside a task. */
    cr_expect_eq(ferry_pq_query(g_shared, &r, "SELECT 1", 0, NULL), -EPERM);
    cr_expect_null(r);
    cr_expect_eq(ferry_pq_connect(&none, g_conninfo, NULL), -EPERM);
    cr_expect_null(none);
    cr_assert_eq(tu_run(free_shared_main, NULL), 0);
}
