"""The one weights writer: every stored tensor of a generated model, as bytes and declarations.

Weights are never written as C text. :func:`tensor_bytes` gives a tensor's bytes in the layout
the kernels read (fp32 arrays, fp16 bits, the int8 per-output-channel struct with its padding,
int4 ``colibri_block_q4_32`` and q4k ``colibri_block_q4k`` blocks; little-endian, as every
supported core is) and
:func:`tensor_entry` its C declaration, typedef and reference. :class:`WeightTable` names each
tensor once (:class:`~colibri.emit.cformat.NameTable`), lays the bytes out back to back in one
blob (16-byte aligned, in the order added) and counts them per part of the model; the
generated ``*_weights.c`` holds only assembler ``.incbin`` directives that give each symbol its
slice of the ``*_weights.bin`` blob (``templates/common/weights.c.j2``), so compiling a model
costs the same whatever its weights.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..frontends.container import q4k_stream_stored
from ..quant.formats import (
    QuantExpert,
    QuantTensor,
    c8_order,
    pad_inputs,
    q4h4_order,
    q4r4_order,
    q8_channel_dtype,
    r4_order,
    r4p_order,
)
from .cformat import NameTable, c_assert
from .experts import with_layout
from .output import BinaryFile

#: Alignment of every tensor in the blob (the arrays were _Alignas(16) as C text).
BLOB_ALIGN = 16


def tensor_bytes(t: QuantTensor | np.ndarray) -> bytes:
    """The bytes of one stored tensor exactly as the C code reads it."""
    return b"".join(tensor_chunks(t))


def _view(a: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array, as a flat view (no copy)."""
    return a.reshape(-1).view(np.uint8).data


def tensor_chunks(t: QuantTensor | np.ndarray) -> list[bytes | memoryview]:
    """:func:`tensor_bytes` as the buffers it is made of, views of the arrays wherever they
    already are in the C layout (a model's quantised weights are not copied into the blob)."""
    if isinstance(t, np.ndarray):
        return [_view(np.ascontiguousarray(t, dtype="<f4"))]
    if t.scheme == "fp32" and t.layout == "c8":  # column blocks of the seed layout
        return [_view(c8_order(np.asarray(t.data, dtype="<f4")))]
    if t.scheme == "fp32":
        return [_view(np.ascontiguousarray(t.data.T, dtype="<f4"))]  # the seed layout
    if t.scheme == "fp16" and t.layout == "c8":  # column blocks of 8 outputs, as fp32 c8
        return [_view(c8_order(np.asarray(t.data, dtype="<u2")))]
    if t.scheme == "fp16":
        return [_view(np.ascontiguousarray(t.data, dtype="<u2"))]
    if t.scheme == "int8":  # the q8_channel_dtype struct: scales, codes, padding to 4 bytes
        assert t.scale is not None
        scale = np.ascontiguousarray(t.scale, dtype="<f4").reshape(-1)
        q = np.ascontiguousarray(t.data, dtype=np.int8)
        if t.layout == "r4":  # layout r4: a reordered copy (zero columns up to stored_in)
            q = r4_order(pad_inputs(q, t.stored_in))
        elif t.layout == "r4p":  # layout r4p: a reordered, pair-corrected copy (the same)
            q = r4p_order(pad_inputs(q, t.stored_in))
        else:
            q = q.reshape(-1)
        size = q8_channel_dtype(t.n_out, t.stored_in, scale.size).itemsize
        pad = size - scale.nbytes - q.nbytes
        return [_view(scale), _view(q), *([bytes(pad)] if pad else [])]
    if t.scheme in ("q4k", "q5k"):  # one stream of super-blocks, the last cut (q4k_bytes)
        return [_view(q4k_stream_stored(t.data, t.n_out, t.n_in))]
    if t.layout == "q4r4":  # int4 in layout q4r4: a reordered copy, the same size
        return [_view(q4r4_order(np.asarray(t.data)))]
    if t.layout == "q4h4":  # int4 in layout q4h4 (Helium): grouped rows, the same size
        return [_view(q4h4_order(np.asarray(t.data)))]
    # int4: BLOCK_Q4_DTYPE records, 18 bytes; q4k: BLOCK_Q4K_DTYPE records, 144 bytes
    return [_view(np.ascontiguousarray(t.data))]


