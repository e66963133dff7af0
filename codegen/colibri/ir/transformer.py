"""The whole-model IR: a decoder-only MoE transformer as dataclasses of numpy arrays.

:class:`MoETransformer` is token embedding -> N x [RMSNorm -> rotary grouped-query attention
(optional QK-norm, QKV clipping, sliding window) -> residual -> RMSNorm -> MoE block (an
:class:`~colibri.ir.moe.MoELayer`) or dense SwiGLU MLP -> residual] -> final RMSNorm -> LM head
(tied to the embedding or not). Matrices are stored as ``x @ W`` (``[in, out]``), like the MoE
IR.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np

from .moe import Expert, MoELayer


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


def transformer_hash(model: MoETransformer) -> str:
    """SHA-256 of the model content: config and every tensor in a fixed order."""
    h = hashlib.sha256(json.dumps(model.config.__dict__, sort_keys=True).encode())
    for _, arr in all_tensors(model):
        h.update(np.ascontiguousarray(arr, "<f4").tobytes())
    return h.hexdigest()


def all_tensors(model: MoETransformer) -> list[tuple[str, np.ndarray]]:
    out: list[tuple[str, np.ndarray]] = [("embed", model.embed)]
    for i, layer in enumerate(model.layers):
        a = layer.attention
        for n in ("wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo", "q_norm", "k_norm"):
            v = getattr(a, n)
            if v is not None:
                out.append((f"l{i}.{n}", v))
        out += [(f"l{i}.input_norm", layer.input_norm), (f"l{i}.post_norm", layer.post_norm)]
        if layer.moe is not None:
            out.append((f"l{i}.router", layer.moe.router_w))
            for j, e in enumerate(layer.moe.experts):
                out += [(f"l{i}.e{j}.{n}", t) for n, t in e.tensors()]
            if layer.moe.shared_expert is not None:
                out += [(f"l{i}.se.{n}", t) for n, t in layer.moe.shared_expert.tensors()]
            if layer.moe.shared_gate is not None:
                out.append((f"l{i}.sg", layer.moe.shared_gate))
        if layer.mlp is not None:
            out += [(f"l{i}.mlp.{n}", t) for n, t in layer.mlp.tensors()]
    out.append(("final_norm", model.final_norm))
    if not model.config.tie_word_embeddings:
        out.append(("lm_head", model.lm_head))
    return out
