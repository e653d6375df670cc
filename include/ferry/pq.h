/* ferry/pq.h - PostgreSQL for tasks through libpq: connect, queries with
 * parameters, pipeline mode, COPY in and out, LISTEN/NOTIFY, and a small
 * pool of connections.
 *
 * Built as its own library (ferry_pq, pkg-config ferry-pq) when libpq's
 * development files were found: FERRY_HAVE_PQ in ferry/features.h says
 * so.  libpq is driven through its non-blocking API on the connection's
 * one socket (ferry_wait_fd()), so a task waiting for the server holds no
 * thread and the other tasks run meanwhile.
 *
 * A connection belongs to the loop of the task that made it and runs on
 * that loop's thread.  One task at a time uses it: a call made while
 * another task is inside a call on the same connection returns -EBUSY.
 *
 * Results.  A query's result is a libpq PGresult, the caller's to free with
 * PQclear().  An error of the server (a syntax error, a constraint
 * violated, a query cancelled) is a result like any other: the call returns
 * 0 and the caller looks at PQresultStatus().  A negative return means that
 * no result came.
 *
 * Cancellation and deadlines.  Every call that waits for the server is a
 * cancellation point and honours the deadlines of the caller's scopes.  A
 * query interrupted that way is cancelled on the server: the cancel
 * request goes out from the task with libpq 17's non-blocking cancel, or
 * before libpq 17 on a thread of the default pool (PQcancel() blocks), the
 * query's results are read and dropped, and the call returns
 * -ECANCELED or -ETIMEDOUT with the connection idle again.  That cleanup
 * runs shielded, bounded by ferry_pq_opts.cleanup_timeout: if the server
 * has not answered by then (or the query was only half sent), the
 * connection is closed instead (ferry_pq_ok() false), so that no
 * connection is ever handed back busy.  The interrupted query may or may
 * not have taken effect: inside a transaction, roll back.
 *
 * Connection loss.  A call on a connection whose server went away returns
 * -ECONNRESET (or a result with PGRES_FATAL_ERROR that says why, when the
 * server said it before closing); ferry_pq_ok() is false from then on and
 * the connection is only good for ferry_pq_free().  The pool below
 * replaces such connections.
 */
#ifndef FERRY_PQ_H
#define FERRY_PQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "ferry/queue.h"
#include "ferry/task.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Connection ------------------------------------------------------ */

typedef struct ferry_pq ferry_pq;

typedef struct ferry_pq_opts {
    /* How long the cleanup after an interrupted call may take (the cancel
     * request, reading the rest of the results) before the connection is
     * closed instead; 0: 2 s. */
    int64_t cleanup_timeout;
    /* Where a failed connect writes libpq's message (NUL-terminated,
     * truncated to errbuf_len); NULL: nowhere. */
    char   *errbuf;
    size_t  errbuf_len;
} ferry_pq_opts;

/*
 * Connect to the server that `conninfo` names (a libpq connection string
 * or URI, "" for the environment's defaults) and put the connection in
 * non-blocking mode.  The connect is bounded by the caller's deadlines
 * and cancellation (libpq's connect_timeout applies to its blocking
 * connect only).  libpq resolves a host name with the blocking
 * getaddrinfo() when the connect starts, holding the loop meanwhile: name
 * the server by address (hostaddr=, or host= an address or a unix
 * socket's directory) where that matters.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: 0 (*out is yours: ferry_pq_free()); -ECONNREFUSED (the server
 * refused or could not be reached, authentication failed, or `conninfo`
 * is not valid: the message is in opts->errbuf); -ECANCELED, -ETIMEDOUT;
 * -ENOMEM; -EPERM (not in a task); -EINVAL (NULL).  On an error *out is
 * NULL and nothing is left open.
 */
int ferry_pq_connect(ferry_pq **out /* OUT */, const char *conninfo,
                     const ferry_pq_opts *opts /* optional */);

/*
 * Close the connection and free it.  If the server still works for it (a
 * pipeline or a COPY TO STDOUT not read to its end), a cancel request is
 * sent from a thread of the default pool, not waited for: the server
 * would otherwise finish the work before it noticed the closed socket.  A
 * connection in a call of another task must not be freed.
 * Thread: loop.  Suspends: no.  NULL is ignored.
 */
void ferry_pq_free(ferry_pq *c);

/* Thread: loop.  Suspends: no.
 * Returns: true while the connection is open, idle and its server
 * reachable as far as libpq knows (CONNECTION_OK, no call in progress, no
 * results left unread). */
bool ferry_pq_ok(const ferry_pq *c);

