"""Platform self-tests for every board, independent of the code generator and the runtime.

For each board: build tests/platform/hello.c with the board's platform and libm
(``scons board=X selftest=1``), run it in QEMU (or natively) in a temporary directory and check
the reversed output file, the console line and the exit code 3. Plus: a HardFault is reported as
such on Cortex-M, the no-heap check rejects a program that calls malloc, and instruction counts
of the marked region are deterministic.

Skips: a board whose toolchain/emulator is missing is skipped with the install hint, except with
CI=true, where only esp32s3 (not installable here) may be skipped.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from colibri.boards import Board, list_boards, load_board, matrix_boards
from colibri.errors import HeapUseError, QemuError
from colibri.reference import f32
from colibri.targets.build import scons
from colibri.targets.elfcheck import check_no_heap
from colibri.targets.qemu import run_elf
from conftest import IN_CI, NOT_INSTALLABLE, ROOT, require_board

#: The platform matrix skips ISA variants (same platform as their base board); the kernel
#: self-test runs on every board.
BOARDS = [b.name for b in matrix_boards()]
ALL_BOARDS = [b.name for b in list_boards()]
QEMU_BOARDS = [b.name for b in matrix_boards() if b.kind != "host"]
HELLO_INPUT = bytes(range(7, 7 + 200)) + b"colibri"
HELLO_LINE = f"colibri hello: reversed {len(HELLO_INPUT)} bytes"


def _build(board: Board, selftest: str, build_dir: Path) -> Path:
    args = [f"board={board.name}", f"selftest={selftest}", f"build_dir={build_dir}"]
    proc = scons(args)
    if proc.returncode != 0:
        pytest.fail(
            f"scons {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    names = {"1": "hello", "fault": "fault", "heap": "heap", "spin": "spin"}
    name = names.get(selftest, selftest)  # kernels, qkernels: their own names
    elf = build_dir / "selftest" / f"{name}{board.elf_suffix}"
    assert elf.is_file(), f"scons succeeded but {elf} is missing"
    return elf


@pytest.fixture(scope="module")
def build_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("platform-build")


def _hello(name: str, build_root: Path) -> tuple[Board, Path]:
    require_board(name)
    board = load_board(name)
    return board, _build(board, "1", build_root / name)


@pytest.mark.parametrize("name", BOARDS)
def test_hello_runs_on_board(name: str, build_root: Path, tmp_path: Path) -> None:
    board, elf = _hello(name, build_root)
    (tmp_path / "input.bin").write_bytes(HELLO_INPUT)
    result = run_elf(board, elf, tmp_path, expected_returncode=3)
    assert result.returncode == 3
    assert HELLO_LINE in result.stdout, f"console line missing:\n{result.stdout}{result.stderr}"
    assert "libm ok" in result.stdout
    assert (tmp_path / "output.bin").read_bytes() == HELLO_INPUT[::-1]


def test_boards_are_valid_and_complete() -> None:
    names = set(BOARDS)
    assert {"host", "cortex-a53", "cortex-a7", "cortex-m3", "cortex-m4", "cortex-m7"} <= names
    assert {"cortex-m55", "xtensa-lx106", "esp32s3"} <= names
    variants = {b.name: b.variant_of for b in list_boards() if b.variant_of}
    assert variants == {"cortex-a76": "cortex-a53"}
    for board in list_boards():
        if board.is_baremetal:
            assert board.region("ram").size > board.stack_size
            assert "COLIBRI_NO_FILESYSTEM" in board.all_defines()
        assert "-ffp-contract=off" in board.compile_flags()


def _hide_esp32s3_tools(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """An environment where no xtensa-esp32s3-elf-gcc / esp32s3 QEMU can be found: PATH without
    them, HOME and the cache variables pointing at an empty folder."""
    path = os.pathsep.join(
        d
        for d in os.environ.get("PATH", "").split(os.pathsep)
        if d and not Path(d, "xtensa-esp32s3-elf-gcc").exists()
    )
    env = {"PATH": path, "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "COLIBRI_ESP32S3_PREFIX": str(tmp_path / "none")}  # fmt: skip
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def test_esp32s3_reports_what_is_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _hide_esp32s3_tools(monkeypatch, tmp_path)
    board = load_board("esp32s3")
    ok, why = board.can_build()
    assert not ok
    assert "xtensa-esp32s3-elf-gcc" in why and str(tmp_path / "none" / "bin") in why
    assert "ESP-IDF" in why and "COLIBRI_XTENSA_OVERLAY" in why and "setup.sh" in why
    ok, why = board.can_run()
    if shutil.which("qemu-system-xtensa") is None:
        assert not ok and "qemu-system-xtensa" in why
    else:  # Debian's QEMU (the lx106 board's) is on PATH, but without the esp32s3 CPU
        assert not ok and "no CPU 'esp32s3'" in why, why


def test_missing_toolchain_fails_the_build_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _hide_esp32s3_tools(monkeypatch, tmp_path)  # scons() passes os.environ on
    proc = scons(["board=esp32s3", f"build_dir={tmp_path / 'build'}"])
    assert proc.returncode != 0
    assert "xtensa-esp32s3-elf-gcc" in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("name", "pattern"),
    [
        # the MPU stack guard (default memory map elsewhere) makes the fetch an XN MemManage fault
        ("cortex-m4", r"guest (HardFault|MemManage) .*pc=0xfffffff0"),
        ("cortex-m55", r"guest HardFault .*pc=0xfffffff0"),
        ("xtensa-lx106", r"guest XtensaException .*pc=0xfffffff0"),
        # the windowed start-up's fault path: window state reset, reported from the stack top
        ("esp32s3", r"guest XtensaException .*pc=0xfffffff0"),
    ],
)
def test_fault_is_reported(name: str, pattern: str, build_root: Path, tmp_path: Path) -> None:
    require_board(name)
    board = load_board(name)
    elf = _build(board, "fault", build_root / f"{name}-fault")
    with pytest.raises(QemuError, match=pattern):
        run_elf(board, elf, tmp_path, timeout=30)


def test_heap_use_is_rejected(build_root: Path) -> None:
    require_board("cortex-m4", run=False)
    board = load_board("cortex-m4")
    elf = _build(board, "heap", build_root / "cortex-m4-heap")
    with pytest.raises(HeapUseError, match=r"malloc.*referenced by .*heap\.o"):
        check_no_heap(elf)


def test_hello_has_no_heap(build_root: Path) -> None:
    _, elf = _hello("cortex-m4", build_root)
    check_no_heap(elf)


def _can_count(board: Board) -> bool:
    """Whether instructions can be counted on the board: the QEMU TCG plugin, or callgrind on
    the host (valgrind missing: False locally, a failure with CI=true)."""
    if board.kind != "host" or shutil.which("valgrind") is not None:
        return True
    if IN_CI:
        pytest.fail("CI=true and valgrind is missing: scripts/setup.sh installs it")
    return False


@pytest.mark.parametrize("name", BOARDS)
def test_instruction_count_is_deterministic(name: str, build_root: Path, tmp_path: Path) -> None:
    board, elf = _hello(name, build_root)
    if not _can_count(board):
        pytest.skip("host instruction counts need valgrind (apt-get install valgrind)")
    counts = []
    for _ in range(2):
        (tmp_path / "input.bin").write_bytes(HELLO_INPUT)
        result = run_elf(board, elf, tmp_path, count_instructions=True, expected_returncode=3)
        counts.append(result.instructions)
    how = "instructions (callgrind)" if board.kind == "host" else "guest instructions"
    print(f"{name}: hello marked region = {counts[0]} {how}")
    assert counts[0] is not None and counts[0] > 0
    assert counts[0] == counts[1]


KERNEL_LINE = re.compile(r"colibri kernels: (\d+) checks, (\d+) failed")
#: The matvec / matmul line of tests/platform/kernels.c: every kernel level the CPU has.
MATVEC_LINE = re.compile(r"colibri matvec: (\d+) checks, (\d+) failed, levels ([a-z0-9 ]+)")
#: Bench loops of tests/platform/kernels.c, selected by the first byte of input.bin.
KERNEL_BENCH = {
    "int8 dot": (0, 1),
    "int4 block dot": (2, 3),
    "fp16 matvec 8x64": (6, 7),
    "int4 x int8 matvec 8x64": (8, 9),
    "int4 x fp32 matvec 8x64": (10, 11),
}
#: Self-test checks: int8 / int4 dots 4920, fp16 conversions 65536, matvecs 2 x 3 x 9 x 13.
KERNEL_DOT_CHECKS = 4920
KERNEL_CHECKS = KERNEL_DOT_CHECKS + 65536 + 702
#: Where kernels_q.c has an ISA path (elsewhere the runtime runs the portable loop itself). The
#: Neon int4 block alone is not asserted on cortex-a53: GCC vectorises the portable block loop
#: too (within a few instructions); the gain is in the matvec, which inlines the block.
_NEON = ("int8 dot", "fp16 matvec 8x64", "int4 x int8 matvec 8x64", "int4 x fp32 matvec 8x64")
ISA_PATHS = {
    "host": ("int8 dot",),
    "cortex-m4": ("int8 dot", "int4 block dot"),
    "cortex-m7": ("int8 dot", "int4 block dot"),
    "cortex-m55": ("int8 dot", "int4 block dot"),
    "cortex-a53": _NEON,
    "cortex-a7": _NEON,
    "cortex-a76": _NEON,  # with SDOT
    "esp32s3": ("int8 dot", "int4 block dot", "fp16 matvec 8x64", "int4 x int8 matvec 8x64"),
}


@pytest.mark.parametrize("name", ALL_BOARDS)
def test_isa_dot_products_are_exact(name: str, build_root: Path, tmp_path: Path) -> None:
    """The runtime's integer dot products (Helium on cortex-m55, Neon on cortex-a53 / a7, SDOT on
    cortex-a76, SIMD32 on cortex-m4 / m7, SSE2 on the host, portable C elsewhere) equal the plain
    loops for every length 0..140, unaligned pointers and extreme values; the fp16 conversion
    (every bit pattern), the fp16 and int4 x int8 matvecs (tails, subnormals) equal the portable C
    bit for bit; every matvec / matmul level the CPU has (x86-64: AVX2, AVX-VNNI, AVX-512 VNNI)
    equals the base level bit for bit; the instruction counts of both (QEMU, callgrind on the
    host) are printed side by side."""
    require_board(name)
    board = load_board(name)
    elf = _build(board, "kernels", build_root / name)
    counting = _can_count(board)
    counts: dict[int, int | None] = {}
    # the matvec benches only where a board has an ISA path for them (CI time)
    benches = {
        w: m for w, m in KERNEL_BENCH.items() if "matvec" not in w or w in ISA_PATHS.get(name, ())
    }
    for mode in sorted({m for pair in benches.values() for m in pair}):
        (tmp_path / "input.bin").write_bytes(bytes([mode]))
        result = run_elf(board, elf, tmp_path, count_instructions=counting)
        found = KERNEL_LINE.search(result.stdout)
        assert found, f"no result line:\n{result.stdout}{result.stderr}"
        checks = KERNEL_CHECKS if mode == 0 else KERNEL_DOT_CHECKS  # fp16 / matvecs: mode 0
        assert int(found.group(1)) == checks and found.group(2) == "0", found.group(0)
        mv = MATVEC_LINE.search(result.stdout)
        assert mv, f"no matvec line:\n{result.stdout}{result.stderr}"
        assert int(mv.group(1)) > 0 and mv.group(2) == "0", mv.group(0)
        assert mv.group(3).split()[0] == "base", mv.group(0)
        counts[mode] = result.instructions
    if not counting:
        return
    for what, (fast, plain) in benches.items():
        f, p = counts[fast], counts[plain]
        assert f is not None and p is not None and f > 0 and p > 0
        print(f"\n{name}: {what}: runtime {f} / plain C {p} instructions = {p / f:.2f}x")
        if what in ISA_PATHS.get(name, ()):
            assert f < p, f"{name}: the runtime's {what} is not faster than the plain loop"


#: The line of tests/platform/refkernels.c: checks, failures, kernels and tiles compared, levels
#: run, then the checks of the tiles alone and their paths on the board.
REFKERNELS_LINE = re.compile(
    r"colibri refkernels: (\d+) checks, (\d+) failed, (\d+) kernels, (\d+) tiles, "
    r"levels ([a-z0-9 ]+); tiles (\d+) checks, int ([a-z0-9+]+), float ([a-z0-9-]+)"
)
#: The tiles' paths each board compiles (colibri_qi_common.h, colibri_qinline_f.h): the twins
#: are compared with these.
TILE_PATHS = {
    "cortex-m4": ("simd32+vfp", "vfp"),
    "cortex-m7": ("simd32+vfp", "vfp"),
    "cortex-m55": ("helium", "helium"),
    "esp32s3": ("c", "xtensa-fpu"),
}


@pytest.mark.parametrize("name", ALL_BOARDS)
def test_refkernels_kernels_and_tiles_equal_their_ref_twins(
    name: str, build_root: Path, tmp_path: Path
) -> None:
    """Every optimised kernel of the runtime (the board's ISA path; on x86-64 every CPUID level the
    CPU has, and the packed AVX-512 VNNI matrices) returns the bits of its portable _ref twin
    (runtime_c/src/kernels_q_ref.c) on seeded random shapes with tails (n_in not a multiple of
    the block, odd n_out, 1..9 tokens, a wider row stride), and the fp16 conversion on all 65536
    patterns (tests/platform/refkernels.c); and every tile of generated code (runtime_c/tiles,
    the board's assembly / Helium / SIMD32 path or its C one) the bits of its twin of
    runtime_c/tiles/colibri_qi_ref.c on shapes with tails, every n_in its layout allows and
    extreme values (tests/platform/refkernels_tiles.c)."""
    require_board(name)
    board = load_board(name)
    elf = _build(board, "refkernels", build_root / name)
    result = run_elf(board, elf, tmp_path)
    found = REFKERNELS_LINE.search(result.stdout)
    assert found, f"no result line:\n{result.stdout}{result.stderr}"
    print(f"\n{name}: {found.group(0)}")
    assert found.group(2) == "0", f"{found.group(0)}\n{result.stdout}"
    assert int(found.group(1)) > 65536 and int(found.group(3)) == 17, found.group(0)
    assert int(found.group(4)) == 15 and int(found.group(6)) > 10000, found.group(0)
    assert found.group(5).split()[0] == "base", found.group(0)
    assert (found.group(7), found.group(8)) == TILE_PATHS.get(name, ("c", "c")), found.group(0)


QKERNELS_LINE = re.compile(r"colibri qkernels: (\d+) checks, (\d+) failed")
#: Checks tests/platform/qkernels.c makes: R4 int8 (450: 5 rounds of scales, two of them on
#: either side of the Helium paths' guard), its multi-token variant (3780), R4P int8 one token
#: and 1..9 tokens (2800: the same 5 rounds), R4P with + bias and relu on the output rows
#: (colibri_qi_mm_q8_q8_r4p_act, 1..9 tokens: 1260), int4 plain blocks and Q4R4 (455), their
#: multi-token variants (4095), the relu row (10).
N_QKERNEL_CHECKS = 12850
#: Boards where colibri_qinline.h has its own paths (elsewhere it calls the library).
QINLINE_FAST = ("cortex-m4", "cortex-m7", "cortex-m55")


@pytest.mark.parametrize("name", BOARDS)
def test_qinline_kernels_equal_the_library(name: str, build_root: Path, tmp_path: Path) -> None:
    """colibri_qinline.h (what generated expert kernels call): the R4 int8 matvec and its
    multi-token variant (1..9 tokens), the same in layout R4P, the int4 matvecs on plain
    blocks and in layout Q4R4 (colibri_qinline_q4.h) and their multi-token variants (1..9
    tokens) and the activation quantiser give the library's bits on every board
    (tests/platform/qkernels.c: N_QKERNEL_CHECKS shapes, token counts and value kinds). Where
    they have their own paths, each takes fewer instructions than the library's, the
    multi-token int8 kernel at 8 tokens fewer per MAC than the one-token one, on the M4 / M7
    the Q4R4 kernel fewer than the plain-block one and its multi-token variant fewer at 8
    tokens, on the M55 the plain-block multi-token int4 kernel fewer at 8 tokens (QEMU counts,
    deterministic), printed per MAC and per value."""
    require_board(name)
    board = load_board(name)
    elf = _build(board, "qkernels", build_root / name)
    counting = name in QINLINE_FAST and _can_count(board)
    counts: dict[int, int | None] = {}
    for mode in range(10) if counting else (0xFF,):
        (tmp_path / "input.bin").write_bytes(bytes([mode]))
        result = run_elf(board, elf, tmp_path, count_instructions=counting)
        found = QKERNELS_LINE.search(result.stdout)
        assert found, f"no result line:\n{result.stdout}{result.stderr}"
        assert int(found.group(1)) == N_QKERNEL_CHECKS and found.group(2) == "0", found.group(0)
        counts[mode] = result.instructions
    if not counting:
        return
    macs, values = 2 * 128 * 256, 128 + 256  # qkernels.c QK_D, QK_FF
    lib_mv, r4_mv, lib_q, qi_q, lib_q4, qi_q4, q4r4, r4_mm, q4_mm, q4r4_mm = (
        counts[m] for m in range(10)
    )
    assert None not in (lib_mv, r4_mv, lib_q, qi_q, lib_q4, qi_q4, q4r4, r4_mm, q4_mm, q4r4_mm)
    print(
        f"\n{name}: int8 matvec {lib_mv / macs:.3f} -> {r4_mv / macs:.3f} instructions/MAC (R4), "
        f"{r4_mm / (8 * macs):.3f} at 8 tokens; "
        f"int4 matvec {lib_q4 / macs:.3f} -> {qi_q4 / macs:.3f} (plain blocks), "
        f"{q4r4 / macs:.3f} (Q4R4) instructions/MAC, at 8 tokens {q4_mm / (8 * macs):.3f} "
        f"(plain blocks), {q4r4_mm / (8 * macs):.3f} (Q4R4); "
        f"quantiser {lib_q / values:.1f} -> {qi_q / values:.1f} instructions/value"
    )
    assert r4_mv < lib_mv and qi_q < lib_q and qi_q4 < lib_q4 and r4_mm < 8 * r4_mv
    if name in ("cortex-m4", "cortex-m7"):  # the boards whose int4 experts use Q4R4
        assert q4r4 < qi_q4 and q4r4_mm < 8 * q4r4
    else:  # Helium: the plain-block multi-token kernel
        assert q4_mm < 8 * qi_q4


FKERNELS_LINE = re.compile(r"colibri fkernels: (\d+) checks, (\d+) failed")
#: Boards where colibri_qinline_f.h has its own fp32 (layout c8) / fp16 paths.
QINLINE_F_FP32 = ("cortex-m4", "cortex-m7", "cortex-m55")
QINLINE_F_FP16 = ("cortex-m55", "esp32s3")
#: Boards where colibri_qinline_f.h converts fp16 in layout c8 by VCVTB / VCVTT.
QINLINE_F_FP16_C8 = ("cortex-m4", "cortex-m7")


@pytest.mark.parametrize("name", BOARDS)
def test_qinline_float_kernels_within_rounding(name: str, build_root: Path, tmp_path: Path) -> None:
    """colibri_qinline_f.h (what generated fp32 / fp16 expert kernels call): the layout-c8 fp32
    matvec, the fp16 matvec and the layout-c8 fp16 matvec stay within the dot-product rounding
    bound of the library's on every board (tests/platform/fkernels.c: 752 shapes and value
    kinds). Where they have their own paths (fused multiply-adds; the hardware fp16 conversion
    of Helium and of the M4 / M7; on the ESP32-S3 the fp16 matvec with MADD.S), they take fewer
    instructions than the generated seed-layout loop / the library (QEMU counts)."""
    require_board(name)
    board = load_board(name)
    elf = _build(board, "fkernels", build_root / name)
    counting = name in QINLINE_F_FP32 + QINLINE_F_FP16 and _can_count(board)
    counts: dict[int, int | None] = {}
    for mode in range(5) if counting else (0xFF,):
        (tmp_path / "input.bin").write_bytes(bytes([mode]))
        result = run_elf(board, elf, tmp_path, count_instructions=counting)
        found = FKERNELS_LINE.search(result.stdout)
        assert found, f"no result line:\n{result.stdout}{result.stderr}"
        assert int(found.group(1)) == 752 and found.group(2) == "0", found.group(0)
        counts[mode] = result.instructions
    if not counting:
        return
    macs = 64 * 64  # fkernels.c FK_N
    seed, c8, lib16, qf16, h8 = (counts[m] for m in range(5))
    assert seed is not None and c8 is not None and lib16 is not None and qf16 is not None
    assert h8 is not None
    print(
        f"\n{name}: fp32 matvec {seed / macs:.3f} -> {c8 / macs:.3f} instructions/MAC (c8), "
        f"fp16 {lib16 / macs:.3f} -> {qf16 / macs:.3f}, fp16 c8 {h8 / macs:.3f}"
    )
    if name in QINLINE_F_FP32:
        assert c8 < seed
    if name in QINLINE_F_FP16:
        assert qf16 < lib16
    if name in QINLINE_F_FP16_C8:
        assert h8 < lib16


MATHFNS_LINE = re.compile(r"colibri mathfns: (\d+) values")
#: tests/platform/mathfns.c: the grid i * 2^-13, i in -MF_GRID..MF_GRID, the MF_SCATTER bit
#: patterns i * 0x9E3779B1 and the edge values.
MF_GRID, MF_EXP, MF_SCATTER, MF_CHUNK = 81920, 1792, 65536, 256
MF_EDGES = [
    0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000,
    0x00000001, 0x80000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0xFF7FFFFF,
    0x3F600000, 0x3F5FFFFF, 0xBF600000, 0x40800000, 0x407FFFFF, 0xC0800000,
    0x3F200000, 0x3F1FFFFF, 0xBF200000, 0xC1300000, 0xC12FFFFF, 0xC1300001,
    0x42AE0000, 0xC2AE0000, 0x42B17218, 0xC2B17218, 0x42B17217, 0xC2B17217,
]  # fmt: skip
#: Boards the activation functions are checked on: every one (hard- and soft-float, Xtensa).
MATHFNS_BOARDS = ALL_BOARDS


def _mathfns_inputs() -> np.ndarray:
    grid = (np.arange(-MF_GRID, MF_GRID + 1, dtype=np.float64) / 8192.0).astype(np.float32)
    ends = (86.0 + np.arange(MF_EXP, dtype=np.float64) / 512.0).astype(np.float32)
    ends = np.stack([ends, -ends], axis=1).reshape(-1)  # +a, -a for each a
    idx = np.arange(MF_SCATTER, dtype=np.uint64)
    scatter = ((idx * 0x9E3779B1) & 0xFFFFFFFF).astype(np.uint32).view(np.float32)
    edges = np.asarray(MF_EDGES, dtype=np.uint32).view(np.float32)
    return np.concatenate([grid, ends, scatter, edges])


def _swiglu_gate(x: np.ndarray) -> np.ndarray:
    """colibri_swiglu_row's h with its gate the row of MF_CHUNK inputs reversed (mathfns.c)."""
    g = np.concatenate([x[i : i + MF_CHUNK][::-1] for i in range(0, x.size, MF_CHUNK)])
    with np.errstate(all="ignore"):
        return (f32.silu_f32(x) * g).astype(np.float32)


