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
 * waiters) keeps a second hiredis context, subscribed to its wake channel;
 * see "The wake channel" below and redis_int.h.
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

/* The wake channel (redis_int.h): a subscriber connection of its own. */
struct redis_wake {
    redisAsyncContext *ac;        /* the subscriber; NULL while there is none */
    bool               up;        /* ac's SUBSCRIBE was confirmed */
    uint64_t           epoch;     /* subscriptions confirmed so far */
    int64_t            retry_at;  /* no new attempt before this time */
    int64_t            backoff;   /* the wait after the next failed attempt */
    ferry_timer       *timer;     /* ends an attempt that takes too long, or
                                   * starts the next one after a back-off */
    struct ferry__redis_waiter *first, *last; /* registered, oldest first */
    char               id[64];    /* the channel's name after "ferry-wake:" */
};

struct ferry_redis {
    ferry_loop        *loop;      /* the loop whose task made it */
    struct event_base *base;      /* that loop's base */
    redisAsyncContext *ac;        /* the context; NULL while down */
    char              *host;      /* IP address (or Unix socket path) */
    int                port;      /* TCP port; unused for a Unix socket */
    bool               unix_path; /* host is a Unix socket's path */
    bool               closing;   /* ferry_redis_close() is freeing it */
    ferry_redis_opts   opts;      /* with the defaults filled in */
    int                err;       /* error of the last failed attempt; 0 after a success */
    int64_t            retry_at;  /* no new attempt before this time */
    int64_t            backoff;   /* the wait after the next failed attempt */
    ferry_timer       *connect_timer; /* ends an attempt that takes too long */
    int64_t            client_id; /* CLIENT ID of the current connection; 0 unknown */
    struct redis_wake  wake;      /* the wake channel of its waiters */
};

