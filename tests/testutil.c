/* testutil.c - fixtures shared by ferry's test programs. */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <criterion/criterion.h>
#include <event2/event.h>

#include "testutil.h"
#include "clock.h"
#include "fault.h"
#include "ferry_int.h"

#ifndef __has_feature
#define __has_feature(x) 0
#endif
#if defined(__SANITIZE_ADDRESS__) || __has_feature(address_sanitizer)
#include <sanitizer/lsan_interface.h>
#define TU_LSAN 1
#endif

ferry_loop *tu_loop;

/* Every test program counts ferry's live allocations and may fail them,
 * from before its first one. */
__attribute__((constructor)) static void count_allocations(void)
{
    ferry__alloc_count_on();
}

/* Live allocations before tu_loop_setup() made the loop, and just after:
 * what the test must come back to once the loop is freed, and what the
 * loop itself holds while it lives. */
static long live_before_loop;
static long live_with_loop;
/* The loop live_with_loop was measured with. */
static ferry_loop *baseline_loop;
/* tu_loop_setup() ran and the end-of-test checks have not yet. */
static bool fixture_open;

void tu_loop_setup(void)
{
    ferry__fault_reset();
    live_before_loop = ferry__alloc_live();
    cr_assert_eq(ferry_loop_new(&tu_loop, NULL), 0, "ferry_loop_new failed");
    live_with_loop = ferry__alloc_live();
    baseline_loop = tu_loop;
    fixture_open = true;
    /* The detector (on by default without NDEBUG) turns off the direct
     * task-to-task handover: test the production path in every build;
     * the detector's own tests turn it on. */
    ferry_loop_set_slow_threshold(tu_loop, 0);
}

void tu_alloc_setup(void)
{
    ferry__fault_reset();
    tu_loop = NULL;
    baseline_loop = NULL;
    live_before_loop = ferry__alloc_live();
    live_with_loop = live_before_loop;
    fixture_open = true;
}

void tu_vclock_setup(void)
{
    tu_alloc_setup();
    cr_assert_eq(ferry_loop_new(&tu_loop, &(ferry_loop_opts){ .virtual_clock = true }), 0);
    ferry_loop_set_slow_threshold(tu_loop, 0);
}

long tu_alloc_settle(long want)
{
    int64_t until = ferry__now_real() + tu_ms(1000);
    long d;

    while ((d = ferry__alloc_live() - want) != 0 && ferry__now_real() < until)
        usleep(1000);
    return d;
}

/*
 * The end of a test that used tu_loop: the loop must hold no task, no
 * callback, no timer and no post from a thread (libuv's tests close every
 * loop and check it); then it is freed and every allocation the test made
 * through ferry must have been given back.  Expectations, not assertions:
 * they never jump, so this may run from .fini after a failed body too.
 */
static void test_end(void)
{
    ferry_loop *loop = tu_loop;
    struct ferry__leftovers lo;
    long d;

    fixture_open = false;
    tu_loop = NULL;
    ferry__fault_reset();
    if (loop) {
        int rc = ferry__loop_leftovers(loop, &lo);
        cr_expect_eq(rc, 0, "tu_loop cannot be inspected (freed, or not this thread's)");
        if (rc == 0)
            cr_expect(lo.tasks == 0 && lo.callbacks == 0 && lo.timers == 0 && !lo.posts,
                      "the test left on tu_loop: %zu live tasks, %zu callbacks, %zu timers%s",
                      lo.tasks, lo.callbacks, lo.timers, lo.posts ? ", posts from threads" : "");
        ferry_loop_free(loop);
    }
    d = tu_alloc_settle(live_before_loop);
    cr_expect_eq(d, 0, "%ld ferry allocations %s %s", d < 0 ? -d : d,
                 d > 0 ? "leaked" : "freed twice or more than made",
                 loop ? "after the loop was freed" : "by the end of the test");
}

void tu_loop_teardown(void)
{
    if (fixture_open || tu_loop)
        test_end();
    ferry__fault_reset();
}

