/* loop_int.h - the loop and task structures, private to src/.
 * Loop thread only.
 */
#ifndef FERRY_LOOP_INT_H
#define FERRY_LOOP_INT_H

#include <stdbool.h>
#include <stdint.h>

#include <event2/event.h>
#include <event2/event_struct.h>

#include "ctx/ctx.h"
#include "ferry_int.h"

/* ---- Timer heap: an intrusive pairing heap keyed by (deadline, seq) ---- */

struct ferry__hnode {
    struct ferry__hnode *child;           /* first child */
    struct ferry__hnode *next;            /* next sibling */
    struct ferry__hnode *prev;            /* previous sibling, or parent if first */
    int64_t key;                          /* deadline, monotonic ns */
    uint64_t seq;                         /* insertion order: ties fire FIFO */
    void (*fire)(struct ferry__hnode *n); /* called when the deadline passes */
    bool linked;                          /* in the heap */
};

struct ferry__heap {
    struct ferry__hnode *root; /* earliest deadline */
    uint64_t seq;              /* next insertion number */
    size_t count;              /* nodes in the heap */
};

void ferry__heap_insert(struct ferry__heap *h, struct ferry__hnode *n, int64_t key);
void ferry__heap_remove(struct ferry__heap *h, struct ferry__hnode *n);
static inline struct ferry__hnode *ferry__heap_min(const struct ferry__heap *h)
{
    return h->root;
}

/* ---- Run queue entries ------------------------------------------------ */

/* FERRY__RUN_CB: a call_soon node; FERRY__RUN_TIMER: a fired ferry_timer. */
enum { FERRY__RUN_TASK = 1, FERRY__RUN_CB = 2, FERRY__RUN_TIMER = 3 };

/* What the run queue holds: a task, or a callback (struct ferry__cbnode).
 * Only the link and the kind, so that a task carries nothing it does not
 * use in the first cache lines of its structure. */
struct ferry__runnable {
    struct ferry__link link; /* in loop->runq while ready */
    int kind;                /* FERRY__RUN_* */
};

/* A callback in the run queue. */
struct ferry__cbnode {
    struct ferry__runnable run; /* kind FERRY__RUN_CB or FERRY__RUN_TIMER */
    ferry_cb cb;
    void *arg;
};

/* ---- Stacks ------------------------------------------------------------ */

enum { FERRY__GUARD_NONE = 0, FERRY__GUARD_MADV, FERRY__GUARD_MPROTECT };

/* Stacks of the loop's default size are cut from slabs of this many (one
 * mapping each, stack.c); other sizes get a mapping of their own. */
#define FERRY__SLAB_SLOTS 64

struct ferry__slab;

/*
 * The guard region at the bottom of every stack: FERRY__GUARD_SIZE bytes
 * that fault when touched.  A frame larger than the free stack left moves
 * the stack pointer past the bottom in one step, and without
 * -fstack-clash-protection its first write may land anywhere in the frame:
 * the region has to reach that far, or the write lands in the stack below
 * (the neighbouring slot of a slab) and corrupts it silently.  With
 * MADV_GUARD_INSTALL and with an mprotect'd region it costs no memory and
 * no extra mapping, only address space and the page tables that cover it.
 * A frame of up to 64 KiB is caught wherever it starts, a larger one if
 * the stack has room enough above the region.  A
 * multiple of the page size on every Linux ferry runs on (4, 16 or 64 KiB
 * pages).
 */
#define FERRY__GUARD_SIZE ((size_t)64 * 1024)

/* A task stack: [base, base + size), the guard region at the bottom, the
 * task structure at the top.  This header survives reuse from the cache. */
struct ferry__stack {
    size_t size;                  /* bytes, guard region included; starts at ferry__stack_base() */
    struct ferry__slab *slab;     /* the slab it is cut from, or NULL: a mapping of its own */
    struct ferry__link free_link; /* in loop->stack_free while cached */
    unsigned vg_id;               /* valgrind stack id */
    uint8_t guard;                /* FERRY__GUARD_* */
    uint8_t slot;                 /* index in the slab */
};

#define FERRY__CANARY        0x6665727279c0ffeeULL
#define FERRY__ALTSTACK_SIZE (64 * 1024)

/* ---- Task ----------------------------------------------------------- */

