/* pq_bench.c - the PostgreSQL part (ferry/pq.h) against libpq's blocking
 * API on threads, in the same run; bench/run-pq.sh adds asyncpg's row
 * (bench/pq_asyncpg.py) and starts the server.
 *
 *   ferry-pq-bench [-r RUNS] [-n QUERIES] [-b BATCHES] [WORKLOAD...]
 *
 * The server is the one FERRY_PQ_CONNINFO names.  Workloads (default both):
 *
 *   pq_select_50    QUERIES single-row queries (SELECT $1::int + 1) by 50
 *                   tasks at once, through a ferry_pq_pool of 50 (system
 *                   ferry), or by 50 threads with a connection each and
 *                   PQexecParams() (system libpq-threads).  Queries/s;
 *                   check=ok: every answer was the question plus one.
 *   pq_pipeline_1000  BATCHES batches of 1,000 INSERTs sent as one pipeline
 *                   and one sync (1,000 executions of a statement
 *                   prepared in the first batch, as asyncpg's executemany()
 *                   does), one batch after
 *                   the other on one connection: ferry_pq_send_prepare(),
 *                   _send_prepared(), _sync(), _recv() (system
 *                   ferry), or libpq's pipeline mode in blocking mode
 *                   (system libpq-blocking: the floor, a thread doing
 *                   nothing else).  Batches/s; check=ok: every insert
 *                   succeeded and the table holds them all.
 *
 * Each workload runs RUNS times (default 5) per system, one BENCH line a
 * run (ops_per_s: queries or batches a second); bench/parts.py pq makes
 * the table of bench/README.md from them.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ferry/ferry.h"
#include "ferry/pq.h"

#define TASKS 50
#define BATCH 1000

static const char *conninfo;
static long queries = 20000, batches = 20;
static int runs = 5;

/* One BENCH line per run (the contract's format, bench/README.md): `n`
 * operations (queries or batches) at `v[i]` a second. */
static void report(const char *workload, const char *system, long n, const double *v,
                   int nruns, bool ok)
{
    for (int i = 0; i < nruns; i++)
        printf("BENCH workload=%s system=%s n=%ld seconds=%.6f ops_per_s=%.0f check=%s\n",
               workload, system, n, v[i] > 0 ? (double)n / v[i] : 0.0, v[i],
               ok ? "ok" : "FAIL");
    fflush(stdout);
}

/* ---- pq_select_50, ferry ------------------------------------------------ */

static ferry_pq_pool *pool;
static long sel_left, sel_bad;

static int select_task(void *arg)
{
    (void)arg;
    while (sel_left > 0) {
        long q = sel_left--;
        char num[24];
        const char *vals[] = { num };
        ferry_pq *c;
        PGresult *r;
        int rc;

        snprintf(num, sizeof(num), "%ld", q);
        rc = ferry_pq_pool_acquire(pool, &c);
        if (rc) {
            sel_bad++;
            continue;
        }
        rc = ferry_pq_query(c, &r, "SELECT $1::int + 1", 1, vals);
        ferry_pq_pool_release(pool, c);
        if (rc || PQresultStatus(r) != PGRES_TUPLES_OK || atol(PQgetvalue(r, 0, 0)) != q + 1)
            sel_bad++;
        PQclear(r);
    }
    return 0;
}

static int select_ferry(void *arg)
{
    double *per_s = arg;
    ferry_task *t[TASKS];
    int64_t t0;
    int rc = ferry_pq_pool_new(&pool, conninfo, TASKS, NULL);

    if (rc)
        return rc;
    /* Connections made before the clock starts, as for the threads. */
    {
        ferry_pq *c[TASKS];

        for (int i = 0; i < TASKS; i++)
            if ((rc = ferry_pq_pool_acquire(pool, &c[i])) != 0)
                return rc;
        for (int i = 0; i < TASKS; i++)
            ferry_pq_pool_release(pool, c[i]);
    }
    sel_left = queries;
    t0 = ferry_now();
    for (int i = 0; i < TASKS; i++)
        ferry_task_spawn(&t[i], NULL, select_task, NULL, NULL);
    for (int i = 0; i < TASKS; i++)
        ferry_task_join(t[i], NULL);
    *per_s = (double)queries * 1e9 / (double)(ferry_now() - t0);
    return ferry_pq_pool_free(pool);
}

