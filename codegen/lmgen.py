"""Emit a whole decoder-only MoE transformer as C (`colibri generate CKPT --max-context N`).

Output (one directory): transformer_model.h (dimensions, the arena plan as macros, the step
API), transformer_model.c (per-layer table, one ``colibri_model_t`` per MoE block run by the
runtime's router + sparse forward, the token step), transformer_weights.{h,c} (const arrays,
flash on MCUs) and manifest.json with ``"kind": "transformer"`` (the SConstruct then links
runtime_c/runner/lm_main.c). Attention / norm / MLP weights are stored one row per output
(``[out][in]``, the Hugging Face layout); expert weights keep the MoE IR's layout, which the
runtime's kernels read. RoPE angles are tabulated in float64 and stored as fp32 cos / sin
tables of ``max_context`` positions. Deterministic and written atomically (emit.write_output).

With ``--quant fp16|int8|int4`` every MoE layer's routed experts are stored in that scheme
(codegen/quantize.py formats, output-channel-major) and run by generated per-expert kernels
(``<name>_l<L>_expert_<J>``, weights baked in) on the colibri_quant.h matvecs, activations
quantised per token to int8 in an ``act_q`` arena row (``--act fp32`` keeps them float). The
numpy mirror is :func:`colibri.transformer.forward` with the same
:func:`~colibri.transformer.quantize_transformer`. ``--dense-quant fp16|int8`` stores every
other matrix in that scheme too (attention q/k/v/o, the shared expert / dense MLPs through the
same generated FFN kernels, the embedding, dequantised one row per token, and the LM head, one
table when tied); ``--router-quant fp16|int8`` stores the routers for the runtime's quantised
router; norms, biases and the shared-expert gate stay fp32. Without these options the output
contains no quantisation code.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__
from .cnames import NameTable, c_float, c_float_array, c_ident
from .emit import MANIFEST, _environment, _tensor_entry, write_output
from .errors import BudgetExceeded, ConfigError
from .quantize import ROUTER_SCHEME_CODES, QuantRouter, QuantTensor, check_scheme
from .tfplan import TransformerPlan, max_top_k, plan_transformer
from .transformer import (
    MoETransformer,
    TransformerQuant,
    check_dense_scheme,
    quantize_transformer,
    rope_tables,
)

KIND = "transformer"
GENERATED_FILES = (
    "transformer_model.h",
    "transformer_model.c",
    "transformer_weights.h",
    "transformer_weights.c",
)
DEFAULT_MAX_CONTEXT = 64
#: Largest --max-context accepted (positions are int32 in C; far above any MCU's RAM).
MAX_CONTEXT_LIMIT = 1 << 20


def transformer_hash(model: MoETransformer) -> str:
    """SHA-256 of the model content: config and every tensor in a fixed order."""
    h = hashlib.sha256(json.dumps(model.config.__dict__, sort_keys=True).encode())
    for _, arr in _all_tensors(model):
        h.update(np.ascontiguousarray(arr, "<f4").tobytes())
    return h.hexdigest()


def _all_tensors(model: MoETransformer) -> list[tuple[str, np.ndarray]]:
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


def _check_supported(model: MoETransformer) -> None:
    for i, layer in enumerate(model.layers):
        moe = layer.moe
        if moe is None:
            continue
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


#: Weight keys of _Weights -> the part of the model they belong to (first match; else norms).
_PARTS = (
    (r"embed", "embedding"),
    (r"lm_head", "LM head"),
    (r"l\d+_(wq|wk|wv|wo|bq|bk|bv|bo)", "attention"),
    (r"l\d+_e\d+_\w+", "routed experts"),
    (r"l\d+_router", "routers"),
    (r"l\d+_(shared|mlp)_\w+", "shared experts / dense MLPs"),
)


class _Weights:
    """Const arrays of the generated weights file, each named once (NameTable)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.names = NameTable()
        self.arrays: list[dict[str, Any]] = []
        self.keys: set[str] = set()
        self.qarrays: list[dict[str, Any]] = []
        self.typedefs: dict[str, str] = {}
        self.parts: dict[str, int] = {}

    def _count(self, key: str, nbytes: int) -> None:
        """Bytes per part of the model (the budget error's largest consumers)."""
        part = next((p for pattern, p in _PARTS if re.fullmatch(pattern, key)), "norms")
        self.parts[part] = self.parts.get(part, 0) + nbytes

    @property
    def nbytes(self) -> int:
        """Bytes of every array added so far."""
        return sum(self.parts.values())

    def add(self, key: str, arr: np.ndarray, what: str) -> str:
        if key in self.keys:
            raise ConfigError(f"generated weight '{key}' would be emitted twice")
        self.keys.add(key)
        sym = self.names.add(key, f"{self.name}_{key}")
        a = np.ascontiguousarray(arr, dtype=np.float32)
        self.arrays.append(
            {"symbol": sym, "size": int(a.size), "init": c_float_array(a), "what": what}
        )
        self._count(key, int(a.nbytes))
        return sym

    def opt(self, key: str, arr: np.ndarray | None, what: str) -> str:
        return "NULL" if arr is None else self.add(key, arr, what)

    def add_quant(self, key: str, t: QuantTensor, what: str) -> dict[str, Any]:
        """A quantised tensor (emit._tensor_entry: its decl, init, typedef and reference)."""
        if key in self.keys:
            raise ConfigError(f"generated weight '{key}' would be emitted twice")
        self.keys.add(key)
        sym = self.names.add(key, f"{self.name}_{key}")
        entry = _tensor_entry(sym, key, t, self.name, "const ")
        if entry["typedef"] is not None:
            self.typedefs[entry["typedef"][0]] = entry["typedef"][1]
        entry["what"] = what
        self.qarrays.append(entry)
        self._count(key, int(entry["nbytes"]))
        return entry


