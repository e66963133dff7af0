"""Static memory plan of a whole generated transformer: activations, MoE buffers, KV cache.

The generated model runs one token at a time (prefill included), so every activation buffer
holds one row; the KV cache holds ``max_context`` positions of every layer's keys and values.
All of it is one arena with a fixed offset per buffer (``<NAME>_<REGION>_OFFSET`` / ``_BYTES``
macros). The MoE workspace is :func:`colibri.memplan.workspace_bytes` for one token (the C
macro COLIBRI_WORKSPACE_BYTES, checked by a ``_Static_assert`` in the generated C), shared by
every layer's MoE block since layers run one after the other; the sampler's workspace is
COLIBRI_SAMPLE_WORKSPACE_BYTES (colibri_transformer.h).
"""

from __future__ import annotations

from dataclasses import dataclass

from .memplan import ArenaPlan, align16, lay_out, workspace_bytes
from .transformer import MoETransformer


def sample_workspace_bytes(vocab: int) -> int:
    """COLIBRI_SAMPLE_WORKSPACE_BYTES(N) of colibri_transformer.h."""
    return 2 * align16(4 * vocab)


def kv_cache_bytes(model: MoETransformer, max_context: int) -> int:
    """Keys + values of every layer, fp32: 2 * layers * kv_heads * max_context * head_dim * 4."""
    c = model.config
    return 2 * c.n_layers * c.n_kv_heads * max_context * c.head_dim * 4


def ffn_scratch_floats(model: MoETransformer) -> int:
    """Floats of the SwiGLU scratch (gate + up rows) of the widest dense MLP / shared expert."""
    widths = [0]
    for layer in model.layers:
        if layer.mlp is not None:
            widths.append(int(layer.mlp.w1.shape[1]))
        if layer.moe is not None and layer.moe.shared_expert is not None:
            widths.append(int(layer.moe.shared_expert.w1.shape[1]))
    return 2 * max(widths)


def moe_workspace_bytes(model: MoETransformer) -> int:
    """The largest one-token sparse-forward workspace over the MoE layers."""
    sizes = [0]
    for layer in model.layers:
        if layer.moe is not None:
            m = layer.moe.config
            sizes.append(workspace_bytes(m.n_experts, m.top_k, m.d_model, m.d_ff, m.gated, 1))
    return max(sizes)


def max_top_k(model: MoETransformer) -> int:
    return max([1] + [layer.moe.config.top_k for layer in model.layers if layer.moe is not None])


@dataclass(frozen=True)
class TransformerPlan(ArenaPlan):
    """The arena of a whole transformer with a KV cache of max_context positions."""

    max_context: int = 0


def plan_transformer(model: MoETransformer, max_context: int, act_q: int = 0) -> TransformerPlan:
    """Lay out the arena of a transformer with a KV cache of max_context positions; act_q > 0
    adds the int8 row of the quantised experts' per-token activations (that many bytes)."""
    c = model.config
    d, hq, hkv = c.d_model, c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    k = max_top_k(model)
    scratch = max(ffn_scratch_floats(model), 1)
    items = [
        ("x", 4 * d, f"float[{d}] residual stream"),
        ("h", 4 * d, f"float[{d}] normalised input of a sub-layer"),
        ("q", 4 * hq, f"float[{hq}] queries"),
        ("k", 4 * hkv, f"float[{hkv}] keys of this token"),
        ("v", 4 * hkv, f"float[{hkv}] values of this token"),
        ("att", 4 * hq, f"float[{hq}] attention output (all heads)"),
        ("proj", 4 * d, f"float[{d}] sub-layer output (attention / MoE / MLP)"),
        ("shared", 4 * d, f"float[{d}] shared-expert output"),
        ("ffn_scratch", 4 * scratch, f"float[{scratch}] SwiGLU gate + up rows"),
        ("expert_ids", 4 * k, f"int32[{k}] routing of this token"),
        ("gates", 4 * k, f"float[{k}] gate weights"),
        ("route_temp", 4, "float[1] router workspace"),
        (
            "workspace",
            max(moe_workspace_bytes(model), 16),
            "one-token sparse-forward workspace (COLIBRI_WORKSPACE_BYTES), shared by all layers",
        ),
        ("scores", 4 * max_context, f"float[{max_context}] attention scores"),
        ("logits", 4 * c.vocab_size, f"float[{c.vocab_size}] next-token logits"),
        (
            "sample",
            sample_workspace_bytes(c.vocab_size),
            "sampler workspace (COLIBRI_SAMPLE_WORKSPACE_BYTES)",
        ),
        *(
            [("act_q", act_q, f"int8[{act_q}] quantised activation row (int8 experts)")]
            if act_q
            else []
        ),
        (
            "kv_cache",
            kv_cache_bytes(model, max_context),
            f"float[{c.n_layers}][2][{c.n_kv_heads}][{max_context}][{c.head_dim}] KV cache",
        ),
    ]
    return TransformerPlan(regions=lay_out(items), max_context=max_context)
