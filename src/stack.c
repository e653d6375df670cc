/* stack.c - task stacks: cut from slabs, guarded, cached for reuse,
 * unmapped even when munmap() fails at first; how deep a stack was used.
 * Loop thread only.
 *
 * Stacks of the loop's default size are cut from slabs: one mapping holds
 * a header page and up to FERRY__SLAB_SLOTS stacks, so a new stack costs
 * no mmap and a freed one no munmap (each munmap would split the merged
 * mapping, a costly system call).  A slot gets its guard region (FERRY__GUARD_SIZE,
 * loop_int.h) the first time it is used and keeps it for the slab's life
 * (see guard_install() for why one slot at a time).  Free stacks go to the
 * loop's list, most recent first, so the stacks reused are the ones whose
 * pages are still in memory.  Beyond `stack_cache` free stacks, memory goes back
 * in bulk and later, not in the burst of task ends that freed it (see
 * ferry__stack_trim_due()): slabs with no live stack are unmapped whole,
 * and the other free stacks above the cache give their pages back with
 * MADV_DONTNEED, adjacent ones in one call.  Stacks of other sizes get a
 * mapping of their own and are unmapped when they end.
 *
 * Guards, best first: MADV_GUARD_INSTALL (Linux 6.13+: no extra mapping,
 * so a million tasks fit in vm.max_map_count), an mprotect'd region (two
 * mappings per stack, also inside a slab: used for at most
 * FERRY__MPROTECT_BUDGET slots and stacks), else no guard and a canary
 * word checked whenever the task switches out; an overflow that faults
 * there is still recognised by the stack pointer (ferry__stack_overflowed()).
 *
 * Adjacent stack mappings merge into one, so unmapping one of them from
 * the middle splits a mapping, and at vm.max_map_count munmap() fails.  A
 * range it refuses gives its memory back at once and is kept on a list of
 * the thread (unmap_or_keep()) to be unmapped later, sorted by address so
 * that a merged run goes from its ends, which needs no split.
 */
#include "loop_only.h"

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

/* mprotect-guarded stacks and slab slots allowed per loop (2 mappings
 * each); a slot keeps its guard while its slab is mapped. */
#define FERRY__MPROTECT_BUDGET 16384

/* Address space of one slab, at most: fewer slots for large stacks. */
#define FERRY__SLAB_BYTES ((size_t)8 << 20)

/* How long free stacks above the cache may keep their pages while the
 * loop is busy. */
#define FERRY__TRIM_AFTER FERRY_MSEC(100)

_Static_assert(FERRY__SLAB_SLOTS <= 64, "slot masks are 64 bits");

/*
 * A slab: its first page holds this header (so a slab needs no allocation),
 * then `nslots` stacks of loop->stack_size bytes, slot i at
 * slots + i * stack_size.  A slot is
 *   unused     i >= ncarved: no guard yet, no memory;
 *   live       a task's stack (neither bit set);
 *   cached     in loop->stack_free: header valid, touched pages resident;
 *   cold       free, its pages given back; keeps its guard.
 */
struct ferry__slab {
    struct ferry__link link;          /* in loop->slabs */
    struct ferry__link avail_link;    /* in loop->slabs_avail while a slot is unused or cold */
    char *slots;                      /* slot 0 */
    size_t map_size;                  /* the whole mapping, header page included */
    uint64_t cached;                  /* bit i: slot i is cached */
    uint64_t cold;                    /* bit i: slot i is cold */
    uint64_t trim;                    /* trim_stacks(): cached slots turning cold */
    struct ferry__slab *trim_next;    /* trim_stacks(): next slab with `trim` bits */
    unsigned nslots;                  /* slots in the slab */
    unsigned ncarved;                 /* slots used at least once: [0, ncarved) */
    unsigned nlive;                   /* live slots */
    uint8_t guard[FERRY__SLAB_SLOTS]; /* FERRY__GUARD_* of each used slot */
};

/* The page size, read once at load time: spawn needs it on every call,
 * and sysconf() is a call into the C library each time. */
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

size_t ferry__stack_map_size(size_t usable)
{
    return (usable + page_size - 1) / page_size * page_size + FERRY__GUARD_SIZE;
}

