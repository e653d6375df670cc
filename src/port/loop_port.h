/* loop_port.h - what the loop (src/) offers the layers above it: the one
 * header of src/ that bridge/ sees.
 *
 * bridge/ reaches a loop only through this header and the public ones:
 * a waiter to park a task on and the grant that wakes it, the checks a
 * task-side call starts with, the loop's idle test and its blocked-loop
 * report, the fork-copy test, and the per-loop state that wire/ hands the
 * loop in the hooks below.  Everything else of a loop (its structure, the
 * run queue, the timers) stays private to src/.  docs/design.md ("Layout")
 * has the picture.
 *
 * Loop thread only, except where a function says otherwise.
 */
#ifndef FERRY_LOOP_PORT_H
#define FERRY_LOOP_PORT_H

#include <stdbool.h>
#include <stdint.h>
#include <netdb.h>

#include "ferry/bridge.h"
#include "ferry/detail.h"
#include "ferry/loop.h"
#include "ferry/task.h"

/* ---- Waiting ------------------------------------------------------------ */

struct ferry__sel;

/* States of a waiter: the explicit state that closes the "granted but not
 * yet run" window of every primitive. */
enum ferry__wstate {
    FERRY__W_IDLE = 0,  /* not waiting */
    FERRY__W_WAITING,   /* linked in a waitq (or waiting on a timer/fd) */
    FERRY__W_GRANTED,   /* woken by a grant; `result` says what */
    FERRY__W_CANCELLED, /* woken by ferry_task_cancel() */
    FERRY__W_TIMEDOUT,  /* woken by its deadline */
};

/*
 * A waiting task's node.  It lives on the waiting task's stack for the
 * duration of one wait: waiting allocates nothing.
 */
