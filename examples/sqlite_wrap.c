/* sqlite_wrap.c - SQLite wrapped for tasks, interrupted by a deadline.
 *
 * The asyncio code it translates:
 *
 *     async def count_to(n):
 *         return await asyncio.wait_for(asyncio.to_thread(query, n), 0.05)
 *
 * except that asyncio's wait_for stops waiting and leaves the query
 * running on its thread, while here the query itself stops: the job's
 * interrupt hook calls sqlite3_interrupt() on the connection, and a
 * progress handler asks ferry_job_cancelled(), which catches the interrupt
 * that came just before sqlite3_step() started (sqlite3_interrupt() is a
 * no-op while no statement runs).
 *
 * A connection per pool thread: a connection must not be used by two
 * threads at once, so the pool is the scarce resource's size, each of its
 * threads opens its own connection on its first job and closes it when
 * the pool is freed (a thread-specific key's destructor).
 *
 * What it checks, under random cancellations and deadlines: every query
 * returns the right answer or -ECANCELED / -ETIMEDOUT, no statement is
 * left unfinalized on any connection, an interrupted write transaction
 * left nothing behind (all of its rows or none), and every connection
 * answers correctly afterwards.
 */
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "examples.h"

#define THREADS 3

static char db_path[64];
static pthread_key_t conn_key;
static atomic_int conns_open, conns_closed, stmts_leaked, interrupted;

/* ---- the wrapper ---------------------------------------------------- */

/* The progress handler: a non-zero return makes the statement fail with
 * SQLITE_INTERRUPT. */
static int progress(void *arg)
{
    (void)arg;
    return ferry_job_cancelled();
}

static void conn_close(void *db)
{
    sqlite3_close(db);
    atomic_fetch_add(&conns_closed, 1);
}

/* The calling pool thread's connection, opened on first use. */
static sqlite3 *thread_conn(void)
{
    sqlite3 *db = pthread_getspecific(conn_key);

    if (db)
        return db;
    if (sqlite3_open(db_path, &db) != SQLITE_OK) {
        sqlite3_close(db);
        return NULL;
    }
    sqlite3_busy_timeout(db, 5000);
    sqlite3_progress_handler(db, 1000, progress, NULL);
    pthread_setspecific(conn_key, db);
    atomic_fetch_add(&conns_open, 1);
    return db;
}

struct query {
    const char       *sql;
    int64_t           param;
    _Atomic(sqlite3 *) db;     /* set by the job once it has its connection */
    int64_t           value;   /* the first column of the first row */
};

/* The interrupt hook: on the loop thread, while the job runs.  The
 * connection outlives the hook: it belongs to the pool thread, which
 * does not take its next job before the hook has returned. */
static void query_interrupt(void *arg)
{
    struct query *q = arg;
    sqlite3 *db = atomic_load(&q->db);

    if (db)
        sqlite3_interrupt(db);
}

/* The job: one statement (several if `sql` holds more), every one
 * finalized whatever happens.  A write interrupted inside an explicit
 * transaction is rolled back. */
static int query_job(void *arg, void **result)
{
    struct query *q = arg;
    sqlite3 *db = thread_conn();
    const char *sql = q->sql, *tail;
    sqlite3_stmt *st;
    int rc = SQLITE_OK;

    (void)result;
    if (!db)
        return -EIO;
    atomic_store(&q->db, db);
    while (rc == SQLITE_OK && *sql) {
        rc = sqlite3_prepare_v2(db, sql, -1, &st, &tail);
        if (rc != SQLITE_OK || !st)
            break;
        if (sqlite3_bind_parameter_count(st))
            sqlite3_bind_int64(st, 1, q->param);
        while ((rc = sqlite3_step(st)) == SQLITE_ROW)
            q->value = sqlite3_column_int64(st, 0);
        if (rc == SQLITE_DONE)
            rc = SQLITE_OK;
        sqlite3_finalize(st);
        sql = tail;
    }
    if (rc != SQLITE_OK && !sqlite3_get_autocommit(db))
        sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    if (sqlite3_next_stmt(db, NULL))
        atomic_fetch_add(&stmts_leaked, 1);
    if (rc == SQLITE_INTERRUPT) {
        atomic_fetch_add(&interrupted, 1);
        return -ECANCELED;
    }
    return rc == SQLITE_OK ? 0 : -EIO;
}

/*
 * Run `sql` (its one parameter bound to `param`) on a connection of
 * `pool`; *value is the first column of the last row.  Returns 0;
 * -ECANCELED or -ETIMEDOUT (the task was cancelled or its deadline passed:
 * the statement was interrupted or never started, and a write transaction
 * was rolled back); -EIO (an SQLite error).
 */
static int db_query(ferry_pool *pool, const char *sql, int64_t param, int64_t *value)
{
    struct query q = { .sql = sql, .param = param };
    ferry_job job = { .fn = query_job, .arg = &q, .interrupt = query_interrupt };
    int rc, status;

    rc = ferry_to_thread_ex(pool, &job, &status, NULL);
    if (rc)
        return rc;                      /* never ran */
    if (status == -ECANCELED)           /* interrupted: say why */
        return ferry_task_cancelled(ferry_task_current()) ? -ECANCELED : -ETIMEDOUT;
    if (status == 0)
        *value = q.value;
    return status;
}

/* ---- the demonstration ---------------------------------------------- */

static ferry_pool *pool;

static const char *count_sql =
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < ?1) "
    "SELECT count(*) FROM c";

