/* selftest.c - checks the test runners against the behaviour the ferry
 * tests rely on.  It compiles against real Criterion and against the shim;
 * check.sh runs it and compares each test's outcome with its suite name:
 * suite "pass" must pass, "fail" must fail, "skip" must be skipped.
 * Suites "shimonly" and "sanitizer" hold cases where Criterion is known to
 * get it wrong and that only the shim is held to: an assertion failing in
 * .fini (Criterion has decided the verdict by then), a leak reported at
 * exit, a data race under TSan.  The "teardown" tests break the rules of
 * ferry's shared teardown (tests/testutil.c: a task, a callback, a timer
 * or a post left behind, an allocation not given back) and must fail
 * under both.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SELFTEST_TSAN 1
#endif
#if __has_feature(address_sanitizer)
#define SELFTEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define SELFTEST_TSAN 1
#endif
#if defined(__SANITIZE_ADDRESS__)
#define SELFTEST_ASAN 1
#endif

static int fixture_state;

static void setup(void)
{
    fixture_state = 42;
}

static void teardown(void)
{
    fixture_state = 0;
}

static void failing_teardown(void)
{
    cr_assert_eq(fixture_state, 7, "teardown sees %d", fixture_state);
}

TestSuite(suitewide, .init = setup);

Test(pass, plain)
{
    cr_assert(1);
    cr_assert(1 + 1 == 2, "with a message %d", 3);
    cr_expect(1);
    cr_assert_not(0);
    cr_expect_not(0, "msg");
}

Test(pass, comparisons)
{
    int a = 1, b = 2;
    const char *s = "abc";
    void *nul = NULL;
    cr_assert_eq(a, 1);
    cr_assert_neq(a, b, "a=%d b=%d", a, b);
    cr_assert_lt(a, b);
    cr_assert_leq(a, 1);
    cr_assert_gt(b, a);
    cr_assert_geq(b, 2);
    cr_expect_eq(a, 1);
    cr_expect_neq(a, b);
    cr_expect_lt(a, b);
    cr_expect_leq(a, b);
    cr_expect_gt(b, a);
    cr_expect_geq(b, a);
    cr_assert_null(nul);
    cr_expect_null(nul);
    cr_assert_not_null(s);
    cr_expect_not_null(s, "s");
    cr_assert_str_eq(s, "abc");
    cr_expect_str_eq(s, "abc");
    cr_assert_str_neq(s, "abd");
    cr_expect_str_neq(s, "abd");
    cr_assert_float_eq(0.1 + 0.2, 0.3, 1e-9);
    cr_log_info("info %d", 1);
    cr_log_warn("warn");
}

Test(pass, fixtures, .init = setup, .fini = teardown)
{
    cr_assert_eq(fixture_state, 42);
}

Test(suitewide, init_from_suite)
{
    cr_assert_eq(fixture_state, 42);
}

Test(pass, expected_signal, .signal = SIGABRT)
{
    abort();
}

Test(pass, expected_exit_code, .exit_code = 3)
{
    exit(3);
}

Test(pass, within_timeout, .timeout = 2.)
{
    usleep(10000);
}

static void *thread_ok(void *arg)
{
    int *p = arg;
    *p = 5;
    return NULL;
}

Test(pass, threads)
{
    pthread_t th;
    int v = 0;
    cr_assert_eq(pthread_create(&th, NULL, thread_ok, &v), 0);
    pthread_join(th, NULL);
    cr_assert_eq(v, 5);
}

Test(fail, assert)
{
    cr_assert(0, "expected failure %s", "here");
}

Test(fail, assert_eq)
{
    int a = 1;
    cr_assert_eq(a, 2);
}

Test(fail, expect_continues)
{
    cr_expect_eq(1, 2, "first");
    cr_expect_str_eq("a", "b");
}

Test(fail, assert_fail)
{
    cr_assert_fail("unconditional");
}

Test(fail, timeout, .timeout = 0.5)
{
    for (;;)
        pause();
}

Test(fail, crash)
{
    raise(SIGSEGV);
}

Test(fail, wrong_signal, .signal = SIGSEGV)
{
    abort();
}

Test(fail, missing_signal, .signal = SIGABRT)
{
}

Test(fail, exit_code)
{
    exit(4);
}

Test(fail, init_fails, .init = failing_teardown)
{
}

static void *thread_assert(void *arg)
{
    cr_assert(0, "failed on another thread");
    return arg;
}

Test(fail, assert_on_thread)
{
    pthread_t th;
    pthread_create(&th, NULL, thread_assert, NULL);
    pthread_join(th, NULL);
}

Test(skip, skipped)
{
    cr_skip_test("not today");
    cr_assert_fail("not reached");
}

Test(skip, disabled, .disabled = true)
{
    cr_assert_fail("not run");
}

/* Criterion ignores an assertion that fails in .fini. */
Test(shimonly, fini_fails, .init = setup, .fini = failing_teardown)
{
}

