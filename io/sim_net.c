/* sim_net.c - the calls of the simulated network (ferry/sim.h): the
 * simulation and its hosts and links, listening, accepting and
 * connecting, and the faults on command.  The segments and the transport
 * are in sim.c.
 * Loop thread only.
 *
 * A connect makes both ends of the connection and the server's stream at
 * once, so that the arrival of its SYN allocates nothing; the SYN owns the
 * server's stream until it arrives.  A connect that gives up (cancelled,
 * refused, timed out) takes down a SYN still on its way with the server's
 * stream.
 */
#include "loop_only.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "log.h"
#include "sim_int.h"
#include "sync_int.h"

/* ---- the simulation --------------------------------------------------------- */

/*
 * The seed of a simulation made with seed 0: FERRY_FUZZ's (so that the
 * one number ferry-fuzz prints replays the schedule and the network),
 * else FERRY_SIM_SEED, else 1.  Logged with the variable that replays it,
 * since a run that fails must say how to run it again.
 */
static uint64_t env_seed(void)
{
    struct ferry__fuzz f;
    const char *s = getenv("FERRY_SIM_SEED");
    unsigned long long v;
    char *end;

    if (ferry__fuzz_env(&f)) {
        ferry__log(FERRY_LOG_WARN,
                   "simulation seed %llu, FERRY_FUZZ's (FERRY_FUZZ=%llu replays the schedule "
                   "and the network)",
                   (unsigned long long)f.seed, (unsigned long long)f.seed);
        return f.seed;
    }
    if (s && *s) {
        errno = 0;
        v = strtoull(s, &end, 10);
        if (!errno && end != s && !*end && v && *s != '-') {
            ferry__log(FERRY_LOG_WARN, "simulation seed %llu (FERRY_SIM_SEED=%llu replays it)", v,
                       v);
            return v;
        }
        ferry__log(FERRY_LOG_WARN, "FERRY_SIM_SEED=%s ignored: expected 1 to 2^64-1", s);
    }
    ferry__log(FERRY_LOG_WARN, "simulation seed 1 (FERRY_SIM_SEED=N runs another)");
    return 1;
}

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
    if (opts &&
        (opts->latency < 0 || opts->jitter < 0 || opts->stall < 0 || opts->reset_every < 0 ||
         opts->bandwidth < 0 || opts->partition_every < 0 || opts->partition_for < 0 ||
         opts->crash_every < 0 || opts->crash_for < 0 || opts->loss_ppm > 1000000))
        return -EINVAL;
    /* Its hosts' tasks find it as the loop's part: one a loop. */
    if (ferry__loop_part_find(loop, &ferry__sim_part_ops))
        return -EBUSY;
    sim = ferry__calloc(1, sizeof *sim);
    if (!sim)
        return -ENOMEM;
    sim->loop = loop;
    sim->seed = seed ? seed : env_seed();
    sim->rng = sim->seed;
    sim->start = ferry__loop_now(loop);
    sim->latency = opts && opts->latency ? opts->latency : 1000000;
    sim->jitter = opts ? opts->jitter : 0;
    sim->stall = opts && opts->stall ? opts->stall : 10 * (int64_t)1000000000;
    sim->stall_node.fire = ferry__sim_stall_fire;
    sim->reset_every = opts ? opts->reset_every : 0;
    sim->bandwidth = opts ? opts->bandwidth : 0;
    sim->window = opts && opts->window ? opts->window : 64 * 1024;
    sim->loss_ppm = opts ? opts->loss_ppm : 0;
    sim->partition_every = opts ? opts->partition_every : 0;
    sim->partition_for = opts && opts->partition_for ? opts->partition_for : 1000000000;
    sim->crash_every = opts ? opts->crash_every : 0;
    sim->crash_for = opts && opts->crash_for ? opts->crash_for : 1000000000;
    ferry__loop_part_add(loop, &sim->part, &ferry__sim_part_ops);
    *out = sim;
    return 0;
}

static void free_list(struct ferry__link *list, size_t off)
{
    struct ferry__link *l;

    while ((l = ferry__list_pop_front(list)) != NULL)
        ferry__free((char *)l - off);
}

void ferry__sim_listener_put(struct ferry_sim_listener *li)
{
    if (li->closed && !li->inside && !li->owned)
        ferry__free(li);
}

/* Take the listener down: its connections not yet accepted go, its
 * accepting tasks get -EBADF, its port is free. */
static void listener_down(struct ferry_sim_listener *li)
{
    struct ferry__link *l;

    while ((l = ferry__list_pop_front(&li->pending)) != NULL) {
        struct sim_end *e = ferry__container_of(l, struct sim_end, plink);
        ferry__sim_end_reset(e, -ECONNRESET);
        ferry__stream_destroy(e->s);
    }
    li->down = true;
    ferry__waitq_grant_all(&li->q, -EBADF);
}