def _router_entry(
    w: _Weights, layer: int, router_w: np.ndarray, qr: QuantRouter | None
) -> dict[str, Any]:
    """The router of an MoE layer as colibri_model_t takes it: fp32 router_w, or router_scheme
    with router_wq (fp16 bits / int8 codes) and, for int8, router_scale per expert."""
    n_experts = router_w.shape[0]
    what = f"router [{n_experts}][d]"
    if qr is None or qr.scheme == "fp32":
        return {"scheme": 0, "w": w.add(f"l{layer}_router", router_w, what)}
    t = QuantTensor(qr.scheme, n_experts, int(router_w.shape[1]), qr.data, qr.scale)
    sym = w.add_quant(f"l{layer}_router", t, f"{what}, {qr.scheme}")["symbol"]
    if qr.scheme == "fp16":
        return {"scheme": ROUTER_SCHEME_CODES["fp16"], "wq": sym, "scale": "NULL"}
    return {"scheme": ROUTER_SCHEME_CODES["int8"], "wq": f"{sym}.q", "scale": f"{sym}.scale"}


def _quant_params(name: str, scheme: str, d: int, f: int) -> str:
    """C parameter list (w1, w2, w3) of a quantised expert FFN of d_model d, d_ff f."""
    if scheme == "int8":
        t_in, t_out = f"const {name}_q8_{f}x{d}_t *", f"const {name}_q8_{d}x{f}_t *"
    else:
        t_in = t_out = "const uint16_t *" if scheme == "fp16" else "const colibri_block_q4_32 *"
    return f"{t_in}w1, {t_out}w2, {t_in}w3"


