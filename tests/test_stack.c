/* test_stack.c - task stacks: the guard region and the overflow report,
 * the canary of an unguarded stack, the guard kinds and their budget, the
 * cache of free stacks and its trimming, the colouring of a slab's stacks,
 * the alternate signal stack shared by the loops of a thread, unmapping
 * that survives munmap failures, and the stack use shown by
 * ferry_loop_dump.
 *
 * The overflow tests run the overflow in a forked child whose stderr goes
 * to a pipe, and check how the child died and what it printed.  Under ASan
 * the sanitizer owns SIGSEGV (ferry's reporter is not installed), so those
 * tests only check that the overflow did not go unnoticed there.  A few
 * tests look inside (src/loop_int.h) where the public API cannot show what
 * they check: a task's canary word, the kind of guard a stack got, the
 * free stacks and slabs of a loop.
 */
#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
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

/* Tests that make their own loops, and those on tu_loop. */
#define TL(name, ...) \
    Test(stack, name, .init = tu_alloc_setup, .fini = tu_loop_teardown, .timeout = 60., ##__VA_ARGS__)
#define T(name) Test(stack, name, .init = tu_loop_setup, .fini = tu_loop_teardown, .timeout = 60.)


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

/* ---- infinite recursion ------------------------------------------------ */

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
/* The recursing task alone on a new loop, with the guard FERRY_STACK_GUARD
 * names (NULL: the default one). */
static const char *lone_guard;

static void lone_recursion_child(void)
{
    ferry_loop *l = child_loop(lone_guard);

    ferry_task_spawn(NULL, l, recurser, NULL, &(ferry_task_opts){ .name = "deep-recursion" });
    ferry_loop_run(l, FERRY_RUN_DEFAULT);
    child_say("ferry-test: the loop ended\n");
}

TL(overflow_names_the_task)
{
    struct child c;

    lone_guard = NULL;
    run_child(lone_recursion_child, &c);
    assert_reported(&c, "deep-recursion", NULL);
}

TL(overflow_names_the_task_with_mprotect_guards)
{
    struct child c;

    /* What kernels before 6.13 get: an mprotect'd guard region. */
    lone_guard = "mprotect";
    run_child(lone_recursion_child, &c);
    assert_reported(&c, "deep-recursion", NULL);
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

T(overflow_is_told_from_other_faults)
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

/* ---- the kind of guard, its budget --------------------------------------- */

static int guard_kind[2] = { -1, -1 }, canary_ok[2];

static int note_guard(void *arg)
{
    ferry_task *self = ferry_task_current();
    int i = (int)(intptr_t)arg;

    guard_kind[i] = self->stk.guard;
    for (int k = 0; k < 5; k++)
        ferry_yield();          /* the two tasks hand over to each other */
    canary_ok[i] = *(uint64_t *)self->lo == FERRY__CANARY;
    return 0;
}

TL(guard_none_puts_a_canary_that_survives_switches)
{
    ferry_loop *l;
    ferry_task *t[2];
    int st;

    cr_assert_eq(setenv("FERRY_STACK_GUARD", "none", 1), 0);
    cr_assert_eq(ferry_loop_new(&l, NULL), 0);
    unsetenv("FERRY_STACK_GUARD");
    ferry_loop_set_slow_threshold(l, 0);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(ferry_task_spawn(&t[i], l, note_guard, (void *)(intptr_t)i, NULL), 0);
    cr_assert_eq(ferry_loop_run(l, FERRY_RUN_DEFAULT), 0);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(ferry_task_try_join(t[i], &st), 0);
        cr_assert_eq(st, 0);
        cr_assert_eq(guard_kind[i], FERRY__GUARD_NONE);
        cr_assert(canary_ok[i]);
    }
    ferry_loop_free(l);
    cr_assert_eq(tu_leaks(), 0);
}

TL(guard_with_an_unknown_value_probes_as_usual)
{
    ferry_loop *l;

    cr_assert_eq(setenv("FERRY_STACK_GUARD", "bogus", 1), 0);
    cr_assert_eq(ferry_loop_new(&l, NULL), 0);
    unsetenv("FERRY_STACK_GUARD");
    cr_assert_eq(tu_run_on(l, note_guard, (void *)0), 0);
    cr_assert_neq(guard_kind[0], FERRY__GUARD_NONE);
    ferry_loop_free(l);
}

TL(mprotect_guards_stop_at_their_budget_then_stacks_get_a_canary)
{
    enum { CAP = 40000 };
    ferry_task *t, *first = NULL;
    ferry_loop *l;
    size_t guarded = 0;
    int kind = -1, first_kind, st;

#ifdef STACK_TSAN
    cr_skip_test("16,385 TSan fibers: TSan runs out of trace memory");
#endif
    if (RUNNING_ON_VALGRIND)
        cr_skip_test("32,768 mappings: more segments than valgrind tracks");
    cr_assert_eq(setenv("FERRY_STACK_GUARD", "mprotect", 1), 0);
    cr_assert_eq(ferry_loop_new(&l, NULL), 0);
    unsetenv("FERRY_STACK_GUARD");
    cr_assert_eq(ferry_task_spawn(&first, l, tu_ret42, NULL, NULL), 0);
    first_kind = first->stk.guard;
    /* Detached tasks that never run: ferry_loop_free() ends them. */
    for (int i = 0; i < CAP; i++) {
        cr_assert_eq(ferry_task_spawn(&t, l, tu_ret0, NULL, NULL), 0);
        kind = t->stk.guard;
        ferry_task_detach(t);
        if (kind != FERRY__GUARD_MPROTECT)
            break;
        guarded++;
    }
    cr_assert_eq(first_kind, FERRY__GUARD_MPROTECT);
    cr_assert_eq(kind, FERRY__GUARD_NONE, "no budget after %zu stacks", guarded);
    cr_assert_eq(l->mprotect_live, guarded + 1);
    /* An unguarded task still runs, with its canary. */
    cr_assert_eq(ferry_loop_run(l, FERRY_RUN_DEFAULT), 0);
    cr_assert_eq(ferry_task_try_join(first, &st), 0);
    cr_assert_eq(st, 42);
    ferry_loop_free(l);
    cr_assert_eq(tu_leaks(), 0);
}

/* ---- the cache of free stacks and its trimming -------------------------- */

/* Stacks beyond the cache.  A loop keeping 8 free stacks runs 200 tasks
 * (four slabs of 64 slots; the main task holds slot 0 of the first).  When
 * the loop next waits, the three slabs with nothing live are unmapped
 * whole; the first slab's free stacks above the cache give their pages
 * back once they have been above it for 100 ms, least recently freed
 * first; the slots are reused afterwards. */
enum { TRIM_N = 200, TRIM_CACHE = 8 };
static void *trim_top[TRIM_N];
static int trim_ran;
static size_t trim_nfree[4], trim_slabs[4], trim_resident[2];

static int note_top_and_yield(void *arg)
{
    ferry_task *self = ferry_task_current();

    trim_top[(intptr_t)arg] = ferry__stack_base(&self->stk) + self->stk.size - 4096;
    ferry_yield();
    trim_ran++;
    return 0;
}

static size_t count_slabs(ferry_loop *l)
{
    struct ferry__link *p;
    size_t n = 0;

    ferry__list_foreach(p, &l->slabs)
        n++;
    return n;
}

static bool page_resident(void *page)
{
    unsigned char v = 0;

    return mincore(page, 4096, &v) == 0 && (v & 1);
}

static int spawn_and_join(int n)
{
    ferry_task *t[TRIM_N];
    int rc = 0;

    for (int i = 0; i < n; i++)
        if (ferry_task_spawn(&t[i], NULL, note_top_and_yield, (void *)(intptr_t)i, NULL))
            return -1;
    for (int i = 0; i < n; i++)
        if (ferry_task_join(t[i], NULL))
            rc = -1;
    return rc;
}

static int trim_main(void *arg)
{
    ferry_loop *l = arg;

    if (spawn_and_join(TRIM_N))
        return -1;
    trim_nfree[0] = l->stack_nfree;
    trim_slabs[0] = count_slabs(l);
    /* The loop waits (long enough that it does, also under valgrind): the
     * slabs with nothing live go. */
    ferry_sleep(FERRY_MSEC(50));
    trim_nfree[1] = l->stack_nfree;
    trim_slabs[1] = count_slabs(l);
    /* The rest is above the cache for more than 100 ms at the poll before
     * the second wait. */
    ferry_sleep(FERRY_MSEC(150));
    ferry_sleep(FERRY_MSEC(1));
    trim_nfree[2] = l->stack_nfree;
    trim_slabs[2] = count_slabs(l);
    trim_resident[0] = page_resident(trim_top[0]);    /* freed first: given back */
    trim_resident[1] = page_resident(trim_top[62]);   /* freed last in the slab: kept */
    if (spawn_and_join(100))                          /* cold slots come back */
        return -1;
    trim_nfree[3] = l->stack_nfree;
    trim_slabs[3] = count_slabs(l);
    return 0;
}

TL(free_stacks_beyond_the_cache_go_back_in_whole_slabs_then_page_by_page)
{
    ferry_loop *l;

    cr_assert_eq(ferry_loop_new(&l, &(ferry_loop_opts){ .stack_cache = TRIM_CACHE }), 0);
    ferry_loop_set_slow_threshold(l, 0);
    cr_assert_eq(tu_run_on(l, trim_main, l), 0);
    cr_assert_eq(trim_ran, TRIM_N + 100);
    cr_assert_eq(trim_nfree[0], TRIM_N);
    cr_assert_eq(trim_slabs[0], 4);
    cr_assert_eq(trim_nfree[1], 63, "%zu", trim_nfree[1]);
    cr_assert_eq(trim_slabs[1], 1);
    cr_assert_eq(trim_nfree[2], TRIM_CACHE, "%zu", trim_nfree[2]);
    cr_assert_eq(trim_slabs[2], 1);
    if (!RUNNING_ON_VALGRIND) {
        cr_assert_not(trim_resident[0], "a trimmed stack kept its pages");
        cr_assert(trim_resident[1], "a cached stack lost its pages");
    }
    cr_assert_eq(trim_slabs[3], 2, "%zu", trim_slabs[3]);
    /* The 100 stacks just used are all free again; none trimmed yet. */
    cr_assert_eq(trim_nfree[3], 100, "%zu", trim_nfree[3]);
    cr_assert_eq(l->mprotect_live, 0);
    ferry_loop_free(l);
    cr_assert_eq(tu_leaks(), 0);
}

/* ---- colouring ----------------------------------------------------------- */

/* Stack colouring (loop_int.h): the task structures of one slab's slots
 * sit at different offsets within a page, one cache line apart, so that
 * their hot lines do not all share the same cache sets.  The base computed
 * back from a coloured header is still the slot's (page-aligned) base, and
 * a stack with a mapping of its own is not coloured. */
enum { COLOR_N = FERRY__STACK_COLORS - 1 };   /* slots 1..31: the main task holds slot 0 */
static uintptr_t color_off[COLOR_N];
static bool color_base_aligned[COLOR_N];
static size_t color_room[COLOR_N];
static uintptr_t color_single_off;

static int note_color(void *arg)
{
    ferry_task *self = ferry_task_current();
    intptr_t i = (intptr_t)arg;
    char *base = ferry__stack_base(&self->stk);

    if (i < 0) {
        color_single_off = ((uintptr_t)self + FERRY__TASK_ROOM) % 4096;
    } else {
        color_off[i] = (uintptr_t)self % 4096;
        color_base_aligned[i] = (uintptr_t)base % 4096 == 0 &&
                                (char *)self->lo == base + FERRY__GUARD_SIZE;
        color_room[i] = (size_t)((char *)self->hi - (char *)self->lo);
    }
    return 0;
}

static int color_main(void *arg)
{
    ferry_task *t[COLOR_N], *single;
    int rc = 0;

    (void)arg;
    for (int i = 0; i < COLOR_N; i++)
        if (ferry_task_spawn(&t[i], NULL, note_color, (void *)(intptr_t)i, NULL))
            return -1;
    if (ferry_task_spawn(&single, NULL, note_color, (void *)(intptr_t)-1,
                         &(ferry_task_opts){ .stack_size = 2 * FERRY_STACK_DEFAULT }))
        return -1;
    for (int i = 0; i < COLOR_N; i++)
        if (ferry_task_join(t[i], NULL))
            rc = -1;
    if (ferry_task_join(single, NULL))
        rc = -1;
    return rc;
}

TL(stacks_of_a_slab_are_coloured_one_cache_line_apart)
{
    ferry_loop *l;

    cr_assert_eq(ferry_loop_new(&l, NULL), 0);
    cr_assert_eq(tu_run_on(l, color_main, NULL), 0);
    for (int i = 0; i < COLOR_N; i++) {
        cr_assert(color_base_aligned[i], "slot %d: the base computed from the header is off", i + 1);
        cr_assert_eq(color_off[i] % 64, 0);
        cr_assert_geq(color_room[i], FERRY_STACK_DEFAULT - FERRY__TASK_ROOM - 64 * (COLOR_N + 1) + 64);
        for (int k = 0; k < i; k++)
            cr_assert_neq(color_off[i], color_off[k], "slots %d and %d share an offset", k + 1, i + 1);
    }
    cr_assert_eq(color_single_off, 0, "a stack of its own is coloured");
    ferry_loop_free(l);
    cr_assert_eq(tu_leaks(), 0);
}

/* ---- the canary of an unguarded stack ---------------------------------- */

/* The canary: a task that overwrote the bottom of its stack is stopped when
 * it switches out.  ferry logs and aborts; the SIGABRT handler checks the
 * line written on stderr and exits with 42 (so the coverage data is
 * written; a test process killed by a signal writes none). */
static void canary_abort_handler(int sig)
{
    char buf[1024] = { 0 };
    ssize_t n;
    int code = 43;

    (void)sig;
    n = pread(tu_stderr_fd(), buf, sizeof buf - 1, 0);
    if (n > 0 && strstr(buf, "ferry: error: stack overflow in task 'smasher' (canary overwritten)"))
        code = 42;
#ifdef STACK_ASAN
    /* LeakSanitizer at exit() would scan the main thread's stack from here,
     * the task's stack, miss the runner's allocations and report them. */
    _exit(code);
#else
    exit(code);
#endif
}

static int smash_and_sleep(void *arg)
{
    (void)arg;
    *(volatile uint64_t *)ferry_task_current()->lo = 0;   /* what a deep recursion does */
    ferry_sleep(FERRY_MSEC(1));
    return 0;
}

static int smash_and_yield(void *arg)
{
    (void)arg;
    ferry_yield();                      /* the partner has started too */
    *(volatile uint64_t *)ferry_task_current()->lo = 0;
    ferry_yield();                      /* hands over to the partner */
    return 0;
}

static int partner(void *arg)
{
    (void)arg;
    for (int i = 0; i < 10; i++)
        ferry_yield();
    return 0;
}

static void canary_run(ferry_task_fn smasher, bool with_partner)
{
    ferry_loop *l;

    cr_assert_eq(setenv("FERRY_STACK_GUARD", "none", 1), 0);
    cr_assert_eq(ferry_loop_new(&l, NULL), 0);
    ferry_loop_set_slow_threshold(l, 0);
    ferry_set_log(NULL, NULL);          /* the default: stderr */
    cr_assert_eq(ferry_task_spawn(NULL, l, smasher, NULL,
                                  &(ferry_task_opts){ .name = "smasher" }), 0);
    if (with_partner)
        cr_assert_eq(ferry_task_spawn(NULL, l, partner, NULL, NULL), 0);
    signal(SIGABRT, canary_abort_handler);
    tu_stderr_capture();
    ferry_loop_run(l, FERRY_RUN_DEFAULT);
    tu_stderr_release();
    cr_assert_fail("the overwritten canary went unnoticed");
}

TL(canary_overwritten_is_caught_when_the_task_goes_back_to_the_scheduler, .exit_code = 42)
{
    canary_run(smash_and_sleep, false);
}

TL(canary_overwritten_is_caught_when_the_task_hands_over, .exit_code = 42)
{
    canary_run(smash_and_yield, true);
}

/* ---- the overflow reporter and the application's SIGSEGV handler -------- */

/* The overflow reporter, driven by a SIGSEGV sent to this thread with a
 * chosen fault address (rt_tgsigqueueinfo) while the stack pointer is in
 * the task's stack: only an address in the running task's guard region is
 * reported.  The reporter then restores the default
 * action; a queued signal is not repeated, so the process goes on. */
static void segv_to_self(const void *addr)
{
    siginfo_t si;

    memset(&si, 0, sizeof si);
    si.si_signo = SIGSEGV;
    si.si_code = SEGV_MAPERR;
    si.si_addr = (void *)addr;
    syscall(SYS_rt_tgsigqueueinfo, getpid(), (pid_t)syscall(SYS_gettid), SIGSEGV, &si);
}

/* How many times `needle` occurs in `hay`. */
static int count_str(const char *hay, const char *needle)
{
    int n = 0;

    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p++)
        n++;
    return n;
}

