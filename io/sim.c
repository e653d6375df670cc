/* sim.c - a simulated network inside one loop (ferry/sim.h): hosts,
 * listeners, connections whose ends are ordinary streams on a transport of
 * their own, and segments that travel as timers of the loop.
 * Loop thread only.
 *
 * Segments.  Everything that crosses a link is a segment: the set-up of a
 * connection (SYN, then SYNACK or REFUSED on the way back), bytes (DATA)
 * and the end of a direction (FIN).  A segment's timer node is part of the
 * segment, so a delivery, and the re-sending of held segments when a
 * partition heals, allocate nothing: only a write (the DATA segment) and a
 * connect (the two ends and their segments) allocate, and they report
 * -ENOMEM to their caller.  A delivered DATA segment is queued at the
 * receiving end as it is and read from there.  Within one direction of a
 * connection, segments arrive in the order they were sent (an arrival is
 * never earlier than the last one scheduled from that end, and the heap
 * fires ties in the order they were armed), as TCP delivers them.
 *
 * Determinism.  The only random choice, the jitter, is drawn from the
 * simulation's own generator at the moment a segment is sent, so the
 * draws follow the program's order of sends: with the same seed, the same
 * program and a virtual clock, every delivery comes at the same time and
 * in the same order.  The trace records them.
 *
 * Ends and their lifetime.  An end is the transport state of one stream
 * (`io_ctx`).  It is freed with its stream; segments that point at it are
 * found on the simulation's lists and forget it, so a late segment is
 * dropped.  The server's stream of a connection is made by the connect
 * (so that the arrival of a SYN allocates nothing) and belongs to the
 * connecting task until the SYN arrives, then to the listener until it is
 * accepted.
 */
#include "loop_only.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "loop_int.h"
#include "rand.h"
#include "stream_int.h"
#include "sync_int.h"
#include "ferry/sim.h"

enum seg_kind { SEG_SYN, SEG_SYNACK, SEG_REFUSED, SEG_DATA, SEG_FIN };

static const char *const kind_names[] = { "syn", "synack", "refused", "data", "fin" };

struct sim_end;

/* One segment on its way, held by a partition, or queued at its end. */
struct sim_seg {
    struct ferry__hnode node;     /* in the loop's timers while on its way */
    struct ferry__link link;      /* in sim->segs, sim->held or to->inq */
    struct ferry_sim *sim;        /* the simulation */
    struct sim_end *to;           /* receiving end, NULL once it is gone */
    struct sim_end *back;         /* SYN: the connecting end, or NULL */
    ferry_sim_host *src, *dst;    /* hosts it goes from and to */
    uint64_t conn;                /* connection number, for the trace */
    enum seg_kind kind;           /* what it carries */
    size_t len;                   /* DATA: bytes in data[] */
    size_t off;                   /* DATA at an end: bytes already read */
    char data[];                  /* DATA: the bytes */
};

/* One end of a connection: the transport state of its stream. */
struct sim_end {
    struct ferry_sim *sim;        /* NULL once the simulation is freed */
    ferry_stream *s;              /* the stream it belongs to */
    struct sim_end *peer;         /* the other end, NULL once it is gone */
    ferry_sim_host *host;         /* where this end is */
    struct ferry__link link;      /* in sim->ends */
    struct ferry__link plink;     /* in a listener's pending list */
    struct ferry__link inq;       /* delivered DATA segments not yet read */
    struct sim_seg *fin;          /* the FIN, kept ready until it is sent */
    struct ferry__waiter *connw;  /* the task connecting, or NULL */
    int64_t tx_last;              /* latest arrival scheduled from here */
    uint64_t conn;                /* connection number */
    int err;                      /* -ECONNRESET, -ETIMEDOUT once reset */
    bool fin_in;                  /* the peer's FIN arrived */
    bool fin_out;                 /* this end shut its direction down */
};

struct ferry_sim_host {
    struct ferry__link link; /* in sim->hosts */
    int side;                /* 1 or 2: its set in the partition, 0 none */
    bool crashed;            /* connections to it are refused */
    char name[];             /* its name */
};

