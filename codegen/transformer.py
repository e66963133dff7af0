"""A whole decoder-only MoE transformer: IR, Hugging Face loader and the numpy reference.

The IR (:class:`MoETransformer`) is token embedding -> N x [RMSNorm -> rotary grouped-query
attention (optional QK-norm, QKV clipping, sliding window) -> residual -> RMSNorm -> MoE block
(an :class:`~colibri.ir.MoELayer`) or dense SwiGLU MLP -> residual] -> final RMSNorm -> LM head
(tied to the embedding or not). Matrices are stored as ``x @ W`` (``[in, out]``), like the
MoE IR.

The reference forward runs in float64 with a KV cache (:class:`KVCache`): a prefill of the
prompt and then one token at a time give the same logits as one pass over the whole sequence.
MoE blocks go through :func:`colibri.reference.moe_forward` (its fp32 router, so expert choices
match the C runtime's). :func:`generate` does greedy decoding or seeded temperature / top-k /
top-p sampling.

Quantised experts (:func:`quantize_transformer`, ``forward(..., quant=...)``): every MoE
layer's routed experts go through :func:`colibri.quantize.quant_moe_forward`, the numpy mirror
of the generated quantised kernels (int8 per-output-channel weights and int8 per-token
activations by default, as ``colibri generate --quant int8``). With ``dense=`` (``colibri
generate --dense-quant fp16|int8``) the other matrices follow: attention q/k/v/o projections,
Qwen's shared expert and dense MLPs, the token embedding and the LM head (one table when tied),
stored in that scheme and run through the same kernels' mirror (:func:`colibri.quantize.matvec`)
on fp32 rows. Norms, biases, the router and the shared expert's gate stay fp32.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import ConfigError, InputError
from .hf import HFCheckpoint, load_hf_moe_layer
from .ir import Expert, MoELayer
from .quantize import (
    QuantExpert,
    QuantRouter,
    QuantTensor,
    check_router_scheme,
    check_scheme,
    make_plan,
    matvec,
    quant_expert_ffn,
    quant_moe_forward,
    quantize_expert,
    quantize_layer,
    quantize_matrix,
    quantize_router,
)
from .reference import ffn, moe_forward

#: Logits of the float64 reference vs transformers' float32 model on the tiny test models:
#: measured max |diff| is <= 4e-6 (fp32 accumulation over 1-4 layers); 1e-4 absolute leaves
#: headroom while a wrong rotation, head grouping or gate moves logits by O(0.1).
LOGIT_TOLERANCE = 1e-4

#: rope theta when config.json names none (the transformers defaults per architecture).
DEFAULT_ROPE_THETA = {
    "MixtralForCausalLM": 1e6,
    "Qwen2MoeForCausalLM": 1e4,
    "OlmoeForCausalLM": 1e4,
}


@dataclass(frozen=True)
class TransformerConfig:
    """Dimensions and options of a decoder-only MoE transformer."""

    architecture: str
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    tie_word_embeddings: bool = False
    qk_norm: bool = False
    clip_qkv: float | None = None
    sliding_window: int | None = None


@dataclass
class Attention:
    """Grouped-query attention weights, ``[in, out]``; biases / QK-norm weights optional."""

    wq: np.ndarray  # [d_model, n_heads * head_dim]
    wk: np.ndarray  # [d_model, n_kv_heads * head_dim]
    wv: np.ndarray  # [d_model, n_kv_heads * head_dim]
    wo: np.ndarray  # [n_heads * head_dim, d_model]
    bq: np.ndarray | None = None
    bk: np.ndarray | None = None
    bv: np.ndarray | None = None
    bo: np.ndarray | None = None
    q_norm: np.ndarray | None = None  # [n_heads * head_dim] (OLMoE: over the whole projection)
    k_norm: np.ndarray | None = None  # [n_kv_heads * head_dim]


@dataclass
class DecoderLayer:
    """One decoder layer: exactly one of `moe` and `mlp` (a dense SwiGLU MLP) is set."""

    input_norm: np.ndarray
    attention: Attention
    post_norm: np.ndarray
    moe: MoELayer | None = None
    mlp: Expert | None = None


@dataclass
class MoETransformer:
    config: TransformerConfig
    embed: np.ndarray  # [vocab, d_model]
    layers: list[DecoderLayer]
    final_norm: np.ndarray
    lm_head: np.ndarray  # [vocab, d_model] (the embedding itself when tied)
    source: str = ""


# -- Hugging Face loader -----------------------------------------------------------------------


def _rope_theta(ckpt: HFCheckpoint) -> float:
    cfg = ckpt.config
    params = cfg.get("rope_parameters")
    scaling = cfg.get("rope_scaling")
    theta = cfg.get("rope_theta")
    if isinstance(params, dict):
        rope_type = params.get("rope_type", params.get("type", "default"))
        theta = params.get("rope_theta", theta)
    elif isinstance(scaling, dict):
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    else:
        rope_type = "default"
    if rope_type != "default":
        raise ConfigError(
            f"{ckpt.config_source}: rope type {rope_type!r} is not supported; supported: "
            f"'default' (plain rotary embeddings with rope_theta)"
        )
    if theta is None:
        theta = DEFAULT_ROPE_THETA[ckpt.arch.name]
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0:
        raise ConfigError(f"{ckpt.config_source}: rope_theta must be a number > 0, got {theta!r}")
    return float(theta)


def _sliding_window(ckpt: HFCheckpoint) -> int | None:
    cfg = ckpt.config
    if ckpt.arch.name == "MixtralForCausalLM":
        w = cfg.get("sliding_window")
        if w is None:
            return None
        if isinstance(w, bool) or not isinstance(w, int) or w < 1:
            raise ConfigError(f"{ckpt.config_source}: sliding_window must be null or >= 1")
        return w
    if cfg.get("use_sliding_window"):
        raise ConfigError(
            f"{ckpt.config_source}: use_sliding_window=true is not supported for "
            f"{ckpt.arch.name}; supported: full attention (use_sliding_window=false)"
        )
    return None


def load_hf_config(ckpt: HFCheckpoint) -> TransformerConfig:
    """The TransformerConfig of a checkpoint, every field checked."""
    ckpt.check_silu()
    d = ckpt.get_int("hidden_size")
    n_heads = ckpt.get_int("num_attention_heads")
    kv = ckpt.config.get("num_key_value_heads")
    n_kv = n_heads if kv is None else ckpt.get_int("num_key_value_heads")
    if n_heads % n_kv:
        raise ConfigError(
            f"{ckpt.config_source}: num_attention_heads={n_heads} is not a multiple of "
            f"num_key_value_heads={n_kv}"
        )
    head_dim = ckpt.config.get("head_dim") or d // n_heads
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim % 2:
        raise ConfigError(
            f"{ckpt.config_source}: head_dim={head_dim!r} must be an even integer (rotary pairs)"
        )
    eps = ckpt.config.get("rms_norm_eps", 1e-6)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or eps < 0:
        raise ConfigError(f"{ckpt.config_source}: rms_norm_eps must be a number >= 0")
    clip = ckpt.config.get("clip_qkv")
    return TransformerConfig(
        architecture=ckpt.arch.name,
        vocab_size=ckpt.get_int("vocab_size"),
        d_model=d,
        n_layers=ckpt.n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        rope_theta=_rope_theta(ckpt),
        rms_norm_eps=float(eps),
        tie_word_embeddings=bool(ckpt.config.get("tie_word_embeddings", False)),
        qk_norm=ckpt.arch.qk_norm,
        clip_qkv=None if clip is None else float(clip),
        sliding_window=_sliding_window(ckpt),
    )


def _attention(ckpt: HFCheckpoint, c: TransformerConfig, i: int) -> Attention:
    p = f"model.layers.{i}.self_attn"
    d, hq, hkv = c.d_model, c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    cfg = ckpt.config
    if c.architecture == "Qwen2MoeForCausalLM":
        qkv_bias, o_bias = bool(cfg.get("qkv_bias", True)), False
    elif c.architecture == "OlmoeForCausalLM":
        qkv_bias = o_bias = bool(cfg.get("attention_bias", False))
    else:
        qkv_bias = o_bias = False

    def bias(name: str, n: int, present: bool) -> np.ndarray | None:
        return ckpt.tensor(f"{p}.{name}.bias", (n,)) if present else None

    att = Attention(
        wq=ckpt.tensor(f"{p}.q_proj.weight", (hq, d)).T.copy(),
        wk=ckpt.tensor(f"{p}.k_proj.weight", (hkv, d)).T.copy(),
        wv=ckpt.tensor(f"{p}.v_proj.weight", (hkv, d)).T.copy(),
        wo=ckpt.tensor(f"{p}.o_proj.weight", (d, hq)).T.copy(),
        bq=bias("q_proj", hq, qkv_bias),
        bk=bias("k_proj", hkv, qkv_bias),
        bv=bias("v_proj", hkv, qkv_bias),
        bo=bias("o_proj", d, o_bias),
    )
    if c.qk_norm:
        att.q_norm = ckpt.tensor(f"{p}.q_norm.weight", (hq,))
        att.k_norm = ckpt.tensor(f"{p}.k_norm.weight", (hkv,))
    return att


def load_hf_transformer(path: str | os.PathLike[str] | HFCheckpoint) -> MoETransformer:
    """A whole Hugging Face MoE causal LM (Mixtral, Qwen2-MoE, OLMoE) as a MoETransformer."""
    ckpt = path if isinstance(path, HFCheckpoint) else HFCheckpoint(path)
    c = load_hf_config(ckpt)
    d = c.d_model
    layers = []
    for i in range(c.n_layers):
        moe: MoELayer | None = None
        mlp: Expert | None = None
        if ckpt.is_moe_layer(i):
            moe = load_hf_moe_layer(ckpt, i)
        else:
            f = ckpt.get_int("intermediate_size")
            p = f"model.layers.{i}.mlp"
            mlp = Expert(
                w1=ckpt.tensor(f"{p}.gate_proj.weight", (f, d)).T.copy(),
                w3=ckpt.tensor(f"{p}.up_proj.weight", (f, d)).T.copy(),
                w2=ckpt.tensor(f"{p}.down_proj.weight", (d, f)).T.copy(),
            )
        layers.append(
            DecoderLayer(
                input_norm=ckpt.tensor(f"model.layers.{i}.input_layernorm.weight", (d,)),
                attention=_attention(ckpt, c, i),
                post_norm=ckpt.tensor(f"model.layers.{i}.post_attention_layernorm.weight", (d,)),
                moe=moe,
                mlp=mlp,
            )
        )
    embed = ckpt.tensor("model.embed_tokens.weight", (c.vocab_size, d))
    if c.tie_word_embeddings:
        lm_head = embed
    else:
        lm_head = ckpt.tensor("lm_head.weight", (c.vocab_size, d))
    return MoETransformer(
        config=c,
        embed=embed,
        layers=layers,
        final_norm=ckpt.tensor("model.norm.weight", (d,)),
        lm_head=lm_head,
        source=str(ckpt.path),
    )


# -- quantised experts --------------------------------------------------------------------------


#: Schemes of --dense-quant (int4 blocks of 32 are for the routed experts: --quant int4).
DENSE_SCHEMES = ("fp32", "fp16", "int8")
#: The attention projections of every layer, as named in the IR and the generated C.
ATTENTION_PROJECTIONS = ("wq", "wk", "wv", "wo")


@dataclass
class TransformerQuant:
    """The quantised weights of a transformer, as `colibri generate --quant SCHEME [--act MODE]
    [--dense-quant SCHEME]` stores them: the routed experts of every MoE layer (layer index ->
    stored expert index -> QuantExpert) and, when dense_scheme is not fp32, the rest
    (``dense``: "embed", "lm_head" (absent when tied), "l<i>.wq" .. "l<i>.wo" as [out, in];
    ``dense_ffn``: layer index -> its shared expert or dense MLP) and, with router_scheme fp16 /
    int8, the routers (dequantised per element before the fp32 accumulation, as the C router
    does)."""

    scheme: str
    act: str
    experts: dict[int, dict[int, QuantExpert]]
    dense_scheme: str = "fp32"
    dense_act: str = "fp32"
    dense: dict[str, QuantTensor] = field(default_factory=dict)
    dense_ffn: dict[int, QuantExpert] = field(default_factory=dict)
    #: --router-quant: every MoE layer's router (layer index -> QuantRouter) when not fp32.
    router_scheme: str = "fp32"
    routers: dict[int, QuantRouter] = field(default_factory=dict)

    def lm_head(self) -> QuantTensor:
        """The LM head's tensor (the embedding's when tied)."""
        return self.dense.get("lm_head", self.dense["embed"])


def check_dense_scheme(dense: str) -> str:
    dense = check_scheme(dense, "--dense-quant")
    if dense not in DENSE_SCHEMES:
        raise ConfigError(
            f"--dense-quant {dense} is not supported; supported: {', '.join(DENSE_SCHEMES)} "
            f"(int4 blocks are for the routed experts: --quant int4)"
        )
    return dense


def quantize_transformer(
    model: MoETransformer,
    scheme: str = "int8",
    act: str | None = None,
    dense: str = "fp32",
    router: str = "fp32",
) -> TransformerQuant:
    """Quantise the routed experts of every MoE layer (codegen/quantize.py formats) and, with
    dense fp16 / int8, every other matrix; act is the activation mode of int8/int4 matrices
    (default int8: integer dot products; fp16 has no integer kernel and keeps fp32)."""
    plan_act = ""
    experts: dict[int, dict[int, QuantExpert]] = {}
    for i, layer in enumerate(model.layers):
        if layer.moe is None:
            continue
        plan = make_plan(layer.moe.config.n_experts, scheme, None, act)
        plan_act = plan.acts[0]
        experts[i] = quantize_layer(layer.moe, plan)
    if not plan_act:
        plan_act = make_plan(1, scheme, None, act).acts[0]
    q = TransformerQuant(scheme=scheme, act=plan_act, experts=experts)
    q.router_scheme = check_router_scheme(router)
    if router != "fp32":
        for i, layer in enumerate(model.layers):
            if layer.moe is not None:
                q.routers[i] = quantize_router(layer.moe.router_w, q.router_scheme)
    q.dense_scheme = check_dense_scheme(dense)
    if q.dense_scheme == "fp32":
        return q
    q.dense_act = make_plan(1, q.dense_scheme, None, act).acts[0]
    q.dense["embed"] = quantize_matrix(model.embed, q.dense_scheme, "embed")
    if not model.config.tie_word_embeddings:
        q.dense["lm_head"] = quantize_matrix(model.lm_head, q.dense_scheme, "lm_head")
    for i, layer in enumerate(model.layers):
        for n in ATTENTION_PROJECTIONS:
            w = getattr(layer.attention, n)
            q.dense[f"l{i}.{n}"] = quantize_matrix(w.T, q.dense_scheme, f"l{i}.{n}")
        ffn = layer.mlp if layer.moe is None else layer.moe.shared_expert
        if ffn is not None:
            q.dense_ffn[i] = quantize_expert(ffn, q.dense_scheme, q.dense_act, f"l{i}.ffn")
    return q


def _moe_block(
    layer: MoELayer,
    h: np.ndarray,
    qexperts: dict[int, QuantExpert] | None,
    shared_q: QuantExpert | None = None,
    router: QuantRouter | None = None,
) -> np.ndarray:
    """The MoE block on fp32 rows h: fp32 reference, or the quantised mirror of the routed
    experts plus the shared expert (fp32, or shared_q's scheme)."""
    if qexperts is None:
        y, _ = moe_forward(layer, h)
        return y
    y, _ = quant_moe_forward(layer, qexperts, h, router)
    if layer.shared_expert is not None:
        if shared_q is not None:
            shared = quant_expert_ffn(shared_q, "silu", True, h).astype(np.float64)
        else:
            shared = ffn(layer.shared_expert, layer, h)
        if layer.shared_gate is not None:
            g = h.astype(np.float64) @ layer.shared_gate.astype(np.float64)
            shared = shared / (1.0 + np.exp(-g))[:, None]
        y = y + shared
    return y


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
    """Keys and values (after RoPE) of every past position, per layer: [n_kv, T, head_dim]."""

    keys: list[np.ndarray] = field(default_factory=list)
    values: list[np.ndarray] = field(default_factory=list)

    @property
    def length(self) -> int:
        return int(self.keys[0].shape[1]) if self.keys else 0


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


#: A linear layer of attention: (projection name, rows x [T, in], weight [in, out], bias).
Linear = Callable[[str, np.ndarray, np.ndarray, np.ndarray | None], np.ndarray]


def _float_linear(name: str, x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    return _linear(x, w, b)


def _dense_linear(q: TransformerQuant, layer: int) -> Linear:
    """Attention projections of `layer` through the quantised kernels' mirror: fp32 rows in,
    fp32 matvec (+ fp32 bias, as the generated C adds it), float64 out."""

    def run(name: str, x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
        y = matvec(q.dense[f"l{layer}.{name}"], x.astype(np.float32), q.dense_act)
        if b is not None:
            y = (y + b.astype(np.float32)[None, :]).astype(np.float32)
        return y.astype(np.float64)

    return run


def attention_forward(
    c: TransformerConfig,
    att: Attention,
    h: np.ndarray,
    cache: KVCache,
    layer: int,
    start: int,
    linear: Linear = _float_linear,
) -> np.ndarray:
    """Causal GQA self-attention of rows h [T, d] at positions start.., updating the cache."""
    t = h.shape[0]
    q = linear("wq", h, att.wq, att.bq)
    k = linear("wk", h, att.wk, att.bk)
    v = linear("wv", h, att.wv, att.bv)
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
    if layer < len(cache.keys):
        cache.keys[layer] = np.concatenate([cache.keys[layer], k], axis=1)
        cache.values[layer] = np.concatenate([cache.values[layer], v], axis=1)
    else:
        cache.keys.append(k)
        cache.values.append(v)
    keys, values = cache.keys[layer], cache.values[layer]
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
    return linear("wo", out.reshape(t, c.n_heads * hd), att.wo, att.bo)


def _swiglu(ex: Expert, x: np.ndarray) -> np.ndarray:
    assert ex.w3 is not None
    g = x @ ex.w1.astype(np.float64)
    return np.asarray(((g / (1.0 + np.exp(-g))) * (x @ ex.w3.astype(np.float64))) @ ex.w2)


def forward(
    model: MoETransformer,
    token_ids: list[int] | np.ndarray,
    cache: KVCache | None = None,
    quant: TransformerQuant | str | None = None,
) -> np.ndarray:
    """Logits [T, vocab] (float64) of `token_ids`, which follow the cache's positions. With
    `quant` (a :class:`TransformerQuant`, or a scheme name quantised on the fly) the routed
    experts run through the quantised kernels' mirror."""
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
    start = cache.length
    dq = q if q is not None and q.dense_scheme != "fp32" else None
    if dq is not None:  # rows dequantised in fp32, as the generated C does
        x = dq.dense["embed"].dequantize()[ids].astype(np.float64)
    else:
        x = model.embed[ids].astype(np.float64)
    for i, layer in enumerate(model.layers):
        h = rms_norm(x, layer.input_norm, c.rms_norm_eps)
        linear = _dense_linear(dq, i) if dq is not None else _float_linear
        x = x + attention_forward(c, layer.attention, h, cache, i, start, linear)
        h = rms_norm(x, layer.post_norm, c.rms_norm_eps)
        dense_ffn = dq.dense_ffn.get(i) if dq is not None else None
        if layer.moe is not None:
            qe = q.experts[i] if q is not None else None
            router = q.routers.get(i) if q is not None else None
            y = _moe_block(layer.moe, h.astype(np.float32), qe, dense_ffn, router)
        elif dense_ffn is not None:
            y = quant_expert_ffn(dense_ffn, "silu", True, h).astype(np.float64)
        else:
            assert layer.mlp is not None
            y = _swiglu(layer.mlp, h)
        x = x + y
    x = rms_norm(x, model.final_norm, c.rms_norm_eps)
    if dq is not None:
        return matvec(dq.lm_head(), x.astype(np.float32), dq.dense_act).astype(np.float64)
    return np.asarray(x @ model.lm_head.astype(np.float64).T)


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


def load_transformer(path: str | os.PathLike[str]) -> MoETransformer:
    """A whole model from a checkpoint directory (only Hugging Face checkpoints for now)."""
    return load_hf_transformer(Path(path))
