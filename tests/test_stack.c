/* test_stack.c - task stacks: the guard region and the overflow report, the
 * alternate signal stack shared by the loops of a thread, unmapping that
 * survives munmap failures, and the stack use shown by ferry_loop_dump.
 *
 * The overflow tests run the overflow in a forked child whose stderr goes
 * to a pipe, and check how the child died and what it printed.  Under ASan
 * the sanitizer owns SIGSEGV (ferry's reporter is not installed), so those
 * tests only check that the overflow did not go unnoticed there.
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "testutil.h"
#include "fault.h"
#include "loop_int.h"

#ifndef __has_feature
#define __has_feature(x) 0
#endif
#if defined(__SANITIZE_ADDRESS__) || __has_feature(address_sanitizer)
#define STACK_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__) || __has_feature(thread_sanitizer)
#define STACK_TSAN 1
#endif
#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#endif
#ifndef RUNNING_ON_VALGRIND
#define RUNNING_ON_VALGRIND 0
#endif

#define TL(name, ...) Test(stack, name, .timeout = 60., ##__VA_ARGS__)

/* ---- a child that overflows ------------------------------------------- */

struct child {
    int  status;        /* from waitpid */
    char err[4096];     /* what it wrote on stderr */
};

/* Run fn() in a forked child with stderr captured; fn does not return if
 * all goes as the test expects (the child dies), else the child exits 0. */
static void run_child(void (*fn)(void), struct child *c)
{
    int fds[2];
    size_t total = 0;
    ssize_t n;
    pid_t pid;

    memset(c, 0, sizeof *c);
    cr_assert_eq(pipe(fds), 0);
    fflush(NULL);
    pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        dup2(fds[1], STDERR_FILENO);
        close(fds[0]);
        close(fds[1]);
        ferry_set_log(NULL, NULL);
        fn();
        _exit(0);
    }
    close(fds[1]);
    while (total < sizeof c->err - 1 &&
           (n = read(fds[0], c->err + total, sizeof c->err - 1 - total)) > 0)
        total += (size_t)n;
    close(fds[0]);
    cr_assert_eq(waitpid(pid, &c->status, 0), pid);
}

static void child_say(const char *s)
{
    ssize_t r = write(STDERR_FILENO, s, strlen(s));
    (void)r;
}

/* The child died of the overflow, and the report named `task` (not
 * `other`, if given). */
static void assert_reported(const struct child *c, const char *task, const char *other)
{
    char want[128];

#ifdef STACK_ASAN
    /* ASan's own SIGSEGV handler reports and exits non-zero. */
    (void)task;
    cr_assert(WIFSIGNALED(c->status) || (WIFEXITED(c->status) && WEXITSTATUS(c->status) != 0),
              "the child survived the overflow; stderr: %s", c->err);
#else
    cr_assert(WIFSIGNALED(c->status) && WTERMSIG(c->status) == SIGSEGV,
              "the child did not die by SIGSEGV (status %#x); stderr: %s", c->status, c->err);
    snprintf(want, sizeof want, "ferry: stack overflow in task '%s'", task);
    cr_assert(strstr(c->err, want), "no report naming '%s'; stderr: %s", task, c->err);
#endif
    if (other) {
        snprintf(want, sizeof want, "'%s'", other);
        cr_assert_null(strstr(c->err, want), "'%s' was reported; stderr: %s", other, c->err);
    }
    cr_assert_null(strstr(c->err, "overwritten"), "stderr: %s", c->err);
}

static ferry_loop *child_loop(const char *guard)
{
    ferry_loop *l;

    if (guard)
        setenv("FERRY_STACK_GUARD", guard, 1);
    if (ferry_loop_new(&l, NULL)) {
        child_say("ferry-test: ferry_loop_new failed\n");
        _exit(3);
    }
    ferry_loop_set_slow_threshold(l, 0);
    return l;
}

/* ---- a frame larger than the stack ------------------------------------- */

enum { VICTIM_BYTES = 24 * 1024, BIG_FRAME = 96 * 1024, BIG_WRITES = 16 * 1024 };

/* Fills a pattern near the top of its stack, lets the others run, then
 * checks it: the live stack of the task just below the overflowing one. */