def tensor_entry(sym: str, t: QuantTensor | np.ndarray, name: str, const: str) -> dict[str, Any]:
    """C declaration, typedef, reference and pointer type of one weight tensor."""
    if isinstance(t, np.ndarray) or t.scheme == "fp32":
        size = int(t.size) if isinstance(t, np.ndarray) else t.n_out * t.n_in
        return {
            "symbol": sym,
            "decl": f"{const}float {sym}[{size}]",
            "size": size,
            "nbytes": 4 * size,
            "typedef": None,
            "ref": sym,
            "ptype": "const float *",
            "quantised": False,
        }
    if t.scheme == "fp16":
        return {
            "symbol": sym,
            "decl": f"{const}uint16_t {sym}[{t.n_out * t.n_in}]",
            "nbytes": t.nbytes,
            "typedef": None,
            "ref": sym,
            "ptype": "const uint16_t *",
            "quantised": True,
        }
    if t.scheme == "int8":
        assert t.scale is not None
        # per output channel: scale[n_out]; block-scaled: scale[n_out][blocks] (flattened);
        # named by the stored row width (a layout that pads its rows: QuantTensor.stored_in)
        tname_c = f"{name}_q8{'b' if t.blocked else ''}_{t.n_out}x{t.stored_in}_t"
        size = t.nbytes
        typedef = (
            f"typedef struct {{\n    float scale[{t.scale.size}];\n"
            f"    int8_t q[{t.n_out * t.stored_in}];\n"
            f"}} {tname_c};\n"
            + c_assert(
                f"sizeof({tname_c})",
                "==",
                str(size),
                f"{tname_c.removeprefix(name + '_')} differs from colibri/quant/formats.py "
                "q8_channel_dtype",
            )
        )
        return {
            "symbol": sym,
            "decl": f"{const}{tname_c} {sym}",
            "nbytes": size,
            "typedef": (tname_c, typedef),
            "ref": f"&{sym}",
            "ptype": f"const {tname_c} *",
            "quantised": True,
        }
    if t.scheme in ("q4k", "q5k"):  # COLIBRI_Q4K / Q5K_BYTES(n_out, n_in) bytes
        return {
            "symbol": sym,
            "decl": f"{const}uint8_t {sym}[{t.nbytes}]",
            "nbytes": t.nbytes,
            "typedef": None,
            "ref": sym,
            "ptype": "const uint8_t *",
            "quantised": True,
        }
    block = "colibri_block_q4_32"
    return {
        "symbol": sym,
        "decl": f"{const}{block} {sym}[{t.data.size}]",
        "nbytes": t.nbytes,
        "typedef": None,
        "ref": sym,
        "ptype": f"const {block} *",
        "quantised": True,
    }


#: Weight keys of a WeightTable -> the part of the model they belong to (first match; else
#: norms). A lone layer's experts are e<J>_<part>, a transformer's l<L>_e<J>_<part>.
_PARTS = (
    (r"embed", "embedding"),
    (r"lm_head", "LM head"),
    (r"l\d+_(wq|wk|wv|wo|bq|bk|bv|bo)", "attention"),
    (r"(l\d+_)?e\d+_\w+", "routed experts"),
    (r"(l\d+_)?router_?\w*", "routers"),
    (r"rope_(cos|sin)", "RoPE tables"),
    (r"(l\d+_)?(shared|mlp)_\w+", "shared experts / dense MLPs"),
)


