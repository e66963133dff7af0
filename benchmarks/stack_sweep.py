"""Exhaustive sweep of the bare-metal stack guard (issue 37, item 5; Xtensa: issue 42): every
stack size from 64 bytes in steps of 8 up to the static worst case (the size where the build's
stack check passes), per board and model, built with ``stack_check=0`` and run under QEMU with
a timeout.

Every run must end one of two ways:

  pass      exit 0, the output file identical to a run with the board's own stack_size, and the
            console intact ("colibri: model <name>: N tokens done" then "stack high-water: ...")
  overflow  exit 98 (the documented stack-overflow code) with "colibri: stack overflow: ..." on
            the console (QEMU's stdout, the semihosting ":tt" stream)

anything else counts as ``other`` (another exit code, a missing console line, a different
output) and a run still going after ``--timeout`` seconds as ``hang``.

Models (different stack depth; generated once per board into --work, then each stack size only
relinks the runner):

  toy2   2 experts, d_model 8, d_ff 16, k 1, gelu (the seed articles' toy)
  m8     8 experts, d_model 32, d_ff 64, k 2, gelu (the model of the issue's report)
  deep   8 experts, d_model 48, d_ff 96, k 4, swiglu, renormalised gates, router bias,
         int8 experts (the quantised kernels and a larger routing frame)

    python benchmarks/stack_sweep.py
        [--boards cortex-m3 cortex-m4 cortex-m7 cortex-m55 esp32s3 xtensa-lx106]
        [--models toy2 m8 deep] [--step 8] [--start 64] [--timeout 20] [--work DIR]
        [--json stack_sweep.json]

The summary JSON has, per board and model, the static bound, the sizes swept and the counts of
pass / overflow / other / hang, with the non-conforming runs listed; the script exits 1 when any
run is ``other`` or ``hang``. tests/targets/test_stack.py imports :func:`prepare` and
:func:`probe` for its short sweep around the boundaries.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "codegen") not in sys.path:
    sys.path.insert(0, str(ROOT / "codegen"))

from colibri.boards import Board, load_board  # noqa: E402
from colibri.cli.pipeline import generate  # noqa: E402
from colibri.errors import ColibriError  # noqa: E402
from colibri.frontends.seed import make_toy  # noqa: E402
from colibri.options import GenerateOptions  # noqa: E402
from colibri.targets.build import build_model  # noqa: E402
from colibri.targets.lmrun import write_input  # noqa: E402
from colibri.targets.qemu import STACK_OVERFLOW_EXIT_CODE, qemu_command  # noqa: E402
from colibri.targets.stack import load_report  # noqa: E402

BOARDS = ("cortex-m3", "cortex-m4", "cortex-m7", "cortex-m55", "esp32s3", "xtensa-lx106")

#: name -> (make_toy arguments, GenerateOptions arguments)
MODELS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "toy2": (dict(experts=2, hidden=8, ff=16, top_k=1, activation="gelu"), {}),
    "m8": (dict(experts=8, hidden=32, ff=64, top_k=2, activation="gelu"), {}),
    "deep": (
        dict(
            experts=8,
            hidden=48,
            ff=96,
            top_k=4,
            activation="swiglu",
            norm_topk_prob=True,
            router_bias=True,
        ),
        dict(quant="int8"),
    ),
}
TOKENS = 5
MAX_TOKENS = 4  # two chunks of the 5 tokens: the forward pass runs twice
OVERFLOW = re.compile(r"^colibri: stack overflow: .+$", re.MULTILINE)


@dataclass
class Prepared:
    """A model generated for a board, its reference run (the board's own stack_size) and the
    static worst case."""

    board: Board
    model: str
    gen: Path
    build: Path
    work: Path
    worst: int
    reference: bytes
    done_line: str


def _run(board: Board, elf: Path, work: Path, timeout: float) -> tuple[str, int, str, str]:
    """('ok' or 'hang', exit code, stdout, stderr) of one QEMU run in `work`."""
    out = work / "output.bin"
    if out.exists():
        out.unlink()
    try:
        proc = subprocess.run(
            qemu_command(board, elf),
            cwd=work,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:

        def text(b: Any) -> str:
            return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")

        return "hang", -1, text(exc.stdout), text(exc.stderr)
    return "ok", proc.returncode, proc.stdout, proc.stderr


def prepare(board_name: str, model: str, root: Path, timeout: float = 60.0) -> Prepared:
    """Generate `model` for the board under root/<board>/<model> (kept: a second call reuses
    it), build it with the board's stack_size and run it once for the reference output."""
    board = load_board(board_name)
    where = root / board.name / model
    gen = where / "gen"
    toy, opts = MODELS[model]
    if not (gen / "manifest.json").is_file():
        layer = make_toy(seed=0, **toy)
        generate(
            layer, gen, GenerateOptions(board=board.name, name=model, max_tokens=MAX_TOKENS, **opts)
        )
    work = where / "run"
    work.mkdir(parents=True, exist_ok=True)
    x = np.random.default_rng(42).standard_normal((TOKENS, int(toy["hidden"]))).astype(np.float32)
    write_input(work / "input.bin", x)
    build = where / "build"
    elf = build_model(gen, board.name, build_dir=build)
    rep = load_report(elf)
    if rep is None:
        raise ColibriError(f"{elf}: the build wrote no stack report")
    how, code, out, err = _run(board, elf, work, timeout)
    done_line = f"colibri: model {model}: {TOKENS} tokens done"
    if how != "ok" or code != 0 or done_line not in out:
        raise ColibriError(
            f"{board.name}/{model}: the reference run failed ({how}, exit {code}):\n{out}{err}"
        )
    return Prepared(
        board, model, gen, build, work, rep.worst, (work / "output.bin").read_bytes(), done_line
    )


def probe(p: Prepared, size: int, timeout: float = 20.0) -> tuple[str, str]:
    """Build the runner with a `size`-byte stack (stack_check=0) and run it: ('pass' |
    'overflow' | 'other' | 'hang', detail)."""
    elf = build_model(p.gen, p.board.name, stack_size=size, stack_check=False, build_dir=p.build)
    how, code, out, err = _run(p.board, elf, p.work, timeout)
    tail = (out + err).strip().replace("\n", " | ")[-240:]
    if how == "hang":
        return "hang", f"timed out after {timeout:g} s: {tail!r}"
    if code == STACK_OVERFLOW_EXIT_CODE:
        if OVERFLOW.search(out) and not err.strip():
            return "overflow", OVERFLOW.search(out).group(0)  # type: ignore[union-attr]
        return "other", f"exit 98 without the message on the console: {tail!r}"
    if code == 0:
        lines = out.splitlines()
        high = "stack high-water: "
        ok_console = (
            len(lines) == 2
            and lines[0] == p.done_line
            and lines[1].startswith(high)
            and lines[1].endswith(f" of {size} bytes")
            and not err.strip()
        )
        output = p.work / "output.bin"
        same = output.is_file() and output.read_bytes() == p.reference
        if ok_console and same:
            return "pass", lines[1]
        return (
            "other",
            f"exit 0, console {'ok' if ok_console else 'damaged'}, output "
            f"{'identical' if same else 'differs'}: {tail!r}",
        )
    return "other", f"exit {code}: {tail!r}"


def sweep(p: Prepared, start: int, step: int, timeout: float, log: Any = None) -> dict[str, Any]:
    """Every size from `start` in `step`s up to the static bound (rounded up to 8)."""
    bound = (p.worst + 7) // 8 * 8
    counts = {"pass": 0, "overflow": 0, "other": 0, "hang": 0}
    bad: list[dict[str, Any]] = []
    first_pass = None
    sizes = list(range(start, bound + 1, step))
    if sizes[-1] != bound:
        sizes.append(bound)
    t0 = time.monotonic()
    for size in sizes:
        kind, detail = probe(p, size, timeout)
        counts[kind] += 1
        if kind == "pass" and first_pass is None:
            first_pass = size
        if kind in ("other", "hang") or (size == bound and kind != "pass"):
            bad.append({"size": size, "kind": kind, "detail": detail})
        if log is not None:
            print(f"{p.board.name} {p.model} {size}: {kind} {detail[:160]}", file=log, flush=True)
    return {
        "worst_case": p.worst,
        "bound": bound,
        "sizes": len(sizes),
        "first": sizes[0],
        "last": sizes[-1],
        "step": step,
        "first_pass": first_pass,
        **counts,
        "bound_passes": not any(b["size"] == bound for b in bad),
        "problems": bad,
        "seconds": round(time.monotonic() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--boards", nargs="+", default=list(BOARDS))
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--start", type=int, default=64)
    ap.add_argument("--step", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds per run")
    ap.add_argument("--work", type=Path, default=ROOT / "build" / "stack_sweep")
    ap.add_argument(
        "--json", type=Path, default=None, help="summary (default: <work>/summary.json)"
    )
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per run on stderr")
    args = ap.parse_args(argv)
    if args.start < 8 or args.start % 8 or args.step < 8 or args.step % 8:
        ap.error("--start and --step must be positive multiples of 8")
    out_json = args.json or args.work / "summary.json"
    summary: dict[str, Any] = {"timeout": args.timeout, "results": {}}
    totals = {"runs": 0, "pass": 0, "overflow": 0, "other": 0, "hang": 0}
    for board in args.boards:
        for model in args.models:
            p = prepare(board, model, args.work)
            res = sweep(
                p, args.start, args.step, args.timeout, sys.stderr if args.verbose else None
            )
            summary["results"].setdefault(board, {})[model] = res
            totals["runs"] += res["sizes"]
            for k in ("pass", "overflow", "other", "hang"):
                totals[k] += res[k]
            print(
                f"{board:11s} {model:5s} bound {res['bound']:5d}: {res['sizes']:4d} runs, "
                f"pass {res['pass']}, overflow {res['overflow']}, other {res['other']}, "
                f"hang {res['hang']} (first pass {res['first_pass']}, {res['seconds']} s)",
                flush=True,
            )
            summary["totals"] = totals
            out_json.parent.mkdir(parents=True, exist_ok=True)
            out_json.write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"total: {totals['runs']} runs, pass {totals['pass']}, overflow {totals['overflow']}, "
        f"other {totals['other']}, hang {totals['hang']} -> {out_json}"
    )
    return 0 if totals["other"] == 0 and totals["hang"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
