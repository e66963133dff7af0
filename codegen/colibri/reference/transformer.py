"""The float64 numpy reference of a whole decoder-only MoE transformer (the oracle).

The forward runs in float64 with a KV cache (:class:`KVCache`): a prefill of the prompt and then
one token at a time give the same logits as one pass over the whole sequence. MoE blocks go
through :func:`colibri.reference.moe.moe_forward` (its fp32 router, so expert choices match the
C runtime's). :func:`generate` does greedy decoding or seeded temperature / top-k / top-p
sampling.

Quantised models (``forward(..., quant=...)`` with a
:class:`~colibri.quant.model.TransformerQuant`) run the *mirror* instead: the generated C's
fp32 operations in the C's order (:mod:`colibri.reference.f32`), so that it gives the C's logits
to the bit (up to the order-independent rounding of nothing: every sum is sequential) at every
position, prompt and generated. Every MoE layer's routed experts go through
:func:`colibri.reference.kernels.quant_moe_forward`, the mirror of the generated quantised
kernels and of the runtime's router; with a dense scheme the other matrices (attention
q/k/v/o, Qwen's shared expert and dense MLPs, the token embedding and the LM head) run through
the same kernels' mirror (:func:`colibri.reference.kernels.matvec`); norms, RoPE, attention,
the fp32 matrices and the shared expert's gate repeat runtime_c/src/transformer_ops.c and the
generated transformer_model.c.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import InputError
from ..ir.moe import Expert
from ..ir.transformer import Attention, DecoderLayer, MoETransformer, TransformerConfig
from ..quant.formats import QuantExpert
from ..quant.model import TransformerQuant, quantize_transformer
from . import f32
from .kernels import matvec, quant_expert_ffn, quant_moe_forward
from .moe import moe_forward

#: Logits of the float64 reference vs transformers' float32 model on the tiny test models:
#: measured max |diff| is <= 4e-6 (fp32 accumulation over 1-4 layers); 1e-4 absolute leaves
#: headroom while a wrong rotation, head grouping or gate moves logits by O(0.1).
LOGIT_TOLERANCE = 1e-4


def _as_quant(
    model: MoETransformer, quant: TransformerQuant | str | None
) -> TransformerQuant | None:
    if quant is None or isinstance(quant, TransformerQuant):
        return quant
    if quant == "fp32":
        return None
    return quantize_transformer(model, quant)


# -- reference forward -------------------------------------------------------------------------


@dataclass
class KVCache:
    """Keys and values (after RoPE) of every past position, per layer index: [n_kv, T,
    head_dim]. Layers may come in any order (a streamed calibration runs one layer alone)."""

    keys: dict[int, np.ndarray] = field(default_factory=dict)
    values: dict[int, np.ndarray] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return int(next(iter(self.keys.values())).shape[1]) if self.keys else 0

    def append(self, layer: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Add the keys / values [n_kv, T, head_dim] of new positions to `layer`'s cache (the
        first call per layer creates it); return the layer's whole keys and values."""
        if layer in self.keys:
            self.keys[layer] = np.concatenate([self.keys[layer], k], axis=1)
            self.values[layer] = np.concatenate([self.values[layer], v], axis=1)
        else:
            self.keys[layer] = k
            self.values[layer] = v
        return self.keys[layer], self.values[layer]


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """``weight * x / sqrt(mean(x^2) + eps)`` over the last axis, float64."""
    var = np.mean(x * x, axis=-1, keepdims=True)
    return np.asarray(weight, dtype=np.float64) * (x / np.sqrt(var + eps))


