"""Emit the C sources of a lone MoE layer (kind "layer") from the Jinja2 templates.

Output: colibri_model.h, colibri_model.c, colibri_weights.h, colibri_weights.c (``.incbin``
directives), colibri_weights.bin (every weight's bytes) and the manifest. Experts are stored in
their scheme (:mod:`colibri.quant.formats`: fp32 in the seed layout, fp16 / int8 / int4
output-channel-major in the formats of colibri_quant.h), 16-byte aligned, one expert's tensors
together, identical experts once, in the order and placement of the plan (hot experts pinned in
RAM and stored first). The manifest carries the analysis (accuracy report), the layout savings
and a per-expert table when there is something to report. Deterministic: the same model and
options give byte-identical files.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..boards import Board
from ..ir.model import Model
from ..ir.moe import MoELayer, model_hash
from ..options import GenerateOptions
from ..plan.memory import TransformerPlan, act_q_group_codes_offset
from ..plan.model import LayerPlan
from ..quant.formats import ROUTER_SCHEME_CODES
from ..quant.model import LayerQuant
from ..reference.accuracy import Analysis
from .cnames import c_ident, c_int_array
from .experts import ffn_kernel, fp32_expert, kernel_params
from .output import WEIGHTS_BLOB, FileContent, banner_context, new_manifest, render_files
from .weights import WeightTable, blob_context


def render_layer(
    model: Model,
    q: LayerQuant,
    analysis: Analysis,
    plan: LayerPlan | TransformerPlan,
    options: GenerateOptions,
    board: Board,
) -> tuple[dict[str, FileContent], dict[str, Any]]:
    """The emit stage of a lone MoE layer: every generated file and the manifest, from the
    quantised weights, the analysis and the plan; returns ({filename: text}, manifest)."""
    assert isinstance(plan, LayerPlan)
    layer = model.layer
    layer.validate()
    c = layer.config
    name = c_ident(options.name)
    prefix = name.upper()
    qplan, qexperts, qrouter = q.plan, q.experts, q.router
    storage = layer.storage_map()
    quantised = q.quantised
    n_slots, slot_floats = plan.n_slots, plan.slot_floats
    bias = layer.experts[0].b1 is not None
    report, heat, accuracy = analysis.report, analysis.heat, analysis.accuracy
    placements = plan.placements
    by_index = {p.index: p for p in placements}

    stored: list[dict[str, Any]] = []
    weights = WeightTable(name)
    isa = board.isa  # the layouts its kernels read (colibri/emit/experts.py)
    kinds: dict[tuple[str, str], dict[str, Any]] = {}

    def kernel(scheme: str, act: str) -> dict[str, Any]:
        """The FFN kernel of an expert kind (and the layouts it reads)."""
        if (scheme, act) not in kinds:
            kinds[scheme, act] = ffn_kernel(
                name,
                prefix,
                scheme,
                act,
                c.d_model,
                c.d_ff,
                c.gated,
                lone_layer=True,
                isa=isa,
                group=plan.memory.max_tokens,
            )
        return kinds[scheme, act]

    # the fp32 experts' kernel ({name}_ffn), written whether or not an expert uses it
    f32_kernel = ffn_kernel(
        name, prefix, "fp32", "fp32", c.d_model, c.d_ff, c.gated, lone_layer=True, isa=isa
    )
    f32_layouts = f32_kernel["layouts"]
    shared_ex = shared_expert(layer, weights, name, prefix, isa)

    what = f"router [{c.n_experts}][{c.d_model}]"
    if qrouter.scheme == "fp32":
        weights.add("router_w", layer.router_w, what)
    else:
        weights.add_codes("router_wq", np.asarray(qrouter.data), f"{what}, {qrouter.scheme}")
        if qrouter.scale is not None:
            weights.add("router_scale", qrouter.scale, f"router scales [{c.n_experts}]")
    if layer.router_b is not None:
        weights.add("router_b", layer.router_b, f"router bias [{c.n_experts}]")
    for idx in [p.index for p in placements]:  # hot experts first
        qe = qexperts[idx]
        pl = by_index[idx]
        const = "" if pl.placement == "ram" else "const "
        pinned = ", pinned in RAM" if pl.placement == "ram" else ""
        users = [i for i, s in enumerate(storage) if s == idx and i != idx]
        shared = f" (also used by experts {', '.join(map(str, users))})" if users else ""
        arg = {"w1": "NULL", "b1": "NULL", "w2": "NULL", "b2": "NULL", "w3": "NULL"}
        # The same pointers taken from the loader's weights (a cache slot under LRU/NONE).
        warg = dict(arg)
        part_bytes = {"w1": "0u", "b1": "0u", "w2": "0u", "b2": "0u", "w3": "0u"}
        k = f32_kernel if qe.scheme == "fp32" else kernel(qe.scheme, qe.act)
        describe = f"expert {idx} {{}}, {qe.scheme}{pinned}{shared}".format  # (part, tensor)
        entries = weights.add_expert(f"e{idx}", qe, k, describe, const)
        for tname, entry in entries.items():
            arg[tname] = entry["ref"]
            if entry["quantised"]:
                warg[tname] = f"({entry['ptype']})(const void *)w->{tname}"
                part_bytes[tname] = f"sizeof({entry['symbol']})"
            else:
                warg[tname] = f"w->{tname}"
        stored.append(
            {
                "index": idx,
                "tensors": list(entries.values()),
                "arg": arg,
                "warg": warg,
                "part_bytes": part_bytes,
                "nbytes": qe.nbytes,
                "scheme": qe.scheme,
                "act": qe.act,
                "kernel": pl.kernel,
                "placement": pl.placement,
                "ffn": k["fn"],
            }
        )
    ffn_kinds = [kinds[k] for k in sorted(kinds)]
    by_index_order = sorted(stored, key=lambda s: int(s["index"]))
    variants = sorted({(s["ffn"], s["kernel"]) for s in stored if s["kernel"] != "default"})
    weight_bytes = weights.nbytes  # router, experts, shared expert and gate
    pinned_ram = sum(int(s["nbytes"]) for s in stored if s["placement"] == "ram")
    fp32_bytes = int(layer.router_w.nbytes) + sum(e.nbytes for e in layer.experts)
    if layer.router_b is not None:
        fp32_bytes += int(layer.router_b.nbytes)
    mhash = model_hash(layer)
    opts = options.as_dict()
    ctx: dict[str, Any] = {
        **banner_context(layer.source, mhash, opts, name),
        "c": c,
        "plan": plan.memory,
        "flags": layer.flags,
        "act_name": "silu" if c.gated else c.activation,
        "router_bias": layer.router_b is not None,
        "router_scheme": qrouter.scheme,
        "router_scheme_code": ROUTER_SCHEME_CODES[qrouter.scheme],
        "stored": by_index_order,
        "stored_layout": stored,
        "stored_by_index": {s["index"]: s for s in stored},
        "kernel_params": {
            s["ffn"]: kernel_params(name, s["scheme"], c.d_model, c.d_ff, bias=True) for s in stored
        },
        "storage": storage,
        "share_values": c_int_array(storage),
        "weight_bytes": weight_bytes,
        "quantised": quantised,
        "typedefs": [weights.typedefs[k] for k in sorted(weights.typedefs)],
        **blob_context(weights, "colibri_weights.h", WEIGHTS_BLOB["layer"]),
        "ffn_kinds": ffn_kinds,
        "variants": variants,
        "act_q_codes": act_q_group_codes_offset(max(c.d_model, c.d_ff), plan.memory.max_tokens),
        # int8-activation kernels quantise the rows of a group of up to max_tokens tokens into
        # their scratch (the calling handle's workspace), after the hidden rows:
        # colibri_model_t.kernel_scratch_bytes
        "kernel_scratch": plan.memory.kernel_scratch,
        "act_q_scratch": plan.memory.act_q_scratch,
        "shared": shared_ex,
        "cache": options.cache,
        "n_slots": n_slots,
        "slot_floats": slot_floats,
        "bias": bias,
        "f32_kernel": f32_kernel,
    }
    files: dict[str, FileContent] = {**render_files("layer", ctx)}
    files[WEIGHTS_BLOB["layer"]] = weights.blob()
    manifest = new_manifest(
        "layer",
        {
            "source": str(layer.source),
            "sha256": mhash,
            "config": c.to_json(),
            "storage_map": storage,
            "unique_experts": len(stored),
        },
        opts,
        plan.memory,
        plan.memory.max_tokens,
        weight_bytes,
        files,
    )
    manifest["experts_bytes"] = [[s["index"], s["nbytes"]] for s in by_index_order]
    if ffn_kinds:  # how each quantised kernel's weights are stored (quant/formats.py LAYOUTS)
        manifest["weight_layouts"] = {k["fn"]: k["layouts"] for k in ffn_kinds}
    if any(s["scheme"] == "fp32" for s in stored):  # and the fp32 experts' ({name}_ffn)
        manifest.setdefault("weight_layouts", {})[f"{name}_ffn"] = f32_layouts
    if report:
        manifest["quantization"] = {
            "schemes": qplan.scheme_counts(),
            "router": qrouter.scheme,
            "fp32_weight_bytes": fp32_bytes,
            "weight_bytes": weight_bytes,
            "bytes_saved": fp32_bytes - weight_bytes,
        }
        manifest["accuracy"] = accuracy
        manifest["layout"] = layout_summary(layer, stored, pinned_ram, options.cache, n_slots)
        manifest["experts"] = [
            {
                "expert": i,
                "stored_as": storage[i],
                "scheme": by_index[storage[i]].scheme,
                "act": by_index[storage[i]].act,
                "placement": by_index[storage[i]].placement,
                "kernel": by_index[storage[i]].kernel,
                "bytes": by_index[storage[i]].nbytes if storage[i] == i else 0,
                "calib_hits": int(heat[i]),
            }
            for i in range(c.n_experts)
        ]
    return files, manifest


def shared_expert(
    layer: MoELayer, weights: WeightTable, name: str, prefix: str, isa: str
) -> dict[str, Any] | None:
    """The shared expert of a Qwen2-MoE style layer (None: none): its fp32 weights (the same
    generated fp32 kernel as the routed experts', with its own d_ff) and sigmoid gate, run on
    every token by ``{name}_shared`` (colibri_model_t.shared_expert)."""
    se = layer.shared_expert
    if se is None:
        return None
    c = layer.config
    d_ff = int(se.w1.shape[1])
    k = ffn_kernel(name, prefix, "fp32", "fp32", c.d_model, d_ff, c.gated, True, isa, shared=True)
    arg = {"w1": "NULL", "b1": "NULL", "w2": "NULL", "b2": "NULL", "w3": "NULL"}
    entries = weights.add_expert("shared", fp32_expert(se), k, "shared expert {}, fp32".format)
    arg.update({n: e["ref"] for n, e in entries.items()})
    decls = [e["decl"] for e in entries.values()]
    gate = "NULL"
    if layer.shared_gate is not None:
        gate = weights.add("shared_gate", layer.shared_gate, f"shared-expert gate [{c.d_model}]")
        decls.append(f"const float {gate}[{c.d_model}]")
    return {"kernel": k, "arg": arg, "gate": gate, "d_ff": d_ff, "decls": decls}


def layout_summary(
    layer: MoELayer, stored: list[dict[str, Any]], pinned_ram: int, cache: str, n_slots: int
) -> dict[str, Any]:
    """Sharing / dedup savings and placement totals."""
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
        "cache": cache,
        "cache_slots": n_slots,
    }
