/* test_sim_hosts.c - the tasks of simulated hosts (ferry/sim.h): a line
 * service written only with ferry_tcp_listen(), ferry_listener_accept()
 * and the stream calls, and a client with ferry_tcp_connect() by name,
 * both as host tasks on the virtual clock; the tasks they spawn belong to
 * their host; ferry_getaddrinfo() answered with the hosts' names and
 * addresses; port 0 picking free ports; a task that is not a host's on
 * the same loop still on real TCP; a service host crashed mid-request and
 * restarted by its boot task; seed 0 read from the environment and
 * logged; a pool job holding the virtual clock; argument checks.
 *
 * No cr_assert inside task bodies: tasks record what they saw into
 * variables, and the test asserts on the main stack after tu_run().
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <criterion/criterion.h>

#include "testutil.h"
#include "ferry/bridge.h"
#include "ferry/net.h"
#include "ferry/resolve.h"
#include "ferry/sim.h"

#define T(suite, name) \
    Test(suite, name, .init = tu_vclock_setup, .fini = tu_loop_teardown, .timeout = 20.)

#define LAT FERRY_MSEC(5)

/* ---- a line service on the ordinary calls ---------------------------------- */

/* What the scenario sets up and what its tasks saw. */
struct net {
    ferry_sim *sim;
    ferry_sim_host *srv, *cli;
    ferry_listener *l;      /* the service's listener */
    int listen_rc;          /* ferry_tcp_listen() in the service */
    int port;               /* ferry_listener_port() */
    int lfd;                /* ferry_listener_fd() */
    int accept_rc;          /* the accept loop's last result */
    int served;             /* connections taken */
    bool conn_on_srv;       /* a connection task found itself on the server host */
    char peer[32];          /* the peer address accept reported */
    int client_rc;          /* the client's result */
    int cfd;                /* ferry_stream_fd() of the client's stream */
    bool client_on_cli;     /* the client found itself on its host */
    char got[64];           /* the line read back */
    int64_t took;           /* the client's time, connect to answer */
    ferry_sim_host *main_h; /* ferry_sim_current_host() in the test's task */
};

/* One connection of the service: records whose host it is on, then
 * echoes. */
struct conn {
    struct net *n;
    ferry_stream *s;
};

static int conn_task(void *arg)
{
    struct conn *c = arg;
    ferry_stream *s = c->s;

    c->n->conn_on_srv = ferry_sim_current_host() == c->n->srv;
    c->s = NULL;
    return tu_echo_lines(s);
}

/* The service: the code a real one runs on TCP. */
static int service(void *arg)
{
    struct net *n = arg;
    struct sockaddr_storage peer;
    struct conn c = { n, NULL };
    ferry_stream *s;
    ferry_task *t;

    n->listen_rc = ferry_tcp_listen(&n->l, NULL, "0.0.0.0", 7, NULL);
    if (n->listen_rc)
        return n->listen_rc;
    n->port = ferry_listener_port(n->l);
    n->lfd = ferry_listener_fd(n->l);
    while ((n->accept_rc = ferry_listener_accept(n->l, &s, &peer)) == 0) {
        n->served++;
        inet_ntop(AF_INET, &((struct sockaddr_in *)&peer)->sin_addr, n->peer, sizeof n->peer);
        c.s = s;
        if (ferry_task_spawn(&t, NULL, conn_task, &c, NULL) != 0) {
            ferry_stream_close(s);
            continue;
        }
        ferry_task_join(t, NULL);
    }
    ferry_listener_close(n->l);
    return n->accept_rc;
}

static int line_client(void *arg)
{
    struct net *n = arg;
    int64_t start = ferry_now();
    ferry_stream *s;
    size_t len;
    int rc;

    n->client_on_cli = ferry_sim_current_host() == n->cli;
    rc = ferry_tcp_connect(&s, "server", 7, NULL);
    if (rc)
        goto out;
    n->cfd = ferry_stream_fd(s);
    rc = ferry_stream_write(s, "hello\n", 6, NULL);
    if (!rc)
        rc = ferry_stream_read_until(s, "\n", 1, n->got, sizeof n->got - 1, &len);
    if (!rc)
        n->got[len] = '\0';
    ferry_stream_close(s);
out:
    n->took = ferry_now() - start;
    n->client_rc = rc;
    return rc;
}

