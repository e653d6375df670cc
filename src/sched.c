/* sched.c - the scheduler: the run queue, one turn at a time, polling
 * libevent between turns, ferry_loop_run(), and running turns inside an
 * application's own dispatch.
 * Loop thread only.
 *
 * A turn runs what was ready when it began; what becomes ready during it
 * waits for the next turn.  A yield costs no system call: I/O and timers
 * are polled every `io_interval` steps, and whenever the run queue is empty
 * (then blocking until the earliest timer).  Tasks hand the CPU to each
 * other within a turn without coming back here (switch.h).
 */
#include "loop_only.h"

#include <stdlib.h>
#include <string.h>

#include "rand.h"
#include "loop_int.h"
#include "loop_new.h"
#include "switch.h"

void ferry__loop_kick(ferry_loop *loop)
{
    if (!loop->in_run && !loop->kick_pending) {
        loop->kick_pending = true;
        event_active(loop->kick_ev, EV_READ, 0);
    }
}

int ferry_call_soon(ferry_loop *loop, ferry_cb cb, void *arg)
{
    struct ferry__cbnode *c;
    int rc = ferry__loop_arg(&loop);

    if (rc)
        return rc;
    if (!cb)
        return -EINVAL;
    c = ferry__malloc(sizeof *c);
    if (!c)
        return -ENOMEM;
    c->run.kind = FERRY__RUN_CB;
    c->cb = cb;
    c->arg = arg;
    ferry__list_push_back(&loop->runq, &c->run.link);
    if (!loop->in_run)
        ferry__loop_kick(loop);
    return 0;
}

static inline __attribute__((always_inline)) void run_step(ferry_loop *loop,
                                                           struct ferry__runnable *r)
{
    /* Read once: a step may change the threshold, and `r` may be freed by
     * the time the step ends. */
    int64_t slow = loop->slow_ns;
    int64_t t0 = slow ? ferry__now_real() : 0;
    bool is_task = r->kind == FERRY__RUN_TASK;
    char name[sizeof((ferry_task *)0)->name];

    if (is_task) {
        ferry_task *t = ferry__container_of(r, ferry_task, run);
        if (slow)
            memcpy(name, t->name, sizeof name);
        if (__builtin_expect(!t->started, 0))
            ferry__task_resume(t);
        else
            ferry__task_run(loop, t);
    } else {
        struct ferry__cbnode *c = ferry__container_of(r, struct ferry__cbnode, run);
        ferry_cb cb = c->cb;
        void *arg = c->arg;
        if (r->kind == FERRY__RUN_TIMER)
            ferry__free(ferry__container_of(c, ferry_timer, run));
        else
            ferry__free(c);
        cb(arg);
    }
    loop->stats.steps++;
    loop->since_poll++;
    if (slow) {
        int64_t dt = ferry__now_real() - t0;
        if (dt > slow)
            ferry__loop_report_slow(loop, dt, slow, is_task ? name : NULL);
    }
}

/* Run what is ready now.  Returns false if nothing was. */
static bool run_turn(ferry_loop *loop)
{
    struct ferry__link local, *l;

    if (ferry__list_empty(&loop->runq))
        return false;
    ferry__list_move(&local, &loop->runq);
    if (__builtin_expect(loop->fuzz, 0))
        ferry__fuzz_shuffle(loop, &local);
    loop->in_turn = true;
    loop->turn = &local;
    loop->stats.turns++;
    while ((l = ferry__list_pop_front(&local))) {
        ferry__prefetch_run(loop, local.next, &local);
        run_step(loop, ferry__container_of(l, struct ferry__runnable, link));
        if (loop->stop && !loop->closing) {
            /* Put back what this turn did not reach, in order. */
            while ((l = ferry__list_pop_front(&local)) != NULL)
                ferry__list_push_back(&loop->runq, l);
            break;
        }
    }
    loop->in_turn = false;
    loop->turn = NULL;
    return true;
}

/*
 * One poll of libevent.  Under schedule fuzzing the bridge then decides,
 * from the seed, whether what threads sent comes in now (whatever woke
 * the poll): threads' posts reach a fuzzed loop only here.
 */
static void poll_base(ferry_loop *loop, int flags)
{
    event_base_loop(loop->base, flags);
    if (__builtin_expect(loop->fuzz, 0) && loop->hooks.fuzz_deliver)
        loop->hooks.fuzz_deliver(loop->hooks.ctx);
}