static int guard_mode_probe(ferry_loop *loop, void *base, size_t len)
{
    if (loop->guard_mode != FERRY__GUARD_MPROTECT && madvise(base, len, MADV_GUARD_INSTALL) == 0) {
        loop->guard_mode = FERRY__GUARD_MADV;
        return FERRY__GUARD_MADV;
    }
    loop->guard_mode = FERRY__GUARD_MPROTECT;
    if (loop->mprotect_live < FERRY__MPROTECT_BUDGET && mprotect(base, len, PROT_NONE) == 0) {
        loop->mprotect_live++;
        return FERRY__GUARD_MPROTECT;
    }
    return FERRY__GUARD_NONE;
}

/*
 * Make the region at `base` a guard region; returns the FERRY__GUARD_* used.
 * A slab slot gets its region when it is first used, one madvise() per
 * slot.  Installing the regions of a whole slab with one process_madvise()
 * saves system calls, but on a virtual machine whose hypervisor shadows the
 * guest's page tables it makes the first run of every task on that slab
 * far slower once the regions are more than a few pages.
 */
static uint8_t guard_install(ferry_loop *loop, void *base)
{
    if (loop->guard_forced_none)
        return FERRY__GUARD_NONE;
    if (loop->guard_mode == FERRY__GUARD_MADV &&
        madvise(base, FERRY__GUARD_SIZE, MADV_GUARD_INSTALL) == 0)
        return FERRY__GUARD_MADV;
    return (uint8_t)guard_mode_probe(loop, base, FERRY__GUARD_SIZE);
}