/* Insert ?1 rows in one transaction: all of them or, interrupted, none. */
static const char *fill_sql =
    "BEGIN;"
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < ?1) "
    "INSERT INTO t SELECT x FROM c;"
    "COMMIT;";

static int count_within(int64_t n, int64_t deadline_ms, int64_t *value)
{
    ferry_scope sc;
    int rc;

    ferry_scope_enter(&sc, ferry_now() + FERRY_MSEC(deadline_ms), 0);
    rc = db_query(pool, count_sql, n, value);
    ferry_scope_exit(&sc);
    return rc;
}

struct victim {
    const char *sql;
    int64_t     n, value;
    int         rc;
};

static int victim_task(void *arg)
{
    struct victim *v = arg;

    v->rc = db_query(pool, v->sql, v->n, &v->value);
    return 0;
}

static int main_task(void *arg)
{
    int64_t v = 0, rows = 0;
    int rc, bad = 0, ok = 0, cut = 0, fills = 0, fill_cut = 0;
    unsigned seed = 7;

    (void)arg;
    rc = db_query(pool, "CREATE TABLE t(x INTEGER)", 0, &v);
    if (rc)
        return 1;
    rc = db_query(pool, count_sql, 1000, &v);
    printf("count to 1000: %s, %lld\n", errname(rc), (long long)v);
    if (rc || v != 1000)
        return 1;
    /* Minutes of work: the deadline cuts it, inside SQLite (or, on a
     * machine too busy to start the job within 50 ms, before it ran). */
    rc = count_within(1000000000, 50, &v);
    printf("count to 10^9 within 50 ms: %s, %s\n", errname(rc),
           atomic_load(&interrupted) ? "the statement was interrupted, not abandoned"
                                     : "cut before the job started");
    if (rc != -ETIMEDOUT)
        return 1;

    /* Random cancellations, some reads, some writes. */
    atomic_store(&interrupted, 0);
    for (int i = 0; i < 200; i++) {
        struct victim vi = { .n = 1 + rand_r(&seed) % 40000 };
        bool write = rand_r(&seed) % 4 == 0;
        ferry_task *t;

        vi.sql = write ? fill_sql : count_sql;
        vi.rc = 1;
        if (ferry_task_spawn(&t, NULL, victim_task, &vi, NULL))
            return 1;
        ferry_sleep(FERRY_USEC(rand_r(&seed) % 3000));
        ferry_task_cancel(t);
        ferry_task_join(t, NULL);
        if (vi.rc == 0 && !write && vi.value != vi.n)
            bad++;
        else if (vi.rc == 0)
            ok++;
        else if (vi.rc == -ECANCELED || vi.rc == 1)   /* 1: cancelled before it ran */
            cut++;
        else
            bad++;
        if (write) {
            int64_t before = rows, now = 0;

            if (db_query(pool, "SELECT count(*) FROM t", 0, &now))
                return 1;
            if (vi.rc == 0 && now != before + vi.n)
                bad++;
            else if (vi.rc != 0 && now != before)
                bad++;                  /* a cut write left rows behind */
            fills++;
            fill_cut += vi.rc != 0;
            rows = now;
        }
    }
    printf("200 queries cancelled at random: %d finished, %d cut short (%d of them "
           "interrupted inside SQLite), %d wrong\n", ok, cut, atomic_load(&interrupted), bad);
    printf("interrupted writes: %d of %d cut short, each left all of its rows or none\n",
           fill_cut, fills);
    if (bad)
        return 1;

    /* Every connection still answers. */
    struct victim after[THREADS * 4];
    ferry_task *ts[THREADS * 4];
    int right = 0;

    for (int i = 0; i < THREADS * 4; i++) {
        after[i] = (struct victim){ .sql = count_sql, .n = 20000 + i };
        ferry_task_spawn(&ts[i], NULL, victim_task, &after[i], NULL);
    }
    for (int i = 0; i < THREADS * 4; i++) {
        ferry_task_join(ts[i], NULL);
        right += after[i].rc == 0 && after[i].value == after[i].n;
    }
    printf("afterwards: %d of %d queries right on %d connections\n", right, THREADS * 4,
           atomic_load(&conns_open));
    return right == THREADS * 4 ? 0 : 1;
}

int ex_sqlite_wrap(void)
{
    int fd, rc;

    snprintf(db_path, sizeof db_path, "/tmp/ferry-sqlite-XXXXXX");
    fd = mkstemp(db_path);
    if (fd < 0)
        return 1;
    close(fd);
    if (pthread_key_create(&conn_key, conn_close)) {
        unlink(db_path);
        return 1;
    }
    if (ferry_pool_new(&pool, &(ferry_pool_opts){ .threads = THREADS })) {
        unlink(db_path);
        return 1;
    }
    rc = ferry_run(main_task, NULL);
    ferry_pool_free(pool);          /* the threads exit: their connections close */
    pthread_key_delete(conn_key);
    unlink(db_path);
    printf("statements left unfinalized: %d, connections opened %d, closed %d\n",
           atomic_load(&stmts_leaked), atomic_load(&conns_open), atomic_load(&conns_closed));
    if (atomic_load(&stmts_leaked) || atomic_load(&conns_open) != atomic_load(&conns_closed))
        return 1;
    return rc ? 1 : 0;
}

#ifndef FERRY_DEMO
int main(void)
{
    return ex_sqlite_wrap();
}
#endif