/*
 * A loop with a virtual clock about to block: poll without blocking first,
 * and if that made nothing ready, nothing holds the clock and a timer is
 * waiting, jump to its deadline instead of blocking.  The clock is held by
 * a task waiting for a pool job (ferry__wait_held()) and by what the bridge
 * still has to deliver (posts and completions from other threads, jobs
 * whose callback will run on the loop): those end in real time, and a jump
 * would fire deadlines that they would have beaten.  Tasks waiting for
 * descriptors or signals do not hold it: whatever is ready for them at the
 * poll is served first, and the rest is idle.  Returns true if the loop
 * need not block.
 */
static bool vclock_poll(ferry_loop *loop)
{
    poll_base(loop, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    loop->stats.polls++;
    loop->since_poll = 0;
    if (!ferry__list_empty(&loop->runq) || loop->stop)
        return true;
    if (loop->vholds || (loop->hooks.pending && loop->hooks.pending(loop->hooks.ctx)))
        return false;
    return ferry__vclock_jump(loop);
}

/*
 * The entries of a turn run in an order drawn from the loop's generator:
 * every primitive decides who gets what when it grants (docs/design.md),
 * so the order in which the granted tasks then run is free, and so is the
 * order of a task and a callback.  Callbacks keep their order among
 * themselves (ferry_call_soon() promises it): the tasks are shuffled, then
 * merged with the callbacks at random places.  Without memory for the
 * shuffle the turn keeps its order.
 */
static int by_task_id(const void *a, const void *b)
{
    const ferry_task *x =
        ferry__container_of(*(struct ferry__link *const *)a, ferry_task, run.link);
    const ferry_task *y =
        ferry__container_of(*(struct ferry__link *const *)b, ferry_task, run.link);

    return x->id < y->id ? -1 : x->id > y->id;
}

void ferry__fuzz_shuffle(ferry_loop *loop, struct ferry__link *turn)
{
    struct ferry__link *l;
    size_t n = 0, ntasks = 0, i, k;
    void **buf;

    ferry__list_foreach(l, turn) {
        n++;
        if (ferry__container_of(l, struct ferry__runnable, link)->kind == FERRY__RUN_TASK)
            ntasks++;
    }
    if (ntasks == 0 || n < 2)
        return;
    if (n > loop->fuzz_cap) {
        buf = ferry__realloc(loop->fuzz_buf, n * 2 * sizeof *buf);
        if (!buf)
            return;
        loop->fuzz_buf = buf;
        loop->fuzz_cap = n * 2;
    }
    /* The tasks first, then the callbacks in their order. */
    buf = loop->fuzz_buf;
    i = 0;
    k = ntasks;
    while ((l = ferry__list_pop_front(turn)) != NULL) {
        if (ferry__container_of(l, struct ferry__runnable, link)->kind == FERRY__RUN_TASK)
            buf[i++] = l;
        else
            buf[k++] = l;
    }
    /* By spawn number first: the order in which tasks became ready can
     * depend on threads (which completion the loop took first), the set
     * of them does not once the bridge lets completions in at seeded
     * polls, and the shuffle must depend only on the set and the seed. */
    qsort(buf, ntasks, sizeof *buf, by_task_id);
    for (i = ntasks - 1; i > 0; i--) { /* Fisher-Yates */
        size_t j = ferry__rand_below(&loop->rng, (uint32_t)(i + 1));
        void *t = buf[i];

        buf[i] = buf[j];
        buf[j] = t;
    }
    /* A uniform merge: the next entry is a callback with the share of
     * callbacks among the entries left. */
    for (i = 0, k = ntasks; i < ntasks || k < n;) {
        size_t tasks_left = ntasks - i, cbs_left = n - k;
        uint32_t left = (uint32_t)(tasks_left + cbs_left);

        if (cbs_left && (!tasks_left || ferry__rand_below(&loop->rng, left) < cbs_left))
            ferry__list_push_back(turn, buf[k++]);
        else
            ferry__list_push_back(turn, buf[i++]);
    }
}

static void poll_io(ferry_loop *loop, bool block)
{
    int flags = EVLOOP_ONCE;

    ferry__timers_expire(loop);
    if (loop->io_prepoll)
        loop->io_prepoll(loop);
    if (!ferry__list_empty(&loop->runq) || loop->stop)
        block = false;
    ferry__stack_poll(loop, block);
    if (block && loop->vclock && vclock_poll(loop))
        return;
    if (block) {
        ferry__timers_arm(loop);
        flags |= EVLOOP_NO_EXIT_ON_EMPTY;
    } else {
        flags |= EVLOOP_NONBLOCK;
    }
    poll_base(loop, flags);
    loop->stats.polls++;
    loop->since_poll = 0;
    ferry__timers_expire(loop);
}

static bool nothing_left(ferry_loop *loop)
{
    if (loop->live || !ferry__list_empty(&loop->runq) || ferry__heap_min(&loop->timers))
        return false;
    if (loop->refs > 0 && !loop->closing)
        return false;
    if (loop->hooks.pending && loop->hooks.pending(loop->hooks.ctx))
        return false;
    return true;
}

static void drive(ferry_loop *loop, int mode)
{
    for (;;) {
        if (run_turn(loop)) {
            if (loop->stop)
                break;
            if (mode == FERRY_RUN_ONCE) {
                poll_io(loop, false);
                break;
            }
            /* Under fuzzing, every turn ends with a poll: each is a
             * place where threads' completions may come in. */
            if (loop->since_poll >= loop->io_interval || loop->fuzz)
                poll_io(loop, false);
            continue;
        }
        if (loop->stop)
            break;
        if (mode == FERRY_RUN_ONCE) {
            poll_io(loop, false);
            run_turn(loop);
            break;
        }
        if (mode == FERRY_RUN_DEFAULT && nothing_left(loop))
            break;
        poll_io(loop, true);
    }
}

int ferry_loop_run(ferry_loop *loop, int mode)
{
    ferry_task *prev_task;
    ferry_loop *prev;
    int rc = ferry__loop_arg(&loop);

    if (rc)
        return rc;
    if (mode != FERRY_RUN_DEFAULT && mode != FERRY_RUN_FOREVER && mode != FERRY_RUN_ONCE)
        return -EINVAL;
    if (loop->in_run || loop->in_turn)
        return -EPERM;
    prev = ferry__tls_loop;
    prev_task = ferry__tls_task; /* a task of another loop running this one */
    ferry__tls_loop = loop;
    ferry__tls_task = NULL;
    loop->in_run = true;
    loop->stop = false;
    ferry__loop_hand_update(loop);
    loop->one_turn = mode == FERRY_RUN_ONCE;
    drive(loop, mode);
    /* What the last turn offloaded goes to the pools now: the callback that
     * hands it over runs in the next turn, and an application that drives
     * the loop one pass at a time may make that pass only once these jobs
     * are done. */
    if (loop->hooks.flush)
        loop->hooks.flush(loop->hooks.ctx);
    loop->one_turn = false;
    loop->in_run = false;
    loop->stop = false;
    ferry__loop_hand_update(loop);
    ferry__tls_loop = prev ? prev : loop;
    ferry__tls_task = prev_task;
    /* Someone else's dispatch may drive us from now on. */
    if (!ferry__list_empty(&loop->runq))
        ferry__loop_kick(loop);
    ferry__loop_timers_changed(loop);
    return 0;
}

/* Runs turns when the application's own event_base_dispatch drives us. */
static void kick_cb(evutil_socket_t fd, short what, void *arg)
{
    ferry_loop *loop = arg;
    ferry_loop *prev = ferry__tls_loop;
    ferry_task *prev_task = ferry__tls_task;
    unsigned steps = 0;

    (void)fd;
    (void)what;
    loop->kick_pending = false;
    if (loop->in_run || loop->in_turn)
        return;
    ferry__tls_loop = loop;
    ferry__tls_task = NULL;
    loop->since_poll = 0;
    ferry__timers_expire(loop);
    while (steps < loop->io_interval && !ferry__list_empty(&loop->runq)) {
        uint64_t before = loop->stats.steps;
        run_turn(loop);
        steps += (unsigned)(loop->stats.steps - before);
    }
    ferry__stack_poll(loop, ferry__list_empty(&loop->runq));
    ferry__tls_loop = prev ? prev : loop;
    ferry__tls_task = prev_task;
    if (!ferry__list_empty(&loop->runq))
        ferry__loop_kick(loop);
    ferry__timers_arm(loop);
}

int ferry__sched_init(ferry_loop *loop)
{
    loop->kick_ev = event_new(loop->base, -1, 0, kick_cb, loop);
    return loop->kick_ev ? 0 : -ENOMEM;
}

void ferry__sched_fini(ferry_loop *loop)
{
    event_free(loop->kick_ev);
}

void ferry__sched_end_tasks(ferry_loop *loop)
{
    struct ferry__link *l, *tmp;

    /* Until the parts may go too: a part may still owe callbacks (the
     * resolver's lookups cancelled by now, from evdns). */
    while (loop->live || !ferry__list_empty(&loop->runq) || ferry__loop_parts_closing(loop)) {
        ferry__list_foreach_safe(l, tmp, &loop->tasks)
            ferry_task_cancel(ferry__container_of(l, ferry_task, all));
        loop->stop = false;
        ferry__loop_hand_update(loop);
        if (!run_turn(loop))
            poll_io(loop, loop->live != 0);
        else if (loop->since_poll >= loop->io_interval)
            poll_io(loop, false);
    }
}

void ferry__sched_run_ready(ferry_loop *loop)
{
    while (run_turn(loop))
        ;
}
