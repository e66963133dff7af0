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
# colibri_gelu: q = Phi(-|x|) below GELU_RANGE, a quartic in u per piece of width 1 / INV_STEP
GELU_RANGE = F32(6.0)
GELU_INV_STEP = F32(8.0)
GELU_Q = np.array(
    [
        (
            0.5, 0.450261772, 0.401293665, 0.353830218, 0.308537543, 0.265985519, 0.22662735,
            0.190786958, 0.158655256, 0.130294517, 0.105649777, 0.0845657215, 0.066807203,
            0.0520812795, 0.0400591567, 0.0303963628, 0.0227501318, 0.0167933069, 0.0122244731,
            0.00877447519, 0.00620966544, 0.00433244836, 0.00297976309, 0.00202013738,
            0.00134989794, 0.000889025221, 0.000577024999, 0.000369078392, 0.000232629041,
            0.000144480699, 8.84172623e-05, 5.33123348e-05, 3.16712285e-05, 1.85367298e-05,
            1.068852e-05, 6.07162019e-06, 3.39767053e-06, 1.87299042e-06, 1.01708224e-06,
            5.44041654e-07, 2.86651186e-07, 1.48768649e-07, 7.60494743e-08, 3.82912653e-08,
            1.89895211e-08, 9.27537602e-09, 4.46215997e-09, 2.11421014e-09
        ),
        (
            -0.0498677529, -0.049479682, -0.0483334921, -0.0464818701, -0.0440081544,
            -0.0410201177, -0.0376421809, -0.0340068862, -0.0302463546, -0.0264845993,
            -0.022831155, -0.0193765536, -0.0161897168, -0.0133172991, -0.0107846772,
            -0.00859829318, -0.00674887653, -0.00521512609, -0.00396745699, -0.00297148619,
            -0.00219103484, -0.0015905191, -0.00113669143, -0.000799761154, -0.000553977443,
            -0.000377779041, -0.00025362827, -0.000167637612, -0.000109083543, -6.98813092e-05,
            -4.40734184e-05, -2.73656915e-05, -1.67282324e-05, -1.0067175e-05, -5.96456903e-06,
            -3.47908008e-06, -1.99785359e-06, -1.12947544e-06, -6.2864251e-07, -3.44464581e-07,
            -1.85822884e-07, -9.86887514e-08, -5.1600022e-08, -2.65610893e-08, -1.3460328e-08,
            -6.71551259e-09, -3.29849925e-09, -1.59502445e-09
        ),
        (
            -2.40896611e-07, 0.000386336178, 0.000755020767, 0.00108927593, 0.0013751674,
            0.00160231942, 0.00176450447, 0.00185982743, 0.00189051114, 0.00186233758,
            0.001783835, 0.00166532281, 0.00151792518, 0.00135265826, 0.00117967033,
            0.00100768299, 0.000843654969, 0.000692656729, 0.000557927589, 0.000441069511,
            0.000342328713, 0.000260918139, 0.00019533989, 0.000143678219, 0.00010384382,
            7.37610608e-05, 5.14978965e-05, 3.53443611e-05, 2.3848761e-05, 1.58222501e-05,
            1.03220264e-05, 6.62200864e-06, 4.17804631e-06, 2.59264561e-06, 1.58243097e-06,
            9.50038384e-07, 5.61065292e-07, 3.25957444e-07, 1.86295097e-07, 1.04749375e-07,
            5.79463517e-08, 3.15383843e-08, 1.688902e-08, 8.89883722e-09, 4.61357086e-09,
            2.35356734e-09, 1.1814395e-09, 5.83580573e-10
        ),
        (
            0.000130533357, 0.000127464853, 0.000118534947, 0.000104428625, 8.62045199e-05,
            6.51843075e-05, 4.28193161e-05, 2.05520773e-05, -3.11424401e-07, -1.87035512e-05,
            -3.38621066e-05, -4.53585562e-05, -5.30889702e-05, -5.72338577e-05, -5.81960921e-05,
            -5.65276096e-05, -5.28549317e-05, -4.78121074e-05, -4.19868957e-05, -3.58831094e-05,
            -2.99000621e-05, -2.43263421e-05, -1.93459218e-05, -1.50521555e-05, -1.14662553e-05,
            -8.55697181e-06, -6.25912571e-06, -4.48939727e-06, -3.15865373e-06, -2.18068294e-06,
            -1.47767389e-06, -9.83024506e-07, -6.42157488e-07, -4.11994506e-07, -2.596488e-07,
            -1.60764799e-07, -9.78055539e-08, -5.84731481e-08, -3.43571713e-08, -1.98421848e-08,
            -1.12645058e-08, -6.28668051e-09, -3.44945361e-09, -1.86092675e-09, -9.87157245e-10,
            -5.14929099e-10, -2.64141403e-10, -1.33252645e-10
        ),
        (
            -7.61537592e-07, -2.21821847e-06, -3.50518417e-06, -4.52966879e-06, -5.22627306e-06,
            -5.56260284e-06, -5.54064218e-06, -5.19401192e-06, -4.5816746e-06, -3.77929928e-06,
            -2.86965451e-06, -1.93335973e-06, -1.04115145e-06, -2.48435413e-07, 4.0754918e-07,
            9.08036384e-07, 1.25093652e-06, 1.44756814e-06, 1.51863514e-06, 1.49004075e-06,
            1.38927192e-06, 1.24234998e-06, 1.07185019e-06, 8.95780545e-07, 7.27262545e-07,
            5.74811509e-07, 4.43006059e-07, 3.3334706e-07, 2.451483e-07, 1.76346575e-07,
            1.24167883e-07, 8.56260201e-08, 5.78586565e-08, 3.83246892e-08, 2.48939358e-08,
            1.58617013e-08, 9.91669769e-09, 6.08487127e-09, 3.66519171e-09, 2.16763896e-09,
            1.25891775e-09, 7.1811801e-10, 4.02386791e-10, 2.21511753e-10, 1.19813506e-10,
            6.36820804e-11, 3.32639367e-11, 1.70771036e-11
        ),
    ],
    dtype=F32,
)  # fmt: skip
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
    """colibri_gelu: x Phi(x) as x - x q (x > 0) or x q, q = Phi(-|x|) from GELU_Q's quartic
    at k = int(|x| * 8), u = |x| * 8 - k, for |x| < 6; x from 6 on, -0 below -6, NaN stays."""
    x = np.asarray(x, dtype=F32)
    with np.errstate(all="ignore"):
        a = np.abs(x)
        inside = a < GELU_RANGE
        t = np.where(inside, a, F32(0.0)) * GELU_INV_STEP
        k = t.astype(np.int32)
        u = t - k.astype(F32)
        q = GELU_Q[4][k]
        for j in (3, 2, 1, 0):
            q = q * u + GELU_Q[j][k]
        m = x * q
        fast = np.where(x > 0, x - m, m)
        rare = np.where(x > 0, x, np.where(x < 0, F32(-0.0), x + x))
        out = np.where(inside, fast, rare)
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
    y = w * (x * inv). A row whose ss overflows fp32 is summed again over x * 2^-e (2^e: max
    |x| rounded up to a power of two, frexp's exponent), inv = 2^-e / sqrt(ss' / n + eps
    2^-2e); NaN when the row holds NaN or Inf (rmsnorm_inv_scaled)."""
    x = np.asarray(x, dtype=F32)
    n = x.shape[-1]
    ss = np.zeros(x.shape[:-1], dtype=F32)
    with np.errstate(over="ignore", invalid="ignore"):
        for i in range(n):
            ss += x[..., i] * x[..., i]
        inv = F32(1.0) / np.sqrt(ss / F32(n) + F32(eps))
        big = ~(ss <= np.finfo(F32).max)
        if big.any():
            m = np.abs(x[big]).max(axis=-1)
            s = np.ldexp(F32(1.0), -np.frexp(m)[1]).astype(F32)
            ss2 = np.zeros(m.shape, dtype=F32)
            for i in range(n):
                v = x[big][..., i] * s
                ss2 += v * v
            scaled = s / np.sqrt(ss2 / F32(n) + F32(eps) * s * s)
            inv[big] = np.where(np.isfinite(x[big]).all(axis=-1), scaled, F32(np.nan))
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
