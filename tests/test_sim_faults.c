/* test_sim_faults.c - the random faults of the simulated network
 * (ferry/sim.h) drawn from the seed: partitions and crashes, each giving
 * the same trace twice under one seed and another under another seed,
 * and none armed while nothing can be hit; loss (stalls, then a reset),
 * bandwidth and the window that makes a writer wait.
 *
 * No cr_assert inside task bodies: tasks record what they saw into
 * variables, and the test asserts on the main stack after tu_run().
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "testutil.h"
#include "ferry/net.h"
#include "ferry/sim.h"

#define T(suite, name) \
    Test(suite, name, .init = tu_vclock_setup, .fini = tu_loop_teardown, .timeout = 30.)

#define LAT FERRY_MSEC(5)

/* ---- a service and its clients, restarted by their boot tasks ---------------- */

struct scen {
    ferry_sim *sim;
    ferry_sim_host *srv, *cli[3];
    bool stop;       /* the scenario is over: boot tasks return at once */
    int answers;     /* answers the clients read */
    int failures;    /* requests that failed (reset, refused, timed out) */
    int cancelled;   /* host tasks that saw -ECANCELED */
};

static struct scen *g;

static int echo_conn(void *arg)
{
    ferry_stream *s = arg;
    char line[64];
    size_t n;
    int rc;

    while ((rc = ferry_stream_read_until(s, "\n", 1, line, sizeof line, &n)) == 0)
        if ((rc = ferry_stream_write(s, line, n, NULL)) != 0)
            break;
    g->cancelled += rc == -ECANCELED;
    ferry_stream_close(s);
    return rc;
}

static int service(void *arg)
{
    ferry_listener *l;
    ferry_stream *s;
    int rc;

    (void)arg;
    if (g->stop)
        return 0;
    rc = ferry_tcp_listen(&l, NULL, NULL, 7, NULL);
    if (rc)
        return rc;
    while ((rc = ferry_listener_accept(l, &s, NULL)) == 0)
        if (ferry_task_spawn(NULL, NULL, echo_conn, s, NULL) != 0)
            ferry_stream_close(s);
    g->cancelled += rc == -ECANCELED;
    ferry_listener_close(l);
    return rc;
}

/* Lines asked and read back on `s` until a failure or the end. */
static int converse(ferry_stream *s, int *k)
{
    char line[64], got[64];
    size_t n;
    int rc = 0;

    while (!rc && !g->stop) {
        int len = snprintf(line, sizeof line, "%s-%d\n",
                           ferry_sim_host_name(ferry_sim_current_host()), (*k)++);

        rc = ferry_stream_write(s, line, (size_t)len, NULL);
        if (!rc)
            rc = ferry_stream_read_until(s, "\n", 1, got, sizeof got, &n);
        if (!rc) {
            g->answers++;
            rc = ferry_sleep(FERRY_MSEC(50));
        }
    }
    return rc;
}

/* Connect, converse, and after a failure wait and connect again, until
 * the end or a crash of the host. */
static int client(void *arg)
{
    ferry_stream *s;
    int rc, k = 0;

    (void)arg;
    while (!g->stop) {
        rc = ferry_tcp_connect(&s, "server", 7, NULL);
        if (!rc) {
            rc = converse(s, &k);
            ferry_stream_close(s);
        }
        if (rc && rc != -ECANCELED) {
            g->failures++;
            rc = ferry_sleep(FERRY_MSEC(100));
        }
        if (rc == -ECANCELED) {
            g->cancelled++;
            return rc;
        }
    }
    return 0;
}

static int scen_main(void *arg)
{
    struct scen *sc = arg;

    if (ferry_sim_boot(sc->srv, service, NULL) != 0)
        return -1;
    for (int i = 0; i < 3; i++)
        if (ferry_sim_boot(sc->cli[i], client, NULL) != 0)
            return -2;
    ferry_sleep(FERRY_SEC(10));
    sc->stop = true;
    /* The end: every host's tasks go as at a crash, and boot tasks that a
     * random restart runs return at once. */
    ferry_sim_crash(sc->sim, sc->srv);
    for (int i = 0; i < 3; i++)
        ferry_sim_crash(sc->sim, sc->cli[i]);
    ferry_sleep(FERRY_SEC(10));
    return 0;
}

