/* test_sim.c - the simulated network (ferry/sim.h): a line echo service
 * and its clients on simulated hosts, through the ordinary stream calls;
 * deliveries after the link's latency on the virtual clock; the same seed
 * giving the same trace byte for byte and another seed another; refused
 * connections; the end of a direction; a partition that holds bytes until
 * it heals, or resets the connections once it has lasted the stall time;
 * bytes that reach a partition after the stall reset at once; one
 * direction keeps its order under jitter; a reset on command; a crashed
 * host and its restart; a listener closed under a waiting accept, and
 * with a connection not yet accepted; a connect given up while its SYN is
 * held; the simulation freed with streams still open.
 *
 * No cr_assert inside task bodies: tasks record what they saw into
 * variables, and the test asserts on the main stack after tu_run().
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "testutil.h"
#include "ferry/sim.h"

#define T(suite, name) \
    Test(suite, name, .init = tu_vclock_setup, .fini = tu_loop_teardown, .timeout = 20.)

#define LAT FERRY_MSEC(5)

/* ---- a line echo service ------------------------------------------------ */

/* What a scenario sets up and what its tasks saw. */
struct world {
    ferry_sim *sim;
    ferry_sim_host *srv, *cli[4];
    ferry_sim_listener *l;
    int served;          /* connections the server took */
    int server_rc;       /* the last error a server connection saw */
    int rc[4];           /* each client's result */
    int64_t t[4];        /* when each client ended, since the start */
    int64_t start;
    char got[4][64];     /* what each client read back */
    int lines;           /* lines each client sends */
};

static int server(void *arg)
{
    struct world *w = arg;
    ferry_stream *s;
    int rc;

    while ((rc = ferry_sim_accept(w->l, &s)) == 0) {
        w->served++;
        if (ferry_task_spawn(NULL, NULL, tu_echo_lines, s, NULL) != 0)
            ferry_stream_close(s);
    }
    return rc;
}

/* Client i: connect, send w->lines lines, read each echo back. */
static int client_n(struct world *w, int i)
{
    ferry_stream *s;
    char line[64];
    size_t n;
    int rc;

    rc = ferry_sim_connect(w->sim, w->cli[i], w->srv, 7, &s);
    if (rc)
        goto out;
    for (int k = 0; k < w->lines && !rc; k++) {
        int len = snprintf(line, sizeof line, "c%d-%d\n", i, k);
        rc = ferry_stream_write(s, line, (size_t)len, NULL);
        if (!rc)
            rc = ferry_stream_read_until(s, "\n", 1, w->got[i], sizeof w->got[i] - 1, &n);
        if (!rc)
            w->got[i][n] = '\0';
    }
    ferry_stream_close(s);
out:
    w->rc[i] = rc;
    w->t[i] = ferry_now() - w->start;
    return rc;
}

struct cl {
    struct world *w;
    int i;
};

static int client(void *arg)
{
    struct cl *c = arg;
    return client_n(c->w, c->i);
}

/* Make the simulation, its hosts and the listener. */
static void world_init(struct world *w, uint64_t seed, const ferry_sim_opts *opts, int nclients)
{
    char name[16];

    memset(w, 0, sizeof *w);
    w->lines = 1;
    cr_assert_eq(ferry_sim_new(&w->sim, tu_loop, seed, opts), 0);
    cr_assert_eq(ferry_sim_find_host(w->sim, "server", &w->srv), 0);
    for (int i = 0; i < nclients; i++) {
        snprintf(name, sizeof name, "client%d", i);
        cr_assert_eq(ferry_sim_find_host(w->sim, name, &w->cli[i]), 0);
    }
    cr_assert_eq(ferry_sim_listen(w->sim, w->srv, 7, &w->l), 0);
    w->start = ferry_now();
}

/* Run the server and `n` clients until the clients are done. */
struct run {
    struct world *w;
    int n;
};

