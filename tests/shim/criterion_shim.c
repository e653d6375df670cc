/* criterion_shim.c - the runner behind tests/shim/criterion/criterion.h.
 *
 * main() forks one child per test (up to --jobs at a time), enforces the
 * test's timeout from the parent, reads the child's verdict from a shared
 * page and its wait status, prints one line per test and, last,
 * "N passed, N failed" (", N skipped" when some were); it exits non-zero
 * if a test failed or if none ran.  The runner itself
 * stays single-threaded, so each fork is of a one-thread process (TSan
 * supports that; it refuses to start threads after a multi-threaded fork).
 *
 * Options: --filter GLOB (matched against "suite/name", extended globs),
 * --jobs N / -jN (also CRITERION_JOBS), --list, --timeout SECONDS (the
 * default for tests without .timeout, 300 s).  Environment:
 * FERRY_TEST_TIME_MULT multiplies every timeout (slow builds: TSan,
 * valgrind); FERRY_TEST_TIMEOUT_CAP (seconds) caps the result, so that a
 * hung test in a slow build costs minutes, not tens of minutes.  Unknown
 * options are ignored with a warning.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fnmatch.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "criterion/criterion.h"

/* The verdict a test child leaves for the runner, in a MAP_SHARED page. */
struct slot {
    volatile int failed;        /* an assertion or expectation failed */
    volatile int skipped;       /* cr_skip_test() was called */
    volatile int done;          /* .fini returned: the test ran to its end */
    char skip_msg[256];         /* cr_skip_test()'s message */
};

/* A test that is running: the runner's bookkeeping. */
struct running {
    pid_t pid;                  /* 0: this entry is free */
    struct crs_test *test;
    struct slot *slot;
    double start;               /* monotonic seconds */
    double deadline;            /* monotonic seconds */
};

static struct crs_test *registered_tests;
static struct crs_suite *registered_suites;

/* In a test child: where to leave the verdict.  NULL in the runner. */
static struct slot *current_slot;

/* The runner's children, for the SIGINT/SIGTERM handler. */
static struct running *running;
static int njobs = 1;

void crs_register_test(struct crs_test *t)
{
    t->next = registered_tests;
    registered_tests = t;
}

void crs_register_suite(struct crs_suite *s)
{
    s->next = registered_suites;
    registered_suites = s;
}

static double now_sec(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Print one preformatted block on stdout (where the runner's result lines
 * go) with a single write, so that lines from several threads or test
 * processes do not interleave mid-line. */
static void emit(const char *prefix, const char *fmt, va_list ap)
{
    char buf[2048];
    int n = snprintf(buf, sizeof buf, "%s", prefix);
    if (n < 0)
        return;
    if ((size_t)n < sizeof buf && fmt)
        vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    size_t len = strlen(buf);
    if (len + 1 < sizeof buf && (len == 0 || buf[len - 1] != '\n'))
        buf[len++] = '\n';
    const char *p = buf;
    while (len > 0) {
        ssize_t w = write(STDOUT_FILENO, p, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        p += w;
        len -= (size_t)w;
    }
}

static void emitf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void emitf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    emit("", fmt, ap);
    va_end(ap);
}

static void report_failure(const char *file, unsigned line, const char *expr,
                           const char *fmt, va_list ap)
{
    char head[1024];
    /* fmt is "x" followed by the caller's format, possibly empty. */
    if (fmt && fmt[1]) {
        snprintf(head, sizeof head, "[----] %s:%u: Assertion failed: %s\n[----]   ",
                 file, line, expr);
        emit(head, fmt + 1, ap);
    } else {
        emitf("[----] %s:%u: Assertion failed: %s", file, line, expr);
    }
    if (current_slot)
        __atomic_store_n(&current_slot->failed, 1, __ATOMIC_SEQ_CST);
}

void crs_fail_abort(const char *file, unsigned line, const char *expr,
                    const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    report_failure(file, line, expr, fmt, ap);
    va_end(ap);
    /* From any thread or stack: no unwinding, no .fini, no leak check. */
    _exit(1);
}

void crs_fail_continue(const char *file, unsigned line, const char *expr,
                       const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    report_failure(file, line, expr, fmt, ap);
    va_end(ap);
}

void crs_skip(const char *fmt, ...)
{
    if (current_slot) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(current_slot->skip_msg, sizeof current_slot->skip_msg,
                  fmt + 1, ap);
        va_end(ap);
        __atomic_store_n(&current_slot->skipped, 1, __ATOMIC_SEQ_CST);
    }
    _exit(0);
}

