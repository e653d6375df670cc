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

#include "rand.h"
#include "sim_int.h"
#include "sync_int.h"

static const char *const kind_names[] = { "syn", "synack", "refused", "data", "fin", "rst" };

/* The first retransmission timeout of a lost segment; it doubles at each
 * loss in a row, as TCP's does. */
#define RTO_MIN ((int64_t)200000000)


/* ---- the trace ------------------------------------------------------------ */

/* Append one line to the trace; running out of memory marks it lost. */
void ferry__sim_trace(struct ferry_sim *sim, const char *fmt, ...)
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
    ferry__sim_trace(
        sim, "%lld c%llu %s>%s %s %s %zu\n", (long long)(ferry__loop_now(sim->loop) - sim->start),
        (unsigned long long)g->conn, g->src->name, g->dst->name, what, kind_names[g->kind], g->len);
}

/* ---- links and segments ---------------------------------------------------- */

/* The link between a and b is cut by the partition. */
static bool cut(const ferry_sim_host *a, const ferry_sim_host *b)
{
    return a->side && b->side && a->side != b->side;
}

static struct sim_link *find_link(struct ferry_sim *sim, const ferry_sim_host *a,
                                  const ferry_sim_host *b)
{
    struct ferry__link *l;

    ferry__list_foreach(l, &sim->links) {
        struct sim_link *k = ferry__container_of(l, struct sim_link, link);
        if ((k->a == a && k->b == b) || (k->a == b && k->b == a))
            return k;
    }
    return NULL;
}

int ferry__sim_link_get(struct ferry_sim *sim, ferry_sim_host *a, ferry_sim_host *b,
                        struct sim_link **out)
{
    struct sim_link *k = find_link(sim, a, b);

    if (!k) {
        k = ferry__calloc(1, sizeof *k);
        if (!k)
            return -ENOMEM;
        k->a = a;
        k->b = b;
        ferry__list_push_back(&sim->links, &k->link);
    }
    *out = k;
    return 0;
}

/* The one-way delay of the next segment on link `k` (NULL: defaults). */
static int64_t delay(struct ferry_sim *sim, const struct sim_link *k)
{
    int64_t lat = sim->latency, jit = sim->jitter;

    if (k && k->own) {
        lat = k->latency;
        jit = k->jitter;
    }
    if (jit > 0)
        lat += (int64_t)(ferry__rand_next(&sim->rng) % ((uint64_t)jit + 1));
    return lat;
}

static void seg_fire(struct ferry__hnode *n);

struct sim_seg *ferry__sim_seg_new(struct ferry_sim *sim, size_t len)
{
    struct sim_seg *g = ferry__calloc(1, sizeof *g + len);

    if (g) {
        g->sim = sim;
        g->node.fire = seg_fire;
    }
    return g;
}

/*
 * When the link `k` has sent segment `g` (with a bandwidth, it waits for
 * the segments before it on that way of the link, then takes len /
 * bandwidth).
 */
static int64_t occupy(struct ferry_sim *sim, struct sim_link *k, const struct sim_seg *g,
                      int64_t now)
{
    int64_t *busy, start;

    if (!sim->bandwidth || !k)
        return now;
    busy = &k->busy[k->a == g->src ? 0 : 1];
    start = *busy > now ? *busy : now;
    *busy = start + (int64_t)((uint64_t)g->len * 1000000000u / (uint64_t)sim->bandwidth);
    return *busy;
}

/*
 * The time losses add to segment `g`, drawn from the seed: each loss
 * sends it again a retransmission timeout later, doubling.  Once the
 * losses in a row last the stall time the segment is doomed: it resets
 * its connection when that time has passed.
 */
static int64_t losses(struct ferry_sim *sim, struct sim_seg *g)
{
    int64_t wait = 0, rto = RTO_MIN;
    unsigned n = 0;

    if (!sim->loss_ppm)
        return 0;
    while (ferry__rand_below(&sim->rng, 1000000) < sim->loss_ppm) {
        n++;
        wait += rto;
        rto *= 2;
        if (wait >= sim->stall) {
            g->doomed = true;
            wait = sim->stall;
            break;
        }
    }
    if (n)
        ferry__sim_trace(sim, "%lld c%llu %s>%s lost %s %zu x%u\n",
                         (long long)(ferry__loop_now(sim->loop) - sim->start),
                         (unsigned long long)g->conn, g->src->name, g->dst->name,
                         kind_names[g->kind], g->len, n);
    return wait;
}