static void listener_free(struct ferry_sim_listener *li)
{
    if (ferry__link_linked(&li->link))
        ferry__list_remove(&li->link);
    listener_down(li);
    li->closed = true;
    ferry__sim_listener_put(li);
}

void ferry_sim_free(ferry_sim *sim)
{
    struct ferry__link *l;

    if (!sim)
        return;
    if (sim->stall_node.linked)
        ferry__heap_remove(&sim->loop->timers, &sim->stall_node);
    if (sim->chaos_node.linked)
        ferry__heap_remove(&sim->loop->timers, &sim->chaos_node);
    if (sim->part_node.linked)
        ferry__heap_remove(&sim->loop->timers, &sim->part_node);
    if (sim->crash_node.linked)
        ferry__heap_remove(&sim->loop->timers, &sim->crash_node);
    ferry__list_foreach(l, &sim->segs) {
        struct sim_seg *g = ferry__container_of(l, struct sim_seg, link);
        ferry__heap_remove(&sim->loop->timers, &g->node);
    }
    /* No SYN on its way owns a server's stream here: only a connect that
     * is still waiting has one, and no task may be inside a call. */
    free_list(&sim->segs, offsetof(struct sim_seg, link));
    free_list(&sim->held, offsetof(struct sim_seg, link));
    while ((l = ferry__list_pop_front(&sim->listeners)) != NULL)
        listener_free(ferry__container_of(l, struct ferry_sim_listener, link));
    while ((l = ferry__list_pop_front(&sim->ends)) != NULL) {
        struct sim_end *e = ferry__container_of(l, struct sim_end, link);
        ferry__sim_end_reset(e, -ECONNRESET);
        e->sim = NULL;
    }
    free_list(&sim->links, offsetof(struct sim_link, link));
    free_list(&sim->hosts, offsetof(struct ferry_sim_host, link));
    ferry__loop_timers_changed(sim->loop);
    ferry__loop_part_del(&sim->part);
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
    h->sim = sim;
    h->addr = ++sim->nhosts;
    ferry__list_push_back(&sim->hosts, &h->link);
    *out = h;
    return 0;
}

int ferry_sim_link(ferry_sim *sim, ferry_sim_host *a, ferry_sim_host *b, int64_t latency,
                   int64_t jitter)
{
    struct sim_link *k;
    int rc;

    if (!sim || !a || !b || latency <= 0 || jitter < 0)
        return -EINVAL;
    rc = ferry__sim_link_get(sim, a, b, &k);
    if (rc)
        return rc;
    k->own = true;
    k->latency = latency;
    k->jitter = jitter;
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
    if (ferry__sim_find_listener(sim, host, port))
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
        ferry__sim_conn_reset(e, -ECONNRESET, "unaccepted");
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
    while (!li->closed && !li->down && ferry__list_empty(&li->pending)) {
        ferry__waiter_init(&w, self, "sim accept", li);
        rc = ferry__wait(&li->q, &w, FERRY_NEVER);
        if (rc) {
            /* A connection granted to this task goes to the next one. */
            struct ferry__waiter *next = ferry__first_waiting(&li->q);
            if (w.state == FERRY__W_GRANTED && next && !li->closed && !li->down)
                ferry__grant(next, 0);
            break;
        }
    }
    if (!rc && (li->closed || li->down))
        rc = -EBADF;
    if (!rc) {
        l = ferry__list_pop_front(&li->pending);
        *out = ferry__container_of(l, struct sim_end, plink)->s;
    }
    li->inside--;
    ferry__sim_listener_put(li);
    return rc;
}

/* The two ends of a new connection, the server's with its SYN ready. */
static int conn_new(struct ferry_sim *sim, ferry_sim_host *from, ferry_sim_host *to, int port,
                    struct sim_end **cli, struct sim_seg **syn)
{
    struct sim_end *srv;
    struct sim_link *k;
    uint64_t id = sim->conns + 1;
    int rc;