void crs_log(int level, const char *fmt, ...)
{
    const char *prefix = level == CR_LOG_ERROR   ? "[ERR ] "
                       : level == CR_LOG_WARNING ? "[WARN] "
                                                 : "[----] ";
    va_list ap;
    va_start(ap, fmt);
    emit(prefix, fmt, ap);
    va_end(ap);
}

bool crs_str_cmp(const char *a, const char *b, const char *op)
{
    int c = strcmp(a, b);
    bool ok;
    if (strcmp(op, "==") == 0)
        ok = c == 0;
    else if (strcmp(op, "!=") == 0)
        ok = c != 0;
    else if (strcmp(op, "<") == 0)
        ok = c < 0;
    else if (strcmp(op, "<=") == 0)
        ok = c <= 0;
    else if (strcmp(op, ">") == 0)
        ok = c > 0;
    else
        ok = c >= 0;
    if (!ok)
        emitf("[----]   left:  \"%s\"\n[----]   right: \"%s\"", a, b);
    return ok;
}

/* ---- the runner ----------------------------------------------------------- */

static int cmp_tests(const void *pa, const void *pb)
{
    const struct crs_test *a = *(struct crs_test *const *)pa;
    const struct crs_test *b = *(struct crs_test *const *)pb;
    int c = strcmp(a->suite, b->suite);
    return c ? c : strcmp(a->name, b->name);
}

/* The test's options with its suite's as defaults. */
static void merge_suite_opts(struct crs_test *t)
{
    for (struct crs_suite *s = registered_suites; s; s = s->next) {
        if (strcmp(s->name, t->suite) != 0)
            continue;
        if (!t->opts.init)
            t->opts.init = s->opts.init;
        if (!t->opts.fini)
            t->opts.fini = s->opts.fini;
        if (!t->opts.signal)
            t->opts.signal = s->opts.signal;
        if (!t->opts.exit_code)
            t->opts.exit_code = s->opts.exit_code;
        if (!t->opts.timeout)
            t->opts.timeout = s->opts.timeout;
        t->opts.disabled = t->opts.disabled || s->opts.disabled;
    }
}

static void on_terminate(int sig)
{
    for (int i = 0; running && i < njobs; i++)
        if (running[i].pid > 0) {
            kill(-running[i].pid, SIGKILL);
            kill(running[i].pid, SIGKILL);
        }
    signal(sig, SIG_DFL);
    raise(sig);
}

static _Noreturn void run_child(struct crs_test *t, struct slot *slot)
{
    /* Own process group, so a timeout also kills what the test forked. */
    setpgid(0, 0);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    setvbuf(stdout, NULL, _IOLBF, 0);
    current_slot = slot;
    if (t->opts.init)
        t->opts.init();
    t->fn();
    if (t->opts.fini)
        t->opts.fini();
    __atomic_store_n(&slot->done, 1, __ATOMIC_SEQ_CST);
    /* exit(), not _exit(): LeakSanitizer, TSan's exit code, gcov and
     * valgrind's --error-exitcode all act here. */
    exit(0);
}

static int parse_jobs(const char *s)
{
    int n = atoi(s);
    return n > 0 ? n : 1;
}

static void usage(const char *argv0)
{
    printf("usage: %s [--filter GLOB] [--jobs N] [--timeout SECONDS] [--list]\n", argv0);
}

