/* stack.c - task stacks: mmap'd, guarded, cached for reuse; and the
 * stack-overflow reporter.
 * Loop thread only (the SIGSEGV handler runs on the faulting thread).
 *
 * Guards, best first: MADV_GUARD_INSTALL (Linux 6.13+: no extra mapping,
 * so a million tasks fit in vm.max_map_count), an mprotect'd page (two
 * mappings per stack: used for at most FERRY__MPROTECT_BUDGET live stacks),
 * else no guard page and a canary word checked whenever the task switches
 * out.
 */
#include "loop_only.h"

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "loop_int.h"
#include "sanitize.h"

#ifndef MADV_GUARD_INSTALL
#define MADV_GUARD_INSTALL 102
#endif

/* Live mprotect-guarded stacks allowed per loop (2 mappings each). */
#define FERRY__MPROTECT_BUDGET 16384

/* The page size, read once at load time: spawn needs it on every call and
 * sysconf() costs about 50 instructions. */
static size_t page_size = 4096;

__attribute__((constructor)) static void page_size_init(void)
{
    long p = sysconf(_SC_PAGESIZE);

    if (p > 0)
        page_size = (size_t)p;
}

size_t ferry__page_size(void)
{
    return page_size;
}

static int guard_mode_probe(ferry_loop *loop, void *base, size_t pg)
{
    if (loop->guard_mode != FERRY__GUARD_MPROTECT &&
        madvise(base, pg, MADV_GUARD_INSTALL) == 0) {
        loop->guard_mode = FERRY__GUARD_MADV;
        return FERRY__GUARD_MADV;
    }
    loop->guard_mode = FERRY__GUARD_MPROTECT;
    if (loop->mprotect_live < FERRY__MPROTECT_BUDGET &&
        mprotect(base, pg, PROT_NONE) == 0) {
        loop->mprotect_live++;
        return FERRY__GUARD_MPROTECT;
    }
    return FERRY__GUARD_NONE;
}

int ferry__stack_get(ferry_loop *loop, size_t size, struct ferry__stack **out)
{
    size_t pg = ferry__page_size();
    size_t map = (size + pg - 1) / pg * pg + pg;   /* + the guard page */
    struct ferry__link *l;
    struct ferry__stack *s;
    void *base;
    uint8_t guard;

    if (map == loop->stack_size && (l = ferry__list_pop_front(&loop->stack_free))) {
        loop->stack_nfree--;
        s = ferry__container_of(l, struct ferry__stack, free_link);
        ferry__san_unpoison(s->base, s->size);
        *out = s;
        return 0;
    }
    if (ferry__fault_point("stack"))
        return -ENOMEM;
    base = mmap(NULL, map, PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (base == MAP_FAILED)
        return -ENOMEM;
    if (loop->guard_forced_none)
        guard = FERRY__GUARD_NONE;
    else if (loop->guard_mode == FERRY__GUARD_MADV &&
        madvise(base, pg, MADV_GUARD_INSTALL) == 0)
        guard = FERRY__GUARD_MADV;
    else
        guard = (uint8_t)guard_mode_probe(loop, base, pg);
    /* The header sits at the top of the mapping, inside the task struct. */
    s = (struct ferry__stack *)(void *)((char *)base + map -
                                        ((sizeof(ferry_task) + 63) & ~(size_t)63));
    s->base = base;
    s->size = map;
    s->guard = guard;
    ferry__link_init(&s->free_link);
    s->vg_id = ferry__vg_stack_register((char *)base + pg, (char *)s);
    *out = s;
    return 0;
}

static void stack_unmap(ferry_loop *loop, struct ferry__stack *s)
{
    ferry__vg_stack_deregister(s->vg_id);
    ferry__san_unpoison(s->base, s->size);
    if (s->guard == FERRY__GUARD_MPROTECT)
        loop->mprotect_live--;
    munmap(s->base, s->size);
}

void ferry__stack_put(ferry_loop *loop, struct ferry__stack *s)
{
    if (s->size == loop->stack_size && loop->stack_nfree < loop->stack_cache &&
        !loop->closing) {
        ferry__list_push_front(&loop->stack_free, &s->free_link);
        loop->stack_nfree++;
        /* Poison all but the header: a waiter left behind in a returned
         * stack is then reported by ASan instead of read silently. */
        ferry__san_poison((char *)s->base + ferry__page_size(),
                          (size_t)((char *)s - (char *)s->base) - ferry__page_size());
        return;
    }
    stack_unmap(loop, s);
}

void ferry__stack_drain(ferry_loop *loop)
{
    struct ferry__link *l;

    while ((l = ferry__list_pop_front(&loop->stack_free))) {
        loop->stack_nfree--;
        stack_unmap(loop, ferry__container_of(l, struct ferry__stack, free_link));
    }
}

bool ferry__stack_guard_hit(const struct ferry__stack *s, const void *addr)
{
    const char *a = addr, *b = s->base;
    /* The guard page, and a margin below it for frames that skip it. */
    return a >= b - 16 * 4096 && a < b + ferry__page_size();
}

/* ---- the overflow reporter ------------------------------------------ */

static void write_str(const char *s)
{
    ssize_t r = write(STDERR_FILENO, s, strlen(s));
    (void)r;
}

static void segv_handler(int sig, siginfo_t *si, void *uc)
{
    ferry_loop *loop = ferry__loop_tls();
    ferry_task *t = loop ? loop->current : NULL;

    (void)uc;
    if (t && ferry__stack_guard_hit(&t->stk, si->si_addr)) {
        write_str("ferry: stack overflow in task '");
        write_str(t->name);
        write_str("'; raise ferry_task_opts.stack_size\n");
    }
    /* Fall back to the default action: the fault repeats and kills us. */
    signal(sig, SIG_DFL);
}

void ferry__overflow_setup(ferry_loop *loop)
{
    struct sigaction old, sa;
    stack_t ss;

    if (sigaltstack(NULL, &ss) == 0 && (ss.ss_flags & SS_DISABLE) && loop->altstack) {
        ss.ss_sp = loop->altstack;
        ss.ss_size = FERRY__ALTSTACK_SIZE;
        ss.ss_flags = 0;
        if (sigaltstack(&ss, NULL) == 0)
            loop->altstack_on = true;
    }
    if (sigaction(SIGSEGV, NULL, &old) == 0 && !(old.sa_flags & SA_SIGINFO) &&
        old.sa_handler == SIG_DFL) {
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = segv_handler;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGSEGV, &sa, NULL);
    }
}

void ferry__overflow_teardown(ferry_loop *loop)
{
    stack_t ss;

    if (loop->altstack_on && sigaltstack(NULL, &ss) == 0 && ss.ss_sp == loop->altstack) {
        memset(&ss, 0, sizeof ss);
        ss.ss_flags = SS_DISABLE;
        sigaltstack(&ss, NULL);
    }
    loop->altstack_on = false;
}