static int run_main(void *arg)
{
    struct run *r = arg;
    struct cl cl[4];
    ferry_task *srv, *c[4];

    ferry_task_spawn(&srv, NULL, server, r->w, NULL);
    for (int i = 0; i < r->n; i++) {
        cl[i] = (struct cl){ r->w, i };
        ferry_task_spawn(&c[i], NULL, client, &cl[i], NULL);
    }
    for (int i = 0; i < r->n; i++)
        ferry_task_join(c[i], NULL);
    ferry_sim_listener_close(r->w->l);
    ferry_task_join(srv, NULL);
    return 0;
}

/* Let every connection task wind down, then free the simulation. */
static void world_free(struct world *w)
{
    ferry_sim_free(w->sim);
}

T(sim, echo_through_the_stream_calls)
{
    struct world w;

    world_init(&w, 1, &(ferry_sim_opts){ .latency = LAT }, 1);
    w.lines = 3;
    cr_assert_eq(tu_run(run_main, &(struct run){ &w, 1 }), 0);
    cr_assert_eq(w.rc[0], 0, "client: %d", w.rc[0]);
    cr_assert_str_eq(w.got[0], "c0-2\n");
    cr_assert_eq(w.served, 1);
    /* One round trip to connect, one per line. */
    cr_assert_eq(w.t[0], 4 * 2 * LAT, "took %lld ns", (long long)w.t[0]);
    world_free(&w);
}

/* The trace of a scenario of 4 clients sending 5 lines each over links
 * with jitter, on a loop of its own whose schedule is fuzzed with
 * `fuzz`; the caller frees it. */
static char *scenario_trace(uint64_t seed, uint64_t fuzz)
{
    ferry_loop *saved = tu_loop;
    struct world w;
    const char *t;
    size_t len;
    char *copy;

    cr_assert_eq(ferry_loop_new(&tu_loop, &(ferry_loop_opts){ .virtual_clock = true,
                                                              .fuzz_seed = fuzz }),
                 0);
    world_init(&w, seed, &(ferry_sim_opts){ .latency = LAT, .jitter = FERRY_MSEC(20) }, 4);
    w.lines = 5;
    cr_assert_eq(tu_run(run_main, &(struct run){ &w, 4 }), 0);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(w.rc[i], 0, "client %d: %d", i, w.rc[i]);
    t = ferry_sim_trace(w.sim, &len);
    cr_assert_not_null(t);
    cr_assert_gt(len, 0);
    copy = strdup(t);
    world_free(&w);
    ferry_loop_free(tu_loop);
    tu_loop = saved;
    return copy;
}

T(sim, same_seed_same_trace)
{
    char *a = scenario_trace(42, 7), *b = scenario_trace(42, 7), *c = scenario_trace(43, 7);
    int lines = 0;

    for (const char *p = a; *p; p++)
        lines += *p == '\n';
    /* 4 x (syn, synack, 5 x 2 data, the client's fin): the server's fin
     * finds the client's end closed and is not sent. */
    cr_assert_eq(lines, 4 * 13, "%d lines:\n%s", lines, a);
    cr_assert_str_eq(a, b);
    cr_assert_str_neq(a, c);
    free(a);
    free(b);
    free(c);
}

T(sim, connect_refused_without_listener)
{
    struct world w;

    world_init(&w, 1, &(ferry_sim_opts){ .latency = LAT }, 1);
    ferry_sim_listener_close(w.l);
    cr_assert_eq(tu_run((ferry_task_fn)client, &(struct cl){ &w, 0 }), -ECONNREFUSED);
    cr_assert_eq(w.t[0], 2 * LAT);
    world_free(&w);
}

/* ---- faults ------------------------------------------------------------- */

struct pair {
    struct world *w;
    ferry_stream *c, *s;  /* client's and server's ends */
    int rc;
};

static int connect_pair(void *arg)
{
    struct pair *p = arg;
    int rc = ferry_sim_connect(p->w->sim, p->w->cli[0], p->w->srv, 7, &p->c);

    if (!rc)
        rc = ferry_sim_accept(p->w->l, &p->s);
    return rc;
}

static void pair_init(struct pair *p, struct world *w, int64_t stall)
{
    world_init(w, 7, &(ferry_sim_opts){ .latency = LAT, .stall = stall }, 2);
    memset(p, 0, sizeof *p);
    p->w = w;
    cr_assert_eq(tu_run(connect_pair, p), 0);
}

