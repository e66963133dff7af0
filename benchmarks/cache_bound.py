#!/usr/bin/env python3
"""What any expert cache could reach under a RAM budget on a trained model (issue 41): the hit
rates of replacement policies replayed offline over the model's own routing, beside Belady's
optimum (OPT: evict the expert used again furthest ahead), which no policy that cannot see the
future beats.

The routing is the numpy reference's (colibri.reference.transformer.forward, fp32) on the
checkpoint's held-out text (heldout.txt through its tokenizer.json), teacher-forced: every MoE
layer's top-k experts of every token, in the order the runtime uses them (token by token, layer
by layer). The slots hold a share of all routed experts, one expert a slot, shared by the layers
as the runtime's are. Policies:

- LRU: least recently used out (the runtime without prefetch);
- LFU: the expert with the fewest uses so far out, ties to the least recent (online);
- pin P + LRU: the P experts used most over the whole text (an oracle of the counts, as
  calibration heat approximates them) held from the start, the other slots LRU (the runtime's
  --pin, which loads its pins at start-up and needs top_k LRU slots for the misses);
- OPT: Belady's.

With a miss costing m microseconds and a resident step r, decode runs at about
r / (r + misses_a_token * m) of resident speed; `--miss-us` and `--step-us` print that bound
for OPT's misses. The runtime's own counters on the same text: prefetch_hits.py.

    python benchmarks/cache_bound.py --ckpt DIR [--ckpt DIR2 ...] [--tokens 2000]
        [--shares 0.25,0.5] [--miss-us 6.5 --step-us 25] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "codegen"))

Use = tuple[int, int]  # (layer, expert)


def routing(ckpt: Path, n_tokens: int) -> tuple[list[Use], int, int, int, int]:
    """Expert uses in run order, tokens, MoE layers, experts a layer, top_k."""
    import numpy as np
    from colibri.frontends.hf_model import load_transformer
    from colibri.frontends.tokenizer import load_tokenizer
    from colibri.reference.moe import route
    from colibri.reference.transformer import KVCache, forward

    model = load_transformer(ckpt)
    ids = load_tokenizer(ckpt / "tokenizer.json").encode(
        (ckpt / "heldout.txt").read_text(encoding="utf-8")
    )[:n_tokens]
    per: dict[int, list[Any]] = {}

    def capture(i: int, rows: Any) -> None:
        moe = model.layers[i].moe
        assert moe is not None
        per.setdefault(i, []).append(route(moe, rows).expert_ids)

    forward(model, ids, KVCache(), capture=capture, logits=False)
    layers = sorted(per)
    chosen = {i: np.concatenate(per[i]) for i in layers}
    n_tok, top_k = chosen[layers[0]].shape
    first = model.layers[layers[0]].moe
    assert first is not None
    seq = [(i, int(e)) for t in range(n_tok) for i in layers for e in chosen[i][t]]
    return seq, n_tok, len(layers), first.config.n_experts, top_k


def lru(seq: list[Use], slots: int, pinned: frozenset[Use] = frozenset()) -> int:
    cache: dict[Use, None] = {}  # insertion order = recency
    hits = 0
    for u in seq:
        if u in pinned:
            hits += 1
        elif u in cache:
            hits += 1
            del cache[u]
            cache[u] = None
        else:
            if len(cache) >= slots - len(pinned):
                del cache[next(iter(cache))]
            cache[u] = None
    return hits


def lfu(seq: list[Use], slots: int) -> int:
    count: Counter[Use] = Counter()
    cache: dict[Use, int] = {}  # expert -> last use
    hits = 0
    for t, u in enumerate(seq):
        count[u] += 1
        if u in cache:
            hits += 1
        elif len(cache) >= slots:
            del cache[min(cache, key=lambda v: (count[v], cache[v]))]
        cache[u] = t
    return hits


def opt(seq: list[Use], slots: int) -> int:
    never = len(seq) + 1
    nxt: list[int] = [never] * len(seq)
    last: dict[Use, int] = {}
    for j in range(len(seq) - 1, -1, -1):
        nxt[j] = last.get(seq[j], never)
        last[seq[j]] = j
    cache: dict[Use, int] = {}  # expert -> its next use
    hits = 0
    for j, u in enumerate(seq):
        if u in cache:
            hits += 1
        elif len(cache) >= slots:
            del cache[max(cache, key=lambda v: cache[v])]
        cache[u] = nxt[j]
    return hits


def measure(ckpt: Path, n_tokens: int, shares: list[float]) -> list[dict[str, Any]]:
    seq, n_tok, n_layers, n_experts, top_k = routing(ckpt, n_tokens)
    top = [u for u, _ in Counter(seq).most_common()]
    rows = []
    for share in shares:
        slots = max(top_k, round(share * n_layers * n_experts))
        rates = {"LRU": lru(seq, slots), "LFU": lfu(seq, slots), "OPT": opt(seq, slots)}
        for pins in range(1, slots - top_k + 1):
            rates[f"pin {pins} + LRU"] = lru(seq, slots, frozenset(top[:pins]))
        rows.append(
            {
                "model": ckpt.name,
                "tokens": n_tok,
                "moe_layers": n_layers,
                "experts": n_experts,
                "top_k": top_k,
                "share": share,
                "slots": slots,
                "uses": len(seq),
                "hit_rate": {k: v / len(seq) for k, v in rates.items()},
                "opt_misses_per_token": (len(seq) - rates["OPT"]) / n_tok,
            }
        )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--ckpt", type=Path, action="append", required=True, help="trained checkpoint")
    ap.add_argument("--tokens", type=int, default=2000, help="held-out tokens (default 2000)")
    ap.add_argument("--shares", default="0.25,0.5", help="budget shares of all routed experts")
    ap.add_argument("--miss-us", type=float, help="microseconds a miss costs (with --step-us)")
    ap.add_argument("--step-us", type=float, help="microseconds a resident decode step takes")
    ap.add_argument("--json", type=Path, help="write the rows here")
    a = ap.parse_args()
    shares = [float(s) for s in a.shares.split(",")]
    rows = [r for ckpt in a.ckpt for r in measure(ckpt, a.tokens, shares)]
    for r in rows:
        rates = ", ".join(f"{k} {v:.1%}" for k, v in r["hit_rate"].items())
        line = (
            f"{r['model']}: {r['moe_layers']} MoE layers x {r['experts']} experts, top-"
            f"{r['top_k']}, {r['tokens']} tokens; {r['slots']} slots ({r['share']:.0%}): {rates}"
        )
        if a.miss_us and a.step_us:
            bound = a.step_us / (a.step_us + r["opt_misses_per_token"] * a.miss_us)
            line += f"; with OPT's {r['opt_misses_per_token']:.2f} misses a token <= {bound:.2f}x"
        print(line)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
