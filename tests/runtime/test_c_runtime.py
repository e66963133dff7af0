"""Build and run the C runtime's own tests (host gcc with ASan/UBSan), check the MCU build
(no heap references, Cortex-M4 / Xtensa cross-compiles) and run the C API example on a toy
seed-layout model against a numpy computation of the layer."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from colibri.paths import runtime_sources
from conftest import ROOT, require_tool

SRC_DIR = ROOT / "runtime_c" / "src"
INCLUDE_DIR = ROOT / "runtime_c" / "include"
C_TEST_DIR = ROOT / "tests" / "c"
RUNTIME_SOURCES = runtime_sources()  # src/*.c and arch/x86_64/*.c (host ISA)
C_TESTS = sorted(C_TEST_DIR.glob("*.c"))

WARN_FLAGS = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-ffp-contract=off"]
HOST_FLAGS = [
    *WARN_FLAGS,
    "-O1",
    "-g",
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=undefined",
    "-fno-omit-frame-pointer",
]
CORTEX_M4_FLAGS = ["-mcpu=cortex-m4", "-mthumb", "-mfloat-abi=hard", "-mfpu=fpv4-sp-d16"]
HEAP_SYMBOLS = {"malloc", "free", "calloc", "realloc"}
SUMMARY = re.compile(r"^(\d+) passed, (\d+) failed$", re.MULTILINE)


def _run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, **kwargs)  # type: ignore[call-overload]


def _compile_host(sources: list[Path], exe: Path, defines: tuple[str, ...] = ()) -> None:
    cmd = [
        "gcc",
        *HOST_FLAGS,
        *(f"-D{d}" for d in defines),
        f"-I{INCLUDE_DIR}",
        f"-I{ROOT / 'runtime_c' / 'tiles'}",
        f"-I{SRC_DIR}",  # test_crc.c: colibri_internal.h
        f"-I{C_TEST_DIR}",
        *map(str, sources),
        "-o",
        str(exe),
        "-lm",
    ]
    result = _run(cmd)
    assert result.returncode == 0, f"compile failed:\n{' '.join(cmd)}\n{result.stderr}"


def test_runtime_sources_present() -> None:
    names = {p.name for p in RUNTIME_SOURCES}
    for required in (
        "status.c",
        "router.c",
        "loader.c",
        "sparse_forward.c",
        "kernels_ref.c",
        "model_static.c",
        "model_file.c",
    ):
        assert required in names
    assert C_TESTS, "no C tests in tests/c"


@pytest.mark.parametrize("test_source", C_TESTS, ids=lambda p: p.stem)
def test_c_unit(test_source: Path, tmp_path: Path) -> None:
    require_tool("gcc", "gcc")
    exe = tmp_path / test_source.stem
    _compile_host([test_source, *RUNTIME_SOURCES], exe)
    env = dict(os.environ)
    env.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
    env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
    result = _run([str(exe)], env=env, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    match = SUMMARY.search(result.stdout)
    assert match is not None, f"no summary line in output:\n{output}"
    assert int(match.group(1)) > 0 and int(match.group(2)) == 0, output


def test_c_router_scalar_lanes(tmp_path: Path) -> None:
    """tests/c/test_router.c with router.c's scalar lanes (COLIBRI_ROUTE_SCALAR: the branch-free
    exp of the boards without SSE2 / Neon / Helium vectors, M3 / M4 / M7 / A7) on the host."""
    require_tool("gcc", "gcc")
    exe = tmp_path / "test_router_scalar"
    _compile_host([C_TEST_DIR / "test_router.c", *RUNTIME_SOURCES], exe, ("COLIBRI_ROUTE_SCALAR",))
    result = _run([str(exe)], timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    match = SUMMARY.search(result.stdout)
    assert match is not None, f"no summary line in output:\n{output}"
    assert int(match.group(1)) > 0 and int(match.group(2)) == 0, output


def _heap_references(nm: str, objects: list[Path]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for obj in objects:
        result = _run([nm, "-u", str(obj)])
        assert result.returncode == 0, result.stderr
        undefined = {line.split()[-1] for line in result.stdout.splitlines() if line.strip()}
        bad = undefined & HEAP_SYMBOLS
        if bad:
            found[obj.name] = bad
    return found


def _compile_objects(cc: str, flags: list[str], out_dir: Path) -> list[Path]:
    objects = []
    for src in RUNTIME_SOURCES:
        obj = out_dir / (src.stem + ".o")
        cmd = [cc, *flags, f"-I{INCLUDE_DIR}", "-c", str(src), "-o", str(obj)]
        result = _run(cmd)
        assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stderr}"
        objects.append(obj)
    return objects


def test_no_filesystem_build_has_no_heap(tmp_path: Path) -> None:
    require_tool("gcc", "gcc")
    nm = require_tool("nm", "binutils")
    objects = _compile_objects("gcc", [*WARN_FLAGS, "-O2", "-DCOLIBRI_NO_FILESYSTEM"], tmp_path)
    assert _heap_references(nm, objects) == {}
    defined = _run([nm, "--defined-only", *map(str, objects)]).stdout
    assert re.search(r"\bT colibri_init\b", defined), "colibri_init stub missing"
    assert re.search(r"\bT colibri_cleanup\b", defined)


def test_filesystem_build_heap_only_in_model_file(tmp_path: Path) -> None:
    require_tool("gcc", "gcc")
    nm = require_tool("nm", "binutils")
    objects = _compile_objects("gcc", [*WARN_FLAGS, "-O2"], tmp_path)
    # the two POSIX file loaders: colibri_init (one MoE block: its blocks, and config.json's
    # text in the seed layout's reader) and colibri_lm_init (whole models); and the packed
    # copies a generated model makes at setup on an x86-64 host (mat_pack.c, colibri_pack_*)
    heap = set(_heap_references(nm, objects))
    loaders = {"model_file.o", "model_seed.o", "mat_pack.o"}
    assert heap <= loaders | {o.name for o in objects if o.name.startswith("lm_")}


def test_clang_build(tmp_path: Path) -> None:
    """Backend developers embed the runtime with clang too: every runtime source and the POSIX
    platform build warning-free with clang's -Wall -Wextra -Werror -pedantic (no GCC-only
    attribute such as noipa reaches clang: colibri_platform.h CLB_PLATFORM_MARKER)."""
    cc = require_tool("clang", "clang")
    objects = _compile_objects(cc, [*WARN_FLAGS, "-O2"], tmp_path)
    platform = ROOT / "runtime_c" / "platform"
    obj = tmp_path / "platform_posix.o"
    src = platform / "posix" / "platform_posix.c"
    cmd = [cc, *WARN_FLAGS, "-O2", f"-I{platform}", "-c", str(src), "-o", str(obj)]
    result = _run(cmd)
    assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stderr}"
    assert len(objects) == len(RUNTIME_SOURCES)


def test_cortex_m4_build(tmp_path: Path) -> None:
    cc = require_tool("arm-none-eabi-gcc", "gcc-arm-none-eabi libnewlib-arm-none-eabi")
    flags = [*CORTEX_M4_FLAGS, *WARN_FLAGS, "-O2", "-DCOLIBRI_NO_FILESYSTEM"]
    objects = _compile_objects(cc, flags, tmp_path)
    nm = shutil.which("arm-none-eabi-nm")
    if nm is not None:
        assert _heap_references(nm, objects) == {}


def test_xtensa_lx106_build(tmp_path: Path) -> None:
    cc = require_tool("xtensa-lx106-elf-gcc", "gcc-xtensa-lx106")
    flags = ["-mlongcalls", *WARN_FLAGS, "-O2", "-DCOLIBRI_NO_FILESYSTEM"]
    objects = _compile_objects(cc, flags, tmp_path)
    nm = shutil.which("xtensa-lx106-elf-nm")
    if nm is not None:
        assert _heap_references(nm, objects) == {}


# ---------------------------------------------------------------------------------------------
# C API example on a toy seed-layout model


def _write_seed_model(directory: Path, rng: np.random.Generator, n_experts: int, d: int, f: int):
    router = rng.standard_normal((n_experts, d)).astype(np.float32)
    experts = []
    blob = bytearray(struct.pack("<III", 0x434F4C49, 1, n_experts))
    for _ in range(n_experts):
        w1 = (rng.standard_normal((d, f)) / math.sqrt(d)).astype(np.float32)
        b1 = (0.1 * rng.standard_normal(f)).astype(np.float32)
        w2 = (rng.standard_normal((f, d)) / math.sqrt(f)).astype(np.float32)
        b2 = (0.1 * rng.standard_normal(d)).astype(np.float32)
        for array in (w1, b1, w2, b2):
            blob += array.astype("<f4").tobytes()
        experts.append((w1, b1, w2, b2))
    model = directory / "toy_moe.bin"
    model.write_bytes(bytes(blob))
    (directory / "router.bin").write_bytes(router.astype("<f4").tobytes())
    config = {
        "n_experts": n_experts,
        "k": 1,
        "hidden_size": d,
        "intermediate_size": f,
        "activation": "gelu",
        "norm_topk_prob": False,
    }
    (directory / "config.json").write_text(json.dumps(config))
    return model, router, experts


def _reference_layer(
    x: np.ndarray, router: np.ndarray, experts: list
) -> tuple[int, float, np.ndarray]:
    """Top-1 MoE layer in float64: softmax gate over all experts, not renormalised."""
    logits = router.astype(np.float64) @ x
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    expert = int(np.argmax(logits))  # ties: lowest index, as the runtime
    w1, b1, w2, b2 = (a.astype(np.float64) for a in experts[expert])
    h = x @ w1 + b1
    h = np.array([0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))) for v in h])
    y = h @ w2 + b2
    return expert, float(probs[expert]), probs[expert] * y


def test_infer_example_on_seed_model(tmp_path: Path) -> None:
    require_tool("gcc", "gcc")
    exe = tmp_path / "infer"
    _compile_host([ROOT / "examples" / "c_api" / "infer.c", *RUNTIME_SOURCES], exe)

    rng = np.random.default_rng(1234)
    model, router, experts = _write_seed_model(tmp_path, rng, n_experts=4, d=8, f=16)
    result = _run([str(exe), str(model)], timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout

    input_line = re.search(r"^Input:(.*)$", out, re.MULTILINE)
    output_line = re.search(r"^Output:(.*)$", out, re.MULTILINE)
    chosen = re.search(r"^Expert chosen: (-?\d+), Gate weight: ([0-9.]+)$", out, re.MULTILINE)
    assert input_line and output_line and chosen, out
    x = np.array([float(v) for v in input_line.group(1).split()])
    np.testing.assert_allclose(x, [1.0, 0.5, 0.2, 0.8, 0.1, 0.9, 0.4, 0.6], rtol=0, atol=1e-6)
    y_c = np.array([float(v) for v in output_line.group(1).split()])

    expert, gate, y_ref = _reference_layer(x.astype(np.float32).astype(np.float64), router, experts)
    assert int(chosen.group(1)) == expert
    assert float(chosen.group(2)) == pytest.approx(gate, abs=5e-4)
    assert gate < 1.0  # softmax over all experts, k = 1, not renormalised
    scale = float(np.max(np.abs(y_ref)))
    np.testing.assert_allclose(y_c, y_ref, rtol=1e-5, atol=1e-5 * scale)
    assert "Loader:" in out


def test_infer_example_reports_errors(tmp_path: Path) -> None:
    require_tool("gcc", "gcc")
    exe = tmp_path / "infer"
    _compile_host([ROOT / "examples" / "c_api" / "infer.c", *RUNTIME_SOURCES], exe)
    bogus = tmp_path / "bogus.bin"
    bogus.write_bytes(b"NOTAMODEL" * 4)
    result = _run([str(exe), str(bogus)], timeout=60)
    assert result.returncode == 1
    assert "bad magic" in result.stderr


def test_infer_example_checks_cli_containers(tmp_path: Path) -> None:
    """Containers written by `colibri convert` pass the C runtime's CRC-32 check; a flipped
    bit in a blob and a NaN weight in a seed-layout file are refused with their own status."""
    require_tool("gcc", "gcc")
    exe = tmp_path / "infer"
    _compile_host([ROOT / "examples" / "c_api" / "infer.c", *RUNTIME_SOURCES], exe)
    toy, clb = tmp_path / "toy", tmp_path / "toy.clb"
    for args in (
        ["make-toy", "--out", str(toy), "--experts", "4", "--hidden", "8", "--ff", "16"],
        ["convert", str(toy / "model.bin"), "--out", str(clb)],
    ):
        made = _run([sys.executable, "-m", "colibri", *args], timeout=120)
        assert made.returncode == 0, made.stderr
    result = _run([str(exe), str(clb)], timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr

    data = bytearray(clb.read_bytes())
    data[-7] ^= 0x10  # inside the last expert's b2
    bad = tmp_path / "flipped.clb"
    bad.write_bytes(bytes(data))
    result = _run([str(exe), str(bad)], timeout=60)
    assert result.returncode == 1
    assert "fails its CRC-32 check" in result.stderr

    weights = bytearray((toy / "model.bin").read_bytes())
    weights[12 + 4 * 5 : 12 + 4 * 6] = struct.pack("<f", math.nan)  # expert 0, W1[0][5]
    (toy / "model.bin").write_bytes(bytes(weights))
    result = _run([str(exe), str(toy / "model.bin")], timeout=60)
    assert result.returncode == 1
    assert "NaN or Inf" in result.stderr
