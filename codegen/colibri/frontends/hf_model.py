"""Hugging Face MoE causal LMs (Mixtral, Qwen2-MoE, OLMoE) as a whole :class:`MoETransformer`.

Reads the checkpoint's config.json (every field checked) and its safetensors through
:mod:`colibri.frontends.hf`; each MoE block is :func:`~colibri.frontends.hf.load_hf_moe_layer`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..hostmem import check_memory
from ..ir.moe import Expert, MoELayer
from ..ir.transformer import Attention, DecoderLayer, MoETransformer, TransformerConfig
from ..progress import SILENT, Progress
from .hf import HFCheckpoint, config_positive_float, load_hf_moe_layer, read_ffn

#: rope theta when config.json names none (the transformers defaults per architecture).
DEFAULT_ROPE_THETA = {
    "MixtralForCausalLM": 1e6,
    "Qwen2MoeForCausalLM": 1e4,
    "OlmoeForCausalLM": 1e4,
}


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
    return config_positive_float(ckpt.config_source, "rope_theta", theta)


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
    head_dim = ckpt.config.get("head_dim")
    if head_dim is None:
        if d % n_heads:
            raise ConfigError(
                f"{ckpt.config_source}: field 'num_attention_heads' = {n_heads} does not divide "
                f"hidden_size = {d} (and there is no head_dim); the config is corrupt"
            )
        head_dim = d // n_heads
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 2 or head_dim % 2:
        raise ConfigError(
            f"{ckpt.config_source}: field 'head_dim' = {head_dim!r} must be an even integer >= 2 "
            f"(rotary pairs)"
        )
    eps = config_positive_float(
        ckpt.config_source, "rms_norm_eps", ckpt.config.get("rms_norm_eps", 1e-6)
    )
    positions = ckpt.config.get("max_position_embeddings")
    if positions is not None:
        ckpt.get_int("max_position_embeddings")  # >= 1 (the RoPE tables are --max-context's)
    tie = ckpt.config.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise ConfigError(
            f"{ckpt.config_source}: field 'tie_word_embeddings' must be true or false, got {tie!r}"
        )
    clip = ckpt.config.get("clip_qkv")
    if clip is not None:
        clip = config_positive_float(ckpt.config_source, "clip_qkv", clip)
    return TransformerConfig(
        architecture=ckpt.arch.name,
        vocab_size=ckpt.get_int("vocab_size"),
        d_model=d,
        n_layers=ckpt.n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        rope_theta=_rope_theta(ckpt),
        rms_norm_eps=eps,
        tie_word_embeddings=tie,
        qk_norm=ckpt.arch.qk_norm,
        clip_qkv=None if clip is None else float(clip),
        sliding_window=_sliding_window(ckpt),
    )


def attention_biases(cfg: dict[str, Any], architecture: str) -> tuple[bool, bool]:
    """Whether the q/k/v and the o projections have biases, per architecture and config."""
    if architecture == "Qwen2MoeForCausalLM":
        return bool(cfg.get("qkv_bias", True)), False
    if architecture == "OlmoeForCausalLM":
        bias = bool(cfg.get("attention_bias", False))
        return bias, bias
    return False, False


def _attention(ckpt: HFCheckpoint, c: TransformerConfig, i: int) -> Attention:
    p = f"model.layers.{i}.self_attn"
    d, hq, hkv = c.d_model, c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    qkv_bias, o_bias = attention_biases(ckpt.config, c.architecture)

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


def load_hf_transformer(
    path: str | os.PathLike[str] | HFCheckpoint, progress: Progress = SILENT
) -> MoETransformer:
    """A whole Hugging Face MoE causal LM (Mixtral, Qwen2-MoE, OLMoE) as a MoETransformer
    (`progress`: a line counting the layers)."""
    ckpt = path if isinstance(path, HFCheckpoint) else HFCheckpoint(path)
    c = load_hf_config(ckpt)
    check_fits_memory(ckpt)
    with progress.stage("load", c.n_layers + 1) as st:
        return _read_layers(ckpt, c, lambda i: st.update(i, f"layer {i}/{c.n_layers}"))


def _fp32_bytes(ckpt: HFCheckpoint, names: list[str]) -> int:
    return 4 * sum(int(np.prod(ckpt.shape(name), dtype=np.int64)) for name in names)


def check_fits_memory(ckpt: HFCheckpoint) -> None:
    """Refuse, before reading a weight, a checkpoint whose fp32 weights (what the loader holds,
    whatever the file's dtype) exceed the machine's available memory (colibri.hostmem)."""
    nbytes = _fp32_bytes(ckpt, ckpt.names())
    check_memory(
        nbytes,
        f"{ckpt.path}: loading",
        f"its {nbytes // 4:,} weights as fp32",
        "run it on a machine with more memory, or free some (quantising does not lower this: "
        "the loader holds the fp32 weights)",
    )


def streaming_bytes(ckpt: HFCheckpoint) -> tuple[int, int]:
    """(bytes, weights) a conversion one layer at a time holds at once as fp32: every tensor
    outside the decoder layers (embedding, LM head, final norm) and the largest layer, plus one
    more copy of the largest tensor of a layer (read, then transposed)."""
    per_layer: dict[int, list[str]] = {}
    other: list[str] = []
    for name in ckpt.names():
        parts = name.split(".")
        if len(parts) > 3 and parts[:2] == ["model", "layers"] and parts[2].isdigit():
            per_layer.setdefault(int(parts[2]), []).append(name)
        else:
            other.append(name)
    layer = max((_fp32_bytes(ckpt, names) for names in per_layer.values()), default=0)
    largest = max((_fp32_bytes(ckpt, [n]) for ns in per_layer.values() for n in ns), default=0)
    held = _fp32_bytes(ckpt, other) + layer
    return held + largest, held // 4


def check_fits_memory_streamed(ckpt: HFCheckpoint) -> None:
    """:func:`check_fits_memory` for a conversion that reads one decoder layer at a time
    (:func:`streaming_bytes`): a model larger than memory passes when one layer and the
    embedding / LM head fit."""
    nbytes, weights = streaming_bytes(ckpt)
    check_memory(
        nbytes,
        f"{ckpt.path}: converting",
        f"{weights:,} weights as fp32 at once: the embedding, LM head and the largest decoder "
        f"layer, read one layer at a time",
        "run it on a machine with more memory, or free some",
    )


def read_head(ckpt: HFCheckpoint, c: TransformerConfig) -> MoETransformer:
    """The tensors outside the decoder layers (embedding, final norm, LM head) as a
    MoETransformer without layers (:func:`read_decoder_layer` reads those one at a time)."""
    d = c.d_model
    embed = ckpt.tensor("model.embed_tokens.weight", (c.vocab_size, d))
    lm_head = embed if c.tie_word_embeddings else read_lm_head(ckpt, c)
    return MoETransformer(
        config=c,
        embed=embed,
        layers=[],
        final_norm=ckpt.tensor("model.norm.weight", (d,)),
        lm_head=lm_head,
        source=str(ckpt.path),
    )


def read_lm_head(ckpt: HFCheckpoint, c: TransformerConfig) -> np.ndarray:
    """The untied LM head [vocab, d_model] of the checkpoint."""
    return ckpt.tensor("lm_head.weight", (c.vocab_size, c.d_model))


def read_decoder_layer(ckpt: HFCheckpoint, c: TransformerConfig, i: int) -> DecoderLayer:
    """Decoder layer `i` of the checkpoint."""
    d = c.d_model
    moe: MoELayer | None = None
    mlp: Expert | None = None
    if ckpt.is_moe_layer(i):
        moe = load_hf_moe_layer(ckpt, i)
    else:
        f = ckpt.get_int("intermediate_size")
        names = ("gate_proj", "up_proj", "down_proj")
        mlp = read_ffn(ckpt, f"model.layers.{i}.mlp.", names, d, f)
    return DecoderLayer(
        input_norm=ckpt.tensor(f"model.layers.{i}.input_layernorm.weight", (d,)),
        attention=_attention(ckpt, c, i),
        post_norm=ckpt.tensor(f"model.layers.{i}.post_attention_layernorm.weight", (d,)),
        moe=moe,
        mlp=mlp,
    )


def _read_layers(
    ckpt: HFCheckpoint, c: TransformerConfig, tick: Callable[[int], None]
) -> MoETransformer:
    layers = []
    for i in range(c.n_layers):
        layers.append(read_decoder_layer(ckpt, c, i))
        tick(i + 1)
    model = read_head(ckpt, c)
    model.layers = layers
    return model


def load_transformer(path: str | os.PathLike[str], progress: Progress = SILENT) -> MoETransformer:
    """A whole model from a checkpoint directory (only Hugging Face checkpoints for now)."""
    return load_hf_transformer(Path(path), progress)