/* Field order: what every switch, yield, wait and lock handoff reads (the
 * run queue entry, the saved stack pointer, the loop, the state bytes, the
 * count of locks held, the current wait, the scope) fills the first cache
 * line (with the assembly switch on LP64), so that switching to a task
 * last run a turn ago misses the cache once for its structure.  The stack
 * header (read when a stack is taken or given back) comes later, and the
 * timer is read only by a wait that armed it. */
struct ferry_task {
    struct ferry__runnable run;    /* in the run queue while READY */
    ferry__ctx ctx;                /* saved registers while not running */
    ferry_loop *loop;              /* the loop it runs on */
    uint8_t state;                 /* enum ferry_task_state */
    bool started;                  /* fn has been entered */
    bool cancelled;                /* ferry_task_cancel() was called */
    bool handle;                   /* the spawner still holds a handle */
    unsigned locks;                /* ferry_locks it holds (see ferry__task_locks_died()) */
    struct ferry__waiter *waiter;  /* current wait, or NULL */
    ferry_scope *scope;            /* innermost scope, or NULL */
    int status;                    /* fn's return value once DONE */
    uint8_t gflags;                /* FERRY__GCHILD_*: how its group holds it;
                                       * FERRY__TASK_BODY_ALWAYS */
    struct ferry__stack stk;       /* survives reuse (see ferry__stack_task()) */
    ferry_task_fn fn;              /* body */
    void *arg;                     /* body's argument */
    struct ferry__hnode timer;     /* wakes a sleep or a deadline */
    struct ferry__waitq joiners;   /* tasks in ferry_task_join() */
    struct ferry__link all;        /* in loop->tasks while not DONE */
    ferry_group *group;            /* owning group, or NULL */
    struct ferry__link group_link; /* in group->children */
    void *lo;                      /* usable stack: [lo, hi) */
    void *hi;
    void *asan_fake;             /* ASan fake stack while switched out */
    void *tsan_fiber;            /* TSan fiber */
    uint64_t id;                 /* spawn number, for the dump */
    char name[32];               /* for diagnostics */
    struct ferry__local *locals; /* task-local values (local.c), or NULL */
};

/* ferry_task.gflags. */
#define FERRY__GCHILD_ISOLATE 0x1u /* FERRY_GROUP_ISOLATE: a failure is counted only */
#define FERRY__GCHILD_HANDLE  0x2u /* the spawner holds a handle as well as the group */
/* Not of a group: the body runs even if the task was cancelled before its
 * first run (ferry__task_spawn_always()). */
#define FERRY__TASK_BODY_ALWAYS 0x4u

/* Room of the task structure at the top of its stack: a whole number of
 * cache lines. */
#define FERRY__TASK_ROOM ((sizeof(ferry_task) + 63) & ~(size_t)63)

/*
 * Stack colouring.  Stack mappings are whole pages, so without it every
 * task's structure and the frames just below it (what every switch, wait
 * and completion touches) sit at the same offset within a page, and the
 * caches index their sets by that offset: the hot lines of all tasks
 * crowd into the few sets of one offset (in a 32 KiB 8-way L1, 8 tasks'
 * worth) while the other sets idle.  So the task structure of slot i of a
 * slab sits ferry__stack_color() bytes below the top of its mapping:
 * FERRY__STACK_COLORS offsets, one cache line apart, spread consecutive
 * slots over the sets.  The cost is at most 1,984 bytes of each stack,
 * only for mappings of FERRY__COLOR_MIN bytes or more (the default is),
 * and no memory: the colour stays within the top page the task structure
 * dirties anyway.  A stack with a mapping of its own (slot 0) is not
 * coloured.
 */
#define FERRY__STACK_COLORS 32
#define FERRY__COLOR_MIN    ((size_t)64 * 1024)

static inline size_t ferry__stack_color(size_t map_size, unsigned slot)
{
    return map_size >= FERRY__COLOR_MIN ? (size_t)(slot % FERRY__STACK_COLORS) * 64 : 0;
}

/* The task structure a stack's header lives in: FERRY__TASK_ROOM bytes
 * at the top of the stack, below its colour.  Its address is the top of
 * the usable stack. */
