/* The fiber context switch for x86-64 System V (see fiber.h for why it is hand-written).
 *
 * void fa_emu_fiber_switch(void **save_sp, void *load_sp)
 *   Pushes the callee-saved registers (rbp, rbx, r12-r15) and the MXCSR / x87 control words, stores rsp in
 *   *save_sp, loads load_sp and pops the same frame from there. Caller-saved registers need no saving: to
 *   the compiler this is an ordinary function call.
 *
 * fa_emu_fiber_start
 *   Where a fresh fiber's first switch "returns" to: fiber_prepare leaves the entry function in r13 and its
 *   argument in r12, with rsp 16-byte aligned so the call below sees the ABI's stack alignment.
 */
#if defined(__x86_64__) && defined(__linux__) && !defined(FA_EMU_FORCE_UCONTEXT)

        .text
        .globl  fa_emu_fiber_switch
        .hidden fa_emu_fiber_switch
        .type   fa_emu_fiber_switch, @function
        .p2align 4
fa_emu_fiber_switch:
        .cfi_startproc
        pushq   %rbp
        pushq   %rbx
        pushq   %r12
        pushq   %r13
        pushq   %r14
        pushq   %r15
        subq    $8, %rsp
        stmxcsr (%rsp)
        fnstcw  4(%rsp)
        movq    %rsp, (%rdi)
        movq    %rsi, %rsp
        ldmxcsr (%rsp)
        fldcw   4(%rsp)
        addq    $8, %rsp
        popq    %r15
        popq    %r14
        popq    %r13
        popq    %r12
        popq    %rbx
        popq    %rbp
        ret
        .cfi_endproc
        .size   fa_emu_fiber_switch, .-fa_emu_fiber_switch

        .globl  fa_emu_fiber_start
        .hidden fa_emu_fiber_start
        .type   fa_emu_fiber_start, @function
        .p2align 4
fa_emu_fiber_start:
        .cfi_startproc
        .cfi_undefined rip      /* the outermost frame of a fiber: debuggers stop unwinding here */
        movq    %r12, %rdi
        callq   *%r13
        ud2                     /* entry functions never return */
        .cfi_endproc
        .size   fa_emu_fiber_start, .-fa_emu_fiber_start

#endif

#if defined(__linux__) && defined(__ELF__)
        .section .note.GNU-stack, "", %progbits   /* no executable stack */
#endif
