/* future.c - a foreign thread runs a function or a task on a loop and
 * waits for its status: futures, run_sync, run_task_sync; and tasks that
 * await a future (ferry_future_await(), select's future case).
 *
 * The future is shared by the thread that holds the handle and the loop
 * that computes the result, so it is reference-counted: the handle, the
 * loop side (until fn's status is in) and every cancel request in flight
 * hold one; the last one frees it.  Requests reach the loop through its
 * inbox (which the future keeps a reference on, so a late cancel finds a
 * closed inbox, never a freed one).
 *
 * Threads wait on the condition variable; tasks, of any loop, wait on
 * nodes of their own (on their stacks, or on the heap for a select case)
 * in a list, each woken through its loop's inbox (task_wake.c).  The
 * completion unlinks every node under the mutex and fires the wakes after
 * releasing it, so a task that stops waiting finds its node either still
 * linked (it takes it out) or unlinked, and then waits for the wake that
 * is on its way before its node goes away.
 *
 * Lock order: ferry_future.mu is a leaf; nothing is called under it.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "runtime_int.h"

/* A task awaiting a future. */
struct fwait {
    struct ferry__link link;    /* mu: in ferry_future.twaiters until completion */
    struct fwait *next_fire;    /* the completer's, once it unlinked the node */
    bool fired;                 /* select's detach found it unlinked: a wake is on its way */
    struct ferry__task_wake tw; /* the waiting task */
};

struct ferry_future {
    pthread_mutex_t mu;          /* guards the fields marked "mu" */
    pthread_cond_t cv;           /* threads waiting for `done` */
    int refs;                    /* mu: handle + loop side + cancel posts */
    bool done;                   /* mu: status is in */
    int status;                  /* mu: fn's status, or why it never ran */
    bool ran;                    /* mu: fn was called */
    bool started;                /* mu: the loop took the request: fn runs or has run */
    bool cancel_req;             /* mu: a thread asked to cancel */
    struct ferry__link twaiters; /* mu: tasks awaiting it (struct fwait) */
    struct ferry_inbox *ib;      /* set once; one inbox reference */
    ferry_task_fn fn;            /* set once */
    void *arg;                   /* set once */
    bool as_task;                /* set once: spawn a task, else call fn */
    char name[32];               /* set once: the task's name */
    size_t stack_size;           /* set once */

    /* loop thread only */
    ferry_task *task;               /* the task while fn runs in it */
    bool cancel_seen;               /* a cancel reached the loop before the task ran */
    struct ferry__closer unstarted; /* on the inbox's list from the spawn until
                                    * the task starts: a task cancelled before
                                    * it starts (the loop is freed) never runs
                                    * task_body, and the close ends the future */
};

/* ==== any thread ======================================================= */

static void future_unref(struct ferry_future *f)
{
    bool last;

    pthread_mutex_lock(&f->mu);
    last = --f->refs == 0;
    pthread_mutex_unlock(&f->mu);
    if (!last)
        return;
    ferry_inbox_unref(f->ib);
    pthread_cond_destroy(&f->cv);
    pthread_mutex_destroy(&f->mu);
    ferry__free(f);
}

/* The loop side is done: publish the status, wake the threads and the
 * tasks waiting, and drop its reference. */
static void future_complete(struct ferry_future *f, int status, bool ran)
{
    struct fwait *fire = NULL, *next;
    struct ferry__link *l;

    pthread_mutex_lock(&f->mu);
    f->done = true;
    f->status = status;
    f->ran = ran;
    pthread_cond_broadcast(&f->cv);
    while ((l = ferry__list_pop_front(&f->twaiters)) != NULL) {
        struct fwait *w = ferry__container_of(l, struct fwait, link);

        w->next_fire = fire;
        fire = w;
    }
    pthread_mutex_unlock(&f->mu);
    for (; fire; fire = next) {
        next = fire->next_fire; /* the node may go once fired */
        ferry__task_wake_fire(&fire->tw, 0);
    }
    future_unref(f);
}

/* ==== loop thread ====================================================== */

static int task_body(void *arg)
{
    struct ferry_future *f = arg;
    int st;

    ferry__inbox_closer_del(&f->unstarted);
    if (f->cancel_seen) {
        future_complete(f, -ECANCELED, false);
        return -ECANCELED;
    }
    f->task = ferry_task_current();
    st = f->fn(f->arg);
    f->task = NULL;
    future_complete(f, st, true);
    return st;
}

/* The loop closed before the spawned task started: it never will. */
static void unstarted_close(struct ferry__closer *c)
{
    struct ferry_future *f = ferry__container_of(c, struct ferry_future, unstarted);

    future_complete(f, f->cancel_seen ? -ECANCELED : -ESHUTDOWN, false);
}