static inline ferry_task *ferry__stack_task(const struct ferry__stack *s)
{
    return (ferry_task *)(void *)((char *)s - offsetof(ferry_task, stk));
}

/* Start of a stack (its guard region).  Computed, not stored: the task
 * structure is what a spawn writes, field by field, so it stays as small
 * as it can. */
static inline char *ferry__stack_base(const struct ferry__stack *s)
{
    return (char *)ferry__stack_task(s) + FERRY__TASK_ROOM + ferry__stack_color(s->size, s->slot) -
           s->size;
}

/* The lowest usable byte of a stack, just above its guard region. */
static inline char *ferry__stack_lo(const struct ferry__stack *s)
{
    return ferry__stack_base(s) + FERRY__GUARD_SIZE;
}

/* ---- Loop ------------------------------------------------------------- */

/* A lock broken by a task that ended holding it, kept for
 * ferry_loop_dump() until the lock is destroyed. */
struct ferry__broken_lock {
    const void *lock;                         /* its address: printed, never read */
    uint64_t task_id;                         /* the task that broke it */
    char name[sizeof((ferry_task *)0)->name]; /* that task's name */
};

/* Broken locks a loop keeps for its dump: the most recent ones. */
#define FERRY__BROKEN_KEPT 16

/*
 * A loop, in parts, each owned by the file that uses it (its banner says
 * which); the parts are anonymous, so a field is named as if the struct
 * were flat (loop->runq).  The order is deliberate: the identity and the
 * scheduler part come first and fill the first two cache lines (on LP64)
 * with what every check, step, switch and hand-over reads, so that a
 * switch touches as few of the loop's lines as it can.
 */
struct ferry_loop {
    /* ---- who may use it (loop.c): read by every entry check ---- */
    struct {
        const void *owner; /* identity of the owning thread */
        /* A page of its own, madvise(MADV_WIPEONFORK), holding 1: a forked
         * child inherits the loop but reads 0 there, and every loop call of
         * the child returns -EPERM (docs/fork.md).  NULL if the kernel
         * refused (then a child is not detected). */
        const volatile unsigned char *fork_mark;
    };

    /* ---- the scheduler (sched.c, switch.h, task.c, spawn.c) ---- */
    struct {
        struct ferry__link runq;  /* of struct ferry__runnable */
        struct ferry__link *turn; /* the running turn's list, or NULL */
        ferry_task *current;      /* running task, or NULL */
        unsigned since_poll;      /* steps since the last poll */
        /* 0 while a task must not hand the CPU straight to the next one
         * (stop requested, or the blocked-loop detector timing each step),
         * else io_interval: a task may then begin the next turn itself
         * while since_poll is below it.  Kept by ferry__loop_hand_update(). */
        unsigned hand_limit;
        bool in_run;       /* inside ferry_loop_run() */
        bool in_turn;      /* running a turn */
        bool one_turn;     /* FERRY_RUN_ONCE: no new turn inside a handover */
        bool stop;         /* ferry_loop_stop() was called */
        bool closing;      /* ferry_loop_free() in progress */
        bool kick_pending; /* kick_ev is active */
        /* A stack without a guard was handed out (set by stack.c): from
         * then on every switch checks the canary of such a stack. */
        bool canaries;
        /* Schedule fuzzing is on (sched.c, task.c): every turn's order is
         * drawn from rng, and no task hands the CPU straight to another. */
        bool fuzz;
        ferry_loop_stats stats;   /* counters */
        size_t live;              /* live tasks */
        int64_t slow_ns;          /* blocked-loop threshold, 0 off */
        unsigned io_interval;     /* steps between polls */
        struct ferry__link tasks; /* live tasks */
        uint64_t next_id;         /* task numbering */
        struct event *kick_ev;    /* runs turns when driven by someone else's dispatch */
    };

    /* ---- the scheduler's own context, and what ASan and TSan know of it
     * (switch.h) ---- */
    struct {
        ferry__ctx sched_ctx; /* the scheduler's context */
        void *sched_fake;     /* ASan fake stack of the scheduler */
        const void *sched_lo; /* scheduler stack bounds for ASan */
        size_t sched_size;
        void *sched_fiber; /* TSan fiber of the scheduler */
    };

