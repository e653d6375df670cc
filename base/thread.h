/* thread.h - small pthread helpers for the code that crosses threads:
 * condition variables on the monotonic clock, ferry's own threads with
 * signals blocked, and a pause for spin-waits.
 * Thread: any.  Not for src/ (loop thread only).
 */
#ifndef FERRY_BASE_THREAD_H
#define FERRY_BASE_THREAD_H

#include <pthread.h>
#include <stdint.h>

/* Initialise a condition variable on CLOCK_MONOTONIC (ferry_now()'s
 * clock).  Returns 0 or -ENOMEM. */
int ferry__cond_init(pthread_cond_t *cv);

/* Wait on `cv` (made by ferry__cond_init) until `deadline` (FERRY_NEVER:
 * forever).  Returns 0 or ETIMEDOUT (positive, as pthread does). */
int ferry__cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t deadline);

/* pthread_create() for ferry's own threads: the thread starts with every
 * signal blocked but those a fault raises, so it never takes a signal
 * meant for the process (ferry/signal.h).  Same returns. */
int ferry__thread_create_nosig(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *),
                               void *arg);

/* One pause in a spin-wait (a spinning worker, a loop waiting briefly for
 * a completion). */
static inline void ferry__cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

#endif /* FERRY_BASE_THREAD_H */
