/* bridge_int.h - what the files of bridge/ share, and what wire/ calls in
 * bridge/: the loop's inbox seen from inside, completions that cannot
 * fail, cross-thread wakes of a waiting task, the pools' hooks.
 *
 * bridge/ sees the loop only through port/loop_port.h and the public
 * headers; what any thread may use comes from base/.
 *
 * Lock order (outermost first), for every file of bridge/:
 *   ferry_pool.mu  ->  ferry_chan.mu  ->  ferry_inbox.mu
 *   ferry_future.mu is a leaf.
 * A file takes only locks further right than the ones it holds.
 */
#ifndef FERRY_BRIDGE_INT_H
#define FERRY_BRIDGE_INT_H

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/bridge.h"

#include "alloc.h"
#include "clock.h"
#include "env.h"
#include "list.h"
#include "log.h"
#include "loop_port.h"
#include "thread.h"

struct event_base;

/* ---- the inbox, for wire/ ---------------------------------------------- */

/*
 * Make the inbox of a new loop on `base` (`own_base`: the loop made the
 * base, so the inbox watches an eventfd; an application's base is woken
 * through event_active() instead, see inbox_loop.c), with `ext_size`
 * bytes of room for other parts of the bridge (ferry__inbox_ext()).
 * Thread: loop.
 * Returns: 0 and *out; -ENOMEM; -EMFILE, -ENFILE (no descriptor for the
 * eventfd).
 */
int ferry__inbox_new(struct ferry_inbox **out /* OUT */, ferry_loop *loop, struct event_base *base,
                     bool own_base, size_t ext_size);

/* The loop's hooks (port/loop_port.h) that the inbox implements; `ctx`
 * is the inbox. */
bool ferry__inbox_pending(void *ctx);
/* The loop's fuzz_deliver hook (loop_port.h; inbox_int.h has the rule). */
void ferry__inbox_fuzz_deliver(void *ctx);
struct ferry__task_wake;
/* Loop thread, schedule fuzzing (inbox_int.h): a held task wake starts
 * waiting (counted, if the loop is fuzzed); its wake came (true: parked
 * until a poll lets it in; false: grant it now); its wait ended (no
 * longer counted or parked). */
void ferry__inbox_held_begin(struct ferry__task_wake *x);
bool ferry__inbox_held_park(struct ferry__task_wake *x);
void ferry__inbox_held_end(struct ferry__task_wake *x);
void ferry__inbox_close(void *ctx);

/* The room for other parts of the bridge, ext_size bytes, all-zero at
 * first, aligned for any type.  Thread: loop. */
void *ferry__inbox_ext(struct ferry_inbox *ib);

/* ---- the inbox, for the bridge ------------------------------------------ */

/* The loop's inbox (no reference taken), or NULL if it has none.
 * Thread: any, while the loop is not freed. */
struct ferry_inbox *ferry__inbox_of(ferry_loop *loop);

/* The loop an inbox belongs to.  Thread: any; the pointer is only
 * compared, or used on the loop thread. */
ferry_loop *ferry__inbox_loop(const struct ferry_inbox *ib);

/* True on the inbox's loop thread.  Thread: any. */
bool ferry__inbox_on_loop(const struct ferry_inbox *ib);

/* ---- completions ------------------------------------------------------ */

/*
 * A completion node: fn(node) runs on the inbox's loop thread.  It lives
 * inside whatever it completes (a job on a task's stack, a waiter), so
 * posting it allocates nothing and cannot fail.
 */
struct ferry__cnode {
    struct ferry__cnode *next;             /* guarded by ferry_inbox.mu, then loop thread */
    void (*fn)(struct ferry__cnode *node); /* set by the poster */
};

/*
 * Post a completion.  Never fails and ignores "closed": the caller holds a
 * reservation (ferry__inbox_reserve) or a task on that loop is waiting for
 * this node, which keeps the loop from closing.  After it returns the
 * caller must not touch the inbox: the loop may have closed.  The eventfd
 * write that wakes the loop comes after the inbox's lock is released, on a
 * reference of its own.
 * Thread: any.
 */
void ferry__inbox_complete(struct ferry_inbox *ib, struct ferry__cnode *n);

