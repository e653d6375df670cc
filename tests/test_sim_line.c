/* test_sim_line.c - the line server of examples/line_server.c, built
 * without its main() (LINE_SERVER_NO_MAIN), run unchanged as the boot task
 * of a simulated host (ferry/sim.h): its ferry_tcp_listen() and
 * ferry_listener_accept() reach the simulation.  Clients on other hosts
 * send numbered requests, one at a time, through a partition shorter than
 * the stall time (the bytes are held, then delivered), a partition longer
 * than it (the connections are reset) and a crash of the server's host
 * followed by its restart (the boot task runs again, with a new pool and
 * listener).  A client whose connection fails connects again and sends
 * the same request again.  Every request must be answered to its client
 * exactly once, by its number, in capitals; an answer seen twice, or one
 * that answers another request, is counted and must not happen.
 *
 * The server runs its work on a thread pool: the virtual clock stands
 * still while a request waits for its job, so a run takes the same
 * simulated time whatever the machine does.  No SIGTERM is sent: the
 * service's drain is not part of this test, the crash ends it.
 *
 * No cr_assert inside task bodies: tasks record what they saw, and the
 * test asserts on the main stack after tu_run().
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <criterion/criterion.h>

#include "testutil.h"
#include "ferry/sim.h"

/* examples/line_server.c without its main(). */
int line_server_service(void *port);

#define NCLIENTS 3
#define MAXREQ   400
#define LAT      FERRY_MSEC(5)
#define STALL    FERRY_SEC(1)
#define PORT     7

/* What one client saw. */
struct client {
    int id;              /* its number, in its requests */
    int sent;            /* requests answered so far: the next one's number */
    int answers[MAXREQ]; /* how many answers each request got */
    int twice;           /* answers to a request answered before */
    int wrong;           /* answers that match no request of this client */
    int failures;        /* connections that failed (reset, timeout, refused) */
    int rc;              /* how the client ended */
};

static struct {
    ferry_sim *sim;
    ferry_sim_host *server, *cli[NCLIENTS];
    struct client cl[NCLIENTS];
    int port;         /* the service's argument */
    int min_requests; /* each client sends at least this many */
    bool faults_done; /* the clients stop once this is set */
} w;

/* Read answers on s until the one to request n; count the others. */
static int read_answer(struct client *c, ferry_stream *s, int n)
{
    char line[64];
    size_t len;
    int id, k, rc;

    for (;;) {
        rc = ferry_stream_read_until(s, "\n", 1, line, sizeof line - 1, &len);
        if (rc)
            return rc;
        line[len] = '\0';
        if (sscanf(line, "REQ C%d %d", &id, &k) != 2 || id != c->id || k < 0 || k > n) {
            c->wrong++;
            continue;
        }
        if (c->answers[k]++ > 0)
            c->twice++;
        if (k == n)
            return 0;
    }
}

/* One request, tried until it is answered: a failed connection is closed,
 * and the request sent again on a new one. */
static int request(struct client *c, ferry_stream **s, int n)
{
    char req[64];
    ferry_scope sc;
    int len = snprintf(req, sizeof req, "req c%d %d\n", c->id, n), rc;

    for (;;) {
        ferry_scope_enter(&sc, ferry_now() + 2 * STALL, 0);
        rc = *s ? 0 : ferry_tcp_connect(s, "server", PORT, NULL);
        if (!rc)
            rc = ferry_stream_write(*s, req, (size_t)len, NULL);
        if (!rc)
            rc = read_answer(c, *s, n);
        ferry_scope_exit(&sc);
        if (!rc)
            return 0;
        if (rc == -ECANCELED)
            return rc;
        c->failures++;
        if (*s)
            ferry_stream_close(*s);
        *s = NULL;
        if ((rc = ferry_sleep(FERRY_MSEC(100))))
            return rc;
    }
}

