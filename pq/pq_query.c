/* pq_query.c - the calls that talk to the server once connected: queries
 * and prepared statements, pipeline mode, COPY, notifications.  Each one
 * enters the connection (one task at a time), sends, waits for what it
 * needs with pq.c's helpers, and leaves it; an interruption on the way
 * leaves it settled or closed (ferry__pq_leave()).
 * Loop thread only.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pq_int.h"

/* Pipeline: how many messages are queued between two checks that the
 * socket takes what libpq buffered. */
#define PQ_SEND_CHECK 64

/* ---- queries ------------------------------------------------------- */

/* One message to send: a query with parameters, a prepared statement's
 * execution, or a preparation. */
enum send_kind { SEND_PARAMS, SEND_PREPARED, SEND_PREPARE };

struct send {
    enum send_kind kind;       /* which of the three */
    const char *name;          /* the statement: SEND_PREPARED, SEND_PREPARE */
    const char *sql;           /* SEND_PARAMS, SEND_PREPARE */
    int nparams;               /* how many parameters */
    const Oid *types;          /* their types or NULL: SEND_PARAMS, SEND_PREPARE */
    const char *const *values; /* their values: SEND_PARAMS, SEND_PREPARED */
    const int *lengths;        /* of binary values, or NULL */
    const int *formats;        /* 0 text, 1 binary, per value; NULL: all text */
    int result_format;         /* 0 text, 1 binary */
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
        ok = PQsendQueryPrepared(c->conn, s->name, s->nparams, s->values, s->lengths, s->formats,
                                 s->result_format);
    else
        ok = PQsendPrepare(c->conn, s->name, s->sql, s->nparams, s->types);
    return ok ? 0 : ferry__pq_send_failed(c);
}

/* Send one message on an idle connection and wait for its result. */
static int query_one(ferry_pq *c, PGresult **out, const struct send *s)
{
    int rc;

    if (!out || !send_valid(s))
        return -EINVAL;
    *out = NULL;
    rc = ferry__pq_enter(c);
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
    rc = ferry__pq_collect(c, out);
    return ferry__pq_leave(c, rc);
}

/* Queue one message of the pipeline and send what the socket takes. */
static int pipeline_one(ferry_pq *c, const struct send *s)
{
    int rc, fl;

    if (!send_valid(s))
        return -EINVAL;
    rc = ferry__pq_enter(c);
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
        return ferry__pq_leave(c, 0);
    fl = PQflush(c->conn);
    if (fl < 0)
        return ferry__pq_leave(c, ferry__pq_lost(c));
    rc = fl ? ferry__pq_flush(c) : 0;
    return ferry__pq_leave(c, rc);
}

int ferry_pq_query_params(ferry_pq *c, PGresult **out, const char *sql, int nparams,
                          const Oid *types, const char *const *values, const int *lengths,
                          const int *formats, int result_format)
{
    struct send s = { SEND_PARAMS, NULL,    sql,     nparams,      types,
                      values,      lengths, formats, result_format };

    return query_one(c, out, &s);
}

int ferry_pq_prepare(ferry_pq *c, PGresult **out, const char *name, const char *sql, int nparams,
                     const Oid *types)
{
    struct send s = { SEND_PREPARE, name, sql, nparams, types, NULL, NULL, NULL, 0 };

    return query_one(c, out, &s);
}

int ferry_pq_query_prepared(ferry_pq *c, PGresult **out, const char *name, int nparams,
                            const char *const *values, const int *lengths, const int *formats,
                            int result_format)
{
    struct send s = { SEND_PREPARED, name,    NULL,    nparams,      NULL,
                      values,        lengths, formats, result_format };

    return query_one(c, out, &s);
}

int ferry_pq_query(ferry_pq *c, PGresult **out, const char *sql, int nparams,
                   const char *const *values)
{
    return ferry_pq_query_params(c, out, sql, nparams, NULL, values, NULL, NULL, 0);
}

/* Enter `c` and send `sql` as a simple query: -EBUSY when a call, a
 * pipeline or COPY is under way; on success the caller is inside and must
 * leave through ferry__pq_leave(). */
static int send_simple(ferry_pq *c, const char *sql)
{
    int rc = ferry__pq_enter(c);

    if (rc)
        return rc;
    if (c->mode != PQ_IDLE || c->inflight) {
        c->inside = false;
        return -EBUSY;
    }
    if (!PQsendQuery(c->conn, sql)) {
        c->inside = false;
        return ferry__pq_send_failed(c);
    }
    c->inflight = true;
    return 0;
}

int ferry_pq_exec(ferry_pq *c, const char *sql)
{
    int rc, err = 0;

    if (!sql)
        return -EINVAL;
    rc = send_simple(c, sql);
    if (rc)
        return rc;
    for (;;) {
        PGresult *r;
        ExecStatusType st;

        rc = ferry__pq_await(c);
        if (rc)
            return ferry__pq_leave(c, rc);
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
            return ferry__pq_leave(c, -EINVAL);
        }
    }
    c->inflight = false;
    if (PQstatus(c->conn) != CONNECTION_OK)
        return ferry__pq_leave(c, ferry__pq_lost(c));
    return ferry__pq_leave(c, err);
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
        return PQstatus(c->conn) == CONNECTION_BAD ? ferry__pq_lost(c) : -EBUSY;
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
    return ferry__pq_leave_pipeline(c) ? 0 : -EBUSY;
}