static int victim(void *arg)
{
    volatile unsigned char pat[VICTIM_BYTES];

    (void)arg;
    for (size_t i = 0; i < sizeof pat; i++)
        pat[i] = (unsigned char)(i * 7 + 1);
    ferry_yield();
    ferry_yield();
    for (size_t i = 0; i < sizeof pat; i++)
        if (pat[i] != (unsigned char)(i * 7 + 1)) {
            child_say("ferry-test: the victim's stack was overwritten\n");
            return 1;
        }
    return 0;
}

/* A 96 KiB frame in a 64 KiB stack whose first writes fill the bottom of
 * the array upwards (a read() into the start of a big buffer): the lowest
 * address of the frame is the first one written. */
static __attribute__((noinline)) int big_frame(int n)
{
    volatile char buf[BIG_FRAME];

    for (size_t i = 0; i < BIG_WRITES; i += 64)
        buf[i] = (char)n;
    return buf[n];
}

static int overflower(void *arg)
{
    (void)arg;
    return big_frame(1);
}

static const char *big_frame_guard;

static void big_frame_child(void)
{
    ferry_loop *l = child_loop(big_frame_guard);

    /* A new loop's first slab: the victim gets slot 0, the overflowing task
     * slot 1, right above it. */
    ferry_task_spawn(NULL, l, victim, NULL, &(ferry_task_opts){ .name = "victim" });
    ferry_task_spawn(NULL, l, overflower, NULL, &(ferry_task_opts){ .name = "overflower" });
    ferry_loop_run(l, FERRY_RUN_DEFAULT);
    child_say("ferry-test: the loop ended\n");
}

TL(a_frame_larger_than_the_stack_is_caught_before_the_neighbouring_stack)
{
    struct child c;

    big_frame_guard = NULL;
    run_child(big_frame_child, &c);
    assert_reported(&c, "overflower", "victim");
}

TL(a_frame_larger_than_the_stack_is_caught_with_mprotect_guards)
{
    struct child c;

    /* What kernels before 6.13 get: an mprotect'd guard region. */
    big_frame_guard = "mprotect";
    run_child(big_frame_child, &c);
    assert_reported(&c, "overflower", "victim");
}

/* ---- infinite recursion without guard pages --------------------------- */

static __attribute__((noinline)) int recurse(int n)
{
    volatile char buf[1024];

    buf[0] = (char)n;
    if (n == 0)
        return buf[0];
    return recurse(n - 1) + buf[0];
}

static int recurser(void *arg)
{
    (void)arg;
    return recurse(1 << 24);
}

static int idler(void *arg)
{
    (void)arg;
    return ferry_sleep(FERRY_SEC(30));
}

static void recursion_child(void)
{
    ferry_loop *l = child_loop("none");

    /* Below the recursing task, five live stacks of its slab: it runs
     * through them (no guard) before it faults, far below its own stack. */
    for (int i = 0; i < 5; i++)
        ferry_task_spawn(NULL, l, idler, NULL, &(ferry_task_opts){ .name = "idler" });
    ferry_task_spawn(NULL, l, recurser, NULL, &(ferry_task_opts){ .name = "recurser" });
    ferry_loop_run(l, FERRY_RUN_DEFAULT);
    child_say("ferry-test: the loop ended\n");
}

TL(infinite_recursion_without_guard_pages_is_reported)
{
    struct child c;

    run_child(recursion_child, &c);
    assert_reported(&c, "recurser", "idler");
}

/* What the handler counts as an overflow of the running task: a fault in
 * its guard region, or a fault near a stack pointer that has left the
 * stack downwards; not a fault elsewhere while the stack pointer is in the
 * stack, nor a fault far from a stack pointer that is below it (a handler
 * running on another stack). */
enum { OV_GUARD, OV_BELOW_AT_SP, OV_PUSH_BELOW_SP, OV_NULL_SP_BELOW, OV_NULL_SP_IN,
       OV_ABOVE_GUARD_SP_IN, OV_FAR_BELOW_SP_IN, OV_N };
static bool ov[OV_N];

