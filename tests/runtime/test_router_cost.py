"""Instruction cost of colibri_route_gate on the host (issue 11): benchmarks/router_bench.c
built and counted by benchmarks/router_table.py with callgrind (deterministic counts, no wall
time). 1024 tokens, 64 experts, k 2. Measured when written: 11.5x fewer instructions than qsort
+ take-k + softmax and 2.4x fewer than the plain two-pass loop; the asserts are the issue's
goals (6x and 1.3x), which leaves about a factor 2 of margin."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from types import ModuleType

import pytest
from colibri.boards import load_board
from conftest import IN_CI, ROOT


def _router_table() -> ModuleType:
    path = ROOT / "benchmarks" / "router_table.py"
    spec = importlib.util.spec_from_file_location("router_table", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_route_gate_is_cheaper_than_the_obvious_loops(tmp_path: Path) -> None:
    if shutil.which("valgrind") is None:
        if IN_CI:
            pytest.fail("CI=true and valgrind is missing: scripts/setup.sh installs it")
        pytest.skip("host instruction counts need valgrind (apt-get install valgrind)")
    table = _router_table()
    board = load_board("host")
    elf = table.build(board, 1024, tmp_path)
    qsort_n, plain_n, route_n = table.count(board, elf, 1024, 1)
    print("\n" + table.table(board, [qsort_n, plain_n, route_n], 1024))
    assert qsort_n >= 6.0 * route_n, (qsort_n, route_n)
    assert plain_n >= 1.3 * route_n, (plain_n, route_n)
