/* clock.c - ferry_now(), the real clock, and deadlines on either.
 * Thread: any.
 *
 * A loop made with a virtual clock (ferry_loop_opts.virtual_clock) keeps
 * its own time, which moves only when the loop jumps it (src/timer.c).
 * base/ cannot see a loop, so src/ installs a source here, once, when the
 * first such loop is made: the function answers for the calling thread,
 * with the virtual time of the loop current on it, or says that the
 * thread has none.  Until then ferry_now() is the real clock at the cost
 * of one load more.
 */
#include <stdatomic.h>
#include <stddef.h>
#include <time.h>

#include "clock.h"

static _Atomic(ferry__clock_source) clock_source;

int64_t ferry__now_real(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void ferry__clock_set_source(ferry__clock_source src)
{
    atomic_store_explicit(&clock_source, src, memory_order_relaxed);
}

bool ferry__clock_virtual(int64_t *now)
{
    ferry__clock_source src = atomic_load_explicit(&clock_source, memory_order_relaxed);

    return src && src(now);
}

int64_t ferry_now(void)
{
    int64_t now;

    if (ferry__clock_virtual(&now))
        return now;
    return ferry__now_real();
}

/* now + timeout, FERRY_NEVER on overflow. */
static int64_t deadline_from(int64_t now, int64_t timeout)
{
    if (timeout == FERRY_NEVER)
        return FERRY_NEVER;
    if (timeout < 0)
        timeout = 0;
    return timeout > INT64_MAX - now ? FERRY_NEVER : now + timeout;
}

int64_t ferry__deadline(int64_t timeout)
{
    return deadline_from(timeout == FERRY_NEVER ? 0 : ferry_now(), timeout);
}

int64_t ferry__deadline_real(int64_t timeout)
{
    return deadline_from(timeout == FERRY_NEVER ? 0 : ferry__now_real(), timeout);
}

int64_t ferry__deadline_to_real(int64_t deadline)
{
    int64_t vnow;

    if (deadline == FERRY_NEVER || !ferry__clock_virtual(&vnow))
        return deadline;
    return ferry__deadline_real(deadline > vnow ? deadline - vnow : 0);
}

int64_t ferry__deadline_from_real(int64_t deadline)
{
    int64_t now;

    if (deadline == FERRY_NEVER || !ferry__clock_virtual(&now))
        return deadline;
    now = ferry__now_real();
    return ferry__deadline(deadline > now ? deadline - now : 0);
}