def rope_tables(c: TransformerConfig, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [T, head_dim] in the rotate-half layout (frequencies repeated twice)."""
    inv_freq = 1.0 / (c.rope_theta ** (np.arange(0, c.head_dim, 2, dtype=np.float64) / c.head_dim))
    freqs = positions.astype(np.float64)[:, None] * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb), np.sin(emb)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x [heads, T, head_dim]: ``x cos + rotate_half(x) sin``."""
    half = x.shape[-1] // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[None] + rot * sin[None]


def _linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    y = x @ w.astype(np.float64)
    return y if b is None else y + b


def attention_forward(
    c: TransformerConfig,
    att: Attention,
    h: np.ndarray,
    cache: KVCache,
    layer: int,
    start: int,
) -> np.ndarray:
    """Causal GQA self-attention of rows h [T, d] at positions start.., updating the cache."""
    t = h.shape[0]
    q = _linear(h, att.wq, att.bq)
    k = _linear(h, att.wk, att.bk)
    v = _linear(h, att.wv, att.bv)
    if att.q_norm is not None and att.k_norm is not None:
        q = rms_norm(q, att.q_norm, c.rms_norm_eps)
        k = rms_norm(k, att.k_norm, c.rms_norm_eps)
    if c.clip_qkv is not None:
        q, k, v = (np.clip(a, -c.clip_qkv, c.clip_qkv) for a in (q, k, v))
    hd = c.head_dim
    q = q.reshape(t, c.n_heads, hd).transpose(1, 0, 2)
    k = k.reshape(t, c.n_kv_heads, hd).transpose(1, 0, 2)
    v = v.reshape(t, c.n_kv_heads, hd).transpose(1, 0, 2)
    positions = np.arange(start, start + t)
    cos, sin = rope_tables(c, positions)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    keys, values = cache.append(layer, k, v)
    total = keys.shape[1]
    key_pos = np.arange(total)
    allowed = key_pos[None, :] <= positions[:, None]
    if c.sliding_window is not None:
        allowed &= positions[:, None] - key_pos[None, :] < c.sliding_window
    group = c.n_heads // c.n_kv_heads
    out = np.empty((t, c.n_heads, hd))
    for head in range(c.n_heads):
        kv = head // group
        scores = (q[head] @ keys[kv].T) / np.sqrt(hd)
        scores = np.where(allowed, scores, -np.inf)
        scores -= scores.max(axis=1, keepdims=True)
        p = np.exp(scores)
        p /= p.sum(axis=1, keepdims=True)
        out[:, head] = p @ values[kv]
    return _linear(out.reshape(t, c.n_heads * hd), att.wo, att.bo)


def _swiglu(ex: Expert, x: np.ndarray) -> np.ndarray:
    assert ex.w3 is not None
    g = x @ ex.w1.astype(np.float64)
    return np.asarray(((g / (1.0 + np.exp(-g))) * (x @ ex.w3.astype(np.float64))) @ ex.w2)


def layer_forward(
    c: TransformerConfig,
    layer: DecoderLayer,
    x: np.ndarray,
    cache: KVCache,
    i: int,
    start: int,
    capture: Callable[[int, np.ndarray], None] | None = None,
) -> np.ndarray:
    """The residual stream x [T, d_model] (float64, positions start..) after decoder layer `i`
    (its keys / values go to the cache's layer `i`); `capture(i, rows)` sees the fp32
    input rows of its MoE block. :func:`forward` runs this for every layer; the streamed
    calibration one layer at a time over every sequence
    (:class:`colibri.reference.calibration.LayerByLayer`)."""
    h = rms_norm(x, layer.input_norm, c.rms_norm_eps)
    x = x + attention_forward(c, layer.attention, h, cache, i, start)
    h = rms_norm(x, layer.post_norm, c.rms_norm_eps)
    if layer.moe is not None:
        h32 = h.astype(np.float32)
        if capture is not None:
            capture(i, h32)
        y, _ = moe_forward(layer.moe, h32)
    else:
        assert layer.mlp is not None
        y = _swiglu(layer.mlp, h)
    return np.asarray(x + y)


def forward(
    model: MoETransformer,
    token_ids: list[int] | np.ndarray,
    cache: KVCache | None = None,
    quant: TransformerQuant | str | None = None,
    capture: Callable[[int, np.ndarray], None] | None = None,
    logits: bool = True,
) -> np.ndarray:
    """Logits [T, vocab] (float64) of `token_ids`, which follow the cache's positions. With
    `quant` (a :class:`TransformerQuant`, or a scheme name quantised on the fly) the routed
    experts run through the quantised kernels' mirror. `capture(layer index, rows)` sees the
    fp32 input rows [T, d_model] of every MoE block (calibration statistics); with `logits`
    False (fp32 only) the layers after the last MoE block (the cache then lacks them) and the
    LM head are skipped and [T, 0] returned (calibration reads only the captures)."""
    c = model.config
    q = _as_quant(model, quant)
    ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
    if ids.size == 0:
        raise InputError("no tokens to run: pass at least one token id")
    bad = ids[(ids < 0) | (ids >= c.vocab_size)]
    if bad.size:
        raise InputError(
            f"token id {int(bad[0])} is outside the vocabulary (0..{c.vocab_size - 1})"
        )
    cache = KVCache() if cache is None else cache
    if q is not None:
        return _finite_last(mirror_forward(model, ids, cache, q, capture).astype(np.float64))
    start = cache.length
    x = model.embed[ids].astype(np.float64)
    last_moe = max((i for i, layer in enumerate(model.layers) if layer.moe), default=-1)
    for i, layer in enumerate(model.layers):
        if not logits and i > last_moe:
            break
        x = layer_forward(c, layer, x, cache, i, start, capture)
    if not logits:
        return np.zeros((ids.size, 0))
    x = rms_norm(x, model.final_norm, c.rms_norm_eps)
    return _finite_last(np.asarray(x @ model.lm_head.astype(np.float64).T))


def _finite_last(logits: np.ndarray) -> np.ndarray:
    """The logits, when the last row's (what the C returns) are all finite; an InputError as
    the C's COLIBRI_ERR_NAN otherwise (colibri_tfi_logits)."""
    if logits.size and not np.isfinite(logits[-1]).all():
        raise InputError(
            "NaN or Inf in the logits: the forward pass overflowed or the weights hold NaN "
            "(the C refuses the step with COLIBRI_ERR_NAN)"
        )
    return logits


# -- the quantised mirror ----------------------------------------------------------------------


def _mirror_linear(
    dq: TransformerQuant | None, key: str, x: np.ndarray, w: np.ndarray, b: np.ndarray | None
) -> np.ndarray:
    """The generated `lin` macro: colibri_linear_f32 on the fp32 weight w [in, out], or the
    dense scheme's kernel on q.dense[key] then `y[o] += b[o]`."""
    if dq is None:
        return f32.linear_f32(x, w.T, b)
    y = matvec(dq.dense[key], x, dq.dense_act)
    return y if b is None else (y + b.astype(np.float32)[None, :]).astype(np.float32)


def _mirror_attention(
    c: TransformerConfig,
    att: Attention,
    dq: TransformerQuant | None,
    layer: int,
    h: np.ndarray,
    cache: KVCache,
    start: int,
) -> np.ndarray:
    """The generated <name>_attention at positions start.. (rows h [T, d]), caching k / v."""
    t = h.shape[0]
    q = _mirror_linear(dq, f"l{layer}.wq", h, att.wq, att.bq)
    k = _mirror_linear(dq, f"l{layer}.wk", h, att.wk, att.bk)
    v = _mirror_linear(dq, f"l{layer}.wv", h, att.wv, att.bv)
    if att.q_norm is not None and att.k_norm is not None:
        q = f32.rmsnorm_f32(q, att.q_norm, c.rms_norm_eps)
        k = f32.rmsnorm_f32(k, att.k_norm, c.rms_norm_eps)
    if c.clip_qkv is not None:
        lim = np.float32(c.clip_qkv)
        q, k, v = (np.clip(a, -lim, lim).astype(np.float32) for a in (q, k, v))
    hd = c.head_dim
    positions = np.arange(start, start + t)
    cos, sin = rope_tables(c, positions)  # the generated tables: float64 rounded to fp32
    cos32 = cos[:, : hd // 2].astype(np.float32)
    sin32 = sin[:, : hd // 2].astype(np.float32)
    q = f32.rope_f32(q.reshape(t, c.n_heads, hd).transpose(1, 0, 2), cos32, sin32)
    k = f32.rope_f32(k.reshape(t, c.n_kv_heads, hd).transpose(1, 0, 2), cos32, sin32)
    v = v.reshape(t, c.n_kv_heads, hd).transpose(1, 0, 2).astype(np.float32)
    keys, values = cache.append(layer, k, v)
    out = f32.attention_f32(q, keys, values, positions, c.sliding_window)
    return _mirror_linear(dq, f"l{layer}.wo", out, att.wo, att.bo)


def _mirror_dense_ffn(ex: Expert | None, qe: QuantExpert | None, h: np.ndarray) -> np.ndarray:
    """A shared expert or dense MLP: the dense scheme's generated kernel, or
    colibri_swiglu_f32 on the fp32 weights."""
    if qe is not None:
        return quant_expert_ffn(qe, "silu", True, h)
    assert ex is not None and ex.w3 is not None
    return f32.swiglu_f32(h, ex.w1.T, ex.w3.T, ex.w2.T)


def _mirror_ffn(
    layer: DecoderLayer, q: TransformerQuant, index: int, h: np.ndarray, x: np.ndarray
) -> np.ndarray:
    """The generated <name>_ffn: x + the MoE block (+ gated shared expert) or dense MLP."""
    dq = q if q.dense_scheme != "fp32" else None
    dense_ffn = dq.dense_ffn.get(index) if dq is not None else None
    moe = layer.moe
    if moe is None:
        y = _mirror_dense_ffn(layer.mlp, dense_ffn, h)
        return (x + y).astype(np.float32)
    # the routed experts only (colibri_forward; the shared expert is added below, as <name>_ffn)
    routed = replace(moe, shared_expert=None, shared_gate=None)
    proj, _ = quant_moe_forward(routed, q.experts[index], h, q.routers.get(index))
    proj = proj.astype(np.float32)
    if moe.shared_expert is None:
        return (x + proj).astype(np.float32)
    shared = _mirror_dense_ffn(moe.shared_expert, dense_ffn, h)
    scale = np.ones((h.shape[0], 1), dtype=np.float32)
    if moe.shared_gate is not None:
        g = f32.seq_dot(moe.shared_gate.reshape(1, -1), h)
        scale = (np.float32(1.0) / (np.float32(1.0) + f32.exp_f32(-g))).astype(np.float32)
    return (x + (proj + scale * shared)).astype(np.float32)


def mirror_forward(
    model: MoETransformer,
    ids: np.ndarray,
    cache: KVCache,
    q: TransformerQuant,
    capture: Callable[[int, np.ndarray], None] | None = None,
) -> np.ndarray:
    """fp32 logits [T, vocab] of the generated C of `model` quantised as `q`, bit for bit:
    <name>_lm_step of templates/transformer/transformer_model.c.j2 on every token of ids (a
    prompt is the same as one token at a time: every operation is per position)."""
    c = model.config
    eps = c.rms_norm_eps
    start = cache.length
    dq = q if q.dense_scheme != "fp32" else None
    if dq is not None:  # rows dequantised in fp32, as the generated C does
        x = dq.dense["embed"].dequantize()[ids].astype(np.float32)
    else:
        x = model.embed[ids].astype(np.float32)
    for i, layer in enumerate(model.layers):
        h = f32.rmsnorm_f32(x, layer.input_norm, eps)
        x = (x + _mirror_attention(c, layer.attention, dq, i, h, cache, start)).astype(np.float32)
        h = f32.rmsnorm_f32(x, layer.post_norm, eps)
        if capture is not None and layer.moe is not None:
            capture(i, h)
        x = _mirror_ffn(layer, q, i, h, x)
    h = f32.rmsnorm_f32(x, model.final_norm, eps)
    if dq is not None:
        return matvec(dq.lm_head(), h, dq.dense_act)
    return f32.linear_f32(h, model.lm_head, None)


# -- sampling ----------------------------------------------------------------------------------


def sample_next(
    logits: np.ndarray,
    rng: np.random.Generator | None = None,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> int:
    """Next token from a row of logits: greedy (temperature 0, ties to the lower id), else
    softmax(logits / temperature) restricted to the top_k ids (0: all) and to the smallest
    set whose probability reaches top_p, sampled with `rng`."""
    logits = np.asarray(logits, dtype=np.float64).reshape(-1)
    if temperature < 0 or not 0.0 < top_p <= 1.0 or top_k < 0:
        raise InputError(
            f"sampling needs temperature >= 0, 0 < top_p <= 1 and top_k >= 0; got "
            f"temperature={temperature}, top_p={top_p}, top_k={top_k}"
        )
    if temperature == 0.0:
        return int(np.argmax(logits))
    if rng is None:
        raise InputError("temperature > 0 needs a random generator (a seed)")
    order = np.argsort(-logits, kind="stable")
    if top_k:
        order = order[:top_k]
    z = logits[order] / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    if top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(p), top_p) + 1)
        order, p = order[:keep], p[:keep] / p[:keep].sum()
    return int(order[rng.choice(len(order), p=p)])


def generate(
    model: MoETransformer,
    prompt_ids: list[int],
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    eos_token_id: int | None = None,
    quant: TransformerQuant | str | None = None,
) -> list[int]:
    """Prompt + up to max_new_tokens new tokens (stops after eos_token_id when given); quant
    as in :func:`forward`."""
    if not prompt_ids:
        raise InputError("the prompt is empty: pass at least one token id")
    q = _as_quant(model, quant)
    rng = np.random.default_rng(seed)
    cache = KVCache()
    out = list(prompt_ids)
    logits = forward(model, out, cache, q)[-1]
    for _ in range(max_new_tokens):
        nxt = sample_next(logits, rng, temperature, top_k, top_p)
        out.append(nxt)
        if eos_token_id is not None and nxt == eos_token_id:
            break
        logits = forward(model, [nxt], cache, q)[-1]
    return out
