"""Checks on linked firmware: the MCU path must never touch the heap.

``check_no_heap`` looks at the ELF's symbol table for heap entry points, defined or merely
referenced (a newlib/picolibc firmware that calls malloc links ``malloc`` and ``_malloc_r``; an
object or library that calls it has it undefined). When the linker map made with
``-Wl,-Map=...,--cref`` is beside the ELF (``<elf>.map``), the message names the objects that
reference the symbol.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import HeapUseError

#: Entry points of the C heap (and the sbrk underneath it) in glibc, newlib and picolibc.
HEAP_SYMBOLS = frozenset(
    {
        "malloc",
        "free",
        "calloc",
        "realloc",
        "reallocarray",
        "reallocf",
        "memalign",
        "aligned_alloc",
        "posix_memalign",
        "valloc",
        "pvalloc",
        "_malloc_r",
        "_free_r",
        "_calloc_r",
        "_realloc_r",
        "_memalign_r",
        "_sbrk",
        "_sbrk_r",
        "sbrk",
        "__libc_malloc",
        "__libc_free",
        "__libc_calloc",
        "__libc_realloc",
    }
)


def heap_symbols(elf_path: str | Path) -> dict[str, bool]:
    """Heap symbols of an ELF (executable, object or shared library): name -> defined?"""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    found: dict[str, bool] = {}
    try:
        with open(elf_path, "rb") as f:
            elf = ELFFile(f)
            for section in elf.iter_sections():
                if not isinstance(section, SymbolTableSection):
                    continue
                for sym in section.iter_symbols():
                    if sym.name in HEAP_SYMBOLS:
                        defined = sym["st_shndx"] != "SHN_UNDEF"
                        found[sym.name] = found.get(sym.name, False) or defined
    except (OSError, ELFError) as exc:
        raise HeapUseError(f"{elf_path}: cannot read ELF for the heap check: {exc}") from exc
    return found


def map_references(map_path: str | Path, symbol: str) -> list[str]:
    """Objects that reference ``symbol`` according to a GNU ld ``--cref`` map (definer first)."""
    try:
        text = Path(map_path).read_text(errors="replace")
    except OSError:
        return []
    marker = text.find("Cross Reference Table")
    if marker < 0:
        return []
    files: list[str] = []
    in_symbol = False
    for line in text[marker:].splitlines()[1:]:
        if not line.strip():
            continue
        if not line[0].isspace():
            name, _, rest = line.partition(" ")
            in_symbol = name == symbol
            if in_symbol and rest.strip():
                files.append(rest.strip())
        elif in_symbol:
            files.append(line.strip())
    return files


def _short(path: str) -> str:
    match = re.match(r"(.*/)?([^/]+\.a)\((.+)\)$", path)
    if match:
        return f"{match.group(2)}({match.group(3)})"
    return path


def check_no_heap(elf_path: str | Path, map_path: str | Path | None = None) -> None:
    """Raise HeapUseError if the ELF defines or references malloc/free/calloc/realloc & co."""
    found = heap_symbols(elf_path)
    if not found:
        return
    if map_path is None:
        candidate = Path(str(elf_path) + ".map")
        map_path = candidate if candidate.is_file() else None
    lines = []
    for name in sorted(found, key=lambda n: (n not in {"malloc", "free", "calloc", "realloc"}, n)):
        state = "defined (linked in)" if found[name] else "referenced (undefined)"
        detail = ""
        if map_path is not None:
            refs = map_references(map_path, name)
            users = [_short(r) for r in refs[1:]] if found[name] else [_short(r) for r in refs]
            if users:
                detail = f"; referenced by {', '.join(users)}"
        lines.append(f"  {name}: {state}{detail}")
    raise HeapUseError(
        f"{elf_path}: firmware uses the heap, which the MCU path forbids:\n"
        + "\n".join(lines)
        + "\nRemove the call (use the static arena / caller-provided buffers); printf-family "
        "functions of newlib also pull in malloc."
    )
