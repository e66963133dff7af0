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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2

from .. import __version__
from ..errors import OutputExistsError, output_error
from ..paths import check_output_file, check_output_parent, dir_mode, resource_dir
from ..plan.memory import ArenaPlan
from .cformat import c_comment
from .cformat import register as register_c_layout

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
#: The weights blob of each kind (bytes, linked by the generated *_weights.c with .incbin).
WEIGHTS_BLOB: dict[str, str] = {
    "layer": "colibri_weights.bin",
    "transformer": "transformer_weights.bin",
}


def manifest_kind(manifest: dict[str, Any]) -> str:
    """The kind of a generated directory's manifest (:data:`colibri.ir.model.KINDS`; older
    layer manifests have none)."""
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
    register_c_layout(env)
    return env


class BinaryFile:
    """A generated binary file kept as the buffers it is made of (the weights blob: views of
    the model's arrays and the quantised tensors' bytes), never joined in memory."""

    def __init__(self, chunks: list[bytes | memoryview]) -> None:
        self.chunks = chunks
        self.size = sum(memoryview(c).nbytes for c in chunks)

    def tobytes(self) -> bytes:
        return b"".join(self.chunks)

    def __eq__(self, other: object) -> bool:
        """Equal when the bytes are (determinism checks compare rendered files)."""
        if not isinstance(other, BinaryFile):
            return NotImplemented
        return self.size == other.size and self.tobytes() == other.tobytes()

    def sha256(self) -> str:
        h = hashlib.sha256()
        for c in self.chunks:
            h.update(c)
        return h.hexdigest()

    def write(self, path: Path) -> None:
        with open(path, "wb") as f:
            f.writelines(self.chunks)


#: What a generated file holds: C text, or bytes.
FileContent = str | bytes | BinaryFile


def as_binary(content: FileContent) -> bytes | BinaryFile:
    """A generated file's content as written: text in UTF-8, bytes as they are."""
    return content.encode("utf-8") if isinstance(content, str) else content


def content_size(content: bytes | BinaryFile) -> int:
    return content.size if isinstance(content, BinaryFile) else len(content)


def content_sha256(content: FileContent) -> str:
    data = as_binary(content)
    return data.sha256() if isinstance(data, BinaryFile) else hashlib.sha256(data).hexdigest()


def write_output(
    out_dir: str | os.PathLike[str],
    files: Mapping[str, FileContent],
    manifest: dict,
    force: bool = False,
) -> Path:
    """Write files + manifest into out_dir atomically (temp dir, then rename). The directory
    gets the normal mode (0777 & ~umask); a full disk or an unwritable or file parent is an
    OutputError naming the path, and a previous output stays as it was."""
    check_output_file(out_dir)  # not a device, FIFO, socket or a link out of its directory
    out = Path(out_dir).resolve()
    if out.exists():
        if not out.is_dir():
            raise OutputExistsError(f"{out}: exists and is not a directory")
        if any(out.iterdir()) and not (out / MANIFEST).is_file() and not force:
            raise OutputExistsError(
                f"{out}: directory exists, is not empty and holds no Colibri manifest.json; "
                f"choose another --out or pass --force to replace it"
            )
    check_output_parent(out)
    contents = {f: as_binary(t) for f, t in files.items()}
    contents[MANIFEST] = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    needed = sum(content_size(b) for b in contents.values())
    try:
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    except OSError as exc:
        raise output_error(out, exc, needed) from None
    old: Path | None = None
    try:
        os.chmod(tmp, dir_mode())
        for fname, data in contents.items():
            if isinstance(data, BinaryFile):
                data.write(tmp / fname)
            else:
                (tmp / fname).write_bytes(data)
        if out.exists():
            old = tmp.with_name(tmp.name.replace(".tmp-", ".old-", 1))
            out.rename(old)
        tmp.rename(out)
    except BaseException as exc:
        if old is not None and old.exists() and not out.exists():
            old.rename(out)  # put the previous output back
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise output_error(out, exc, needed) from None
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
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
        # the banner's " * Options: " line, wrapped under its first option at the column limit
        "options_line": c_comment(
            " ".join(f"{k}={v}" for k, v in sorted(options.items())),
            "",
            " * Options: ",
            " *          ",
        )[len(" * Options: ") : -len(" */")],
        "name": name,
        "P": name.upper(),
    }


def render_files(kind: str, ctx: dict[str, Any]) -> dict[str, str]:
    """Every generated file of a model of `kind` from templates/<kind>/<file>.j2; the weights
    files of both kinds from templates/common/weights.{h,c}.j2."""
    env = environment()

    def template(f: str) -> str:
        tail = f.rsplit("_", 1)[-1]  # weights.h / weights.c: one template for both kinds
        return f"common/{tail}.j2" if tail.startswith("weights.") else f"{kind}/{f}.j2"

    return {
        f: env.get_template(template(f)).render(filename=f, **ctx) for f in GENERATED_FILES[kind]
    }


def new_manifest(
    kind: str,
    model: dict[str, Any],
    options: dict[str, Any],
    plan: ArenaPlan,
    max_tokens: int,
    weight_bytes: int,
    files: Mapping[str, FileContent],
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
        "files": {f: content_sha256(t) for f, t in sorted(files.items())},
    }
