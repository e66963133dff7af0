"""The one emitter: a quantised, planned :class:`~colibri.ir.model.Model` -> its C sources and
manifest (`colibri generate`).

:func:`render` walks the IR. Every MoE block goes through :func:`emit_block`, the one code path
for a block wherever it sits (a lone layer, or layer 17 of a transformer): its router, its
stored experts in their schemes and layouts (:mod:`colibri.quant.formats`), each run by a
generated FFN kernel (:mod:`colibri.emit.experts`, ``templates/common/experts.j2``), the
per-expert wrappers, dispatch table and sharing map and the ``colibri_model_t`` fields the
runtime's router + sparse forward take (the ``block_tables`` / ``block_fields`` macros of
``experts.j2``). A whole decoder adds what surrounds its blocks (:func:`_decoder`): token
embedding, attention, norms, shared experts and dense MLPs (the same generated kernels), the LM
head and RoPE tables (float64, stored as fp32 cos / sin of ``max_context`` positions). Every
tensor goes through the one weights writer (:class:`~colibri.emit.weights.WeightTable`).
Deterministic: the same model and options give byte-identical files.

Output per kind (:data:`colibri.emit.output.GENERATED_FILES`): a lone layer ("layer") writes
colibri_model.{h,c} + colibri_weights.{h,c,bin}; a decoder ("transformer") transformer_model.{h,c}
+ transformer_weights.{h,c,bin} (the SConstruct then links runtime_c/runner/lm_main.c). A lone
layer's experts may be pinned in RAM, kept in flash or streamed through the loader's cache
(``--cache``), have biases and any activation; a transformer's are SwiGLU without biases,
baked into the kernels. A transformer's step itself is the runtime's step functions
(``runtime_c/tiles/colibri_tf_step.h``, inline; the ones the model-file runtime runs too): the
generated C holds its tables (a ``colibri_tf_model_t`` over the const weights and the arena),
its matrix product (one kernel), the per-expert kernels and the loop that calls them. The
manifest carries the analysis (accuracy report, layout savings and a per-expert table for a lone
layer; the accuracy of a calibrated transformer).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..boards import Board
from ..errors import ConfigError
from ..ir.model import Model
from ..ir.moe import ACTIVATIONS, MoELayer, model_hash
from ..ir.transformer import DecoderLayer, MoETransformer, all_tensors, transformer_hash
from ..options import GenerateOptions
from ..plan.memory import TransformerPlan, act_q_group_codes_offset
from ..plan.model import LayerPlan
from ..plan.placement import Placement
from ..quant.formats import ROUTER_SCHEME_CODES, QuantExpert, QuantRouter, QuantTensor
from ..quant.model import LayerQuant, TransformerQuant
from ..reference.accuracy import Analysis
from ..reference.transformer import rope_tables
from .cformat import c_float, model_ident
from .experts import (
    PACK_ISAS,
    PARTS,
    ROW_ACTIVATIONS,
    ffn_kernel,
    fp32_expert,
    kernel_params,
    packed_kernel,
)
from .output import (
    GENERATED_FILES,
    WEIGHTS_BLOB,
    FileContent,
    banner_context,
    new_manifest,
    render_files,
)
from .weights import WeightTable, blob_context

#: The kernel of a kind of expert: (scheme, activation mode, d_ff) -> ffn_kernel's description.
KernelOf = Callable[[str, str, int], dict[str, Any]]


def render(
    model: Model,
    q: Any,
    analysis: Any,
    plan: LayerPlan | TransformerPlan,
    options: GenerateOptions,
    board: Board,
) -> tuple[dict[str, FileContent], dict[str, Any]]:
    """The emit stage: every generated file and the manifest of `model` from its quantised
    weights (a lone layer's LayerQuant; a transformer's TransformerQuant, None when all fp32),
    the analysis stage's result and the plan; returns ({filename: text}, manifest)."""
    name = model_ident(options.name)
    w = WeightTable(name)
    kinds: dict[str, dict[str, Any]] = {}
    if model.decoder is None:
        assert isinstance(plan, LayerPlan)
        ctx, head = _layer(model.layer, q, analysis, plan, options, board, w, kinds)
    else:
        assert isinstance(plan, TransformerPlan)
        ctx, head = _decoder(model.decoder, q, analysis, plan, options, board, w, kinds)
    weights_h = GENERATED_FILES[model.kind][2]
    ctx.update(
        {
            "ffn_kinds": [kinds[k] for k in sorted(kinds)],
            "weight_bytes": w.nbytes,
            **blob_context(w, weights_h, WEIGHTS_BLOB[model.kind]),
        }
    )
    files: dict[str, FileContent] = {**render_files(model.kind, ctx)}
    files[WEIGHTS_BLOB[model.kind]] = w.blob()
    manifest = new_manifest(
        model.kind,
        head["model"],
        head["options"],
        head["plan"],
        head["max_tokens"],
        w.nbytes,
        files,
        **head.get("memory", {}),
    )
    if kinds:  # how each kernel's weights are stored (quant/formats.py LAYOUTS)
        manifest["weight_layouts"] = {fn: kinds[fn]["layouts"] for fn in sorted(kinds)}
    head["finish"](manifest, w)
    return files, manifest


