"""`colibri inspect MODEL`: what a model is, what it weighs and which boards it fits.

Any input `colibri generate` reads: the seed layout (file or directory), numpy .npz, a Colibri
container (each one MoE layer, read completely) or a Hugging Face checkpoint directory (a whole
transformer, of which only config.json and the safetensors headers are read: shapes and dtypes,
never the weights). The report: architecture, dimensions, the stored tensors' dtypes,
parameter counts (total, routed experts, active per token), the weight bytes `colibri generate`
would store per scheme (routed experts in fp32 / fp16 / int8 / int4, everything else fp32; for
whole models also with ``--dense-quant int8``) with the static arena at the default
``--max-tokens`` / ``--max-context``, and a board x scheme table from the budget check of
:mod:`colibri.plan.budget` (flash: weights + an estimate of the code; RAM: arena + stack).
"""

from __future__ import annotations

import argparse
import json
import struct
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..boards import Board, list_boards
from ..errors import BudgetExceeded, ConfigError, ModelFormatError, ShapeError
from ..frontends.container import (
    DTYPE_Q4,
    DTYPE_Q4K,
    DTYPE_Q5K,
    EXPERT_COLUMNS,
    HEAT_TENSOR,
    SCHEME_NAMES,
    TOKENIZER_TENSOR,
    LMTableEntry,
    is_lm_container,
    read_lm_table,
    read_table,
)
from ..frontends.container import DTYPES as CONTAINER_DTYPES
from ..frontends.container import MAGIC as CONTAINER_MAGIC
from ..frontends.hf import HFCheckpoint, check_architectures, is_hf_checkpoint, moe_block_config
from ..frontends.hf_model import attention_biases, load_hf_config
from ..frontends.load import load_model
from ..frontends.seed import SEED_MAGIC, npz_members
from ..ir.moe import FLAG_GATED, FLAG_NORM_TOPK, Expert, MoEConfig, MoELayer
from ..ir.transformer import (
    Attention,
    DecoderLayer,
    MoETransformer,
    TransformerConfig,
    all_tensors,
)
from ..options import DEFAULT_MAX_CONTEXT, DEFAULT_MAX_TOKENS, MAX_CONTEXT_LIMIT
from ..plan.budget import check_budget, dense_int8_saving
from ..plan.memory import ArenaPlan, plan_memory, plan_transformer
from ..plan.model import transformer_act_q_for
from ..quant.formats import (
    DEFAULT_ACT,
    SCHEMES,
    expert_matrix_bytes,
)
from ..quant.formats import weight_bytes_for as layer_weight_bytes
from .argtypes import MAX_TOKENS, int_range

#: safetensors dtype names -> numpy's (the names every other format reports).
_ST_NAMES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}


@dataclass(frozen=True)
class Variant:
    """One way `colibri generate` could store the model: its weight bytes and arena."""

    quant: str
    dense_quant: str
    weight_bytes: int
    plan: ArenaPlan

    @property
    def label(self) -> str:
        return (
            self.quant if self.dense_quant == "fp32" else f"{self.quant}+dense-{self.dense_quant}"
        )


@dataclass
class Report:
    path: str
    format: str
    architecture: str
    dims: dict[str, Any]
    dtypes: dict[str, int]
    parameters: dict[str, int]
    limit: dict[str, int]  # {"max_tokens": N} or {"max_context": N}
    variants: list[Variant] = field(default_factory=list)
    fits: dict[str, dict[str, str]] = field(default_factory=dict)
    #: A whole-model container (version 2): its file bytes, stored schemes and the boards whose
    #: model-file runner reads it (`colibri run F.clb --board B`); None for other inputs.
    file: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.path,
            "format": self.format,
            "architecture": self.architecture,
            "dims": self.dims,
            "dtypes": self.dtypes,
            "parameters": self.parameters,
            "budget_at": self.limit,
            "schemes": {
                v.label: {
                    "quant": v.quant,
                    "dense_quant": v.dense_quant,
                    "weight_bytes": v.weight_bytes,
                    "arena_bytes": v.plan.arena_size,
                }
                for v in self.variants
            },
            "boards": self.fits,
            **({"file": self.file} if self.file is not None else {}),
        }


