/* switch_aarch64.S - context switch for AArch64 (AAPCS64).
 *
 * Saves x19-x30 and d8-d15 (the callee-saved registers) on the current
 * stack, swaps sp, restores the other side and returns through x30.
 */
    .text
    .globl  ferry__ctx_switch
    .type   ferry__ctx_switch, %function
    .p2align 6      /* one cache line, whatever the link order */
/* void ferry__ctx_switch(ferry__ctx *from (x0), ferry__ctx *to (x1)) */
ferry__ctx_switch:
    sub     sp, sp, #176
    stp     x19, x20, [sp, #0]
    stp     x21, x22, [sp, #16]
    stp     x23, x24, [sp, #32]
    stp     x25, x26, [sp, #48]
    stp     x27, x28, [sp, #64]
    stp     x29, x30, [sp, #80]
    stp     d8,  d9,  [sp, #96]
    stp     d10, d11, [sp, #112]
    stp     d12, d13, [sp, #128]
    stp     d14, d15, [sp, #144]
    mov     x9, sp
    str     x9, [x0]
    ldr     x9, [x1]
    mov     sp, x9
    ldp     x19, x20, [sp, #0]
    ldp     x21, x22, [sp, #16]
    ldp     x23, x24, [sp, #32]
    ldp     x25, x26, [sp, #48]
    ldp     x27, x28, [sp, #64]
    ldp     x29, x30, [sp, #80]
    ldp     d8,  d9,  [sp, #96]
    ldp     d10, d11, [sp, #112]
    ldp     d12, d13, [sp, #128]
    ldp     d14, d15, [sp, #144]
    add     sp, sp, #176
    ret
    .size   ferry__ctx_switch, .-ferry__ctx_switch

    .globl  ferry__ctx_trampoline
    .type   ferry__ctx_trampoline, %function
    .p2align 4
/* First code of a new context: entry (x19) called with arg (x20). */
ferry__ctx_trampoline:
    mov     x0, x20
    blr     x19
    brk     #0
    .size   ferry__ctx_trampoline, .-ferry__ctx_trampoline

    .section .note.GNU-stack,"",%progbits
