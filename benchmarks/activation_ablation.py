#!/usr/bin/env python3
"""Where int8 + dense int8 loses accuracy: the numpy mirror with each matrix input rounded to
L levels per block (issue 38; docs/transformer.md, "What int8 + dense int8 lacks against Q8_0").

    python benchmarks/activation_ablation.py --checkpoint DIR [--windows 32] [--window 96]
                                             [--levels 127,32767] [--jitter 0,1e-6,-1e-6]
                                             [--q80-experts]

The model is quantised as ``colibri generate CKPT --quant int8 --dense-quant int8`` quantises it
(colibri.cli.pipeline.quantise_transformer) and run teacher-forced through the numpy mirror
(colibri.reference.transformer.forward) on held-out windows (accuracy_table's), against
transformers' fp32 logits: top-1 agreement and KL divergence per row.

Rows:
  kernels             the mirror as it is: every int8-activation matrix rounds its input to int8
                      per block of 32 (colibri_quantize_row_q8), the generated C's bits.
  L=<n> J=<j>         every input that the kernels would round is instead multiplied by 1 + j,
                      rounded per block of 32 to n levels (scale max|x| / n, round half away
                      from zero), and the matrix run in fp32 on the rounded values: n = 127 is
                      the kernels' rounding up to ties and the order of the sums; n = 32767 is
                      close to no rounding; j != 0 shows how far a rounding perturbation that
                      small moves the figures (near-tied router choices flip).
  ... Q80             (with --q80-experts) the routed experts' weights replaced by their Q8_0
                      rounding (blocks of 32 inputs, fp16 scale max|w| / 127): llama.cpp's
                      expert weights under Colibri's activations.

The patching is local to this script (a context manager restores the mirror's functions).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "codegen"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import accuracy_table as acc  # noqa: E402
from colibri.cli.pipeline import quantise_transformer  # noqa: E402
from colibri.frontends.hf_model import load_hf_transformer  # noqa: E402
from colibri.ir.transformer import MoETransformer  # noqa: E402
from colibri.options import GenerateOptions  # noqa: E402
from colibri.quant.formats import QuantExpert, QuantTensor  # noqa: E402
from colibri.quant.model import TransformerQuant  # noqa: E402
from colibri.reference import kernels as K  # noqa: E402
from colibri.reference import transformer as T  # noqa: E402
from colibri.reference.lm_metrics import kl_divergence, token_windows, top1_agreement  # noqa: E402

BLOCK = 32


@dataclass(frozen=True)
class Variant:
    """How the matrix inputs are rounded: None levels = as the kernels do."""

    levels: int | None = None
    jitter: float = 0.0
    q80_experts: bool = False

    @property
    def label(self) -> str:
        if self.levels is None:
            return "kernels"
        return f"L={self.levels} J={self.jitter:g}" + (" Q80" if self.q80_experts else "")


def round_blocks(x: np.ndarray, levels: int, jitter: float = 0.0) -> np.ndarray:
    """x [T, n] (times 1 + jitter) rounded per block of 32 along n to `levels` levels each
    side of 0 (scale max|x| / levels, half away from zero), as fp32 values."""
    x = np.asarray(x, dtype=np.float32)
    if jitter:
        x = (x * np.float32(1.0 + jitter)).astype(np.float32)
    t, n = x.shape
    nb = -(-n // BLOCK)
    p = np.zeros((t, nb * BLOCK), dtype=np.float32)
    p[:, :n] = x
    b = p.reshape(t, nb, BLOCK)
    amax = np.abs(b).max(axis=2, keepdims=True)
    s = np.where(amax > 0, amax / np.float32(levels), np.float32(1)).astype(np.float32)
    r = b / s
    r = np.sign(r) * np.floor(np.abs(r) + np.float32(0.5))
    return (r * s).reshape(t, nb * BLOCK)[:, :n].astype(np.float32)


def q80_dequantised(w_t: np.ndarray) -> np.ndarray:
    """w_t [out, in] as llama.cpp's Q8_0 stores it, dequantised: blocks of 32 inputs, fp16 scale
    max|w| / 127, codes rounded half away from zero."""
    w = np.asarray(w_t, dtype=np.float32)
    o, n = w.shape
    nb = -(-n // BLOCK)
    p = np.zeros((o, nb * BLOCK), dtype=np.float32)
    p[:, :n] = w
    b = p.reshape(o, nb, BLOCK)
    d = (np.abs(b).max(axis=2, keepdims=True) / 127).astype(np.float16).astype(np.float32)
    r = np.where(d > 0, b / np.where(d > 0, d, 1), 0)
    return (np.sign(r) * np.floor(np.abs(r) + 0.5) * d).reshape(o, nb * BLOCK)[:, :n]


def q80_experts(model: MoETransformer, q: TransformerQuant) -> dict[int, np.ndarray]:
    """id(QuantTensor) of each routed expert matrix -> its fp32 weights rounded as Q8_0."""
    out: dict[int, np.ndarray] = {}
    for li, experts in q.experts.items():
        moe = model.layers[li].moe
        assert moe is not None
        for e, qe in experts.items():
            ex = moe.experts[e]
            out[id(qe.w1)] = q80_dequantised(ex.w1.T)
            out[id(qe.w2)] = q80_dequantised(ex.w2.T)
            if qe.w3 is not None and ex.w3 is not None:
                out[id(qe.w3)] = q80_dequantised(ex.w3.T)
    return out


@contextlib.contextmanager
def rounding(v: Variant, q80: dict[int, np.ndarray]) -> Iterator[None]:
    """The mirror's matvec (dense matrices) and expert FFN with v's input rounding, restored on
    exit. Matrices whose activations are fp32 (act != 'int8') are left alone."""
    matvec = K.matvec
    ffn = K.quant_expert_ffn
    if v.levels is None:
        yield
        return
    levels = v.levels

    def mv(t: QuantTensor, x: np.ndarray, act: str) -> np.ndarray:
        if act != "int8":
            return matvec(t, x, act)
        xr = round_blocks(x, levels, v.jitter)
        if v.q80_experts and id(t) in q80:
            return (xr @ q80[id(t)].T).astype(np.float32)
        return matvec(t, xr, "fp32")

    def expert_ffn(qe: QuantExpert, activation: str, gated: bool, x: np.ndarray) -> np.ndarray:
        return ffn(qe, activation, gated, x, mv)

    try:
        K.quant_expert_ffn = expert_ffn  # type: ignore[assignment]
        T.quant_expert_ffn = expert_ffn  # type: ignore[assignment]
        T.matvec = mv  # type: ignore[assignment]
        yield
    finally:
        K.quant_expert_ffn = ffn  # type: ignore[assignment]
        T.quant_expert_ffn = ffn  # type: ignore[assignment]
        T.matvec = matvec  # type: ignore[assignment]


def run(
    model: MoETransformer,
    q: TransformerQuant,
    windows: np.ndarray,
    ref_logits: Sequence[np.ndarray],
    variants: Sequence[Variant],
) -> list[dict[str, Any]]:
    """Top-1 agreement and KL divergence of each variant against ref_logits."""
    q80 = q80_experts(model, q) if any(v.q80_experts for v in variants) else {}
    rows = []
    for v in variants:
        with rounding(v, q80):
            logits = [T.forward(model, w, quant=q) for w in windows]
        rows.append(
            {
                "variant": v.label,
                "top1": top1_agreement(logits, ref_logits),
                "kl": kl_divergence(logits, ref_logits),
            }
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--windows", type=int, default=32)
    ap.add_argument("--window", type=int, default=acc.DEFAULT_WINDOW)
    ap.add_argument("--levels", default="127,32767", help="comma-separated levels per side")
    ap.add_argument("--jitter", default="0", help="comma-separated relative input jitters")
    ap.add_argument("--q80-experts", action="store_true", help="also each with Q8_0 experts")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)

    ids = acc.load_ids(args.checkpoint)
    windows = token_windows(ids, args.windows, args.window)
    ref = acc.hf_reference(acc.load_hf(args.checkpoint, args.threads), windows)
    model = load_hf_transformer(args.checkpoint)
    opts = GenerateOptions(
        board="host", name="abl", max_context=args.window, quant="int8", dense_quant="int8"
    )
    q = quantise_transformer(model, opts)[0]
    assert q is not None
    variants = [Variant()]
    for lv in (int(s) for s in args.levels.split(",")):
        for j in (float(s) for s in args.jitter.split(",")):
            variants.append(Variant(lv, j))
            if args.q80_experts:
                variants.append(Variant(lv, j, True))
    print(f"{args.checkpoint.name}: {windows.shape[0]} x {windows.shape[1]} held-out positions")
    print("| variant | top-1 | KL (nats) |\n|---|---|---|")
    for r in run(model, q, windows, ref.logits, variants):
        print(f"| {r['variant']} | {100 * r['top1']:.2f} % | {r['kl']:.5f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
