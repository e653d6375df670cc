/* alloc.c - the one allocator of ferry, with a SQLite-style fault hook and
 * a count of live allocations.
 *
 * Any thread: pool threads allocate too, so the counters are atomics.
 * Tests arm the hook through the declarations in fault.h: "fail the Nth
 * counted point from now", once (transient) or from then on (persistent).
 * Every malloc-like call and every ferry__fault_point() (stack mmap,
 * thread creation, eventfd) counts.
 *
 * The live count is what lets every test, in every build, assert that a
 * freed loop gave back everything it took; LeakSanitizer and valgrind see
 * leaks only in their own builds, and only at exit.
 *
 * Both cost an atomic read-modify-write on a counter every thread shares,
 * per allocation and per free: not a price for a program that never looks.
 * So they are off until a test process turns them on, before its first
 * allocation (ferry__alloc_count_on()); until then an allocation pays one
 * relaxed load and a branch that is always predicted.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "fault.h"

static atomic_ulong fault_count;            /* points passed since the last reset */
static atomic_ulong fault_target;           /* fail when the count reaches this; 0: never */
static atomic_bool fault_persist;           /* keep failing after the target */
static atomic_ulong fault_hits;             /* failures injected */
static const char *_Atomic fault_last_site; /* site of the last failure */
static atomic_long alloc_live;              /* allocations not yet freed */
static atomic_long alloc_resident;          /* of those, the ones kept until exit */
static atomic_bool counting;                /* set once by ferry__alloc_count_on() */

static inline bool count_on(void)
{
    return atomic_load_explicit(&counting, memory_order_relaxed);
}

void ferry__alloc_count_on(void)
{
    atomic_store(&counting, true);
}

void ferry__fault_reset(void)
{
    atomic_store(&fault_target, 0);
    atomic_store(&fault_persist, false);
    atomic_store(&fault_hits, 0);
    atomic_store(&fault_count, 0);
    atomic_store(&fault_last_site, NULL);
}

void ferry__fault_arm(unsigned long nth, bool persistent)
{
    atomic_store(&fault_persist, persistent);
    atomic_store(&fault_count, 0);
    atomic_store(&fault_hits, 0);
    atomic_store(&fault_target, nth);
}

unsigned long ferry__fault_count(void)
{
    return atomic_load(&fault_count);
}

unsigned long ferry__fault_hits(void)
{
    return atomic_load(&fault_hits);
}

const char *ferry__fault_last_site(void)
{
    return atomic_load(&fault_last_site);
}

long ferry__alloc_live(void)
{
    return atomic_load(&alloc_live) - atomic_load(&alloc_resident);
}

void ferry__alloc_resident(long n)
{
    if (count_on())
        atomic_fetch_add_explicit(&alloc_resident, n, memory_order_relaxed);
}

/* The fault hook: true if this point must fail. */
static inline bool fault_check(const char *site)
{
    unsigned long target, n;

    if (!count_on())
        return false;
    target = atomic_load_explicit(&fault_target, memory_order_relaxed);
    n = atomic_fetch_add_explicit(&fault_count, 1, memory_order_relaxed) + 1;
    if (target == 0 || n < target)
        return false;
    if (n > target && !atomic_load(&fault_persist))
        return false;
    atomic_fetch_add(&fault_hits, 1);
    atomic_store(&fault_last_site, site);
    return true;
}

bool ferry__fault_point(const char *site)
{
    return fault_check(site);
}

/* Count an allocation that succeeded.  Relaxed: the count is read by a
 * test once the threads that allocate have been joined or have handed
 * their work back to the loop, which orders it. */
static inline void *counted(void *p)
{
    if (p && count_on())
        atomic_fetch_add_explicit(&alloc_live, 1, memory_order_relaxed);
    return p;
}

void *ferry__malloc(size_t size)
{
    if (fault_check("malloc"))
        return NULL;
    return counted(malloc(size ? size : 1));
}

void *ferry__calloc(size_t n, size_t size)
{
    if (fault_check("calloc"))
        return NULL;
    return counted(calloc(n ? n : 1, size ? size : 1));
}

void *ferry__realloc(void *p, size_t size)
{
    void *q;

    if (fault_check("realloc"))
        return NULL;
    q = realloc(p, size ? size : 1);
    /* Growing an existing block moves it, it does not add one. */
    return p ? q : counted(q);
}

void ferry__free(void *p)
{
    if (p && count_on())
        atomic_fetch_sub_explicit(&alloc_live, 1, memory_order_relaxed);
    free(p);
}
