/* pq.c - a libpq connection driven from tasks: connect, queries, pipeline
 * mode, COPY, notifications, and the cleanup after an interrupted call.
 * Loop thread only (the cancel request alone runs on a pool thread).
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

/* Pipeline: how many messages are queued between two checks that the
 * socket takes what libpq buffered. */
#define PQ_SEND_CHECK 64

/* ---- helpers ------------------------------------------------------- */

/* The connection is gone: close what is left of it. */
static int lost(ferry_pq *c)
{
    ferry__pq_close(c);
    return -ECONNRESET;
}

static int wait_sock(ferry_pq *c, int events)
{
    int fd = c->conn ? PQsocket(c->conn) : -1;

    if (fd < 0)
        return lost(c);
    return ferry_wait_fd(fd, events, NULL);
}

/* Send everything libpq has buffered, reading meanwhile. */
static int flush_all(ferry_pq *c)
{
    for (;;) {
        int rc, fl = PQflush(c->conn);

        if (fl == 0)
            return 0;
        if (fl < 0)
            return lost(c);
        rc = wait_sock(c, FERRY_READ | FERRY_WRITE);
        if (rc)
            return rc;
        if (!PQconsumeInput(c->conn))
            return lost(c);
    }
}

/*
 * Wait until PQgetResult() will not block: send what is buffered and read
 * until libpq has a whole result.  A read that fails lets libpq make an
 * error result of the loss (PQisBusy() false), which the caller then gets.
 */
static int await_result(ferry_pq *c)
{
    for (;;) {
        int rc, fl = PQflush(c->conn);

        if (fl < 0)
            return lost(c);
        if (!PQisBusy(c->conn))
            return 0;
        rc = wait_sock(c, FERRY_READ | (fl ? FERRY_WRITE : 0));
        if (rc)
            return rc;
        if (!PQconsumeInput(c->conn) && PQisBusy(c->conn))
            return lost(c);
    }
}

/* Read and drop the rows of a COPY TO STDOUT up to its end. */
static int drain_copy_out(ferry_pq *c)
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
            return lost(c);
        rc = wait_sock(c, FERRY_READ);
        if (rc)
            return rc;
        if (!PQconsumeInput(c->conn))
            return lost(c);
    }
}

/* End a COPY FROM STDIN with an error, so that the server aborts it. */
static int abort_copy_in(ferry_pq *c, const char *why)
{
    for (;;) {
        int rc, r = PQputCopyEnd(c->conn, why);

        if (r > 0)
            return flush_all(c);
        if (r < 0)
            return lost(c);
        rc = wait_sock(c, FERRY_WRITE);
        if (rc)
            return rc;
    }
}

/* Leave pipeline mode once every result was read.  libpq may still hold
 * the end of the last query's results: read it first. */
static bool leave_pipeline(ferry_pq *c)
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
        rc = drain_copy_out(c);
        if (rc)
            return rc;
    }
    if (c->mode == PQ_PIPELINE) {
        while (c->pending) {
            PGresult *r;

            rc = await_result(c);
            if (rc)
                return rc;
            r = PQgetResult(c->conn);
            if (!r) {
                if (PQstatus(c->conn) == CONNECTION_BAD)
                    return lost(c);
                continue;
            }
            c->pending--;
            PQclear(r);
        }
        if (!leave_pipeline(c))
            return lost(c);
        c->inflight = false;
        return 0;
    }
    c->mode = PQ_IDLE;
    for (;;) {
        PGresult *r;
        ExecStatusType st;

        rc = await_result(c);
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
            rc = drain_copy_out(c);
        if (rc)
            return rc;
    }
    c->inflight = false;
    return PQstatus(c->conn) == CONNECTION_OK ? 0 : lost(c);
}

/* A cancel request on a pool thread: PQcancel() connects to the server
 * and waits for it to take the request.  Before libpq 17 there is no
 * other way; a connection freed while the server works for it uses it
 * too, without waiting for it. */
