/* pq_pool.c - a bounded pool of connections lent to tasks, and the
 * listener that turns LISTEN/NOTIFY into a queue.
 * Loop thread only.
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/sync.h"
#include "pq_int.h"

/* ---- pool ------------------------------------------------------------ */

struct ferry_pq_pool {
    char *conninfo;     /* copied at creation */
    ferry_pq_opts opts; /* for each connection; errbuf cleared */
    size_t size;        /* most connections open at once */
    ferry_sem slots;    /* one permit per connection not lent */
    ferry_pq **idle;    /* `size` places; the first `nidle` hold idle ones */
    size_t nidle;       /* idle connections */
    size_t open;        /* connections open, idle or lent */
    size_t lent;        /* connections lent now */
    uint64_t made;      /* connections made since creation */
    uint64_t closed;    /* connections closed as broken or busy */
};

int ferry_pq_pool_new(ferry_pq_pool **out, const char *conninfo, size_t size,
                      const ferry_pq_opts *opts)
{
    ferry_pq_pool *p;

    if (!out || !conninfo || !size)
        return -EINVAL;
    *out = NULL;
    p = calloc(1, sizeof(*p));
    if (!p)
        return -ENOMEM;
    p->conninfo = strdup(conninfo);
    p->idle = calloc(size, sizeof(*p->idle));
    if (!p->conninfo || !p->idle) {
        free(p->conninfo);
        free(p->idle);
        free(p);
        return -ENOMEM;
    }
    if (opts)
        p->opts = *opts;
    p->opts.errbuf = NULL;
    p->opts.errbuf_len = 0;
    p->size = size;
    ferry_sem_init(&p->slots, size, 0);
    *out = p;
    return 0;
}

/* Whether an idle connection still has its server: what arrived while it
 * was idle is read, and a close or a fatal error there shows. */
static bool still_good(ferry_pq *c)
{
    for (int i = 0; i < 4; i++) {
        struct pollfd pfd = { .fd = PQsocket(c->conn), .events = POLLIN };

        if (PQstatus(c->conn) != CONNECTION_OK || pfd.fd < 0)
            return false;
        if (poll(&pfd, 1, 0) <= 0)
            return true;
        if (!PQconsumeInput(c->conn))
            return false;
    }
    return PQstatus(c->conn) == CONNECTION_OK;
}

int ferry_pq_pool_acquire(ferry_pq_pool *p, ferry_pq **out)
{
    ferry_pq *c;
    int rc;

    if (!p || !out)
        return -EINVAL;
    *out = NULL;
    rc = ferry_sem_acquire(&p->slots);
    if (rc)
        return rc;
    while (p->nidle) {
        c = p->idle[--p->nidle];
        if (still_good(c)) {
            p->lent++;
            *out = c;
            return 0;
        }
        ferry_pq_free(c);
        p->open--;
        p->closed++;
    }
    rc = ferry_pq_connect(&c, p->conninfo, &p->opts);
    if (rc) {
        ferry_sem_release(&p->slots);
        return rc;
    }
    p->open++;
    p->made++;
    p->lent++;
    *out = c;
    return 0;
}

void ferry_pq_pool_release(ferry_pq_pool *p, ferry_pq *c)
{
    if (!p || !c)
        return;
    p->lent--;
    if (ferry_pq_ok(c) && PQtransactionStatus(c->conn) == PQTRANS_IDLE) {
        p->idle[p->nidle++] = c;
    } else {
        ferry_pq_free(c);
        p->open--;
        p->closed++;
    }
    ferry_sem_release(&p->slots);
}

int ferry_pq_pool_stats_get(const ferry_pq_pool *p, ferry_pq_pool_stats *out)
{
    if (!p || !out)
        return -EINVAL;
    out->open = p->open;
    out->idle = p->nidle;
    out->made = p->made;
    out->closed = p->closed;
    return 0;
}

