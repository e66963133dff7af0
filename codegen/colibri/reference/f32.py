"""The C runtime's fp32 operators, repeated bit for bit in numpy.

The float64 reference (:mod:`colibri.reference.moe`, :mod:`colibri.reference.transformer`
without ``quant``) computes the *true* values that C is compared against within a tolerance. A
quantised model cannot be checked that way over a long sequence: an ulp of difference before an
int8 activation quantiser can move one code, the KV cache carries the difference to every later
position, and C and a float64 model drift apart by far more than any tolerance would allow.
So the quantised mirror repeats every fp32 operation of the C in C's order instead:

- every dot product accumulates in fp32, ``acc += w[i] * x[i]`` for i ascending (C builds with
  ``-ffp-contract=off``, so no fused multiply-add anywhere), then ``+ b``;
- exp is the runtime's own :c:func:`colibri_expf` (colibri_math.h), not libm's, so C gives the
  same bits on every board and :func:`exp_f32` gives them in numpy; so are erf, tanh and the
  two GELUs (:func:`erf_f32`, :func:`tanh_f32`, :func:`gelu_f32`, :func:`gelu_tanh_f32`);
- RMSNorm, RoPE, the attention softmax, SwiGLU, the router's softmax and top-k, and the gated
  sum of the experts follow runtime_c/src/transformer_ops.c, router.c and sparse_forward.c line
  by line (each function below names its C original).

numpy's float32 ``+ - * /`` and ``sqrt`` are IEEE round-to-nearest, like C's, so equal
operations in equal order give equal bits. Every function takes and returns float32 arrays.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32

# colibri_math.h
EXP_MIN = F32(-87.0)
EXP_MAX = F32(88.7228394)
EXP_LOG2E = F32(1.44269504088896341)
EXP_ROUND = F32(12582912.0)
EXP_ROUND_BITS = 0x4B400000
EXP_LN2_HI = F32(0.693359375)
EXP_LN2_LO = F32(-2.12194440e-4)
EXP_P = tuple(
    F32(v)
    for v in (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
              1.6666665459e-1, 5.0000001201e-1)
)  # fmt: skip

# colibri_math.h: colibri_erff, colibri_tanhf, the GELUs
ERF_SMALL = F32(0.875)
ERF_S = tuple(
    F32(v)
    for v in (0.128379151, -0.376125574, 0.112825252, -0.0267939754, 0.00503589865,
              -0.000622254738)
)  # fmt: skip
ERF_ONE = F32(4.0)
ERF_T = F32(0.5)
ERF_R = tuple(
    F32(v)
    for v in (-0.00015567732, 0.284934789, 0.259548396, 0.34827745, -0.104563706,
              0.564393222, -0.47192499, 0.119545832)
)  # fmt: skip
TANH_SMALL = F32(0.625)
TANH_Q = tuple(
    F32(v) for v in (-0.333333284, 0.133327946, -0.0538541153, 0.0210102368, -0.00611336716)
)
GELU_INV_SQRT2 = F32(0.70710678)
GELU_TANH_K = F32(0.7978845608)
GELU_TANH_C = F32(0.044715)
GELU_ZERO_BELOW = F32(-11.0)

#: colibri_router's softmax block (router.c ROUTE_BLOCK).
ROUTE_BLOCK = 64


def exp_f32(x: np.ndarray) -> np.ndarray:
    """colibri_expf, element-wise: the same bits as the C on every board."""
    x = np.asarray(x, dtype=F32)
    with np.errstate(all="ignore"):
        t = x * EXP_LOG2E + EXP_ROUND
        n = t - EXP_ROUND
        r = (x - n * EXP_LN2_HI) - n * EXP_LN2_LO
        z = r * r
        p = np.full_like(x, EXP_P[0])
        for c in EXP_P[1:]:
            p = p * r + c
        y = (p * z + r) + F32(1.0)
        top = n > F32(127.0)
        bits = t.view(np.uint32) - top.astype(np.uint32)
        bits = (bits + np.uint32((127 - EXP_ROUND_BITS) & 0xFFFFFFFF)) << np.uint32(23)
        scale = bits.astype(np.uint32).view(F32)
        out = np.where(top, (y * scale) * F32(2.0), y * scale)
        out = np.where(x < EXP_MIN, F32(0.0), out)
        out = np.where(x > EXP_MAX, F32(np.inf), out)
    return np.asarray(out, dtype=F32)


def silu_f32(v: np.ndarray) -> np.ndarray:
    """colibri_silu: v / (1 + colibri_expf(-v))."""
    v = np.asarray(v, dtype=F32)
    with np.errstate(all="ignore"):
        return np.asarray(v / (F32(1.0) + exp_f32(-v)), dtype=F32)


def _horner(coefs: tuple[np.float32, ...], v: np.ndarray) -> np.ndarray:
    """coefs[0] + coefs[1] v + ... by Horner from the highest, as the C: p = p * v + c."""
    p = np.full_like(v, coefs[-1])
    for c in coefs[-2::-1]:
        p = p * v + c
    return p


def erf_f32(x: np.ndarray) -> np.ndarray:
    """colibri_erff: |x| < 0.875: x + x P(x^2); |x| < 4: +-(1 - colibri_expf(-x^2) R(t)),
    t = 1 / (1 + |x| / 2); else +-1 (NaN stays NaN)."""
    x = np.asarray(x, dtype=F32)
    with np.errstate(all="ignore"):
        a = np.where(x < 0, -x, x)
        small = x + x * _horner(ERF_S, x * x)
        t = F32(1.0) / (F32(1.0) + ERF_T * a)
        e = F32(1.0) - exp_f32(-(a * a)) * _horner(ERF_R, t)
        mid = np.where(x < 0, -e, e)
        one = np.where(x < 0, F32(-1.0), F32(1.0))
        out = np.where(a >= ERF_ONE, one, x + x)
        out = np.where(a < ERF_ONE, mid, out)
        out = np.where(a < ERF_SMALL, small, out)
    return np.asarray(out, dtype=F32)


def tanh_f32(x: np.ndarray) -> np.ndarray:
    """colibri_tanhf: |x| < 0.625: x + x (x^2 Q(x^2)) (x itself when that term is 0, which
    keeps -0); else +-(1 - 2 / (colibri_expf(2|x|) + 1))."""
    x = np.asarray(x, dtype=F32)
    with np.errstate(all="ignore"):
        a = np.where(x < 0, -x, x)
        s = x * x
        w = x * (s * _horner(TANH_Q, s))
        small = np.where(w == 0, x, x + w)
        r = F32(1.0) - F32(2.0) / (exp_f32(a + a) + F32(1.0))
        out = np.where(a < TANH_SMALL, small, np.where(x < 0, -r, r))
    return np.asarray(out, dtype=F32)


def gelu_f32(x: np.ndarray) -> np.ndarray:
    """colibri_gelu: 0.5 x (1 + colibri_erff(x / sqrt 2)), -0 below -11."""
    x = np.asarray(x, dtype=F32)
    with np.errstate(all="ignore"):
        y = F32(0.5) * x * (F32(1.0) + erf_f32(x * GELU_INV_SQRT2))
        out = np.where(x < GELU_ZERO_BELOW, F32(-0.0), y)
    return np.asarray(out, dtype=F32)


def gelu_tanh_f32(x: np.ndarray) -> np.ndarray:
    """colibri_gelu_tanh: x / (1 + colibri_expf(-2u)), u = sqrt(2 / pi) (x + 0.044715 x^3)
    (the product left to right), -0 below -11."""
    x = np.asarray(x, dtype=F32)
    with np.errstate(all="ignore"):
        u = GELU_TANH_K * (x + GELU_TANH_C * x * x * x)
        y = x / (F32(1.0) + exp_f32(-(u + u)))
        out = np.where(x < GELU_ZERO_BELOW, F32(-0.0), y)
    return np.asarray(out, dtype=F32)


def seq_dot(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Rows x [T, n_in] times w [n_out, n_in], fp32 accumulated in input order: [T, n_out]."""
    w = np.asarray(w, dtype=F32)
    x = np.asarray(x, dtype=F32)
    acc = np.zeros((x.shape[0], w.shape[0]), dtype=F32)
    for i in range(w.shape[1]):
        acc += x[:, i : i + 1] * w[None, :, i]
    return acc


