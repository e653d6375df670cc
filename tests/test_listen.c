/* test_listen.c - a TCP port served by every loop of a runtime
 * (ferry_runtime_listen(), ferry/runtime.h): balanced mode deals 64
 * long-lived connections out evenly over 8 loops, each stream opened on
 * the loop that serves it; reuseport mode accepts on every loop; steering
 * by the receiving CPU; a runtime ended while connections are handed
 * over leaves no descriptor open and nothing allocated; argument checks.
 *
 * The clients are plain threads with blocking sockets.  No cr_assert
 * inside task bodies: they record, the test body asserts after the
 * runtime returned.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <criterion/criterion.h>
#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#endif
#ifndef RUNNING_ON_VALGRIND
#define RUNNING_ON_VALGRIND 0
#endif

#include "testutil.h"
#include "ferry/ferry.h"

#define TL(name) Test(listen, name, .init = tu_alloc_setup, .fini = tu_loop_teardown, \
                      .timeout = 60.)

#define MAX_LOOPS 8
#define MAX_CONNS 256

/* What a test shares between its client thread, the serving tasks and
 * the body. */
struct srv {
    ferry_runtime          *rt;
    unsigned                loops;
    ferry_runtime_listen_opts opts;
    ferry_runtime_listener *l;
    int                     port;
    int                     serve_rc;
    /* the client */
    int                     conns;             /* connections to make */
    bool                    keep;              /* keep them open until told */
    bool                    until_every_loop;  /* reuseport: stop once each loop served one */
    int                     fds[MAX_CONNS];
    int                     made;
    atomic_bool             client_done;       /* set by the client thread */
    atomic_bool             release;           /* the body lets the client close */
    /* the server */
    atomic_int              served[MAX_LOOPS]; /* connections whose fn ran, per loop */
    atomic_int              wrong_loop;        /* a stream used from another loop */
    int64_t                 load_seen[MAX_LOOPS]; /* loads once every connection arrived */
    int64_t                 load_after[MAX_LOOPS];
};

static int served_total(struct srv *s)
{
    int i, t = 0;

    for (i = 0; i < MAX_LOOPS; i++)
        t += atomic_load(&s->served[i]);
    return t;
}

static bool every_loop_served(struct srv *s)
{
    unsigned i;

    for (i = 0; i < s->loops; i++)
        if (atomic_load(&s->served[i]) == 0)
            return false;
    return true;
}

static int connect_to(int port)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void *client(void *arg)
{
    struct srv *s = arg;
    int i;

    for (i = 0; i < s->conns && i < MAX_CONNS; i++) {
        int fd = connect_to(s->port);

        if (fd < 0)
            break;
        s->fds[s->made++] = fd;
        if (!s->keep) {
            /* Wait until it was served, so the next one sees its loop. */
            while (served_total(s) < s->made)
                usleep(100);
            if (s->until_every_loop && every_loop_served(s))
                break;
        }
    }
    if (s->keep) {
        while (served_total(s) < s->made)
            usleep(100);
        for (i = 0; i < (int)s->loops; i++)
            s->load_seen[i] = ferry_runtime_load(s->rt, (unsigned)i);
        atomic_store(&s->client_done, true);
        while (!atomic_load(&s->release))
            usleep(100);
    }
    for (i = 0; i < s->made; i++)
        close(s->fds[i]);
    atomic_store(&s->client_done, true);
    return NULL;
}

/* A connection: note its loop, then read to the end. */
static int conn_fn(ferry_stream *st, void *arg)
{
    struct srv *s = arg;
    char buf[64];
    size_t n;
    int me = ferry_runtime_index(NULL, NULL);

    if (me < 0 || me >= MAX_LOOPS) {
        atomic_fetch_add(&s->wrong_loop, 1);
        return -1;
    }
    atomic_fetch_add(&s->served[me], 1);
    /* The stream belongs to this loop: reading it works. */
    while (ferry_stream_read(st, buf, sizeof buf, &n) == 0 && n > 0)
        ;
    return 0;
}

static int serve_task(void *arg)
{
    struct srv *s = arg;

    s->serve_rc = ferry_runtime_listener_serve(s->l, conn_fn, s);
    return 0;
}