int ferry_pq_pool_free(ferry_pq_pool *p)
{
    if (!p)
        return 0;
    if (p->lent || ferry_sem_destroy(&p->slots))
        return -EBUSY;
    while (p->nidle)
        ferry_pq_free(p->idle[--p->nidle]);
    free(p->idle);
    free(p->conninfo);
    free(p);
    return 0;
}

/* ---- listener -------------------------------------------------------- */

struct ferry_pq_listener {
    ferry_pq *c;        /* the connection, read by `reader` only */
    ferry_queue q;      /* PGnotify pointers */
    ferry_task *reader; /* the task that reads `c` into `q` */
    int status;         /* 0, or the error that ended the reader */
};

/* Read notifications into the queue until the connection fails or the
 * listener is freed (which cancels this task). */
static int reader_main(void *arg)
{
    ferry_pq_listener *l = arg;

    for (;;) {
        PGnotify *n;
        int rc = ferry_pq_notify_recv(l->c, &n);

        if (!rc) {
            rc = ferry_queue_put(&l->q, &n);
            if (rc)
                PQfreemem(n);
        }
        if (rc) {
            if (rc != -ECANCELED)
                l->status = rc;
            break;
        }
    }
    ferry_queue_shutdown(&l->q, false);
    return 0;
}

int ferry_pq_listener_new(ferry_pq_listener **out, const char *conninfo,
                          const char *const *channels, size_t nchannels, size_t capacity)
{
    static const ferry_task_opts topts = { .name = "pq listener" };
    ferry_pq_listener *l;
    int rc;

    if (!out || !conninfo || (nchannels && !channels))
        return -EINVAL;
    *out = NULL;
    l = calloc(1, sizeof(*l));
    if (!l)
        return -ENOMEM;
    ferry_queue_init(&l->q, sizeof(PGnotify *), capacity ? capacity : 1024, FERRY_QUEUE_FIFO, NULL,
                     NULL);
    rc = ferry_pq_connect(&l->c, conninfo, NULL);
    if (rc)
        goto err_free;
    for (size_t i = 0; i < nchannels; i++) {
        char *id = PQescapeIdentifier(l->c->conn, channels[i], strlen(channels[i]));
        char *sql;

        if (!id) {
            rc = -ENOMEM;
            goto err_close;
        }
        sql = malloc(strlen(id) + sizeof("LISTEN "));
        if (!sql) {
            PQfreemem(id);
            rc = -ENOMEM;
            goto err_close;
        }
        strcpy(sql, "LISTEN ");
        strcat(sql, id);
        PQfreemem(id);
        rc = ferry_pq_exec(l->c, sql);
        free(sql);
        if (rc)
            goto err_close;
    }
    rc = ferry_task_spawn(&l->reader, NULL, reader_main, l, &topts);
    if (rc)
        goto err_close;
    *out = l;
    return 0;

err_close:
    ferry_pq_free(l->c);
err_free:
    ferry_queue_destroy(&l->q);
    free(l);
    return rc;
}

int ferry_pq_listener_recv(ferry_pq_listener *l, PGnotify **out)
{
    if (!l || !out)
        return -EINVAL;
    return ferry_queue_get(&l->q, out);
}

ferry_queue *ferry_pq_listener_queue(ferry_pq_listener *l)
{
    return l ? &l->q : NULL;
}

int ferry_pq_listener_status(const ferry_pq_listener *l)
{
    return l ? l->status : -EINVAL;
}

void ferry_pq_listener_free(ferry_pq_listener *l)
{
    ferry_scope shield;
    PGnotify *n;

    if (!l)
        return;
    ferry_task_cancel(l->reader);
    /* The reader waits on the connection's socket: it must be gone before
     * the socket closes (ferry_wait_fd()), whatever happens to the caller. */
    ferry_scope_enter(&shield, FERRY_NEVER, FERRY_SCOPE_SHIELD);
    ferry_task_join(l->reader, NULL);
    ferry_scope_exit(&shield);
    while (ferry_queue_try_get(&l->q, &n) == 0)
        PQfreemem(n);
    ferry_queue_destroy(&l->q);
    ferry_pq_free(l->c);
    free(l);
}