def emit_block(
    w: WeightTable,
    m: MoELayer,
    key: str,
    sym: str,
    qexperts: dict[int, QuantExpert],
    qrouter: QuantRouter | None,
    kernel: KernelOf,
    placements: list[Placement] | None = None,
    cache: str = "pinned",
    macros: str = "",
) -> dict[str, Any]:
    """One MoE block, wherever it sits: its router and stored experts added to `w` under the
    key prefix `key` (a lone layer's "", layer L's "l<L>_"), each expert run by the generated
    kernel `kernel` gives for its kind, wrapped as ``<sym>_expert_<J>`` (sym: the block's C
    prefix) for the block's dispatch table. `placements` (the plan's, hottest first; None: every
    stored expert in flash, in index order, default kernel) and `cache` (the loader's policy:
    other than "pinned", the wrappers take the weights the loader hands them); `macros`: the
    prefix of the header's dimension macros (a lone layer's), else the numbers. Returns what
    experts.j2's block_tables / block_fields write: wrappers, tables, colibri_model_t fields."""
    c = m.config
    storage = m.storage_map()
    if placements is None:
        placements = [
            Placement(j, qe.scheme, qe.act, "flash", "default", qe.nbytes, 0)
            for j, qe in sorted(qexperts.items())
        ]
    router = _router(w, key, m, qrouter)
    stored: list[dict[str, Any]] = []
    for pl in placements:
        idx, qe = pl.index, qexperts[pl.index]
        k = kernel(qe.scheme, qe.act, c.d_ff)
        const = "" if pl.placement == "ram" else "const "
        pinned = {"ram": ", pinned in RAM", "psram": ", in PSRAM"}.get(pl.placement, "")
        users = [i for i, s in enumerate(storage) if s == idx and i != idx]
        shared = f" (also used by experts {', '.join(map(str, users))})" if users else ""

        arg = dict.fromkeys(PARTS, "NULL")
        warg = dict(arg)  # the same pointers taken from the loader's weights (a cache slot)
        part_bytes = dict.fromkeys(PARTS, "0u")
        for part, entry in w.add_expert(
            f"{key}e{idx}",
            qe,
            k,
            _describe(f"expert {idx}", f"{qe.scheme}{pinned}{shared}"),
            const,
            psram=pl.placement == "psram",
        ).items():
            arg[part] = entry["ref"]
            warg[part] = f"w->{part}"
            if entry["quantised"]:
                warg[part] = f"({entry['ptype']})(const void *)w->{part}"
                part_bytes[part] = f"sizeof({entry['symbol']})"
        params = [p for p in PARTS if k["bias"] or p[0] == "w"]
        # a packed kernel (host) first takes the expert's row of <sym>_packed
        pk = [f"{sym}_packed[{idx}]"] if k.get("pack") else []
        stored.append(
            {
                "index": idx,
                "arg": arg,
                "args": ", ".join(pk + [arg[p] for p in params]),
                "pack": k.get("pack"),
                "wargs": ", ".join(warg[p] for p in params),
                "part_bytes": part_bytes,
                "nbytes": pl.nbytes,  # as stored (layout padding included: the plan's)
                "scheme": qe.scheme,
                "act": qe.act,
                "kernel": pl.kernel,
                "placement": pl.placement,
                "ffn": k["fn"],
                "call": k["fn"] if pl.kernel == "default" else f"{k['fn']}_{pl.kernel}",
            }
        )
    by_index = {s["index"]: s for s in stored}
    dims = ("n_experts", "d_model", "d_ff", "top_k")
    return {
        "c": c,
        "dims": {d: f"{macros}_{d.upper()}" if macros else getattr(c, d) for d in dims},
        "sym": sym,
        "activation": f"COLIBRI_ACT_{ACTIVATIONS[c.activation_code].upper()}",
        "flags": m.flags,
        "router": router,
        "stored": stored,
        "by_index": by_index,
        "storage": storage,
        # the dispatch table and sharing map, one expert a line
        "kernel_lines": [(f"{sym}_expert_{j},", f"expert {i}") for i, j in enumerate(storage)],
        "share_lines": [(f"{j},", f"expert {i}") for i, j in enumerate(storage)],
        "cache": cache,
        "wrappers": [by_index[j] for j in sorted(by_index)],
        "table": [by_index[storage[i]] for i in range(c.n_experts)],
        "stored_table": None,  # colibri_model_t.stored: none, the weights are in the kernels
        "pack": any(s.get("pack") for s in stored),  # a <sym>_packed table (host)
        "where": "" if key == "" else f" (layer {key[1:-1]})",
    }


