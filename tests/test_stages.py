"""The package's shape is its data flow: one folder per stage, imports only point backwards.

Stages in order (README "Design"): the core modules at the package root (errors, paths, boards,
options), then ir -> frontends -> quant -> reference -> plan -> emit -> targets -> report -> cli
-> hil (the pytest plugin, which drives the CLI and the runners from a user's test suite).
Every import of a colibri module, at module level or inside a function, must name a module of the
same or an earlier stage, and the import graph has no cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "codegen" / "colibri"
STAGES = (
    "core",
    "ir",
    "frontends",
    "quant",
    "reference",
    "plan",
    "emit",
    "targets",
    "report",
    "cli",
    "hil",
)
MAX_MODULES_PER_FOLDER = 8


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def stage_of(module: str) -> int:
    """Index in STAGES: the folder under colibri/, core for root modules; `python -m colibri`
    (colibri.__main__) only starts the CLI, so it is the CLI's."""
    parts = module.split(".")
    if module == "colibri.__main__":
        return STAGES.index("cli")
    if len(parts) >= 2 and (PACKAGE / parts[1]).is_dir():
        return STAGES.index(parts[1])
    return STAGES.index("core")


def imports_of(module: str) -> set[str]:
    """colibri modules imported anywhere in `module` (lazy imports inside functions too)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in MODULES else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in MODULES and m != module}


GRAPH = {m: imports_of(m) for m in MODULES}


def test_every_folder_is_a_stage_with_a_map() -> None:
    folders = sorted(p for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert [f.name for f in folders] == sorted(STAGES[1:])
    for folder in [PACKAGE, *folders]:
        modules = list(folder.glob("*.py"))  # __init__ / __main__ included
        assert len(modules) <= MAX_MODULES_PER_FOLDER, f"{folder}: {len(modules)} modules"
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))
        assert doc and len(doc.split()) >= 20, f"{folder}/__init__.py: no docstring map"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_backwards(module: str) -> None:
    later = sorted(t for t in GRAPH[module] if stage_of(t) > stage_of(module))
    assert not later, f"{module} ({STAGES[stage_of(module)]}) imports a later stage: " + ", ".join(
        f"{t} ({STAGES[stage_of(t)]})" for t in later
    )


def test_no_import_cycles() -> None:
    state: dict[str, int] = {}  # 1: on the DFS stack, 2: done
    cycles: list[str] = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(GRAPH[module]):
            if state.get(target) == 1:
                cycles.append(" -> ".join(path[path.index(target) :] + [target]))
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_checker_sees_a_later_import() -> None:
    """The graph is real: the CLI imports every stage, and the pipeline lists them in order."""
    assert {stage_of(t) for t in GRAPH["colibri.cli.pipeline"]} >= {
        STAGES.index(s) for s in ("core", "ir", "frontends", "quant", "reference", "plan", "emit")
    }
    assert stage_of("colibri.plan.memory") > stage_of("colibri.ir.moe")


def test_generate_and_convert_climb_back_rarely() -> None:
    """Following `generate` and `convert` through the code (tools/stage_climbs.py: the calls,
    traced, of a function of an earlier stage than the caller's, the driver and the core
    modules left out) finds at most 10 places where a stage hands work back (issue 36)."""
    import sys

    sys.path.insert(0, str(PACKAGE.parent.parent / "tools"))
    import stage_climbs

    for command, (_, climbs, _) in stage_climbs.measure().items():
        assert len(climbs) <= 10, f"{command}: {len(climbs)} climbs:\n" + "\n".join(
            f"  {caller} -> {callee}" for caller, callee in sorted(climbs)
        )
