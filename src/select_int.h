/* select_int.h - the select record, its grant (wait.c), and what the
 * queue offers a select: try a case without waiting, the queue a case's
 * waiter goes in, and, for a case that was granted, perform it or hand the
 * grant back.  ferry_select() itself is in the I/O layer (io/select.c),
 * which also has the stream cases (io/stream_int.h).
 * Loop thread only.
 */
#ifndef FERRY_SELECT_INT_H
#define FERRY_SELECT_INT_H

#include "ferry_int.h"
#include "ferry/queue.h"

/*
 * One select in progress, on the selecting task's stack.  `master` is the
 * task's waiter (task->waiter), linked nowhere: cancellation and deadlines
 * wake it as they wake any waiter.  Each case's waiter points here through
 * its `sel`; the first of them granted is the winner.
 */
struct ferry__sel {
    struct ferry__waiter master; /* the task's waiter for the whole select */
    struct ferry__waiter **w;    /* the cases' waiters, one per case (on
                                    * this stack, or in a channel's node) */
    size_t n;                    /* cases */
    int winner;                  /* index of the granted case, or -1 */
};

/* ferry__grant() of a case's waiter `w` (WAITING): grant it, unlink every
 * sibling, and wake the task unless cancellation or a deadline woke it
 * already (the select then hands the grant back).  Returns true.  Only
 * until the selecting task runs again: its first step takes every case
 * out, so no case waiter is WAITING once it may suspend again.  Cold and
 * out of line, so that ferry__grant() stays small enough to be inlined
 * into the primitives' release paths. */
__attribute__((cold, noinline)) bool ferry__sel_grant(struct ferry__waiter *w, int result);

/*
 * Queue cases (queue.c).  `put` picks the side.
 *   try:   1 performed (*result: 0, or -ESHUTDOWN for a shut-down queue),
 *          0 not possible now, or an error of the select (-EINVAL, -EPERM,
 *          -ENOMEM) with nothing done;
 *   waitq: the queue a waiting case goes in;
 *   done:  a case's waiter was granted: perform it (`perform`, returns the
 *          case's result) or hand its reservation back (returns 0).
 */
int ferry__queue_sel_try(ferry_queue *q, struct ferry_task *self, void *buf, bool put,
                         int *result /* OUT */);
struct ferry__waitq *ferry__queue_sel_waitq(ferry_queue *q, bool put);
int ferry__queue_sel_done(ferry_queue *q, struct ferry__waiter *w, void *buf, bool put,
                          bool perform);

#endif /* FERRY_SELECT_INT_H */
