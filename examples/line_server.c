/* line_server.c - a TCP line server: a request per line, the work on a
 * thread pool, at most SLOTS requests worked on at once (a semaphore), a
 * deadline per request, and a drain on SIGTERM that finishes the requests
 * in flight and refuses new ones.
 *
 * asyncio:
 *
 *     async def serve(reader, writer):
 *         async for line in reader:                   # StreamReader.readline()
 *             async with slots, asyncio.timeout(DEADLINE):
 *                 answer = await asyncio.to_thread(work, line)
 *             writer.write(answer); await writer.drain()
 *     server = await asyncio.start_server(serve, "127.0.0.1", port)
 *     loop.add_signal_handler(signal.SIGTERM, stopping.set)
 *
 * The protocol: "sleep MS" sleeps MS milliseconds on the pool and answers
 * "slept MS"; any other line is answered in capitals.  A request that gets
 * no slot and no pool thread within its deadline is answered "timeout" (a
 * job that has started runs to its end); one longer than MAXLINE, "too
 * long" (the connection then ends).  A connection waits for its next
 * request or the drain, whichever comes first (ferry_select(), the drain
 * listed first: once it began, no new request starts).
 * `./line_server [PORT]` prints "listening on 127.0.0.1:PORT" (port 0, the
 * default: the system picks one); after SIGTERM it closes the listener,
 * closes the connections that wait for a request, lets the others finish
 * theirs, prints what it served and returns 0.  examples/line_load drives
 * it (test_line_server.sh).
 *
 * Built with LINE_SERVER_NO_MAIN, the file leaves out main() and gives the
 * service to a program of its own as line_server_service(&port):
 * tests/test_sim_line.c runs it, unchanged, as the boot task of a host of
 * the simulated network (ferry/sim.h).
 */
#include <ctype.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ferry/ferry.h"

#define SLOTS       8
#define MAXLINE     1024
#define DEADLINE_MS 5000

struct request {
    char   line[MAXLINE + 1];     /* a request, NUL-terminated for sscanf() */
    size_t len;                   /* of the request, then of the answer */
};

static struct {
    ferry_listener *lis;
    ferry_pool     *pool;
    ferry_sem       slots;
    ferry_event     stop;         /* set at SIGTERM: the drain */
    long            busy;         /* requests between read and answer */
    long            served, in_flight_at_term, finished_in_drain, ended_by_drain;
} srv;

static int work(void *arg)        /* on a pool thread: plain C, no ferry */
{
    struct request *r = arg;
    long ms;

    if (sscanf(r->line, "sleep %ld", &ms) == 1 && ms >= 0) {
        nanosleep(&(struct timespec){ ms / 1000, ms % 1000 * 1000000 }, NULL);
        r->len = (size_t)snprintf(r->line, MAXLINE, "slept %ld\n", ms);
    } else {
        for (size_t i = 0; i < r->len; i++)
            r->line[i] = (char)toupper((unsigned char)r->line[i]);
    }
    return 0;
}

static int serve(void *arg)
{
    ferry_stream *s = arg;
    ferry_case next[2] = { FERRY_CASE_EVENT_INIT(&srv.stop), FERRY_CASE_STREAM_INIT(s, FERRY_READ) };
    struct request r;
    ferry_scope sc;
    int rc = 0;

    while (ferry_select(next, 2, FERRY_SELECT_PRIORITY) == 1 &&
           !(rc = ferry_stream_read_until(s, "\n", 1, r.line, MAXLINE, &r.len)) &&
           !ferry_event_is_set(&srv.stop)) {
        r.line[r.len] = '\0';
        srv.busy++;
        ferry_scope_enter(&sc, ferry_now() + FERRY_MSEC(DEADLINE_MS), 0);
        if ((rc = ferry_sem_acquire(&srv.slots)) == 0) {
            rc = ferry_to_thread(srv.pool, work, &r);
            ferry_sem_release(&srv.slots);
        }
        ferry_scope_exit(&sc);
        if (rc == -ETIMEDOUT)     /* no slot or no pool thread in time */
            r.len = (size_t)snprintf(r.line, MAXLINE, "timeout\n");
        rc = ferry_stream_write(s, r.line, r.len, NULL);
        srv.busy--;
        if (rc)
            break;
        srv.served++;
        srv.finished_in_drain += ferry_event_is_set(&srv.stop);
    }
    if (rc == -EMSGSIZE)          /* a line over MAXLINE: an error, not a truncation */
        ferry_stream_write(s, "too long\n", 9, NULL);
    srv.ended_by_drain += ferry_event_is_set(&srv.stop) && rc == 0;
    ferry_stream_close(s);
    return 0;
}

static int acceptor(void *arg)    /* its group holds the connections */
{
    ferry_group conns;
    ferry_stream *s;
    int rc;

    ferry_group_init(&conns);
    /* A cancelled accept fails at once every time: it ends the loop, as a
     * closed listener does (the group then cancels the connections). */
    while ((rc = ferry_listener_accept(srv.lis, &s, NULL)) != -EBADF && rc != -ECANCELED)
        if (rc == 0 && ferry_group_spawn(&conns, serve, s, NULL))
            ferry_stream_close(s);  /* out of memory: drop the connection */
    return ferry_group_wait(&conns);
}

static int service(void *arg)
{
    ferry_sigsub *sub = NULL;
    ferry_task *acc;
    int rc, signum;

    ferry_sem_init(&srv.slots, SLOTS, 0);
    ferry_event_init(&srv.stop);
    if ((rc = ferry_pool_new(&srv.pool, NULL)) || (rc = ferry_sigsub_new(&sub, NULL, (const int[]){ SIGTERM }, 1)) ||
        (rc = ferry_tcp_listen(&srv.lis, NULL, "127.0.0.1", *(int *)arg, NULL)))
        return rc;                /* the process ends: the OS takes the rest back */
    printf("listening on 127.0.0.1:%d\n", ferry_listener_port(srv.lis));
    fflush(stdout);
    ferry_task_spawn(&acc, NULL, acceptor, NULL, NULL);
    ferry_sigsub_recv(sub, &signum);             /* SIGTERM: drain */
    srv.in_flight_at_term = srv.busy;
    ferry_event_set(&srv.stop);                  /* idle connections end */
    ferry_listener_close(srv.lis);               /* refuse new connections */
    rc = ferry_task_join(acc, NULL);             /* the requests in flight finish */
    ferry_sigsub_free(sub);
    ferry_pool_free(srv.pool);
    return rc;
}

#ifdef LINE_SERVER_NO_MAIN
int line_server_service(void *port);

int line_server_service(void *port)
{
    return service(port);
}
#else
int main(int argc, char **argv)
{
    int port = argc > 1 ? atoi(argv[1]) : 0, rc = ferry_run(service, &port);

    printf("drained: %ld of %ld requests in flight at SIGTERM finished, %ld connections ended "
           "by the drain, %ld requests served\n", srv.finished_in_drain, srv.in_flight_at_term,
           srv.ended_by_drain, srv.served);
    return rc == 0 ? 0 : 1;
}
#endif
