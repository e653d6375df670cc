/* inspect.c - looking into a loop: ferry_loop_dump() for people, and
 * what the loop still holds for a test's teardown.
 * Loop thread only.
 */
#include "loop_only.h"

#include <stdio.h>

#include "loop_int.h"
#include "loop_new.h"
#include "log.h"

static const char *const state_names[] = { "ready", "running", "waiting", "done" };

int ferry_loop_dump(ferry_loop *loop, FILE *out)
{
    struct ferry__link *l;
    int rc = ferry__loop_arg(&loop), n = 0;

    if (rc)
        return rc;
    if (!out)
        return -EINVAL;
    fprintf(out, "ferry: %zu live task(s)\n", loop->live);
    ferry__list_foreach(l, &loop->tasks) {
        ferry_task *t = ferry__container_of(l, ferry_task, all);
        fprintf(out, "  task #%llu '%s' %s", (unsigned long long)t->id, t->name,
                state_names[t->state]);
        if (t->state == FERRY_TASK_WAITING && t->waiter)
            fprintf(out, " on %s %p", t->waiter->what ? t->waiter->what : "?",
                    t->waiter->obj);
        if (t->timer.linked)
            fprintf(out, ", wakes in %.3f ms",
                    (double)(t->timer.key - ferry__loop_now(loop)) / 1e6);
        if (t->cancelled)
            fprintf(out, ", cancelled");
        if (t->group)
            fprintf(out, ", in group %p", (void *)t->group);
        fprintf(out, ", stack used %zu of %zu KiB\n", (ferry__stack_used(t) + 1023) / 1024,
                (size_t)((char *)t->hi - (char *)t->lo) / 1024);
        n++;
    }
    ferry__lock_dump_broken(loop, out);
    return n;
}


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

size_t ferry__loop_log_alive(ferry_loop *loop, const char *who)
{
    struct ferry__link *l;
    size_t n = 0;

    ferry__list_foreach(l, &loop->tasks) {
        ferry_task *t = ferry__container_of(l, ferry_task, all);

        if (t->state == FERRY_TASK_DONE)
            continue;
        ferry__log(FERRY_LOG_WARN, "%s: task #%llu '%s' (%s%s%s) still alive; cancelling it",
                   who, (unsigned long long)t->id, t->name, state_names[t->state],
                   t->state == FERRY_TASK_WAITING && t->waiter && t->waiter->what ? " on " : "",
                   t->state == FERRY_TASK_WAITING && t->waiter && t->waiter->what ?
                   t->waiter->what : "");
        n++;
    }
    return n;
}