    /* ---- timers (timer.c) ---- */
    struct {
        struct ferry__heap timers; /* task timers and ferry_timer */
        struct event *tick_ev;     /* wakes a blocking poll for the earliest timer */
        int tfd;                   /* timerfd behind tick_ev (owned base), or -1 */
        int64_t tick_armed;        /* deadline tfd is set to, 0 if disarmed */
        /* The virtual clock (ferry_loop_opts.virtual_clock): its time,
         * which moves only by jumps (sched.c) and ferry_loop_advance(),
         * and the waits of tasks for work on other threads, which keep it
         * from jumping (ferry__wait_held()). */
        bool vclock;   /* the loop's time is vnow */
        int64_t vnow;  /* virtual time, ns */
        size_t vholds; /* tasks in ferry__wait_held() */
    };

    /* ---- stacks (stack.c) ---- */
    struct {
        size_t stack_size;              /* default task stack size (mapping) */
        size_t stack_cache;             /* free stacks kept */
        struct ferry__link stack_free;  /* free resident stacks of stack_size, most
                                          * recent first */
        size_t stack_nfree;             /* stacks in stack_free: above stack_cache
                                          * until trimmed */
        int64_t stack_over_since;       /* when stack_nfree went above
                                               * stack_cache, or 0 */
        struct ferry__link slabs;       /* every slab (struct ferry__slab) */
        struct ferry__link slabs_avail; /* slabs with a slot never used or given back */
        size_t slabs_empty;             /* slabs with no live stack */
        size_t mprotect_live;           /* live mprotect-guarded stacks */
        uint8_t guard_mode;             /* FERRY__GUARD_*: what worked last */
        bool guard_forced_none;         /* FERRY_STACK_GUARD=none */
    };

    /* ---- its base and its place among the layers (loop.c, loop_new.c).
     * Seldom written (made, referenced, freed): hooks.ctx is read by
     * every post from another thread, so this part stays away from the
     * fields the loop's thread writes on every step or timer change (the
     * scheduler, the timers), whose cache lines would otherwise move
     * between the two threads on every post. ---- */
    struct {
        struct event_base *base;             /* libevent base */
        bool own_base;                       /* made for it: freed with it */
        long refs;                           /* ferry_loop_ref() count */
        struct ferry__loop_hooks hooks;      /* set by wire/ (port/loop_port.h) */
        struct ferry__loop_entry live_entry; /* in the set of live loops (base/loops.c) */
    };

    /* ---- the stack-overflow reporter (overflow.c) ---- */
    struct {
        void *altstack;              /* memory for a sigaltstack, installed while
                                          * it is the thread's */
        struct ferry__link alt_link; /* in the thread's list of loops relying on its
                                          * sigaltstack */
    };

    /* ---- locks held and broken (sync.c) ---- */
    struct {
        struct ferry__link held_locks; /* ferry_locks owned by a task (lock->held) */
        /* Locks broken by tasks that ended holding them and not destroyed
         * since, oldest first; older ones are only counted. */
        struct ferry__broken_lock broken[FERRY__BROKEN_KEPT];
        unsigned nbroken;        /* entries in `broken` */
        uint64_t broken_dropped; /* broken locks pushed out of `broken` */
    };

    /* ---- the parts the I/O layer adds at their first use (loop.c) ---- */
    struct ferry__link parts; /* of struct ferry__loop_part, oldest first */
    /* Set by the I/O layer when it queues work that the kernel takes in
     * batches (the io_uring backend): called before every poll, to hand
     * over what the turn queued and take in what completed.  NULL: nothing
     * to do. */
    void (*io_prepoll)(ferry_loop *loop);

    /* ---- the loop's random choices (select.c, and fuzzing's in sched.c
     * and task.c) ---- */
    uint64_t rng; /* state of base/rand.h's generator,
                                          * seeded when the loop is made */
    struct {
        uint32_t fuzz_p; /* spurious suspension probability, of 2^32 */
        void **fuzz_buf; /* a turn's entries while they are shuffled */
        size_t fuzz_cap; /* entries fuzz_buf has room for */
        /* A second generator, seeded from the same seed, for the choice
         * of when what threads sent is let in (ferry__loop_fuzz_hold()):
         * kept apart so that the turns' shuffles do not depend on how
         * many such choices were made. */
        uint64_t deliver_rng;
    };
};

