/* inbox_int.h - the inbox's structure, shared by its two files: inbox.c
 * (posting, from any thread) and inbox_loop.c (the loop's side: making it,
 * draining it, spinning, closing).
 *
 * Any thread posts a callback (or a completion node, which cannot fail);
 * the loop runs them.  Posts go into an array under a mutex (no node, no
 * allocation per post: the array grows in amortised steps and is reused by
 * double buffering), completions into an intrusive list.  The loop is woken
 * through an eventfd (a pipe where there is none) that is written only when
 * the loop is not already awake:
 *
 *   `woken` (under mu) means "a drain of the queue is guaranteed to come":
 *   an eventfd write is on its way, a drain step is scheduled, or a drain
 *   is running and will look at the queue again under mu before it ends.
 *   A poster sets it and writes the eventfd only if it was clear, once it
 *   has released mu: the loop it wakes would otherwise find mu held and
 *   sleep on it at once (a futex wait, and a wakeup of the poster when it
 *   unlocks).  The
 *   drain clears it only under mu, after finding the queue empty.  The
 *   eventfd is read at the start of the event callback, before the queue is
 *   looked at, so a write that lands while the loop drains stays readable
 *   and only costs an extra, empty drain (docs/testing.md).
 *
 * The loop drains in steps of at most FERRY__DRAIN_BATCH items.  The first
 * step runs directly in the eventfd's callback (no timer, no allocation per
 * wakeup: a completion wakes its task in the same poll).  Whatever is left
 * over runs in further steps, each a zero-delay ferry_call_later()
 * callback, so I/O and timers are polled between steps: a flood of posts
 * cannot starve them.  The blocked-loop detector times the loop's own
 * steps; the items of a direct drain run outside them, so drain() times
 * each of those itself and reports it as the loop does.
 *
 * Staying awake a little, when the loop has nothing else to run (no ready
 * task, no timer due, not stopping), so that busy posters need no wakeup:
 *   - gather(): a small batch from a poster on another CPU: wait about a
 *     microsecond before taking the next one (fewer lock and buffer
 *     handovers, which cost the poster cache misses);
 *   - yield_to_waker(): the queue is empty and the thread that last had to
 *     wake us runs on our CPU: give it the CPU once, then look again;
 *   - ferry__inbox_spin() (the pools' hand-over, to_thread.c, when a
 *     spinning worker took a task's job): poll for the completion instead of sleeping in epoll;
 *     `spinning` (under mu) tells posters to leave the drain to it rather
 *     than write the eventfd.
 * The first two keep `woken` set and look at the queue again under mu
 * before clearing it; the third decides under mu too, so in every case a
 * post either finds a drain that will see it or writes the eventfd.
 *
 * Under schedule fuzzing (a loop on its own base), nothing that threads
 * sent runs when the eventfd fires: the loop calls
 * ferry__inbox_fuzz_deliver() after every poll.  While tasks wait for
 * work they handed to threads (pool jobs, room in a pool's queue, a call
 * to another loop: the `held` wakes), that poll waits, for a bounded
 * while, until all of that work has come back; a wake that comes is
 * parked instead of granted.  Then the poll grants the parked wakes in
 * the order of their tasks' numbers, each now or at a later poll as drawn
 * from the seed.  Which task gets its completion at which poll then
 * depends on the seed, not on how fast the threads were (docs/fuzzing.md,
 * "What replays").  Posts and other completions run at the poll that
 * finds them.
 *
 * Closing (ferry_loop_free): refuse posts, then run every accepted post and
 * wait for every reserved completion (jobs submitted to run their callback
 * on this loop), then free the events.  The inbox memory and the eventfd
 * live until the last reference goes (the loop's, and ferry_inbox_get's).
 *
 * Lock order: see bridge_int.h; the inbox takes ferry_inbox.mu only and
 * never calls out while holding it.
 */
#ifndef FERRY_INBOX_INT_H
#define FERRY_INBOX_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include <event2/event.h>

#include "bridge_int.h"
#include "wakefd.h"

/* Items run per drain step before I/O and timers get a turn. */
#define FERRY__DRAIN_BATCH 1024

struct post {
    ferry_cb cb; /* callback */
    void *arg;   /* its argument */
};

