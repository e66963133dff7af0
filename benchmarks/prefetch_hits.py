"""Hit rates under a RAM budget with and without prefetch (issue 41 item 1): deterministic
counters only (no timing), so one run a setting is the figure.

Each container is run on its own handle per setting (default, --no-prefetch, every prediction
read ahead), with a share of its routed-expert bytes as the budget:

- `text`: the ids fed one at a time (`forward`, teacher-forced): a trained checkpoint's
  heldout.txt tokenized by its tokenizer.json, else seeded random ids;
- `greedy`: budget_table.py's decode (8 prompt tokens prefilled, then greedy steps), the
  counters over the decode steps only.

    python benchmarks/prefetch_hits.py --clb int8.clb [--ckpt DIR] [--tokens 120]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

SETTINGS: dict[str, bool | str] = {"default": True, "no-prefetch": False, "always": "always"}


def text_ids(ckpt: Path | None, n: int, vocab: int) -> list[int]:
    if ckpt is None:
        return [int(t) for t in np.random.default_rng(0).integers(1, vocab, n)]
    from tokenizers import Tokenizer

    text = (ckpt / "heldout.txt").read_text(encoding="utf-8")
    return list(Tokenizer.from_file(str(ckpt / "tokenizer.json")).encode(text).ids[:n])


def run(clb: Path, budget: int, prefetch: bool | str, ids: list[int], mode: str) -> dict[str, int]:
    from colibri.targets.binding import LM

    with LM(clb, ram_budget=budget, prefetch=prefetch) as lm:
        if mode == "text":
            for pos, t in enumerate(ids):
                lm.forward(t, pos)
            return lm.stats()
        row = lm.prefill(ids[:8])
        s0 = lm.stats()
        for i in range(len(ids)):
            row = lm.forward(int(np.argmax(row)), 8 + i)
        s1 = lm.stats()
        return {k: s1[k] - s0[k] if k not in ("n_slots", "n_pinned") else s1[k] for k in s1}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clb", type=Path, required=True, action="append")
    ap.add_argument("--ckpt", type=Path, default=None, help="trained checkpoint (heldout.txt)")
    ap.add_argument("--tokens", type=int, default=120)
    ap.add_argument("--mode", choices=("text", "greedy"), default="text")
    ap.add_argument("--budget-share", type=float, default=0.25)
    ap.add_argument("--vocab", type=int, default=32000, help="random ids below this (no --ckpt)")
    a = ap.parse_args(argv)
    from colibri.targets.binding import LM

    ids = text_ids(a.ckpt, a.tokens, a.vocab)
    for clb in a.clb:
        with LM(clb) as probe:
            budget = int(probe.stats()["expert_bytes"] * a.budget_share)
        out = []
        for name, pf in SETTINGS.items():
            s = run(clb, budget, pf, ids, a.mode)
            out.append(
                f"{name} {s['hits']}/{s['loads']} = {s['hits'] / max(s['loads'], 1):.1%}"
                f" (prefetches {s['prefetches']}, used {s['prefetch_hits']},"
                f" restores {s.get('restores', 0)})"
            )
        print(f"{clb} {a.mode} {len(ids)} tokens, slots {s['n_slots']} pinned {s['n_pinned']}:")
        for line in out:
            print("   ", line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
