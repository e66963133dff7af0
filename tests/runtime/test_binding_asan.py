"""The Python binding under AddressSanitizer and UBSan (issue 37): libcolibri.so built with
-fsanitize=address,undefined (COLIBRI_SANITIZE) and loaded into a Python that preloads the
sanitizer runtime, then the binding's argument tests, hypothesis properties included
(tests/runtime/test_binding_args.py: random shapes, dtypes, integers and positions), run in it.
Every bad call must be a named Python error before C sees it, so the sanitizers must stay
silent: before the checks, (3, 7), (8,) or a scalar read past the input in colibri_route. A
canary first calls C past the checks, to show the sanitizer is live in that process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import IN_CI, ROOT, require_tool

REPORTS = ("ERROR: AddressSanitizer", "runtime error:", "ERROR: LeakSanitizer")

#: The canary: colibri_forward called past the binding's checks with 3 tokens' worth of rows
#: declared and one row given: the sanitizer must report the read past the buffer.
CANARY = """
import numpy as np
from colibri.emit.container import write_container
from colibri.frontends.seed import make_toy
from colibri.targets.binding import Runtime
path = write_container(make_toy(experts=4, hidden=8, ff=16, top_k=2, seed=5), "{path}")
with Runtime(path) as rt:
    x = np.ones((1, 8), np.float32)
    y = np.zeros((3, 8), np.float32)
    ids, gates = np.zeros((3, 2), np.int32), np.zeros((3, 2), np.float32)
    rt._lib.colibri_forward(rt._handle, x, y, 3, 8, 2, ids, gates, np.zeros(3, np.float32))
print("canary not caught")
"""


def test_binding_args_under_asan(tmp_path: Path) -> None:
    gcc = require_tool("gcc", "gcc")
    lib = subprocess.run(
        [gcc, "-print-file-name=libasan.so"], capture_output=True, text=True, check=True
    ).stdout.strip()
    if not Path(lib).is_file():
        message = f"{gcc} has no libasan.so here ({lib}): apt-get install libasan8"
        if IN_CI:
            pytest.fail(f"{message} (CI=true: gcc's sanitizer runtime comes with the set-up)")
        pytest.skip(message)
    env = dict(
        os.environ,
        CC=gcc,
        COLIBRI_SANITIZE="address,undefined",
        LD_PRELOAD=lib,
        # CPython and numpy keep memory until exit by design: leaks are not what is checked
        ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=1",
        UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1",
        PYTHONPATH=str(ROOT / "codegen"),
    )
    canary = subprocess.run(
        [sys.executable, "-c", CANARY.format(path=tmp_path / "toy.clb")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert "ERROR: AddressSanitizer: heap-buffer-overflow" in canary.stderr, (
        canary.stdout + canary.stderr[-3000:]
    )
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-n",
            "0",
            "-p",
            "no:cacheprovider",
            str(ROOT / "tests" / "runtime" / "test_binding_args.py"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT / "tests",
        timeout=1500,
        check=False,
    )
    output = r.stdout + r.stderr
    for report in REPORTS:
        assert report not in output, output[-6000:]
    assert r.returncode == 0, output[-6000:]
    assert " passed" in output and " failed" not in output, output[-3000:]