struct ferry_inbox {
    pthread_mutex_t mu;                      /* guards the fields marked "mu" */
    pthread_cond_t idle;                     /* close() waits here for reserved completions */
    struct post *q;                          /* mu: posts not yet taken by the loop, FIFO */
    size_t qlen;                             /* mu */
    size_t qcap;                             /* mu */
    struct ferry__cnode *chead;              /* mu: completions not yet taken, FIFO */
    struct ferry__cnode **ctail;             /* mu */
    size_t reserved;                         /* mu: completions promised by jobs in flight */
    bool woken;                              /* mu: a drain is guaranteed to come (see top) */
    bool closed;                             /* mu: posts are refused */
    bool ev_gone;                            /* mu: ev was freed: no event_active() any more */
    bool closer_waits;                       /* mu: close() sleeps on `idle` */
    bool stop_queued;                        /* mu: stop_node is in the completion list */
    bool spinning;                           /* mu: the loop waits in ferry__inbox_spin() */
    bool spin_kicked;                        /* mu: a poster found it waiting: the drain is owed */
    bool fuzz_waits;                         /* mu: the loop waits on `idle` for threads' work
                                      * (ferry__inbox_fuzz_deliver()) */
    atomic_bool kick;                        /* spin_kicked, published: set by posters (under mu),
                                      * cleared (under mu) and polled by the loop */
    atomic_int waker_cpu;                    /* CPU of the last thread that wrote the eventfd:
                                      * set by posters, read by the loop (a hint) */
    uint64_t posts;                          /* mu: accepted posts and completions */
    uint64_t wakeups;                        /* mu: eventfd writes */
    uint64_t write_errors;                   /* mu: failed eventfd writes */
    uint64_t drains;                         /* mu: batches taken by the loop */
    uint64_t run;                            /* mu: items run (added once per step) */
    size_t max_batch;                        /* mu: most items run in one step */
    struct ferry__cnode stop_node;           /* posted by ferry_loop_stop_threadsafe() */
    atomic_uint refs;                        /* the loop's (dropped by close) + ferry_inbox_get's */
    struct ferry__wakefd fd;                 /* eventfd or pipe, -1 if none (attached base); wfd
                                      * written by a poster that set `woken` under mu,
                                      * after releasing mu, on a reference of its own;
                                      * closed by the last ref */
    const void *owner;                       /* identity of the loop's thread; set once */
    ferry_loop *loop;                        /* set once; dereferenced on the loop thread only */
    const volatile unsigned char *fork_mark; /* the loop's (loop_port.h), or NULL; set
                                      * once, read under mu while not closed */

    /* loop thread only */
    struct event *ev;           /* EV_READ|EV_PERSIST on fd.rfd */
    ferry_timer *step;          /* the scheduled drain step, or NULL */
    struct post *lq;            /* posts taken from q, being run */
    size_t lhead;               /* next to run in lq */
    size_t llen;                /* items in lq */
    size_t lcap;                /* capacity of lq */
    struct ferry__cnode *lc;    /* completions taken, being run */
    struct ferry__link closers; /* struct ferry__closer, run by close() */
    bool draining;              /* inside drain() */
    bool closing;               /* close() has begun */
    /* Schedule fuzzing of a loop polling its own base: what threads send
     * comes in only at ferry__inbox_fuzz_deliver(), after a poll.  Set
     * once when the inbox is made. */
    bool fuzz;
    /* A wait for the work of `held` ran out of time: the next polls let
     * in what has come without waiting, until `held` is 0 again. */
    bool fuzz_late;
    size_t held;                 /* task wakes for threads' work being waited for
                                      * and not granted (task_wake.c), counted under
                                      * fuzzing only */
    struct ferry__cnode *parked; /* of those, the ones that came, by task number,
                                      * linked through their cn.next */
    size_t nparked;              /* wakes in `parked` */

    /* Room for the per-loop state of other parts of the bridge (the
     * pools' list of jobs to hand over), sized by ferry__inbox_new()'s
     * caller; all-zero at first.  Loop thread only. */
    max_align_t ext[];
};

/* Its address identifies the calling thread (inbox.c). */
extern _Thread_local char ferry__inbox_token;

static inline bool ferry__inbox_on_loop_thread(const struct ferry_inbox *ib)
{
    return ib->owner == &ferry__inbox_token;
}

/* Requires mu.  True once posts are refused: the loop has closed, or this
 * is a forked child, whose copy of the loop never runs and whose eventfd
 * is the parent's (docs/fork.md).  While the inbox is not closed the loop
 * exists, and so does the page of its fork mark. */
static inline bool ferry__inbox_refused_locked(const struct ferry_inbox *ib)
{
    return ib->closed || ferry__fork_mark_copied(ib->fork_mark);
}

#endif /* FERRY_INBOX_INT_H */