/* Loop 0's main: serve until the client is done, then end the serve call
 * and read the loads it left. */
static int main_serve(void *arg)
{
    struct srv *s = arg;
    ferry_task *t;
    unsigned i;
    int rc;

    rc = ferry_task_spawn(&t, NULL, serve_task, s, NULL);
    if (rc)
        return rc;
    while (!atomic_load(&s->client_done))
        ferry_sleep(FERRY_MSEC(1));
    atomic_store(&s->release, true);
    ferry_task_cancel(t);
    ferry_task_join(t, NULL);
    for (i = 0; i < s->loops; i++)
        s->load_after[i] = ferry_runtime_load(s->rt, i);
    return 0;
}

/* Make the runtime and the listener, run the client against main_serve,
 * free everything. */
static void run_server(struct srv *s)
{
    ferry_runtime_opts o = { .loops = s->loops };
    pthread_t th;
    int st = -1;

    cr_assert_eq(ferry_runtime_new(&s->rt, &o), 0);
    cr_assert_eq(ferry_runtime_listen(&s->l, s->rt, "127.0.0.1", 0, &s->opts), 0);
    s->port = ferry_runtime_listener_port(s->l);
    cr_assert_gt(s->port, 0);
    atomic_init(&s->client_done, false);
    atomic_init(&s->release, false);
    cr_assert_eq(pthread_create(&th, NULL, client, s), 0);
    cr_assert_eq(ferry_runtime_run(s->rt, main_serve, s, &st), 0);
    cr_assert_eq(st, 0);
    pthread_join(th, NULL);
    ferry_runtime_listener_free(s->l);
    ferry_runtime_free(s->rt);
}

TL(balanced_deals_64_connections_evenly_over_8_loops)
{
    static struct srv s;
    int64_t lo = INT64_MAX, hi = 0, sum = 0;
    unsigned i;

    s.loops = 8;
    s.opts.mode = FERRY_SPREAD_BALANCED;
    s.opts.seed = 12345;
    s.conns = 64;
    s.keep = true;
    run_server(&s);
    cr_assert_eq(s.made, 64);
    cr_assert_eq(s.serve_rc, -ECANCELED);
    cr_assert_eq(atomic_load(&s.wrong_loop), 0);
    for (i = 0; i < 8; i++) {
        cr_log_info("loop %u: %lld connections", i, (long long)s.load_seen[i]);
        /* The load the acceptor counted is where the stream was served. */
        cr_expect_eq(s.load_seen[i], atomic_load(&s.served[i]), "loop %u", i);
        cr_expect_eq(s.load_after[i], 0, "loop %u keeps load %lld", i,
                     (long long)s.load_after[i]);
        lo = s.load_seen[i] < lo ? s.load_seen[i] : lo;
        hi = s.load_seen[i] > hi ? s.load_seen[i] : hi;
        sum += s.load_seen[i];
    }
    cr_assert_eq(sum, 64);
    cr_assert_gt(lo, 0);
    cr_assert_leq(hi * 4, lo * 5, "max %lld / min %lld above 1.25", (long long)hi,
                  (long long)lo);
}

TL(reuseport_accepts_on_every_loop)
{
    static struct srv s;
    unsigned i;

    s.loops = 4;
    s.opts.mode = FERRY_SPREAD_REUSEPORT;
    s.conns = MAX_CONNS;
    s.until_every_loop = true;
    run_server(&s);
    cr_assert_eq(atomic_load(&s.wrong_loop), 0);
    for (i = 0; i < 4; i++) {
        cr_expect_gt(atomic_load(&s.served[i]), 0, "loop %u accepted nothing in %d connections",
                     i, s.made);
        cr_expect_eq(s.load_after[i], 0);
    }
    cr_assert_eq(s.serve_rc, -ECANCELED);
}

/* Does this kernel take a reuseport program? */
static bool kernel_has_reuseport_cbpf(void)
{
    struct sock_filter code[] = { { BPF_RET | BPF_K, 0, 0, 0 } };
    struct sock_fprog prog;
    int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0);
    bool ok;

    memset(&prog, 0, sizeof prog);
    prog.len = 1;
    prog.filter = code;

    setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    ok = setsockopt(fd, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &prog, sizeof prog) == 0;
    close(fd);
    return ok;
}