/* Run the scenario under `seed` with `opts`; the trace, the caller's to
 * free. */
static char *scen_trace(uint64_t seed, const ferry_sim_opts *opts, struct scen *sc)
{
    char name[16];
    const char *t;
    char *copy;

    memset(sc, 0, sizeof *sc);
    g = sc;
    cr_assert_eq(ferry_sim_new(&sc->sim, tu_loop, seed, opts), 0);
    cr_assert_eq(ferry_sim_find_host(sc->sim, "server", &sc->srv), 0);
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "c%d", i);
        cr_assert_eq(ferry_sim_find_host(sc->sim, name, &sc->cli[i]), 0);
    }
    cr_assert_eq(tu_run(scen_main, sc), 0);
    t = ferry_sim_trace(sc->sim, NULL);
    cr_assert_not_null(t);
    copy = strdup(t);
    ferry_sim_free(sc->sim);
    return copy;
}

static const ferry_sim_opts faults = {
    .latency = LAT,
    .jitter = FERRY_MSEC(2),
    .stall = FERRY_SEC(2),
    .partition_every = FERRY_SEC(2),
    .partition_for = FERRY_MSEC(500),
};

T(sim_faults, random_partitions_replay_by_seed)
{
    struct scen a, b, c;
    char *ta = scen_trace(5, &faults, &a);
    char *tb = scen_trace(5, &faults, &b);
    char *tc = scen_trace(6, &faults, &c);

    cr_assert_not_null(strstr(ta, "partition random"), "%s", ta);
    cr_assert_not_null(strstr(ta, " heal\n"));
    cr_assert_null(strstr(ta, "crash random"));
    cr_assert_str_eq(ta, tb, "the same seed gives the same trace");
    cr_assert_str_neq(ta, tc, "another seed another");
    cr_assert_eq(a.answers, b.answers);
    cr_assert_gt(a.answers, 0);
    free(ta);
    free(tb);
    free(tc);
}

static const ferry_sim_opts crashes = {
    .latency = LAT,
    .jitter = FERRY_MSEC(2),
    .crash_every = FERRY_SEC(1),
    .crash_for = FERRY_MSEC(300),
};

T(sim_faults, random_crashes_replay_by_seed)
{
    struct scen a, b, c;
    char *ta = scen_trace(5, &crashes, &a);
    char *tb = scen_trace(5, &crashes, &b);
    char *tc = scen_trace(6, &crashes, &c);

    cr_assert_not_null(strstr(ta, "crash random"), "%s", ta);
    cr_assert_not_null(strstr(ta, "restart random"), "%s", ta);
    cr_assert_null(strstr(ta, "partition"));
    cr_assert_str_eq(ta, tb, "the same seed gives the same trace");
    cr_assert_str_neq(ta, tc, "another seed another");
    cr_assert_gt(a.cancelled, 0, "crashed hosts' tasks saw -ECANCELED");
    cr_assert_gt(a.answers, 0);
    free(ta);
    free(tb);
    free(tc);
}

/* A boot task that ends at once. */
static int boot_done(void *arg)
{
    (void)arg;
    return 0;
}

T(sim_faults, idle_simulation_arms_nothing)
{
    ferry_sim *sim;
    ferry_sim_host *h, *k;
    ferry_sim_opts o = faults;

    o.crash_every = FERRY_SEC(1);
    o.reset_every = FERRY_SEC(1);
    cr_assert_eq(ferry_sim_new(&sim, tu_loop, 3, &o), 0);
    cr_assert_eq(ferry_sim_find_host(sim, "a", &h), 0);
    cr_assert_eq(ferry_sim_find_host(sim, "b", &k), 0);
    cr_assert_eq(ferry_sim_boot(h, boot_done, NULL), 0);
    /* Would not return if a fault kept re-arming with nothing to hit. */
    cr_assert_eq(ferry_loop_run(tu_loop, 0), 0);
    cr_assert_null(strstr(ferry_sim_trace(sim, NULL), "random"), "%s",
                   ferry_sim_trace(sim, NULL));
    ferry_sim_free(sim);
}

