"""The numpy mirror of the quantised C kernels (kernels_q.c and the generated FFN kernels).

The mirror repeats the C kernels' arithmetic *in the same fp32 order* (there is no FMA on any
board: -ffp-contract=off), so integer accumulators and matvec outputs are bit-identical; the
activation quantiser's round half away from zero (16.16 fixed point in C, no libm) is repeated
in integers, not ``np.round`` (half to even). Weight formats are :mod:`colibri.quant.formats`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from ..ir.moe import MoELayer
from ..quant.formats import (
    Q8_MAX,
    QK4,
    QK8,
    QuantExpert,
    QuantRouter,
    QuantTensor,
    f16_to_f32,
    int4_values,
    q4k_codes,
    q4k_sub_params,
    q8_blocks,
)
from .f32 import gelu_f32, gelu_tanh_f32, route_gates_f32, seq_dot, silu_f32
from .moe import Routing, activation, expert_ffn, route, shared_ffn


def matvec_f16_f32(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """colibri_matvec_f16_f32 on rows x [T, in]: [T, out]."""
    return seq_dot(f16_to_f32(w), x)


def matvec_q8_f32(q: np.ndarray, scale: np.ndarray, x: np.ndarray) -> np.ndarray:
    """colibri_matvec_q8_f32."""
    return (seq_dot(q.astype(np.float32), x) * scale[None, :]).astype(np.float32)


def matvec_q4_f32(blocks: np.ndarray, x: np.ndarray, n_in: int) -> np.ndarray:
    """colibri_matvec_q4_f32."""
    x = np.asarray(x, dtype=np.float32)
    vals = int4_values(blocks, n_in).astype(np.float32)
    d = f16_to_f32(blocks["d"])
    acc = np.zeros((x.shape[0], blocks.shape[0]), dtype=np.float32)
    for b in range(blocks.shape[1]):
        lo, hi = b * QK4, min(n_in, (b + 1) * QK4)
        bs = seq_dot(vals[:, lo:hi], x[:, lo:hi])
        acc += bs * d[None, :, b]
    return acc


def quantize_rows_q8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """colibri_quantize_row_q8 on every row: (xq int8 [T, n], sx float32 [T, blocks]).

    One scale per block of QK8 = 32 values along the row (the last block may be shorter). In
    float32 as the C does: inv = 127 / amax once per block, v = x * inv, q = round half away
    from zero of min(|v|, 127) in 16.16 fixed point ((int(|v| * 2^16) + 2^15) >> 16), with the
    sign bit of v; a block whose amax is NaN or below 2^-120 (127 / amax would overflow) is all
    zero, scale 0.
    """
    x = np.asarray(x, dtype=np.float32)
    t, n = x.shape
    nb = q8_blocks(n)
    padded = np.zeros((t, nb * QK8), dtype=np.float32)
    padded[:, :n] = x
    blocks = padded.reshape(t, nb, QK8)
    with np.errstate(invalid="ignore"):
        amax = np.max(np.abs(blocks), axis=2).astype(np.float32)  # NaN propagates, as in C
    zero = ~(amax >= np.float32(2.0**-120))
    sx = np.where(zero, np.float32(0), amax / np.float32(Q8_MAX)).astype(np.float32)
    inv = (np.float32(Q8_MAX) / np.where(zero, np.float32(1), amax)).astype(np.float32)
    with np.errstate(invalid="ignore"):  # amax inf: inv is 0 and inf * 0 is NaN, as in C
        v = (blocks * inv[:, :, None]).astype(np.float32)
    a = np.abs(v)
    with np.errstate(invalid="ignore"):
        a = np.where(a < np.float32(Q8_MAX), a, np.float32(Q8_MAX)).astype(np.float32)
        q = ((a * np.float32(65536)).astype(np.int32) + 32768) >> 16
    q = np.where(np.signbit(v), -q, q)
    q = np.where(zero[:, :, None], 0, q)
    return q.reshape(t, nb * QK8)[:, :n].astype(np.int8), sx


#: Block sums [blocks, rows, out] computed at once (rows are taken in chunks so that a large
#: expert measured on many rows stays bounded: 16 MB of int32).
BLOCK_SUM_ELEMS = 1 << 22


def _padded_blocks(a: np.ndarray, n_in: int) -> np.ndarray:
    """a [n, in] as int32 [n, blocks, QK8], the last block zero-padded."""
    nb = q8_blocks(n_in)
    out = np.zeros((a.shape[0], nb * QK8), dtype=np.int32)
    out[:, :n_in] = a[:, :n_in]
    return out.reshape(a.shape[0], nb, QK8)


def _weight_blocks(vals: np.ndarray, n_in: int) -> np.ndarray:
    """Integer weights vals [out, in] as float32 [blocks, out, QK8] (a view of one padded
    copy) for :func:`_block_sums_f32`."""
    nb = q8_blocks(n_in)
    out = np.zeros((vals.shape[0], nb * QK8), dtype=np.float32)
    out[:, :n_in] = vals[:, :n_in]
    return out.reshape(vals.shape[0], nb, QK8).transpose(1, 0, 2)


def _block_sums_f32(wb: np.ndarray, xq: np.ndarray, n_in: int) -> np.ndarray:
    """The integer sums per block of QK8 inputs of the weights wb (:func:`_weight_blocks`) and
    the rows xq [T, in]: float32 [blocks, T, out], exact. Every product and partial sum is an
    integer of magnitude at most 32 * 128 * 128 < 2^24 (int8 / int4 / 5-bit codes against int8
    activations), so float32 holds each exactly whatever the order of the additions: one
    batched BLAS product gives the integer kernels' sums to the bit (measured 6x faster than
    numpy's int32 einsum at 2816 x 1024; the command line runs BLAS on one thread)."""
    xb = _padded_blocks(xq, n_in).astype(np.float32).transpose(1, 0, 2)  # [blocks, T, QK8]
    return np.asarray(np.matmul(xb, wb.transpose(0, 2, 1)))


