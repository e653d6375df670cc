/* redis_server.c - a redis-server of a test's own (redis_server.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "redis_server.h"

/* A port nobody listens on now: the kernel's pick for a socket bound to
 * port 0, released again. */
static int free_port(void)
{
    struct sockaddr_in a;
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1;

    if (fd < 0)
        return -errno;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port > 0 ? port : -EADDRNOTAVAIL;
}

static bool answers_ping(int port)
{
    struct timeval tv = { 0, 200000 };
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    redisReply *r;
    bool ok = false;

    if (c == NULL)
        return false;
    if (!c->err) {
        r = redisCommand(c, "PING");
        ok = r != NULL && r->type == REDIS_REPLY_STATUS;
        if (r)
            freeReplyObject(r);
    }
    redisFree(c);
    return ok;
}

int tu_redis_start(struct tu_redis *s)
{
    const char *prog = getenv("FERRY_REDIS_SERVER");
    char portbuf[16];
    int status;

    if (prog == NULL || prog[0] == '\0')
        prog = "redis-server";
    if (s->port == 0) {
        s->port = free_port();
        if (s->port < 0)
            return s->port;
    }
    if (s->dir[0] == '\0') {
        snprintf(s->dir, sizeof(s->dir), "/tmp/ferry-redis-XXXXXX");
        if (mkdtemp(s->dir) == NULL)
            return -errno;
    }
    snprintf(portbuf, sizeof(portbuf), "%d", s->port);
    s->pid = fork();
    if (s->pid < 0)
        return -errno;
    if (s->pid == 0) {
        int null = open("/dev/null", O_RDWR);

        /* The server dies with the test (a test that timed out never
         * reaches its .fini), and keeps none of the test's output pipes
         * open: its log goes to its directory. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (null >= 0) {
            dup2(null, 0);
            dup2(null, 1);
            dup2(null, 2);
        }
        execlp(prog, prog, "--port", portbuf, "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--dir", s->dir, "--daemonize", "no",
               "--loglevel", "warning", "--logfile", "redis.log", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 250; i++) {
        struct timespec ts = { 0, 20 * 1000000 };

        if (waitpid(s->pid, &status, WNOHANG) == s->pid) {
            s->pid = 0;
            return WIFEXITED(status) && WEXITSTATUS(status) == 127 ? -ENOENT : -ECHILD;
        }
        if (answers_ping(s->port))
            return 0;
        nanosleep(&ts, NULL);
    }
    tu_redis_kill(s);
    return -ETIMEDOUT;
}

void tu_redis_kill(struct tu_redis *s)
{
    if (s->pid > 0) {
        kill(s->pid, SIGKILL);
        while (waitpid(s->pid, NULL, 0) < 0 && errno == EINTR)
            ;
    }
    s->pid = 0;
}

void tu_redis_stop(struct tu_redis *s)
{
    char cmd[128];

    tu_redis_kill(s);
    if (s->dir[0] != '\0') {
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", s->dir);
        if (system(cmd) != 0)
            fprintf(stderr, "redis_server: could not remove %s\n", s->dir);
        s->dir[0] = '\0';
    }
}

long long tu_redis_query(const struct tu_redis *s, char *str, size_t n, const char *fmt, ...)
{
    struct timeval tv = { 2, 0 };
    redisContext *c = redisConnectWithTimeout("127.0.0.1", s->port, tv);
    redisReply *r = NULL;
    long long v = -1;
    va_list ap;

    if (str != NULL && n > 0)
        str[0] = '\0';
    if (c == NULL || c->err)
        goto out;
    va_start(ap, fmt);
    r = redisvCommand(c, fmt, ap);
    va_end(ap);
    if (r == NULL)
        goto out;
    switch (r->type) {
    case REDIS_REPLY_INTEGER:
        v = r->integer;
        break;
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
        v = (long long)r->len;
        if (str != NULL && n > 0)
            snprintf(str, n, "%.*s", (int)r->len, r->str);
        break;
    case REDIS_REPLY_ARRAY:
        v = (long long)r->elements;
        break;
    case REDIS_REPLY_NIL:
        v = 0;
        break;
    default:
        break;
    }
out:
    if (r)
        freeReplyObject(r);
    if (c)
        redisFree(c);
    return v;
}
