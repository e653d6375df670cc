/* alloc.c - the one allocator of ferry, with a SQLite-style fault hook.
 *
 * Any thread: pool threads allocate too, so the counters are atomics and
 * this file lives in bridge/.  Tests arm the hook through ferry/testing.h
 * declarations in fault.h: "fail the Nth counted point from now", once
 * (transient) or from then on (persistent).  Every malloc-like call and
 * every ferry__fault_point() (stack mmap, thread creation, eventfd) counts.
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

void *ferry__malloc(size_t size)
{
    if (ferry__fault_point("malloc"))
        return NULL;
    return malloc(size ? size : 1);
}

void *ferry__calloc(size_t n, size_t size)
{
    if (ferry__fault_point("calloc"))
        return NULL;
    return calloc(n ? n : 1, size ? size : 1);
}

void *ferry__realloc(void *p, size_t size)
{
    if (ferry__fault_point("realloc"))
        return NULL;
    return realloc(p, size ? size : 1);
}

void ferry__free(void *p)
{
    free(p);
}