/* A link with settings of its own. */
struct sim_link {
    struct ferry__link link;     /* in sim->links */
    ferry_sim_host *a, *b;       /* its two hosts */
    int64_t latency, jitter;     /* its settings */
};

struct ferry_sim_listener {
    struct ferry__link link;     /* in sim->listeners while open */
    struct ferry_sim *sim;       /* the simulation */
    ferry_sim_host *host;        /* where it listens */
    int port;                    /* on which port */
    bool closed;                 /* closed: freed when nobody is inside */
    unsigned inside;             /* tasks inside ferry_sim_accept() */
    struct ferry__link pending;  /* server ends not yet accepted */
    struct ferry__waitq q;       /* tasks accepting */
};

struct ferry_sim {
    ferry_loop *loop;            /* the loop it runs on */
    uint64_t rng;                /* the generator's state, from the seed */
    int64_t start;               /* the loop's time when made */
    int64_t latency, jitter;     /* the links' default settings */
    int64_t stall;               /* how long a partition holds bytes */
    uint64_t conns;              /* connections made so far */
    bool parted;                 /* a partition is in place */
    bool stalled;                /* it has lasted the stall time */
    struct ferry__hnode stall_node; /* fires when the partition stalls */
    struct ferry__link hosts;    /* ferry_sim_host */
    struct ferry__link links;    /* struct sim_link */
    struct ferry__link listeners; /* open listeners */
    struct ferry__link ends;     /* every end */
    struct ferry__link segs;     /* segments on their way */
    struct ferry__link held;     /* segments held by the partition */
    char *trace;                 /* the trace, NUL-terminated */
    size_t tlen, tcap;           /* its length and room */
    bool trace_lost;             /* an append ran out of memory */
};

static const struct ferry__stream_io sim_io;

/* ---- the trace ------------------------------------------------------------ */

/* Append one line to the trace; running out of memory marks it lost. */
static void trace(struct ferry_sim *sim, const char *fmt, ...)
{
    char line[192];
    va_list ap;
    int n;

    if (sim->trace_lost)
        return;
    va_start(ap, fmt);
    n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof line)
        n = sizeof line - 1;
    if (sim->tlen + (size_t)n + 1 > sim->tcap) {
        size_t cap = sim->tcap ? sim->tcap * 2 : 4096;
        char *p;

        while (cap < sim->tlen + (size_t)n + 1)
            cap *= 2;
        p = ferry__realloc(sim->trace, cap);
        if (!p) {
            sim->trace_lost = true;
            return;
        }
        sim->trace = p;
        sim->tcap = cap;
    }
    memcpy(sim->trace + sim->tlen, line, (size_t)n + 1);
    sim->tlen += (size_t)n;
}

static void trace_seg(struct ferry_sim *sim, const struct sim_seg *g, const char *what)
{
    trace(sim, "%lld c%llu %s>%s %s %s %zu\n",
          (long long)(ferry__loop_now(sim->loop) - sim->start), (unsigned long long)g->conn,
          g->src->name, g->dst->name, what, kind_names[g->kind], g->len);
}

/* ---- links and segments ---------------------------------------------------- */

/* The link between a and b is cut by the partition. */
static bool cut(const ferry_sim_host *a, const ferry_sim_host *b)
{
    return a->side && b->side && a->side != b->side;
}

/* The one-way delay of the next segment from a to b. */
static int64_t delay(struct ferry_sim *sim, const ferry_sim_host *a, const ferry_sim_host *b)
{
    int64_t lat = sim->latency, jit = sim->jitter;
    struct ferry__link *l;

    ferry__list_foreach(l, &sim->links) {
        struct sim_link *k = ferry__container_of(l, struct sim_link, link);
        if ((k->a == a && k->b == b) || (k->a == b && k->b == a)) {
            lat = k->latency;
            jit = k->jitter;
            break;
        }
    }
    if (jit > 0)
        lat += (int64_t)(ferry__rand_next(&sim->rng) % ((uint64_t)jit + 1));
    return lat;
}

static void seg_fire(struct ferry__hnode *n);

