/* pq_int.h - what the files of the PostgreSQL part share.
 * Loop thread only, like the connections themselves.
 */
#ifndef FERRY_PQ_INT_H
#define FERRY_PQ_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/pq.h"

/* What the connection is doing between calls. */
enum pq_mode {
    PQ_IDLE,      /* nothing, or one query whose results are being read */
    PQ_PIPELINE,  /* in pipeline mode */
    PQ_COPY_IN,   /* a COPY FROM STDIN takes data */
    PQ_COPY_OUT,  /* a COPY TO STDOUT gives rows */
    PQ_COPY_DONE, /* a COPY TO STDOUT gave its last row; its result is next */
};

struct ferry_pq {
    PGconn *conn;            /* NULL once closed */
    int64_t cleanup_timeout; /* bound of the cleanup after an interruption */
    enum pq_mode mode;       /* see above */
    bool inside;             /* a task is inside a call on it */
    bool inflight;           /* a query was sent and its last result not read */
    size_t pending;          /* pipeline: results still to come (queries and syncs) */
    size_t unsynced;         /* pipeline: queries sent since the last sync */
};

/* Close the connection (the socket with it); the struct stays. */
void ferry__pq_close(ferry_pq *c);

/* The connection is gone: close what is left.  Returns -ECONNRESET. */
int ferry__pq_lost(ferry_pq *c);

/* Wait for the socket (FERRY_READ, FERRY_WRITE); -ECONNRESET once closed. */
int ferry__pq_wait(ferry_pq *c, int events);

/* Send everything libpq has buffered, reading meanwhile. */
int ferry__pq_flush(ferry_pq *c);

/* Wait until PQgetResult() will not block. */
int ferry__pq_await(ferry_pq *c);

/* Read and drop the rows of a COPY TO STDOUT up to its end. */
int ferry__pq_drain_copy_out(ferry_pq *c);

/* Leave pipeline mode once every result was read; false if libpq refuses. */
bool ferry__pq_leave_pipeline(ferry_pq *c);

/* Start a call: -EINVAL, -EPERM (not in a task), -EBUSY (another task
 * inside), -ECONNRESET (closed); 0 and the connection is the caller's. */
int ferry__pq_enter(ferry_pq *c);

/* End a call with `rc`; an interruption or failure past the point where
 * the server was involved leaves the connection settled or closed.
 * Returns rc. */
int ferry__pq_leave(ferry_pq *c, int rc);

/* libpq refused a send: -ECONNRESET (and closed) or -EIO. */
int ferry__pq_send_failed(ferry_pq *c);

/* Collect the results of the query in flight into *out (the first error,
 * or else the last result; a COPY that began returns at once). */
int ferry__pq_collect(ferry_pq *c, PGresult **out);

#endif /* FERRY_PQ_INT_H */
