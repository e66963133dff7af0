"""numpy reference of the MoE layer: the oracle the generated C is compared with.

Router: logits are computed in float32 with the *same sequential accumulation order as the C
runtime* (``acc += x[i] * w[i]`` for i = 0..d-1, no fused multiply-add, then ``+ bias``), so
that the top-k choice is bit-identical to C's and comparisons never hinge on a near-tie. The
softmax, gates and expert FFNs are computed in float64: they are the "true" values, and C's
fp32 result is compared against them with :data:`FP32_TOLERANCE`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..ir.moe import Expert, MoELayer
from .f32 import linear_f32

#: Tolerance of every fp32 comparison (C vs this reference), relative to the largest |output|:
#: ``max|c - ref| <= FP32_TOLERANCE * max(max|ref|, 1e-6)``. fp32 has a unit roundoff of
#: 6e-8; a dot product of n terms accumulates a relative error of about sqrt(n) * 6e-8
#: (random rounding), the largest shapes tested (d_ff ~ 1000) give ~2e-6, and the runtime's
#: activations (colibri_math.h: expf, SiLU, the GELUs) add 1-3 ulp against these float64 ones.
#: 2e-5 leaves ~10x headroom without hiding real bugs (a wrong expert or a wrong gate moves
#: outputs by O(1)).
FP32_TOLERANCE = 2e-5


@dataclass
class Routing:
    """Top-k routing of T tokens."""

    expert_ids: np.ndarray  # [T, k] int32, best first
    gates: np.ndarray  # [T, k] float64, renormalised if the model asks
    logits: np.ndarray  # [T, E] float32 (the C-identical logits)


def router_logits_f32(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """Router logits with the C runtime's fp32 accumulation order (bit-exact): w [E, d] is the
    C layout, so this is colibri_linear_f32's order (reference.f32.linear_f32)."""
    return linear_f32(x, w, b)


def top_k(logits: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest logits per row, best first; ties: lower index first."""
    order = np.argsort(-logits.astype(np.float64), axis=1, kind="stable")
    return order[:, :k].astype(np.int32)


def route(layer: MoELayer, x: np.ndarray, k: int | None = None) -> Routing:
    """Router + softmax + top-k (+ renormalisation when the config asks)."""
    c = layer.config
    k = c.top_k if k is None else k
    if not 1 <= k <= c.n_experts:
        raise InputError(f"top_k = {k} must be between 1 and n_experts = {c.n_experts}")
    logits = router_logits_f32(x, layer.router_w, layer.router_b)
    if not np.all(np.isfinite(logits)):
        raise InputError("router logits contain NaN/Inf: the input has NaN/Inf values")
    ids = top_k(logits, k)
    l64 = logits.astype(np.float64)
    m = l64.max(axis=1, keepdims=True)
    p = np.exp(l64 - m)
    p /= p.sum(axis=1, keepdims=True)
    gates = np.take_along_axis(p, ids, axis=1)
    if c.norm_topk_prob:
        gates = gates / gates.sum(axis=1, keepdims=True)
    return Routing(ids, gates, logits)


_erf = np.frompyfunc(math.erf, 1, 1)


def activation(name: str, h: np.ndarray) -> np.ndarray:
    """Expert activation in float64."""
    if name == "gelu":
        erf = np.asarray(_erf(h / math.sqrt(2.0)), dtype=np.float64)
        return np.asarray(0.5 * h * (1.0 + erf))
    if name == "gelu_tanh":
        return 0.5 * h * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h**3)))
    if name == "silu":
        return h / (1.0 + np.exp(-h))
    if name == "relu":
        return np.maximum(h, 0.0)
    raise InputError(f"unknown activation '{name}'")


def expert_ffn(layer: MoELayer, e: int, x: np.ndarray) -> np.ndarray:
    """One expert's FFN on rows x [n, d_model], float64."""
    return ffn(layer.experts[e], layer, x)


def hidden(ex: Expert, layer: MoELayer, x: np.ndarray) -> np.ndarray:
    """An expert's hidden activation on rows x (float64 [n, d_ff]): act(x w1 + b1), times x w3
    when gated."""
    x64 = np.asarray(x, dtype=np.float64)
    h = x64 @ ex.w1.astype(np.float64)
    if ex.b1 is not None:
        h = h + ex.b1
    if layer.config.gated:
        assert ex.w3 is not None
        return np.asarray(activation("silu", h) * (x64 @ ex.w3.astype(np.float64)))
    return np.asarray(activation(layer.config.activation, h))


def ffn(ex: Expert, layer: MoELayer, x: np.ndarray) -> np.ndarray:
    """An expert's FFN (routed or shared) with the layer's activation on rows x, float64."""
    y = hidden(ex, layer, x) @ ex.w2.astype(np.float64)
    if ex.b2 is not None:
        y = y + ex.b2
    return np.asarray(y, dtype=np.float64)


def moe_forward(layer: MoELayer, x: np.ndarray, k: int | None = None) -> tuple[np.ndarray, Routing]:
    """The MoE layer on x [T, d_model]: returns (output float64 [T, d_model], routing)."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != layer.config.d_model:
        raise InputError(
            f"input has shape {x.shape}, expected [T, {layer.config.d_model}] (T tokens of "
            f"hidden_size={layer.config.d_model})"
        )
    if not np.all(np.isfinite(x)):
        raise InputError(f"input contains {int(np.count_nonzero(~np.isfinite(x)))} NaN/Inf values")
    r = route(layer, x, k)
    out = np.zeros(x.shape, dtype=np.float64)
    for e in np.unique(r.expert_ids):
        rows, slots = np.nonzero(r.expert_ids == e)
        out[rows] += r.gates[rows, slots, None] * expert_ffn(layer, int(e), x[rows])
    if layer.shared_expert is not None:
        out += shared_ffn(layer, x)
    return out, r


def shared_ffn(layer: MoELayer, x: np.ndarray) -> np.ndarray:
    """The shared expert's contribution on rows x (float64 [T, d_model]): its FFN scaled by
    sigmoid(x . shared_gate) (by 1 without a gate); zeros without a shared expert."""
    if layer.shared_expert is None:
        return np.zeros(np.shape(x), dtype=np.float64)
    shared = ffn(layer.shared_expert, layer, x)
    if layer.shared_gate is not None:
        g = np.asarray(x, dtype=np.float64) @ layer.shared_gate.astype(np.float64)
        shared = shared / (1.0 + np.exp(-g))[:, None]
    return np.asarray(shared, dtype=np.float64)


def compare(actual: np.ndarray, expected: np.ndarray, tol: float = FP32_TOLERANCE) -> str | None:
    """None if within tolerance, else a message with the worst index, values and counts."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if actual.shape != expected.shape:
        return f"shape {actual.shape} != expected {expected.shape}"
    scale = max(float(np.max(np.abs(expected))) if expected.size else 0.0, 1e-6)
    err = np.abs(actual - expected)
    bound = tol * scale
    if not np.all(np.isfinite(actual)):
        return f"{int(np.count_nonzero(~np.isfinite(actual)))} non-finite values in the output"
    bad = err > bound
    if not bad.any():
        return None
    idx = np.unravel_index(int(np.argmax(err)), err.shape)
    return (
        f"{int(bad.sum())} of {err.size} values exceed {bound:.3g} (tol {tol} x max|ref| "
        f"{scale:.3g}); worst at {tuple(int(i) for i in idx)}: actual {actual[idx]!r}, "
        f"expected {expected[idx]!r}, |err| {err[idx]:.3g}"
    )
