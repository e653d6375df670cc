/* ferry/task.h - tasks (stackful coroutines), cancellation, deadlines,
 * task groups, and the basic suspension points: yield, sleep, join, waiting
 * for a file descriptor or a signal.
 *
 * A task is a function running on its own stack on a loop's thread.  It
 * reads like blocking code: a call that may wait is a *suspension point*:
 * it suspends the task (never the thread) and returns an int, 0 or a
 * negative errno.  Every suspension point is also a cancellation point.
 *
 * Cancellation is level-triggered: after ferry_task_cancel(t), every
 * suspension point of t returns -ECANCELED until t ends, except inside a
 * shielded scope.  Inside a deadline scope whose deadline has passed,
 * suspension points return -ETIMEDOUT.  A suspending call that returns an
 * error had no effect (all or nothing).
 */
#ifndef FERRY_TASK_H
#define FERRY_TASK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ferry/detail.h"
#include "ferry/loop.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ferry_task ferry_task;

/* A task's body.  Its return value is the task's status. */
typedef int (*ferry_task_fn)(void *arg);

/*
 * Default stack size: 64 KiB, of which only the touched pages use memory.
 * A stack also holds its task's structure (a few hundred bytes) at the
 * top, and a stack of the loop's default size of 64 KiB or more gives up
 * to 1,984 bytes more to cache colouring (docs/design.md).
 *
 * Overflows.  Below every stack lies a 64 KiB guard region that faults
 * when touched (no memory, no extra mapping: only address space and page
 * tables); ferry reports such a fault on stderr with the task's name
 * ("ferry: stack overflow in task 'x'") and the process dies of the
 * SIGSEGV.  Compile application code with -fstack-clash-protection (gcc,
 * clang): then every frame larger than a page touches its pages one by one
 * from the top, so the first touch below the stack hits the guard region,
 * whatever the frame's size.  Without it a frame's first write may land
 * anywhere in the frame: the region catches any frame of up to 64 KiB,
 * and a larger one only if the stack has room enough above the region (a
 * 96 KiB frame entered with 32 KiB or more of a stack left); a larger
 * frame may write into the stack below, another task's, unreported.
 * Where the kernel gives no guard (before Linux 6.13, beyond a budget of
 * mprotect'd regions per loop), a canary word checked
 * whenever the task switches out, and the stack pointer seen by the
 * SIGSEGV handler, report the overflows that fault or survive to a switch;
 * an overflow into another task's stack that does neither goes unnoticed.
 * The report needs ferry's SIGSEGV handler, which ferry installs only when
 * the application has none, on an alternate signal stack of the thread.
 */
#define FERRY_STACK_DEFAULT ((size_t)64 * 1024)
/* Smallest accepted stack size. */
#define FERRY_STACK_MIN     ((size_t)16 * 1024)

/*
 * ferry_task_opts.flags:
 *   FERRY_SPAWN_EAGER  when spawned from a task of the same loop, the new
 *                      task starts at once and runs until it first suspends
 *                      or ends; the spawner is then ready again, as after
 *                      ferry_yield(), and continues in a later turn
 *                      (boost.fiber's launch::dispatch; like asyncio's eager
 *                      tasks, but the spawner gives up its turn).  A
 *                      detached task that ends without suspending gives its
 *                      stack back before the spawner continues, so a burst of spawns
 *                      of mostly short tasks (cache hits) reuses a few hot
 *                      stacks instead of holding one each.  Spawned from a
 *                      callback, the flag is ignored.  The spawn is not a
 *                      cancellation point: it never fails for the spawner
 *                      having been cancelled.
 */
#define FERRY_SPAWN_EAGER 0x1u

typedef struct ferry_task_opts {
    const char *name;      /* for diagnostics; copied (up to 31 bytes); NULL: "task" */
    size_t stack_size;     /* 0: the loop's default */
    unsigned flags;        /* FERRY_SPAWN_*; 0: none */
} ferry_task_opts;

