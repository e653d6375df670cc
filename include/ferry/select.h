/* ferry/select.h - wait on several things at once and do exactly one.
 *
 * ferry_select() takes an array of cases (an fd or a stream readable or
 * writable, an event set, a queue get or put, a channel receive or send,
 * a task's end, a future done, a signal subscription, a time) and
 * performs exactly one of
 * them: the one that
 * became possible first, or, when several are possible at once, one drawn
 * at random from the loop's generator (FERRY_SELECT_PRIORITY: the first
 * listed).  The cases that were not performed had no effect: no element
 * was taken from or put into a queue, no task was joined, no signal was
 * received.  An error return (-ECANCELED, -ETIMEDOUT, ...) performed no
 * case at all.
 *
 * Performing a case means what the matching call would do: a queue get
 * copies an element into `buf` (ferry_queue_get()), a put copies one from
 * `buf`, a channel receive stores the item in *(void **)buf and a send
 * passes the item `buf` (ferry_chan_recv(), ferry_chan_send(); for a
 * channel of ferry_chan_new_elem(), `buf` points to the element or to room
 * for one, as for a queue), a join
 * ends the task's handle and reports its status
 * (ferry_task_join()), a signal case receives one delivery
 * (ferry_sigsub_recv()).  An fd, stream, event or future case only
 * reports: the descriptor is readable, the event is set, the future is done
 * (its status in `value`, as ferry_future_await() gives it: the way to
 * select on a task of another loop, spawned with ferry_runtime_spawn(),
 * ferry/runtime.h); nothing is consumed.
 *
 * A case whose object is NULL, or an fd case with a negative fd, or any
 * case with FERRY_CASE_OFF in its flags, is disabled: it is skipped, so a
 * loop can switch cases on and off without rebuilding the array (Go's nil
 * channel).  A select with every case disabled waits until it is cancelled
 * or a scope's deadline passes.
 *
 * A case on a shut-down queue, a closed stream or an ended subscription is
 * ready: it is performed with the error (-ESHUTDOWN, -EBADF) in its
 * `result`, as the matching call would return it, so the loop learns of it
 * and can disable the case.
 *
 * A channel's wake is a hint (ferry/bridge.h): a channel case that won but
 * finds nothing to take (another receiver, a thread, was quicker) does not
 * end the select, which tries every case again and goes on waiting.
 *
 * Everything here runs on the loop's thread, in a task.
 */
#ifndef FERRY_SELECT_H
#define FERRY_SELECT_H

#include <stddef.h>
#include <stdint.h>

#include "ferry/bridge.h"
#include "ferry/queue.h"
#include "ferry/signal.h"
#include "ferry/stream.h"
#include "ferry/sync.h"
#include "ferry/task.h"

/* What a case waits for. */
enum ferry_case_kind {
    FERRY_CASE_NONE = 0,   /* disabled */
    FERRY_CASE_FD,         /* `fd` ready for `events` (FERRY_READ, FERRY_WRITE) */
    FERRY_CASE_STREAM,     /* `obj` (ferry_stream) ready for `events`: bytes
                            * buffered or the end reached (FERRY_READ), room
                            * to write (FERRY_WRITE) */
    FERRY_CASE_EVENT,      /* `obj` (ferry_event) set */
    FERRY_CASE_QUEUE_GET,  /* an element of `obj` (ferry_queue) into `buf` */
    FERRY_CASE_QUEUE_PUT,  /* the element at `buf` into `obj` (ferry_queue) */
    FERRY_CASE_JOIN,       /* `obj` (ferry_task) ended; joined */
    FERRY_CASE_SIGNAL,     /* a delivery of `obj` (ferry_sigsub) received */
    FERRY_CASE_DEADLINE,   /* `at` (ferry_now() clock) has come */
    FERRY_CASE_CHAN_RECV,  /* an item of `obj` (ferry_chan) into *(void **)buf */
    FERRY_CASE_CHAN_SEND,  /* the item `buf` into `obj` (ferry_chan) */
    FERRY_CASE_FUTURE,     /* `obj` (ferry_future) done: its status in
                            * `value`, as ferry_future_await() reports it */
};

/* Case flag: skip this case. */
#define FERRY_CASE_OFF 1u

/* ferry_select() flag: try the cases in listed order instead of a random
 * one, so the first ready case listed is the one performed. */