def _describe(what: str, tail: str) -> Callable[[str, QuantTensor | np.ndarray], str]:
    """How each stored tensor of an expert is described in the weights files: what, the part,
    its shape ([f][d] output-channel-major, [d][f] in the seed layout for w1 / w3), tail."""

    def describe(part: str, t: QuantTensor | np.ndarray) -> str:
        seed = isinstance(t, np.ndarray) or (t.scheme == "fp32" and t.layout == "rows")
        shape = "[d][f]" if (part == "w2") != seed else "[f][d]"
        if part[0] == "b":
            shape = "[f]" if part == "b1" else "[d]"
        return f"{what} {part} {shape}, {tail}"

    return describe


def _router(w: WeightTable, key: str, m: MoELayer, qr: QuantRouter | None) -> dict[str, Any]:
    """The router of a block as colibri_model_t takes it: fp32 ``<key>router_w``, or with
    --router-quant ``<key>router_wq`` (fp16 bits / int8 codes) and, for int8,
    ``<key>router_scale`` per expert; a bias ``<key>router_b``."""
    n, d = m.config.n_experts, m.config.d_model
    what = f"router [{n}][{d}]"
    scheme = qr.scheme if qr is not None else "fp32"
    r: dict[str, Any] = {"scheme": scheme, "code": ROUTER_SCHEME_CODES[scheme], "scale": None}
    if qr is None or scheme == "fp32":
        r["w"] = w.add(f"{key}router_w", m.router_w, what)
    else:
        r["wq"] = w.add_codes(f"{key}router_wq", np.asarray(qr.data), f"{what}, {scheme}")
        if qr.scale is not None:
            r["scale"] = w.add(f"{key}router_scale", qr.scale, f"router scales [{n}]")
    r["b"] = w.opt(f"{key}router_b", m.router_b, f"router bias [{n}]")
    return r


# -- a lone MoE layer ---------------------------------------------------------------------------


