"""Ctrl-C at any moment ends the CLI quietly (issue 37): also during the first half second, while
the imports run (that printed a KeyboardInterrupt traceback). Exit 130 with at most the one line
`colibri: interrupted` (or, before Python has set up its handler, killed by SIGINT), no
traceback, and no output or temporary left behind.

The one moment no package code can guard is CPython's own start-up (site, runpy and the
package's __init__, the first ~20 ms, longer on a loaded machine): there a KeyboardInterrupt
is the interpreter's. At the delays 0 and 0.05 s such a traceback is accepted only when none of
its frames is in colibri/__main__.py or colibri/cli, i.e. when colibri's entry had not begun."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

DELAYS = (0.0, 0.05, 0.2, 0.5, 1.0)
#: `python -m colibri` and the console script's wrapper (pyproject.toml [project.scripts]).
LAUNCHERS = {
    "module": [sys.executable, "-m", "colibri"],
    "script": [
        sys.executable,
        "-c",
        "import sys; from colibri.cli import entry; sys.exit(entry())",
    ],
}


def _interpreter_startup(stderr: str) -> bool:
    """A KeyboardInterrupt traceback from CPython's start-up, before colibri's entry ran."""
    if "KeyboardInterrupt" not in stderr:
        return False
    ours = ("colibri/__main__.py", "colibri/cli/", "colibri/frontends", "numpy")
    return not any(name in stderr for name in ours)


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
@pytest.mark.parametrize("delay", DELAYS)
def test_ctrl_c_is_quiet_at_every_moment(tmp_path: Path, delay: float, launcher: str) -> None:
    out = tmp_path / "toy"
    # a toy of ~200 MB of weights: a few seconds of work after the imports
    argv = ["make-toy", "--out", str(out), "--experts", "8", "--hidden", "1024", "--ff", "2048"]
    proc = subprocess.Popen(
        [*LAUNCHERS[launcher], *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    if delay < 0.2 and _interpreter_startup(stderr):
        return
    assert "Traceback" not in stderr, stderr
    assert "KeyboardInterrupt" not in stderr, stderr
    if proc.returncode == 0:  # finished before the signal: nothing to check
        return
    assert proc.returncode in (130, -signal.SIGINT), (proc.returncode, stderr)
    assert stderr in ("", "colibri: interrupted\n"), stderr
    # nothing half-written: no output (make-toy removes what it made), or, when the signal
    # came after the last rename, the whole one; never a temporary
    if out.exists():
        assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.bin", "router.bin"]
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]


#: A finder that, when colibri.cli.main is imported, does what numpy's C core does when a Ctrl-C
#: lands in its import of `datetime` (CI saw it at the delay 0.05): the KeyboardInterrupt is
#: raised inside and reported as an ImportError. SIGNAL 0: the same ImportError without a Ctrl-C.
_SWALLOW = """
import importlib.abc, os, signal, sys
SIGNAL = {signal}
class Swallow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "colibri.cli.main":
            return None
        if SIGNAL:
            try:
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(100000):
                    pass
            except KeyboardInterrupt:
                pass
        raise ImportError('PyCapsule_Import could not import module "datetime"')
sys.meta_path.insert(0, Swallow())
from colibri.cli import entry
sys.exit(entry(["--help"]))
"""


def test_ctrl_c_turned_into_an_import_error_is_quiet() -> None:
    """A Ctrl-C during the imports that an extension reports as an ImportError ends the CLI as
    any Ctrl-C does (exit 130, one line); the same ImportError without a Ctrl-C is still an
    error with its traceback (the entry does not hide a broken install)."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "codegen"))
    run = [sys.executable, "-c"]
    done = subprocess.run(
        [*run, _SWALLOW.format(signal=1)], env=env, capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stderr) == (130, "colibri: interrupted\n"), done.stderr
    done = subprocess.run(
        [*run, _SWALLOW.format(signal=0)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "PyCapsule_Import could not import module" in done.stderr, done.stderr