/* Where segv_task says the fault was. */
enum { AT_LOW, AT_STACK, AT_GUARD };

static int segv_task(void *arg)
{
    ferry_task *self = ferry_task_current();
    const char *base = ferry__stack_base(&self->stk);

    switch ((int)(intptr_t)arg) {
    case AT_LOW:                /* far below the stack: a NULL dereference */
        segv_to_self((const void *)16);
        break;
    case AT_STACK:              /* inside the usable stack */
        segv_to_self((const char *)self->lo + 2 * ferry__page_size());
        break;
    default:                    /* the guard region */
        segv_to_self(base + 8);
        break;
    }
    return 0;
}

static bool segv_default(void)
{
    struct sigaction sa;

    sigaction(SIGSEGV, NULL, &sa);
    return !(sa.sa_flags & SA_SIGINFO) && sa.sa_handler == SIG_DFL;
}

TL(overflow_reporter_names_the_task_only_for_its_guard_page)
{
#if defined(STACK_ASAN) || defined(STACK_TSAN)
    cr_skip_test("the sanitizer owns SIGSEGV");
#else
    ferry_loop *l;
    const char *out;
    bool dfl[5];
    int k = 0;

    if (RUNNING_ON_VALGRIND)
        cr_skip_test("valgrind delivers a queued SIGSEGV its own way");
    cr_assert(segv_default());
    tu_stderr_capture();
    /* The reporter stays installed after its loop is gone: no loop. */
    cr_assert_eq(ferry_loop_new(&l, NULL), 0);
    ferry_loop_free(l);
    segv_to_self((const void *)16);
    dfl[k++] = segv_default();
    /* A loop, no task. */
    cr_assert_eq(ferry_loop_new(&l, NULL), 0);
    segv_to_self((const void *)16);
    dfl[k++] = segv_default();
    ferry_loop_free(l);
    /* A task, each place; every new loop installs the reporter again. */
    for (int at = AT_LOW; at <= AT_GUARD; at++) {
        cr_assert_eq(ferry_loop_new(&l, NULL), 0);
        cr_assert_eq(tu_run_on(l, segv_task, (void *)(intptr_t)at), 0);
        dfl[k++] = segv_default();
        ferry_loop_free(l);
    }
    out = tu_stderr_release();
    for (int i = 0; i < k; i++)
        cr_assert(dfl[i], "the reporter did not restore the default action (%d)", i);
    cr_assert(strstr(out, "ferry: stack overflow in task 'main'; raise ferry_task_opts.stack_size"),
              "stderr was: %s", out);
    cr_assert_eq(count_str(out, "stack overflow"), 1, "stderr was: %s", out);
#endif
}

