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
    PQ_IDLE,       /* nothing, or one query whose results are being read */
    PQ_PIPELINE,   /* in pipeline mode */
    PQ_COPY_IN,    /* a COPY FROM STDIN takes data */
    PQ_COPY_OUT,   /* a COPY TO STDOUT gives rows */
    PQ_COPY_DONE,  /* a COPY TO STDOUT gave its last row; its result is next */
};

struct ferry_pq {
    PGconn       *conn;            /* NULL once closed */
    int64_t       cleanup_timeout; /* bound of the cleanup after an interruption */
    enum pq_mode  mode;            /* see above */
    bool          inside;          /* a task is inside a call on it */
    bool          inflight;        /* a query was sent and its last result not read */
    size_t        pending;         /* pipeline: results still to come (queries and syncs) */
    size_t        unsynced;        /* pipeline: queries sent since the last sync */
};

/* Close the connection (the socket with it); the struct stays. */
void ferry__pq_close(ferry_pq *c);

#endif /* FERRY_PQ_INT_H */