static struct sim_seg *seg_new(struct ferry_sim *sim, size_t len)
{
    struct sim_seg *g = ferry__calloc(1, sizeof *g + len);

    if (g) {
        g->sim = sim;
        g->node.fire = seg_fire;
    }
    return g;
}

/* Put segment `g`, sent by end `from`, on its way. */
static void seg_send(struct sim_seg *g, struct sim_end *from)
{
    struct ferry_sim *sim = g->sim;
    int64_t at = ferry__loop_now(sim->loop) + delay(sim, g->src, g->dst);

    if (from) {
        if (at < from->tx_last)
            at = from->tx_last;
        from->tx_last = at;
    }
    ferry__list_push_back(&sim->segs, &g->link);
    ferry__heap_insert(&sim->loop->timers, &g->node, at);
    ferry__loop_timers_changed(sim->loop);
}

/* ---- ends ------------------------------------------------------------------ */

static void free_inq(struct sim_end *e)
{
    struct ferry__link *l;

    while ((l = ferry__list_pop_front(&e->inq)) != NULL)
        ferry__free(ferry__container_of(l, struct sim_seg, link));
}

/* Reset end `e` with `err`: drop what it has not read, wake its tasks. */
static void end_reset(struct sim_end *e, int err)
{
    if (e->err)
        return;
    e->err = err;
    free_inq(e);
    if (e->connw) {
        ferry__grant(e->connw, err == -ECONNRESET ? -ECONNREFUSED : err);
        e->connw = NULL;
    }
    if (!e->s->reg.closed)
        ferry__ioreg_ready(&e->s->reg, FERRY_READ | FERRY_WRITE);
}

/* Reset both ends of e's connection. */
static void conn_reset(struct sim_end *e, int err, const char *why)
{
    if (e->sim && !e->err)
        trace(e->sim, "%lld c%llu %s reset %s\n",
              (long long)(ferry__loop_now(e->sim->loop) - e->sim->start),
              (unsigned long long)e->conn, e->host->name, why);
    if (e->peer)
        end_reset(e->peer, err == -ETIMEDOUT && !e->peer->connw ? -ECONNRESET : err);
    end_reset(e, err == -ETIMEDOUT && !e->connw ? -ECONNRESET : err);
}

/* Forget `e` in every segment that points at it. */
static void forget(struct ferry__link *list, const struct sim_end *e)
{
    struct ferry__link *l;

    ferry__list_foreach(l, list) {
        struct sim_seg *g = ferry__container_of(l, struct sim_seg, link);
        if (g->to == e)
            g->to = NULL;
        if (g->back == e)
            g->back = NULL;
    }
}

static int end_new(struct ferry_sim *sim, ferry_sim_host *host, uint64_t conn,
                   struct sim_end **out)
{
    struct sim_end *e = ferry__calloc(1, sizeof *e);
    int rc;

    if (!e)
        return -ENOMEM;
    e->fin = seg_new(sim, 0);
    if (!e->fin) {
        ferry__free(e);
        return -ENOMEM;
    }
    rc = ferry__stream_make(&e->s, sim->loop, -1, &sim_io, FERRY_WRITE, NULL);
    if (rc) {
        ferry__free(e->fin);
        ferry__free(e);
        return rc;
    }
    e->s->io_ctx = e;
    e->sim = sim;
    e->host = host;
    e->conn = conn;
    e->fin->kind = SEG_FIN;
    e->fin->conn = conn;
    e->fin->src = host;
    ferry__list_push_back(&sim->ends, &e->link);
    *out = e;
    return 0;
}

/* ---- the transport --------------------------------------------------------- */

static ssize_t sim_recv(ferry_stream *s, void *buf, size_t len, int *want)
{
    struct sim_end *e = s->io_ctx;
    size_t got = 0;

    if (e->err)
        return e->err;
    while (got < len && !ferry__list_empty(&e->inq)) {
        struct sim_seg *g = ferry__container_of(e->inq.next, struct sim_seg, link);
        size_t k = g->len - g->off;

        if (k > len - got)
            k = len - got;
        memcpy((char *)buf + got, g->data + g->off, k);
        got += k;
        g->off += k;
        if (g->off == g->len) {
            ferry__list_remove(&g->link);
            ferry__free(g);
        }
    }
    if (got)
        return (ssize_t)got;
    if (e->fin_in)
        return 0;
    *want = FERRY_READ;
    return -EAGAIN;
}