# -- one MoE layer (seed layout, .npz, container) -------------------------------------------------


def _npz_dtypes(path: Path) -> dict[str, int]:
    """dtype -> number of arrays, from the members' .npy headers (the config text left out)."""
    try:
        with zipfile.ZipFile(path) as zf:
            members = [(info.filename, dtype.name) for info, _, dtype in npz_members(zf)]
    except (OSError, ValueError, zipfile.BadZipFile) as exc:  # load_model read it already
        raise ModelFormatError(f"{path}: not a readable .npz file ({exc})") from None
    return dict(Counter(dtype for name, dtype in members if name != "config.npy"))


def _layer_tensor_count(layer: MoELayer) -> int:
    stored = sorted(set(layer.storage_map()))
    return 1 + (layer.router_b is not None) + sum(len(layer.experts[i].tensors()) for i in stored)


def _layer_format(p: Path, layer: MoELayer) -> tuple[str, dict[str, int]]:
    """The format of a single-layer model file and its stored tensors' dtypes."""
    if p.is_dir():
        if (p / "expert_0.bin").is_file():
            return "seed layout (directory variant)", {"float32": _layer_tensor_count(layer)}
        for name in ("model.clb", "model.bin", "model.npz"):
            if (p / name).is_file():
                return _layer_format(p / name, layer)
    with open(p, "rb") as f:
        head = f.read(8)
    if head.startswith(CONTAINER_MAGIC[:7]):
        _, entries, _ = read_table(p.read_bytes(), str(p))
        return "Colibri container", dict(Counter(CONTAINER_DTYPES[t.dtype].name for t in entries))
    if head.startswith(b"PK"):
        return "numpy .npz", _npz_dtypes(p)
    if len(head) >= 4 and struct.unpack_from("<I", head)[0] == SEED_MAGIC:
        return "seed layout", {"float32": _layer_tensor_count(layer)}
    return "model file", {"float32": _layer_tensor_count(layer)}


def layer_report(path: Path, config: str | None, max_tokens: int) -> Report:
    layer = load_model(path, config)
    fmt, dtypes = _layer_format(path, layer)
    c = layer.config
    bias = layer.experts[0].b1 is not None
    per_expert = sum(int(a.size) for _, a in layer.experts[0].tensors())
    router = int(layer.router_w.size) + (0 if layer.router_b is None else int(layer.router_b.size))
    shared = 0
    if layer.shared_expert is not None:
        shared = sum(int(a.size) for _, a in layer.shared_expert.tensors())
    if layer.shared_gate is not None:
        shared += int(layer.shared_gate.size)
    routed = c.n_experts * per_expert
    dims: dict[str, Any] = {
        "d_model": c.d_model,
        "d_ff": c.d_ff,
        "experts": c.n_experts,
        "stored_experts": len(set(layer.storage_map())),
        "top_k": c.top_k,
        "activation": "swiglu" if c.gated else c.activation,
        "norm_topk_prob": c.norm_topk_prob,
        "router_bias": layer.router_b is not None,
        "expert_bias": bias,
    }
    if c.vocab_size is not None:
        dims["vocab"] = c.vocab_size
    variants = [
        Variant(
            scheme,
            "fp32",
            layer_weight_bytes(layer, scheme),
            plan_memory(c, max_tokens, 0, bias, DEFAULT_ACT[scheme] == "int8"),
        )
        for scheme in SCHEMES
    ]
    return Report(
        path=str(path),
        format=fmt,
        architecture="single MoE layer",
        dims=dims,
        dtypes=dtypes,
        parameters={
            "total": router + routed + shared,
            "routed_experts": routed,
            "active_per_token": router + shared + c.top_k * per_expert,
        },
        limit={"max_tokens": max_tokens},
        variants=variants,
    )


# -- a whole Hugging Face transformer, from shapes only ---------------------------------------


