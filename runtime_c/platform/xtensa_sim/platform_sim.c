/**
 * @file platform_sim.c
 * @brief Colibri platform for Xtensa cores on QEMU's `sim` machine: files, console and exit
 *        through the simulator call (`simcall`: a2 = call number, a3..a5 = arguments, result in
 *        a2, errno in a3). File descriptors and open flags are the host's (QEMU passes them
 *        through), paths are relative to QEMU's working directory.
 *
 *        Stack guard (colibri_stack_guard.h, startup.S): the painted guard below the stack is
 *        checked after each forward pass (the bench end marker's hook) and at exit, where the
 *        high-water mark is printed; on the ESP32-S3 its top 128 bytes are also watched by the
 *        core's data breakpoints (clb_xtensa_stack_watch), and an exception taken with the stack
 *        pointer below the stack is reported as an overflow. Every overflow prints "colibri: stack
 *        overflow: ..." and exits with 98.
 */
#include "colibri_fmt.h"
#include "colibri_stack_guard.h"

#define CLB_PLATFORM_BENCH_END_HOOK() clb_stack_guard_painted_check()
#include "colibri_platform_impl.h"

#include <stdint.h>

#define CLB_SIM_SYS_EXIT 1
#define CLB_SIM_SYS_READ 3
#define CLB_SIM_SYS_WRITE 4
#define CLB_SIM_SYS_OPEN 5
#define CLB_SIM_SYS_CLOSE 6

/* Linux open(2) flags of the host QEMU runs on. */
#define CLB_SIM_O_RDONLY 0x0
#define CLB_SIM_O_WRONLY 0x1
#define CLB_SIM_O_CREAT 0x40
#define CLB_SIM_O_TRUNC 0x200

#define CLB_SIM_STDOUT 1

#define CLB_FAULT_EXIT_CODE 99

int main(int argc, char **argv);
void clb_xtensa_start(void);
void clb_xtensa_fault(uint32_t cause, uint32_t pc, uint32_t sp);
void clb_xtensa_stack_watch(uint32_t pc, uint32_t sp);

static int32_t clb_simcall(int32_t nr, int32_t arg1, int32_t arg2, int32_t arg3)
{
    register int32_t a2 __asm__("a2") = nr;
    register int32_t a3 __asm__("a3") = arg1;
    register int32_t a4 __asm__("a4") = arg2;
    register int32_t a5 __asm__("a5") = arg3;
    __asm__ volatile("simcall" : "+r"(a2), "+r"(a3) : "r"(a4), "r"(a5) : "memory");
    return a2;
}

static char clb_prog_name[] = "colibri";
static char *clb_argv[] = {clb_prog_name, 0};

/** @brief Called by startup.S once the stack and .bss are set up. */
void clb_xtensa_start(void)
{
    const int32_t code = (int32_t)main(1, clb_argv);
    clb_stack_guard_painted_check();
    clb_stack_report_high_water();
    clb_platform_exit(code);
}

/** @brief "<what> at pc=..., sp=..." into buf (the overflow report's detail). */
static const char *clb_xtensa_where(char *buf, const char *what, uint32_t pc, uint32_t sp)
{
    char *p = clb_append(buf, what);
    p = clb_append_field(p, " at pc=", pc);
    p = clb_append_field(p, ", sp=", sp);
    *p = '\0';
    return buf;
}

/** @brief Called by the debug vector (startup.S) when a data breakpoint on the guard's top 128
 *         bytes fired: a store below the stack. Runs on the fault stack. */
void clb_xtensa_stack_watch(uint32_t pc, uint32_t sp)
{
    char how[96];
    clb_stack_overflow(
        0u, clb_xtensa_where(how, "data breakpoint on the guard below the stack", pc, sp));
}

/** @brief Called by the exception vectors (startup.S), on the fault stack: report and exit with
 *         99, or with 98 when the stack pointer the exception was taken with lies below the
 *         stack (a store there faulted: below RAM, where the sim maps nothing). */
void clb_xtensa_fault(uint32_t cause, uint32_t pc, uint32_t sp)
{
    if (sp < (uint32_t)(uintptr_t)__stack_limit) {
        char how[96];
        const char *what = "exception with the stack pointer below the stack";
        clb_stack_overflow(0u, clb_xtensa_where(how, what, pc, sp));
    }
    char msg[96];
    char *p = clb_append_field(msg, "colibri: XtensaException pc=", pc);
    p = clb_append_field(p, " exccause=", cause);
    p = clb_append(p, "\n");
    *p = '\0';
    clb_platform_puts(msg);
    clb_platform_exit(CLB_FAULT_EXIT_CODE);
}

void clb_platform_init(void)
{
}

int32_t clb_platform_open(const char *path, int32_t mode)
{
    int32_t flags = (mode == CLB_PLATFORM_WRITE)
                        ? (CLB_SIM_O_WRONLY | CLB_SIM_O_CREAT | CLB_SIM_O_TRUNC)
                        : CLB_SIM_O_RDONLY;
    return clb_simcall(CLB_SIM_SYS_OPEN, (int32_t)(uintptr_t)path, flags, 0644);
}

static int32_t clb_sim_read(int32_t fd, uintptr_t addr, uint32_t n)
{
    return clb_simcall(CLB_SIM_SYS_READ, fd, (int32_t)addr, (int32_t)n);
}

static int32_t clb_sim_write(int32_t fd, uintptr_t addr, uint32_t n)
{
    return clb_simcall(CLB_SIM_SYS_WRITE, fd, (int32_t)addr, (int32_t)n);
}

int32_t clb_platform_read(int32_t fd, void *buf, uint32_t n)
{
    return clb_platform_io_all(clb_sim_read, fd, (uintptr_t)buf, n, 0);
}

int32_t clb_platform_write(int32_t fd, const void *buf, uint32_t n)
{
    return clb_platform_io_all(clb_sim_write, fd, (uintptr_t)buf, n, 1);
}

int32_t clb_platform_close(int32_t fd)
{
    return clb_simcall(CLB_SIM_SYS_CLOSE, fd, 0, 0);
}

void clb_platform_puts(const char *s)
{
    (void)clb_platform_write(CLB_SIM_STDOUT, s, clb_platform_strlen(s));
}

_Noreturn void clb_platform_exit(int32_t code)
{
    for (;;) {
        (void)clb_simcall(CLB_SIM_SYS_EXIT, code, 0, 0);
    }
}
