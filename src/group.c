/* group.c - task groups: structured concurrency.
 * Loop thread only.
 *
 * A group waits for all its children; the first child that fails (status
 * not 0, and not the -ECANCELED of a child that was cancelled) cancels its
 * siblings and becomes the group's status.  ferry_group_wait() never
 * returns while a child lives, even when the waiting task is cancelled.
 */
#include "loop_only.h"

#include <string.h>

#include "loop_int.h"

int ferry_group_init(ferry_group *g)
{
    ferry_task *self;
    int rc;

    if (!g)
        return -EINVAL;
    rc = ferry__enter_task_inline(&self);
    if (rc)
        return rc;
    memset(g, 0, sizeof *g);
    g->owner = self;
    return 0;
}

static void cancel_children(ferry_group *g)
{
    struct ferry__link *l, *tmp;

    ferry__list_foreach_safe(l, tmp, &g->children)
        ferry_task_cancel(ferry__container_of(l, ferry_task, group_link));
}

int ferry_group_spawn_ex(ferry_group *g, ferry_task **out, ferry_task_fn fn, void *arg,
                         const ferry_task_opts *opts, unsigned flags)
{
    ferry_task *self, *t;
    int rc;

    if (out)
        *out = NULL;
    if (!g || !g->owner || (flags & ~FERRY_GROUP_ISOLATE))
        return -EINVAL;
    rc = ferry__enter_task_inline(&self);
    if (rc)
        return rc;
    if (self->loop != g->owner->loop)
        return -EPERM;
    if (g->closed || g->failing)
        return -ESHUTDOWN;
    /* The group holds a handle (it gives it back when the child ends); with
     * `out`, the caller holds one as well. */
    return ferry__task_spawn(out ? out : &t, self->loop, fn, arg, opts, g,
                             (flags & FERRY_GROUP_ISOLATE ? FERRY__GCHILD_ISOLATE : 0) |
                                 (out ? FERRY__GCHILD_HANDLE : 0));
}

int ferry_group_spawn(ferry_group *g, ferry_task_fn fn, void *arg, const ferry_task_opts *opts)
{
    return ferry_group_spawn_ex(g, NULL, fn, arg, opts, 0);
}

void ferry__group_child_done(ferry_task *t)
{
    ferry_group *g = t->group;
    bool failed = t->status != 0 && !(t->cancelled && t->status == -ECANCELED);

    ferry__list_remove(&t->group_link);
    t->group = NULL;
    g->live--;
    if (failed && (t->gflags & FERRY__GCHILD_ISOLATE)) {
        /* A server's connection: reported to the owner, siblings go on. */
        if (g->isolated_failures++ == 0)
            g->isolated_status = t->status;
    } else if (failed && !g->failing) {
        g->failing = true;
        g->status = t->status;
        cancel_children(g);
    }
    /* The group held a handle; the scheduler frees the stack unless the
     * spawner holds one too. */
    if (!(t->gflags & FERRY__GCHILD_HANDLE))
        t->handle = false;
    if (g->live == 0)
        ferry__waitq_grant_all(&g->waiters, 0);
}

size_t ferry_group_failures(const ferry_group *g, int *first)
{
    if (!g)
        return 0;
    if (first)
        *first = g->isolated_failures ? g->isolated_status : 0;
    return g->isolated_failures;
}

int ferry_group_wait(ferry_group *g)
{
    struct ferry__waiter w;
    ferry_scope shield;
    ferry_task *self;
    int rc, interrupted = 0;

    if (!g || !g->owner)
        return -EINVAL;
    rc = ferry__enter_task_inline(&self);
    if (rc)
        return rc;
    if (self != g->owner)
        return -EPERM;
    while (g->live) {
        ferry__waiter_init(&w, self, "group", g);
        rc = ferry__wait(&g->waiters, &w, FERRY_NEVER);
        if (rc < 0 && !interrupted) {
            /* Interrupted: cancel the children and keep waiting, shielded. */
            interrupted = rc;
            cancel_children(g);
            ferry_scope_enter(&shield, FERRY_NEVER, FERRY_SCOPE_SHIELD);
        }
    }
    if (interrupted)
        ferry_scope_exit(&shield);
    g->closed = true;
    return interrupted ? interrupted : g->status;
}

int ferry_group_cancel(ferry_group *g)
{
    int rc;

    if (!g || !g->owner)
        return -EINVAL;
    rc = ferry__loop_check(g->owner->loop);
    if (rc)
        return rc;
    cancel_children(g);
    return 0;
}