/* Put segment `g`, sent by end `from`, on its way. */
void ferry__sim_seg_send(struct sim_seg *g, struct sim_end *from)
{
    struct ferry_sim *sim = g->sim;
    struct sim_link *k = find_link(sim, g->src, g->dst);
    int64_t at = occupy(sim, k, g, ferry__loop_now(sim->loop));

    g->from = from;
    g->doomed = false;
    at += losses(sim, g);
    if (!g->doomed)
        at += delay(sim, k);
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
void ferry__sim_end_reset(struct sim_end *e, int err)
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
void ferry__sim_conn_reset(struct sim_end *e, int err, const char *why)
{
    if (e->sim && !e->err)
        ferry__sim_trace(e->sim, "%lld c%llu %s reset %s\n",
                         (long long)(ferry__loop_now(e->sim->loop) - e->sim->start),
                         (unsigned long long)e->conn, e->host->name, why);
    if (e->peer)
        ferry__sim_end_reset(e->peer, err == -ETIMEDOUT && !e->peer->connw ? -ECONNRESET : err);
    ferry__sim_end_reset(e, err == -ETIMEDOUT && !e->connw ? -ECONNRESET : err);
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
        if (g->from == e)
            g->from = NULL;
    }
}

int ferry__sim_end_new(struct ferry_sim *sim, ferry_sim_host *host, uint64_t conn,
                       struct sim_end **out)
{
    struct sim_end *e = ferry__calloc(1, sizeof *e);
    int rc;

    if (!e)
        return -ENOMEM;
    e->fin = ferry__sim_seg_new(sim, 0);
    if (!e->fin) {
        ferry__free(e);
        return -ENOMEM;
    }
    rc = ferry__stream_make(&e->s, sim->loop, -1, &ferry__sim_io, FERRY_WRITE, NULL);
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
    size_t len = 0, off = 0, room;

    if (e->err)
        return e->err;
    if (!e->sim)
        return -ECONNRESET;
    if (e->fin_out)
        return -EPIPE;
    /* The window is full: wait as for a full socket buffer, until an
     * arrival makes room. */
    if (e->inflight >= e->sim->window) {
        *want = FERRY_WRITE;
        return -EAGAIN;
    }
    room = e->sim->window - e->inflight;
    for (int i = 0; i < n; i++)
        len += iov[i].iov_len;
    if (len > room)
        len = room;
    g = ferry__sim_seg_new(e->sim, len);
    if (!g)
        return -ENOMEM;
    for (int i = 0; i < n && off < len; i++) {
        size_t k = iov[i].iov_len < len - off ? iov[i].iov_len : len - off;

        memcpy(g->data + off, iov[i].iov_base, k);
        off += k;
    }
    e->inflight += len;
    g->kind = SEG_DATA;
    g->len = len;
    g->conn = e->conn;
    g->src = e->host;
    g->to = e->peer;
    g->dst = e->peer_host;
    ferry__sim_seg_send(g, e);
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
    ferry__sim_seg_send(g, e);
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

const struct ferry__stream_io ferry__sim_io = {
    .recv = sim_recv,
    .send = sim_send,
    .shutdown = sim_shutdown,
    .close = sim_close,
    .drains = false,
};

/* ---- deliveries ------------------------------------------------------------ */

struct ferry_sim_listener *ferry__sim_find_listener(struct ferry_sim *sim, const ferry_sim_host *h,
                                                    int port)
{
    struct ferry__link *l;

    ferry__list_foreach(l, &sim->listeners) {
        struct ferry_sim_listener *li = ferry__container_of(l, struct ferry_sim_listener, link);
        if (li->host == h && li->port == port && !li->down)
            return li;
    }
    return NULL;
}

/* A SYN reached the server's end: hand it to the listener and answer
 * SYNACK, or answer REFUSED and free the server's stream. */
static void deliver_syn(struct sim_seg *g)
{
    struct sim_end *srv = g->to, *cli = g->back;
    struct ferry_sim_listener *li = ferry__sim_find_listener(g->sim, g->dst, (int)g->len);
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
        ferry__sim_seg_send(g, NULL);
        return;
    }
    g->kind = SEG_SYNACK;
    ferry__list_push_back(&li->pending, &srv->plink);
    w = ferry__first_waiting(&li->q);
    if (w)
        ferry__grant(w, 0);
    ferry__sim_seg_send(g, srv);
}

/* DATA segment `g` arrived (or is dropped): its bytes are not on their
 * way any more, which may make room in its sender's window. */
