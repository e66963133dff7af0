"""The one weights writer: every stored tensor of a generated model as C.

:func:`tensor_entry` gives the declaration, initialiser, typedef and reference of one tensor in
its scheme (fp32 arrays, fp16 bits, int8 per output channel with its scale struct, int4 blocks of
``colibri_block_q4_32``); :class:`WeightTable` collects a model's tensors, each named once
(:class:`~colibri.emit.cnames.NameTable`), and counts their bytes per part of the model.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..quant.formats import QuantRouter, QuantTensor, q8_channel_dtype
from .cnames import NameTable, c_float_array


def c_hex_array(values: np.ndarray, digits: int, per_line: int = 12, indent: str = "    ") -> str:
    """Unsigned integers as 0x literals with a u suffix, `per_line` to a line."""
    flat = np.asarray(values).ravel().tolist()
    fmt = f"0x{{:0{digits}x}}u"
    lines = []
    for i in range(0, len(flat), per_line):
        lines.append(indent + ", ".join(fmt.format(int(v)) for v in flat[i : i + per_line]) + ",")
    return "\n".join(lines)


def c_q4_blocks(blocks: np.ndarray) -> str:
    """colibri_block_q4_32 initialisers, one block per line."""
    lines = []
    for d, qs in zip(blocks["d"].ravel().tolist(), blocks["qs"].reshape(-1, 16).tolist()):
        nib = ", ".join(f"0x{v:02x}" for v in qs)
        lines.append(f"    {{0x{d:04x}u, {{{nib}}}}},")
    return "\n".join(lines)


def router_wq_literal(r: QuantRouter) -> str:
    """Initialiser body of the quantised router weights (fp16 bits or int8)."""
    if r.scheme == "fp16":
        return c_hex_array(r.data, 4)
    if r.scheme == "int8":
        vals = np.asarray(r.data, dtype=np.int8).ravel().tolist()
        return "\n".join(
            "    " + ", ".join(str(v) for v in vals[i : i + 20]) + ","
            for i in range(0, len(vals), 20)
        )
    return ""


def tensor_entry(
    sym: str, tname: str, t: QuantTensor | np.ndarray, name: str, const: str
) -> dict[str, Any]:
    """decl / init / typedef of one weight tensor in the generated C."""
    if isinstance(t, np.ndarray) or t.scheme == "fp32":
        arr = t if isinstance(t, np.ndarray) else t.data.T  # fp32 keeps the seed layout
        return {
            "symbol": sym,
            "decl": f"{const}float {sym}[{int(arr.size)}]",
            "init": "{\n" + c_float_array(arr) + "\n}",
            "size": int(arr.size),
            "nbytes": int(arr.nbytes),
            "typedef": None,
            "ref": sym,
            "ptype": "const float *",
            "quantised": False,
        }
    if t.scheme == "fp16":
        return {
            "symbol": sym,
            "decl": f"{const}uint16_t {sym}[{t.n_out * t.n_in}]",
            "init": "{\n" + c_hex_array(t.data, 4) + "\n}",
            "nbytes": t.nbytes,
            "typedef": None,
            "ref": sym,
            "ptype": "const uint16_t *",
            "quantised": True,
        }
    if t.scheme == "int8":
        assert t.scale is not None
        tname_c = f"{name}_q8_{t.n_out}x{t.n_in}_t"
        size = q8_channel_dtype(t.n_out, t.n_in).itemsize
        typedef = (
            f"typedef struct {{\n    float scale[{t.n_out}];\n    int8_t q[{t.n_out * t.n_in}];\n"
            f"}} {tname_c};\n_Static_assert(sizeof({tname_c}) == {size}, "
            f'"{tname_c} differs from colibri/quant/formats.py q8_channel_dtype");'
        )
        q = np.asarray(t.data, dtype=np.int8).ravel().tolist()
        qlines = [
            "        " + ", ".join(str(v) for v in q[i : i + 20]) + ","
            for i in range(0, len(q), 20)
        ]
        init = (
            "{\n    .scale = {\n"
            + c_float_array(t.scale, indent="        ")
            + "\n    },\n    .q = {\n"
            + "\n".join(qlines)
            + "\n    },\n}"
        )
        return {
            "symbol": sym,
            "decl": f"{const}{tname_c} {sym}",
            "init": init,
            "nbytes": size,
            "typedef": (tname_c, typedef),
            "ref": f"&{sym}",
            "ptype": f"const {tname_c} *",
            "quantised": True,
        }
    nblk = t.data.size
    return {
        "symbol": sym,
        "decl": f"{const}colibri_block_q4_32 {sym}[{nblk}]",
        "init": "{\n" + c_q4_blocks(t.data) + "\n}",
        "nbytes": t.nbytes,
        "typedef": None,
        "ref": sym,
        "ptype": "const colibri_block_q4_32 *",
        "quantised": True,
    }


#: Weight keys of a WeightTable -> the part of the model they belong to (first match; else
#: norms). A lone layer's experts are e<J>_<part>, a transformer's l<L>_e<J>_<part>.
_PARTS = (
    (r"embed", "embedding"),
    (r"lm_head", "LM head"),
    (r"l\d+_(wq|wk|wv|wo|bq|bk|bv|bo)", "attention"),
    (r"(l\d+_)?e\d+_\w+", "routed experts"),
    (r"l\d+_router", "routers"),
    (r"l\d+_(shared|mlp)_\w+", "shared experts / dense MLPs"),
)


class WeightTable:
    """The tensors of a generated weights file, each named ``<model>_<key>`` once (NameTable),
    with their bytes counted per part of the model: fp32 arrays (:meth:`add`, listed in
    ``arrays``) and stored tensors in any scheme (:meth:`add_stored`, in ``qarrays``, their
    typedefs in ``typedefs``)."""

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

    def add_stored(
        self, key: str, t: QuantTensor | np.ndarray, what: str, const: str = "const "
    ) -> dict[str, Any]:
        """A tensor in its stored scheme (:func:`tensor_entry`: its decl, init, typedef and
        reference); const "" places it in RAM (pinned experts)."""
        if key in self.keys:
            raise ConfigError(f"generated weight '{key}' would be emitted twice")
        self.keys.add(key)
        sym = self.names.add(key, f"{self.name}_{key}")
        entry = tensor_entry(sym, key, t, self.name, const)
        if entry["typedef"] is not None:
            self.typedefs[entry["typedef"][0]] = entry["typedef"][1]
        entry["what"] = what
        self.qarrays.append(entry)
        self._count(key, int(entry["nbytes"]))
        return entry
