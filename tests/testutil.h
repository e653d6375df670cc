/* testutil.h - fixtures and helpers shared by ferry's test programs
 * (docs/testing.md tells how they are used).
 *
 * No cr_assert*() inside a task body (it longjmps off the task stack);
 * record into variables or use cr_expect*(), and assert on the main stack
 * after tu_run() returns.
 */
#ifndef FERRY_TESTUTIL_H
#define FERRY_TESTUTIL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "ferry/ferry.h"

/* The loop made by tu_loop_setup(). */
extern ferry_loop *tu_loop;

/*
 * Criterion .init / .fini.  tu_loop_setup() makes tu_loop on this thread.
 * When the test body returns, tu_loop must hold no live task, no callback
 * or timer not yet run and no post from a thread not yet drained; it is
 * then freed, and every allocation made through ferry's allocator since
 * the setup must have been given back (pool threads get a second to
 * finish freeing).  Either failing fails the test, under Criterion (the
 * check runs at the end of the body: Criterion ignores failures in .fini)
 * and under the shim.  A test that frees tu_loop itself sets it to NULL.
 * tu_loop_teardown() also ends a test whose .init set tu_loop some other
 * way.
 *
 * tu_alloc_setup() is the .init of a test that makes its own loops (or
 * none): there is no tu_loop, and tu_loop_teardown() checks only that
 * every allocation made through ferry since the setup was given back.
 */
void tu_loop_setup(void);
void tu_alloc_setup(void);
void tu_loop_teardown(void);

/* The .init of a test on simulated time: tu_alloc_setup(), then tu_loop
 * made with a virtual clock (ferry_loop_opts.virtual_clock) and, as by
 * tu_loop_setup(), no slow-step detector.  The loop's own allocations
 * count as the test's, so tu_loop_teardown() must find them freed. */
void tu_vclock_setup(void);

/* Spawn fn(arg) as a task named "main" on `loop`, run the loop until the
 * task has ended, and return its status (or the error of the spawn). */
int tu_run_on(ferry_loop *loop, ferry_task_fn fn, void *arg);

/* tu_run_on(tu_loop, fn, arg). */
int tu_run(ferry_task_fn fn, void *arg);

/* Cancel task t of tu_loop and run the loop until it has ended; its
 * status (-ECANCELED unless it ended first). */
int tu_cancel_join(ferry_task *t);

/* Send libevent's allocations through ferry's fault hook (so a test can
 * fail them), counted as fault points but not as ferry's allocations.
 * Call before libevent allocates: from a constructor.  `failed`, if not
 * NULL, is called (on the allocating thread) after each libevent
 * allocation the hook failed, with the fault point's site name. */
void tu_libevent_fault_hook(void (*failed)(const char *site));

/* While `on`, libevent's allocations are neither failed nor counted (a
 * sweep that needs libevent to work, e.g. evdns queries, while it fails
 * ferry's own allocations). */
void tu_libevent_fault_exempt(bool on);

/* Descriptors open in the process now (entries of /proc/self/fd, less the
 * directory's own): tests that a close or a cancel leaves none behind. */
int tu_open_fds(void);

/* A connected TCP pair over loopback in fds[0] and fds[1] (blocking,
 * close-on-exec); fails the test if the machine cannot make one. */
void tu_tcp_pair(int fds[2]);

/* FERRY_TEST_TIME_MULT (at least 1): how much slower than a plain build
 * this build runs (valgrind, TSan, ASan). */
double tu_time_mult(void);

/* Milliseconds scaled by tu_time_mult(), as nanoseconds. */
int64_t tu_ms(int64_t ms);

/* FERRY_STRESS_SCALE, a factor in (0, 1] (1 if unset or out of range):
 * how much of its full iteration count a stress test runs in this build. */
double tu_stress_scale(void);

/* n scaled by tu_stress_scale(), at least 1. */
long tu_scaled(long n);

/*
 * 0 if nothing leaked so far: the allocations made through ferry's
 * allocator and not yet freed are back to what tu_loop held when it was
 * made (or, without tu_loop, to what the test started with), and, under
 * LeakSanitizer, it finds no leak.  Otherwise how many are off, with a
 * line on stderr.
 */
int tu_leaks(void);

/* Wait until ferry__alloc_live() comes back to `want`, for at most a
 * second (scaled): a pool thread may still be freeing the job of a task
 * that has ended (an abandoned one).  Returns the difference left. */
