/* select.c - ferry_select(): wait on several cases, perform exactly one.
 * Loop thread only.
 *
 * Pass 1 tries every enabled case with the primitive's non-blocking
 * operation, in a random order (or the listed one).  Pass 2 links one
 * waiter per case, all pointing at one record on this stack, and waits on
 * the record's master waiter, which is what cancellation and deadlines
 * wake.  The first grant of a case decides the select (ferry__sel_grant()
 * in src/wait.c unlinks the siblings), so no primitive ever grants a case that lost.  A
 * grant that arrives after the master was woken for cancellation or a
 * deadline is handed back with the primitive's own "granted, then
 * cancelled" step: an error return performed nothing.
 */
#include "loop_only.h"

#include <poll.h>
#include <string.h>

#include <event2/event.h>

#include "ferry/select.h"
#include "loop_int.h"
#include "rand.h"
#include "select_int.h"
#include "sig_int.h"
#include "stream_int.h"
#include "wait_int.h"

static bool case_enabled(const ferry_case *c)
{
    if (c->flags & FERRY_CASE_OFF)
        return false;
    switch (c->kind) {
    case FERRY_CASE_NONE:
        return false;
    case FERRY_CASE_FD:
        return c->fd >= 0;
    case FERRY_CASE_DEADLINE:
        return true;
    default:
        return c->obj != NULL;
    }
}

/* The table of a case on an object of a layer above (a channel, a
 * future), or NULL for the loop's own objects. */
static const struct ferry__sel_ext *case_ext(const ferry_case *c, const ferry_task *self)
{
    switch (c->kind) {
    case FERRY_CASE_CHAN_RECV:
    case FERRY_CASE_CHAN_SEND:
        return self->loop->hooks.chan;
    case FERRY_CASE_FUTURE:
        return self->loop->hooks.future;
    default:
        return NULL;
    }
}

/* The checks that do not depend on the objects' state: -EINVAL, -EPERM,
 * -EDEADLK, or 0. */
static int case_check(const ferry_case *c, ferry_task *self)
{
    ferry_task *t;

    if (c->kind < FERRY_CASE_NONE || c->kind > FERRY_CASE_FUTURE || (c->flags & ~FERRY_CASE_OFF))
        return -EINVAL;
    if (!case_enabled(c))
        return 0;
    switch (c->kind) {
    case FERRY_CASE_FD:
    case FERRY_CASE_STREAM:
        if (!c->events || (c->events & ~(FERRY_READ | FERRY_WRITE)))
            return -EINVAL;
        if (c->kind == FERRY_CASE_STREAM && c->events != FERRY_READ && c->events != FERRY_WRITE)
            return -EINVAL;
        return 0;
    case FERRY_CASE_QUEUE_GET:
    case FERRY_CASE_QUEUE_PUT:
    case FERRY_CASE_CHAN_RECV:
        return c->buf ? 0 : -EINVAL;
    case FERRY_CASE_CHAN_SEND:
    case FERRY_CASE_FUTURE:
        return case_ext(c, self) ? 0 : -EPERM;
    case FERRY_CASE_JOIN:
        t = c->obj;
        if (t->loop != self->loop)
            return -EPERM;
        if (t == self)
            return -EDEADLK;
        return t->handle ? 0 : -EINVAL;
    default:
        return 0;
    }
}

/* A joined task's status, its handle given up: ferry_task_join()'s end. */
static int join_take(ferry_task *t)
{
    int status = t->status;

    t->handle = false;
    ferry__task_release(t);
    return status;
}

/* An fd's readiness now, as FERRY_READ|FERRY_WRITE of `events`, without
 * waiting; -EBADF for a descriptor that is not open. */
static int fd_poll(int fd, int events)
{
    struct pollfd p = { .fd = fd };
    int k, got = 0;

    if (events & FERRY_READ)
        p.events |= POLLIN;
    if (events & FERRY_WRITE)
        p.events |= POLLOUT;
    do
        k = poll(&p, 1, 0);
    while (k < 0 && errno == EINTR);
    if (k <= 0)
        return 0;
    if (p.revents & POLLNVAL)
        return -EBADF;
    /* An error or a hang-up makes every wait ready, as epoll reports it. */
    if (p.revents & (POLLIN | POLLERR | POLLHUP))
        got |= events & FERRY_READ;
    if (p.revents & (POLLOUT | POLLERR | POLLHUP))
        got |= events & FERRY_WRITE;
    return got;
}

/*
 * Pass 1 for one enabled case: 1 performed (c->result, c->value written),
 * 0 not possible now, or an error of the select (nothing done).
 */