static void app_segv(int sig)
{
    (void)sig;
}

TL(loop_leaves_an_application_sigsegv_handler_in_place)
{
#if defined(STACK_ASAN) || defined(STACK_TSAN)
    cr_skip_test("the sanitizer owns SIGSEGV");
#else
    struct sigaction sa;
    ferry_loop *l;

    signal(SIGSEGV, app_segv);
    cr_assert_eq(ferry_loop_new(&l, NULL), 0);
    cr_assert_eq(sigaction(SIGSEGV, NULL, &sa), 0);
    cr_assert_not(sa.sa_flags & SA_SIGINFO);
    cr_assert_eq(sa.sa_handler, app_segv);
    cr_assert_eq(tu_run_on(l, tu_ret42, NULL), 42);
    ferry_loop_free(l);
    signal(SIGSEGV, SIG_DFL);
#endif
}

/* ---- no address space left ----------------------------------------------- */

/* Address space so short that no new mapping fits, while malloc is fed
 * from a heap grown beforehand: the loop is made without its fork mark
 * (optional), and a spawn that needs a new stack mapping fails cleanly. */
static long vm_size_kib(void)
{
    char line[256];
    long kib = -1;
    FILE *f = fopen("/proc/self/status", "r");

    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmSize: %ld kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib;
}

