/* pq.c - a libpq connection driven from tasks: connect and free, the
 * waits every call is made of, and the cleanup after an interrupted call
 * (the calls themselves are in pq_query.c).
 * Loop thread only (a cancel request before libpq 17 runs on a pool
 * thread).
 *
 * Every wait is ferry_wait_fd() on PQsocket(), read again before each
 * wait: during the connect the socket changes (another host, a retry
 * without SSL), and once closed it is -1.  libpq is in non-blocking mode,
 * so a call that could block says so instead (PQflush() 1, PQisBusy(),
 * PQputCopyData() 0, PQgetCopyData() 0) and the task waits for the socket.
 * While output is pending the wait is for reading too, and what arrives is
 * consumed: a server that is writing results it cannot get rid of stops
 * reading, and waiting only to write would dead-lock against it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/bridge.h"
#include "pq_int.h"

#define PQ_CLEANUP_DEFAULT ((int64_t)2 * 1000 * 1000 * 1000)

/* ---- helpers ------------------------------------------------------- */

/* The connection is gone: close what is left of it. */
int ferry__pq_lost(ferry_pq *c)
{
    ferry__pq_close(c);
    return -ECONNRESET;
}

int ferry__pq_wait(ferry_pq *c, int events)
{
    int fd = c->conn ? PQsocket(c->conn) : -1;

    if (fd < 0)
        return ferry__pq_lost(c);
    return ferry_wait_fd(fd, events, NULL);
}

/* Send everything libpq has buffered, reading meanwhile. */
int ferry__pq_flush(ferry_pq *c)
{
    for (;;) {
        int rc, fl = PQflush(c->conn);

        if (fl == 0)
            return 0;
        if (fl < 0)
            return ferry__pq_lost(c);
        rc = ferry__pq_wait(c, FERRY_READ | FERRY_WRITE);
        if (rc)
            return rc;
        if (!PQconsumeInput(c->conn))
            return ferry__pq_lost(c);
    }
}

/*
 * Wait until PQgetResult() will not block: send what is buffered and read
 * until libpq has a whole result.  A read that fails lets libpq make an
 * error result of the loss (PQisBusy() false), which the caller then gets.
 */
int ferry__pq_await(ferry_pq *c)
{
    for (;;) {
        int rc, fl = PQflush(c->conn);

        if (fl < 0)
            return ferry__pq_lost(c);
        if (!PQisBusy(c->conn))
            return 0;
        rc = ferry__pq_wait(c, FERRY_READ | (fl ? FERRY_WRITE : 0));
        if (rc)
            return rc;
        if (!PQconsumeInput(c->conn) && PQisBusy(c->conn))
            return ferry__pq_lost(c);
    }
}

/* Read and drop the rows of a COPY TO STDOUT up to its end. */
int ferry__pq_drain_copy_out(ferry_pq *c)
{
    for (;;) {
        char *buf = NULL;
        int rc, n = PQgetCopyData(c->conn, &buf, 1);

        if (n > 0) {
            PQfreemem(buf);
            continue;
        }
        if (n == -1)
            return 0;
        if (n < -1)
            return ferry__pq_lost(c);
        rc = ferry__pq_wait(c, FERRY_READ);
        if (rc)
            return rc;
        if (!PQconsumeInput(c->conn))
            return ferry__pq_lost(c);
    }
}

/* End a COPY FROM STDIN with an error, so that the server aborts it. */
static int abort_copy_in(ferry_pq *c, const char *why)
{
    for (;;) {
        int rc, r = PQputCopyEnd(c->conn, why);

        if (r > 0)
            return ferry__pq_flush(c);
        if (r < 0)
            return ferry__pq_lost(c);
        rc = ferry__pq_wait(c, FERRY_WRITE);
        if (rc)
            return rc;
    }
}

/* Leave pipeline mode once every result was read.  libpq may still hold
 * the end of the last query's results: read it first. */
