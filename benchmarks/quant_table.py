#!/usr/bin/env python3
"""Flash, RAM, accuracy and instructions per forward pass of one MoE layer on a board, for
every weight scheme (the "done" table of the quantisation issue).

    python3 benchmarks/quant_table.py [--board cortex-m4] [--experts 16 --hidden 128 --ff 512
                                       --top-k 2] [--tokens 8]

Columns:
  weights   const weight bytes of the full model (router fp32 + every expert), exact
  flash     the full model's firmware flash: measured ELF flash of the build below plus the
            weights of the experts it shares, i.e. what the full build would link to
  fits      whether that flash and the RAM fit the board (colibri's budget)
  RAM       measured ELF RAM (.data + .bss + arena + stack)
  rel-RMS   relative RMS error of the layer output vs fp32, on 64 seeded calibration tokens
  routing   routing agreement (fraction of tokens with the same top-k set; the router is fp32)
  instr     guest instructions per forward pass of --tokens tokens (QEMU icount)

Instructions are measured on a compute-equivalent build: the same router (all E experts),
the same dimensions and kernels, but every expert sharing one weight set, so that the model
links even where the full fp32 weights exceed the board's flash. The kernels' instruction
counts do not depend on the weight values (only libm's activation has data-dependent paths).
"""

from __future__ import annotations

import argparse
import copy
import shutil
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from colibri.boards import load_board  # noqa: E402
from colibri.cli.argtypes import add_board_argument  # noqa: E402
from colibri.cli.main import run_model  # noqa: E402
from colibri.cli.pipeline import generate, render  # noqa: E402
from colibri.errors import BudgetExceeded  # noqa: E402
from colibri.frontends.seed import make_toy  # noqa: E402
from colibri.options import GenerateOptions  # noqa: E402
from colibri.plan.budget import check_budget  # noqa: E402
from colibri.quant.formats import make_plan, quantize_layer  # noqa: E402
from colibri.reference.accuracy import accuracy_report  # noqa: E402
from colibri.targets.size import size_report  # noqa: E402

ROWS = [("fp32", None), ("fp16", None), ("int8", None), ("int4", None)]
EXTRA = [("int8", "fp32"), ("int4", "fp32")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_board_argument(p, "cortex-m4")
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--ff", type=int, default=512)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--workdir", default=str(ROOT / "build" / "quant_table"))
    p.add_argument("--no-extra", action="store_true", help="skip the fp32-activation rows")
    a = p.parse_args(argv)

    board = load_board(a.board)
    layer = make_toy(a.experts, a.hidden, a.ff, a.top_k, "gelu", seed=1)
    rng = np.random.default_rng(0)
    calib = rng.standard_normal((64, a.hidden)).astype(np.float32)
    x = rng.standard_normal((a.tokens, a.hidden)).astype(np.float32)
    shared = copy.copy(layer)
    shared.sharing_map = [0] * a.experts
    work = Path(a.workdir)
    shutil.rmtree(work, ignore_errors=True)

    head = (
        f"{'scheme':<6} {'act':<5} {'weights':>9} {'flash':>9} {'fits':>4} {'RAM':>7} "
        f"{'rel-RMS':>9} {'routing':>7} {'instr':>11} {'instr/token':>11}"
    )
    lines = [
        f"{a.experts} experts, d_model {a.hidden}, d_ff {a.ff}, k {a.top_k}, gelu; board "
        f"{board.name} (flash {board.memory['flash'].size if 'flash' in board.memory else '-'}"
        f", RAM {board.memory['ram'].size if 'ram' in board.memory else '-'}); "
        f"{a.tokens} tokens per forward pass",
        head,
        "-" * len(head),
    ]
    print(lines[0], flush=True)
    for scheme, act in ROWS + ([] if a.no_extra else EXTRA):
        plan = make_plan(a.experts, scheme, None, act)
        acc = accuracy_report(layer, quantize_layer(layer, plan), calib)["layers"][0]
        opts = GenerateOptions(
            board=board.name, name=f"qt_{scheme}", quant=scheme, act=act, max_tokens=a.tokens
        )
        _, full = render(layer, opts)
        weights = int(full["memory"]["weight_bytes"])
        try:
            check_budget(full, board)
            fits = "yes"
        except BudgetExceeded:
            fits = "no"
        gen = work / f"{scheme}_{act or 'def'}"
        _, man = generate(shared, gen, opts)
        out, res = run_model(gen, board.name, x, count_instructions=board.kind != "host")
        rep = size_report(gen, board.name)
        flash = rep.flash_used + weights - int(man["memory"]["weight_bytes"])
        if fits == "yes" and rep.flash_size and flash > rep.flash_size:
            fits = "no"
        instr = res.instructions or 0
        lines.append(
            f"{scheme:<6} {plan.acts[0]:<5} {weights:>9} {flash:>9} {fits:>4} {rep.ram_used:>7} "
            f"{acc['rel_rms_error']:>9.2e} {100 * acc['routing_agreement']:>6.1f}% "
            f"{instr:>11} {instr // max(1, a.tokens):>11}"
        )
        print(lines[-1], flush=True)
    print()
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
