"""Writing a generated model: the Jinja2 environment, file names per kind, atomic output.

Every generated directory holds its C sources and ``manifest.json``, whose ``"kind"`` says what
was generated (``"layer"``: one MoE block, files ``colibri_model.{h,c}`` +
``colibri_weights.{h,c}``; ``"transformer"``: a whole decoder, ``transformer_*``). The SConstruct
and the runners read the kind. The directory is written to a temporary sibling and renamed into
place, so a failed generation never leaves a half-written output.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import jinja2

from .. import __version__
from ..errors import OutputExistsError
from ..paths import resource_dir
from ..plan.memory import ArenaPlan

MANIFEST = "manifest.json"
#: Generated files per manifest kind.
GENERATED_FILES: dict[str, tuple[str, ...]] = {
    "layer": ("colibri_model.h", "colibri_model.c", "colibri_weights.h", "colibri_weights.c"),
    "transformer": (
        "transformer_model.h",
        "transformer_model.c",
        "transformer_weights.h",
        "transformer_weights.c",
    ),
}
KIND = "transformer"


def manifest_kind(manifest: dict[str, Any]) -> str:
    """The kind of a generated directory's manifest (older layer manifests have none)."""
    return str(manifest.get("kind", "layer"))


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(resource_dir() / "templates")),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    return env


def is_transformer_dir(manifest: dict[str, Any]) -> bool:
    """Whether a generated directory's manifest describes a whole transformer."""
    return manifest.get("kind") == KIND


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


def banner_context(
    source: str, model_hash: str, options: dict[str, Any], name: str
) -> dict[str, Any]:
    """What every generated file's banner and every template need: the generator's version,
    the model (file name, content hash), the options line and the C name and macro prefix."""
    return {
        "version": __version__,
        "model_source": Path(source).name if source else "(in memory)",
        "model_hash": model_hash,
        "options_line": " ".join(f"{k}={v}" for k, v in sorted(options.items())),
        "name": name,
        "P": name.upper(),
    }


def render_files(kind: str, ctx: dict[str, Any]) -> dict[str, str]:
    """Every generated file of a model of `kind` from templates/<kind>/<file>.j2."""
    env = environment()
    return {
        f: env.get_template(f"{kind}/{f}.j2").render(filename=f, **ctx)
        for f in GENERATED_FILES[kind]
    }


def new_manifest(
    kind: str,
    model: dict[str, Any],
    options: dict[str, Any],
    plan: ArenaPlan,
    max_tokens: int,
    weight_bytes: int,
    files: dict[str, str],
    **memory: Any,
) -> dict[str, Any]:
    """The manifest every kind shares: generator, kind, model (source, sha256, config, ...),
    options, memory (the arena plan, weight bytes and the kind's extra figures) and the
    SHA-256 of every generated file."""
    return {
        "generator": f"colibri {__version__}",
        "kind": kind,
        "model": model,
        "options": options,
        "memory": {
            "arena_size": plan.arena_size,
            "max_tokens": max_tokens,
            "regions": [
                {"name": r.name, "offset": r.offset, "size": r.size, "what": r.what}
                for r in plan.regions
            ],
            "weight_bytes": weight_bytes,
            **memory,
        },
        "files": {f: hashlib.sha256(t.encode()).hexdigest() for f, t in sorted(files.items())},
    }
