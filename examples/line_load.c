/* line_load.c - drives examples/line_server: CONNS connections at once,
 * each a task that sends REQS requests one after another and checks every
 * answer.
 *
 *   line_load PORT CONNS REQS         "hello ..." requests; then one line
 *                                      longer than the server's maximum
 *   line_load PORT CONNS --drain PID  a "sleep 300" request on each
 *                                      connection and 5 more connections
 *                                      that send nothing, then SIGTERM to
 *                                      PID; the idle ones must see the end
 *
 * It prints one line of counts; its exit status is 0 when every request
 * got the right answer (with --drain: the right answer, or the connection
 * closed without one, the server having refused it).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/ferry.h"

static int g_port, g_reqs, g_conns;
static pid_t g_drain_pid;
#define IDLE 5
static int g_idle_ready, g_idle_ended;
static int g_connected, g_sent, g_answered, g_closed, g_wrong;
static char g_why[160];
static ferry_event g_all_sent;

static void wrong(const char *what, int rc)
{
    if (g_wrong++ == 0)
        snprintf(g_why, sizeof g_why, "%s: %d", what, rc);
}

static int client(void *arg)
{
    int id = (int)(intptr_t)arg, rc;
    char req[64], want[64], got[128];
    ferry_stream *s;
    size_t n;

    if ((rc = ferry_tcp_connect(&s, "127.0.0.1", g_port, NULL)) != 0) {
        wrong("connect", rc);
        return 0;
    }
    g_connected++;
    if (id >= g_conns) {                    /* idle, in a drain */
        if (++g_idle_ready == IDLE && g_sent == g_conns)
            ferry_event_set(&g_all_sent);
        rc = ferry_stream_read(s, got, sizeof got, &n);
        if ((rc == 0 && n == 0) || rc == -ECONNRESET)
            g_idle_ended++;
        else
            wrong("an idle connection", rc);
        ferry_stream_close(s);
        return 0;
    }
    for (int r = 0; r < (g_drain_pid ? 1 : g_reqs); r++) {
        int len = g_drain_pid ? snprintf(req, sizeof req, "sleep 300\n")
                              : snprintf(req, sizeof req, "hello %d.%d\n", id, r);
        if (g_drain_pid)
            snprintf(want, sizeof want, "slept 300\n");
        else
            snprintf(want, sizeof want, "HELLO %d.%d\n", id, r);
        if ((rc = ferry_stream_write(s, req, (size_t)len, NULL)) != 0) {
            wrong("write", rc);
            break;
        }
        if (++g_sent == g_conns && g_drain_pid && g_idle_ready == IDLE)
            ferry_event_set(&g_all_sent);
        rc = ferry_stream_read_until(s, "\n", 1, got, sizeof got, &n);
        if (rc == 0 && n == strlen(want) && memcmp(got, want, n) == 0)
            g_answered++;
        else if (g_drain_pid && (rc == -ENODATA || rc == -ECONNRESET) && n == 0)
            g_closed++;
        else
            wrong(rc ? "read" : "a wrong answer", rc);
    }
    if (!g_drain_pid && id == 0) {          /* a line over the server's maximum */
        static char big[2048];
        memset(big, 'x', sizeof big - 1);
        big[sizeof big - 1] = '\n';
        if ((rc = ferry_stream_write(s, big, sizeof big, NULL)) != 0 ||
            (rc = ferry_stream_read_until(s, "\n", 1, got, sizeof got, &n)) != 0 ||
            n != 9 || memcmp(got, "too long\n", 9) != 0)
            wrong("the long line's answer", rc);
    }
    ferry_stream_close(s);
    return 0;
}

static int run(void *arg)
{
    ferry_group g;

    (void)arg;
    ferry_event_init(&g_all_sent);
    ferry_group_init(&g);
    for (int i = 0; i < g_conns + (g_drain_pid ? IDLE : 0); i++)
        ferry_group_spawn(&g, client, (void *)(intptr_t)i, NULL);
    if (g_drain_pid) {
        ferry_event_wait(&g_all_sent);
        kill(g_drain_pid, SIGTERM);
    }
    ferry_group_wait(&g);
    ferry_event_destroy(&g_all_sent);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: line_load PORT CONNS REQS | line_load PORT CONNS --drain PID\n");
        return 2;
    }
    g_port = atoi(argv[1]);
    g_conns = atoi(argv[2]);
    if (strcmp(argv[3], "--drain") == 0 && argc > 4)
        g_drain_pid = (pid_t)atoi(argv[4]);
    else
        g_reqs = atoi(argv[3]);
    ferry_run(run, NULL);
    printf("%d connections made, %d requests sent: %d answered right, %d closed unanswered, "
           "%d wrong%s%s; %d idle connections ended\n", g_connected, g_sent, g_answered,
           g_closed, g_wrong, g_wrong ? ": " : "", g_why, g_idle_ended);
    return g_wrong == 0 && g_connected == g_conns + (g_drain_pid ? IDLE : 0) &&
           g_answered + g_closed == g_sent && g_idle_ended == (g_drain_pid ? IDLE : 0) ? 0 : 1;
}