int main(int argc, char **argv)
{
    const char *filter = NULL;
    bool list = false;
    double default_timeout = 300.0;
    double mult = 1.0;
    double cap = 0.0;
    const char *env;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if ((env = getenv("CRITERION_JOBS")) && *env)
        njobs = parse_jobs(env);
    if ((env = getenv("FERRY_TEST_TIME_MULT")) && *env && atof(env) > 0)
        mult = atof(env);
    if ((env = getenv("FERRY_TEST_TIMEOUT_CAP")) && *env && atof(env) > 0)
        cap = atof(env);

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--filter") == 0 && i + 1 < argc)
            filter = argv[++i];
        else if (strncmp(a, "--filter=", 9) == 0)
            filter = a + 9;
        else if ((strcmp(a, "--jobs") == 0 || strcmp(a, "-j") == 0) && i + 1 < argc)
            njobs = parse_jobs(argv[++i]);
        else if (strncmp(a, "--jobs=", 7) == 0)
            njobs = parse_jobs(a + 7);
        else if (strncmp(a, "-j", 2) == 0 && a[2])
            njobs = parse_jobs(a + 2);
        else if (strcmp(a, "--timeout") == 0 && i + 1 < argc)
            default_timeout = atof(argv[++i]);
        else if (strncmp(a, "--timeout=", 10) == 0)
            default_timeout = atof(a + 10);
        else if (strcmp(a, "--list") == 0 || strcmp(a, "-l") == 0)
            list = true;
        else if (strcmp(a, "--verbose") == 0 || strncmp(a, "--verbose=", 10) == 0 ||
                 strcmp(a, "--ascii") == 0 || strcmp(a, "-q") == 0 ||
                 strcmp(a, "--quiet") == 0)
            ;   /* the shim's output has one verbosity */
        else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(argv[0]);
            return 0;
        } else
            fprintf(stderr, "criterion-shim: ignoring option %s\n", a);
    }

    size_t n = 0;
    for (struct crs_test *t = registered_tests; t; t = t->next)
        n++;
    struct crs_test **tests = calloc(n ? n : 1, sizeof *tests);
    if (!tests) {
        perror("calloc");
        return 2;
    }
    size_t selected = 0;
    for (struct crs_test *t = registered_tests; t; t = t->next) {
        char full[512];
        snprintf(full, sizeof full, "%s/%s", t->suite, t->name);
        if (filter && fnmatch(filter, full, FNM_EXTMATCH) != 0)
            continue;
        merge_suite_opts(t);
        tests[selected++] = t;
    }
    qsort(tests, selected, sizeof *tests, cmp_tests);

    if (list) {
        for (size_t i = 0; i < selected; i++)
            printf("%s/%s%s\n", tests[i]->suite, tests[i]->name,
                   tests[i]->opts.disabled ? " (disabled)" : "");
        free(tests);
        return 0;
    }

    struct slot *slots = mmap(NULL, sizeof(struct slot) * (size_t)njobs,
                              PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    running = calloc((size_t)njobs, sizeof *running);
    if (slots == MAP_FAILED || !running) {
        perror("criterion-shim");
        return 2;
    }
    signal(SIGINT, on_terminate);
    signal(SIGTERM, on_terminate);

    int passed = 0, failed = 0, skipped = 0, active = 0;
    size_t next = 0;
    char failures[8192] = "";
    double poll = 0.0002;

    while (next < selected || active > 0) {
        /* Start tests while there is a free job. */
        while (next < selected && active < njobs) {
            struct crs_test *t = tests[next++];
            if (t->opts.disabled) {
                printf("[SKIP] %s::%s: disabled\n", t->suite, t->name);
                skipped++;
                continue;
            }
            int j = 0;
            while (running[j].pid)
                j++;
            struct slot *slot = &slots[j];
            memset(slot, 0, sizeof *slot);
            fflush(NULL);
            pid_t pid = fork();
            if (pid < 0) {
                perror("fork");
                return 2;
            }
            if (pid == 0)
                run_child(t, slot);
            setpgid(pid, pid);  /* both sides, whichever runs first */
            double timeout = (t->opts.timeout > 0 ? t->opts.timeout : default_timeout) * mult;
            if (cap > 0 && timeout > cap)
                timeout = cap;
            running[j] = (struct running){ pid, t, slot, now_sec(), 0 };
            running[j].deadline = running[j].start + timeout;
            active++;
            poll = 0.0002;
        }
        if (active == 0)
            break;

        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid < 0 && errno != EINTR && errno != ECHILD) {
            perror("waitpid");
            return 2;
        }
        double t_now = now_sec();
        if (pid <= 0) {
            /* Nothing ended: enforce deadlines, then sleep a little. */
            for (int j = 0; j < njobs; j++) {
                struct running *r = &running[j];
                if (r->pid > 0 && t_now > r->deadline && r->deadline > 0) {
                    kill(-r->pid, SIGKILL);
                    kill(r->pid, SIGKILL);
                    r->deadline = -1;   /* marks "timed out" */
                }
            }
            struct timespec ts = { 0, (long)(poll * 1e9) };
            nanosleep(&ts, NULL);
            if (poll < 0.01)
                poll *= 2;
            continue;
        }

        int j = 0;
        while (j < njobs && running[j].pid != pid)
            j++;
        if (j == njobs)
            continue;   /* not ours (cannot happen) */
        struct running r = running[j];
        running[j].pid = 0;
        active--;
        /* Reap whatever the test left in its process group. */
        kill(-pid, SIGKILL);

        struct crs_test *t = r.test;
        const struct crs_opts *o = &t->opts;
        double secs = t_now - r.start;
        char why[512] = "";
        bool skip = false;

        if (r.deadline < 0) {
            snprintf(why, sizeof why, "Timed out");
        } else if (r.slot->failed) {
            snprintf(why, sizeof why, "assertion failed");
        } else if (r.slot->skipped) {
            skip = true;
        } else if (WIFSIGNALED(status)) {
            int sig = WTERMSIG(status);
            if (o->signal != sig)
                snprintf(why, sizeof why, "crashed: signal %d (%s)%s", sig, strsignal(sig),
                         o->signal ? ", expected another" : "");
        } else if (WIFEXITED(status)) {
            int code = WEXITSTATUS(status);
            if (o->signal)
                snprintf(why, sizeof why, "exited with status %d, expected signal %d (%s)",
                         code, o->signal, strsignal(o->signal));
            else if (code != o->exit_code)
                snprintf(why, sizeof why, "exited with status %d, expected %d%s", code,
                         o->exit_code,
                         code == 66 ? " (ThreadSanitizer report)" :
                         code == 23 ? " (LeakSanitizer report)" : "");
            else if (code == 0 && !r.slot->done)
                snprintf(why, sizeof why, "exited with status 0 before its end");
        }

        if (skip) {
            printf("[SKIP] %s::%s: %s\n", t->suite, t->name, r.slot->skip_msg);
            skipped++;
        } else if (why[0]) {
            printf("[FAIL] %s::%s: %s (%.2fs)\n", t->suite, t->name, why, secs);
            size_t len = strlen(failures);
            snprintf(failures + len, sizeof failures - len, "  %s::%s: %s\n",
                     t->suite, t->name, why);
            failed++;
        } else {
            printf("[PASS] %s::%s (%.2fs)\n", t->suite, t->name, secs);
            passed++;
        }
    }

    free(tests);
    free(running);
    running = NULL;
    munmap(slots, sizeof(struct slot) * (size_t)njobs);

    if (failed)
        printf("Failed tests:\n%s", failures);
    /* A run that tested nothing (a filter that matches nothing, every test
     * skipped) fails: it would otherwise pass while checking nothing. */
    if (selected == 0)
        printf("criterion-shim: no test matched%s%s\n", filter ? " the filter " : "",
               filter ? filter : "");
    else if (passed + failed == 0)
        printf("criterion-shim: no test ran (%d skipped)\n", skipped);
    if (skipped)
        printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    else
        printf("%d passed, %d failed\n", passed, failed);
    return failed || passed + failed == 0 ? 1 : 0;
}