/* Recompute loop->hand_limit after stop, slow_ns or io_interval changed. */
static inline void ferry__loop_hand_update(ferry_loop *loop)
{
    loop->hand_limit = loop->stop || loop->slow_ns || loop->fuzz ? 0 : loop->io_interval;
}

/* The scheduler (sched.c). */
/* Outside ferry_loop_run(), someone else's dispatch runs the loop's
 * turns: make it run one (once, however often this is called before it
 * does).  Inside ferry_loop_run() it does nothing. */
void ferry__loop_kick(ferry_loop *loop);
/* The kick event; freeing it. */
int ferry__sched_init(ferry_loop *loop);
void ferry__sched_fini(ferry_loop *loop);
/* ferry_loop_free(): cancel every live task and run until all have ended;
 * then run the turns that the bridge's close made ready. */
void ferry__sched_end_tasks(ferry_loop *loop);
void ferry__sched_run_ready(ferry_loop *loop);

/* Make a task ready to run in the next turn.  Inline: every grant ends
 * here. */
static inline void ferry__task_ready(ferry_task *t)
{
    ferry_loop *loop = t->loop;

    t->state = FERRY_TASK_READY;
    ferry__list_insert_before(&loop->runq, &t->run.link); /* runq is linked from the start */
    if (__builtin_expect(!loop->in_run, 0))
        ferry__loop_kick(loop);
}
/* Schedule fuzzing: shuffle the entries of a turn's list `turn`,
 * callbacks keeping their order among themselves (sched.c). */
void ferry__fuzz_shuffle(ferry_loop *loop, struct ferry__link *turn);
/* Schedule fuzzing: with the loop's probability, queue the running task
 * `self` at the back of the run queue and switch away, as ferry_yield()
 * does but without its cancellation check (task.c). */
void ferry__fuzz_yield(ferry_task *self);
/* A suspension point of the API that may not suspend (a free lock, an
 * available element): under fuzzing it sometimes does, before anything is
 * taken, so that the caller's all-or-nothing rules still hold. */
static inline __attribute__((always_inline)) void ferry__fuzz_point(ferry_task *self)
{
    if (__builtin_expect(self->loop->fuzz, 0))
        ferry__fuzz_yield(self);
}
/* The body every task's context starts in (task.c). */
void ferry__task_entry(void *arg);
/* ferry_task_spawn(), and with `group` not NULL ferry_group_spawn(): the
 * task joins the group before it can run. */
int ferry__task_spawn(ferry_task **out, ferry_loop *loop, ferry_task_fn fn, void *arg,
                      const ferry_task_opts *opts, ferry_group *group, unsigned gflags);
/* Task-local values (local.c).  The copies a child inherits from `parent`
 * (keys with an inherit function), in *out: 0; -ENOMEM (nothing made). */
struct ferry__local;
int ferry__locals_inherit(const ferry_task *parent, struct ferry__local **out /* OUT */);
/* Destroy a list ferry__locals_inherit() made (a spawn that failed). */
void ferry__locals_free(struct ferry__local *list);
/* Set key's value in `list` (replacing an inherited one): a layer above
 * gives a new task a value of its own before it runs.
 * Returns: 0; -ENOMEM (the list unchanged). */
int ferry__locals_put(struct ferry__local **list, const ferry_task_key *key, void *value);
/* Task `t`'s value for `key`, or NULL: a layer above reads the values of
 * tasks other than the running one (to find the tasks that carry one). */
void *ferry__task_local_of(const ferry_task *t, const ferry_task_key *key);
/* ferry__task_spawn(), the new task starting with its value for `key`
 * set to `value` (over what it inherits).  Allocates before the task is
 * made: on an error nothing is. */
int ferry__task_spawn_with(ferry_task **out, ferry_loop *loop, ferry_task_fn fn, void *arg,
                           const ferry_task_opts *opts, const ferry_task_key *key, void *value);
/* A task ended: run the destructors of its values and free them. */
void ferry__locals_end(ferry_task *t);
/* Run a task until it suspends or ends (scheduler side). */
void ferry__task_resume(ferry_task *t);
/* True if cancellation of the task is blocked by a shield. */
bool ferry__task_shielded(const ferry_task *t);
/* Earliest deadline reaching the task's current point, FERRY_NEVER if none. */
int64_t ferry__task_deadline(const ferry_task *t);
/* Release a task's stack once it is DONE and its handle is given back. */
void ferry__task_release(ferry_task *t);

