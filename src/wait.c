/* wait.c - the one wait queue, the cancellation point, and scopes.
 * Loop thread only.
 *
 * Every primitive waits through ferry__wait(): the waiter node lives on
 * the waiting task's stack, and cancellation and deadlines unlink it here,
 * in one place.  A waiter's explicit state (WAITING, GRANTED, CANCELLED,
 * TIMEDOUT) tells the primitive, after the wait, whether it holds a grant
 * that it must keep or pass on.
 */
#include "loop_only.h"

#include "wait_int.h"
#include "select_int.h"

/* The out-of-line entry checks, for bridge/; src/ uses the inline forms
 * in loop_int.h. */
int ferry__enter_task(ferry_task **self)
{
    return ferry__enter_task_inline(self);
}

int ferry__bind(ferry_loop **bound)
{
    return ferry__bind_inline(bound);
}

bool ferry__task_shielded(const ferry_task *t)
{
    const ferry_scope *s;

    for (s = t->scope; s; s = s->parent)
        if (s->shield)
            return true;
    return false;
}

int64_t ferry__task_deadline(const ferry_task *t)
{
    const ferry_scope *s;
    int64_t d = FERRY_NEVER;

    for (s = t->scope; s; s = s->parent) {
        if (s->deadline < d)
            d = s->deadline;
        if (s->shield)
            break;
    }
    return d;
}

/* ferry__check() of a task inside scopes: the slow path, kept out of line
 * so that the common case (no scope) costs a few instructions and no
 * register saves. */
__attribute__((noinline)) int ferry__check_scopes(ferry_task *t)
{
    ferry_scope *s;
    int64_t now = 0;
    int rc = 0;

    for (s = t->scope; s; s = s->parent) {
        if (s->deadline != FERRY_NEVER) {
            if (!now)
                now = ferry_now();
            if (now >= s->deadline) {
                s->fired = true;
                rc = -ETIMEDOUT;
            }
        }
        if (s->shield)
            return rc;
    }
    return t->cancelled ? -ECANCELED : rc;
}

int ferry__check(ferry_task *t)
{
    return ferry__check_inline(t);
}

void ferry__wait_timer_fire(struct ferry__hnode *n)
{
    ferry_task *t = ferry__container_of(n, ferry_task, timer);
    struct ferry__waiter *w = t->waiter;

    if (w && w->state == FERRY__W_WAITING) {
        if (ferry__link_linked(&w->link))
            ferry__list_remove(&w->link);
        w->state = FERRY__W_TIMEDOUT;
        ferry__task_ready(t);
    }
}

int ferry__wait(struct ferry__waitq *q, struct ferry__waiter *w, int64_t until)
{
    return ferry__wait_inline(q, w, until);
}

int ferry__wait_held(struct ferry__waiter *w)
{
    ferry_loop *loop = w->task->loop;
    int rc;

    loop->vholds++;
    rc = ferry__wait_inline(NULL, w, FERRY_NEVER);
    loop->vholds--;
    return rc;
}

bool ferry__grant(struct ferry__waiter *w, int result)
{
    if (w->state != FERRY__W_WAITING)
        return false;
    if (__builtin_expect(w->sel != NULL, 0))
        return ferry__sel_grant(w, result);
    if (ferry__link_linked(&w->link))
        ferry__list_remove(&w->link);
    w->state = FERRY__W_GRANTED;
    w->result = result;
    ferry__task_ready(w->task);
    return true;
}

size_t ferry__waitq_grant_all(struct ferry__waitq *q, int result)
{
    struct ferry__waiter *w;
    size_t n = 0;

    while ((w = ferry__waitq_first(q)) != NULL) {
        ferry__grant(w, result);
        n++;
    }
    return n;
}

/* ---- scopes ------------------------------------------------------------ */

int ferry_scope_enter(ferry_scope *s, int64_t deadline, unsigned flags)
{
    ferry_task *self;
    int rc;

    if (!s || (flags & ~(unsigned)FERRY_SCOPE_SHIELD))
        return -EINVAL;
    rc = ferry__enter_task_inline(&self);
    if (rc)
        return rc;
    s->parent = self->scope;
    s->task = self;
    s->deadline = deadline;
    s->shield = flags & FERRY_SCOPE_SHIELD;
    s->fired = false;
    self->scope = s;
    return 0;
}

int ferry_scope_exit(ferry_scope *s)
{
    ferry_task *self;
    int rc;

    if (!s)
        return -EINVAL;
    rc = ferry__enter_task_inline(&self);
    if (rc)
        return rc;
    if (self->scope != s)
        return -EINVAL;
    self->scope = s->parent;
    /* A cancel that a shield held back reaches a waiting task at its next
     * suspension point (level-triggered), so nothing to wake here. */
    return s->fired ? -ETIMEDOUT : 0;
}

bool ferry_scope_fired(const ferry_scope *s)
{
    return s && s->fired;
}

/* A grant of a select's case (select_int.h): the select record is the
 * waiters' business, whatever the case waits on. */
bool ferry__sel_grant(struct ferry__waiter *w, int result)
{
    struct ferry__sel *sel = w->sel;
    size_t i;

    if (ferry__link_linked(&w->link))
        ferry__list_remove(&w->link);
    w->state = FERRY__W_GRANTED;
    w->result = result;
    for (i = 0; i < sel->n; i++) {
        struct ferry__waiter *o = sel->w[i];

        if (o == w)
            sel->winner = (int)i;
        if (o == w || o->state != FERRY__W_WAITING)
            continue;
        /* A channel's node is in its channel's list, under its mutex:
         * only the waiter's state changes here, and the channel's wake
         * then finds it not WAITING (the disarm passes that wake on). */
        if (ferry__link_linked(&o->link))
            ferry__list_remove(&o->link);
        o->state = FERRY__W_IDLE;
    }
    if (sel->master.state == FERRY__W_WAITING) {
        sel->master.state = FERRY__W_GRANTED;
        sel->master.result = 0;
        ferry__task_ready(w->task);
    }
    return true;
}
