"""Threads and batched prefill of a whole-model container on the host (issue 13, points 3-4):
decode tokens/s with 1 and 2 threads, and the tokens/s of a 64-token prompt through
colibri_lm_prefill against the token-by-token loop (colibri_lm_forward), per scheme.

The model is a random Mixtral made with transformers' own init (seed 0; default hidden 512,
intermediate 1408, 8 experts top-2, 4 layers, 8 heads / 4 KV heads, vocab 8000), converted as
`colibri convert` would (int8 = --quant int8 --dense-quant int8; int4 = --quant int4).

Method: one handle per engine (binding.LM, libcolibri.so built at -O2 as the host board), all
loaded first; per repeat the engines run interleaved (threads 1, then 2, ...). Decode: prefill
8 tokens, then ``--tokens`` forward steps timed together (time.perf_counter) -> tokens/s.
Prompt: 64 tokens from position 0, timed as one colibri_lm_prefill call and as 64
colibri_lm_forward calls. min / median / max over ``--repeats``; the load average (uptime) is
printed before and after, since the machine is shared.

    python benchmarks/threads_prefill.py [--hidden 512] [--ff 1408] [--layers 4]
        [--schemes int8,int4] [--threads 1,2] [--repeats 5] [--tokens 32]
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
from scale_table import make_checkpoint  # noqa: E402

SCHEMES = {"fp32": {}, "int8": {"quant": "int8", "dense_quant": "int8"}, "int4": {"quant": "int4"}}


def prompt64(vocab: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(0).integers(1, vocab, 64)]


def summary(xs: list[float]) -> str:
    return f"{min(xs):7.1f} / {statistics.median(xs):7.1f} / {max(xs):7.1f}"


def mixtral(ckpt: Path, hidden: int, ff: int, layers: int, vocab: int) -> int:
    """The benchmarks' random Mixtral (8 experts top-2, 8 heads / 4 KV heads) written to ckpt;
    its parameter count, printed."""
    n = make_checkpoint(
        ckpt,
        dict(
            hidden_size=hidden,
            intermediate_size=ff,
            num_local_experts=8,
            num_experts_per_tok=2,
            num_hidden_layers=layers,
            num_attention_heads=8,
            num_key_value_heads=4,
            vocab_size=vocab,
        ),
    )
    print(f"random Mixtral: {n / 1e6:.1f} M parameters, hidden {hidden}, ff {ff}")
    return n


def model_args(ap: argparse.ArgumentParser) -> None:
    """The options of mixtral()'s shape and the schemes, with the benchmarks' defaults."""
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--ff", type=int, default=1408)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--schemes", default="int8,int4")


def container(ckpt: Path, scheme: str, out: Path, max_context: int) -> Path:
    from colibri.cli.pipeline import quantise_transformer
    from colibri.emit.lmfile import write_lm_container
    from colibri.frontends.hf_model import load_hf_transformer
    from colibri.options import GenerateOptions

    model = load_hf_transformer(ckpt)
    opts = GenerateOptions(board="host", name="lm", max_context=max_context, **SCHEMES[scheme])
    q, _ = quantise_transformer(model, opts)
    return write_lm_container(model, q, out, max_context)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    model_args(ap)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=32)
    a = ap.parse_args(argv)
    from colibri.targets.binding import LM

    print("load before:", os.getloadavg(), f"({os.cpu_count()} CPUs)")
    threads = [int(t) for t in a.threads.split(",")]
    with tempfile.TemporaryDirectory(prefix="colibri-bench-") as tmp:
        ckpt = Path(tmp) / "ckpt"
        mixtral(ckpt, a.hidden, a.ff, a.layers, a.vocab)
        for scheme in a.schemes.split(","):
            prompt = prompt64(a.vocab)
            clb = container(ckpt, scheme, Path(tmp) / f"{scheme}.clb", 128)
            lms = {t: LM(clb, threads=t) for t in threads}
            dec: dict[int, list[float]] = {t: [] for t in threads}
            pre: dict[int, list[float]] = {t: [] for t in threads}
            loop: dict[int, list[float]] = {t: [] for t in threads}
            for _ in range(a.repeats):
                for t in threads:
                    lm = lms[t]
                    row = lm.prefill(prompt[:8])
                    t0 = time.perf_counter()
                    for i in range(a.tokens):
                        row = lm.forward(int(np.argmax(row)), 8 + i)
                    dec[t].append(a.tokens / (time.perf_counter() - t0))
                    t0 = time.perf_counter()
                    last = lm.prefill(prompt)
                    pre[t].append(64 / (time.perf_counter() - t0))
                    t0 = time.perf_counter()
                    for p, tok in enumerate(prompt):
                        row = lm.forward(tok, p)
                    loop[t].append(64 / (time.perf_counter() - t0))
                    assert np.array_equal(row.view(np.uint32), last.view(np.uint32))
            for lm in lms.values():
                lm.close()
            print(f"{scheme}: tokens/s, min / median / max of {a.repeats}")
            for t in threads:
                print(
                    f"  threads {t}: decode {summary(dec[t])} | 64-token prompt: prefill "
                    f"{summary(pre[t])}, token loop {summary(loop[t])}"
                )
    print("load after:", os.getloadavg())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
