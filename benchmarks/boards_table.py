"""Per-board figures for the demo model (8 experts, d_model 32, d_ff 64, k 2): flash and RAM
used by the firmware (pyelftools, `colibri size`) and guest instructions for one forward pass
of one token under QEMU (deterministic; the host uses callgrind when valgrind is installed).

    python benchmarks/boards_table.py [--tokens 1] [--json FILE.json]

With --json the rows are also written as JSON, and beside it FILE.png (benchmarks/plots.py):
flash and RAM used per board as a percentage of the board's regions, the budget at 100 %.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from colibri.boards import list_boards
from colibri.cli.main import run_model
from colibri.cli.pipeline import generate
from colibri.errors import ColibriError
from colibri.frontends.seed import make_toy
from colibri.options import GenerateOptions
from colibri.reference.moe import compare, moe_forward
from colibri.targets.size import size_report

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plots import bar_plot  # noqa: E402


def plot_boards(json_path: Path) -> Path | None:
    """FILE.png beside the --json FILE: flash and RAM % of each board with a budget (hosted
    boards have no regions and are left out)."""
    rows = [r for r in json.loads(json_path.read_text())["boards"] if r.get("flash_size")]
    return bar_plot(
        json_path,
        [r["board"] for r in rows],
        {
            "flash": [round(100.0 * r["flash_used"] / r["flash_size"], 1) for r in rows],
            "RAM": [round(100.0 * r["ram_used"] / r["ram_size"], 1) for r in rows],
        },
        title="demo model (8 experts, d_model 32, d_ff 64, k 2): share of each board",
        ylabel="% of the board's region",
        limit=100.0,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--json", type=Path, help="also write the rows as JSON, and a PNG beside it")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
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
            rows.append(
                {
                    "board": board.name,
                    "flash_used": rep.flash_used,
                    "flash_size": rep.flash_size,
                    "ram_used": rep.ram_used,
                    "ram_size": rep.ram_size,
                    "instructions": res.instructions,
                    "matches_reference": ok_ref == "yes",
                }
            )
    if args.json:
        doc = {"model": "demo (8 experts, d_model 32, d_ff 64, k 2)", "tokens": args.tokens}
        args.json.write_text(json.dumps({**doc, "boards": rows}, indent=2) + "\n")
        print(f"\nwrote {args.json}")
        png = plot_boards(args.json)
        if png is not None:
            print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
