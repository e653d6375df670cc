/* wait_int.h - the body of ferry__wait(), for the primitives whose
 * contended path is hot enough to inline it (a lock's acquire): without
 * the call, the waiting task's stack keeps one frame less in the cache
 * lines a switch back to it reads.  Same contract as ferry__wait() in
 * ferry_int.h, which is this function out of line.
 * Loop thread only.
 */
#ifndef FERRY_WAIT_INT_H
#define FERRY_WAIT_INT_H

#include "loop_int.h"
#include "switch.h"

/* The fire function of a waiting task's timer (wait.c). */
void ferry__wait_timer_fire(struct ferry__hnode *n);

static inline __attribute__((always_inline)) int
ferry__wait_inline(struct ferry__waitq *q, struct ferry__waiter *w, int64_t until)
{
    ferry_task *t = w->task;
    ferry_loop *loop = t->loop;
    int64_t wake;
    int rc = ferry__check_inline(t);

    if (rc)
        return rc;
    wake = t->scope ? ferry__task_deadline(t) : FERRY_NEVER;
    if (until < wake)
        wake = until;
    if (q)
        ferry__list_push_back(&q->head, &w->link);
    w->state = FERRY__W_WAITING;
    t->waiter = w;
    t->state = FERRY_TASK_WAITING;
    if (wake != FERRY_NEVER) {
        t->timer.fire = ferry__wait_timer_fire;
        ferry__heap_insert(&loop->timers, &t->timer, wake);
        ferry__loop_timers_changed(loop);
    }
    ferry__switch_away(loop, t);
    /* Only this function arms the task's timer: with no deadline the
     * timer's cache line is not touched at all. */
    if (wake != FERRY_NEVER && t->timer.linked)
        ferry__heap_remove(&loop->timers, &t->timer);
    t->waiter = NULL;
    if (ferry__link_linked(&w->link))
        ferry__list_remove(&w->link);
    switch (w->state) {
    case FERRY__W_GRANTED:
        if (t->cancelled && !ferry__task_shielded(t))
            return -ECANCELED; /* state stays GRANTED: pass it on */
        return w->result;
    case FERRY__W_CANCELLED:
        return -ECANCELED;
    default:
        w->state = FERRY__W_TIMEDOUT;
        if (until != FERRY_NEVER && ferry_now() >= until) {
            rc = ferry__check_inline(t);
            return rc ? rc : 1;
        }
        rc = ferry__check_inline(t);
        return rc ? rc : -ETIMEDOUT;
    }
}

#endif /* FERRY_WAIT_INT_H */