static ssize_t sim_send(ferry_stream *s, const struct iovec *iov, int n, int *want)
{
    struct sim_end *e = s->io_ctx;
    struct sim_seg *g;
    size_t len = 0, off = 0;

    (void)want;
    if (e->err)
        return e->err;
    if (!e->sim)
        return -ECONNRESET;
    if (e->fin_out)
        return -EPIPE;
    for (int i = 0; i < n; i++)
        len += iov[i].iov_len;
    if (len > SSIZE_MAX)
        return -EINVAL;
    g = seg_new(e->sim, len);
    if (!g)
        return -ENOMEM;
    for (int i = 0; i < n; i++) {
        memcpy(g->data + off, iov[i].iov_base, iov[i].iov_len);
        off += iov[i].iov_len;
    }
    g->kind = SEG_DATA;
    g->len = len;
    g->conn = e->conn;
    g->src = e->host;
    g->to = e->peer;
    g->dst = e->peer ? e->peer->host : e->host;
    seg_send(g, e);
    return (ssize_t)len;
}

/* Send the FIN kept ready for `e`. */
static void send_fin(struct sim_end *e)
{
    struct sim_seg *g = e->fin;

    e->fin = NULL;
    e->fin_out = true;
    if (!e->peer || !e->sim) {
        ferry__free(g);
        return;
    }
    g->to = e->peer;
    g->dst = e->peer->host;
    seg_send(g, e);
}

static int sim_shutdown(ferry_stream *s)
{
    struct sim_end *e = s->io_ctx;

    if (e->err)
        return e->err;
    if (!e->fin_out)
        send_fin(e);
    return 0;
}

static void sim_close(ferry_stream *s)
{
    struct sim_end *e = s->io_ctx;

    if (e->sim) {
        if (!e->err && !e->fin_out)
            send_fin(e);
        ferry__list_remove(&e->link);
        if (ferry__link_linked(&e->plink))
            ferry__list_remove(&e->plink);
        forget(&e->sim->segs, e);
        forget(&e->sim->held, e);
    }
    if (e->peer)
        e->peer->peer = NULL;
    free_inq(e);
    ferry__free(e->fin);
    ferry__free(e);
}

static const struct ferry__stream_io sim_io = {
    .recv = sim_recv,
    .send = sim_send,
    .shutdown = sim_shutdown,
    .close = sim_close,
    .drains = false,
};

/* ---- deliveries ------------------------------------------------------------ */

static struct ferry_sim_listener *find_listener(struct ferry_sim *sim, const ferry_sim_host *h,
                                                int port)
{
    struct ferry__link *l;

    ferry__list_foreach(l, &sim->listeners) {
        struct ferry_sim_listener *li = ferry__container_of(l, struct ferry_sim_listener, link);
        if (li->host == h && li->port == port)
            return li;
    }
    return NULL;
}

/* A SYN reached the server's end: hand it to the listener and answer
 * SYNACK, or answer REFUSED and free the server's stream. */
static void deliver_syn(struct sim_seg *g)
{
    struct sim_end *srv = g->to, *cli = g->back;
    struct ferry_sim_listener *li = find_listener(g->sim, g->dst, (int)g->len);
    struct ferry_sim_host *h = g->src;
    struct ferry__waiter *w;

    g->len = 0;
    g->src = g->dst;
    g->dst = h;
    g->to = cli;
    g->back = NULL;
    if (!li || g->src->crashed) {
        g->kind = SEG_REFUSED;
        srv->err = -ECONNREFUSED;
        ferry__stream_destroy(srv->s);
        seg_send(g, NULL);
        return;
    }
    g->kind = SEG_SYNACK;
    ferry__list_push_back(&li->pending, &srv->plink);
    w = ferry__first_waiting(&li->q);
    if (w)
        ferry__grant(w, 0);
    seg_send(g, srv);
}

