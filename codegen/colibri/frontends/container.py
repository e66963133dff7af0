"""The Colibri container (.clb), both versions: its byte format, defined once here, and its
readers. Byte layout: docs/format.md (section 1: version 1, one MoE block; section 1b: version
2, a whole transformer).

Both versions share the 8-byte magic, the 128-byte header (version 1 :data:`HEADER`, version
2 :data:`LM_HEADER`; the version is the word after the magic), the 96-byte tensor-table entry
(:data:`ENTRY`, packed by :func:`pack_entry`), the metadata (JSON) and the blobs, each at a
multiple of :data:`ALIGN` (:func:`align`) in table order, with a CRC-32 per tensor. The
writers (:mod:`colibri.emit.container`: version 1 and the image of either version;
:mod:`colibri.emit.lmfile`: version 2) pack with these same structs and codes; the readers
below (:func:`read_container`, :func:`read_table`; :func:`read_lm_container`,
:func:`read_lm_header`, :func:`read_lm_table`, :func:`read_lm_tokenizer`) unpack with them.
The model back from a version-2 file with its quantisation
(:func:`colibri.emit.lmfile.read_lm_model`) needs the quantiser's types and so lives after it.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelFormatError, ShapeError
from ..ir.moe import Expert, MoEConfig, MoELayer, validate_sharing_map

# -- the format ------------------------------------------------------------------------------

MAGIC = b"CLBRMOE\0"
#: Version 1: one MoE block (`colibri convert MODEL --out F.clb`, `colibri export`).
VERSION = 1
#: Version 2: a whole decoder-only transformer (`colibri convert CKPT --out F.clb`).
LM_VERSION = 2
ALIGN = 64
HEADER_SIZE = 128
ENTRY_SIZE = 96
NAME_SIZE = 48
NO_EXPERT = 0xFFFFFFFF

#: Version-1 header fields, in order (then 44 reserved bytes).
LAYER_HEADER_FIELDS = (
    "magic",
    "version",
    "alignment",
    "n_experts",
    "top_k",
    "d_model",
    "d_ff",
    "activation",
    "flags",
    "n_tensors",
    "meta_bytes",
    "table_offset",
    "meta_offset",
    "data_offset",
    "file_size",
    "vocab_size",
)
HEADER = struct.Struct("<8s10I4QI44x")
#: Version-2 header fields, in order (then 8 reserved bytes).
HEADER_FIELDS = (
    "magic",
    "version",
    "alignment",
    "kind",
    "n_tensors",
    "meta_bytes",
    "n_layers",
    "table_offset",
    "meta_offset",
    "data_offset",
    "file_size",
    "vocab_size",
    "d_model",
    "n_heads",
    "n_kv_heads",
    "head_dim",
    "max_context",
    "flags",
    "rms_norm_eps",
    "clip_qkv",
    "sliding_window",
    "rope_theta",
    "dense_scheme",
    "dense_act",
)
LM_HEADER = struct.Struct("<8s6I4Q7I2fIdII8x")
#: Tensor-table entry fields, in order (both versions; shape: 4 dims, unused ones 0).
ENTRY_FIELDS = ("name", "dtype", "ndim", "shape", "offset", "nbytes", "expert", "crc32")
ENTRY = struct.Struct("<48sII4IQQII")
assert HEADER.size == HEADER_SIZE and LM_HEADER.size == HEADER_SIZE and ENTRY.size == ENTRY_SIZE
assert len(HEADER.unpack(bytes(HEADER_SIZE))) == len(LAYER_HEADER_FIELDS)
assert len(LM_HEADER.unpack(bytes(HEADER_SIZE))) == len(HEADER_FIELDS)

#: Table dtype codes of version 1 (the weights' numpy dtypes).
DTYPES: dict[int, np.dtype] = {
    0: np.dtype("<f4"),
    1: np.dtype("<f2"),
    2: np.dtype("i1"),
    4: np.dtype("<i4"),
}
DTYPE_CODES = {v: k for k, v in DTYPES.items()}
#: Table dtype of int4 blocks of 32 (colibri_block_q4_32, 18 bytes; the shape is [out, in]).
DTYPE_Q4 = 3
#: Values per int4 block (COLIBRI_QK4).
QK4 = 32
#: numpy mirror of colibri_block_q4_32 (C struct: uint16_t d; uint8_t qs[16]; 18 bytes), the
#: stored form of dtype code 3 (colibri.quant.formats quantises into it).
BLOCK_Q4_DTYPE = np.dtype([("d", "<u2"), ("qs", "u1", (QK4 // 2,))])
#: Table dtype of q4k matrices (colibri_block_q4k super-blocks, 144 bytes, running across rows:
#: :func:`q4k_bytes`; the shape is [out, in]).
DTYPE_Q4K = 7
#: Values per q4k super-block (COLIBRI_QK_K).
QK_K = 256
#: numpy mirror of colibri_block_q4k (C: uint16_t d, dmin; uint8_t scales[12]; uint8_t
#: qs[128]; 144 bytes), the stored form of dtype code 7 (colibri.quant.formats: the q4k
#: section).
BLOCK_Q4K_DTYPE = np.dtype(
    [("d", "<u2"), ("dmin", "<u2"), ("scales", "u1", (12,)), ("qs", "u1", (QK_K // 2,))]
)
#: Table dtype of q5k matrices (colibri_block_q5k super-blocks, 176 bytes; the shape is
#: [out, in]).
DTYPE_Q5K = 8
#: Table dtypes 5 / 6: q4k / q5k in the layout before issue 38's streams (each row its own
#: super-blocks, the last cut), which no reader takes any more: such a file is refused.
OLD_KQUANT_DTYPES: dict[int, str] = {5: "q4k", 6: "q5k"}
#: numpy mirror of colibri_block_q5k (C: uint16_t d, dmin; uint8_t scales[12]; uint8_t
#: qs[160]; 176 bytes): q4k's layout with 20 bytes per sub-block (16 of low nibbles, then 4
#: holding the codes' fifth bits).
BLOCK_Q5K_DTYPE = np.dtype(
    [("d", "<u2"), ("dmin", "<u2"), ("scales", "u1", (12,)), ("qs", "u1", (8 * 20,))]
)
#: The k-quant-class schemes: dtype of their super-blocks by code bits.
KQUANT_DTYPES: dict[int, np.dtype] = {4: BLOCK_Q4K_DTYPE, 5: BLOCK_Q5K_DTYPE}
#: Table dtype codes of their stored matrices by code bits.
KQUANT_DTYPE_CODES: dict[int, int] = {4: DTYPE_Q4K, 5: DTYPE_Q5K}
#: Bytes of a super-block's head (d, dmin, scales).
KQUANT_HEAD_BYTES = 16
#: Sub-blocks (of 32 weights) per super-block.
KQUANT_SUBS = 8


def kquant_sub_bytes(bits: int) -> int:
    """Bytes of one sub-block of 32 codes: 16 of nibbles, + 4 of fifth bits (q5k)."""
    return 16 if bits == 4 else 20


def kquant_bits(dtype: np.dtype) -> int:
    """Code bits (4 or 5) of a k-quant super-block dtype."""
    return 4 if dtype == BLOCK_Q4K_DTYPE else 5


def q4k_row_subs(n_in: int) -> int:
    """COLIBRI_KQ_SUBS: sub-blocks of 32 per row of n_in weights (the last zero-padded)."""
    return (n_in + 31) // 32


def q4k_group_rows(n_in: int) -> int:
    """COLIBRI_KQ_GROUP_ROWS: rows whose sub-blocks fill whole super-blocks, 8 / gcd(nsub, 8)
    (1 when a row is whole super-blocks). Row r starts a super-block when r is a multiple."""
    return KQUANT_SUBS // math.gcd(q4k_row_subs(n_in), KQUANT_SUBS)


def q4k_stream_blocks(n_out: int, n_in: int) -> int:
    """Super-blocks of an [n_out, n_in] matrix's stream (the last one possibly partial)."""
    return (n_out * q4k_row_subs(n_in) + KQUANT_SUBS - 1) // KQUANT_SUBS


