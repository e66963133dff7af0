"""Two builds of one build directory wait for each other (colibri.targets.build's lock)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from colibri.targets.build import _build_dir_lock

PROBE = """
import fcntl, sys
with open(sys.argv[1], "a") as fh:
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print("busy")
    else:
        print("free")
"""


def _probe(lock: Path) -> str:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(lock)], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_the_build_dir_is_locked_while_scons_runs(tmp_path: Path) -> None:
    bdir = tmp_path / "b" / "host"
    lock = bdir / ".colibri.lock"
    with _build_dir_lock(["board=host", f"build_dir={bdir}"]):
        assert lock.is_file()
        assert _probe(lock) == "busy"  # another process cannot take it
    assert _probe(lock) == "free"
