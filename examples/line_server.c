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
 * long" (the connection then ends).  Idle connections are cancelled at the
 * drain (their task waits in the read).  `./line_server [PORT]` prints
 * "listening on 127.0.0.1:PORT" (port 0, the default: the system picks
 * one); after SIGTERM it closes the listener, closes the connections that
 * wait for a request, lets the others finish theirs, prints what it served
 * and returns 0.  examples/line_load drives it (test_line_server.sh).
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

struct conn {                     /* a connection, in the list of them all */
    ferry_stream *s;
    ferry_task   *task;
    bool          busy;           /* between reading a request and answering it */
    struct conn  *prev, *next;
    size_t        len;            /* of the request, then of the answer, at line */
    char          line[MAXLINE];
};

static struct {
    ferry_listener *lis;
    ferry_pool     *pool;
    ferry_sem       slots;
    ferry_event     drained;      /* the last connection has ended, after SIGTERM */
    struct conn     conns;        /* the list's head */
    bool            draining;
    long            served, in_flight_at_term, finished_in_drain, idle_closed;
} srv = { .conns = { .prev = &srv.conns, .next = &srv.conns } };

static int work(void *arg)        /* on a pool thread: plain C, no ferry */
{
    struct conn *c = arg;
    long ms;

    if (sscanf(c->line, "sleep %ld", &ms) == 1 && ms >= 0) {
        nanosleep(&(struct timespec){ ms / 1000, ms % 1000 * 1000000 }, NULL);
        c->len = (size_t)snprintf(c->line, MAXLINE, "slept %ld\n", ms);
    } else {
        for (size_t i = 0; i < c->len; i++)
            c->line[i] = (char)toupper((unsigned char)c->line[i]);
    }
    return 0;
}

static int serve(void *arg)
{
    struct conn *c = arg;
    ferry_scope sc;
    int rc = 0;

    *c = (struct conn){ c->s, ferry_task_current(), false, &srv.conns, srv.conns.next, 0, "" };
    c->next->prev = c->prev->next = c;
    while (!srv.draining && !(rc = ferry_stream_read_until(c->s, "\n", 1, c->line, MAXLINE, &c->len))) {
        c->busy = true;
        ferry_scope_enter(&sc, ferry_now() + FERRY_MSEC(DEADLINE_MS), 0);
        if ((rc = ferry_sem_acquire(&srv.slots)) == 0) {
            rc = ferry_to_thread(srv.pool, work, c);
            ferry_sem_release(&srv.slots);
        }
        ferry_scope_exit(&sc);
        if (rc == -ETIMEDOUT)     /* no slot or no pool thread in time */
            c->len = (size_t)snprintf(c->line, MAXLINE, "timeout\n");
        if (ferry_stream_write(c->s, c->line, c->len, NULL) != 0)
            break;
        srv.served++;
        srv.finished_in_drain += srv.draining;
        c->busy = false;
    }
    if (rc == -EMSGSIZE)          /* a line over MAXLINE: an error, not a truncation */
        ferry_stream_write(c->s, "too long\n", 9, NULL);
    c->prev->next = c->next;
    c->next->prev = c->prev;
    ferry_stream_close(c->s);
    free(c);
    if (srv.draining && srv.conns.next == &srv.conns)
        ferry_event_set(&srv.drained);
    return 0;
}

static int acceptor(void *arg)
{
    ferry_stream *s = NULL;
    struct conn *c;

    (void)arg;
    while (ferry_listener_accept(srv.lis, &s, NULL) != -EBADF) {
        if (s && (!(c = malloc(sizeof *c)) || (c->s = s, ferry_task_spawn(NULL, NULL, serve, c, NULL)))) {
            free(c);              /* out of memory: drop the connection */
            ferry_stream_close(s);
        }
        s = NULL;
    }
    return 0;
}

static int service(void *arg)
{
    ferry_sigsub *sub = NULL;
    ferry_task *acc;
    int rc, signum;

    ferry_sem_init(&srv.slots, SLOTS, 0);
    ferry_event_init(&srv.drained);
    if ((rc = ferry_pool_new(&srv.pool, NULL)) || (rc = ferry_sigsub_new(&sub, NULL, (const int[]){ SIGTERM }, 1)) ||
        (rc = ferry_tcp_listen(&srv.lis, NULL, "127.0.0.1", *(int *)arg, NULL)))
        return rc;                /* the process ends: the OS takes the rest back */
    printf("listening on 127.0.0.1:%d\n", ferry_listener_port(srv.lis));
    fflush(stdout);
    ferry_task_spawn(&acc, NULL, acceptor, NULL, NULL);
    ferry_sigsub_recv(sub, &signum);             /* SIGTERM: drain */
    srv.draining = true;
    ferry_listener_close(srv.lis);               /* refuse new connections */
    ferry_task_join(acc, NULL);
    for (struct conn *c = srv.conns.next; c != &srv.conns; c = c->next)
        c->busy ? srv.in_flight_at_term++ : (srv.idle_closed++, ferry_task_cancel(c->task));
    if (srv.conns.next != &srv.conns)
        ferry_event_wait(&srv.drained);          /* the requests in flight finish */
    ferry_sigsub_free(sub);
    ferry_pool_free(srv.pool);
    return 0;
}

int main(int argc, char **argv)
{
    int port = argc > 1 ? atoi(argv[1]) : 0, rc = ferry_run(service, &port);

    printf("drained: %ld of %ld requests in flight at SIGTERM finished, %ld idle connections "
           "closed, %ld requests served\n", srv.finished_in_drain, srv.in_flight_at_term,
           srv.idle_closed, srv.served);
    return rc == 0 ? 0 : 1;
}