/* ---- pq_select_50, threads ------------------------------------------------ */

struct sel_thread {
    PGconn *conn;
    long n, first, bad;
};

static void *select_thread(void *arg)
{
    struct sel_thread *st = arg;

    for (long i = 0; i < st->n; i++) {
        long q = st->first + i;
        char num[24];
        const char *vals[] = { num };
        PGresult *r;

        snprintf(num, sizeof(num), "%ld", q);
        r = PQexecParams(st->conn, "SELECT $1::int + 1", 1, NULL, vals, NULL, NULL, 0);
        if (PQresultStatus(r) != PGRES_TUPLES_OK || atol(PQgetvalue(r, 0, 0)) != q + 1)
            st->bad++;
        PQclear(r);
    }
    return NULL;
}

static int select_threads(double *per_s, long *bad)
{
    struct sel_thread st[TASKS];
    pthread_t th[TASKS];
    int64_t t0;

    for (int i = 0; i < TASKS; i++) {
        st[i] = (struct sel_thread){ PQconnectdb(conninfo), queries / TASKS,
                                     1 + i * (queries / TASKS), 0 };
        if (PQstatus(st[i].conn) != CONNECTION_OK)
            return -ECONNREFUSED;
    }
    t0 = ferry_now();
    for (int i = 0; i < TASKS; i++)
        pthread_create(&th[i], NULL, select_thread, &st[i]);
    for (int i = 0; i < TASKS; i++) {
        pthread_join(th[i], NULL);
        *bad += st[i].bad;
    }
    *per_s = (double)(queries / TASKS * TASKS) * 1e9 / (double)(ferry_now() - t0);
    for (int i = 0; i < TASKS; i++)
        PQfinish(st[i].conn);
    return 0;
}

/* ---- pq_pipeline_1000 ---------------------------------------------------- */

static const char insert_sql[] = "INSERT INTO bench_rows VALUES ($1, $2)";
static long pipe_bad;

static int pipeline_ferry(void *arg)
{
    double *per_s = arg;
    ferry_pq *c;
    int64_t t0;
    int rc = ferry_pq_connect(&c, conninfo, NULL);

    if (rc)
        return rc;
    rc = ferry_pq_exec(c, "DROP TABLE IF EXISTS bench_rows; "
                          "CREATE UNLOGGED TABLE bench_rows (i int, s text)");
    t0 = ferry_now();
    for (long b = 0; b < batches && !rc; b++) {
        PGresult *r;

        rc = ferry_pq_pipeline_enter(c);
        if (!rc && b == 0)
            rc = ferry_pq_send_prepare(c, "ins", insert_sql, 2, NULL);
        for (int i = 0; i < BATCH && !rc; i++) {
            char num[24], txt[32];
            const char *vals[] = { num, txt };

            snprintf(num, sizeof(num), "%ld", b * BATCH + i);
            snprintf(txt, sizeof(txt), "row %ld", b * BATCH + i);
            rc = ferry_pq_send_prepared(c, "ins", 2, vals, NULL, NULL, 0);
        }
        if (!rc)
            rc = ferry_pq_sync(c);
        while (!rc && (rc = ferry_pq_recv(c, &r)) == 0) {
            if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_PIPELINE_SYNC)
                pipe_bad++;
            PQclear(r);
        }
        if (rc == -ENODATA)
            rc = ferry_pq_pipeline_exit(c);
    }
    *per_s = (double)batches * 1e9 / (double)(ferry_now() - t0);
    ferry_pq_free(c);
    return rc;
}

