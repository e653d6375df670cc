/* redis.c - a Redis connection for tasks: hiredis's asynchronous context
 * driven by events on the loop's event_base, one heap record per command.
 * Loop thread only.
 *
 * Built on ferry's public API (tasks, events, timers, the resolver) and
 * hiredis; nothing here reaches ferry's internals, so the part links
 * against the shared library as any application does.
 *
 * A command's record is on the heap, never on the caller's stack: hiredis
 * keeps it as the callback's private data until the reply comes, and the
 * caller may have given up and returned long before.  Replies come back in
 * the order the commands were sent, so each reply finds its own record;
 * the record says whether its caller still waits (then it gets the reply)
 * or gave up (then ferry frees the reply, after the caller's late
 * function if it gave one).
 *
 * A connection whose tasks wait for pushed messages (the semaphore's
 * waiters) keeps a second hiredis context, subscribed to its wake channel
 * (redis_wake.c, redis_int.h).  The events that drive both contexts on
 * the loop's base are redis_io.c's.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include "ferry/resolve.h"
#include "ferry/redis.h"
#include "ferry/sync.h"
#include "redis_int.h"

#define DEFAULT_CONNECT_TIMEOUT FERRY_SEC(5)
#define DEFAULT_RETRY_MIN       FERRY_MSEC(100)
#define DEFAULT_RETRY_MAX       FERRY_SEC(2)

/* One command whose caller waits (or waited) for the reply. */
struct redis_call {
    ferry_event done;         /* set when the reply or the loss came */
    redisReply *reply;        /* the reply, now the caller's */
    int err;                  /* why no reply came, when reply is NULL */
    bool finished;            /* the callback ran */
    bool abandoned;           /* the caller gave up: the callback frees this */
    ferry_redis_late_fn late; /* for an abandoned call: gets the reply */
    void *late_arg;           /* late's argument */
};

/* ---- Keeping a reply past its callback -------------------------------- */

/*
 * hiredis frees each reply as soon as its callback returns, through the
 * reader's freeObject function.  To hand the reply itself to the waiting
 * task (rather than a deep copy), each context's reader gets a copy of its
 * function table whose freeObject skips the one reply the callback just
 * kept.  Everything runs on the loop's thread, so the table and the kept
 * pointer are per thread.
 */
static __thread redisReplyObjectFunctions kept_fns;
static __thread void (*orig_free)(void *);
static __thread void *kept_reply;

static void free_unless_kept(void *reply)
{
    if (reply != NULL && reply == kept_reply) {
        kept_reply = NULL;
        return;
    }
    orig_free(reply);
}

static void keep_replies(redisAsyncContext *ac)
{
    redisReader *rd = ac->c.reader;

    if (orig_free == NULL) {
        kept_fns = *rd->fn;
        orig_free = kept_fns.freeObject;
        kept_fns.freeObject = free_unless_kept;
    }
    rd->fn = &kept_fns;
}

void ferry_redis_reply_free(redisReply *reply)
{
    if (reply != NULL)
        freeReplyObject(reply);
}

/* ---- Connection attempts ------------------------------------------------ */

static void attempt_failed(ferry_redis *r, int err)
{
    r->err = err;
    r->retry_at = ferry_now() + r->backoff;
    r->backoff = r->backoff > r->opts.retry_max / 2 ? r->opts.retry_max : r->backoff * 2;
}

static void stop_connect_timer(ferry_redis *r)
{
    if (r->connect_timer != NULL) {
        ferry_timer_cancel(r->connect_timer);
        r->connect_timer = NULL;
    }
}

/* The errno of a connection error hiredis reported (it keeps only the
 * message): errno itself right after the failing call, else a refusal. */
static int connect_errno(int saved)
{
    if (saved > 0 && saved != EINPROGRESS && saved != EAGAIN)
        return -saved;
    return -ECONNREFUSED;
}

static void on_connect(const redisAsyncContext *ac, int status)
{
    ferry_redis *r = ac->data;
    int saved = errno;

    stop_connect_timer(r);
    if (status == REDIS_OK) {
        r->err = 0;
        r->retry_at = 0;
        r->backoff = r->opts.retry_min;
        return;
    }
    /* hiredis frees the context after this returns, after running every
     * queued callback with no reply: they read r->err. */
    attempt_failed(r, connect_errno(saved));
    r->ac = NULL;
}

