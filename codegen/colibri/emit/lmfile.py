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
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from .. import __version__
from ..errors import ConfigError, ModelFormatError
from ..frontends.container import (
    ACT_CODES,
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
    TOKENIZER_TENSOR,
    LMContainer,
    q4k_stream_dtype,
    q4k_stream_stored,
    read_lm_container,
)
from ..ir.transformer import DecoderLayer, MoETransformer
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


def _stored_matrix(lm: LMContainer, name: str) -> QuantTensor:
    """The matrix `name` [out, in] as stored: its scheme from its dtype (fp32, fp16 bits,
    int8 with `name.scale`, int4 / q4k blocks), exactly the QuantTensor the writer was given."""
    arr = lm.tensors.get(name)
    if arr is None:
        raise ModelFormatError(f"tensor '{name}' is missing")
    shape = lm.shapes[name]
    if len(shape) != 2:
        raise ModelFormatError(f"tensor '{name}' is not a matrix")
    n_out, n_in = shape
    if arr.dtype == BLOCK_Q4_DTYPE:
        return QuantTensor("int4", n_out, n_in, arr)
    if arr.dtype == BLOCK_Q4K_DTYPE:
        return QuantTensor("q4k", n_out, n_in, arr)
    if arr.dtype == BLOCK_Q5K_DTYPE:
        return QuantTensor("q5k", n_out, n_in, arr)
    if arr.dtype == np.dtype("<u2"):
        return QuantTensor("fp16", n_out, n_in, arr)
    if arr.dtype == np.dtype("i1"):
        scale = lm.tensors.get(f"{name}.scale")
        if scale is None:
            raise ModelFormatError(f"int8 tensor '{name}' has no '{name}.scale'")
        return QuantTensor("int8", n_out, n_in, arr, scale.astype(np.float32))
    if arr.dtype == np.dtype("<f4"):
        return QuantTensor("fp32", n_out, n_in, arr)
    raise ModelFormatError(f"tensor '{name}' has dtype {arr.dtype}, not a matrix scheme")


def _f32_of(t: QuantTensor, lean: bool = False) -> np.ndarray:
    """A stored matrix as the IR's fp32 [in, out] weights (dequantised when quantised; with
    `lean` a quantised one is a read-only NaN placeholder of that shape, no memory: see
    :func:`read_lm_model`)."""
    if lean and t.scheme != "fp32":
        return np.broadcast_to(np.float32(np.nan), (t.n_in, t.n_out))
    return np.ascontiguousarray(t.dequantize().T, np.float32)


def _stored_ffn(lm: LMContainer, prefix: str, act: str) -> QuantExpert:
    """A SwiGLU FFN stored out-major (`prefix.w1` / `.w2` / `.w3`, optional fp32 biases)."""
    w1, w2, w3 = (_stored_matrix(lm, f"{prefix}.{n}") for n in ("w1", "w2", "w3"))
    b1, b2 = (lm.tensors.get(f"{prefix}.{n}") for n in ("b1", "b2"))
    return QuantExpert(w1.scheme, act, w1, w2, w3, b1, b2)


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
    source = str(path)
    lm = read_lm_container(path, mapped=lean)
    try:
        return _lm_model(lm, source, lean)
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelFormatError(f"{source}: not a whole model this version reads ({exc})") from None
    except ModelFormatError as exc:
        raise ModelFormatError(f"{source}: {exc}") from None


