/* thread.c - condition variables on the monotonic clock, and ferry's own
 * threads started with signals blocked.
 * Thread: any.
 */
#include <errno.h>
#include <signal.h>
#include <time.h>

#include "ferry/loop.h" /* FERRY_NEVER */
#include "thread.h"

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

int ferry__thread_create_nosig(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *),
                               void *arg)
{
    static const int faults[] = { SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS };
    sigset_t set, old;
    int rc;

    /* The new thread inherits the mask in force here.  A fault's signal
     * stays open: blocked, the kernel would kill the process on it without
     * running any handler (a sanitizer's, a crash reporter's). */
    sigfillset(&set);
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++)
        sigdelset(&set, faults[i]);
    pthread_sigmask(SIG_BLOCK, &set, &old);
    rc = pthread_create(th, attr, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}
