/* task.c - a task's life after its spawn (spawn.c): running, ending,
 * joining, detaching, cancelling; ferry_yield(); what the API tells of a
 * task.
 * Loop thread only.
 */
#include "loop_only.h"

#include <stdlib.h>

#include "loop_int.h"
#include "rand.h"
#include "sanitize.h"
#include "switch.h"

void ferry__canary_dead(ferry_task *t)
{
    ferry__log(FERRY_LOG_ERROR, "stack overflow in task '%s' (canary overwritten)", t->name);
    abort();
}

void ferry__fiber_create(ferry_task *t)
{
#ifdef FERRY_TSAN_ON
    if (!t->tsan_fiber) {
        t->tsan_fiber = __tsan_create_fiber(0);
        __tsan_set_fiber_name(t->tsan_fiber, t->name);
    }
#else
    (void)t;
#endif
}

void ferry__fiber_destroy(ferry_task *t)
{
#ifdef FERRY_TSAN_ON
    if (t->tsan_fiber) {
        __tsan_destroy_fiber(t->tsan_fiber);
        t->tsan_fiber = NULL;
    }
#else
    (void)t;
#endif
}

ferry_loop *ferry__task_loop(const ferry_task *t)
{
    return t->loop;
}

uint64_t ferry__task_number(const ferry_task *t)
{
    return t->id;
}

static void task_finish(ferry_task *t, int status)
{
    ferry_loop *loop = t->loop;

    t->status = status;
    if (__builtin_expect(t->locals != NULL, 0))
        ferry__locals_end(t); /* before anyone sees it done */
    t->state = FERRY_TASK_DONE;
    if (__builtin_expect(t->locks != 0, 0))
        ferry__task_locks_died(t); /* locks it still holds break */
    ferry__waitq_grant_all(&t->joiners, 0);
    ferry__list_remove(&t->all);
    loop->live--;
    if (t->group)
        ferry__group_child_done(t);
}

void ferry__task_entry(void *arg)
{
    ferry_task *t = arg;

    ferry__switch_arrived(t->loop, t);
    task_finish(t, t->fn(t->arg));
    ferry__switch_to_sched(t->loop, t, true);
    abort(); /* a finished task is never resumed */
}

void ferry__task_resume(ferry_task *t)
{
    ferry_loop *loop = t->loop;

    if (!t->started) {
        t->started = true;
        if (t->cancelled && !(t->gflags & FERRY__TASK_BODY_ALWAYS)) {
            /* Cancelled before its first run: the body never runs. */
            task_finish(t, -ECANCELED);
            ferry__task_release(t);
            return;
        }
    }
    ferry__task_run(loop, t);
}

void ferry__task_release(ferry_task *t)
{
    ferry_loop *loop = t->loop;

    if (t->state != FERRY_TASK_DONE || t->handle)
        return;
    if (loop->current == t)
        return; /* still on its stack: the scheduler releases it */
    ferry__fiber_destroy(t);
    ferry__stack_put(loop, &t->stk);
}

int ferry_task_join(ferry_task *t, int *status)
{
    struct ferry__waiter w;
    ferry_task *self;
    int rc;

    if (!t)
        return -EINVAL;
    rc = ferry__enter_task_inline(&self);
    if (rc)
        return rc;
    if (t->loop != self->loop)
        return -EPERM;
    if (t == self)
        return -EDEADLK;
    if (!t->handle)
        return -EINVAL;
    rc = ferry__check_inline(self);
    if (rc)
        return rc;
    while (t->state != FERRY_TASK_DONE) {
        ferry__waiter_init(&w, self, "join", t);
        rc = ferry__wait(&t->joiners, &w, FERRY_NEVER);
        if (rc)
            return rc;
    }
    if (status)
        *status = t->status;
    t->handle = false;
    ferry__task_release(t);
    return 0;
}

int ferry_task_try_join(ferry_task *t, int *status)
{
    int rc;

    if (!t)
        return -EINVAL;
    rc = ferry__loop_check(t->loop);
    if (rc)
        return rc;
    if (!t->handle)
        return -EINVAL;
    if (t->state != FERRY_TASK_DONE)
        return -EAGAIN;
    if (status)
        *status = t->status;
    t->handle = false;
    ferry__task_release(t);
    return 0;
}

int ferry_task_detach(ferry_task *t)
{
    int rc;

    if (!t)
        return -EINVAL;
    rc = ferry__loop_check(t->loop);
    if (rc)
        return rc;
    if (!t->handle)
        return -EINVAL;
    t->handle = false;
    ferry__task_release(t);
    return 0;
}

int ferry_task_cancel(ferry_task *t)
{
    struct ferry__waiter *w;
    int rc;

    if (!t)
        return -EINVAL;
    rc = ferry__loop_check(t->loop);
    if (rc)
        return rc;
    if (t->state == FERRY_TASK_DONE)
        return 0;
    t->cancelled = true;
    w = t->waiter;
    if (t->state == FERRY_TASK_WAITING && w && w->state == FERRY__W_WAITING &&
        !ferry__task_shielded(t)) {
        if (ferry__link_linked(&w->link))
            ferry__list_remove(&w->link);
        w->state = FERRY__W_CANCELLED;
        ferry__task_ready(t);
    }
    return 0;
}

ferry_task *ferry_task_current(void)
{
    ferry_loop *loop = ferry__loop_tls();
    return loop && ferry_loop_is_current(loop) ? loop->current : NULL;
}

const char *ferry_task_name(const ferry_task *t)
{
    return t ? t->name : "(null)";
}

enum ferry_task_state ferry_task_state(const ferry_task *t)
{
    return (enum ferry_task_state)t->state;
}

bool ferry_task_cancelled(const ferry_task *t)
{
    return t && t->cancelled;
}

/* ferry_yield() when another runnable exists: queue the task at the back
 * and switch away.  Out of line, so that the path without a switch saves
 * no registers. */
static __attribute__((noinline)) int yield_switch(ferry_loop *loop, ferry_task *self)
{
    self->state = FERRY_TASK_READY;
    ferry__list_push_back(&loop->runq, &self->run.link);
    if (__builtin_expect(!loop->in_run, 0))
        ferry__loop_kick(loop);
    ferry__switch_away(loop, self);
    return 0;
}

void ferry__fuzz_yield(ferry_task *self)
{
    ferry_loop *loop = self->loop;

    if ((uint32_t)ferry__rand_next(&loop->rng) < loop->fuzz_p)
        yield_switch(loop, self);
}

int ferry_yield(void)
{
    ferry_task *self = ferry__self();
    ferry_loop *loop;
    int rc;

    if (__builtin_expect(!self, 0))
        return -EPERM;
    if (__builtin_expect(self->cancelled || self->scope, 0)) {
        rc = ferry__check(self);
        if (rc)
            return rc;
    }
    loop = self->loop;
    if (loop->turn && ferry__list_empty_linked(loop->turn) &&
        ferry__list_empty_linked(&loop->runq) && loop->since_poll < loop->hand_limit &&
        !loop->one_turn) {
        /* Nothing else is ready: the next turn would hold only this task,
         * so it begins here and the task goes on, as the scheduler or
         * ferry__switch_away() would do after queueing it, under the same
         * conditions (no detector timing steps, no stop, no poll due). */
        ferry__canary_check(loop, self);
        loop->stats.turns++;
        loop->stats.steps++;
        loop->stats.handoffs++;
        loop->since_poll++;
        return 0;
    }
    return yield_switch(loop, self);
}