static void on_disconnect(const redisAsyncContext *ac, int status)
{
    ferry_redis *r = ac->data;

    (void)status;
    r->ac = NULL;
    r->client_id = 0;
}

/* The attempt did not finish within opts.connect_timeout. */
static void on_connect_timeout(void *arg)
{
    ferry_redis *r = arg;
    redisAsyncContext *ac = r->ac;

    r->connect_timer = NULL;
    if (ac == NULL || (ac->c.flags & REDIS_CONNECTED))
        return;
    attempt_failed(r, -ETIMEDOUT);
    r->ac = NULL;
    redisAsyncFree(ac);
}

static void on_client_id(redisAsyncContext *ac, void *reply, void *priv)
{
    ferry_redis *r = priv;
    redisReply *rep = reply;

    if (rep != NULL && rep->type == REDIS_REPLY_INTEGER && r->ac == ac)
        r->client_id = rep->integer;
}

/*
 * Start a connection attempt; commands may be queued on it at once (hiredis
 * sends them once it is made).  The first command asks for the
 * connection's CLIENT ID.
 */
static int start_attempt(ferry_redis *r)
{
    redisAsyncContext *ac;
    int err, saved;

    errno = 0;
    if (r->unix_path)
        ac = redisAsyncConnectUnix(r->host);
    else
        ac = redisAsyncConnect(r->host, r->port);
    saved = errno;
    if (ac == NULL)
        return -ENOMEM;
    if (ac->err) {
        err = ac->err == REDIS_ERR_OOM ? -ENOMEM : connect_errno(saved);
        redisAsyncFree(ac);
        attempt_failed(r, err);
        return err;
    }
    err = ferry__redis_io_attach(ac, r->loop, r->base);
    if (err == 0)
        err = ferry_call_later(r->loop, r->opts.connect_timeout, on_connect_timeout, r,
                               &r->connect_timer);
    if (err) {
        redisAsyncFree(ac);
        return err;
    }
    keep_replies(ac);
    ac->data = r;
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    redisAsyncSetConnectCallback(ac, on_connect);
    r->ac = ac;
    r->client_id = 0;
    redisAsyncCommand(ac, on_client_id, r, "CLIENT ID");
    return 0;
}

/* A context to queue a command on: the current one, or a new attempt
 * unless the back-off of a failed one runs. */
static int ensure_conn(ferry_redis *r)
{
    if (r->ac != NULL)
        return 0;
    if (r->err != 0 && ferry_now() < r->retry_at)
        return r->err;
    return start_attempt(r);
}

/* ---- Commands ----------------------------------------------------------- */

/*
 * Whether the formatted command (RESP: "*N\r\n$L\r\nNAME\r\n...") is one
 * that switches the connection to pushed messages, which the one-reply-
 * per-command records here cannot follow.
 */
static bool refused_command(const char *cmd, size_t len)
{
    static const char *const names[] = {
        "subscribe", "psubscribe", "unsubscribe", "punsubscribe", "monitor",
    };
    const char *end = cmd + len;
    const char *p = memchr(cmd, '\n', len);
    char *q;
    long n;

    if (p == NULL || p + 1 >= end || p[1] != '$')
        return false;
    n = strtol(p + 2, &q, 10);
    if (n <= 0 || q + 2 + n > end)
        return false;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (strlen(names[i]) == (size_t)n && strncasecmp(q + 2, names[i], (size_t)n) == 0)
            return true;
    }
    return false;
}

static int format_error(int len)
{
    return len == -1 ? -ENOMEM : -EINVAL;
}

/* The error of a command whose reply will not come. */
static int lost_error(const ferry_redis *r, const redisAsyncContext *ac)
{
    if (r->closing)
        return -ESHUTDOWN;
    if (ac->c.flags & REDIS_CONNECTED)
        return -ECONNRESET;
    return r->err != 0 ? r->err : -ECONNREFUSED;
}

static void free_call(struct redis_call *c)
{
    ferry_event_destroy(&c->done);
    free(c);
}