static void net_init(struct net *n, const ferry_sim_opts *opts)
{
    memset(n, 0, sizeof *n);
    cr_assert_eq(ferry_sim_new(&n->sim, tu_loop, 1, opts), 0);
    cr_assert_eq(ferry_sim_find_host(n->sim, "server", &n->srv), 0);
    cr_assert_eq(ferry_sim_find_host(n->sim, "client", &n->cli), 0);
}

static int service_main(void *arg)
{
    struct net *n = arg;
    ferry_task *srv, *cli;

    n->main_h = ferry_sim_current_host();
    if (ferry_sim_spawn(n->srv, &srv, service, n) != 0)
        return -1;
    if (ferry_sim_spawn(n->cli, &cli, line_client, n) != 0) {
        ferry_task_cancel(srv);
        ferry_task_join(srv, NULL);
        return -1;
    }
    ferry_task_join(cli, NULL);
    ferry_task_cancel(srv);
    ferry_task_join(srv, NULL);
    return 0;
}

T(sim_hosts, line_service_on_the_ordinary_calls)
{
    struct net n;
    const char *trace;

    net_init(&n, &(ferry_sim_opts){ .latency = LAT });
    cr_assert_eq(tu_run(service_main, &n), 0);
    cr_assert_eq(n.listen_rc, 0);
    cr_assert_eq(n.port, 7);
    cr_assert_eq(n.lfd, -ENOTSOCK);
    cr_assert_eq(n.client_rc, 0, "client: %d", n.client_rc);
    cr_assert_str_eq(n.got, "hello\n");
    cr_assert_eq(n.cfd, -ENOTSOCK);
    cr_assert(n.client_on_cli);
    cr_assert(n.conn_on_srv, "a task the service spawned belongs to its host");
    cr_assert_null(n.main_h);
    cr_assert_eq(n.served, 1);
    cr_assert_str_eq(n.peer, "10.0.0.2");
    /* Simulated: one round trip to connect, one for the line, on the
     * virtual clock. */
    cr_assert_eq(n.took, 4 * LAT, "took %lld ns", (long long)n.took);
    cr_assert_eq(n.accept_rc, -ECANCELED, "accept: %d", n.accept_rc);
    trace = ferry_sim_trace(n.sim, NULL);
    cr_assert_not_null(strstr(trace, "client>server deliver syn 7"), "%s", trace);
    ferry_sim_free(n.sim);
}

/* ---- names ------------------------------------------------------------------ */

struct names {
    struct net *n;
    int rc_name, rc_addr, rc_unknown, rc_real, rc_v6, rc_connect;
    char addr_name[32], addr_addr[32];
    int port;
};

static void first_addr(const struct addrinfo *ai, char *buf, size_t len, int *port)
{
    const struct sockaddr_in *sin = (const struct sockaddr_in *)(const void *)ai->ai_addr;

    inet_ntop(AF_INET, &sin->sin_addr, buf, (socklen_t)len);
    if (port)
        *port = ntohs(sin->sin_port);
}

static int lookups(void *arg)
{
    struct names *m = arg;
    struct addrinfo hints, *ai;
    ferry_stream *s;

    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    m->rc_name = ferry_getaddrinfo("server", "7", &hints, &ai);
    if (!m->rc_name) {
        first_addr(ai, m->addr_name, sizeof m->addr_name, &m->port);
        ferry_freeaddrinfo(ai);
    }
    m->rc_addr = ferry_getaddrinfo("10.0.0.2", "80", &hints, &ai);
    if (!m->rc_addr) {
        first_addr(ai, m->addr_addr, sizeof m->addr_addr, NULL);
        ferry_freeaddrinfo(ai);
    }
    m->rc_unknown = ferry_getaddrinfo("nosuch", "80", &hints, &ai);
    m->rc_real = ferry_getaddrinfo("127.0.0.1", "80", &hints, &ai);
    hints.ai_family = AF_INET6;
    m->rc_v6 = ferry_getaddrinfo("server", "80", &hints, &ai);
    m->rc_connect = ferry_tcp_connect(&s, "nosuch", 80, NULL);
    return 0;
}

