"""Planning a model for a board: memory (one static arena), expert placement, cache slots.

:func:`plan` is the planning stage of every model: a lone MoE layer gets the cache policy and
its slots, the arena (:func:`~colibri.plan.memory.plan_memory`), the RAM budget for pinned
experts and each stored expert's placement and kernel variant
(:func:`~colibri.plan.placement.plan_placement`); a whole decoder its arena with a KV cache of
--max-context positions (:func:`~colibri.plan.memory.plan_transformer`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..boards import Board
from ..errors import ConfigError
from ..ir.model import Model
from ..ir.moe import Expert, MoELayer
from ..ir.transformer import DecoderLayer, MoETransformer
from ..options import CACHE_POLICIES, MAX_CONTEXT_LIMIT, OPTIMIZE, GenerateOptions
from ..quant.formats import DEFAULT_ACT, QuantExpert, QuantTensor, stored_nbytes
from ..quant.layouts import act_row_width, layouts
from ..quant.model import LayerQuant, TransformerQuant
from .memory import (
    MemoryPlan,
    TransformerPlan,
    align16,
    expert_floats,
    plan_memory,
    plan_transformer,
)
from .placement import Placement, plan_placement

#: Largest number of LRU slots (COLIBRI_MAX_LRU_SLOTS).
MAX_LRU_SLOTS = 256


@dataclass(frozen=True)
class LayerPlan:
    """Where everything of a lone MoE layer lives: the arena, the cache slots and every stored
    expert's placement (in storage order: hottest first when calibrated)."""

    memory: MemoryPlan
    placements: list[Placement]
    n_slots: int
    slot_floats: int


