/* sanitize.h - what the switch tells ASan, TSan and valgrind.
 * Loop thread only.  Every helper compiles to nothing in a plain build.
 */
#ifndef FERRY_SANITIZE_H
#define FERRY_SANITIZE_H

#include <stddef.h>

#ifndef __has_feature
#define __has_feature(x) 0
#endif

#if defined(__SANITIZE_ADDRESS__) || __has_feature(address_sanitizer)
#define FERRY_ASAN_ON 1
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if defined(__SANITIZE_THREAD__) || __has_feature(thread_sanitizer)
#define FERRY_TSAN_ON 1
#include <sanitizer/tsan_interface.h>
#endif

#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#define FERRY_VALGRIND_ON 1
#include <valgrind/valgrind.h>
#endif
#endif

static inline void ferry__san_poison(void *p, size_t n)
{
#ifdef FERRY_ASAN_ON
    ASAN_POISON_MEMORY_REGION(p, n);
#else
    (void)p;
    (void)n;
#endif
}

static inline void ferry__san_unpoison(void *p, size_t n)
{
#ifdef FERRY_ASAN_ON
    ASAN_UNPOISON_MEMORY_REGION(p, n);
#else
    (void)p;
    (void)n;
#endif
}

static inline unsigned ferry__vg_stack_register(void *lo, void *hi)
{
#ifdef FERRY_VALGRIND_ON
    return VALGRIND_STACK_REGISTER(lo, hi);
#else
    (void)lo;
    (void)hi;
    return 0;
#endif
}

static inline void ferry__vg_stack_deregister(unsigned id)
{
#ifdef FERRY_VALGRIND_ON
    VALGRIND_STACK_DEREGISTER(id);
#else
    (void)id;
#endif
}

#endif /* FERRY_SANITIZE_H */
