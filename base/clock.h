/* clock.h - the clock every part of ferry reads: CLOCK_MONOTONIC in
 * nanoseconds (ferry_now(), public in ferry/loop.h), and deadlines on it.
 * Thread: any.
 */
#ifndef FERRY_BASE_CLOCK_H
#define FERRY_BASE_CLOCK_H

#include <stdint.h>

#include "ferry/loop.h"   /* ferry_now(), FERRY_NEVER */

/* A relative timeout in ns (FERRY_NEVER: none) as an absolute deadline on
 * ferry_now()'s clock; FERRY_NEVER stays FERRY_NEVER, a negative timeout
 * is now, and one that would overflow is FERRY_NEVER. */
int64_t ferry__deadline(int64_t timeout);

#endif /* FERRY_BASE_CLOCK_H */