def _shaped(shape: tuple[int, ...]) -> np.ndarray:
    """A read-only array of `shape` that occupies no memory (the planners read shapes only)."""
    return np.broadcast_to(np.float32(0), shape)


class _Shapes:
    """The tensors of a checkpoint as shape-only arrays, each checked against config.json."""

    def __init__(self, ckpt: HFCheckpoint) -> None:
        self.ckpt = ckpt

    def need(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        ckpt = self.ckpt
        if not ckpt.has(name):
            raise ModelFormatError(
                f"{ckpt.path}: tensor '{name}' is missing ({ckpt.arch.name} checkpoints have it)"
            )
        got = ckpt.shape(name)
        if got != shape:
            raise ShapeError(
                f"{ckpt.path}: tensor '{name}' has shape {list(got)}, but config.json implies "
                f"{list(shape)}; the config and the weights disagree"
            )
        return _shaped(shape)

    def swiglu(self, prefix: str, names: tuple[str, str, str], d: int, f: int) -> Expert:
        g, u, dn = names
        self.need(f"{prefix}{g}.weight", (f, d))
        self.need(f"{prefix}{u}.weight", (f, d))
        self.need(f"{prefix}{dn}.weight", (d, f))
        return Expert(w1=_shaped((d, f)), w2=_shaped((f, d)), w3=_shaped((d, f)))


def _moe_block(s: _Shapes, i: int, mc: MoEConfig) -> MoELayer:
    ckpt = s.ckpt
    arch = ckpt.arch
    e, d, f = mc.n_experts, mc.d_model, mc.d_ff
    prefix = ""
    for p in arch.moe_prefixes:
        if ckpt.has(f"model.layers.{i}.{p}.gate.weight"):
            prefix = f"model.layers.{i}.{p}."
            break
    if not prefix:
        prefix = f"model.layers.{i}.{arch.moe_prefixes[0]}."
    s.need(f"{prefix}gate.weight", (e, d))
    if ckpt.has(f"{prefix}experts.gate_up_proj"):
        s.need(f"{prefix}experts.gate_up_proj", (e, 2 * f, d))
        s.need(f"{prefix}experts.down_proj", (e, d, f))
        expert = Expert(w1=_shaped((d, f)), w2=_shaped((f, d)), w3=_shaped((d, f)))
        experts = [expert] * e
    else:
        experts = [s.swiglu(f"{prefix}experts.{j}.", arch.expert_names, d, f) for j in range(e)]
    shared: Expert | None = None
    gate: np.ndarray | None = None
    if arch.has_shared_expert:
        f_s = ckpt.get_int("shared_expert_intermediate_size")
        shared = s.swiglu(f"{prefix}shared_expert.", arch.expert_names, d, f_s)
        s.need(f"{prefix}shared_expert_gate.weight", (1, d))
        gate = _shaped((d,))
    return MoELayer(mc, _shaped((e, d)), None, experts, shared_expert=shared, shared_gate=gate)


def _attention(s: _Shapes, i: int, arch: str, d: int, hq: int, hkv: int, qk: bool) -> Attention:
    """The attention of layer i as colibri.frontends.hf_model reads it (biases per config)."""
    p = f"model.layers.{i}.self_attn"
    qkv_bias, o_bias = attention_biases(s.ckpt.config, arch)

    def bias(name: str, n: int, present: bool) -> np.ndarray | None:
        return s.need(f"{p}.{name}.bias", (n,)) if present else None

    s.need(f"{p}.q_proj.weight", (hq, d))
    s.need(f"{p}.k_proj.weight", (hkv, d))
    s.need(f"{p}.v_proj.weight", (hkv, d))
    s.need(f"{p}.o_proj.weight", (d, hq))
    att = Attention(
        wq=_shaped((d, hq)),
        wk=_shaped((d, hkv)),
        wv=_shaped((d, hkv)),
        wo=_shaped((hq, d)),
        bq=bias("q_proj", hq, qkv_bias),
        bk=bias("k_proj", hkv, qkv_bias),
        bv=bias("v_proj", hkv, qkv_bias),
        bo=bias("o_proj", d, o_bias),
    )
    if qk:
        att.q_norm = s.need(f"{p}.q_norm.weight", (hq,))
        att.k_norm = s.need(f"{p}.k_norm.weight", (hkv,))
    return att


def shape_model(ckpt: HFCheckpoint) -> MoETransformer:
    """The checkpoint as a MoETransformer of shape-only arrays (no weight is read), every
    tensor the architecture needs checked against config.json from the safetensors headers."""
    c = load_hf_config(ckpt)
    d, hq, hkv = c.d_model, c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    s = _Shapes(ckpt)
    mc: MoEConfig | None = None
    layers = []
    for i in range(c.n_layers):
        moe: MoELayer | None = None
        mlp: Expert | None = None
        if ckpt.is_moe_layer(i):
            mc = mc or moe_block_config(ckpt)
            moe = _moe_block(s, i, mc)
        else:
            mlp = s.swiglu(
                f"model.layers.{i}.mlp.",
                ("gate_proj", "up_proj", "down_proj"),
                d,
                ckpt.get_int("intermediate_size"),
            )
        layers.append(
            DecoderLayer(
                input_norm=s.need(f"model.layers.{i}.input_layernorm.weight", (d,)),
                attention=_attention(s, i, c.architecture, d, hq, hkv, c.qk_norm),
                post_norm=s.need(f"model.layers.{i}.post_attention_layernorm.weight", (d,)),
                moe=moe,
                mlp=mlp,
            )
        )
    embed = s.need("model.embed_tokens.weight", (c.vocab_size, d))
    lm_head = embed if c.tie_word_embeddings else s.need("lm_head.weight", (c.vocab_size, d))
    return MoETransformer(
        c, embed, layers, s.need("model.norm.weight", (d,)), lm_head, str(ckpt.path)
    )


def routed_params(m: MoELayer) -> int:
    """Parameters of a block's routed experts (shape-only float32 arrays: 4 bytes each)."""
    return sum(e.nbytes // 4 for e in m.experts)


def hf_report(path: Path, max_context: int) -> Report:
    ckpt = HFCheckpoint(path)
    model = shape_model(ckpt)
    c = model.config
    moes = [(i, layer.moe) for i, layer in enumerate(model.layers) if layer.moe is not None]
    total = sum(int(a.size) for _, a in all_tensors(model))
    routed = sum(routed_params(m) for _, m in moes)
    active = total - routed + sum(m.config.top_k * m.experts[0].nbytes // 4 for _, m in moes)
    dtypes = dict(Counter(_ST_NAMES.get(ckpt.dtype(n), ckpt.dtype(n)) for n in ckpt.names()))
    dims: dict[str, Any] = {
        "layers": c.n_layers,
        "d_model": c.d_model,
        "heads": c.n_heads,
        "kv_heads": c.n_kv_heads,
        "head_dim": c.head_dim,
        "vocab": c.vocab_size,
        "tie_word_embeddings": c.tie_word_embeddings,
        "moe_layers": [i for i, _ in moes],
    }
    if moes:
        mc = moes[0][1].config
        dims.update(
            d_ff=mc.d_ff,
            experts=mc.n_experts,
            top_k=mc.top_k,
            activation="swiglu",
            norm_topk_prob=mc.norm_topk_prob,
        )
    shared = [m.shared_expert for _, m in moes if m.shared_expert is not None]
    dims["shared_experts"] = (
        {"layers": len(shared), "d_ff": int(shared[0].w1.shape[1])} if shared else None
    )
    dense = [i for i, layer in enumerate(model.layers) if layer.mlp is not None]
    mlp = model.layers[dense[0]].mlp if dense else None
    dims["dense_layers"] = (
        {"layers": dense, "d_ff": int(mlp.w1.shape[1])} if mlp is not None else None
    )
    rope = 2 * max_context * (c.head_dim // 2) * 4  # fp32 cos / sin tables
    fp32 = sum(int(a.nbytes) for _, a in all_tensors(model)) + rope
    others = fp32 - sum(4 * routed_params(m) for _, m in moes)
    saved = dense_int8_saving(model)
    variants = []
    for dense_q in ("fp32", "int8"):
        for scheme in SCHEMES:
            experts = sum(
                m.config.n_experts * expert_matrix_bytes(c.d_model, m.config.d_ff, True, scheme)
                for _, m in moes
            )
            wb = others + experts - (saved if dense_q == "int8" else 0)
            act_q = transformer_act_q_for(model, scheme, dense_q)
            variants.append(
                Variant(scheme, dense_q, wb, plan_transformer(model, max_context, act_q))
            )
    return Report(
        path=str(path),
        format="Hugging Face checkpoint",
        architecture=c.architecture,
        dims=dims,
        dtypes=dtypes,
        parameters={"total": total, "routed_experts": routed, "active_per_token": active},
        limit={"max_context": max_context},
        variants=variants,
    )


# -- a whole-model container (version 2), from its header and tensor table ----------------------

#: Table dtype codes -> the names the report uses.
_FILE_DTYPES = {
    0: "float32",
    1: "float16",
    2: "int8",
    DTYPE_Q4: "int4 (q4_32 blocks)",
    4: "int32",
    DTYPE_Q4K: "q4k (super-blocks of 256 across rows)",
    DTYPE_Q5K: "q5k (super-blocks of 256 across rows)",
    5: "q4k in the old row layout (no longer read: convert again)",
    6: "q5k in the old row layout (no longer read: convert again)",
}
#: Tensors of a container that are not weights (descriptors, tables, tokenizer, RoPE tables).
_NOT_PARAMETERS = (".desc", ".experts", f".{HEAT_TENSOR}", ".scale")


def _is_parameter(e: LMTableEntry) -> bool:
    return e.name not in (TOKENIZER_TENSOR, "rope.cos", "rope.sin") and not e.name.endswith(
        _NOT_PARAMETERS
    )


def _file_model(
    config: TransformerConfig, names: set[str], descs: list[dict[str, int]]
) -> MoETransformer:
    """The container's model as shape-only arrays (from its config and layer descriptors), for
    the arena planner (colibri.plan.memory.plan_transformer)."""
    c = config
    d, hq, hkv = c.d_model, c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim

    def swiglu(f: int) -> Expert:
        return Expert(w1=_shaped((d, f)), w2=_shaped((f, d)), w3=_shaped((d, f)))

    def opt(name: str, n: int) -> np.ndarray | None:
        return _shaped((n,)) if name in names else None

    layers = []
    for i, desc in enumerate(descs):
        p = f"layer.{i}.attn"
        att = Attention(
            wq=_shaped((d, hq)),
            wk=_shaped((d, hkv)),
            wv=_shaped((d, hkv)),
            wo=_shaped((hq, d)),
            bq=opt(f"{p}.q_bias", hq),
            bk=opt(f"{p}.k_bias", hkv),
            bv=opt(f"{p}.v_bias", hkv),
            bo=opt(f"{p}.o_bias", d),
            q_norm=opt(f"{p}.q_norm", hq),
            k_norm=opt(f"{p}.k_norm", hkv),
        )
        moe: MoELayer | None = None
        mlp: Expert | None = None
        ffn = swiglu(desc["ffn_d_ff"]) if desc["ffn_d_ff"] else None
        if desc["is_moe"]:
            e = desc["n_experts"]
            flags = desc["moe_flags"]
            mc = MoEConfig(
                e,
                desc["top_k"],
                d,
                desc["d_ff"],
                gated=bool(flags & FLAG_GATED),
                norm_topk_prob=bool(flags & FLAG_NORM_TOPK),
            )
            gate = _shaped((d,)) if desc["has_shared_gate"] else None
            moe = MoELayer(
                mc, _shaped((e, d)), None, [swiglu(mc.d_ff)] * e, None, shared_expert=ffn,
                shared_gate=gate,
            )  # fmt: skip
        else:
            mlp = ffn
        layers.append(
            DecoderLayer(_shaped((d,)), att, _shaped((d,)), moe=moe, mlp=mlp)
        )  # fmt: skip
    embed = _shaped((c.vocab_size, d))
    return MoETransformer(c, embed, layers, _shaped((d,)), embed, "")


def lm_file_report(path: Path) -> Report:
    """`colibri inspect F.clb` of a whole-model container: everything from its header, metadata
    and tensor table (descriptors and expert tables read, CRC-checked; no weight is read)."""
    from ..emit.lmfile import layer_desc, lm_config, lm_scheme_names

    h, meta, entries, arrays = read_lm_table(path, (".desc", ".experts"))
    try:  # the header and descriptors checked as the C and `colibri reference` check them
        config = lm_config(h, meta)
        scheme, act, dense, _, router = lm_scheme_names(h, meta)
        dense_codes = int(h["dense_scheme"]), int(h["dense_act"])
        descs = [layer_desc(arrays, i, *dense_codes) for i in range(config.n_layers)]
    except ModelFormatError as exc:
        raise ModelFormatError(f"{path}: {exc}") from None
    names = {e.name for e in entries}
    model = _file_model(config, names, descs)
    size = {e.name: int(np.prod(e.shape)) for e in entries if _is_parameter(e)}
    total = sum(size.values())
    routed = active = 0
    expert_schemes: Counter[str] = Counter()
    moes = [(i, layer.moe) for i, layer in enumerate(model.layers) if layer.moe is not None]
    for i, m in moes:
        table = arrays.get(f"layer.{i}.experts")
        if table is None or table.shape != (m.config.n_experts, len(EXPERT_COLUMNS)):
            raise ModelFormatError(f"{path}: layer {i} has no expert table")
        per = {
            int(o): sum(v for n, v in size.items() if n.startswith(f"layer.{i}.expert.{o}."))
            for o in set(table[:, 0].tolist())
        }
        routed += sum(per[int(o)] for o in table[:, 0])
        active += m.config.top_k * max(per.values(), default=0)
        expert_schemes.update(SCHEME_NAMES.get(int(code), "?") for code in table[:, 1])
    active += total - sum(v for n, v in size.items() if ".expert." in n)
    max_context = int(h["max_context"])
    dims: dict[str, Any] = {
        "layers": config.n_layers,
        "d_model": config.d_model,
        "heads": config.n_heads,
        "kv_heads": config.n_kv_heads,
        "head_dim": config.head_dim,
        "vocab": config.vocab_size,
        "tie_word_embeddings": config.tie_word_embeddings,
        "moe_layers": [i for i, _ in moes],
    }
    if moes:
        mc = moes[0][1].config
        dims.update(
            d_ff=mc.d_ff,
            experts=mc.n_experts,
            top_k=mc.top_k,
            activation="swiglu" if mc.gated else "?",
            norm_topk_prob=mc.norm_topk_prob,
        )
    shared = [m.shared_expert for _, m in moes if m.shared_expert is not None]
    dims["shared_experts"] = (
        {"layers": len(shared), "d_ff": int(shared[0].w1.shape[1])} if shared else None
    )
    dense_layers = [i for i, layer in enumerate(model.layers) if layer.mlp is not None]
    mlp = model.layers[dense_layers[0]].mlp if dense_layers else None
    dims["dense_layers"] = (
        {"layers": dense_layers, "d_ff": int(mlp.w1.shape[1])} if mlp is not None else None
    )
    # what `generate` with the same flags stores: not the runtime's descriptors and expert
    # tables, the calibration heat or the tokenizer
    weights = sum(
        e.nbytes
        for e in entries
        if e.name != TOKENIZER_TENSOR
        and not e.name.endswith((".desc", ".experts", f".{HEAT_TENSOR}"))
    )
    plan = plan_transformer(model, max_context, transformer_act_q_for(model, scheme, dense))
    runs = [b.name for b in list_boards() if not b.is_baremetal and b.has_mmap]
    return Report(
        path=str(path),
        format=f"Colibri container (version 2, whole model, {int(h['file_size'])} bytes)",
        architecture=config.architecture,
        dims=dims,
        dtypes=dict(Counter(_FILE_DTYPES.get(e.dtype, str(e.dtype)) for e in entries)),
        parameters={"total": total, "routed_experts": routed, "active_per_token": active},
        limit={"max_context": max_context},
        variants=[Variant(scheme, dense, weights, plan)],
        file={
            "file_bytes": int(h["file_size"]),
            "schemes": {
                "experts": scheme,
                "expert_mix": dict(sorted(expert_schemes.items())),
                "act": act,
                "dense": dense,
                "router": router,
            },
            "tokenizer": TOKENIZER_TENSOR in names,
            "calibration_heat": any(n.endswith(f".{HEAT_TENSOR}") for n in names),
            "source": str(meta.get("source") or ""),
            "producer": str(meta.get("producer") or ""),
            "runs_on": runs,
        },
    )


# -- boards --------------------------------------------------------------------------------------


def fit(v: Variant, board: Board, max_tokens: int) -> str:
    """fits / flash over / RAM over / flash+RAM over, from plan.budget.check_budget."""
    manifest = {
        "memory": {
            "weight_bytes": v.weight_bytes,
            "arena_size": v.plan.arena_size,
            "max_tokens": max_tokens,
            "regions": [{"name": r.name, "size": r.size} for r in v.plan.regions],
        }
    }
    try:
        check_budget(manifest, board)
    except BudgetExceeded as exc:
        msg = str(exc)
        flash = "flash:" in msg
        ram = "RAM:" in msg or not flash  # or the arena over 2 GiB (any board)
        return "flash+RAM over" if flash and ram else ("flash over" if flash else "RAM over")
    return "fits"


def inspect_model(
    path: str | Path,
    config: str | None = None,
    max_tokens: int | None = None,
    max_context: int | None = None,
) -> Report:
    p = Path(path)
    if not p.exists():
        raise ModelFormatError(f"{p}: no such file or directory")
    if is_lm_container(p):  # a whole model, as `colibri convert CKPT` writes it
        if config is not None or max_tokens is not None or max_context is not None:
            raise ConfigError(
                f"{p}: a whole-model container carries its own config and --max-context (set "
                f"by `colibri convert`); inspect it without --config / --max-tokens / "
                f"--max-context"
            )
        report = lm_file_report(p)
        for board in list_boards():
            report.fits[board.name] = {v.label: fit(v, board, 1) for v in report.variants}
        return report
    check_architectures(p)
    whole = p.is_dir() and is_hf_checkpoint(p)
    if whole and config is not None:
        raise ConfigError(
            f"{p}: --config applies to single-layer models (seed layout, .npz); a Hugging Face "
            f"checkpoint is described by its own config.json"
        )
    if whole and max_tokens is not None:
        raise ConfigError(
            "--max-tokens applies to a single MoE layer; a whole transformer takes --max-context"
        )
    if not whole and max_context is not None:
        raise ConfigError(
            "--max-context applies to whole transformers (a Hugging Face checkpoint directory); "
            "a single MoE layer takes --max-tokens"
        )
    if whole:
        report = hf_report(p, max_context or DEFAULT_MAX_CONTEXT)
        chunk = 1
    else:
        chunk = max_tokens or DEFAULT_MAX_TOKENS
        report = layer_report(p, config, chunk)
    for board in list_boards():
        report.fits[board.name] = {v.label: fit(v, board, chunk) for v in report.variants}
    return report


# -- output --------------------------------------------------------------------------------------


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]


def format_report(r: Report) -> str:
    d = r.dims
    lines = [f"{r.path}: {r.format}", f"architecture: {r.architecture}"]
    if "layers" in d:
        lines.append(
            f"dims: {d['layers']} layers, d_model {d['d_model']}, heads {d['heads']}, kv-heads "
            f"{d['kv_heads']}, head_dim {d['head_dim']}, vocab {d['vocab']}"
            + (", tied embeddings" if d["tie_word_embeddings"] else "")
        )
        if "experts" in d:
            lines.append(
                f"MoE layers {d['moe_layers']}: {d['experts']} experts, d_ff {d['d_ff']}, top-k "
                f"{d['top_k']}, {d['activation']}"
            )
        se, dl = d["shared_experts"], d["dense_layers"]
        lines.append(
            "shared experts: "
            + (
                f"d_ff {se['d_ff']} in {se['layers']} layer{'s' * (se['layers'] != 1)}"
                if se
                else "none"
            )
            + "; dense layers: "
            + (f"{dl['layers']} (d_ff {dl['d_ff']})" if dl else "none")
        )
    else:
        stored = "" if d["stored_experts"] == d["experts"] else f" ({d['stored_experts']} stored)"
        lines.append(
            f"dims: d_model {d['d_model']}, d_ff {d['d_ff']}, {d['experts']} experts{stored}, "
            f"top-k {d['top_k']}, {d['activation']}"
        )
    lines.append(
        "stored dtypes: "
        + ", ".join(f"{k} ({n} tensor{'s' if n != 1 else ''})" for k, n in r.dtypes.items())
    )
    p = r.parameters
    lines.append(
        f"parameters: {p['total']} total, {p['routed_experts']} in routed experts, "
        f"{p['active_per_token']} active per token"
    )
    if r.file is not None:
        f = r.file
        sc = f["schemes"]
        mix = ", ".join(f"{k} {n}" for k, n in sc["expert_mix"].items())
        lines.append(
            f"stored schemes: routed experts {sc['experts']} ({sc['act']} activations"
            + (f"; per expert: {mix}" if mix else "")
            + f"), dense {sc['dense']}, routers {sc['router']}"
            + (", with tokenizer.json" if f["tokenizer"] else "")
            + (", with calibration heat" if f["calibration_heat"] else "")
        )
        lines.append(
            f"runs as a model file (`colibri run {r.path} --board B --prompt-ids ...`) on: "
            + ", ".join(f["runs_on"])
        )
    ((key, n),) = r.limit.items()
    rest = "everything else fp32" if key == "max_tokens" else "the rest fp32 unless dense-int8"
    if r.file is not None:
        lines.append(
            f"bytes (weights as stored, what `generate` with these flags stores; arena at the "
            f"file's --max-context {n}):"
        )
    else:
        lines.append(
            f"bytes (routed experts in the scheme, {rest}; arena at --{key.replace('_', '-')} {n}):"
        )
    rows = [["scheme", "weights", "arena"]]
    rows += [[v.label, str(v.weight_bytes), str(v.plan.arena_size)] for v in r.variants]
    lines += _table(rows)
    lines.append("boards (flash: weights + ~24 KB of code; RAM: arena + stack):")
    labels = [v.label for v in r.variants]
    rows = [["board", *labels]]
    rows += [[b, *(verdicts[label] for label in labels)] for b, verdicts in r.fits.items()]
    lines += _table(rows)
    return "\n".join(lines)


def cmd_inspect(a: argparse.Namespace) -> int:
    report = inspect_model(a.model, a.config, a.max_tokens, a.max_context)
    if a.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print(format_report(report))
    return 0


def add_parser(sub: Any) -> None:
    """The `inspect` subcommand on the CLI's subparsers."""
    s = sub.add_parser(
        "inspect",
        help="dimensions, parameter counts, bytes per scheme and the boards a model fits",
    )
    s.add_argument(
        "model", help="container, seed layout (file or directory), .npz or HF checkpoint dir"
    )
    s.add_argument("--config", help="config.json (default: beside the model)")
    s.add_argument(
        "--max-tokens",
        type=int_range(1, MAX_TOKENS, "tokens per chunk"),
        help=f"single MoE layer: tokens per chunk the arena holds (default {DEFAULT_MAX_TOKENS})",
    )
    s.add_argument(
        "--max-context",
        type=int_range(1, MAX_CONTEXT_LIMIT, "positions"),
        metavar="N",
        help=f"whole transformer: KV-cache positions (default {DEFAULT_MAX_CONTEXT})",
    )
    s.add_argument("--json", action="store_true", help="the report as one JSON object")
    s.set_defaults(func=cmd_inspect)
