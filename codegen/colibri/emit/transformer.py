"""Emit a whole decoder-only MoE transformer as C (`colibri generate CKPT --max-context N`).

Output (one directory): transformer_model.h (dimensions, the arena plan as macros, the step
API), transformer_model.c (per-layer table, one ``colibri_model_t`` per MoE block run by the
runtime's router + sparse forward, the token step), transformer_weights.{h,c} (const arrays,
flash on MCUs) and manifest.json with ``"kind": "transformer"`` (the SConstruct then links
runtime_c/runner/lm_main.c). Attention / norm weights are stored one row per output
(``[out][in]``, the Hugging Face layout). Every expert (routed, shared) and dense MLP runs a
generated kernel (:mod:`colibri.emit.experts`, ``templates/common/experts.j2``: the same code
path as a lone layer's experts), fp32 ones in the MoE IR's layout (layout c8 on cores with an
fp32 c8 path). RoPE angles are tabulated in float64 and stored as fp32 cos / sin
tables of ``max_context`` positions. Deterministic.

With ``--quant fp16|int8|int4`` every MoE layer's routed experts are stored in that scheme
(colibri.quant.formats, output-channel-major) and their per-expert kernels
(``<name>_l<L>_expert_<J>``, weights baked in) run the colibri_quant.h matvecs, activations
quantised to int8 per block of 32 in an ``act_q`` arena row (``--act fp32`` keeps them float). The
numpy mirror is :func:`colibri.reference.transformer.forward` with the same
:func:`~colibri.quant.model.quantize_transformer`. ``--dense-quant fp16|int8`` stores every
other matrix in that scheme too (attention q/k/v/o, the shared expert / dense MLPs through the
same generated FFN kernels, the embedding, dequantised one row per token, and the LM head, one
table when tied); ``--router-quant fp16|int8`` stores the routers for the runtime's quantised
router; norms, biases and the shared-expert gate stay fp32. Without these options the output
contains no quantisation code.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..boards import Board
from ..errors import ConfigError
from ..ir.model import Model
from ..ir.transformer import DecoderLayer, MoETransformer, all_tensors, transformer_hash
from ..options import GenerateOptions
from ..plan.memory import TransformerPlan, act_q_codes_offset, max_top_k
from ..plan.model import LayerPlan
from ..quant.formats import ROUTER_SCHEME_CODES, QuantExpert, QuantRouter, QuantTensor
from ..quant.model import TransformerQuant
from ..reference.transformer import rope_tables
from .cnames import c_float, c_ident
from .experts import ffn_kernel, fp32_expert
from .output import WEIGHTS_BLOB, FileContent, banner_context, new_manifest, render_files
from .weights import WeightTable, blob_context


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


#: How each stored expert matrix is described in the weights header, per scheme.
_SHAPES = {"w1": "gate [f][d]", "w2": "down [d][f]", "w3": "up [f][d]"}
_F32_SHAPES = {"w1": "gate [d][f]", "w2": "down [f][d]", "w3": "up [d][f]"}


def _store_ffn(
    w: WeightTable, key: str, qe: QuantExpert, k: dict[str, Any], what: str, shapes: dict
) -> dict[str, str]:
    """The tensors of an expert / dense MLP in the layouts of its kernel `k`; returns their
    references. fp32 in the seed layout is described without its scheme."""

    def describe(part: str, t: QuantTensor | np.ndarray) -> str:
        if qe.scheme == "fp32" and getattr(t, "layout", "rows") == "rows":  # the seed layout
            return f"{what} {_F32_SHAPES[part]}"
        return f"{what} {shapes[part]}, {qe.scheme}"

    return {part: e["ref"] for part, e in w.add_expert(key, qe, k, describe).items()}


def _router_entry(
    w: WeightTable, layer: int, router_w: np.ndarray, qr: QuantRouter | None
) -> dict[str, Any]:
    """The router of an MoE layer as colibri_model_t takes it: fp32 router_w, or router_scheme
    with router_wq (fp16 bits / int8 codes) and, for int8, router_scale per expert."""
    n_experts = router_w.shape[0]
    what = f"router [{n_experts}][d]"
    if qr is None or qr.scheme == "fp32":
        return {"scheme": 0, "w": w.add(f"l{layer}_router", router_w, what)}
    t = QuantTensor(qr.scheme, n_experts, int(router_w.shape[1]), qr.data, qr.scale)
    sym = w.add_stored(f"l{layer}_router", t, f"{what}, {qr.scheme}")["symbol"]
    if qr.scheme == "fp16":
        return {"scheme": ROUTER_SCHEME_CODES["fp16"], "wq": sym, "scale": "NULL"}
    return {"scheme": ROUTER_SCHEME_CODES["int8"], "wq": f"{sym}.q", "scale": f"{sym}.scale"}


def render_transformer(
    ir: Model,
    q: TransformerQuant | None,
    accuracy: dict[str, Any] | None,
    plan: LayerPlan | TransformerPlan,
    opts: GenerateOptions,
    board: Board,
) -> tuple[dict[str, FileContent], dict[str, Any]]:
    """The emit stage of a whole transformer: every generated file and the manifest, from the
    quantised weights (None: all fp32), the accuracy of a calibrated model (None: none) and the
    plan; returns ({filename: text}, manifest)."""
    model = ir.decoder  # checked by the quantise stage (check_supported)
    assert model is not None and isinstance(plan, TransformerPlan)
    c = model.config
    name = c_ident(opts.name)
    max_context = plan.max_context
    quant = q.scheme if q is not None else "fp32"
    dense = q.dense_scheme if q is not None else "fp32"
    eq = q if q is not None and q.scheme != "fp32" else None  # quantised routed experts
    dq = q if q is not None and q.dense_scheme != "fp32" else None  # quantised dense matrices
    kinds: dict[str, dict[str, Any]] = {}
    w = WeightTable(name)
    what = f"token embedding [{c.vocab_size}][{c.d_model}]"
    embed: dict[str, Any]
    if dq is None:
        sym = w.add("embed", model.embed, what)
        embed = {"ref": sym, "symbol": sym}
    else:
        embed = w.add_stored("embed", dq.dense["embed"], f"{what}, {dense}")
    dense_types: dict[str, str] = {}

    def proj(i: int, n: str, arr: np.ndarray, what: str) -> str:
        if dq is None:
            return w.add(f"l{i}_{n}", arr, what)
        e = w.add_stored(f"l{i}_{n}", dq.dense[f"l{i}.{n}"], f"{what}, {dense}")
        dense_types[n] = e["ptype"]
        return str(e["ref"])

    isa = board.isa  # the layouts its kernels read (colibri/emit/experts.py)

    def kind(scheme: str, kact: str, d_ff: int) -> dict[str, Any]:
        k = ffn_kernel(
            name, name.upper(), scheme, kact, c.d_model, d_ff, True, lone_layer=False, isa=isa
        )
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
            mc = m.config
            stored_q = []
            storage = m.storage_map()
            # every scheme, fp32 included, runs a generated kernel per d_ff (emit/experts.py)
            qexperts = (
                eq.experts[i]
                if eq is not None
                else {j: fp32_expert(m.experts[j]) for j in sorted(set(storage))}
            )
            for idx, qe in sorted(qexperts.items()):
                k = kind(qe.scheme, qe.act, mc.d_ff)
                shapes = _F32_SHAPES if qe.scheme == "fp32" else _SHAPES
                args = _store_ffn(w, f"l{i}_e{idx}", qe, k, f"expert {idx}", shapes)
                stored_q.append({"index": idx, "ffn": k["fn"], "args": args})
            kernels = [f"{name}_l{i}_expert_{storage[j]}" for j in range(mc.n_experts)]
            entry["moe"] = len(moes)
            moes.append(
                {
                    "layer": i,
                    "index": len(moes),
                    "c": mc,
                    "flags": m.flags,
                    "router": _router_entry(w, i, m.router_w, q.routers.get(i) if q else None),
                    "stored_q": stored_q,
                    "kernels": kernels,
                }
            )
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
            k = kind(qf.scheme, qf.act, d_ff)
            args = _store_ffn(w, f"l{i}_{prefix}", qf, k, "SwiGLU", _SHAPES)
            entry["dense_ffn"] = {"ffn": k["fn"], "args": args, "scheme": qf.scheme}
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
    cos, sin = rope_tables(c, np.arange(max_context))
    half = c.head_dim // 2
    what = f"RoPE {{}} table [{max_context}][{half}] (theta {c.rope_theta}), from float64"
    w.add("rope_cos", cos[:, :half], what.format("cos"))
    w.add("rope_sin", sin[:, :half], what.format("sin"))
    rope_bytes = w.parts["RoPE tables"]
    weight_bytes = w.nbytes
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
        "weights": w.arrays,
        "qweights": w.qarrays,
        **blob_context(w, "transformer_weights.h", WEIGHTS_BLOB["transformer"]),
        "typedefs": [w.typedefs[k] for k in sorted(w.typedefs)],
        "ffn_kinds": [kinds[k] for k in sorted(kinds)],
        "act_q_codes": act_q_codes_offset(plan.act_q),
        "weight_bytes": weight_bytes,
        "layers": layers,
        "moes": moes,
        "max_top_k": max_top_k(model),
        "lm_head": lm_head,
        "embed": embed,
        "dense": (
            {"scheme": dq.dense_scheme, "act": dq.dense_act, "types": dense_types}
            if dq is not None
            else None
        ),
        "dense_ffn_layers": [entry for entry in layers if entry["dense_ffn"]],
        "architecture": c.architecture,
    }
    files: dict[str, FileContent] = {**render_files("transformer", ctx)}
    files[WEIGHTS_BLOB["transformer"]] = w.blob()
    kv = plan.region("kv_cache").size
    manifest = new_manifest(
        "transformer",
        {
            "source": str(model.source),
            "sha256": mhash,
            "architecture": c.architecture,
            "config": dict(sorted(c.__dict__.items())),
            "moe_layers": [m["layer"] for m in moes],
        },
        options,
        plan,
        1,
        weight_bytes,
        files,
        kv_cache_bytes=kv,
        activation_bytes=plan.arena_size - kv,
        max_context=max_context,
        weight_parts=w.parts,
    )
    if kinds:  # how each quantised kernel's weights are stored (quant/formats.py LAYOUTS)
        manifest["weight_layouts"] = {fn: kinds[fn]["layouts"] for fn in sorted(kinds)}
    if q is not None and opts.scale_search != "mse":
        manifest["options"]["scale_search"] = opts.scale_search
    if accuracy is not None:
        manifest["options"]["calib"] = str(opts.calib or "(array)")
        manifest["accuracy"] = accuracy
    if q is not None:
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
            "weight_bytes": weight_bytes,
            "bytes_saved": fp32_bytes - weight_bytes,
        }
    return files, manifest