struct ferry__waiter {
    struct ferry__link link; /* in a waitq while WAITING */
    struct ferry_task *task; /* the waiting task */
    struct ferry__sel *sel;  /* one case of a select (io/select.c), or
                                 * NULL: a grant then unlinks its siblings */
    int state;               /* enum ferry__wstate */
    int result;              /* set by the granter */
    uint64_t n;              /* primitive's own: weight, count */
    void *data;              /* primitive's own: item buffer */
    const char *what;        /* for the dump: "lock", "queue get" */
    const void *obj;         /* for the dump: the object waited on */
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

/* ferry__wait(NULL, w, FERRY_NEVER) for a task that waits for work a
 * thread does for it (a pool job, room in a pool's queue): while it waits,
 * the loop's virtual clock, if it has one, does not jump (sched.c). */
int ferry__wait_held(struct ferry__waiter *w);

/* Grant a WAITING waiter: unlink it, set `result`, make its task ready.
 * A case of a select decides the select: its siblings are unlinked before
 * this returns, so every waiter still linked in a queue can be granted.
 * Returns false (and does nothing) if it is not WAITING. */
bool ferry__grant(struct ferry__waiter *w, int result);

/*
 * ferry_task_spawn() of a detached task whose body runs even if the task
 * is cancelled before its first run (its first suspension point then
 * reports the cancellation): for a body that must answer someone waiting
 * for it on another loop (bridge/call.c), also while its loop ends.
 * Returns as ferry_task_spawn().
 */
int ferry__task_spawn_always(ferry_loop *loop, ferry_task_fn fn, void *arg,
                             const ferry_task_opts *opts);

/* The loop a task runs on. */
ferry_loop *ferry__task_loop(const struct ferry_task *task);

/* The task's spawn number on its loop (the dump's id): what orders tasks
 * when an order must not depend on timing. */
uint64_t ferry__task_number(const struct ferry_task *task);

/* The earliest deadline of the scopes reaching the task's current point
 * (up to the first shield), FERRY_NEVER if none. */
int64_t ferry__task_deadline(const struct ferry_task *t);

/* ---- The loop ------------------------------------------------------------- */

/*
 * A select's case on an object of a layer above (the mixed channel and the
 * future of bridge/), whose waiters are not in a wait queue of the loop.
 * `send` picks the side (a future has one: false); `buf` is the item to
 * send, or where a received one goes.  A future's case reports the
 * future's status in *result, which the select hands on as the case's
 * `value` (its `result` is 0).
 *   try:    1 performed (*result: 0, or the object's error such as
 *           -ESHUTDOWN), 0 not possible now;
 *   arm:    link a node for the task `self` whose waiter (*w, with its
 *           `sel` set to `sel`) the object's wake will grant on the loop's
 *           thread; *node is the node.  Returns 0; 1 ready meanwhile
 *           (nothing linked: try again); -ENOMEM, -EPERM (nothing linked);
 *   detach: after the wait, once per armed node, before any node's
 *           disarm: take it out, so that no wake reaches it any more, and
 *           make a wake that took it out already (received or still on
 *           its way) grant nothing.  Never suspends;
 *   disarm: then, once per armed node: wait for a wake still on its way
 *           (shielded: the node cannot be freed while the inbox holds
 *           it), pass a wake that did not win on to the next waiter, and
 *           free the node;
 *   done:   the case won (its wake is a hint): perform it (`perform`;
 *           returns 1 and *result, or 0 if there was nothing to do after
 *           all: try again), or pass the wake on (returns 0).
 */
struct ferry__sel_ext {
    int (*try_op)(void *obj, bool send, void *buf, int *result);
    int (*arm)(void *obj, bool send, struct ferry_task *self, struct ferry__sel *sel, void **node,
               struct ferry__waiter **w);
    void (*detach)(void *obj, bool send, void *node);
    void (*disarm)(void *obj, bool send, void *node);
    int (*done)(void *obj, bool send, void *buf, bool perform, int *result);
};

/*
 * What the loop needs from the layers above, filled in by wire/ when it
 * makes the loop (libevent's way: the lower layer declares the table, the
 * upper one fills it).  `ctx` is the bridge's per-loop state (the inbox).
 *   pending(ctx)   true while callbacks posted from threads await running:
 *                  FERRY_RUN_DEFAULT does not end then;
 *   flush(ctx)     ferry_loop_run() is about to return: hand what the last
 *                  turn left for other threads (jobs that tasks offloaded)
 *                  to them now, not in a later pass of the loop;
 *   close(ctx)     ferry_loop_free(): run every accepted post, refuse new
 *                  ones with -ESHUTDOWN, release the channel.  Called after
 *                  every task has ended, before the event_base is freed.
 *   getaddrinfo    getaddrinfo(3) on a thread of `pool` (NULL: the
 *                  default pool) for the calling task, abandoned if the
 *                  task is interrupted: the resolver's fallback where evdns
 *                  cannot answer (dns.c).  Returns as ferry_getaddrinfo().
 *   chan, future   the channel's and the future's cases of ferry_select();
 *   fuzz_deliver(ctx)  a loop under schedule fuzzing polled: let in what
 *                  threads sent, or hold it (ferry__loop_fuzz_hold()); the
 *                  loop calls it after every poll, whatever woke it, and
 *                  nowhere else lets threads' posts in (NULL: no such rule);
 * The loop clears the functions that take `ctx` once it has called
 * close(); `ctx` stays, so that a thread that still reaches the loop finds
 * the closed inbox.
 */
struct ferry__loop_hooks {
    void *ctx;
    bool (*pending)(void *ctx);
    void (*flush)(void *ctx);
    void (*close)(void *ctx);
    int (*getaddrinfo)(ferry_pool *pool, const char *host, const char *service,
                       const struct addrinfo *hints, struct addrinfo **res);
    const struct ferry__sel_ext *chan;   /* select's channel cases */
    const struct ferry__sel_ext *future; /* select's future cases */
    void (*fuzz_deliver)(void *ctx);
};

/* True if the loop runs under schedule fuzzing (docs/fuzzing.md).  Set
 * when the loop is made and never changed. */
bool ferry__loop_fuzzed(const ferry_loop *loop);

/* Under schedule fuzzing, at a poll while tasks wait for threads' work:
 * true if what threads sent stays out until a later poll, drawn from the
 * seed; false if the loop has nothing else to run (it must not sleep
 * with work held) or is stopping. */
bool ferry__loop_fuzz_hold(ferry_loop *loop);

/* The bridge's per-loop state (hooks.ctx), NULL if the loop has none.
 * Thread: any, once ferry_loop_new() has returned the loop. */
void *ferry__loop_bridge(const ferry_loop *loop);

/* True if the loop has nothing to run before it would poll: no ready task
 * or callback, none left in the running turn, no timer due within
 * `horizon` ns, no stop requested.  What the bridge asks before it keeps
 * the loop's thread busy waiting for a completion. */
bool ferry__loop_idle(const ferry_loop *loop, int64_t horizon);

/* True from the start of ferry_loop_free(): the loop cancels its tasks,
 * refuses new ones (-ESHUTDOWN) and closes. */
bool ferry__loop_closing(const ferry_loop *loop);

/* The blocked-loop detector's threshold in ns (0: off). */
int64_t ferry__loop_slow_threshold(const ferry_loop *loop);

/* The blocked-loop detector's report of a step that ran `dt` ns, more than
 * `threshold` (the threshold when the step began): counted in the loop's
 * statistics and logged, naming the task (`task_name`) or, with NULL, a
 * callback.  The loop reports its own steps so; the bridge reports work
 * that runs outside them (a drain straight from the inbox's event). */
void ferry__loop_report_slow(ferry_loop *loop, int64_t dt, int64_t threshold,
                             const char *task_name);

/* The loop's fork mark: a page of its own that reads 0 in a forked
 * child's copy of the loop (a post into it could never run; docs/fork.md),
 * or NULL if the kernel refused it (then a child is not detected).  Set
 * when the loop is made and valid until it is freed.  A thread that tests
 * it on every post keeps the pointer and tests it with
 * ferry__fork_mark_copied(): the loop's structure, which the loop's thread
 * writes on every step, stays out of the poster's path. */
const volatile unsigned char *ferry__loop_fork_mark(const ferry_loop *loop);

/* True in a forked child's copy of `loop` (NULL: false).  Thread: any,
 * while the loop is not freed. */
bool ferry__loop_is_fork_copy(const ferry_loop *loop);

/* True if `mark` (from ferry__loop_fork_mark()) says this process is a
 * forked child of the one that made the loop.  Thread: any. */
static inline bool ferry__fork_mark_copied(const volatile unsigned char *mark)
{
    return mark && *mark == 0;
}

#endif /* FERRY_LOOP_PORT_H */
