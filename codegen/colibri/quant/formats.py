"""Quantise expert weights, and the numpy mirror of the quantised C kernels.

Schemes (one per expert, chosen per model and overridable per expert):

- ``fp32``: the seed layout, unchanged (the existing float path).
- ``fp16``: IEEE binary16 storage, computed in fp32.
- ``int8``: symmetric, one fp32 scale per output channel, q in -127..127.
- ``int4``: blocks of 32 weights along the input dimension with one fp16 scale per block
  (18 bytes per block, 4.5 bits per weight: ggml's q4_0 layout), w = d * (nibble - 8); d may
  be negative.
- ``q4k``: super-blocks of 256 weights, 8 sub-blocks of 32 along the input (a matrix's rows'
  sub-blocks in one stream: a super-block may span rows) with a 6-bit scale and a 6-bit minimum
  each, one fp16 super-scale and super-minimum (144 bytes per 256
  weights, 4.5 bits per weight), w = d * sc * q - dmin * m with q in 0..15; int8 activations
  only (the k-quant-class scheme of issue 38: the q4k section below).
- ``q5k``: q4k with 5-bit codes (q in 0..31; 176 bytes per 256 weights, 5.5 bits per weight).

The int8 / int4 scales are chosen by the scale search (``search="mse"``, the default:
:func:`search_int4_scales`, :func:`search_int8_scales`) or are the plain ones (``"none"``:
max|w| / 7 per block, max|w| / 127 per channel); the codes are always the nearest ones for the
stored scale.

Quantised tensors are stored output-channel-major (``w.T`` of the seed layout) so every
output is a dot product over contiguous memory; an int8 matrix whose kernel reads several rows
at once may be stored in layout ``r4`` instead (:func:`r4_order`, chosen per core by the
emitter and recorded in the manifest). Activations stay fp32 (``act="fp32"``) or are
quantised to int8 at run time, one scale per block of QK8 = 32 values (``act="int8"``, integer
dot products per block).

The formats are defined once in C (runtime_c/include/colibri_quant.h) and mirrored here as
numpy dtypes (:data:`BLOCK_Q4_DTYPE`, which with QK4 and :func:`q4_blocks` is part of the
container format, :mod:`colibri.frontends.container`, that stores these blocks);
tests/test_quant.py reads the C sizes and offsets back from a compiled object. The kernels
below mirror the C library kernels' arithmetic *in the same fp32 order* (every board compiles
with -ffp-contract=off), so integer accumulators and matvec outputs are bit-identical (the
generated fp32 experts in layout ``c8`` and the Helium fp16 experts use fused multiply-adds
instead: within the fp32 tolerance, docs/format.md 6); C's ``roundf`` (half away from zero)
is mirrored by :func:`round_half_away`, not ``np.round`` (half to even).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError, ModelFormatError, ShapeError
from ..frontends.container import (
    BLOCK_Q4_DTYPE,
    BLOCK_Q4K_DTYPE,
    KQUANT_DTYPES,
    QK4,
    QK_K,
    q4_blocks,
    q4k_bytes,
    q4k_group_rows,
    q4k_row_subs,
)
from ..ir.moe import Expert, MoELayer
from ..progress import Tick

#: Weight schemes, in colibri_quant_scheme order.
SCHEMES: tuple[str, ...] = ("fp32", "fp16", "int8", "int4", "q4k", "q5k")
#: Activation modes of the quantised kernels.
ACT_MODES: tuple[str, ...] = ("fp32", "int8")
#: Default activation mode per scheme: integer dot products for integer weights.
DEFAULT_ACT: dict[str, str] = {
    "fp32": "fp32",
    "fp16": "fp32",
    "int8": "int8",
    "int4": "int8",
    "q4k": "int8",
    "q5k": "int8",
}
#: The k-quant-class schemes and their code bits (the q4k section).
KQUANT_BITS: dict[str, int] = {"q4k": 4, "q5k": 5}
#: Schemes whose kernels take int8 activations only (no fp32-activation kernel).
INT8_ACT_ONLY: tuple[str, ...] = ("q4k", "q5k")

QK8 = 32  # COLIBRI_QK8: activations per scale of the int8 activation quantiser
Q8_MAX = 127  # COLIBRI_Q8_MAX
FP16_MAX = 65504.0


def q8_channel_dtype(n_out: int, n_in: int, n_scales: int | None = None) -> np.dtype:
    """numpy mirror of the generated int8 tensor struct (one per shape, colibri_weights.h):
    ``struct { float scale[n_scales]; int8_t q[n_out * n_in]; }``, C padding included (the
    generated header _Static_asserts that sizeof matches this itemsize). n_scales is n_out (one
    scale per output channel) or, for the block-scaled dense layout, n_out * ceil(n_in / 32)."""
    n_scales = n_out if n_scales is None else n_scales
    return np.dtype([("scale", "<f4", (n_scales,)), ("q", "i1", (n_out * n_in,))], align=True)


# -- error bounds, named in one place ---------------------------------------------------------

#: fp16 round trip: relative error <= 2^-11 (half an ulp) for normal values; absolute error
#: <= 2^-25 (half the smallest subnormal step) below the normal range.
FP16_REL_BOUND = 2.0**-11
FP16_ABS_BOUND = 2.0**-25
#: int8 / int4 round trip: |w - deq(q(w))| <= QUANT_STEP_FRACTION * step (step = the channel's
#: or the block's scale), plus one fp32 ulp of the value for the division/multiplication.
QUANT_STEP_FRACTION = 0.5

#: Whole-layer tolerance of C vs the quantised reference (relative to max|ref|, as
#: reference.compare). Quantised experts are bit-exact with the mirror: the matvecs, the
#: activation quantiser and every activation (colibri_math.h's expf, SiLU and GELUs, no libm,
#: repeated op for op by reference.f32), so those layers can be compared with np.array_equal.
#: What stays approximate is what the mirror computes in float64: fp32 experts and the shared
#: expert (fp32 size). The int8-activation entries keep the margin they had when libm's
#: erff / tanhf could flip an int8 code of the hidden row (~1e-3 of max|y|).
LAYER_TOLERANCE: dict[tuple[str, str], float] = {
    ("fp32", "fp32"): 2e-5,
    ("fp16", "fp32"): 2e-5,
    ("int8", "fp32"): 2e-5,
    ("int4", "fp32"): 2e-5,
    ("fp16", "int8"): 5e-3,
    ("int8", "int8"): 5e-3,
    ("int4", "int8"): 5e-3,
    ("q4k", "int8"): 5e-3,
    ("q5k", "int8"): 5e-3,
}


def round_half_away(x: np.ndarray) -> np.ndarray:
    """C ``roundf``: round half away from zero. Done in float64, where |x| + 0.5 is exact for
    every float32 x (in float32 it would round 0.49999997 + 0.5 up to 1)."""
    x64 = np.asarray(x, dtype=np.float64)
    return np.sign(x64) * np.floor(np.abs(x64) + 0.5)


def check_choice(value: str, choices: tuple[str, ...], what: str, kind: str = "scheme") -> str:
    """value if it is one of choices, else the ConfigError naming the option and the choices."""
    if value not in choices:
        raise ConfigError(f"{what}: unknown {kind} '{value}'; supported: {', '.join(choices)}")
    return value


def check_scheme(scheme: str, what: str = "--quant") -> str:
    s = scheme.lower()
    if s not in SCHEMES:
        raise ConfigError(f"{what}: unknown scheme '{scheme}'; supported: {', '.join(SCHEMES)}")
    return s


# -- fp16 -------------------------------------------------------------------------------------


def quantize_fp16(w: np.ndarray, name: str = "tensor") -> np.ndarray:
    """IEEE binary16 bits (uint16) of w (round to nearest even, numpy's float16 cast)."""
    w = np.asarray(w, dtype=np.float32)
    big = np.abs(w) > FP16_MAX
    if big.any():
        raise ModelFormatError(
            f"{name}: {int(big.sum())} values exceed the fp16 range (|w| <= {FP16_MAX}), "
            f"largest {float(np.abs(w).max()):.6g}; use --quant int8 or fp32 for this expert"
        )
    return w.astype(np.float16).view(np.uint16)


def f16_to_f32(bits: np.ndarray) -> np.ndarray:
    """colibri_f16_to_f32: exact."""
    return np.asarray(bits, dtype=np.uint16).view(np.float16).astype(np.float32)


# -- int8, per output channel ------------------------------------------------------------------


def quantize_int8_per_channel(w_t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """w_t [out, in] -> (q int8 [out, in], scale float32 [out]); q = roundf(w / s), s = max|w|
    / 127 per row (rows of zeros get s = 0 and q = 0): the plain method."""
    w_t = np.asarray(w_t, dtype=np.float32)
    amax = np.max(np.abs(w_t), axis=1) if w_t.shape[1] else np.zeros(w_t.shape[0], np.float32)
    scale = (amax / np.float32(Q8_MAX)).astype(np.float32)
    return int8_codes(w_t, scale), scale


def int8_codes(w_t: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The nearest codes of w_t [out, in] for per-row scales: clamp(roundf(w / s), -127, 127)
    (0 where s is 0), a chunk of rows at a time (the temporaries of a whole embedding would be
    ten times its size)."""
    w_t = np.asarray(w_t, dtype=np.float32)
    scale = np.asarray(scale)
    out = np.empty(w_t.shape, np.int8)
    rows = max(1, SEARCH_CHUNK // max(1, w_t.shape[1]))
    for r0 in range(0, w_t.shape[0], rows):
        out[r0 : r0 + rows] = _int8_codes(w_t[r0 : r0 + rows], scale[r0 : r0 + rows])
    return out


def _int8_codes(w_t: np.ndarray, scale: np.ndarray) -> np.ndarray:
    safe = np.where(scale == 0, np.float32(1), scale).astype(np.float32)
    q = round_half_away((w_t / safe[:, None]).astype(np.float32))
    q = np.where(scale[:, None] == 0, 0, q)
    return np.clip(q, -Q8_MAX, Q8_MAX).astype(np.int8)


def dequantize_int8(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return (q.astype(np.float32) * scale[:, None]).astype(np.float32)


# -- int4, blocks of 32 along the input --------------------------------------------------------


def q8_blocks(n: int) -> int:
    """COLIBRI_Q8_BLOCKS: scales of a quantised activation row of n values."""
    return (n + QK8 - 1) // QK8


def _q4_padded(w_t: np.ndarray) -> np.ndarray:
    """w_t [out, in] as zero-padded blocks [out, nb, 32] (float32)."""
    w_t = np.asarray(w_t, dtype=np.float32)
    n_out, n_in = w_t.shape
    nb = q4_blocks(n_in)
    padded = np.zeros((n_out, nb * QK4), dtype=np.float32)
    padded[:, :n_in] = w_t
    return padded.reshape(n_out, nb, QK4)


def _q4_plain_scale(amax: np.ndarray) -> np.ndarray:
    """The plain method's fp16 scale of blocks whose max |w| is amax: fp16(amax / 7)."""
    d16 = (amax / np.float32(7)).astype(np.float32).astype(np.float16)
    # fp16 may round the scale down far enough (subnormal scales, or to 0) that the largest
    # weight would round past 7 and clamp: take the next fp16 up, which always suffices.
    d = d16.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = (amax / np.where(d == 0, np.float32(1), d)).astype(np.float32)
    low = (amax > 0) & ((d == 0) | (ratio >= np.float32(7.5)))
    return np.where(low, np.nextafter(d16, np.float16(np.inf)), d16).astype(np.float16)


def int4_blocks_with_scales(w_t: np.ndarray, d16: np.ndarray) -> np.ndarray:
    """BLOCK_Q4_DTYPE [out, nb] of w_t [out, in] for the given fp16 scales d16 [out, nb] (of
    either sign): value = clamp(roundf(w / d), -8, 7), stored as nibble value + 8 (0 where d is
    0)."""
    blocks = _q4_padded(w_t)
    d16 = np.asarray(d16, dtype=np.float16)
    d = d16.astype(np.float32)
    safe = np.where(d == 0, np.float32(1), d).astype(np.float32)
    v = round_half_away((blocks / safe[:, :, None]).astype(np.float32))
    v = np.where(d[:, :, None] == 0, 0, v)
    nib = (np.clip(v, -8, 7) + 8).astype(np.uint8)
    out = np.zeros(d16.shape, dtype=BLOCK_Q4_DTYPE)
    out["d"] = d16.view(np.uint16)
    out["qs"] = nib[:, :, :16] | (nib[:, :, 16:] << 4)
    return out


def quantize_int4_blocks(w_t: np.ndarray) -> np.ndarray:
    """w_t [out, in] -> BLOCK_Q4_DTYPE [out, blocks]: d = fp16(max|w| / 7) per block, value =
    clamp(roundf(w / d), -8, 7), stored as nibble value + 8: the plain method."""
    amax = np.max(np.abs(_q4_padded(w_t)), axis=2)
    return int4_blocks_with_scales(w_t, _q4_plain_scale(amax))


def int4_values(blocks: np.ndarray, n_in: int) -> np.ndarray:
    """Signed values -8..7 [out, in] of BLOCK_Q4_DTYPE blocks [out, nb]."""
    qs = blocks["qs"]
    nib = np.concatenate([qs & 0x0F, qs >> 4], axis=2).astype(np.int32) - 8
    return nib.reshape(blocks.shape[0], -1)[:, :n_in]


def dequantize_int4(blocks: np.ndarray, n_in: int) -> np.ndarray:
    d = f16_to_f32(blocks["d"])
    vals = int4_values(blocks, blocks.shape[1] * QK4).astype(np.float32)
    vals = vals.reshape(blocks.shape[0], blocks.shape[1], QK4) * d[:, :, None]
    return vals.reshape(blocks.shape[0], -1)[:, :n_in].astype(np.float32)


# -- scale search (issue 15): the stored scales chosen by measured error ------------------------
#
# The formats and kernels are unchanged: only the values of the scales (and so the codes) are
# chosen. Per int4 block / int8 output channel, candidate scales are tried and the one with the
# least weighted squared reconstruction error kept (:func:`search_objective`):
#
#     sum_i imp_i * (w_i^2 + SIGMA_WEIGHT * mean(w^2)) * (w_i - s q_i)^2
#
# over the block / channel, with the codes q the nearest ones for the scale as stored (int4:
# after rounding to fp16). imp is 1, or per input channel (calibration E[x^2]); the w_i^2 +
# sigma^2 term (llama.cpp's k-quant weighting without an importance matrix) counts errors of
# large weights more. On a trained 3.4 M-parameter Mixtral (int4, its experts' output error on
# held-out tokens) it gives -15 % of the plain method's error, where plain MSE gives -10 %. The
# plain method's scale is the first candidate, so the search is never worse on its objective
# and keeps the plain scale on ties (deterministic: the same weights give the same bytes).

#: --scale-search: "mse" (search, the default) or "none" (the plain method: max|w| / 7 per
#: int4 block, max|w| / 127 per int8 channel).
SCALE_SEARCHES: tuple[str, ...] = ("mse", "none")
DEFAULT_SCALE_SEARCH = "mse"
#: int4 candidates, as the code c that the block's largest-magnitude weight m maps to (d = m /
#: c, rounded to fp16): c > 0 keeps m on the 7-level side of its sign (c = 7 is the plain
#: method), c < 0 puts it on the -8 side, so d has the opposite sign of m (c = -8 is ggml's
#: q4_0 "d = max / -8"); |c| beyond 7.5 / 8.5 clips m.
INT4_TARGETS: tuple[float, ...] = (
    7.0, 6.5, 6.75, 7.25, 7.5, 7.75, -8.0, -7.5, -7.75, -8.25, -8.5, -8.75, -9.0,
)  # fmt: skip
#: int8 candidates, as factors of the plain scale max|w| / 127 (<= 1: clipping the largest).
INT8_FACTORS: tuple[float, ...] = (1.0, 0.995, 0.99, 0.98, 0.97, 0.96, 0.94, 0.92, 0.9, 0.85)
#: Refinements after the grid: the weighted least-squares scale of the best codes,
#: sum(a w q) / sum(a q^2) (a: the objective's weights), rounded as stored and re-coded, kept
#: where it is better.
SEARCH_REFINEMENTS = 1
#: The objective weights each error by w_i^2 + SIGMA_WEIGHT * mean(w^2) of its block / channel
#: (module comment); a large value approaches plain MSE, 0 weights by w_i^2 alone.
SIGMA_WEIGHT = 1.0
#: Weights per chunk of rows: each candidate makes a few passes over a chunk, so a chunk that
#: stays in the L2 cache (256 KB of float32) makes the search 1.45x (int4) / 1.5x (int8) faster
#: than chunks of 2^20 weights at 2816 x 1024, with the same scales (rows are independent).
SEARCH_CHUNK = 1 << 16
#: Channel importances are floored at this fraction of their mean (a channel never seen in
#: calibration still counts a little, so its weights are not left arbitrary).
IMPORTANCE_FLOOR = 1e-2


def check_scale_search(search: str) -> str:
    return check_choice(search, SCALE_SEARCHES, "--scale-search", "method")


def normalise_importance(importance: np.ndarray | None, n_in: int, name: str) -> np.ndarray | None:
    """Per-input-channel importances (e.g. calibration E[x^2]) as float32 [n_in] with mean 1,
    floored at IMPORTANCE_FLOOR; None stays None (every channel 1)."""
    if importance is None:
        return None
    imp = np.asarray(importance, dtype=np.float64).reshape(-1)
    if imp.shape != (n_in,):
        raise ShapeError(f"{name}: {imp.size} channel importances for {n_in} input channels")
    imp = np.where(np.isfinite(imp) & (imp > 0), imp, 0.0)
    mean = float(imp.mean()) if imp.size else 0.0
    if mean <= 0:
        return None
    return np.maximum(imp / mean, IMPORTANCE_FLOOR).astype(np.float32)


def _objective_weights(groups: np.ndarray, imp: np.ndarray | None) -> np.ndarray:
    """The objective's weight of every element of groups [..., group] (int4 blocks or int8
    channels): imp * (w^2 + SIGMA_WEIGHT * mean(w^2) of the group), float32."""
    sq = groups * groups
    a = sq + np.float32(SIGMA_WEIGHT) * sq.mean(axis=-1, keepdims=True)
    return a if imp is None else a * imp


def _weighted_sq(diff: np.ndarray, a: np.ndarray) -> np.ndarray:
    """sum over the last axis of a * diff^2 (diff is overwritten)."""
    np.square(diff, out=diff)
    diff *= a
    return np.asarray(diff.sum(axis=-1))


def _nearest(groups: np.ndarray, s: np.ndarray, top: int, bottom: int) -> np.ndarray:
    """Nearest codes (float32) of groups [..., group] for scales s [...] (s usable)."""
    v = np.rint(groups / s[..., None])
    return np.clip(v, bottom, top, out=v)


def _error(groups: np.ndarray, s: np.ndarray, a: np.ndarray, top: int, bottom: int) -> np.ndarray:
    """The objective of every group for scales s (inf where s is 0 or not finite)."""
    ok = np.isfinite(s) & (s != 0)
    safe = np.where(ok, s, np.float32(1)).astype(np.float32)
    v = _nearest(groups, safe, top, bottom)
    v *= safe[..., None]
    err = _weighted_sq(np.subtract(groups, v, out=v), a)
    return np.where(ok, err, np.float32(np.inf)).astype(np.float32)


def _least_squares(
    groups: np.ndarray, s: np.ndarray, a: np.ndarray, top: int, bottom: int
) -> np.ndarray:
    """The weighted least-squares scale of the nearest codes for s: sum(a w q) / sum(a q^2)
    per group (s where that is undefined), float64."""
    ok = np.isfinite(s) & (s != 0)
    safe = np.where(ok, s, np.float32(1)).astype(np.float32)
    q = _nearest(groups, safe, top, bottom)
    qa = q * a
    num = np.einsum("...k,...k->...", qa, groups, dtype=np.float64)
    den = np.einsum("...k,...k->...", qa, q, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(ok & (den > 0), num / np.where(den > 0, den, 1), s)


def _keep_better(
    best: np.ndarray, err: np.ndarray, s: np.ndarray, e: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    better = e < err
    return np.where(better, s, best), np.where(better, e, err)


def search_int4_scales(w_t: np.ndarray, importance: np.ndarray | None = None) -> np.ndarray:
    """fp16 scales [out, nb] of w_t [out, in] minimising each block's objective over the plain
    scale, the INT4_TARGETS grid and SEARCH_REFINEMENTS least-squares steps; importance: [in]
    per input channel, or None."""
    w_t = np.asarray(w_t, dtype=np.float32)
    n_out, n_in = w_t.shape
    nb = q4_blocks(n_in)
    imp = normalise_importance(importance, n_in, "int4 scale search")
    imp_b = None
    if imp is not None:
        flat = np.zeros(nb * QK4, np.float32)
        flat[:n_in] = imp
        imp_b = flat.reshape(nb, QK4)
    out = np.zeros((n_out, nb), np.float16)
    rows = max(1, SEARCH_CHUNK // max(1, nb * QK4))
    for r0 in range(0, n_out, rows):
        blocks = _q4_padded(w_t[r0 : r0 + rows])
        absb = np.abs(blocks)
        amax = absb.max(axis=2)
        m = np.take_along_axis(blocks, absb.argmax(axis=2)[..., None], axis=2)[..., 0]
        a = _objective_weights(blocks, imp_b)
        best = _q4_plain_scale(amax).astype(np.float32)
        err = _error(blocks, best, a, 7, -8)
        with np.errstate(over="ignore"):
            for c in INT4_TARGETS:
                d = (m / np.float32(c)).astype(np.float16).astype(np.float32)
                best, err = _keep_better(best, err, d, _error(blocks, d, a, 7, -8))
            for _ in range(SEARCH_REFINEMENTS):
                d = _least_squares(blocks, best, a, 7, -8)
                d = d.astype(np.float16).astype(np.float32)
                best, err = _keep_better(best, err, d, _error(blocks, d, a, 7, -8))
        out[r0 : r0 + rows] = np.where(amax > 0, best, 0).astype(np.float16)
    return out


def search_int8_scales(w_t: np.ndarray, importance: np.ndarray | None = None) -> np.ndarray:
    """float32 scales [out] of w_t [out, in] minimising each channel's objective over the
    plain scale, the INT8_FACTORS clip grid and SEARCH_REFINEMENTS least-squares steps."""
    w_t = np.asarray(w_t, dtype=np.float32)
    n_out, n_in = w_t.shape
    imp = normalise_importance(importance, n_in, "int8 scale search")
    out = np.zeros(n_out, np.float32)
    if n_in == 0:
        return out
    rows = max(1, SEARCH_CHUNK // n_in)
    for r0 in range(0, n_out, rows):
        w = w_t[r0 : r0 + rows]
        amax = np.abs(w).max(axis=1)
        a = _objective_weights(w, imp)
        plain = (amax / np.float32(Q8_MAX)).astype(np.float32)
        best, err = plain, _error(w, plain, a, Q8_MAX, -Q8_MAX)
        for f in INT8_FACTORS[1:]:
            s = (plain * np.float32(f)).astype(np.float32)
            best, err = _keep_better(best, err, s, _error(w, s, a, Q8_MAX, -Q8_MAX))
        for _ in range(SEARCH_REFINEMENTS):
            s = _least_squares(w, best, a, Q8_MAX, -Q8_MAX).astype(np.float32)
            best, err = _keep_better(best, err, s, _error(w, s, a, Q8_MAX, -Q8_MAX))
        out[r0 : r0 + rows] = np.where(amax > 0, best, 0)
    return out


def search_objective(
    t: QuantTensor, w_t: np.ndarray, importance: np.ndarray | None = None
) -> float:
    """The scale search's objective of a stored int8 / int4 tensor against its float weights
    [out, in] (module comment; float64, summed over the tensor)."""
    w_t = np.asarray(w_t, dtype=np.float32)
    imp = normalise_importance(importance, t.n_in, "search objective")
    deq = t.dequantize()
    if t.scheme == "int4":
        w_g, d_g = _q4_padded(w_t), _q4_padded(deq)
        imp_g = None
        if imp is not None:
            flat = np.zeros(w_g.shape[1] * QK4, np.float32)
            flat[: t.n_in] = imp
            imp_g = flat.reshape(-1, QK4)
    else:
        w_g, d_g, imp_g = w_t, deq, imp
    a = _objective_weights(w_g, imp_g).astype(np.float64)
    return float(np.sum(a * (w_g.astype(np.float64) - d_g) ** 2))


def reconstruction_error(t: QuantTensor, w_t: np.ndarray) -> float:
    """sum (w - deq(q))^2 of a stored tensor against its float weights [out, in] (float64)."""
    diff = t.dequantize().astype(np.float64) - np.asarray(w_t, dtype=np.float64)
    return float(np.sum(diff**2))


# -- q4k: super-blocks of 256 with 6-bit sub-block scales and minimums ------------------------
#
# The k-quant-class 4-bit scheme (issue 38; the idea of llama.cpp's Q4_K, this project's own
# layout and quantiser). A row of n_in weights is cut into nsub = ceil(n_in / 32) sub-blocks of
# 32 (the last zero-padded) that line up with the int8 activation blocks (QK8). A matrix's
# sub-blocks, rows in order and each row's in order, form one stream cut into super-blocks of
# 8: row r's sub-block c is the stream's k = r * nsub + c (super-block k / 8, slot j = k % 8),
# so a super-block may span rows and rows of any width pay 4.5 bits per weight (rows of 96 or
# 128 inputs no longer pay a super-block's head each). Rows go in groups of G = 8 / gcd(nsub, 8)
# whose sub-blocks fill whole super-blocks (G = 1 when nsub is a multiple of 8: then every row
# is its own whole super-blocks, the layout of llama.cpp's rows); a row split at a multiple of
# G starts a super-block (q4k_group_rows, COLIBRI_KQ_GROUP_ROWS). Sub-block j of a super-block
# stores the 32 codes q in 0..15, a 6-bit scale sc_j and a 6-bit minimum m_j; the super-block
# stores one fp16 super-scale d and one fp16 super-minimum dmin:
#
#     w ~ (d * sc_j) * q - (dmin * m_j)
#
# colibri_block_q4k (runtime_c/include/colibri_quant.h), 144 bytes per 256 weights, 4.5 bits
# per weight: d (2 bytes), dmin (2), scales (12: the 16 6-bit values), qs (128: the nibbles).
# scales[j] (j < 8) holds the low 4 bits of sc_j (low nibble) and of m_j (high nibble);
# scales[8 + j / 2] holds their high 2 bits, sc_j's at bit 4 * (j % 2) and m_j's at bit
# 4 * (j % 2) + 2. Sub-block j's codes are qs[16 j .. 16 j + 16): code i (i < 16) in the low
# nibble of qs[16 j + i], code i + 16 in its high nibble (the int4 block's order).
# QuantTensor.data holds the matrix's stream of super-blocks [nsb] (the last one's unused
# slots zero); as stored (generated weights, container), the stream is cut after its last used
# sub-block (colibri.frontends.container.q4k_bytes, COLIBRI_Q4K_BYTES).
#
# The kernel with int8 activations (xq, one scale sx[b] per block b of 32, the last possibly
# shorter), per output, the fp32 operations in this order (C == mirror bit for bit):
#
#     acc = 0; for each sub-block b of the row (stream sub-block r * nsub + b: 8 s + j):
#         isum = sum_i q_i * xq[i]; xsum = sum_i xq[i]          (int32, over the block's inputs)
#         acc += (float)(sc_j * isum) * (d_s * sx[b])
#         acc -= (float)(m_j * xsum) * (dmin_s * sx[b])
#     y = acc
#
# sc_j * isum and m_j * xsum are exact in int32 and in fp32 (|.| <= 63 * 32 * 15 * 127 < 2^24).
#
# Quantiser: per sub-block, the scale s and minimum m >= 0 of w ~ s q - m are searched over
# Q4K_STEPS code ranges (llama.cpp's make_qkx idea: codes of a grid of inverse scales, each
# refitted by weighted least squares for s and m), weighted as the int4 search (imp * (w^2 +
# SIGMA_WEIGHT mean(w^2))); then per super-block d = max_j s_j / 63 and dmin = max_j m_j / 63
# (fp16) over the super-block's 8 sub-blocks (whichever rows they belong to), the 6-bit
# sc_j / m_j (of the floors and ceilings of s_j / d and m_j / dmin, the pair whose nearest codes
# give the smallest weighted error: a super-scale shared by rows of different size leaves the
# smaller sub-blocks few 6-bit levels, where the nearest value alone costs 2-4 % more squared
# error), and the codes nearest for the stored (d sc_j, dmin m_j). search "none" skips the
# grid and the floor / ceiling choice (s = (max - min) / 15 (q5k: / 31), m = -min, the nearest
# 6-bit values).
#
# q5k (colibri_block_q5k, 176 bytes, 5.5 bits per weight) is the same with codes 0..31: each
# sub-block takes 20 bytes of qs, its 16 bytes of low nibbles (as q4k's) then 4 bytes whose
# bit k (a little-endian 32-bit word) is bit 4 of code k; the kernel's order is the same
# (|sc_j * isum| <= 63 * 32 * 31 * 127 < 2^24, still exact in fp32).

#: Weights per q4k sub-block (== QK8); QK_K, the super-block, and BLOCK_Q4K_DTYPE (the
#: numpy mirror of colibri_block_q4k) are part of the container format
#: (:mod:`colibri.frontends.container`).
QK_K_SUB = 32
#: Sub-blocks per super-block.
Q4K_SUBS = QK_K // QK_K_SUB
#: Largest 6-bit sub-block scale / minimum, largest code.
Q4K_SCALE_MAX = 63
Q4K_CODE_MAX = 15
#: Bits per weight of q4k (whole super-blocks; a matrix's rows share them, so every shape pays
#: this up to its one cut last super-block and the zero-padded tail of each row's last
#: sub-block: q4k_bytes).
Q4K_BITS_PER_WEIGHT = BLOCK_Q4K_DTYPE.itemsize * 8 / QK_K
#: The grid of the sub-block search: inverse scales (Q4K_CODE_MAX + k * Q4K_STEP) / (max - min)
#: for k in -Q4K_STEPS .. Q4K_STEPS.
Q4K_STEPS = 10
Q4K_STEP = 0.1


def q4k_pack_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """The 12 scale bytes [..., 12] of 6-bit scales sc [..., 8] and minimums m [..., 8]."""
    sc = np.asarray(sc, dtype=np.uint8)
    m = np.asarray(m, dtype=np.uint8)
    out = np.zeros(sc.shape[:-1] + (12,), np.uint8)
    out[..., :8] = (sc & 15) | ((m & 15) << 4)
    hi = ((sc >> 4) & 3) | (((m >> 4) & 3) << 2)  # [..., 8], 4 bits per sub-block
    out[..., 8:] = hi[..., 0::2] | (hi[..., 1::2] << 4)
    return out


def q4k_unpack_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sc, m) int32 [..., 8] of the 12 scale bytes [..., 12]."""
    s = np.asarray(scales, dtype=np.int32)
    hi = np.stack([s[..., 8:] & 15, s[..., 8:] >> 4], axis=-1).reshape(s.shape[:-1] + (8,))
    sc = (s[..., :8] & 15) | ((hi & 3) << 4)
    m = (s[..., :8] >> 4) | ((hi >> 2) << 4)
    return sc, m


def kquant_code_max(bits: int) -> int:
    return (1 << bits) - 1


def _q4k_rows(v: np.ndarray, n_out: int, n_in: int) -> np.ndarray:
    """Per-sub-block values of the stream [nsb, 8, ...] as rows [n_out, nsub, ...] (the
    stream's row-major order; the unused slots of the last super-block dropped)."""
    nsub = q4k_row_subs(n_in)
    flat = v.reshape((-1,) + v.shape[2:])
    return flat[: n_out * nsub].reshape((n_out, nsub) + v.shape[2:])


def _q4k_stream(v: np.ndarray) -> np.ndarray:
    """Per-sub-block values [n_out, nsub, ...] as the stream's super-blocks [nsb, 8, ...] (the
    last one's unused slots zero): row r's sub-block c is stream sub-block r * nsub + c."""
    n = v.shape[0] * v.shape[1]
    nsb = (n + Q4K_SUBS - 1) // Q4K_SUBS
    out = np.zeros((nsb * Q4K_SUBS,) + v.shape[2:], v.dtype)
    out[:n] = v.reshape((n,) + v.shape[2:])
    return out.reshape((nsb, Q4K_SUBS) + v.shape[2:])


def q4k_codes(blocks: np.ndarray, n_out: int, n_in: int) -> np.ndarray:
    """Codes (0..15 q4k, 0..31 q5k) int32 [out, n_in] of a matrix's super-blocks [nsb]."""
    sub = blocks["qs"].shape[-1] // Q4K_SUBS
    qs = blocks["qs"].reshape(blocks.shape + (Q4K_SUBS, sub))
    nib = qs[..., :16]
    q = np.concatenate([nib & 0x0F, nib >> 4], axis=-1).astype(np.int32)
    if sub == 20:  # q5k: the fifth bits, bit k of the little-endian word of bytes 16..19
        hb = qs[..., 16:20].astype(np.uint32)
        word = hb[..., 0] | (hb[..., 1] << 8) | (hb[..., 2] << 16) | (hb[..., 3] << 24)
        hi = (word[..., None] >> np.arange(QK_K_SUB, dtype=np.uint32)) & 1
        q |= hi.astype(np.int32) << 4
    return _q4k_rows(q, n_out, n_in).reshape(n_out, -1)[:, :n_in]


def q4k_sub_params(
    blocks: np.ndarray, n_out: int, n_in: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(sc, m) int32 and (d, dmin) fp32 of each row's sub-blocks, [out, nsub] each (d / dmin:
    those of the super-block the sub-block sits in)."""
    sc, m = q4k_unpack_scales(blocks["scales"])
    one = np.ones((1, Q4K_SUBS), np.float32)
    d = f16_to_f32(blocks["d"])[:, None] * one
    dmin = f16_to_f32(blocks["dmin"])[:, None] * one
    return (
        _q4k_rows(sc, n_out, n_in),
        _q4k_rows(m, n_out, n_in),
        _q4k_rows(d, n_out, n_in),
        _q4k_rows(dmin, n_out, n_in),
    )


def q4k_sub_scales(blocks: np.ndarray, n_out: int, n_in: int) -> tuple[np.ndarray, np.ndarray]:
    """The fp32 sub-block step and minimum [out, nsub] as the dequantiser uses them:
    d * (float)sc_j and dmin * (float)m_j, each one fp32 product."""
    sc, m, d, dmin = q4k_sub_params(blocks, n_out, n_in)
    step = (d * sc.astype(np.float32)).astype(np.float32)
    low = (dmin * m.astype(np.float32)).astype(np.float32)
    return step, low


def dequantize_q4k(blocks: np.ndarray, n_out: int, n_in: int) -> np.ndarray:
    """float32 [out, n_in]: (d sc_j) * q - (dmin m_j), in fp32."""
    step, low = q4k_sub_scales(blocks, n_out, n_in)
    nsub = q4k_row_subs(n_in)
    q = q4k_codes(blocks, n_out, nsub * QK_K_SUB).astype(np.float32)
    q = q.reshape(n_out, nsub, QK_K_SUB)
    w = (q * step[..., None]).astype(np.float32) - low[..., None]
    return w.reshape(n_out, -1)[:, :n_in].astype(np.float32)


def _q4k_padded(w_t: np.ndarray) -> np.ndarray:
    """w_t [out, in] as zero-padded sub-blocks [out, nsub, 32] (float32)."""
    w_t = np.asarray(w_t, dtype=np.float32)
    n_out, n_in = w_t.shape
    padded = np.zeros((n_out, q4k_row_subs(n_in) * QK_K_SUB), dtype=np.float32)
    padded[:, :n_in] = w_t
    return padded.reshape(n_out, -1, QK_K_SUB)


def _q4k_fit(
    g: np.ndarray, a: np.ndarray, codes: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The weighted least-squares (s >= 0, m >= 0) of g ~ s codes - m per group [..., 32], and
    its objective: (s, m, err) float64."""
    g64 = g.astype(np.float64)
    a64 = a.astype(np.float64)
    sw = a64.sum(-1)
    sl = np.einsum("...k,...k->...", a64, codes)
    sll = np.einsum("...k,...k->...", a64, codes * codes)
    sx = np.einsum("...k,...k->...", a64, g64)
    slx = np.einsum("...k,...k->...", a64 * codes, g64)
    det = sw * sll - sl * sl
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.where(det > 0, (sw * slx - sl * sx) / np.where(det > 0, det, 1), 0.0)
        b = np.where(det > 0, (sll * sx - sl * slx) / np.where(det > 0, det, 1), 0.0)
        # the minimum must be >= 0 (b = -m <= 0): else the fit through the origin
        alone = np.where(sll > 0, slx / np.where(sll > 0, sll, 1), 0.0)
    pos = b > 0
    s = np.where(pos, alone, s)
    b = np.where(pos, 0.0, b)
    s = np.maximum(s, 0.0)
    err = np.einsum("...k,...k->...", a64, (s[..., None] * codes + b[..., None] - g64) ** 2)
    return s, -b, err


def _q4k_sub_search(
    g: np.ndarray, a: np.ndarray, search: str, top: int = Q4K_CODE_MAX
) -> tuple[np.ndarray, np.ndarray]:
    """The (s, m) float64 [...] of each sub-block g [..., 32] (weights a) for codes 0..top: the
    plain range, then (search "mse") the grid of inverse scales, each refitted (module
    comment)."""
    lo = np.minimum(g.min(-1), 0).astype(np.float64)
    hi = g.max(-1).astype(np.float64)
    rng = hi - lo
    s = rng / top
    m = -lo
    if search == "none":
        return s, m
    safe = np.where(rng > 0, rng, 1.0)
    shifted = g.astype(np.float64) - lo[..., None]
    codes = np.clip(np.rint(shifted / np.where(s > 0, s, 1.0)[..., None]), 0, top)
    d = s[..., None] * codes - m[..., None] - g
    err = np.einsum("...k,...k->...", a.astype(np.float64), d * d)
    for k in range(-Q4K_STEPS, Q4K_STEPS + 1):
        inv = (top + k * Q4K_STEP) / safe
        codes = np.clip(np.rint(shifted * inv[..., None]), 0, top)
        s2, m2, e2 = _q4k_fit(g, a, codes)
        better = (e2 < err) & (rng > 0)
        s, m, err = np.where(better, s2, s), np.where(better, m2, m), np.where(better, e2, err)
    return s, m


def _q4k_six_bit(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per super-block: (fp16 bits [...], 6-bit values [..., 8]) of v [..., 8] >= 0:
    D = fp16(max / 63), q = clamp(roundf(v / D), 0, 63) (0 where D is 0)."""
    top = v.max(-1)
    d16 = (top / Q4K_SCALE_MAX).astype(np.float32).astype(np.float16)
    d = d16.astype(np.float32).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = round_half_away(v / np.where(d > 0, d, 1.0)[..., None])
    q = np.where(d[..., None] > 0, np.clip(q, 0, Q4K_SCALE_MAX), 0)
    return d16.view(np.uint16), q.astype(np.uint8)


def _q4k_six_bit_refined(
    g: np.ndarray,
    a: np.ndarray,
    s: np.ndarray,
    m: np.ndarray,
    d: np.ndarray,
    dmin: np.ndarray,
    top: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The 6-bit (sc, m) [nsb, 8] of each sub-block g [nsb, 8, 32] (objective weights a) for the
    super-block's fp32 d / dmin [nsb]: of sc in {floor, ceil}(s / d) and m in {floor, ceil}(m /
    dmin), the pair whose nearest codes give the smallest weighted error (the nearest 6-bit
    values alone ignore that a super-scale shared by several rows' sub-blocks leaves the
    smaller ones few levels)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        rs = np.where(d[:, None] > 0, s / np.where(d > 0, d, 1.0)[:, None], 0.0)
        rm = np.where(dmin[:, None] > 0, m / np.where(dmin > 0, dmin, 1.0)[:, None], 0.0)
    best_err = np.full(s.shape, np.inf)
    best_sc = np.zeros(s.shape, np.uint8)
    best_m = np.zeros(s.shape, np.uint8)
    d32 = d.astype(np.float32)[:, None]
    dm32 = dmin.astype(np.float32)[:, None]
    for sc_c in (np.floor(rs), np.ceil(rs)):
        sc_c = np.clip(sc_c, 0, Q4K_SCALE_MAX)
        step = (d32 * sc_c.astype(np.float32)).astype(np.float32)[..., None]
        for m_c in (np.floor(rm), np.ceil(rm)):
            m_c = np.clip(m_c, 0, Q4K_SCALE_MAX)
            low = (dm32 * m_c.astype(np.float32)).astype(np.float32)[..., None]
            with np.errstate(divide="ignore", invalid="ignore"):
                q = round_half_away((g + low) / np.where(step > 0, step, 1))
            q = np.where(step > 0, np.clip(q, 0, top), 0).astype(np.float32)
            diff = (q * step - low - g).astype(np.float64)
            err = _weighted_sq(diff, a)
            better = err < best_err
            best_err = np.where(better, err, best_err)
            best_sc = np.where(better, sc_c, best_sc).astype(np.uint8)
            best_m = np.where(better, m_c, best_m).astype(np.uint8)
    return best_sc, best_m


def q4k_blocks_with_scales(
    w_t: np.ndarray,
    s: np.ndarray,
    m: np.ndarray,
    bits: int = 4,
    weights: np.ndarray | None = None,
) -> np.ndarray:
    """BLOCK_Q4K_DTYPE [nsb] of w_t [out, in] for the sub-block steps s and minimums m
    [out, nsub] (>= 0): the stream's super-blocks (rows' sub-blocks in row-major order, 8 to a
    super-block), their 6-bit quantisation per super-block (the nearest 6-bit values, or with
    the objective's weights [out, nsub, 32] the better of their floors and ceilings:
    :func:`_q4k_six_bit_refined`), then the nearest codes for the stored step and minimum."""
    n_out, n_in = w_t.shape
    g = _q4k_stream(_q4k_padded(w_t))  # [nsb, 8, 32]
    nsb = g.shape[0]
    out = np.zeros(nsb, dtype=KQUANT_DTYPES[bits])
    top = kquant_code_max(bits)
    sv = _q4k_stream(np.asarray(s, np.float64).reshape(n_out, -1))
    mv = _q4k_stream(np.asarray(m, np.float64).reshape(n_out, -1))
    out["d"], sc = _q4k_six_bit(sv)
    out["dmin"], mq = _q4k_six_bit(mv)
    if weights is not None:
        a = _q4k_stream(np.asarray(weights, np.float32))
        d = f16_to_f32(out["d"]).astype(np.float64)
        dmin = f16_to_f32(out["dmin"]).astype(np.float64)
        sc, mq = _q4k_six_bit_refined(g, a, sv, mv, d, dmin, top)
    out["scales"] = q4k_pack_scales(sc, mq)
    sc32, m32 = q4k_unpack_scales(out["scales"])
    step = (f16_to_f32(out["d"])[:, None] * sc32.astype(np.float32)).astype(np.float32)
    low = (f16_to_f32(out["dmin"])[:, None] * m32.astype(np.float32)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = round_half_away((g + low[..., None]) / np.where(step > 0, step, 1)[..., None])
    v = np.where(step[..., None] > 0, np.clip(v, 0, top), 0).astype(np.uint8)
    qs = (v[..., :16] & 0x0F) | ((v[..., 16:] & 0x0F) << 4)
    if bits == 5:  # the fifth bits: bit k of the little-endian word of 4 more bytes
        hi = ((v >> 4) & 1).astype(np.uint32) << np.arange(QK_K_SUB, dtype=np.uint32)
        word = hi.sum(axis=-1, dtype=np.uint32)
        hb = np.stack([(word >> (8 * i)) & 0xFF for i in range(4)], axis=-1).astype(np.uint8)
        qs = np.concatenate([qs, hb], axis=-1)
    out["qs"] = qs.reshape(nsb, -1)
    return out


def quantize_q4k(
    w_t: np.ndarray,
    importance: np.ndarray | None = None,
    search: str = DEFAULT_SCALE_SEARCH,
    bits: int = 4,
) -> np.ndarray:
    """w_t [out, in] -> BLOCK_Q4K_DTYPE [nsb], the matrix's stream of super-blocks (module
    comment: the sub-block search, weighted by importance [in] when given (each row's
    sub-blocks weighted by the same channels), then the 6-bit scales per super-block and the
    codes)."""
    w_t = np.asarray(w_t, dtype=np.float32)
    n_out, n_in = w_t.shape
    nsub = q4k_row_subs(n_in)
    imp = normalise_importance(importance, n_in, "q4k scale search")
    flat = np.zeros(nsub * QK_K_SUB, np.float32)
    flat[:n_in] = 1 if imp is None else imp  # padded inputs weigh nothing
    imp_g = flat.reshape(-1, QK_K_SUB)
    s = np.zeros((n_out, nsub))
    m = np.zeros((n_out, nsub))
    a_all = np.zeros((n_out, nsub, QK_K_SUB), np.float32)
    rows = max(1, SEARCH_CHUNK // max(1, nsub * QK_K_SUB))
    for r0 in range(0, n_out, rows):
        g = _q4k_padded(w_t[r0 : r0 + rows])
        a = _objective_weights(g, imp_g)
        a_all[r0 : r0 + rows] = a
        s[r0 : r0 + rows], m[r0 : r0 + rows] = _q4k_sub_search(g, a, search, kquant_code_max(bits))
    return q4k_blocks_with_scales(w_t, s, m, bits, None if search == "none" else a_all)


# -- stored layouts ----------------------------------------------------------------------------

#: Output rows per group and inputs per chunk of layout ``r4`` (colibri_qinline.h R4).
R4_ROWS = 4
R4_CHUNK = 16
#: Output columns per block of layout ``c8`` (fp32 / fp16, colibri_qinline_f.h) and the inputs per
#: pass of its Cortex-M4 / M7 kernels (the n_in % C8_CHUNK inputs after the last pass, and the
#: n_out % C8_COLS outputs after the last whole block, run in C: any shape is stored in c8).
C8_COLS = 8
C8_CHUNK = 4
#: Stored layouts of a matrix: ``rows`` (output-channel-major; fp32: the seed layout, input-
#: major), ``r4`` / ``r4p`` (int8), ``q4r4`` / ``q4h4`` (int4) or ``c8`` (fp32 / fp16).
LAYOUTS = ("rows", "r4", "r4p", "q4r4", "q4h4", "c8")


#: The multiple of inputs each layout stores a row as (its kernels' chunk: r4 16, r4p a block of
#: QK8, q4r4 / q4h4 a block of QK4, whose blocks are always whole); the emitter pads a matrix whose
#: n_in is not one with zero columns (:func:`stored_width`, :func:`pad_inputs`), and the
#: quantised activation row it reads with zero codes to the same width (colibri_qi_common.h
#: colibri_qi_quantize_row_pad): a zero code times a zero weight adds nothing to a block's
#: integer sum, and no scale sees the padding, so the outputs are the unpadded ones bit for bit.
LAYOUT_IN_MULTIPLE = {"r4": R4_CHUNK, "r4p": QK8, "q4r4": QK4, "q4h4": QK4}


def stored_width(layout: str, n_in: int) -> int:
    """Inputs per stored row of a matrix with n_in inputs in `layout` (n_in rounded up to the
    layout's :data:`LAYOUT_IN_MULTIPLE`; n_in itself for the other layouts)."""
    m = LAYOUT_IN_MULTIPLE.get(layout, 1)
    return (n_in + m - 1) // m * m


def pad_inputs(codes: np.ndarray, width: int) -> np.ndarray:
    """codes [n_out, n_in] with width - n_in zero columns after the last input (codes itself
    when width == n_in)."""
    n_out, n_in = codes.shape
    if width == n_in:
        return codes
    out = np.zeros((n_out, width), dtype=codes.dtype)
    out[:, :n_in] = codes
    return out


def r4_fits(n_out: int, n_in: int) -> bool:
    """Whether an [n_out, n_in] matrix can be stored in layout r4 (whole chunks, one group)."""
    return n_out >= R4_ROWS and n_in % R4_CHUNK == 0


def r4_order(codes: np.ndarray) -> np.ndarray:
    """The codes [n_out, n_in] in layout r4, as the flat array of stored bytes: groups of
    R4_ROWS rows; in a group, for each chunk of R4_CHUNK inputs, that chunk of row 0, 1, 2, 3;
    the n_out % R4_ROWS rows after the last group row-major."""
    n_out, n_in = codes.shape
    if not r4_fits(n_out, n_in):
        raise ShapeError(f"layout r4 needs n_out >= {R4_ROWS} and n_in % {R4_CHUNK} == 0")
    g = n_out // R4_ROWS * R4_ROWS
    head = codes[:g].reshape(g // R4_ROWS, R4_ROWS, n_in // R4_CHUNK, R4_CHUNK)
    return np.concatenate([head.transpose(0, 2, 1, 3).ravel(), codes[g:].ravel()])


def r4_restore(stored: np.ndarray, n_out: int, n_in: int) -> np.ndarray:
    """The inverse of :func:`r4_order`: stored bytes back to codes [n_out, n_in]."""
    g = n_out // R4_ROWS * R4_ROWS
    flat = np.asarray(stored).ravel()
    head = flat[: g * n_in].reshape(g // R4_ROWS, n_in // R4_CHUNK, R4_ROWS, R4_CHUNK)
    rows = head.transpose(0, 2, 1, 3).reshape(g, n_in)
    return np.concatenate([rows, flat[g * n_in :].reshape(n_out - g, n_in)])


def r4p_fits(n_out: int, n_in: int) -> bool:
    """Whether an [n_out, n_in] matrix can be stored in layout r4p (r4 with whole blocks of
    QK8 inputs)."""
    return n_out >= R4_ROWS and n_in % QK8 == 0


def r4p_order(codes: np.ndarray) -> np.ndarray:
    """The codes [n_out, n_in] in layout r4p, as the flat array of stored bytes: layout r4 in
    which every odd-indexed code of a row in the groups is stored as c[2j+1] - (c[2j] < 0), so
    each little-endian halfword read as int16 is 256 c[2j+1] + c[2j] (colibri_qinline.h);
    the n_out % R4_ROWS rows after the last group unchanged. Codes must be in [-127, 127]."""
    codes = np.asarray(codes, dtype=np.int8)
    n_out, n_in = codes.shape
    if not r4p_fits(n_out, n_in):
        raise ShapeError(f"layout r4p needs n_out >= {R4_ROWS} and n_in % {QK8} == 0")
    if np.any(codes == -128):
        raise ModelFormatError(
            "layout r4p needs int8 codes in [-127, 127], and these weights hold -128: Colibri's "
            "int8 quantiser is symmetric and never makes -128, so re-quantise the weights with "
            "it (or choose a board whose int8 layout is not r4p)"
        )
    g = n_out // R4_ROWS * R4_ROWS
    fixed = codes.copy()
    fixed[:g, 1::2] = codes[:g, 1::2] - (codes[:g, 0::2] < 0).astype(np.int8)
    return r4_order(fixed)


def r4p_restore(stored: np.ndarray, n_out: int, n_in: int) -> np.ndarray:
    """The inverse of :func:`r4p_order`: stored bytes back to codes [n_out, n_in]."""
    codes = r4_restore(np.asarray(stored, dtype=np.int8), n_out, n_in).copy()
    g = n_out // R4_ROWS * R4_ROWS
    codes[:g, 1::2] = codes[:g, 1::2] + (codes[:g, 0::2] < 0).astype(np.int8)
    return codes


#: Layout ``q4r4`` (int4, colibri_qinline_q4.h): nibble slot of weight i (0..31) of a block in
#: the reordered 16 bytes, byte = slot // 2, high nibble when slot is odd. Per 8 weights
#: 8s..8s+7 one 32-bit word s whose halfword lanes (bits 4k..4k+3, 16+4k..16+4k+3), k = 0..3,
#: hold the weight pairs (8s, 8s+2), (8s+1, 8s+3), (8s+4, 8s+6), (8s+5, 8s+7): the activation
#: pairs SXTB16 makes of two words of codes on the Cortex-M4 / M7.
Q4R4_SLOT = np.array(
    [8 * s + k for s in range(4) for k in (0, 1, 4, 5, 2, 3, 6, 7)], dtype=np.intp
)  # slot -> weight; its inverse below is weight -> slot
Q4R4_OF_WEIGHT = np.argsort(Q4R4_SLOT)


def q4r4_fits(n_out: int, n_in: int) -> bool:
    """Whether an int4 [n_out, n_in] matrix can be stored in layout q4r4 (whole blocks, one
    group of four rows)."""
    return n_out >= R4_ROWS and n_in % QK4 == 0


def _q4_nibbles(qs: np.ndarray) -> np.ndarray:
    """qs [..., 16] bytes -> the 32 nibbles [..., 32] in weight order (low halves, then high)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def q4r4_order(blocks: np.ndarray, slots: np.ndarray = Q4R4_SLOT) -> np.ndarray:
    """int4 blocks [n_out, nb] (:data:`BLOCK_Q4_DTYPE`) in layout q4r4, as the flat uint8 array
    of stored bytes: per group of R4_ROWS rows and per block, the 4 rows' fp16 scales (8 bytes),
    then the 4 rows' 16 bytes of nibbles, reordered by `slots` (:data:`Q4R4_SLOT`; 72 bytes in
    all, as the 4 plain blocks); the n_out % R4_ROWS rows after the last group as plain
    blocks."""
    n_out, nb = blocks.shape
    if n_out < R4_ROWS:
        raise ShapeError(f"layouts q4r4 / q4h4 need n_out >= {R4_ROWS}")
    g = n_out // R4_ROWS * R4_ROWS
    head = blocks[:g].reshape(g // R4_ROWS, R4_ROWS, nb).transpose(0, 2, 1)  # [G, nb, 4]
    nib = _q4_nibbles(head["qs"])[..., slots]  # [G, nb, 4, 32] in slot order
    qs = (nib[..., 0::2] | (nib[..., 1::2] << 4)).astype(np.uint8)
    d = np.ascontiguousarray(head["d"], dtype="<u2").view(np.uint8)  # [G, nb, 8]
    grouped = np.concatenate([d.reshape(g // R4_ROWS, nb, 8), qs.reshape(g // R4_ROWS, nb, 64)], -1)
    rest = np.ascontiguousarray(blocks[g:], dtype=BLOCK_Q4_DTYPE).reshape(-1).view(np.uint8)
    return np.concatenate([grouped.ravel(), rest])


def q4r4_restore(
    stored: np.ndarray, n_out: int, n_in: int, weights: np.ndarray | None = None
) -> np.ndarray:
    """The inverse of :func:`q4r4_order`: stored bytes back to blocks [n_out, nb] (weights: the
    inverse of its `slots`, :data:`Q4R4_OF_WEIGHT` by default)."""
    nb = (n_in + QK4 - 1) // QK4
    g = n_out // R4_ROWS * R4_ROWS
    flat = np.asarray(stored, dtype=np.uint8).ravel()
    head = flat[: g * nb * BLOCK_Q4_DTYPE.itemsize].reshape(g // R4_ROWS, nb, 72)
    d = np.ascontiguousarray(head[..., :8]).view("<u2")  # [G, nb, 4]
    qs = head[..., 8:].reshape(g // R4_ROWS, nb, R4_ROWS, 16)
    slots = np.stack([qs & 0x0F, qs >> 4], axis=-1).reshape(g // R4_ROWS, nb, R4_ROWS, QK4)
    nib = slots[..., Q4R4_OF_WEIGHT if weights is None else weights]  # weight order
    out = np.empty((n_out, nb), dtype=BLOCK_Q4_DTYPE)
    rows = out[:g].reshape(g // R4_ROWS, R4_ROWS, nb)
    rows["d"] = d.transpose(0, 2, 1)
    rows["qs"] = (nib[..., :16] | (nib[..., 16:] << 4)).astype(np.uint8).transpose(0, 2, 1, 3)
    out[g:] = flat[g * nb * BLOCK_Q4_DTYPE.itemsize :].view(BLOCK_Q4_DTYPE).reshape(n_out - g, nb)
    return out


#: Layout ``q4h4`` (int4, Helium, colibri_qinline_q4.h): the groups of layout q4r4 with each
#: row's 16 bytes of nibbles in the plain order (byte j: weight j low, weight 16 + j high), so
#: that one 16-byte load, VAND and VSHR give the block's two halves of weights in order; the
#: nibble slot of weight i, in the slot order of :data:`Q4R4_SLOT`.
Q4H4_SLOT = np.array([i // 2 + 16 * (i % 2) for i in range(QK4)], dtype=np.intp)
Q4H4_OF_WEIGHT = np.argsort(Q4H4_SLOT)


def q4h4_order(blocks: np.ndarray) -> np.ndarray:
    """int4 blocks [n_out, nb] in layout q4h4 (:func:`q4r4_order` with the plain nibbles)."""
    return q4r4_order(blocks, Q4H4_SLOT)


def q4h4_restore(stored: np.ndarray, n_out: int, n_in: int) -> np.ndarray:
    """The inverse of :func:`q4h4_order`: stored bytes back to blocks [n_out, nb]."""
    return q4r4_restore(stored, n_out, n_in, Q4H4_OF_WEIGHT)


def c8_fits(n_out: int, n_in: int) -> bool:
    """Whether an fp32 / fp16 [n_out, n_in] matrix can be stored in layout c8: any non-empty
    one (the n_out % C8_COLS outputs after the last whole block form a narrower block, and the
    kernels run the n_in % C8_CHUNK inputs after their last pass in C)."""
    return n_out > 0 and n_in > 0


def c8_order(w: np.ndarray) -> np.ndarray:
    """The fp32 weights (or fp16 codes) [n_out, n_in] in layout c8, as the flat array of stored
    elements: blocks of C8_COLS outputs; in a block, for each input i, the weights of its
    outputs 0..7 (the seed layout [n_in][n_out] cut into column blocks, each block
    contiguous); the n_out % C8_COLS outputs after the last whole block are a last block of
    that width, [n_in][n_out % C8_COLS]. Element (o, i) is at
    (o // 8) * 8 * n_in + i * width + o % 8, width the block's (8, or n_out % 8 for the last)."""
    n_out, n_in = w.shape
    if not c8_fits(n_out, n_in):
        raise ShapeError(f"layout c8 needs n_out > 0 and n_in > 0, not {n_out} x {n_in}")
    full = n_out // C8_COLS * C8_COLS
    head = w[:full].reshape(full // C8_COLS, C8_COLS, n_in).transpose(0, 2, 1)
    return np.concatenate(
        [np.ascontiguousarray(head).ravel(), np.ascontiguousarray(w[full:].T).ravel()]
    )


def c8_restore(stored: np.ndarray, n_out: int, n_in: int) -> np.ndarray:
    """The inverse of :func:`c8_order`: stored floats back to weights [n_out, n_in]."""
    flat = np.asarray(stored).ravel()
    full = n_out // C8_COLS * C8_COLS
    blocks = flat[: full * n_in].reshape(full // C8_COLS, n_in, C8_COLS)
    head = blocks.transpose(0, 2, 1).reshape(full, n_in)
    tail = flat[full * n_in : n_out * n_in].reshape(n_in, n_out - full).T
    return np.ascontiguousarray(np.concatenate([head, tail]))


# -- quantised tensors and experts --------------------------------------------------------------


@dataclass
class QuantTensor:
    """One weight matrix in a scheme, output-channel-major ``[n_out, n_in]`` (``data`` always;
    ``layout`` says how the generated C stores it: :data:`LAYOUTS`)."""

    scheme: str
    n_out: int
    n_in: int
    #: fp32 [out,in] | uint16 [out,in] | int8 [out,in] | BLOCK_Q4 [out,nb] | BLOCK_Q4K [nsb]
    #: (q4k / q5k: the matrix's one stream of super-blocks, rows sharing them)
    data: np.ndarray
    #: int8: float32 [out] (one scale per output channel), or [out, ceil(in / 32)] (one per
    #: block of 32 inputs: the dense matrices of --dense-quant int8, see quantize_matrix)
    scale: np.ndarray | None = None
    layout: str = "rows"

    @property
    def blocked(self) -> bool:
        """int8 with one scale per block of QK8 inputs (colibri_matvec_q8b_*)."""
        return self.scheme == "int8" and self.scale is not None and self.scale.ndim == 2

    @property
    def stored_in(self) -> int:
        """Inputs per stored row in its layout (:func:`stored_width`: n_in, or for r4 / r4p /
        q4r4 / q4h4 n_in rounded up to the layout's chunk with zero columns)."""
        return stored_width(self.layout, self.n_in)

    @property
    def nbytes(self) -> int:
        """Bytes as stored in the generated C (int8: the padded struct, its codes stored_in to
        a row)."""
        if self.scheme == "int8":
            assert self.scale is not None
            return q8_channel_dtype(self.n_out, self.stored_in, self.scale.size).itemsize
        if self.scheme in KQUANT_BITS:
            return q4k_bytes(self.n_out, self.n_in, KQUANT_BITS[self.scheme])
        return int(self.data.nbytes)

    def dequantize(self) -> np.ndarray:
        """float32 [out, in]."""
        if self.scheme == "fp32":
            return np.asarray(self.data, dtype=np.float32)
        if self.scheme == "fp16":
            return f16_to_f32(self.data)
        if self.scheme == "int8":
            assert self.scale is not None
            if self.blocked:
                per = np.repeat(self.scale, QK8, axis=1)[:, : self.n_in]
                return (self.data.astype(np.float32) * per).astype(np.float32)
            return dequantize_int8(self.data, self.scale)
        if self.scheme in KQUANT_BITS:
            return dequantize_q4k(self.data, self.n_out, self.n_in)
        return dequantize_int4(self.data, self.n_in)

    def roundtrip_bound(self, w_t: np.ndarray) -> np.ndarray:
        """Per-element bound of |w - dequantize()| (the error bounds named above)."""
        w_t = np.asarray(w_t, dtype=np.float32)
        ulp = np.spacing(np.abs(w_t)).astype(np.float64)
        if self.scheme == "fp32":
            return np.zeros(w_t.shape)
        if self.scheme == "fp16":
            return np.maximum(FP16_REL_BOUND * np.abs(w_t), FP16_ABS_BOUND) + ulp
        # Nearest codes: half a step, or for a weight beyond the largest code (a searched
        # scale may clip) its distance to that code's value.
        if self.scheme in KQUANT_BITS:
            kmax = kquant_code_max(KQUANT_BITS[self.scheme])
            step, low = q4k_sub_scales(self.data, self.n_out, self.n_in)
            st = np.repeat(step.astype(np.float64), QK_K_SUB, axis=1)[:, : self.n_in]
            lo = np.repeat(low.astype(np.float64), QK_K_SUB, axis=1)[:, : self.n_in]
            w64 = w_t.astype(np.float64)
            out = np.maximum(np.maximum(-lo - w64, w64 - (kmax * st - lo)), 0)
            return np.maximum(QUANT_STEP_FRACTION * st, out) * (1 + 1e-6) + 2 * ulp
        if self.scheme == "int8":
            assert self.scale is not None
            if self.blocked:
                step = np.repeat(np.abs(self.scale.astype(np.float64)), QK8, axis=1)
                step = step[:, : self.n_in]
            else:
                step = np.abs(self.scale.astype(np.float64))[:, None]
            top = Q8_MAX * step
        else:
            d = np.abs(f16_to_f32(self.data["d"]).astype(np.float64))
            step = np.repeat(d, QK4, axis=1)[:, : self.n_in]
            top = 7 * step  # both signs reach 7 steps; one reaches 8
        clip = np.abs(w_t).astype(np.float64) - top
        return np.maximum(QUANT_STEP_FRACTION * step, clip) * (1 + 1e-6) + ulp


def divide_rows(t: QuantTensor, s: np.ndarray) -> QuantTensor | None:
    """t with output row o divided by s[o] > 0, its codes kept: int8 scales / s in fp32, int4
    block scales fp16(d / s) (the row's relative error is unchanged up to that rounding); None
    when a scale leaves the fp16 range or flushes to zero, and for q4k / q5k whose rows share
    super-blocks (q4k_group_rows > 1: quantise the divided weights instead). fp32 / fp16
    tensors are divided and rounded again."""
    s = np.asarray(s, dtype=np.float32)
    if t.scheme == "int8":
        assert t.scale is not None
        return QuantTensor("int8", t.n_out, t.n_in, t.data, (t.scale / s).astype(np.float32))
    if t.scheme == "int4":
        d = f16_to_f32(t.data["d"]) / s[:, None]
        if not np.all(np.abs(d) <= FP16_MAX):
            return None
        d16 = d.astype(np.float16)
        if np.any((d16 == 0) & (d != 0)):
            return None  # a scale flushed to zero
        out = t.data.copy()
        out["d"] = d16.view(np.uint16)
        return QuantTensor("int4", t.n_out, t.n_in, out)
    if t.scheme in KQUANT_BITS:
        if q4k_group_rows(t.n_in) > 1:
            return None  # super-blocks shared by rows: no row's scale is its own
        out = t.data.copy()
        row = np.arange(out.shape[0]) // (q4k_row_subs(t.n_in) // Q4K_SUBS)
        for f in ("d", "dmin"):
            v = f16_to_f32(t.data[f]) / s[row]
            v16 = v.astype(np.float16)
            if not np.all(np.abs(v) <= FP16_MAX) or np.any((v16 == 0) & (v != 0)):
                return None
            out[f] = v16.view(np.uint16)
        return QuantTensor(t.scheme, t.n_out, t.n_in, out)
    w = t.dequantize() / s[:, None]
    if t.scheme == "fp16" and not np.all(np.abs(w) <= FP16_MAX):
        return None
    return quantize_matrix(w, t.scheme)


def quantize_matrix(
    w_t: np.ndarray,
    scheme: str,
    name: str = "tensor",
    search: str = DEFAULT_SCALE_SEARCH,
    importance: np.ndarray | None = None,
    blocks: bool = False,
) -> QuantTensor:
    """Quantise one [out, in] matrix; int8 / int4 scales by `search` ("mse": the scale search,
    weighted by `importance` [in] when given; "none": the plain method). blocks: int8 with one
    scale per block of QK8 inputs instead of one per output channel (the dense matrices of
    --dense-quant int8: attention, embedding, LM head), the codes still [out, in]."""
    w_t = np.ascontiguousarray(w_t, dtype=np.float32)
    n_out, n_in = w_t.shape
    check_scale_search(search)
    if scheme == "fp32":
        return QuantTensor(scheme, n_out, n_in, w_t)
    if scheme == "fp16":
        return QuantTensor(scheme, n_out, n_in, quantize_fp16(w_t, name))
    if scheme == "int8" and blocks:
        # One scale per block of QK8 inputs: the blocks are quantised as the rows of a
        # [out * nb, QK8] matrix (the last block zero-padded), each by the per-row method.
        nb = q8_blocks(n_in)
        padded = np.zeros((n_out, nb * QK8), dtype=np.float32)
        padded[:, :n_in] = w_t
        if importance is not None:
            raise ConfigError(f"{name}: block-scaled int8 takes no channel importances")
        inner = quantize_matrix(padded.reshape(n_out * nb, QK8), "int8", name, search)
        assert inner.scale is not None
        q = np.ascontiguousarray(inner.data.reshape(n_out, nb * QK8)[:, :n_in])
        return QuantTensor(scheme, n_out, n_in, q, inner.scale.reshape(n_out, nb))
    if scheme == "int8":
        if search == "none":
            q, s = quantize_int8_per_channel(w_t)
        else:
            s = search_int8_scales(w_t, importance)
            q = int8_codes(w_t, s)
        return QuantTensor(scheme, n_out, n_in, q, s)
    if scheme == "int4":
        if search == "none":
            return QuantTensor(scheme, n_out, n_in, quantize_int4_blocks(w_t))
        d16 = search_int4_scales(w_t, importance)
        return QuantTensor(scheme, n_out, n_in, int4_blocks_with_scales(w_t, d16))
    if scheme in KQUANT_BITS:
        data = quantize_q4k(w_t, importance, search, KQUANT_BITS[scheme])
        return QuantTensor(scheme, n_out, n_in, data)
    raise ConfigError(f"unknown scheme '{scheme}'; supported: {', '.join(SCHEMES)}")


@dataclass
class QuantExpert:
    """One expert in a scheme: w1/w3 are [d_ff, d_model], w2 is [d_model, d_ff] (transposed);
    biases stay fp32."""

    scheme: str
    act: str
    w1: QuantTensor
    w2: QuantTensor
    w3: QuantTensor | None
    b1: np.ndarray | None
    b2: np.ndarray | None
    #: How calibration chose the weights (colibri.quant.calib: method, fold exponent alpha),
    #: None when not calibrated.
    calibration: dict[str, Any] | None = None

    def tensors(self) -> list[tuple[str, QuantTensor | np.ndarray]]:
        items: list[tuple[str, QuantTensor | np.ndarray | None]] = [
            ("w1", self.w1),
            ("b1", self.b1),
            ("w2", self.w2),
            ("b2", self.b2),
            ("w3", self.w3),
        ]
        return [(n, t) for n, t in items if t is not None]

    @property
    def nbytes(self) -> int:
        return sum(int(t.nbytes) for _, t in self.tensors())


def quantize_expert(
    e: Expert,
    scheme: str,
    act: str | None = None,
    name: str = "",
    search: str = DEFAULT_SCALE_SEARCH,
    x_importance: np.ndarray | None = None,
    h_importance: np.ndarray | None = None,
) -> QuantExpert:
    """Quantise one expert's matrices (transposed to output-major); biases stay fp32. With the
    scale search, w1 / w3 are weighted by x_importance [d_model] and w2 by h_importance [d_ff]
    (e.g. calibration E[x^2] and E[h^2]) when given."""
    scheme = check_scheme(scheme)
    act = DEFAULT_ACT[scheme] if act is None else act
    check_choice(act, ACT_MODES, "--act", "mode")

    def q(w: np.ndarray, what: str, imp: np.ndarray | None) -> QuantTensor:
        return quantize_matrix(w.T, scheme, f"{name}.{what}", search, imp)

    return QuantExpert(
        scheme=scheme,
        act=act,
        w1=q(e.w1, "w1", x_importance),
        w2=q(e.w2, "w2", h_importance),
        w3=q(e.w3, "w3", x_importance) if e.w3 is not None else None,
        b1=e.b1,
        b2=e.b2,
    )


def parse_expert_quant(spec: str | None, n_experts: int) -> dict[int, str]:
    """``3=int4,7=fp32`` -> {3: 'int4', 7: 'fp32'}."""
    out: dict[int, str] = {}
    if not spec:
        return out
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        idx, sep, scheme = item.partition("=")
        if not sep or not idx.strip().isdigit():
            raise ConfigError(
                f"--expert-quant: '{item}' is not EXPERT=SCHEME (e.g. --expert-quant 3=int4,7=fp32)"
            )
        i = int(idx)
        if not 0 <= i < n_experts:
            raise ConfigError(
                f"--expert-quant: expert {i} does not exist (the model has experts "
                f"0..{n_experts - 1})"
            )
        out[i] = check_scheme(scheme.strip(), "--expert-quant")
    return out


@dataclass
class QuantPlan:
    """Scheme and activation mode of every expert (by expert index)."""

    schemes: list[str]
    acts: list[str]

    def scheme_counts(self) -> dict[str, int]:
        return {s: self.schemes.count(s) for s in SCHEMES if s in self.schemes}


def make_plan(
    n_experts: int, quant: str = "fp32", expert_quant: str | None = None, act: str | None = None
) -> QuantPlan:
    """Per-expert schemes from --quant / --expert-quant; act overrides the default mode."""
    base = check_scheme(quant)
    over = parse_expert_quant(expert_quant, n_experts)
    if act is not None:
        check_choice(act, ACT_MODES, "--act", "mode")
    schemes = [over.get(i, base) for i in range(n_experts)]
    acts = [
        "fp32" if s in ("fp32", "fp16") else (act or DEFAULT_ACT[s]) for s in schemes
    ]  # fp16 has no integer kernel
    for s, a in zip(schemes, acts):
        if s in INT8_ACT_ONLY and a != "int8":
            raise ConfigError(
                f"--act {a}: {s} experts have int8-activation kernels only; drop --act or "
                f"pass --act int8"
            )
    return QuantPlan(schemes, acts)


def quantize_layer(
    layer: MoELayer,
    plan: QuantPlan,
    search: str = DEFAULT_SCALE_SEARCH,
    tick: Tick | None = None,
) -> dict[int, QuantExpert]:
    """Quantised form of every stored expert (keyed by the storing expert's index). A stored
    expert used by several experts takes the scheme of its own index. `tick(done, total)`
    follows the experts (colibri.progress)."""
    out: dict[int, QuantExpert] = {}
    stored = sorted(set(layer.storage_map()))
    for n, idx in enumerate(stored, start=1):
        out[idx] = quantize_expert(
            layer.experts[idx], plan.schemes[idx], plan.acts[idx], f"expert.{idx}", search
        )
        if tick is not None:
            tick(n, len(stored))
    return out


ROUTER_SCHEMES = ("fp32", "fp16", "int8")
#: colibri_model_t.router_scheme of each router scheme (colibri.h).
ROUTER_SCHEME_CODES = {"fp32": 0, "fp16": 1, "int8": 2}


@dataclass(frozen=True)
class QuantRouter:
    """The router's weights as stored (colibri_model_t router_scheme / router_wq / scale)."""

    scheme: str
    data: np.ndarray  # fp32 [E, d], fp16 bits uint16 [E, d] or int8 [E, d]
    scale: np.ndarray | None = None  # int8: float32 [E]

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes) + (int(self.scale.nbytes) if self.scale is not None else 0)

    def dequantized(self) -> np.ndarray:
        """The fp32 weights the C router multiplies by: exactly what it computes per element
        (fp16 -> fp32 is exact; int8: (float)q * scale[e] in fp32)."""
        if self.scheme == "fp16":
            return f16_to_f32(self.data)
        if self.scheme == "int8":
            assert self.scale is not None
            return dequantize_int8(self.data, self.scale)
        return np.asarray(self.data, dtype=np.float32)


def check_router_scheme(scheme: str) -> str:
    return check_choice(scheme, ROUTER_SCHEMES, "--router-quant")


def quantize_router(w: np.ndarray, scheme: str) -> QuantRouter:
    """Router weights [E, d] in `scheme` (int8: symmetric per expert row)."""
    check_router_scheme(scheme)
    w = np.asarray(w, dtype=np.float32)
    if scheme == "fp16":
        return QuantRouter("fp16", quantize_fp16(w, "router.weight"))
    if scheme == "int8":
        q, scale = quantize_int8_per_channel(w)
        return QuantRouter("int8", q, scale)
    return QuantRouter("fp32", w)


def expert_matrix_bytes(d_model: int, d_ff: int, gated: bool, scheme: str) -> int:
    """Stored bytes of one expert's matrices (w1, w3 when gated, w2; no biases) in `scheme`."""
    n_in_d = 2 if gated else 1  # matrices [d_ff, d_model] (w1, w3)
    if scheme == "int4":
        return (n_in_d * d_ff * q4_blocks(d_model) + d_model * q4_blocks(d_ff)) * (
            BLOCK_Q4_DTYPE.itemsize
        )
    if scheme in KQUANT_BITS:
        bits = KQUANT_BITS[scheme]
        return n_in_d * q4k_bytes(d_ff, d_model, bits) + q4k_bytes(d_model, d_ff, bits)
    width = {"fp32": 4, "fp16": 2, "int8": 1}[check_scheme(scheme)]
    if scheme == "int8":
        return (
            n_in_d * q8_channel_dtype(d_ff, d_model).itemsize
            + q8_channel_dtype(d_model, d_ff).itemsize
        )
    return (n_in_d + 1) * d_model * d_ff * width


def weight_bytes_for(layer: MoELayer, scheme: str) -> int:
    """Const weight bytes of the layer if every stored expert used `scheme` (router fp32)."""
    c = layer.config
    mats = expert_matrix_bytes(c.d_model, c.d_ff, c.gated, scheme)
    bias = 4 * (c.d_ff + c.d_model) if layer.experts[0].b1 is not None else 0
    router = 4 * c.n_experts * c.d_model + (4 * c.n_experts if layer.router_b is not None else 0)
    return router + len(set(layer.storage_map())) * (mats + bias)


def stored_nbytes(t: QuantTensor | np.ndarray) -> int:
    """Bytes of one stored tensor as the C code holds it (sizeof of its generated symbol, the
    int8 struct's padding included)."""
    if isinstance(t, np.ndarray):
        return int(t.nbytes)
    if t.scheme == "fp32":
        return int(t.data.nbytes)
    return int(t.nbytes)
