/* chan.c - ferry_chan: a bounded channel between threads and tasks.
 *
 * One mutex guards a ring buffer.  Threads wait on two condition
 * variables; tasks wait on nodes of their own (on their stacks) in two
 * FIFO lists and are woken through their loop's inbox (ferry__task_wake, task_wake.c).
 * A wake is a hint, not a handoff: the woken waiter takes the mutex and
 * retries, so no item is ever held by a waiter that might not run.  A task
 * that was woken but leaves anyway (cancelled, deadline) passes the wake on
 * to the next waiter of its side, so a wake is never swallowed
 * (docs/testing.md).  Every state change wakes one thread and one task of
 * the side that can now proceed; an extra wake costs only a retry.
 *
 * Lock order: ferry_chan.mu -> ferry_inbox.mu (bridge_int.h).
 */
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "bridge_int.h"

struct cwait {
    struct ferry__link link;    /* mu: in recvq or sendq until woken */
    struct ferry__task_wake tw; /* the waiting task */
    bool fired;                 /* loop thread, a select's node: a wake took
                                 * it out (set by sel_detach) */
};

struct ferry_chan {
    pthread_mutex_t mu;       /* guards everything below */
    pthread_cond_t not_empty; /* threads waiting to receive */
    pthread_cond_t not_full;  /* threads waiting to send */
    unsigned thr_recv;        /* threads waiting on not_empty */
    unsigned thr_send;        /* threads waiting on not_full */
    struct ferry__link recvq; /* tasks waiting to receive: struct cwait */
    struct ferry__link sendq; /* tasks waiting to send: struct cwait */
    unsigned char *buf;       /* ring of `cap` elements of `esize` bytes */
    size_t cap;               /* capacity, set once */
    size_t esize;             /* bytes per element, set once */
    bool ptrs;                /* made by ferry_chan_new(): select's buf is the item */
    size_t head;              /* index of the oldest item */
    size_t count;             /* items in the ring */
    bool closed;              /* sends refused */
};

/* ==== any thread ======================================================= */

/* Wake one thread and one task of a side.  Requires mu. */
static void wake_one_locked(struct ferry_chan *ch, bool receivers)
{
    struct ferry__link *l;

    if (receivers) {
        if (ch->thr_recv)
            pthread_cond_signal(&ch->not_empty);
        l = ferry__list_pop_front(&ch->recvq);
    } else {
        if (ch->thr_send)
            pthread_cond_signal(&ch->not_full);
        l = ferry__list_pop_front(&ch->sendq);
    }
    if (l)
        ferry__task_wake_fire(&ferry__container_of(l, struct cwait, link)->tw, 0);
}

static void wake_all_locked(struct ferry__link *q)
{
    struct ferry__link *l;

    while ((l = ferry__list_pop_front(q)) != NULL)
        ferry__task_wake_fire(&ferry__container_of(l, struct cwait, link)->tw, 0);
}

/* Copy one element; a pointer channel's element is one assignment. */
static inline void elem_copy(const struct ferry_chan *ch, void *dst, const void *src)
{
    if (ch->esize == sizeof(void *))
        memcpy(dst, src, sizeof(void *));
    else
        memcpy(dst, src, ch->esize);
}

/* Requires mu and room.  Copies the element at `src` in. */
static void put_locked(struct ferry_chan *ch, const void *src)
{
    elem_copy(ch, ch->buf + ((ch->head + ch->count) % ch->cap) * ch->esize, src);
    ch->count++;
    wake_one_locked(ch, true);
}

/* Requires mu and an element.  Copies the oldest element out to `dst`. */
static void take_locked(struct ferry_chan *ch, void *dst)
{
    elem_copy(ch, dst, ch->buf + ch->head * ch->esize);
    ch->head = (ch->head + 1) % ch->cap;
    ch->count--;
    wake_one_locked(ch, false);
}

static int chan_make(ferry_chan **out, size_t capacity, size_t esize, bool ptrs)
{
    struct ferry_chan *ch;

    if (!out)
        return -EINVAL;
    *out = NULL;
    if (!capacity || !esize || capacity > SIZE_MAX / esize)
        return -EINVAL;
    ch = ferry__calloc(1, sizeof *ch);
    if (!ch)
        return -ENOMEM;
    ch->buf = ferry__calloc(capacity, esize);
    if (!ch->buf)
        goto err_free;
    ch->cap = capacity;
    ch->esize = esize;
    ch->ptrs = ptrs;
    if (pthread_mutex_init(&ch->mu, NULL))
        goto err_buf;
    if (ferry__cond_init(&ch->not_empty))
        goto err_mutex;
    if (ferry__cond_init(&ch->not_full))
        goto err_cond;
    *out = ch;
    return 0;

err_cond:
    pthread_cond_destroy(&ch->not_empty);
err_mutex:
    pthread_mutex_destroy(&ch->mu);
err_buf:
    ferry__free(ch->buf);
err_free:
    ferry__free(ch);
    return -ENOMEM;
}