def _lm_model(
    lm: LMContainer, source: str, lean: bool = False
) -> tuple[MoETransformer, TransformerQuant | None, int]:
    from ..ir.moe import FLAG_GATED, FLAG_NORM_TOPK, Expert, MoEConfig, MoELayer
    from ..ir.transformer import Attention, TransformerConfig
    from ..quant.formats import QuantRouter, quantize_expert

    h, t = lm.header, lm.tensors
    c = TransformerConfig(**lm.meta["config"])
    qm = lm.meta.get("quantization") or {}
    scheme, act = str(qm.get("scheme", "fp32")), str(qm.get("act", "fp32"))
    dense, router = str(qm.get("dense_scheme", "fp32")), str(qm.get("router_scheme", "fp32"))
    dense_act = str(qm.get("dense_act", "fp32"))
    quantised = scheme != "fp32" or dense != "fp32" or router != "fp32"
    q = TransformerQuant(scheme, act, {}, dense, dense_act, router_scheme=router)
    acts = {v: k for k, v in ACT_CODES.items()}
    schemes = {v: k for k, v in SCHEME_CODES.items()}

    def mat(name: str, key: str) -> np.ndarray:
        m = _stored_matrix(lm, name)
        if m.scheme != "fp32":
            q.dense[key] = m
        return _f32_of(m, lean)

    embed_t = _stored_matrix(lm, "embed")
    if embed_t.scheme != "fp32":
        q.dense["embed"] = embed_t
    embed = np.ascontiguousarray(embed_t.dequantize(), np.float32)  # [vocab, d] as stored
    lm_head = embed
    if not c.tie_word_embeddings:
        head_t = _stored_matrix(lm, "lm_head")
        if head_t.scheme != "fp32":
            q.dense["lm_head"] = head_t
        lm_head = np.ascontiguousarray(head_t.dequantize(), np.float32)
    layers = []
    for i in range(c.n_layers):
        p = f"layer.{i}"
        desc = dict(zip(LAYER_DESC, (int(v) for v in t[f"{p}.desc"])))

        def opt(name: str) -> np.ndarray | None:
            return t.get(name)

        att = Attention(
            wq=mat(f"{p}.attn.q", f"l{i}.wq"),
            wk=mat(f"{p}.attn.k", f"l{i}.wk"),
            wv=mat(f"{p}.attn.v", f"l{i}.wv"),
            wo=mat(f"{p}.attn.o", f"l{i}.wo"),
            bq=opt(f"{p}.attn.q_bias"),
            bk=opt(f"{p}.attn.k_bias"),
            bv=opt(f"{p}.attn.v_bias"),
            bo=opt(f"{p}.attn.o_bias"),
            q_norm=opt(f"{p}.attn.q_norm"),
            k_norm=opt(f"{p}.attn.k_norm"),
        )
        ffn: Expert | None = None
        if desc["ffn_d_ff"]:
            qf = _stored_ffn(lm, f"{p}.ffn", acts[desc["ffn_act"]])
            assert qf.w3 is not None
            ffn = Expert(w1=_f32_of(qf.w1, lean), w2=_f32_of(qf.w2, lean), w3=_f32_of(qf.w3, lean))
            if qf.scheme != "fp32":
                q.dense_ffn[i] = qf
        moe: MoELayer | None = None
        if desc["is_moe"]:
            e, flags = desc["n_experts"], desc["moe_flags"]
            mc = MoEConfig(
                e,
                desc["top_k"],
                c.d_model,
                desc["d_ff"],
                activation="silu",
                gated=bool(flags & FLAG_GATED),
                norm_topk_prob=bool(flags & FLAG_NORM_TOPK),
                vocab_size=c.vocab_size,
            )
            rt = _stored_matrix(lm, f"{p}.router")
            router_w = np.ascontiguousarray(rt.dequantize(), np.float32)  # [E, d]
            if rt.scheme != "fp32":
                q.routers[i] = QuantRouter(rt.scheme, rt.data, rt.scale)
            table = t[f"{p}.experts"].reshape(e, len(EXPERT_COLUMNS))
            owners = [int(o) for o in table[:, 0]]
            stored: dict[int, Expert] = {}
            qexperts: dict[int, QuantExpert] = {}
            for j in sorted(set(owners)):
                ep = f"{p}.expert.{j}"
                es, ea = schemes[int(table[j, 1])], acts[int(table[j, 2])]
                if es == "fp32":
                    stored[j] = Expert(
                        w1=t[f"{ep}.w1"], w2=t[f"{ep}.w2"], w3=t.get(f"{ep}.w3"),
                        b1=t.get(f"{ep}.b1"), b2=t.get(f"{ep}.b2"),
                    )  # fmt: skip
                    qexperts[j] = quantize_expert(stored[j], "fp32", "fp32")
                else:
                    qe = _stored_ffn(lm, ep, ea)
                    assert qe.w3 is not None
                    stored[j] = Expert(
                        w1=_f32_of(qe.w1, lean), w2=_f32_of(qe.w2, lean),
                        w3=_f32_of(qe.w3, lean), b1=qe.b1, b2=qe.b2,
                    )  # fmt: skip
                    qexperts[j] = qe
            q.experts[i] = qexperts
            moe = MoELayer(
                mc,
                router_w,
                None,
                [stored[o] for o in owners],
                sharing_map=owners,
                source=source,
                shared_expert=ffn,
                shared_gate=t.get(f"{p}.shared_gate"),
                storage=owners,  # the file's table, as the C reads it (not a content hash:
                # lean placeholders all hash alike)
            )
            ffn_mlp = None
        else:
            ffn_mlp = ffn
        layers.append(
            DecoderLayer(t[f"{p}.input_norm"], att, t[f"{p}.post_norm"], moe=moe, mlp=ffn_mlp)
        )
    model = MoETransformer(c, embed, layers, t["final_norm"], lm_head, source)
    return model, (q if quantised else None), int(h["max_context"])
