"""Static memory plans: every run-time buffer gets a fixed offset in one arena.

One planner for every kind of model: :func:`lay_out` places named regions back to back,
16-byte aligned, into an :class:`ArenaPlan`; :func:`plan_memory` lists the regions of a lone
MoE layer and :func:`plan_transformer` those of a whole decoder.

A lone layer's arena holds the runner's I/O chunk (input, output, routing results, the router's
route_temp) followed by the runtime's sparse-forward workspace, whose size is the C macro
COLIBRI_WORKSPACE_BYTES (colibri.h) — :func:`workspace_bytes` computes the same number, and
a test compiles the macro to check they agree — plus the expert kernels' own scratch
(colibri_model_t.kernel_scratch_bytes: the int8 activation row of quantised kernels,
:func:`kernel_scratch_bytes`), so every handle on the model has its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.moe import MoEConfig
from ..ir.transformer import MoETransformer
from ..quant.formats import q8_blocks

ALIGN = 16


def align16(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def workspace_bytes(e: int, k: int, d: int, f: int, gated: bool, t: int) -> int:
    """COLIBRI_WORKSPACE_BYTES(E, K, D, F, GATED, T) of colibri.h."""
    return (
        align16(4 * (2 * e + 2))
        + align16(4 * t * k)
        + 2 * align16(4 * t * d)
        + align16(4 * t * f * (2 if gated else 1))
    )


#: Bytes of colibri_expert_weights_t on a 64-bit target (5 pointers + 5 uint32 part sizes,
#: padded to 8); 32-bit targets need 40, so a plan sized with this fits every board (the
#: generated C _Static_asserts it).
EXPERT_WEIGHTS_STRUCT_BYTES = 64


def slot_bytes(n_slots: int, expert_floats: int) -> int:
    """COLIBRI_SLOT_BYTES(N, EF) of colibri.h, with the 64-bit size of the pointer struct."""
    if n_slots <= 0:
        return 0
    return (
        align16(8 * n_slots)
        + align16(n_slots * EXPERT_WEIGHTS_STRUCT_BYTES)
        + align16(4 * n_slots)
        + align16(4 * n_slots * expert_floats)
    )


def expert_floats(c: MoEConfig, bias: bool) -> int:
    """COLIBRI_EXPERT_FLOATS(D, F, GATED, BIAS)."""
    return c.d_model * c.d_ff * (3 if c.gated else 2) + ((c.d_model + c.d_ff) if bias else 0)


@dataclass(frozen=True)
class Region:
    name: str
    offset: int
    size: int
    what: str


def lay_out(items: list[tuple[str, int, str]]) -> tuple[Region, ...]:
    """Regions back to back in the given order, each at a 16-byte aligned offset."""
    regions = []
    off = 0
    for name, size, what in items:
        regions.append(Region(name, off, size, what))
        off = align16(off + size)
    return tuple(regions)


@dataclass(frozen=True)
class ArenaPlan:
    """One static arena: named regions at fixed offsets (see lay_out)."""

    regions: tuple[Region, ...]

    @property
    def arena_size(self) -> int:
        last = self.regions[-1]
        return align16(last.offset + last.size)

    def region(self, name: str) -> Region:
        return next(r for r in self.regions if r.name == name)


@dataclass(frozen=True)
class MemoryPlan(ArenaPlan):
    """The arena of one MoE layer processed in chunks of max_tokens tokens, with the kernels'
    scratch (:func:`kernel_scratch_bytes`) and the part of it the int8 activation rows take."""

    max_tokens: int = 0
    kernel_scratch: int = 0
    act_q_scratch: int = 0


def act_q_codes_offset(n: int) -> int:
    """Offset of the int8 codes in the quantised activation row of n values: the row holds its
    fp32 block scales first (COLIBRI_Q8_BLOCKS(n) of them, so they stay 4-byte aligned), then
    the n codes."""
    return 4 * q8_blocks(n)


def act_q_bytes(n: int) -> int:
    """Bytes of the quantised activation row of n values (scales, then codes)."""
    return act_q_codes_offset(n) + n


def _act_q_what(n: int) -> str:
    return f"float[{q8_blocks(n)}] block scales + int8[{n}] quantised activation row"


def kernel_scratch_bytes(
    c: MoEConfig, act_q: bool, tokens: int = 1, shared_d_ff: int = 0, act_width: int = 0
) -> int:
    """colibri_model_t.kernel_scratch_bytes of a lone layer's generated kernels: the quantised
    activation rows of a group of `tokens` tokens (the chunk's max_tokens: a kernel quantises
    every row of its group before its matrix products) that kernels with int8 activations keep
    in their scratch after the hidden rows: the group's block scales, then its codes
    (:func:`act_q_group_codes_offset`); 0 without them. A shared expert wider than the routed
    ones (shared_d_ff > d_ff: colibri_shared_expert_fn) runs a chunk's rows in the same scratch,
    so it is at least the bytes its hidden rows need beyond the routed experts' hidden rows.
    act_width: codes per row where the kernels' layouts pad their rows beyond max(d_model, d_ff)
    (colibri.quant.layouts.act_row_width; the block scales stay those of the unpadded row)."""
    ks = tokens * act_q_bytes(act_q_width(c, act_width)) if act_q else 0
    rows = 2 if c.gated else 1
    return max(ks, 4 * tokens * rows * max(0, shared_d_ff - c.d_ff))


def act_q_width(c: MoEConfig, act_width: int = 0) -> int:
    """Codes per quantised activation row of a lone layer's kernels: max(d_model, d_ff), or
    act_width where their layouts pad the rows wider."""
    return max(c.d_model, c.d_ff, act_width)


def act_q_group_codes_offset(n: int, tokens: int) -> int:
    """Offset of the codes in the quantised rows of a group of `tokens` rows of up to n values:
    the group's block scales first (row t's at t * COLIBRI_Q8_BLOCKS(width)), then its codes
    (row t's at t * width), width being the rows' actual length (d_model or d_ff)."""
    return tokens * act_q_codes_offset(n)


def plan_memory(
    c: MoEConfig,
    max_tokens: int,
    slots: int = 0,
    bias: bool = False,
    act_q: bool = False,
    slot_floats: int = 0,
    shared_d_ff: int = 0,
    act_width: int = 0,
) -> MemoryPlan:
    """Lay out the arena for chunks of max_tokens tokens.

    slots: expert cache slots of an LRU/NONE static model (they must follow the workspace,
    where colibri_init_static carves them), each of slot_floats floats (0: the fp32 expert
    size, COLIBRI_EXPERT_FLOATS); act_q: the kernels quantise activations to int8, so the
    workspace also holds their quantised row after the hidden rows (:func:`kernel_scratch_bytes`,
    per handle: the workspace is what colibri_init_shared_static needs); shared_d_ff: d_ff of
    a shared expert (0: none), whose hidden rows may need more kernel scratch; act_width: the
    kernels' activation rows where their layouts pad them (:func:`kernel_scratch_bytes`)."""
    t, d, k = max_tokens, c.d_model, c.top_k
    ks = kernel_scratch_bytes(c, act_q, t, shared_d_ff, act_width)
    aq = kernel_scratch_bytes(c, act_q, t, 0, act_width)
    what = "sparse-forward workspace (COLIBRI_WORKSPACE_BYTES)"
    if ks and ks == aq:
        n = act_q_width(c, act_width)
        what += f" + the kernels' int8 activation rows ({ks} bytes: {t} x {_act_q_what(n)})"
    elif ks:
        what += f" + the kernels' scratch ({ks} bytes: the shared expert's hidden rows)"
    items = [
        ("input", 4 * t * d, f"float[{t}][{d}] token chunk"),
        ("output", 4 * t * d, f"float[{t}][{d}] layer output"),
        ("expert_ids", 4 * t * k, f"int32[{t}][{k}] routing"),
        ("gates", 4 * t * k, f"float[{t}][{k}] gate weights"),
        ("route_temp", 4 * t, f"float[{t}] router workspace (per-token log-sum-exp)"),
        ("workspace", workspace_bytes(c.n_experts, k, d, c.d_ff, c.gated, t) + align16(ks), what),
    ]
    if slots:
        items.append(
            (
                "slots",
                slot_bytes(slots, slot_floats or expert_floats(c, bias)),
                f"{slots} expert cache slot(s) (COLIBRI_SLOT_BYTES)",
            )
        )
    return MemoryPlan(lay_out(items), max_tokens, ks, aq)


# -- whole transformers ------------------------------------------------------------------------
# Static memory plan of a whole generated transformer: activations, MoE buffers, KV cache.
# The generated model runs one token at a time (prefill included), so every activation buffer
# holds one row; the KV cache holds ``max_context`` positions of every layer's keys and values.
# All of it is one arena with a fixed offset per buffer (``<NAME>_<REGION>_OFFSET`` / ``_BYTES``
# macros). The MoE workspace is :func:`colibri.memplan.workspace_bytes` for one token (the C
# macro COLIBRI_WORKSPACE_BYTES, checked by a ``_Static_assert`` in the generated C), shared by
# every layer's MoE block since layers run one after the other; the sampler's workspace is
# COLIBRI_SAMPLE_WORKSPACE_BYTES (colibri_transformer.h).


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
    """The arena of a whole transformer with a KV cache of max_context positions; act_q: the
    values of its quantised activation row (0: none), act_q_codes: where its int8 codes start
    in it (:func:`act_q_codes_offset`); max_top_k: the most experts a token is routed to (the
    routing buffers hold that many)."""

    max_context: int = 0
    act_q: int = 0
    act_q_codes: int = 0
    max_top_k: int = 1


def plan_transformer(model: MoETransformer, max_context: int, act_q: int = 0) -> TransformerPlan:
    """Lay out the arena of a transformer with a KV cache of max_context positions; act_q > 0
    adds the quantised activation row of that many values (:func:`act_q_bytes`)."""
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
        *([("act_q", act_q_bytes(act_q), _act_q_what(act_q))] if act_q else []),
        (
            "kv_cache",
            kv_cache_bytes(model, max_context),
            f"float[{c.n_layers}][2][{c.n_kv_heads}][{max_context}][{c.head_dim}] KV cache",
        ),
    ]
    return TransformerPlan(lay_out(items), max_context, act_q, act_q_codes_offset(act_q), k)
