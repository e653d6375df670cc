/* switch.c - every switch between the scheduler and a task, with the
 * annotations that keep ASan (fiber switches), TSan (fibers) and valgrind
 * (registered stacks) accurate.
 * Loop thread only.
 *
 * Switches always go scheduler -> task -> scheduler: a task never resumes
 * another task directly, so there are exactly two kinds of switch to
 * annotate.  Kept in its own file so that the returns_twice-like switch is
 * never inlined into task bodies (ASan loses stack redzones around it).
 */
#include "loop_only.h"

#include <stdint.h>
#include <stdlib.h>

#include "loop_int.h"
#include "sanitize.h"

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

__attribute__((noinline))
void ferry__switch_to_task(ferry_loop *loop, ferry_task *t)
{
#ifdef FERRY_TSAN_ON
    if (!loop->sched_fiber)
        loop->sched_fiber = __tsan_get_current_fiber();
    __tsan_switch_to_fiber(t->tsan_fiber, 0);
#endif
#ifdef FERRY_ASAN_ON
    __sanitizer_start_switch_fiber(&loop->sched_fake, t->lo,
                                   (size_t)((char *)t->hi - (char *)t->lo));
#endif
    ferry__ctx_switch(&loop->sched_ctx, &t->ctx);
#ifdef FERRY_ASAN_ON
    __sanitizer_finish_switch_fiber(loop->sched_fake, NULL, NULL);
#endif
}

__attribute__((noinline))
void ferry__switch_to_sched(ferry_loop *loop, ferry_task *t, bool exiting)
{
    if (t->stk.guard == FERRY__GUARD_NONE && *(uint64_t *)t->lo != FERRY__CANARY) {
        ferry__log(FERRY_LOG_ERROR, "stack overflow in task '%s' (canary overwritten)",
                   t->name);
        abort();
    }
#ifdef FERRY_TSAN_ON
    __tsan_switch_to_fiber(loop->sched_fiber, 0);
#endif
#ifdef FERRY_ASAN_ON
    __sanitizer_start_switch_fiber(exiting ? NULL : &t->asan_fake,
                                   loop->sched_lo, loop->sched_size);
#else
    (void)exiting;
#endif
    ferry__ctx_switch(&t->ctx, &loop->sched_ctx);
    ferry__switch_arrived(loop, t);
}

/* First thing a task does after a switch lands on its stack. */
void ferry__switch_arrived(ferry_loop *loop, ferry_task *t)
{
#ifdef FERRY_ASAN_ON
    __sanitizer_finish_switch_fiber(t->asan_fake, &loop->sched_lo, &loop->sched_size);
#else
    (void)loop; (void)t;
#endif
}