T(sim_faults, negative_settings_are_refused)
{
    ferry_sim *sim;

    cr_assert_eq(ferry_sim_new(&sim, tu_loop, 1, &(ferry_sim_opts){ .partition_every = -1 }),
                 -EINVAL);
    cr_assert_eq(ferry_sim_new(&sim, tu_loop, 1, &(ferry_sim_opts){ .crash_for = -1 }), -EINVAL);
    cr_assert_eq(ferry_sim_new(&sim, tu_loop, 1, &(ferry_sim_opts){ .bandwidth = -1 }), -EINVAL);
    cr_assert_eq(ferry_sim_new(&sim, tu_loop, 1, &(ferry_sim_opts){ .loss_ppm = 1000001 }),
                 -EINVAL);
}

/* ---- loss, bandwidth, window ------------------------------------------------------ */

/* A connection made with the simulation's own calls: c the client's end,
 * s the server's. */
struct link2 {
    ferry_sim *sim;
    ferry_sim_host *a, *b;
    ferry_sim_listener *l;
    ferry_stream *c, *s;
    int rc;          /* what the scenario's task saw */
    int rc2;
    size_t n;        /* bytes moved */
    int64_t t, t2;   /* when things happened, since the start */
    int64_t start;
};

static void link2_init(struct link2 *k, uint64_t seed, const ferry_sim_opts *opts)
{
    memset(k, 0, sizeof *k);
    cr_assert_eq(ferry_sim_new(&k->sim, tu_loop, seed, opts), 0);
    cr_assert_eq(ferry_sim_find_host(k->sim, "a", &k->a), 0);
    cr_assert_eq(ferry_sim_find_host(k->sim, "b", &k->b), 0);
    cr_assert_eq(ferry_sim_listen(k->sim, k->b, 7, &k->l), 0);
}

/* Connect and accept; the time of the end of the set-up in k->start. */
static int link2_connect(struct link2 *k)
{
    int rc = ferry_sim_connect(k->sim, k->a, k->b, 7, &k->c);

    if (!rc)
        rc = ferry_sim_accept(k->l, &k->s);
    k->start = ferry_now();
    return rc;
}

static void link2_free(struct link2 *k)
{
    if (k->c)
        ferry_stream_close(k->c);
    if (k->s)
        ferry_stream_close(k->s);
    ferry_sim_listener_close(k->l);
    ferry_sim_free(k->sim);
}

/* 40 lines one way and their echo, each read back in order. */
static int lossy_echo(void *arg)
{
    struct link2 *k = arg;
    char line[32], got[32];
    size_t n;
    int rc = link2_connect(k);

    for (int i = 0; i < 40 && !rc; i++) {
        int len = snprintf(line, sizeof line, "line-%d\n", i);

        rc = ferry_stream_write(k->c, line, (size_t)len, NULL);
        if (!rc)
            rc = ferry_stream_read_until(k->s, "\n", 1, got, sizeof got, &n);
        if (!rc && (n != (size_t)len || memcmp(got, line, n) != 0))
            rc = -EPROTO;
        if (!rc)
            k->n++;
    }
    k->rc = rc;
    k->t = ferry_now() - k->start;
    return 0;
}

static char *lossy_trace(uint64_t seed, struct link2 *k)
{
    char *t;

    link2_init(k, seed,
               &(ferry_sim_opts){ .latency = LAT, .loss_ppm = 200000, .stall = FERRY_SEC(30) });
    cr_assert_eq(tu_run(lossy_echo, k), 0);
    t = strdup(ferry_sim_trace(k->sim, NULL));
    link2_free(k);
    return t;
}

T(sim_faults, loss_stalls_and_keeps_order)
{
    struct link2 a, b, c;
    char *ta = lossy_trace(11, &a), *tb = lossy_trace(11, &b), *tc = lossy_trace(12, &c);

    cr_assert_eq(a.rc, 0, "%d", a.rc);
    cr_assert_eq(a.n, 40, "every line, in order");
    cr_assert_not_null(strstr(ta, " lost data "), "%s", ta);
    /* Without loss: 40 one-way trips.  Each loss adds a retransmission
     * timeout of 200 ms at least. */
    cr_assert_gt(a.t, 40 * LAT + FERRY_MSEC(200));
    cr_assert_str_eq(ta, tb, "the same seed gives the same losses");
    cr_assert_str_neq(ta, tc);
    free(ta);
    free(tb);
    free(tc);
}

