"""Code quality gates, run by the same test command as everything else: ruff (lint + format),
mypy, and clang-format on the hand-written C."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import IN_CI, ROOT


def _tool(name: str) -> list[str]:
    exe = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if exe is None:
        if IN_CI:
            pytest.fail(f"{name} is not installed; scripts/setup.sh installs it")
        pytest.skip(f"{name} not installed (pip install ruff mypy / apt-get install clang-format)")
    return [exe]


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"


def test_ruff_lint() -> None:
    _run(_tool("ruff") + ["check", "codegen", "tests", "benchmarks", "fuzz", "setup.py"])


def test_ruff_format() -> None:
    _run(
        _tool("ruff") + ["format", "--check", "codegen", "tests", "benchmarks", "fuzz", "setup.py"]
    )


def test_mypy() -> None:
    _run(_tool("mypy"))


def test_clang_format() -> None:
    files = sorted(
        str(p.relative_to(ROOT))
        for d in ("runtime_c", "examples", "tests/c", "tests/platform", "tools", "fuzz")
        for p in (ROOT / d).rglob("*")
        if p.suffix in (".c", ".h")
    )
    assert files
    _run(_tool("clang-format") + ["--dry-run", "--Werror", *files])