static void start_cb(void *arg)
{
    struct ferry_future *f = arg;
    ferry_task_opts o = { .name = f->name, .stack_size = f->stack_size };
    bool cancelled;
    int rc;

    /* Decided under mu, so that a cancel and the start never both go
     * ahead: either the thread's cancel came first and fn never runs, or
     * fn started and the cancel reaches the running task. */
    pthread_mutex_lock(&f->mu);
    cancelled = f->cancel_req;
    if (!cancelled)
        f->started = true;
    pthread_mutex_unlock(&f->mu);
    if (cancelled) {
        future_complete(f, -ECANCELED, false);
        return;
    }
    if (!f->as_task) {
        future_complete(f, f->fn(f->arg), true);
        return;
    }
    if (ferry__inbox_closing(f->ib)) {
        /* ferry_loop_free() runs accepted posts after every task ended:
         * no new task may start now. */
        future_complete(f, -ESHUTDOWN, false);
        return;
    }
    f->unstarted.fn = unstarted_close;
    ferry__inbox_closer_add(f->ib, &f->unstarted);
    rc = ferry_task_spawn(NULL, ferry__inbox_loop(f->ib), task_body, f, &o);
    if (rc) {
        ferry__inbox_closer_del(&f->unstarted);
        future_complete(f, rc, false);
    }
}

static void cancel_cb(void *arg)
{
    struct ferry_future *f = arg;
    bool done;

    pthread_mutex_lock(&f->mu);
    done = f->done;
    pthread_mutex_unlock(&f->mu);
    if (!done) {
        if (f->task)
            ferry_task_cancel(f->task);
        else
            f->cancel_seen = true; /* spawned, not yet run */
    }
    future_unref(f);
}

/* ==== any thread: the API ============================================== */

/* The future of fn(arg) on the loop of `ib`, which holds a reference the
 * future takes over (or drops, on an error). */
static int submit_ib(struct ferry_inbox *ib, ferry_task_fn fn, void *arg, bool as_task,
                     const ferry_task_opts *opts, ferry_future **out)
{
    struct ferry_future *f;
    int rc;

    f = ferry__calloc(1, sizeof *f);
    if (!f) {
        rc = -ENOMEM;
        goto err_inbox;
    }
    if (pthread_mutex_init(&f->mu, NULL)) {
        rc = -ENOMEM;
        goto err_free;
    }
    rc = ferry__cond_init(&f->cv);
    if (rc)
        goto err_mutex;
    f->refs = 2;
    f->ib = ib;
    f->fn = fn;
    f->arg = arg;
    f->as_task = as_task;
    snprintf(f->name, sizeof f->name, "%s", opts && opts->name ? opts->name : "from_thread");
    f->stack_size = opts ? opts->stack_size : 0;
    rc = ferry__inbox_post(ib, start_cb, f);
    if (rc)
        goto err_cond;
    *out = f;
    return 0;

err_cond:
    pthread_cond_destroy(&f->cv);
err_mutex:
    pthread_mutex_destroy(&f->mu);
err_free:
    ferry__free(f);
err_inbox:
    ferry_inbox_unref(ib);
    return rc;
}

static int submit(ferry_loop *loop, ferry_task_fn fn, void *arg, bool as_task,
                  const ferry_task_opts *opts, ferry_future **out)
{
    struct ferry_inbox *ib;
    int rc;

    if (!out)
        return -EINVAL;
    *out = NULL;
    if (!loop)
        loop = ferry_loop_current();
    if (!loop || !fn)
        return -EINVAL;
    if (ferry_loop_is_current(loop))
        return -EDEADLK;
    rc = ferry_inbox_get(&ib, loop);
    if (rc)
        return rc;
    return submit_ib(ib, fn, arg, as_task, opts, out);
}

int ferry__future_spawn(struct ferry_inbox *ib, ferry_task_fn fn, void *arg,
                        const ferry_task_opts *opts, bool on_loop_ok, ferry_future **out)
{
    int rc;

    if (!out)
        return -EINVAL;
    *out = NULL;
    if (!ib || !fn)
        return -EINVAL;
    if (!on_loop_ok && ferry__inbox_on_loop(ib))
        return -EDEADLK;
    rc = ferry__inbox_ref(ib);
    if (rc)
        return rc;
    return submit_ib(ib, fn, arg, true, opts, out);
}

int ferry_loop_spawn_threadsafe(ferry_loop *loop, ferry_task_fn fn, void *arg,
                                const ferry_task_opts *opts, ferry_future **out)
{
    return submit(loop, fn, arg, true, opts, out);
}