static int case_try(ferry_case *c, ferry_task *self)
{
    int rc, res = 0, sig;
    ferry_task *t;

    switch (c->kind) {
    case FERRY_CASE_FD:
        rc = fd_poll(c->fd, c->events);
        if (rc == 0)
            return 0;
        c->result = rc < 0 ? rc : 0;
        c->value = rc < 0 ? 0 : rc;
        return 1;
    case FERRY_CASE_STREAM:
        rc = ferry__stream_sel_poll(c->obj, self, c->events);
        if (rc == 0)
            return 0;
        if (rc < 0 && rc != -EBADF)
            return rc;
        c->result = rc < 0 ? rc : 0;
        c->value = rc < 0 ? 0 : rc;
        return 1;
    case FERRY_CASE_EVENT:
        rc = ferry__bind_task(&((ferry_event *)c->obj)->loop, self);
        if (rc)
            return rc;
        if (!((ferry_event *)c->obj)->set)
            return 0;
        c->result = 0;
        c->value = 0;
        return 1;
    case FERRY_CASE_QUEUE_GET:
    case FERRY_CASE_QUEUE_PUT:
        rc = ferry__queue_sel_try(c->obj, self, c->buf, c->kind == FERRY_CASE_QUEUE_PUT, &res);
        if (rc != 1)
            return rc;
        c->result = res;
        c->value = 0;
        return 1;
    case FERRY_CASE_JOIN:
        t = c->obj;
        if (t->state != FERRY_TASK_DONE)
            return 0;
        c->result = 0;
        c->value = join_take(t);
        return 1;
    case FERRY_CASE_SIGNAL:
        rc = ferry_sigsub_try_recv(c->obj, &sig);
        if (rc == -EAGAIN)
            return 0;
        if (rc)
            return rc;
        c->result = 0;
        c->value = sig;
        return 1;
    case FERRY_CASE_DEADLINE:
        if (ferry_now() < c->at)
            return 0;
        c->result = 0;
        c->value = 0;
        return 1;
    case FERRY_CASE_CHAN_RECV:
    case FERRY_CASE_CHAN_SEND:
    case FERRY_CASE_FUTURE:
        if (!case_ext(c, self))
            return -EPERM;
        rc = case_ext(c, self)->try_op(c->obj, c->kind == FERRY_CASE_CHAN_SEND, c->buf, &res);
        if (rc != 1)
            return rc;
        /* A future's status is its case's value. */
        c->result = c->kind == FERRY_CASE_FUTURE ? 0 : res;
        c->value = c->kind == FERRY_CASE_FUTURE ? res : 0;
        return 1;
    default:
        return 0;
    }
}

/* libevent's callback of an fd case: the readiness, then the grant (which
 * does nothing to a case that lost: it is no longer WAITING). */
static void sel_io_cb(evutil_socket_t fd, short what, void *arg)
{
    struct ferry__waiter *w = arg;

    (void)fd;
    if (w->state != FERRY__W_WAITING)
        return;
    w->n = (uint64_t)(((what & EV_READ) ? FERRY_READ : 0) | ((what & EV_WRITE) ? FERRY_WRITE : 0));
    ferry__grant(w, 0);
}

static const char *case_what(int kind)
{
    switch (kind) {
    case FERRY_CASE_CHAN_RECV:
        return "select chan recv";
    case FERRY_CASE_CHAN_SEND:
        return "select chan send";
    case FERRY_CASE_FD:
        return "select fd";
    case FERRY_CASE_STREAM:
        return "select stream";
    case FERRY_CASE_EVENT:
        return "select event";
    case FERRY_CASE_QUEUE_GET:
        return "select queue get";
    case FERRY_CASE_QUEUE_PUT:
        return "select queue put";
    case FERRY_CASE_JOIN:
        return "select join";
    case FERRY_CASE_SIGNAL:
        return "select signal";
    case FERRY_CASE_FUTURE:
        return "select future";
    default:
        return "select";
    }
}

/* Pass 2 for one enabled case (not a deadline): link its waiter *wp (a
 * channel's node replaces it with its own, and keeps the node in *node).
 * Returns 0; 1 a channel case became ready (nothing linked: try again);
 * -ENOMEM with nothing linked. */
static int case_arm(ferry_case *c, struct ferry__waiter **wp, void **node, ferry_task *self,
                    struct ferry__sel *sel)
{
    struct ferry__waiter *w = *wp;
    struct ferry__waitq *q = NULL;
    struct event *ev;
    short what = 0;
    int rc;