#ifndef CRITERION_SHIM
/*
 * Criterion decides a test's verdict when its body returns: an assertion
 * that fails in .fini is ignored (the test passes), so the end-of-test
 * checks would check nothing there.  Criterion runs each body through
 * criterion_internal_test_main(), called from the test program: this
 * definition takes its place and runs the body, then the checks, still
 * inside the test's main phase where a failed assertion counts.  The shim
 * runner (tests/shim) fails a test whose .fini fails, so there the checks
 * stay in tu_loop_teardown().
 */
static void (*test_body)(void);

static void body_then_end(void)
{
    test_body();
    if (fixture_open || tu_loop)
        test_end();
}

void criterion_internal_test_main(void (*fn)(void))
{
    static void (*real)(void (*)(void));

    if (!real) {
        *(void **)&real = dlsym(RTLD_NEXT, "criterion_internal_test_main");
        if (!real) {
            fprintf(stderr, "testutil: Criterion's criterion_internal_test_main not found\n");
            abort();
        }
    }
    test_body = fn;
    real(body_then_end);
}
#endif

int tu_run_on(ferry_loop *loop, ferry_task_fn fn, void *arg)
{
    ferry_task *t;
    int status = -12345, rc;

    rc = ferry_task_spawn(&t, loop, fn, arg, &(ferry_task_opts){ .name = "main" });
    if (rc)
        return rc;
    while (ferry_task_try_join(t, &status) == -EAGAIN)
        ferry_loop_run(loop, FERRY_RUN_DEFAULT);
    return status;
}

int tu_run(ferry_task_fn fn, void *arg)
{
    return tu_run_on(tu_loop, fn, arg);
}

double tu_time_mult(void)
{
    const char *m = getenv("FERRY_TEST_TIME_MULT");
    double mult = m ? atof(m) : 1.0;

    return mult < 1.0 ? 1.0 : mult;
}

int64_t tu_ms(int64_t ms)
{
    return (int64_t)((double)ms * tu_time_mult() * 1e6);
}

double tu_stress_scale(void)
{
    const char *s = getenv("FERRY_STRESS_SCALE");
    double v = s ? atof(s) : 1.0;

    return v > 0 && v <= 1 ? v : 1.0;
}

long tu_scaled(long n)
{
    long v = (long)((double)n * tu_stress_scale());

    return v > 0 ? v : 1;
}

int tu_leaks(void)
{
    long d = 0;
    int n;

    /* A tu_loop made by another fixture holds what it holds: counted at
     * the end of the test only. */
    if (!tu_loop || tu_loop == baseline_loop)
        d = tu_alloc_settle(tu_loop ? live_with_loop : live_before_loop);
    n = (int)(d < 0 ? -d : d);
    if (n)
        fprintf(stderr, "tu_leaks: %ld ferry allocations live beyond what %s\n", d,
                tu_loop ? "tu_loop held when it was made" : "the test started with");
#ifdef TU_LSAN
    n += __lsan_do_recoverable_leak_check();
#endif
    return n;
}

/* libevent's allocations, failed through the fault hook but not counted
 * as ferry's: libevent keeps some for the whole process (the locks made
 * when threads are enabled), and its own leaks are LeakSanitizer's and
 * valgrind's to find. */
static void (*ev_failed)(const char *site);
static bool ev_exempt;

void tu_libevent_fault_exempt(bool on)
{
    ev_exempt = on;
}

static void *ev_malloc(size_t n)
{
    if (!ev_exempt && ferry__fault_point("libevent malloc")) {
        if (ev_failed)
            ev_failed("libevent malloc");
        return NULL;
    }
    return malloc(n);
}

static void *ev_realloc(void *p, size_t n)
{
    if (!ev_exempt && ferry__fault_point("libevent realloc")) {
        if (ev_failed)
            ev_failed("libevent realloc");
        return NULL;
    }
    return realloc(p, n);
}

static void ev_free(void *p)
{
    free(p);
}

void tu_libevent_fault_hook(void (*failed)(const char *site))
{
    ev_failed = failed;
    event_set_mem_functions(ev_malloc, ev_realloc, ev_free);
}