bool ferry__pq_leave_pipeline(ferry_pq *c)
{
    PGresult *r;

    if (PQexitPipelineMode(c->conn) != 1) {
        while (!PQisBusy(c->conn) && (r = PQgetResult(c->conn)) != NULL)
            PQclear(r);
        if (PQexitPipelineMode(c->conn) != 1)
            return false;
    }
    c->mode = PQ_IDLE;
    return true;
}

/*
 * Read every result left until the connection is idle, dropping them: a
 * COPY that began is ended on the way, a pipeline is read up to its last
 * sync and left.
 */
static int drain(ferry_pq *c)
{
    int rc;

    if (c->mode == PQ_COPY_IN) {
        rc = abort_copy_in(c, "cancelled by the client");
        if (rc)
            return rc;
    } else if (c->mode == PQ_COPY_OUT) {
        rc = ferry__pq_drain_copy_out(c);
        if (rc)
            return rc;
    }
    if (c->mode == PQ_PIPELINE) {
        while (c->pending) {
            PGresult *r;

            rc = ferry__pq_await(c);
            if (rc)
                return rc;
            r = PQgetResult(c->conn);
            if (!r) {
                if (PQstatus(c->conn) == CONNECTION_BAD)
                    return ferry__pq_lost(c);
                continue;
            }
            c->pending--;
            PQclear(r);
        }
        if (!ferry__pq_leave_pipeline(c))
            return ferry__pq_lost(c);
        c->inflight = false;
        return 0;
    }
    c->mode = PQ_IDLE;
    for (;;) {
        PGresult *r;
        ExecStatusType st;

        rc = ferry__pq_await(c);
        if (rc)
            return rc;
        r = PQgetResult(c->conn);
        if (!r)
            break;
        st = PQresultStatus(r);
        PQclear(r);
        if (st == PGRES_COPY_IN)
            rc = abort_copy_in(c, "cancelled by the client");
        else if (st == PGRES_COPY_OUT)
            rc = ferry__pq_drain_copy_out(c);
        if (rc)
            return rc;
    }
    c->inflight = false;
    return PQstatus(c->conn) == CONNECTION_OK ? 0 : ferry__pq_lost(c);
}

/* A cancel request on a pool thread: PQcancel() connects to the server
 * and waits for it to take the request.  Before libpq 17 there is no
 * other way; a connection freed while the server works for it uses it
 * too, without waiting for it. */
struct cancel_job {
    PGcancel *cancel; /* made on the loop from the connection */
    char err[256];    /* PQcancel()'s message */
};

static int cancel_run(void *arg)
{
    struct cancel_job *j = arg;

    return PQcancel(j->cancel, j->err, (int)sizeof(j->err)) ? 0 : -EIO;
}

static void cancel_free(void *arg, int status)
{
    struct cancel_job *j = arg;

    (void)status;
    PQfreeCancel(j->cancel);
    free(j);
}

#ifdef LIBPQ_HAS_ASYNC_CANCEL
/* Ask the server to cancel what the connection runs (libpq 17's
 * non-blocking cancel: a connection of its own, polled as a connect is).
 * Whether it worked or not, the caller drains next: a query that ended
 * first just gives its results. */
static int send_cancel(ferry_pq *c)
{
    PostgresPollingStatusType st = PGRES_POLLING_WRITING;
    PGcancelConn *cc = PQcancelCreate(c->conn);
    int rc = 0;

    if (!cc)
        return -ENOMEM;
    if (PQcancelStart(cc)) {
        while (st != PGRES_POLLING_OK && st != PGRES_POLLING_FAILED) {
            int fd = PQcancelSocket(cc);

            if (fd < 0)
                break;
            rc = ferry_wait_fd(fd, st == PGRES_POLLING_READING ? FERRY_READ : FERRY_WRITE, NULL);
            if (rc)
                break;
            st = PQcancelPoll(cc);
        }
    }
    PQcancelFinish(cc);
    return rc;
}
#else
/* Ask the server to cancel what the connection runs.  Whether it worked
 * or not, the caller drains next: a query that ended first just gives its
 * results. */