    switch (c->kind) {
    case FERRY_CASE_CHAN_RECV:
    case FERRY_CASE_CHAN_SEND:
    case FERRY_CASE_FUTURE:
        rc = case_ext(c, self)->arm(c->obj, c->kind == FERRY_CASE_CHAN_SEND, self, sel, node, wp);
        if (rc)
            return rc;
        (*wp)->what = case_what(c->kind);
        (*wp)->state = FERRY__W_WAITING;
        return 0;
    case FERRY_CASE_FD:
        if (c->events & FERRY_READ)
            what |= EV_READ;
        if (c->events & FERRY_WRITE)
            what |= EV_WRITE;
        ev = event_new(self->loop->base, c->fd, what, sel_io_cb, w);
        if (!ev)
            return -ENOMEM;
        if (event_add(ev, NULL) != 0) {
            event_free(ev);
            return -ENOMEM;
        }
        w->data = ev;
        break;
    case FERRY_CASE_STREAM:
        rc = ferry__stream_sel_arm(c->obj, w, c->events);
        if (rc)
            return rc;
        break;
    case FERRY_CASE_EVENT:
        q = &((ferry_event *)c->obj)->waiters;
        break;
    case FERRY_CASE_QUEUE_GET:
    case FERRY_CASE_QUEUE_PUT:
        q = ferry__queue_sel_waitq(c->obj, c->kind == FERRY_CASE_QUEUE_PUT);
        break;
    case FERRY_CASE_JOIN:
        q = &((ferry_task *)c->obj)->joiners;
        break;
    case FERRY_CASE_SIGNAL:
        q = ferry__sigsub_waitq(c->obj);
        break;
    default:
        return 0;
    }
    if (q)
        ferry__list_push_back(&q->head, &w->link);
    w->state = FERRY__W_WAITING;
    return 0;
}

/* Undo pass 2 for one case, without suspending: unlink its waiter and
 * drop what it registered (a channel's node is only taken out of its
 * channel: cases_disarm() frees it).  A granted waiter keeps its state
 * for case_done(); any other is left IDLE, so no grant reaches it. */
static void case_detach(ferry_case *c, struct ferry__waiter *w, void *node, ferry_task *self)
{
    if (node) {
        /* Only taken out of its channel or future here: cases_disarm()
         * frees it. */
        case_ext(c, self)->detach(c->obj, c->kind == FERRY_CASE_CHAN_SEND, node);
        return;
    }
    if (ferry__link_linked(&w->link))
        ferry__list_remove(&w->link);
    if (c->kind == FERRY_CASE_FD && w->data) {
        event_free(w->data);
        w->data = NULL;
    }
    if (c->kind == FERRY_CASE_STREAM && w->data)
        ferry__stream_sel_disarm(c->obj, w);
    if (w->state == FERRY__W_WAITING)
        w->state = FERRY__W_IDLE;
}

/*
 * Undo pass 2 for the first `n` cases.  Every case is taken out before a
 * channel's disarm may suspend (for a wake still on its way from another
 * thread): a case still linked then could be granted while the select no
 * longer waits, and that grant would be lost (the winner is already read)
 * and would leave its siblings idle, the waiter that the suspended disarm
 * waits on among them, so that the wake it waits for would wake nobody.
 */
static void cases_disarm(ferry_case *cases, struct ferry__waiter **w, void **node, size_t n,
                         ferry_task *self)
{
    size_t i;

    for (i = 0; i < n; i++)
        case_detach(&cases[i], w[i], node[i], self);
    for (i = 0; i < n; i++) {
        /* The channel or future frees the node, and its waiter with it. */
        if (node[i])
            case_ext(&cases[i], self)
                ->disarm(cases[i].obj, cases[i].kind == FERRY_CASE_CHAN_SEND, node[i]);
    }
}

/*
 * The granted case `c`: perform it (`perform`) or hand its grant back.
 * Returns 1 performed (c->result, c->value written), 0 nothing to perform
 * after all (try again).
 */
