/* select_stop.c - a TCP echo server whose every wait is "readable or
 * shutting down": the accept loop and each connection wait on the socket
 * and on the stop at once, so a stop ends idle connections at once and
 * never cuts a line in half.
 *
 * asyncio:
 *
 *     done, _ = await asyncio.wait({read_task, stop_task},
 *                                  return_when=FIRST_COMPLETED)
 *     # read_task may have taken a line that is now lost if it is
 *     # cancelled; stop_task must be cancelled by hand
 *
 * Go:
 *
 *     select {
 *     case line := <-lines:    // a reader goroutine feeds the channel
 *     case <-ctx.Done():
 *     }
 *
 * ferry_select() waits on the stream and on the stop without a helper task
 * and without taking anything it does not return: a stream case only says
 * the stream has bytes (the read that follows takes them), so a stop that
 * wins leaves unread bytes where they were.  The server stops on SIGTERM
 * (a signal case of the accept loop) or on an event (the same loop's
 * shutdown event, which the connections watch).
 *
 * A client task connects twice, sends lines, and then sends SIGTERM to the
 * process; the second connection is idle when the stop comes.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "examples.h"
#include "ferry/select.h"

static ferry_event stopping = FERRY_EVENT_INIT;
static ferry_listener *listener;
static int served_lines, closed_on_stop;

/* One connection: echo lines in upper case until the peer ends or the
 * server stops. */
static int conn_main(void *arg)
{
    ferry_stream *s = arg;
    ferry_case c[2] = {
        FERRY_CASE_STREAM_INIT(s, FERRY_READ),
        FERRY_CASE_EVENT_INIT(&stopping),
    };
    char line[256];
    size_t n;
    int k, rc = 0;

    for (;;) {
        k = ferry_select(c, 2, FERRY_SELECT_PRIORITY);
        if (k < 0) {
            rc = k;
            break;
        }
        if (k == 1) {
            closed_on_stop++;
            ferry_stream_write(s, "bye\n", 4, NULL);
            break;
        }
        rc = ferry_stream_read_until(s, "\n", 1, line, sizeof line, &n);
        if (rc) {
            rc = rc == -ENODATA ? 0 : rc;
            break;
        }
        for (size_t i = 0; i < n; i++)
            if (line[i] >= 'a' && line[i] <= 'z')
                line[i] = (char)(line[i] - 'a' + 'A');
        served_lines++;
        rc = ferry_stream_write(s, line, n, NULL);
        if (rc)
            break;
    }
    ferry_stream_close(s);
    return rc;
}

/* The accept loop: a connection waiting, SIGTERM, or the stop event. */
static int server_main(void *arg)
{
    ferry_sigsub *term = arg;
    ferry_case c[3] = {
        FERRY_CASE_FD_INIT(ferry_listener_fd(listener), FERRY_READ),
        FERRY_CASE_SIGNAL_INIT(term),
        FERRY_CASE_EVENT_INIT(&stopping),
    };
    ferry_group g;
    ferry_stream *s;
    int k;

    ferry_group_init(&g);
    for (;;) {
        k = ferry_select(c, 3, 0);
        if (k < 0)
            break;
        if (k == 1) {
            printf("server: SIGTERM: stopping\n");
            ferry_event_set(&stopping);
            break;
        }
        if (k == 2)
            break;
        if (ferry_listener_accept(listener, &s, NULL) == 0)
            ferry_group_spawn(&g, conn_main, s, NULL);
    }
    ferry_group_wait(&g);
    return 0;
}

/* Send `line`, read the echo. */
static int ask(ferry_stream *s, const char *line, char *reply, size_t max)
{
    size_t n = 0;
    int rc = ferry_stream_write(s, line, strlen(line), NULL);

    if (rc == 0)
        rc = ferry_stream_read_until(s, "\n", 1, reply, max - 1, &n);
    reply[n] = '\0';
    return rc;
}

static int client_main(void *arg)
{
    int port = *(int *)arg;
    ferry_stream *a, *b;
    char reply[256];
    size_t n = 0;
    int rc;

    if (ferry_tcp_connect(&a, "127.0.0.1", port, NULL) ||
        ferry_tcp_connect(&b, "127.0.0.1", port, NULL))
        return 1;
    ask(a, "hello\n", reply, sizeof reply);
    printf("client: a got %s", reply);
    ask(b, "select\n", reply, sizeof reply);
    printf("client: b got %s", reply);
    ask(a, "bye for now\n", reply, sizeof reply);
    printf("client: a got %s", reply);
    ferry_stream_close(a);
    /* b stays open and idle: the stop must reach it. */
    kill(getpid(), SIGTERM);
    rc = ferry_stream_read_until(b, "\n", 1, reply, sizeof reply - 1, &n);
    reply[n] = '\0';
    printf("client: b got %s", rc == 0 ? reply : "(nothing)\n");
    ferry_stream_close(b);
    return 0;
}

static int main_task(void *arg)
{
    int sig = SIGTERM, port;
    ferry_sigsub *term;
    ferry_task *srv, *cli;
    int st_srv = -1, st_cli = -1;

    (void)arg;
    if (ferry_sigsub_new(&term, NULL, &sig, 1) ||
        ferry_tcp_listen(&listener, NULL, "127.0.0.1", 0, NULL))
        return 1;
    port = ferry_listener_port(listener);
    ferry_task_spawn(&srv, NULL, server_main, term, NULL);
    ferry_task_spawn(&cli, NULL, client_main, &port, NULL);
    ferry_task_join(cli, &st_cli);
    ferry_task_join(srv, &st_srv);
    ferry_listener_close(listener);
    ferry_sigsub_free(term);
    printf("served %d lines; %d idle connection closed on stop\n", served_lines,
           closed_on_stop);
    return st_cli || st_srv || served_lines != 3 || closed_on_stop != 1;
}

int main(void)
{
    int rc = ferry_run(main_task, NULL);

    return rc ? 1 : 0;
}
