/*
 * Start-up for Xtensa cores on QEMU's `sim` machine: the call0 ABI (lx106) and the windowed ABI
 * (the ESP32-S3's LX7; GCC defines __XTENSA_WINDOWED_ABI__).
 * QEMU's loader device has already written .text, .rodata and .data where they are linked,
 * so there is nothing to copy: point VECBASE at our vectors, leave exception mode (PS.EXCM = 0,
 * PS.UM = 1, interrupts masked), set the stack pointer (a1), zero .bss, call C.
 * Any exception then lands in clb_xtensa_exception, which reports EXCCAUSE and EPC1 through
 * clb_xtensa_fault (platform_sim.c: prints, exits with 99) instead of hanging QEMU.
 * Symbols come from the board's linker template (xtensa_sim.ld.j2, xtensa_esp32s3.ld.j2).
 *
 * Windowed ABI: a call rotates the register window by 4, 8 or 12; when the 64 physical registers
 * run out, `entry` raises a window-overflow exception whose handler spills the oldest frame's
 * registers to its save areas on the stack (the 16 bytes below the next frame's stack pointer,
 * and for call8/call12 frames the extra area at the bottom of the frame beyond); `retw` into a
 * spilled frame raises the matching underflow. Those six handlers sit at fixed offsets from
 * VECBASE, 64 bytes each, and are the architecture's standard spill sequences. The first C
 * function is called with `callx4`: its caller (this start-up) has no frame of its own, so with
 * callx8 an overflow would read the extra save area's address from a garbage stack slot.
 * The FPU is coprocessor 0: CPENABLE bit 0 must be set before the first float instruction.
 */

/* A function in a section of its own (.text.<section>: --gc-sections, the linker script), with
 * its literal pool. */
    .macro clb_function name, section
    .section .text.\section, "ax"
    .literal_position
    .align 4
    .global \name
    .type \name, @function
    .endm

#if defined(__XTENSA_WINDOWED_ABI__)

/* PS: INTLEVEL 15 (interrupts masked), EXCM 0, UM 1, WOE 1 (window exceptions on). */
#define CLB_PS_RUN 0x4002F

/* Call a C function: callx4 (see above; its arguments are a6, a7 here, a2, a3 there). */
    .macro clb_call fn
    movi    a4, \fn
    callx4  a4
    .endm

    .section .clb_vectors, "ax"
    .global clb_vector_base
clb_vector_base:
    .begin no-transform
    .org    0x000               /* window overflow, call4 frame: a0..a3 below the next sp (a5) */
    s32e    a0, a5, -16
    s32e    a1, a5, -12
    s32e    a2, a5, -8
    s32e    a3, a5, -4
    rfwo
    .org    0x040               /* window underflow, call4 frame */
    l32e    a0, a5, -16
    l32e    a1, a5, -12
    l32e    a2, a5, -8
    l32e    a3, a5, -4
    rfwu
    .org    0x080               /* window overflow, call8 frame: a4..a7 to the extra save area */
    s32e    a0, a9, -16
    l32e    a0, a1, -12         /* the caller's sp: its frame's bottom holds the extra area */
    s32e    a2, a9, -8
    s32e    a1, a9, -12
    s32e    a3, a9, -4
    s32e    a4, a0, -32
    s32e    a5, a0, -28
    s32e    a6, a0, -24
    s32e    a7, a0, -20
    rfwo
    .org    0x0C0               /* window underflow, call8 frame */
    l32e    a1, a9, -12
    l32e    a0, a9, -16
    l32e    a7, a1, -12
    l32e    a2, a9, -8
    l32e    a4, a7, -32
    l32e    a3, a9, -4
    l32e    a5, a7, -28
    l32e    a6, a7, -24
    l32e    a7, a7, -20
    rfwu
    .org    0x100               /* window overflow, call12 frame: a4..a11 to the extra area */
    s32e    a0, a13, -16
    l32e    a0, a1, -12
    s32e    a1, a13, -12
    s32e    a2, a13, -8
    s32e    a3, a13, -4
    s32e    a4, a0, -48
    s32e    a5, a0, -44
    s32e    a6, a0, -40
    s32e    a7, a0, -36
    s32e    a8, a0, -32
    s32e    a9, a0, -28
    s32e    a10, a0, -24
    s32e    a11, a0, -20
    rfwo
    .org    0x140               /* window underflow, call12 frame */
    l32e    a1, a13, -12
    l32e    a0, a13, -16
    l32e    a11, a1, -12
    l32e    a2, a13, -8
    l32e    a4, a11, -48
    l32e    a8, a11, -32
    l32e    a3, a13, -4
    l32e    a5, a11, -44
    l32e    a6, a11, -40
    l32e    a7, a11, -36
    l32e    a9, a11, -28
    l32e    a10, a11, -24
    l32e    a11, a11, -20
    rfwu
    /* interrupt levels 2..5 (0x180..0x240), debug (level 6), NMI (level 7), kernel, user and
     * double exception */
    .irp    off, 0x180, 0x1C0, 0x200, 0x240, 0x280, 0x2C0, 0x300, 0x340, 0x3C0
    .org    \off
    j       clb_xtensa_exception
    .endr
    .end no-transform

#else /* call0 ABI */

/* PS: INTLEVEL 15, EXCM 0, UM 1. */
#define CLB_PS_RUN 0x2F

    .macro clb_call fn
    movi    a0, \fn
    callx0  a0
    .endm

/* Vector table at VECBASE (1 KB aligned by the linker script); offsets of the lx106 layout:
 * debug, NMI, kernel, user and double exception. */
    .section .clb_vectors, "ax"
    .global clb_vector_base
clb_vector_base:
    .begin no-transform
    .irp    off, 0x10, 0x20, 0x30, 0x50, 0x70
    .org    \off
    j       clb_xtensa_exception
    .endr
    .end no-transform

#endif

/*
 * Fault path: the program is abandoned; reports EXCCAUSE and EPC1 from the top of the stack.
 * Windowed ABI: the window state is reset first (only the current frame live) and window
 * exceptions turned back on.
 */
    clb_function clb_xtensa_exception, clb_xtensa_exception
clb_xtensa_exception:
#if defined(__XTENSA_WINDOWED_ABI__)
    rsr     a6, exccause
    rsr     a7, epc1
    rsr     a4, windowbase
    movi    a5, 1
    ssl     a4
    sll     a5, a5
    wsr     a5, windowstart
    movi    a4, CLB_PS_RUN
    wsr     a4, ps
    rsync
#else
    rsr     a2, exccause
    rsr     a3, epc1
#endif
    movi    a1, _estack
    clb_call clb_xtensa_fault
.Lfault_hang:
    j       .Lfault_hang
    .size clb_xtensa_exception, . - clb_xtensa_exception

    clb_function _start, clb_start
_start:
    movi    a2, clb_vector_base
    wsr     a2, vecbase
#if defined(__XTENSA_WINDOWED_ABI__)
    movi    a2, 0
    wsr     a2, windowbase
    rsync
    movi    a2, 1
    wsr     a2, windowstart
#endif
    movi    a2, CLB_PS_RUN
    wsr     a2, ps
    rsync
#ifndef __XTENSA_SOFT_FLOAT__
    movi    a2, 1               /* CPENABLE.CP0: the FPU */
    wsr     a2, cpenable
    rsync
#endif
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
    clb_call clb_xtensa_start
.Lhang:
    j       .Lhang
    .size _start, . - _start