/* Stacks (stack.c). */
size_t ferry__page_size(void);
/* The mapping of a stack of `usable` bytes: whole pages and the guard
 * region. */
size_t ferry__stack_map_size(size_t usable);
/* A stack of `size` usable bytes (0: the loop's default). */
int ferry__stack_get(ferry_loop *loop, size_t size, struct ferry__stack **out);
void ferry__stack_put(ferry_loop *loop, struct ferry__stack *s);
/* Unmap every stack of the loop (ferry_loop_free()), and retry the
 * mappings of this thread that munmap() refused before. */
void ferry__stack_drain(ferry_loop *loop);
/* How deep task `t`'s stack has been used: bytes from the top of its usable
 * stack down to the lowest page that is resident, a whole number of pages
 * (ferry_loop_dump(), debuggers).  0 if mincore() fails. */
size_t ferry__stack_used(const ferry_task *t);
/* The loop polls (about to wait if `block`): give back the memory of the
 * free stacks above the cache if they have waited long enough. */
void ferry__stack_trim_due(ferry_loop *loop, bool block);
static inline void ferry__stack_poll(ferry_loop *loop, bool block)
{
    if (__builtin_expect(loop->stack_nfree > loop->stack_cache, 0))
        ferry__stack_trim_due(loop, block);
}
/* A fault at `addr` while task `t` ran with its stack pointer at `sp`
 * (NULL if unknown) is an overflow of its stack: `addr` is in the guard
 * region, or the stack pointer has left the stack downwards and the fault
 * is near it (a stack without a guard, or a frame that jumped the guard). */
bool ferry__stack_overflowed(const ferry_task *t, const void *addr, const void *sp);
/* The overflow reporter (overflow.c): the memory for an alternate signal
 * stack (-ENOMEM); installing the reporter for this thread; undoing it and
 * freeing the memory (also when it was never installed). */
int ferry__overflow_init(ferry_loop *loop);
void ferry__overflow_setup(ferry_loop *loop);
void ferry__overflow_teardown(ferry_loop *loop);

/* The loop current on this thread (running, or the last one made here);
 * the address of ferry__tls_token identifies the thread. */
extern __thread ferry_loop *ferry__tls_loop __attribute__((tls_model("initial-exec")));
extern __thread char ferry__tls_token __attribute__((tls_model("initial-exec")));
/* The task running on this thread, or NULL (scheduler, callbacks, other
 * threads).  Set by every switch into a task (switch.h), cleared when the
 * scheduler is back and around nested loop runs, and cleared in a forked
 * child (ferry__fork_child(), registered with pthread_atfork by wire/):
 * the primitives' entry check is one thread-local load. */
extern __thread ferry_task *ferry__tls_task __attribute__((tls_model("initial-exec")));

static inline ferry_loop *ferry__loop_tls(void)
{
    return ferry__tls_loop;
}

/* True in a process forked from the one that made `loop`. */
static inline bool ferry__loop_forked(const ferry_loop *loop)
{
    return loop->fork_mark && *loop->fork_mark == 0;
}

/* The running task of this thread's loop, or NULL (also in a forked
 * child: see ferry__tls_task). */
static inline ferry_task *ferry__self(void)
{
    return ferry__tls_task;
}
/* 0 if the caller is on the loop's thread, -EPERM otherwise. */
int ferry__loop_check(const ferry_loop *loop);

/* The loop argument of a public call, by the rule of loop.h: NULL stands
 * for the calling thread's current loop.  Then ferry__loop_check() of it.
 * Returns: 0 and *loop set; -EINVAL (NULL and no current loop); -EPERM. */
static inline int ferry__loop_arg(ferry_loop **loop)
{
    if (!*loop)
        *loop = ferry__loop_tls();
    return ferry__loop_check(*loop);
}

/* ---- Entry checks, inline ----------------------------------------------- */

/*
 * The inline forms of ferry__enter_task(), ferry__bind() and ferry__check()
 * of port/loop_port.h and ferry_int.h, for src/.  Every primitive call
 * passes through them, and out of line they would be a large part of a
 * lock round trip.  The out-of-line functions stay for bridge/, which does
 * not see the task structure.  Same contracts as there.
 */
