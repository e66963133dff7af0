"""Run a board's ELF: natively (host), under qemu-user (Cortex-A Linux) or qemu-system (bare metal).

Every run is under a timeout. A guest that faults (the platform's fault handler exits with 99
after printing ``colibri: HardFault ...``), hangs, locks QEMU up or exits with an unexpected
status raises :class:`QemuError` whose message says which, with the tail of the guest's output.

Instruction counts (``count_instructions=True``) cover the region between entering
``clb_platform_bench_begin`` and entering ``clb_platform_bench_end`` (summed over every pair):
under QEMU with the TCG plugin ``tools/qemu_icount/icount.c`` (built on demand into
``build/tools/libicount.so``), on the host with ``valgrind --tool=callgrind`` (dumps before each
marker; the dumps triggered by the end marker hold the region). Both are deterministic.
With ``count_prefix`` the run also counts, inclusively (callees included), the calls made inside
that region to the functions whose names start with the prefix (``RunResult.prefix_instructions``;
the plugin's ``sub_prefix``; on the host callgrind's ``--toggle-collect`` in a second run, which
counts such calls in the whole run, the same for a program that calls them only in the region).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..boards import Board, qemu_command
from ..errors import QemuError, ToolchainNotFound
from ..paths import resource_dir, tools_dir

BENCH_BEGIN = "clb_platform_bench_begin"
BENCH_END = "clb_platform_bench_end"
FAULT_EXIT_CODE = 99
#: Lines printed by the platforms' fault handlers (arm_semihost, xtensa_sim) before exit 99.
_FAULT_RE = re.compile(
    r"colibri: (\w+Fault|MemManage|XtensaException|NMI|SVCall|PendSV|SysTick|interrupt)\b"
    r"[^\n]*"
)
#: Printed by the arm_semihost start-up's stack guard (MPU region, MSPLIM or canary) before exit 98.
STACK_OVERFLOW_EXIT_CODE = 98
_STACK_RE = re.compile(r"colibri: stack overflow: [^\n]*")
#: Printed at a normal bare-metal exit: the measured stack high-water mark.
_HIGH_WATER_RE = re.compile(r"stack high-water: (\d+) of (\d+) bytes")
_TAIL_LINES = 20


@dataclass
class RunResult:
    """Outcome of one run; ``instructions`` is None unless counting was asked for and worked."""

    returncode: int
    stdout: str
    stderr: str
    instructions: int | None = None
    prefix_instructions: int | None = None

    @property
    def stack_high_water(self) -> int | None:
        """Stack bytes the guest used (painted-stack high-water mark), if it reported it."""
        match = _HIGH_WATER_RE.search(self.stdout)
        return int(match.group(1)) if match else None


def _tail(stdout: str, stderr: str) -> str:
    lines = (stdout + ("\n" if stdout and not stdout.endswith("\n") else "") + stderr).splitlines()
    tail = lines[-_TAIL_LINES:]
    body = "\n".join("    " + line for line in tail) if tail else "    (no output)"
    return f"guest output (last {len(tail)} lines):\n{body}"


# -- instruction counting ---------------------------------------------------------------------


def icount_plugin() -> Path:
    """Path of the instruction-count plugin, compiling it with the host gcc if missing/stale."""
    out = tools_dir() / "libicount.so"
    src = resource_dir() / "tools" / "qemu_icount" / "icount.c"
    if out.is_file() and (not src.is_file() or out.stat().st_mtime >= src.stat().st_mtime):
        return out
    if not src.is_file():
        raise QemuError(f"instruction counting needs {out} or its source {src}; neither exists")
    gcc = shutil.which("gcc")
    if gcc is None:
        raise ToolchainNotFound(
            f"instruction counting needs the QEMU plugin {out}, and building it needs the host "
            f"C compiler 'gcc' (apt-get install gcc), which is not on PATH"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    cmd = [gcc, "-std=c11", "-O2", "-Wall", "-Wextra", "-shared", "-fPIC", str(src), "-o", str(tmp)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise QemuError(f"building the icount plugin failed ({' '.join(cmd)}):\n{proc.stderr}")
    tmp.replace(out)
    return out


def marker_addresses(elf: str | Path) -> tuple[int, int, bool]:
    """(begin, end, position_independent) of the bench markers in an ELF (Thumb bit cleared)."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    found: dict[str, int] = {}
    with open(elf, "rb") as f:
        elffile = ELFFile(f)
        thumb = elffile["e_machine"] == "EM_ARM"
        pie = elffile["e_type"] == "ET_DYN"
        for section in elffile.iter_sections():
            if isinstance(section, SymbolTableSection):
                for name in (BENCH_BEGIN, BENCH_END):
                    for sym in section.get_symbol_by_name(name) or []:
                        if sym["st_shndx"] != "SHN_UNDEF":
                            found[name] = sym["st_value"] & ~1 if thumb else sym["st_value"]
    missing = [n for n in (BENCH_BEGIN, BENCH_END) if n not in found]
    if missing:
        raise QemuError(
            f"{elf}: cannot count instructions, symbol(s) {', '.join(missing)} not found "
            f"(link the board's platform and do not strip the ELF)"
        )
    return found[BENCH_BEGIN], found[BENCH_END], pie