static int classify_task(void *arg)
{
    ferry_task *t = ferry_task_current();
    const char *base = ferry__stack_base(&t->stk), *lo = t->lo, *hi = t->hi;
    const char *far = base - 256 * 1024, *in = hi - 256;

    (void)arg;
    ov[OV_GUARD] = ferry__stack_overflowed(t, base + 8, in);
    ov[OV_BELOW_AT_SP] = ferry__stack_overflowed(t, far, far);
    ov[OV_PUSH_BELOW_SP] = ferry__stack_overflowed(t, far - 8, far);
    ov[OV_NULL_SP_BELOW] = ferry__stack_overflowed(t, (const void *)16, far);
    ov[OV_NULL_SP_IN] = ferry__stack_overflowed(t, (const void *)16, in);
    ov[OV_ABOVE_GUARD_SP_IN] = ferry__stack_overflowed(t, lo + 64, in);
    ov[OV_FAR_BELOW_SP_IN] = ferry__stack_overflowed(t, far, in);
    return 0;
}

TL(overflow_is_told_from_other_faults, .init = tu_loop_setup, .fini = tu_loop_teardown)
{
    cr_assert_eq(tu_run(classify_task, NULL), 0);
    cr_assert(ov[OV_GUARD], "a fault in the guard region");
    cr_assert(ov[OV_BELOW_AT_SP], "a fault at a stack pointer below the stack");
    cr_assert(ov[OV_PUSH_BELOW_SP], "a push below a stack pointer below the stack");
    cr_assert_not(ov[OV_NULL_SP_BELOW], "a NULL dereference, stack pointer elsewhere");
    cr_assert_not(ov[OV_NULL_SP_IN], "a NULL dereference in the task");
    cr_assert_not(ov[OV_ABOVE_GUARD_SP_IN], "a fault in the usable stack");
    cr_assert_not(ov[OV_FAR_BELOW_SP_IN], "a fault below the stack, stack pointer in it");
}

/* ---- the alternate signal stack of a thread with several loops -------- */

static void two_loops_child(void)
{
    ferry_loop *a = child_loop(NULL), *b = child_loop(NULL);

    /* `a` made the thread's alternate signal stack; `b` relies on it. */
    ferry_loop_free(a);
    ferry_task_spawn(NULL, b, recurser, NULL, &(ferry_task_opts){ .name = "recurser" });
    ferry_loop_run(b, FERRY_RUN_DEFAULT);
    child_say("ferry-test: the loop ended\n");
}

TL(overflow_is_reported_after_another_loop_of_the_thread_was_freed)
{
    struct child c;

    run_child(two_loops_child, &c);
    assert_reported(&c, "recurser", NULL);
}

/* ---- the stack used, in the dump -------------------------------------- */

enum { DEEP_BYTES = 40 * 1024 };

static ferry_event dump_go;

static __attribute__((noinline)) int touch_deep(void)
{
    volatile char buf[DEEP_BYTES];

    for (size_t i = 0; i < sizeof buf; i += 512)
        buf[i] = 1;
    return ferry_event_wait(&dump_go) + buf[0] - 1;
}

static int deep_task(void *arg)
{
    (void)arg;
    return touch_deep();
}

static int shallow_task(void *arg)
{
    (void)arg;
    return ferry_event_wait(&dump_go);
}

static char *dump_text;
static size_t dump_len;

static int dump_main(void *arg)
{
    ferry_loop *l = arg;
    ferry_task *d, *s;
    FILE *f;
    int rc = 0;

    if (ferry_task_spawn(&d, l, deep_task, NULL, &(ferry_task_opts){ .name = "deep" }) ||
        ferry_task_spawn(&s, l, shallow_task, NULL, &(ferry_task_opts){ .name = "shallow" }))
        return -1;
    ferry_yield();          /* both wait now */
    f = open_memstream(&dump_text, &dump_len);
    if (!f || ferry_loop_dump(l, f) != 3)
        rc = -1;
    if (f)
        fclose(f);
    ferry_event_set(&dump_go);
    if (ferry_task_join(d, NULL) || ferry_task_join(s, NULL))
        rc = -1;
    return rc;
}

/* The KiB figure after "used" on the dump line of task `name`, or -1. */
static long dump_used_kib(const char *text, const char *name)
{
    char key[64];
    const char *line, *used;

    snprintf(key, sizeof key, "'%s'", name);
    line = strstr(text, key);
    if (!line)
        return -1;
    used = strstr(line, "used ");
    if (!used || (strchr(line, '\n') && used > strchr(line, '\n')))
        return -1;
    return strtol(used + 5, NULL, 10);
}