static int connect_lossy(void *arg)
{
    struct link2 *k = arg;
    int64_t t0 = ferry_now();

    k->rc = ferry_sim_connect(k->sim, k->a, k->b, 7, &k->c);
    k->t = ferry_now() - t0;
    return 0;
}

T(sim_faults, losses_in_a_row_for_the_stall_time_time_out)
{
    struct link2 k;

    link2_init(&k, 1, &(ferry_sim_opts){ .latency = LAT, .loss_ppm = 1000000,
                                         .stall = FERRY_SEC(2) });
    cr_assert_eq(tu_run(connect_lossy, &k), 0);
    cr_assert_eq(k.rc, -ETIMEDOUT, "%d", k.rc);
    cr_assert_eq(k.t, FERRY_SEC(2), "gave up after the stall time: %lld", (long long)k.t);
    cr_assert_not_null(strstr(ferry_sim_trace(k.sim, NULL), "reset loss"));
    k.c = NULL;
    link2_free(&k);
}

/* 500 bytes, twice, at 1000 bytes a second. */
static int slow_link(void *arg)
{
    struct link2 *k = arg;
    static char buf[500];
    char got[500];
    size_t n;
    int rc = link2_connect(k);

    if (!rc)
        rc = ferry_stream_write(k->c, buf, sizeof buf, NULL);
    if (!rc)
        rc = ferry_stream_write(k->c, buf, sizeof buf, NULL);
    if (!rc)
        rc = ferry_stream_read_exactly(k->s, got, sizeof got, &n);
    k->t = ferry_now() - k->start;
    if (!rc)
        rc = ferry_stream_read_exactly(k->s, got, sizeof got, &n);
    k->t2 = ferry_now() - k->start;
    k->rc = rc;
    return 0;
}

T(sim_faults, bandwidth_spaces_the_segments)
{
    struct link2 k;

    link2_init(&k, 1, &(ferry_sim_opts){ .latency = LAT, .bandwidth = 1000 });
    cr_assert_eq(tu_run(slow_link, &k), 0);
    cr_assert_eq(k.rc, 0, "%d", k.rc);
    cr_assert_eq(k.t, FERRY_MSEC(500) + LAT, "%lld", (long long)k.t);
    cr_assert_eq(k.t2, FERRY_MSEC(1000) + LAT, "%lld", (long long)k.t2);
    link2_free(&k);
}

/* 3000 bytes through a window of 1000 on a link of 100 ms. */
static int windowed(void *arg)
{
    struct link2 *k = arg;
    static char buf[3000];
    int rc = link2_connect(k);

    if (!rc)
        rc = ferry_stream_write(k->c, buf, sizeof buf, &k->n);
    k->t = ferry_now() - k->start;
    k->rc = rc;
    return 0;
}

T(sim_faults, a_full_window_makes_the_writer_wait)
{
    struct link2 k;

    link2_init(&k, 1, &(ferry_sim_opts){ .latency = FERRY_MSEC(100), .window = 1000 });
    cr_assert_eq(tu_run(windowed, &k), 0);
    cr_assert_eq(k.rc, 0);
    cr_assert_eq(k.n, 3000);
    /* 1000 bytes at once, 1000 when they arrive, the last 1000 when
     * those do. */
    cr_assert_eq(k.t, FERRY_MSEC(200), "%lld", (long long)k.t);
    link2_free(&k);
}

static int window_writer(void *arg)
{
    struct link2 *k = arg;
    static char buf[3000];

    k->rc = ferry_stream_write(k->c, buf, sizeof buf, &k->n);
    return 0;
}