static int names_main(void *arg)
{
    struct names *m = arg;
    ferry_task *t;
    int rc = ferry_sim_spawn(m->n->cli, &t, lookups, m);

    if (!rc)
        rc = ferry_task_join(t, NULL);
    return rc;
}

T(sim_hosts, getaddrinfo_answers_the_hosts)
{
    struct net n;
    struct names m = { .n = &n };

    net_init(&n, NULL);
    cr_assert_eq(tu_run(names_main, &m), 0);
    cr_assert_eq(m.rc_name, 0);
    cr_assert_str_eq(m.addr_name, "10.0.0.1");
    cr_assert_eq(m.port, 7);
    cr_assert_eq(m.rc_addr, 0);
    cr_assert_str_eq(m.addr_addr, "10.0.0.2");
    cr_assert_eq(m.rc_unknown, FERRY_EAI_NONAME);
    cr_assert_eq(m.rc_real, FERRY_EAI_NONAME, "a host task does not reach the real network");
    cr_assert_eq(m.rc_v6, FERRY_EAI_NODATA);
    cr_assert_eq(m.rc_connect, FERRY_EAI_NONAME);
    ferry_sim_free(n.sim);
}

/* ---- ports -------------------------------------------------------------------- */

struct ports {
    struct net *n;
    int p1, p2, busy, closed_port, fd_closed;
};

static int listen_twice(void *arg)
{
    struct ports *p = arg;
    ferry_listener *a, *b, *c;

    if (ferry_tcp_listen(&a, NULL, NULL, 0, NULL) != 0)
        return -1;
    if (ferry_tcp_listen(&b, NULL, "::", 0, NULL) != 0) {
        ferry_listener_close(a);
        return -1;
    }
    p->p1 = ferry_listener_port(a);
    p->p2 = ferry_listener_port(b);
    p->busy = ferry_tcp_listen(&c, NULL, NULL, p->p1, NULL);
    ferry_listener_close(a);
    /* The port is free again once its listener is closed. */
    if (ferry_tcp_listen(&c, NULL, NULL, p->p1, NULL) == 0)
        ferry_listener_close(c);
    else
        p->closed_port = -1;
    ferry_listener_close(b);
    return 0;
}

static int ports_main(void *arg)
{
    struct ports *p = arg;
    ferry_task *t;
    int rc = ferry_sim_spawn(p->n->srv, &t, listen_twice, p);
    int st = -1;

    if (!rc)
        rc = ferry_task_join(t, &st);
    return rc ? rc : st;
}

T(sim_hosts, listen_on_port_zero_picks_free_ports)
{
    struct net n;
    struct ports p = { .n = &n };

    net_init(&n, NULL);
    cr_assert_eq(tu_run(ports_main, &p), 0);
    cr_assert_geq(p.p1, 32768);
    cr_assert_geq(p.p2, 32768);
    cr_assert_neq(p.p1, p.p2);
    cr_assert_eq(p.busy, -EADDRINUSE);
    cr_assert_eq(p.closed_port, 0);
    ferry_sim_free(n.sim);
}

/* ---- a task that is not a host's ------------------------------------------------- */

struct real {
    int lfd, sfd, rc;
};

static int real_accept(void *arg)
{
    ferry_listener *l = arg;
    ferry_stream *s;
    int rc = ferry_listener_accept(l, &s, NULL);

    if (!rc)
        ferry_stream_close(s);
    return rc;
}

static int real_main(void *arg)
{
    struct real *r = arg;
    ferry_listener *l;
    ferry_stream *s;
    ferry_task *t;

    r->rc = ferry_tcp_listen(&l, NULL, "127.0.0.1", 0, NULL);
    if (r->rc)
        return 0;
    r->lfd = ferry_listener_fd(l);
    ferry_task_spawn(&t, NULL, real_accept, l, NULL);
    r->rc = ferry_tcp_connect(&s, "127.0.0.1", ferry_listener_port(l), NULL);
    if (!r->rc) {
        r->sfd = ferry_stream_fd(s);
        ferry_stream_close(s);
    }
    ferry_task_join(t, NULL);
    ferry_listener_close(l);
    return 0;
}

