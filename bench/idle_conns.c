/* idle_conns.c - what an echo server holds for connections that do nothing.
 *
 *     ferry-idle-conns --port P --server-pid PID [--conns 10000]
 *                      [--system NAME] [--hold-ms 500]
 *
 * Reads the server's resident memory (VmRSS of /proc/PID/status), opens
 * --conns connections to 127.0.0.1:P in batches, sends one byte on each
 * and waits for it to come back, so that the server has accepted every
 * connection, read from it and gone back to waiting on it; then holds them
 * all idle for --hold-ms and reads the server's VmRSS again.  The growth
 * is what the server holds per idle connection: its task or callback
 * state, and whatever receive buffer a waiting read keeps.
 *
 * Prints one line in the benchmark contract's format (bench/README.md):
 *
 *     BENCH workload=idle_conns system=NAME n=CONNS seconds=... ns_per_op=...
 *           ops_per_s=... rss_kb=SERVER_VMRSS check=ok|FAIL
 *           rss_growth_kb=... bytes_per_conn=...
 *
 * seconds covers opening the connections and their first echo.  check is
 * ok when every connection echoed its byte and none was closed while held.
 * The client needs --conns descriptors and a few more: raise ulimit -n
 * (bench/run-uring.sh does).  Exit status: 0 if check=ok, 1 otherwise,
 * 2 on a usage error.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Connections opened before their echoes are awaited: small enough that
 * the server's accept backlog never overflows (a refused SYN would stall
 * a connect for a second), large enough to be quick. */
#define BATCH 200

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The server's VmRSS in KiB, or -1. */
static long server_rss_kb(long pid)
{
    char path[64], line[256];
    long kb = -1;
    FILE *f;

    snprintf(path, sizeof path, "/proc/%ld/status", pid);
    if (!(f = fopen(path, "r")))
        return -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

static int connect_one(int port)
{
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((unsigned short)port) };
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0)
        return -errno;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || write(fd, "x", 1) != 1) {
        int e = errno;

        close(fd);
        return -e;
    }
    return fd;
}

/* Wait until each of fds[0..n) has echoed its byte; 0, or -1 on an error,
 * a closed connection or 10 s without progress. */
static int await_echoes(const int *fds, int n)
{
    struct pollfd p[BATCH];
    int left = n;
    char c;

    for (int i = 0; i < n; i++)
        p[i] = (struct pollfd){ .fd = fds[i], .events = POLLIN };
    while (left > 0) {
        int r = poll(p, (nfds_t)n, 10000);

        if (r <= 0)
            return -1;
        for (int i = 0; i < n; i++) {
            if (p[i].fd < 0 || !p[i].revents)
                continue;
            if (read(p[i].fd, &c, 1) != 1 || c != 'x')
                return -1;
            p[i].fd = -1;
            left--;
        }
    }
    return 0;
}

/* Are all held connections still open?  An idle one has nothing to read;
 * a readable one was closed or sent something unasked. */
static int all_quiet(const int *fds, int n)
{
    for (int i = 0; i < n; i += BATCH) {
        struct pollfd p[BATCH];
        int m = n - i < BATCH ? n - i : BATCH;

        for (int j = 0; j < m; j++)
            p[j] = (struct pollfd){ .fd = fds[i + j], .events = POLLIN };
        if (poll(p, (nfds_t)m, 0) != 0)
            return 0;
    }
    return 1;
}

static void usage(void)
{
    fprintf(stderr, "usage: ferry-idle-conns --port P --server-pid PID [--conns 10000] "
                    "[--system NAME] [--hold-ms 500]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        { "port", required_argument, NULL, 'p' },    { "server-pid", required_argument, NULL, 's' },
        { "conns", required_argument, NULL, 'c' },   { "system", required_argument, NULL, 'n' },
        { "hold-ms", required_argument, NULL, 'h' }, { NULL, 0, NULL, 0 },
    };
    const char *sys = "?";
    long pid = -1, conns = 10000, hold_ms = 500, rss0, rss1;
    int port = -1, o, ok = 1, *fds, opened = 0;
    struct rlimit rl;
    double t0, secs;

    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'p':
            port = atoi(optarg);
            break;
        case 's':
            pid = atol(optarg);
            break;
        case 'c':
            conns = atol(optarg);
            break;
        case 'n':
            sys = optarg;
            break;
        case 'h':
            hold_ms = atol(optarg);
            break;
        default:
            usage();
        }
    }
    if (port <= 0 || port > 65535 || pid <= 0 || conns <= 0 || hold_ms < 0)
        usage();
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (rlim_t)conns + 16) {
        fprintf(stderr,
                "ferry-idle-conns: %ld connections need %ld descriptors; ulimit -n is %lu\n", conns,
                conns + 16, (unsigned long)rl.rlim_cur);
        return 2;
    }
    if (!(fds = calloc((size_t)conns, sizeof *fds)))
        return 1;
    if ((rss0 = server_rss_kb(pid)) < 0) {
        fprintf(stderr, "ferry-idle-conns: no process %ld\n", pid);
        return 2;
    }
    t0 = now_s();
    while (ok && opened < conns) {
        int m = conns - opened < BATCH ? (int)(conns - opened) : BATCH;

        for (int j = 0; j < m; j++) {
            int fd = connect_one(port);

            if (fd < 0) {
                fprintf(stderr, "ferry-idle-conns: connection %d: %s\n", opened + j, strerror(-fd));
                ok = 0;
                m = j;
                break;
            }
            fds[opened + j] = fd;
        }
        if (await_echoes(fds + opened, m) != 0) {
            fprintf(stderr, "ferry-idle-conns: no echo on a connection of %d..%d\n", opened,
                    opened + m - 1);
            ok = 0;
        }
        opened += m;
    }
    secs = now_s() - t0;
    usleep((useconds_t)hold_ms * 1000);
    rss1 = server_rss_kb(pid);
    if (ok && !all_quiet(fds, opened)) {
        fprintf(stderr, "ferry-idle-conns: a held connection was closed or written to\n");
        ok = 0;
    }
    printf("BENCH workload=idle_conns system=%s n=%d seconds=%.6f ns_per_op=%.2f "
           "ops_per_s=%.0f rss_kb=%ld check=%s rss_growth_kb=%ld bytes_per_conn=%.0f\n",
           sys, opened, secs, opened ? secs * 1e9 / opened : 0.0, secs > 0 ? opened / secs : 0.0,
           rss1, ok ? "ok" : "FAIL", rss1 - rss0,
           opened ? (double)(rss1 - rss0) * 1024.0 / opened : 0.0);
    fflush(stdout);
    for (int i = 0; i < opened; i++)
        close(fds[i]);
    free(fds);
    return ok ? 0 : 1;
}
