/* redis_io.c - the events that drive a hiredis context on the loop's
 * event_base: hiredis's event hooks for the connections of redis.c and
 * redis_wake.c.
 * Loop thread only.
 */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include "ferry/loop.h"
#include "redis_int.h"

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
 * - The SIGPIPE guard around the write (see ferry__redis_write_quietly())
 *   is skipped when the process ignores SIGPIPE.
 */
struct redis_io {
    redisAsyncContext *ac; /* the context the events serve; NULL once it is gone */
    ferry_loop *loop;      /* runs the flush */
    struct event *rev;     /* readable, persistent */
    struct event *wev;     /* writable, one-shot */
    bool flush_queued;     /* flush_soon() is scheduled and has not run */
    bool writing;          /* inside io_write(): hiredis's wish to write more goes to wev */
    bool pipe_ignored;     /* SIGPIPE was ignored when the connection began */
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
void ferry__redis_write_quietly(redisAsyncContext *ac, bool pipe_ignored, bool flush_only)
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
    ferry__redis_write_quietly(io->ac, io->pipe_ignored, false);
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
        event_add(io->wev, NULL); /* no memory for the flush: the event writes */
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

int ferry__redis_io_attach(redisAsyncContext *ac, ferry_loop *loop, struct event_base *base)
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