TL(dump_shows_how_deep_each_task_used_its_stack)
{
    ferry_loop *l;
    ferry_task *m;
    long deep, shallow;
    int st = -1;

    /* A new loop: fresh stacks, no page touched by an earlier task. */
    cr_assert_eq(ferry_loop_new(&l, NULL), 0);
    ferry_loop_set_slow_threshold(l, 0);
    cr_assert_eq(ferry_task_spawn(&m, l, dump_main, l, &(ferry_task_opts){ .name = "main" }), 0);
    while (ferry_task_try_join(m, &st) == -EAGAIN)
        ferry_loop_run(l, FERRY_RUN_DEFAULT);
    ferry_loop_free(l);
    cr_assert_eq(st, 0);
    cr_assert_not_null(dump_text);
    deep = dump_used_kib(dump_text, "deep");
    shallow = dump_used_kib(dump_text, "shallow");
    cr_assert_geq(deep, DEEP_BYTES / 1024, "dump:\n%s", dump_text);
    cr_assert_geq(shallow, 1, "dump:\n%s", dump_text);
    cr_assert_leq(shallow, 8, "dump:\n%s", dump_text);
    free(dump_text);
    cr_assert_eq(tu_leaks(), 0);
}

/* ferry__stack_used() itself: a whole number of pages, at least as deep as
 * the deepest byte touched, and a fresh stack that was barely used shows
 * a page or two. */
static size_t used_deep, used_shallow, used_size;

static int used_deep_task(void *arg)
{
    volatile char buf[DEEP_BYTES];

    (void)arg;
    for (size_t i = 0; i < sizeof buf; i += 512)
        buf[i] = 1;
    used_deep = ferry__stack_used(ferry_task_current());
    return buf[0] - 1;
}

static int used_shallow_task(void *arg)
{
    ferry_task *self = ferry_task_current();

    (void)arg;
    used_shallow = ferry__stack_used(self);
    used_size = (size_t)((char *)self->hi - (char *)self->lo);
    return 0;
}

TL(stack_used_is_the_deepest_resident_page)
{
    ferry_loop *l;
    ferry_task *t;
    int st = -1;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);

    cr_assert_eq(ferry_loop_new(&l, NULL), 0);
    /* Sizes other than the loop's: a fresh mapping each. */
    cr_assert_eq(ferry_task_spawn(&t, l, used_deep_task, NULL,
                                  &(ferry_task_opts){ .stack_size = 96 * 1024 }), 0);
    while (ferry_task_try_join(t, &st) == -EAGAIN)
        ferry_loop_run(l, FERRY_RUN_DEFAULT);
    cr_assert_eq(st, 0);
    cr_assert_eq(ferry_task_spawn(&t, l, used_shallow_task, NULL,
                                  &(ferry_task_opts){ .stack_size = 80 * 1024 }), 0);
    while (ferry_task_try_join(t, &st) == -EAGAIN)
        ferry_loop_run(l, FERRY_RUN_DEFAULT);
    ferry_loop_free(l);
    cr_assert_geq(used_deep, (size_t)DEEP_BYTES);
    cr_assert_leq(used_deep, (size_t)DEEP_BYTES + 4 * pg, "used %zu", used_deep);
    cr_assert_gt(used_shallow, 0);
    cr_assert_leq(used_shallow, 2 * pg, "used %zu", used_shallow);
    cr_assert_lt(used_shallow, used_size);
    cr_assert_eq(tu_leaks(), 0);
}

/* ---- the alternate signal stack, handed on ---------------------------- */

