/* testutil.c - fixtures shared by ferry's test programs. */
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "testutil.h"
#include "fault.h"

#ifndef __has_feature
#define __has_feature(x) 0
#endif
#if defined(__SANITIZE_ADDRESS__) || __has_feature(address_sanitizer)
#include <sanitizer/lsan_interface.h>
#define TU_LSAN 1
#endif

ferry_loop *tu_loop;

void tu_loop_setup(void)
{
    ferry__fault_reset();
    cr_assert_eq(ferry_loop_new(&tu_loop, NULL), 0, "ferry_loop_new failed");
    /* The detector (on by default without NDEBUG) turns off the direct
     * task-to-task handover: test the production path in every build;
     * the detector's own tests turn it on. */
    ferry_loop_set_slow_threshold(tu_loop, 0);
}

void tu_loop_teardown(void)
{
    ferry__fault_reset();
    ferry_loop_free(tu_loop);
    tu_loop = NULL;
}

int tu_run(ferry_task_fn fn, void *arg)
{
    ferry_task *t;
    int status = -12345, rc;

    rc = ferry_task_spawn(&t, tu_loop, fn, arg, &(ferry_task_opts){ .name = "main" });
    if (rc)
        return rc;
    while (ferry_task_try_join(t, &status) == -EAGAIN)
        ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT);
    return status;
}

int64_t tu_ms(int64_t ms)
{
    const char *m = getenv("FERRY_TEST_TIME_MULT");
    double mult = m ? atof(m) : 1.0;
    if (mult < 1.0)
        mult = 1.0;
    return (int64_t)((double)ms * mult * 1e6);
}

int tu_leaks(void)
{
#ifdef TU_LSAN
    return __lsan_do_recoverable_leak_check();
#else
    return 0;
#endif
}

pthread_t tu_start_thread(void *(*fn)(void *), void *arg)
{
    pthread_t t;

    cr_assert_eq(pthread_create(&t, NULL, fn, arg), 0);
    return t;
}

void tu_spin_until(atomic_int *flag)
{
    while (!atomic_load(flag))
        usleep(100);
}

int tu_task_wait_flag(atomic_int *flag)
{
    while (!atomic_load(flag)) {
        int rc = ferry_sleep(FERRY_USEC(200));
        if (rc)
            return rc;
    }
    return 0;
}
