"""Every Python path the documentation names exists (issue 39, item 4.3).

README.md and docs/*.md name modules and functions as dotted paths (`colibri.reference.transformer`,
`colibri.targets.binding.LM`); a module moved in a refactor left the README pointing at
`colibri.transformer`. Each dotted `colibri.…` name in those files must import: the longest
prefix that is a module is imported and the rest looked up as attributes. File names that look
dotted (`libcolibri.a`, `colibri.h`, `colibri.pc`) are not Python paths and are left out.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: `colibri.<name>` words that are file names (C header, archive, pkg-config file, ...).
FILE_SUFFIXES = {"a", "h", "c", "pc", "so", "clb", "json", "toml", "cmake", "bin", "elf", "md"}
DOTTED = re.compile(r"(?<![\w./-])colibri(?:\.[A-Za-z_]\w*)+")
#: twister scenario names (the `tests:` keys of the Zephyr yaml files), quoted in twister's output.
TWISTER_FILES = [
    ROOT / "examples" / "zephyr_app" / "sample.yaml",
    ROOT / "tests" / "zephyr" / "colibri_layer" / "testcase.yaml",
]
TWISTER_SCENARIOS = {
    m.group(1)
    for path in TWISTER_FILES
    for m in re.finditer(r"^  (\w+(?:\.\w+)+):\s*$", path.read_text(), re.MULTILINE)
}


def dotted_names() -> list[tuple[str, str]]:
    """(file, dotted name) of every Python path the docs mention, once each."""
    seen: dict[str, str] = {}
    for doc in DOCS:
        for name in DOTTED.findall(doc.read_text()):
            if name.rsplit(".", 1)[-1] in FILE_SUFFIXES or name in TWISTER_SCENARIOS:
                continue
            seen.setdefault(name, doc.name)
    return sorted((f, n) for n, f in seen.items())


def resolve(name: str) -> object:
    """Import the longest module prefix of `name`, then look the rest up as attributes."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as exc:
            if exc.name is not None and not ".".join(parts[:cut]).startswith(exc.name):
                raise  # the module exists but one of its own imports is missing
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(name)


def test_docs_name_python_paths() -> None:
    names = [n for _, n in dotted_names()]
    assert "colibri.reference.transformer" in " ".join(names)  # the scan finds them
    assert not any(n.endswith((".h", ".a", ".pc")) for n in names)
    assert "colibri.moe_layer.fixed_model" in TWISTER_SCENARIOS  # the testcase's scenario


@pytest.mark.parametrize(("doc", "name"), dotted_names())
def test_every_named_python_path_imports(doc: str, name: str) -> None:
    try:
        resolve(name)
    except (ImportError, AttributeError) as exc:
        pytest.fail(f"{doc} names `{name}`, which does not exist ({exc})")
