/* task_wait.c - the waits of a task that are not primitives: sleeping,
 * waiting for a file descriptor, waiting for a signal.
 * Loop thread only.
 */
#include "loop_only.h"

#include <event2/event.h>

#include "loop_int.h"
#include "sig_int.h"

int ferry_sleep_until(int64_t deadline)
{
    struct ferry__waiter w;
    ferry_task *self;
    int rc = ferry__enter_task_inline(&self);

    if (rc)
        return rc;
    if (deadline <= ferry_now())
        return ferry_yield();
    ferry__waiter_init(&w, self, "sleep", NULL);
    rc = ferry__wait(NULL, &w, deadline);
    return rc == 1 ? 0 : rc;
}

int ferry_sleep(int64_t duration)
{
    int64_t now = ferry_now();

    if (duration > INT64_MAX - now)
        return ferry_sleep_until(FERRY_NEVER - 1);
    return ferry_sleep_until(now + duration);
}

static void io_cb(evutil_socket_t fd, short what, void *arg)
{
    struct ferry__waiter *w = arg;

    (void)fd;
    w->n = (uint64_t)(((what & EV_READ) ? FERRY_READ : 0) |
                      ((what & EV_WRITE) ? FERRY_WRITE : 0) |
                      ((what & EV_SIGNAL) ? 1 : 0));
    ferry__grant(w, 0);
}

int ferry_wait_fd(int fd, int events, int *revents)
{
    struct ferry__waiter w;
    struct event ev;
    ferry_task *self;
    short what = 0;
    int rc = ferry__enter_task_inline(&self);

    if (rc)
        return rc;
    if (fd < 0 || !events || (events & ~(FERRY_READ | FERRY_WRITE)))
        return -EINVAL;
    rc = ferry__check_inline(self);
    if (rc)
        return rc;
    if (events & FERRY_READ)
        what |= EV_READ;
    if (events & FERRY_WRITE)
        what |= EV_WRITE;
    ferry__waiter_init(&w, self, events & FERRY_WRITE ? "fd write" : "fd read",
                       (const void *)(intptr_t)fd);
    if (event_assign(&ev, self->loop->base, fd, what, io_cb, &w) != 0)
        return -EINVAL;
    if (event_add(&ev, NULL) != 0)
        return -ENOMEM;
    rc = ferry__wait(NULL, &w, FERRY_NEVER);
    event_del(&ev);
    if (rc == 0 && revents)
        *revents = (int)w.n;
    return rc;
}

/* A subscription that lives for one wait (ferry/signal.h has the rules):
 * every loop waiting for the signal gets its own count of each delivery. */
int ferry_wait_signal(int signum)
{
    ferry_sigsub *sub;
    ferry_task *self;
    int rc = ferry__enter_task_inline(&self), got;

    if (rc)
        return rc;
    if (!ferry__sig_valid(signum))
        return -EINVAL;
    rc = ferry__check_inline(self);
    if (rc)
        return rc;
    rc = ferry_sigsub_new(&sub, self->loop, &signum, 1);
    if (rc)
        return rc;
    rc = ferry_sigsub_recv(sub, &got);
    /* Received: more deliveries during the wait merge into this one.  Not
     * received: one that came is raised again for the old disposition. */
    ferry__sigsub_release(sub, rc == 0);
    return rc;
}