TL(freeing_the_loop_whose_altstack_is_installed_hands_it_to_another)
{
    ferry_loop *a, *b, *c;
    stack_t before, ss[3];
    void *bmem, *cmem;

    /* Sanitizer runtimes install one of their own: set it aside. */
    cr_assert_eq(sigaltstack(NULL, &before), 0);
    if (!(before.ss_flags & SS_DISABLE)) {
        stack_t off = { .ss_flags = SS_DISABLE };

        cr_assert_eq(sigaltstack(&off, NULL), 0);
    }
    cr_assert_eq(ferry_loop_new(&a, NULL), 0);
    cr_assert_eq(ferry_loop_new(&b, NULL), 0);
    cr_assert_eq(ferry_loop_new(&c, NULL), 0);
    bmem = b->altstack;
    cmem = c->altstack;
    ferry_loop_free(a);
    cr_assert_eq(sigaltstack(NULL, &ss[0]), 0);
    ferry_loop_free(c);
    cr_assert_eq(sigaltstack(NULL, &ss[1]), 0);
    ferry_loop_free(b);
    cr_assert_eq(sigaltstack(NULL, &ss[2]), 0);
    if (!(before.ss_flags & SS_DISABLE))
        sigaltstack(&before, NULL);
    cr_assert_not(ss[0].ss_flags & SS_DISABLE, "no altstack once the first loop was freed");
    cr_assert(ss[0].ss_sp == bmem || ss[0].ss_sp == cmem);
    cr_assert_not(ss[1].ss_flags & SS_DISABLE, "no altstack while `b` lives");
    cr_assert_eq(ss[1].ss_sp, bmem);
    cr_assert(ss[2].ss_flags & SS_DISABLE, "the last loop out left its altstack installed");
    cr_assert_eq(tu_leaks(), 0);
}

/* ---- unmapping that munmap() refused ---------------------------------- */

static bool page_mapped(const void *p)
{
    unsigned char v;
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);

    return mincore((void *)((uintptr_t)p & ~(pg - 1)), 1, &v) == 0 || errno != ENOMEM;
}

enum { UNMAP_N = 140 };        /* three slabs with the main task */
static const void *unmap_pages[2 * UNMAP_N + 4];   /* main, the N, the single */
static int unmap_npages;
static const char *unmap_site;
static unsigned long unmap_hits;

static void note_stack(ferry_task *t)
{
    unmap_pages[unmap_npages++] = ferry__stack_base(&t->stk) + FERRY__GUARD_SIZE;
    unmap_pages[unmap_npages++] = t;
}

static int unmap_child(void *arg)
{
    (void)arg;
    note_stack(ferry_task_current());
    return ferry_yield();
}

static int unmap_main(void *arg)
{
    ferry_task *t[UNMAP_N], *single;
    int rc = 0;

    (void)arg;
    note_stack(ferry_task_current());
    for (int i = 0; i < UNMAP_N; i++)
        if (ferry_task_spawn(&t[i], NULL, unmap_child, NULL, NULL))
            return -1;
    if (ferry_task_spawn(&single, NULL, unmap_child, NULL,
                         &(ferry_task_opts){ .stack_size = 2 * FERRY_STACK_DEFAULT }))
        return -1;
    ferry_yield();
    ferry_yield();
    /* The join gives the single stack back: its munmap fails. */
    ferry__fault_arm(1, false);
    if (ferry_task_join(single, NULL))
        rc = -1;
    unmap_site = ferry__fault_last_site();
    unmap_hits = ferry__fault_hits();
    ferry__fault_reset();
    for (int i = 0; i < UNMAP_N; i++)
        if (ferry_task_join(t[i], NULL))
            rc = -1;
    return rc;
}

TL(refused_munmaps_are_retried_until_nothing_stays_mapped)
{
    /* The first, second and third munmap of the loop's end fail once
     * each: a slab whichever place it has among the three. */
    for (unsigned long nth = 1; nth <= 3; nth++) {
        ferry_loop *l;
        ferry_task *m;
        const char *site;
        unsigned long hits;
        int st = -1, mapped = 0;

        unmap_npages = 0;
        unmap_site = NULL;
        cr_assert_eq(ferry_loop_new(&l, NULL), 0);
        ferry_loop_set_slow_threshold(l, 0);
        cr_assert_eq(ferry_task_spawn(&m, l, unmap_main, NULL, NULL), 0);
        while (ferry_task_try_join(m, &st) == -EAGAIN)
            ferry_loop_run(l, FERRY_RUN_DEFAULT);
        cr_assert_eq(st, 0);
        cr_assert_str_eq(unmap_site ? unmap_site : "(none)", "munmap");
        cr_assert_eq(unmap_hits, 1);
        cr_assert_eq(unmap_npages, 2 * UNMAP_N + 4);
        ferry__fault_arm(nth, false);
        ferry_loop_free(l);
        site = ferry__fault_last_site();
        hits = ferry__fault_hits();
        ferry__fault_reset();
        cr_assert_str_eq(site ? site : "(none)", "munmap", "point %lu", nth);
        cr_assert_eq(hits, 1);
        for (int i = 0; i < unmap_npages; i++)
            mapped += page_mapped(unmap_pages[i]);
        cr_assert_eq(mapped, 0, "munmap %lu failed: %d of %d stack pages still mapped after "
                     "ferry_loop_free()", nth, mapped, unmap_npages);
    }
    cr_assert_eq(tu_leaks(), 0);
}