    /* With a bandwidth, the link keeps the time each way is busy until:
     * made now, so that no send allocates it. */
    if (sim->bandwidth) {
        rc = ferry__sim_link_get(sim, from, to, &k);
        if (rc)
            return rc;
    }
    *syn = ferry__sim_seg_new(sim, 0);
    if (!*syn)
        return -ENOMEM;
    rc = ferry__sim_end_new(sim, from, id, cli);
    if (rc)
        goto err_free_syn;
    rc = ferry__sim_end_new(sim, to, id, &srv);
    if (rc)
        goto err_free_cli;
    sim->conns = id;
    (*cli)->peer = srv;
    (*cli)->peer_host = to;
    srv->peer = *cli;
    srv->peer_host = from;
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
    ferry__sim_seg_send(syn, cli);
    ferry__sim_faults_arm(sim);
    rc = ferry__wait(NULL, &w, FERRY_NEVER);
    cli->connw = NULL;
    if (rc == 0 && cli->err)
        rc = cli->err;
    if (rc) {
        /* The server's end is the SYN's while it is on its way. */
        syn_abort(sim, cli);
        ferry__sim_conn_reset(cli, -ECONNRESET, "connect abandoned");
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
        if (!a[i])
            return -EINVAL;
    for (size_t j = 0; j < nb; j++) {
        if (!b[j])
            return -EINVAL;
        for (size_t i = 0; i < na; i++)
            if (a[i] == b[j])
                return -EINVAL;
    }
    ferry__sim_part_forget(sim);
    ferry__sim_heal_now(sim);
    for (size_t i = 0; i < na; i++)
        a[i]->side = 1;
    for (size_t j = 0; j < nb; j++)
        b[j]->side = 2;
    ferry__sim_parted(sim, "");
    return 0;
}

void ferry__sim_parted(struct ferry_sim *sim, const char *why)
{
    sim->parted = true;
    ferry__sim_trace(sim, "%lld partition%s%s\n",
                     (long long)(ferry__loop_now(sim->loop) - sim->start), *why ? " " : "", why);
    ferry__heap_insert(&sim->loop->timers, &sim->stall_node,
                       ferry__loop_now(sim->loop) + sim->stall);
    ferry__loop_timers_changed(sim->loop);
}

void ferry_sim_heal(ferry_sim *sim)
{
    if (!sim)
        return;
    ferry__sim_part_forget(sim);
    ferry__sim_heal_now(sim);
    ferry__sim_faults_arm(sim);
}

void ferry__sim_heal_now(struct ferry_sim *sim)
{
    struct ferry__link held, *l;

    if (!sim->parted)
        return;
    ferry__list_foreach(l, &sim->hosts)
        ferry__container_of(l, ferry_sim_host, link)->side = 0;
    if (sim->stall_node.linked)
        ferry__heap_remove(&sim->loop->timers, &sim->stall_node);
    sim->parted = false;
    sim->stalled = false;
    ferry__sim_trace(sim, "%lld heal\n", (long long)(ferry__loop_now(sim->loop) - sim->start));
    ferry__list_move(&held, &sim->held);
    while ((l = ferry__list_pop_front(&held)) != NULL) {
        struct sim_seg *g = ferry__container_of(l, struct sim_seg, link);
        struct sim_end *from = g->to ? g->to->peer : NULL;

        /* A SYNACK is sent by the server's end, every other segment by
         * the peer of the end it goes to: each keeps its direction's
         * order. */
        ferry__sim_seg_send(g, g->kind == SEG_SYN ? g->back : from);
    }
    ferry__loop_timers_changed(sim->loop);
}

int ferry_sim_reset(ferry_stream *s)
{
    struct sim_end *e;

    if (!s || s->io != &ferry__sim_io)
        return -EINVAL;
    if (s->reg.closed)
        return -EBADF;
    e = s->io_ctx;
    ferry__sim_conn_reset(e, -ECONNRESET, "command");
    return 0;
}

void ferry_sim_crash(ferry_sim *sim, ferry_sim_host *host)
{
    struct ferry__link *l;

    if (!sim || !host)
        return;
    if (host->crashed)
        return;
    host->crashed = true;
    ferry__sim_trace(sim, "%lld %s crash\n", (long long)(ferry__loop_now(sim->loop) - sim->start),
                     host->name);
    ferry__sim_host_cancel(sim, host);
    ferry__list_foreach(l, &sim->listeners) {
        struct ferry_sim_listener *li = ferry__container_of(l, struct ferry_sim_listener, link);
        if (li->host == host && !li->down) {
            struct ferry__link *p;

            ferry__list_foreach(p, &li->pending)
                ferry__sim_conn_reset(ferry__container_of(p, struct sim_end, plink), -ECONNRESET,
                                      "crash");
            listener_down(li);
        }
    }
    ferry__list_foreach(l, &sim->ends) {
        struct sim_end *e = ferry__container_of(l, struct sim_end, link);
        if (e->host == host)
            ferry__sim_conn_reset(e, -ECONNRESET, "crash");
    }
}

void ferry_sim_restart(ferry_sim *sim, ferry_sim_host *host)
{
    int rc;

    if (!sim || !host || !host->crashed)
        return;
    host->crashed = false;
    ferry__sim_trace(sim, "%lld %s restart\n", (long long)(ferry__loop_now(sim->loop) - sim->start),
                     host->name);
    if (host->boot_fn) {
        rc = ferry_sim_spawn(host, NULL, host->boot_fn, host->boot_arg);
        if (rc)
            ferry__sim_trace(sim, "%lld %s boot failed %d\n",
                             (long long)(ferry__loop_now(sim->loop) - sim->start), host->name, rc);
    }
}