static void pair_free(struct pair *p)
{
    ferry_stream_close(p->c);
    ferry_stream_close(p->s);
    world_free(p->w);
}

/* Partition the pair, write "ping\n" from the client, heal after `heal`
 * (0: never); the server reads a line.  Records when it came. */
struct part {
    struct pair *p;
    int64_t heal;
    int64_t t;       /* when the server's read returned */
    int wrc, rrc, rrc2;
    char line[16];
};

static int healer(void *arg)
{
    struct part *x = arg;

    ferry_sleep(x->heal);
    ferry_sim_heal(x->p->w->sim);
    return 0;
}

static int partitioned_write(void *arg)
{
    struct part *x = arg;
    struct world *w = x->p->w;
    int64_t t0 = ferry_now();
    ferry_task *h = NULL;
    size_t n = 0;

    ferry_sim_partition(w->sim, &w->cli[0], 1, &w->srv, 1);
    if (x->heal)
        ferry_task_spawn(&h, NULL, healer, x, NULL);
    x->wrc = ferry_stream_write(x->p->c, "ping\n", 5, NULL);
    x->rrc = ferry_stream_read_until(x->p->s, "\n", 1, x->line, sizeof x->line - 1, &n);
    x->line[n] = '\0';
    x->t = ferry_now() - t0;
    x->rrc2 = ferry_stream_write(x->p->c, "more\n", 5, NULL);
    if (h)
        ferry_task_join(h, NULL);
    else
        ferry_sim_heal(w->sim);
    return 0;
}

T(sim, partition_holds_bytes_until_healed)
{
    struct world w;
    struct pair p;
    struct part x = { .p = &p, .heal = FERRY_SEC(3) };

    pair_init(&p, &w, FERRY_SEC(10));
    cr_assert_eq(tu_run(partitioned_write, &x), 0);
    cr_assert_eq(x.wrc, 0);
    cr_assert_eq(x.rrc, 0, "read: %d", x.rrc);
    cr_assert_str_eq(x.line, "ping\n");
    /* Held from its arrival at the cut until the heal, then one latency. */
    cr_assert_eq(x.t, FERRY_SEC(3) + LAT, "came after %lld ns", (long long)x.t);
    cr_assert_eq(x.rrc2, 0);
    pair_free(&p);
}

T(sim, partition_resets_after_stall)
{
    struct world w;
    struct pair p;
    struct part x = { .p = &p, .heal = 0 };

    pair_init(&p, &w, FERRY_SEC(2));
    cr_assert_eq(tu_run(partitioned_write, &x), 0);
    cr_assert_eq(x.wrc, 0);
    cr_assert_eq(x.rrc, -ECONNRESET, "read: %d", x.rrc);
    cr_assert_eq(x.t, FERRY_SEC(2), "reset after %lld ns", (long long)x.t);
    cr_assert_eq(x.rrc2, -ECONNRESET);
    cr_assert_str_eq(ferry_sim_trace(w.sim, NULL), "5000000 c1 client0>server deliver syn 7\n"
                                                   "10000000 c1 server>client0 deliver synack 0\n"
                                                   "10000000 partition\n"
                                                   "15000000 c1 client0>server held data 5\n"
                                                   "2010000000 c1 server reset stall\n"
                                                   "2010000000 heal\n"
                                                   "2015000000 c1 client0>server drop data 5\n");
    pair_free(&p);
}

static int connect_across(void *arg)
{
    struct world *w = arg;

    ferry_sim_partition(w->sim, &w->cli[0], 1, &w->srv, 1);
    return client_n(w, 0);
}

T(sim, connect_across_partition_times_out)
{
    struct world w;

    world_init(&w, 3, &(ferry_sim_opts){ .latency = LAT, .stall = FERRY_SEC(5) }, 1);
    cr_assert_eq(tu_run(connect_across, &w), -ETIMEDOUT);
    cr_assert_eq(w.t[0], FERRY_SEC(5));
    world_free(&w);
}