def q4k_bytes(n_rows: int, n_in: int, bits: int = 4) -> int:
    """COLIBRI_Q4K_BYTES / COLIBRI_Q5K_BYTES: stored bytes of the first n_rows rows of n_in
    weights: the stream of their n_rows * nsub sub-blocks in row-major order, in super-blocks
    of 8, the last one cut after its last used sub-block (head + 16 / 20 bytes per sub-block).
    With n_rows a multiple of q4k_group_rows(n_in), also where row n_rows starts."""
    full, rest = divmod(n_rows * q4k_row_subs(n_in), KQUANT_SUBS)
    tail = KQUANT_HEAD_BYTES + kquant_sub_bytes(bits) * rest if rest else 0
    return full * KQUANT_DTYPES[bits].itemsize + tail


def q4k_stream_stored(blocks: np.ndarray, n_out: int, n_in: int) -> np.ndarray:
    """A matrix's super-blocks [nsb] as stored: uint8 [q4k_bytes(n_out, n_in, bits)]."""
    raw = np.ascontiguousarray(blocks).view(np.uint8).reshape(-1)
    return np.ascontiguousarray(raw[: q4k_bytes(n_out, n_in, kquant_bits(blocks.dtype))])


def q4k_stream_restore(raw: np.ndarray, n_out: int, n_in: int, bits: int = 4) -> np.ndarray:
    """The inverse of :func:`q4k_stream_stored`: super-blocks [nsb], unused sub-blocks zero."""
    dt = KQUANT_DTYPES[bits]
    full = np.zeros(q4k_stream_blocks(n_out, n_in) * dt.itemsize, np.uint8)
    full[: q4k_bytes(n_out, n_in, bits)] = np.asarray(raw, np.uint8).reshape(-1)
    return full.view(dt)


