/* clock.c - ferry_now() and deadlines on its clock.
 * Thread: any.
 */
#include <time.h>

#include "clock.h"

int64_t ferry_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t ferry__deadline(int64_t timeout)
{
    int64_t now;

    if (timeout == FERRY_NEVER)
        return FERRY_NEVER;
    if (timeout < 0)
        timeout = 0;
    now = ferry_now();
    return timeout > INT64_MAX - now ? FERRY_NEVER : now + timeout;
}