/*
 * Reserve one completion: the loop's FERRY_RUN_DEFAULT keeps running and
 * ferry_loop_free() waits until the matching ferry__inbox_complete_reserved
 * (or ferry__inbox_unreserve) happened.
 * Thread: any.  Returns: 0; -ESHUTDOWN (closing).
 */
int ferry__inbox_reserve(struct ferry_inbox *ib);
void ferry__inbox_unreserve(struct ferry_inbox *ib);
void ferry__inbox_complete_reserved(struct ferry_inbox *ib, struct ferry__cnode *n);

/* Post that may fail (the public call_soon_threadsafe path). */
int ferry__inbox_post(struct ferry_inbox *ib, ferry_cb cb, void *arg);

/*
 * Post a completion node that nothing keeps the loop open for (a call's
 * request to another loop): as ferry__inbox_complete(), allocation-free,
 * but refused once the inbox is closed.
 * Thread: any.  Returns: 0 (n->fn will run on the loop); -ESHUTDOWN
 * (closed, or a forked child: nothing queued).
 */
int ferry__inbox_post_node(struct ferry_inbox *ib, struct ferry__cnode *n);

/*
 * The loop learned that another thread is about to post it a completion
 * with ferry__inbox_complete() (a call's cancel node, bridge/call.c), also
 * if the loop is closing: its close waits for that node as for a
 * reservation, until the node's handler calls ferry__inbox_unreserve().
 * Thread: the inbox's loop.
 */
void ferry__inbox_expect(struct ferry_inbox *ib);

/* Take one more reference on an inbox the caller holds one on, unless it
 * is closed.  Thread: any.  Returns: 0; -ESHUTDOWN (closed: none taken). */
int ferry__inbox_ref(struct ferry_inbox *ib);

/* True while ferry_loop_free() is in the close step (loop thread). */
bool ferry__inbox_closing(const struct ferry_inbox *ib);

/* ---- what must end when the loop closes ------------------------------- */

/*
 * Something of the bridge that waits for the loop to do its part (a
 * future whose task was spawned and has not started): if it is still on
 * the list when ferry_loop_free() closes the inbox, after every task has
 * ended, fn(c) runs then to end it.  Lives in the object it ends.
 * Loop thread only.
 */
struct ferry__closer {
    struct ferry__link link;             /* in the inbox's list while added */
    void (*fn)(struct ferry__closer *c); /* set by the owner before adding */
};

void ferry__inbox_closer_add(struct ferry_inbox *ib, struct ferry__closer *c);
/* Take `c` off its inbox's list (it ended the ordinary way). */
void ferry__inbox_closer_del(struct ferry__closer *c);

/* ---- cross-thread wakes of one waiting task --------------------------- */

/*
 * A task waits on `w`; another thread (or a task of the same loop) fires
 * the wake once.  From another thread the wake travels as a completion
 * through the task's inbox, so the node must stay alive until it has been
 * delivered: a task that stops waiting (cancelled) after its wake was
 * fired calls ferry__task_wake_settle() before leaving.
 * Lives on the waiting task's stack.
 */
struct ferry__task_wake {
    struct ferry__cnode cn; /* posted when fired from another thread */
    struct ferry__waiter w; /* loop thread */
    struct ferry_inbox *ib; /* inbox of the waiting task's loop */
    int result;             /* written by the firer before delivery */
    bool delivered;         /* loop thread: the wake reached the task */
    /* Set by the caller after init: the wake comes from work a thread does
     * for the task, and waiting for it holds a virtual clock
     * (ferry__wait_held()).  Init clears it. */
    bool hold;
    bool counted; /* loop thread: in its inbox's `held` count */
    bool parked;  /* loop thread: came, and waits for a poll to let
                                     * it in (fuzzing; inbox_int.h), linked through
                                     * cn.next, which the delivery no longer uses */
};

/* Loop, in a task.  Returns: 0; -EPERM (not in a task, or no inbox). */
int ferry__task_wake_init(struct ferry__task_wake *x, const char *what, const void *obj);
/* The same for the task `self` (the caller checked that it runs it). */
int ferry__task_wake_init_self(struct ferry__task_wake *x, struct ferry_task *self,
                               const char *what, const void *obj);
