/* task_wake.c - waking one waiting task from any thread.
 *
 * The waiting task owns the node (on its stack).  A wake fired on the
 * task's own loop thread grants the waiter at once; from another thread it
 * travels as a completion through the loop's inbox, which cannot fail and
 * allocates nothing.  Because the node is in the inbox until the loop runs
 * it, a task that stops waiting after its wake was fired must settle (wait,
 * shielded, for the delivery) before its stack frame goes away: the
 * thread-pool job writing into a cancelled task's stack is the bug this
 * prevents (docs/testing.md).
 *
 * Loop thread, except ferry__task_wake_fire (any thread).
 */
#include "bridge_int.h"

/* A held wait, counted while it lasts (inbox_int.h). */
static int wait_held(struct ferry__task_wake *x)
{
    int rc;

    ferry__inbox_held_begin(x);
    rc = ferry__wait_held(&x->w);
    ferry__inbox_held_end(x);
    return rc;
}

static void deliver(struct ferry__cnode *n)
{
    struct ferry__task_wake *x = ferry__container_of(n, struct ferry__task_wake, cn);

    x->delivered = true;
    if (x->counted && ferry__inbox_held_park(x))
        return; /* granted by a later poll (fuzzing) */
    ferry__grant(&x->w, x->result);
}

int ferry__task_wake_init_self(struct ferry__task_wake *x, struct ferry_task *self,
                               const char *what, const void *obj)
{
    x->ib = ferry__inbox_of(ferry__task_loop(self));
    if (!x->ib)
        return -EPERM;
    ferry__waiter_init(&x->w, self, what, obj);
    x->cn.next = NULL;
    x->cn.fn = deliver;
    x->result = 0;
    x->delivered = false;
    x->hold = false;
    x->counted = false;
    x->parked = false;
    return 0;
}

int ferry__task_wake_init(struct ferry__task_wake *x, const char *what, const void *obj)
{
    struct ferry_task *self;
    int rc = ferry__enter_task(&self);

    if (rc)
        return rc;
    return ferry__task_wake_init_self(x, self, what, obj);
}

void ferry__task_wake_rearm(struct ferry__task_wake *x)
{
    ferry__waiter_init(&x->w, x->w.task, x->w.what, x->w.obj);
    x->result = 0;
    x->delivered = false;
}

void ferry__task_wake_deliver(struct ferry__task_wake *x, int result)
{
    x->result = result;
    deliver(&x->cn);
}

void ferry__task_wake_fire(struct ferry__task_wake *x, int result)
{
    x->result = result;
    if (ferry__inbox_on_loop(x->ib))
        deliver(&x->cn);
    else
        ferry__inbox_complete(x->ib, &x->cn);
}

int ferry__task_wake_wait(struct ferry__task_wake *x)
{
    if (x->delivered)
        return x->result; /* fired on this thread before we waited */
    return x->hold ? wait_held(x) : ferry__wait(NULL, &x->w, FERRY_NEVER);
}

void ferry__task_wake_settle(struct ferry__task_wake *x)
{
    ferry_scope sc;

    if (x->delivered)
        return;
    ferry_scope_enter(&sc, FERRY_NEVER, FERRY_SCOPE_SHIELD);
    while (!x->delivered) {
        ferry__waiter_init(&x->w, x->w.task, x->w.what, x->w.obj);
        if (x->hold)
            wait_held(x);
        else
            ferry__wait(NULL, &x->w, FERRY_NEVER);
    }
    ferry_scope_exit(&sc);
}