/* The server shuts its direction down: the client reads the end. */
static int half_close(void *arg)
{
    struct pair *p = arg;
    char buf[8];
    size_t n;
    int rc = ferry_stream_shutdown(p->s);

    if (!rc)
        rc = ferry_stream_read(p->c, buf, sizeof buf, &n);
    if (!rc && n != 0)
        rc = -EPROTO;
    if (!rc)
        rc = ferry_stream_write(p->s, "x", 1, NULL) == -EPIPE ? 0 : -EPROTO;
    return rc;
}

T(sim, shutdown_reaches_the_peer_as_the_end)
{
    struct world w;
    struct pair p;

    pair_init(&p, &w, 0);
    cr_assert_eq(tu_run(half_close, &p), 0);
    pair_free(&p);
}

/* A task reads each end; the test's fault wakes both. */
static int read_end(void *arg)
{
    char buf[8];
    size_t n;

    return ferry_stream_read(arg, buf, sizeof buf, &n);
}

struct fault {
    struct pair *p;
    int crash;        /* crash the client's host instead of a reset */
    int rc[2];
    int again;        /* a connect after the crash, then after a restart */
    int after;
    int relisten;     /* listening again on the crashed listener's port */
    int fresh;        /* a connect to that new listener */
    int old_accept;   /* an accept on the crashed listener */
};

static int fault_main(void *arg)
{
    struct fault *f = arg;
    struct world *w = f->p->w;
    ferry_task *t[2];
    ferry_stream *s;

    ferry_task_spawn(&t[0], NULL, read_end, f->p->c, NULL);
    ferry_task_spawn(&t[1], NULL, read_end, f->p->s, NULL);
    ferry_sleep(FERRY_SEC(1));
    if (f->crash)
        ferry_sim_crash(w->sim, w->srv);
    else
        ferry_sim_reset(f->p->c);
    ferry_task_join(t[0], &f->rc[0]);
    ferry_task_join(t[1], &f->rc[1]);
    if (f->crash) {
        ferry_sim_listener *l2;

        f->again = ferry_sim_connect(w->sim, w->cli[0], w->srv, 7, &s);
        ferry_sim_restart(w->sim, w->srv);
        /* The crash took the listener down: its port is free, and only a
         * new listener takes connections on it. */
        f->after = ferry_sim_connect(w->sim, w->cli[0], w->srv, 7, &s);
        if (!f->after)
            ferry_stream_close(s);
        f->old_accept = ferry_sim_accept(w->l, &s);
        f->relisten = ferry_sim_listen(w->sim, w->srv, 7, &l2);
        if (!f->relisten) {
            f->fresh = ferry_sim_connect(w->sim, w->cli[0], w->srv, 7, &s);
            if (!f->fresh)
                ferry_stream_close(s);
            ferry_sim_listener_close(l2);
        }
    }
    return 0;
}

T(sim, reset_on_command_reaches_both_ends)
{
    struct world w;
    struct pair p;
    struct fault f = { .p = &p };

    pair_init(&p, &w, 0);
    cr_assert_eq(tu_run(fault_main, &f), 0);
    cr_assert_eq(f.rc[0], -ECONNRESET);
    cr_assert_eq(f.rc[1], -ECONNRESET);
    cr_assert_eq(ferry_sim_reset(NULL), -EINVAL);
    pair_free(&p);
}

T(sim, crashed_host_resets_and_refuses_until_restart)
{
    struct world w;
    struct pair p;
    struct fault f = { .p = &p, .crash = 1 };

    pair_init(&p, &w, 0);
    cr_assert_eq(tu_run(fault_main, &f), 0);
    cr_assert_eq(f.rc[0], -ECONNRESET);
    cr_assert_eq(f.rc[1], -ECONNRESET);
    cr_assert_eq(f.again, -ECONNREFUSED);
    cr_assert_eq(f.after, -ECONNREFUSED);
    cr_assert_eq(f.old_accept, -EBADF);
    cr_assert_eq(f.relisten, 0);
    cr_assert_eq(f.fresh, 0);
    pair_free(&p);
}

