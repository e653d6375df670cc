/* ferry_int.h - what ferry's own files share: the allocator with its fault
 * hook, the wait queue every primitive waits through, and the hooks the
 * bridge needs into a loop.
 *
 * Loop thread only, except the allocator (any thread) and the fields of
 * struct ferry__bridge_hooks (set once by bridge/ on the loop thread).
 */
#ifndef FERRY_INT_H
#define FERRY_INT_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/loop.h"
#include "ferry/task.h"

#include "alloc.h"
#include "clock.h"
#include "list.h"
#include "log.h"
#include "loops.h"

/* ---- Wait queue ------------------------------------------------------- */

/* States of a waiter: the explicit state that closes the "granted but not
 * yet run" window of every primitive. */
enum ferry__wstate {
    FERRY__W_IDLE = 0,    /* not waiting */
    FERRY__W_WAITING,     /* linked in a waitq (or waiting on a timer/fd) */
    FERRY__W_GRANTED,     /* woken by a grant; `result` says what */
    FERRY__W_CANCELLED,   /* woken by ferry_task_cancel() */
    FERRY__W_TIMEDOUT,    /* woken by its deadline */
};

/*
 * A waiting task's node.  It lives on the waiting task's stack for the
 * duration of one wait: waiting allocates nothing.
 */
struct ferry__waiter {
    struct ferry__link  link;   /* in a waitq while WAITING */
    struct ferry_task  *task;   /* the waiting task */
    int                 state;  /* enum ferry__wstate */
    int                 result; /* set by the granter */
    uint64_t            n;      /* primitive's own: weight, count */
    void               *data;   /* primitive's own: item buffer */
    const char         *what;   /* for the dump: "lock", "queue get" */
    const void         *obj;    /* for the dump: the object waited on */
};

/* Initialise a waiter for the calling task `self`.  Inline: every wait
 * of every primitive starts here. */
static inline void ferry__waiter_init(struct ferry__waiter *w, struct ferry_task *self,
                                      const char *what, const void *obj)
{
    __builtin_memset(w, 0, sizeof *w);
    w->task = self;
    w->what = what;
    w->obj = obj;
}

/*
 * The calling task, checked: 0 and *self set when called from a task on its
 * loop's thread; -EPERM otherwise.
 */
int ferry__enter_task(struct ferry_task **self /* OUT */);

/*
 * Bind a primitive to the current loop at its first use: *bound NULL is set
 * to the current loop; a different loop, or no loop on this thread, gives
 * -EPERM.
 */
int ferry__bind(ferry_loop **bound);

/*
 * The cancellation point: 0, or -ECANCELED (task cancelled, not shielded)
 * or -ETIMEDOUT (an active deadline scope has passed; the scope is marked
 * fired).  Does not suspend.
 */
int ferry__check(struct ferry_task *self);

/*
 * Suspend `w->task` until the waiter is granted, the task is cancelled,
 * the task's deadline passes or `until` (FERRY_NEVER for none) passes.
 * With `q` not NULL the waiter is appended to `q` (FIFO).
 *
 * First checks ferry__check(): a task already cancelled gets -ECANCELED
 * without suspending.
 *
 * Returns:
 *   w->result   granted (state GRANTED) and not cancelled meanwhile;
 *   -ECANCELED  cancelled; state CANCELLED (never granted: nothing to undo)
 *               or GRANTED (granted, then cancelled before it ran: the
 *               caller must pass the grant on to the next waiter);
 *   -ETIMEDOUT  an enclosing deadline passed (state TIMEDOUT), never granted;
 *   1           `until` passed (state TIMEDOUT): a sleep ended.
 * On every return the waiter is unlinked from `q`.
 */
int ferry__wait(struct ferry__waitq *q, struct ferry__waiter *w, int64_t until);

/* Grant a WAITING waiter: unlink it, set `result`, make its task ready.
 * Returns false (and does nothing) if it is not WAITING. */
bool ferry__grant(struct ferry__waiter *w, int result);

static inline bool ferry__waitq_empty(const struct ferry__waitq *q)
{
    return ferry__list_empty(&q->head);
}