/*
 * Start fn(arg) as a new task on `loop` (NULL: the current loop).  It first
 * runs in a later turn (at once with FERRY_SPAWN_EAGER, above).  If `out` is not NULL it receives a handle that the
 * caller owns and must give back with ferry_task_join() or
 * ferry_task_detach(); the task's stack is kept until both the task has
 * ended and the handle is given back.  With `out` NULL the task is detached.
 * The loop need not be running: on its thread, before ferry_loop_run() (or
 * between two runs), a program spawns its first tasks, which start when the
 * loop runs; `loop` NULL then means ferry_loop_current() (the first loop
 * made on this thread and not yet freed).  FERRY_SPAWN_EAGER is ignored
 * there.
 * Thread: loop (in a task, a callback, or outside the loop's run).
 * Suspends: no (with FERRY_SPAWN_EAGER from a task: yes, until a later
 * turn).
 * Returns: 0; -ENOMEM (no task made, nothing leaked; also when the values
 * the child inherits (ferry_task_key) could not be stored); -EPERM (not
 * on the loop's thread); -EINVAL (fn NULL, an unknown flag, or loop NULL
 * on a thread without a loop, as for every call taking a loop: loop.h).
 */
int ferry_task_spawn(ferry_task **out /* OUT, optional */, ferry_loop *loop,
                     ferry_task_fn fn, void *arg, const ferry_task_opts *opts);

/*
 * Wait until `task` ends, store its status in *status (if not NULL) and give
 * the handle back.  Joining a finished task returns at once.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: 0 (handle given back); -ECANCELED, -ETIMEDOUT (handle still
 * yours); -EDEADLK (joining itself); -EPERM; -EINVAL.
 */
int ferry_task_join(ferry_task *task, int *status /* OUT, optional */);

/*
 * Join without waiting: if `task` has ended, store its status, give the
 * handle back and return 0; otherwise -EAGAIN and nothing changes.
 * Thread: loop (in a task or not).  Suspends: no.
 * Returns: 0; -EAGAIN; -EPERM; -EINVAL.
 */
int ferry_task_try_join(ferry_task *task, int *status /* OUT, optional */);

/* Give the handle back without waiting.  Thread: loop.  Returns: 0; -EPERM; -EINVAL. */
int ferry_task_detach(ferry_task *task);

/*
 * Request cancellation: from now on every suspension point of `task`
 * outside a shield returns -ECANCELED; a task waiting now is woken.
 * Cancelling a finished task does nothing.  Thread: loop.  Suspends: no.
 * Returns: 0; -EPERM; -EINVAL.
 */
int ferry_task_cancel(ferry_task *task);

/* State of a task, for diagnostics. */
enum ferry_task_state {
    FERRY_TASK_READY,    /* spawned or woken, waiting for its turn */
    FERRY_TASK_RUNNING,  /* running now */
    FERRY_TASK_WAITING,  /* suspended at a suspension point */
    FERRY_TASK_DONE,     /* ended; status available */
};

/* Thread: any.  Suspends: no.
 * Returns: the running task, or NULL outside tasks. */
ferry_task *ferry_task_current(void);
/* Thread: loop.  Suspends: no.  Returns: the task's name, never NULL. */
const char *ferry_task_name(const ferry_task *task);
/* Thread: loop.  Suspends: no.  Returns: the task's state. */
enum ferry_task_state ferry_task_state(const ferry_task *task);
/* Thread: loop.  Suspends: no.
 * Returns: true once ferry_task_cancel() was called on the task. */
bool ferry_task_cancelled(const ferry_task *task);

/*
 * Let every other ready task and callback run, then continue.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: 0; -ECANCELED; -ETIMEDOUT; -EPERM.
 */
int ferry_yield(void);

/*
 * Suspend for `duration` nanoseconds (ferry_sleep) or until the monotonic
 * time `deadline` (ferry_sleep_until).
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: 0 (slept the full time); -ECANCELED; -ETIMEDOUT (an enclosing
 * deadline passed first); -EPERM.
 */
int ferry_sleep(int64_t duration);
int ferry_sleep_until(int64_t deadline);

/* Events for ferry_wait_fd(). */
enum { FERRY_READ = 1, FERRY_WRITE = 2 };