TL(cpu_steering_picks_the_loop_of_the_receiving_cpu)
{
    static struct srv s;
    long cpus = sysconf(_SC_NPROCESSORS_CONF);
    unsigned i;

    if (!kernel_has_reuseport_cbpf() || cpus < 1 || cpus >= MAX_LOOPS)
        cr_skip_test("no reuseport program here, or too many CPUs to tell");
    s.loops = MAX_LOOPS;
    s.opts.mode = FERRY_SPREAD_REUSEPORT;
    s.opts.flags = FERRY_SPREAD_CPU;
    s.conns = 32;
    run_server(&s);
    cr_assert_eq(s.made, 32);
    /* Socket (CPU mod 8): never a loop above the last CPU's number. */
    for (i = (unsigned)cpus; i < MAX_LOOPS; i++)
        cr_expect_eq(atomic_load(&s.served[i]), 0, "loop %u served %d", i,
                     atomic_load(&s.served[i]));
}

TL(balanced_cpu_steering_serves_where_it_counts)
{
    static struct srv s;
    int64_t sum = 0;
    unsigned i;

    s.loops = 4;
    s.opts.mode = FERRY_SPREAD_BALANCED;
    s.opts.flags = FERRY_SPREAD_CPU;
    s.opts.acceptor = 3;
    s.conns = 16;
    s.keep = true;
    run_server(&s);
    cr_assert_eq(s.made, 16);
    cr_assert_eq(atomic_load(&s.wrong_loop), 0);
    for (i = 0; i < 4; i++) {
        cr_expect_eq(s.load_seen[i], atomic_load(&s.served[i]), "loop %u", i);
        cr_expect_eq(s.load_after[i], 0, "loop %u", i);
        sum += s.load_seen[i];
    }
    cr_assert_eq(sum, 16);
}

/* ---- the end while connections are handed over -------------------------- */

struct churn {
    int                     port;
    atomic_bool             stop;
    atomic_int              served;
    int                     fds[MAX_CONNS];
    int                     made;
};

static void *churn_client(void *arg)
{
    struct churn *c = arg;

    while (!atomic_load(&c->stop) && c->made < MAX_CONNS) {
        int fd = connect_to(c->port);

        if (fd < 0)
            break;      /* the listener is gone */
        c->fds[c->made++] = fd;
    }
    return NULL;
}

static int churn_conn(ferry_stream *st, void *arg)
{
    struct churn *c = arg;
    char b;
    size_t n;

    atomic_fetch_add(&c->served, 1);
    /* Long-lived: ends only when cancelled by the runtime's end. */
    while (ferry_stream_read(st, &b, 1, &n) == 0 && n > 0)
        ;
    return 0;
}

struct churn_main {
    struct churn           *c;
    ferry_runtime_listener *l;
};

static int churn_serve(void *arg)
{
    struct churn_main *m = arg;

    return ferry_runtime_listener_serve(m->l, churn_conn, m->c);
}

/* Serve until some connections arrived, then return with the serve task
 * and the connections still alive: ferry_runtime_free() ends them while
 * the client goes on connecting. */
static int churn_main(void *arg)
{
    struct churn_main *m = arg;
    ferry_task *t;
    int rc = ferry_task_spawn(&t, NULL, churn_serve, m, NULL);

    if (rc)
        return rc;
    ferry_task_detach(t);
    while (atomic_load(&m->c->served) < 16)
        ferry_sleep(FERRY_MSEC(1));
    return 0;
}

