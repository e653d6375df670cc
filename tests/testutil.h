/* testutil.h - fixtures shared by ferry's test programs.
 *
 * Rule from TESTING.md: no cr_assert*() inside a task body (it longjmps off
 * the task stack); record into variables or use cr_expect*(), and assert
 * on the main stack after tu_run() returns.
 */
#ifndef FERRY_TESTUTIL_H
#define FERRY_TESTUTIL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "ferry/ferry.h"

/* The loop made by tu_loop_setup(). */
extern ferry_loop *tu_loop;

/* Criterion .init / .fini: make tu_loop on this thread; free it, then
 * check that nothing leaked (LeakSanitizer builds) and the fault hook is
 * disarmed. */
void tu_loop_setup(void);
void tu_loop_teardown(void);

/* Spawn fn(arg) as a task named "main" on tu_loop, run the loop until
 * nothing is left, and return the task's status. */
int tu_run(ferry_task_fn fn, void *arg);

/* Milliseconds scaled by FERRY_TEST_TIME_MULT (default 1) for slow builds
 * (valgrind, TSan), as nanoseconds. */
int64_t tu_ms(int64_t ms);

/* Under LeakSanitizer: 0 if no leak so far.  Elsewhere always 0. */
int tu_leaks(void);

/* Start a thread running fn(arg); a failure fails the test. */
pthread_t tu_start_thread(void *(*fn)(void *), void *arg);

/* Thread side: wait until *flag is non-zero, sleeping 100 us at a time. */
void tu_spin_until(atomic_int *flag);

/* Task side: wait until *flag is non-zero, sleeping 200 us at a time.
 * Returns 0, or the error of ferry_sleep() (cancelled, deadline). */
int tu_task_wait_flag(atomic_int *flag);

#endif /* FERRY_TESTUTIL_H */