def _plugin_args(elf: str | Path, out_file: Path, count_prefix: str | None = None) -> list[str]:
    begin, end, pie = marker_addresses(elf)
    if pie:  # qemu-user relocates a PIE: match the marker symbols, QEMU knows the load bias
        where = f"begin_sym={BENCH_BEGIN},end_sym={BENCH_END}"
    else:
        where = f"begin={begin:#x},end={end:#x}"
    if count_prefix:
        where += ",sub_prefix=" + count_prefix.replace(",", ",,")
    plugin = str(icount_plugin()).replace(",", ",,")
    out = str(out_file).replace(",", ",,")
    return ["-plugin", f"{plugin},{where},out={out}", "-d", "plugin"]


def _parse_plugin_output(path: Path, what: str = "region", calls: str = "pairs") -> int | None:
    """The plugin's count `what` (region: the marked region; sub: the sub_prefix calls), None
    without a completed region / call (`calls` = 0) or output file."""
    try:
        text = path.read_text()
    except OSError:
        return None
    match = re.search(rf"{what}=(\d+) {calls}=(\d+)", text)
    if match is None or int(match.group(2)) == 0:
        return None
    return int(match.group(1))


def _callgrind_prefix_command(elf: str | Path, out_file: Path, prefix: str) -> list[str]:
    """callgrind collecting only inside calls of functions named PREFIX* (inclusive)."""
    cmd = _callgrind_command(elf, out_file)
    cmd = [c for c in cmd if not c.startswith("--dump-before=")]
    at = cmd.index(str(elf))
    return [*cmd[:at], "--collect-atstart=no", f"--toggle-collect={prefix}*", *cmd[at:]]


def _callgrind_command(elf: str | Path, out_pattern: Path) -> list[str]:
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise ToolchainNotFound(
            "instruction counting on the host board needs valgrind (apt-get install valgrind), "
            "which is not on PATH"
        )
    return [
        valgrind,
        "--tool=callgrind",
        "-q",
        f"--callgrind-out-file={out_pattern}",
        f"--dump-before={BENCH_BEGIN}",
        f"--dump-before={BENCH_END}",
        str(elf),
    ]


def _parse_callgrind(directory: Path) -> int | None:
    total = 0
    found = False
    for dump in sorted(directory.glob("callgrind.out*")):
        text = dump.read_text(errors="replace")
        if f"Trigger: --dump-before={BENCH_END}" not in text:
            continue
        match = re.search(r"^(?:totals|summary):\s+(\d+)", text, re.MULTILINE)
        if match:
            total += int(match.group(1))
            found = True
    return total if found else None


# -- running ----------------------------------------------------------------------------------


def _run(
    cmd: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None
) -> tuple[int | None, str, str]:
    """Run under a timeout in its own process group; returncode None means it timed out."""
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        code = None
    return code, out.decode(errors="replace"), err.decode(errors="replace")


