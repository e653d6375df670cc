/* ctx.h - switching between stacks on one thread.
 *
 * The assembly switches (x86_64, aarch64) save only the callee-saved
 * registers and make no system call; the ucontext fallback is chosen at
 * configure time (FERRY_CTX=ucontext) and costs a sigprocmask per switch.
 * Loop thread only.  No sanitizer or valgrind annotation happens here:
 * the scheduler does that around ferry__ctx_switch().
 */
#ifndef FERRY_CTX_H
#define FERRY_CTX_H

#include <stddef.h>

#if defined(FERRY_CTX_UCONTEXT)
#include <ucontext.h>
typedef struct ferry__ctx {
    ucontext_t uc;
} ferry__ctx;
#else
typedef struct ferry__ctx {
    void *sp; /* saved stack pointer; registers are on that stack */
} ferry__ctx;
#endif

/*
 * Prepare `c` so that the first switch to it calls entry(arg) on the stack
 * [lo, lo + size).  `entry` must never return: it ends by switching away
 * for the last time.
 */
void ferry__ctx_make(ferry__ctx *c, void *lo, size_t size, void (*entry)(void *arg), void *arg);

/* Save the current context in `from` and resume `to`. */
void ferry__ctx_switch(ferry__ctx *from, ferry__ctx *to);

#endif /* FERRY_CTX_H */