static int send_cancel(ferry_pq *c)
{
    struct cancel_job *j = calloc(1, sizeof(*j));
    int rc;

    if (!j)
        return -ENOMEM;
    j->cancel = PQgetCancel(c->conn);
    if (!j->cancel) {
        free(j);
        return -ENOMEM;
    }
    rc = ferry_to_thread_abandon(NULL, cancel_run, j, cancel_free);
    if (rc == -ECANCELED || rc == -ETIMEDOUT)
        return rc; /* the cleanup deadline: cancel_free() has the job */
    cancel_free(j, rc);
    return rc == -EIO ? 0 : rc;
}
#endif

/*
 * After an interrupted call: finish sending, cancel on the server what
 * still runs, read the results, all shielded and within the connection's
 * cleanup bound; if any of it fails, close the connection.  Either way no
 * call is left in progress on it.
 */
static void settle(ferry_pq *c)
{
    ferry_scope scope;
    int rc;

    if (!c->conn)
        return;
    if (ferry_scope_enter(&scope, ferry_now() + c->cleanup_timeout, FERRY_SCOPE_SHIELD)) {
        ferry__pq_close(c);
        return;
    }
    rc = ferry__pq_flush(c);
    if (!rc && c->mode == PQ_PIPELINE && c->unsynced) {
        /* The server skips nothing before a sync: end the batch so that
         * the drain below has an end to read up to. */
        if (PQpipelineSync(c->conn) != 1) {
            rc = ferry__pq_lost(c);
        } else {
            c->unsynced = 0;
            c->pending++;
            rc = ferry__pq_flush(c);
        }
    }
    /* A COPY FROM STDIN waits for us, not the server: drain() ends it. */
    if (!rc && c->mode != PQ_COPY_IN &&
        (c->inflight || c->mode == PQ_COPY_OUT || (c->mode == PQ_PIPELINE && c->pending)))
        rc = send_cancel(c);
    if (!rc)
        rc = drain(c);
    ferry_scope_exit(&scope);
    if (rc && c->conn)
        ferry__pq_close(c);
}

/* Start a call: one task at a time, in a task, on an open connection. */
int ferry__pq_enter(ferry_pq *c)
{
    if (!c)
        return -EINVAL;
    if (!ferry_task_current())
        return -EPERM;
    if (c->inside)
        return -EBUSY;
    if (!c->conn)
        return -ECONNRESET;
    c->inside = true;
    return 0;
}

/* End a call with `rc`: an interruption or failure past the point where
 * the server was involved leaves the connection settled (idle) or closed.
 * Not for an end that leaves the connection as the caller expects it
 * (copy_get's -ENODATA). */
int ferry__pq_leave(ferry_pq *c, int rc)
{
    if (rc && rc != -ECONNRESET && c->conn)
        settle(c);
    c->inside = false;
    return rc;
}

/* libpq refused a send: the connection is gone, or it was a misuse. */
int ferry__pq_send_failed(ferry_pq *c)
{
    if (PQstatus(c->conn) == CONNECTION_BAD)
        return ferry__pq_lost(c);
    return -EIO;
}

/* Collect the results of the query in flight: the first error, or else
 * the last result; a COPY that began returns at once. */
int ferry__pq_collect(ferry_pq *c, PGresult **out)
{
    PGresult *keep = NULL;

    for (;;) {
        PGresult *r;
        ExecStatusType st;
        int rc = ferry__pq_await(c);

        if (rc) {
            PQclear(keep);
            return rc;
        }
        r = PQgetResult(c->conn);
        if (!r)
            break;
        st = PQresultStatus(r);
        if (st == PGRES_COPY_IN || st == PGRES_COPY_OUT) {
            PQclear(keep);
            c->mode = st == PGRES_COPY_IN ? PQ_COPY_IN : PQ_COPY_OUT;
            *out = r;
            return 0;
        }
        if (keep && PQresultStatus(keep) == PGRES_FATAL_ERROR) {
            PQclear(r);
        } else {
            PQclear(keep);
            keep = r;
        }
    }
    c->inflight = false;
    if (!keep)
        return ferry__pq_lost(c);
    *out = keep;
    return 0;
}