def _block_sums(wb: np.ndarray, xq: np.ndarray, n_in: int) -> np.ndarray:
    """:func:`_block_sums_f32` as int32 [blocks, T, out] (the C's integer accumulators)."""
    return _block_sums_f32(wb, xq, n_in).astype(np.int32)


def _block_matvec(
    vals: np.ndarray, xq: np.ndarray, sx: np.ndarray, n_in: int, wscale: np.ndarray | None
) -> np.ndarray:
    """acc [T, out] float32 of the blocked integer kernels: for each block b in order,
    acc += (float)isum_b * sx[b] (wscale None) or acc += (float)isum_b * (wscale[o][b] * sx[b])
    (wscale [out, nb] float32), rows taken in chunks of at most BLOCK_SUM_ELEMS block sums."""
    t, n_out = xq.shape[0], vals.shape[0]
    nb = q8_blocks(n_in)
    wb = _weight_blocks(vals, n_in)
    acc = np.zeros((t, n_out), dtype=np.float32)
    rows = max(1, BLOCK_SUM_ELEMS // max(1, n_out * nb))
    for r0 in range(0, t, rows):
        r1 = min(t, r0 + rows)
        isum = _block_sums_f32(wb, xq[r0:r1], n_in)  # exact in float32
        part = acc[r0:r1]
        for b in range(nb):
            if wscale is None:
                part += isum[b] * sx[r0:r1, b, None]
            else:
                part += isum[b] * (wscale[None, :, b] * sx[r0:r1, b, None]).astype(np.float32)
    return acc


def _block_dots(vals: np.ndarray, xq: np.ndarray, n_in: int) -> np.ndarray:
    """Integer sums per block of QK8 inputs of vals [out, in] and xq [T, in]: int32 [T, out, nb]."""
    sums = _block_sums(_weight_blocks(vals, n_in), xq, n_in)
    return np.ascontiguousarray(sums.transpose(1, 2, 0))


def dot_q8(q: np.ndarray, xq: np.ndarray) -> np.ndarray:
    """Integer accumulators of colibri_dot_q8 for every (token, output): int32 [T, out]."""
    return xq.astype(np.int32) @ q.astype(np.int32).T


def dot_q4_q8(blocks: np.ndarray, xq: np.ndarray, n_in: int) -> np.ndarray:
    """Integer accumulators of colibri_dot_q4_q8 per block: int32 [T, out, nb]."""
    return _block_dots(int4_values(blocks, n_in), xq, n_in)


def matvec_q8_q8(q: np.ndarray, scale: np.ndarray, xq: np.ndarray, sx: np.ndarray) -> np.ndarray:
    """colibri_matvec_q8_q8: acc += (float)isum_b * sx[b] over the blocks; y = acc * scale[o]."""
    acc = _block_matvec(q, xq, sx, q.shape[1], None)
    return (acc * scale[None, :]).astype(np.float32)


def matvec_q8b_q8(q: np.ndarray, scale: np.ndarray, xq: np.ndarray, sx: np.ndarray) -> np.ndarray:
    """colibri_matvec_q8b_q8 (block-scaled int8 weights, scale [out, nb]):
    acc += (float)isum_b * (scale[o][b] * sx[b]) over the blocks in order."""
    return _block_matvec(q, xq, sx, q.shape[1], np.asarray(scale, dtype=np.float32))


def matvec_q8b_f32(q: np.ndarray, scale: np.ndarray, x: np.ndarray) -> np.ndarray:
    """colibri_matvec_q8b_f32: per block, s = sum_j (float)q * x in order, acc += s * scale."""
    x = np.asarray(x, dtype=np.float32)
    n_in = q.shape[1]
    acc = np.zeros((x.shape[0], q.shape[0]), dtype=np.float32)
    for b in range(scale.shape[1]):
        lo, hi = b * QK8, min(n_in, (b + 1) * QK8)
        bs = seq_dot(q[:, lo:hi].astype(np.float32), x[:, lo:hi])
        acc += bs * scale[None, :, b]
    return acc


def matvec_q4_q8(blocks: np.ndarray, xq: np.ndarray, sx: np.ndarray, n_in: int) -> np.ndarray:
    """colibri_matvec_q4_q8: acc += (float)isum_b * (d_b * sx[b]) over the blocks in order."""
    return _block_matvec(int4_values(blocks, n_in), xq, sx, n_in, f16_to_f32(blocks["d"]))


def matvec_q4k_q8(
    blocks: np.ndarray, xq: np.ndarray, sx: np.ndarray, n_out: int, n_in: int
) -> np.ndarray:
    """colibri_matvec_q4k_q8 / _q5k_q8 (a matrix's stream of super-blocks [nsb], formats.py's
    q4k section): for each sub-block b of a row in order, acc += (float)(sc * isum_b) *
    (d * sx[b]), then acc -= (float)(m * xsum_b) * (dmin * sx[b]); isum_b = sum q * xq,
    xsum_b = sum xq; sc, m, d and dmin those of the row's sub-block b wherever it sits."""
    t = xq.shape[0]
    nb = q8_blocks(n_in)
    sc, m, d, dmin = q4k_sub_params(blocks, n_out, n_in)  # [out, nb] each
    wb = _weight_blocks(q4k_codes(blocks, n_out, n_in), n_in)
    xsum_all = _padded_blocks(xq, n_in).sum(axis=2)  # [T, nb], exact
    acc = np.zeros((t, n_out), dtype=np.float32)
    rows = max(1, BLOCK_SUM_ELEMS // max(1, n_out * nb))
    for r0 in range(0, t, rows):
        r1 = min(t, r0 + rows)
        isum = _block_sums(wb, xq[r0:r1], n_in)  # [nb, rows, out] int32
        part = acc[r0:r1]
        for b in range(nb):
            s_b = sx[r0:r1, b, None]
            hi = (sc[None, :, b] * isum[b]).astype(np.float32)
            part += hi * (d[None, :, b] * s_b).astype(np.float32)
            lo = (m[None, :, b] * xsum_all[r0:r1, b, None]).astype(np.float32)
            part -= lo * (dmin[None, :, b] * s_b).astype(np.float32)
    return acc


def matvec(t: QuantTensor, x: np.ndarray, act: str) -> np.ndarray:
    """The C kernel of t's scheme on rows x [T, in] (fp32 out [T, out]), activations
    quantised per row first when act == 'int8'."""
    if t.scheme == "fp32":
        return seq_dot(t.data, x)
    if act == "int8":
        xq, sx = quantize_rows_q8(x)
        if t.scheme == "int8":
            assert t.scale is not None
            if t.blocked:
                return matvec_q8b_q8(t.data, t.scale, xq, sx)
            return matvec_q8_q8(t.data, t.scale, xq, sx)
        if t.scheme == "int4":
            return matvec_q4_q8(t.data, xq, sx, t.n_in)
        if t.scheme in ("q4k", "q5k"):
            return matvec_q4k_q8(t.data, xq, sx, t.n_out, t.n_in)
        # fp16 weights have no integer kernel: activations stay fp32
    if t.scheme in ("q4k", "q5k"):
        raise ValueError(f"{t.scheme} weights have an int8-activation kernel only (act='int8')")
    if t.scheme == "fp16":
        return matvec_f16_f32(t.data, x)
    if t.scheme == "int8":
        assert t.scale is not None
        if t.blocked:
            return matvec_q8b_f32(t.data, t.scale, x)
        return matvec_q8_f32(t.data, t.scale, x)
    return matvec_q4_f32(t.data, x, t.n_in)


def _activation_f32(name: str, h: np.ndarray) -> np.ndarray:
    """The generated kernels' activation, bit for bit: colibri_silu, colibri_gelu,
    colibri_gelu_tanh (colibri_math.h, no libm) or relu."""
    if name == "silu":
        return silu_f32(h)
    if name == "gelu":
        return gelu_f32(h)
    if name == "gelu_tanh":
        return gelu_tanh_f32(h)
    return np.asarray(activation(name, h.astype(np.float64)), dtype=np.float32)


#: A matrix kernel: (weights, rows [T, in], activation scheme) -> fp32 [T, out].
MatvecFn = Callable[[QuantTensor, np.ndarray, str], np.ndarray]


def quant_expert_ffn(
    qe: QuantExpert, activation: str, gated: bool, x: np.ndarray, mv: MatvecFn | None = None
) -> np.ndarray:
    """One quantised expert on rows x [n, d_model], mirroring the generated C in fp32:
    h = W1 x (+ b1); act (gated: act(h) * W3 x); y = W2 h (+ b2). `mv` replaces :func:`matvec`
    (benchmarks/activation_ablation.py rounds the inputs otherwise)."""
    mv = matvec if mv is None else mv
    x = np.asarray(x, dtype=np.float32)
    h = mv(qe.w1, x, qe.act)
    if qe.b1 is not None:
        h = (h + qe.b1[None, :]).astype(np.float32)
    if gated:
        assert qe.w3 is not None
        g = mv(qe.w3, x, qe.act)
        h = (_activation_f32("silu", h) * g).astype(np.float32)
    else:
        h = _activation_f32(activation, h)
    y = mv(qe.w2, h, qe.act)
    if qe.b2 is not None:
        y = (y + qe.b2[None, :]).astype(np.float32)
    return y


def route_c(layer: MoELayer, x: np.ndarray, router: QuantRouter | None = None) -> Routing:
    """colibri_route on fp32 rows x: the C's logits (fp32, input order; a quantised router
    dequantised per element), top-k (ties to the lower index) and its fp32 gates
    (:func:`colibri.reference.f32.route_gates_f32`), bit for bit."""
    routed = layer if router is None else replace(layer, router_w=router.dequantized())
    r = route(routed, x)
    gates = route_gates_f32(r.logits, r.expert_ids, layer.config.norm_topk_prob)
    return Routing(r.expert_ids, gates, r.logits)


def quant_moe_forward(
    layer: MoELayer,
    qexperts: dict[int, QuantExpert],
    x: np.ndarray,
    router: QuantRouter | None = None,
) -> tuple[np.ndarray, Routing]:
    """The layer with quantised experts (and router, if given): (output [T, d], the routing
    the C router chose: expert ids and fp32 gates), mirroring the generated C and
    colibri_sparse_forward: each active expert in ascending id, ``out += gate * y`` in fp32
    from 0, then the shared expert if any. Bit-exact with quantised experts; an fp32 expert
    (and the shared expert, always fp32) runs the float64 reference (its C kernel is compared
    within FP32_TOLERANCE). Returned as float64 for the comparisons."""
    x = np.asarray(x, dtype=np.float32)
    r = route_c(layer, x, router)
    storage = layer.storage_map()
    c = layer.config
    out = np.zeros(x.shape, dtype=np.float32)
    for e in np.unique(r.expert_ids):
        rows, slots = np.nonzero(r.expert_ids == e)
        owner = storage[int(e)]
        qe = qexperts[owner]
        if qe.scheme == "fp32":
            y = expert_ffn(layer, owner, x[rows]).astype(np.float32)
        else:
            y = quant_expert_ffn(qe, c.activation, c.gated, x[rows])
        out[rows] = out[rows] + r.gates[rows, slots, None].astype(np.float32) * y
    if layer.shared_expert is not None:  # fp32, after the routed experts (float64 reference)
        out = out + shared_ffn(layer, x).astype(np.float32)
    return out.astype(np.float64), r