/* Re-arm for another wait (same task). */
void ferry__task_wake_rearm(struct ferry__task_wake *x);
/* Any thread, once per arm: deliver `result` to the waiting task. */
void ferry__task_wake_fire(struct ferry__task_wake *x, int result);
/* ferry__task_wake_fire() known to run on the task's loop thread. */
void ferry__task_wake_deliver(struct ferry__task_wake *x, int result);
/* Loop, in the task: wait for the wake.  Returns its result, or
 * -ECANCELED / -ETIMEDOUT (check x->delivered and the owner's state). */
int ferry__task_wake_wait(struct ferry__task_wake *x);
/* Loop, in the task: the wake was fired; wait, shielded, until it has been
 * delivered, so the node may go away. */
void ferry__task_wake_settle(struct ferry__task_wake *x);

/* ---- the loop waiting briefly for a completion ------------------------ */

/* True if the loop has nothing to run before it would poll: no ready task
 * or callback, no timer due within `horizon` ns, not stopping or closing.
 * Thread: loop. */
bool ferry__inbox_loop_idle(const struct ferry_inbox *ib, int64_t horizon);

enum { FERRY__SPIN_KICKED = 1, FERRY__SPIN_TIMEOUT, FERRY__SPIN_GAVE_UP };

/*
 * Loop thread, inside a step, when ferry__inbox_loop_idle(): instead of
 * going to sleep in epoll, poll for up to `budget` ns for a completion or
 * post to arrive.  Meanwhile posters make no eventfd write: one that finds
 * the loop waiting here leaves the drain to it (decided under the inbox
 * lock, so none is lost when the wait ends at the same moment).
 * give_up(arg, waited) is asked every few polls whether to stop early.
 * Returns FERRY__SPIN_KICKED (something arrived and was drained here),
 * FERRY__SPIN_TIMEOUT or FERRY__SPIN_GAVE_UP (nothing drained).
 */
int ferry__inbox_spin(struct ferry_inbox *ib, int64_t budget,
                      bool (*give_up)(void *arg, int64_t waited), void *arg);

/* ---- tasks' pool jobs, handed over once per turn ---------------------- */

/* The room a loop's list of jobs to hand over (to_thread.c) takes in the
 * loop's inbox: wire/ makes every inbox with that much extension room. */
extern const size_t ferry__to_thread_room;

/* The loop's flush hook (port/loop_port.h; `ctx` is the inbox): hand the
 * jobs on the loop's list to their pools now (to_thread.c), without
 * waiting for the flush callback: ferry_loop_run() is about to return, and
 * an application driving the loop one pass at a time may not make the next
 * pass before these jobs are done.  Thread: loop, not in a task. */
void ferry__pool_handover(void *ctx);

/* ---- pool threads calling into loops ---------------------------------- */

/* Around a blocking wait of a thread for a task on a loop (run_task_sync,
 * the future of a spawned task): if the thread is a pool thread, the pool
 * counts it as blocked, so that offloading into a pool all of whose
 * threads wait on such tasks gives -EDEADLK instead of hanging.  A wait
 * for a plain callback is not counted: it cannot wait on a pool.
 * Thread: any. */
void ferry__pool_block_enter(void);
void ferry__pool_block_exit(void);

/* ---- getaddrinfo(3) on a pool (bridge/getaddrinfo.c) ------------------------ */

/* The channel's cases of ferry_select() (chan.c), for the loop's hooks. */
extern const struct ferry__sel_ext ferry__chan_sel_ext;

/* The future's cases of ferry_select() (future.c), for the loop's hooks. */
extern const struct ferry__sel_ext ferry__future_sel_ext;

/* The loop's getaddrinfo hook (loop_port.h): loop thread, in a task.  The
 * strings and hints are copied; an abandoned job's late answer is freed on
 * the pool thread. */
int ferry__gai_on_pool(ferry_pool *pool, const char *host, const char *service,
                       const struct addrinfo *hints, struct addrinfo **res /* OUT */);

/* The blocking call the pool runs: getaddrinfo(3) unless a test replaced
 * it (the list it returns is freed with freeaddrinfo(3)).  NULL puts
 * getaddrinfo(3) back.  Thread: any, before the lookups it is meant for. */
typedef int (*ferry__gai_fn)(const char *host, const char *service, const struct addrinfo *hints,
                             struct addrinfo **res);
void ferry__gai_set_blocking(ferry__gai_fn fn);

#endif /* FERRY_BRIDGE_INT_H */