int ferry_chan_new(ferry_chan **out, size_t capacity)
{
    return chan_make(out, capacity, sizeof(void *), true);
}

int ferry_chan_new_elem(ferry_chan **out, size_t capacity, size_t elem_size)
{
    return chan_make(out, capacity, elem_size, false);
}

void ferry_chan_free(ferry_chan *ch)
{
    if (!ch)
        return;
    pthread_cond_destroy(&ch->not_full);
    pthread_cond_destroy(&ch->not_empty);
    pthread_mutex_destroy(&ch->mu);
    ferry__free(ch->buf);
    ferry__free(ch);
}

int ferry_chan_close(ferry_chan *ch)
{
    if (!ch)
        return -EINVAL;
    pthread_mutex_lock(&ch->mu);
    if (!ch->closed) {
        ch->closed = true;
        pthread_cond_broadcast(&ch->not_empty);
        pthread_cond_broadcast(&ch->not_full);
        wake_all_locked(&ch->recvq);
        wake_all_locked(&ch->sendq);
    }
    pthread_mutex_unlock(&ch->mu);
    return 0;
}

size_t ferry_chan_len(ferry_chan *ch)
{
    size_t n;

    if (!ch)
        return 0;
    pthread_mutex_lock(&ch->mu);
    n = ch->count;
    pthread_mutex_unlock(&ch->mu);
    return n;
}

int ferry_chan_try_send_elem(ferry_chan *ch, const void *item)
{
    int rc = 0;

    if (!ch || !item)
        return -EINVAL;
    pthread_mutex_lock(&ch->mu);
    if (ch->closed)
        rc = -ESHUTDOWN;
    else if (ch->count == ch->cap)
        rc = -EAGAIN;
    else
        put_locked(ch, item);
    pthread_mutex_unlock(&ch->mu);
    return rc;
}

int ferry_chan_try_recv_elem(ferry_chan *ch, void *item)
{
    int rc = 0;

    if (!ch || !item)
        return -EINVAL;
    pthread_mutex_lock(&ch->mu);
    if (ch->count)
        take_locked(ch, item);
    else
        rc = ch->closed ? -ESHUTDOWN : -EAGAIN;
    pthread_mutex_unlock(&ch->mu);
    return rc;
}

/* Blocking from a plain thread: wait on `cv` until ready() or the deadline. */
int ferry_chan_send_elem_blocking(ferry_chan *ch, const void *item, int64_t timeout)
{
    int64_t deadline;
    bool expired = false;
    int rc = 0;

    if (!ch || !item)
        return -EINVAL;
    if (timeout != 0 && ferry_loop_current())
        return -EDEADLK;
    deadline = ferry__deadline_real(timeout);
    pthread_mutex_lock(&ch->mu);
    for (;;) {
        if (ch->closed) {
            rc = -ESHUTDOWN;
            break;
        }
        if (ch->count < ch->cap) {
            put_locked(ch, item);
            break;
        }
        if (timeout == 0) {
            /* Zero means "do not wait": the try-call's answer. */
            rc = -EAGAIN;
            break;
        }
        if (expired) {
            rc = -ETIMEDOUT;
            break;
        }
        ch->thr_send++;
        /* Re-check once after a timeout: a signal meant for us counts. */
        expired = ferry__cond_wait_until(&ch->not_full, &ch->mu, deadline) == ETIMEDOUT;
        ch->thr_send--;
    }
    pthread_mutex_unlock(&ch->mu);
    return rc;
}

int ferry_chan_recv_elem_blocking(ferry_chan *ch, void *item, int64_t timeout)
{
    int64_t deadline;
    bool expired = false;
    int rc = 0;

    if (!ch || !item)
        return -EINVAL;
    if (timeout != 0 && ferry_loop_current())
        return -EDEADLK;
    deadline = ferry__deadline_real(timeout);
    pthread_mutex_lock(&ch->mu);
    for (;;) {
        if (ch->count) {
            take_locked(ch, item);
            break;
        }
        if (ch->closed) {
            rc = -ESHUTDOWN;
            break;
        }
        if (timeout == 0) {
            /* Zero means "do not wait": the try-call's answer. */
            rc = -EAGAIN;
            break;
        }
        if (expired) {
            rc = -ETIMEDOUT;
            break;
        }
        ch->thr_recv++;
        expired = ferry__cond_wait_until(&ch->not_empty, &ch->mu, deadline) == ETIMEDOUT;
        ch->thr_recv--;
    }
    pthread_mutex_unlock(&ch->mu);
    return rc;
}

