/* clock.h - the clocks every part of ferry reads: ferry_now() (public in
 * ferry/loop.h), which is the virtual time of the loop current on the
 * calling thread if that loop has a virtual clock, else the real clock
 * (CLOCK_MONOTONIC in nanoseconds), and deadlines on either.
 * Thread: any.
 */
#ifndef FERRY_BASE_CLOCK_H
#define FERRY_BASE_CLOCK_H

#include <stdbool.h>
#include <stdint.h>

#include "ferry/loop.h" /* ferry_now(), FERRY_NEVER */

/* The real clock: CLOCK_MONOTONIC in ns, also on a loop's thread whose
 * clock is virtual.  For what measures time that really passes (spin
 * budgets, the blocked-loop detector) and for deadlines that threads wait
 * for on condition variables. */
int64_t ferry__now_real(void);

/* A relative timeout in ns (FERRY_NEVER: none) as an absolute deadline on
 * ferry_now()'s clock; FERRY_NEVER stays FERRY_NEVER, a negative timeout
 * is now, and one that would overflow is FERRY_NEVER. */
int64_t ferry__deadline(int64_t timeout);

/* The same on the real clock (ferry__now_real()). */
int64_t ferry__deadline_real(int64_t timeout);

/* A deadline on ferry_now()'s clock as one on the real clock, keeping the
 * time left: unchanged where ferry_now() is the real clock. */
int64_t ferry__deadline_to_real(int64_t deadline);

/* A deadline on the real clock as one on ferry_now()'s clock of the
 * calling thread, keeping the time left: the other way of
 * ferry__deadline_to_real(). */
int64_t ferry__deadline_from_real(int64_t deadline);

/* Answers for the calling thread: true and *now, the virtual time of the
 * loop current on it, or false if that thread's clock is the real one. */
typedef bool (*ferry__clock_source)(int64_t *now);

/* Install the source of virtual time (once, before the first loop with a
 * virtual clock runs; it stays installed). */
void ferry__clock_set_source(ferry__clock_source src);

/* True and *now (the thread's virtual time) if ferry_now() on this thread
 * reads a virtual clock. */
bool ferry__clock_virtual(int64_t *now);

#endif /* FERRY_BASE_CLOCK_H */
