/* alloc.h - the one allocator of ferry, with its fault hook.
 *
 * Every allocation of ferry goes through these, so that a test can make
 * any one of them fail and check that the caller gets -ENOMEM and nothing
 * leaks (base/fault.h is the tests' side; docs/testing.md tells how to
 * use it).  Thread: any.
 */
#ifndef FERRY_BASE_ALLOC_H
#define FERRY_BASE_ALLOC_H

#include <stdbool.h>
#include <stddef.h>

/* malloc, calloc and realloc that a test can make fail.  A size of 0 asks
 * for 1 byte, so that NULL always means failure.  ferry__free(NULL) is a
 * no-op. */
void *ferry__malloc(size_t size);
void *ferry__calloc(size_t n, size_t size);
void *ferry__realloc(void *p, size_t size);
void ferry__free(void *p);

/* Count a resource acquisition that is not malloc (mmap of a stack,
 * thread creation, eventfd creation): returns true if the fault hook says
 * this one must fail.  `site` names the point in the tests' reports. */
bool ferry__fault_point(const char *site);

/* Declare `n` live allocations as the process's: objects made once and
 * never freed (the default pool), which a test's count of live
 * allocations must not take for a leak. */
void ferry__alloc_resident(long n);

#endif /* FERRY_BASE_ALLOC_H */
