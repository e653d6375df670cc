/* testutil.h - fixtures shared by ferry's test programs.
 *
 * No cr_assert*() inside a task body (it longjmps off the task stack);
 * record into variables or use cr_expect*(), and assert on the main stack
 * after tu_run() returns.
 */
#ifndef FERRY_TESTUTIL_H
#define FERRY_TESTUTIL_H

#include <pthread.h>
#include <stdatomic.h>
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
 */
void tu_loop_setup(void);
void tu_loop_teardown(void);

/* Spawn fn(arg) as a task named "main" on tu_loop, run the loop until
 * nothing is left, and return the task's status. */
int tu_run(ferry_task_fn fn, void *arg);

/* Cancel task t of tu_loop and run the loop until it has ended; its
 * status (-ECANCELED unless it ended first). */
int tu_cancel_join(ferry_task *t);

/* Send libevent's allocations through ferry's fault hook (so a test can
 * fail them), counted as fault points but not as ferry's allocations.
 * Call before libevent allocates: from a constructor. */
void tu_libevent_fault_hook(void);

/* FERRY_TEST_TIME_MULT (at least 1): how much slower than a plain build
 * this build runs (valgrind, TSan, ASan). */
double tu_time_mult(void);

/* Milliseconds scaled by tu_time_mult(), as nanoseconds. */
int64_t tu_ms(int64_t ms);

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

/* Thread side: wait until *flag is non-zero, sleeping 100 us at a time. */
void tu_spin_until(atomic_int *flag);

/* Task side: wait until *flag is non-zero, sleeping 200 us at a time.
 * Returns 0, or the error of ferry_sleep() (cancelled, deadline). */
int tu_task_wait_flag(atomic_int *flag);

#endif /* FERRY_TESTUTIL_H */
