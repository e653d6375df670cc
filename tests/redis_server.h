/* redis_server.h - a redis-server of a test's own, on 127.0.0.1 at a free
 * port, for the tests of ferry/redis.h.
 *
 * The program is redis-server from PATH, or the one FERRY_REDIS_SERVER
 * names.  It runs without persistence (--save "" --appendonly no) in a
 * directory of its own under /tmp, removed when it stops.
 */
#ifndef FERRY_REDIS_SERVER_H
#define FERRY_REDIS_SERVER_H

#include <stdbool.h>
#include <sys/types.h>

struct tu_redis {
    pid_t pid;        /* the server; 0 when not running */
    int   port;       /* its TCP port on 127.0.0.1 */
    char  dir[64];    /* its working directory */
};

/*
 * Start a server at a free port (s->port 0) or at s->port, and wait until
 * it answers PING (at most 5 s).  Blocks the calling thread.
 * Returns: 0; -ENOENT when no redis-server could be run (the caller skips,
 * saying so); -ETIMEDOUT when it never answered; another negative errno.
 */
int tu_redis_start(struct tu_redis *s);

/* Kill the server (SIGKILL) and reap it; the port is kept for a restart. */
void tu_redis_kill(struct tu_redis *s);

/* Stop the server and remove its directory. */
void tu_redis_stop(struct tu_redis *s);

/*
 * Run one command on the server with a blocking hiredis connection of its
 * own, outside any loop (a test's look at the server's keys).  Returns the
 * reply's integer (an integer reply), its length (a string or an array),
 * 0 for nil, or -1 on any error; `str`, if not NULL, receives a string
 * reply (up to n bytes, NUL-terminated).
 */
long long tu_redis_query(const struct tu_redis *s, char *str, size_t n, const char *fmt, ...);

#endif /* FERRY_REDIS_SERVER_H */