TL(no_address_space_left_no_fork_mark_and_spawn_enomem)
{
#if defined(STACK_ASAN) || defined(STACK_TSAN)
    cr_skip_test("the sanitizer's allocator maps memory of its own");
#else
    struct rlimit old, low;
    ferry_loop *l;
    ferry_task *t = (ferry_task *)&old;
    bool no_mark = false, current = false;
    int rc_new, rc_spawn = 1, rc_after;
    void *warm;

    if (RUNNING_ON_VALGRIND)
        cr_skip_test("valgrind manages the address space itself");
    cr_assert_eq(ferry_loop_new(&l, NULL), 0);   /* one-time setup done */
    ferry_loop_free(l);
    /* Keep 8 MiB of free heap for malloc: no trimming, no mmap'd chunks. */
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 64 << 20);
    warm = malloc(8 << 20);
    cr_assert_not_null(warm);
    memset(warm, 1, 8 << 20);
    free(warm);
    cr_assert_eq(getrlimit(RLIMIT_AS, &old), 0);
    low = old;
    low.rlim_cur = (rlim_t)vm_size_kib() * 1024;
    cr_assert_eq(setrlimit(RLIMIT_AS, &low), 0);
    rc_new = ferry_loop_new(&l, NULL);
    if (rc_new == 0) {
        no_mark = l->fork_mark == NULL;
        current = ferry_loop_is_current(l);
        rc_spawn = ferry_task_spawn(&t, l, tu_ret42, NULL, NULL);
    }
    setrlimit(RLIMIT_AS, &old);
    cr_assert_eq(rc_new, 0, "loop_new without address space: %d", rc_new);
    cr_assert_eq(rc_spawn, -ENOMEM, "spawn without address space: %d", rc_spawn);
    cr_assert(no_mark, "the fork mark was mapped");
    cr_assert(current);
    cr_assert_null(t);
    /* With its address space back, the same loop spawns and runs. */
    rc_after = tu_run_on(l, tu_ret42, NULL);
    cr_assert_eq(rc_after, 42);
    ferry_loop_free(l);