static int accept_closed(void *arg)
{
    struct world *w = arg;
    ferry_task *t;
    int rc;

    ferry_task_spawn(&t, NULL, server, w, NULL);
    ferry_sleep(FERRY_SEC(1));
    ferry_sim_listener_close(w->l);
    ferry_task_join(t, &rc);
    return rc;
}

T(sim, closed_listener_wakes_accept)
{
    struct world w;

    world_init(&w, 1, NULL, 1);
    cr_assert_eq(tu_run(accept_closed, &w), -EBADF);
    world_free(&w);
}

T(sim, argument_checks)
{
    ferry_sim *sim;
    ferry_sim_host *a, *b;
    ferry_sim_listener *l, *l2;
    ferry_stream *s = NULL;
    size_t len = 1;
    int fds[2];

    cr_assert_eq(ferry_sim_new(NULL, tu_loop, 1, NULL), -EINVAL);
    cr_assert_eq(ferry_sim_new(&sim, tu_loop, 1, &(ferry_sim_opts){ .jitter = -1 }), -EINVAL);
    cr_assert_eq(ferry_sim_new(&sim, tu_loop, 1, NULL), 0);
    cr_assert_eq(ferry_sim_find_host(sim, "", &a), -EINVAL);
    cr_assert_eq(ferry_sim_find_host(sim, "a", &a), 0);
    cr_assert_eq(ferry_sim_find_host(sim, "a", &b), 0);
    cr_assert_eq(a, b);
    cr_assert_eq(ferry_sim_find_host(sim, "b", &b), 0);
    cr_assert_eq(ferry_sim_link(sim, a, b, 0, 0), -EINVAL);
    cr_assert_eq(ferry_sim_link(sim, a, b, LAT, 0), 0);
    cr_assert_eq(ferry_sim_link(sim, b, a, 2 * LAT, 0), 0);
    cr_assert_eq(ferry_sim_listen(sim, a, 0, &l), -EINVAL);
    cr_assert_eq(ferry_sim_listen(sim, a, 80, &l), 0);
    cr_assert_eq(ferry_sim_listen(sim, a, 80, &l2), -EADDRINUSE);
    cr_assert_eq(ferry_sim_partition(sim, &a, 1, &a, 1), -EINVAL);
    cr_assert_eq(ferry_sim_accept(NULL, NULL), -EINVAL);
    cr_assert_eq(ferry_sim_connect(sim, a, b, 80, NULL), -EINVAL);
    /* Outside a task, the calls that suspend refuse. */
    cr_assert_eq(ferry_sim_accept(l, &s), -EPERM);
    cr_assert_null(s);
    cr_assert_eq(ferry_sim_connect(sim, a, b, 80, &s), -EPERM);
    cr_assert_eq(ferry_sim_connect(NULL, a, b, 80, &s), -EINVAL);
    cr_assert_eq(ferry_sim_connect(sim, a, b, 70000, &s), -EINVAL);
    cr_assert_eq(ferry_sim_find_host(sim, "a", NULL), -EINVAL);
    cr_assert_eq(ferry_sim_find_host(NULL, "a", &a), -EINVAL);
    cr_assert_eq(ferry_sim_listen(sim, a, 81, NULL), -EINVAL);
    cr_assert_eq(ferry_sim_listen(NULL, a, 81, &l2), -EINVAL);
    cr_assert_eq(ferry_sim_link(NULL, a, b, LAT, 0), -EINVAL);
    cr_assert_eq(ferry_sim_partition(NULL, &a, 1, &b, 1), -EINVAL);
    cr_assert_eq(ferry_sim_partition(sim, NULL, 1, &b, 1), -EINVAL);
    cr_assert_eq(ferry_sim_partition(sim, (ferry_sim_host *[]){ NULL }, 1, NULL, 0), -EINVAL);
    cr_assert_eq(ferry_sim_partition(sim, NULL, 0, (ferry_sim_host *[]){ NULL }, 1), -EINVAL);
    cr_assert_null(ferry_sim_trace(NULL, &len));
    cr_assert_eq(len, 0);
    cr_assert_not_null(ferry_sim_trace(sim, NULL));
    /* A stream that is not simulated cannot be reset by the simulation. */
    cr_assert_eq(pipe(fds), 0);
    cr_assert_eq(ferry_stream_open(&s, tu_loop, fds[0], NULL), 0);
    cr_assert_eq(ferry_sim_reset(s), -EINVAL);
    cr_assert_eq(ferry_stream_close(s), 0);
    close(fds[1]);
    /* The calls that cannot fail ignore NULL. */
    ferry_sim_listener_close(NULL);
    ferry_sim_crash(NULL, a);
    ferry_sim_restart(sim, NULL);
    ferry_sim_heal(NULL);
    ferry_sim_heal(sim); /* no partition: nothing to do */
    ferry_sim_free(NULL);
    ferry_sim_free(sim); /* frees the listener too */
}

