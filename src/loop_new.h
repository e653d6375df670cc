/* loop_new.h - making and freeing a loop: what wire/ calls in src/.
 *
 * ferry_loop_new() (wire/loop.c) checks the options here, makes or checks
 * the event_base, makes the loop here, attaches the bridge's inbox and
 * starts the loop with the hooks that reach it.  ferry_loop_free() frees
 * it here; the loop calls the hooks' close() on its way.
 * Loop thread only (the thread that makes the loop).
 */
#ifndef FERRY_LOOP_NEW_H
#define FERRY_LOOP_NEW_H

#include <stdbool.h>

#include "ferry/loop.h"
#include "port/loop_port.h"

struct event_base;

/* Whether a loop with options `opts` (NULL: defaults) may be made on this
 * thread.  Returns: 0; -EINVAL (a stack size out of range); -EPERM (called
 * from a task). */
int ferry__loop_opts_check(const ferry_loop_opts *opts);

/*
 * Make a loop on `base` (`own_base`: the loop frees it with itself) with
 * the options `opts` (checked).  The loop is not usable until
 * ferry__loop_start().  Returns: 0 and *out; -ENOMEM; -EMFILE, -ENFILE (no
 * descriptor for the timerfd).  On error nothing is left, and the base is
 * still the caller's.
 */
int ferry__loop_create(ferry_loop **out /* OUT */, const ferry_loop_opts *opts,
                       struct event_base *base, bool own_base);

/* Free a loop that ferry__loop_create() made and that was never started;
 * the base stays the caller's. */
void ferry__loop_discard(ferry_loop *loop);

/* Give a made loop its hooks (copied) and make it this thread's live loop:
 * the stack-overflow reporter, the set of live loops, the thread's current
 * loop if it has none.  Cannot fail.  From here on the loop owns its base
 * if it was made with own_base. */
void ferry__loop_start(ferry_loop *loop, const struct ferry__loop_hooks *hooks);

/* ferry_loop_free(), as ferry/loop.h describes it. */
void ferry__loop_free(ferry_loop *loop);

/* Log one line (FERRY_LOG_WARN) per task of `loop` that has not ended,
 * each as `who`: the tasks ferry_run() cancels when its main task is
 * done.  Returns how many. */
size_t ferry__loop_log_alive(ferry_loop *loop, const char *who);

/* The child side of fork(), which wire/ registers with pthread_atfork():
 * no task runs in the child, so a task's code that goes on there gets
 * -EPERM from every suspension point (docs/fork.md).  Thread: the forking
 * one. */
void ferry__fork_child(void);

#endif /* FERRY_LOOP_NEW_H */