TL(runtime_ended_during_handovers_leaves_no_descriptor)
{
    int round;

    for (round = 0; round < 5; round++) {
        static struct churn c;
        struct churn_main m = { .c = &c };
        ferry_runtime_opts o = { .loops = 4 };
        ferry_runtime_listen_opts lo = { .mode = FERRY_SPREAD_BALANCED, .seed = 7 };
        ferry_runtime *rt;
        pthread_t th;
        int before, st = -1, i;

        memset(&c, 0, sizeof c);
        before = tu_open_fds();
        cr_assert_eq(ferry_runtime_new(&rt, &o), 0);
        cr_assert_eq(ferry_runtime_listen(&m.l, rt, "127.0.0.1", 0, &lo), 0);
        c.port = ferry_runtime_listener_port(m.l);
        cr_assert_eq(pthread_create(&th, NULL, churn_client, &c), 0);
        cr_assert_eq(ferry_runtime_run(rt, churn_main, &m, &st), 0);
        cr_assert_eq(st, 0);
        /* Every loop ends while the client keeps connecting. */
        ferry_runtime_free(rt);
        ferry_runtime_listener_free(m.l);
        atomic_store(&c.stop, true);
        pthread_join(th, NULL);
        for (i = 0; i < c.made; i++)
            close(c.fds[i]);
        cr_assert_geq(atomic_load(&c.served), 16);
        cr_assert_eq(tu_open_fds(), before, "round %d: %d descriptors left open", round,
                     tu_open_fds() - before);
    }
}

/* ---- out of descriptors --------------------------------------------------- */

/* The client's sockets exist before the limit is lowered: connecting
 * takes no descriptor, accepting does. */
struct emfile {
    ferry_runtime_listener *l;
    int                     fds[4];
    atomic_int              served;
    int                     served_while_low;
    int                     rc;
};

static int emfile_conn(ferry_stream *s, void *arg)
{
    struct emfile *e = arg;

    (void)s;
    atomic_fetch_add(&e->served, 1);
    return 0;
}

static int emfile_serve(void *arg)
{
    struct emfile *e = arg;

    return ferry_runtime_listener_serve(e->l, emfile_conn, e);
}

/* The lowest descriptor number not in use. */
static int lowest_free(void)
{
    int fd = dup(0);

    close(fd);
    return fd;
}

/* Wait (a task) until `n` connections were served, or 5 s scaled. */
static void emfile_wait(struct emfile *e, int n)
{
    int64_t until = ferry_now() + tu_ms(5000);

    while (atomic_load(&e->served) < n && ferry_now() < until)
        ferry_sleep(FERRY_MSEC(1));
}