static int client(void *arg)
{
    struct client *c = arg;
    ferry_stream *s = NULL;
    int rc = 0;

    while (!rc && c->sent < MAXREQ && (c->sent < w.min_requests || !w.faults_done)) {
        rc = request(c, &s, c->sent);
        if (!rc) {
            c->sent++;
            rc = ferry_sleep(FERRY_MSEC(20));
        }
    }
    if (s)
        ferry_stream_close(s);
    c->rc = rc;
    return rc;
}

static void partition_server(void)
{
    ferry_sim_partition(w.sim, &w.server, 1, w.cli, NCLIENTS);
}

/* The faults, one after another, while the clients send; then wait for
 * the clients, and crash the server's host for good to end its tasks. */
static int scenario(void *arg)
{
    ferry_task *t[NCLIENTS];
    int rc = 0;

    (void)arg;
    cr_expect_eq(ferry_sim_boot(w.server, line_server_service, &w.port), 0);
    for (int i = 0; i < NCLIENTS; i++)
        cr_expect_eq(ferry_sim_spawn(w.cli[i], &t[i], client, &w.cl[i]), 0);
    ferry_sleep(FERRY_MSEC(300));
    partition_server(); /* shorter than the stall: bytes held, then delivered */
    ferry_sleep(STALL / 2);
    ferry_sim_heal(w.sim);
    ferry_sleep(FERRY_MSEC(500));
    partition_server(); /* longer than the stall: connections reset */
    ferry_sleep(2 * STALL);
    ferry_sim_heal(w.sim);
    ferry_sleep(FERRY_MSEC(500));
    ferry_sim_crash(w.sim, w.server); /* tasks cancelled, connections reset */
    ferry_sleep(FERRY_SEC(1));
    ferry_sim_restart(w.sim, w.server); /* the service boots again */
    ferry_sleep(FERRY_MSEC(500));
    w.faults_done = true;
    for (int i = 0; i < NCLIENTS; i++)
        rc |= ferry_task_join(t[i], NULL);
    ferry_sim_crash(w.sim, w.server);
    ferry_sleep(FERRY_MSEC(10)); /* the service's tasks unwind */
    return rc;
}

Test(sim_line, no_request_lost_or_answered_twice_through_partitions_and_a_crash,
     .init = tu_vclock_setup, .fini = tu_loop_teardown, .timeout = 60.)
{
    char name[16];
    int total = 0, failures = 0;

    memset(&w, 0, sizeof w);
    w.port = PORT;
    w.min_requests = 50;
    cr_assert_eq(
        ferry_sim_new(&w.sim, tu_loop, 5,
                      &(ferry_sim_opts){ .latency = LAT, .jitter = FERRY_MSEC(5), .stall = STALL }),
        0);
    cr_assert_eq(ferry_sim_find_host(w.sim, "server", &w.server), 0);
    for (int i = 0; i < NCLIENTS; i++) {
        snprintf(name, sizeof name, "client%d", i);
        cr_assert_eq(ferry_sim_find_host(w.sim, name, &w.cli[i]), 0);
        w.cl[i].id = i;
    }
    cr_assert_eq(tu_run(scenario, NULL), 0);
    for (int i = 0; i < NCLIENTS; i++) {
        struct client *c = &w.cl[i];

        cr_assert_eq(c->rc, 0, "client %d ended with %d", i, c->rc);
        cr_assert_geq(c->sent, w.min_requests, "client %d: %d requests", i, c->sent);
        for (int n = 0; n < c->sent; n++)
            cr_assert_eq(c->answers[n], 1, "client %d, request %d: %d answers", i, n,
                         c->answers[n]);
        cr_assert_eq(c->twice, 0, "client %d: %d answers seen twice", i, c->twice);
        cr_assert_eq(c->wrong, 0, "client %d: %d wrong answers", i, c->wrong);
        total += c->sent;
        failures += c->failures;
    }
    /* The faults reached the clients: each of the long partition and the
     * crash failed at least one connection of each client. */
    cr_assert_geq(failures, 2 * NCLIENTS, "%d failed connections", failures);
    cr_log_info("%d requests answered once each, %d failed connections retried", total, failures);
    ferry_sim_free(w.sim);
}
