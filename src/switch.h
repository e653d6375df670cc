/* switch.h - every switch between the scheduler and a task, and from one
 * task straight to the next, with the annotations that keep ASan (fiber
 * switches), TSan (fibers) and valgrind (registered stacks) accurate.
 * Loop thread only.
 *
 * There are three kinds of switch: scheduler -> task, task -> scheduler
 * and task -> task (the hand-over, ferry__switch_away()).  Before each,
 * ASan is told the stack and TSan the fiber it goes to; where it lands,
 * ASan is told the switch has arrived.  The same switches run in every
 * build.  They are inlined into their few callers: after a switch
 * the CPU's return-stack predictor holds the other side's return
 * addresses, so every `ret` between two switches mispredicts, and fewer
 * call levels around the switch make a yield markedly cheaper.
 */
#ifndef FERRY_SWITCH_H
#define FERRY_SWITCH_H

#include <stdint.h>
#include <stdlib.h>

#include "loop_int.h"
#include "sanitize.h"

/*
 * First thing a task does after a switch lands on its stack, whether the
 * scheduler or another task switched to it.  ASan reports the bounds of
 * the stack the switch came from; they are the scheduler's only when the
 * scheduler asked for them (ferry__switch_to_task() clears sched_lo), so
 * that a hand-over from another task never passes that task's stack off
 * as the scheduler's.
 */
static inline void ferry__switch_arrived(ferry_loop *loop, ferry_task *t)
{
#ifdef FERRY_ASAN_ON
    if (!loop->sched_lo)
        __sanitizer_finish_switch_fiber(t->asan_fake, &loop->sched_lo, &loop->sched_size);
    else
        __sanitizer_finish_switch_fiber(t->asan_fake, NULL, NULL);
#else
    (void)loop;
    (void)t;
#endif
}

/*
 * The scheduler switches to task `t`.  It need not run on the same stack
 * and fiber every time (a loop run from a task of another loop, later from
 * its thread's own stack): its TSan fiber is taken here, and the task
 * records its stack bounds for ASan when it lands.
 */
static inline void ferry__switch_to_task(ferry_loop *loop, ferry_task *t)
{
#ifdef FERRY_TSAN_ON
    loop->sched_fiber = __tsan_get_current_fiber();
    __tsan_switch_to_fiber(t->tsan_fiber, 0);
#endif
#ifdef FERRY_ASAN_ON
    loop->sched_lo = NULL;
    __sanitizer_start_switch_fiber(&loop->sched_fake, t->lo,
                                   (size_t)((char *)t->hi - (char *)t->lo));
#endif
    ferry__tls_task = t;
    ferry__ctx_switch(&loop->sched_ctx, &t->ctx);
    ferry__tls_task = NULL; /* the scheduler is back */
#ifdef FERRY_ASAN_ON
    __sanitizer_finish_switch_fiber(loop->sched_fake, NULL, NULL);
#endif
}

/*
 * The scheduler runs task `t` (started) until the CPU comes back to it.
 * Tasks may hand over to each other meanwhile: the last one to run is the
 * one that came back, and its stack is given back here if it ended (it
 * could not give it back while it ran on it).
 */
static inline __attribute__((always_inline)) void ferry__task_run(ferry_loop *loop, ferry_task *t)
{
    t->state = FERRY_TASK_RUNNING;
    loop->current = t;
    ferry__switch_to_task(loop, t);
    t = loop->current;
    loop->current = NULL;
    if (t->state == FERRY_TASK_DONE)
        ferry__task_release(t);
}

void ferry__canary_dead(ferry_task *t) __attribute__((noreturn, cold));

/* A task leaving the CPU: if its stack has no guard page, its canary must
 * be intact.  Only loops that ever handed out such a stack look at the
 * task's stack header (which is not in the cache line a switch reads). */
static inline void ferry__canary_check(const ferry_loop *loop, ferry_task *t)
{
    if (__builtin_expect(loop->canaries, 0) && t->stk.guard == FERRY__GUARD_NONE &&
        *(uint64_t *)t->lo != FERRY__CANARY)
        ferry__canary_dead(t);
}

static inline void ferry__switch_to_sched(ferry_loop *loop, ferry_task *t, bool exiting)
{
    ferry__canary_check(loop, t);
#ifdef FERRY_TSAN_ON
    __tsan_switch_to_fiber(loop->sched_fiber, 0);
#endif
#ifdef FERRY_ASAN_ON
    __sanitizer_start_switch_fiber(exiting ? NULL : &t->asan_fake, loop->sched_lo,
                                   loop->sched_size);
#else
    (void)exiting;
#endif
    ferry__ctx_switch(&t->ctx, &loop->sched_ctx);
    ferry__switch_arrived(loop, t);
}

