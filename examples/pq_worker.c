/* pq_worker.c - a worker that takes jobs from PostgreSQL when it is told
 * there are some (LISTEN/NOTIFY) and writes their results in a pipelined
 * transaction.
 *
 * A producer task inserts jobs in small bursts and NOTIFYs the channel
 * "jobs" after each burst.  The worker waits on its listener (with a
 * deadline: a notification lost while it was busy costs at most that
 * long), then, in one transaction sent as one pipeline:
 *
 *     BEGIN
 *     UPDATE job SET taken = true WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED)
 *         RETURNING id, input                      -- claim a batch
 *     -- sync, read the claimed jobs, compute
 *     INSERT INTO result VALUES ($1, $2) x N       -- one per job
 *     COMMIT
 *     -- sync
 *
 * so a batch of N results costs two round trips, not N + 3.  SKIP LOCKED
 * lets several workers share the table; a worker that dies mid-batch rolls
 * its claim back with its transaction.
 *
 *     pq_worker [CONNINFO]      (default: $FERRY_PQ_CONNINFO, else libpq's
 *                                environment defaults)
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/ferry.h"
#include "ferry/pq.h"

#define BURSTS      10
#define PER_BURST   25
#define JOBS        (BURSTS * PER_BURST)
#define BATCH       100

static const char *conninfo = "";
static int done_jobs, batches, wrong;

/* The "work": the length of the input, as text. */
static void compute(const char *input, char *out, size_t n)
{
    snprintf(out, n, "%zu", strlen(input));
}

/* Claim up to BATCH jobs and write their results, in one transaction.
 * Returns how many were done, or a negative errno. */
static int run_batch(ferry_pq *c)
{
    char ids[BATCH][24], outs[BATCH][24];
    PGresult *r, *claimed = NULL;
    int n = 0, rc, bad = 0;

    rc = ferry_pq_pipeline_enter(c);
    if (rc)
        return rc;
    ferry_pq_send(c, "BEGIN", 0, NULL, NULL, NULL, NULL, 0);
    ferry_pq_send(c, "UPDATE job SET taken = true WHERE id IN (SELECT id FROM job "
                     "WHERE NOT taken ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED) "
                     "RETURNING id, input", 0, NULL, NULL, NULL, NULL, 0);
    rc = ferry_pq_sync(c);
    /* BEGIN's result, the claim's, the sync's. */
    for (int i = 0; !rc && i < 3; i++) {
        rc = ferry_pq_recv(c, &r);
        if (rc)
            break;
        if (i == 1)
            claimed = r;
        else
            PQclear(r);
    }
    if (!rc && PQresultStatus(claimed) == PGRES_TUPLES_OK) {
        n = PQntuples(claimed);
        for (int i = 0; i < n && !rc; i++) {
            const char *vals[2] = { ids[i], outs[i] };

            snprintf(ids[i], sizeof(ids[i]), "%s", PQgetvalue(claimed, i, 0));
            compute(PQgetvalue(claimed, i, 1), outs[i], sizeof(outs[i]));
            rc = ferry_pq_send(c, "INSERT INTO result VALUES ($1, $2)", 2, NULL, vals,
                               NULL, NULL, 0);
        }
    } else if (!rc) {
        bad = 1;
    }
    PQclear(claimed);
    if (!rc) {
        ferry_pq_send(c, bad ? "ROLLBACK" : "COMMIT", 0, NULL, NULL, NULL, NULL, 0);
        rc = ferry_pq_sync(c);
    }
    /* The inserts', the COMMIT's and the sync's results. */
    while (!rc) {
        rc = ferry_pq_recv(c, &r);
        if (rc)
            break;
        if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_PIPELINE_SYNC)
            bad = 1;
        PQclear(r);
    }
    if (rc == -ENODATA)
        rc = ferry_pq_pipeline_exit(c);
    if (rc)
        return rc;
    return bad ? -EIO : n;
}

