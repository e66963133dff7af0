"""Where generated data lands: every symbol that *_weights.c links from *_weights.bin with
.incbin holds, in the object each board's compiler makes, exactly the tensor the IR quantised,
with the size of its C type, in flash (.rodata) or RAM (.data) as placed; the static arena goes
to the section COLIBRI_ARENA_SECTION names."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from colibri.boards import load_board
from colibri.cli.pipeline import generate
from colibri.frontends.seed import make_toy
from colibri.options import GenerateOptions
from colibri.quant.formats import (
    BLOCK_Q4_DTYPE,
    QuantTensor,
    c8_restore,
    q4r4_restore,
    q8_channel_dtype,
    r4p_restore,
)
from colibri.quant.model import quantize_moe_layer
from colibri.reference.calibration import layer_calibration
from conftest import ROOT, require_board
from elftools.elf.elffile import ELFFile

BOARDS = ("host", "cortex-m4", "cortex-a53", "xtensa-lx106")


def _symbols(obj: Path) -> dict[str, tuple[bytes, str]]:
    """Defined data symbols of an object: (bytes, section name)."""
    out = {}
    with open(obj, "rb") as f:
        elf = ELFFile(f)
        symtab = elf.get_section_by_name(".symtab")
        for s in symtab.iter_symbols():  # type: ignore[union-attr]
            if s["st_info"]["type"] != "STT_OBJECT" or not isinstance(s["st_shndx"], int):
                continue
            sec = elf.get_section(s["st_shndx"])
            data = sec.data()[s["st_value"] : s["st_value"] + s["st_size"]]
            out[s.name] = (data, sec.name)
    return out


def _compile(board_name: str, gen: Path, out: Path) -> dict[str, tuple[bytes, str]]:
    board = load_board(board_name)
    obj = out / f"weights-{board_name}.o"
    cmd = [board.compiler, *board.compile_flags(), "-I", str(ROOT / "runtime_c" / "include")]
    cmd += ["-I", str(ROOT / "runtime_c" / "tiles")]
    cmd += ["-I", str(gen), f"-Wa,-I{gen}", "-c", str(gen / "colibri_weights.c"), "-o", str(obj)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return _symbols(obj)


def _expected(t: QuantTensor | np.ndarray) -> tuple[bytes, int]:
    """The tensor's bytes built from its numpy form, and its C size."""
    if isinstance(t, np.ndarray) or t.scheme == "fp32":
        arr = t if isinstance(t, np.ndarray) else t.data.T
        raw = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        return raw, len(raw)
    if t.scheme == "int8":
        dt = q8_channel_dtype(t.n_out, t.n_in)
        return b"", dt.itemsize  # checked field by field below
    if t.scheme == "int4":
        raw = np.asarray(t.data, dtype=BLOCK_Q4_DTYPE).tobytes()
        return raw, len(raw)
    raw = np.asarray(t.data, dtype="<u2").tobytes()
    return raw, len(raw)