int ferry_loop_call_threadsafe(ferry_loop *loop, ferry_task_fn fn, void *arg, ferry_future **out)
{
    return submit(loop, fn, arg, false, NULL, out);
}

/* Wait; the caller has done the pool-thread accounting. */
static int future_wait(ferry_future *f, int64_t timeout, int *status)
{
    int64_t deadline = ferry__deadline_real(timeout);
    int rc = 0;

    pthread_mutex_lock(&f->mu);
    while (!f->done) {
        if (timeout == 0 || ferry__cond_wait_until(&f->cv, &f->mu, deadline) == ETIMEDOUT) {
            if (!f->done)
                rc = -ETIMEDOUT;
            break;
        }
    }
    if (!rc && status)
        *status = f->status;
    pthread_mutex_unlock(&f->mu);
    return rc;
}

int ferry_future_wait(ferry_future *f, int64_t timeout, int *status)
{
    int rc;

    if (!f)
        return -EINVAL;
    if (ferry__inbox_on_loop(f->ib))
        return -EDEADLK;
    /* Only a task can wait on a pool: a pool thread waiting for a plain
     * callback does not count as blocked (see run_sync). */
    if (f->as_task)
        ferry__pool_block_enter();
    rc = future_wait(f, timeout, status);
    if (f->as_task)
        ferry__pool_block_exit();
    return rc;
}

/* ==== loop thread: tasks awaiting a future ============================= */

/*
 * After the wait of the node `w`, linked in f->twaiters before it: take it
 * out if the completion has not, else wait until its wake (on its way) has
 * been delivered, so that the node may go.  Requires mu; may release it
 * meanwhile.
 */
static void fwait_leave_locked(struct ferry_future *f, struct fwait *w)
{
    if (ferry__link_linked(&w->link)) {
        ferry__list_remove(&w->link);
    } else if (!w->tw.delivered) {
        pthread_mutex_unlock(&f->mu);
        ferry__task_wake_settle(&w->tw);
        pthread_mutex_lock(&f->mu);
    }
}

int ferry_future_await(ferry_future *f, int *status)
{
    struct fwait w;
    int rc, st;

    if (!f)
        return -EINVAL;
    rc = ferry__task_wake_init(&w.tw, "future", f);
    if (rc)
        return rc;
    rc = ferry__check(w.tw.w.task);
    if (rc)
        return rc;
    pthread_mutex_lock(&f->mu);
    if (!f->done) {
        ferry__link_init(&w.link);
        ferry__list_push_back(&f->twaiters, &w.link);
        pthread_mutex_unlock(&f->mu);
        rc = ferry__task_wake_wait(&w.tw);
        pthread_mutex_lock(&f->mu);
        fwait_leave_locked(f, &w);
        /* Interrupted: nothing taken, the future stays as it was. */
        if (rc == -ECANCELED || rc == -ETIMEDOUT) {
            pthread_mutex_unlock(&f->mu);
            return rc;
        }
    }
    st = f->status;
    pthread_mutex_unlock(&f->mu);
    if (status)
        *status = st;
    return 0;
}

/* Select's future case (port/loop_port.h): reading a done future takes
 * nothing, so a wake that reached a case that lost needs no passing on. */