@pytest.mark.parametrize("name", MATHFNS_BOARDS)
def test_gelu_functions_equal_the_mirror(name: str, build_root: Path, tmp_path: Path) -> None:
    """colibri_erff, colibri_tanhf, colibri_gelu, colibri_gelu_tanh and colibri_silu
    (colibri_math.h, no libm), and the row functions colibri_silu_row, colibri_gelu_row,
    colibri_gelu_tanh_row and colibri_swiglu_row (vector lanes or the scalar common case, tails)
    give the numpy mirror's bits (colibri.reference.f32) on the board, for every multiple of
    2^-13 in [-10, 10], +-[86, 89.5) in steps of 2^-9 (exp's range ends), 65536 bit patterns of
    every exponent (subnormals, NaNs) and the branch edges, +-0, +-inf, NaN
    (tests/platform/mathfns.c; a NaN need only stay a NaN)."""
    require_board(name)
    board = load_board(name)
    elf = _build(board, "mathfns", build_root / name)
    result = run_elf(board, elf, tmp_path)
    x = _mathfns_inputs()
    found = MATHFNS_LINE.search(result.stdout)
    assert found and int(found.group(1)) == x.size, f"{result.stdout}{result.stderr}"
    got = np.fromfile(tmp_path / "output.bin", dtype="<f4").reshape(x.size, 9)
    fns = (f32.erf_f32, f32.tanh_f32, f32.gelu_f32, f32.gelu_tanh_f32, f32.silu_f32)
    rows = (f32.silu_f32, f32.gelu_f32, f32.gelu_tanh_f32, _swiglu_gate)
    for col, fn in enumerate(fns + rows):
        want = fn(x)
        differ = got[:, col].view(np.uint32) != want.view(np.uint32)
        differ &= ~(np.isnan(got[:, col]) & np.isnan(want))
        if differ.any():
            i = int(np.flatnonzero(differ)[0])
            pytest.fail(
                f"{name}: column {col} {fn.__name__}: {int(differ.sum())} of {x.size} differ, "
                "first "
                f"x = {x[i]!r} ({x[i : i + 1].view(np.uint32)[0]:#010x}): board {got[i, col]!r} "
                f"mirror {want[i]!r}"
            )