def run_elf(
    board: Board,
    elf: str | Path,
    cwd: str | Path,
    timeout: float | None = None,
    count_instructions: bool = False,
    *,
    check: bool = True,
    expected_returncode: int = 0,
    args: tuple[str, ...] = (),
    count_prefix: str | None = None,
) -> RunResult:
    """Run ``elf`` for ``board`` in ``cwd`` (where the guest's relative file paths point);
    ``args`` are the program's arguments (host and Linux boards); ``count_prefix`` (with
    ``count_instructions``) also counts the calls of the functions named so (module docstring).

    Faults, timeouts and emulator failures always raise QemuError; with ``check`` a return code
    other than ``expected_returncode`` does too.
    """
    elf = Path(elf).resolve()
    cwd = Path(cwd)
    if not elf.is_file():
        raise QemuError(f"board {board.name}: ELF {elf} does not exist (build it first)")
    ok, why = board.can_run()
    if not ok:
        raise ToolchainNotFound(why)
    if timeout is None:
        timeout = board.qemu.timeout if board.qemu is not None else 120.0

    with tempfile.TemporaryDirectory(prefix="colibri-run-") as tmp_name:
        tmp = Path(tmp_name)
        if board.kind == "host":
            if count_instructions:
                cmd = _callgrind_command(elf, tmp / "callgrind.out.%p")
            else:
                cmd = qemu_command(board, elf)
        else:
            extra = (
                _plugin_args(elf, tmp / "icount.txt", count_prefix) if count_instructions else []
            )
            cmd = qemu_command(board, elf, extra)
        cmd = [*cmd, *args]
        env = None
        if count_instructions and board.kind != "baremetal":
            # Resolve dynamic symbols at start-up, not lazily inside the measured region.
            env = {**os.environ, "LD_BIND_NOW": "1"}
        code, out, err = _run(cmd, cwd, timeout, env)
        instructions = None
        prefix_instructions = None
        if count_instructions:
            if board.kind == "host":
                instructions = _parse_callgrind(tmp)
            else:
                instructions = _parse_plugin_output(tmp / "icount.txt")
                if count_prefix:
                    prefix_instructions = _parse_plugin_output(tmp / "icount.txt", "sub", "calls")
        if count_prefix and count_instructions and board.kind == "host" and code == 0:
            sub_dir = tmp / "prefix"
            sub_dir.mkdir()
            sub_cmd = [*_callgrind_prefix_command(elf, sub_dir / "callgrind.out", count_prefix)]
            sub_code, _, _ = _run([*sub_cmd, *args], cwd, timeout, env)
            if sub_code == 0:
                found = re.search(
                    r"^(?:totals|summary):\s+(\d+)",
                    (sub_dir / "callgrind.out").read_text(errors="replace"),
                    re.MULTILINE,
                )
                prefix_instructions = int(found.group(1)) if found else None

    what = f"board {board.name}: {elf.name}"
    if code is None:
        raise QemuError(
            f"{what} timed out after {timeout:g} s (hung guest, or a fault with no handler on "
            f"this board); command: {' '.join(cmd)}\n{_tail(out, err)}"
        )
    overflow = _STACK_RE.search(out + err)
    if code == STACK_OVERFLOW_EXIT_CODE or overflow is not None:
        detail = overflow.group(0) if overflow else f"exit code {STACK_OVERFLOW_EXIT_CODE}"
        raise QemuError(f"{what}: guest stack overflow ({detail})\n{_tail(out, err)}")
    fault = _FAULT_RE.search(out + err)
    if code == FAULT_EXIT_CODE or fault is not None:
        kind = fault.group(1) if fault else "fault"
        detail = fault.group(0) if fault else f"exit code {FAULT_EXIT_CODE}"
        raise QemuError(f"{what}: guest {kind} ({detail})\n{_tail(out, err)}")
    if "Lockup" in err or "lockup" in err:
        raise QemuError(
            f"{what}: QEMU reported a CPU lockup (a fault inside a fault handler, or no vector "
            f"table)\n{_tail(out, err)}"
        )
    if code < 0:
        raise QemuError(
            f"{what}: {'the program' if board.kind == 'host' else 'QEMU'} was killed by "
            f"signal {-code}\n{_tail(out, err)}"
        )
    qemu_error = [
        line
        for line in err.splitlines()
        if board.qemu and line.split(":", 1)[0].endswith(board.qemu.binary)
    ]
    if qemu_error and code != expected_returncode:
        raise QemuError(f"{what}: QEMU failed: {qemu_error[0]}\n{_tail(out, err)}")
    if check and code != expected_returncode:
        raise QemuError(
            f"{what}: exit code {code}, expected {expected_returncode}\n{_tail(out, err)}"
        )
    return RunResult(
        returncode=code,
        stdout=out,
        stderr=err,
        instructions=instructions,
        prefix_instructions=prefix_instructions,
    )
