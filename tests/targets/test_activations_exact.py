"""GELU, SiLU and SwiGLU layers bit-exact with the numpy mirror: colibri_gelu / colibri_gelu_tanh /
colibri_silu (colibri_math.h) use no libm, and colibri.reference.f32 repeats them op for op, so a
generated MoE layer with any of them and integer experts (int8 weights with int8 activations,
int4) gives the output of colibri.reference.kernels.quant_moe_forward bit for bit on the host,
the Cortex-M4 (scalar rows) and the Cortex-M55 (Helium rows: colibri_math.h's row functions;
before, libm's erff / tanhf against float64 needed LAYER_TOLERANCE). fp32 experts keep the
float64 reference (colibri.reference.moe.activation) within FP32_TOLERANCE."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from colibri.cli.main import run_model
from colibri.cli.pipeline import generate
from colibri.frontends.seed import make_toy
from colibri.ir.moe import MoELayer
from colibri.options import GenerateOptions
from colibri.quant.formats import make_plan, quantize_layer
from colibri.reference.kernels import quant_moe_forward
from colibri.reference.moe import FP32_TOLERANCE, compare, moe_forward
from conftest import require_board

BOARDS = ["host", "cortex-m4", "cortex-m55"]
ACTIVATIONS = ["gelu", "gelu_tanh", "silu", "swiglu"]
#: d_model 72, d_ff 40: the last int4 / int8 block of a row is partial.
D_MODEL, D_FF, EXPERTS, TOP_K = 72, 40, 4, 2


def _layer_and_input(act: str) -> tuple[MoELayer, np.ndarray]:
    layer = make_toy(EXPERTS, D_MODEL, D_FF, TOP_K, act, seed=21, router_bias=True)
    # x 3 times the unit scale: hidden values over about [-10, 10], both GELU tails
    x = (3.0 * np.random.default_rng(5).standard_normal((11, D_MODEL))).astype(np.float32)
    return layer, x


@pytest.mark.parametrize("quant", ["int8", "int4"])
@pytest.mark.parametrize("act", ACTIVATIONS)
@pytest.mark.parametrize("board", BOARDS)
def test_gelu_layer_equals_the_mirror(board: str, act: str, quant: str, tmp_path: Path) -> None:
    require_board(board)
    layer, x = _layer_and_input(act)
    opts = GenerateOptions(board=board, name="g", max_tokens=16, quant=quant)
    generate(layer, tmp_path / "gen", opts)
    out, _ = run_model(tmp_path / "gen", board, x)
    plan = make_plan(EXPERTS, quant, None, None)
    assert plan.acts == ["int8"] * EXPERTS
    ref, rq = quant_moe_forward(layer, quantize_layer(layer, plan), x)
    np.testing.assert_array_equal(out.expert_ids, rq.expert_ids)
    want = ref.astype(np.float32)
    differ = out.output.view(np.uint32) != want.view(np.uint32)
    assert not differ.any(), (
        f"{board} {act} {quant}: {int(differ.sum())} of {want.size} outputs differ, "
        f"max |diff| {np.abs(out.output - want).max():.3g}"
    )


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh"])
def test_fp32_gelu_layer_within_tolerance(act: str, tmp_path: Path) -> None:
    """fp32 experts: the float64 reference, within FP32_TOLERANCE."""
    require_board("host")
    layer, x = _layer_and_input(act)
    generate(layer, tmp_path / "gen", GenerateOptions(board="host", name="g", max_tokens=16))
    out, _ = run_model(tmp_path / "gen", "host", x)
    ref, r = moe_forward(layer, x)
    np.testing.assert_array_equal(out.expert_ids, r.expert_ids)
    assert compare(out.output, ref, FP32_TOLERANCE) is None
