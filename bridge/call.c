/* call.c - the cross-loop call of a runtime (ferry_runtime_call()), the
 * spawn of a task on a loop of a runtime, a loop's place in its runtime,
 * and the loops' load figures.  docs/runtime.md has the contract and the
 * picture of the call's states.
 *
 * A call's state is a record on the caller's stack (struct call): the
 * caller waits until the target has answered, whatever happens, so the
 * record outlives every use the target makes of it.  The request and the
 * cancel request travel as completion nodes of that record through the
 * target's inbox, the answer as the caller's wake through the caller's
 * inbox: nothing is allocated, and the only locks taken are the two
 * inboxes' mutexes, one at a time.  One atomic word orders the target's
 * start of fn and its end against the caller's cancellation:
 *
 *   QUEUED     posted; the target swaps it to STARTED when the request
 *              runs there, the caller to CANCELLED when it gives up first
 *              (fn then never runs, and the target answers at once);
 *   STARTED    fn runs (or is about to, or could not): the target swaps it
 *              to ENDED when fn ends and answers; a caller that gives up
 *              swaps it to CANCELLING and posts the cancel node;
 *   CANCELLING the cancel node is on its way: of fn's end and the node's
 *              arrival, whichever comes second answers.  The node lives on
 *              the caller's stack, so the answer must not come before the
 *              target is done with it.
 *
 * Who runs what: the caller's half (ferry_runtime_call(), the lanes) on
 * the caller's loop thread; the target's half (req_run(), cancel_run(),
 * call_task(), finish()) on the target's loop thread.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>

#include "fuzz.h"
#include "runtime_int.h"

enum { CALL_QUEUED, CALL_STARTED, CALL_ENDED, CALL_CANCELLED, CALL_CANCELLING };

struct call {
    struct ferry__cnode req;      /* posted to the target: start fn */
    struct ferry__cnode cancel;   /* posted to the target: cancel fn's task */
    struct ferry__task_wake done; /* the caller's wake, fired with the answer */
    atomic_int state;             /* CALL_*, see the top */
    /* Set by the caller before the request is posted. */
    ferry_call_fn fn;
    void *arg;
    bool as_task;               /* a task, else a plain callback */
    int64_t deadline;           /* the caller's, on the real clock */
    struct ferry__rt_slot *dst; /* the target loop's slot */
    /* Written by the target, read by the caller once answered. */
    int rc;       /* 0: fn ran to its end; else why it never ran */
    int status;   /* fn's return value */
    void *result; /* what fn stored */
    /* The target's thread only. */
    ferry_task *task; /* fn's task while fn runs */
    bool cancel_seen; /* the cancel node has run */
    bool ended;       /* finish() came first and left the answer to
                                        * the cancel node */
};

static const ferry_task_opts call_task_opts = { .name = "call" };

/* ==== a loop's place in its runtime (any thread) ======================== */

/* Where the runtime's part of an inbox's extension room begins. */
static size_t rt_room_offset(void)
{
    size_t a = _Alignof(max_align_t);

    return (ferry__to_thread_room + a - 1) / a * a;
}

size_t ferry__inbox_room(void)
{
    return rt_room_offset() + sizeof(struct ferry__loop_rt);
}

struct ferry__loop_rt *ferry__loop_rt(ferry_loop *loop)
{
    struct ferry_inbox *ib = ferry__inbox_of(loop);

    /* The room is aligned for any type and the offset a multiple of that. */
    return ib ? (struct ferry__loop_rt *)(void *)((char *)ferry__inbox_ext(ib) + rt_room_offset())
              : NULL;
}

struct ferry_runtime *ferry__rt_resolve(struct ferry_runtime *rt)
{
    struct ferry__loop_rt *me;
    ferry_loop *loop;

    if (rt)
        return rt;
    loop = ferry_loop_current();
    me = loop ? ferry__loop_rt(loop) : NULL;
    return me ? me->rt : NULL;
}

ferry_runtime *ferry_runtime_current(void)
{
    return ferry__rt_resolve(NULL);
}

unsigned ferry_runtime_size(const ferry_runtime *rt)
{
    rt = ferry__rt_resolve((ferry_runtime *)rt);
    return rt ? rt->n : 0;
}

int ferry_runtime_index(const ferry_runtime *rt, const ferry_loop *loop)
{
    unsigned i;

    if (!loop)
        loop = ferry_loop_current();
    if (!loop)
        return -ENOENT;
    if (!rt) {
        /* The loop's own record: the caller's loop, or one it knows lives. */
        struct ferry__loop_rt *r = ferry__loop_rt((ferry_loop *)loop);
        rt = r ? r->rt : NULL;
    }
    if (!rt)
        return -ENOENT;
    /* Pointers only: `loop` is never read through here. */
    for (i = 0; i < rt->n; i++)
        if (rt->slots[i]->loop == loop)
            return (int)i;
    return -ENOENT;
}