#define FERRY_SELECT_PRIORITY 1u
/* ferry_select() flag: do not wait; -EAGAIN if no case is ready. */
#define FERRY_SELECT_TRY 2u

/* The most cases one select takes (their waiters live on the task's
 * stack). */
#define FERRY_SELECT_MAX 32

typedef struct ferry_case {
    int       kind;    /* enum ferry_case_kind */
    unsigned  flags;   /* FERRY_CASE_OFF */
    void     *obj;     /* the stream, event, queue, task or subscription */
    void     *buf;     /* queue get: where the element goes; put: the element */
    int       fd;      /* FERRY_CASE_FD: the descriptor */
    int       events;  /* FERRY_CASE_FD, _STREAM: FERRY_READ or FERRY_WRITE */
    int64_t   at;      /* FERRY_CASE_DEADLINE: when it fires */
    int       result;  /* OUT, the performed case: 0, or its error
                        * (-ESHUTDOWN, -EBADF) as the matching call returns it */
    int       value;   /* OUT, the performed case: revents of an fd or
                        * stream case, a joined task's status, a signal
                        * number; 0 otherwise */
} ferry_case;

/* Cases, for array initialisers and assignments. */
#define FERRY_CASE_FD_INIT(fd_, events_) \
    ((ferry_case){ .kind = FERRY_CASE_FD, .fd = (fd_), .events = (events_) })
#define FERRY_CASE_STREAM_INIT(s, events_) \
    ((ferry_case){ .kind = FERRY_CASE_STREAM, .obj = (s), .events = (events_) })
#define FERRY_CASE_EVENT_INIT(ev) \
    ((ferry_case){ .kind = FERRY_CASE_EVENT, .obj = (ev) })
#define FERRY_CASE_GET_INIT(q, out) \
    ((ferry_case){ .kind = FERRY_CASE_QUEUE_GET, .obj = (q), .buf = (out) })
#define FERRY_CASE_PUT_INIT(q, item) \
    ((ferry_case){ .kind = FERRY_CASE_QUEUE_PUT, .obj = (q), .buf = (void *)(item) })
#define FERRY_CASE_JOIN_INIT(t) \
    ((ferry_case){ .kind = FERRY_CASE_JOIN, .obj = (t) })
#define FERRY_CASE_SIGNAL_INIT(sub) \
    ((ferry_case){ .kind = FERRY_CASE_SIGNAL, .obj = (sub) })
#define FERRY_CASE_DEADLINE_INIT(at_) \
    ((ferry_case){ .kind = FERRY_CASE_DEADLINE, .at = (at_) })
#define FERRY_CASE_RECV_INIT(ch, out) \
    ((ferry_case){ .kind = FERRY_CASE_CHAN_RECV, .obj = (ch), .buf = (out) })
#define FERRY_CASE_SEND_INIT(ch, item) \
    ((ferry_case){ .kind = FERRY_CASE_CHAN_SEND, .obj = (ch), .buf = (item) })
#define FERRY_CASE_FUTURE_INIT(fut) \
    ((ferry_case){ .kind = FERRY_CASE_FUTURE, .obj = (fut) })

/*
 * Wait until one of the `n` cases can be performed, perform it, and return
 * its index.  The cases that were not performed had no effect.  When
 * several are ready, the one performed is drawn at random (uniformly among
 * the ready ones), or is the first listed with FERRY_SELECT_PRIORITY.
 * Only the performed case's `result` and `value` are written.
 * Thread: loop, in a task.   Suspends: yes (not with FERRY_SELECT_TRY;
 * every call is a cancellation point).
 * Returns: the index of the performed case (its `result` says how it went);
 *          -ECANCELED, -ETIMEDOUT (a scope's deadline)   no case performed;
 *          -EAGAIN     FERRY_SELECT_TRY and no case ready;
 *          -EINVAL     cases NULL with n > 0, n > FERRY_SELECT_MAX, an
 *                      unknown kind or flag, a queue case or a channel
 *                      receive without `buf`,
 *                      an fd or stream case without events, a join of a
 *                      task that has no handle; no case performed;
 *          -EDEADLK    a join of the calling task;
 *          -ENOMEM     a case could not be registered (an fd's event, a
 *                      channel's node, a stream's buffer); nothing performed;
 *          -EPERM      not in a task of the loop, or an object of another loop.
 */
int ferry_select(ferry_case *cases, size_t n, unsigned flags);

#endif /* FERRY_SELECT_H */