/* The timer of segment `g` fired: it reaches its end, or is held by the
 * partition, or is dropped (its end is gone or was reset). */
static void seg_fire(struct ferry__hnode *n)
{
    struct sim_seg *g = ferry__container_of(n, struct sim_seg, node);
    struct ferry_sim *sim = g->sim;
    struct sim_end *to = g->to;

    ferry__list_remove(&g->link);
    if (to && cut(g->src, g->dst)) {
        trace_seg(sim, g, "held");
        ferry__list_push_back(&sim->held, &g->link);
        if (sim->stalled)
            conn_reset(to, -ETIMEDOUT, "stall");
        return;
    }
    if (!to || (to->err && g->kind != SEG_SYN)) {
        trace_seg(sim, g, "drop");
        ferry__free(g);
        return;
    }
    trace_seg(sim, g, "deliver");
    switch (g->kind) {
    case SEG_SYN:
        deliver_syn(g);
        return;
    case SEG_SYNACK:
    case SEG_REFUSED:
        if (to->connw)
            ferry__grant(to->connw, g->kind == SEG_SYNACK ? 0 : -ECONNREFUSED);
        to->connw = NULL;
        break;
    case SEG_DATA:
        ferry__list_push_back(&to->inq, &g->link);
        ferry__ioreg_ready(&to->s->reg, FERRY_READ);
        return;
    case SEG_FIN:
        to->fin_in = true;
        ferry__ioreg_ready(&to->s->reg, FERRY_READ);
        break;
    }
    ferry__free(g);
}

/* The partition has lasted the stall time: reset the connections that
 * have bytes held across it, and those that get some from now on. */
static void stall_fire(struct ferry__hnode *n)
{
    struct ferry_sim *sim = ferry__container_of(n, struct ferry_sim, stall_node);
    struct ferry__link *l;

    sim->stalled = true;
    ferry__list_foreach(l, &sim->held) {
        struct sim_seg *g = ferry__container_of(l, struct sim_seg, link);
        if (g->to)
            conn_reset(g->to, -ETIMEDOUT, "stall");
    }
}

/* ---- the simulation --------------------------------------------------------- */

int ferry_sim_new(ferry_sim **out, ferry_loop *loop, uint64_t seed, const ferry_sim_opts *opts)
{
    struct ferry_sim *sim;
    int rc;

    if (!out)
        return -EINVAL;
    *out = NULL;
    rc = ferry__loop_arg(&loop);
    if (rc)
        return rc;
    if (opts && (opts->latency < 0 || opts->jitter < 0 || opts->stall < 0))
        return -EINVAL;
    sim = ferry__calloc(1, sizeof *sim);
    if (!sim)
        return -ENOMEM;
    sim->loop = loop;
    sim->rng = seed;
    sim->start = ferry__loop_now(loop);
    sim->latency = opts && opts->latency ? opts->latency : 1000000;
    sim->jitter = opts ? opts->jitter : 0;
    sim->stall = opts && opts->stall ? opts->stall : 10 * (int64_t)1000000000;
    sim->stall_node.fire = stall_fire;
    *out = sim;
    return 0;
}

static void free_list(struct ferry__link *list, size_t off)
{
    struct ferry__link *l;

    while ((l = ferry__list_pop_front(list)) != NULL)
        ferry__free((char *)l - off);
}

static void listener_free(struct ferry_sim_listener *li)
{
    struct ferry__link *l;

    if (ferry__link_linked(&li->link))
        ferry__list_remove(&li->link);
    while ((l = ferry__list_pop_front(&li->pending)) != NULL) {
        struct sim_end *e = ferry__container_of(l, struct sim_end, plink);
        end_reset(e, -ECONNRESET);
        ferry__stream_destroy(e->s);
    }
    li->closed = true;
    ferry__waitq_grant_all(&li->q, -EBADF);
    if (!li->inside)
        ferry__free(li);
}

/* Free the server's stream that SYN `g` owns, sending nothing. */
static void syn_free_server(struct sim_seg *g)
{
    struct sim_end *srv = g->to;

    srv->err = -ECONNRESET;
    ferry__stream_destroy(srv->s);
}