static int pipeline_blocking(double *per_s)
{
    PGconn *conn = PQconnectdb(conninfo);
    PGresult *r;
    int64_t t0;

    if (PQstatus(conn) != CONNECTION_OK)
        return -ECONNREFUSED;
    PQclear(PQexec(conn, "DROP TABLE IF EXISTS bench_rows"));
    PQclear(PQexec(conn, "CREATE UNLOGGED TABLE bench_rows (i int, s text)"));
    t0 = ferry_now();
    for (long b = 0; b < batches; b++) {
        PQenterPipelineMode(conn);
        if (b == 0)
            PQsendPrepare(conn, "ins", insert_sql, 2, NULL);
        for (int i = 0; i < BATCH; i++) {
            char num[24], txt[32];
            const char *vals[] = { num, txt };

            snprintf(num, sizeof(num), "%ld", b * BATCH + i);
            snprintf(txt, sizeof(txt), "row %ld", b * BATCH + i);
            PQsendQueryPrepared(conn, "ins", 2, vals, NULL, NULL, 0);
        }
        PQpipelineSync(conn);
        for (int got = 0; got <= BATCH + (b == 0);) {
            r = PQgetResult(conn);
            if (!r)
                continue;
            if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_PIPELINE_SYNC)
                pipe_bad++;
            PQclear(r);
            got++;
        }
        PQexitPipelineMode(conn);
    }
    *per_s = (double)batches * 1e9 / (double)(ferry_now() - t0);
    PQfinish(conn);
    return 0;
}

static long count_rows(void)
{
    PGconn *conn = PQconnectdb(conninfo);
    PGresult *r = PQexec(conn, "SELECT count(*) FROM bench_rows");
    long n = PQresultStatus(r) == PGRES_TUPLES_OK ? atol(PQgetvalue(r, 0, 0)) : -1;

    PQclear(r);
    PQfinish(conn);
    return n;
}

/* ---- main ---------------------------------------------------------------- */

static bool wanted(int argc, char **argv, int first, const char *name)
{
    if (first >= argc)
        return true;
    for (int i = first; i < argc; i++)
        if (strcmp(argv[i], name) == 0)
            return true;
    return false;
}

int main(int argc, char **argv)
{
    double v[64];
    bool ok;
    int opt;

    while ((opt = getopt(argc, argv, "r:n:b:")) != -1) {
        if (opt == 'r')
            runs = atoi(optarg);
        else if (opt == 'n')
            queries = atol(optarg);
        else if (opt == 'b')
            batches = atol(optarg);
        else
            return 2;
    }
    if (runs < 1 || runs > 64 || queries < TASKS || batches < 1)
        return 2;
    conninfo = getenv("FERRY_PQ_CONNINFO");
    if (!conninfo) {
        fprintf(stderr, "ferry-pq-bench: set FERRY_PQ_CONNINFO (bench/run-pq.sh does)\n");
        return 2;
    }
    if (wanted(argc, argv, optind, "pq_select_50")) {
        ok = true;
        for (int i = 0; i < runs; i++) {
            sel_bad = 0;
            ok &= ferry_run(select_ferry, &v[i]) == 0 && sel_bad == 0;
        }
        report("pq_select_50", "ferry", queries, v, runs, ok);
        ok = true;
        for (int i = 0; i < runs; i++) {
            long bad = 0;

            ok &= select_threads(&v[i], &bad) == 0 && bad == 0;
        }
        report("pq_select_50", "libpq-threads", queries, v, runs, ok);
    }
    if (wanted(argc, argv, optind, "pq_pipeline_1000")) {
        ok = true;
        for (int i = 0; i < runs; i++) {
            pipe_bad = 0;
            ok &= ferry_run(pipeline_ferry, &v[i]) == 0 && pipe_bad == 0 &&
                  count_rows() == batches * BATCH;
        }
        report("pq_pipeline_1000", "ferry", batches, v, runs, ok);
        ok = true;
        for (int i = 0; i < runs; i++) {
            pipe_bad = 0;
            ok &= pipeline_blocking(&v[i]) == 0 && pipe_bad == 0 &&
                  count_rows() == batches * BATCH;
        }
        report("pq_pipeline_1000", "libpq-blocking", batches, v, runs, ok);
    }
    return 0;
}
