/* leftovers.c - what a loop still holds: the question a test's teardown
 * asks before it frees the loop.
 * Loop thread only.
 */
#include "loop_only.h"

#include "loop_int.h"

int ferry__loop_leftovers(ferry_loop *loop, struct ferry__leftovers *out)
{
    struct ferry__link *l;
    int rc = ferry__loop_check(loop);

    if (rc)
        return rc;
    if (!out)
        return -EINVAL;
    out->tasks = loop->live;
    out->callbacks = 0;
    ferry__list_foreach(l, &loop->runq) {
        if (ferry__container_of(l, struct ferry__runnable, link)->kind != FERRY__RUN_TASK)
            out->callbacks++;
    }
    out->timers = loop->timers.count;
    out->posts = loop->hooks.pending && loop->hooks.pending(loop->hooks.ctx);
    return 0;
}