/* ---- connection ---------------------------------------------------- */

/* Queue a cancel request that nobody waits for (ferry_pq_free() of a
 * connection the server still works for): the server would otherwise
 * finish the query before it noticed the closed socket. */
static int cancel_done(void *arg, int status)
{
    cancel_free(arg, status);
    return 0;
}

static void cancel_detached(ferry_pq *c)
{
    struct cancel_job *j = calloc(1, sizeof(*j));

    if (!j)
        return;
    j->cancel = PQgetCancel(c->conn);
    if (!j->cancel || ferry_pool_submit(NULL, cancel_run, j, NULL, cancel_done, j) != 0)
        cancel_free(j, 0);
}

void ferry__pq_close(ferry_pq *c)
{
    if (c->conn)
        PQfinish(c->conn);
    c->conn = NULL;
    c->mode = PQ_IDLE;
    c->inflight = false;
    c->pending = 0;
    c->unsynced = 0;
}

static void put_error(const ferry_pq_opts *opts, const char *msg)
{
    if (opts && opts->errbuf && opts->errbuf_len)
        snprintf(opts->errbuf, opts->errbuf_len, "%s", msg ? msg : "");
}

int ferry_pq_connect(ferry_pq **out, const char *conninfo, const ferry_pq_opts *opts)
{
    static const char *const keys[] = { "dbname", NULL };
    const char *vals[] = { conninfo, NULL };
    PostgresPollingStatusType st = PGRES_POLLING_WRITING;
    ferry_pq *c;
    int rc;

    if (!out || !conninfo)
        return -EINVAL;
    *out = NULL;
    if (!ferry_task_current())
        return -EPERM;
    c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->cleanup_timeout =
        opts && opts->cleanup_timeout > 0 ? opts->cleanup_timeout : PQ_CLEANUP_DEFAULT;
    c->conn = PQconnectStartParams(keys, vals, 1);
    if (!c->conn) {
        rc = -ENOMEM;
        goto err_free;
    }
    for (;;) {
        int fd;

        if (PQstatus(c->conn) == CONNECTION_BAD || st == PGRES_POLLING_FAILED) {
            rc = -ECONNREFUSED;
            put_error(opts, PQerrorMessage(c->conn));
            goto err_finish;
        }
        if (st == PGRES_POLLING_OK)
            break;
        fd = PQsocket(c->conn);
        if (fd < 0) {
            rc = -ECONNREFUSED;
            put_error(opts, PQerrorMessage(c->conn));
            goto err_finish;
        }
        rc = ferry_wait_fd(fd, st == PGRES_POLLING_READING ? FERRY_READ : FERRY_WRITE, NULL);
        if (rc)
            goto err_finish;
        st = PQconnectPoll(c->conn);
    }
    if (PQsetnonblocking(c->conn, 1) != 0) {
        rc = -ECONNREFUSED;
        put_error(opts, PQerrorMessage(c->conn));
        goto err_finish;
    }
    *out = c;
    return 0;

err_finish:
    PQfinish(c->conn);
err_free:
    free(c);
    return rc;
}

void ferry_pq_free(ferry_pq *c)
{
    if (!c)
        return;
    if (c->conn && PQstatus(c->conn) == CONNECTION_OK &&
        (c->inflight || c->mode == PQ_COPY_OUT || (c->mode == PQ_PIPELINE && c->pending)))
        cancel_detached(c);
    ferry__pq_close(c);
    free(c);
}

bool ferry_pq_ok(const ferry_pq *c)
{
    return c && c->conn && PQstatus(c->conn) == CONNECTION_OK && !c->inside && !c->inflight &&
           c->mode == PQ_IDLE;
}

PGconn *ferry_pq_conn(const ferry_pq *c)
{
    return c ? c->conn : NULL;
}

const char *ferry_pq_error(const ferry_pq *c)
{
    if (!c)
        return "";
    if (!c->conn)
        return "connection closed";
    return PQerrorMessage(c->conn);
}
