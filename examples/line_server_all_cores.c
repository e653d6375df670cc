/* line_server_all_cores.c - the line server on every core: a runtime of
 * one loop per CPU (FERRY_LOOPS overrides), the port served by every loop,
 * each connection handed to the less loaded of two loops, and a counter of
 * the requests kept on loop 0 and reached by the other loops through the
 * cross-loop call.
 *
 * Go would share the counter behind a mutex or an atomic; here it belongs
 * to loop 0, as a Seastar shard's data belongs to its shard: every change
 * runs on loop 0's thread (ferry_runtime_call(), FERRY_CALL_CALLBACK), so
 * it needs no lock, and a task on another loop waits for the answer
 * without blocking its loop.
 *
 * The protocol is examples/line_server's: "sleep MS" sleeps MS
 * milliseconds and answers "slept MS"; "count" answers "count N", the
 * requests served so far by all loops; any other line is answered in
 * capitals; a line longer than MAXLINE is answered "too long" and ends
 * the connection.
 *
 * `./line_server_all_cores [PORT] [reuseport]` prints "listening on
 * 127.0.0.1:PORT with N loops" (port 0, the default: the system picks
 * one); "reuseport" gives each loop a listener of its own instead of one
 * acceptor.  After SIGTERM it stops serving (the connections end), prints
 * the requests each loop served and the counter, and returns 0.
 * test_line_server_all_cores.sh drives it with examples/line_load.
 */
#include <ctype.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/ferry.h"

#define MAXLINE  1024
#define MAXLOOPS 64

static struct {
    ferry_runtime_listener *lis;
    long  total;                  /* loop 0's thread only */
    long  per_loop[MAXLOOPS];     /* [i]: loop i's thread only */
} srv;

/* On loop 0: count `*delta` requests more, answer the new total. */
static int count_add(void *arg, void **result)
{
    srv.total += *(long *)arg;
    *result = (void *)(intptr_t)srv.total;
    return 0;
}

/* The counter, from any loop: suspends this task only. */
static long counter_add(long delta)
{
    void *total = NULL;
    int st;

    if (ferry_runtime_call(NULL, 0, count_add, &delta, FERRY_CALL_CALLBACK, &st, &total) != 0)
        return -1;
    return (long)(intptr_t)total;
}

static int serve(ferry_stream *s, void *arg)
{
    int me = ferry_runtime_index(NULL, NULL);
    char line[MAXLINE + 32];
    size_t len;
    long ms, total;
    int rc;

    (void)arg;
    while ((rc = ferry_stream_read_until(s, "\n", 1, line, MAXLINE, &len)) == 0) {
        if (len == 6 && memcmp(line, "count\n", 6) == 0) {
            total = counter_add(0);
            len = (size_t)snprintf(line, sizeof line, "count %ld\n", total);
        } else if (sscanf(line, "sleep %ld", &ms) == 1 && ms >= 0) {
            if (ferry_sleep(FERRY_MSEC(ms)) != 0)
                break;
            len = (size_t)snprintf(line, sizeof line, "slept %ld\n", ms);
        } else {
            for (size_t i = 0; i < len; i++)
                line[i] = (char)toupper((unsigned char)line[i]);
        }
        if (counter_add(1) < 0 || ferry_stream_write(s, line, len, NULL) != 0)
            break;
        if (me >= 0 && me < MAXLOOPS)
            srv.per_loop[me]++;
    }
    if (rc == -EMSGSIZE)
        ferry_stream_write(s, "too long\n", 9, NULL);
    return 0;                     /* ferry closes the stream */
}

static int serve_all(void *arg)
{
    (void)arg;
    return ferry_runtime_listener_serve(srv.lis, serve, NULL);
}

static int service(void *arg)
{
    ferry_sigsub *sub = NULL;
    ferry_task *t;
    int rc, signum;

    (void)arg;
    if ((rc = ferry_sigsub_new(&sub, NULL, (const int[]){ SIGTERM }, 1)) != 0)
        return rc;
    printf("listening on 127.0.0.1:%d with %u loops\n", ferry_runtime_listener_port(srv.lis),
           ferry_runtime_size(NULL));
    fflush(stdout);
    if ((rc = ferry_task_spawn(&t, NULL, serve_all, NULL, NULL)) != 0)
        return rc;
    ferry_sigsub_recv(sub, &signum);
    ferry_task_cancel(t);         /* every loop stops serving, connections end */
    ferry_task_join(t, NULL);
    ferry_sigsub_free(sub);
    return 0;
}

int main(int argc, char **argv)
{
    ferry_runtime_listen_opts lo = { .mode = FERRY_SPREAD_BALANCED };
    ferry_runtime *rt;
    unsigned n, i;
    long sum = 0;
    int port = argc > 1 ? atoi(argv[1]) : 0, rc, st = 1;

    if (argc > 2 && strcmp(argv[2], "reuseport") == 0)
        lo.mode = FERRY_SPREAD_REUSEPORT;
    if ((rc = ferry_runtime_new(&rt, NULL)) != 0 ||
        (rc = ferry_runtime_listen(&srv.lis, rt, "127.0.0.1", port, &lo)) != 0) {
        fprintf(stderr, "line_server_all_cores: %s\n", ferry_gai_strerror(rc));
        return 1;
    }
    n = ferry_runtime_size(rt);
    rc = ferry_runtime_run(rt, service, NULL, &st);
    ferry_runtime_listener_free(srv.lis);
    ferry_runtime_free(rt);
    printf("served per loop:");
    for (i = 0; i < n && i < MAXLOOPS; i++) {
        printf(" %ld", srv.per_loop[i]);
        sum += srv.per_loop[i];
    }
    printf("; %ld requests served, counter on loop 0: %ld\n", sum, srv.total);
    return rc == 0 && st == 0 ? 0 : 1;
}
