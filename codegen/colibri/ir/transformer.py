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
    #: :func:`transformer_hash` when already known: set by a streamed `generate --calib`
    #: (colibri.cli.pipeline), which hashes each layer as it reads it and then drops the fp32
    #: weights it quantised.
    sha256: str | None = None


def transformer_hash(model: MoETransformer) -> str:
    """SHA-256 of the model content: config and every tensor in a fixed order
    (:func:`all_tensors`; :class:`TransformerHash` computes it a part at a time)."""
    if model.sha256 is not None:
        return model.sha256
    h = TransformerHash(model.config)
    h.update(all_tensors(model))
    return h.hexdigest()


class TransformerHash:
    """:func:`transformer_hash` fed one part of :func:`all_tensors` at a time (the embedding,
    each layer's :func:`layer_tensors`, then :func:`tail_tensors`), for a model read one layer
    at a time."""

    def __init__(self, config: TransformerConfig) -> None:
        self._h = hashlib.sha256(json.dumps(config.__dict__, sort_keys=True).encode())

    def update(self, tensors: list[tuple[str, np.ndarray]]) -> None:
        for _, arr in tensors:
            self._h.update(np.ascontiguousarray(arr, "<f4").tobytes())

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def all_tensors(model: MoETransformer) -> list[tuple[str, np.ndarray]]:
    """Every tensor of the model, named, in a fixed order: the embedding, each layer's
    :func:`layer_tensors`, then :func:`tail_tensors`."""
    out: list[tuple[str, np.ndarray]] = [("embed", model.embed)]
    for i, layer in enumerate(model.layers):
        out += layer_tensors(i, layer)
    return out + tail_tensors(model)


def layer_tensors(i: int, layer: DecoderLayer) -> list[tuple[str, np.ndarray]]:
    """The tensors of decoder layer `i` in :func:`all_tensors`' order."""
    out: list[tuple[str, np.ndarray]] = []
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
    return out


def tail_tensors(model: MoETransformer) -> list[tuple[str, np.ndarray]]:
    """The tensors after the decoder layers in :func:`all_tensors`' order: the final norm and
    (untied) the LM head."""
    out: list[tuple[str, np.ndarray]] = [("final_norm", model.final_norm)]
    if not model.config.tie_word_embeddings:
        out.append(("lm_head", model.lm_head))
    return out