def default_ram_budget(board: Board, plan: MemoryPlan) -> int:
    """RAM for pinned experts when --ram-budget is not given: half of what the board has left
    after the arena, the stack and a 4 KB allowance for the runtime's statics; 0 on hosted
    boards (no RAM region: weights are in RAM there anyway)."""
    ram = board.memory.get("ram")
    if ram is None or "flash" not in board.memory:
        return 0
    free = ram.size - plan.arena_size - board.stack_size - 4096
    return max(0, free // 2)


def stored_expert_bytes(qe: QuantExpert, d_model: int, d_ff: int, isa: str) -> int:
    """Bytes of an expert's arrays as the generated C stores them: each quantised part in the
    layout its kernel on `isa` reads (rows padded to the layout's chunk included:
    colibri.quant.layouts), so the RAM / PSRAM budgets count what the ELF holds."""
    lay = {} if qe.scheme == "fp32" else layouts(isa, qe.scheme, qe.act, d_model, d_ff)
    return sum(
        stored_nbytes(replace(t, layout=lay.get(part, "rows")) if isinstance(t, QuantTensor) else t)
        for part, t in qe.tensors()
    )


def slot_floats(layer: MoELayer, q: LayerQuant, bias: bool, isa: str = "") -> int:
    """Floats of one cache slot when some experts are quantised: the largest stored expert as
    the loader packs it (fp32: COLIBRI_EXPERT_FLOATS back to back; quantised: each part at a
    16-byte aligned offset, loader.c slot_fill, in the layout its kernel on `isa` reads:
    colibri.quant.layouts), rounded up so every slot starts 16-aligned."""
    c = layer.config
    largest = 4 * expert_floats(c, bias)
    for qe in q.experts.values():
        if qe.scheme == "fp32":
            continue
        lay = layouts(isa, qe.scheme, qe.act, c.d_model, c.d_ff)
        off = 0
        for part, t in qe.tensors():
            if isinstance(t, QuantTensor):
                t = replace(t, layout=lay.get(part, "rows"))
            off = align16(off) + stored_nbytes(t)
        largest = max(largest, off)
    return align16(largest) // 4


def plan(
    model: Model, q: Any, analysis: Any, board: Board, options: GenerateOptions
) -> LayerPlan | TransformerPlan:
    """The planning stage: `q` and `analysis` are what the quantise and analyse stages gave."""
    if options.optimize not in OPTIMIZE:
        raise ConfigError(
            f"--optimize: unknown choice '{options.optimize}'; supported: {', '.join(OPTIMIZE)}"
        )
    if model.decoder is not None:
        n = options.context
        if isinstance(n, bool) or not 1 <= n <= MAX_CONTEXT_LIMIT:
            raise ConfigError(
                f"--max-context must be between 1 and {MAX_CONTEXT_LIMIT} positions, got {n}"
            )
        act_q = transformer_act_q(model.decoder, q, options.kernel_isa(board.isa))
        return plan_transformer(model.decoder, n, act_q)
    layer = model.layer
    if options.cache not in CACHE_POLICIES:
        raise ConfigError(
            f"--cache: unknown policy '{options.cache}'; supported: {', '.join(CACHE_POLICIES)}"
        )
    n_slots = {"pinned": 0, "none": 1, "lru": options.cache_slots}[options.cache]
    if options.cache == "lru" and not 1 <= options.cache_slots <= MAX_LRU_SLOTS:
        raise ConfigError(
            f"--cache lru needs --cache-slots between 1 and {MAX_LRU_SLOTS} "
            f"(COLIBRI_MAX_LRU_SLOTS), got {options.cache_slots}"
        )
    bias = layer.experts[0].b1 is not None
    act_q = any(e.act == "int8" and e.scheme != "fp32" for e in q.experts.values())
    c = layer.config
    isa = options.kernel_isa(board.isa)  # the core the kernels' layouts are chosen for
    # the kernels' quantised rows, padded where their layouts pad (colibri.quant.layouts)
    act_width = max(
        [act_row_width(isa, e.scheme, e.act, c.d_model, c.d_ff) for e in q.experts.values()],
        default=0,
    )
    floats = slot_floats(layer, q, bias, isa) if n_slots and q.quantised else 0
    se = layer.shared_expert
    shared_d_ff = int(se.w1.shape[1]) if se is not None else 0
    memory = plan_memory(
        layer.config, options.max_tokens, n_slots, bias, act_q, floats, shared_d_ff, act_width
    )
    ram_budget = options.ram_budget
    if ram_budget is None:
        ram_budget = default_ram_budget(board, memory) if analysis.calibrated else 0
    psram_budget = options.psram_budget
    psram = board.memory.get("psram")
    if psram_budget is None:
        psram_budget = psram.size if psram is not None and analysis.calibrated else 0
    elif psram_budget and psram is None:
        raise ConfigError(
            f"--psram-budget: board {board.name} has no external PSRAM (no [memory.psram] in "
            f"boards/{board.name}.toml); drop the option, or use a board with PSRAM (esp32s3)"
        )
    elif psram is not None and psram_budget > psram.size:
        raise ConfigError(
            f"--psram-budget {psram_budget} exceeds board {board.name}'s PSRAM "
            f"({psram.size} bytes); pass at most {psram.size}"
        )
    sizes = {i: stored_expert_bytes(qe, c.d_model, c.d_ff, isa) for i, qe in q.experts.items()}
    placements = plan_placement(
        layer, q.experts, analysis.heat, ram_budget, analysis.calibrated, psram_budget, sizes
    )
    return LayerPlan(memory, placements, n_slots, floats)


def transformer_act_q(model: MoETransformer, q: TransformerQuant | None, isa: str = "") -> int:
    """Values of the int8 row that quantised matrices with int8 activations need: the widest
    input they quantise (expert / FFN inputs and hidden rows, attention inputs; an expert's or
    FFN's padded to the stored row width of its layouts on `isa`, colibri.quant.layouts); 0
    for none."""
    if q is None:
        return 0
    d = model.config.d_model
    padded = [
        act_row_width(isa, e.scheme, e.act, d, int(e.w1.n_out))
        for qe in [*q.experts.values(), q.dense_ffn]
        for e in qe.values()
    ]
    experts = [
        i
        for i, layer in enumerate(model.layers)
        if layer.moe is not None
        and q.scheme != "fp32"
        and any(e.act == "int8" for e in q.experts[i].values())
    ]
    dense = q.dense_scheme != "fp32"
    ffns = [i for i, f in q.dense_ffn.items() if dense and f.act == "int8"]
    plain = _act_q_values(model, experts, ffns, dense and q.dense_act == "int8")
    return max([plain, *padded]) if plain else 0


def transformer_act_q_for(model: MoETransformer, quant: str, dense: str) -> int:
    """:func:`transformer_act_q` from the schemes alone, with their default activations (what
    `generate --quant QUANT --dense-quant DENSE` plans; `colibri inspect`, before anything is
    quantised)."""
    experts = [i for i, layer in enumerate(model.layers) if layer.moe is not None]
    ffns = [i for i, layer in enumerate(model.layers) if _ffn(layer) is not None]
    dense_int8 = DEFAULT_ACT[dense] == "int8"
    return _act_q_values(
        model,
        experts if DEFAULT_ACT[quant] == "int8" else [],
        ffns if dense_int8 else [],
        dense_int8,
    )


def _ffn(layer: DecoderLayer) -> Expert | None:
    """A layer's dense FFN: its MLP, or its MoE block's shared expert."""
    return layer.mlp if layer.moe is None else layer.moe.shared_expert


def _act_q_values(
    model: MoETransformer, experts: list[int], ffns: list[int], attention: bool
) -> int:
    """The widest input quantised to int8: the experts of layers `experts`, the dense FFNs of
    layers `ffns` (their inputs and hidden rows) and, with `attention`, the attention inputs."""
    c = model.config
    rows = []
    for i in experts:
        moe = model.layers[i].moe
        assert moe is not None
        rows.append(max(c.d_model, moe.config.d_ff))
    for i in ffns:
        ffn = _ffn(model.layers[i])
        assert ffn is not None
        rows.append(max(c.d_model, int(ffn.w1.shape[1])))
    if attention:
        rows.append(max(c.d_model, c.n_heads * c.head_dim))
    return max(rows, default=0)
