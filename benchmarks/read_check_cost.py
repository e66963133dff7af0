"""The cost of checking every expert read under a RAM budget (issue 37, item 6): decode tokens/s
of a whole-model container whose routed experts pass through LRU slots, with the CRC-32 check of
each read (the default) and without it (COLIBRI_LM_NO_READ_CHECK), and the bytes read per token.

The model is a random Mixtral made with transformers' own init (seed 0; default hidden 512,
intermediate 1408, 8 experts top-2, 4 layers, 8 heads / 4 KV heads, vocab 8000), converted as
`colibri convert` would (int8 = --quant int8 --dense-quant int8; int4 = --quant int4).

Method: per scheme, two handles (binding.LM, libcolibri.so built at -O2 as the host board) with
the same budget (``--budget-share`` of the routed-expert bytes, default a quarter; prefetch and
pinning off, so that every miss is a read and both handles read the same experts), loaded
first; per repeat they run interleaved (check on, then off): prefill 8 tokens, then
``--tokens`` greedy forward steps timed together (time.perf_counter). The two handles' logits
are compared bit for bit. min / median / max over ``--repeats``; the load average (uptime) is
printed before and after, since the machine is shared.

    python benchmarks/read_check_cost.py [--hidden 512] [--ff 1408] [--layers 4]
        [--schemes int8,int4] [--repeats 5] [--tokens 32] [--budget-share 0.25]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from threads_prefill import container, mixtral, model_args, prompt64  # noqa: E402


def summary(xs: list[float]) -> str:
    return f"{min(xs):7.1f} / {statistics.median(xs):7.1f} / {max(xs):7.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    model_args(ap)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--budget-share", type=float, default=0.25)
    a = ap.parse_args(argv)
    from colibri.targets.binding import LM

    print("load before:", os.getloadavg(), f"({os.cpu_count()} CPUs)")
    with tempfile.TemporaryDirectory(prefix="colibri-bench-") as tmp:
        ckpt = Path(tmp) / "ckpt"
        mixtral(ckpt, a.hidden, a.ff, a.layers, a.vocab)
        for scheme in a.schemes.split(","):
            prompt = prompt64(a.vocab)[:8]
            clb = container(ckpt, scheme, Path(tmp) / f"{scheme}.clb", 128)
            with LM(clb) as probe:
                expert_bytes = probe.stats()["expert_bytes"]
            budget = int(expert_bytes * a.budget_share)
            lms = {
                check: LM(clb, ram_budget=budget, prefetch=False, pin=0, read_check=check)
                for check in (True, False)
            }
            rates: dict[bool, list[float]] = {True: [], False: []}
            rows: dict[bool, list[np.ndarray]] = {True: [], False: []}
            for _ in range(a.repeats):
                for check, lm in lms.items():
                    row = lm.prefill(prompt)
                    out = []
                    t0 = time.perf_counter()
                    for i in range(a.tokens):
                        row = lm.forward(int(np.argmax(row)), len(prompt) + i)
                        out.append(row)
                    rates[check].append(a.tokens / (time.perf_counter() - t0))
                    rows[check] = out
            same = all(
                np.array_equal(x.view(np.uint32), y.view(np.uint32))
                for x, y in zip(rows[True], rows[False])
            )
            stats = {check: lm.stats() for check, lm in lms.items()}
            for lm in lms.values():
                lm.close()
            s = stats[True]
            tokens = a.repeats * (len(prompt) + a.tokens)
            on, off = statistics.median(rates[True]), statistics.median(rates[False])
            print(
                f"{scheme}: budget {budget} of {expert_bytes} expert bytes, {s['n_slots']} slots; "
                f"hit rate {s['hits'] / max(s['loads'], 1):.1%}, "
                f"{s['bytes_read'] / tokens / 1e6:.2f} MB read per token; logits identical: {same}"
            )
            print(f"  decode tokens/s, min / median / max of {a.repeats}:")
            print(f"    read check on  {summary(rates[True])}")
            print(f"    read check off {summary(rates[False])}")
            print(f"    cost of the check (median): {(off - on) / off:+.1%} of the decode rate")
    print("load after:", os.getloadavg())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