static inline int ferry__enter_task_inline(ferry_task **self /* OUT */)
{
    *self = ferry__self();
    return __builtin_expect(*self != NULL, 1) ? 0 : -EPERM;
}

static inline int ferry__bind_inline(ferry_loop **bound)
{
    ferry_loop *loop = ferry__tls_loop;

    if (__builtin_expect(!loop || loop->owner != &ferry__tls_token || ferry__loop_forked(loop), 0))
        return -EPERM;
    if (__builtin_expect(*bound == loop, 1))
        return 0;
    if (*bound)
        return -EPERM;
    *bound = loop;
    return 0;
}

/* ferry__bind() for `self`, a task that ferry__enter_task_inline() has just
 * returned: its loop is the one running on this thread, so this is one
 * comparison and no thread-local read. */
static inline int ferry__bind_task(ferry_loop **bound, const ferry_task *self)
{
    if (__builtin_expect(*bound == self->loop, 1))
        return 0;
    if (*bound)
        return -EPERM;
    *bound = self->loop;
    return 0;
}

/* ferry__check() inside scopes: the slow path, out of line (wait.c). */
int ferry__check_scopes(ferry_task *t);

static inline int ferry__check_inline(ferry_task *t)
{
    if (__builtin_expect(!t->scope, 1))
        return t->cancelled ? -ECANCELED : 0;
    return ferry__check_scopes(t);
}
/* Timers (timer.c). */
/* A timer of ferry_call_later(). */
struct ferry_timer {
    struct ferry__hnode node; /* in loop->timers until it fires */
    struct ferry__cbnode run; /* in the run queue once fired */
    ferry_loop *loop;
};
/* The loop's time: its virtual time if it has a virtual clock, else the
 * real clock.  What its timers are keyed on, whichever loop is current on
 * the thread. */
static inline int64_t ferry__loop_now(const ferry_loop *loop)
{
    return loop->vclock ? loop->vnow : ferry__now_real();
}
/* Fire the timers due now. */
void ferry__timers_expire(ferry_loop *loop);
/* The virtual clock: move the loop's time to the earliest timer's deadline
 * and fire the timers due then.  Returns false (and moves nothing) if no
 * timer is waiting, or only ones that never fire (FERRY_NEVER). */
bool ferry__vclock_jump(ferry_loop *loop);
/* The source of ferry_now() for loops with a virtual clock (base/clock.h):
 * the time of the loop current on the calling thread, if it has one. */
bool ferry__vclock_source(int64_t *now);
/* Make the next blocking poll wake up for the earliest timer. */
void ferry__timers_arm(ferry_loop *loop);
/* Arm the poll timer if the loop is driven by someone else's dispatch. */
void ferry__loop_timers_changed(ferry_loop *loop);
/* The tick that wakes a blocking poll (a timerfd for an owned base, a
 * libevent timer otherwise): -ENOMEM, -EMFILE, -ENFILE.  Freeing it drops
 * the timers that never fired too. */
int ferry__timers_init(ferry_loop *loop);
void ferry__timers_fini(ferry_loop *loop);

/* The fork mark (loop.c): mapped when the loop is made (optional: without
 * it a forked child is not detected), unmapped when it is freed. */
void ferry__fork_mark_setup(ferry_loop *loop);
void ferry__fork_mark_teardown(ferry_loop *loop);

/* `t` ended holding t->locks ferry_locks: break each of them, log each
 * and keep it for the dump (sync.c). */
void ferry__task_locks_died(ferry_task *t);
/* Forget the broken lock at `lock` (it is destroyed or freed) (sync.c). */
void ferry__lock_forget(ferry_loop *loop, const void *lock);
/* Print the broken locks kept by the loop, if any (sync.c). */
void ferry__lock_dump_broken(ferry_loop *loop, FILE *out);

/* A child of a group ended (group.c). */
void ferry__group_child_done(ferry_task *t);

/* TSan fibers of tasks (task.c). */
void ferry__fiber_create(ferry_task *t);
void ferry__fiber_destroy(ferry_task *t);

#endif /* FERRY_LOOP_INT_H */