static int case_done(ferry_case *c, struct ferry__waiter *w, bool perform, ferry_task *self)
{
    int sig = 0, res = 0;
    ferry_task *t;

    switch (c->kind) {
    case FERRY_CASE_CHAN_RECV:
    case FERRY_CASE_CHAN_SEND:
    case FERRY_CASE_FUTURE:
        if (!case_ext(c, self)->done(c->obj, c->kind == FERRY_CASE_CHAN_SEND, c->buf, perform,
                                     &res))
            return 0;
        c->result = c->kind == FERRY_CASE_FUTURE ? 0 : res;
        c->value = c->kind == FERRY_CASE_FUTURE ? res : 0;
        return 1;
    case FERRY_CASE_QUEUE_GET:
    case FERRY_CASE_QUEUE_PUT:
        res = ferry__queue_sel_done(c->obj, w, c->buf, c->kind == FERRY_CASE_QUEUE_PUT, perform);
        if (!perform)
            return 0;
        c->result = res;
        c->value = 0;
        return 1;
    case FERRY_CASE_SIGNAL:
        if (!perform) {
            ferry__sigsub_unclaim(c->obj);
            return 0;
        }
        ferry__sigsub_claim(c->obj, &sig);
        c->result = 0;
        c->value = sig;
        return 1;
    case FERRY_CASE_JOIN:
        t = c->obj;
        if (!perform || t->state != FERRY_TASK_DONE)
            return 0;
        c->result = 0;
        c->value = join_take(t);
        return 1;
    case FERRY_CASE_FD:
    case FERRY_CASE_STREAM:
        if (!perform)
            return 0;
        c->result = w->result;
        c->value = w->result ? 0 : (int)w->n;
        return 1;
    default:
        if (!perform)
            return 0;
        c->result = w->result;
        c->value = 0;
        return 1;
    }
}

/* The order pass 1 tries the cases in: listed, or a uniform shuffle from
 * the loop's generator (Fisher-Yates), so that among several ready cases
 * each is equally likely to be performed. */
static void pick_order(ferry_loop *loop, uint8_t *ord, size_t n, bool listed)
{
    size_t i;

    for (i = 0; i < n; i++)
        ord[i] = (uint8_t)i;
    if (listed)
        return;
    for (i = n; i > 1; i--) {
        size_t j = ferry__rand_below(&loop->rng, (uint32_t)i);
        uint8_t x = ord[i - 1];

        ord[i - 1] = ord[j];
        ord[j] = x;
    }
}

int ferry_select(ferry_case *cases, size_t n, unsigned flags)
{
    struct ferry__waiter ws[FERRY_SELECT_MAX];
    struct ferry__waiter *w[FERRY_SELECT_MAX];
    void *node[FERRY_SELECT_MAX];
    uint8_t ord[FERRY_SELECT_MAX];
    struct ferry__sel sel;
    ferry_task *self;
    size_t i, armed;
    int64_t until;
    int rc, dl, win;

    if ((n && !cases) || n > FERRY_SELECT_MAX ||
        (flags & ~(FERRY_SELECT_PRIORITY | FERRY_SELECT_TRY)))
        return -EINVAL;
    rc = ferry__enter_task_inline(&self);
    if (rc)
        return rc;
    for (i = 0; i < n; i++) {
        rc = case_check(&cases[i], self);
        if (rc)
            return rc;
    }
    rc = ferry__check_inline(self);
    if (rc)
        return rc;
    for (;;) {
        pick_order(self->loop, ord, n, flags & FERRY_SELECT_PRIORITY);
        for (i = 0; i < n; i++) {
            ferry_case *c = &cases[ord[i]];

            if (!case_enabled(c))
                continue;
            rc = case_try(c, self);
            if (rc < 0)
                return rc;
            if (rc == 1)
                return ord[i];
        }
        if (flags & FERRY_SELECT_TRY)
            return -EAGAIN;

        ferry__waiter_init(&sel.master, self, "select", cases);
        sel.w = w;
        sel.n = n;
        sel.winner = -1;
        until = FERRY_NEVER;
        dl = -1;
        rc = 0;
        for (armed = 0; armed < n; armed++) {
            ferry_case *c = &cases[armed];

            w[armed] = &ws[armed];
            node[armed] = NULL;
            ferry__waiter_init(w[armed], self, case_what(c->kind), c->obj);
            w[armed]->sel = &sel;
            if (!case_enabled(c))
                continue;
            if (c->kind == FERRY_CASE_DEADLINE) {
                if (c->at < until) {
                    until = c->at;
                    dl = (int)armed;
                }
                continue;
            }
            rc = case_arm(c, &w[armed], &node[armed], self, &sel);
            if (rc)
                break;
        }
        if (rc) {
            cases_disarm(cases, w, node, armed, self);
            if (rc == 1)
                continue; /* a channel became ready meanwhile */
            return rc;
        }
        rc = ferry__wait(NULL, &sel.master, until);
        win = sel.winner;
        cases_disarm(cases, w, node, n, self);
        if (rc < 0) {
            /* Cancelled or a scope's deadline: a grant that came anyway
             * goes back, so nothing was performed. */
            if (win >= 0)
                case_done(&cases[win], w[win], false, self);
            return rc;
        }
        if (win >= 0) {
            if (case_done(&cases[win], w[win], true, self))
                return win;
            continue;
        }
        if (rc == 1 && dl >= 0) {
            cases[dl].result = 0;
            cases[dl].value = 0;
            return dl;
        }
    }
}
