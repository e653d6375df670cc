/* select_int.h - the select record, and what each primitive offers a
 * select: try a case without waiting, the queue a case's waiter goes in,
 * and, for a case that was granted, perform it or hand the grant back.
 * Loop thread only.
 */
#ifndef FERRY_SELECT_INT_H
#define FERRY_SELECT_INT_H

#include "ferry_int.h"
#include "ferry/queue.h"
#include "ferry/stream.h"

/*
 * One select in progress, on the selecting task's stack.  `master` is the
 * task's waiter (task->waiter), linked nowhere: cancellation and deadlines
 * wake it as they wake any waiter.  Each case's waiter points here through
 * its `sel`; the first of them granted is the winner.
 */
struct ferry__sel {
    struct ferry__waiter  master;  /* the task's waiter for the whole select */
    struct ferry__waiter **w;      /* the cases' waiters, one per case (on
                                    * this stack, or in a channel's node) */
    size_t                n;       /* cases */
    int                   winner;  /* index of the granted case, or -1 */
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

/*
 * Stream cases (stream.c).  `want` is FERRY_READ or FERRY_WRITE.
 *   poll:   the readiness now without waiting (FERRY_READ: bytes buffered,
 *           the end or an error reached, or read now into the buffer;
 *           FERRY_WRITE: no EAGAIN since the loop last said writable),
 *           0 not ready, -EBADF closed, -EPERM another loop's stream,
 *           -ENOMEM no buffer;
 *   arm:    link `w` for `want` and count the select as inside the stream
 *           (0, or -ENOMEM with nothing linked);
 *   disarm: after `w` was unlinked: stop waiting, and free the stream if
 *           it was closed meanwhile and nobody else is inside.
 */
int  ferry__stream_sel_poll(ferry_stream *s, struct ferry_task *self, int want);
int  ferry__stream_sel_arm(ferry_stream *s, struct ferry__waiter *w, int want);
void ferry__stream_sel_disarm(ferry_stream *s, struct ferry__waiter *w);

#endif /* FERRY_SELECT_INT_H */