int tu_cancel_join(ferry_task *t)
{
    int status = -12345;

    ferry_task_cancel(t);
    while (ferry_task_try_join(t, &status) == -EAGAIN)
        ferry_loop_run(tu_loop, FERRY_RUN_DEFAULT);
    return status;
}

pthread_t tu_start_thread(void *(*fn)(void *), void *arg)
{
    pthread_t t;

    cr_assert_eq(pthread_create(&t, NULL, fn, arg), 0);
    return t;
}

void *tu_on_thread(void *(*fn)(void *), void *arg)
{
    void *res = NULL;

    pthread_join(tu_start_thread(fn, arg), &res);
    return res;
}

int tu_threads_now(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    int n = -1;

    if (!f)
        return -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Threads: %d", &n) == 1)
            break;
    fclose(f);
    return n;
}

int tu_threads_wait(int want)
{
    int64_t until = ferry__now_real() + tu_ms(5000);
    int n;

    while ((n = tu_threads_now()) != want && ferry__now_real() < until)
        usleep(1000);
    return n;
}

static void *own_tid(void *arg)
{
    *(pid_t *)arg = gettid();
    return NULL;
}

int tu_threads_baseline(void)
{
    int64_t until = ferry__now_real() + tu_ms(5000);
    char path[64];
    pid_t tid = 0;

    pthread_join(tu_start_thread(own_tid, &tid), NULL);
    snprintf(path, sizeof path, "/proc/self/task/%d", (int)tid);
    while (access(path, F_OK) == 0 && ferry__now_real() < until)
        usleep(1000);
    cr_assert_neq(access(path, F_OK), 0, "a joined thread was never reaped");
    return tu_threads_now();
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

ferry_task *tu_spawn_opts(ferry_task_fn fn, void *arg, const ferry_task_opts *opts)
{
    ferry_task *t = NULL;

    if (ferry_task_spawn(&t, NULL, fn, arg, opts) != 0)
        return NULL;
    return t;
}

ferry_task *tu_spawn(ferry_task_fn fn, void *arg)
{
    return tu_spawn_opts(fn, arg, NULL);
}

int tu_join(ferry_task *t)
{
    int st = -99999;

    if (t == NULL || ferry_task_join(t, &st) != 0)
        return -99998;
    return st;
}

void tu_settle(void)
{
    for (int i = 0; i < 8; i++)
        ferry_yield();
}

void tu_assert_einval_and_false(const int *rc, int nrc, const bool *pred, int npred)
{
    for (int i = 0; i < nrc; i++)
        cr_assert_eq(rc[i], -EINVAL, "call %d returned %d", i, rc[i]);
    for (int i = 0; i < npred; i++)
        cr_assert_not(pred[i], "predicate %d", i);
}

int tu_ret0(void *arg)
{
    (void)arg;
    return 0;
}

int tu_ret42(void *arg)
{
    (void)arg;
    return 42;
}

int tu_echo_lines(void *arg)
{
    ferry_stream *s = arg;
    char line[128];
    size_t n;
    int rc;

    for (;;) {
        rc = ferry_stream_read_until(s, "\n", 1, line, sizeof line, &n);
        if (rc)
            break;
        rc = ferry_stream_write(s, line, n, NULL);
        if (rc)
            break;
    }
    ferry_stream_close(s);
    return rc;
}

/* tu_assert_eperm_elsewhere(): the calls, and what they returned. */
static int (*elsewhere_calls)(int *rc);
static int elsewhere_rc[32], elsewhere_n;

static void *elsewhere_thread(void *arg)
{
    (void)arg;
    elsewhere_n = elsewhere_calls(elsewhere_rc);
    return NULL;
}

static int elsewhere_task(void *arg)
{
    (void)arg;
    elsewhere_n = elsewhere_calls(elsewhere_rc);
    return 0;
}

static void elsewhere_check(const char *where)
{
    cr_assert_gt(elsewhere_n, 0, "the calls from %s did not run", where);
    cr_assert_leq(elsewhere_n, 32);
    for (int i = 0; i < elsewhere_n; i++)
        cr_assert_eq(elsewhere_rc[i], -EPERM, "call %d from %s returned %d", i, where,
                     elsewhere_rc[i]);
}

void tu_assert_eperm_elsewhere(int (*calls)(int *rc))
{
    ferry_loop *other;

    elsewhere_calls = calls;
    elsewhere_n = 0;
    tu_on_thread(elsewhere_thread, NULL);
    elsewhere_check("a thread");
    elsewhere_n = 0;
    cr_assert_eq(ferry_loop_new(&other, NULL), 0);
    cr_assert_eq(ferry_task_spawn(NULL, other, elsewhere_task, NULL, NULL), 0);
    cr_assert_eq(ferry_loop_run(other, FERRY_RUN_DEFAULT), 0);
    ferry_loop_free(other);
    elsewhere_check("another loop");
}

void tu_order_add(struct tu_order *o, int who)
{
    if (o->n < (int)(sizeof o->who / sizeof o->who[0]))
        o->who[o->n++] = who;
}

/* ---- log capture ---------------------------------------------------------- */

/* The log may be written by pool threads as well as the loop's. */
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char log_text[8192];
static int log_lines;
static int log_levels[8];

static void capture_log(int level, const char *msg, void *ctx)
{
    size_t len;

    (void)ctx;
    pthread_mutex_lock(&log_mu);
    if (log_lines < (int)(sizeof log_levels / sizeof log_levels[0]))
        log_levels[log_lines] = level;
    log_lines++;
    len = strlen(log_text);
    snprintf(log_text + len, sizeof log_text - len, "%s\n", msg);
    pthread_mutex_unlock(&log_mu);
}

void tu_log_capture_start(void)
{
    pthread_mutex_lock(&log_mu);
    log_text[0] = '\0';
    log_lines = 0;
    pthread_mutex_unlock(&log_mu);
    ferry_set_log(capture_log, NULL);
}

void tu_log_capture_stop(void)
{
    ferry_set_log(NULL, NULL);
}

int tu_log_lines(void)
{
    int n;

    pthread_mutex_lock(&log_mu);
    n = log_lines;
    pthread_mutex_unlock(&log_mu);
    return n;
}

const char *tu_log_text(void)
{
    return log_text;
}

int tu_log_level(int i)
{
    int level = -1;

    pthread_mutex_lock(&log_mu);
    if (i >= 0 && i < log_lines && i < (int)(sizeof log_levels / sizeof log_levels[0]))
        level = log_levels[i];
    pthread_mutex_unlock(&log_mu);
    return level;
}

/* ---- stderr capture -------------------------------------------------------- */

static FILE *cap_file;
static int cap_saved = -1;

void tu_stderr_capture(void)
{
    fflush(stderr);
    cap_file = tmpfile();
    cr_assert_not_null(cap_file);
    cap_saved = dup(STDERR_FILENO);
    cr_assert_geq(cap_saved, 0);
    dup2(fileno(cap_file), STDERR_FILENO);
}

const char *tu_stderr_release(void)
{
    static char buf[8192];
    ssize_t n;

    fflush(stderr);
    dup2(cap_saved, STDERR_FILENO);
    close(cap_saved);
    cap_saved = -1;
    n = pread(fileno(cap_file), buf, sizeof buf - 1, 0);
    buf[n > 0 ? n : 0] = '\0';
    fclose(cap_file);
    cap_file = NULL;
    return buf;
}

int tu_stderr_fd(void)
{
    return cap_file ? fileno(cap_file) : -1;
}

int tu_open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int n = 0;

    cr_assert_not_null(d);
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n - 1; /* the directory's own descriptor */
}

void tu_tcp_pair(int fds[2])
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t al = sizeof a;
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    cr_assert_geq(l, 0);
    cr_assert_eq(bind(l, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(l, 1), 0);
    cr_assert_eq(getsockname(l, (struct sockaddr *)&a, &al), 0);
    fds[0] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(fds[0], 0);
    cr_assert_eq(connect(fds[0], (struct sockaddr *)&a, sizeof a), 0);
    fds[1] = accept4(l, NULL, NULL, SOCK_CLOEXEC);
    cr_assert_geq(fds[1], 0);
    close(l);
}
