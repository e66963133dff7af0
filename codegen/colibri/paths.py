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