/* Every stack mapping, slab or single, is made here: one fault point. */
static void *stack_map(size_t size)
{
    void *p;

    if (ferry__fault_point("stack"))
        return NULL;
    p = mmap(NULL, size, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* ---- unmapping ------------------------------------------------------- */

/* A range munmap() refused, kept to be unmapped later.  It lives in the
 * range itself, in a page that stays resident: the slab header, or the
 * task structure of a stack with a mapping of its own. */
struct kept_range {
    struct ferry__link link; /* in kept */
    char *addr;              /* the range: [addr, addr + len) */
    size_t len;
};

/* This thread's kept ranges, sorted by address after kept_retry(); they
 * outlive the loop that made them, and any loop of the thread retries
 * them. */
static __thread struct ferry__link kept __attribute__((tls_model("initial-exec")));
static __thread size_t nkept __attribute__((tls_model("initial-exec")));

/* Every stack mapping is unmapped here: one fault point, so that a test
 * can make munmap() fail as it does at vm.max_map_count. */
static bool try_unmap(char *addr, size_t len)
{
    if (ferry__fault_point("munmap"))
        return false;
    return munmap(addr, len) == 0;
}

static void drop_pages(char *from, char *to)
{
    if (to > from)
        madvise(from, (size_t)(to - from), MADV_DONTNEED);
}

/* Unmap [addr, addr + len), or, if munmap() refuses, give its memory back
 * but for the page of `rec` (writable, inside the range) and keep the range
 * there for a later try.  The guard markers and mprotect'd pages of the
 * range need no memory and stay as they are. */
static void unmap_or_keep(char *addr, size_t len, void *rec)
{
    struct kept_range *k = rec;
    char *page = (char *)((uintptr_t)rec & ~(uintptr_t)(page_size - 1));

    if (try_unmap(addr, len))
        return;
    k->addr = addr;
    k->len = len;
    drop_pages(addr, page);
    drop_pages(page + page_size, addr + len);
    ferry__list_push_back(&kept, &k->link);
    nkept++;
}

static char *kept_addr(const struct ferry__link *l)
{
    return ferry__container_of(l, struct kept_range, link)->addr;
}

/* Merge two address-sorted chains linked through `next`, NULL-ended. */
static struct ferry__link *kept_merge(struct ferry__link *a, struct ferry__link *b)
{
    struct ferry__link head, *t = &head;

    while (a && b) {
        if (kept_addr(a) < kept_addr(b)) {
            t->next = a;
            a = a->next;
        } else {
            t->next = b;
            b = b->next;
        }
        t = t->next;
    }
    t->next = a ? a : b;
    return head.next;
}

/* Sort the kept ranges by address: a bottom-up merge sort of the list, as
 * a failed drain at the limit may leave thousands of them. */
static void kept_sort(void)
{
    struct ferry__link *bins[64] = { NULL }, *l, *next, *all = NULL;
    unsigned i;

    if (nkept < 2)
        return;
    kept.prev->next = NULL;
    for (l = kept.next; l; l = next) {
        next = l->next;
        l->next = NULL;
        for (i = 0; i < 63 && bins[i]; i++) {
            l = kept_merge(bins[i], l);
            bins[i] = NULL;
        }
        bins[i] = kept_merge(bins[i], l);
    }
    for (i = 0; i < 64; i++)
        all = kept_merge(bins[i], all);
    ferry__list_init_linked(&kept);
    for (l = all; l; l = next) {
        next = l->next;
        ferry__list_insert_before(&kept, l);
    }
}

/*
 * Try every kept range again, lowest address first, then the ones left
 * highest first, for as long as that unmaps something.  munmap() fails at
 * the limit only for a range strictly inside one mapping; once the lowest
 * range of a merged run is gone the next one starts the mapping, so a run
 * goes in one pass from whichever of its ends is free.
 */
static void kept_retry(void)
{
    struct ferry__link todo, *l;
    bool up = true, progress = true;

    kept_sort();
    while (nkept && progress) {
        progress = false;
        ferry__list_move(&todo, &kept);
        while (!ferry__list_empty(&todo)) {
            struct kept_range *k;

            l = up ? todo.next : todo.prev;
            k = ferry__container_of(l, struct kept_range, link);
            ferry__list_remove(l);
            /* The record is inside the range: gone once it is unmapped. */
            if (try_unmap(k->addr, k->len)) {
                nkept--;
                progress = true;
            } else if (up) {
                ferry__list_push_back(&kept, l);
            } else {
                ferry__list_push_front(&kept, l);
            }
        }
        up = !up;
    }
}

/* The header of the stack [base, base + size) in slot `slot` of its slab
 * (0: a mapping of its own): at the top below the colour, inside the task
 * structure. */
static struct ferry__stack *stack_at(void *base, size_t size, unsigned slot)
{
    ferry_task *t = (ferry_task *)(void *)((char *)base + size - FERRY__TASK_ROOM -
                                           ferry__stack_color(size, slot));

    return &t->stk;
}

/* Fill in the header of a stack about to be handed out. */
static struct ferry__stack *stack_init(ferry_loop *loop, void *base, size_t size,
                                       struct ferry__slab *sl, unsigned slot, uint8_t guard)
{
    struct ferry__stack *s = stack_at(base, size, slot);

    if (guard == FERRY__GUARD_NONE)
        loop->canaries = true; /* switches check the canary from now on */
    s->size = size;
    s->slab = sl;
    s->slot = (uint8_t)slot;
    s->guard = guard;
    ferry__link_init(&s->free_link);
    s->vg_id =
        ferry__vg_stack_register((char *)base + FERRY__GUARD_SIZE, (char *)ferry__stack_task(s));
    return s;
}

static char *slot_base(const ferry_loop *loop, const struct ferry__slab *sl, unsigned i)
{
    return sl->slots + (size_t)i * loop->stack_size;
}

static void over_cache_check(ferry_loop *loop)
{
    if (loop->stack_nfree <= loop->stack_cache)
        loop->stack_over_since = 0;
}

/* Unmap a slab with everything in it: cached stacks leave the free list,
 * live ones (ferry_loop_free() only) are gone too.  If munmap() refuses,
 * the slab's header page keeps the range for a later try. */
static void slab_unmap(ferry_loop *loop, struct ferry__slab *sl)
{
    unsigned i;

    for (i = 0; i < sl->ncarved; i++) {
        uint64_t bit = (uint64_t)1 << i;

        if (sl->guard[i] == FERRY__GUARD_MPROTECT)
            loop->mprotect_live--;
        if (!(sl->cold & bit)) {
            struct ferry__stack *s = stack_at(slot_base(loop, sl, i), loop->stack_size, i);

            ferry__vg_stack_deregister(s->vg_id);
            if (sl->cached & bit) {
                ferry__list_remove(&s->free_link);
                loop->stack_nfree--;
            }
        }
    }
    over_cache_check(loop);
    if (sl->nlive == 0)
        loop->slabs_empty--;
    ferry__list_remove(&sl->link);
    if (ferry__link_linked(&sl->avail_link))
        ferry__list_remove(&sl->avail_link);
    ferry__san_unpoison(sl->slots, (size_t)sl->nslots * loop->stack_size);
    unmap_or_keep((char *)sl, sl->map_size, sl);
}

/* A stack of the default size from a slab with a free slot, or a new slab.
 * Out of line: spawn's common case, a cached stack, then saves no
 * registers. */
static __attribute__((noinline)) int slab_carve(ferry_loop *loop, struct ferry__stack **out)
{
    size_t size = loop->stack_size;
    struct ferry__link *l = ferry__list_first(&loop->slabs_avail);
    struct ferry__slab *sl;
    unsigned i;
    char *base;

    if (l) {
        sl = ferry__container_of(l, struct ferry__slab, avail_link);
    } else {
        size_t n = FERRY__SLAB_BYTES / size;

        if (n > FERRY__SLAB_SLOTS)
            n = FERRY__SLAB_SLOTS;
        if (n < 1)
            n = 1;
        base = stack_map(page_size + n * size);
        if (!base)
            return -ENOMEM;
        /* Fresh memory: every field starts at zero. */
        sl = (struct ferry__slab *)(void *)base;
        sl->slots = base + page_size;
        sl->map_size = page_size + n * size;
        sl->nslots = (unsigned)n;
        ferry__list_push_back(&loop->slabs, &sl->link);
        ferry__list_push_front(&loop->slabs_avail, &sl->avail_link);
        loop->slabs_empty++;
    }
    if (sl->cold) {
        i = (unsigned)__builtin_ctzll(sl->cold);
        sl->cold &= ~((uint64_t)1 << i);
    } else {
        i = sl->ncarved++;
        sl->guard[i] = guard_install(loop, slot_base(loop, sl, i));
    }
    if (!sl->cold && sl->ncarved == sl->nslots)
        ferry__list_remove(&sl->avail_link);
    if (sl->nlive++ == 0)
        loop->slabs_empty--;
    base = slot_base(loop, sl, i);
    /* A cold slot was poisoned while it was cached. */
    ferry__san_unpoison(base, size);
    *out = stack_init(loop, base, size, sl, i, sl->guard[i]);
    return 0;
}

/* A stack of another size than the default: a mapping of its own. */
static __attribute__((noinline)) int stack_single(ferry_loop *loop, size_t map,
                                                  struct ferry__stack **out)
{
    void *base = stack_map(map);

    if (!base)
        return -ENOMEM;
    *out = stack_init(loop, base, map, NULL, 0, guard_install(loop, base));
    return 0;
}

int ferry__stack_get(ferry_loop *loop, size_t size, struct ferry__stack **out)
{
    struct ferry__link *l;
    struct ferry__stack *s;
    struct ferry__slab *sl;
    size_t map;

    if (size) {
        map = ferry__stack_map_size(size);
        if (map != loop->stack_size)
            return stack_single(loop, map, out);
    }
    l = ferry__list_pop_front(&loop->stack_free);
    if (!l)
        return slab_carve(loop, out);
    s = ferry__container_of(l, struct ferry__stack, free_link);
    sl = s->slab;
    if (--loop->stack_nfree == loop->stack_cache)
        loop->stack_over_since = 0;
    sl->cached &= ~((uint64_t)1 << s->slot);
    if (sl->nlive++ == 0)
        loop->slabs_empty--;
    ferry__san_unpoison(ferry__stack_base(s), s->size);
    *out = s;
    return 0;
}

/* ferry__stack_put() of a stack with a mapping of its own.  If munmap()
 * refuses, the task structure's page keeps the range for a later try. */
static __attribute__((noinline)) void stack_unmap_single(ferry_loop *loop, struct ferry__stack *s)
{
    ferry__vg_stack_deregister(s->vg_id);
    ferry__san_unpoison(ferry__stack_base(s), s->size);
    if (s->guard == FERRY__GUARD_MPROTECT)
        loop->mprotect_live--;
    unmap_or_keep(ferry__stack_base(s), s->size, ferry__stack_task(s));
}

void ferry__stack_put(ferry_loop *loop, struct ferry__stack *s)
{
    struct ferry__slab *sl = s->slab;

    if (!sl) {
        stack_unmap_single(loop, s);
        return;
    }
    if (--sl->nlive == 0)
        loop->slabs_empty++;
    ferry__list_push_front(&loop->stack_free, &s->free_link);
    sl->cached |= (uint64_t)1 << s->slot;
    if (++loop->stack_nfree > loop->stack_cache && !loop->stack_over_since)
        loop->stack_over_since = ferry__now_real();
    /* Poison all but the task structure (the header is in it): a waiter
     * left behind in a returned stack is then reported by ASan instead of
     * read silently. */
    ferry__san_poison(ferry__stack_lo(s),
                      (size_t)((char *)ferry__stack_task(s) - ferry__stack_lo(s)));
}

/* Unmap slabs with no live stack while more stacks than the cache are
 * free: unmapping a whole slab costs far less per stack than an madvise()
 * of each of its stacks. */
static void trim_slabs(ferry_loop *loop)
{
    struct ferry__link *l, *tmp;

    ferry__list_foreach_safe(l, tmp, &loop->slabs) {
        struct ferry__slab *sl = ferry__container_of(l, struct ferry__slab, link);

        if (loop->stack_nfree <= loop->stack_cache || !loop->slabs_empty)
            break;
        if (sl->nlive == 0)
            slab_unmap(loop, sl);
    }
}

/* Give back the pages of the free stacks above the cache, least recently
 * freed first, one madvise per run of adjacent slots; a slab left with
 * nothing live or cached is unmapped instead. */
static void trim_stacks(ferry_loop *loop)
{
    struct ferry__slab *touched = NULL, *sl, *next;
    struct ferry__stack *s;
    struct ferry__link *l;

    while (loop->stack_nfree > loop->stack_cache) {
        l = loop->stack_free.prev; /* the tail: freed longest ago */
        ferry__list_remove(l);
        loop->stack_nfree--;
        s = ferry__container_of(l, struct ferry__stack, free_link);
        sl = s->slab;
        ferry__vg_stack_deregister(s->vg_id);
        sl->cached &= ~((uint64_t)1 << s->slot);
        if (!sl->trim) {
            sl->trim_next = touched;
            touched = sl;
        }
        sl->trim |= (uint64_t)1 << s->slot;
    }
    for (sl = touched; sl; sl = next) {
        uint64_t m = sl->trim;

        next = sl->trim_next;
        sl->cold |= m;
        sl->trim = 0;
        if (sl->nlive == 0 && sl->cached == 0) {
            slab_unmap(loop, sl);
            continue;
        }
        while (m) {
            unsigned a = (unsigned)__builtin_ctzll(m), b = a;

            while (b < 64 && (m >> b) & 1)
                b++;
            m &= b < 64 ? ~(((uint64_t)1 << b) - 1) : 0;
            /* From above the first slot's guard to the end of the last:
             * the guards in between stay (MADV_GUARD_INSTALL markers and
             * mprotect'd pages survive MADV_DONTNEED). */
            madvise(slot_base(loop, sl, a) + FERRY__GUARD_SIZE,
                    (size_t)(b - a) * loop->stack_size - FERRY__GUARD_SIZE, MADV_DONTNEED);
        }
        if (!ferry__link_linked(&sl->avail_link))
            ferry__list_push_back(&loop->slabs_avail, &sl->avail_link);
    }
}

/*
 * More stacks than the cache are free.  Whole slabs with nothing live go
 * back when the loop is about to wait; single stacks only once they have
 * been above the cache for FERRY__TRIM_AFTER (checked at every poll, so
 * while the loop is busy too).  Between two waves of a burst the loop
 * often waits briefly: giving back thousands of single stacks then would
 * cost milliseconds of system calls and delay the next wave.
 */
void ferry__stack_trim_due(ferry_loop *loop, bool block)
{
    bool old;

    if (loop->closing)
        return; /* ferry__stack_drain() unmaps everything soon */
    old = ferry__now_real() - loop->stack_over_since >= FERRY__TRIM_AFTER;
    if (block || old)
        trim_slabs(loop);
    if (old)
        trim_stacks(loop);
    over_cache_check(loop);
    if (nkept && (block || old))
        kept_retry();
}

void ferry__stack_drain(ferry_loop *loop)
{
    struct ferry__link *l;

    while ((l = ferry__list_first(&loop->slabs)))
        slab_unmap(loop, ferry__container_of(l, struct ferry__slab, link));
    if (nkept) {
        kept_retry();
        if (nkept)
            ferry__log(FERRY_LOG_WARN,
                       "%zu stack mapping(s) could not be unmapped yet "
                       "(vm.max_map_count reached?): retried when a loop of this thread "
                       "next trims its stacks or is freed",
                       nkept);
    }
}

/* ---- how deep a stack was used -------------------------------------- */

size_t ferry__stack_used(const ferry_task *t)
{
    unsigned char vec[256];
    char *lo = t->lo, *hi = t->hi, *p;

    /* lo is page-aligned: the guard region is whole pages. */
    for (p = lo; p < hi; p += sizeof vec * page_size) {
        size_t n = (size_t)(hi - p + (ptrdiff_t)page_size - 1) / page_size;

        if (n > sizeof vec)
            n = sizeof vec;
        if (mincore(p, n * page_size, vec) != 0)
            return 0;
        for (size_t i = 0; i < n; i++)
            if (vec[i] & 1)
                return (size_t)(hi - (p + i * page_size));
    }
    return 0;
}