/* Thread: loop.  Suspends: no.
 * Returns: the libpq connection, for calls that do not touch the socket
 * (PQescapeLiteral, PQparameterStatus, PQtransactionStatus, ...); NULL
 * once it was closed. */
PGconn *ferry_pq_conn(const ferry_pq *c);

/* Thread: loop.  Suspends: no.
 * Returns: libpq's last error message for the connection ("" if none);
 * valid until the next call on it. */
const char *ferry_pq_error(const ferry_pq *c);

/* ---- Queries --------------------------------------------------------- */

/*
 * Run `sql` with `nparams` parameters (PQsendQueryParams(): `types`,
 * `lengths`, `formats` may be NULL for text parameters whose types the
 * server infers; `values[i]` NULL is SQL NULL) and wait for its result,
 * in text (`result_format` 0) or binary (1).  `sql` holds one statement.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: 0 (*out is yours: PQclear()); -ECANCELED, -ETIMEDOUT (cancelled
 * on the server, see above; *out NULL); -ECONNRESET (the connection is
 * lost); -EBUSY (another task is in a call on `c`, or `c` is in pipeline
 * mode or COPY); -EIO (libpq refused to send it: ferry_pq_error() says
 * why); -ENOMEM; -EPERM (not in a task); -EINVAL.
 */
int ferry_pq_query_params(ferry_pq *c, PGresult **out /* OUT */, const char *sql,
                          int nparams, const Oid *types, const char *const *values,
                          const int *lengths, const int *formats, int result_format);

/* ferry_pq_query_params() with text parameters and text results.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: as ferry_pq_query_params(). */
int ferry_pq_query(ferry_pq *c, PGresult **out /* OUT */, const char *sql,
                   int nparams, const char *const *values);

/*
 * Prepare `sql` as the statement `name` ("" for the unnamed one) of the
 * connection (PQsendPrepare(); `types` may be NULL), for
 * ferry_pq_query_prepared() and ferry_pq_send_prepared(): the server
 * parses and plans it once.  *out is PGRES_COMMAND_OK or the server's
 * error.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: as ferry_pq_query_params().
 */
int ferry_pq_prepare(ferry_pq *c, PGresult **out /* OUT */, const char *name, const char *sql,
                     int nparams, const Oid *types);

/*
 * Run the prepared statement `name` with `nparams` parameters (as
 * ferry_pq_query_params(), without types) and wait for its result.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: as ferry_pq_query_params().
 */
int ferry_pq_query_prepared(ferry_pq *c, PGresult **out /* OUT */, const char *name,
                            int nparams, const char *const *values, const int *lengths,
                            const int *formats, int result_format);

/*
 * Run `sql` (any number of statements, no parameters) and drop its
 * results; the first error result is turned into -EIO.  For commands such
 * as BEGIN, LISTEN or SET.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: 0; -EIO (the server reported an error: ferry_pq_error() says
 * which); as ferry_pq_query_params().
 */
int ferry_pq_exec(ferry_pq *c, const char *sql);

/* ---- Pipeline mode ----------------------------------------------------- */

/*
 * Pipeline mode (libpq 14 and later; docs/pq.md): queries are sent
 * without waiting for the results of the ones before; ferry_pq_sync()
 * ends a batch (a transaction of its own unless BEGIN/COMMIT are sent in
 * it), and ferry_pq_recv() reads the results in order: one per query,
 * then one PGRES_PIPELINE_SYNC per sync.  After an error the server skips
 * the rest of the batch: those queries give PGRES_PIPELINE_ABORTED.
 *
 * ferry_pq_pipeline_enter(): Thread: loop.  Suspends: no.
 * Returns: 0; -EBUSY (a call or results in progress); -ECONNRESET;
 * -ENOTSUP (libpq without pipeline mode).
 * ferry_pq_pipeline_exit(): every result must have been read.
 * Thread: loop.  Suspends: no.
 * Returns: 0 (also when not in pipeline mode); -EBUSY (results or a batch
 * not synced remain).
 */
int ferry_pq_pipeline_enter(ferry_pq *c);
int ferry_pq_pipeline_exit(ferry_pq *c);

/*
 * Queue one query of the pipeline (parameters as ferry_pq_query_params()).
 * It is sent as the socket takes it: the call waits only while the socket
 * takes no more, and reads the server's results meanwhile, so a long
 * batch cannot dead-lock against a server that waits for its results to
 * be read.  The server sends its results when a sync (or its buffer)
 * tells it to: ferry_pq_recv() for a query of a batch not yet synced may
 * wait for the sync.
 * Thread: loop, in a task.  Suspends: when the socket is full.
 * Returns: 0; -EBUSY (not in pipeline mode, another task inside); -EIO
 * (libpq refused the query: ferry_pq_error()); as ferry_pq_query_params().
 */