#: The array type the container writer takes for a q4k / q5k matrix as stored (dtype 7 / 8):
#: one record of its bytes.
def q4k_stream_dtype(n_out: int, n_in: int, bits: int = 4) -> np.dtype:
    return np.dtype([(f"q{bits}k_stream", "u1", (q4k_bytes(n_out, n_in, bits),))])


#: Version 2 reads the item dtypes as stored (fp16 as its bits).
LM_DTYPES: dict[int, np.dtype] = {
    0: np.dtype("<f4"),
    1: np.dtype("<u2"),
    2: np.dtype("i1"),
    4: np.dtype("<i4"),
}

#: Version 2: the tensor holding the checkpoint's tokenizer.json (int8 bytes; the runtime
#: skips it).
TOKENIZER_TENSOR = "tokenizer.json"
#: Version 2: the per-layer calibration heat (`layer.{i}.heat`, f32 [n_experts]; optional).
HEAT_TENSOR = "heat"
#: Version-2 header `kind` of a whole decoder-only transformer.
KIND_DECODER = 1
#: Weight schemes of the version-2 descriptors (colibri_quant_scheme order).
SCHEME_CODES = {"fp32": 0, "fp16": 1, "int8": 2, "int4": 3, "q4k": 4, "q5k": 5}
ACT_CODES = {"fp32": 0, "int8": 1}
#: The codes back to their names.
SCHEME_NAMES = {v: k for k, v in SCHEME_CODES.items()}
ACT_NAMES = {v: k for k, v in ACT_CODES.items()}
#: Version-2 header flags.
FLAG_TIED = 0x1
FLAG_QK_NORM = 0x2
FLAG_CLIP_QKV = 0x4
FLAGS_KNOWN = FLAG_TIED | FLAG_QK_NORM | FLAG_CLIP_QKV
#: Entries of a version-2 layer descriptor (`layer.{i}.desc`, int32).
LAYER_DESC = (
    "is_moe",
    "n_experts",
    "top_k",
    "d_ff",
    "moe_flags",
    "router_scheme",
    "ffn_d_ff",
    "ffn_scheme",
    "ffn_act",
    "has_shared_gate",
)
#: Columns of a version-2 layer's expert table (`layer.{i}.experts`, int32 [E, 3]).
EXPERT_COLUMNS = ("owner", "scheme", "act")


def entry_name(raw: bytes) -> str:
    """A table entry's name: its bytes up to the first NUL, as the C reader compares them
    (whatever follows the NUL is padding)."""
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def align(n: int) -> int:
    """`n` rounded up to a multiple of ALIGN (where the metadata ends and each blob starts)."""
    return (n + ALIGN - 1) // ALIGN * ALIGN


def q4_blocks(n_in: int) -> int:
    """COLIBRI_Q4_BLOCKS: int4 blocks per row of `n_in` values (the last one zero-padded)."""
    return (n_in + QK4 - 1) // QK4


def pack_entry(
    name: str, dtype: int, shape: tuple[int, ...], offset: int, nbytes: int, expert: int, crc: int
) -> bytes:
    """One tensor-table entry (ShapeError for a name or shape the entry cannot hold)."""
    raw = name.encode()
    if len(raw) >= NAME_SIZE:
        raise ShapeError(f"tensor name {name!r} is longer than {NAME_SIZE - 1} bytes")
    if len(shape) > 4:
        raise ShapeError(f"tensor {name!r} has {len(shape)} dimensions; at most 4")
    dims = list(shape) + [0] * (4 - len(shape))
    return ENTRY.pack(
        raw.ljust(NAME_SIZE, b"\0"), dtype, len(shape), *dims, offset, nbytes, expert, crc
    )


