"""A whole transformer in one Colibri container, version 2 (`colibri convert CKPT --out F.clb`).

The file holds exactly the weights the generated C of the same model and quantisation flags
holds (:func:`colibri.quant.model.quantize_transformer`, the same scale search), in the layouts
the runtime's kernels read, plus the RoPE tables of ``max_context`` positions computed in
float64 as :mod:`colibri.emit.model` does, so the runtime's file entry point
(``colibri_lm_init`` / ``colibri_lm_forward``, runtime_c/src/lm_*.c) gives the generated C's
logits bit for bit, without compiling anything per model. Byte layout: docs/format.md section 1b;
the format's structs and codes are :mod:`colibri.frontends.container`'s (which also reads the
file back: :func:`~colibri.frontends.container.read_lm_container`).

:func:`lm_container_bytes` builds the image, :func:`write_lm_container` writes it atomically
(buffer by buffer), :func:`write_lm_container_streamed` writes one whose layers are read and
quantised one at a time (`colibri convert`: memory holds one layer), and :func:`read_lm_model`
reads one back as the model and quantisation it was written from (`colibri reference F.clb`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from .. import __version__
from ..errors import ConfigError, ModelFormatError
from ..frontends.container import (
    ACT_CODES,
    ACT_NAMES,
    ALIGN,
    BLOCK_Q4_DTYPE,
    BLOCK_Q4K_DTYPE,
    BLOCK_Q5K_DTYPE,
    DTYPE_CODES,
    DTYPE_Q4,
    DTYPE_Q4K,
    DTYPE_Q5K,
    EXPERT_COLUMNS,
    FLAG_CLIP_QKV,
    FLAG_QK_NORM,
    FLAG_TIED,
    HEAT_TENSOR,
    KIND_DECODER,
    LAYER_DESC,
    LM_HEADER,
    LM_VERSION,
    MAGIC,
    NO_EXPERT,
    SCHEME_CODES,
    SCHEME_NAMES,
    TOKENIZER_TENSOR,
    LMContainer,
    check_lm_meta,
    q4_blocks,
    q4k_stream_dtype,
    q4k_stream_stored,
    read_lm_container,
)
from ..ir.transformer import DecoderLayer, MoETransformer, TransformerConfig
from ..paths import Needed, write_file_atomic
from ..quant.formats import QuantExpert, QuantTensor
from ..quant.model import TransformerQuant
from ..reference.transformer import rope_tables
from .container import (
    ContainerImage,
    HeaderFn,
    TableEntry,
    byte_view,
    container_image,
    write_container_streamed,
)


def _matrix(
    tensors: list[tuple[str, np.ndarray, int, tuple[int, ...]]],
    name: str,
    t: QuantTensor,
    expert: int = NO_EXPERT,
) -> None:
    """A stored matrix [out, in]: its codes / values under `name`, int8 scales in `name.scale`."""
    shape = (t.n_out, t.n_in)
    if t.scheme in ("q4k", "q5k"):  # one stream of super-blocks, the last cut (q4k_bytes)
        bits = 5 if t.scheme == "q5k" else 4
        raw = q4k_stream_stored(t.data, t.n_out, t.n_in)
        tensors.append((name, raw.view(q4k_stream_dtype(t.n_out, t.n_in, bits)), expert, shape))
        return
    tensors.append((name, np.ascontiguousarray(t.data), expert, shape))
    if t.scheme == "int8":
        assert t.scale is not None
        tensors.append((f"{name}.scale", np.ascontiguousarray(t.scale, "<f4"), expert, ()))


def _f32(
    name: str, arr: np.ndarray, expert: int = NO_EXPERT
) -> tuple[str, np.ndarray, int, tuple[int, ...]]:
    return (name, np.ascontiguousarray(arr, "<f4"), expert, ())


def _ffn(
    tensors: list[tuple[str, np.ndarray, int, tuple[int, ...]]],
    prefix: str,
    qe: QuantExpert,
    expert: int = NO_EXPERT,
) -> None:
    for tname, t in qe.tensors():
        assert isinstance(t, QuantTensor)
        _matrix(tensors, f"{prefix}.{tname}", t, expert)


def _fp32_ffn_out_major(e: object) -> QuantExpert:
    """An fp32 SwiGLU MLP as [out, in] matrices (colibri_swiglu_f32's layout)."""
    w1, w2, w3 = (np.asarray(getattr(e, n), np.float32) for n in ("w1", "w2", "w3"))
    return QuantExpert(
        "fp32",
        "fp32",
        QuantTensor("fp32", w1.shape[1], w1.shape[0], np.ascontiguousarray(w1.T)),
        QuantTensor("fp32", w2.shape[1], w2.shape[0], np.ascontiguousarray(w2.T)),
        QuantTensor("fp32", w3.shape[1], w3.shape[0], np.ascontiguousarray(w3.T)),
        None,
        None,
    )


def _dense(
    model: MoETransformer | None, q: TransformerQuant | None, key: str, w_t: np.ndarray
) -> QuantTensor:
    """A dense matrix [out, in] as stored: q.dense[key] under --dense-quant, else fp32."""
    if q is not None and q.dense_scheme != "fp32":
        return q.dense[key]
    w_t = np.ascontiguousarray(w_t, np.float32)
    return QuantTensor("fp32", w_t.shape[0], w_t.shape[1], w_t)


#: (name, array, expert index, logical shape or ()) of one stored tensor.
Tensor = tuple[str, np.ndarray, int, tuple[int, ...]]


def model_tensors(
    model: MoETransformer,
    q: TransformerQuant | None,
    max_context: int,
    tokenizer: bytes | None = None,
    heat: dict[int, np.ndarray] | None = None,
) -> list[Tensor]:
    """(name, array, expert index, logical shape or ()) of every tensor, in file order; `heat`
    (calibration heat per MoE layer, :func:`colibri.reference.calibration.expert_heat`) adds
    ``layer.{i}.heat``."""
    from .model import check_supported

    check_supported(model)
    out = head_tensors(model, q, max_context)
    for i, layer in enumerate(model.layers):
        out += layer_tensors(i, layer, q, None if heat is None else heat.get(i))
    out += tail_tensors(tokenizer)
    return out


def head_tensors(
    model: MoETransformer, q: TransformerQuant | None, max_context: int
) -> list[Tensor]:
    """The tensors before the layers: embedding, LM head, final norm, RoPE tables (of `model`
    only these are read, so its `layers` may be empty)."""
    c = model.config
    out: list[Tensor] = []
    _matrix(out, "embed", _dense(model, q, "embed", model.embed))
    if not c.tie_word_embeddings:
        _matrix(out, "lm_head", _dense(model, q, "lm_head", model.lm_head))
    out.append(_f32("final_norm", model.final_norm))
    cos, sin = rope_tables(c, np.arange(max_context))
    half = c.head_dim // 2
    out.append(_f32("rope.cos", cos[:, :half].astype(np.float32)))
    out.append(_f32("rope.sin", sin[:, :half].astype(np.float32)))
    return out


def tail_tensors(tokenizer: bytes | None) -> list[Tensor]:
    """The tensors after the layers: the checkpoint's tokenizer.json, for `colibri run
    --prompt`."""
    if tokenizer is None:
        return []
    return [(TOKENIZER_TENSOR, np.frombuffer(tokenizer, np.int8), NO_EXPERT, ())]


def layer_tensors(
    i: int, layer: DecoderLayer, q: TransformerQuant | None, heat: np.ndarray | None = None
) -> list[Tensor]:
    """The tensors of decoder layer `i` (q: its quantised weights, keyed by `i`; heat: its
    experts' calibration heat, stored as ``layer.{i}.heat`` when given)."""
    dense = q.dense_scheme if q is not None else "fp32"
    out: list[Tensor] = []
    p = f"layer.{i}"
    a = layer.attention
    desc = dict.fromkeys(LAYER_DESC, 0)
    out.append(_f32(f"{p}.input_norm", layer.input_norm))
    out.append(_f32(f"{p}.post_norm", layer.post_norm))
    for n, short in (("wq", "q"), ("wk", "k"), ("wv", "v"), ("wo", "o")):
        _matrix(out, f"{p}.attn.{short}", _dense(None, q, f"l{i}.{n}", getattr(a, n).T))
    for n in ("bq", "bk", "bv", "bo"):
        v = getattr(a, n)
        if v is not None:
            out.append(_f32(f"{p}.attn.{n[1]}_bias", v))
    if a.q_norm is not None and a.k_norm is not None:
        out.append(_f32(f"{p}.attn.q_norm", a.q_norm))
        out.append(_f32(f"{p}.attn.k_norm", a.k_norm))
    ffn = layer.mlp
    if layer.moe is not None:
        m = layer.moe
        mc = m.config
        desc.update(is_moe=1, n_experts=mc.n_experts, top_k=mc.top_k, d_ff=mc.d_ff)
        desc["moe_flags"] = m.flags
        qr = q.routers.get(i) if q is not None else None
        if qr is None or qr.scheme == "fp32":
            out.append(_f32(f"{p}.router", m.router_w))
        else:
            desc["router_scheme"] = SCHEME_CODES[qr.scheme]
            rq = QuantTensor(qr.scheme, mc.n_experts, mc.d_model, qr.data, qr.scale)
            _matrix(out, f"{p}.router", rq)
        storage = m.storage_map()
        eq = q.experts.get(i) if q is not None else None  # per expert: mixes too
        table = np.zeros((mc.n_experts, len(EXPERT_COLUMNS)), "<i4")
        for j in range(mc.n_experts):
            owner = storage[j]
            qe = eq[owner] if eq is not None else None
            table[j] = (
                owner,
                SCHEME_CODES[qe.scheme] if qe is not None else 0,
                ACT_CODES[qe.act] if qe is not None else 0,
            )
        out.append((f"{p}.experts", table, NO_EXPERT, ()))
        if heat is not None:
            out.append(_f32(f"{p}.{HEAT_TENSOR}", _check_heat(heat, mc.n_experts, i)))
        for j in sorted(set(storage)):
            if eq is not None and eq[j].scheme != "fp32":
                _ffn(out, f"{p}.expert.{j}", eq[j], j)
            else:  # fp32: the MoE IR layout colibri_expert_ffn_f32 reads ([in][out])
                e = m.experts[j]
                for tname, arr in e.tensors():
                    out.append(_f32(f"{p}.expert.{j}.{tname}", arr, j))
        ffn = m.shared_expert
        if m.shared_gate is not None:
            desc["has_shared_gate"] = 1
            out.append(_f32(f"{p}.shared_gate", m.shared_gate))
    if ffn is not None:
        qf = q.dense_ffn[i] if q is not None and dense != "fp32" else _fp32_ffn_out_major(ffn)
        desc.update(ffn_d_ff=int(ffn.w1.shape[1]), ffn_scheme=SCHEME_CODES[qf.scheme])
        desc["ffn_act"] = ACT_CODES[qf.act]
        _ffn(out, f"{p}.ffn", qf)
    out.append((f"{p}.desc", np.asarray([desc[k] for k in LAYER_DESC], "<i4"), NO_EXPERT, ()))
    return out


def _check_heat(h: np.ndarray, n_experts: int, layer: int) -> np.ndarray:
    h = np.asarray(h, np.float32)
    if h.shape != (n_experts,) or not np.all(np.isfinite(h)) or np.any(h < 0):
        raise ConfigError(
            f"expert heat of layer {layer}: expected {n_experts} finite values >= 0, got shape "
            f"{h.shape}; compute it with colibri.reference.calibration.expert_heat"
        )
    return h


def _dtype_code(arr: np.ndarray) -> int:
    if arr.dtype == BLOCK_Q4_DTYPE:
        return DTYPE_Q4
    if arr.dtype.names == ("q4k_stream",):
        return DTYPE_Q4K
    if arr.dtype.names == ("q5k_stream",):
        return DTYPE_Q5K
    dt = np.dtype(arr.dtype).newbyteorder("<")
    if dt == np.dtype("<u2"):
        return DTYPE_CODES[np.dtype("<f2")]  # fp16 bits
    return DTYPE_CODES[dt]


def lm_container_bytes(
    model: MoETransformer,
    q: TransformerQuant | None,
    max_context: int,
    tokenizer: bytes | None = None,
    heat: dict[int, np.ndarray] | None = None,
) -> bytearray:
    """The version-2 container image of a whole transformer with its quantisation (None: all
    fp32) and RoPE tables for `max_context` positions (in memory: tests, small models)."""
    return lm_container_image(model, q, max_context, tokenizer, heat).tobytes()


def check_max_context(max_context: int) -> None:
    if not 1 <= max_context <= 1 << 24:
        raise ConfigError(f"--max-context {max_context}: must be 1..16777216")


def lm_container_image(
    model: MoETransformer,
    q: TransformerQuant | None,
    max_context: int,
    tokenizer: bytes | None = None,
    heat: dict[int, np.ndarray] | None = None,
) -> ContainerImage:
    """:func:`lm_container_bytes` planned, not joined: the blobs are views of the arrays."""
    check_max_context(max_context)
    tensors = model_tensors(model, q, max_context, tokenizer, heat)
    meta, header = lm_meta_header(model, q, max_context)
    return container_image(list(table_entries(tensors)), meta, header)


def table_entries(tensors: Iterable[Tensor]) -> Iterator[TableEntry]:
    """The container table entries of stored tensors (their bytes as views, not copies)."""
    for name, arr, expert, logical in tensors:
        yield TableEntry(
            name, byte_view(arr), _dtype_code(arr), tuple(logical or arr.shape), expert
        )


def lm_meta_header(
    model: MoETransformer, q: TransformerQuant | None, max_context: int
) -> tuple[bytes, HeaderFn]:
    """The metadata and the header packer of a version-2 container (from the config and the
    quantisation schemes only: a model whose layers are read later may pass none)."""
    c = model.config
    meta = json.dumps(
        {
            "kind": "transformer",
            "config": dict(sorted(c.__dict__.items())),
            "quantization": _quant_meta(q),
            "source": str(model.source),
            "producer": f"colibri {__version__}",
        },
        sort_keys=True,
    ).encode()
    flags = (FLAG_TIED if c.tie_word_embeddings else 0) | (FLAG_QK_NORM if c.qk_norm else 0)
    flags |= FLAG_CLIP_QKV if c.clip_qkv is not None else 0

    def header(
        n_tensors: int, table_offset: int, meta_offset: int, data_offset: int, file_size: int
    ) -> bytes:
        return LM_HEADER.pack(
            MAGIC,
            LM_VERSION,
            ALIGN,
            KIND_DECODER,
            n_tensors,
            len(meta),
            c.n_layers,
            table_offset,
            meta_offset,
            data_offset,
            file_size,
            c.vocab_size,
            c.d_model,
            c.n_heads,
            c.n_kv_heads,
            c.head_dim,
            max_context,
            flags,
            float(c.rms_norm_eps),
            float(c.clip_qkv or 0.0),
            c.sliding_window or 0,
            float(c.rope_theta),
            SCHEME_CODES[q.dense_scheme if q is not None else "fp32"],
            ACT_CODES[q.dense_act if q is not None else "fp32"],
        )

    return meta, header


def _quant_meta(q: TransformerQuant | None) -> dict[str, str]:
    if q is None:
        return {"scheme": "fp32", "act": "fp32", "dense_scheme": "fp32", "router_scheme": "fp32"}
    return {
        "scheme": q.scheme,
        "act": q.act,
        "dense_scheme": q.dense_scheme,
        "dense_act": q.dense_act,
        "router_scheme": q.router_scheme,
    }


def write_lm_container(
    model: MoETransformer,
    q: TransformerQuant | None,
    path: str | os.PathLike[str],
    max_context: int,
    tokenizer: bytes | None = None,
    heat: dict[int, np.ndarray] | None = None,
) -> Path:
    """Write the version-2 container of `model` atomically (with `tokenizer`, the bytes of a
    tokenizer.json, as the tensor ``tokenizer.json``; with `heat`, ``layer.{i}.heat``), buffer
    by buffer; returns the path."""
    image = lm_container_image(model, q, max_context, tokenizer, heat)
    return write_file_atomic(path, image.write, image.size)


def write_lm_container_streamed(
    path: str | os.PathLike[str],
    head: MoETransformer,
    q: TransformerQuant | None,
    max_context: int,
    layers: Iterable[tuple[DecoderLayer, TransformerQuant | None, np.ndarray | None]],
    tokenizer: bytes | None = None,
    needed: Needed = None,
) -> Path:
    """Write the version-2 container of a model whose decoder layers come one at a time: `head`
    holds the config, embedding, LM head and final norm (its `layers` unused), `q` the
    quantised embedding / LM head, and `layers` yields each layer in order with its quantised
    weights (keyed by its index) and its calibration heat (as `heat` of
    :func:`write_lm_container`; None: none), which are dropped once written. The file is byte
    for byte :func:`write_lm_container` of the whole model; memory holds one layer. `needed`: the
    bytes the write needs if known, or a function estimating them (for a full disk's
    message)."""
    check_max_context(max_context)
    meta, header = lm_meta_header(head, q, max_context)
    spool = Path(path).resolve().parent

    def tensors() -> Iterator[Tensor]:
        from .model import check_supported_layer

        yield from head_tensors(head, q, max_context)
        # not enumerate(): it keeps the last item until the next one is made, so two layers
        # would be in memory while the next is read
        i = 0
        for item in layers:
            layer, lq, heat = item
            del item
            check_supported_layer(i, layer)
            yield from layer_tensors(i, layer, lq, heat)
            del layer, lq, heat  # before the next layer is read: one in memory at a time
            i += 1
        yield from tail_tensors(tokenizer)

    def write(f: BinaryIO) -> None:
        write_container_streamed(f, table_entries(tensors()), meta, header, spool)

    return write_file_atomic(path, write, needed)


# -- the model back from a container (`colibri reference F.clb`) -----------------------------------


#: Bounds the C reader puts on a version-2 header (runtime_c/src/lm_parse.c: LM_MAX_DIM,
#: COLIBRI_LM_MAX_LAYERS / _HEADS, LM_MAX_EXPERTS, COLIBRI_MAX_TOP_K).
LM_MAX_DIM = 1 << 24
LM_MAX_LAYERS = 4096
LM_MAX_HEADS = 4096
LM_MAX_EXPERTS = 65535
LM_MAX_TOP_K = 64
_SCHEME_DTYPES = {
    "fp32": np.dtype("<f4"),
    "fp16": np.dtype("<u2"),
    "int8": np.dtype("i1"),
    "int4": BLOCK_Q4_DTYPE,
    "q4k": BLOCK_Q4K_DTYPE,
    "q5k": BLOCK_Q5K_DTYPE,
}


def _stored_matrix(
    lm: LMContainer, name: str, scheme: str, n_out: int, n_in: int, blocked: bool = False
) -> QuantTensor:
    """The matrix `name` [n_out, n_in] as stored, which must be in `scheme` (fp32, fp16 bits,
    int8 with `name.scale`: one per row, or per block of 32 inputs when `blocked`, int4 / q4k /
    q5k blocks) and of that shape, as the C reader requires: exactly the QuantTensor the writer
    was given."""
    arr = lm.tensors.get(name)
    if arr is None:
        raise ModelFormatError(f"tensor '{name}' is missing")
    shape = lm.shapes[name]
    if arr.dtype != _SCHEME_DTYPES[scheme]:
        raise ModelFormatError(
            f"tensor '{name}' is stored as {arr.dtype}, but the file's tables make it {scheme}"
        )
    if shape != (n_out, n_in):
        raise ModelFormatError(
            f"tensor '{name}' has shape {list(shape)}, the header's dimensions make it "
            f"{[n_out, n_in]}"
        )
    scale = None
    if scheme == "int8":
        scale = _stored_vector(
            lm, f"{name}.scale", (n_out, q4_blocks(n_in)) if blocked else (n_out,)
        )
    return QuantTensor(scheme, n_out, n_in, arr, scale)


def _optional_vector(lm: LMContainer, name: str, shape: tuple[int, ...]) -> np.ndarray | None:
    """The fp32 tensor `name`, which must have exactly `shape`; None when absent."""
    arr = lm.tensors.get(name)
    if arr is not None and (arr.dtype != np.dtype("<f4") or lm.shapes[name] != shape):
        raise ModelFormatError(
            f"tensor '{name}' is {arr.dtype} {list(lm.shapes[name])}, expected float32 "
            f"{list(shape)}"
        )
    return arr


def _stored_vector(lm: LMContainer, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """The fp32 tensor `name` of exactly `shape`, which must be present."""
    arr = _optional_vector(lm, name, shape)
    if arr is None:
        raise ModelFormatError(f"tensor '{name}' is missing")
    return arr


def _f32_of(t: QuantTensor, lean: bool = False) -> np.ndarray:
    """A stored matrix as the IR's fp32 [in, out] weights (dequantised when quantised; with
    `lean` a quantised one is a read-only NaN placeholder of that shape, no memory: see
    :func:`read_lm_model`)."""
    if lean and t.scheme != "fp32":
        return np.broadcast_to(np.float32(np.nan), (t.n_in, t.n_out))
    return np.ascontiguousarray(t.dequantize().T, np.float32)


def _stored_ffn(
    lm: LMContainer, prefix: str, scheme: str, act: str, d_model: int, d_ff: int
) -> QuantExpert:
    """A SwiGLU FFN stored out-major (`prefix.w1` / `.w2` / `.w3`) in `scheme`; biases are not
    part of the format (the C reads none)."""
    w1 = _stored_matrix(lm, f"{prefix}.w1", scheme, d_ff, d_model)
    w2 = _stored_matrix(lm, f"{prefix}.w2", scheme, d_model, d_ff)
    w3 = _stored_matrix(lm, f"{prefix}.w3", scheme, d_ff, d_model)
    return QuantExpert(scheme, act, w1, w2, w3, None, None)


def read_lm_model(
    path: str | os.PathLike[str], lean: bool = False
) -> tuple[MoETransformer, TransformerQuant | None, int]:
    """A version-2 container back as the model and quantisation it was written from: (the
    model IR, with quantised matrices dequantised to fp32; the TransformerQuant of its stored
    weights, None when everything is fp32; its max_context). The numpy reference
    (:func:`colibri.reference.transformer.forward` with ``quant=``) on these gives what it gives
    on the checkpoint with the flags the file was converted with (`colibri reference F.clb`).

    `lean` (`colibri reference F.clb`: a file larger than the RAM): the file is mapped and the
    stored tensors are views of it, and the IR's fp32 copies of quantised matrices (the
    attention projections under --dense-quant, quantised experts and dense MLPs) are NaN
    placeholders without memory, which the quantised mirror never reads (it runs the
    TransformerQuant's tensors); the embedding and LM head are still dequantised. Memory: those
    two in fp32 and one matrix's codes at a time, whatever the experts' total."""
    return lm_model(read_lm_container(path, mapped=lean), str(path), lean)


def lm_model(
    lm: LMContainer, source: str, lean: bool = False
) -> tuple[MoETransformer, TransformerQuant | None, int]:
    """:func:`read_lm_model` of a container already read (`colibri verify`: one read)."""
    try:
        return _lm_model(lm, source, lean)
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelFormatError(f"{source}: not a whole model this version reads ({exc})") from None
    except ModelFormatError as exc:
        raise ModelFormatError(f"{source}: {exc}") from None


def lm_config(h: dict[str, int | float], meta: object) -> TransformerConfig:
    """The dimensions of a version-2 container as the C reads them: from its header `h`,
    checked as the C checks them (lm_parse.c, header_read); the metadata JSON `meta` must
    agree with the header. A ModelFormatError names what does not (its caller names the
    file)."""
    check_lm_meta("", h, meta)
    assert isinstance(meta, dict)
    arch = meta["config"].get("architecture")
    if not isinstance(arch, str):
        raise ModelFormatError("metadata config.architecture is not a string")
    d = {k: int(h[k]) for k in ("n_layers", "vocab_size", "d_model", "n_heads", "n_kv_heads")}
    hd, ctx, flags = int(h["head_dim"]), int(h["max_context"]), int(h["flags"])
    eps, clip, theta = float(h["rms_norm_eps"]), float(h["clip_qkv"]), float(h["rope_theta"])
    bad = [
        f"{k} {v}"
        for k, v, top in (
            ("n_layers", d["n_layers"], LM_MAX_LAYERS),
            ("vocab_size", d["vocab_size"], LM_MAX_DIM),
            ("d_model", d["d_model"], LM_MAX_DIM),
            ("n_heads", d["n_heads"], LM_MAX_HEADS),
            ("n_kv_heads", d["n_kv_heads"], d["n_heads"]),
            ("head_dim", hd, 65536),
            ("max_context", ctx, LM_MAX_DIM),
        )
        if not 1 <= v <= top
    ]
    if d["n_heads"] % max(d["n_kv_heads"], 1) or hd % 2 or d["n_heads"] * hd > LM_MAX_DIM:
        bad.append(f"n_heads {d['n_heads']} / n_kv_heads {d['n_kv_heads']} / head_dim {hd}")
    if flags & ~(FLAG_TIED | FLAG_QK_NORM | FLAG_CLIP_QKV):
        bad.append(f"flags {flags:#x}")
    if not (math.isfinite(eps) and eps > 0):
        bad.append(f"rms_norm_eps {eps}")
    if not (math.isfinite(clip) and clip >= 0) or bool(flags & FLAG_CLIP_QKV) != (clip > 0):
        bad.append(f"clip_qkv {clip}")
    if not (math.isfinite(theta) and theta > 0):
        bad.append(f"rope_theta {theta}")
    if int(h["sliding_window"]) > 2**31 - 1:
        bad.append(f"sliding_window {h['sliding_window']}")
    if bad:
        raise ModelFormatError(f"the header's {', '.join(bad)} are out of range")
    return TransformerConfig(
        arch,
        d["vocab_size"],
        d["d_model"],
        d["n_layers"],
        d["n_heads"],
        d["n_kv_heads"],
        hd,
        theta,
        eps,
        tie_word_embeddings=bool(flags & FLAG_TIED),
        qk_norm=bool(flags & FLAG_QK_NORM),
        clip_qkv=clip if flags & FLAG_CLIP_QKV else None,
        sliding_window=int(h["sliding_window"]) or None,
    )


def _schemes_ok(scheme: int, act: int) -> bool:
    """A (scheme, activation) code pair the kernels have (int8 activations for int8 / int4 /
    q4k / q5k only, and required by q4k / q5k), as the C checks it."""
    q8, q4k = SCHEME_CODES["int8"], SCHEME_CODES["q4k"]
    return (
        0 <= scheme <= SCHEME_CODES["q5k"]
        and act in (0, 1)
        and (scheme >= q8 if act == 1 else scheme < q4k)
    )


def layer_desc(arrays: dict[str, np.ndarray], i: int, dense: int, dense_act: int) -> dict[str, int]:
    """Layer i's descriptor (the int32 tensor ``layer.{i}.desc`` of `arrays`), checked as the C
    checks it (lm_parse.c, read_desc) against the header's dense scheme / activation codes."""
    from ..ir.moe import FLAG_GATED, FLAG_NORM_TOPK

    name = f"layer.{i}.desc"
    arr = arrays.get(name)
    if arr is None or arr.dtype != np.dtype("<i4") or arr.shape != (len(LAYER_DESC),):
        raise ModelFormatError(f"tensor '{name}' is missing or not int32 [{len(LAYER_DESC)}]")
    v = dict(zip(LAYER_DESC, (int(x) for x in arr)))
    ok = v["is_moe"] in (0, 1) and 0 <= v["ffn_d_ff"] <= LM_MAX_DIM
    if v["is_moe"]:
        ok = ok and (
            1 <= v["n_experts"] <= LM_MAX_EXPERTS
            and 1 <= v["top_k"] <= min(v["n_experts"], LM_MAX_TOP_K)
            and 1 <= v["d_ff"] <= LM_MAX_DIM
            and v["moe_flags"] & ~(FLAG_NORM_TOPK | FLAG_GATED) == 0
            and bool(v["moe_flags"] & FLAG_GATED)
            and 0 <= v["router_scheme"] <= SCHEME_CODES["int8"]
        )
    else:
        ok = ok and v["ffn_d_ff"] >= 1
    if v["ffn_d_ff"] and (v["ffn_scheme"] != dense or v["ffn_act"] != dense_act):
        ok = False
    if v["has_shared_gate"] not in (0, 1) or (
        v["has_shared_gate"] and (not v["is_moe"] or not v["ffn_d_ff"])
    ):
        ok = False
    if not ok:
        raise ModelFormatError(f"layer {i}'s descriptor {list(v.values())} is out of range")
    return v


def _check_stored(lm: LMContainer, c: TransformerConfig, max_context: int) -> None:
    """What the C checks of every tensor at load besides shapes: every fp32 value finite (its
    default NaN / Inf scan); and what it stores precomputed, the RoPE tables, equal to those of
    the header's rope_theta, which the numpy reference computes again."""
    for name, arr in lm.tensors.items():
        if arr.dtype == np.dtype("<f4") and not np.isfinite(arr).all():
            raise ModelFormatError(f"tensor '{name}' holds NaN or Inf")
    half = c.head_dim // 2
    cos, sin = rope_tables(c, np.arange(max_context))
    for name, want in (("rope.cos", cos), ("rope.sin", sin)):
        got = _stored_vector(lm, name, (max_context, half))
        if not np.array_equal(got, want[:, :half].astype(np.float32)):
            raise ModelFormatError(
                f"tensor '{name}' is not the RoPE table of the header's rope_theta {c.rope_theta}"
            )


def lm_scheme_names(h: dict[str, int | float], meta: dict) -> tuple[str, str, str, str, str]:
    """The schemes a version-2 container was converted with (after :func:`lm_config`): the
    experts' and their activations' (the metadata's defaults; each expert's own are in its
    layer's table), the dense matrices' and their activations' (the header's) and the
    routers'; a ModelFormatError when the header's pair is not one the kernels have or the
    metadata names an unknown scheme."""
    dense_code, dense_act_code = int(h["dense_scheme"]), int(h["dense_act"])
    if not _schemes_ok(dense_code, dense_act_code):
        raise ModelFormatError(
            f"the header's dense_scheme {dense_code} / dense_act {dense_act_code} are not a "
            f"scheme the kernels have"
        )
    qm = meta["quantization"]
    names = qm.get("scheme", "fp32"), qm.get("act", "fp32"), qm.get("router_scheme", "fp32")
    if not all(isinstance(v, str) for v in names) or (
        names[0] not in SCHEME_CODES or names[1] not in ACT_CODES or names[2] not in SCHEME_CODES
    ):
        raise ModelFormatError(
            f"metadata quantization {json.dumps(qm)[:200]} names an unknown scheme"
        )
    return names[0], names[1], SCHEME_NAMES[dense_code], ACT_NAMES[dense_act_code], names[2]


def _lm_model(
    lm: LMContainer, source: str, lean: bool = False
) -> tuple[MoETransformer, TransformerQuant | None, int]:
    from ..ir.moe import FLAG_GATED, FLAG_NORM_TOPK, Expert, MoEConfig, MoELayer
    from ..ir.transformer import Attention
    from ..quant.formats import QuantRouter, quantize_expert

    h, t = lm.header, lm.tensors
    c = lm_config(h, lm.meta)
    max_context = int(h["max_context"])
    scheme, act, dense, dense_act, router = lm_scheme_names(h, lm.meta)
    dense_code, dense_act_code = int(h["dense_scheme"]), int(h["dense_act"])  # checked above
    _check_stored(lm, c, max_context)
    q = TransformerQuant(scheme, act, {}, dense, dense_act, router_scheme=router)
    blocked = dense == "int8"
    dm, hq, hkv = c.d_model, c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim

    def mat(name: str, key: str, n_out: int, n_in: int) -> np.ndarray:
        m = _stored_matrix(lm, name, dense, n_out, n_in, blocked)
        if m.scheme != "fp32":
            q.dense[key] = m
        return _f32_of(m, lean)

    embed_t = _stored_matrix(lm, "embed", dense, c.vocab_size, dm, blocked)
    if embed_t.scheme != "fp32":
        q.dense["embed"] = embed_t
    embed = np.ascontiguousarray(embed_t.dequantize(), np.float32)  # [vocab, d] as stored
    lm_head = embed
    if not c.tie_word_embeddings:
        head_t = _stored_matrix(lm, "lm_head", dense, c.vocab_size, dm, blocked)
        if head_t.scheme != "fp32":
            q.dense["lm_head"] = head_t
        lm_head = np.ascontiguousarray(head_t.dequantize(), np.float32)
    layers = []
    for i in range(c.n_layers):
        p = f"layer.{i}"
        desc = layer_desc(t, i, dense_code, dense_act_code)

        def vec(name: str, n: int, p: str = p) -> np.ndarray | None:
            return _optional_vector(lm, f"{p}.{name}", (n,))

        att = Attention(
            wq=mat(f"{p}.attn.q", f"l{i}.wq", hq, dm),
            wk=mat(f"{p}.attn.k", f"l{i}.wk", hkv, dm),
            wv=mat(f"{p}.attn.v", f"l{i}.wv", hkv, dm),
            wo=mat(f"{p}.attn.o", f"l{i}.wo", dm, hq),
            bq=vec("attn.q_bias", hq),
            bk=vec("attn.k_bias", hkv),
            bv=vec("attn.v_bias", hkv),
            bo=vec("attn.o_bias", dm),
            q_norm=_stored_vector(lm, f"{p}.attn.q_norm", (hq,)) if c.qk_norm else None,
            k_norm=_stored_vector(lm, f"{p}.attn.k_norm", (hkv,)) if c.qk_norm else None,
        )
        ffn: Expert | None = None
        if desc["ffn_d_ff"]:
            qf = _stored_ffn(lm, f"{p}.ffn", dense, dense_act, dm, desc["ffn_d_ff"])
            assert qf.w3 is not None
            ffn = Expert(w1=_f32_of(qf.w1, lean), w2=_f32_of(qf.w2, lean), w3=_f32_of(qf.w3, lean))
            if qf.scheme != "fp32":
                q.dense_ffn[i] = qf
        moe: MoELayer | None = None
        if desc["is_moe"]:
            e, flags, f = desc["n_experts"], desc["moe_flags"], desc["d_ff"]
            mc = MoEConfig(
                e,
                desc["top_k"],
                dm,
                f,
                activation="silu",
                gated=bool(flags & FLAG_GATED),
                norm_topk_prob=bool(flags & FLAG_NORM_TOPK),
                vocab_size=c.vocab_size,
            )
            rt = _stored_matrix(lm, f"{p}.router", SCHEME_NAMES[desc["router_scheme"]], e, dm)
            router_w = np.ascontiguousarray(rt.dequantize(), np.float32)  # [E, d]
            if rt.scheme != "fp32":
                q.routers[i] = QuantRouter(rt.scheme, rt.data, rt.scale)
            tname = f"{p}.experts"
            table = t.get(tname)
            if (
                table is None
                or table.dtype != np.dtype("<i4")
                or lm.shapes[tname]
                != (
                    e,
                    len(EXPERT_COLUMNS),
                )
            ):
                raise ModelFormatError(
                    f"tensor '{tname}' is missing or not int32 [{e}, {len(EXPERT_COLUMNS)}]"
                )
            owners = [int(o) for o in table[:, 0]]
            for j, (o, es, ea) in enumerate(table.tolist()):
                if not (0 <= o < e and owners[o] == o and _schemes_ok(es, ea)):
                    raise ModelFormatError(
                        f"layer {i}'s expert table row {j} [owner {o}, scheme {es}, act {ea}] "
                        f"is out of range (owners must store themselves; q4k / q5k need int8 "
                        f"activations)"
                    )
            stored: dict[int, Expert] = {}
            qexperts: dict[int, QuantExpert] = {}
            for j in sorted(set(owners)):
                ep = f"{p}.expert.{j}"
                es, ea = SCHEME_NAMES[int(table[j, 1])], ACT_NAMES[int(table[j, 2])]
                if es == "fp32":  # the MoE IR layout [in][out], as the C reads it
                    stored[j] = Expert(
                        w1=_stored_vector(lm, f"{ep}.w1", (dm, f)),
                        w2=_stored_vector(lm, f"{ep}.w2", (f, dm)),
                        w3=_stored_vector(lm, f"{ep}.w3", (dm, f)),
                    )  # fmt: skip
                    qexperts[j] = quantize_expert(stored[j], "fp32", "fp32")
                else:
                    qe = _stored_ffn(lm, ep, es, ea, dm, f)
                    assert qe.w3 is not None
                    stored[j] = Expert(
                        w1=_f32_of(qe.w1, lean), w2=_f32_of(qe.w2, lean), w3=_f32_of(qe.w3, lean)
                    )
                    qexperts[j] = qe
            heat = vec(HEAT_TENSOR, e)
            if heat is not None and (heat < 0).any():
                raise ModelFormatError(f"tensor '{p}.{HEAT_TENSOR}' holds a negative value")
            q.experts[i] = qexperts
            gate = (
                _stored_vector(lm, f"{p}.shared_gate", (dm,)) if desc["has_shared_gate"] else None
            )
            moe = MoELayer(
                mc,
                router_w,
                None,
                [stored[o] for o in owners],
                sharing_map=owners,
                source=source,
                shared_expert=ffn,
                shared_gate=gate,
                storage=owners,  # the file's table, as the C reads it (not a content hash:
                # lean placeholders all hash alike)
            )
            ffn_mlp = None
        else:
            ffn_mlp = ffn
        input_norm = _stored_vector(lm, f"{p}.input_norm", (dm,))
        post_norm = _stored_vector(lm, f"{p}.post_norm", (dm,))
        layers.append(DecoderLayer(input_norm, att, post_norm, moe=moe, mlp=ffn_mlp))
    final_norm = _stored_vector(lm, "final_norm", (dm,))
    model = MoETransformer(c, embed, layers, final_norm, lm_head, source)
    quantised = bool(q.dense or q.dense_ffn or q.routers) or any(
        e.scheme != "fp32" for layer in q.experts.values() for e in layer.values()
    )
    return model, (q if quantised else None), max_context
