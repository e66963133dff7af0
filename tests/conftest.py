"""Shared fixtures: the CLI as a subprocess, toy models on disk, board availability."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() == "true"


def _esp32s3_installable() -> bool:
    """scripts/setup.sh builds the esp32s3 toolchain and QEMU core when the ESP32-S3 core
    overlay is there (COLIBRI_XTENSA_OVERLAY, default ../shared/third_party/xtensa-overlays);
    an ESP-IDF toolchain on PATH counts too."""
    overlay = os.environ.get("COLIBRI_XTENSA_OVERLAY") or str(
        ROOT.parent / "shared" / "third_party" / "xtensa-overlays"
    )
    return Path(overlay).exists() or shutil.which("xtensa-esp32s3-elf-gcc") is not None


#: Boards whose toolchain scripts/setup.sh cannot install on this machine (it may skip them,
#: even with CI=true, saying how to get it): esp32s3 without its core overlay or ESP-IDF.
NOT_INSTALLABLE = set() if _esp32s3_installable() else {"esp32s3"}


def require_board(name: str, run: bool = True) -> None:
    """Skip (locally) or fail (CI) when a board's toolchain or emulator is missing."""
    from colibri.boards import load_board

    board = load_board(name)
    ok, why = board.can_build()
    if ok and run:
        ok, why = board.can_run()
    if ok:
        return
    if IN_CI and name not in NOT_INSTALLABLE:
        pytest.fail(f"CI=true and {why}: scripts/setup.sh should have installed it")
    pytest.skip(why)


def require_tool(name: str, package: str) -> str:
    """The path of program `name`; skips (locally) or fails (CI, where scripts/setup.sh
    installs Debian's `package`) when it is missing."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} not found; install it with: apt-get install {package}"
        if IN_CI:
            pytest.fail(f"{message} (CI=true: scripts/setup.sh installs it)")
        pytest.skip(message)
    return path


#: Flags of the host build of the quantised kernels loaded with ctypes (bit-exact tests).
KERNEL_CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off"]


def host_kernels(out_dir: Path) -> ctypes.CDLL:
    """runtime_c/src/kernels_q.c (and runtime_c/arch/x86_64, its x86-64 levels) built for the host
    as a shared library in out_dir and loaded (skips without a host C compiler); return types of
    the non-void kernels set."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no host C compiler")
    so = out_dir / "libkq.so"
    subprocess.run(
        [cc, *KERNEL_CFLAGS, "-shared", "-fPIC", "-I", str(ROOT / "runtime_c" / "include")]
        + [str(ROOT / "runtime_c" / "src" / "kernels_q.c")]
        + [str(p) for p in sorted((ROOT / "runtime_c" / "arch" / "x86_64").glob("*.c"))]
        + ["-o", str(so), "-lm"],
        check=True,
    )
    lib = ctypes.CDLL(str(so))
    lib.colibri_f16_to_f32.restype = ctypes.c_float
    lib.colibri_f16_to_f32.argtypes = [ctypes.c_uint16]
    lib.colibri_quantize_row_q8.restype = None
    lib.colibri_dot_q8.restype = ctypes.c_int32
    lib.colibri_dot_q4_q8.restype = ctypes.c_int32
    return lib