Test(sim_hosts, other_tasks_keep_real_tcp, .init = tu_loop_setup, .fini = tu_loop_teardown,
     .timeout = 20.)
{
    struct real r = { -1, -1, -1 };
    ferry_sim *sim;
    ferry_sim_host *h;

    cr_assert_eq(ferry_sim_new(&sim, tu_loop, 1, NULL), 0);
    cr_assert_eq(ferry_sim_find_host(sim, "127.0.0.1", &h), 0);
    cr_assert_eq(tu_run(real_main, &r), 0);
    cr_assert_eq(r.rc, 0);
    cr_assert_geq(r.lfd, 0, "a real listener has a descriptor");
    cr_assert_geq(r.sfd, 0, "a real stream has a descriptor");
    cr_assert_str_eq(ferry_sim_trace(sim, NULL), "", "nothing went through the simulation");
    ferry_sim_free(sim);
}

/* ---- argument checks ------------------------------------------------------------ */

static int boot_nothing(void *arg)
{
    (void)arg;
    return 0;
}

T(sim_hosts, argument_checks)
{
    ferry_sim *sim, *other;
    ferry_sim_host *h;
    ferry_task *t = (ferry_task *)&t;

    cr_assert_eq(ferry_sim_new(&sim, tu_loop, 1, NULL), 0);
    cr_assert_eq(ferry_sim_new(&other, tu_loop, 1, NULL), -EBUSY, "one simulation a loop");
    cr_assert_eq(ferry_sim_find_host(sim, "a", &h), 0);
    cr_assert_str_eq(ferry_sim_host_name(h), "a");
    cr_assert_eq(ferry_sim_spawn(NULL, &t, boot_nothing, NULL), -EINVAL);
    cr_assert_null(t);
    cr_assert_eq(ferry_sim_spawn(h, NULL, NULL, NULL), -EINVAL);
    cr_assert_eq(ferry_sim_boot(NULL, boot_nothing, NULL), -EINVAL);
    cr_assert_eq(ferry_sim_boot(h, boot_nothing, NULL), 0);
    cr_assert_eq(ferry_sim_boot(h, boot_nothing, NULL), -EBUSY);
    cr_assert_null(ferry_sim_current_host());
    cr_assert_eq(ferry_sim_seed(sim), 1);
    cr_assert_eq(ferry_sim_seed(NULL), 0);
    cr_assert_null(ferry_sim_host_name(NULL));
    /* A restart of a host that is up, and a second crash, change nothing. */
    ferry_sim_restart(sim, h);
    ferry_sim_crash(sim, h);
    ferry_sim_crash(sim, h);
    cr_assert_eq(ferry_sim_spawn(h, NULL, boot_nothing, NULL), -EHOSTDOWN);
    ferry_sim_restart(sim, h);
    cr_assert_eq(ferry_sim_spawn(h, NULL, boot_nothing, NULL), 0);
    cr_assert_eq(ferry_loop_run(tu_loop, 0), 0);
    ferry_sim_free(sim);
}

/* ---- crash and restart ----------------------------------------------------------- */

/* What the crashed service's tasks saw. */
struct crash {
    struct net *n;
    int boots;          /* times the boot task ran */
    int accept_rc[2];   /* each boot's accept loop's end */
    int work_rc;        /* the last request's work */
    int cancelled;      /* requests whose work was cancelled */
    int served;         /* requests answered */
    int read_rc;        /* the client's read across the crash */
    int down_spawn;     /* ferry_sim_spawn() on the crashed host */
    int down_connect;   /* a connect to the crashed host */
    int again_rc;       /* a request after the restart */
    char again[16];     /* its answer */
};

static struct crash *g_crash;

/* A request takes 100 ms of work, then its answer. */
static int slow_conn(void *arg)
{
    ferry_stream *s = arg;
    char line[64];
    size_t len;
    int rc;

    while ((rc = ferry_stream_read_until(s, "\n", 1, line, sizeof line, &len)) == 0) {
        rc = ferry_sleep(FERRY_MSEC(100));
        g_crash->work_rc = rc;
        g_crash->cancelled += rc == -ECANCELED;
        if (rc)
            break;
        rc = ferry_stream_write(s, line, len, NULL);
        if (rc)
            break;
        g_crash->served++;
    }
    ferry_stream_close(s);
    return rc;
}

/* The boot task: listen on port 7, serve each connection in a task of
 * its own. */