/* Ten writes in a row over a link whose jitter is larger than the time
 * between them: they still arrive in the order written. */
static int burst(void *arg)
{
    struct pair *p = arg;
    char buf[16];
    size_t got = 0;
    int rc = 0;

    for (int i = 0; i < 10 && !rc; i++)
        rc = ferry_stream_write(p->c, &"0123456789"[i], 1, NULL);
    if (!rc)
        rc = ferry_stream_read_exactly(p->s, buf, 10, &got);
    if (!rc && memcmp(buf, "0123456789", 10) != 0)
        rc = -EPROTO;
    return rc;
}

T(sim, one_direction_keeps_its_order_under_jitter)
{
    struct world w;
    struct pair p = { .w = &w };

    world_init(&w, 11, &(ferry_sim_opts){ .latency = LAT, .jitter = FERRY_MSEC(50) }, 1);
    cr_assert_eq(tu_run(connect_pair, &p), 0);
    cr_assert_eq(tu_run(burst, &p), 0);
    pair_free(&p);
}

/* Once a partition has lasted the stall time, bytes that reach it reset
 * their connection at once. */
static int write_after_stall(void *arg)
{
    struct pair *p = arg;
    struct world *w = p->w;
    char b;
    size_t n;

    ferry_sim_partition(w->sim, &w->cli[0], 1, &w->srv, 1);
    ferry_sleep(FERRY_SEC(5));
    p->rc = ferry_stream_write(p->c, "x", 1, NULL);
    return ferry_stream_read(p->s, &b, 1, &n);
}

T(sim, bytes_after_the_stall_reset_at_once)
{
    struct world w;
    struct pair p;
    int64_t t0;

    pair_init(&p, &w, FERRY_SEC(2));
    t0 = ferry_now();
    cr_assert_eq(tu_run(write_after_stall, &p), -ECONNRESET);
    cr_assert_eq(p.rc, 0);
    cr_assert_eq(ferry_now() - t0, FERRY_SEC(5) + LAT);
    pair_free(&p);
}

/* A connect cancelled while its SYN is held by a partition takes the
 * server's end down with it: nothing reaches the listener. */
static int connect_task(void *arg)
{
    struct world *w = arg;
    ferry_stream *s = NULL;
    int rc = ferry_sim_connect(w->sim, w->cli[1], w->srv, 7, &s);

    w->rc[1] = rc;
    if (!rc)
        ferry_stream_close(s);
    return rc;
}

/* Leave the simulation with a connection open on both ends, one not yet
 * accepted, a connect given up and a partition in place. */
static int leave_everything(void *arg)
{
    struct pair *p = arg;
    struct world *w = p->w;
    ferry_stream *pending = NULL;
    ferry_task *t;
    char b;
    size_t n;

    p->rc = ferry_sim_connect(w->sim, w->cli[0], w->srv, 7, &pending);
    ferry_sim_partition(w->sim, &w->cli[1], 1, &w->srv, 1);
    ferry_task_spawn(&t, NULL, connect_task, w, NULL);
    ferry_sleep(FERRY_SEC(1));
    ferry_task_cancel(t);
    ferry_task_join(t, NULL);
    ferry_sim_listener_close(w->l);
    w->rc[2] = pending ? ferry_stream_read(pending, &b, 1, &n) : -1;
    if (pending)
        ferry_stream_close(pending);
    return 0;
}

