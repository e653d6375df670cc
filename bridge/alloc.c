/* alloc.c - the one allocator of ferry, with a SQLite-style fault hook and
 * a count of live allocations.
 *
 * Any thread: pool threads allocate too, so the counters are atomics and
 * this file lives in bridge/.  Tests arm the hook through the declarations
 * in fault.h: "fail the Nth counted point from now", once (transient) or
 * from then on (persistent).  Every malloc-like call and every
 * ferry__fault_point() (stack mmap, thread creation, eventfd) counts.
 *
 * The live count is what lets every test, in every build, assert that a
 * freed loop gave back everything it took; LeakSanitizer and valgrind see
 * leaks only in their own builds, and only at exit.  It costs one relaxed
 * atomic add per allocation and per free, next to the fault counter's.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "ferry_int.h"
#include "fault.h"

static atomic_ulong fault_count;     /* points passed since the last reset */
static atomic_ulong fault_target;    /* fail when the count reaches this; 0: never */
static atomic_bool  fault_persist;   /* keep failing after the target */
static atomic_ulong fault_hits;      /* failures injected */
static const char *_Atomic fault_last_site; /* site of the last failure */
static atomic_long  alloc_live;      /* allocations not yet freed */
static atomic_long  alloc_resident;  /* of those, the ones kept until exit */

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
    atomic_fetch_add_explicit(&alloc_resident, n, memory_order_relaxed);
}

bool ferry__fault_point(const char *site)
{
    unsigned long target = atomic_load_explicit(&fault_target, memory_order_relaxed);
    unsigned long n = atomic_fetch_add_explicit(&fault_count, 1, memory_order_relaxed) + 1;

    if (target == 0 || n < target)
        return false;
    if (n > target && !atomic_load(&fault_persist))
        return false;
    atomic_fetch_add(&fault_hits, 1);
    atomic_store(&fault_last_site, site);
    return true;
}

/* Count an allocation that succeeded.  Relaxed: the count is read by a
 * test once the threads that allocate have been joined or have handed
 * their work back to the loop, which orders it. */
static inline void *counted(void *p)
{
    if (p)
        atomic_fetch_add_explicit(&alloc_live, 1, memory_order_relaxed);
    return p;
}

void *ferry__malloc(size_t size)
{
    if (ferry__fault_point("malloc"))
        return NULL;
    return counted(malloc(size ? size : 1));
}

void *ferry__calloc(size_t n, size_t size)
{
    if (ferry__fault_point("calloc"))
        return NULL;
    return counted(calloc(n ? n : 1, size ? size : 1));
}

void *ferry__realloc(void *p, size_t size)
{
    void *q;

    if (ferry__fault_point("realloc"))
        return NULL;
    q = realloc(p, size ? size : 1);
    /* Growing an existing block moves it, it does not add one. */
    return p ? q : counted(q);
}

void ferry__free(void *p)
{
    if (p)
        atomic_fetch_sub_explicit(&alloc_live, 1, memory_order_relaxed);
    free(p);
}
