"""Per-board figures for the demo model (8 experts, d_model 32, d_ff 64, k 2): flash and RAM
used by the firmware (pyelftools, `colibri size`) and guest instructions for one forward pass
of one token under QEMU (deterministic; the host uses callgrind when valgrind is installed).

    python benchmarks/boards_table.py [--tokens 1]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
from colibri.boards import list_boards
from colibri.cli.main import run_model
from colibri.cli.pipeline import generate
from colibri.errors import ColibriError
from colibri.frontends.toy import make_toy
from colibri.options import GenerateOptions
from colibri.reference.moe import compare, moe_forward
from colibri.targets.size import size_report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=1)
    args = ap.parse_args()
    layer = make_toy(experts=8, hidden=32, ff=64, top_k=2, activation="gelu", seed=7)
    x = np.random.default_rng(1).standard_normal((args.tokens, 32)).astype(np.float32)
    ref, _ = moe_forward(layer, x)
    print(f"demo model: 8 experts, d_model 32, d_ff 64, k 2, gelu; {args.tokens} token(s)\n")
    print(
        f"{'board':14} {'flash used':>12} {'flash %':>8} {'RAM used':>10} {'RAM %':>7} "
        f"{'instructions':>13}  matches reference"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for board in list_boards():
            ok, why = board.can_build()
            if ok:
                ok, why = board.can_run()
            if not ok:
                print(f"{board.name:14} unavailable: {why.split('. ')[0]}")
                continue
            gen = Path(tmp) / board.name
            try:
                generate(layer, gen, GenerateOptions(board=board.name, name="demo", max_tokens=8))
                out, res = run_model(gen, board.name, x, count_instructions=True)
                rep = size_report(gen, board.name)
            except ColibriError as exc:
                print(f"{board.name:14} error: {exc}")
                continue
            fp = f"{100 * rep.flash_used / rep.flash_size:.1f}" if rep.flash_size else "-"
            rp = f"{100 * rep.ram_used / rep.ram_size:.1f}" if rep.ram_size else "-"
            ok_ref = "yes" if compare(out.output, ref) is None else "NO"
            print(
                f"{board.name:14} {rep.flash_used:>12} {fp:>8} {rep.ram_used:>10} {rp:>7} "
                f"{res.instructions if res.instructions is not None else '-':>13}  {ok_ref}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
