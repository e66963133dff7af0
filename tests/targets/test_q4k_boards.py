"""q4k and q5k experts (formats.py's q4k section, colibri_matvec_q4k_q8 / _q5k_q8 and the
matmuls of kernels_q.c) generated, built with each board's -Wall -Wextra -Werror flags and run
(host, QEMU): outputs and routing equal colibri.reference.kernels.quant_moe_forward bit for
bit, on a small layer with partial blocks (d_model 72: a cut super-block with a partial
sub-block; an int4 expert beside the q4k / q5k ones) and on a SwiGLU layer of two super-blocks
with tails (d_model 260, d_ff 100: a sub-block of 4 inputs), run in groups of tokens (the
matmuls) and one at a time. A whole tiny Mixtral with q4k routed experts: its generated C gives
the mirror's logits (colibri.reference.transformer.forward with the same TransformerQuant) bit
for bit."""

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
from conftest import require_board

#: The boards of the brief (bare metal Cortex-M4 DSP, Cortex-M55 Helium, Xtensa ESP32-S3 and
#: the host), then the others of one case each.
BOARDS = ["host", "cortex-m4", "cortex-m55", "esp32s3"]
MORE_BOARDS = ["cortex-m3", "cortex-m7", "cortex-a53", "cortex-a7", "cortex-a76", "xtensa-lx106"]
EXPERT_QUANT = "1=int4"


def _layer(kind: str) -> tuple[MoELayer, np.ndarray]:
    if kind == "small":
        layer = make_toy(4, 72, 40, 2, "silu", seed=13, router_bias=True)
    else:
        layer = make_toy(4, 260, 100, 2, "swiglu", seed=5)
    x = np.random.default_rng(3).standard_normal((9, layer.config.d_model)).astype(np.float32)
    return layer, x


def _check(board: str, kind: str, max_tokens: int, tmp_path: Path, scheme: str = "q4k") -> None:
    require_board(board)
    layer, x = _layer(kind)
    opts = GenerateOptions(
        board=board, name="k", max_tokens=max_tokens, quant=scheme, expert_quant=EXPERT_QUANT
    )
    generate(layer, tmp_path / "k", opts)
    got, _ = run_model(tmp_path / "k", board, x)
    plan = make_plan(4, scheme, EXPERT_QUANT, None)
    assert plan.schemes == [scheme, "int4", scheme, scheme] and plan.acts == ["int8"] * 4
    ref, rq = quant_moe_forward(layer, quantize_layer(layer, plan), x)
    np.testing.assert_array_equal(got.expert_ids, rq.expert_ids)
    want = ref.astype(np.float32)
    bad = got.output.view(np.uint32) != want.view(np.uint32)
    assert not bad.any(), (
        f"{board}/{kind}: {int(bad.sum())} of {bad.size} outputs differ from the mirror, max "
        f"|diff| {np.abs(got.output - want).max():.3g}"
    )


@pytest.mark.parametrize("scheme", ["q4k", "q5k"])
@pytest.mark.parametrize("kind,max_tokens", [("small", 16), ("swiglu", 1)])
@pytest.mark.parametrize("board", BOARDS)
def test_q4k_layer_bit_exact_with_the_mirror(
    board: str, kind: str, max_tokens: int, scheme: str, tmp_path: Path
) -> None:
    _check(board, kind, max_tokens, tmp_path, scheme)


@pytest.mark.parametrize("board", MORE_BOARDS)
def test_q4k_layer_on_more_boards(board: str, tmp_path: Path) -> None:
    _check(board, "small", 16, tmp_path)


@pytest.mark.parametrize("board", BOARDS)
def test_q4k_transformer_bit_exact_with_the_mirror(board: str, tmp_path: Path) -> None:
    from colibri.cli.pipeline import quantise_transformer
    from colibri.frontends.hf_model import load_hf_transformer
    from colibri.reference.transformer import KVCache, forward
    from colibri.targets.lmrun import run_lm
    from hf_tiny import generate_lm, lm_options, make_model, require_torch, save_model

    require_torch()
    require_board(board)
    ours = load_hf_transformer(save_model(make_model("mixtral", seed=70), tmp_path / "ckpt"))
    q, _ = quantise_transformer(ours, lm_options(board, "lm", 32, quant="q4k"))
    gen, _ = generate_lm(ours, tmp_path / "gen", board, "lm", 32, quant="q4k")
    prompt = [3, 17, 5, 60, 9, 41]
    out, _ = run_lm(gen, board, prompt, 4, want_logits=True)
    assert out.logits is not None
    want = forward(ours, prompt, KVCache(), q).astype(np.float32)
    got = out.logits[: len(prompt)]
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (
        f"{board}: max |logit diff| {np.abs(got - want).max():.3g}"
    )


@pytest.mark.parametrize("cache", ["lru", "none"])
@pytest.mark.parametrize("board", ["host", "cortex-m4"])
def test_q4k_q5k_experts_through_the_expert_cache(board: str, cache: str, tmp_path: Path) -> None:
    """q4k experts with a q5k one, kept in flash and copied into 2 LRU slots on use (or read in
    place, none): the stored rows are copied as they are and the outputs stay the mirror's."""
    require_board(board)
    layer, x = _layer("small")
    opts = GenerateOptions(
        board=board, name="c", max_tokens=16, quant="q4k", expert_quant="2=q5k",
        cache=cache, cache_slots=2,
    )  # fmt: skip
    generate(layer, tmp_path / "c", opts)
    got, _ = run_model(tmp_path / "c", board, x)
    plan = make_plan(4, "q4k", "2=q5k", None)
    ref, rq = quant_moe_forward(layer, quantize_layer(layer, plan), x)
    np.testing.assert_array_equal(got.expert_ids, rq.expert_ids)
    want = ref.astype(np.float32)
    assert np.array_equal(got.output.view(np.uint32), want.view(np.uint32)), (
        f"{board}/{cache}: max |diff| {np.abs(got.output - want).max():.3g}"
    )