int ferry_pq_send(ferry_pq *c, const char *sql, int nparams, const Oid *types,
                  const char *const *values, const int *lengths, const int *formats,
                  int result_format);

/*
 * Queue a preparation (ferry_pq_prepare()) or an execution of a prepared
 * statement (ferry_pq_query_prepared()) in the pipeline, as
 * ferry_pq_send(); each gives one result to ferry_pq_recv().  A batch of
 * the same statement sent as executions of one preparation spares the
 * server a parse and a plan per row.
 * Thread: loop, in a task.  Suspends: when the socket is full.
 * Returns: as ferry_pq_send().
 */
int ferry_pq_send_prepare(ferry_pq *c, const char *name, const char *sql, int nparams,
                          const Oid *types);
int ferry_pq_send_prepared(ferry_pq *c, const char *name, int nparams,
                           const char *const *values, const int *lengths, const int *formats,
                           int result_format);

/* End the batch (PQpipelineSync()).  Thread: loop.  Suspends: no.
 * Returns: 0; -EBUSY (not in pipeline mode); -ECONNRESET; -ENOMEM. */
int ferry_pq_sync(ferry_pq *c);

/*
 * Wait for the next result of the pipeline.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: 0 (*out is yours: PQclear()); -ENODATA (nothing is pending: no
 * query or sync awaits its result); -ECANCELED, -ETIMEDOUT (every batch
 * still pending was cancelled on the server and its results dropped; the
 * connection is out of pipeline mode, or closed); as ferry_pq_query_params().
 */
int ferry_pq_recv(ferry_pq *c, PGresult **out /* OUT */);

/* ---- COPY ------------------------------------------------------------ */

/*
 * Start `sql`, a COPY ... FROM STDIN or COPY ... TO STDOUT.  *out receives
 * the server's answer: PGRES_COPY_IN or PGRES_COPY_OUT when the copy
 * began, an error result otherwise (the connection is then idle).
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: as ferry_pq_query_params().
 */
int ferry_pq_copy_start(ferry_pq *c, PGresult **out /* OUT */, const char *sql);

/*
 * COPY FROM STDIN: send `len` bytes of data (any split of the rows).
 * Thread: loop, in a task.  Suspends: while the socket takes no more.
 * Returns: 0; -ECANCELED, -ETIMEDOUT (the copy was aborted on the server;
 * connection idle, or closed); -EBUSY (not in COPY IN); -ECONNRESET.
 */
int ferry_pq_copy_put(ferry_pq *c, const void *buf, size_t len);

/*
 * COPY TO STDOUT: receive the next row into *buf (the caller frees it with
 * PQfreemem()) and its length into *len.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: 0; -ENODATA (all rows received: call ferry_pq_copy_end());
 * -ECANCELED, -ETIMEDOUT (cancelled on the server, as a query);
 * -EBUSY (not in COPY OUT); -ECONNRESET.
 */
int ferry_pq_copy_get(ferry_pq *c, char **buf /* OUT */, size_t *len /* OUT */);

/*
 * End the copy and wait for its final result (PGRES_COMMAND_OK, or the
 * error that ended it).  COPY IN: with `errmsg` not NULL the copy is
 * aborted with that message instead.  COPY OUT: rows not received yet
 * are dropped.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: 0 (*out is yours); -EBUSY (no copy in progress); as
 * ferry_pq_query_params().
 */
int ferry_pq_copy_end(ferry_pq *c, const char *errmsg /* optional */,
                      PGresult **out /* OUT */);

/* ---- Notifications ----------------------------------------------------- */

/*
 * Wait for the next notification (NOTIFY) that reached the connection
 * after a LISTEN on it (ferry_pq_exec(c, "LISTEN name")).  Notifications
 * that came during earlier calls are kept by libpq and returned first.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: 0 (*out is yours: PQfreemem()); -ECANCELED, -ETIMEDOUT (the
 * connection stays idle); -ECONNRESET; -EBUSY; -EPERM.
 */
int ferry_pq_notify_recv(ferry_pq *c, PGnotify **out /* OUT */);

/*
 * A listener: a connection of its own that LISTENs on channels, and a task
 * of the loop that reads it and puts each notification (a PGnotify *) in a
 * queue.  Tasks receive from it with ferry_pq_listener_recv(), or select on
 * it with FERRY_CASE_GET_INIT(ferry_pq_listener_queue(l), &notify).  When
 * the connection is lost the queue is shut down: what it holds can still
 * be received, then receives return -ESHUTDOWN.
 */
