"""benchmarks/activation_ablation.py: its rounding is the kernels' (so its rows measure what they
say), and its patching of the numpy mirror is undone on exit."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import activation_ablation as abl  # noqa: E402
from colibri.cli.pipeline import quantise_transformer  # noqa: E402
from colibri.frontends.hf_model import load_hf_transformer  # noqa: E402
from colibri.options import GenerateOptions  # noqa: E402
from colibri.reference import kernels as K  # noqa: E402
from colibri.reference import transformer as T  # noqa: E402

TRAINED = ROOT / "tests" / "data" / "trained_moe"


def test_127_levels_are_the_kernels_int8_rounding() -> None:
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((5, 77)) * rng.uniform(0.01, 30, (5, 1))).astype(np.float32)
    x[1, 40:64] = 0.0  # an all-zero block
    xq, sx = K.quantize_rows_q8(x)
    kernels = xq.astype(np.float32) * np.repeat(sx, 32, axis=1)[:, :77]
    got = abl.round_blocks(x, 127)
    # the same codes (the C multiplies by 127 / amax, the script divides by amax / 127: a value
    # within an ulp of a .5 may round the other way), so the same values to the scale's ulp
    steps = np.abs(got - kernels) / np.maximum(np.repeat(sx, 32, axis=1)[:, :77], 1e-30)
    assert np.count_nonzero(steps > 1e-3) <= 2
    assert np.all(steps < 1.0 + 1e-3)
    assert np.array_equal(got[1, 40:64], np.zeros(24, np.float32))


def test_q80_rounding_keeps_32_levels_of_each_block() -> None:
    w = np.linspace(-1.0, 2.0, 3 * 40, dtype=np.float32).reshape(3, 40)
    d = abl.q80_dequantised(w)
    assert d.shape == w.shape
    amax = np.abs(w[:, :32]).max(axis=1)
    step = (amax / 127).astype(np.float16).astype(np.float32)
    codes = d[:, :32] / step[:, None]
    assert np.allclose(codes, np.round(codes), atol=1e-3)
    assert np.max(np.abs(d - w)) <= np.max(step) * 0.5 + 1e-6


def test_the_kernels_row_is_the_mirror_and_patching_is_undone() -> None:
    model = load_hf_transformer(TRAINED)
    opts = GenerateOptions(board="host", name="t", max_context=24, quant="int8", dense_quant="int8")
    q = quantise_transformer(model, opts)[0]
    assert q is not None
    ids = np.arange(3, 27, dtype=np.int64)
    plain = T.forward(model, ids, quant=q)
    before = (K.matvec, K.quant_expert_ffn, T.matvec, T.quant_expert_ffn)
    with abl.rounding(abl.Variant(), {}):
        same = T.forward(model, ids, quant=q)
    with abl.rounding(abl.Variant(127), {}):
        near = T.forward(model, ids, quant=q)
    with abl.rounding(abl.Variant(32767, 0.0, True), abl.q80_experts(model, q)):
        wide = T.forward(model, ids, quant=q)
    assert (K.matvec, K.quant_expert_ffn, T.matvec, T.quant_expert_ffn) == before
    assert np.array_equal(same, plain)
    # 127 levels: the kernels' rounding, summed in another order; 32767 levels: another model
    assert np.max(np.abs(near - plain)) < 1e-2 * np.max(np.abs(plain))
    assert np.max(np.abs(wide - plain)) > 0
    assert np.all(np.isfinite(wide))