/* Below this many live tasks their stacks stay in the L1 cache between
 * two runs, and ferry__prefetch_run() would only cost instructions (a
 * yield between two tasks is slower with it). */
#define FERRY__PREFETCH_MIN_TASKS 64

/*
 * Ask the cache for the top of the saved stack of the runnable at `l` (in
 * a list ending at `end`), if it is a task: the switch to it pops its
 * registers from there and returns through the frames just above, lines
 * last touched a whole turn ago.  Called one task ahead, so the lines
 * arrive while the task before it runs.
 */
static inline void ferry__prefetch_run(const ferry_loop *loop, const struct ferry__link *l,
                                       const struct ferry__link *end)
{
#if !defined(FERRY_CTX_UCONTEXT)
    if (loop->live >= FERRY__PREFETCH_MIN_TASKS && l != end) {
        const struct ferry__runnable *r = ferry__container_of(l, struct ferry__runnable, link);

        if (r->kind == FERRY__RUN_TASK) {
            const char *sp = ferry__container_of(r, ferry_task, run)->ctx.sp;

            __builtin_prefetch(sp, 0);
            __builtin_prefetch(sp + 64, 0);
            __builtin_prefetch(sp + 128, 0);
        }
    }
#else
    (void)loop;
    (void)l;
    (void)end;
#endif
}

/*
 * The task that a task leaving the CPU may hand it to: the next one of the
 * current turn, if it has started (a new task starts through the
 * scheduler).  When the turn is over and no poll is due, the next turn
 * begins here, as the scheduler would begin it; within a turn the
 * hand-over goes on however many steps it has run, as the scheduler polls
 * only between turns.  NULL: go back to the scheduler (no turn running, a
 * stop requested, the blocked-loop detector timing every step, or nothing
 * to hand to).
 */
static inline __attribute__((always_inline)) ferry_task *ferry__turn_next(ferry_loop *loop)
{
    struct ferry__link *turn = loop->turn, *l;
    struct ferry__runnable *r;

    if (!turn || !loop->hand_limit)
        return NULL;
    if (ferry__list_empty_linked(turn) && !ferry__list_empty_linked(&loop->runq) &&
        !loop->one_turn && loop->since_poll < loop->hand_limit) {
        ferry__list_move(turn, &loop->runq);
        loop->stats.turns++;
    }
    l = turn->next;
    if (l == turn)
        return NULL;
    r = ferry__container_of(l, struct ferry__runnable, link);
    if (r->kind != FERRY__RUN_TASK || !ferry__container_of(r, ferry_task, run)->started)
        return NULL;
    return ferry__container_of(r, ferry_task, run);
}

/*
 * Hand the CPU from `self` straight to `next`, the first of the turn
 * (ferry__turn_next()), counting the step as the scheduler would.  Under
 * ASan and TSan it is annotated as a switch from this task's fiber to the
 * next task's, as the scheduler's switches are.
 */
static inline __attribute__((always_inline)) void
ferry__switch_hand_over(ferry_loop *loop, ferry_task *self, ferry_task *next)
{
    ferry__canary_check(loop, self);
    ferry__list_remove(&next->run.link);
    ferry__prefetch_run(loop, loop->turn->next, loop->turn);
    loop->stats.steps++;
    loop->stats.handoffs++;
    loop->since_poll++;
    next->state = FERRY_TASK_RUNNING;
    loop->current = next;
    ferry__tls_task = next;
    if (next == self)
        return;
#ifdef FERRY_TSAN_ON
    __tsan_switch_to_fiber(next->tsan_fiber, 0);
#endif
#ifdef FERRY_ASAN_ON
    __sanitizer_start_switch_fiber(&self->asan_fake, next->lo,
                                   (size_t)((char *)next->hi - (char *)next->lo));
#endif
    ferry__ctx_switch(&self->ctx, &next->ctx);
    ferry__switch_arrived(loop, self);
}

/*
 * Leave the running task `self` (already queued or waiting): hand the CPU
 * straight to the next task of the current turn if there is one, else back
 * to the scheduler.  A direct task-to-task switch halves the cost of a
 * yield.
 */
static inline void ferry__switch_away(ferry_loop *loop, ferry_task *self)
{
    ferry_task *next = ferry__turn_next(loop);

    if (next)
        ferry__switch_hand_over(loop, self, next);
    else
        ferry__switch_to_sched(loop, self, false);
}

#endif /* FERRY_SWITCH_H */
