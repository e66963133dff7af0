"""External PSRAM as a placement tier (esp32s3): with calibration, the hottest experts that fit
--ram-budget are pinned in internal SRAM, the next ones that fit --psram-budget go to
.colibri_psram (PSRAM in the board's linker script), the rest (and experts no calibration token
chose) stay in flash. The model is shaped like the seeds' ESP32-S3 firmware (4 experts, top-1,
d_model 128). Checked: the plan, where each expert's arrays land in the linked ELF, the size
report's PSRAM line, outputs under QEMU equal to the numpy reference, the fallback to flash
for builds without Colibri's linker script (no COLIBRI_LINK_PSRAM), and the errors for a board
without PSRAM or a budget beyond it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from colibri.boards import load_board
from colibri.cli.main import run_model
from colibri.cli.pipeline import generate
from colibri.errors import ConfigError
from colibri.frontends.seed import make_toy
from colibri.ir.moe import MoELayer
from colibri.options import GenerateOptions
from colibri.quant.formats import LAYER_TOLERANCE, make_plan
from colibri.quant.model import quantize_moe_layer
from colibri.reference.calibration import layer_calibration
from colibri.reference.kernels import quant_moe_forward
from colibri.reference.moe import compare
from colibri.targets.size import analyse
from conftest import ROOT, require_board
from elftools.elf.elffile import ELFFile


def _model() -> tuple[MoELayer, np.ndarray]:
    layer = make_toy(4, 128, 192, 1, "relu", seed=21)
    calib = np.random.default_rng(5).standard_normal((96, 128)).astype(np.float32)
    return layer, calib


def _opts(board: str, **kw: object) -> GenerateOptions:
    return GenerateOptions(board=board, name="ps", quant="int8", calib="calib", **kw)  # type: ignore[arg-type]


def _expert_bytes(manifest: dict) -> dict[int, int]:
    return {e["expert"]: e["bytes"] for e in manifest["experts"]}


def test_psram_tier_is_planned_after_sram(tmp_path: Path) -> None:
    layer, calib = _model()
    _, manifest = generate(layer, tmp_path / "a", _opts("esp32s3", ram_budget=1), calib=calib)
    sizes = _expert_bytes(manifest)
    one = max(sizes.values())
    _, manifest = generate(layer, tmp_path / "b", _opts("esp32s3", ram_budget=one), calib=calib)
    hits = {e["expert"]: e["calib_hits"] for e in manifest["experts"]}
    where = {e["expert"]: e["placement"] for e in manifest["experts"]}
    assert sorted(where.values()).count("ram") == 1
    hot = max(hits, key=lambda i: (hits[i], -i))
    assert where[hot] == "ram"
    for i, w in where.items():
        if i != hot:
            assert w == ("psram" if hits[i] > 0 else "flash"), (i, hits[i], w)
    assert "psram" in where.values()
    in_psram = sum(sizes[i] for i, w in where.items() if w == "psram")
    assert manifest["layout"]["psram_bytes"] == in_psram
    # a budget holding one expert: only the hottest of the rest goes to PSRAM
    _, small = generate(
        layer,
        tmp_path / "c",
        _opts("esp32s3", ram_budget=one, psram_budget=one),
        calib=calib,
    )
    assert [e["placement"] for e in small["experts"]].count("psram") == 1
    # without calibration nothing moves
    _, plain = generate(layer, tmp_path / "d", GenerateOptions(board="esp32s3", name="ps"))
    assert all(e["placement"] == "flash" for e in plain.get("experts", []))
    assert "psram_bytes" not in plain.get("layout", {})
    assert ".colibri_psram" not in (tmp_path / "d" / "colibri_weights.c").read_text()


def test_psram_budget_errors(tmp_path: Path) -> None:
    layer, calib = _model()
    with pytest.raises(ConfigError, match=r"cortex-m4 has no external PSRAM.*drop the option"):
        generate(layer, tmp_path / "m4", _opts("cortex-m4", psram_budget=4096), calib=calib)
    psram = load_board("esp32s3").memory["psram"].size
    with pytest.raises(ConfigError, match=rf"exceeds board esp32s3's PSRAM \({psram} bytes\)"):
        generate(layer, tmp_path / "s3", _opts("esp32s3", psram_budget=psram + 1), calib=calib)
    assert not (tmp_path / "m4").exists() and not (tmp_path / "s3").exists()


def _sections(obj: Path) -> dict[str, tuple[str, int]]:
    """Data symbols of an object or ELF: (section name, address)."""
    out = {}
    with open(obj, "rb") as f:
        elf = ELFFile(f)
        symtab = elf.get_section_by_name(".symtab")
        for s in symtab.iter_symbols():  # type: ignore[union-attr]
            if s["st_info"]["type"] == "STT_OBJECT" and isinstance(s["st_shndx"], int):
                out[s.name] = (elf.get_section(s["st_shndx"]).name, int(s["st_value"]))
    return out


def test_psram_experts_fall_back_to_flash_without_the_linker_script(tmp_path: Path) -> None:
    """ESP-IDF / Zephyr builds compile the generated weights without COLIBRI_LINK_PSRAM: the
    experts placed in PSRAM stay in .rodata (flash) there."""
    layer, calib = _model()
    gen, manifest = generate(layer, tmp_path / "g", _opts("esp32s3", ram_budget=1), calib=calib)
    where = {e["expert"]: e["placement"] for e in manifest["experts"]}
    host = load_board("host")
    obj = tmp_path / "w.o"
    cmd = [host.compiler, *host.compile_flags(), "-I", str(ROOT / "runtime_c" / "include")]
    subprocess.run(
        [
            *cmd,
            "-I",
            str(gen),
            f"-Wa,-I{gen}",
            "-c",
            str(gen / "colibri_weights.c"),
            "-o",
            str(obj),
        ],
        check=True,
    )
    syms = _sections(obj)
    for i, w in where.items():
        if w == "psram":
            assert syms[f"ps_e{i}_w1"][0] == f".rodata.ps_e{i}_w1"


def test_psram_experts_run_from_psram_on_esp32s3(tmp_path: Path) -> None:
    require_board("esp32s3")
    layer, calib = _model()
    _, first = generate(layer, tmp_path / "probe", _opts("esp32s3", ram_budget=1), calib=calib)
    one = max(_expert_bytes(first).values())
    gen, manifest = generate(layer, tmp_path / "g", _opts("esp32s3", ram_budget=one), calib=calib)
    x = np.random.default_rng(8).standard_normal((12, 128)).astype(np.float32)
    out, result = run_model(gen, "esp32s3", x)
    assert result.returncode == 0, result.stdout + result.stderr

    stats = layer_calibration(layer, calib)
    q = quantize_moe_layer(layer, "int8", calib=stats)
    ref, rq = quant_moe_forward(layer, q.experts, x)
    np.testing.assert_array_equal(out.expert_ids, rq.expert_ids)
    plan = make_plan(4, "int8", None, None)
    tol = max(LAYER_TOLERANCE[(s, a)] for s, a in zip(plan.schemes, plan.acts, strict=True))
    assert compare(out.output, ref, tol) is None

    board = load_board("esp32s3")
    elf = next(p for p in (gen / "build" / "esp32s3").rglob("*.elf"))
    syms = _sections(elf)
    regions = board.memory
    where = {e["expert"]: e["placement"] for e in manifest["experts"]}
    for i, w in where.items():
        sec, addr = syms[f"ps_e{i}_w1"]
        region = {"ram": "ram", "psram": "psram", "flash": "flash"}[w]
        r = regions[region]
        assert r.origin <= addr < r.end, (i, w, sec, hex(addr))
    rep = analyse(elf, board)
    in_psram = manifest["layout"]["psram_bytes"]
    assert in_psram <= rep.psram_used < in_psram + 16 * 3 * 4  # per-array 16-byte alignment
    assert rep.as_dict()["psram_size"] == regions["psram"].size