/*
 * The real thing: the process at vm.max_map_count (its own mappings, the
 * system-wide setting is left alone).  Slabs merged into one mapping; one
 * in the middle, whose tasks have all ended, is trimmed while the loop
 * waits: unmapping it would split the mapping, and munmap() fails.  It must
 * still be gone once the loop is freed, also at the limit.
 */
static long read_long(const char *path)
{
    FILE *f = fopen(path, "r");
    long v = -1;

    if (f) {
        if (fscanf(f, "%ld", &v) != 1)
            v = -1;
        fclose(f);
    }
    return v;
}

static long map_count(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    long n = 0;
    int c;

    if (!f)
        return -1;
    while ((c = getc(f)) != EOF)
        n += c == '\n';
    fclose(f);
    return n;
}

/* The start and end of the mapping (line of /proc/self/maps) holding p. */
static bool mapping_of(const void *p, uintptr_t *start, uintptr_t *end)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    bool found = false;

    while (f && !found && fgets(line, sizeof line, f)) {
        unsigned long a, b;

        if (sscanf(line, "%lx-%lx", &a, &b) == 2 && (uintptr_t)p >= a && (uintptr_t)p < b) {
            *start = a;
            *end = b;
            found = true;
        }
    }
    if (f)
        fclose(f);
    return found;
}

enum { FILL_SINGLES = 64 };
static struct {
    char  *region;               /* split by mprotect into many mappings */
    size_t len;
    void  *single[FILL_SINGLES]; /* single pages mapped after it */
    int    nsingle;
} fill;

/* Use up the process's mappings: a PROT_NONE region cut into pieces, then
 * single pages of alternating protection (so that they do not merge) until
 * mmap() is refused. */
