/*
 * Start-up for Xtensa cores on QEMU's `sim` machine (call0 ABI, e.g. lx106).
 * QEMU's loader device has already written .text, .rodata and .data where they are linked,
 * so there is nothing to copy: set the stack pointer (a1), zero .bss, call C.
 * Symbols come from templates/linker/xtensa_sim.ld.j2.
 */
    .section .text.clb_start, "ax"
    .literal_position
    .align 4
    .global _start
    .type _start, @function
_start:
    movi    a1, _estack
    movi    a2, __bss_start
    movi    a3, __bss_end
    movi    a4, 0
.Lzero_bss:
    bgeu    a2, a3, .Lcall_c
    s32i    a4, a2, 0
    addi    a2, a2, 4
    j       .Lzero_bss
.Lcall_c:
    movi    a0, clb_xtensa_start
    callx0  a0
.Lhang:
    j       .Lhang
    .size _start, . - _start