/* ---- ferry's shared teardown (tests/testutil.c) -------------------------
 * Each test below breaks one rule of the teardown and must fail under
 * both runners, although the teardown's checks cannot run from .fini
 * under Criterion. */

static void nop_cb(void *arg)
{
    (void)arg;
}

static int sleeper(void *arg)
{
    (void)arg;
    return ferry_sleep(FERRY_SEC(3600));
}

Test(pass, teardown_of_a_clean_test, .init = tu_loop_setup, .fini = tu_loop_teardown)
{
    ferry_chan *ch;
    ferry_task *t;

    cr_assert_eq(ferry_chan_new(&ch, 4), 0);
    ferry_chan_free(ch);
    cr_assert_eq(ferry_call_soon(tu_loop, nop_cb, NULL), 0);
    cr_assert_eq(ferry_task_spawn(&t, tu_loop, sleeper, NULL, NULL), 0);
    ferry_loop_run(tu_loop, FERRY_RUN_ONCE);
    cr_assert_eq(tu_cancel_join(t), -ECANCELED);
    cr_assert_eq(tu_leaks(), 0);
}

/* A channel made and never freed: one allocation of ferry's leaks. */
Test(fail, teardown_finds_a_leaked_allocation, .init = tu_loop_setup, .fini = tu_loop_teardown)
{
    ferry_chan *ch;

    cr_assert_eq(ferry_chan_new(&ch, 4), 0);
}

Test(fail, teardown_finds_a_live_task, .init = tu_loop_setup, .fini = tu_loop_teardown)
{
    cr_assert_eq(ferry_task_spawn(NULL, tu_loop, sleeper, NULL, NULL), 0);
    ferry_loop_run(tu_loop, FERRY_RUN_ONCE);
}

Test(fail, teardown_finds_a_callback_not_run, .init = tu_loop_setup, .fini = tu_loop_teardown)
{
    cr_assert_eq(ferry_call_soon(tu_loop, nop_cb, NULL), 0);
}

Test(fail, teardown_finds_a_timer_not_fired, .init = tu_loop_setup, .fini = tu_loop_teardown)
{
    cr_assert_eq(ferry_call_later(tu_loop, FERRY_SEC(3600), nop_cb, NULL, NULL), 0);
}

/* A post from another thread that the loop has not run yet. */
static void *post_from_a_thread(void *arg)
{
    (void)arg;
    return (void *)(intptr_t)ferry_loop_call_soon_threadsafe(tu_loop, nop_cb, NULL);
}

Test(fail, teardown_finds_a_post_from_a_thread_not_run, .init = tu_loop_setup,
     .fini = tu_loop_teardown)
{
    void *rc;

    pthread_join(tu_start_thread(post_from_a_thread, NULL), &rc);
    cr_assert_null(rc);
}

