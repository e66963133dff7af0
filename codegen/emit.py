"""Emit C sources specialised to one model from the Jinja2 templates in templates/.

Output (one directory): colibri_model.h, colibri_model.c, colibri_weights.h, colibri_weights.c,
manifest.json. Deterministic: the same model and options give byte-identical files. The
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
from .errors import OutputExistsError
from .ir import MoELayer
from .memplan import MemoryPlan, plan_memory
from .paths import resource_dir

GENERATED_FILES = (
    "colibri_model.h",
    "colibri_model.c",
    "colibri_weights.h",
    "colibri_weights.c",
)
MANIFEST = "manifest.json"
DEFAULT_MAX_TOKENS = 32


@dataclass(frozen=True)
class GenerateOptions:
    """What `colibri generate` was asked for (recorded in the manifest)."""

    board: str = "host"
    name: str = "model"
    max_tokens: int = DEFAULT_MAX_TOKENS

    def as_dict(self) -> dict[str, Any]:
        return {"board": self.board, "name": self.name, "max_tokens": self.max_tokens}


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


def render_sources(layer: MoELayer, options: GenerateOptions) -> tuple[dict[str, str], dict]:
    """Render every generated file; returns ({filename: text}, manifest)."""
    layer.validate()
    c = layer.config
    name = c_ident(options.name)
    names = NameTable()
    prefix = name.upper()
    plan: MemoryPlan = plan_memory(c, options.max_tokens)
    storage = layer.storage_map()
    stored: list[dict[str, Any]] = []
    for idx in sorted(set(storage)):
        e = layer.experts[idx]
        tensors = []
        arg = {"w1": "NULL", "b1": "NULL", "w2": "NULL", "b2": "NULL", "w3": "NULL"}
        for tname, arr in e.tensors():
            sym = names.add(f"expert.{idx}.{tname}", f"{name}_e{idx}_{tname}")
            tensors.append({"symbol": sym, "size": int(arr.size), "data": c_float_array(arr)})
            arg[tname] = sym
        stored.append(
            {
                "index": idx,
                "tensors": tensors,
                "arg": arg,
                "nbytes": e.nbytes,
                "users": [i for i, s in enumerate(storage) if s == idx],
            }
        )
    weight_bytes = int(layer.router_w.nbytes) + sum(int(s["nbytes"]) for s in stored)
    if layer.router_b is not None:
        weight_bytes += int(layer.router_b.nbytes)
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
        "router_w": c_float_array(layer.router_w),
        "router_b": c_float_array(layer.router_b) if layer.router_b is not None else "",
        "stored": stored,
        "stored_by_index": {s["index"]: s for s in stored},
        "storage": storage,
        "share_values": c_int_array(storage),
        "weight_bytes": weight_bytes,
    }
    env = _environment()
    files = {}
    for fname in GENERATED_FILES:
        files[fname] = env.get_template(fname + ".j2").render(filename=fname, **ctx)
    manifest = {
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
        "experts_bytes": [[s["index"], s["nbytes"]] for s in stored],
        "files": {f: hashlib.sha256(t.encode()).hexdigest() for f, t in sorted(files.items())},
    }
    return files, manifest


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
    layer: MoELayer, out_dir: str | os.PathLike[str], options: GenerateOptions, force: bool = False
) -> tuple[Path, dict]:
    """Render and write the generated sources for `layer`."""
    from .boards import load_board
    from .size import check_budget

    board = load_board(options.board)
    files, manifest = render_sources(layer, options)
    check_budget(manifest, board)
    return write_output(out_dir, files, manifest, force=force), manifest
