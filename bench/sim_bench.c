/* sim_bench.c - the cost of a round trip on the simulated network
 * (ferry/sim.h) against the same round trip over loopback TCP: one task
 * writes a byte, another echoes it, N times, through the same stream calls.
 * The simulated link has a latency of 1 ms on the virtual clock, so its
 * figure is the CPU time of the simulation (segments, timers, jumps of the
 * clock), not the latency.
 *
 *     ferry-sim-bench [ROUND_TRIPS]      (default 200000)
 *
 * Prints one BENCH line per transport: ns per round trip of real time.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "ferry/ferry.h"

static long rounds = 200000;

static int64_t real_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Echo bytes until the stream ends. */
static int echo(void *arg)
{
    ferry_stream *s = arg;
    char b;
    size_t n;
    int rc;

    while ((rc = ferry_stream_read(s, &b, 1, &n)) == 0 && n == 1)
        if ((rc = ferry_stream_write(s, &b, 1, NULL)) != 0)
            break;
    ferry_stream_close(s);
    return rc;
}

/* Ping `rounds` times over `c`, then close it. */
static int ping(ferry_stream *c)
{
    char b = 'x';
    size_t n;
    int rc = 0;

    for (long i = 0; i < rounds && !rc; i++) {
        rc = ferry_stream_write(c, &b, 1, NULL);
        if (!rc)
            rc = ferry_stream_read(c, &b, 1, &n);
    }
    ferry_stream_close(c);
    return rc;
}

static int sim_main(void *arg)
{
    ferry_sim *sim = arg;
    ferry_sim_host *a, *b;
    ferry_sim_listener *l;
    ferry_stream *c, *s;
    int rc;

    if ((rc = ferry_sim_find_host(sim, "a", &a)) || (rc = ferry_sim_find_host(sim, "b", &b)) ||
        (rc = ferry_sim_listen(sim, b, 7, &l)) || (rc = ferry_sim_connect(sim, a, b, 7, &c)))
        return rc;
    if ((rc = ferry_sim_accept(l, &s)) != 0)
        return rc;
    ferry_task_spawn(NULL, NULL, echo, s, NULL);
    rc = ping(c);
    ferry_sim_listener_close(l);
    return rc;
}

static int tcp_main(void *arg)
{
    ferry_listener *l;
    ferry_stream *c, *s;
    int rc;

    (void)arg;
    if ((rc = ferry_tcp_listen(&l, NULL, "127.0.0.1", 0, NULL)) ||
        (rc = ferry_tcp_connect(&c, "127.0.0.1", ferry_listener_port(l), NULL)))
        return rc;
    if ((rc = ferry_listener_accept(l, &s, NULL)) != 0)
        return rc;
    ferry_task_spawn(NULL, NULL, echo, s, NULL);
    rc = ping(c);
    ferry_listener_close(l);
    return rc;
}

/* Run fn on a new loop; print its BENCH line. */
static int run(const char *name, bool vclock, ferry_task_fn fn)
{
    ferry_loop *loop;
    ferry_sim *sim = NULL;
    ferry_task *t;
    int64_t t0;
    int st = -1, rc;

    rc = ferry_loop_new(&loop, &(ferry_loop_opts){ .virtual_clock = vclock });
    if (rc)
        return rc;
    if (vclock && (rc = ferry_sim_new(&sim, loop, 1, NULL)) != 0)
        return rc;
    t0 = real_ns();
    rc = ferry_task_spawn(&t, loop, fn, sim, NULL);
    if (rc)
        return rc;
    while (ferry_task_try_join(t, &st) == -EAGAIN)
        ferry_loop_run(loop, FERRY_RUN_DEFAULT);
    printf("BENCH %s round_trips=%ld ns_per_round_trip=%.0f status=%d\n", name, rounds,
           (double)(real_ns() - t0) / (double)rounds, st);
    ferry_loop_run(loop, FERRY_RUN_DEFAULT);
    ferry_sim_free(sim);
    ferry_loop_free(loop);
    return st;
}

int main(int argc, char **argv)
{
    if (argc > 1)
        rounds = atol(argv[1]);
    if (rounds < 1)
        return 2;
    if (run("sim_round_trip", true, sim_main) || run("tcp_loopback_round_trip", false, tcp_main))
        return 1;
    return 0;
}
