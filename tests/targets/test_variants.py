"""ISA variants of a board (``variant_of`` in the board file, e.g. cortex-a76 = cortex-a53 plus
the dot-product extension): the test matrix runs on the base board only, so a variant gets a
small footprint of its own. Its kernel self-test is test_platforms.py's
test_isa_dot_products_are_exact; here, a quantised MoE layer with int4, fp16 and int8 experts
(int8 activations) runs on the variant and on its base board, and the outputs are identical bit
for bit (the variant's kernels change integer paths only, every float operation keeps its order)
and match the quantised numpy reference under the schemes' tolerance."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from colibri.boards import list_boards
from colibri.cli.main import run_model
from colibri.cli.pipeline import generate
from colibri.frontends.seed import make_toy
from colibri.options import GenerateOptions
from colibri.quant.formats import LAYER_TOLERANCE, make_plan, quantize_layer
from colibri.reference.kernels import quant_moe_forward
from colibri.reference.moe import compare
from conftest import require_board

VARIANTS = [(b.name, b.variant_of) for b in list_boards() if b.variant_of]
#: Expert 0 int4, 1 fp16, 2 int8, 3 int4; d_model 72 so the last int4 / int8 block is partial.
EXPERT_QUANT = "1=fp16,2=int8"


@pytest.mark.parametrize(("board", "base"), VARIANTS)
def test_variant_forward_equals_its_base_board(board: str, base: str, tmp_path: Path) -> None:
    require_board(board)
    require_board(base)
    layer = make_toy(4, 72, 40, 2, "silu", seed=13, router_bias=True)
    x = np.random.default_rng(3).standard_normal((9, 72)).astype(np.float32)
    outs = {}
    for name in (board, base):
        opts = GenerateOptions(
            board=name, name="v", max_tokens=16, quant="int4", expert_quant=EXPERT_QUANT
        )
        generate(layer, tmp_path / name, opts)
        outs[name], _ = run_model(tmp_path / name, name, x)
    got, want = outs[board], outs[base]
    np.testing.assert_array_equal(got.expert_ids, want.expert_ids)
    assert np.array_equal(got.output.view(np.uint32), want.output.view(np.uint32)), (
        f"{board} vs {base}: max |diff| {np.abs(got.output - want.output).max():.3g}"
    )
    plan = make_plan(4, "int4", EXPERT_QUANT, None)
    assert plan.schemes == ["int4", "fp16", "int8", "int4"]
    ref, rq = quant_moe_forward(layer, quantize_layer(layer, plan), x)
    np.testing.assert_array_equal(got.expert_ids, rq.expert_ids)
    tol = max(LAYER_TOLERANCE[(s, a)] for s, a in zip(plan.schemes, plan.acts))
    err = compare(got.output, ref, tol)
    assert err is None, f"{board}: {err}"


@pytest.mark.parametrize(("board", "base"), VARIANTS)
def test_variant_runs_a_model_file_like_its_base(board: str, base: str, tmp_path: Path) -> None:
    """End to end: a whole tiny Mixtral in the container (int4 routed experts, fp16 dense
    matrices) run by the variant's prebuilt model-file runner gives its base board's logits and
    greedy tokens bit for bit."""
    from colibri.cli.pipeline import quantise_transformer
    from colibri.emit.lmfile import write_lm_container
    from colibri.frontends.hf_model import load_hf_transformer
    from colibri.targets.lmrun import run_lm_file
    from hf_tiny import lm_options, make_model, require_torch, save_model

    require_torch()
    require_board(board)
    require_board(base)
    ours = load_hf_transformer(save_model(make_model("mixtral", seed=70), tmp_path / "ckpt"))
    q, _ = quantise_transformer(ours, lm_options("host", "lm", 32, quant="int4", dense="fp16"))
    clb = write_lm_container(ours, q, tmp_path / "m.clb", 32)
    prompt = [3, 17, 5, 60, 9, 41]
    got, _ = run_lm_file(clb, board, prompt, 8, want_logits=True)
    want, _ = run_lm_file(clb, base, prompt, 8, want_logits=True)
    assert got.logits is not None and want.logits is not None
    assert np.array_equal(got.logits.view(np.uint32), want.logits.view(np.uint32)), (
        f"{board} vs {base}: max |logit diff| {np.abs(got.logits - want.logits).max():.3g}"
    )
    assert got.tokens.tolist() == want.tokens.tolist()
