/* ctx_asm.c - preparing a new context for the assembly switches.
 * Loop thread only.
 */
#include "../loop_only.h"

#if defined(FERRY_CTX_ASM)
#include <stdint.h>
#include <string.h>

#include "ctx.h"

void ferry__ctx_trampoline(void);

void ferry__ctx_make(ferry__ctx *c, void *lo, size_t size, void (*entry)(void *arg), void *arg)
{
    uintptr_t top = ((uintptr_t)lo + size) & ~(uintptr_t)15;
#if defined(__x86_64__)
    /* Popped by the switch: r15 r14 r13 r12 rbx rbp, then the resume
     * address.  The trampoline then runs with rsp 16-byte aligned. */
    void **sp = (void **)(top - 72);
    memset(sp, 0, 72);
    sp[2] = (void *)(uintptr_t)entry; /* r13 */
    sp[3] = arg;                      /* r12 */
    sp[6] = (void *)(uintptr_t)ferry__ctx_trampoline;
    c->sp = sp;
#elif defined(__aarch64__)
    /* The switch's frame: x19..x30 at 0..88, d8..d15 at 96..152. */
    void **sp = (void **)(top - 176);
    memset(sp, 0, 176);
    sp[0] = (void *)(uintptr_t)entry;                  /* x19 */
    sp[1] = arg;                                       /* x20 */
    sp[11] = (void *)(uintptr_t)ferry__ctx_trampoline; /* x30 */
    c->sp = sp;
#else
#error "no assembly context switch for this architecture"
#endif
}
#endif /* FERRY_CTX_ASM */