void ferry_sim_free(ferry_sim *sim)
{
    struct ferry__link *l;

    if (!sim)
        return;
    if (sim->stall_node.linked)
        ferry__heap_remove(&sim->loop->timers, &sim->stall_node);
    ferry__list_foreach(l, &sim->segs) {
        struct sim_seg *g = ferry__container_of(l, struct sim_seg, link);
        ferry__heap_remove(&sim->loop->timers, &g->node);
    }
    /* A SYN still on its way owns the server's stream. */
    ferry__list_foreach(l, &sim->segs) {
        struct sim_seg *g = ferry__container_of(l, struct sim_seg, link);
        if (g->kind == SEG_SYN && g->to)
            syn_free_server(g);
    }
    ferry__list_foreach(l, &sim->held) {
        struct sim_seg *g = ferry__container_of(l, struct sim_seg, link);
        if (g->kind == SEG_SYN && g->to)
            syn_free_server(g);
    }
    free_list(&sim->segs, offsetof(struct sim_seg, link));
    free_list(&sim->held, offsetof(struct sim_seg, link));
    while ((l = ferry__list_pop_front(&sim->listeners)) != NULL)
        listener_free(ferry__container_of(l, struct ferry_sim_listener, link));
    while ((l = ferry__list_pop_front(&sim->ends)) != NULL) {
        struct sim_end *e = ferry__container_of(l, struct sim_end, link);
        end_reset(e, -ECONNRESET);
        e->sim = NULL;
    }
    free_list(&sim->links, offsetof(struct sim_link, link));
    free_list(&sim->hosts, offsetof(struct ferry_sim_host, link));
    ferry__loop_timers_changed(sim->loop);
    ferry__free(sim->trace);
    ferry__free(sim);
}

int ferry_sim_find_host(ferry_sim *sim, const char *name, ferry_sim_host **out)
{
    struct ferry__link *l;
    ferry_sim_host *h;
    size_t len;

    if (!out)
        return -EINVAL;
    *out = NULL;
    if (!sim || !name || !*name)
        return -EINVAL;
    ferry__list_foreach(l, &sim->hosts) {
        h = ferry__container_of(l, ferry_sim_host, link);
        if (strcmp(h->name, name) == 0) {
            *out = h;
            return 0;
        }
    }
    len = strlen(name);
    h = ferry__calloc(1, sizeof *h + len + 1);
    if (!h)
        return -ENOMEM;
    memcpy(h->name, name, len + 1);
    ferry__list_push_back(&sim->hosts, &h->link);
    *out = h;
    return 0;
}

int ferry_sim_link(ferry_sim *sim, ferry_sim_host *a, ferry_sim_host *b, int64_t latency,
                   int64_t jitter)
{
    struct ferry__link *l;
    struct sim_link *k;

    if (!sim || !a || !b || latency <= 0 || jitter < 0)
        return -EINVAL;
    ferry__list_foreach(l, &sim->links) {
        k = ferry__container_of(l, struct sim_link, link);
        if ((k->a == a && k->b == b) || (k->a == b && k->b == a)) {
            k->latency = latency;
            k->jitter = jitter;
            return 0;
        }
    }
    k = ferry__calloc(1, sizeof *k);
    if (!k)
        return -ENOMEM;
    k->a = a;
    k->b = b;
    k->latency = latency;
    k->jitter = jitter;
    ferry__list_push_back(&sim->links, &k->link);
    return 0;
}

const char *ferry_sim_trace(const ferry_sim *sim, size_t *len)
{
    if (len)
        *len = 0;
    if (!sim || sim->trace_lost)
        return NULL;
    if (len)
        *len = sim->tlen;
    return sim->trace ? sim->trace : "";
}

/* ---- listening and connecting ------------------------------------------------- */

int ferry_sim_listen(ferry_sim *sim, ferry_sim_host *host, int port, ferry_sim_listener **out)
{
    struct ferry_sim_listener *li;

    if (!out)
        return -EINVAL;
    *out = NULL;
    if (!sim || !host || port < 1 || port > 65535)
        return -EINVAL;
    if (find_listener(sim, host, port))
        return -EADDRINUSE;
    li = ferry__calloc(1, sizeof *li);
    if (!li)
        return -ENOMEM;
    li->sim = sim;
    li->host = host;
    li->port = port;
    ferry__list_push_back(&sim->listeners, &li->link);
    *out = li;
    return 0;
}