def probe_object(board: str, source: str, tmp_path: Path) -> dict[str, tuple[list[int], int]]:
    """Compile C `source` for `board` (its flags, the runtime's include and tiles directories)
    and read its symbols back from the object: name -> (the 32-bit words of its data in the
    object's byte order, its size in bytes). Used to check C struct layouts against numpy
    dtypes on every compiler."""
    from colibri.boards import load_board
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    b = load_board(board)
    src = tmp_path / "probe.c"
    src.write_text(source)
    obj = tmp_path / "probe.o"
    include = ["-I", str(ROOT / "runtime_c" / "include"), "-I", str(ROOT / "runtime_c" / "tiles")]
    subprocess.run([b.compiler, *b.compile_flags(), *include, "-c", str(src), "-o", str(obj)],
                   check=True)  # fmt: skip
    out: dict[str, tuple[list[int], int]] = {}
    with open(obj, "rb") as f:
        elf = ELFFile(f)
        symtab = elf.get_section_by_name(".symtab")
        assert isinstance(symtab, SymbolTableSection)
        order = "<" if elf.little_endian else ">"
        for sym in symtab.iter_symbols():
            shndx, size = sym["st_shndx"], int(sym["st_size"])
            if not sym.name or not isinstance(shndx, int) or size == 0:
                continue
            sec = elf.get_section(shndx)
            raw = b"" if sec["sh_type"] == "SHT_NOBITS" else sec.data()
            raw = raw[sym["st_value"] : sym["st_value"] + size // 4 * 4]
            words = [int.from_bytes(raw[i : i + 4], "little" if order == "<" else "big")
                     for i in range(0, len(raw), 4)]  # fmt: skip
            out[sym.name] = (words, size)
    return out


def scons_cmd() -> list[str]:
    """SCons from the virtualenv running the tests (its `scons` script, else `-m SCons`)."""
    scons = Path(sys.executable).with_name("scons")
    return [str(scons)] if scons.exists() else [sys.executable, "-m", "SCons"]


def run_in_root(
    cmd: list[str], env: dict[str, str], **kwargs: object
) -> subprocess.CompletedProcess[str]:
    """Run cmd in the repository root with env added to the environment; never raises on a
    non-zero exit (the sanitizer tests read the output)."""
    return subprocess.run(  # type: ignore[call-overload]
        cmd, capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, **env), check=False,
        **kwargs,
    )  # fmt: skip


def run_colibri(env: dict[str, str], *args: str) -> str:
    """`python -m colibri ARGS` through run_in_root; a non-zero exit fails the test."""
    result = run_in_root([sys.executable, "-m", "colibri", *args], env, timeout=120)
    assert result.returncode == 0, f"colibri {' '.join(args)}:\n{result.stderr}"
    return result.stdout


def run_ok(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    """Run a command; a non-zero exit fails the test with its output."""
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    )
    return proc


def run_cli(
    *args: str, cwd: Path | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run `python -m colibri ARGS`; with check=True a non-zero exit fails the test."""
    proc = subprocess.run(
        [sys.executable, "-m", "colibri", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
    )
    if check and proc.returncode != 0:
        pytest.fail(
            f"colibri {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


@pytest.fixture
def cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    return run_cli


@pytest.fixture
def toy_dir(tmp_path: Path) -> Path:
    """The seed toy (2 experts, d_model 8, d_ff 16, k 1) in the seed layout."""
    from colibri.frontends.seed import make_toy, write_seed

    write_seed(make_toy(), tmp_path / "toy")
    return tmp_path / "toy"


#: Headless Chromium builds that can dump a page's DOM (Debian: chromium-headless-shell).
CHROMIUM_NAMES = ("chromium-headless-shell", "chromium", "chromium-browser")


def dump_dom(page: Path) -> str:
    """The DOM headless Chromium builds from an HTML file (--dump-dom, after parsing and any
    script); skips (locally) or fails (CI) when no Chromium is installed."""
    exe = next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)
    if exe is None:
        message = (
            "headless Chromium not found; install it with: apt-get install chromium-headless-shell"
        )
        if IN_CI:
            pytest.fail(f"{message} (CI=true: scripts/setup.sh installs it)")
        pytest.skip(message)
    cmd = [
        exe,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--dump-dom",
        page.resolve().as_uri(),
    ]
    import tempfile

    with tempfile.TemporaryDirectory(prefix="chromium-home-") as home:  # its profile, not ~'s
        proc = run_ok(cmd, timeout=120, env=dict(os.environ, HOME=home))
    assert "</html>" in proc.stdout, f"{exe} dumped no page:\n{proc.stderr[-2000:]}"
    return proc.stdout
