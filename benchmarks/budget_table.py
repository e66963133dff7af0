"""Experts beyond RAM on the host (issue 41, points 1-2): decode and prefill tokens/s of a
whole-model container with a quarter of its routed-expert bytes as the RAM budget, against the
same file with every expert resident, for the prefetch settings side by side (the default,
none, and every prediction read ahead) and the default without the CRC-32 check of each expert
read (COLIBRI_LM_NO_READ_CHECK: the check's cost, issue 37 point 6), with the hit rate and the
bytes read per token.

The model is a random Mixtral made with transformers' own init (seed 0; default hidden 512,
intermediate 1408, 8 experts top-2, 4 layers, 8 heads / 4 KV heads, vocab 8000), converted as
`colibri convert` would (int8 = --quant int8 --dense-quant int8; int4 = --quant int4). Its
routing is random, so its next experts cannot be predicted: the case where a prefetch must not
cost anything. The page cache is warm (the file was just written).

Method: one handle per engine (binding.LM, libcolibri.so built at -O2 as the host board), all
loaded first; per repeat the engines run interleaved. Decode: prefill 8 tokens, then
``--tokens`` greedy forward steps timed together (time.perf_counter). Prefill: a 64-token
prompt through colibri_lm_prefill from position 0 (batch 64). The engines' logits are compared
bit for bit. min / median / max over ``--repeats``; the load average is printed before and
after, since the machine is shared. ``--prompt N`` prefills N tokens instead of 64, and the
budgeted engines' prefill chunk is ``--chunk`` (0, the default: sized to the budget, as a user
gets it; the resident engine runs chunks of 64): a chunk reads each expert it routes to once
per layer, so a prompt longer than the chunk reads them again.

    python benchmarks/budget_table.py [--hidden 512] [--ff 1408] [--layers 4]
        [--schemes int8,int4] [--repeats 5] [--tokens 32] [--budget-share 0.25]
        [--prompt 64] [--chunk 0] [--ckpt DIR] [--keep DIR]

``--ckpt DIR`` measures a trained checkpoint instead (e.g. tests/data/trained_moe: its router
was trained, so its experts can be predicted), prompted with the start of its heldout.txt.
``--keep DIR`` keeps the checkpoint and the containers there and reuses them on the next run
(the 353 M model's checkpoint and container are some 1.1 GB and a minute to make).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from threads_prefill import container, mixtral, model_args, summary  # noqa: E402

#: engine -> LM keyword arguments besides the budget (None: every expert resident)
ENGINES: dict[str, dict[str, Any] | None] = {
    "resident": None,
    "default": {},
    "no-prefetch": {"prefetch": False},
    "always": {"prefetch": "always"},
    "no-read-check": {"read_check": False},
}


def text_prompt(ckpt: Path, n: int) -> list[int]:
    """The first n tokens of a trained checkpoint's held-out text (its tokenizer.json)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    ids = tok.encode((ckpt / "heldout.txt").read_text(encoding="utf-8")).ids[:n]
    if len(ids) < n:
        raise SystemExit(f"{ckpt}/heldout.txt has fewer than {n} tokens")
    return [int(t) for t in ids]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    model_args(ap)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--budget-share", type=float, default=0.25)
    ap.add_argument(
        "--ckpt",
        type=Path,
        default=None,
        help="a trained checkpoint instead of the random Mixtral (e.g. tests/data/trained_moe); "
        "the prompt is then the start of its heldout.txt, tokenized by its tokenizer.json",
    )
    ap.add_argument(
        "--keep",
        type=Path,
        default=None,
        help="directory keeping the checkpoint and containers between runs (reused when there)",
    )
    ap.add_argument("--prompt", type=int, default=64, help="prefill prompt tokens (default 64)")
    ap.add_argument(
        "--chunk",
        type=int,
        default=0,
        help="prefill chunk of the budgeted engines (0: sized to the budget, the default)",
    )
    a = ap.parse_args(argv)
    if a.prompt < 8 or a.chunk < 0:
        ap.error("--prompt >= 8 and --chunk >= 0")
    from colibri.targets.binding import LM

    print("load before:", os.getloadavg(), f"({os.cpu_count()} CPUs)")
    with tempfile.TemporaryDirectory(prefix="colibri-bench-") as scratch:
        tag = f"h{a.hidden}-f{a.ff}-l{a.layers}-v{a.vocab}"
        tag = a.ckpt.resolve().name if a.ckpt is not None else tag
        tmp = a.keep / tag if a.keep is not None else Path(scratch)
        tmp.mkdir(parents=True, exist_ok=True)
        ckpt = a.ckpt if a.ckpt is not None else tmp / "ckpt"
        if not (ckpt / "config.json").exists():
            mixtral(ckpt, a.hidden, a.ff, a.layers, a.vocab)
        for scheme in a.schemes.split(","):
            prompt = [int(t) for t in np.random.default_rng(0).integers(1, a.vocab, a.prompt)]
            if a.ckpt is not None:
                prompt = text_prompt(a.ckpt, a.prompt)
            ctx = max(128, a.prompt + 8)
            clb = tmp / f"{scheme}-c{ctx}.clb"
            if not clb.exists():
                container(ckpt, scheme, clb, ctx)
            with LM(clb) as probe:
                expert_bytes = probe.stats()["expert_bytes"]
            budget = int(expert_bytes * a.budget_share)
            lms = {
                name: LM(clb, prefill_batch=64)
                if kw is None
                else LM(clb, ram_budget=budget, prefill_batch=a.chunk, **kw)
                for name, kw in ENGINES.items()
            }
            dec: dict[str, list[float]] = {n: [] for n in lms}
            pre: dict[str, list[float]] = {n: [] for n in lms}
            decode_stats: dict[str, dict[str, int]] = {n: {} for n in lms}
            rows: dict[str, np.ndarray] = {}
            for _ in range(a.repeats):
                for name, lm in lms.items():
                    row = lm.prefill(prompt[:8])
                    s0 = lm.stats()
                    t0 = time.perf_counter()
                    for i in range(a.tokens):
                        row = lm.forward(int(np.argmax(row)), 8 + i)
                    dec[name].append(a.tokens / (time.perf_counter() - t0))
                    s1 = lm.stats()
                    for k in ("loads", "hits", "bytes_read", "prefetches", "prefetch_hits"):
                        decode_stats[name][k] = decode_stats[name].get(k, 0) + s1[k] - s0[k]
                    rows[name] = row
                    t0 = time.perf_counter()
                    rows[name + " prefill"] = lm.prefill(prompt)
                    pre[name].append(len(prompt) / (time.perf_counter() - t0))
            same = all(
                np.array_equal(rows[n].view(np.uint32), rows["resident"].view(np.uint32))
                and np.array_equal(
                    rows[n + " prefill"].view(np.uint32), rows["resident prefill"].view(np.uint32)
                )
                for n in lms
            )
            for lm in lms.values():
                lm.close()
            print(
                f"{scheme}: budget {budget} of {expert_bytes} routed-expert bytes; logits "
                f"identical across engines: {same}"
            )
            print(f"  tokens/s, min / median / max of {a.repeats}; decode ratio to resident")
            base_dec = statistics.median(dec["resident"])
            base_pre = statistics.median(pre["resident"])
            tokens = a.repeats * a.tokens
            for name in lms:
                s = decode_stats[name]
                hit = s["hits"] / s["loads"] if s.get("loads") else float("nan")
                print(
                    f"  {name:12s} decode {summary(dec[name])} "
                    f"({statistics.median(dec[name]) / base_dec:.2f}x), hit rate {hit:6.1%}, "
                    f"{s.get('bytes_read', 0) / tokens / 1e6:6.2f} MB read/token, prefetches "
                    f"{s.get('prefetches', 0)} ({s.get('prefetch_hits', 0)} used) | prefill "
                    f"{summary(pre[name])} ({statistics.median(pre[name]) / base_pre:.2f}x)"
                )
    print("load after:", os.getloadavg())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