static void on_reply(redisAsyncContext *ac, void *reply, void *priv)
{
    struct redis_call *c = priv;
    ferry_redis *r = ac->data;

    if (c->abandoned) {
        if (c->late != NULL)
            c->late(r, reply, c->late_arg);
        free_call(c);
        return;
    }
    c->finished = true;
    if (reply != NULL) {
        c->reply = reply;
        kept_reply = reply;
    } else {
        c->err = lost_error(r, ac);
    }
    ferry_event_set(&c->done);
}

static int queue_command(ferry_redis *r, redisCallbackFn *fn, void *priv, const char *cmd,
                         size_t len)
{
    redisAsyncContext *ac = r->ac;

    if (ac->c.flags & (REDIS_DISCONNECTING | REDIS_FREEING))
        return -ECONNRESET;
    if (redisAsyncFormattedCommand(ac, fn, priv, cmd, len) != REDIS_OK)
        return -ENOMEM;
    return 0;
}

/*
 * Send the formatted command `cmd` (freed here) and wait for its reply.
 */
static int call(ferry_redis *r, redisReply **reply, char *cmd, int len, ferry_redis_late_fn late,
                void *late_arg)
{
    struct redis_call *c;
    int rc;

    if (len < 0)
        return format_error(len);
    if (refused_command(cmd, (size_t)len)) {
        rc = -ENOTSUP;
        goto out_free_cmd;
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        rc = -ENOMEM;
        goto out_free_cmd;
    }
    ferry_event_init(&c->done);
    /* A caller already cancelled or past its deadline sends nothing: the
     * wait on a set event only checks for that. */
    ferry_event_set(&c->done);
    rc = ferry_event_wait(&c->done);
    if (rc) {
        /* Given up before anything was sent: the late function learns it
         * at once, with no reply. */
        if (late != NULL)
            late(r, NULL, late_arg);
        free_call(c);
        goto out_free_cmd;
    }
    ferry_event_clear(&c->done);
    rc = ensure_conn(r);
    if (rc == 0)
        rc = queue_command(r, on_reply, c, cmd, (size_t)len);
    redisFreeCommand(cmd);
    if (rc) {
        free_call(c);
        return rc;
    }
    rc = ferry_event_wait(&c->done);
    if (!c->finished) {
        c->abandoned = true;
        c->late = late;
        c->late_arg = late_arg;
        return rc;
    }
    *reply = c->reply;
    rc = c->reply != NULL ? 0 : c->err;
    free_call(c);
    return rc;

out_free_cmd:
    redisFreeCommand(cmd);
    return rc;
}

/* The checks every command starts with. */
static int enter(ferry_redis *r, redisReply **reply)
{
    if (reply != NULL)
        *reply = NULL;
    if (r == NULL || reply == NULL)
        return -EINVAL;
    if (!ferry_loop_is_current(r->loop) || ferry_task_current() == NULL)
        return -EPERM;
    return 0;
}

int ferry_redis_vcommand(ferry_redis *r, redisReply **reply, const char *fmt, va_list ap)
{
    char *cmd = NULL;
    int rc, len;

    rc = enter(r, reply);
    if (rc)
        return rc;
    if (fmt == NULL)
        return -EINVAL;
    len = redisvFormatCommand(&cmd, fmt, ap);
    return call(r, reply, cmd, len, NULL, NULL);
}

int ferry_redis_command(ferry_redis *r, redisReply **reply, const char *fmt, ...)
{
    va_list ap;
    int rc;

    va_start(ap, fmt);
    rc = ferry_redis_vcommand(r, reply, fmt, ap);
    va_end(ap);
    return rc;
}

int ferry_redis_commandv_late(ferry_redis *r, redisReply **reply, int argc, const char **argv,
                              const size_t *argvlen, ferry_redis_late_fn late, void *late_arg)
{
    char *cmd = NULL;
    int rc, len;

    rc = enter(r, reply);
    if (rc)
        return rc;
    if (argc < 1 || argv == NULL)
        return -EINVAL;
    len = redisFormatCommandArgv(&cmd, argc, argv, argvlen);
    return call(r, reply, cmd, len, late, late_arg);
}

int ferry_redis_commandv(ferry_redis *r, redisReply **reply, int argc, const char **argv,
                         const size_t *argvlen)
{
    return ferry_redis_commandv_late(r, reply, argc, argv, argvlen, NULL, NULL);
}

