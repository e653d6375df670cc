/* http_load.c - a small HTTP load client written with ferry: one task per
 * request, non-blocking sockets and ferry_wait_fd(), a semaphore for the
 * concurrency.  Loopback only.
 *
 *   http_load PORT REQUESTS CONCURRENCY PATH... [--expect CODE] [--print-body]
 *
 * Sends REQUESTS GETs to 127.0.0.1:PORT, cycling through the PATHs, each on
 * its own connection (Connection: close), at most CONCURRENCY at once.
 * A 200 answer to a path with a query "k=v" must contain "v" in its body.
 * Prints one line of counts:
 *
 *   sent N, answered A (200: x, 404: y, 504: z, other: w), refused R,
 *   no answer U, bad bodies B, slowest M ms
 *
 * "refused": the connection was not accepted (the server is gone or no
 * longer listening).  "no answer": connected and sent, but the connection
 * closed without a complete status line.  Exit status: 0, or 1 if
 * --expect was given and some request did not get that code.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "ferry/ferry.h"

static int port, requests, concurrency, npaths, expect;
static char **paths;
static bool print_body;
static ferry_sem slots;
static int answered, refused, no_answer, bad_body, by_code[4], other;
static double slowest_ms;

/* Read until the server closes; returns bytes read or a negative errno. */
static int read_all(int fd, char *buf, size_t cap)
{
    size_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r > 0) {
            n += (size_t)r;
            if (n == cap - 1)
                break;
        } else if (r == 0) {
            break;
        } else if (errno == EAGAIN) {
            int rc = ferry_wait_fd(fd, FERRY_READ, NULL);
            if (rc)
                return rc;
        } else if (errno == EINTR) {
            continue;
        } else {
            return n ? (int)n : -errno;
        }
    }
    buf[n] = 0;
    return (int)n;
}

static int one_request(void *arg)
{
    const char *path = paths[(intptr_t)arg % npaths];
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    char req[512], resp[8192];
    int64_t t0;
    int fd, rc, code;

    if (ferry_sem_acquire(&slots))
        return 0;
    t0 = ferry_now();
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        refused++;
        goto out;
    }
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) && errno != EINPROGRESS) {
        refused++;
        goto out_close;
    }
    int err = 0;
    socklen_t len = sizeof err;
    if (ferry_wait_fd(fd, FERRY_WRITE, NULL) ||
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) || err) {
        refused++;
        goto out_close;
    }
    int n = snprintf(req, sizeof req,
                     "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", path);
    if (write(fd, req, (size_t)n) != n) {     /* a small request fits the socket buffer */
        no_answer++;
        goto out_close;
    }
    rc = read_all(fd, resp, sizeof resp);
    if (rc <= 0 || sscanf(resp, "HTTP/1.%*d %d", &code) != 1) {
        no_answer++;
        goto out_close;
    }
    answered++;
    if (code == 200)
        by_code[0]++;
    else if (code == 404)
        by_code[1]++;
    else if (code == 504)
        by_code[2]++;
    else if (code == 503)
        by_code[3]++;
    else
        other++;
    const char *body = strstr(resp, "\r\n\r\n");
    body = body ? body + 4 : "";
    const char *eq = strchr(path, '=');
    if (code == 200 && eq && !strstr(body, eq + 1))
        bad_body++;
    if (expect && code != expect)
        bad_body++;
    if (print_body)
        printf("%s", body);
    double ms = (double)(ferry_now() - t0) / 1e6;
    if (ms > slowest_ms)
        slowest_ms = ms;
out_close:
    close(fd);
out:
    ferry_sem_release(&slots);
    return 0;
}

static int main_task(void *arg)
{
    ferry_group group;
    ferry_scope limit;
    int64_t t0 = ferry_now();

    ferry_sem_init(&slots, (uint64_t)concurrency, 0);
    ferry_scope_enter(&limit, ferry_now() + FERRY_SEC(120), 0);   /* bounded in time */
    ferry_group_init(&group);
    for (int i = 0; i < requests; i++)
        ferry_group_spawn(&group, one_request, (void *)(intptr_t)i, NULL);
    int rc = ferry_group_wait(&group);
    ferry_scope_exit(&limit);
    printf("sent %d, answered %d (200: %d, 404: %d, 504: %d, 503: %d, other: %d), "
           "refused %d, no answer %d, bad bodies %d, slowest %.0f ms, %.0f ms in all\n",
           requests, answered, by_code[0], by_code[1], by_code[2], by_code[3], other,
           refused, no_answer, bad_body, slowest_ms, (double)(ferry_now() - t0) / 1e6);
    return rc;
}

int main(int argc, char **argv)
{
    static char *list[64];

    if (argc < 5) {
        fprintf(stderr, "usage: http_load PORT REQUESTS CONCURRENCY PATH... "
                        "[--expect CODE] [--print-body]\n");
        return 2;
    }
    port = atoi(argv[1]);
    requests = atoi(argv[2]);
    concurrency = atoi(argv[3]);
    for (int i = 4; i < argc; i++) {
        if (strcmp(argv[i], "--expect") == 0 && i + 1 < argc)
            expect = atoi(argv[++i]);
        else if (strcmp(argv[i], "--print-body") == 0)
            print_body = true;
        else if (npaths < 64)
            list[npaths++] = argv[i];
    }
    paths = list;
    if (port <= 0 || requests <= 0 || requests > 100000 || concurrency <= 0 || npaths == 0)
        return 2;
    int rc = ferry_run(main_task, NULL);
    if (rc)
        return 1;
    return expect && (answered != requests || bad_body) ? 1 : 0;
}