#endif
}

/* ---- the alternate signal stack of the application ---------------------- */

TL(freeing_loops_leaves_an_alternate_signal_stack_they_did_not_install)
{
    static char mine[FERRY__ALTSTACK_SIZE];
    ferry_loop *a, *b;
    stack_t before, ss, set;
    void *a_stack;

    cr_assert_eq(sigaltstack(NULL, &before), 0);
    cr_assert_eq(ferry_loop_new(&a, NULL), 0);
    cr_assert_eq(sigaltstack(NULL, &ss), 0);
    cr_assert_not(ss.ss_flags & SS_DISABLE);
    if (!(before.ss_flags & SS_DISABLE))
        cr_assert_eq(ss.ss_sp, before.ss_sp, "replaced an existing altstack");
    a_stack = ss.ss_sp;
    /* A second loop on the thread finds it and keeps it. */
    cr_assert_eq(ferry_loop_new(&b, NULL), 0);
    ferry_loop_free(b);
    cr_assert_eq(sigaltstack(NULL, &ss), 0);
    cr_assert_not(ss.ss_flags & SS_DISABLE);
    cr_assert_eq(ss.ss_sp, a_stack);
    /* The application installs its own: freeing `a` leaves it. */
    set.ss_sp = mine;
    set.ss_size = sizeof mine;
    set.ss_flags = 0;
    cr_assert_eq(sigaltstack(&set, NULL), 0);
    ferry_loop_free(a);
    cr_assert_eq(sigaltstack(NULL, &ss), 0);
    cr_assert_eq(ss.ss_sp, (void *)mine);
    cr_assert_not(ss.ss_flags & SS_DISABLE);
    if (before.ss_flags & SS_DISABLE) {
        set.ss_flags = SS_DISABLE;
        sigaltstack(&set, NULL);
    } else {
        sigaltstack(&before, NULL);
    }
    cr_assert_eq(tu_leaks(), 0);
}