# -- version 1: one MoE block ------------------------------------------------------------------


@dataclass(frozen=True)
class TensorEntry:
    """One row of the tensor table."""

    name: str
    dtype: int
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    expert: int
    crc32: int


def read_table(data: bytes, source: str) -> tuple[tuple[int, ...], list[TensorEntry], dict]:
    """Parse and check the header, tensor table and metadata of a container image."""
    if len(data) < HEADER_SIZE:
        raise ModelFormatError(
            f"{source}: truncated Colibri container: {len(data)} bytes, the header alone is "
            f"{HEADER_SIZE}"
        )
    h = HEADER.unpack_from(data, 0)
    if h[0] != MAGIC:
        raise ModelFormatError(f"{source}: bad magic {h[0]!r}, expected {MAGIC!r}")
    version, align, e, k, d, f, act, flags, n_t, meta_bytes = h[1:11]
    table_off, meta_off, data_off, file_size, _vocab = h[11:16]
    if version == LM_VERSION:
        raise ModelFormatError(
            f"{source}: a whole-model container (version 2), not a single MoE block: run it "
            f"with `colibri run {source} --prompt-ids 1,5,9` (or colibri.targets.binding.LM)"
        )
    if version != VERSION:
        raise ModelFormatError(
            f"{source}: container version {version} is not supported (this Colibri reads "
            f"version {VERSION}); re-convert the model with `colibri convert`"
        )
    if file_size > len(data):
        raise ModelFormatError(
            f"{source}: truncated: header says {file_size} bytes, file has {len(data)}"
        )
    if file_size != len(data):
        raise ModelFormatError(
            f"{source}: file is {len(data)} bytes but its header says {file_size}"
        )
    if align != ALIGN or table_off != HEADER_SIZE or meta_off != table_off + n_t * ENTRY_SIZE:
        raise ModelFormatError(f"{source}: inconsistent container header (table/alignment)")
    if meta_off + meta_bytes > data_off or data_off % ALIGN or data_off > len(data):
        raise ModelFormatError(f"{source}: inconsistent container header (metadata/data offset)")
    entries = []
    for i in range(n_t):
        name_b, dtype, ndim, s0, s1, s2, s3, off, nb, expert, crc = ENTRY.unpack_from(
            data, table_off + i * ENTRY_SIZE
        )
        name = entry_name(name_b)
        if dtype not in DTYPES or not 1 <= ndim <= 4:
            raise ModelFormatError(f"{source}: tensor '{name}' has unknown dtype {dtype}/ndim")
        shape = (s0, s1, s2, s3)[:ndim]
        if off % ALIGN or off < data_off or off + nb > len(data):
            raise ModelFormatError(
                f"{source}: tensor '{name}' at offset {off} (+{nb} bytes) lies outside the "
                f"file or is misaligned; the file is truncated or corrupt"
            )
        if int(np.prod(shape)) * DTYPES[dtype].itemsize != nb:
            raise ModelFormatError(f"{source}: tensor '{name}' size does not match its shape")
        if zlib.crc32(data[off : off + nb]) != crc:
            raise ModelFormatError(f"{source}: tensor '{name}' fails its CRC-32 check (corrupt)")
        entries.append(TensorEntry(name, dtype, shape, off, nb, expert, crc))
    try:
        meta = json.loads(data[meta_off : meta_off + meta_bytes].decode())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ModelFormatError(f"{source}: metadata is not valid JSON ({exc})") from exc
    if not isinstance(meta, dict):
        raise ModelFormatError(f"{source}: metadata is not a JSON object; the file is corrupt")
    return (e, k, d, f, act, flags), entries, meta