/* After the simulation is gone: the client's end reads a reset, the
 * server's end cannot write. */
static int after_free(void *arg)
{
    struct pair *p = arg;
    int rc = read_end(p->c);

    if (rc != -ECONNRESET)
        return rc ? rc : -EPROTO;
    rc = ferry_stream_write(p->s, "x", 1, NULL);
    return rc == -ECONNRESET ? 0 : rc ? rc : -EPROTO;
}

T(sim, free_with_connections_in_every_state)
{
    struct world w;
    struct pair p;

    pair_init(&p, &w, FERRY_SEC(10));
    cr_assert_eq(tu_run(leave_everything, &p), 0);
    cr_assert_eq(p.rc, 0);
    cr_assert_eq(w.rc[1], -ECANCELED, "connect: %d", w.rc[1]);
    cr_assert_eq(w.rc[2], -ECONNRESET, "unaccepted: %d", w.rc[2]);
    ferry_sim_free(w.sim);
    cr_assert_eq(tu_run(after_free, &p), 0);
    ferry_stream_close(p.c);
    ferry_stream_close(p.s);
}

/* ---- random faults ------------------------------------------------------ */

/* Client i pings 50 times, 100 ms apart, connecting again after each
 * reset; counts the resets in w->rc[i]. */
static int pinger(void *arg)
{
    struct cl *c = arg;
    struct world *w = c->w;
    ferry_stream *s = NULL;
    char line[16];
    size_t n;
    int done = 0, rc;

    while (done < 50) {
        if (!s && ferry_sim_connect(w->sim, w->cli[c->i], w->srv, 7, &s) != 0) {
            s = NULL;
            w->rc[c->i]++;
            continue;
        }
        rc = ferry_stream_write(s, "ping\n", 5, NULL);
        if (!rc)
            rc = ferry_stream_read_until(s, "\n", 1, line, sizeof line, &n);
        if (rc) {
            ferry_stream_close(s);
            s = NULL;
            w->rc[c->i]++;
            continue;
        }
        done++;
        ferry_sleep(FERRY_MSEC(100));
    }
    ferry_stream_close(s);
    return 0;
}

static int chaos_main(void *arg)
{
    struct world *w = arg;
    struct cl cl[2] = { { w, 0 }, { w, 1 } };
    ferry_task *srv, *c[2];

    ferry_task_spawn(&srv, NULL, server, w, NULL);
    for (int i = 0; i < 2; i++)
        ferry_task_spawn(&c[i], NULL, pinger, &cl[i], NULL);
    for (int i = 0; i < 2; i++)
        ferry_task_join(c[i], NULL);
    ferry_sim_listener_close(w->l);
    ferry_task_join(srv, NULL);
    return 0;
}

/* The trace of two pingers under random resets; *resets gets how many
 * the clients saw.  The caller frees the trace. */
static char *chaos_trace(uint64_t seed, int *resets)
{
    struct world w;
    char *copy;

    world_init(&w, seed, &(ferry_sim_opts){ .latency = LAT, .reset_every = FERRY_SEC(1) }, 2);
    cr_assert_eq(tu_run(chaos_main, &w), 0);
    *resets = w.rc[0] + w.rc[1];
    copy = strdup(ferry_sim_trace(w.sim, NULL));
    world_free(&w);
    return copy;
}

T(sim, random_resets_replay_by_seed)
{
    int ra, rb, rc;
    char *a = chaos_trace(5, &ra), *b = chaos_trace(5, &rb), *c = chaos_trace(6, &rc);

    /* Ten seconds of pings with a reset every second on average. */
    cr_assert_geq(ra, 2, "%d resets:\n%s", ra, a);
    cr_assert_not_null(strstr(a, "reset random"));
    cr_assert_eq(ra, rb);
    cr_assert_str_eq(a, b);
    cr_assert_str_neq(a, c);
    free(a);
    free(b);
    free(c);
}