/* One command whose caller waits (or waited) for the reply. */
struct redis_call {
    ferry_event         done;      /* set when the reply or the loss came */
    redisReply         *reply;     /* the reply, now the caller's */
    int                 err;       /* why no reply came, when reply is NULL */
    bool                finished;  /* the callback ran */
    bool                abandoned; /* the caller gave up: the callback frees this */
    ferry_redis_late_fn late;      /* for an abandoned call: gets the reply */
    void               *late_arg;  /* late's argument */
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

/* ---- Events on the loop's base ------------------------------------------ */

/*
 * hiredis's event hooks, with the allocations checked and a cleanup that
 * may run twice.  They differ from hiredis's libevent adapter in three
 * ways, each to save system calls per command:
 *
 * - The read event is persistent: hiredis always wants replies read once
 *   connected, so it stays added until the cleanup and costs no epoll_ctl
 *   per command.  A read event with nothing pending is harmless: hiredis
 *   reads no reply.
 * - A write hiredis asks for on an established connection is done by a
 *   flush at the end of the current turn (one per connection until it
 *   runs, so the commands of every task in that turn go out in one write),
 *   without a write event.  Only if output remains (the socket was full)
 *   is the write event added.  While connecting, hiredis learns from the
 *   write event that the connect finished, so that path keeps the event.
 * - The SIGPIPE guard around the write (see write_quietly()) is skipped
 *   when the process ignores SIGPIPE.
 */
struct redis_io {
    redisAsyncContext *ac;    /* the context the events serve; NULL once it is gone */
    ferry_loop        *loop;  /* runs the flush */
    struct event      *rev;   /* readable, persistent */
    struct event      *wev;   /* writable, one-shot */
    bool               flush_queued;  /* flush_soon() is scheduled and has not run */
    bool               writing;       /* inside io_write(): hiredis's wish to write more goes to wev */
    bool               pipe_ignored;  /* SIGPIPE was ignored when the connection began */
};

static void on_readable(evutil_socket_t fd, short what, void *arg)
{
    struct redis_io *io = arg;

    (void)fd;
    (void)what;
    redisAsyncHandleRead(io->ac);
}

/*
 * hiredis writes with write(2), which raises SIGPIPE when the server has
 * gone.  Block it on this thread around the write, take back a SIGPIPE the
 * write raised (not one that was already pending: that one is the
 * application's) and restore the mask; the process's disposition is never
 * changed.  A process that ignores SIGPIPE needs none of this.
 * `flush_only`: one write of what is queued, without hiredis's handling of
 * the result (for a context about to be freed).
 */
static void write_quietly(redisAsyncContext *ac, bool pipe_ignored, bool flush_only)
{
    static const struct timespec zero = { 0, 0 };
    sigset_t pipe_set, old, pending;
    bool was_pending = false;
    int done;

    if (pipe_ignored) {
        if (flush_only)
            redisBufferWrite(&ac->c, &done);
        else
            redisAsyncHandleWrite(ac);
        return;
    }
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
    if (sigpending(&pending) == 0)
        was_pending = sigismember(&pending, SIGPIPE) == 1;
    if (flush_only)
        redisBufferWrite(&ac->c, &done);
    else
        redisAsyncHandleWrite(ac);
    if (!was_pending && sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) {
        while (sigtimedwait(&pipe_set, NULL, &zero) < 0 && errno == EINTR)
            ;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/*
 * Let hiredis write.  The write may end the connection, and hiredis then
 * runs the cleanup, which leaves `io` for this function to free.
 */
static void io_write(struct redis_io *io)
{
    io->writing = true;
    write_quietly(io->ac, io->pipe_ignored, false);
    io->writing = false;
    if (io->ac == NULL && !io->flush_queued)
        free(io);
}

static void on_writable(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    io_write(arg);
}

/* The flush at the end of the turn in which hiredis asked for a write. */
static void flush_soon(void *arg)
{
    struct redis_io *io = arg;

    io->flush_queued = false;
    if (io->ac == NULL) {
        free(io);
        return;
    }
    /* With the write event added, the socket was full: the event writes
     * when it takes more. */
    if (event_pending(io->wev, EV_WRITE, NULL))
        return;
    io_write(io);
}

static void io_add_read(void *p)
{
    struct redis_io *io = p;

    if (io != NULL && !event_pending(io->rev, EV_READ, NULL))
        event_add(io->rev, NULL);
}

static void io_del_read(void *p)
{
    struct redis_io *io = p;

    if (io != NULL)
        event_del(io->rev);
}

static void io_add_write(void *p)
{
    struct redis_io *io = p;

    if (io == NULL)
        return;
    /* Never write from inside this hook: hiredis calls it while it
     * queues a command, with its own state half updated. */
    if (io->writing || !(io->ac->c.flags & REDIS_CONNECTED)) {
        event_add(io->wev, NULL);
        return;
    }
    if (io->flush_queued || event_pending(io->wev, EV_WRITE, NULL))
        return;
    if (ferry_call_soon(io->loop, flush_soon, io) == 0)
        io->flush_queued = true;
    else
        event_add(io->wev, NULL);   /* no memory for the flush: the event writes */
}

static void io_del_write(void *p)
{
    struct redis_io *io = p;

    if (io != NULL)
        event_del(io->wev);
}

/* hiredis is done with the context.  A queued flush or a write under way
 * still holds `io`: it frees it. */
static void io_cleanup(void *p)
{
    struct redis_io *io = p;

    if (io == NULL)
        return;
    io->ac->ev.data = NULL;
    io->ac->ev.cleanup = NULL;
    io->ac = NULL;
    event_free(io->rev);
    event_free(io->wev);
    io->rev = NULL;
    io->wev = NULL;
    if (!io->flush_queued && !io->writing)
        free(io);
}

static int io_attach(redisAsyncContext *ac, ferry_loop *loop, struct event_base *base)
{
    struct redis_io *io = calloc(1, sizeof(*io));
    struct sigaction sa;

    if (io == NULL)
        return -ENOMEM;
    io->ac = ac;
    io->loop = loop;
    io->pipe_ignored = sigaction(SIGPIPE, NULL, &sa) == 0 && sa.sa_handler == SIG_IGN;
    io->rev = event_new(base, ac->c.fd, EV_READ | EV_PERSIST, on_readable, io);
    io->wev = event_new(base, ac->c.fd, EV_WRITE, on_writable, io);
    if (io->rev == NULL || io->wev == NULL) {
        if (io->rev)
            event_free(io->rev);
        if (io->wev)
            event_free(io->wev);
        free(io);
        return -ENOMEM;
    }
    ac->ev.addRead = io_add_read;
    ac->ev.delRead = io_del_read;
    ac->ev.addWrite = io_add_write;
    ac->ev.delWrite = io_del_write;
    ac->ev.cleanup = io_cleanup;
    ac->ev.data = io;
    return 0;
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
    err = io_attach(ac, r->loop, r->base);
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
static int call(ferry_redis *r, redisReply **reply, char *cmd, int len,
                ferry_redis_late_fn late, void *late_arg)
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
    ferry__redis_reply_fn fn;   /* gets the reply */
    void                 *arg;  /* fn's argument */
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

/* ---- The wake channel ---------------------------------------------------- */

#define WAKE_PREFIX "ferry-wake:"

/* The channel's name: the pid, a random number drawn once per thread and a
 * count, so that no two connections of any process share one. */
static __thread uint64_t wake_seed;
static __thread unsigned wake_count;

static void wake_init(ferry_redis *r)
{
    if (wake_seed == 0) {
        if (getrandom(&wake_seed, sizeof(wake_seed), 0) != sizeof(wake_seed))
            wake_seed = (uint64_t)ferry_now() ^ ((uint64_t)getpid() << 32);
        wake_seed |= 1;
    }
    snprintf(r->wake.id, sizeof(r->wake.id), "%ld.%016" PRIx64 ".%u", (long)getpid(), wake_seed,
             ++wake_count);
    r->wake.backoff = r->opts.retry_min;
}

static void wake_stop_timer(struct redis_wake *wk)
{
    if (wk->timer != NULL) {
        ferry_timer_cancel(wk->timer);
        wk->timer = NULL;
    }
}

/* Every registered waiter checks again: the channel came up (messages
 * before it were not seen) or was lost (messages from now on are not). */
static void wake_all(ferry_redis *r)
{
    for (struct ferry__redis_waiter *w = r->wake.first; w != NULL; w = w->next)
        ferry_event_set(w->ev);
}

static void wake_start(ferry_redis *r);

static void wake_retry(void *arg)
{
    ferry_redis *r = arg;

    r->wake.timer = NULL;
    if (r->wake.ac == NULL && r->wake.first != NULL)
        wake_start(r);
}

/* The subscriber is gone (its context is or is being freed): the next
 * attempt after the back-off, if waiters are still registered then. */
static void wake_lost(ferry_redis *r)
{
    struct redis_wake *wk = &r->wake;
    bool was_up = wk->up;

    wk->up = false;
    wake_stop_timer(wk);
    if (r->closing)
        return;
    wk->retry_at = ferry_now() + wk->backoff;
    if (ferry_call_later(r->loop, wk->backoff, wake_retry, r, &wk->timer) != 0)
        wk->timer = NULL;   /* the next registration tries again */
    wk->backoff = wk->backoff > r->opts.retry_max / 2 ? r->opts.retry_max : wk->backoff * 2;
    if (was_up)
        wake_all(r);
}

/* A message "VALUE TOKEN" for the waiter registered with TOKEN. */
static void wake_deliver(ferry_redis *r, const char *msg, size_t len)
{
    const char *sp = memchr(msg, ' ', len), *tok;
    char *end;
    long long v;
    size_t tlen;

    if (sp == NULL)
        return;
    v = strtoll(msg, &end, 10);
    if (end != sp || v <= 0)
        return;
    tok = sp + 1;
    tlen = len - (size_t)(tok - msg);
    for (struct ferry__redis_waiter *w = r->wake.first; w != NULL; w = w->next) {
        if (strlen(w->token) == tlen && memcmp(w->token, tok, tlen) == 0) {
            w->value = v;
            ferry_event_set(w->ev);
            return;
        }
    }
}

/* The channel's callback: the SUBSCRIBE's confirmation, then each message;
 * NULL when the context is freed. */
static void wake_on_reply(redisAsyncContext *ac, void *reply, void *priv)
{
    ferry_redis *r = priv;
    struct redis_wake *wk = &r->wake;
    redisReply *rep = reply;
    const char *kind;

    if (rep == NULL || wk->ac != ac || rep->type != REDIS_REPLY_ARRAY || rep->elements < 3 ||
        rep->element[0]->type != REDIS_REPLY_STRING)
        return;
    kind = rep->element[0]->str;
    if (strcmp(kind, "subscribe") == 0 && !wk->up) {
        wake_stop_timer(wk);
        wk->up = true;
        wk->epoch++;
        wk->backoff = r->opts.retry_min;
        wk->retry_at = 0;
        wake_all(r);
    } else if (strcmp(kind, "message") == 0 && rep->element[2]->type == REDIS_REPLY_STRING) {
        wake_deliver(r, rep->element[2]->str, rep->element[2]->len);
    }
}

static void wake_on_connect(const redisAsyncContext *ac, int status)
{
    ferry_redis *r = ac->data;

    /* A failed connect: hiredis frees the context after this. */
    if (status != REDIS_OK && r->wake.ac == ac) {
        r->wake.ac = NULL;
        wake_lost(r);
    }
}

static void wake_on_disconnect(const redisAsyncContext *ac, int status)
{
    ferry_redis *r = ac->data;

    (void)status;
    if (r->wake.ac == ac) {
        r->wake.ac = NULL;
        wake_lost(r);
    }
}

/* The subscription was not confirmed within opts.connect_timeout. */
static void wake_on_timeout(void *arg)
{
    ferry_redis *r = arg;
    redisAsyncContext *ac = r->wake.ac;

    r->wake.timer = NULL;
    if (ac == NULL || r->wake.up)
        return;
    r->wake.ac = NULL;
    wake_lost(r);
    redisAsyncFree(ac);
}

/* Connect the subscriber and send its SUBSCRIBE, which hiredis writes once
 * the connection is made. */
static void wake_start(ferry_redis *r)
{
    struct redis_wake *wk = &r->wake;
    char chan[sizeof(WAKE_PREFIX) + sizeof(wk->id)];
    redisAsyncContext *ac;

    wake_stop_timer(wk);
    if (r->unix_path)
        ac = redisAsyncConnectUnix(r->host);
    else
        ac = redisAsyncConnect(r->host, r->port);
    if (ac == NULL) {
        wake_lost(r);
        return;
    }
    snprintf(chan, sizeof(chan), WAKE_PREFIX "%s", wk->id);
    if (ac->err || io_attach(ac, r->loop, r->base) != 0)
        goto fail;
    ac->data = r;
    redisAsyncSetConnectCallback(ac, wake_on_connect);
    redisAsyncSetDisconnectCallback(ac, wake_on_disconnect);
    if (redisAsyncCommand(ac, wake_on_reply, r, "SUBSCRIBE %s", chan) != REDIS_OK)
        goto fail;
    if (ferry_call_later(r->loop, r->opts.connect_timeout, wake_on_timeout, r, &wk->timer) != 0) {
        wk->timer = NULL;
        goto fail;
    }
    wk->ac = ac;
    return;

fail:
    redisAsyncFree(ac);
    wake_lost(r);
}

const char *ferry__redis_wake_id(const ferry_redis *r)
{
    return r->wake.id;
}

void ferry__redis_wake_add(ferry_redis *r, struct ferry__redis_waiter *w)
{
    struct redis_wake *wk = &r->wake;

    w->next = NULL;
    w->prev = wk->last;
    if (wk->last != NULL)
        wk->last->next = w;
    else
        wk->first = w;
    wk->last = w;
}

void ferry__redis_wake_want(ferry_redis *r)
{
    struct redis_wake *wk = &r->wake;

    if (wk->ac == NULL && wk->timer == NULL && !r->closing && ferry_now() >= wk->retry_at)
        wake_start(r);
}

void ferry__redis_wake_del(ferry_redis *r, struct ferry__redis_waiter *w)
{
    struct redis_wake *wk = &r->wake;

    if (w->prev != NULL)
        w->prev->next = w->next;
    else
        wk->first = w->next;
    if (w->next != NULL)
        w->next->prev = w->prev;
    else
        wk->last = w->prev;
    w->prev = w->next = NULL;
}

uint64_t ferry__redis_wake_epoch(const ferry_redis *r)
{
    return r->wake.up ? r->wake.epoch : 0;
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
    wake_init(r);
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

int ferry_redis_connect(ferry_redis **out, const char *host, int port,
                        const ferry_redis_opts *opts)
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
    wake_stop_timer(&r->wake);
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
            write_quietly(ac, false, true);
        /* Runs every queued callback with no reply (their callers get
         * -ESHUTDOWN; abandoned records are freed), then on_disconnect. */
        redisAsyncFree(ac);
        r->ac = NULL;
    }
    free(r->host);
    free(r);
}
