"""`python benchmarks/X.py --help` of every benchmark script works and its description is whole
sentences (issue 39, item 4.7: two scripts printed their docstring's first line, which stopped
mid-sentence). Only --help runs, so this is fast and needs no toolchain; a script whose imports
need an optional package that is missing here is skipped with the package's name."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
#: Scripts with a command line (helpers without `__main__`, such as bench_common.py, have none).
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if "__main__" in p.read_text())
HEADINGS = re.compile(r"^(options|optional arguments|positional arguments):", re.MULTILINE)


def description(help_text: str) -> str:
    """argparse's description: between the usage block and the first argument heading."""
    blocks = help_text.split("\n\n", 1)
    assert blocks[0].startswith("usage:") and len(blocks) == 2, help_text
    m = HEADINGS.search(blocks[1])
    assert m is not None, help_text
    return blocks[1][: m.start()].strip()


def test_every_script_is_found() -> None:
    assert {"kernels_table.py", "router_table.py", "host_table.py"} <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_describes_in_whole_sentences(script: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "codegen"), COLUMNS="100")
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), "--help"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )
    if proc.returncode != 0:
        missing = re.search(r"ModuleNotFoundError: No module named '([^']+)'", proc.stderr)
        if missing:
            pytest.skip(f"{script} --help needs {missing.group(1)}, not installed here")
        pytest.fail(f"{script} --help failed:\n{proc.stderr[-2000:]}")
    text = description(proc.stdout)
    assert text, f"{script}: --help has no description"
    last = " ".join(text.split())
    assert re.search(r"[.!?][)\"'`]?$", last), (
        f"{script}: the --help description stops mid-sentence: ...{last[-120:]!r}"
    )