/* ==== loop thread (tasks) ============================================== */

/*
 * Park the calling task on `q` until woken, then come back with mu held.
 * Requires mu.  Returns 0 (woken: retry) or -ECANCELED / -ETIMEDOUT (the
 * node is out of the queue and settled; a wake it got was passed on).
 */
static int park_locked(struct ferry_chan *ch, struct cwait *cw, struct ferry__link *q,
                       bool receiver)
{
    bool fired;
    int rc;

    ferry__task_wake_rearm(&cw->tw);
    ferry__link_init(&cw->link);
    ferry__list_push_back(q, &cw->link);
    pthread_mutex_unlock(&ch->mu);
    rc = ferry__task_wake_wait(&cw->tw);
    pthread_mutex_lock(&ch->mu);
    fired = !ferry__link_linked(&cw->link);
    if (!fired) {
        ferry__list_remove(&cw->link);
    } else if (!cw->tw.delivered) {
        pthread_mutex_unlock(&ch->mu);
        ferry__task_wake_settle(&cw->tw);
        pthread_mutex_lock(&ch->mu);
    }
    if (rc == -ECANCELED || rc == -ETIMEDOUT) {
        if (fired && (receiver ? ch->count > 0 : ch->count < ch->cap))
            wake_one_locked(ch, receiver);
        return rc;
    }
    return 0;
}

/* Start a task-side operation: the waiter node, and the cancellation
 * point (every suspension point is one, also when it need not wait). */
static int task_begin(struct cwait *cw, const char *what, const void *obj)
{
    int rc = ferry__task_wake_init(&cw->tw, what, obj);

    if (rc)
        return rc;
    return ferry__check(cw->tw.w.task);
}

int ferry_chan_send_elem(ferry_chan *ch, const void *item)
{
    struct cwait cw;
    int rc;

    if (!ch || !item)
        return -EINVAL;
    rc = task_begin(&cw, "chan send", ch);
    if (rc)
        return rc;
    pthread_mutex_lock(&ch->mu);
    for (;;) {
        if (ch->closed) {
            rc = -ESHUTDOWN;
            break;
        }
        if (ch->count < ch->cap) {
            put_locked(ch, item);
            rc = 0;
            break;
        }
        rc = park_locked(ch, &cw, &ch->sendq, false);
        if (rc)
            break;
    }
    pthread_mutex_unlock(&ch->mu);
    return rc;
}

int ferry_chan_recv_elem(ferry_chan *ch, void *item)
{
    struct cwait cw;
    int rc;

    if (!ch || !item)
        return -EINVAL;
    rc = task_begin(&cw, "chan recv", ch);
    if (rc)
        return rc;
    pthread_mutex_lock(&ch->mu);
    for (;;) {
        if (ch->count) {
            take_locked(ch, item);
            rc = 0;
            break;
        }
        if (ch->closed) {
            rc = -ESHUTDOWN;
            break;
        }
        rc = park_locked(ch, &cw, &ch->recvq, true);
        if (rc)
            break;
    }
    pthread_mutex_unlock(&ch->mu);
    return rc;
}

/* ==== the pointer calls ================================================= */

/* The pointer calls are the element calls on an element that is a pointer;
 * they refuse a channel of another element size. */
static inline int ptr_chan(const struct ferry_chan *ch)
{
    return ch && ch->esize == sizeof(void *) ? 0 : -EINVAL;
}

int ferry_chan_send(ferry_chan *ch, void *item)
{
    return ptr_chan(ch) ? -EINVAL : ferry_chan_send_elem(ch, &item);
}

int ferry_chan_recv(ferry_chan *ch, void **item)
{
    return ptr_chan(ch) ? -EINVAL : ferry_chan_recv_elem(ch, item);
}

int ferry_chan_send_blocking(ferry_chan *ch, void *item, int64_t timeout)
{
    return ptr_chan(ch) ? -EINVAL : ferry_chan_send_elem_blocking(ch, &item, timeout);
}

int ferry_chan_recv_blocking(ferry_chan *ch, void **item, int64_t timeout)
{
    return ptr_chan(ch) ? -EINVAL : ferry_chan_recv_elem_blocking(ch, item, timeout);
}

int ferry_chan_try_send(ferry_chan *ch, void *item)
{
    return ptr_chan(ch) ? -EINVAL : ferry_chan_try_send_elem(ch, &item);
}

int ferry_chan_try_recv(ferry_chan *ch, void **item)
{
    return ptr_chan(ch) ? -EINVAL : ferry_chan_try_recv_elem(ch, item);
}

/* ==== select's cases (loop thread; port/loop_port.h) ==================== */