/*
 * Wait until `fd` is readable or writable (`events`: FERRY_READ, FERRY_WRITE
 * or both).  *revents, if not NULL, receives what is ready.
 *
 * Do not close an fd while a task waits on it.  Closing does not wake the
 * waiter (the kernel drops the fd from the poll set silently), and the
 * stale wait keeps the fd's number registered in libevent, which counts
 * events per fd number: when the number is reused by a new socket or pipe,
 * a wait on it that begins while the stale one is still there is never
 * woken, not even after the stale waiter has left.  Before closing, wake
 * the waiter (ferry_task_cancel(), or a deadline) and let it return
 * (ferry_task_join(), or any wait until it has run); then close the fd.
 *
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: 0; -ECANCELED; -ETIMEDOUT; -EPERM; -EINVAL; -ENOMEM (libevent
 * could not register the fd).
 */
int ferry_wait_fd(int fd, int events, int *revents /* OUT, optional */);

/*
 * Wait until signal `signum` is delivered to the process (e.g. SIGINT or
 * SIGTERM for a graceful shutdown).  This is a subscription
 * (ferry/signal.h) that lasts for the one wait: every task waiting for the
 * signal, on any loop, is woken by each delivery.  Deliveries that come
 * while it waits, after the first, merge into the one it returns.  Only a
 * live subscription keeps signals between waits: before the call and after
 * it returns, the signal has the disposition it had without ferry (unless
 * a ferry_sigsub for it exists), and a second SIGTERM that arrives while
 * the task handles the first one kills the process.  A service that must
 * see every delivery keeps a ferry_sigsub instead.  If the wait ends with
 * an error after a delivery came, the signal is raised again for that
 * disposition, as ferry_sigsub_free() does.
 * Thread: loop, in a task.  Suspends: yes.
 * Returns: 0; -ECANCELED; -ETIMEDOUT; -EPERM; -EINVAL (a number
 * ferry/signal.h refuses: not a signal, SIGKILL, SIGSTOP, a fault's
 * signal); -ENOMEM.
 */
int ferry_wait_signal(int signum);

/* ---- Scopes: deadlines and shields ------------------------------------ */

/* A scope lives on the task's stack between ferry_scope_enter() and
 * ferry_scope_exit(); scopes nest and must be exited in reverse order. */
typedef struct ferry_scope {
    /* private: use the functions below */
    struct ferry_scope *parent;   /* enclosing scope of the same task */
    struct ferry_task  *task;     /* the task that entered it */
    int64_t             deadline; /* FERRY_NEVER for none */
    bool                shield;   /* blocks outer cancellation and deadlines */
    bool                fired;    /* its deadline made a call return -ETIMEDOUT */
} ferry_scope;

enum { FERRY_SCOPE_SHIELD = 1 };

/*
 * Enter a scope of the running task.  With a deadline (FERRY_NEVER for
 * none), every suspension point inside returns -ETIMEDOUT once the deadline
 * has passed.  With FERRY_SCOPE_SHIELD, cancellation of the task and the
 * deadlines of enclosing scopes do not reach inside; its own deadline does.
 * Thread: loop, in a task.  Suspends: no.  Returns: 0; -EPERM; -EINVAL.
 */
int ferry_scope_enter(ferry_scope *scope, int64_t deadline, unsigned flags);

/*
 * Leave the innermost scope.
 * Thread: loop, in the task that entered it.  Suspends: no.
 * Returns: 0; -ETIMEDOUT if this scope's deadline fired inside it; -EINVAL
 * if `scope` is not the innermost one.
 */
int ferry_scope_exit(ferry_scope *scope);

/* Thread: loop.  Suspends: no.
 * Returns: true if this scope's deadline made a suspension point return
 * -ETIMEDOUT. */
bool ferry_scope_fired(const ferry_scope *scope);

/* ---- Task-local values ------------------------------------------------ */

