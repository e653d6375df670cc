/* runtime_int.h - the runtime's structure (ferry/runtime.h), shared by
 * bridge/call.c (the cross-loop call, futures of other loops, the loop's
 * place in its runtime) and wire/runtime.c (making the loops and their
 * threads, running, stopping).
 *
 * What each loop of a runtime keeps is a slot: the runtime's reference on
 * its inbox, through which calls and spawns reach it (valid until the
 * runtime is freed, so a call to a loop that has closed finds a closed
 * inbox, never a freed loop), its lanes to the other loops, its load
 * figure and its counters.  A loop finds its own slot in the extension
 * room of its inbox (struct ferry__loop_rt), so a call finds the caller's
 * lanes without a search and without a lock.
 */
#ifndef FERRY_RUNTIME_INT_H
#define FERRY_RUNTIME_INT_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "ferry/runtime.h"

#include "bridge_int.h"

/*
 * The calls in flight from one loop to one other loop: counted by the
 * calling loop's thread alone (no lock, no atomic), and its tasks wait
 * here for room once `call_cap` are in flight.
 */
struct ferry__rt_lane {
    unsigned inflight;           /* calls posted and not yet answered */
    struct ferry__waitq waiters; /* callers waiting for room, FIFO */
};

/*
 * One loop of a runtime.  Allocated on its own (and larger than a cache
 * line or two), so that the counters each loop's thread writes do not
 * share lines with another loop's.
 */
struct ferry__rt_slot {
    ferry_loop *loop;              /* set once, before ferry_runtime_new() returns */
    struct ferry_inbox *ib;        /* set once likewise: one reference, dropped by
                                      * ferry_runtime_free() after every loop ended */
    struct ferry__rt_lane *lanes;  /* one per loop of the runtime; this loop's
                                      * thread only */
    atomic_int_fast64_t load;      /* ferry_runtime_load(): any thread */
    struct ferry__cnode stop_node; /* wire/: posted once by ferry_runtime_free() to
                                      * make the loop's thread leave its run */
    /* This loop's thread only: ferry_runtime_stats. */
    uint64_t calls_out;
    uint64_t calls_in;
    uint64_t calls_inline;
    uint64_t call_waits;
    char pad[64]; /* keeps the next allocation's data off these lines */
};

/* The thread of a loop of a runtime (wire/). */
struct ferry__rt_thread {
    struct ferry_runtime *rt; /* its runtime */
    unsigned index;           /* the loop it makes and runs */
    pthread_t th;             /* set by pthread_create() */
};

struct ferry_runtime {
    /* Set once by ferry_runtime_new(), read by any thread. */
    unsigned n;                    /* loops */
    unsigned cap;                  /* call_cap */
    struct ferry__rt_slot **slots; /* n slots */

    /* ---- wire/ only (wire/runtime.c) ---- */
    struct ferry__rt_thread *threads; /* n: [i] runs loop i (i > 0; [0] unused) */
    unsigned started;                 /* threads created, loop 1 first */
    ferry_runtime_opts opts;          /* as given, loops resolved */
    cpu_set_t cpus;                   /* the affinity mask when made */
    cpu_set_t saved;                  /* loop 0's thread's mask, to give back */
    bool pinned;                      /* loop 0's thread was pinned */
    pthread_mutex_t mu;               /* guards `ready`, `failed` */
    pthread_cond_t cv;                /* the maker waits for the threads here */
    unsigned ready;                   /* mu: threads whose loop is made (or failed) */
    int failed;                       /* mu: the first error of a thread, or 0 */
    atomic_bool ending;               /* ferry_runtime_free() began: threads free
                                       * their loop once their run returns */
    atomic_bool stopped;              /* ferry_runtime_stop() was called */
    bool log_alive;                   /* set once before the end: name the tasks left */
    struct ferry__cnode stop_node;    /* posted once to loop 0 by ferry_runtime_stop() */
    /* loop 0's thread only */
    ferry_task *main; /* the main task of a running ferry_runtime_run() */
    bool in_run;      /* inside ferry_runtime_run() */
};

/*
 * A loop's place in its runtime, in its inbox's extension room: set by
 * the loop's thread before the runtime is handed out, all-zero for a loop
 * in no runtime.  Read by the loop's own thread (a call, a spawn, the
 * index) and, for ferry_runtime_index(), compared by any thread.
 */
struct ferry__loop_rt {
    struct ferry_runtime *rt; /* the runtime, or NULL */
    unsigned index;           /* the loop's index in it */
};

/* The extension room every inbox is made with (wire/loop.c): the pools'
 * part (to_thread.c) and the runtime's (struct ferry__loop_rt). */
size_t ferry__inbox_room(void);

/* `loop`'s place in its runtime (in its inbox's room); NULL if the loop
 * has no inbox.  Thread: the loop's, or any while it is set once and the
 * loop is not freed. */
struct ferry__loop_rt *ferry__loop_rt(ferry_loop *loop);

/* The runtime to use for `rt` (NULL: the calling thread's current loop's
 * runtime), or NULL.  Thread: any. */
struct ferry_runtime *ferry__rt_resolve(struct ferry_runtime *rt);

/* The spawn of ferry_runtime_spawn() and ferry_loop_spawn_threadsafe():
 * a future for fn(arg) as a task on the inbox's loop (future.c).
 * `on_loop_ok`: also from the loop's own thread (a task awaits the future
 * instead of blocking on it). */
int ferry__future_spawn(struct ferry_inbox *ib, ferry_task_fn fn, void *arg,
                        const ferry_task_opts *opts, bool on_loop_ok, ferry_future **out /* OUT */);

#endif /* FERRY_RUNTIME_INT_H */
