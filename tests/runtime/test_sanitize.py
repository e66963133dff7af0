"""The documented sanitizer switch, `scons board=host sanitize=address,undefined`: the C unit
tests linked against the sanitized libcolibri.a, and one end-to-end host model (a seed-layout
toy from the CLI, generated for the host, built by SCons with ASan + UBSan) run clean and
match the numpy reference. Any sanitizer report fails the run (halt_on_error, UBSan without
recovery)."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT

SANITIZE = "address,undefined"
SAN_FLAGS = [
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=undefined",
    "-fno-omit-frame-pointer",
    "-g",
]
SAN_ENV = {
    "ASAN_OPTIONS": "halt_on_error=1:abort_on_error=0:detect_leaks=1",
    "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
}
RUNNER_IN_MAGIC = 0x49424C43  # "CLBI", runtime_c/runner/main.c
RUNNER_OUT_MAGIC = 0x4F424C43  # "CLBO"
TOLERANCE = 2e-5  # of max |y| (README: FP32_TOLERANCE)


def _scons() -> list[str]:
    scons = Path(sys.executable).with_name("scons")
    return [str(scons)] if scons.exists() else [sys.executable, "-m", "SCons"]


def _run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, **SAN_ENV)
    return subprocess.run(  # type: ignore[call-overload]
        cmd, capture_output=True, text=True, cwd=ROOT, env=env, check=False, **kwargs
    )


def _colibri(*args: str) -> None:
    result = _run([sys.executable, "-m", "colibri", *args], timeout=120)
    assert result.returncode == 0, f"colibri {' '.join(args)}:\n{result.stderr}"


def _assert_clean(result: subprocess.CompletedProcess[str]) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "ERROR: AddressSanitizer" not in output, output[-6000:]
    assert "runtime error:" not in output, output[-6000:]


@pytest.fixture(scope="module")
def sanitized_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc not found; install it with: apt-get install gcc")
    out = tmp_path_factory.mktemp("build_asan")
    result = _run(
        [*_scons(), "-Q", f"-C{ROOT}", "board=host", f"sanitize={SANITIZE}", f"build_dir={out}"],
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (out / "libcolibri.a").exists()
    return out


def test_sanitize_rejected_for_other_boards() -> None:
    result = _run([*_scons(), "-Q", "board=cortex-m4", f"sanitize={SANITIZE}"], timeout=120)
    assert result.returncode != 0
    assert "needs board=host" in result.stdout + result.stderr


def test_sanitize_rejects_unknown_sanitizer() -> None:
    result = _run([*_scons(), "-Q", "board=host", "sanitize=address,thread"], timeout=120)
    assert result.returncode != 0
    assert "unknown sanitizer(s) thread" in result.stdout + result.stderr


def test_library_is_instrumented(sanitized_build: Path) -> None:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm not found; install it with: apt-get install binutils")
    symbols = _run([nm, str(sanitized_build / "libcolibri.a")]).stdout
    assert "__asan_report" in symbols
    assert "__ubsan_handle" in symbols


@pytest.mark.parametrize(
    "test_source", sorted((ROOT / "tests" / "c").glob("*.c")), ids=lambda p: p.stem
)
def test_c_unit_tests_sanitized(test_source: Path, sanitized_build: Path, tmp_path: Path) -> None:
    exe = tmp_path / test_source.stem
    cmd = [
        "gcc",
        "-std=c11",
        "-O1",
        "-ffp-contract=off",
        *SAN_FLAGS,
        f"-I{ROOT / 'runtime_c' / 'include'}",
        f"-I{ROOT / 'tests' / 'c'}",
        str(test_source),
        str(sanitized_build / "libcolibri.a"),
        "-o",
        str(exe),
        "-lm",
    ]
    result = _run(cmd)
    assert result.returncode == 0, result.stderr
    result = _run([str(exe)], timeout=300)
    _assert_clean(result)
    assert " 0 failed" in result.stdout, result.stdout


def _read_runner_output(path: Path) -> tuple[np.ndarray, np.ndarray]:
    data = path.read_bytes()
    magic, tokens, d_model, top_k, chunk = struct.unpack_from("<5I", data)
    assert magic == RUNNER_OUT_MAGIC
    outputs, ids = [], []
    pos = 20
    for start in range(0, tokens, chunk):
        n = min(chunk, tokens - start)
        outputs.append(np.frombuffer(data, "<f4", n * d_model, pos).reshape(n, d_model))
        pos += 4 * n * d_model
        ids.append(np.frombuffer(data, "<i4", n * top_k, pos).reshape(n, top_k))
        pos += 4 * n * top_k + 4 * n * top_k  # expert ids, then gates
    assert pos == len(data)
    return np.concatenate(outputs), np.concatenate(ids)


def test_end_to_end_host_model_sanitized(tmp_path: Path) -> None:
    if shutil.which("gcc") is None:
        pytest.skip("gcc not found; install it with: apt-get install gcc")
    toy, gen, build = tmp_path / "toy", tmp_path / "gen" / "toy", tmp_path / "build"
    _colibri("make-toy", "--out", str(toy), "--experts", "6", "--hidden", "16", "--ff", "32")
    _colibri("generate", str(toy / "model.bin"), "--board", "host", "--out", str(gen))
    # `colibri build` passes no build variables, so SCons is called directly with the switch.
    result = _run(
        [
            *_scons(),
            "-Q",
            f"-C{ROOT}",
            "board=host",
            f"model={gen}",
            f"build_dir={build}",
            f"sanitize={SANITIZE}",
        ],
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    runner = build / "toy" / "colibri_runner"
    assert "__asan_init" in _run(["nm", str(runner)]).stdout

    rng = np.random.default_rng(14)
    x = rng.standard_normal((45, 16)).astype(np.float32)  # more tokens than one chunk
    inp, out = tmp_path / "input.bin", tmp_path / "output.bin"
    inp.write_bytes(struct.pack("<3I", RUNNER_IN_MAGIC, *x.shape) + x.astype("<f4").tobytes())
    result = _run([str(runner), str(inp), str(out)], timeout=120)
    _assert_clean(result)
    y, _ = _read_runner_output(out)

    np.save(tmp_path / "x.npy", x)
    _colibri(
        "reference",
        str(toy / "model.bin"),
        "--input",
        str(tmp_path / "x.npy"),
        "--output",
        str(tmp_path / "y_ref.npy"),
    )
    y_ref = np.load(tmp_path / "y_ref.npy")
    scale = float(np.max(np.abs(y_ref)))
    np.testing.assert_allclose(y, y_ref, rtol=0, atol=TOLERANCE * scale)