void ferry_sim_listener_close(ferry_sim_listener *li)
{
    struct ferry__link *l;

    if (!li || li->closed)
        return;
    ferry__list_foreach(l, &li->pending) {
        struct sim_end *e = ferry__container_of(l, struct sim_end, plink);
        conn_reset(e, -ECONNRESET, "unaccepted");
    }
    listener_free(li);
}

int ferry_sim_accept(ferry_sim_listener *li, ferry_stream **out)
{
    struct ferry__waiter w;
    struct ferry__link *l;
    ferry_task *self;
    int rc;

    if (!out)
        return -EINVAL;
    *out = NULL;
    if (!li)
        return -EINVAL;
    rc = ferry__enter_task(&self);
    if (rc)
        return rc;
    li->inside++;
    while (!li->closed && ferry__list_empty(&li->pending)) {
        ferry__waiter_init(&w, self, "sim accept", li);
        rc = ferry__wait(&li->q, &w, FERRY_NEVER);
        if (rc) {
            /* A connection granted to this task goes to the next one. */
            struct ferry__waiter *next = ferry__first_waiting(&li->q);
            if (w.state == FERRY__W_GRANTED && next && !li->closed)
                ferry__grant(next, 0);
            break;
        }
    }
    if (!rc && li->closed)
        rc = -EBADF;
    if (!rc) {
        l = ferry__list_pop_front(&li->pending);
        *out = ferry__container_of(l, struct sim_end, plink)->s;
    }
    if (--li->inside == 0 && li->closed)
        ferry__free(li);
    return rc;
}

/* The two ends of a new connection, the server's with its SYN ready. */
static int conn_new(struct ferry_sim *sim, ferry_sim_host *from, ferry_sim_host *to, int port,
                    struct sim_end **cli, struct sim_seg **syn)
{
    struct sim_end *srv;
    uint64_t id = sim->conns + 1;
    int rc;

    *syn = seg_new(sim, 0);
    if (!*syn)
        return -ENOMEM;
    rc = end_new(sim, from, id, cli);
    if (rc)
        goto err_free_syn;
    rc = end_new(sim, to, id, &srv);
    if (rc)
        goto err_free_cli;
    sim->conns = id;
    (*cli)->peer = srv;
    srv->peer = *cli;
    (*syn)->kind = SEG_SYN;
    (*syn)->conn = id;
    (*syn)->src = from;
    (*syn)->dst = to;
    (*syn)->to = srv;
    (*syn)->back = *cli;
    (*syn)->len = (size_t)port; /* the port travels in the length */
    return 0;

err_free_cli:
    (*cli)->err = -ECONNRESET;
    ferry__stream_destroy((*cli)->s);
err_free_syn:
    ferry__free(*syn);
    return rc;
}

/* A connect gave up: the SYN of `cli`, if still on its way or held,
 * takes its server's stream down with it. */
static void syn_abort(struct ferry_sim *sim, const struct sim_end *cli)
{
    struct ferry__link *lists[2] = { &sim->segs, &sim->held }, *l;

    for (int i = 0; i < 2; i++) {
        ferry__list_foreach(l, lists[i]) {
            struct sim_seg *g = ferry__container_of(l, struct sim_seg, link);
            if (g->kind == SEG_SYN && g->back == cli && g->to) {
                g->to->err = -ECONNRESET;
                ferry__stream_destroy(g->to->s);
                g->back = NULL;
                return;
            }
        }
    }
}

