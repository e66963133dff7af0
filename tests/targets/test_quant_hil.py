"""Quantised models on every board: fp16 / int8 / int4 (and int8 / int4 with fp32 activations)
on one small model (d_model 40, so the
last int4 block is partial), compared with the quantised numpy reference under the scheme's
named tolerance; routing identical to fp32; heat-based placement (RAM-pinned hot experts,
speed/compact kernel variants) bit-identical to the plain build and placed where it says."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from colibri.boards import matrix_boards
from colibri.cli.main import run_model
from colibri.cli.pipeline import generate
from colibri.frontends.seed import make_toy
from colibri.options import GenerateOptions
from colibri.quant.formats import LAYER_TOLERANCE, make_plan, quantize_layer
from colibri.reference.kernels import quant_moe_forward
from colibri.reference.moe import compare, moe_forward
from conftest import require_board

BOARDS = [b.name for b in matrix_boards()]  # ISA variants: tests/targets/test_variants.py
SCHEMES = ("fp16", "int8", "int4")


def _model():  # type: ignore[no-untyped-def]
    layer = make_toy(4, 40, 36, 2, "gelu", seed=21, router_bias=True)
    x = np.random.default_rng(5).standard_normal((10, 40)).astype(np.float32)
    return layer, x


@pytest.mark.parametrize(
    "scheme,act", [(s, None) for s in SCHEMES] + [("int8", "fp32"), ("int4", "fp32")]
)
@pytest.mark.parametrize("board", BOARDS)
def test_scheme_on_board_matches_reference(
    board: str, scheme: str, act: str | None, tmp_path: Path
) -> None:
    require_board(board)
    layer, x = _model()
    opts = GenerateOptions(board=board, name="q", quant=scheme, act=act)
    generate(layer, tmp_path / "q", opts)
    out, _ = run_model(tmp_path / "q", board, x)
    plan = make_plan(4, scheme, None, act)
    ref, rq = quant_moe_forward(layer, quantize_layer(layer, plan), x)
    np.testing.assert_array_equal(out.expert_ids, rq.expert_ids, err_msg=f"{board}/{scheme}")
    np.testing.assert_array_equal(out.expert_ids, moe_forward(layer, x)[1].expert_ids)
    err = compare(out.output, ref, LAYER_TOLERANCE[(scheme, plan.acts[0])])
    assert err is None, f"{board}/{scheme}: {err}"


def _int8_layout(board: str, n_out: int, n_in: int) -> str:
    """The layout the emitter picks for an int8 x int8 matrix [n_out, n_in] (n_out >= 4) on
    `board`: the M4 / M7 r4p (padded to blocks of 32) but r4 for n_in <= 16; the M55 r4
    (padded to chunks of 16); the host rows."""
    if board == "host":
        return "rows"
    return "r4p" if board in ("cortex-m4", "cortex-m7") and n_in > 16 else "r4"


@pytest.mark.parametrize("dims", [(32, 48), (64, 98), (64, 288)])
@pytest.mark.parametrize("activation", ["relu", "swiglu"])  # exact on every board (no libm)
@pytest.mark.parametrize("board", ["cortex-m4", "cortex-m7", "cortex-m55"])
def test_r4_experts_equal_the_host_bit_for_bit(
    board: str, activation: str, dims: tuple[int, int], tmp_path: Path
) -> None:
    """int8 experts are stored four rows interleaved on the DSP / Helium cores (layout r4 on
    the M55, r4p on the M4 / M7), their rows padded with zero codes to whole chunks of 16 (r4)
    or blocks of 32 (r4p) and read by colibri_qinline.h's kernels: the manifest records the
    layouts, the outputs equal the host's (row-major weights, one row at a time) bit for bit,
    and both match the quantised reference. d_model 32 / d_ff 48: w1 r4p, w2 r4p with its 48
    inputs padded to 64 on the M4 / M7; 64 / 98: w1 r4p with a tail of 2 rows, w2's 98 inputs
    padded (r4p: to 128, r4: to 112) and its hidden rows with zero codes; 64 / 288: w2 r4p
    over two chunks of inputs (COLIBRI_QI_R4P_CHUNK)."""
    require_board(board)
    require_board("host")
    d_model, d_ff = dims
    layer = make_toy(4, d_model, d_ff, 2, activation, seed=8, router_bias=True)
    x = np.random.default_rng(3).standard_normal((19, d_model)).astype(np.float32)
    outs = {}
    for b in ("host", board):
        opts = GenerateOptions(board=b, name="r", max_tokens=8, quant="int8")
        gen, manifest = generate(layer, tmp_path / b, opts)
        up = _int8_layout(b, d_ff, d_model)
        down = _int8_layout(b, d_model, d_ff)
        assert manifest["weight_layouts"] == {"r_ffn_int8_int8": {"w1": up, "w3": up, "w2": down}}
        outs[b], _ = run_model(gen, b, x)
    np.testing.assert_array_equal(outs[board].expert_ids, outs["host"].expert_ids)
    np.testing.assert_array_equal(outs[board].output, outs["host"].output)
    plan = make_plan(4, "int8", None, None)
    ref, _ = quant_moe_forward(layer, quantize_layer(layer, plan), x)
    assert compare(outs[board].output, ref, LAYER_TOLERANCE[("int8", "int8")]) is None


@pytest.mark.parametrize("dims", [(40, 50), (64, 38)])
@pytest.mark.parametrize("activation", ["relu", "swiglu"])  # exact on every board (no libm)
@pytest.mark.parametrize("board", ["cortex-m4", "cortex-m7", "cortex-m55"])
def test_int4_experts_equal_the_host_bit_for_bit(
    board: str, activation: str, dims: tuple[int, int], tmp_path: Path
) -> None:
    """int4 experts (int8 activations) on the DSP / Helium cores run colibri_qinline_q4.h's
    four-rows-per-pass kernels: the outputs equal the host's (the library, one row at a time,
    plain blocks) bit for bit, and both match the quantised reference. d_model 40 / d_ff 50:
    partial last blocks and a tail of rows after the groups of four; d_model 64 / d_ff 38:
    w1 and w3 (whole blocks) with a tail of 2 rows, w2 with a partial block. On the M4 / M7
    every matrix is in layout q4r4, on the M55 in layout q4h4 (a partial last block read whole:
    its weights are zero beyond n_in and the activation row is padded with zero codes; the
    manifest records the layouts)."""
    require_board(board)
    require_board("host")
    d_model, d_ff = dims
    layer = make_toy(4, d_model, d_ff, 2, activation, seed=9, router_bias=True)
    x = np.random.default_rng(4).standard_normal((19, d_model)).astype(np.float32)
    outs = {}
    for b in ("host", board):
        opts = GenerateOptions(board=b, name="r", max_tokens=8, quant="int4")
        gen, manifest = generate(layer, tmp_path / b, opts)
        lay = {"cortex-m4": "q4r4", "cortex-m7": "q4r4", "cortex-m55": "q4h4"}.get(b, "rows")
        assert manifest["weight_layouts"] == {"r_ffn_int4_int8": {"w1": lay, "w3": lay, "w2": lay}}
        outs[b], _ = run_model(gen, b, x)
    np.testing.assert_array_equal(outs[board].expert_ids, outs["host"].expert_ids)
    np.testing.assert_array_equal(outs[board].output, outs["host"].output)
    plan = make_plan(4, "int4", None, None)
    ref, _ = quant_moe_forward(layer, quantize_layer(layer, plan), x)
    assert compare(outs[board].output, ref, LAYER_TOLERANCE[("int4", "int8")]) is None


@pytest.mark.parametrize("board", ["host", "cortex-m4"])
def test_heat_placement_is_bit_identical_and_pins_hot_experts(board: str, tmp_path: Path) -> None:
    require_board(board)
    layer = make_toy(8, 32, 48, 2, "silu", seed=4)
    # calibration tokens that favour expert 0's router row
    rng = np.random.default_rng(1)
    calib = (rng.standard_normal((64, 32)) + 3 * layer.router_w[0]).astype(np.float32)
    x = rng.standard_normal((12, 32)).astype(np.float32)
    outputs = []
    for tag, kw in (("plain", {}), ("hot", {"ram_budget": 8000})):
        opts = GenerateOptions(board=board, name=tag, quant="int8", **kw)  # type: ignore[arg-type]
        # the same calibration for both: it also chooses the int8 scales (issue 15), so only
        # the placement differs between the two builds
        _, man = generate(layer, tmp_path / tag, opts, calib=calib)
        out, _ = run_model(tmp_path / tag, board, x)
        outputs.append(out.output)
    assert np.array_equal(outputs[0], outputs[1]), "placement changed the numbers"
    experts = man["experts"]
    heat = [e["calib_hits"] for e in experts]
    assert sum(heat) == 64 * 2
    ram = [e["expert"] for e in experts if e["placement"] == "ram"]
    assert ram and sum(experts[i]["bytes"] for i in ram) <= 8000
    coldest_ram = min(heat[i] for i in ram)
    assert all(heat[e["expert"]] <= coldest_ram for e in experts if e["placement"] == "flash")
    assert {e["kernel"] for e in experts} <= {"speed", "compact"}
    assert man["layout"]["order"] == sorted(range(8), key=lambda i: (-heat[i], i))
    if board != "host":
        from colibri.targets.size import size_report

        rep = size_report(tmp_path / "hot", board)
        data = next(s for s in rep.sections if s["name"] == ".data")
        assert data["ram"] and data["size"] >= sum(experts[i]["bytes"] for i in ram)
        # per-expert bytes of the report are the ELF's symbol sizes
        assert {i: v["weights"] for i, v in rep.experts.items()} == {
            e["expert"]: e["bytes"] for e in experts
        }


def test_ram_budget_larger_than_the_board_is_refused(tmp_path: Path) -> None:
    from colibri.errors import BudgetExceeded

    layer = make_toy(8, 64, 128, 2, "gelu", seed=2)  # 8 x 66 KB of fp32 experts
    calib = np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32)
    opts = GenerateOptions(board="cortex-m4", name="r", ram_budget=10**6)
    with pytest.raises(BudgetExceeded, match=r"pinned in RAM .* lower --ram-budget to at most"):
        generate(layer, tmp_path / "r", opts, calib=calib)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("activation", ["relu", "swiglu"])
@pytest.mark.parametrize("board", ["cortex-m4", "cortex-m7", "cortex-m55"])
def test_fp16_experts_in_layout_c8_match_reference(
    board: str, activation: str, tmp_path: Path
) -> None:
    """fp16 experts whose shapes allow layout c8 (d_model 32, d_ff 48: whole blocks of 8
    outputs) are stored in it on the Cortex-M4 / M7 and run by colibri_qf_f16_c8 (VCVTB /
    VCVTT conversion, fused multiply-adds); Helium keeps the rows. The manifest records the
    layouts, the expert choices are the reference's, the outputs within the fp16 tolerance."""
    require_board(board)
    layer = make_toy(4, 32, 48, 2, activation, seed=12, router_bias=True)
    x = np.random.default_rng(6).standard_normal((11, 32)).astype(np.float32)
    opts = GenerateOptions(board=board, name="h", max_tokens=8, quant="fp16")
    gen, manifest = generate(layer, tmp_path / "h", opts)
    plan = make_plan(4, "fp16", None, None)
    layout = "c8" if board in ("cortex-m4", "cortex-m7") else "rows"
    assert manifest["weight_layouts"] == {
        f"h_ffn_fp16_{plan.acts[0]}": {"w1": layout, "w3": layout, "w2": layout}
    }
    out, _ = run_model(gen, board, x)
    ref, rq = quant_moe_forward(layer, quantize_layer(layer, plan), x)
    np.testing.assert_array_equal(out.expert_ids, rq.expert_ids)
    err = compare(out.output, ref, LAYER_TOLERANCE[("fp16", plan.acts[0])])
    assert err is None, f"{board}/fp16 c8: {err}"