class WeightTable:
    """The tensors of a generated weights file, each named ``<model>_<key>`` once (NameTable),
    with their bytes counted per part of the model and their C declarations in blob order
    (``blob_entries``): fp32 arrays (:meth:`add`), integer codes (:meth:`add_codes`) and stored
    tensors in any scheme (:meth:`add_stored`, their typedefs in ``typedefs``)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.names = NameTable()
        self.keys: set[str] = set()
        self.typedefs: dict[str, str] = {}
        self.parts: dict[str, int] = {}
        #: Every tensor in blob order: symbol, C declaration, offset, size, section, what.
        self.blob_entries: list[dict[str, Any]] = []
        self._blob: list[bytes | memoryview] = []
        self._blob_size = 0

    def _place(
        self,
        sym: str,
        decl: str,
        data: bytes | memoryview | list[bytes | memoryview],
        what: str,
        const: bool = True,
        psram: bool = False,
    ) -> None:
        """Append a tensor's bytes (one buffer or several) to the blob at the next 16-byte
        boundary; `decl` declares it in C. Sections: .rodata.<sym> (const: flash on MCUs),
        .data.<sym> (pinned in RAM), or with `psram` .colibri_psram.<sym> (external PSRAM in
        Colibri's ESP32-S3 linker script; weights.c.j2 falls back to .rodata elsewhere)."""
        chunks = data if isinstance(data, list) else [data]
        pad = -self._blob_size % BLOB_ALIGN
        if pad:
            self._blob.append(bytes(pad))
            self._blob_size += pad
        self.blob_entries.append(
            {
                "symbol": sym,
                "decl": decl,
                "offset": self._blob_size,
                "size": sum(memoryview(c).nbytes for c in chunks),
                "section": (".rodata." if const else ".data.") + sym,
                "flags": "a" if const else "aw",
                "psram": psram,
                "what": what,
            }
        )
        self._blob.extend(chunks)
        self._blob_size += sum(memoryview(c).nbytes for c in chunks)

    def blob(self) -> BinaryFile:
        """The weights file: every tensor's bytes at its offset (views of the model's fp32
        arrays, not copies: a model's weights are in memory once while it is generated)."""
        return BinaryFile(list(self._blob))

    def _new_symbol(self, key: str) -> str:
        if key in self.keys:
            raise ConfigError(f"generated weight '{key}' would be emitted twice")
        self.keys.add(key)
        return self.names.add(key, f"{self.name}_{key}")

    def _count(self, key: str, nbytes: int) -> None:
        """Bytes per part of the model (the budget error's largest consumers)."""
        part = next((p for pattern, p in _PARTS if re.fullmatch(pattern, key)), "norms")
        self.parts[part] = self.parts.get(part, 0) + nbytes

    @property
    def nbytes(self) -> int:
        """Bytes of every array added so far."""
        return sum(self.parts.values())

    def add(self, key: str, arr: np.ndarray, what: str) -> str:
        """An fp32 array, declared ``const float <symbol>[size]``; returns its symbol."""
        sym = self._new_symbol(key)
        a = np.ascontiguousarray(arr, dtype="<f4")  # a view when it already is
        self._place(sym, f"const float {sym}[{a.size}]", a.data.cast("B"), what)
        self._count(key, int(a.nbytes))
        return sym

    def add_codes(self, key: str, arr: np.ndarray, what: str) -> str:
        """Integer codes (fp16 bits as uint16, int8); returns the symbol."""
        sym = self._new_symbol(key)
        a = np.ascontiguousarray(arr)
        ctype = {"i": "int", "u": "uint"}[a.dtype.kind] + f"{8 * a.dtype.itemsize}_t"
        decl = f"const {ctype} {sym}[{a.size}]"
        self._place(sym, decl, a.astype(a.dtype.newbyteorder("<")).tobytes(), what)
        self._count(key, int(a.nbytes))
        return sym

    def opt(self, key: str, arr: np.ndarray | None, what: str) -> str:
        return "NULL" if arr is None else self.add(key, arr, what)

    def add_stored(
        self,
        key: str,
        t: QuantTensor | np.ndarray,
        what: str,
        const: str = "const ",
        psram: bool = False,
    ) -> dict[str, Any]:
        """A tensor in its stored scheme (:func:`tensor_entry`: its decl, init, typedef and
        reference); const "" places it in RAM (pinned experts), `psram` in external PSRAM.
        fp32 matrices in the seed layout are declared as plain float arrays, as :meth:`add`'s."""
        sym = self._new_symbol(key)
        entry = tensor_entry(sym, t, self.name, const)
        self._place(sym, entry["decl"], tensor_chunks(t), what, const == "const ", psram)
        if entry["typedef"] is not None:
            self.typedefs[entry["typedef"][0]] = entry["typedef"][1]
        entry["what"] = what
        self._count(key, int(entry["nbytes"]))
        return entry

    def add_expert(
        self,
        key: str,
        qe: QuantExpert,
        kernel: dict[str, Any],
        what: Callable[[str, QuantTensor | np.ndarray], str],
        const: str = "const ",
        psram: bool = False,
    ) -> dict[str, dict[str, Any]]:
        """Every tensor of an expert (routed or shared, of a lone layer or a transformer, or a
        dense MLP) as ``<key>_<part>``, in the layouts its `kernel` reads and described by
        what(part, tensor); returns the :meth:`add_stored` entries by part."""
        entries = {}
        for part, t in qe.tensors():
            if isinstance(t, QuantTensor):
                t = with_layout(t, part, kernel)
            entries[part] = self.add_stored(f"{key}_{part}", t, what(part, t), const, psram)
        return entries


def blob_context(weights: WeightTable, header: str, blob_name: str) -> dict[str, Any]:
    """What templates/common/weights.{h,c}.j2 need to declare the table's tensors and link its
    blob."""
    return {
        "typedefs": [weights.typedefs[k] for k in sorted(weights.typedefs)],
        "integer_weights": any("float" not in e["decl"] for e in weights.blob_entries),
        "weights_header": header,
        "blob_name": blob_name,
        "blob_entries": weights.blob_entries,
        "blob_size": sum(e["size"] for e in weights.blob_entries[-1:])
        + (weights.blob_entries[-1]["offset"] if weights.blob_entries else 0),
    }