static int slow_service(void *arg)
{
    struct crash *c = arg;
    int boot = c->boots++;
    ferry_listener *l;
    ferry_stream *s;
    int rc;

    rc = ferry_tcp_listen(&l, NULL, NULL, 7, NULL);
    if (rc)
        return rc;
    while ((rc = ferry_listener_accept(l, &s, NULL)) == 0)
        if (ferry_task_spawn(NULL, NULL, slow_conn, s, NULL) != 0)
            ferry_stream_close(s);
    if (boot < 2)
        c->accept_rc[boot] = rc;
    ferry_listener_close(l);
    return rc;
}

static int ask(const char *q, char *answer, size_t cap)
{
    ferry_stream *s;
    size_t len;
    int rc = ferry_tcp_connect(&s, "server", 7, NULL);

    if (rc)
        return rc;
    rc = ferry_stream_write(s, q, strlen(q), NULL);
    if (!rc)
        rc = ferry_stream_read_until(s, "\n", 1, answer, cap - 1, &len);
    if (!rc)
        answer[len] = '\0';
    ferry_stream_close(s);
    return rc;
}

static int crash_client(void *arg)
{
    struct crash *c = arg;
    char buf[16];

    c->read_rc = ask("a\n", buf, sizeof buf);
    return 0;
}

static int crash_client_again(void *arg)
{
    struct crash *c = arg;
    ferry_stream *s;

    c->down_connect = ferry_tcp_connect(&s, "server", 7, NULL);
    if (!c->down_connect)
        ferry_stream_close(s);
    return 0;
}

static int crash_client_after(void *arg)
{
    struct crash *c = arg;

    c->again_rc = ask("b\n", c->again, sizeof c->again);
    return 0;
}

static int crash_main(void *arg)
{
    struct crash *c = arg;
    struct net *n = c->n;
    ferry_task *t;

    if (ferry_sim_boot(n->srv, slow_service, c) != 0)
        return -1;
    if (ferry_sim_spawn(n->cli, &t, crash_client, c) != 0)
        return -2;
    /* The request reaches the server at 3 latencies; its work lasts
     * 100 ms: crash in the middle. */
    ferry_sleep(FERRY_MSEC(50));
    ferry_sim_crash(n->sim, n->srv);
    ferry_task_join(t, NULL);
    c->down_spawn = ferry_sim_spawn(n->srv, NULL, crash_client, c);
    if (ferry_sim_spawn(n->cli, &t, crash_client_again, c) != 0)
        return -3;
    ferry_task_join(t, NULL);
    ferry_sim_restart(n->sim, n->srv);
    if (ferry_sim_spawn(n->cli, &t, crash_client_after, c) != 0)
        return -4;
    ferry_task_join(t, NULL);
    /* The end of the test: the service's tasks go as at a crash. */
    ferry_sim_crash(n->sim, n->srv);
    ferry_sleep(FERRY_MSEC(1));
    return 0;
}

T(sim_hosts, crashed_service_restarts_and_serves_again)
{
    struct net n;
    struct crash c = { .n = &n, .work_rc = 1 };

    g_crash = &c;
    net_init(&n, &(ferry_sim_opts){ .latency = LAT });
    cr_assert_eq(tu_run(crash_main, &c), 0);
    cr_assert_eq(c.cancelled, 1, "the request in progress saw -ECANCELED");
    cr_assert_eq(c.work_rc, 0, "the request after the restart was served: %d", c.work_rc);
    cr_assert_eq(c.accept_rc[0], -ECANCELED, "the first boot's accept: %d", c.accept_rc[0]);
    cr_assert_eq(c.read_rc, -ECONNRESET, "the client across the crash: %d", c.read_rc);
    cr_assert_eq(c.down_spawn, -EHOSTDOWN);
    cr_assert_eq(c.down_connect, -ECONNREFUSED);
    cr_assert_eq(c.boots, 2, "the boot task ran again at the restart");
    cr_assert_eq(c.again_rc, 0, "after the restart: %d", c.again_rc);
    cr_assert_str_eq(c.again, "b\n");
    cr_assert_eq(c.served, 1);
    cr_assert_eq(c.accept_rc[1], -ECANCELED);
    ferry_sim_free(n.sim);
}

/* ---- the seed from the environment -------------------------------------------------- */

static char g_log[512];