/* tu_alloc_setup(): a test that makes its own loops is held to give back
 * every allocation too. */
Test(pass, alloc_teardown_of_a_clean_test, .init = tu_alloc_setup, .fini = tu_loop_teardown)
{
    ferry_loop *l;

    cr_assert_eq(ferry_loop_new(&l, NULL), 0);
    cr_assert_eq(tu_run_on(l, tu_ret42, NULL), 42);
    ferry_loop_free(l);
}

Test(fail, alloc_teardown_finds_a_loop_not_freed, .init = tu_alloc_setup,
     .fini = tu_loop_teardown)
{
    ferry_loop *l;

    cr_assert_eq(ferry_loop_new(&l, NULL), 0);
    cr_assert_eq(tu_run_on(l, tu_ret42, NULL), 42);
}

/* tu_leaks() counts ferry's allocations in every build, not only under
 * LeakSanitizer. */
Test(fail, tu_leaks_counts_ferry_allocations, .init = tu_loop_setup, .fini = tu_loop_teardown)
{
    ferry_chan *ch;

    cr_assert_eq(ferry_chan_new(&ch, 4), 0);
    cr_expect_eq(tu_leaks(), 0);
    ferry_chan_free(ch);
}

/*
 * Leak on purpose, so that a leak checker must find it.  LeakSanitizer and
 * valgrind scan memory and registers conservatively: a stale copy of the
 * only pointer to a block (in a register, or a dead slot of the stack) makes
 * the block look reachable, and the check then passes (rarely, and more
 * often on a loaded machine).  So the blocks are made by a function of its own
 * that keeps no pointer to them (each is stored complemented, which no scan
 * takes for a pointer), there are many of them (a stale copy can hide one
 * block, not all), and the stack that function used is overwritten before
 * the test ends.
 */
#define LEAK_BLOCKS 64
static uintptr_t leaked_hidden[LEAK_BLOCKS];

static __attribute__((noinline, unused)) void leak_blocks(void)
{
    for (int i = 0; i < LEAK_BLOCKS; i++) {
        char *p = malloc(100 + (size_t)i);
        if (p)
            memset(p, 1, 100 + (size_t)i);
        leaked_hidden[i] = ~(uintptr_t)p;
    }
}

static __attribute__((noinline, unused)) void scrub_stack(void)
{
    volatile char pad[16384];

    for (size_t i = 0; i < sizeof pad; i++)
        pad[i] = 0;
}

#ifdef SELFTEST_ASAN
/* Criterion counts this as passing (it ignores the exit status);
 * LeakSanitizer's makes the shim fail it. */
Test(sanitizer, leak)
{
    leak_blocks();
    scrub_stack();
}

Test(sanitizer, use_after_free)
{
    char *volatile p = malloc(8);
    free(p);
    p[0] = 1;
    cr_assert_eq(p[0], 1);
}
#endif

#ifdef SELFTEST_TSAN
static int racy;

static void *race_thread(void *arg)
{
    racy++;
    return arg;
}

/* A positive control: TSan must turn a data race into a failure. */
Test(sanitizer, data_race)
{
    pthread_t th;
    pthread_create(&th, NULL, race_thread, NULL);
    racy++;
    pthread_join(th, NULL);
}
#endif

/* Positive controls for the valgrind leg: skipped unless running under
 * valgrind, where --error-exitcode must turn them into failures. */
#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#define SELFTEST_VALGRIND 1
#endif
#endif

#ifdef SELFTEST_VALGRIND
Test(valgrind, leak)
{
    if (!RUNNING_ON_VALGRIND)
        cr_skip_test("not under valgrind");
    leak_blocks();
    scrub_stack();
}

Test(valgrind, invalid_read)
{
    if (!RUNNING_ON_VALGRIND)
        cr_skip_test("not under valgrind");
    char *volatile p = malloc(8);
    free(p);
    cr_assert_eq(p[0], p[0]);
}
#endif