def read_container(path: str | os.PathLike[str]) -> MoELayer:
    """Read a container into the IR (tensors copied out of the file)."""
    from ..ir.moe import ACTIVATIONS, FLAG_GATED, FLAG_NORM_TOPK, MAX_TOP_K

    path = Path(path)
    data = path.read_bytes()
    source = str(path)
    (e, k, d, f, act, flags), entries, meta = read_table(data, source)
    if act >= len(ACTIVATIONS):
        raise ModelFormatError(f"{source}: unknown activation code {act}")
    if min(e, d, f) < 1 or not 1 <= k <= min(e, MAX_TOP_K):
        raise ModelFormatError(
            f"{source}: header says n_experts={e}, k={k}, d_model={d}, d_ff={f}; each must be "
            f">= 1 and k <= n_experts (at most {MAX_TOP_K}): the file is corrupt"
        )
    meta_config = meta.get("config")
    vocab = meta_config.get("vocab_size") if isinstance(meta_config, dict) else None
    if vocab is not None and (isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1):
        raise ModelFormatError(
            f"{source}: metadata config.vocab_size {vocab!r} is not an integer >= 1; the file "
            f"is corrupt"
        )
    config = MoEConfig(
        n_experts=e,
        top_k=k,
        d_model=d,
        d_ff=f,
        activation=ACTIVATIONS[act],
        gated=bool(flags & FLAG_GATED),
        norm_topk_prob=bool(flags & FLAG_NORM_TOPK),
        vocab_size=vocab,
    )
    by_name = {t.name: t for t in entries}

    def get(name: str, required: bool = True) -> np.ndarray | None:
        t = by_name.get(name)
        if t is None:
            if required:
                raise ModelFormatError(f"{source}: tensor '{name}' is missing")
            return None
        arr = np.frombuffer(
            data, dtype=DTYPES[t.dtype], count=int(np.prod(t.shape)), offset=t.offset
        )
        return arr.reshape(t.shape).copy()

    share = get("expert_sharing_map", required=False)
    if share is None and e > len(entries):  # every expert needs its own tensors
        raise ModelFormatError(
            f"{source}: header says {e} experts but the file has {len(entries)} tensors and no "
            f"expert_sharing_map: the file is corrupt"
        )
    storage = [int(v) for v in share] if share is not None else list(range(e))
    validate_sharing_map(storage, e, source)
    experts: dict[int, Expert] = {}
    for i in sorted(set(storage)):
        w1, w2 = get(f"expert.{i}.w1"), get(f"expert.{i}.w2")
        assert w1 is not None and w2 is not None
        experts[i] = Expert(
            w1=w1,
            w2=w2,
            b1=get(f"expert.{i}.b1", required=False),
            b2=get(f"expert.{i}.b2", required=False),
            w3=get(f"expert.{i}.w3", required=False),
        )
    router_w = get("router.weight")
    assert router_w is not None
    layer = MoELayer(
        config=config,
        router_w=router_w,
        router_b=get("router.bias", required=False),
        experts=[experts[storage[i]] for i in range(e)],
        sharing_map=storage if share is not None else None,
        source=source,
        metadata=meta,
    )
    try:
        return layer.validate()
    except ShapeError as exc:
        raise ModelFormatError(str(exc)) from exc


# -- version 2: a whole transformer ------------------------------------------------------------


@dataclass
class LMContainer:
    """A version-2 container read back: header fields, and every tensor by name (numpy arrays
    of the stored dtype; int4 blocks as BLOCK_Q4_DTYPE [out, blocks])."""

    header: dict[str, int | float]
    tensors: dict[str, np.ndarray]
    meta: dict
    #: Each tensor's logical shape from the table (an int4 matrix: [out, in], not its blocks).
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)


