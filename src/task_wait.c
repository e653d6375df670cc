/* task_wait.c - sleeping, the wait of a task that is not a primitive.
 * The waits for a file descriptor and for a signal belong to the I/O layer
 * (io/ioreg.c, io/signal.c).
 * Loop thread only.
 */
#include "loop_only.h"

#include "loop_int.h"

int ferry_sleep_until(int64_t deadline)
{
    struct ferry__waiter w;
    ferry_task *self;
    int rc = ferry__enter_task_inline(&self);

    if (rc)
        return rc;
    if (deadline <= ferry_now())
        return ferry_yield();
    ferry__waiter_init(&w, self, "sleep", NULL);
    rc = ferry__wait(NULL, &w, deadline);
    return rc == 1 ? 0 : rc;
}

int ferry_sleep(int64_t duration)
{
    int64_t now = ferry_now();

    if (duration > INT64_MAX - now)
        return ferry_sleep_until(FERRY_NEVER - 1);
    return ferry_sleep_until(now + duration);
}