def linear_f32(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """colibri_linear_f32: w [n_out, n_in] (C layout), then + b."""
    y = seq_dot(w, x)
    return y if b is None else np.asarray(y + np.asarray(b, dtype=F32)[None, :], dtype=F32)


def rmsnorm_f32(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """colibri_rmsnorm_f32 on every row: ss summed in order, inv = 1 / sqrt(ss / n + eps),
    y = w * (x * inv)."""
    x = np.asarray(x, dtype=F32)
    n = x.shape[-1]
    ss = np.zeros(x.shape[:-1], dtype=F32)
    for i in range(n):
        ss += x[..., i] * x[..., i]
    inv = F32(1.0) / np.sqrt(ss / F32(n) + F32(eps))
    return np.asarray(np.asarray(w, dtype=F32) * (x * inv[..., None]), dtype=F32)


def rope_f32(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """colibri_rope_f32: x [heads, T, head_dim], cos / sin [T, head_dim / 2] (the generated
    fp32 tables): r[i] = a cos - b sin, r[i + half] = b cos + a sin."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    c, s = cos[None], sin[None]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1).astype(F32)


def attention_f32(
    q: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    positions: np.ndarray,
    window: int | None,
) -> np.ndarray:
    """colibri_attention_f32 for queries q [H, T, hd] at `positions` over the cache's keys and
    values [KV, P, hd] (positions 0..P-1): [T, H * hd].

    Per head and query: scores[t] = (q . k_t, summed in order) * (1 / sqrt(hd)) for the allowed
    t ascending (causal, inside the sliding window); max; e = colibri_expf(score - max);
    sum in t order; out = sum over t ascending of (e_t / sum) * v_t, from 0."""
    n_heads, t_len, hd = q.shape
    group = n_heads // keys.shape[0]
    k = np.repeat(keys, group, axis=0)  # [H, P, hd]
    v = np.repeat(values, group, axis=0)
    total = k.shape[1]
    key_pos = np.arange(total)
    allowed = key_pos[None, :] <= positions[:, None]
    if window is not None and window > 0:
        allowed &= key_pos[None, :] > positions[:, None] - window
    acc = np.zeros((n_heads, t_len, total), dtype=F32)
    for i in range(hd):
        acc += q[:, :, i, None] * k[:, None, :, i]
    scores = acc * (F32(1.0) / np.sqrt(F32(hd)))
    masked = np.where(allowed[None], scores, F32(-np.inf))
    top = masked.max(axis=2)
    e = exp_f32(scores - top[:, :, None])
    total_e = np.zeros((n_heads, t_len), dtype=F32)
    for t in range(total):
        total_e = np.where(allowed[None, :, t], total_e + e[:, :, t], total_e)
    p = e / total_e[:, :, None]
    out = np.zeros((n_heads, t_len, hd), dtype=F32)
    for t in range(total):
        out = np.where(allowed[None, :, t, None], out + p[:, :, t, None] * v[:, None, t, :], out)
    return np.asarray(out.transpose(1, 0, 2).reshape(t_len, n_heads * hd), dtype=F32)


def swiglu_f32(
    x: np.ndarray, w_gate: np.ndarray, w_up: np.ndarray, w_down: np.ndarray
) -> np.ndarray:
    """colibri_swiglu_f32, weights in C layout ([f, d], [f, d], [d, f]):
    down(silu(gate x) * up x)."""
    g = seq_dot(w_gate, x)
    u = seq_dot(w_up, x)
    return seq_dot(w_down, (silu_f32(g) * u).astype(F32))


def _block_exp_sum(logits: np.ndarray, m: np.ndarray) -> np.ndarray:
    """router.c route_exp_sum: exp(l - m) summed in four lanes (i % 4, ascending), then
    (s0 + s1) + (s2 + s3). logits [T, n], m [T]."""
    e = exp_f32(logits - m[:, None])
    lanes = [np.zeros(logits.shape[0], dtype=F32) for _ in range(4)]
    for i in range(logits.shape[1]):
        lanes[i % 4] = lanes[i % 4] + e[:, i]
    return np.asarray((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]), dtype=F32)


def route_gates_f32(logits: np.ndarray, ids: np.ndarray, norm_topk: bool) -> np.ndarray:
    """The gates colibri_route gives the chosen experts ids [T, k] (best first) of fp32
    logits [T, E]: the softmax over every expert in blocks of ROUTE_BLOCK (running max M, sum
    S rescaled by colibri_expf(M_old - M) when a block raises M), gate = exp(l - M) / S, then
    divided by their sum (in slot order) when norm_topk. float32 [T, k]."""
    logits = np.asarray(logits, dtype=F32)
    t_len, n_exp = logits.shape
    m = np.zeros(t_len, dtype=F32)
    s = np.zeros(t_len, dtype=F32)
    for e0 in range(0, n_exp, ROUTE_BLOCK):
        block = logits[:, e0 : e0 + ROUTE_BLOCK]
        new_m = block.max(axis=1) if e0 == 0 else np.maximum(m, block.max(axis=1))
        rescale = (s > 0) & (new_m > m)
        s = np.where(rescale, s * exp_f32(m - new_m), s)
        m = new_m.astype(F32)
        s = (s + _block_exp_sum(block, m)).astype(F32)
    kept = np.take_along_axis(logits, ids.astype(np.int64), axis=1)
    g = (exp_f32(kept - m[:, None]) / s[:, None]).astype(F32)
    if norm_topk:
        total = np.zeros(t_len, dtype=F32)
        for j in range(g.shape[1]):
            total = total + g[:, j]
        g = (g / total[:, None]).astype(F32)
    return g
