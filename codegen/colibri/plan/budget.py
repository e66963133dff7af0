"""Budget: does a planned model fit its board, and if not, what would.

Checked before anything is written or built: flash (const weights + an estimate of the code)
and RAM (arena + stack + statics, plus experts pinned in RAM). When the weights overflow the
flash, the error names the quantisation that would fit (:func:`schemes_that_fit`, from
:func:`~colibri.quant.formats.weight_bytes_for`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..boards import Board
from ..errors import BudgetExceeded
from ..ir.model import Model
from ..ir.moe import MoELayer
from ..ir.transformer import MoETransformer
from ..options import GenerateOptions
from ..quant.formats import q8_blocks, q8_channel_dtype, weight_bytes_for

#: The largest static arena: sizes are 32-bit on MCU boards, and x86-64's default code model
#: cannot address a static object of 2 GiB or more.
MAX_ARENA_BYTES = (1 << 31) - 1


def check_budget(
    manifest: dict,
    board: Board,
    runtime_flash_estimate: int = 24 * 1024,
    runtime_ram_estimate: int = 1024,
) -> None:
    """Fail at generation time if the model cannot fit the board (BudgetExceeded).

    Flash: const weights + an estimate of the runtime and kernel code; RAM: the arena + the
    board's stack + a small allowance for the runtime's statics. The exact figures come from
    the linked ELF (`colibri size`); this check exists so nobody waits for a build to learn
    that 3 MB of weights do not fit 1 MB of flash.
    """
    mem = manifest["memory"]
    weights = int(mem["weight_bytes"])
    arena = int(mem["arena_size"])
    if arena > MAX_ARENA_BYTES:
        raise BudgetExceeded(
            f"the model does not fit board {board.name}: a static arena of {arena} bytes is "
            f"over {MAX_ARENA_BYTES} (2 GiB - 1), the largest object 32-bit sizes and the C "
            f"compilers' default code model allow; reduce --max-tokens (now {mem['max_tokens']})"
        )
    flash = board.memory.get("flash")
    ram = board.memory.get("ram")
    if flash is None or ram is None:
        return
    flash_need = weights + runtime_flash_estimate
    ram_need = arena + board.stack_size + runtime_ram_estimate
    problems = []
    if flash_need > flash.size:
        experts = manifest.get("experts_bytes", [])
        top = sorted(experts, key=lambda e: -e[1])[:3]
        biggest = ", ".join(f"expert {i}: {b} bytes" for i, b in top)
        parts = manifest["memory"].get("weight_parts")  # whole transformers: bytes per part
        if parts:
            top = sorted(parts.items(), key=lambda kv: -kv[1])[:3]
            biggest = ", ".join(f"{part} {b} bytes" for part, b in top)
        problems.append(
            f"flash: needs ~{flash_need} bytes (weights {weights} + ~{runtime_flash_estimate} "
            f"code), board has {flash.size}: {flash_need - flash.size} bytes over budget; "
            f"largest consumers: {biggest or 'expert weights'}"
        )
    if ram_need > ram.size:
        regions = sorted(mem["regions"], key=lambda r: -r["size"])[:3]
        biggest = ", ".join(f"{r['name']} {r['size']} bytes" for r in regions)
        problems.append(
            f"RAM: needs ~{ram_need} bytes (arena {arena} + stack {board.stack_size}), board "
            f"has {ram.size}: {ram_need - ram.size} bytes over budget; largest consumers: "
            f"{biggest}; reduce --max-tokens (now {mem['max_tokens']})"
        )
    if problems:
        fixes = []
        if flash_need > flash.size:
            fixes.append("smaller or quantised weights (--quant) for the flash")
        if ram_need > ram.size:
            fixes.append("fewer tokens per chunk (--max-tokens) for the RAM")
        raise BudgetExceeded(
            f"the model does not fit board {board.name}:\n  "
            + "\n  ".join(problems)
            + f"\n  Fix: {', '.join(fixes)}, or a board with more memory (colibri boards)"
        )


def schemes_that_fit(
    manifest: dict, board: Board, weight_bytes_with: Callable[[str], int]
) -> list[tuple[str, int]]:
    """Which of --quant fp16/int8/int4 would make the weights fit the board's flash:
    [(scheme, weight bytes)], given the weight bytes the model would have with each scheme.
    Schemes that do not shrink the weights are left out."""
    current = int(manifest["memory"]["weight_bytes"])
    fits = []
    for scheme in ("fp16", "int8", "int4"):
        need = weight_bytes_with(scheme)
        if need >= current:
            continue
        trial = json.loads(json.dumps(manifest))
        trial["memory"]["weight_bytes"] = need
        try:
            check_budget(trial, board)
        except BudgetExceeded as exc:
            if "flash:" in str(exc):
                continue
        fits.append((scheme, need))
    return fits


def check_fits(
    model: Model, manifest: dict[str, Any], board: Board, options: GenerateOptions
) -> None:
    """The budget stage: a model against the board, flash and RAM, naming what would fit when
    it does not (the --quant for the weights; a lone layer's experts pinned in RAM, a whole
    transformer's KV cache)."""
    if model.decoder is not None:
        check_transformer_budget(model.decoder, manifest, board)
        return
    try:
        check_budget(manifest, board)
    except BudgetExceeded as exc:
        hint = _quant_suggestion(model.layer, manifest, board, str(exc))
        raise BudgetExceeded(str(exc) + hint) from None
    pinned = int(manifest.get("layout", {}).get("pinned_ram_bytes", 0))
    ram = board.memory.get("ram")
    if pinned and ram is not None:
        need = manifest["memory"]["arena_size"] + board.stack_size + 4096 + pinned
        if need > ram.size:
            raise BudgetExceeded(
                f"the experts pinned in RAM ({pinned} bytes, --ram-budget "
                f"{options.ram_budget}) do not fit board {board.name}: arena + stack + pinned "
                f"experts need ~{need} bytes, the board has {ram.size}; lower --ram-budget to "
                f"at most {max(0, ram.size - need + pinned)}"
            )


def check_transformer_budget(model: MoETransformer, manifest: dict[str, Any], board: Board) -> None:
    """A whole transformer against the board (quantised weights counted as stored), with the
    KV cache's share and the quantisation that would fit."""
    try:
        check_budget(manifest, board)
    except BudgetExceeded as exc:
        kv = manifest["memory"]["kv_cache_bytes"]
        kv_line = ""
        if "RAM:" in str(exc):  # the KV cache only matters when the RAM overflowed
            kv_line = (
                f"\n  KV cache: {kv} bytes for --max-context {manifest['memory']['max_context']}"
            )
        raise BudgetExceeded(
            _for_transformers(str(exc)) + kv_line + _quant_hint(model, manifest, board, str(exc))
        ) from None


def _quant_suggestion(layer: MoELayer, manifest: dict, board: Any, message: str) -> str:
    """When the weights overflow the board's flash: which of --quant fp16/int8/int4 fits."""
    if "flash:" not in message:
        return ""
    fits = schemes_that_fit(manifest, board, lambda scheme: weight_bytes_for(layer, scheme))
    if fits:
        return "\n  Quantised weights fit the flash: " + ", ".join(
            f"--quant {scheme} ({need} bytes of weights)" for scheme, need in fits
        )
    return (
        f"\n  Even --quant int4 ({weight_bytes_for(layer, 'int4')} bytes of weights) does not "
        "fit the flash of this board"
    )


def _for_transformers(message: str) -> str:
    """check_budget's advice in a whole transformer's terms (no token chunks: a context)."""
    return (
        message.replace("reduce --max-tokens (now 1)", "reduce --max-context")
        .replace("fewer tokens per chunk (--max-tokens)", "a shorter --max-context (KV cache)")
        .replace("smaller or quantised weights (--quant)", "--quant / --dense-quant")
    )


def _q8_saving(n_out: int, n_in: int, blocks: bool = False) -> int:
    """Bytes an [out, in] fp32 matrix saves as the int8 struct (one scale per output channel,
    or with `blocks` one per block of 32 inputs)."""
    n_scales = n_out * q8_blocks(n_in) if blocks else n_out
    return 4 * n_out * n_in - q8_channel_dtype(n_out, n_in, n_scales).itemsize


def dense_int8_saving(model: MoETransformer) -> int:
    """Bytes --dense-quant int8 saves: the embedding, LM head and attention projections as
    block-scaled int8 structs, shared experts and dense MLPs per output channel, struct
    padding included (norms, biases, routers and the shared-expert gate stay fp32); of
    `model` only the shapes are read (`colibri inspect` passes shape-only arrays)."""
    c = model.config
    saved = _q8_saving(c.vocab_size, c.d_model, True) * (1 if c.tie_word_embeddings else 2)
    for layer in model.layers:
        a = layer.attention
        for w in (a.wq, a.wk, a.wv, a.wo):
            saved += _q8_saving(int(w.shape[1]), int(w.shape[0]), True)  # stored [out, in]
        ffn = layer.mlp if layer.moe is None else layer.moe.shared_expert
        if ffn is not None:
            f = int(ffn.w1.shape[1])
            saved += 2 * _q8_saving(f, c.d_model) + _q8_saving(c.d_model, f)
    return saved


def _quant_hint(model: MoETransformer, manifest: dict[str, Any], board: Any, message: str) -> str:
    """When fp32 weights overflow the flash: which --quant makes them fit (the routed experts
    of every MoE layer quantised), alone or with --dense-quant int8 (every other matrix)."""
    if "flash:" not in message or "quantization" in manifest:
        return ""
    moes = [layer.moe for layer in model.layers if layer.moe is not None]
    fp32 = sum(int(m.router_w.nbytes) + sum(e.nbytes for e in m.experts) for m in moes)
    others = int(manifest["memory"]["weight_bytes"]) - fp32
    fits = schemes_that_fit(
        manifest, board, lambda scheme: others + sum(weight_bytes_for(m, scheme) for m in moes)
    )
    if fits:
        return "\n  Quantised routed experts fit the flash: " + ", ".join(
            f"--quant {scheme} (~{need} bytes of weights)" for scheme, need in fits
        )
    saved = dense_int8_saving(model)
    fits = schemes_that_fit(
        manifest,
        board,
        lambda scheme: others - saved + sum(weight_bytes_for(m, scheme) for m in moes),
    )
    if not fits:
        return (
            "\n  Even --quant int4 routed experts with --dense-quant int8 do not fit the flash "
            "of this board"
        )
    return "\n  Quantised weights fit the flash: " + ", ".join(
        f"--quant {scheme} --dense-quant int8 (~{need} bytes of weights)" for scheme, need in fits
    )