int ferry_sim_connect(ferry_sim *sim, ferry_sim_host *from, ferry_sim_host *to, int port,
                      ferry_stream **out)
{
    struct ferry__waiter w;
    struct sim_end *cli;
    struct sim_seg *syn;
    ferry_task *self;
    int rc;

    if (!out)
        return -EINVAL;
    *out = NULL;
    if (!sim || !from || !to || port < 1 || port > 65535)
        return -EINVAL;
    rc = ferry__enter_task(&self);
    if (rc)
        return rc;
    rc = ferry__check(self);
    if (rc)
        return rc;
    rc = conn_new(sim, from, to, port, &cli, &syn);
    if (rc)
        return rc;
    ferry__waiter_init(&w, self, "sim connect", sim);
    cli->connw = &w;
    seg_send(syn, cli);
    rc = ferry__wait(NULL, &w, FERRY_NEVER);
    cli->connw = NULL;
    if (rc == 0 && cli->err)
        rc = cli->err;
    if (rc) {
        /* The server's end is the SYN's while it is on its way. */
        syn_abort(sim, cli);
        conn_reset(cli, -ECONNRESET, "connect abandoned");
        ferry__stream_destroy(cli->s);
        return rc;
    }
    *out = cli->s;
    return 0;
}

/* ---- faults ---------------------------------------------------------------- */

int ferry_sim_partition(ferry_sim *sim, ferry_sim_host *const *a, size_t na,
                        ferry_sim_host *const *b, size_t nb)
{
    if (!sim || (na && !a) || (nb && !b))
        return -EINVAL;
    for (size_t i = 0; i < na; i++)
        for (size_t j = 0; j < nb; j++)
            if (!a[i] || !b[j] || a[i] == b[j])
                return -EINVAL;
    ferry_sim_heal(sim);
    for (size_t i = 0; i < na; i++)
        a[i]->side = 1;
    for (size_t j = 0; j < nb; j++)
        b[j]->side = 2;
    sim->parted = true;
    trace(sim, "%lld partition\n", (long long)(ferry__loop_now(sim->loop) - sim->start));
    ferry__heap_insert(&sim->loop->timers, &sim->stall_node,
                       ferry__loop_now(sim->loop) + sim->stall);
    ferry__loop_timers_changed(sim->loop);
    return 0;
}

void ferry_sim_heal(ferry_sim *sim)
{
    struct ferry__link held, *l;

    if (!sim || !sim->parted)
        return;
    ferry__list_foreach(l, &sim->hosts)
        ferry__container_of(l, ferry_sim_host, link)->side = 0;
    if (sim->stall_node.linked)
        ferry__heap_remove(&sim->loop->timers, &sim->stall_node);
    sim->parted = false;
    sim->stalled = false;
    trace(sim, "%lld heal\n", (long long)(ferry__loop_now(sim->loop) - sim->start));
    ferry__list_move(&held, &sim->held);
    while ((l = ferry__list_pop_front(&held)) != NULL) {
        struct sim_seg *g = ferry__container_of(l, struct sim_seg, link);
        struct sim_end *from = g->to ? g->to->peer : NULL;

        /* A SYNACK is sent by the server's end, every other segment by
         * the peer of the end it goes to: each keeps its direction's
         * order. */
        seg_send(g, g->kind == SEG_SYN ? g->back : from);
    }
    ferry__loop_timers_changed(sim->loop);
}

int ferry_sim_reset(ferry_stream *s)
{
    struct sim_end *e;

    if (!s || s->io != &sim_io)
        return -EINVAL;
    if (s->reg.closed)
        return -EBADF;
    e = s->io_ctx;
    conn_reset(e, -ECONNRESET, "command");
    return 0;
}

void ferry_sim_crash(ferry_sim *sim, ferry_sim_host *host)
{
    struct ferry__link *l;

    if (!sim || !host)
        return;
    host->crashed = true;
    trace(sim, "%lld %s crash\n", (long long)(ferry__loop_now(sim->loop) - sim->start),
          host->name);
    ferry__list_foreach(l, &sim->ends) {
        struct sim_end *e = ferry__container_of(l, struct sim_end, link);
        if (e->host == host)
            conn_reset(e, -ECONNRESET, "crash");
    }
}

void ferry_sim_restart(ferry_sim *sim, ferry_sim_host *host)
{
    if (!sim || !host)
        return;
    host->crashed = false;
    trace(sim, "%lld %s restart\n", (long long)(ferry__loop_now(sim->loop) - sim->start),
          host->name);
}
