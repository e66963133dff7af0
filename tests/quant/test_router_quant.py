"""The router stays fp32 unless asked: `--router-quant fp16|int8` stores it quantised, the C
router dequantises each weight to fp32 before the same sequential accumulation, and the numpy
mirror (reference on the dequantised weights) picks the same experts bit for bit; the accuracy
report shows the routing agreement with the fp32 router."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from colibri.cli.main import run_model
from colibri.cli.pipeline import generate
from colibri.frontends.seed import make_toy
from colibri.options import GenerateOptions
from colibri.quant.formats import quantize_router
from colibri.reference.accuracy import routing_agreement
from colibri.reference.moe import compare, moe_forward
from conftest import require_board


@pytest.mark.parametrize("scheme", ["fp16", "int8"])
@pytest.mark.parametrize("board", ["host", "cortex-m4", "xtensa-lx106"])
def test_quantised_router_matches_its_mirror(board: str, scheme: str, tmp_path: Path) -> None:
    require_board(board)
    layer = make_toy(16, 24, 32, 2, "silu", seed=4, router_bias=True)
    x = np.random.default_rng(9).standard_normal((200, 24)).astype(np.float32)
    np.save(tmp_path / "calib.npy", x)
    q = quantize_router(layer.router_w, scheme)
    mirror, r = moe_forward(replace(layer, router_w=q.dequantized()), x)
    _, r_fp32 = moe_forward(layer, x)
    opts = GenerateOptions(
        board=board, name="rq", router_quant=scheme, calib=str(tmp_path / "calib.npy")
    )
    _, man = generate(layer, tmp_path / "rq", opts)
    out, _ = run_model(tmp_path / "rq", board, x)
    np.testing.assert_array_equal(out.expert_ids, r.expert_ids)
    assert compare(out.output, mirror) is None
    assert man["quantization"]["router"] == scheme
    fp32_router = 4 * 16 * 24
    assert man["quantization"]["bytes_saved"] == fp32_router - q.nbytes
    agreement = man["accuracy"]["layers"][0]["routing_agreement"]
    assert agreement == pytest.approx(routing_agreement(r.expert_ids, r_fp32.expert_ids))
    if scheme == "int8":
        assert agreement < 1.0  # int8 flips some routing on this model, and the report says so


def test_router_quant_rejects_unknown_scheme() -> None:
    from colibri.errors import ConfigError

    with pytest.raises(ConfigError, match="--router-quant: unknown scheme 'int4'"):
        quantize_router(np.zeros((2, 3), np.float32), "int4")