static inline struct ferry__waiter *ferry__waitq_first(const struct ferry__waitq *q)
{
    struct ferry__link *l = ferry__list_first(&q->head);
    return l ? ferry__container_of(l, struct ferry__waiter, link) : NULL;
}

/* Grant every waiter present now; returns how many. */
size_t ferry__waitq_grant_all(struct ferry__waitq *q, int result);

/* The loop a task runs on. */
ferry_loop *ferry__task_loop(const struct ferry_task *task);

/* What a loop still holds (ferry__loop_leftovers()). */
struct ferry__leftovers {
    size_t tasks;       /* tasks not yet ended */
    size_t callbacks;   /* callbacks and fired timers in the run queue */
    size_t timers;      /* timers armed: ferry_timer and the tasks' own */
    bool   posts;       /* posts from threads (or completions) not yet run */
};

/*
 * Count what `loop` still holds, for a test's teardown: a loop about to be
 * freed after a test that awaited everything it started holds nothing.
 * Thread: loop.  Suspends: no.  Returns: 0; -EPERM; -EINVAL.
 */
int ferry__loop_leftovers(ferry_loop *loop, struct ferry__leftovers *out /* OUT */);

/* ---- Hooks for bridge/ ------------------------------------------------ */

/*
 * Functions bridge/ registers on a loop (loop thread).  `ctx` is the
 * bridge's per-loop state.
 *   pending(ctx)   true while callbacks posted from threads await running:
 *                  FERRY_RUN_DEFAULT does not end then;
 *   flush(ctx)     ferry_loop_run() is about to return: hand what the last
 *                  turn left for other threads (jobs that tasks offloaded)
 *                  to them now, not in a later pass of the loop;
 *   close(ctx)     ferry_loop_free(): run every accepted post, refuse new
 *                  ones with -ESHUTDOWN, release the channel.  Called after
 *                  every task has ended, before the event_base is freed.
 */
struct ferry__bridge_hooks {
    void *ctx;
    bool (*pending)(void *ctx);
    void (*flush)(void *ctx);
    void (*close)(void *ctx);
};

/* Returns the loop's hooks slot (all NULL until the bridge sets it). */
struct ferry__bridge_hooks *ferry__loop_bridge(ferry_loop *loop);

/* True if the loop made its event_base; false if it is attached to an
 * application's base (whose dispatch must not be kept alive by bridge/'s
 * idle inbox event).  Set once at creation.  Thread: any. */
bool ferry__loop_owns_base(const ferry_loop *loop);

/* One-time process setup for threads (libevent's locking, the fork
 * handler below), done by bridge/ when the program starts, and before the
 * first loop makes its event_base.  Thread: any. */
void ferry__threads_init(void);

/* The event_base of a loop that owns it, with the lock that other
 * threads' wakeups need.  Thread: any.
 * Returns: 0 and *out; -ENOMEM (no base, or libevent could not give it
 * its lock or condition and went on without). */
int ferry__base_new(struct event_base **out /* OUT */);

/* Check an application's event_base before a loop attaches to it.
 * Thread: any.  Returns: 0; -EINVAL (the base has no lock: it was made
 * before ferry installed libevent's thread callbacks, or with
 * EVENT_BASE_FLAG_NOLOCK; wakeups from other threads would never reach
 * it). */
int ferry__base_check(struct event_base *base);

/* The child side of fork(), registered with pthread_atfork(): no task runs
 * in the child, so a task's code that goes on there gets -EPERM from every
 * suspension point (docs/fork.md).  Thread: the forking one. */
void ferry__fork_child(void);

/* Give a new loop its cross-thread inbox (eventfd, event, hooks above);
 * called by ferry_loop_new() on the loop thread once the event_base
 * exists.  Returns: 0; -ENOMEM; -EMFILE, -ENFILE (no descriptor for the
 * eventfd).  Implemented in bridge/inbox.c. */
int ferry__bridge_attach(ferry_loop *loop);

#endif /* FERRY_INT_H */
