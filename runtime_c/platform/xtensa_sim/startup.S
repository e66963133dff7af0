/*
 * Start-up for Xtensa cores on QEMU's `sim` machine: the call0 ABI (lx106) and the windowed ABI
 * (the ESP32-S3's LX7; GCC defines __XTENSA_WINDOWED_ABI__).
 * QEMU's loader device has already written .text, .rodata and .data where they are linked,
 * so there is nothing to copy: point VECBASE at our vectors, leave exception mode (PS.EXCM = 0,
 * PS.UM = 1, interrupts masked), paint the stack guard and the stack (colibri_stack_guard.h),
 * set the stack pointer (a1), zero .bss, call C.
 * Any exception then lands in clb_xtensa_exception, which reports EXCCAUSE, EPC1 and the
 * faulting a1 through clb_xtensa_fault (platform_sim.c: prints, exits with 99, or 98 when a1 was
 * below the stack) instead of hanging QEMU. Both run on the fault stack above the main stack
 * (__fault_stack_top), which an overflow of the main stack cannot reach.
 *
 * Stack guard, windowed ABI (the ESP32-S3's LX7 has the debug option with two data breakpoints):
 * DBREAKA0/1 watch the top 128 bytes of the guard below the stack for stores (DBREAKC.SB, mask
 * 0: a 64-byte block each), so the first store there, a window spill included, raises a debug
 * exception: clb_xtensa_debug turns the breakpoints off and reports a stack overflow (98) from
 * the fault stack. PS.INTLEVEL is 5, below the debug level (6), so the breakpoints are live;
 * no interrupt is enabled (INTENABLE stays 0). The rest of the guard is checked for its paint
 * after each forward pass and at exit, on both ABIs.
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

/* colibri_stack_guard.h's CLB_STACK_PAINT (a C header: the value is repeated here). */
#define CLB_STACK_PAINT_WORD 0xC0C1B1A5

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

/* PS: INTLEVEL 5 (interrupts masked; debug exceptions, level 6, taken), EXCM 0, UM 1, WOE 1
 * (window exceptions on). */
#define CLB_PS_RUN 0x40025
/* DBREAKC: store break (SB, bit 31), MASK 0 (bits 5..0): a 64-byte aligned block. */
#define CLB_DBREAKC_STORE_64 0x80000000

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
    /* interrupt levels 2..5 (0x180..0x240) */
    .irp    off, 0x180, 0x1C0, 0x200, 0x240
    .org    \off
    j       clb_xtensa_exception
    .endr
    .org    0x280               /* debug (level 6): a data breakpoint on the stack guard */
    j       clb_xtensa_debug
    /* NMI (level 7), kernel, user and double exception */
    .irp    off, 0x2C0, 0x300, 0x340, 0x3C0
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
 * Fault path: the program is abandoned; reports EXCCAUSE, EPC1 and the faulting stack pointer
 * from the fault stack. Windowed ABI: the window state is reset first (only the current frame
 * live, the one the exception was taken in: its a1 is the faulting stack pointer) and window
 * exceptions turned back on.
 */
    .macro clb_fault_window_reset
    rsr     a4, windowbase
    movi    a5, 1
    ssl     a4
    sll     a5, a5
    wsr     a5, windowstart
    movi    a4, CLB_PS_RUN
    wsr     a4, ps
    rsync
    .endm

    clb_function clb_xtensa_exception, clb_xtensa_exception
clb_xtensa_exception:
#if defined(__XTENSA_WINDOWED_ABI__)
    rsr     a6, exccause
    rsr     a7, epc1
    mov     a8, a1
    clb_fault_window_reset
#else
    rsr     a2, exccause
    rsr     a3, epc1
    mov     a4, a1
#endif
    movi    a1, __fault_stack_top
    clb_call clb_xtensa_fault
.Lfault_hang:
    j       .Lfault_hang
    .size clb_xtensa_exception, . - clb_xtensa_exception

#if defined(__XTENSA_WINDOWED_ABI__)
/* A data breakpoint on the stack guard (debug exception, level 6): breakpoints off, then report
 * EPC6 (the store's pc) and the stack pointer as a stack overflow from the fault stack. */
    clb_function clb_xtensa_debug, clb_xtensa_debug
clb_xtensa_debug:
    movi    a6, 0
    wsr     a6, dbreakc0
    wsr     a6, dbreakc1
    dsync
    rsr     a6, epc6
    mov     a7, a1
    clb_fault_window_reset
    movi    a1, __fault_stack_top
    clb_call clb_xtensa_stack_watch
.Ldebug_hang:
    j       .Ldebug_hang
    .size clb_xtensa_debug, . - clb_xtensa_debug
#endif

/* Store a4 into every word of [a2, a3) (a2, a3 word aligned); a2 ends at a3. */
    .macro clb_fill_words
.Lfill\@:
    bgeu    a2, a3, .Lfilled\@
    s32i    a4, a2, 0
    addi    a2, a2, 4
    j       .Lfill\@
.Lfilled\@:
    .endm

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
    movi    a2, __stack_guard   /* paint the guard and the stack (colibri_stack_guard.h) */
    movi    a3, _estack
    movi    a4, CLB_STACK_PAINT_WORD
    clb_fill_words
    movi    a1, _estack         /* 16-byte aligned (the ABI's), below _estack when it is not */
    movi    a2, -16
    and     a1, a1, a2
    movi    a2, __bss_start
    movi    a3, __bss_end
    movi    a4, 0
    clb_fill_words
#if defined(__XTENSA_WINDOWED_ABI__)
    movi    a2, __stack_limit - 64  /* the guard's top 128 bytes: two 64-byte store watches */
    wsr     a2, dbreaka0
    movi    a2, __stack_limit - 128
    wsr     a2, dbreaka1
    movi    a2, CLB_DBREAKC_STORE_64
    wsr     a2, dbreakc0
    wsr     a2, dbreakc1
    dsync
#endif
    clb_call clb_xtensa_start
.Lhang:
    j       .Lhang
    .size _start, . - _start