typedef struct ferry_pq_listener ferry_pq_listener;

/*
 * Connect with `conninfo`, LISTEN on each of the `nchannels` channels
 * (names quoted as identifiers) and start the reader task.  The queue holds
 * at most `capacity` notifications (0: 1024); while it is full the reader
 * stops reading and the server keeps the rest.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: 0 (*out is yours: ferry_pq_listener_free()); as
 * ferry_pq_connect(); -EIO (a LISTEN failed).
 */
int ferry_pq_listener_new(ferry_pq_listener **out /* OUT */, const char *conninfo,
                          const char *const *channels, size_t nchannels, size_t capacity);

/*
 * Receive the next notification, waiting while there is none.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: 0 (*out is yours: PQfreemem()); -ESHUTDOWN (the connection was
 * lost and everything received before was taken: see
 * ferry_pq_listener_status()); -ECANCELED; -ETIMEDOUT; -EPERM.
 */
int ferry_pq_listener_recv(ferry_pq_listener *l, PGnotify **out /* OUT */);

/* The queue of PGnotify pointers, for ferry_select(); each element taken is
 * the taker's to PQfreemem().  Thread: loop.  Suspends: no.
 * Returns: the queue, owned by the listener; NULL for NULL. */
ferry_queue *ferry_pq_listener_queue(ferry_pq_listener *l);

/* Thread: loop.  Suspends: no.
 * Returns: 0 while the reader runs; the error that ended it
 * (-ECONNRESET) otherwise. */
int ferry_pq_listener_status(const ferry_pq_listener *l);

/*
 * Stop the reader, close the connection, free the notifications not
 * received and the listener.  No task may be receiving from it.
 * Thread: loop, in a task.  Suspends: yes (until the reader has ended; not
 * a cancellation point).  NULL is ignored.
 */
void ferry_pq_listener_free(ferry_pq_listener *l);

/* ---- Pool ------------------------------------------------------------ */

/*
 * At most `size` connections to one server, made when needed, kept open
 * while idle, and lent to one task at a time.  A connection lent back
 * broken (ferry_pq_ok() false), or inside a transaction, is closed and a
 * later acquire makes a new one; an idle connection whose server closed it
 * meanwhile is noticed at acquire and replaced.
 */
typedef struct ferry_pq_pool ferry_pq_pool;

/*
 * Make a pool for `conninfo` (copied) of at most `size` connections; no
 * connection is made yet.  `opts` (copied, errbuf ignored) applies to each
 * connection.
 * Thread: loop.  Suspends: no.
 * Returns: 0 (*out is yours: ferry_pq_pool_free()); -ENOMEM; -EINVAL (size 0).
 */
int ferry_pq_pool_new(ferry_pq_pool **out /* OUT */, const char *conninfo, size_t size,
                      const ferry_pq_opts *opts /* optional */);

/*
 * Borrow a connection: an idle one, or a new one while fewer than `size`
 * are open, or wait (FIFO) for one to be given back.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: 0 (*out is lent to you until ferry_pq_pool_release());
 * -ECANCELED, -ETIMEDOUT (nothing borrowed); as ferry_pq_connect().
 */
int ferry_pq_pool_acquire(ferry_pq_pool *p, ferry_pq **out /* OUT */);

/*
 * Give a borrowed connection back.  One that is not ferry_pq_ok() or not
 * idle in its transaction (PQTRANS_IDLE) is closed.
 * Thread: loop.  Suspends: no.
 */
void ferry_pq_pool_release(ferry_pq_pool *p, ferry_pq *c);

/* Counters of a pool. */
typedef struct ferry_pq_pool_stats {
    size_t   open;      /* connections open now, lent or idle */
    size_t   idle;      /* of `open`: idle in the pool */
    uint64_t made;      /* connections made since the pool was */
    uint64_t closed;    /* connections closed as broken or busy */
} ferry_pq_pool_stats;

/* Thread: loop.  Suspends: no.  Returns: 0; -EINVAL. */
int ferry_pq_pool_stats_get(const ferry_pq_pool *p, ferry_pq_pool_stats *out /* OUT */);

/*
 * Close every idle connection and free the pool.  Every connection must
 * have been given back and no task may wait in ferry_pq_pool_acquire().
 * Thread: loop.  Suspends: no.
 * Returns: 0; -EBUSY (connections still lent or waiters: nothing done).
 */
int ferry_pq_pool_free(ferry_pq_pool *p);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_PQ_H */