static void log_keep(int level, const char *msg, void *ctx)
{
    (void)ctx;
    (void)level;
    strncat(g_log, msg, sizeof g_log - strlen(g_log) - 2);
    strcat(g_log, "\n");
}

/* The seed a simulation made with seed 0 takes, and what it logged. */
static uint64_t seed_from_env(void)
{
    ferry_sim *sim;
    uint64_t seed;

    g_log[0] = '\0';
    cr_assert_eq(ferry_sim_new(&sim, tu_loop, 0, NULL), 0);
    seed = ferry_sim_seed(sim);
    ferry_sim_free(sim);
    return seed;
}

/* The trace of the line service with jitter, under seed `seed`. */
static char *jitter_trace(uint64_t seed)
{
    struct net n;
    const char *t;
    char *copy;

    memset(&n, 0, sizeof n);
    cr_assert_eq(ferry_sim_new(&n.sim, tu_loop, seed,
                               &(ferry_sim_opts){ .latency = LAT, .jitter = FERRY_MSEC(20) }),
                 0);
    cr_assert_eq(ferry_sim_find_host(n.sim, "server", &n.srv), 0);
    cr_assert_eq(ferry_sim_find_host(n.sim, "client", &n.cli), 0);
    cr_assert_eq(tu_run(service_main, &n), 0);
    cr_assert_eq(n.client_rc, 0);
    t = ferry_sim_trace(n.sim, NULL);
    cr_assert_not_null(t);
    copy = strdup(t);
    ferry_sim_free(n.sim);
    return copy;
}

T(sim_hosts, seed_zero_reads_the_environment)
{
    char *a, *b, *c;

    ferry_set_log(log_keep, NULL);
    unsetenv("FERRY_FUZZ");
    unsetenv("FERRY_SIM_SEED");
    cr_assert_eq(seed_from_env(), 1);
    cr_assert_not_null(strstr(g_log, "simulation seed 1 (FERRY_SIM_SEED=N"), "%s", g_log);
    setenv("FERRY_SIM_SEED", "1234", 1);
    cr_assert_eq(seed_from_env(), 1234);
    cr_assert_not_null(strstr(g_log, "FERRY_SIM_SEED=1234 replays"), "%s", g_log);
    /* FERRY_FUZZ wins: ferry-fuzz's one number replays both. */
    setenv("FERRY_FUZZ", "77,0.5", 1);
    cr_assert_eq(seed_from_env(), 77);
    cr_assert_not_null(strstr(g_log, "FERRY_FUZZ=77 replays"), "%s", g_log);
    unsetenv("FERRY_FUZZ");
    setenv("FERRY_SIM_SEED", "x1", 1);
    cr_assert_eq(seed_from_env(), 1);
    cr_assert_not_null(strstr(g_log, "FERRY_SIM_SEED=x1 ignored"), "%s", g_log);
    /* An explicit seed is used as it is, without a word. */
    setenv("FERRY_SIM_SEED", "1234", 1);
    g_log[0] = '\0';
    a = jitter_trace(1234);
    cr_assert_str_eq(g_log, "");
    b = jitter_trace(0);
    c = jitter_trace(99);
    cr_assert_str_eq(a, b, "FERRY_SIM_SEED=1234 replays seed 1234");
    cr_assert_str_neq(a, c);
    free(a);
    free(b);
    free(c);
    unsetenv("FERRY_SIM_SEED");
    ferry_set_log(NULL, NULL);
}

/* ---- more of the names, boot on a crashed host, the loop freed first ------------- */

struct names2 {
    int rc_mapped, rc_canon;
    char mapped[64], canon[32];
};

static int lookups2(void *arg)
{
    struct names2 *m = arg;
    struct addrinfo hints, *ai;

    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_INET6;
    hints.ai_flags = AI_V4MAPPED;
    hints.ai_socktype = SOCK_STREAM;
    m->rc_mapped = ferry_getaddrinfo("client", "80", &hints, &ai);
    if (!m->rc_mapped) {
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)(void *)ai->ai_addr)->sin6_addr, m->mapped,
                  sizeof m->mapped);
        ferry_freeaddrinfo(ai);
    }
    memset(&hints, 0, sizeof hints);
    hints.ai_flags = AI_CANONNAME;
    m->rc_canon = ferry_getaddrinfo("10.0.0.1", NULL, &hints, &ai);
    if (!m->rc_canon) {
        snprintf(m->canon, sizeof m->canon, "%s", ai->ai_canonname ? ai->ai_canonname : "");
        ferry_freeaddrinfo(ai);
    }
    return 0;
}

