"""Emit C sources specialised to one model from the Jinja2 templates in templates/.

Output (one directory): colibri_model.h, colibri_model.c, colibri_weights.h, colibri_weights.c,
manifest.json. Experts are stored in their scheme (codegen/quantize.py: fp32 in the seed layout,
fp16 / int8 / int4 output-channel-major in the formats of colibri_quant.h), 16-byte aligned,
one expert's tensors together, identical experts once; with calibration data the hottest are
pinned in RAM and stored first (codegen/placement.py). The manifest then carries the accuracy
report (codegen/accuracy.py), the layout savings and a per-expert table.

Deterministic: the same model and options give byte-identical files. The
directory is written to a temporary sibling and renamed into place, so a failed generation
never leaves a half-written output.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import numpy as np

from . import __version__
from .cnames import NameTable, c_float_array, c_ident, c_int_array
from .errors import BudgetExceeded, ConfigError, OutputExistsError
from .ir import MoELayer
from .memplan import MemoryPlan, align16, plan_memory
from .paths import resource_dir
from .quantize import (
    ROUTER_SCHEME_CODES,
    QuantRouter,
    QuantTensor,
    make_plan,
    q8_channel_dtype,
    quantize_layer,
    quantize_router,
    weight_bytes_for,
)

GENERATED_FILES = (
    "colibri_model.h",
    "colibri_model.c",
    "colibri_weights.h",
    "colibri_weights.c",
)
MANIFEST = "manifest.json"
DEFAULT_MAX_TOKENS = 32
#: Calibration tokens when no --calib file is given (seeded, standard normal).
DEFAULT_CALIB_TOKENS = 64
DEFAULT_CALIB_SEED = 0


CACHE_POLICIES = ("pinned", "lru", "none")


@dataclass(frozen=True)
class GenerateOptions:
    """What `colibri generate` was asked for (recorded in the manifest)."""

    board: str = "host"
    name: str = "model"
    max_tokens: int = DEFAULT_MAX_TOKENS
    quant: str = "fp32"
    expert_quant: str | None = None
    act: str | None = None
    cache: str = "pinned"
    cache_slots: int = 0
    calib: str | None = None
    ram_budget: int | None = None
    router_quant: str = "fp32"

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "board": self.board,
            "name": self.name,
            "max_tokens": self.max_tokens,
        }
        # Only non-defaults, so that fp32 outputs stay byte-identical to earlier versions.
        extra = {
            "quant": (self.quant, "fp32"),
            "expert_quant": (self.expert_quant, None),
            "act": (self.act, None),
            "cache": (self.cache, "pinned"),
            "cache_slots": (self.cache_slots, 0),
            "calib": (self.calib, None),
            "ram_budget": (self.ram_budget, None),
            "router_quant": (self.router_quant, "fp32"),
        }
        for key, (value, default) in extra.items():
            if value != default:
                out[key] = value
        return out


def model_hash(layer: MoELayer) -> str:
    """SHA-256 of the model content (config + every tensor), independent of the file format."""
    h = hashlib.sha256(json.dumps(layer.config.to_json(), sort_keys=True).encode())
    h.update(np.ascontiguousarray(layer.router_w, "<f4").tobytes())
    if layer.router_b is not None:
        h.update(np.ascontiguousarray(layer.router_b, "<f4").tobytes())
    for e in layer.experts:
        h.update(e.digest().encode())
    h.update(json.dumps(layer.sharing_map).encode())
    return h.hexdigest()


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(resource_dir() / "templates")),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    return env


def c_hex_array(values: np.ndarray, digits: int, per_line: int = 12, indent: str = "    ") -> str:
    """Unsigned integers as 0x literals with a u suffix, `per_line` to a line."""
    flat = np.asarray(values).ravel().tolist()
    fmt = f"0x{{:0{digits}x}}u"
    lines = []
    for i in range(0, len(flat), per_line):
        lines.append(indent + ", ".join(fmt.format(int(v)) for v in flat[i : i + per_line]) + ",")
    return "\n".join(lines)


def _c_q4_blocks(blocks: np.ndarray) -> str:
    """colibri_block_q4_32 initialisers, one block per line."""
    lines = []
    for d, qs in zip(blocks["d"].ravel().tolist(), blocks["qs"].reshape(-1, 16).tolist()):
        nib = ", ".join(f"0x{v:02x}" for v in qs)
        lines.append(f"    {{0x{d:04x}u, {{{nib}}}}},")
    return "\n".join(lines)


def _router_wq_literal(r: QuantRouter) -> str:
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


def _part_nbytes(t: QuantTensor | np.ndarray) -> int:
    """Bytes of one stored tensor in the generated C (sizeof of its symbol)."""
    if isinstance(t, np.ndarray):
        return int(t.nbytes)
    if t.scheme == "fp32":
        return int(t.data.nbytes)
    if t.scheme == "int8":
        return int(q8_channel_dtype(t.n_out, t.n_in).itemsize)
    return int(t.nbytes)


def _tensor_entry(
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
            f'"{tname_c} differs from codegen/quantize.py q8_channel_dtype");'
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
        "init": "{\n" + _c_q4_blocks(t.data) + "\n}",
        "nbytes": t.nbytes,
        "typedef": None,
        "ref": sym,
        "ptype": "const colibri_block_q4_32 *",
        "quantised": True,
    }


def _load_calib(options: GenerateOptions, calib: np.ndarray | None, d_model: int) -> np.ndarray:
    """Calibration tokens: the array given, --calib FILE, or seeded random ones."""
    from .runio import check_input, load_npy

    if calib is None and options.calib:
        calib = load_npy(
            options.calib, "--calib file", f"a [T, {d_model}] float32 .npy of calibration tokens"
        )
    if calib is None:
        return (
            np.random.default_rng(DEFAULT_CALIB_SEED)
            .standard_normal((DEFAULT_CALIB_TOKENS, d_model))
            .astype(np.float32)
        )
    return check_input(np.asarray(calib), d_model, options.calib or "calibration input")


def render_sources(
    layer: MoELayer, options: GenerateOptions, calib: np.ndarray | None = None
) -> tuple[dict[str, str], dict]:
    """Render every generated file; returns ({filename: text}, manifest)."""
    from .accuracy import accuracy_report
    from .placement import plan_placement, routing_heat

    layer.validate()
    layer.require_no_shared_expert("generated C")
    c = layer.config
    name = c_ident(options.name)
    names = NameTable()
    prefix = name.upper()
    qplan = make_plan(c.n_experts, options.quant, options.expert_quant, options.act)
    if options.cache not in CACHE_POLICIES:
        raise ConfigError(
            f"--cache: unknown policy '{options.cache}'; supported: {', '.join(CACHE_POLICIES)}"
        )
    storage = layer.storage_map()
    qexperts = quantize_layer(layer, qplan)
    qrouter = quantize_router(layer.router_w, options.router_quant)
    quantised = any(qexperts[i].scheme != "fp32" for i in qexperts) or qrouter.scheme != "fp32"
    n_slots = {"pinned": 0, "none": 1, "lru": options.cache_slots}[options.cache]
    if options.cache == "lru" and not 1 <= options.cache_slots <= 256:
        raise ConfigError(
            f"--cache lru needs --cache-slots between 1 and 256 (COLIBRI_MAX_LRU_SLOTS), "
            f"got {options.cache_slots}"
        )
    bias = layer.experts[0].b1 is not None
    act_q = any(qexperts[i].act == "int8" and qexperts[i].scheme != "fp32" for i in qexperts)
    slot_floats = _slot_floats(layer, qexperts, bias) if n_slots and quantised else 0
    plan: MemoryPlan = plan_memory(c, options.max_tokens, n_slots, bias, act_q, slot_floats)

    calibrated = options.calib is not None or calib is not None
    # The report (accuracy, heat, placement) is computed when there is something to report;
    # a plain fp32 model generates exactly as before, without it.
    report = quantised or calibrated or options.cache != "pinned" or bool(options.ram_budget)
    x_cal = _load_calib(options, calib, c.d_model) if report else None
    heat = routing_heat(layer, x_cal) if x_cal is not None else np.zeros(c.n_experts, np.int64)
    ram_budget = options.ram_budget
    if ram_budget is None:
        ram_budget = default_ram_budget(options.board, plan) if calibrated else 0
    placements = plan_placement(layer, qexperts, heat, ram_budget, calibrated)
    by_index = {p.index: p for p in placements}
    accuracy = accuracy_report(layer, qexperts, x_cal, qrouter) if x_cal is not None else None

    stored: list[dict[str, Any]] = []
    typedefs: dict[str, str] = {}
    for idx in [p.index for p in placements]:  # hot experts first
        qe = qexperts[idx]
        pl = by_index[idx]
        const = "" if pl.placement == "ram" else "const "
        tensors = []
        arg = {"w1": "NULL", "b1": "NULL", "w2": "NULL", "b2": "NULL", "w3": "NULL"}
        # The same pointers taken from the loader's weights (a cache slot under LRU/NONE).
        warg = dict(arg)
        part_bytes = {"w1": "0u", "b1": "0u", "w2": "0u", "b2": "0u", "w3": "0u"}
        for tname, t in qe.tensors():
            sym = names.add(f"expert.{idx}.{tname}", f"{name}_e{idx}_{tname}")
            entry = _tensor_entry(sym, tname, t, name, const)
            if entry["typedef"] is not None:
                typedefs[entry["typedef"][0]] = entry["typedef"][1]
            tensors.append(entry)
            arg[tname] = entry["ref"]
            if entry["quantised"]:
                warg[tname] = f"({entry['ptype']})(const void *)w->{tname}"
                part_bytes[tname] = f"sizeof({sym})"
            else:
                warg[tname] = f"w->{tname}"
        stored.append(
            {
                "index": idx,
                "tensors": tensors,
                "arg": arg,
                "warg": warg,
                "part_bytes": part_bytes,
                "nbytes": qe.nbytes,
                "users": [i for i, s in enumerate(storage) if s == idx],
                "scheme": qe.scheme,
                "act": qe.act,
                "kernel": pl.kernel,
                "placement": pl.placement,
                "ffn": f"{name}_ffn" if qe.scheme == "fp32" else f"{name}_ffn_{qe.scheme}_{qe.act}",
            }
        )
    ffn_kinds = sorted({(s["scheme"], s["act"]) for s in stored if s["scheme"] != "fp32"})
    variants = sorted({(s["ffn"], s["kernel"]) for s in stored if s["kernel"] != "default"})
    weight_bytes = qrouter.nbytes + sum(int(s["nbytes"]) for s in stored)
    if layer.router_b is not None:
        weight_bytes += int(layer.router_b.nbytes)
    pinned_ram = sum(int(s["nbytes"]) for s in stored if s["placement"] == "ram")
    fp32_bytes = int(layer.router_w.nbytes) + sum(e.nbytes for e in layer.experts)
    if layer.router_b is not None:
        fp32_bytes += int(layer.router_b.nbytes)
    mhash = model_hash(layer)
    opts = options.as_dict()
    ctx: dict[str, Any] = {
        "version": __version__,
        "model_source": Path(layer.source).name if layer.source else "(in memory)",
        "model_hash": mhash,
        "options_line": " ".join(f"{k}={v}" for k, v in sorted(opts.items())),
        "name": name,
        "P": prefix,
        "c": c,
        "plan": plan,
        "flags": layer.flags,
        "act_name": "silu" if c.gated else c.activation,
        "router_bias": layer.router_b is not None,
        "router_w": c_float_array(layer.router_w) if qrouter.scheme == "fp32" else "",
        "router_scheme": qrouter.scheme,
        "router_scheme_code": ROUTER_SCHEME_CODES[qrouter.scheme],
        "router_wq": _router_wq_literal(qrouter),
        "router_scale": c_float_array(qrouter.scale) if qrouter.scale is not None else "",
        "router_b": c_float_array(layer.router_b) if layer.router_b is not None else "",
        "stored": sorted(stored, key=lambda s: int(s["index"])),
        "stored_layout": stored,
        "stored_by_index": {s["index"]: s for s in stored},
        "stored_by_kind": {s["ffn"]: s["scheme"] for s in stored},
        "storage": storage,
        "share_values": c_int_array(storage),
        "weight_bytes": weight_bytes,
        "quantised": quantised,
        "typedefs": [typedefs[k] for k in sorted(typedefs)],
        "ffn_kinds": ffn_kinds,
        "variants": variants,
        "act_q": act_q,
        "cache": options.cache,
        "n_slots": n_slots,
        "slot_floats": slot_floats,
        "bias": bias,
        "pinned_ram": pinned_ram,
    }
    env = _environment()
    files = {}
    for fname in GENERATED_FILES:
        files[fname] = env.get_template(fname + ".j2").render(filename=fname, **ctx)
    manifest: dict[str, Any] = {
        "generator": f"colibri {__version__}",
        "model": {
            "source": str(layer.source),
            "sha256": mhash,
            "config": c.to_json(),
            "storage_map": storage,
            "unique_experts": len(stored),
        },
        "options": opts,
        "memory": {
            "arena_size": plan.arena_size,
            "max_tokens": plan.max_tokens,
            "regions": [
                {"name": r.name, "offset": r.offset, "size": r.size, "what": r.what}
                for r in plan.regions
            ],
            "weight_bytes": weight_bytes,
        },
        "experts_bytes": [[s["index"], s["nbytes"]] for s in sorted(stored, key=_by_index)],
        "files": {f: hashlib.sha256(t.encode()).hexdigest() for f, t in sorted(files.items())},
    }
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


def _slot_floats(layer: MoELayer, qexperts: dict[int, Any], bias: bool) -> int:
    """Floats of one cache slot when some experts are quantised: the largest stored expert as
    the loader packs it (fp32: COLIBRI_EXPERT_FLOATS back to back; quantised: each part at a
    16-byte aligned offset, loader.c slot_fill), rounded up so every slot starts 16-aligned."""
    from .memplan import expert_floats

    c = layer.config
    largest = 4 * expert_floats(c, bias)
    for qe in qexperts.values():
        if qe.scheme == "fp32":
            continue
        off = 0
        for _, t in qe.tensors():
            off = align16(off) + _part_nbytes(t)
        largest = max(largest, off)
    return align16(largest) // 4


def default_ram_budget(board_name: str, plan: MemoryPlan) -> int:
    """RAM for pinned experts when --ram-budget is not given: half of what the board has left
    after the arena, the stack and a 4 KB allowance for the runtime's statics; 0 on hosted
    boards (no RAM region: weights are in RAM there anyway)."""
    from .boards import load_board

    board = load_board(board_name)
    ram = board.memory.get("ram")
    if ram is None or "flash" not in board.memory:
        return 0
    free = ram.size - plan.arena_size - board.stack_size - 4096
    return max(0, free // 2)


def _by_index(s: dict[str, Any]) -> int:
    return int(s["index"])


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


def write_output(
    out_dir: str | os.PathLike[str], files: dict[str, str], manifest: dict, force: bool = False
) -> Path:
    """Write files + manifest into out_dir atomically (temp dir, then rename)."""
    out = Path(out_dir).resolve()
    if out.exists():
        if not out.is_dir():
            raise OutputExistsError(f"{out}: exists and is not a directory")
        if any(out.iterdir()) and not (out / MANIFEST).is_file() and not force:
            raise OutputExistsError(
                f"{out}: directory exists, is not empty and holds no Colibri manifest.json; "
                f"choose another --out or pass --force to replace it"
            )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        for fname, text in files.items():
            (tmp / fname).write_text(text, encoding="utf-8")
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        if out.exists():
            old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
            old.rmdir()
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def generate(
    layer: MoELayer,
    out_dir: str | os.PathLike[str],
    options: GenerateOptions,
    force: bool = False,
    calib: np.ndarray | None = None,
) -> tuple[Path, dict]:
    """Render and write the generated sources for `layer`."""
    from .boards import load_board
    from .size import check_budget

    board = load_board(options.board)
    files, manifest = render_sources(layer, options, calib)
    try:
        check_budget(manifest, board)
    except BudgetExceeded as exc:
        hint = _quant_suggestion(layer, manifest, board, str(exc))
        raise BudgetExceeded(str(exc) + hint) from None
    pinned = int(manifest.get("layout", {}).get("pinned_ram_bytes", 0))
    ram = board.memory.get("ram")
    if pinned and ram is not None:
        need = manifest["memory"]["arena_size"] + board.stack_size + 4096 + pinned
        if need > ram.size:
            raise BudgetExceeded(
                f"the experts pinned in RAM ({pinned} bytes, --ram-budget "
                f"{options.ram_budget}) do not fit board {board.name}: arena + stack + pinned "
                f"experts need ~{need} bytes, the board has {ram.size}; lower --ram-budget to "
                f"at most {max(0, ram.size - need + pinned)}"
            )
    return write_output(out_dir, files, manifest, force=force), manifest


def _quant_suggestion(layer: MoELayer, manifest: dict, board: Any, message: str) -> str:
    """When the weights overflow the board's flash: which of --quant fp16/int8/int4 fits."""
    from .size import schemes_that_fit

    if "flash:" not in message:
        return ""
    fits = schemes_that_fit(manifest, board, lambda scheme: weight_bytes_for(layer, scheme))
    if fits:
        return "\n  Quantised weights fit the flash: " + ", ".join(
            f"--quant {scheme} ({need} bytes of weights)" for scheme, need in fits
        )
    return (
        f"\n  Even --quant int4 ({weight_bytes_for(layer, 'int4')} bytes of weights) does not "
        "fit the flash of this board"
    )