ferry_loop *ferry_runtime_loop(ferry_runtime *rt, unsigned index)
{
    rt = ferry__rt_resolve(rt);
    return rt && index < rt->n ? rt->slots[index]->loop : NULL;
}

int ferry_runtime_load_add(ferry_runtime *rt, unsigned index, int64_t delta)
{
    rt = ferry__rt_resolve(rt);
    if (!rt || index >= rt->n)
        return -EINVAL;
    atomic_fetch_add_explicit(&rt->slots[index]->load, delta, memory_order_relaxed);
    return 0;
}

int64_t ferry_runtime_load(const ferry_runtime *rt, unsigned index)
{
    rt = ferry__rt_resolve((ferry_runtime *)rt);
    if (!rt || index >= rt->n)
        return 0;
    return atomic_load_explicit(&rt->slots[index]->load, memory_order_relaxed);
}

int ferry_runtime_spawn(ferry_runtime *rt, unsigned index, ferry_task_fn fn, void *arg,
                        const ferry_task_opts *opts, ferry_future **out)
{
    if (out)
        *out = NULL;
    rt = ferry__rt_resolve(rt);
    if (!rt || index >= rt->n)
        return -EINVAL;
    /* The runtime's counted reference: a loop that has closed refuses, and
     * its freed structure is never reached. */
    return ferry__future_spawn(rt->slots[index]->ib, fn, arg, opts, true, out);
}

/* ==== the target's half (the target loop's thread) ====================== */

/* Wake the caller with the answer: the last use of `c`, whose caller may
 * return at once. */
static void answer(struct call *c)
{
    ferry__task_wake_fire(&c->done, 0);
}

/*
 * fn has ended, or it is known that it never will run (c->rc says which):
 * answer, unless the caller's cancel node is on its way (CANCELLING) and
 * has not run yet.  Then cancel_run() answers when it comes, and the
 * loop's close, should the loop be freed meanwhile, waits for it.
 */
static void finish(struct call *c)
{
    int st = CALL_STARTED;

    if (atomic_compare_exchange_strong_explicit(&c->state, &st, CALL_ENDED, memory_order_acq_rel,
                                                memory_order_acquire) ||
        c->cancel_seen) {
        answer(c);
        return;
    }
    c->ended = true;
    ferry__inbox_expect(c->dst->ib);
}

static void cancel_run(struct ferry__cnode *n)
{
    struct call *c = ferry__container_of(n, struct call, cancel);

    c->cancel_seen = true;
    if (c->ended) {
        ferry__inbox_unreserve(c->dst->ib);
        answer(c);
        return;
    }
    /* A task spawned and not yet started sees cancel_seen when it starts
     * and never runs fn. */
    if (c->task)
        ferry_task_cancel(c->task);
}

/*
 * The body of fn's task.  It always runs, also when the task was
 * cancelled before it started (ferry__task_spawn_always()): its loop is
 * ending then, and its answer cannot wait for the loop's close, which
 * comes only once the loop's own tasks have ended; they may be waiting
 * for calls to loops that wait for this one.
 */
static int call_task(void *arg)
{
    struct call *c = arg;
    ferry_scope sc;

    if (c->cancel_seen || ferry__loop_closing(c->dst->loop)) {
        c->rc = c->cancel_seen ? -ECANCELED : -ESHUTDOWN;
        finish(c);
        return 0;
    }
    c->task = ferry_task_current();
    if (c->deadline != FERRY_NEVER)
        ferry_scope_enter(&sc, ferry__deadline_from_real(c->deadline), 0);
    c->status = c->fn(c->arg, &c->result);
    if (c->deadline != FERRY_NEVER)
        ferry_scope_exit(&sc);
    c->task = NULL;
    c->rc = 0;
    finish(c);
    return 0;
}

static void req_run(struct ferry__cnode *n)
{
    struct call *c = ferry__container_of(n, struct call, req);
    struct ferry__rt_slot *dst = c->dst;
    int st = CALL_QUEUED, rc;

    dst->calls_in++;
    if (!atomic_compare_exchange_strong_explicit(&c->state, &st, CALL_STARTED, memory_order_acq_rel,
                                                 memory_order_acquire)) {
        /* CANCELLED: the caller gave up first and posts nothing more. */
        c->rc = -ECANCELED;
        answer(c);
        return;
    }
    if (ferry__loop_closing(dst->loop)) {
        c->rc = -ESHUTDOWN;
        finish(c);
        return;
    }
    if (!c->as_task) {
        c->status = c->fn(c->arg, &c->result);
        c->rc = 0;
        finish(c);
        return;
    }
    rc = ferry__task_spawn_always(dst->loop, call_task, c, &call_task_opts);
    if (rc) {
        c->rc = rc;
        finish(c);
    }
}

/* ==== the caller's half (the caller's loop thread) ====================== */

/* A call on the lane ended (or a caller handed room gave it up): room for
 * the first waiter, which gets it counted (a hand-over, so a new caller
 * cannot take it first). */
