"""Emit a whole decoder-only MoE transformer as C (`colibri generate CKPT --max-context N`).

Output (one directory): transformer_model.h (dimensions, the arena plan as macros, the step
API), transformer_model.c (per-layer table, one ``colibri_model_t`` per MoE block run by the
runtime's router + sparse forward, the token step), transformer_weights.{h,c} (const arrays,
flash on MCUs) and manifest.json with ``"kind": "transformer"`` (the SConstruct then links
runtime_c/runner/lm_main.c). Attention / norm / MLP weights are stored one row per output
(``[out][in]``, the Hugging Face layout); expert weights keep the MoE IR's layout, which the
runtime's kernels read. RoPE angles are tabulated in float64 and stored as fp32 cos / sin
tables of ``max_context`` positions. Deterministic and written atomically (emit.write_output).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__
from .cnames import NameTable, c_float, c_float_array, c_ident
from .emit import MANIFEST, _environment, write_output
from .errors import BudgetExceeded, ConfigError
from .tfplan import TransformerPlan, max_top_k, plan_transformer
from .transformer import MoETransformer, rope_tables

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


class _Weights:
    """Const arrays of the generated weights file, each named once (NameTable)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.names = NameTable()
        self.arrays: list[dict[str, Any]] = []
        self.nbytes = 0
        self.keys: set[str] = set()

    def add(self, key: str, arr: np.ndarray, what: str) -> str:
        if key in self.keys:
            raise ConfigError(f"generated weight '{key}' would be emitted twice")
        self.keys.add(key)
        sym = self.names.add(key, f"{self.name}_{key}")
        a = np.ascontiguousarray(arr, dtype=np.float32)
        self.arrays.append(
            {"symbol": sym, "size": int(a.size), "init": c_float_array(a), "what": what}
        )
        self.nbytes += int(a.nbytes)
        return sym

    def opt(self, key: str, arr: np.ndarray | None, what: str) -> str:
        return "NULL" if arr is None else self.add(key, arr, what)


def render_transformer(
    model: MoETransformer, board: str, name: str, max_context: int
) -> tuple[dict[str, str], dict[str, Any]]:
    """Render every generated file of a whole transformer; returns ({filename: text}, manifest)."""
    if isinstance(max_context, bool) or not 1 <= max_context <= MAX_CONTEXT_LIMIT:
        raise ConfigError(
            f"--max-context must be between 1 and {MAX_CONTEXT_LIMIT} positions, got {max_context}"
        )
    _check_supported(model)
    c = model.config
    name = c_ident(name)
    plan: TransformerPlan = plan_transformer(model, max_context)
    w = _Weights(name)
    w.add("embed", model.embed, f"token embedding [{c.vocab_size}][{c.d_model}]")
    layers: list[dict[str, Any]] = []
    moes: list[dict[str, Any]] = []
    for i, layer in enumerate(model.layers):
        a = layer.attention
        entry: dict[str, Any] = {
            "index": i,
            "input_norm": w.add(f"l{i}_input_norm", layer.input_norm, "RMSNorm weight"),
            "wq": w.add(f"l{i}_wq", a.wq.T, "q_proj [out][in]"),
            "wk": w.add(f"l{i}_wk", a.wk.T, "k_proj [out][in]"),
            "wv": w.add(f"l{i}_wv", a.wv.T, "v_proj [out][in]"),
            "wo": w.add(f"l{i}_wo", a.wo.T, "o_proj [out][in]"),
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
        }
        ffn = layer.mlp
        if layer.moe is not None:
            m = layer.moe
            mc = m.config
            experts = []
            for j, e in enumerate(m.experts):
                assert e.w3 is not None
                experts.append(
                    {
                        "w1": w.add(f"l{i}_e{j}_w1", e.w1, f"expert {j} gate [d][f]"),
                        "w2": w.add(f"l{i}_e{j}_w2", e.w2, f"expert {j} down [f][d]"),
                        "w3": w.add(f"l{i}_e{j}_w3", e.w3, f"expert {j} up [d][f]"),
                    }
                )
            entry["moe"] = len(moes)
            moes.append(
                {
                    "layer": i,
                    "index": len(moes),
                    "c": mc,
                    "flags": m.flags,
                    "router": w.add(f"l{i}_router", m.router_w, f"router [{mc.n_experts}][d]"),
                    "experts": experts,
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
        if ffn is not None:
            assert ffn.w3 is not None
            entry["ffn_gate"] = w.add(f"l{i}_{prefix}_gate", ffn.w1.T, "SwiGLU gate [f][d]")
            entry["ffn_up"] = w.add(f"l{i}_{prefix}_up", ffn.w3.T, "SwiGLU up [f][d]")
            entry["ffn_down"] = w.add(f"l{i}_{prefix}_down", ffn.w2.T, "SwiGLU down [d][f]")
            entry["ffn_d_ff"] = int(ffn.w1.shape[1])
        layers.append(entry)
    w.add("final_norm", model.final_norm, "final RMSNorm weight")
    lm_head = f"{name}_embed"
    if not c.tie_word_embeddings:
        lm_head = w.add("lm_head", model.lm_head, f"LM head [{c.vocab_size}][{c.d_model}]")
    cos, sin = rope_tables(c, np.arange(max_context))
    half = c.head_dim // 2
    rope_bytes = 2 * max_context * half * 4
    mhash = transformer_hash(model)
    options = {"board": board, "name": name, "max_context": max_context}
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
        "weight_bytes": w.nbytes + rope_bytes,
        "layers": layers,
        "moes": moes,
        "max_top_k": max_top_k(model),
        "lm_head": lm_head,
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
            "weight_bytes": w.nbytes + rope_bytes,
        },
        "files": {f: hashlib.sha256(t.encode()).hexdigest() for f, t in sorted(files.items())},
    }
    return files, manifest


def generate_transformer(
    model: MoETransformer,
    out_dir: str | os.PathLike[str],
    board_name: str = "host",
    name: str | None = None,
    max_context: int = DEFAULT_MAX_CONTEXT,
    force: bool = False,
) -> tuple[Path, dict[str, Any]]:
    """Render, check against the board's budget and write a whole-model directory."""
    from .boards import load_board
    from .size import check_budget

    board = load_board(board_name)
    files, manifest = render_transformer(
        model, board.name, name or Path(out_dir).resolve().name, max_context
    )
    try:
        check_budget(manifest, board)
    except BudgetExceeded as exc:
        kv = manifest["memory"]["kv_cache_bytes"]
        raise BudgetExceeded(
            f"{str(exc).replace('reduce --max-tokens (now 1)', 'reduce --max-context')}\n  "
            f"KV cache: {kv} bytes for --max-context {max_context}"
        ) from None
    return write_output(out_dir, files, manifest, force=force), manifest


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