def is_lm_container(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a file starting with a version-2 container header."""
    p = Path(path)
    if not p.is_file():
        return False
    with open(p, "rb") as f:
        head = f.read(12)
    return (
        len(head) == 12 and head[:8] == MAGIC and struct.unpack_from("<I", head, 8)[0] == LM_VERSION
    )


def check_lm_layout(h: dict[str, Any], size: int, source: str) -> None:
    """A version-2 header's sizes and offsets against the file's `size` bytes, as the C
    checks them: the table right after the header, the metadata after it, the data aligned,
    all inside the file."""
    if h["file_size"] != size:
        raise ModelFormatError(
            f"{source}: the header says {h['file_size']} bytes, the file has {size}: "
            f"truncated or corrupt"
        )
    n = int(h["n_tensors"])
    if (
        h["alignment"] != ALIGN
        or h["table_offset"] != HEADER_SIZE
        or n == 0
        or h["meta_offset"] != HEADER_SIZE + ENTRY_SIZE * n
        or h["meta_offset"] + h["meta_bytes"] > h["data_offset"]
        or h["data_offset"] % ALIGN
        or h["data_offset"] > size
    ):
        raise ModelFormatError(f"{source}: inconsistent header offsets")


def read_lm_header(path: str | os.PathLike[str]) -> tuple[dict[str, int | float], dict]:
    """The header fields and metadata of a version-2 container, without reading its tensors
    (the runtime validates those); ModelFormatError when it is not one."""
    source = str(path)
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER_SIZE)
            if len(head) < HEADER_SIZE:
                raise ModelFormatError(
                    f"{source}: truncated: {len(head)} bytes, the container header is {HEADER_SIZE}"
                )
            h = dict(zip(HEADER_FIELDS, LM_HEADER.unpack_from(head, 0)))
            if h["magic"] != MAGIC:
                raise ModelFormatError(f"{source}: not a Colibri container (bad magic)")
            if h["version"] != LM_VERSION or h["kind"] != KIND_DECODER:
                raise ModelFormatError(
                    f"{source}: container version {h['version']} is a single MoE block, not a "
                    f"whole model: generate C from it (`colibri generate {source} --out DIR`) "
                    f"and run DIR, or convert a Hugging Face checkpoint without --layer"
                )
            check_lm_layout(h, os.fstat(f.fileno()).st_size, source)
            f.seek(int(h["meta_offset"]))
            raw = f.read(min(int(h["meta_bytes"]), 1 << 24))
    except OSError as exc:
        raise ModelFormatError(f"{source}: cannot read ({exc.strerror})") from None
    try:
        meta = json.loads(raw.decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        meta = {}
    return h, meta if isinstance(meta, dict) else {}


@dataclass(frozen=True)
class LMTableEntry:
    """One tensor of a version-2 container's table: name, dtype code, logical shape, bytes."""

    name: str
    dtype: int
    shape: tuple[int, ...]
    nbytes: int
    offset: int
    crc: int


def lm_table_entry(
    table: bytes | memoryview, at: int, i: int, end: int, size: int, source: str
) -> LMTableEntry:
    """Entry `i` of a version-2 table (unpacked at byte `at`), placed as the C reader checks it:
    a name, 1..4 dimensions, its bytes aligned, after the previous tensor's `end` and inside
    the file's `size`; a ModelFormatError names the tensor otherwise."""
    name_b, dtype, ndim, s0, s1, s2, s3, off, nb, _expert, crc = ENTRY.unpack_from(table, at)
    name = entry_name(name_b)
    if not 1 <= ndim <= 4:
        raise ModelFormatError(f"{source}: tensor {i} ('{name}') has {ndim} dimensions")
    if not name or off % ALIGN or off < end or off + nb > size:
        raise ModelFormatError(f"{source}: tensor {i} ('{name}') is misplaced or truncated")
    return LMTableEntry(name, dtype, (s0, s1, s2, s3)[:ndim], nb, off, crc)


def read_lm_table(
    path: str | os.PathLike[str], small: Iterable[str] = ()
) -> tuple[dict[str, int | float], dict, list[LMTableEntry], dict[str, np.ndarray]]:
    """The header, metadata and tensor table of a version-2 container, and the tensors whose
    names end with one of `small` (e.g. ``.desc``: int32 descriptors), CRC-32 checked; the
    weights themselves are not read (`colibri inspect`)."""
    source = str(path)
    h, meta = read_lm_header(path)
    n = int(h["n_tensors"])
    suffixes = tuple(small)
    entries: list[LMTableEntry] = []
    arrays: dict[str, np.ndarray] = {}
    try:
        with open(path, "rb") as f:
            f.seek(HEADER_SIZE)
            table = f.read(ENTRY_SIZE * n)
            if len(table) != ENTRY_SIZE * n:
                raise ModelFormatError(f"{source}: truncated tensor table")
            end, seen = int(h["data_offset"]), set()
            for i in range(n):
                e = lm_table_entry(table, i * ENTRY_SIZE, i, end, int(h["file_size"]), source)
                if e.name in seen:
                    raise ModelFormatError(f"{source}: tensor '{e.name}' appears twice")
                seen.add(e.name)
                end = e.offset + e.nbytes
                entries.append(e)
                if suffixes and e.name.endswith(suffixes) and e.dtype in LM_DTYPES:
                    f.seek(e.offset)
                    data = f.read(e.nbytes)
                    dt = LM_DTYPES[e.dtype]
                    count = math.prod(e.shape)
                    if (
                        len(data) != e.nbytes
                        or zlib.crc32(data) != e.crc
                        or e.nbytes != count * dt.itemsize
                    ):
                        raise ModelFormatError(
                            f"{source}: tensor '{e.name}' is truncated or corrupt"
                        )
                    arrays[e.name] = np.frombuffer(data, dt).reshape(e.shape).copy()
    except OSError as exc:
        raise ModelFormatError(f"{source}: cannot read ({exc.strerror})") from None
    return h, meta, entries, arrays


def read_lm_container(path: str | os.PathLike[str], mapped: bool = False) -> LMContainer:
    """Read a version-2 container back: header, tensors (CRC-32 checked), metadata; a
    ModelFormatError names what is wrong. `mapped`: the file is mapped read-only and the
    tensors are views of the mapping, not copies (a file larger than the RAM: the page cache
    holds what is read; the CRC-32 checks read every tensor once)."""
    source = str(path)
    data: bytes | memoryview
    if mapped:
        try:
            with open(path, "rb") as f:  # the mapping keeps its own reference to the file
                data = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
        except (OSError, ValueError) as exc:  # ValueError: an empty file cannot be mapped
            raise ModelFormatError(f"{source}: cannot map ({exc})") from None
    else:
        data = Path(path).read_bytes()
    if len(data) < HEADER_SIZE:
        raise ModelFormatError(f"{source}: truncated: {len(data)} bytes, the header is 128")
    h = dict(zip(HEADER_FIELDS, LM_HEADER.unpack_from(data, 0)))
    if h["magic"] != MAGIC:
        raise ModelFormatError(f"{source}: not a Colibri container (bad magic)")
    if h["version"] != LM_VERSION or h["kind"] != KIND_DECODER:
        raise ModelFormatError(
            f"{source}: container version {h['version']} kind {h['kind']}: not a whole-model "
            f"(version 2) container"
        )
    check_lm_layout(h, len(data), source)
    n = int(h["n_tensors"])
    tensors: dict[str, np.ndarray] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    end = int(h["data_offset"])
    for i in range(n):
        e = lm_table_entry(data, HEADER_SIZE + i * ENTRY_SIZE, i, end, len(data), source)
        name, dtype, shape, off, nb, crc = e.name, e.dtype, e.shape, e.offset, e.nbytes, e.crc
        ndim = len(shape)
        end = off + nb
        if zlib.crc32(data[off : off + nb]) != crc:
            raise ModelFormatError(f"{source}: tensor '{name}' fails its CRC-32 check (corrupt)")
        if name in tensors:
            raise ModelFormatError(f"{source}: tensor '{name}' appears twice")
        if dtype in OLD_KQUANT_DTYPES:
            raise ModelFormatError(
                f"{source}: tensor '{name}' is {OLD_KQUANT_DTYPES[dtype]} in the old row layout "
                f"(dtype {dtype}, each row its own super-blocks), which this colibri no longer "
                "reads (super-blocks now run across rows, dtype "
                f"{DTYPE_Q4K if dtype == 5 else DTYPE_Q5K}): convert the model again"
            )
        if dtype in (DTYPE_Q4, DTYPE_Q4K, DTYPE_Q5K):
            if ndim != 2:
                raise ModelFormatError(f"{source}: block tensor '{name}' is not 2-D")
            bits = 5 if dtype == DTYPE_Q5K else 4
            if dtype == DTYPE_Q4:
                size = shape[0] * q4_blocks(shape[1]) * BLOCK_Q4_DTYPE.itemsize
            else:
                size = q4k_bytes(shape[0], shape[1], bits)
            if size != nb:
                raise ModelFormatError(f"{source}: tensor '{name}' size does not match its shape")
            if dtype == DTYPE_Q4:
                blocks = (shape[0], q4_blocks(shape[1]))
                arr = np.frombuffer(data, BLOCK_Q4_DTYPE, blocks[0] * blocks[1], off)
                arr = arr.reshape(blocks)
            else:
                raw = np.frombuffer(data, np.uint8, nb, off)
                arr = q4k_stream_restore(raw, shape[0], shape[1], bits)
        elif dtype in LM_DTYPES:
            count = int(np.prod(shape))
            if count * LM_DTYPES[dtype].itemsize != nb:
                raise ModelFormatError(f"{source}: tensor '{name}' size does not match its shape")
            arr = np.frombuffer(data, LM_DTYPES[dtype], count, off).reshape(shape)
        else:
            raise ModelFormatError(f"{source}: tensor '{name}' has unknown dtype {dtype}")
        tensors[name] = arr if mapped else arr.copy()
        shapes[name] = tuple(shape)
    mo = int(h["meta_offset"])
    try:
        meta = json.loads(bytes(data[mo : mo + int(h["meta_bytes"])]).decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFormatError(f"{source}: metadata is not valid JSON ({exc})") from exc
    return LMContainer(h, tensors, meta, shapes)


def read_lm_tokenizer(path: str | os.PathLike[str]) -> bytes | None:
    """The tokenizer.json bytes a version-2 container holds (CRC-32 checked), or None."""
    source = str(path)
    h, _ = read_lm_header(path)
    with open(path, "rb") as f:
        table = f.read(ENTRY_SIZE * int(h["n_tensors"]) + HEADER_SIZE)[HEADER_SIZE:]
        for i in range(len(table) // ENTRY_SIZE):
            fields = ENTRY.unpack_from(table, i * ENTRY_SIZE)
            if entry_name(fields[0]) != TOKENIZER_TENSOR:
                continue
            off, nb, crc = fields[7], fields[8], fields[10]
            f.seek(off)
            data = f.read(nb)
            if len(data) != nb or zlib.crc32(data) != crc:
                raise ModelFormatError(f"{source}: the embedded tokenizer.json is corrupt")
            return data
    return None


# -- the metadata JSON against the header (`colibri verify`, the whole-model reader) ----------


def _same(header: object, meta: object) -> bool:
    """A metadata value equals the header's: the same kind (a bool is not 0 / 1) and value;
    floats as the header stores them (float32 or float64)."""
    if isinstance(header, bool) or isinstance(meta, bool) or header is None or meta is None:
        return type(header) is type(meta) and header == meta
    if isinstance(header, float):
        if isinstance(meta, bool) or not isinstance(meta, (int, float)):
            return False
        return header == meta or float(np.float32(meta)) == header
    if isinstance(header, int):
        return isinstance(meta, int) and header == meta
    return bool(header == meta)


def _at(source: str) -> str:
    """A message's "SOURCE: " prefix, or nothing for a caller that adds its own."""
    return f"{source}: " if source else ""


def check_meta_against_header(
    source: str, meta: dict[str, Any], fields: list[tuple[str, str, object]], section: str
) -> int:
    """Every field present in both the metadata JSON (`meta[key]`) and the header (`fields`:
    key, the header's name for it, its value there) must agree; a contradiction is a
    ModelFormatError naming both. Returns how many fields were compared."""
    n = 0
    for key, hname, hval in fields:
        if key not in meta:
            continue
        n += 1
        if not _same(hval, meta[key]):
            raise ModelFormatError(
                f"{_at(source)}metadata {section}.{key} = {json.dumps(meta[key])} contradicts the "
                f"header's {hname} = {json.dumps(hval)}; the file is corrupt or was edited: "
                f"convert the model again"
            )
    return n


def check_lm_meta(source: str, h: dict[str, Any], meta: object) -> int:
    """The metadata JSON of a version-2 container against its header (what the C reads): a
    JSON object with 'config' and 'quantization' objects whose fields the header also holds
    agree with it; a ModelFormatError names the first that does not. Returns how many fields
    were compared."""
    if not isinstance(meta, dict):
        raise ModelFormatError(f"{_at(source)}metadata is not a JSON object; the file is corrupt")
    cfg, quant = meta.get("config"), meta.get("quantization")
    if not isinstance(cfg, dict) or not isinstance(quant, dict):
        raise ModelFormatError(
            f"{_at(source)}metadata has no 'config' / 'quantization' object; the file is corrupt"
        )
    flags = int(h["flags"])
    n = check_meta_against_header(
        source,
        cfg,
        [
            (key, key, int(h[key]))
            for key in ("n_layers", "vocab_size", "d_model", "n_heads", "n_kv_heads", "head_dim")
        ]
        + [
            ("rms_norm_eps", "rms_norm_eps", float(h["rms_norm_eps"])),
            ("rope_theta", "rope_theta", float(h["rope_theta"])),
            ("tie_word_embeddings", "flags (tied)", bool(flags & FLAG_TIED)),
            ("qk_norm", "flags (qk_norm)", bool(flags & FLAG_QK_NORM)),
            (
                "clip_qkv",
                "clip_qkv and flags",
                float(h["clip_qkv"]) if flags & FLAG_CLIP_QKV else None,
            ),
            ("sliding_window", "sliding_window", int(h["sliding_window"]) or None),
        ],
        "config",
    )
    return n + check_meta_against_header(
        source,
        quant,
        [
            ("dense_scheme", "dense_scheme", SCHEME_NAMES.get(int(h["dense_scheme"]))),
            ("dense_act", "dense_act", ACT_NAMES.get(int(h["dense_act"]))),
        ],
        "quantization",
    )
