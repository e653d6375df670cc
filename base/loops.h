/* loops.h - the process-wide set of live loops (base/loops.c has why).
 * Thread: any.
 */
#ifndef FERRY_BASE_LOOPS_H
#define FERRY_BASE_LOOPS_H

#include <stdbool.h>

#include "ferry/detail.h" /* struct ferry__link */
#include "ferry/loop.h"   /* ferry_loop, as an address only */

/* A loop's entry in the set: it lives inside the loop, so entering one
 * allocates nothing and cannot fail. */
struct ferry__loop_entry {
    struct ferry__link link; /* in the set; guarded by the set's mutex */
    const ferry_loop *loop;  /* the loop it stands for; never read through */
};

/* Enter a new loop into the set; take it out before its memory is freed.
 * Cannot fail. */
void ferry__loops_add(struct ferry__loop_entry *e, const ferry_loop *loop);
void ferry__loops_remove(struct ferry__loop_entry *e);

/* True if `loop` is in the set of live loops.  Compares the pointer only,
 * so `loop` may point to freed memory. */
bool ferry__loops_live(const ferry_loop *loop);

/* True if no loop lives in the process now (a snapshot). */
bool ferry__loops_none(void);

#endif /* FERRY_BASE_LOOPS_H */
