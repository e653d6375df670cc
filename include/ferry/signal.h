/* ferry/signal.h - POSIX signals as messages that tasks receive.
 *
 * A subscription asks for one or more signal numbers on one loop.  From the
 * moment ferry_sigsub_new() returns until ferry_sigsub_free(), every
 * delivery of one of those signals to the process is counted for it,
 * whether or not a task is waiting, and tasks receive them one after
 * another with ferry_sigsub_recv().  A signal that arrives while no task
 * waits is kept, not given to its default action, so a second SIGTERM that
 * arrives while the first is being handled is one more message, not the
 * end of the process.
 *
 * Every subscription sees every delivery: two loops on two threads (or two
 * subscriptions on one loop) that subscribe to the same signal each receive
 * each delivery once.
 *
 * Counting.  A delivery is one run of ferry's signal handler.  raise()
 * (pthread_kill() of the calling thread) from a thread that does not block
 * the signal runs it before it returns, so each call counts.
 * kill(getpid(), ...) sends the signal to the process: the kernel gives it
 * to any thread that does not block it (Linux tries the main thread
 * first), which may run the handler only later.  Deliveries that the
 * kernel merges (a signal sent again while it is still pending, before any
 * thread ran the handler) count once, as they would for any handler: two
 * kill(getpid(), SIGHUP) in a row, or two kill -HUP from outside, may be
 * one delivery.
 *
 * Order.  Deliveries of different signals are received in the order the
 * loop saw them, lowest number first among those it saw at the same time;
 * a signal with more than one delivery pending goes to the back after each
 * receive, so a flood of one signal cannot hold another one back.
 *
 * The disposition.  While at least one subscription to a signal exists in
 * the process, ferry's handler is installed for it (SA_RESTART; every
 * signal blocked while it runs; on the interrupted stack).  The first subscription saves the
 * disposition it replaces and the last one to go (ferry_sigsub_free(), or
 * ferry_loop_free() of its loop) puts it back.  If that last subscription
 * had counted deliveries of the signal that it never received, the signal
 * is raised once more on the calling thread after the old disposition is
 * back, so that it gets the action it would have had without ferry (as
 * Trio does): a SIGTERM that arrived during the last moments of a program
 * still ends it with SIGTERM.  Receive them with ferry_sigsub_try_recv()
 * before the free to keep that from happening.
 *
 * The handler is async-signal-safe: it saves errno, adds one to the
 * signal's counter and writes the eventfd of each subscribed loop.  Any
 * thread may run it, so application threads need not block the signals;
 * a thread that cannot cope with EINTR from calls that are never restarted
 * (poll, epoll_wait, nanosleep, ...) may block them.  ferry's pool threads
 * are created with every signal blocked except the ones a fault raises
 * (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS), so they never take
 * one and a job is never interrupted by one.  Consequences for jobs:
 *   - raise() in a job sends the signal to the pool thread, where it stays
 *     blocked: to signal the process from a job, use kill(getpid(), sig);
 *   - a program started from a job (fork and exec, posix_spawn, system)
 *     inherits the blocked mask: give it an empty one
 *     (posix_spawnattr_setsigmask() with POSIX_SPAWN_SETSIGMASK, or
 *     sigprocmask() in the child before exec).
 *
 * Do not share a signal between a ferry subscription and another handler
 * of the same signal: libevent's evsignal events (on any event_base),
 * signal()/sigaction() by the application, or a signalfd.  Each of them
 * takes the signal away from the other, and restoring one's saved
 * disposition undoes the other's.
 *
 * Refused (-EINVAL): SIGKILL and SIGSTOP, which cannot be caught; SIGSEGV,
 * SIGBUS, SIGFPE and SIGILL, whose faulting instruction would run again
 * for ever after a handler that only counts; the signals the C library
 * keeps for itself (glibc's 32 and 33); numbers outside 1..NSIG-1.
 *
 * After fork() the child inherits ferry's handler but no working
 * subscription (docs/fork.md): it should exec at once.
 */
#ifndef FERRY_SIGNAL_H
#define FERRY_SIGNAL_H

#include <stddef.h>

#include "ferry/loop.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ferry_sigsub ferry_sigsub;

/*
 * Subscribe `loop` (NULL: the loop of the calling thread) to the `n`
 * signal numbers at `signums` (a number may repeat).  Deliveries from now
 * on are counted for the new subscription; earlier ones are not.
 * Thread: loop (in a task or not).  Suspends: no.
 * Owns: the caller owns *out; free it with ferry_sigsub_free().
 * Returns: 0; -EINVAL (out or signums NULL, n 0, a number refused as
 * above, or loop NULL on a thread without a loop: nothing subscribed, *out
 * NULL); -EPERM (not on the loop's thread); -ENOMEM (nothing subscribed,
 * every disposition as it was).
 */
int ferry_sigsub_new(ferry_sigsub **out /* OUT */, ferry_loop *loop, const int *signums,
                     size_t n);

/*
 * Receive the next delivery counted for `sub`: its signal number goes to
 * *signum.  Waits while none is pending; tasks waiting on one subscription
 * are served in the order they came.
 * Thread: loop, in a task of the subscription's loop.  Suspends: yes.
 * Returns: 0; -ECANCELED, -ETIMEDOUT (nothing received: the delivery stays
 * for the next receive); -EPERM (not in a task of its loop, or its loop
 * was freed); -EINVAL (NULL).
 */
int ferry_sigsub_recv(ferry_sigsub *sub, int *signum /* OUT */);

/*
 * Receive without waiting.
 * Thread: loop (in a task or not).  Suspends: no.
 * Returns: 0; -EAGAIN (nothing pending, or every pending delivery is
 * promised to a task woken in ferry_sigsub_recv() that has not run yet);
 * -EPERM (not on its loop's thread, or its loop was freed); -EINVAL (NULL).
 */
int ferry_sigsub_try_recv(ferry_sigsub *sub, int *signum /* OUT */);

/*
 * End the subscription and free it.  A delivery it counted but nobody
 * received is raised again if no other subscription to that signal is
 * left (see the top of this file).  A subscription whose loop was freed
 * already is only freed (the loop ended it then).  NULL is ignored.
 * Thread: loop; any thread once its loop was freed.  Suspends: no.
 * Returns: 0; -EBUSY (a task waits in ferry_sigsub_recv(), or was woken
 * there and has not run yet: nothing changed); -EPERM (not on its loop's
 * thread).
 */
int ferry_sigsub_free(ferry_sigsub *sub);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_SIGNAL_H */
