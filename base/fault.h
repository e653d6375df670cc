/* fault.h - the allocation-failure hook and the live-allocation count, for
 * ferry's own tests.
 * Thread: any.  Not part of the installed API.
 */
#ifndef FERRY_FAULT_H
#define FERRY_FAULT_H

#include <stdbool.h>

/* Turn the fault hook and the count of live allocations on, for the rest
 * of the process.  Off, no point fails and nothing is counted.  Call it
 * before the process's first allocation through ferry (a constructor): an
 * allocation made before and freed after would make the count wrong. */
void ferry__alloc_count_on(void);

/* Forget any armed fault and zero the counters. */
void ferry__fault_reset(void);
/* Make the nth counted point from now (1-based) fail; with `persistent`,
 * every later one fails too.  Resets the counters. */
void ferry__fault_arm(unsigned long nth, bool persistent);
/* Points counted since the last arm or reset. */
unsigned long ferry__fault_count(void);
/* Failures injected since the last arm or reset. */
unsigned long ferry__fault_hits(void);
/* Site name of the last injected failure, or NULL. */
const char *ferry__fault_last_site(void);

/* Allocations made through ferry__malloc/calloc/realloc and not yet given
 * to ferry__free, less the ones declared resident (below).  Zero in a
 * process whose loops, pools and other objects have all been freed.  Not
 * reset by ferry__fault_reset(). */
long ferry__alloc_live(void);

#endif /* FERRY_FAULT_H */