int ferry_pq_send(ferry_pq *c, const char *sql, int nparams, const Oid *types,
                  const char *const *values, const int *lengths, const int *formats,
                  int result_format)
{
    struct send s = { SEND_PARAMS, NULL,    sql,     nparams,      types,
                      values,      lengths, formats, result_format };

    return pipeline_one(c, &s);
}

int ferry_pq_send_prepare(ferry_pq *c, const char *name, const char *sql, int nparams,
                          const Oid *types)
{
    struct send s = { SEND_PREPARE, name, sql, nparams, types, NULL, NULL, NULL, 0 };

    return pipeline_one(c, &s);
}

int ferry_pq_send_prepared(ferry_pq *c, const char *name, int nparams, const char *const *values,
                           const int *lengths, const int *formats, int result_format)
{
    struct send s = { SEND_PREPARED, name,    NULL,    nparams,      NULL,
                      values,        lengths, formats, result_format };

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
        return ferry__pq_send_failed(c);
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
    rc = ferry__pq_enter(c);
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

        rc = ferry__pq_await(c);
        if (rc)
            return ferry__pq_leave(c, rc);
        r = PQgetResult(c->conn);
        if (!r) {
            /* The end of one query's results, before the next one's. */
            if (PQstatus(c->conn) == CONNECTION_BAD)
                return ferry__pq_leave(c, ferry__pq_lost(c));
            continue;
        }
        c->pending--;
        *out = r;
        return ferry__pq_leave(c, 0);
    }
}

/* ---- COPY ---------------------------------------------------------- */

int ferry_pq_copy_start(ferry_pq *c, PGresult **out, const char *sql)
{
    int rc;

    if (!out || !sql)
        return -EINVAL;
    *out = NULL;
    rc = send_simple(c, sql);
    if (rc)
        return rc;
    rc = ferry__pq_collect(c, out);
    return ferry__pq_leave(c, rc);
}

int ferry_pq_copy_put(ferry_pq *c, const void *buf, size_t len)
{
    int rc;

    if ((!buf && len) || len > INT32_MAX)
        return -EINVAL;
    rc = ferry__pq_enter(c);
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
            return ferry__pq_leave(c, ferry__pq_lost(c));
        rc = ferry__pq_flush(c);
        if (rc)
            return ferry__pq_leave(c, rc);
    }
    rc = PQflush(c->conn);
    if (rc < 0)
        return ferry__pq_leave(c, ferry__pq_lost(c));
    return ferry__pq_leave(c, rc ? ferry__pq_flush(c) : 0);
}

int ferry_pq_copy_get(ferry_pq *c, char **buf, size_t *len)
{
    int rc;

    if (!buf || !len)
        return -EINVAL;
    *buf = NULL;
    *len = 0;
    rc = ferry__pq_enter(c);
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
            return ferry__pq_leave(c, 0);
        }
        if (n == -1) {
            c->mode = PQ_COPY_DONE;
            c->inside = false;
            return -ENODATA;
        }
        if (n < -1)
            return ferry__pq_leave(c, ferry__pq_lost(c));
        rc = ferry__pq_wait(c, FERRY_READ);
        if (!rc && !PQconsumeInput(c->conn))
            rc = ferry__pq_lost(c);
        if (rc)
            return ferry__pq_leave(c, rc);
    }
}

int ferry_pq_copy_end(ferry_pq *c, const char *errmsg, PGresult **out)
{
    int rc;

    if (!out)
        return -EINVAL;
    *out = NULL;
    rc = ferry__pq_enter(c);
    if (rc)
        return rc;
    if (c->mode == PQ_COPY_IN) {
        for (;;) {
            int r = PQputCopyEnd(c->conn, errmsg);

            if (r > 0)
                break;
            if (r < 0)
                return ferry__pq_leave(c, ferry__pq_lost(c));
            rc = ferry__pq_flush(c);
            if (rc)
                return ferry__pq_leave(c, rc);
        }
    } else if (c->mode == PQ_COPY_OUT) {
        rc = ferry__pq_drain_copy_out(c);
        if (rc)
            return ferry__pq_leave(c, rc);
    } else if (c->mode != PQ_COPY_DONE) {
        c->inside = false;
        return -EBUSY;
    }
    c->mode = PQ_IDLE;
    rc = ferry__pq_collect(c, out);
    return ferry__pq_leave(c, rc);
}

/* ---- notifications --------------------------------------------------- */

int ferry_pq_notify_recv(ferry_pq *c, PGnotify **out)
{
    int rc;

    if (!out)
        return -EINVAL;
    *out = NULL;
    rc = ferry__pq_enter(c);
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
        rc = ferry__pq_wait(c, FERRY_READ);
        if (rc)
            break;
        if (!PQconsumeInput(c->conn)) {
            rc = ferry__pq_lost(c);
            break;
        }
    }
    /* An interrupted wait sent nothing: the connection is idle as it was. */
    c->inside = false;
    return rc;
}
