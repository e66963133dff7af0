"""`scons install` for the host board: the installed library, headers, CMake package and
pkg-config file are enough to build examples/c_api/infer.c both ways (find_package(colibri)
and `cc $(pkg-config --cflags --libs colibri)`), and both binaries give the numpy reference's
answer on a toy model made with the CLI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, require_tool, run_cli, run_ok

INFER = ROOT / "examples" / "c_api" / "infer.c"
#: The input token infer.c uses when d_model is 8.
INFER_INPUT = [1.0, 0.5, 0.2, 0.8, 0.1, 0.9, 0.4, 0.6]
INSTALLED = [
    "lib/libcolibri.a",
    "include/colibri.h",
    "include/colibri_quant.h",
    "include/colibri_transformer.h",
    "lib/cmake/colibri/colibriConfig.cmake",
    "lib/cmake/colibri/colibriConfigVersion.cmake",
    "lib/pkgconfig/colibri.pc",
    "share/licenses/colibri/LICENSE",
]

CMAKE_PROJECT = """\
cmake_minimum_required(VERSION 3.16)
project(colibri_consumer C)
find_package(colibri 0.1 REQUIRED)
add_executable(infer "{infer}")
target_link_libraries(infer PRIVATE colibri::colibri)
"""


def _scons(*args: str) -> subprocess.CompletedProcess[str]:
    return run_ok([sys.executable, "-m", "SCons", "-Q", "-C", str(ROOT), *args])


@pytest.fixture(scope="module")
def prefix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prefix with `scons install board=host` done into it."""
    require_tool("gcc", "gcc")
    work = tmp_path_factory.mktemp("install")
    _scons("board=host", f"build_dir={work / 'build'}", "install", f"prefix={work / 'prefix'}")
    return work / "prefix"


@pytest.fixture(scope="module")
def toy_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray, int, float]:
    """A top-1 toy model (seed layout, d_model 8) and the numpy reference's answer for
    infer.c's input token: (model.bin, output, expert, gate)."""
    work = tmp_path_factory.mktemp("toy")
    run_cli(
        "make-toy", "--out", str(work / "toy"), "--experts", "4", "--hidden", "8", "--ff", "16",
        "--top-k", "1", "--seed", "7",
    )  # fmt: skip
    np.save(work / "x.npy", np.array([INFER_INPUT], dtype=np.float32))
    model = work / "toy" / "model.bin"
    run_cli(
        "reference", str(model), "--input", str(work / "x.npy"), "--output",
        str(work / "y.npy"), "--routing", str(work / "r.npz"),
    )  # fmt: skip
    routing = np.load(work / "r.npz")
    expert = int(routing["expert_ids"][0, 0])
    gate = float(routing["gates"][0, 0])
    return model, np.load(work / "y.npy")[0], expert, gate


def _check_infer(exe: Path, toy: tuple[Path, np.ndarray, int, float]) -> None:
    model, y_ref, expert, gate = toy
    out = run_ok([str(exe), str(model)], timeout=60).stdout
    output_line = re.search(r"^Output:(.*)$", out, re.MULTILINE)
    chosen = re.search(r"^Expert chosen: (-?\d+), Gate weight: ([0-9.]+)$", out, re.MULTILINE)
    assert output_line and chosen, out
    y = np.array([float(v) for v in output_line.group(1).split()])
    assert int(chosen.group(1)) == expert, out
    assert float(chosen.group(2)) == pytest.approx(gate, abs=5e-4)
    scale = float(np.max(np.abs(y_ref)))
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5 * scale)


def test_install_layout(prefix: Path) -> None:
    missing = [name for name in INSTALLED if not (prefix / name).is_file()]
    assert not missing, f"not installed: {missing}"
    installed_headers = sorted(p.name for p in (prefix / "include").glob("colibri*.h"))
    public_headers = sorted(p.name for p in (ROOT / "runtime_c" / "include").glob("*.h"))
    assert installed_headers == public_headers
    pc = (prefix / "lib" / "pkgconfig" / "colibri.pc").read_text()
    assert f"prefix={prefix}" in pc
    assert re.search(r"^Libs: .*-lcolibri -lm -lpthread$", pc, re.MULTILINE), pc
    config = (prefix / "lib" / "cmake" / "colibri" / "colibriConfig.cmake").read_text()
    assert "colibri::colibri" in config and '"m;pthread"' in config
    assert "@COLIBRI_" not in pc + config


def test_install_refuses_bare_metal_board(tmp_path: Path) -> None:
    require_tool(
        "arm-none-eabi-gcc", "gcc-arm-none-eabi libnewlib-arm-none-eabi"
    )  # board must load
    proc = subprocess.run(
        [sys.executable, "-m", "SCons", "-Q", "-C", str(ROOT), "board=cortex-m3"]
        + [f"build_dir={tmp_path / 'build'}", "install", f"prefix={tmp_path / 'prefix'}"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0
    assert "bare metal" in proc.stdout + proc.stderr
    assert not (tmp_path / "prefix").exists()


def test_find_package_builds_infer(
    prefix: Path, toy_model: tuple[Path, np.ndarray, int, float], tmp_path: Path
) -> None:
    cmake = require_tool("cmake", "cmake")
    project = tmp_path / "consumer"
    project.mkdir()
    (project / "CMakeLists.txt").write_text(CMAKE_PROJECT.format(infer=INFER.as_posix()))
    build = tmp_path / "build"
    run_ok([cmake, "-S", str(project), "-B", str(build), f"-DCMAKE_PREFIX_PATH={prefix}"])
    run_ok([cmake, "--build", str(build)])
    cache = (build / "CMakeCache.txt").read_text()
    assert f"colibri_DIR:PATH={prefix}/lib/cmake/colibri" in cache
    _check_infer(build / "infer", toy_model)


def test_find_package_rejects_newer_version(prefix: Path, tmp_path: Path) -> None:
    cmake = require_tool("cmake", "cmake")
    project = tmp_path / "consumer"
    project.mkdir()
    text = CMAKE_PROJECT.format(infer=INFER.as_posix()).replace("colibri 0.1", "colibri 0.2")
    (project / "CMakeLists.txt").write_text(text)
    proc = subprocess.run(
        [cmake, "-S", str(project), "-B", str(tmp_path / "b"), f"-DCMAKE_PREFIX_PATH={prefix}"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0
    assert "0.1.0" in proc.stderr, proc.stderr


def test_pkg_config_builds_infer(
    prefix: Path, toy_model: tuple[Path, np.ndarray, int, float], tmp_path: Path
) -> None:
    pkg_config = require_tool("pkg-config", "pkg-config")
    env = dict(os.environ, PKG_CONFIG_PATH=str(prefix / "lib" / "pkgconfig"))
    flags = run_ok([pkg_config, "--cflags", "--libs", "colibri"], env=env).stdout.split()
    assert f"-I{prefix}/include" in flags and "-lcolibri" in flags
    exe = tmp_path / "infer"
    run_ok(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", str(INFER), "-o", str(exe), *flags])
    _check_infer(exe, toy_model)
