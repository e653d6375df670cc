/* cancel.c - cancellation, deadlines, shields and task groups, the way
 * Trio and asyncio.TaskGroup have them.
 *
 *   - Cancellation is level-triggered: once a task is cancelled, every
 *     suspension point returns -ECANCELED until the task ends, so a task
 *     cannot swallow it by accident.
 *   - A shielded scope lets cleanup that must wait (flush, say goodbye)
 *     finish; the cancellation is delivered after the scope.
 *   - Deadline scopes nest (asyncio.timeout(), wait_for); the one that
 *     fired is the one whose ferry_scope_exit() returns -ETIMEDOUT.
 *   - A group's first failure cancels the siblings and is what the group's
 *     wait returns; no child outlives the group.
 */
#include <stdio.h>

#include "examples.h"

static int first_rc, second_rc, cleanup_rc, after_cleanup_rc;
static double cleanup_ms;

static int stubborn(void *arg)
{
    first_rc = ferry_sleep(FERRY_SEC(10));      /* cancelled here */
    second_rc = ferry_sleep(FERRY_SEC(10));     /* ignores it: cancelled again at once */

    ferry_scope shield;                         /* cleanup that needs to wait */
    int64_t t0 = ferry_now();
    ferry_scope_enter(&shield, FERRY_NEVER, FERRY_SCOPE_SHIELD);
    cleanup_rc = ferry_sleep(FERRY_MSEC(20));
    ferry_scope_exit(&shield);
    cleanup_ms = ms_since(t0);
    after_cleanup_rc = ferry_yield();           /* outside the shield again */
    return after_cleanup_rc;
}

static int child(void *arg)
{
    int ms = (int)(intptr_t)arg;
    int rc = ferry_sleep(FERRY_MSEC(ms));
    if (rc)
        return rc;                              /* cancelled by the group */
    return ms == 20 ? -EIO : 0;                 /* the 20 ms child fails */
}

static int main_task(void *arg)
{
    int bad = 0;

    /* Level-triggered cancellation and a shield. */
    ferry_task *t;
    int status;
    ferry_task_spawn(&t, NULL, stubborn, NULL, &(ferry_task_opts){ .name = "stubborn" });
    ferry_sleep(FERRY_MSEC(10));
    int64_t t0 = ferry_now();
    ferry_task_cancel(t);
    ferry_task_join(t, &status);
    printf("  cancelled task: sleep -> %s, sleep again -> %s, shielded 20 ms cleanup -> %s "
           "(%.0f ms), next suspension point -> %s, joined after %.0f ms\n",
           errname(first_rc), errname(second_rc), errname(cleanup_rc), cleanup_ms,
           errname(after_cleanup_rc), ms_since(t0));
    bad |= first_rc != -ECANCELED || second_rc != -ECANCELED || cleanup_rc != 0 ||
           after_cleanup_rc != -ECANCELED || status != -ECANCELED;

    /* Nested deadlines: the inner one fires first, then the outer one. */
    ferry_scope outer, inner;
    t0 = ferry_now();
    ferry_scope_enter(&outer, ferry_now() + FERRY_MSEC(80), 0);
    ferry_scope_enter(&inner, ferry_now() + FERRY_MSEC(30), 0);
    int rc_in = ferry_sleep(FERRY_SEC(10));
    int inner_exit = ferry_scope_exit(&inner);
    double t_in = ms_since(t0);
    bool outer_early = ferry_scope_fired(&outer);
    int rc_out = ferry_sleep(FERRY_SEC(10));
    int outer_exit = ferry_scope_exit(&outer);
    printf("  nested deadlines 30 ms in 80 ms: sleep -> %s at %.0f ms, inner exit -> %s "
           "(outer fired: %s), sleep -> %s at %.0f ms, outer exit -> %s\n", errname(rc_in), t_in,
           errname(inner_exit), outer_early ? "yes" : "no", errname(rc_out), ms_since(t0), errname(outer_exit));
    bad |= rc_in != -ETIMEDOUT || inner_exit != -ETIMEDOUT || rc_out != -ETIMEDOUT ||
           outer_exit != -ETIMEDOUT || t_in >= 80 || outer_early;

    /* A group: the failure of one child cancels the others. */
    ferry_group group;
    t0 = ferry_now();
    ferry_group_init(&group);
    ferry_group_spawn(&group, child, (void *)(intptr_t)20, NULL);
    ferry_group_spawn(&group, child, (void *)(intptr_t)1000, NULL);
    ferry_group_spawn(&group, child, (void *)(intptr_t)2000, NULL);
    int grc = ferry_group_wait(&group);
    double gms = ms_since(t0);
    printf("  group of 3 (20 ms fails, 1 s, 2 s): wait -> %s after %.0f ms, "
           "the two sleepers cancelled\n", errname(grc), gms);
    bad |= grc != -EIO || gms > 500;
    return bad;
}

int ex_cancel(void)
{
    return ferry_run(main_task, NULL) == 0 ? 0 : 1;
}

#ifndef FERRY_DEMO
int main(void)
{
    return ex_cancel();
}
#endif