static void arrived(struct sim_seg *g)
{
    struct sim_end *f = g->from;

    if (!f)
        return;
    f->inflight -= g->len;
    if (f->inflight < g->sim->window && !f->s->reg.closed)
        ferry__ioreg_ready(&f->s->reg, FERRY_WRITE);
}

/* Segment `g` was lost until the stall time: its connection is reset
 * (-ETIMEDOUT to a task connecting).  A SYN takes the server's end, which
 * it owns, down with it. */
static void seg_doomed(struct sim_seg *g)
{
    struct sim_end *e = g->to ? g->to : g->from;

    trace_seg(g->sim, g, "drop");
    if (e)
        ferry__sim_conn_reset(e, -ETIMEDOUT, "loss");
    if (g->kind == SEG_SYN && g->to)
        ferry__stream_destroy(g->to->s);
    ferry__free(g);
}

/* Turn DATA segment `g`, which reached a closed end, into a reset back
 * to its sender. */
static void send_rst(struct sim_seg *g)
{
    ferry_sim_host *h = g->src;

    g->kind = SEG_RST;
    g->len = 0;
    g->to = g->from;
    g->src = g->dst;
    g->dst = h;
    ferry__sim_seg_send(g, NULL);
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
            ferry__sim_conn_reset(to, -ETIMEDOUT, "stall");
        return;
    }
    if (g->kind == SEG_DATA)
        arrived(g);
    if (g->doomed) {
        seg_doomed(g);
        return;
    }
    if (!to || (to->err && g->kind != SEG_SYN)) {
        trace_seg(sim, g, "drop");
        /* Bytes reaching a closed end: a reset goes back, as a kernel
         * answers them. */
        if (!to && g->kind == SEG_DATA && g->from && !g->from->err) {
            send_rst(g);
            return;
        }
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
    case SEG_RST:
        ferry__sim_conn_reset(to, -ECONNRESET, "rst");
        break;
    }
    ferry__free(g);
}

/* The partition has lasted the stall time: reset the connections that
 * have bytes held across it, and those that get some from now on. */
void ferry__sim_stall_fire(struct ferry__hnode *n)
{
    struct ferry_sim *sim = ferry__container_of(n, struct ferry_sim, stall_node);
    struct ferry__link *l;

    sim->stalled = true;
    ferry__list_foreach(l, &sim->held) {
        struct sim_seg *g = ferry__container_of(l, struct sim_seg, link);
        if (g->to)
            ferry__sim_conn_reset(g->to, -ETIMEDOUT, "stall");
    }
}

/* ---- random faults ---------------------------------------------------------- */

/* An end of a connection that a random reset may hit: not reset, its
 * peer still there. */
static bool live(const struct sim_end *e)
{
    return !e->err && e->peer;
}

/* A random reset is due: reset one live connection drawn from the seed,
 * then draw the time of the next one. */
static void chaos_fire(struct ferry__hnode *n)
{
    struct ferry_sim *sim = ferry__container_of(n, struct ferry_sim, chaos_node);
    struct ferry__link *l;
    uint32_t count = 0, pick;

    ferry__list_foreach(l, &sim->ends)
        count += live(ferry__container_of(l, struct sim_end, link));
    if (count) {
        pick = ferry__rand_below(&sim->rng, count);
        ferry__list_foreach(l, &sim->ends) {
            struct sim_end *e = ferry__container_of(l, struct sim_end, link);
            if (live(e) && pick-- == 0) {
                ferry__sim_conn_reset(e, -ECONNRESET, "random");
                break;
            }
        }
    }
    ferry__sim_chaos_arm(sim);
}

bool ferry__sim_any_live(struct ferry_sim *sim)
{
    struct ferry__link *l;

    ferry__list_foreach(l, &sim->ends) {
        if (live(ferry__container_of(l, struct sim_end, link)))
            return true;
    }
    return false;
}

void ferry__sim_chaos_arm(struct ferry_sim *sim)
{
    struct ferry__link *l;
    bool any = false;
    int64_t d;

    if (!sim->reset_every || sim->chaos_node.linked)
        return;
    ferry__list_foreach(l, &sim->ends)
        any |= live(ferry__container_of(l, struct sim_end, link));
    if (!any)
        return;
    d = (int64_t)(ferry__rand_next(&sim->rng) % (2 * (uint64_t)sim->reset_every + 1));
    sim->chaos_node.fire = chaos_fire;
    ferry__heap_insert(&sim->loop->timers, &sim->chaos_node, ferry__loop_now(sim->loop) + d);
    ferry__loop_timers_changed(sim->loop);
}
