"""libcolibri.a for every board: built by SConstruct into build/<board>/ with its public
headers, every colibri_* function of colibri.h defined; and the seed's infer.c example built
against libcolibri.a by SCons and run on a toy model."""

from __future__ import annotations

import io
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from colibri.boards import matrix_boards
from colibri.frontends.load import load_model
from colibri.frontends.seed import make_toy, write_seed
from colibri.reference.moe import compare, moe_forward
from colibri.targets.build import build_library, scons
from colibri.targets.size import _ar_members
from conftest import ROOT, require_board
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

API = sorted(
    set(re.findall(r"\b(colibri_\w+)\(", (ROOT / "runtime_c/include/colibri.h").read_text()))
)


def _defined(lib: Path) -> set[str]:
    names: set[str] = set()
    for blob in _ar_members(lib).values():
        symtab = ELFFile(io.BytesIO(blob)).get_section_by_name(".symtab")
        assert isinstance(symtab, SymbolTableSection)
        for sym in symtab.iter_symbols():
            if sym["st_shndx"] != "SHN_UNDEF" and sym["st_info"]["bind"] == "STB_GLOBAL":
                names.add(sym.name)
    return names


@pytest.mark.parametrize("board", [b.name for b in matrix_boards()])
def test_library_defines_the_whole_api(board: str, tmp_path: Path) -> None:
    require_board(board, run=False)
    lib = build_library(board, tmp_path / board)
    assert lib == tmp_path / board / "libcolibri.a" and lib.is_file()
    assert (tmp_path / board / "include" / "colibri.h").is_file()
    assert len(API) >= 10
    missing = [f for f in API if f not in _defined(lib)]
    assert not missing, f"{board}: libcolibri.a does not define {missing}"


def test_infer_example_built_by_scons(tmp_path: Path) -> None:
    proc = scons(["board=host", "examples=1", f"build_dir={tmp_path / 'b'}"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    infer = tmp_path / "b" / "examples" / "infer"
    layer = make_toy()
    write_seed(layer, tmp_path / "toy")
    run = subprocess.run(
        [str(infer), str(tmp_path / "toy" / "model.bin")], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    out = run.stdout
    m = re.search(r"Output:\s*((?:[-+0-9.e]+\s*){8})", out)
    assert m, out
    y = np.array([float(v) for v in m.group(1).split()], np.float32)
    x = np.array([[1.0, 0.5, 0.2, 0.8, 0.1, 0.9, 0.4, 0.6]], np.float32)
    ref, r = moe_forward(load_model(tmp_path / "toy" / "model.bin"), x)
    assert compare(y[None, :], ref, tol=1e-3) is None  # printed with 3-6 decimals
    e = re.search(r"Expert chosen: (\d+), Gate weight: ([0-9.]+)", out)
    assert e and int(e.group(1)) == r.expert_ids[0, 0], out
    assert abs(float(e.group(2)) - r.gates[0, 0]) < 1e-3 and float(e.group(2)) < 1.0
    assert "Input:" in out


def test_ccache_gives_the_same_objects_and_stack_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where ccache is installed the SConstruct compiles through it (COLIBRI_CCACHE=0: not):
    a second build directory gets every runtime object and its -fstack-usage file from the
    cache, byte for byte what the compiler wrote, which the stack check reads."""
    import shutil

    if shutil.which("ccache") is None:
        pytest.skip("ccache is not installed (scripts/setup.sh installs it: apt install ccache)")
    require_board("cortex-m4", run=False)
    monkeypatch.setenv("CCACHE_DIR", str(tmp_path / "ccache"))
    monkeypatch.delenv("COLIBRI_CCACHE", raising=False)
    dirs = [tmp_path / "a", tmp_path / "b"]
    for d in dirs:
        proc = scons(["board=cortex-m4", f"build_dir={d}", "verbose=1"])
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert re.search(r"^\S*ccache \S*arm-none-eabi-gcc .*-c .*router\.c", proc.stdout, re.M)
    stats = subprocess.run(["ccache", "--print-stats"], capture_output=True, text=True).stdout
    counts = dict(line.split("\t", 1) for line in stats.splitlines() if "\t" in line)
    runtime = sorted((dirs[0] / "obj" / "runtime").glob("*.o"))
    assert len(runtime) >= 20
    assert int(counts["direct_cache_hit"]) >= len(runtime), stats
    for obj in runtime:
        for path in (obj, obj.with_suffix(".su")):
            twin = dirs[1] / path.relative_to(dirs[0])
            assert twin.read_bytes() == path.read_bytes(), twin
    monkeypatch.setenv("COLIBRI_CCACHE", "0")
    dry = scons(["board=cortex-m4", f"build_dir={tmp_path / 'c'}", "verbose=1", "-n"])
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert re.search(r"^\S*arm-none-eabi-gcc .*-c .*router\.c", dry.stdout, re.M), dry.stdout
    assert not re.search(r"^\S*ccache ", dry.stdout, re.M), dry.stdout
