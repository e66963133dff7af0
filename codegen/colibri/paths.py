"""Where Colibri's data files (boards, templates, C runtime, SConstruct) live.

From a source checkout they are beside the package directory (the repository root); an installed
wheel ships them under ``colibri/data``.
"""

from __future__ import annotations

import os
from pathlib import Path

_MARKERS = ("boards", "templates", "runtime_c", "SConstruct")


def _is_resource_root(path: Path) -> bool:
    return all((path / marker).exists() for marker in _MARKERS)


def resource_dir() -> Path:
    """Directory holding ``boards/``, ``templates/``, ``runtime_c/`` and ``SConstruct``.

    ``COLIBRI_RESOURCE_DIR`` overrides the search (useful for out-of-tree board collections).
    """
    override = os.environ.get("COLIBRI_RESOURCE_DIR")
    if override:
        return Path(override).resolve()
    package_dir = Path(__file__).resolve().parent
    source_root = package_dir.parent.parent  # codegen/colibri -> the repository root
    if _is_resource_root(source_root):
        return source_root
    return package_dir / "data"


def tools_dir() -> Path:
    """Directory of host tools built by ``scripts/setup.sh`` (icount plugin, libgcc helpers).

    ``COLIBRI_TOOLS_DIR`` overrides the default ``<resource_dir>/build/tools``.
    """
    override = os.environ.get("COLIBRI_TOOLS_DIR")
    if override:
        return Path(override).resolve()
    return resource_dir() / "build" / "tools"


#: The ISA directory of the host board (boards/host.toml): native builds of the runtime add
#: ``runtime_c/arch/x86_64``, whose files compile to nothing on other machines.
HOST_ISA = "x86_64"


def runtime_sources(isa: str = HOST_ISA, root: Path | None = None) -> list[Path]:
    """The C files of libcolibri for a board ISA, chosen as the SConstruct chooses them.

    ``runtime_c/src/*.c`` (the portable kernels and the runtime), with each
    ``runtime_c/arch/<isa>/X.c`` replacing ``src/X.c`` of the same name or added beside them;
    ``root`` defaults to :func:`resource_dir`. Sorted by file name.
    """
    rt = (root if root is not None else resource_dir()) / "runtime_c"
    files = {p.name: p for p in (rt / "src").glob("*.c")}
    if isa:
        files.update({p.name: p for p in (rt / "arch" / isa).glob("*.c")})
    return [files[name] for name in sorted(files)]
