"""How often `colibri generate` and `colibri convert` climb back to an earlier stage (issue 36).

Runs both commands in-process on tests/data/trained_moe (a whole two-layer Mixtral: generate
with --quant int4 --dense-quant int8 for cortex-a53, convert with the same flags) under
sys.setprofile and records every call of a function of a colibri module, with the colibri
module that called it (the nearest colibri frame up the stack: a call through numpy or the
standard library is credited to the colibri code that made it). Each module is mapped to its
stage by tests/test_stages.py (STAGES, stage_of: the one list of stages). It prints:

- modules: the distinct colibri modules the command runs code of;
- climbs: the distinct (caller module -> callee function) edges where the callee is a
  module-level function of an earlier stage than the caller's, not counting calls into the
  core modules (errors, progress, boards, options, paths: read by every stage by design) nor
  calls made by the driver (cli: it runs the stages, so every call it makes goes "back"). A
  climb is a stage handing work back to an earlier one (emit asking the reference for RoPE
  tables, quant asking the container format for block counts, a budget re-derived outside the
  planner) — what the data flow of DESIGN.md ("one direction, no back and forth") says should
  not happen. Reading the data an earlier stage produced (a method or property of the IR, a
  plan, a quantised tensor, a dataclass constructor) is the flow itself and is not counted;
- with --all, also the edges of every call (methods and constructors too), by module.

Usage: PYTHONPATH=codegen python tools/stage_climbs.py [--edges]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "codegen"))

from test_stages import MODULES, STAGES, stage_of  # noqa: E402

MODEL = ROOT / "tests" / "data" / "trained_moe"
FLAGS = ["--quant", "int4", "--dense-quant", "int8", "-q"]


def trace(
    run: Callable[[], Any],
) -> tuple[set[str], Counter[tuple[str, str]], set[tuple[str, str]]]:
    """(modules visited, climbs counted per (caller module, callee function) edge, every
    (caller, callee) module edge to an earlier stage, methods included) of `run()`."""
    visited: set[str] = set()
    climbs: Counter[tuple[str, str]] = Counter()
    every: set[tuple[str, str]] = set()
    core, cli = STAGES.index("core"), STAGES.index("cli")

    def colibri_module(frame: FrameType | None) -> str | None:
        while frame is not None:
            name = frame.f_globals.get("__name__", "")
            if name in MODULES:
                return str(name)
            frame = frame.f_back
        return None

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event != "call" or frame.f_code.co_name == "<module>":  # an import, not a call
            return
        callee = frame.f_globals.get("__name__", "")
        if callee not in MODULES:
            return
        visited.add(callee)
        caller = colibri_module(frame.f_back)
        if caller is None or caller == callee:
            return
        s_callee, s_caller = stage_of(callee), stage_of(caller)
        if s_callee < s_caller and s_callee != core and s_caller != cli:
            every.add((caller, callee))
            if "." not in frame.f_code.co_qualname:  # a module-level function
                climbs[(caller, f"{callee}.{frame.f_code.co_qualname}")] += 1

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return visited, climbs, every


def run_cli(argv: list[str]) -> Callable[[], None]:
    def run() -> None:
        from colibri.cli.main import main

        with contextlib.redirect_stdout(io.StringIO()):
            rc = main(argv)
        if rc != 0:
            raise SystemExit(f"colibri {' '.join(argv)}: exit status {rc}")

    return run


Trace = tuple[set[str], Counter[tuple[str, str]], set[tuple[str, str]]]


def measure() -> dict[str, Trace]:
    """The trace of `generate` and of `convert` (each in a fresh temporary directory)."""
    import colibri.cli.main  # noqa: F401  (imports are not calls: load them outside the trace)

    out: dict[str, Trace] = {}
    with tempfile.TemporaryDirectory() as tmp:
        gen = ["generate", str(MODEL), "--board", "cortex-a53", "--out", f"{tmp}/gen", *FLAGS]
        out["generate"] = trace(run_cli(gen))
        out["convert"] = trace(run_cli(["convert", str(MODEL), "--out", f"{tmp}/m.clb", *FLAGS]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--edges", action="store_true", help="list every climb")
    ap.add_argument("--all", action="store_true", help="also count method and constructor calls")
    a = ap.parse_args()
    for command, (visited, climbs, every) in measure().items():
        extra = f" ({len(every)} module edges counting every call)" if a.all else ""
        print(f"{command}: {len(visited)} modules, {len(climbs)} climbs{extra}")
        if a.edges:
            for (caller, callee), n in sorted(climbs.items()):
                print(f"  {caller} ({STAGES[stage_of(caller)]}) -> {callee}: {n} calls")
    return 0


if __name__ == "__main__":
    sys.exit(main())