struct cancel_job {
    PGcancel *cancel;   /* made on the loop from the connection */
    char      err[256]; /* PQcancel()'s message */
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
        return rc;   /* the cleanup deadline: cancel_free() has the job */
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
    rc = flush_all(c);
    if (!rc && c->mode == PQ_PIPELINE && c->unsynced) {
        /* The server skips nothing before a sync: end the batch so that
         * the drain below has an end to read up to. */
        if (PQpipelineSync(c->conn) != 1) {
            rc = lost(c);
        } else {
            c->unsynced = 0;
            c->pending++;
            rc = flush_all(c);
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
static int enter(ferry_pq *c)
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
static int leave(ferry_pq *c, int rc)
{
    if (rc && rc != -ECONNRESET && c->conn)
        settle(c);
    c->inside = false;
    return rc;
}

/* libpq refused a send: the connection is gone, or it was a misuse. */
static int send_failed(ferry_pq *c)
{
    if (PQstatus(c->conn) == CONNECTION_BAD)
        return lost(c);
    return -EIO;
}

/* Collect the results of the query in flight: the first error, or else
 * the last result; a COPY that began returns at once. */
static int collect(ferry_pq *c, PGresult **out)
{
    PGresult *keep = NULL;

    for (;;) {
        PGresult *r;
        ExecStatusType st;
        int rc = await_result(c);

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
        return lost(c);
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
    if (!j->cancel ||
        ferry_pool_submit(NULL, cancel_run, j, NULL, cancel_done, j) != 0)
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
    c->cleanup_timeout = opts && opts->cleanup_timeout > 0 ? opts->cleanup_timeout
                                                           : PQ_CLEANUP_DEFAULT;
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
    return c && c->conn && PQstatus(c->conn) == CONNECTION_OK && !c->inside &&
           !c->inflight && c->mode == PQ_IDLE;
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

/* ---- queries ------------------------------------------------------- */

/* One message to send: a query with parameters, a prepared statement's
 * execution, or a preparation. */
enum send_kind { SEND_PARAMS, SEND_PREPARED, SEND_PREPARE };

struct send {
    enum send_kind     kind;
    const char        *name;          /* SEND_PREPARED, SEND_PREPARE */
    const char        *sql;           /* SEND_PARAMS, SEND_PREPARE */
    int                nparams;
    const Oid         *types;         /* SEND_PARAMS, SEND_PREPARE */
    const char *const *values;        /* SEND_PARAMS, SEND_PREPARED */
    const int         *lengths;
    const int         *formats;
    int                result_format;
};

static bool send_valid(const struct send *s)
{
    if (s->nparams < 0 || (s->nparams && s->kind != SEND_PREPARE && !s->values))
        return false;
    return s->kind == SEND_PREPARED ? s->name != NULL
                                    : s->sql != NULL && (s->kind == SEND_PARAMS || s->name);
}

/* Hand the message to libpq (which buffers it). */
static int send_one(ferry_pq *c, const struct send *s)
{
    int ok;

    if (s->kind == SEND_PARAMS)
        ok = PQsendQueryParams(c->conn, s->sql, s->nparams, s->types, s->values, s->lengths,
                               s->formats, s->result_format);
    else if (s->kind == SEND_PREPARED)
        ok = PQsendQueryPrepared(c->conn, s->name, s->nparams, s->values, s->lengths,
                                 s->formats, s->result_format);
    else
        ok = PQsendPrepare(c->conn, s->name, s->sql, s->nparams, s->types);
    return ok ? 0 : send_failed(c);
}

/* Send one message on an idle connection and wait for its result. */
static int query_one(ferry_pq *c, PGresult **out, const struct send *s)
{
    int rc;

    if (!out || !send_valid(s))
        return -EINVAL;
    *out = NULL;
    rc = enter(c);
    if (rc)
        return rc;
    if (c->mode != PQ_IDLE || c->inflight) {
        c->inside = false;
        return -EBUSY;
    }
    rc = send_one(c, s);
    if (rc) {
        c->inside = false;
        return rc;
    }
    c->inflight = true;
    rc = collect(c, out);
    return leave(c, rc);
}

/* Queue one message of the pipeline and send what the socket takes. */
static int pipeline_one(ferry_pq *c, const struct send *s)
{
    int rc, fl;

    if (!send_valid(s))
        return -EINVAL;
    rc = enter(c);
    if (rc)
        return rc;
    if (c->mode != PQ_PIPELINE) {
        c->inside = false;
        return -EBUSY;
    }
    rc = send_one(c, s);
    if (rc) {
        c->inside = false;
        return rc;
    }
    c->pending++;
    c->unsynced++;
    /* libpq sends on its own once 64 KiB are buffered, but never waits:
     * every PQ_SEND_CHECK messages, see whether the socket took it all,
     * and wait while it takes no more, so that the buffer stays bounded.
     * A flush per message would cost a system call and a server wakeup
     * per query. */
    if (c->unsynced % PQ_SEND_CHECK)
        return leave(c, 0);
    fl = PQflush(c->conn);
    if (fl < 0)
        return leave(c, lost(c));
    rc = fl ? flush_all(c) : 0;
    return leave(c, rc);
}

int ferry_pq_query_params(ferry_pq *c, PGresult **out, const char *sql, int nparams,
                          const Oid *types, const char *const *values, const int *lengths,
                          const int *formats, int result_format)
{
    struct send s = { SEND_PARAMS, NULL, sql, nparams, types, values, lengths, formats,
                      result_format };

    return query_one(c, out, &s);
}

int ferry_pq_prepare(ferry_pq *c, PGresult **out, const char *name, const char *sql,
                     int nparams, const Oid *types)
{
    struct send s = { SEND_PREPARE, name, sql, nparams, types, NULL, NULL, NULL, 0 };

    return query_one(c, out, &s);
}

int ferry_pq_query_prepared(ferry_pq *c, PGresult **out, const char *name, int nparams,
                            const char *const *values, const int *lengths, const int *formats,
                            int result_format)
{
    struct send s = { SEND_PREPARED, name, NULL, nparams, NULL, values, lengths, formats,
                      result_format };

    return query_one(c, out, &s);
}

int ferry_pq_query(ferry_pq *c, PGresult **out, const char *sql, int nparams,
                   const char *const *values)
{
    return ferry_pq_query_params(c, out, sql, nparams, NULL, values, NULL, NULL, 0);
}

int ferry_pq_exec(ferry_pq *c, const char *sql)
{
    int rc, err = 0;

    if (!sql)
        return -EINVAL;
    rc = enter(c);
    if (rc)
        return rc;
    if (c->mode != PQ_IDLE || c->inflight) {
        c->inside = false;
        return -EBUSY;
    }
    if (!PQsendQuery(c->conn, sql)) {
        c->inside = false;
        return send_failed(c);
    }
    c->inflight = true;
    for (;;) {
        PGresult *r;
        ExecStatusType st;

        rc = await_result(c);
        if (rc)
            return leave(c, rc);
        r = PQgetResult(c->conn);
        if (!r)
            break;
        st = PQresultStatus(r);
        PQclear(r);
        if (st == PGRES_FATAL_ERROR || st == PGRES_BAD_RESPONSE || st == PGRES_NONFATAL_ERROR)
            err = -EIO;
        if (st == PGRES_COPY_IN || st == PGRES_COPY_OUT) {
            /* Not for COPY: end it (drain() does) and say so. */
            c->mode = st == PGRES_COPY_IN ? PQ_COPY_IN : PQ_COPY_OUT;
            return leave(c, -EINVAL);
        }
    }
    c->inflight = false;
    if (PQstatus(c->conn) != CONNECTION_OK)
        return leave(c, lost(c));
    return leave(c, err);
}

/* ---- pipeline ------------------------------------------------------ */

int ferry_pq_pipeline_enter(ferry_pq *c)
{
    if (!c)
        return -EINVAL;
    if (!c->conn)
        return -ECONNRESET;
    if (c->inside || c->inflight || c->mode != PQ_IDLE)
        return -EBUSY;
#ifdef LIBPQ_HAS_PIPELINING
    if (PQenterPipelineMode(c->conn) != 1)
        return PQstatus(c->conn) == CONNECTION_BAD ? lost(c) : -EBUSY;
    c->mode = PQ_PIPELINE;
    c->pending = 0;
    c->unsynced = 0;
    return 0;
#else
    return -ENOTSUP;
#endif
}

int ferry_pq_pipeline_exit(ferry_pq *c)
{
    if (!c)
        return -EINVAL;
    if (c->mode != PQ_PIPELINE)
        return 0;
    if (c->inside || c->pending || c->unsynced)
        return -EBUSY;
    return leave_pipeline(c) ? 0 : -EBUSY;
}

int ferry_pq_send(ferry_pq *c, const char *sql, int nparams, const Oid *types,
                  const char *const *values, const int *lengths, const int *formats,
                  int result_format)
{
    struct send s = { SEND_PARAMS, NULL, sql, nparams, types, values, lengths, formats,
                      result_format };

    return pipeline_one(c, &s);
}

int ferry_pq_send_prepare(ferry_pq *c, const char *name, const char *sql, int nparams,
                          const Oid *types)
{
    struct send s = { SEND_PREPARE, name, sql, nparams, types, NULL, NULL, NULL, 0 };

    return pipeline_one(c, &s);
}

int ferry_pq_send_prepared(ferry_pq *c, const char *name, int nparams,
                           const char *const *values, const int *lengths, const int *formats,
                           int result_format)
{
    struct send s = { SEND_PREPARED, name, NULL, nparams, NULL, values, lengths, formats,
                      result_format };

    return pipeline_one(c, &s);
}

int ferry_pq_sync(ferry_pq *c)
{
    if (!c)
        return -EINVAL;
    if (!c->conn)
        return -ECONNRESET;
    if (c->inside || c->mode != PQ_PIPELINE)
        return -EBUSY;
    if (PQpipelineSync(c->conn) != 1)
        return send_failed(c);
    c->pending++;
    c->unsynced = 0;
    return 0;
}

int ferry_pq_recv(ferry_pq *c, PGresult **out)
{
    int rc;

    if (!out)
        return -EINVAL;
    *out = NULL;
    rc = enter(c);
    if (rc)
        return rc;
    if (c->mode != PQ_PIPELINE) {
        c->inside = false;
        return -EBUSY;
    }
    if (!c->pending) {
        c->inside = false;
        return -ENODATA;
    }
    for (;;) {
        PGresult *r;

        rc = await_result(c);
        if (rc)
            return leave(c, rc);
        r = PQgetResult(c->conn);
        if (!r) {
            /* The end of one query's results, before the next one's. */
            if (PQstatus(c->conn) == CONNECTION_BAD)
                return leave(c, lost(c));
            continue;
        }
        c->pending--;
        *out = r;
        return leave(c, 0);
    }
}

/* ---- COPY ---------------------------------------------------------- */

int ferry_pq_copy_start(ferry_pq *c, PGresult **out, const char *sql)
{
    int rc;

    if (!out || !sql)
        return -EINVAL;
    *out = NULL;
    rc = enter(c);
    if (rc)
        return rc;
    if (c->mode != PQ_IDLE || c->inflight) {
        c->inside = false;
        return -EBUSY;
    }
    if (!PQsendQuery(c->conn, sql)) {
        c->inside = false;
        return send_failed(c);
    }
    c->inflight = true;
    rc = collect(c, out);
    return leave(c, rc);
}

int ferry_pq_copy_put(ferry_pq *c, const void *buf, size_t len)
{
    int rc;

    if ((!buf && len) || len > INT32_MAX)
        return -EINVAL;
    rc = enter(c);
    if (rc)
        return rc;
    if (c->mode != PQ_COPY_IN) {
        c->inside = false;
        return -EBUSY;
    }
    for (;;) {
        int r = PQputCopyData(c->conn, buf, (int)len);

        if (r > 0)
            break;
        if (r < 0)
            return leave(c, lost(c));
        rc = flush_all(c);
        if (rc)
            return leave(c, rc);
    }
    rc = PQflush(c->conn);
    if (rc < 0)
        return leave(c, lost(c));
    return leave(c, rc ? flush_all(c) : 0);
}

int ferry_pq_copy_get(ferry_pq *c, char **buf, size_t *len)
{
    int rc;

    if (!buf || !len)
        return -EINVAL;
    *buf = NULL;
    *len = 0;
    rc = enter(c);
    if (rc)
        return rc;
    if (c->mode == PQ_COPY_DONE) {
        c->inside = false;
        return -ENODATA;
    }
    if (c->mode != PQ_COPY_OUT) {
        c->inside = false;
        return -EBUSY;
    }
    for (;;) {
        int n = PQgetCopyData(c->conn, buf, 1);

        if (n > 0) {
            *len = (size_t)n;
            return leave(c, 0);
        }
        if (n == -1) {
            c->mode = PQ_COPY_DONE;
            c->inside = false;
            return -ENODATA;
        }
        if (n < -1)
            return leave(c, lost(c));
        rc = wait_sock(c, FERRY_READ);
        if (!rc && !PQconsumeInput(c->conn))
            rc = lost(c);
        if (rc)
            return leave(c, rc);
    }
}

int ferry_pq_copy_end(ferry_pq *c, const char *errmsg, PGresult **out)
{
    int rc;

    if (!out)
        return -EINVAL;
    *out = NULL;
    rc = enter(c);
    if (rc)
        return rc;
    if (c->mode == PQ_COPY_IN) {
        for (;;) {
            int r = PQputCopyEnd(c->conn, errmsg);

            if (r > 0)
                break;
            if (r < 0)
                return leave(c, lost(c));
            rc = flush_all(c);
            if (rc)
                return leave(c, rc);
        }
    } else if (c->mode == PQ_COPY_OUT) {
        rc = drain_copy_out(c);
        if (rc)
            return leave(c, rc);
    } else if (c->mode != PQ_COPY_DONE) {
        c->inside = false;
        return -EBUSY;
    }
    c->mode = PQ_IDLE;
    rc = collect(c, out);
    return leave(c, rc);
}

/* ---- notifications --------------------------------------------------- */

int ferry_pq_notify_recv(ferry_pq *c, PGnotify **out)
{
    int rc;

    if (!out)
        return -EINVAL;
    *out = NULL;
    rc = enter(c);
    if (rc)
        return rc;
    if (c->mode != PQ_IDLE || c->inflight) {
        c->inside = false;
        return -EBUSY;
    }
    for (;;) {
        *out = PQnotifies(c->conn);
        if (*out)
            break;
        rc = wait_sock(c, FERRY_READ);
        if (rc)
            break;
        if (!PQconsumeInput(c->conn)) {
            rc = lost(c);
            break;
        }
    }
    /* An interrupted wait sent nothing: the connection is idle as it was. */
    c->inside = false;
    return rc;
}