def _layer(
    layer: MoELayer,
    q: LayerQuant,
    analysis: Analysis,
    plan: LayerPlan,
    options: GenerateOptions,
    board: Board,
    w: WeightTable,
    kinds: dict[str, dict[str, Any]],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The context and manifest head of a lone MoE layer."""
    layer.validate()
    c = layer.config
    name = w.name
    prefix = name.upper()
    isa = options.kernel_isa(board.isa)  # the layouts its kernels read (emit/experts.py)

    def kernel(scheme: str, act: str, d_ff: int) -> dict[str, Any]:
        k = ffn_kernel(
            name, prefix, scheme, act, c.d_model, d_ff, c.gated, True, isa, plan.memory.max_tokens
        )
        if scheme != "fp32":
            kinds.setdefault(k["fn"], k)
        return k

    # the fp32 experts' kernel ({name}_ffn): written only when an expert is stored in fp32
    f32_kernel = kernel("fp32", "fp32", c.d_ff)
    block = emit_block(
        w, layer, "", name, q.experts, q.router, kernel, plan.placements, options.cache, prefix
    )
    shared_ex = shared_expert(layer, w, name, prefix, isa)
    stored = block["stored"]
    fp32_used = any(s["scheme"] == "fp32" for s in stored)
    act_name = "silu" if c.gated else c.activation
    by_index = block["by_index"]
    storage = block["storage"]
    mhash = model_hash(layer)
    opts = options.as_dict()
    variants = sorted({(s["ffn"], s["kernel"]) for s in stored if s["kernel"] != "default"})
    quantised = q.quantised
    memory = plan.memory
    ctx: dict[str, Any] = {
        **banner_context(layer.source, mhash, opts, name),
        "c": c,
        "plan": memory,
        "block": block,
        "act_name": act_name,
        # {name}_act: called by the fp32 kernels and the quantised relu kinds with float
        # activations; int8-activation relu runs colibri_qi_relu_row, the gated kinds
        # colibri_swiglu_row and the other activations {name}_act_row (colibri_math.h)
        "act_used": fp32_used
        or shared_ex is not None
        or any(
            not k["gated"] and k["act"] != "int8" and act_name == "relu" for k in kinds.values()
        ),
        "row_acts": ROW_ACTIVATIONS,
        "act_row_used": act_name in ROW_ACTIVATIONS and any(not k["gated"] for k in kinds.values()),
        "quantised": quantised,
        "kernel_params": {  # the kind's own (its weight types name their stored row widths)
            s["ffn"]: kinds[s["ffn"]]["params"]
            if s["ffn"] in kinds
            else kernel_params(name, s["scheme"], c.d_model, c.d_ff, bias=True)
            for s in stored
        },
        "variants": variants,
        "act_q_codes": act_q_group_codes_offset(max(c.d_model, c.d_ff), memory.max_tokens),
        # codes per quantised row: wider than d_model / d_ff where the layouts pad their rows
        "act_q_row": max(
            [c.d_model, c.d_ff] + [max(k["widths"]) for k in kinds.values() if k["act"] == "int8"]
        ),
        # int8-activation kernels quantise the rows of a group of up to max_tokens tokens into
        # their scratch (the calling handle's workspace), after the hidden rows:
        # colibri_model_t.kernel_scratch_bytes
        "kernel_scratch": memory.kernel_scratch,
        "act_q_scratch": memory.act_q_scratch,
        "shared": shared_ex,
        "cache": options.cache,
        "n_slots": plan.n_slots,
        "slot_floats": plan.slot_floats,
        "bias": layer.experts[0].b1 is not None,
        "f32_kernel": f32_kernel if fp32_used else None,
    }
    # colibri_model_t.stored: where the loader finds each expert (fp32 pointers, or the
    # quantised parts and their sizes to copy into a cache slot); none for pinned quantised
    if not quantised or options.cache != "pinned":
        block["stored_table"] = "parts" if quantised else "f32"

    def finish(manifest: dict[str, Any], w: WeightTable) -> None:
        by_order = sorted(stored, key=lambda s: int(s["index"]))
        manifest["experts_bytes"] = [[s["index"], s["nbytes"]] for s in by_order]
        if fp32_used:  # and the fp32 experts' ({name}_ffn)
            manifest.setdefault("weight_layouts", {})[f"{name}_ffn"] = f32_kernel["layouts"]
        if not analysis.report:
            return
        fp32_bytes = int(layer.router_w.nbytes) + sum(e.nbytes for e in layer.experts)
        if layer.router_b is not None:
            fp32_bytes += int(layer.router_b.nbytes)
        manifest["quantization"] = {
            "schemes": q.plan.scheme_counts(),
            "router": q.router.scheme,
            "fp32_weight_bytes": fp32_bytes,
            "weight_bytes": w.nbytes,
            "bytes_saved": fp32_bytes - w.nbytes,
        }
        manifest["accuracy"] = analysis.accuracy
        pinned_ram = sum(int(s["nbytes"]) for s in stored if s["placement"] == "ram")
        in_psram = sum(int(s["nbytes"]) for s in stored if s["placement"] == "psram")
        manifest["layout"] = layout_summary(
            layer, stored, pinned_ram, options.cache, plan.n_slots, in_psram
        )
        manifest["experts"] = [
            {
                "expert": i,
                "stored_as": storage[i],
                "scheme": by_index[storage[i]]["scheme"],
                "act": by_index[storage[i]]["act"],
                "placement": by_index[storage[i]]["placement"],
                "kernel": by_index[storage[i]]["kernel"],
                "bytes": by_index[storage[i]]["nbytes"] if storage[i] == i else 0,
                "calib_hits": int(analysis.heat[i]),
            }
            for i in range(c.n_experts)
        ]

    head = {
        "model": {
            "source": str(layer.source),
            "sha256": mhash,
            "config": c.to_json(),
            "storage_map": storage,
            "unique_experts": len(stored),
        },
        "options": opts,
        "plan": memory,
        "max_tokens": memory.max_tokens,
        "finish": finish,
    }
    return ctx, head


def shared_expert(
    layer: MoELayer, weights: WeightTable, name: str, prefix: str, isa: str
) -> dict[str, Any] | None:
    """The shared expert of a Qwen2-MoE style lone layer (None: none): its fp32 weights (the
    same generated fp32 kernel as the routed experts', with its own d_ff) and sigmoid gate, run
    on every token by ``{name}_shared`` (colibri_model_t.shared_expert)."""
    se = layer.shared_expert
    if se is None:
        return None
    c = layer.config
    d_ff = int(se.w1.shape[1])
    k = ffn_kernel(name, prefix, "fp32", "fp32", c.d_model, d_ff, c.gated, True, isa, shared=True)
    arg = dict.fromkeys(PARTS, "NULL")
    entries = weights.add_expert("shared", fp32_expert(se), k, "shared expert {}, fp32".format)
    arg.update({n: e["ref"] for n, e in entries.items()})
    gate = "NULL"
    if layer.shared_gate is not None:
        gate = weights.add("shared_gate", layer.shared_gate, f"shared-expert gate [{c.d_model}]")
    return {"kernel": k, "args": ", ".join(arg[p] for p in PARTS), "gate": gate, "d_ff": d_ff}


def layout_summary(
    layer: MoELayer,
    stored: list[dict[str, Any]],
    pinned_ram: int,
    cache: str,
    n_slots: int,
    psram: int = 0,
) -> dict[str, Any]:
    """Sharing / dedup savings and placement totals (psram_bytes only when some expert is in
    external PSRAM)."""
    c = layer.config
    per_expert = [int(s["nbytes"]) for s in stored]
    unshared = int(np.mean(per_expert)) * c.n_experts if per_expert else 0
    shared = sum(per_expert)
    explicit = layer.sharing_map is not None
    return {
        "unique_experts": len(stored),
        "n_experts": c.n_experts,
        "sharing": "expert_sharing_map" if explicit else "content hash",
        "expert_bytes_unshared": unshared,
        "expert_bytes_stored": shared,
        "sharing_saved_bytes": unshared - shared,
        "sharing_saved_percent": round(100.0 * (unshared - shared) / unshared, 1)
        if unshared
        else 0.0,
        "alignment": 16,
        "order": [int(s["index"]) for s in stored],
        "pinned_ram_bytes": pinned_ram,
        **({"psram_bytes": psram} if psram else {}),
        "cache": cache,
        "cache_slots": n_slots,
    }


# -- a whole decoder ----------------------------------------------------------------------------


def check_supported(model: MoETransformer) -> None:
    for i, layer in enumerate(model.layers):
        check_supported_layer(i, layer)


def check_supported_layer(i: int, layer: DecoderLayer) -> None:
    """Refuse decoder layer `i` when the generated transformer (and the container) cannot run
    it: biases in the router or experts, non-SwiGLU experts, a shared expert with biases."""
    moe = layer.moe
    if moe is not None:
        if moe.router_b is not None or (moe.experts and moe.experts[0].b1 is not None):
            raise ConfigError(
                f"layer {i}: router / expert biases are not supported by the generated "
                f"transformer (Mixtral, Qwen2-MoE and OLMoE have none)"
            )
        if not moe.config.gated:
            raise ConfigError(f"layer {i}: the generated transformer needs SwiGLU experts")
        se = moe.shared_expert
        if se is not None and (se.b1 is not None or se.b2 is not None):
            raise ConfigError(f"layer {i}: a shared expert with biases is not supported")


def _decoder(
    model: MoETransformer,
    q: TransformerQuant | None,
    accuracy: dict[str, Any] | None,
    plan: TransformerPlan,
    opts: GenerateOptions,
    board: Board,
    w: WeightTable,
    kinds: dict[str, dict[str, Any]],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The context and manifest head of a whole decoder: its MoE blocks by :func:`emit_block`,
    and what surrounds them. Attention / norm weights are stored one row per output
    (``[out][in]``, the Hugging Face layout); with --dense-quant every other matrix in that
    scheme (the embedding dequantised one row per token, the LM head one table when tied)."""
    c = model.config
    name = w.name
    max_context = plan.max_context
    quant = q.scheme if q is not None else "fp32"
    dense = q.dense_scheme if q is not None else "fp32"
    eq = q if q is not None and q.scheme != "fp32" else None  # quantised routed experts
    dq = q if q is not None and q.dense_scheme != "fp32" else None  # quantised dense matrices
    what = f"token embedding [{c.vocab_size}][{c.d_model}]"
    embed: dict[str, Any]
    if dq is None:
        sym = w.add("embed", model.embed, what)
        embed = {"ref": sym, "symbol": sym}
    else:
        embed = w.add_stored("embed", dq.dense["embed"], f"{what}, {dense}")

    def proj(i: int, n: str, arr: np.ndarray, what: str) -> str:
        if dq is None:
            return w.add(f"l{i}_{n}", arr, what)
        e = w.add_stored(f"l{i}_{n}", dq.dense[f"l{i}.{n}"], f"{what}, {dense}")
        return str(e["ref"])

    isa = opts.kernel_isa(board.isa)  # the layouts its kernels read (emit/experts.py)
    pack = board.isa in PACK_ISAS  # int8 / int4 matrices packed at setup where the CPU has them

    def kernel(scheme: str, kact: str, d_ff: int) -> dict[str, Any]:
        k = ffn_kernel(name, name.upper(), scheme, kact, c.d_model, d_ff, True, False, isa)
        if pack and scheme in ("int8", "int4") and kact == "int8":
            k = packed_kernel(k)
        kinds[k["fn"]] = k
        return k

    layers: list[dict[str, Any]] = []
    moes: list[dict[str, Any]] = []
    for i, layer in enumerate(model.layers):
        a = layer.attention
        entry: dict[str, Any] = {
            "index": i,
            "input_norm": w.add(f"l{i}_input_norm", layer.input_norm, "RMSNorm weight"),
            "wq": proj(i, "wq", a.wq.T, "q_proj [out][in]"),
            "wk": proj(i, "wk", a.wk.T, "k_proj [out][in]"),
            "wv": proj(i, "wv", a.wv.T, "v_proj [out][in]"),
            "wo": proj(i, "wo", a.wo.T, "o_proj [out][in]"),
            "bq": w.opt(f"l{i}_bq", a.bq, "q_proj bias"),
            "bk": w.opt(f"l{i}_bk", a.bk, "k_proj bias"),
            "bv": w.opt(f"l{i}_bv", a.bv, "v_proj bias"),
            "bo": w.opt(f"l{i}_bo", a.bo, "o_proj bias"),
            "q_norm": w.opt(f"l{i}_q_norm", a.q_norm, "QK-norm of the queries"),
            "k_norm": w.opt(f"l{i}_k_norm", a.k_norm, "QK-norm of the keys"),
            "post_norm": w.add(f"l{i}_post_norm", layer.post_norm, "RMSNorm weight"),
            "moe": -1,
            "ffn_d_ff": 0,
            "shared_gate": "NULL",
            "dense_ffn": None,
        }
        ffn = layer.mlp
        if layer.moe is not None:
            m = layer.moe
            # every scheme, fp32 included, runs a generated kernel per d_ff (emit/experts.py)
            qexperts = (
                eq.experts[i]
                if eq is not None
                else {j: fp32_expert(m.experts[j]) for j in sorted(set(m.storage_map()))}
            )
            qrouter = q.routers.get(i) if q is not None else None
            block = emit_block(w, m, f"l{i}_", f"{name}_l{i}", qexperts, qrouter, kernel)
            entry["moe"] = len(moes)
            moes.append({**block, "layer": i, "index": len(moes)})
            ffn = m.shared_expert
            if m.shared_gate is not None:
                entry["shared_gate"] = w.add(
                    f"l{i}_shared_expert_gate", m.shared_gate, "shared-expert sigmoid gate [d]"
                )
            prefix = "shared"
        else:
            prefix = "mlp"
        if ffn is not None:  # the same generated kernels as the routed experts
            assert ffn.w3 is not None
            qf = dq.dense_ffn[i] if dq is not None else fp32_expert(ffn)
            d_ff = int(ffn.w1.shape[1])
            k = kernel(qf.scheme, qf.act, d_ff)

            args = {
                p: e["ref"]
                for p, e in w.add_expert(
                    f"l{i}_{prefix}", qf, k, _describe("SwiGLU", qf.scheme)
                ).items()
            }
            entry["dense_ffn"] = {"ffn": k["fn"], "args": args, "scheme": qf.scheme, "pack": None}
            if k.get("pack"):  # the layer's row of <name>_mlp_packed (the packed copies)
                entry["dense_ffn"]["pack"] = {**k["pack"], "pk": f"{name}_mlp_packed[{i}]"}
            entry["ffn_d_ff"] = d_ff
        layers.append(entry)
    w.add("final_norm", model.final_norm, "final RMSNorm weight")
    lm_head = embed
    if not c.tie_word_embeddings:
        what = f"LM head [{c.vocab_size}][{c.d_model}]"
        if dq is None:
            sym = w.add("lm_head", model.lm_head, what)
            lm_head = {"ref": sym, "symbol": sym}
        else:
            lm_head = w.add_stored("lm_head", dq.dense["lm_head"], f"{what}, {dense}")
    # host: the expert / dense-MLP matrices its setup packs (<name>_pack), w1, w2, w3 each
    dense_pack = (
        pack and dq is not None and dq.dense_scheme in ("int8", "int4") and dq.dense_act == "int8"
    )
    pack_list: list[dict[str, Any]] = []

    def pack_parts(refs: dict[str, Any], pk: str, scheme: str, d_ff: int) -> None:
        shapes = {"w1": (d_ff, c.d_model), "w2": (c.d_model, d_ff), "w3": (d_ff, c.d_model)}
        for j, part in enumerate(("w1", "w2", "w3")):
            ref = str(refs[part])
            code = f"{ref[1:]}.q" if ref.startswith("&") else f"({ref})->q"
            pack_list.append(
                {
                    "kind": "COLIBRI_PACK_Q8" if scheme == "int8" else "COLIBRI_PACK_Q4",
                    "n_out": str(shapes[part][0]),
                    "n_in": str(shapes[part][1]),
                    "w": code if scheme == "int8" else ref,
                    "dst": f"&{pk}[{j}]",
                }
            )

    for blk in moes:
        for s in blk["wrappers"]:
            if s["pack"]:
                pk = f"{blk['sym']}_packed[{s['index']}]"
                pack_parts(s["arg"], pk, s["scheme"], blk["c"].d_ff)
    for entry in layers:
        dff = entry["dense_ffn"]
        if dff is not None and dff["pack"]:
            pack_parts(dff["args"], dff["pack"]["pk"], dff["scheme"], entry["ffn_d_ff"])
    cos, sin = rope_tables(c, np.arange(max_context))
    half = c.head_dim // 2
    what = f"RoPE {{}} table [{max_context}][{half}] (theta {c.rope_theta}), from float64"
    w.add("rope_cos", cos[:, :half], what.format("cos"))
    w.add("rope_sin", sin[:, :half], what.format("sin"))
    rope_bytes = w.parts["RoPE tables"]
    mhash = transformer_hash(model)
    options: dict[str, Any] = {"board": board.name, "name": name, "max_context": max_context}
    if q is not None:  # only when asked, so fp32 outputs stay byte-identical
        options["quant"] = quant
        options["act"] = q.act
    if dq is not None:
        options["dense_quant"] = dense
        options["dense_act"] = dq.dense_act
    if q is not None and q.router_scheme != "fp32":
        options["router_quant"] = q.router_scheme
    ctx: dict[str, Any] = {
        **banner_context(model.source, mhash, options, name),
        "c": c,
        "eps": c_float(float(c.rms_norm_eps)),
        "clip": c_float(float(c.clip_qkv)) if c.clip_qkv is not None else None,
        "window": c.sliding_window or 0,
        "plan": plan,
        "max_context": max_context,
        "half": half,
        "act_q_codes": plan.act_q_codes,
        "layers": layers,
        "moes": moes,
        "max_top_k": plan.max_top_k,
        "lm_head": lm_head,
        "embed": embed,
        "dense": ({"scheme": dq.dense_scheme, "act": dq.dense_act} if dq is not None else None),
        "dense_ffn_layers": [entry for entry in layers if entry["dense_ffn"]],
        "pack": bool(pack_list) or dense_pack,  # something to pack (host): <name>_pack
        "pack_list": pack_list,
        "pack_items": max(1, len(pack_list) + (4 * len(layers) + 1 if dense_pack else 0)),
        "architecture": c.architecture,
    }

    def finish(manifest: dict[str, Any], w: WeightTable) -> None:
        if q is not None and opts.scale_search != "mse":
            manifest["options"]["scale_search"] = opts.scale_search
        if accuracy is not None:  # a calibrated transformer's (the analyse stage)
            manifest["options"]["calib"] = str(opts.calib or "(array)")
            if opts.calib_method != "importance":
                manifest["options"]["calib_method"] = opts.calib_method
            manifest["accuracy"] = accuracy
        if q is None:
            return
        fp32_bytes = sum(int(a.nbytes) for _, a in all_tensors(model)) + rope_bytes
        others = "attention, shared experts, dense MLPs, embedding and LM head"
        manifest["quantization"] = {
            "scheme": quant,
            "act": q.act,
            "dense_scheme": q.dense_scheme,
            "dense_act": q.dense_act,
            "router_scheme": q.router_scheme,
            "what": f"routed experts of every MoE layer: {quant}; {others}: {dense}; routers: "
            f"{q.router_scheme}; norms, biases and the shared-expert gate: fp32",
            "fp32_weight_bytes": fp32_bytes,
            "weight_bytes": w.nbytes,
            "bytes_saved": fp32_bytes - w.nbytes,
        }

    kv = plan.region("kv_cache").size
    head = {
        "model": {
            "source": str(model.source),
            "sha256": mhash,
            "architecture": c.architecture,
            "config": dict(sorted(c.__dict__.items())),
            "moe_layers": [m["layer"] for m in moes],
        },
        "options": options,
        "plan": plan,
        "max_tokens": 1,
        "memory": {
            "kv_cache_bytes": kv,
            "activation_bytes": plan.arena_size - kv,
            "max_context": max_context,
            "weight_parts": w.parts,
            **_packed_memory(pack_list, layers, c, dense_pack, dense),
        },
        "finish": finish,
    }
    return ctx, head


def _packed_bytes(kind: str, n_out: int, n_in: int) -> int:
    """Bytes of colibri_x86_packed_bytes for one matrix (AVX-512 VNNI; 0: it does not pack)."""
    nb = n_in // 32
    if n_out < 16 or n_in <= 0 or n_in % 32 != 0 or nb > 4096:
        return 0
    regs = {"COLIBRI_PACK_Q4": 9 * ((nb + 1) // 2), "COLIBRI_PACK_Q8B": 9 * nb}.get(kind, 8 * nb)
    return (n_out + 15) // 16 * regs * 64


def _packed_memory(
    pack_list: list[dict[str, Any]],
    layers: list[dict[str, Any]],
    c: Any,
    dense_pack: bool,
    dense: str = "int8",
) -> dict[str, Any]:
    """A host model's packed copies (manifest memory.packed_bytes_max, none elsewhere): the one
    block its setup allocates on a CPU with packed kernels (colibri_pack_matrices), 0 bytes on
    one without; the const originals stay in the executable (out of the resident set)."""
    mats = [(p["kind"], int(p["n_out"]), int(p["n_in"])) for p in pack_list]
    if dense_pack:
        hq, hkv = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
        kind = "COLIBRI_PACK_Q4" if dense == "int4" else "COLIBRI_PACK_Q8B"
        for _ in layers:
            mats += [(kind, n, c.d_model) for n in (hq, hkv, hkv)]
            mats.append((kind, c.d_model, hq))
        mats.append((kind, c.vocab_size, c.d_model))
    total = 0
    for kind, n_out, n_in in mats:
        b = _packed_bytes(kind, n_out, n_in)
        if b:
            total = (total + 63) // 64 * 64 + b
    if total == 0:
        return {}
    huge = 2 << 20
    return {
        "packed_bytes_max": (total + huge - 1) // huge * huge,
        "packed_what": "heap copies of the int8 / int4 matrices in the layout of the CPU's packed "
        "kernels, allocated by setup on x86-64 with AVX-512 VNNI (0 bytes elsewhere), freed by "
        "<name>_lm_release; the const originals stay in the executable, out of the resident set",
    }