static int sel_try(void *obj, bool send, void *buf, int *result)
{
    struct ferry_future *f = obj;
    int rc = 0;

    (void)send;
    (void)buf;
    pthread_mutex_lock(&f->mu);
    if (f->done) {
        *result = f->status;
        rc = 1;
    }
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static int sel_arm(void *obj, bool send, struct ferry_task *self, struct ferry__sel *sel,
                   void **node, struct ferry__waiter **wp)
{
    struct ferry_future *f = obj;
    struct fwait *w = ferry__malloc(sizeof *w);
    int rc;

    (void)send;
    if (!w)
        return -ENOMEM;
    rc = ferry__task_wake_init_self(&w->tw, self, "future", f);
    if (rc) {
        ferry__free(w);
        return rc;
    }
    w->tw.w.sel = sel;
    w->fired = false;
    ferry__link_init(&w->link);
    pthread_mutex_lock(&f->mu);
    if (f->done) {
        pthread_mutex_unlock(&f->mu);
        ferry__free(w);
        return 1;
    }
    ferry__list_push_back(&f->twaiters, &w->link);
    pthread_mutex_unlock(&f->mu);
    *node = w;
    *wp = &w->tw.w;
    return 0;
}

/* Take the node out without suspending (select's first step of undoing a
 * wait): a node still linked could be fired after the select stopped
 * waiting.  One the completion unlinked keeps its wake, on its way. */
static void sel_detach(void *obj, bool send, void *node)
{
    struct ferry_future *f = obj;
    struct fwait *w = node;

    (void)send;
    pthread_mutex_lock(&f->mu);
    w->fired = !ferry__link_linked(&w->link);
    if (!w->fired)
        ferry__list_remove(&w->link);
    pthread_mutex_unlock(&f->mu);
    if (w->tw.w.state == FERRY__W_WAITING)
        w->tw.w.state = FERRY__W_IDLE;
}

/* The second step: wait for a wake still on its way, then free the node. */
static void sel_disarm(void *obj, bool send, void *node)
{
    struct fwait *w = node;

    (void)obj;
    (void)send;
    if (w->fired && !w->tw.delivered)
        ferry__task_wake_settle(&w->tw);
    ferry__free(w);
}

static int sel_done(void *obj, bool send, void *buf, bool perform, int *result)
{
    (void)send;
    return perform ? sel_try(obj, false, buf, result) : 0;
}

const struct ferry__sel_ext ferry__future_sel_ext = {
    .try_op = sel_try,
    .arm = sel_arm,
    .detach = sel_detach,
    .disarm = sel_disarm,
    .done = sel_done,
};

/* ==== any thread ======================================================= */

bool ferry_future_done(ferry_future *f)
{
    bool d;

    if (!f)
        return false;
    pthread_mutex_lock(&f->mu);
    d = f->done;
    pthread_mutex_unlock(&f->mu);
    return d;
}

int ferry_future_cancel(ferry_future *f)
{
    int rc;
    bool post;

    if (!f)
        return -EINVAL;
    pthread_mutex_lock(&f->mu);
    if (f->done) {
        pthread_mutex_unlock(&f->mu);
        return 0;
    }
    f->cancel_req = true;
    /* Not started: the start sees the request and never calls fn.  A
     * started plain callback cannot be interrupted.  A started task is
     * cancelled on the loop. */
    post = f->started && f->as_task;
    if (post)
        f->refs++;
    pthread_mutex_unlock(&f->mu);
    if (!post)
        return 0;
    rc = ferry__inbox_post(f->ib, cancel_cb, f);
    if (rc) {
        future_unref(f);
        /* A closed loop ran (or refused) everything: nothing to cancel. */
        return rc == -ESHUTDOWN ? 0 : rc;
    }
    return 0;
}

void ferry_future_free(ferry_future *f)
{
    if (f)
        future_unref(f);
}

static int run_sync(ferry_loop *loop, ferry_task_fn fn, void *arg, bool as_task, int64_t timeout,
                    int *status)
{
    ferry_future *f;
    int rc, st = 0;

    /* A pool thread counts as blocked before the request can reach the
     * loop: a task it starts that offloads into the same pool must see it.
     * A plain callback cannot suspend, so it never waits on a pool: a pool
     * thread waiting for one does not count, or jobs of other tasks
     * would fail with -EDEADLK where no deadlock is possible. */
    if (!loop)
        loop = ferry_loop_current();
    if (loop && ferry_loop_is_current(loop))
        return -EDEADLK;
    if (as_task)
        ferry__pool_block_enter();
    rc = submit(loop, fn, arg, as_task, NULL, &f);
    if (rc) {
        if (as_task)
            ferry__pool_block_exit();
        return rc;
    }
    rc = future_wait(f, timeout, &st);
    if (rc == -ETIMEDOUT) {
        bool started;

        ferry_future_cancel(f);
        pthread_mutex_lock(&f->mu);
        started = f->started;
        pthread_mutex_unlock(&f->mu);
        /* fn started: wait for it (a cancelled task ends at its next
         * suspension point), so that `arg` is not used after we return.
         * Not started: it never will be. */
        if (started)
            future_wait(f, FERRY_NEVER, NULL);
    }
    if (as_task)
        ferry__pool_block_exit();
    if (rc != -ETIMEDOUT && !rc && !f->ran)
        rc = st; /* never ran: -ESHUTDOWN, -ENOMEM, -ECANCELED */
    ferry_future_free(f);
    if (!rc && status)
        *status = st;
    return rc;
}

int ferry_loop_run_task_sync(ferry_loop *loop, ferry_task_fn fn, void *arg, int64_t timeout,
                             int *status)
{
    return run_sync(loop, fn, arg, true, timeout, status);
}

int ferry_loop_run_sync(ferry_loop *loop, ferry_task_fn fn, void *arg, int64_t timeout, int *status)
{
    return run_sync(loop, fn, arg, false, timeout, status);
}