/*
 * A key for a pointer per task (Python's contextvars, pthread keys): the
 * caller's struct, usually static; its address names it, so keys need no
 * creation and no registry, and all-zero is a key without destructor that
 * children do not inherit.  The struct must outlive every task that holds
 * a value for it.
 *
 *   destructor  run with the task's value (if not NULL) when the task ends,
 *               on the loop's thread, before the task counts as done
 *               (joiners see it done after it).  It must not suspend.
 *               NULL: none.
 *   inherit     NULL: children start without a value.  Otherwise a child
 *               spawned by a task of the same loop starts with
 *               inherit(parent's value), a value of its own (the destructor
 *               runs for it too): return a new reference or a copy.  To
 *               share one pointer without ownership, use a key without
 *               destructor and an inherit function that returns its
 *               argument.  Inheritance is chosen per key, at spawn time,
 *               from the parent's values then.
 */
typedef struct ferry_task_key {
    void  (*destructor)(void *value);
    void *(*inherit)(void *value);
} ferry_task_key;

/*
 * Set the calling task's value for `key` (NULL: no value).  A value
 * replaced or cleared this way is the caller's again: its destructor is
 * not called (as pthread_setspecific()).
 * Thread: loop, in a task.  Suspends: no.
 * Returns: 0; -ENOMEM (the first value for this key could not be stored:
 * nothing changed); -EPERM (not in a task); -EINVAL (key NULL).
 */
int ferry_task_local_set(const ferry_task_key *key, void *value);

/* Thread: loop, in a task.  Suspends: no.
 * Returns: the calling task's value for `key`; NULL if it has none, or
 * outside a task. */
void *ferry_task_local_get(const ferry_task_key *key);

/* ---- Task groups ------------------------------------------------------ */

/* Structured concurrency (Trio's nursery, asyncio.TaskGroup).  A group lives
 * in its owner task (usually on its stack); the owner must call
 * ferry_group_wait() before the group goes out of scope, and no child
 * outlives that call.
 *
 * The rules:
 *   - Any task of the owner's loop may spawn into the group while it is
 *     open: not yet waited for and not failing (Trio's
 *     nursery.start_soon() from a child; a server's accept task spawning
 *     its connections).  Children spawned while the owner waits are waited
 *     for too.
 *   - A child's failure (a status other than 0, not counting the
 *     -ECANCELED of a child that was cancelled) cancels every sibling and
 *     becomes the group's status, unless the child was spawned with
 *     FERRY_GROUP_ISOLATE: then it is counted and the first such status is
 *     kept (ferry_group_failures()), and the siblings go on (a server's
 *     connections).
 *   - The group holds each child's handle.  ferry_group_spawn_ex() with
 *     `out` gives the caller a handle as well, to join or detach as one
 *     from ferry_task_spawn(); the group still waits for the child.
 */
typedef struct ferry_group {
    /* private: use the functions below */
    struct ferry_task *owner;     /* the task that initialised the group */
    struct ferry__waitq waiters;  /* the owner while it waits */
    size_t  live;                 /* children not yet finished */
    int     status;               /* first failure, 0 if none */
    bool    failing;              /* a child failed: the rest are cancelled */
    bool    closed;               /* ferry_group_wait() has returned */
    struct ferry__link children;  /* live children, by their group link */
    size_t  isolated_failures;    /* FERRY_GROUP_ISOLATE children that failed */
    int     isolated_status;      /* the first of their statuses */
} ferry_group;

/* ferry_group_spawn_ex() flags. */
#define FERRY_GROUP_ISOLATE 0x1u  /* a failure is counted, it cancels no sibling */

/* Thread: loop, in a task.  Returns: 0; -EPERM; -EINVAL. */
int ferry_group_init(ferry_group *group);

/*
 * Spawn a child into the group: ferry_group_spawn_ex(group, NULL, fn, arg,
 * opts, 0).  Thread: loop, in any task of the owner's loop.
 * Returns: as ferry_task_spawn(), plus -ESHUTDOWN if the group is failing
 * or already waited for; -EPERM from a task of another loop.
 */
int ferry_group_spawn(ferry_group *group, ferry_task_fn fn, void *arg,
                      const ferry_task_opts *opts);