int ferry_redis_send(ferry_redis *r, int argc, const char **argv, const size_t *argvlen)
{
    char *cmd = NULL;
    int rc, len;

    if (r == NULL || argc < 1 || argv == NULL)
        return -EINVAL;
    if (!ferry_loop_is_current(r->loop))
        return -EPERM;
    if (r->ac == NULL || r->closing)
        return -ENOTCONN;
    len = redisFormatCommandArgv(&cmd, argc, argv, argvlen);
    if (len < 0)
        return format_error(len);
    if (refused_command(cmd, (size_t)len))
        rc = -ENOTSUP;
    else
        rc = queue_command(r, NULL, NULL, cmd, (size_t)len);
    redisFreeCommand(cmd);
    return rc == -ECONNRESET ? -ENOTCONN : rc;
}

/* A command sent with ferry__redis_send_cb(). */
struct redis_cb {
    ferry__redis_reply_fn fn; /* gets the reply */
    void *arg;                /* fn's argument */
};

static void on_cb_reply(redisAsyncContext *ac, void *reply, void *priv)
{
    struct redis_cb cb = *(struct redis_cb *)priv;

    free(priv);
    cb.fn(ac->data, reply, cb.arg);
}

int ferry__redis_send_cb(ferry_redis *r, int argc, const char **argv, const size_t *argvlen,
                         ferry__redis_reply_fn fn, void *arg)
{
    struct redis_cb *cb;
    char *cmd = NULL;
    int rc, len;

    if (r->closing)
        return -ENOTCONN;
    rc = ensure_conn(r);
    if (rc)
        return rc;
    cb = malloc(sizeof(*cb));
    if (cb == NULL)
        return -ENOMEM;
    cb->fn = fn;
    cb->arg = arg;
    len = redisFormatCommandArgv(&cmd, argc, argv, argvlen);
    rc = len < 0 ? format_error(len) : queue_command(r, on_cb_reply, cb, cmd, (size_t)len);
    if (len >= 0)
        redisFreeCommand(cmd);
    if (rc) {
        free(cb);
        return rc == -ECONNRESET ? -ENOTCONN : rc;
    }
    return 0;
}

ferry_loop *ferry__redis_loop(const ferry_redis *r)
{
    return r->loop;
}

bool ferry_redis_connected(const ferry_redis *r)
{
    return r != NULL && r->ac != NULL && (r->ac->c.flags & REDIS_CONNECTED);
}

int64_t ferry_redis_client_id(const ferry_redis *r)
{
    return ferry_redis_connected(r) ? r->client_id : 0;
}

/* ---- Connect and close -------------------------------------------------- */

static int check_opts(ferry_redis_opts *o, const ferry_redis_opts *in)
{
    if (in != NULL)
        *o = *in;
    else
        memset(o, 0, sizeof(*o));
    if (o->connect_timeout < 0 || o->retry_min < 0 || o->retry_max < 0)
        return -EINVAL;
    if (o->connect_timeout == 0)
        o->connect_timeout = DEFAULT_CONNECT_TIMEOUT;
    if (o->retry_min == 0)
        o->retry_min = DEFAULT_RETRY_MIN;
    if (o->retry_max == 0)
        o->retry_max = o->retry_min > DEFAULT_RETRY_MAX ? o->retry_min : DEFAULT_RETRY_MAX;
    if (o->retry_max < o->retry_min)
        return -EINVAL;
    return 0;
}

/* The address to connect to: `host` itself if it is a path or an IP
 * address, else the first address the resolver gives for it. */
static int resolve(ferry_redis *r, const char *host)
{
    struct in6_addr a6;
    struct in_addr a4;
    struct addrinfo hints, *res = NULL;
    char buf[INET6_ADDRSTRLEN];
    const void *addr;
    int rc;

    r->unix_path = host[0] == '/';
    if (r->unix_path || inet_pton(AF_INET, host, &a4) == 1 || inet_pton(AF_INET6, host, &a6) == 1) {
        r->host = strdup(host);
        return r->host != NULL ? 0 : -ENOMEM;
    }
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    rc = ferry_getaddrinfo(host, NULL, &hints, &res);
    if (rc)
        return rc;
    if (res->ai_family == AF_INET)
        addr = &((const struct sockaddr_in *)(const void *)res->ai_addr)->sin_addr;
    else
        addr = &((const struct sockaddr_in6 *)(const void *)res->ai_addr)->sin6_addr;
    if (inet_ntop(res->ai_family, addr, buf, sizeof(buf)) == NULL)
        rc = -EINVAL;
    ferry_freeaddrinfo(res);
    if (rc)
        return rc;
    r->host = strdup(buf);
    return r->host != NULL ? 0 : -ENOMEM;
}