static int worker_main(void *arg)
{
    static const char *const chans[] = { "jobs" };
    ferry_pq_listener *l;
    ferry_pq *c;
    int rc;

    (void)arg;
    rc = ferry_pq_listener_new(&l, conninfo, chans, 1, 0);
    if (rc)
        return rc;
    rc = ferry_pq_connect(&c, conninfo, NULL);
    if (rc) {
        ferry_pq_listener_free(l);
        return rc;
    }
    while (done_jobs < JOBS) {
        PGnotify *note;
        ferry_scope scope;
        int n;

        /* Wait to be told, but look anyway every 500 ms. */
        ferry_scope_enter(&scope, ferry_now() + FERRY_MSEC(500), 0);
        rc = ferry_pq_listener_recv(l, &note);
        ferry_scope_exit(&scope);
        if (rc == 0)
            PQfreemem(note);
        else if (rc != -ETIMEDOUT)
            break;
        /* Take batches until the table has none left. */
        do {
            n = run_batch(c);
            if (n > 0) {
                done_jobs += n;
                batches++;
            }
        } while (n > 0);
        if (n < 0) {
            rc = n;
            break;
        }
        rc = 0;
    }
    ferry_pq_free(c);
    ferry_pq_listener_free(l);
    return rc;
}

static int producer_main(void *arg)
{
    ferry_pq *c;
    int rc;

    (void)arg;
    rc = ferry_pq_connect(&c, conninfo, NULL);
    if (rc)
        return rc;
    for (int b = 0; b < BURSTS && !rc; b++) {
        char sql[160];

        snprintf(sql, sizeof(sql),
                 "INSERT INTO job (input) SELECT repeat('x', i) FROM generate_series(%d, %d) i; "
                 "NOTIFY jobs", b * PER_BURST + 1, (b + 1) * PER_BURST);
        rc = ferry_pq_exec(c, sql);
        if (!rc)
            rc = ferry_sleep(FERRY_MSEC(20));
    }
    ferry_pq_free(c);
    return rc;
}

static int main_task(void *arg)
{
    ferry_task *worker, *producer;
    int64_t t0 = ferry_now();
    int wrc = -1, prc = -1, rc;
    ferry_pq *c;
    PGresult *r;

    (void)arg;
    rc = ferry_pq_connect(&c, conninfo, NULL);
    if (rc) {
        fprintf(stderr, "pq_worker: cannot connect (%s)\n", strerror(-rc));
        return rc;
    }
    rc = ferry_pq_exec(c, "DROP TABLE IF EXISTS job, result; "
                          "CREATE TABLE job (id serial PRIMARY KEY, input text NOT NULL, "
                          "                  taken bool NOT NULL DEFAULT false); "
                          "CREATE TABLE result (job_id int PRIMARY KEY, output text NOT NULL)");
    if (rc)
        goto out;
    ferry_task_spawn(&worker, NULL, worker_main, NULL, &(ferry_task_opts){ .name = "worker" });
    ferry_sleep(FERRY_MSEC(50));   /* listening before the first NOTIFY */
    ferry_task_spawn(&producer, NULL, producer_main, NULL, &(ferry_task_opts){ .name = "producer" });
    ferry_task_join(producer, &prc);
    ferry_task_join(worker, &wrc);
    /* Each result is the length of its job's input. */
    rc = ferry_pq_query(c, &r, "SELECT count(*), count(*) FILTER (WHERE r.output::int <> "
                               "length(j.input)) FROM result r JOIN job j ON j.id = r.job_id",
                        0, NULL);
    if (!rc) {
        wrong = PQresultStatus(r) == PGRES_TUPLES_OK ? atoi(PQgetvalue(r, 0, 1)) : -1;
        printf("%d jobs in %d bursts, %d done in %d pipelined transactions, %d results "
               "stored, %d wrong, in %lld ms\n",
               JOBS, BURSTS, done_jobs, batches,
               PQresultStatus(r) == PGRES_TUPLES_OK ? atoi(PQgetvalue(r, 0, 0)) : -1, wrong,
               (long long)((ferry_now() - t0) / FERRY_MSEC(1)));
        PQclear(r);
    }
out:
    ferry_pq_free(c);
    if (rc || wrc || prc) {
        fprintf(stderr, "pq_worker: failed (%d, worker %d, producer %d)\n", rc, wrc, prc);
        return 1;
    }
    return done_jobs == JOBS && wrong == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc > 1)
        conninfo = argv[1];
    else if (getenv("FERRY_PQ_CONNINFO"))
        conninfo = getenv("FERRY_PQ_CONNINFO");
    return ferry_run(main_task, NULL) ? 1 : 0;
}