struct boot_count {
    struct net *n;
    struct names2 m;
    int runs;
    int sleep_rc;  /* a task of the crashed host, asleep at the crash */
    int listen_rc; /* its listen afterwards */
};

static int late_listen(void *arg)
{
    struct boot_count *b = arg;
    ferry_listener *l;

    b->sleep_rc = ferry_sleep(FERRY_SEC(1));
    b->listen_rc = ferry_tcp_listen(&l, NULL, NULL, 80, NULL);
    if (!b->listen_rc)
        ferry_listener_close(l);
    return 0;
}

static int count_boot(void *arg)
{
    struct boot_count *b = arg;

    b->runs++;
    return 0;
}

static int names2_main(void *arg)
{
    struct boot_count *b = arg;
    ferry_task *t;

    if (ferry_sim_spawn(b->n->srv, &t, lookups2, &b->m) != 0)
        return -1;
    ferry_task_join(t, NULL);
    if (ferry_sim_spawn(b->n->cli, NULL, late_listen, b) != 0)
        return -4;
    ferry_sleep(FERRY_MSEC(1));
    /* A boot task given to a crashed host waits for its restart. */
    ferry_sim_crash(b->n->sim, b->n->cli);
    if (ferry_sim_boot(b->n->cli, count_boot, b) != 0)
        return -2;
    ferry_sleep(FERRY_MSEC(10));
    if (b->runs != 0)
        return -3;
    ferry_sim_restart(b->n->sim, b->n->cli);
    ferry_sleep(FERRY_MSEC(10));
    return 0;
}

T(sim_hosts, mapped_and_canonical_names_and_a_boot_after_a_crash)
{
    struct net n;
    struct boot_count b = { .n = &n };

    net_init(&n, NULL);
    cr_assert_eq(tu_run(names2_main, &b), 0);
    cr_assert_eq(b.m.rc_mapped, 0);
    cr_assert_str_eq(b.m.mapped, "::ffff:10.0.0.2");
    cr_assert_eq(b.m.rc_canon, 0);
    cr_assert_str_eq(b.m.canon, "server");
    cr_assert_eq(b.runs, 1, "the boot task ran once, at the restart");
    cr_assert_eq(b.sleep_rc, -ECANCELED);
    cr_assert_eq(b.listen_rc, -EHOSTDOWN, "a crashed host listens on nothing");
    ferry_sim_free(n.sim);
}

/* A service and a client left running when the loop is freed. */
static int left_client(void *arg)
{
    ferry_stream *s;
    char buf[8];
    size_t n;

    (void)arg;
    if (ferry_tcp_connect(&s, "server", 7, NULL) != 0)
        return -1;
    ferry_stream_read(s, buf, sizeof buf, &n); /* until the loop ends */
    ferry_stream_close(s);
    return 0;
}

static int left_service(void *arg)
{
    ferry_listener *l;
    ferry_stream *s;

    (void)arg;
    if (ferry_tcp_listen(&l, NULL, NULL, 7, NULL) != 0)
        return -1;
    /* The accepted stream is left open: the loop's end closes it. */
    while (ferry_listener_accept(l, &s, NULL) == 0)
        ;
    return 0; /* the listener too */
}

/* Let the scenario run a while, then stop the loop with its tasks still
 * waiting. */
static int sleep_100ms(void *arg)
{
    int rc = ferry_sleep(FERRY_MSEC(100));

    ferry_loop_stop(arg);
    return rc;
}