long tu_alloc_settle(long want);

/* Start a thread running fn(arg); a failure fails the test. */
pthread_t tu_start_thread(void *(*fn)(void *), void *arg);

/*
 * The threads of this process as /proc counts them ("Threads:" of
 * /proc/self/status), or -1.  The kernel takes a thread out of that count
 * a moment after pthread_join() has returned (the joiner is woken when the
 * thread's stack may be reused, before the kernel has reaped it), so a
 * count right after a join may still include the joined thread: compare
 * through tu_threads_wait().
 */
int tu_threads_now(void);

/* Wait until tu_threads_now() is `want`, for at most five seconds
 * (scaled).  Returns the count last seen. */
int tu_threads_wait(int want);

/* The count to compare with later: taken after one thread has come and
 * gone and the kernel has reaped it, so that a runtime's own helper thread
 * (ThreadSanitizer starts one at the first pthread_create()) is counted
 * and the joined one is not. */
int tu_threads_baseline(void);

/* Run fn(arg) on a thread of its own and wait for it; what fn returned. */
void *tu_on_thread(void *(*fn)(void *), void *arg);

/* Thread side: wait until *flag is non-zero, sleeping 100 us at a time. */
void tu_spin_until(atomic_int *flag);

/* Task side: wait until *flag is non-zero, sleeping 200 us at a time.
 * Returns 0, or the error of ferry_sleep() (cancelled, deadline). */
int tu_task_wait_flag(atomic_int *flag);

/* ---- inside a task -------------------------------------------------- */

/* Spawn fn(arg) on the calling task's loop (opts may be NULL); the handle,
 * or NULL if the spawn failed (tu_join() of NULL reports that). */
ferry_task *tu_spawn(ferry_task_fn fn, void *arg);
ferry_task *tu_spawn_opts(ferry_task_fn fn, void *arg, const ferry_task_opts *opts);

/* Join t: its status; -99998 if t is NULL or the join failed. */
int tu_join(ferry_task *t);

/* Yield a few times, so that every task made ready runs until it blocks
 * (or ends). */
void tu_settle(void);

/* Every rc[i] (i < nrc) is -EINVAL and every pred[i] (i < npred) false,
 * else the test fails: for tests that record the refusals of many calls. */
void tu_assert_einval_and_false(const int *rc, int nrc, const bool *pred, int npred);

/* Trivial task bodies: return 0, return 42. */
int tu_ret0(void *arg);
int tu_ret42(void *arg);

/* Task body, arg a ferry_stream *: write each line read (up to 128 bytes)
 * back, as a line service would, until a read or write fails; then close
 * the stream and return that error (-ENODATA when the peer ended). */
int tu_echo_lines(void *arg);

/* Who got something, in the order they got it (a lock, permits, an item):
 * tu_order_add() appends up to 64 entries. */
struct tu_order {
    int who[64];    /* the ids, in order */
    int n;          /* how many */
};

void tu_order_add(struct tu_order *o, int who);

/*
 * A primitive bound to tu_loop refuses other threads and other loops:
 * calls(rc) makes its calls, stores each one's return code in rc[] and
 * returns how many it made (at most 32).  It is run on a thread of its
 * own, then in a task of another loop of this thread; every call must
 * return -EPERM both times, else the test fails.
 */
void tu_assert_eperm_elsewhere(int (*calls)(int *rc));

/* ---- capturing what ferry writes ------------------------------------- */

/*
 * ferry_set_log() to a capture: every line logged from now until
 * tu_log_capture_stop() is kept (from any thread), the first 8 KiB of
 * them.  tu_log_lines() counts them, tu_log_text() holds them, one a line,
 * and tu_log_level(i) is the level of line i (of the first eight), or -1.
 */
void tu_log_capture_start(void);
void tu_log_capture_stop(void);
int tu_log_lines(void);
const char *tu_log_text(void);
int tu_log_level(int i);

/*
 * stderr (the descriptor) into a temporary file until
 * tu_stderr_release(), which puts it back and returns what was written
 * (up to 8 KiB, in a static buffer).  tu_stderr_fd() is the file's
 * descriptor while the capture lasts, for a signal handler to read with
 * pread().
 */
void tu_stderr_capture(void);
const char *tu_stderr_release(void);
int tu_stderr_fd(void);

#endif /* FERRY_TESTUTIL_H */
