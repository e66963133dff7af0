/*
 * Start-up for Xtensa cores on QEMU's `sim` machine (call0 ABI, e.g. lx106).
 * QEMU's loader device has already written .text, .rodata and .data where they are linked,
 * so there is nothing to copy: point VECBASE at our vectors, leave exception mode (PS.EXCM = 0,
 * PS.UM = 1, interrupts masked), set the stack pointer (a1), zero .bss, call C.
 * Any exception then lands in clb_xtensa_exception, which reports EXCCAUSE and EPC1 through
 * clb_xtensa_fault (platform_sim.c: prints, exits with 99) instead of hanging QEMU.
 * Symbols come from templates/linker/xtensa_sim.ld.j2.
 */

/* Vector table at VECBASE (1 KB aligned by the linker script); offsets of the lx106 layout. */
    .section .clb_vectors, "ax"
    .global clb_vector_base
clb_vector_base:
    .begin no-transform
    .org    0x10                /* debug */
    j       clb_xtensa_exception
    .org    0x20                /* NMI */
    j       clb_xtensa_exception
    .org    0x30                /* kernel exception */
    j       clb_xtensa_exception
    .org    0x50                /* user exception */
    j       clb_xtensa_exception
    .org    0x70                /* double exception */
    j       clb_xtensa_exception
    .end no-transform

    .section .text.clb_xtensa_exception, "ax"
    .literal_position
    .align 4
    .global clb_xtensa_exception
    .type clb_xtensa_exception, @function
clb_xtensa_exception:
    rsr     a2, exccause
    rsr     a3, epc1
    movi    a1, _estack
    movi    a0, clb_xtensa_fault
    callx0  a0
.Lfault_hang:
    j       .Lfault_hang
    .size clb_xtensa_exception, . - clb_xtensa_exception
    .section .text.clb_start, "ax"
    .literal_position
    .align 4
    .global _start
    .type _start, @function
_start:
    movi    a2, clb_vector_base
    wsr     a2, vecbase
    movi    a2, 0x2F            /* PS: INTLEVEL 15, EXCM 0, UM 1 */
    wsr     a2, ps
    rsync
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