/*
 * Spawn a child into the group.  With `out` not NULL, *out receives a
 * handle the caller owns as well, to give back with ferry_task_join() (or
 * try_join) or ferry_task_detach(); it may be given back before or after
 * the child ends and before or after ferry_group_wait().  `flags`:
 * FERRY_GROUP_ISOLATE or 0.
 * Thread: loop, in any task of the owner's loop.  Suspends: as
 * ferry_task_spawn() (only with FERRY_SPAWN_EAGER).
 * Returns: 0; as ferry_task_spawn(); -ESHUTDOWN (failing or already waited
 * for: nothing spawned, *out NULL); -EPERM (a task of another loop, or not
 * in a task); -EINVAL (an unknown flag, an uninitialised group).
 */
int ferry_group_spawn_ex(ferry_group *group, ferry_task **out /* OUT, optional */,
                         ferry_task_fn fn, void *arg, const ferry_task_opts *opts,
                         unsigned flags);

/*
 * The failures of FERRY_GROUP_ISOLATE children so far: how many, and in
 * *first (if not NULL) the status of the first one (0 if none).
 * Thread: loop.  Suspends: no.
 * Returns: the count; 0 for NULL.
 */
size_t ferry_group_failures(const ferry_group *group, int *first /* OUT, optional */);

/*
 * Wait for every child.  If the owner is cancelled or times out while
 * waiting, every child is cancelled and still waited for: no child outlives
 * its group.  Thread: loop, in the owner task.  Suspends: yes.
 * Returns: the first failure's status, 0 if none; -ECANCELED or -ETIMEDOUT
 * if the wait itself was interrupted (children then cancelled and ended);
 * -EPERM.
 */
int ferry_group_wait(ferry_group *group);

/* Cancel every child of the group.  Thread: loop.  Returns: 0; -EPERM. */
int ferry_group_cancel(ferry_group *group);

/* ---- Run and dump ---------------------------------------------------- */

/*
 * asyncio.run(): make a loop, run fn(arg) as its main task (named "main")
 * until it ends, then end the rest as asyncio.run() does: every task still
 * alive is named in the log (one FERRY_LOG_WARN line each), cancelled and
 * waited for (callbacks and timers left are dropped as ferry_loop_free()
 * drops them), the loop is freed, and, when no other loop is alive in the
 * process, the default pool is shut down (ferry_pool_default_shutdown()
 * with FERRY_POOL_FREE_LEAVE_ABANDONED: an abandoned job, such as a stuck
 * name lookup, finishes on its own and does not hold the exit; a later use
 * starts a new pool).  A task that ignores its cancellation
 * (a shield without end) holds the exit.  With FERRY_VIRTUAL_CLOCK=1 in
 * the environment the loop has a virtual clock (ferry_loop_opts
 * .virtual_clock), so that a program's timeouts can be tested without
 * waiting for them.
 * Thread: any, not in a task.
 * Returns: the main task's status; -ENOMEM if the loop or the task could
 * not be made.
 */
int ferry_run(ferry_task_fn fn, void *arg);

/*
 * Print every live task of `loop` on `out`: name, state, what it waits on,
 * and how much of its stack has been used out of its size (asyncio.all_tasks,
 * Go's goroutine dump); then the locks that tasks broke by ending while
 * holding them (the last 16 not destroyed since), each with the task that
 * broke it.  The stack use is the deepest point reached, counted in whole
 * pages (the lowest stack page that is in memory, by mincore()), so it is
 * exact to a page, costs the running tasks nothing, and reads low if stack
 * pages were swapped out.  A stack reused from the loop's cache keeps the
 * pages an earlier task touched until the cache is trimmed, so it shows the
 * deepest use of any task on it since: to size stacks, look at tasks on
 * fresh stacks (the first ones of a loop, or a stack size of their own), or
 * at the largest figure.
 * `loop` NULL: the current loop (loop.h).
 * Thread: loop.  Returns: number of tasks printed; -EPERM; -EINVAL.
 */
int ferry_loop_dump(ferry_loop *loop, FILE *out);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_TASK_H */
