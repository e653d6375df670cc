/* threads.c - one-time process setup for crossing threads, and the small
 * pthread helpers the rest of bridge/ shares.
 * Any thread.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include <event2/thread.h>

#include "bridge_int.h"

static pthread_once_t threads_once = PTHREAD_ONCE_INIT;

static void threads_setup(void)
{
    /* libevent's own locks: needed for event_active() and for any libevent
     * call made on a base from another thread. */
    evthread_use_pthreads();
    /* A task that forks must not go on as a task in the child. */
    if (pthread_atfork(NULL, NULL, ferry__fork_child) != 0)
        ferry__log(FERRY_LOG_ERROR, "pthread_atfork failed: a task that forks keeps "
                   "running as a task in the child");
}

void ferry__threads_init(void)
{
    pthread_once(&threads_once, threads_setup);
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

int ferry__cond_init(pthread_cond_t *cv)
{
    pthread_condattr_t a;
    int rc;

    if (pthread_condattr_init(&a))
        return -ENOMEM;
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    rc = pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
    return rc ? -ENOMEM : 0;
}

int ferry__cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t deadline)
{
    struct timespec ts;

    if (deadline == FERRY_NEVER)
        return pthread_cond_wait(cv, mu);
    ts.tv_sec = (time_t)(deadline / 1000000000);
    ts.tv_nsec = (long)(deadline % 1000000000);
    return pthread_cond_timedwait(cv, mu, &ts);
}

unsigned ferry__env_unsigned(const char *name, unsigned dflt)
{
    const char *s = getenv(name);
    char *end;
    unsigned long v;

    if (!s || !*s)
        return dflt;
    v = strtoul(s, &end, 10);
    if (*end || v == 0 || v > 4096)
        return dflt;
    return (unsigned)v;
}