Test(sim_hosts, loop_freed_first_frees_the_simulation, .init = tu_alloc_setup,
     .fini = tu_loop_teardown, .timeout = 20.)
{
    ferry_loop *loop;
    ferry_sim *sim;
    ferry_sim_host *srv, *cli;

    cr_assert_eq(ferry_loop_new(&loop, &(ferry_loop_opts){ .virtual_clock = true }), 0);
    cr_assert_eq(ferry_sim_new(&sim, loop, 1, NULL), 0);
    cr_assert_eq(ferry_sim_find_host(sim, "server", &srv), 0);
    cr_assert_eq(ferry_sim_find_host(sim, "client", &cli), 0);
    cr_assert_eq(ferry_sim_boot(srv, left_service, NULL), 0);
    cr_assert_eq(ferry_sim_spawn(cli, NULL, left_client, NULL), 0);
    cr_assert_eq(tu_run_on(loop, sleep_100ms, loop), 0);
    /* The tasks are cancelled, then the simulation goes with the loop;
     * the teardown checks that nothing was left allocated. */
    ferry_loop_free(loop);
}

/* ---- pool jobs in a simulation ---------------------------------------------------- */

static ferry_pool *g_pool;

/* Real work on a real thread: real time passes. */
static int real_work(void *arg)
{
    struct timespec ts = { 0, 2000000 };

    (void)arg;
    nanosleep(&ts, NULL);
    return 7;
}

/* Echo each line after a pool job. */
static int pool_conn(void *arg)
{
    ferry_stream *s = arg;
    char line[64];
    size_t len;
    int rc;

    while ((rc = ferry_stream_read_until(s, "\n", 1, line, sizeof line, &len)) == 0) {
        if (g_pool && ferry_to_thread(g_pool, real_work, NULL) != 7) {
            rc = -EPROTO;
            break;
        }
        if ((rc = ferry_stream_write(s, line, len, NULL)) != 0)
            break;
    }
    ferry_stream_close(s);
    return rc;
}

static int pool_service(void *arg)
{
    struct net *n = arg;
    ferry_stream *s;

    n->listen_rc = ferry_tcp_listen(&n->l, NULL, NULL, 7, NULL);
    if (n->listen_rc)
        return n->listen_rc;
    while ((n->accept_rc = ferry_listener_accept(n->l, &s, NULL)) == 0)
        if (ferry_task_spawn(NULL, NULL, pool_conn, s, NULL) != 0)
            ferry_stream_close(s);
    ferry_listener_close(n->l);
    return 0;
}

static int pool_main(void *arg)
{
    struct net *n = arg;
    ferry_task *srv, *cli;

    if (ferry_sim_spawn(n->srv, &srv, pool_service, n) != 0)
        return -1;
    if (ferry_sim_spawn(n->cli, &cli, line_client, n) != 0)
        return -2;
    ferry_task_join(cli, NULL);
    ferry_task_cancel(srv);
    ferry_task_join(srv, NULL);
    return 0;
}

/* The trace of a line through a service that does a pool job for it,
 * over links with jitter. */
static char *pool_trace(uint64_t seed, int64_t *took)
{
    struct net n;
    char *t;

    memset(&n, 0, sizeof n);
    cr_assert_eq(ferry_sim_new(&n.sim, tu_loop, seed,
                               &(ferry_sim_opts){ .latency = LAT, .jitter = FERRY_MSEC(3) }),
                 0);
    cr_assert_eq(ferry_sim_find_host(n.sim, "server", &n.srv), 0);
    cr_assert_eq(ferry_sim_find_host(n.sim, "client", &n.cli), 0);
    cr_assert_eq(tu_run(pool_main, &n), 0);
    cr_assert_eq(n.client_rc, 0, "%d", n.client_rc);
    *took = n.took;
    t = strdup(ferry_sim_trace(n.sim, NULL));
    ferry_sim_free(n.sim);
    return t;
}

T(sim_hosts, a_pool_job_holds_the_virtual_clock)
{
    int64_t t1, t2, t3;
    char *a, *b, *c;

    cr_assert_eq(ferry_pool_new(&g_pool, &(ferry_pool_opts){ .threads = 1 }), 0);
    a = pool_trace(3, &t1);
    b = pool_trace(3, &t2);
    ferry_pool_free(g_pool);
    g_pool = NULL;
    c = pool_trace(3, &t3);
    /* The job's real milliseconds are no simulated time: the answer
     * takes the simulated round trips only, the same each run. */
    cr_assert_eq(t1, t2);
    cr_assert_eq(t1, t3);
    cr_assert_str_eq(a, b, "one job at a time replays");
    cr_assert_str_eq(a, c, "as a service without a pool job");
    free(a);
    free(b);
    free(c);
}
