"""A lone MoE layer with a shared expert (Qwen2-MoE style: run on every token, scaled by
sigmoid(x . g)) in generated C: the same fp32 expert kernel as the routed experts
(templates/common/experts.j2), its own d_ff, run by colibri_sparse_forward after each chunk's
routed experts (colibri_model_t.shared_expert), compared with the numpy reference."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from colibri.cli.main import run_model
from colibri.cli.pipeline import generate
from colibri.frontends.seed import make_toy
from colibri.ir.moe import Expert, MoELayer
from colibri.options import GenerateOptions
from colibri.quant.formats import LAYER_TOLERANCE, make_plan, quantize_layer
from colibri.reference.kernels import quant_moe_forward
from colibri.reference.moe import compare, moe_forward
from conftest import require_board


def _layer(activation: str, shared_d_ff: int, gate: bool, seed: int = 3) -> MoELayer:
    layer = make_toy(4, 32, 24, 2, activation, seed=seed)
    rng = np.random.default_rng(seed + 100)
    d = layer.config.d_model

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(rows)).astype(np.float32)

    gated = layer.config.gated
    shared = Expert(
        w1=mat(d, shared_d_ff),
        w2=mat(shared_d_ff, d),
        w3=mat(d, shared_d_ff) if gated else None,
    )
    g = (rng.standard_normal(d) / np.sqrt(d)).astype(np.float32) if gate else None
    return replace(layer, shared_expert=shared, shared_gate=g)


def _x(n: int = 11) -> np.ndarray:
    return np.random.default_rng(7).standard_normal((n, 32)).astype(np.float32)


@pytest.mark.parametrize(
    "activation,shared_d_ff,gate,max_tokens",
    [
        ("swiglu", 56, True, 4),  # wider than the routed experts: more kernel scratch
        ("swiglu", 16, True, 32),
        ("gelu", 40, False, 3),  # no gate: scale 1
    ],
)
def test_fp32_shared_expert_matches_reference(
    tmp_path: Path, activation: str, shared_d_ff: int, gate: bool, max_tokens: int
) -> None:
    require_board("host")
    layer = _layer(activation, shared_d_ff, gate)
    x = _x()
    opts = GenerateOptions(board="host", name="sh", max_tokens=max_tokens)
    gen, manifest = generate(layer, tmp_path / "sh", opts)
    assert "sh_shared" in (gen / "colibri_model.c").read_text()
    out, _ = run_model(gen, "host", x)
    ref, r = moe_forward(layer, x)
    np.testing.assert_array_equal(out.expert_ids, r.expert_ids)
    assert compare(out.output, ref) is None
    # the shared expert matters: without it the output is off
    assert compare(out.output, moe_forward(replace(layer, shared_expert=None), x)[0]) is not None


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_quantised_routed_experts_with_fp32_shared_expert(tmp_path: Path, scheme: str) -> None:
    """Routed experts quantised (int8 activations in the kernels' scratch), the shared expert
    fp32 and wider: both needs share kernel_scratch_bytes."""
    require_board("host")
    layer = _layer("swiglu", 64, True, seed=5)
    x = _x(9)
    opts = GenerateOptions(board="host", name="sq", max_tokens=2, quant=scheme)
    gen, _ = generate(layer, tmp_path / "sq", opts)
    out, _ = run_model(gen, "host", x)
    plan = make_plan(4, scheme, None, None)
    ref, rq = quant_moe_forward(layer, quantize_layer(layer, plan), x)
    np.testing.assert_array_equal(out.expert_ids, rq.expert_ids)
    assert compare(out.output, ref, LAYER_TOLERANCE[(scheme, plan.acts[0])]) is None


def test_shared_expert_on_cortex_m4(tmp_path: Path) -> None:
    """On the M4 the shared expert's weights are stored in layout c8 (fused multiply-adds)."""
    require_board("cortex-m4")
    layer = _layer("swiglu", 48, True)
    x = _x(5)
    gen, manifest = generate(layer, tmp_path / "m4", GenerateOptions(board="cortex-m4", name="m4"))
    assert (
        "colibri_qf_f32_c8(w1, b1, xt, h, 48, M4_D_MODEL)" in (gen / "colibri_model.c").read_text()
    )
    out, _ = run_model(gen, "cortex-m4", x)
    ref, _ = moe_forward(layer, x)
    assert compare(out.output, ref) is None