/*
 * A select's channel case parks a node like park_locked() does, but on the
 * heap: the select's frame holds one waiter per case, and only the channel
 * knows its node.  The rule of the wake stays: it is a hint.  A case that
 * won retries under the mutex and may find nothing (the select then tries
 * every case again); a wake that reached a case that lost, or that is
 * still on its way through the inbox, is passed on to the next waiter of
 * that side, as a cancelled park_locked() does.
 */

static int sel_try(void *obj, bool send, void *buf, int *result)
{
    struct ferry_chan *ch = obj;
    /* A pointer channel's send case carries the item itself in `buf`. */
    int rc = send ? ferry_chan_try_send_elem(ch, ch->ptrs ? (const void *)&buf : buf)
                  : ferry_chan_try_recv_elem(ch, buf);

    if (rc == -EAGAIN)
        return 0;
    if (rc != 0 && rc != -ESHUTDOWN)
        return rc;
    *result = rc;
    return 1;
}

/* True if a waiter of the side `send` could proceed now.  Requires mu. */
static bool side_ready_locked(const struct ferry_chan *ch, bool send)
{
    return ch->closed || (send ? ch->count < ch->cap : ch->count > 0);
}

static int sel_arm(void *obj, bool send, struct ferry_task *self, struct ferry__sel *sel,
                   void **node, struct ferry__waiter **w)
{
    struct ferry_chan *ch = obj;
    struct cwait *cw = ferry__malloc(sizeof *cw);
    int rc;

    if (!cw)
        return -ENOMEM;
    rc = ferry__task_wake_init_self(&cw->tw, self, send ? "chan send" : "chan recv", ch);
    if (rc) {
        ferry__free(cw);
        return rc;
    }
    cw->tw.w.sel = sel;
    cw->fired = false;
    ferry__link_init(&cw->link);
    pthread_mutex_lock(&ch->mu);
    if (side_ready_locked(ch, send)) {
        pthread_mutex_unlock(&ch->mu);
        ferry__free(cw);
        return 1;
    }
    ferry__list_push_back(send ? &ch->sendq : &ch->recvq, &cw->link);
    pthread_mutex_unlock(&ch->mu);
    *node = cw;
    *w = &cw->tw.w;
    return 0;
}

/* The select has stopped waiting.  A wake that took the node out (or that
 * is still on its way through the inbox) must now grant nothing: the
 * select may be about to wait for it in sel_disarm(), and a case waiter
 * granted then would decide a select that is no longer waiting (its
 * siblings, this node's settle waiter among them, made idle; the grant
 * itself lost). */
static void sel_detach(void *obj, bool send, void *node)
{
    struct ferry_chan *ch = obj;
    struct cwait *cw = node;

    (void)send;
    pthread_mutex_lock(&ch->mu);
    cw->fired = !ferry__link_linked(&cw->link);
    if (!cw->fired)
        ferry__list_remove(&cw->link);
    pthread_mutex_unlock(&ch->mu);
    if (cw->tw.w.state == FERRY__W_WAITING)
        cw->tw.w.state = FERRY__W_IDLE;
}

static void sel_disarm(void *obj, bool send, void *node)
{
    struct ferry_chan *ch = obj;
    struct cwait *cw = node;
    bool won = cw->tw.w.state == FERRY__W_GRANTED;

    /* The inbox still holds the node: wait until it is delivered. */
    if (cw->fired && !cw->tw.delivered)
        ferry__task_wake_settle(&cw->tw);
    pthread_mutex_lock(&ch->mu);
    if (cw->fired && !won && side_ready_locked(ch, send) && !ch->closed)
        wake_one_locked(ch, !send);
    pthread_mutex_unlock(&ch->mu);
    ferry__free(cw);
}

static int sel_done(void *obj, bool send, void *buf, bool perform, int *result)
{
    struct ferry_chan *ch = obj;
    int rc = 0;

    pthread_mutex_lock(&ch->mu);
    if (!perform) {
        if (side_ready_locked(ch, send) && !ch->closed)
            wake_one_locked(ch, !send);
    } else if (send) {
        if (ch->closed) {
            *result = -ESHUTDOWN;
            rc = 1;
        } else if (ch->count < ch->cap) {
            put_locked(ch, ch->ptrs ? (const void *)&buf : buf);
            *result = 0;
            rc = 1;
        }
    } else {
        if (ch->count) {
            take_locked(ch, buf);
            *result = 0;
            rc = 1;
        } else if (ch->closed) {
            *result = -ESHUTDOWN;
            rc = 1;
        }
    }
    pthread_mutex_unlock(&ch->mu);
    return rc;
}

const struct ferry__sel_ext ferry__chan_sel_ext = {
    .try_op = sel_try,
    .arm = sel_arm,
    .detach = sel_detach,
    .disarm = sel_disarm,
    .done = sel_done,
};
