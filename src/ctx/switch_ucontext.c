/* switch_ucontext.c - the portable fallback on makecontext/swapcontext.
 * Loop thread only.  Each switch costs a sigprocmask system call.
 */
#include "../loop_only.h"

#include <stdint.h>
#include <stdlib.h>
#include <ucontext.h>

#include "ctx.h"

static void uc_entry(unsigned hi, unsigned lo, unsigned ehi, unsigned elo)
{
    void *arg = (void *)(uintptr_t)(((uint64_t)hi << 32) | lo);
    void (*entry)(void *) = (void (*)(void *))(uintptr_t)(((uint64_t)ehi << 32) | elo);
    entry(arg);
    abort(); /* entry never returns */
}

void ferry__ctx_make(ferry__ctx *c, void *lo, size_t size, void (*entry)(void *arg), void *arg)
{
    uint64_t a = (uintptr_t)arg, e = (uintptr_t)entry;
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = lo;
    c->uc.uc_stack.ss_size = size;
    c->uc.uc_link = NULL;
    makecontext(&c->uc, (void (*)(void))uc_entry, 4, (unsigned)(a >> 32), (unsigned)a,
                (unsigned)(e >> 32), (unsigned)e);
}

void ferry__ctx_switch(ferry__ctx *from, ferry__ctx *to)
{
    swapcontext(&from->uc, &to->uc);
}
