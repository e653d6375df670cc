/* http_server.c - a small HTTP/1.1 server for the tests and the bench of
 * the libcurl part: a process of its own (so the client's descriptor
 * counts are its own), listening on 127.0.0.1 at a free port, which it
 * prints as one line on stdout once it accepts.  One thread per
 * connection, blocking I/O, keep-alive unless the request says close.
 *
 *   GET  /hello          "hello world"
 *   GET  /size/N         N bytes of 'a'..'z' repeated
 *   POST /echo           the request's body
 *   GET  /slow/MS        "slow" after MS milliseconds
 *   GET  /trickle/N      N bytes, one every 2 ms
 *   GET  /never          reads the request and never answers
 *   GET  /close          announces 100 bytes, sends 10, closes
 *   GET  /bye            "bye", keep-alive announced, closed 20 ms later
 *   GET  /count          the connections accepted so far, in decimal
 *
 * Runs until killed.  Usage: http_server [port]  (0 or none: any free).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static atomic_long accepted;

static void msleep(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static int send_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;

    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int reply(int fd, int code, const char *body, size_t len, bool close_after)
{
    char head[256];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\nContent-Length: %zu\r\nContent-Type: text/plain\r\n%s\r\n",
                     code, code == 200 ? "OK" : "Not Found", len,
                     close_after ? "Connection: close\r\n" : "");

    if (send_all(fd, head, (size_t)n) != 0)
        return -1;
    return len ? send_all(fd, body, len) : 0;
}

/* Serve one request from `buf` (holding `have` bytes, the head ending at
 * `head_len`).  Returns: bytes of buf consumed, or -1 to close. */
static long serve(int fd, char *buf, size_t have, size_t head_len, size_t cap)
{
    char method[8], path[256];
    const char *cl;
    size_t body_len = 0, total;
    bool close_after;
    char *body;

    if (sscanf(buf, "%7s %255s", method, path) != 2)
        return -1;
    buf[head_len - 1] = '\0';
    cl = strcasestr(buf, "\r\ncontent-length:");
    if (cl)
        body_len = strtoul(cl + 17, NULL, 10);
    close_after = strcasestr(buf, "\r\nconnection: close") != NULL;
    total = head_len + body_len;
    if (total > cap)
        return -1;
    while (have < total) {
        ssize_t n = recv(fd, buf + have, cap - have, 0);
        if (n <= 0)
            return -1;
        have += (size_t)n;
    }
    body = buf + head_len;

    if (strcmp(path, "/hello") == 0) {
        if (reply(fd, 200, "hello world", 11, close_after))
            return -1;
    } else if (strncmp(path, "/size/", 6) == 0) {
        size_t n = strtoul(path + 6, NULL, 10);
        char *b = malloc(n ? n : 1);
        if (!b)
            return -1;
        for (size_t i = 0; i < n; i++)
            b[i] = (char)('a' + i % 26);
        int rc = reply(fd, 200, b, n, close_after);
        free(b);
        if (rc)
            return -1;
    } else if (strcmp(path, "/echo") == 0) {
        if (reply(fd, 200, body, body_len, close_after))
            return -1;
    } else if (strncmp(path, "/slow/", 6) == 0) {
        msleep(strtol(path + 6, NULL, 10));
        if (reply(fd, 200, "slow", 4, close_after))
            return -1;
    } else if (strcmp(path, "/never") == 0) {
        char c;
        while (recv(fd, &c, 1, 0) > 0)
            ;
        return -1;
    } else if (strcmp(path, "/close") == 0) {
        const char *h = "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789";
        send_all(fd, h, strlen(h));
        return -1;
    } else if (strcmp(path, "/bye") == 0) {
        /* Answers as if keeping the connection, then closes it idle. */
        reply(fd, 200, "bye", 3, false);
        msleep(20);
        return -1;
    } else if (strcmp(path, "/count") == 0) {
        char b[32];
        int n = snprintf(b, sizeof b, "%ld", atomic_load(&accepted));
        if (reply(fd, 200, b, (size_t)n, close_after))
            return -1;
    } else {
        if (reply(fd, 404, "no", 2, close_after))
            return -1;
    }
    return close_after ? -1 : (long)total;
}

static void *conn_main(void *arg)
{
    int fd = (int)(intptr_t)arg;
    size_t cap = 1 << 20, have = 0;
    char *buf = malloc(cap + 1);

    while (buf) {
        char *end;
        long used;

        buf[have] = '\0';
        end = strstr(buf, "\r\n\r\n");
        if (!end) {
            ssize_t n;

            if (have == cap)
                break;
            n = recv(fd, buf + have, cap - have, 0);
            if (n <= 0)
                break;
            have += (size_t)n;
            continue;
        }
        /* The trickle endpoint needs the head it announces: handled here. */
        if (strncmp(buf, "GET /trickle/", 13) == 0) {
            size_t n = strtoul(buf + 13, NULL, 10);
            char head[128];
            int hl = snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n\r\n", n);
            int one = 1;

            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            if (send_all(fd, head, (size_t)hl) != 0)
                break;
            for (size_t i = 0; i < n; i++) {
                char c = (char)('a' + i % 26);
                msleep(2);
                if (send_all(fd, &c, 1) != 0)
                    goto out;
            }
            used = (long)(end + 4 - buf);
        } else {
            used = serve(fd, buf, have, (size_t)(end + 4 - buf), cap);
            if (used < 0)
                break;
        }
        memmove(buf, buf + used, have - (size_t)used);
        have -= (size_t)used;
    }
out:
    free(buf);
    close(fd);
    return NULL;
}

int main(int argc, char **argv)
{
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    int one = 1;
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    /* Dies with the process that started it, also when a test that
     * started it is killed for its timeout. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1)
        return 1;
    signal(SIGPIPE, SIG_IGN);
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons((uint16_t)(argc > 1 ? atoi(argv[1]) : 0));
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(lfd, 1024) != 0 ||
        getsockname(lfd, (struct sockaddr *)&sa, &sl) != 0) {
        perror("http_server");
        return 1;
    }
    printf("%d\n", ntohs(sa.sin_port));
    fflush(stdout);
    for (;;) {
        pthread_attr_t at;
        pthread_t th;
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);

        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE)
                continue;
            return 1;
        }
        atomic_fetch_add(&accepted, 1);
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&at, 64 * 1024);
        if (pthread_create(&th, &at, conn_main, (void *)(intptr_t)fd) != 0)
            close(fd);
        pthread_attr_destroy(&at);
    }
}