static void fill_map_count(void)
{
    long pg = sysconf(_SC_PAGESIZE), need = read_long("/proc/sys/vm/max_map_count") - map_count();

    fill.len = (size_t)(2 * need + 8) * (size_t)pg;
    fill.region = mmap(NULL, fill.len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (fill.region == MAP_FAILED) {
        fill.region = NULL;
        return;
    }
    for (size_t off = (size_t)pg; off + 2 * (size_t)pg <= fill.len; off += 2 * (size_t)pg)
        if (mprotect(fill.region + off, (size_t)pg, PROT_READ) != 0)
            break;
    for (fill.nsingle = 0; fill.nsingle < FILL_SINGLES; fill.nsingle++) {
        void *p = mmap(NULL, (size_t)pg, fill.nsingle % 2 ? PROT_READ : PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            break;
        fill.single[fill.nsingle] = p;
    }
}

static void fill_release(void)
{
    for (int i = 0; i < fill.nsingle; i++)
        munmap(fill.single[i], (size_t)sysconf(_SC_PAGESIZE));
    fill.nsingle = 0;
    if (fill.region)
        munmap(fill.region, fill.len);
    fill.region = NULL;
}

/* Six slabs: a thread stack that was freed may have left a hole of a
 * slab's size, so the first slab is not always next to the second. */
enum { LIMIT_SLABS = 6, LIMIT_N = LIMIT_SLABS * 64 };
static ferry_event limit_mid_go, limit_rest_go;
static const struct ferry__slab *limit_mid;
static struct {
    bool merged;                   /* the chosen slab has slabs on both sides in its mapping */
    bool full;                     /* the process reached its mapping limit */
    bool kept;                     /* the trimmed slab was still mapped at the limit */
    bool dropped;                  /* ... with its stacks' memory given back */
    const void *slab[LIMIT_SLABS + 1]; /* a page of each slab */
    int nslab;
    const void *mid_top;           /* a page of a stack of the chosen slab */
} lim;

static int limit_child(void *arg)
{
    ferry_task *self = ferry_task_current();

    (void)arg;
    return ferry_event_wait(self->stk.slab == limit_mid ? &limit_mid_go : &limit_rest_go);
}

/* A slab with two others of the loop in its mapping, one below and one
 * above: unmapping it alone splits the mapping. */
static ferry_task *limit_pick(ferry_task **t)
{
    ferry_task *rep[LIMIT_SLABS + 1];
    int n = 0;

    for (int i = 0; i < LIMIT_N; i++)
        if (n == 0 || t[i]->stk.slab != rep[n - 1]->stk.slab)
            rep[n++] = t[i];
    for (int i = 0; i < n; i++)
        lim.slab[i] = rep[i];
    lim.nslab = n;
    for (int i = 0; i < n; i++) {
        uintptr_t s, e, a = (uintptr_t)rep[i]->stk.slab;
        bool below = false, above = false;

        if (!mapping_of(rep[i], &s, &e))
            continue;
        for (int k = 0; k < n; k++) {
            uintptr_t b = (uintptr_t)rep[k]->stk.slab;

            below |= b < a && b >= s;
            above |= b > a && b < e;
        }
        if (below && above)
            return rep[i];
    }
    return NULL;
}

static int limit_main(void *arg)
{
    ferry_task *t[LIMIT_N], *mid;
    int rc = 0;

    (void)arg;
    for (int i = 0; i < LIMIT_N; i++)
        if (ferry_task_spawn(&t[i], NULL, limit_child, NULL, NULL))
            return -1;
    mid = limit_pick(t);
    lim.merged = mid != NULL;
    if (!mid)
        mid = t[100];
    limit_mid = mid->stk.slab;
    lim.mid_top = (const char *)mid - 1;
    ferry_yield();                       /* every child waits */
    ferry_yield();
    fill_map_count();
    lim.full = fill.region && mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) ==
                              MAP_FAILED;
    ferry_event_set(&limit_mid_go);      /* the chosen slab's tasks end */
    for (int i = 0; i < LIMIT_N; i++)
        if (t[i]->stk.slab == limit_mid && ferry_task_join(t[i], NULL) == 0)
            t[i] = NULL;
    ferry_sleep(FERRY_MSEC(20));         /* the loop waits: the slab is trimmed */
    lim.kept = page_mapped(lim.mid_top);
    {
        unsigned char v = 1;
        uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);

        lim.dropped = lim.kept &&
                      mincore((void *)((uintptr_t)lim.mid_top & ~(pg - 1)), 1, &v) == 0 && !(v & 1);
    }
    ferry_event_set(&limit_rest_go);
    for (int i = 0; i < LIMIT_N; i++)
        if (t[i] && ferry_task_join(t[i], NULL))
            rc = -1;
    return rc;
}

TL(at_the_mapping_limit_a_trimmed_slab_is_unmapped_by_the_end)
{
#if defined(STACK_ASAN) || defined(STACK_TSAN)
    cr_skip_test("the sanitizer's runtime needs new mappings at any time");
#else
    ferry_loop *l;
    ferry_task *m;
    int st = -1, still = 0;

    if (RUNNING_ON_VALGRIND)
        cr_skip_test("valgrind manages the address space itself");
    cr_assert_gt(read_long("/proc/sys/vm/max_map_count"), 0);
    /* A free stack above the cache of one: slabs with nothing live are
     * unmapped as soon as the loop waits. */
    cr_assert_eq(ferry_loop_new(&l, &(ferry_loop_opts){ .stack_cache = 1 }), 0);
    ferry_loop_set_slow_threshold(l, 0);
    cr_assert_eq(ferry_task_spawn(&m, l, limit_main, NULL, NULL), 0);
    while (ferry_task_try_join(m, &st) == -EAGAIN)
        ferry_loop_run(l, FERRY_RUN_DEFAULT);
    ferry_loop_free(l);                  /* still at the limit */
    for (int i = 0; i < lim.nslab; i++)
        still += page_mapped(lim.slab[i]);
    still += page_mapped(lim.mid_top);
    fill_release();
    cr_assert_eq(st, 0);
    cr_assert(lim.merged, "no slab of the %d has others on both sides in its mapping", lim.nslab);
    cr_assert(lim.full, "the process did not reach its mapping limit");
    cr_assert(lim.kept, "munmap() of the middle slab did not fail at the limit");
    cr_assert_eq(still, 0, "%d of %d pages of the loop's slabs still mapped after "
                 "ferry_loop_free()", still, lim.nslab + 1);
    cr_assert(lim.dropped, "the kept slab's stacks held their memory");
#endif
}