/*
 * Make `r`'s first connection and wait until a PING is answered, for at
 * most opts.connect_timeout in all: a server that accepts connections but
 * does not answer (stopped, or not Redis) gives -ETIMEDOUT, not a hang.
 */
static int first_connect(ferry_redis *r)
{
    redisReply *reply = NULL;
    ferry_scope sc;
    int rc;

    r->loop = ferry_loop_current();
    r->base = ferry_loop_base(r->loop);
    r->backoff = r->opts.retry_min;
    ferry__redis_wake_init(r);
    rc = start_attempt(r);
    if (rc)
        return rc;
    rc = ferry_scope_enter(&sc, ferry_now() + r->opts.connect_timeout, 0);
    if (rc)
        return rc;
    rc = ferry_redis_command(r, &reply, "PING");
    ferry_scope_exit(&sc);
    ferry_redis_reply_free(reply);
    return rc;
}

static int check_caller(void)
{
    ferry_loop *loop = ferry_loop_current();

    if (loop == NULL || ferry_task_current() == NULL)
        return -EPERM;
    return 0;
}

int ferry_redis_connect(ferry_redis **out, const char *host, int port, const ferry_redis_opts *opts)
{
    ferry_redis *r;
    int rc;

    if (out != NULL)
        *out = NULL;
    if (out == NULL || host == NULL || host[0] == '\0')
        return -EINVAL;
    if (host[0] != '/' && (port <= 0 || port > 65535))
        return -EINVAL;
    rc = check_caller();
    if (rc)
        return rc;
    r = calloc(1, sizeof(*r));
    if (r == NULL)
        return -ENOMEM;
    r->port = port;
    rc = check_opts(&r->opts, opts);
    if (rc == 0)
        rc = resolve(r, host);
    if (rc == 0)
        rc = first_connect(r);
    if (rc) {
        ferry_redis_close(r);
        return rc;
    }
    *out = r;
    return 0;
}

int ferry_redis_connect_like(ferry_redis **out, const ferry_redis *like)
{
    ferry_redis *r;
    int rc;

    if (out != NULL)
        *out = NULL;
    if (out == NULL || like == NULL)
        return -EINVAL;
    rc = check_caller();
    if (rc)
        return rc;
    if (!ferry_loop_is_current(like->loop))
        return -EPERM;
    r = calloc(1, sizeof(*r));
    if (r == NULL)
        return -ENOMEM;
    r->port = like->port;
    r->unix_path = like->unix_path;
    r->opts = like->opts;
    r->host = strdup(like->host);
    rc = r->host != NULL ? first_connect(r) : -ENOMEM;
    if (rc) {
        ferry_redis_close(r);
        return rc;
    }
    *out = r;
    return 0;
}

void ferry_redis_close(ferry_redis *r)
{
    redisAsyncContext *ac;

    if (r == NULL)
        return;
    r->closing = true;
    stop_connect_timer(r);
    ferry__redis_wake_stop_timer(&r->wake);
    ac = r->wake.ac;
    if (ac != NULL) {
        r->wake.ac = NULL;
        redisAsyncFree(ac);
    }
    ac = r->ac;
    if (ac != NULL) {
        /* Commands sent without waiting (a release) go out if the socket
         * takes them at once: closing right after them is common. */
        if (ac->c.flags & REDIS_CONNECTED)
            ferry__redis_write_quietly(ac, false, true);
        /* Runs every queued callback with no reply (their callers get
         * -ESHUTDOWN; abandoned records are freed), then on_disconnect. */
        redisAsyncFree(ac);
        r->ac = NULL;
    }
    free(r->host);
    free(r);
}