def render_transformer(
    model: MoETransformer,
    board: str,
    name: str,
    max_context: int,
    quant: str = "fp32",
    act: str | None = None,
    dense: str = "fp32",
    router: str = "fp32",
) -> tuple[dict[str, str], dict[str, Any]]:
    """Render every generated file of a whole transformer; returns ({filename: text}, manifest).
    quant / act: the scheme and activation mode of every MoE layer's routed experts; dense: the
    scheme of every other matrix (fp32, fp16, int8; act applies to int8); router: the routers'
    scheme (fp32, fp16, int8: dequantised per element by the C router)."""
    if isinstance(max_context, bool) or not 1 <= max_context <= MAX_CONTEXT_LIMIT:
        raise ConfigError(
            f"--max-context must be between 1 and {MAX_CONTEXT_LIMIT} positions, got {max_context}"
        )
    _check_supported(model)
    c = model.config
    name = c_ident(name)
    quant = check_scheme(quant)
    dense = check_dense_scheme(dense)
    q: TransformerQuant | None = None
    if quant != "fp32" or dense != "fp32" or router != "fp32":
        q = quantize_transformer(model, quant, act, dense, router)
    if act is not None and (q is None or (q.scheme in ("fp32", "fp16") and dense != "int8")):
        raise ConfigError(
            "--act applies to int8/int4 matrices: pass --quant int8|int4 or --dense-quant int8 too"
        )
    eq = q if q is not None and q.scheme != "fp32" else None  # quantised routed experts
    dq = q if q is not None and q.dense_scheme != "fp32" else None  # quantised dense matrices
    kinds: dict[str, dict[str, Any]] = {}
    w = _Weights(name)
    what = f"token embedding [{c.vocab_size}][{c.d_model}]"
    embed: dict[str, Any]
    if dq is None:
        sym = w.add("embed", model.embed, what)
        embed = {"ref": sym, "symbol": sym}
    else:
        embed = w.add_quant("embed", dq.dense["embed"], f"{what}, {dense}")
    dense_types: dict[str, str] = {}

    def proj(i: int, n: str, arr: np.ndarray, what: str) -> str:
        if dq is None:
            return w.add(f"l{i}_{n}", arr, what)
        e = w.add_quant(f"l{i}_{n}", dq.dense[f"l{i}.{n}"], f"{what}, {dense}")
        dense_types[n] = e["ptype"]
        return str(e["ref"])

    def kind(scheme: str, kact: str, d_ff: int) -> str:
        fn = f"{name}_ffn_{scheme}_{kact}_f{d_ff}"
        kinds[fn] = {
            "fn": fn,
            "scheme": scheme,
            "act": kact,
            "d_ff": d_ff,
            "params": _quant_params(name, scheme, c.d_model, d_ff),
        }
        return fn

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
            "ffn_gate": "NULL",
            "ffn_up": "NULL",
            "ffn_down": "NULL",
            "ffn_d_ff": 0,
            "shared_gate": "NULL",
            "dense_ffn": None,
        }
        ffn = layer.mlp
        if layer.moe is not None:
            m = layer.moe
            mc = m.config
            experts = []
            stored_q = []
            kernels: list[str] = []
            if eq is None:
                for j, e in enumerate(m.experts):
                    assert e.w3 is not None
                    experts.append(
                        {
                            "w1": w.add(f"l{i}_e{j}_w1", e.w1, f"expert {j} gate [d][f]"),
                            "w2": w.add(f"l{i}_e{j}_w2", e.w2, f"expert {j} down [f][d]"),
                            "w3": w.add(f"l{i}_e{j}_w3", e.w3, f"expert {j} up [d][f]"),
                        }
                    )
            else:
                shape = {"w1": "gate [f][d]", "w2": "down [d][f]", "w3": "up [f][d]"}
                for idx, qe in sorted(eq.experts[i].items()):
                    args = {}
                    for tname, t in qe.tensors():
                        assert isinstance(t, QuantTensor)
                        what = f"expert {idx} {shape[tname]}, {qe.scheme}"
                        args[tname] = w.add_quant(f"l{i}_e{idx}_{tname}", t, what)["ref"]
                    fn = kind(qe.scheme, qe.act, mc.d_ff)
                    stored_q.append({"index": idx, "ffn": fn, "args": args})
                storage = m.storage_map()
                kernels = [f"{name}_l{i}_expert_{storage[j]}" for j in range(mc.n_experts)]
            entry["moe"] = len(moes)
            moes.append(
                {
                    "layer": i,
                    "index": len(moes),
                    "c": mc,
                    "flags": m.flags,
                    "router": _router_entry(w, i, m.router_w, q.routers.get(i) if q else None),
                    "experts": experts,
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
        if ffn is not None and dq is not None:
            qf = dq.dense_ffn[i]
            d_ff = int(ffn.w1.shape[1])
            names = {"w1": "gate [f][d]", "w2": "down [d][f]", "w3": "up [f][d]"}
            args = {}
            for tname, t in qf.tensors():
                assert isinstance(t, QuantTensor)
                key = f"l{i}_{prefix}_{tname}"
                args[tname] = w.add_quant(key, t, f"SwiGLU {names[tname]}, {dense}")["ref"]
            entry["dense_ffn"] = {"ffn": kind(qf.scheme, qf.act, d_ff), "args": args}
            entry["ffn_d_ff"] = d_ff
        elif ffn is not None:
            assert ffn.w3 is not None
            entry["ffn_gate"] = w.add(f"l{i}_{prefix}_gate", ffn.w1.T, "SwiGLU gate [f][d]")
            entry["ffn_up"] = w.add(f"l{i}_{prefix}_up", ffn.w3.T, "SwiGLU up [f][d]")
            entry["ffn_down"] = w.add(f"l{i}_{prefix}_down", ffn.w2.T, "SwiGLU down [d][f]")
            entry["ffn_d_ff"] = int(ffn.w1.shape[1])
        layers.append(entry)
    w.add("final_norm", model.final_norm, "final RMSNorm weight")
    lm_head = embed
    if not c.tie_word_embeddings:
        what = f"LM head [{c.vocab_size}][{c.d_model}]"
        if dq is None:
            sym = w.add("lm_head", model.lm_head, what)
            lm_head = {"ref": sym, "symbol": sym}
        else:
            lm_head = w.add_quant("lm_head", dq.dense["lm_head"], f"{what}, {dense}")
    # Widest row quantised to int8 at run time (expert / FFN inputs, attention inputs).
    act_rows = [max(c.d_model, int(k["d_ff"])) for k in kinds.values() if k["act"] == "int8"]
    if dq is not None and dq.dense_act == "int8":
        act_rows.append(max(c.d_model, c.n_heads * c.head_dim))
    act_q = max(act_rows, default=0)
    plan: TransformerPlan = plan_transformer(model, max_context, act_q)
    cos, sin = rope_tables(c, np.arange(max_context))
    half = c.head_dim // 2
    rope_bytes = 2 * max_context * half * 4
    weight_bytes = w.nbytes + rope_bytes
    mhash = transformer_hash(model)
    options: dict[str, Any] = {"board": board, "name": name, "max_context": max_context}
    if q is not None:  # only when asked, so fp32 outputs stay byte-identical
        options["quant"] = quant
        options["act"] = q.act
    if dq is not None:
        options["dense_quant"] = dense
        options["dense_act"] = dq.dense_act
    if q is not None and q.router_scheme != "fp32":
        options["router_quant"] = q.router_scheme
    ctx: dict[str, Any] = {
        "version": __version__,
        "model_source": Path(model.source).name if model.source else "(in memory)",
        "model_hash": mhash,
        "options_line": " ".join(f"{k}={v}" for k, v in sorted(options.items())),
        "name": name,
        "P": name.upper(),
        "c": c,
        "eps": c_float(float(c.rms_norm_eps)),
        "clip": c_float(float(c.clip_qkv)) if c.clip_qkv is not None else None,
        "window": c.sliding_window or 0,
        "plan": plan,
        "max_context": max_context,
        "half": half,
        "rope_cos": c_float_array(cos[:, :half]),
        "rope_sin": c_float_array(sin[:, :half]),
        "weights": w.arrays,
        "qweights": w.qarrays,
        "typedefs": [w.typedefs[k] for k in sorted(w.typedefs)],
        "ffn_kinds": [kinds[k] for k in sorted(kinds)],
        "act_q": act_q,
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
    env = _environment()
    files = {f: env.get_template(f + ".j2").render(filename=f, **ctx) for f in GENERATED_FILES}
    kv = plan.region("kv_cache").size
    manifest: dict[str, Any] = {
        "generator": f"colibri {__version__}",
        "kind": KIND,
        "model": {
            "source": str(model.source),
            "sha256": mhash,
            "architecture": c.architecture,
            "config": dict(sorted(c.__dict__.items())),
            "moe_layers": [m["layer"] for m in moes],
        },
        "options": options,
        "memory": {
            "arena_size": plan.arena_size,
            "kv_cache_bytes": kv,
            "activation_bytes": plan.arena_size - kv,
            "max_context": max_context,
            "max_tokens": 1,
            "regions": [
                {"name": r.name, "offset": r.offset, "size": r.size, "what": r.what}
                for r in plan.regions
            ],
            "weight_bytes": weight_bytes,
            "weight_parts": {**w.parts, "RoPE tables": rope_bytes},
        },
        "files": {f: hashlib.sha256(t.encode()).hexdigest() for f, t in sorted(files.items())},
    }
    if q is not None:
        fp32_bytes = sum(int(a.nbytes) for _, a in _all_tensors(model)) + rope_bytes
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


def generate_transformer(
    model: MoETransformer,
    out_dir: str | os.PathLike[str],
    board_name: str = "host",
    name: str | None = None,
    max_context: int = DEFAULT_MAX_CONTEXT,
    force: bool = False,
    quant: str = "fp32",
    act: str | None = None,
    dense: str = "fp32",
    router: str = "fp32",
) -> tuple[Path, dict[str, Any]]:
    """Render, check against the board's budget (quantised weights counted as stored) and
    write a whole-model directory."""
    from .boards import load_board
    from .size import check_budget

    board = load_board(board_name)
    files, manifest = render_transformer(
        model,
        board.name,
        name or Path(out_dir).resolve().name,
        max_context,
        quant,
        act,
        dense,
        router,
    )
    try:
        check_budget(manifest, board)
    except BudgetExceeded as exc:
        kv = manifest["memory"]["kv_cache_bytes"]
        raise BudgetExceeded(
            f"{_for_transformers(str(exc))}\n  "
            f"KV cache: {kv} bytes for --max-context {max_context}"
            + _quant_hint(model, manifest, board, str(exc))
        ) from None
    return write_output(out_dir, files, manifest, force=force), manifest


def _for_transformers(message: str) -> str:
    """check_budget's advice in a whole transformer's terms (no token chunks: a context)."""
    return message.replace("reduce --max-tokens (now 1)", "reduce --max-context").replace(
        "fewer tokens per chunk (--max-tokens)", "a shorter --max-context (KV cache)"
    )


def _dense_int8_saving(model: MoETransformer) -> int:
    """Bytes --dense-quant int8 saves: each matrix besides the routed experts and routers goes
    from 4 bytes per weight to 1 plus a float scale per output row (struct padding ignored)."""
    vocab_rows = [model.embed] + ([] if model.config.tie_word_embeddings else [model.lm_head])
    saved = sum(3 * a.size - 4 * a.shape[0] for a in vocab_rows)  # [vocab, d]: a row per token
    for layer in model.layers:
        mats = [getattr(layer.attention, n) for n in ("wq", "wk", "wv", "wo")]
        ffn = layer.mlp if layer.moe is None else layer.moe.shared_expert
        if ffn is not None:
            mats += [t for _, t in ffn.tensors() if t.ndim == 2]
        saved += sum(3 * a.size - 4 * a.shape[1] for a in mats)  # [in, out]
    return int(saved)


def _quant_hint(model: MoETransformer, manifest: dict[str, Any], board: Any, message: str) -> str:
    """When fp32 weights overflow the flash: which --quant makes them fit (the routed experts
    of every MoE layer quantised), alone or with --dense-quant int8 (every other matrix)."""
    from .quantize import weight_bytes_for
    from .size import schemes_that_fit

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
    saved = _dense_int8_saving(model)
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


def is_transformer_dir(manifest: dict[str, Any]) -> bool:
    """Whether a generated directory's manifest describes a whole transformer."""
    return manifest.get("kind") == KIND


__all__ = [
    "DEFAULT_MAX_CONTEXT",
    "GENERATED_FILES",
    "KIND",
    "MANIFEST",
    "generate_transformer",
    "is_transformer_dir",
    "render_transformer",
]