static int window_cancel(void *arg)
{
    struct link2 *k = arg;
    static char buf[1000];
    char got[3000];
    ferry_task *t;
    size_t n = 0;
    int rc = link2_connect(k);

    if (rc)
        return rc;
    ferry_task_spawn(&t, NULL, window_writer, k, NULL);
    ferry_sleep(FERRY_MSEC(50));
    ferry_task_cancel(t);
    ferry_task_join(t, NULL);
    /* The stream goes on: what was taken arrives, and a new write. */
    k->rc2 = ferry_stream_write(k->c, buf, sizeof buf, NULL);
    if (!k->rc2)
        k->rc2 = ferry_stream_read_exactly(k->s, got, k->n + sizeof buf, &n);
    return 0;
}

T(sim_faults, a_writer_waiting_for_the_window_cancels_cleanly)
{
    struct link2 k;

    link2_init(&k, 1, &(ferry_sim_opts){ .latency = FERRY_MSEC(100), .window = 1000 });
    cr_assert_eq(tu_run(window_cancel, &k), 0);
    cr_assert_eq(k.rc, -ECANCELED);
    cr_assert_eq(k.n, 1000, "the bytes the window took count as written");
    cr_assert_eq(k.rc2, 0);
    link2_free(&k);
}

/* The server's end closes; bytes sent to it then come back as a reset. */
static int to_closed(void *arg)
{
    struct link2 *k = arg;
    int rc = link2_connect(k);

    if (rc)
        return rc;
    ferry_stream_close(k->s);
    k->s = NULL;
    ferry_sleep(FERRY_MSEC(100));
    k->rc = ferry_stream_write(k->c, "x", 1, NULL);
    ferry_sleep(FERRY_MSEC(100));
    k->rc2 = ferry_stream_write(k->c, "y", 1, NULL);
    return 0;
}

T(sim_faults, bytes_to_a_closed_end_bring_a_reset_back)
{
    struct link2 k;

    link2_init(&k, 1, &(ferry_sim_opts){ .latency = LAT });
    cr_assert_eq(tu_run(to_closed, &k), 0);
    cr_assert_eq(k.rc, 0);
    cr_assert_eq(k.rc2, -ECONNRESET, "%d", k.rc2);
    cr_assert_not_null(strstr(ferry_sim_trace(k.sim, NULL), "deliver rst"));
    link2_free(&k);
}

/* A partition on command, made while random ones come and go, holds a
 * byte until it is healed on command. */
static int reader(void *arg)
{
    struct link2 *k = arg;
    char x;
    size_t n;

    k->rc2 = ferry_stream_read_exactly(k->s, &x, 1, &n);
    k->t2 = ferry_now() - k->start;
    return 0;
}

static int command_over_random(void *arg)
{
    struct link2 *k = arg;
    ferry_task *t;
    int rc = link2_connect(k);

    if (rc)
        return rc;
    ferry_sleep(FERRY_SEC(3));
    ferry_sim_partition(k->sim, &k->a, 1, &k->b, 1);
    k->t = ferry_now() - k->start;
    ferry_task_spawn(&t, NULL, reader, k, NULL);
    k->rc = ferry_stream_write(k->c, "x", 1, NULL);
    ferry_sleep(FERRY_SEC(10));
    ferry_sim_heal(k->sim);
    ferry_task_join(t, NULL);
    /* Random partitions stay armed while a connection is open. */
    ferry_stream_close(k->c);
    ferry_stream_close(k->s);
    k->c = k->s = NULL;
    return 0;
}

T(sim_faults, a_partition_on_command_outlasts_random_ones)
{
    struct link2 k;

    link2_init(&k, 4, &(ferry_sim_opts){ .latency = LAT, .stall = FERRY_SEC(100),
                                         .partition_every = FERRY_MSEC(200),
                                         .partition_for = FERRY_MSEC(300) });
    cr_assert_eq(tu_run(command_over_random, &k), 0);
    cr_assert_not_null(strstr(ferry_sim_trace(k.sim, NULL), "partition random"));
    cr_assert_eq(k.rc, 0);
    cr_assert_eq(k.rc2, 0);
    /* The byte came after the heal on command, 10 s after the partition. */
    cr_assert_geq(k.t2, k.t + FERRY_SEC(10), "arrived at %lld, partition at %lld",
                  (long long)k.t2, (long long)k.t);
    link2_free(&k);
}