static void lane_release(struct ferry__rt_lane *lane, unsigned cap)
{
    struct ferry__link *l;

    lane->inflight--;
    if (lane->inflight < cap && (l = ferry__list_first(&lane->waiters.head)) != NULL) {
        lane->inflight++;
        ferry__grant(ferry__container_of(l, struct ferry__waiter, link), 0);
    }
}

/* Count a call on the lane, waiting for room while `cap` are in flight or
 * others wait.  Returns 0; -ECANCELED, -ETIMEDOUT (not counted). */
static int lane_take(struct ferry__rt_lane *lane, unsigned cap, struct ferry_task *self,
                     struct ferry__rt_slot *src, const ferry_loop *to)
{
    struct ferry__waiter w;
    int rc;

    if (lane->inflight < cap && ferry__list_empty(&lane->waiters.head)) {
        lane->inflight++;
        return 0;
    }
    src->call_waits++;
    ferry__waiter_init(&w, self, "call room", to);
    rc = ferry__wait(&lane->waiters, &w, FERRY_NEVER);
    if (rc && w.state == FERRY__W_GRANTED)
        lane_release(lane, cap); /* handed room, then interrupted: pass it on */
    return rc;
}

/* The caller was interrupted while the call ran: stop fn if it has not
 * started, cancel its task if it has, and wait, shielded, for the answer. */
static void call_interrupt(struct call *c)
{
    int st = CALL_QUEUED;

    if (!atomic_compare_exchange_strong_explicit(&c->state, &st, CALL_CANCELLED,
                                                 memory_order_acq_rel, memory_order_acquire) &&
        st == CALL_STARTED && c->as_task &&
        atomic_compare_exchange_strong_explicit(&c->state, &st, CALL_CANCELLING,
                                                memory_order_acq_rel, memory_order_acquire)) {
        /* Cannot fail: until fn's end has been answered, the target loop
         * cannot finish closing (finish() makes it wait for this node). */
        ferry__inbox_complete(c->dst->ib, &c->cancel);
    }
    ferry__task_wake_settle(&c->done);
}

int ferry_runtime_call(ferry_runtime *rt, unsigned index, ferry_call_fn fn, void *arg,
                       unsigned flags, int *status, void **result)
{
    struct ferry__loop_rt *me;
    struct ferry__rt_slot *src;
    struct ferry__rt_lane *lane;
    struct ferry_task *self;
    struct call c;
    void *res = NULL;
    int rc;

    if (!fn || !status || (flags & ~FERRY_CALL_CALLBACK))
        return -EINVAL;
    rc = ferry__enter_task(&self);
    if (rc)
        return rc;
    me = ferry__loop_rt(ferry__task_loop(self));
    if (!me || !me->rt || (rt && rt != me->rt))
        return -EPERM;
    rt = me->rt;
    if (index >= rt->n)
        return -EINVAL;
    src = rt->slots[me->index];
    rc = ferry__check(self);
    if (rc)
        return rc;
    if (index == me->index) {
        /* Inline: the caller's own cancellation and scopes apply. */
        src->calls_inline++;
        *status = fn(arg, &res);
        if (result)
            *result = res;
        return 0;
    }
    lane = &src->lanes[index];
    rc = lane_take(lane, rt->cap, self, src, rt->slots[index]->loop);
    if (rc)
        return rc;
    src->calls_out++;
    rc = ferry__task_wake_init_self(&c.done, self, "call", rt->slots[index]->loop);
    if (rc) {
        lane_release(lane, rt->cap);
        return rc;
    }
    /* Work on another thread: a virtual clock does not jump meanwhile. */
    c.done.hold = true;
    atomic_init(&c.state, CALL_QUEUED);
    c.req.fn = req_run;
    c.cancel.fn = cancel_run;
    c.fn = fn;
    c.arg = arg;
    c.as_task = !(flags & FERRY_CALL_CALLBACK);
    c.deadline = ferry__deadline_to_real(ferry__task_deadline(self));
    c.dst = rt->slots[index];
    c.rc = 0;
    c.status = 0;
    c.result = NULL;
    c.task = NULL;
    c.cancel_seen = false;
    c.ended = false;
    /* Schedule fuzzing: calls of a burst may reach the target spread out. */
    ferry__fuzz_delay();
    rc = ferry__inbox_post_node(c.dst->ib, &c.req);
    if (rc) {
        lane_release(lane, rt->cap);
        return rc;
    }
    rc = ferry__task_wake_wait(&c.done);
    if (!c.done.delivered)
        call_interrupt(&c);
    lane_release(lane, rt->cap);
    if (c.rc == 0) {
        *status = c.status;
        if (result)
            *result = c.result;
        return 0;
    }
    /* fn never ran because the caller gave up: say why it did. */
    if (c.rc == -ECANCELED && (rc == -ECANCELED || rc == -ETIMEDOUT))
        return rc;
    return c.rc;
}