@pytest.mark.parametrize("board", BOARDS)
def test_blob_symbols_hold_the_quantised_tensors(board: str, tmp_path: Path) -> None:
    require_board(board, run=False)
    layer = make_toy(6, 32, 64, 2, "gelu", seed=4, router_bias=True)
    for e in layer.experts:
        e.b1 = np.full(64, 0.25, np.float32)
        e.b2 = np.full(32, -0.5, np.float32)
    calib = np.random.default_rng(0).standard_normal((40, 32)).astype(np.float32)
    opts = GenerateOptions(
        board="cortex-m7",
        name="w",
        quant="int8",
        expert_quant="1=int4,2=fp16,3=fp32",
        router_quant="int8",
        calib="calib",
        ram_budget=9000,
    )
    gen, manifest = generate(layer, tmp_path / "w", opts, calib=calib)
    blob = (gen / "colibri_weights.bin").read_bytes()
    assert len(blob) >= manifest["memory"]["weight_bytes"]
    syms = _compile(board, gen, tmp_path)

    stats = layer_calibration(layer, calib)  # calib calibrates the stored experts
    q = quantize_moe_layer(layer, "int8", "1=int4,2=fp16,3=fp32", None, "int8", calib=stats)
    placement = {e["expert"]: e["placement"] for e in manifest["experts"]}
    assert "ram" in placement.values() and "flash" in placement.values()
    checked = 0
    for idx, qe in q.experts.items():
        for part, t in qe.tensors():
            data, section = syms[f"w_e{idx}_{part}"]
            want, size = _expected(t)
            assert len(data) == size, (idx, part)
            if isinstance(t, QuantTensor) and t.scheme == "int8":
                rec = np.frombuffer(data, dtype=q8_channel_dtype(t.n_out, t.n_in))[0]
                assert t.scale is not None
                np.testing.assert_array_equal(rec["scale"], t.scale)
                # cortex-m7 reads int8 x int8 experts in layout r4p (inputs in whole blocks of
                # 32: colibri/emit/experts.py)
                layout = manifest["weight_layouts"][f"w_ffn_int8_{qe.act}"][part]
                assert layout == ("r4p" if qe.act == "int8" else "rows"), (idx, part, layout)
                stored = rec["q"] if layout == "rows" else r4p_restore(rec["q"], t.n_out, t.n_in)
                np.testing.assert_array_equal(stored.ravel(), np.asarray(t.data, np.int8).ravel())
            elif isinstance(t, QuantTensor) and t.scheme == "int4":
                # cortex-m7 reads int4 x int8 experts in layout q4r4 (whole blocks of 32)
                layout = manifest["weight_layouts"][f"w_ffn_int4_{qe.act}"][part]
                assert layout == ("q4r4" if qe.act == "int8" else "rows"), (idx, part, layout)
                blocks = np.frombuffer(data, np.uint8)
                if layout == "q4r4":
                    blocks = q4r4_restore(blocks, t.n_out, t.n_in).view(np.uint8).ravel()
                assert blocks.tobytes() == want, (idx, part)
            elif isinstance(t, QuantTensor) and t.scheme == "fp32":
                # cortex-m7 reads fp32 experts in layout c8 (colibri/emit/experts.py)
                layout = manifest["weight_layouts"]["w_ffn"][part]
                assert layout == "c8", (idx, part, layout)
                got = np.frombuffer(data, dtype="<f4")
                np.testing.assert_array_equal(c8_restore(got, t.n_out, t.n_in), t.data)
            elif isinstance(t, QuantTensor) and t.scheme == "fp16":
                # cortex-m7 reads fp16 experts in layout c8 too (VCVTB / VCVTT, experts.py)
                layout = manifest["weight_layouts"][f"w_ffn_fp16_{qe.act}"][part]
                assert layout == "c8", (idx, part, layout)
                got16 = np.frombuffer(data, dtype="<u2")
                np.testing.assert_array_equal(c8_restore(got16, t.n_out, t.n_in), t.data)
            else:
                assert data == want, (idx, part)
            in_ram = placement[idx] == "ram"
            assert section.startswith(".data" if in_ram else ".rodata"), (idx, part, section)
            checked += 1
    assert checked == sum(len(e.tensors()) for e in q.experts.values())
    codes, _ = syms["w_router_wq"]
    assert codes == np.asarray(q.router.data, np.int8).tobytes()
    assert syms["w_router_scale"][0] == np.asarray(q.router.scale, "<f4").tobytes()
    assert layer.router_b is not None
    assert syms["w_router_b"][0] == layer.router_b.astype("<f4").tobytes()


def test_blob_is_deterministic_and_independent_of_the_directory(tmp_path: Path) -> None:
    layer = make_toy(4, 16, 32, 2, "relu", seed=9)
    opts = GenerateOptions(name="d", quant="int4")
    a, _ = generate(layer, tmp_path / "a", opts)
    b, _ = generate(layer, tmp_path / "elsewhere" / "b", opts)
    for f in ("colibri_weights.bin", "colibri_weights.c", "colibri_weights.h"):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    assert str(tmp_path) not in (a / "colibri_weights.c").read_text()


@pytest.mark.parametrize("section", [None, ".colibri_arena"])
def test_arena_section_follows_colibri_arena_section(section: str | None, tmp_path: Path) -> None:
    """COLIBRI_ARENA_SECTION (the Zephyr / ESP-IDF Kconfig option) moves the static arena."""
    require_board("cortex-m4", run=False)
    layer = make_toy(4, 16, 32, 2, "relu", seed=3)
    gen, _ = generate(layer, tmp_path / "s", GenerateOptions(board="cortex-m4", name="s"))
    board = load_board("cortex-m4")
    obj = tmp_path / "model.o"
    cmd = [board.compiler, *board.compile_flags(), "-I", str(ROOT / "runtime_c" / "include")]
    cmd += ["-I", str(ROOT / "runtime_c" / "tiles")]
    if section is not None:
        cmd.append(f'-DCOLIBRI_ARENA_SECTION="{section}"')
    cmd += ["-I", str(gen), "-c", str(gen / "colibri_model.c"), "-o", str(obj)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    with open(obj, "rb") as f:
        elf = ELFFile(f)
        symtab = elf.get_section_by_name(".symtab")
        (arena,) = [s for s in symtab.iter_symbols() if s.name == "s_arena"]  # type: ignore[union-attr]
        name = elf.get_section(arena["st_shndx"]).name
    assert name == (section or ".bss.s_arena"), name