static int emfile_main(void *arg)
{
    struct emfile *e = arg;
    struct sockaddr_in a = { .sin_family = AF_INET,
                             .sin_port = htons((uint16_t)ferry_runtime_listener_port(e->l)),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    struct rlimit old, low;
    int i, rc, fd;
    ferry_task *t;

    rc = ferry_task_spawn(&t, NULL, emfile_serve, e, NULL);
    if (rc)
        return rc;
    /* A connection served on each of the two loops first: each then has
     * what its streams need (its epoll set), and the test is about
     * accepting alone. */
    for (i = 0; i < 2; i++) {
        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
            return -1;
        emfile_wait(e, i + 1);
        close(fd);
    }
    for (i = 0; i < 4; i++)
        if ((e->fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
            return -1;
    /* No descriptor left: every number below the limit is taken. */
    getrlimit(RLIMIT_NOFILE, &old);
    low = old;
    low.rlim_cur = (rlim_t)lowest_free();
    setrlimit(RLIMIT_NOFILE, &low);
    for (i = 0; i < 4; i++)
        connect(e->fds[i], (struct sockaddr *)&a, sizeof a);
    ferry_sleep(tu_ms(50));             /* accept4() fails with EMFILE meanwhile */
    e->served_while_low = atomic_load(&e->served) - 2;
    setrlimit(RLIMIT_NOFILE, &old);
    emfile_wait(e, 6);
    ferry_task_cancel(t);
    ferry_task_join(t, &e->rc);
    for (i = 0; i < 4; i++)
        close(e->fds[i]);
    return 0;
}

TL(accept_out_of_descriptors_waits_and_serves_later)
{
    static struct emfile e;
    ferry_runtime_opts o = { .loops = 2 };
    ferry_runtime_listen_opts lo = { .mode = FERRY_SPREAD_BALANCED };
    ferry_runtime *rt;
    int st = -1;

    if (RUNNING_ON_VALGRIND)
        cr_skip_test("valgrind keeps descriptor limits of its own (RLIMIT_NOFILE is emulated)");
    cr_assert_eq(ferry_runtime_new(&rt, &o), 0);
    cr_assert_eq(ferry_runtime_listen(&e.l, rt, "127.0.0.1", 0, &lo), 0);
    cr_assert_eq(ferry_runtime_run(rt, emfile_main, &e, &st), 0);
    cr_assert_eq(st, 0);
    ferry_runtime_listener_free(e.l);
    ferry_runtime_free(rt);
    cr_expect_eq(e.served_while_low, 0);
    cr_assert_eq(atomic_load(&e.served), 6, "served %d of 2 + 4 once descriptors were back",
                 atomic_load(&e.served));
    cr_assert_eq(e.rc, -ECANCELED);
}

/* ---- arguments ------------------------------------------------------------ */

static int busy_main(void *arg)
{
    struct churn_main *m = arg;
    ferry_task *t;
    int rc;

    rc = ferry_task_spawn(&t, NULL, churn_serve, m, NULL);
    if (rc)
        return rc;
    ferry_sleep(FERRY_MSEC(20));
    rc = ferry_runtime_listener_serve(m->l, churn_conn, m->c);
    ferry_task_cancel(t);
    ferry_task_join(t, NULL);
    return rc;
}

TL(arguments_and_a_second_serve)
{
    static struct churn c;
    struct churn_main m = { .c = &c };
    ferry_runtime_opts o = { .loops = 2 };
    ferry_runtime_listen_opts bad = { .mode = 7 };
    ferry_runtime_listener *l = NULL;
    ferry_runtime *rt;
    int st = 0;

    cr_assert_eq(ferry_runtime_listen(&l, NULL, "127.0.0.1", 0, NULL), -EINVAL); /* no runtime */
    cr_assert_eq(ferry_runtime_new(&rt, &o), 0);
    cr_assert_eq(ferry_runtime_listen(NULL, rt, NULL, 0, NULL), -EINVAL);
    cr_assert_eq(ferry_runtime_listen(&l, rt, "127.0.0.1", 0, &bad), -EINVAL);
    bad.mode = FERRY_SPREAD_BALANCED;
    bad.acceptor = 2;
    cr_assert_eq(ferry_runtime_listen(&l, rt, "127.0.0.1", 0, &bad), -EINVAL);
    cr_assert_eq(ferry_runtime_listen(&l, rt, "not-an-address", 0, NULL), -EINVAL);
    cr_assert_eq(ferry_runtime_listen(&l, rt, "127.0.0.1", 70000, NULL), -EINVAL);
    cr_assert_null(l);
    cr_assert_eq(ferry_runtime_listener_port(NULL), -EINVAL);
    /* A port another socket holds without SO_REUSEPORT. */
    {
        struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        socklen_t len = sizeof a;
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

        cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
        cr_assert_eq(listen(fd, 1), 0);
        cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
        cr_assert_eq(ferry_runtime_listen(&l, rt, "127.0.0.1", ntohs(a.sin_port), NULL),
                     -EADDRINUSE);
        cr_assert_null(l);
        close(fd);
    }
    /* A numeric IPv6 address, where the machine has IPv6. */
    st = ferry_runtime_listen(&l, rt, "::1", 0, NULL);
    cr_assert(st == 0 || st == -EADDRNOTAVAIL || st == -EAFNOSUPPORT, "::1: %d", st);
    if (st == 0) {
        cr_assert_gt(ferry_runtime_listener_port(l), 0);
        ferry_runtime_listener_free(l);
    }
    /* Every address, IPv6 and IPv4 on one socket per loop. */
    cr_assert_eq(ferry_runtime_listen(&m.l, rt, NULL, 0, NULL), 0);
    cr_assert_eq(ferry_runtime_listener_serve(m.l, churn_conn, &c), -EPERM); /* not a task */
    cr_assert_eq(ferry_runtime_listener_serve(m.l, NULL, &c), -EINVAL);
    cr_assert_eq(ferry_runtime_run(rt, busy_main, &m, &st), 0);
    cr_assert_eq(st, -EBUSY);
    ferry_runtime_listener_free(m.l);
    ferry_runtime_listener_free(NULL);
    ferry_runtime_free(rt);
}
