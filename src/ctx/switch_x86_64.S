/* switch_x86_64.S - context switch for x86_64 System V.
 *
 * Saves the six callee-saved general registers on the current stack, swaps
 * the stack pointer, restores the other side and returns into it.  `ret`
 * (not pop + jmp) on purpose: tasks hand over to each other from the same
 * call sites (ferry_yield, the wait queue), so the return-stack predictor
 * is right on both this ret and the caller's, where pop + jmp would
 * mispredict every time.  No signal mask, no floating-point control words:
 * tasks share them with the loop thread.
 */
    .text
    .globl  ferry__ctx_switch
    .type   ferry__ctx_switch, @function
    .p2align 6      /* one cache line, whatever the link order */
/* void ferry__ctx_switch(ferry__ctx *from (rdi), ferry__ctx *to (rsi)) */
ferry__ctx_switch:
    .cfi_startproc
    pushq   %rbp
    pushq   %rbx
    pushq   %r12
    pushq   %r13
    pushq   %r14
    pushq   %r15
    movq    %rsp, (%rdi)
    movq    (%rsi), %rsp
    popq    %r15
    popq    %r14
    popq    %r13
    popq    %r12
    popq    %rbx
    popq    %rbp
    ret
    .cfi_endproc
    .size   ferry__ctx_switch, .-ferry__ctx_switch

    .globl  ferry__ctx_trampoline
    .type   ferry__ctx_trampoline, @function
    .p2align 4
/* First code of a new context: entry (r13) called with arg (r12). */
ferry__ctx_trampoline:
    .cfi_startproc
    .cfi_undefined rip
    movq    %r12, %rdi
    callq   *%r13
    ud2
    .cfi_endproc
    .size   ferry__ctx_trampoline, .-ferry__ctx_trampoline

    .section .note.GNU-stack,"",@progbits