def test_qemu_failure_is_reported(tmp_path: Path) -> None:
    require_board("cortex-m4")
    bogus = tmp_path / "not-an-elf.elf"
    bogus.write_bytes(b"\x7fELF garbage")
    with pytest.raises(QemuError, match="cortex-m4"):
        run_elf(load_board("cortex-m4"), bogus, tmp_path, timeout=30)


def test_ci_never_skips_installable_boards() -> None:
    if not IN_CI:
        pytest.skip("only meaningful with CI=true")
    for board in list_boards():
        if board.name in NOT_INSTALLABLE:
            continue
        assert board.can_build()[0], board.can_build()[1]
        assert board.can_run()[0], board.can_run()[1]


def test_ram_overflow_fails_the_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A board whose RAM cannot hold .data + .bss + stack must fail to link, naming RAM."""
    require_board("cortex-m3", run=False)
    root = tmp_path / "resources"
    root.mkdir()
    for entry in ("SConstruct", "codegen", "runtime_c", "templates", "tests", "tools"):
        (root / entry).symlink_to(ROOT / entry)
    (root / "boards").mkdir()
    text = (ROOT / "boards" / "cortex-m3.toml").read_text()
    text = text.replace("stack_size = 4096", "stack_size = 70000")  # > the 64 KB of RAM
    (root / "boards" / "cortex-m3.toml").write_text(text)
    monkeypatch.setenv("COLIBRI_RESOURCE_DIR", str(root))  # scons() runs root/SConstruct
    proc = scons(["board=cortex-m3", "selftest=1", f"build_dir={tmp_path / 'build'}"])
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert re.search(r"RAM'? overflow", output), output


@pytest.mark.parametrize("name", ["cortex-m4", "xtensa-lx106"])
def test_timeout_is_reported(name: str, build_root: Path, tmp_path: Path) -> None:
    """A guest that never exits is killed at the timeout and reported, with its output."""
    require_board(name)
    board = load_board(name)
    elf = _build(board, "spin", build_root / f"{name}-spin")
    with pytest.raises(QemuError, match=r"timed out after 2 s(?s:.*)spin: looping forever"):
        run_elf(board, elf, tmp_path, timeout=2)
