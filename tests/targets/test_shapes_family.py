"""Every case of a seeded family of shapes generates, compiles and runs (issue 40): MoE layers
with d_model / d_ff drawn from 16..256 (odd values, multiples of 16 that are not multiples of
32, multiples of 32), top-1 and top-2 of 4..8 experts, relu / silu / gelu, every scheme, on the
Cortex-M boards. Each case is generated, built with the boards' -Werror flags and run under
QEMU; integer schemes (int8 / int4 weights, int8 activations) give
colibri.reference.kernels.quant_moe_forward bit for bit, fp16 / fp32 experts are within their
LAYER_TOLERANCE. The seed is in every case's id (``s40-...``): a failure names the shape to
regenerate.

Before the fix of issue 40, a Cortex-M55 int8 layer whose R4 matrices have one group of four
rows and one and a half blocks of inputs (d_model 48, d_ff 4 or 5: ISSUE_40_CASES) did not
compile: the Helium two-token block (colibri_qi_r4_block2) asked for 8 even core registers in
one asm statement while the low-overhead loop around it held LR.

Every int8 and int4 case on the M4 / M7 / M55 (int8 activations) records a fast layout (r4 /
r4p / q4r4 / q4h4), never "rows", in its manifest: inputs that are no whole number
of the layout's chunks are padded with zero columns inside it (TAIL_CASES adds such shapes,
the issue's 200 x 328 among them). Every fp32 case on the M4 / M7 / M55 and fp16 case on the
M4 / M7 records layout c8 at any shape (C8_TAIL_CASES: outputs after the last block of 8 and
inputs after the last pass of 4)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from colibri.boards import load_board
from colibri.cli.main import run_model
from colibri.cli.pipeline import generate
from colibri.frontends.seed import make_toy
from colibri.options import GenerateOptions
from colibri.quant.formats import LAYER_TOLERANCE, make_plan, quantize_layer
from colibri.reference.kernels import quant_moe_forward
from colibri.reference.moe import compare
from conftest import require_board

#: The family's seed (in every case id).
SEED = 40
#: Cases drawn per board: each board gets every scheme at least once.
CASES_PER_BOARD = {"cortex-m4": 6, "cortex-m55": 6, "cortex-m3": 4, "cortex-m7": 4}
SCHEMES = ("int8", "int4", "fp16", "fp32")
ACTIVATIONS = ("relu", "silu", "gelu")
#: Stored bytes per weight of each scheme (scales included, rounded up) for the flash check.
BYTES_PER_WEIGHT = {"fp32": 4.0, "fp16": 2.0, "int8": 1.2, "int4": 0.6}
#: Tokens per run and per generated group: 11 of up to 8 runs a pass of 8 (Cortex-M4 / M7), of
#: 4 and pairs (Helium) and single tokens.
TOKENS, MAX_TOKENS = 11, 8


@dataclass(frozen=True)
class Case:
    """One member of the family: a board, a layer shape and a scheme."""

    board: str
    d_model: int
    d_ff: int
    experts: int
    top_k: int
    act: str
    scheme: str

    @property
    def id(self) -> str:
        return (
            f"s{SEED}-{self.board}-{self.scheme}-{self.act}-{self.d_model}x{self.d_ff}"
            f"-e{self.experts}k{self.top_k}"
        )


def _dim(rng: np.random.Generator, kind: int) -> int:
    """A dimension in 16..256 of one kind: 0 odd, 1 a multiple of 16 not of 32, 2 a multiple of
    32, 3 any."""
    if kind == 0:
        return int(2 * rng.integers(8, 128) + 1)
    if kind == 1:
        return int(32 * rng.integers(0, 8) + 16)
    if kind == 2:
        return int(32 * rng.integers(1, 9))
    return int(rng.integers(16, 257))


def family(seed: int = SEED) -> list[Case]:
    """The seeded family: per board, the schemes in turn from a drawn offset, each dimension of
    a drawn kind (:func:`_dim`, every kind of d_model on a board of 4 cases or more), experts,
    top-k and activation drawn; shapes redrawn until the weights fit half the board's flash."""
    rng = np.random.default_rng(seed)
    cases = []
    for board, n in CASES_PER_BOARD.items():
        flash = load_board(board).region("flash").size
        first = int(rng.integers(len(SCHEMES)))
        kinds = rng.permutation(4)
        for i in range(n):
            scheme = SCHEMES[(first + i) % len(SCHEMES)]
            experts = int(rng.integers(4, 9))
            while True:
                d_model = _dim(rng, int(kinds[i % 4]))
                d_ff = _dim(rng, int(rng.integers(4)))
                size = 2 * experts * d_model * d_ff * BYTES_PER_WEIGHT[scheme]
                if size <= flash / 2:
                    break
            top_k = int(rng.integers(1, 3))
            act = ACTIVATIONS[int(rng.integers(len(ACTIVATIONS)))]
            cases.append(Case(board, d_model, d_ff, experts, top_k, act, scheme))
    return cases


#: Issue 40 as reported: Cortex-M55 int8, d_model 48 (a multiple of 16, not of 32) with an R4
#: matrix of one row group (d_ff 4 or 5); did not compile before the fix.
ISSUE_40_CASES = [Case("cortex-m55", 48, d_ff, 4, 2, "relu", "int8") for d_ff in (4, 5)]


#: Tails inside the fast layouts (issue 40 item 1): int8 / int4 shapes whose n_in is no whole
#: number of the layout's chunks (r4 16, r4p, q4r4 and q4h4 32), stored with zero columns up to it;
#: 200 x 328 is the issue's named shape, 19 x 45 pads w1's inputs by two thirds.
TAIL_CASES = [
    Case("cortex-m4", 200, 328, 2, 1, "relu", "int8"),
    Case("cortex-m4", 19, 45, 4, 2, "swiglu", "int8"),
    Case("cortex-m7", 50, 70, 5, 2, "gelu", "int8"),
    Case("cortex-m55", 200, 328, 2, 1, "relu", "int8"),
    Case("cortex-m55", 19, 45, 4, 2, "swiglu", "int8"),
    Case("cortex-m4", 50, 70, 4, 2, "swiglu", "int4"),
    Case("cortex-m7", 200, 47, 4, 1, "relu", "int4"),
    Case("cortex-m55", 50, 70, 4, 2, "swiglu", "int4"),
    Case("cortex-m55", 200, 47, 4, 1, "relu", "int4"),
    Case("cortex-m55", 19, 45, 5, 2, "gelu", "int4"),
]

#: c8 tails (issue 40 item 1): fp32 / fp16 shapes whose n_out is no multiple of 8 or n_in no
#: multiple of 4, which fell back to the generic layout (the seed layout / rows) on the M4 / M7 /
#: M55 before layout c8 took a narrower last block and its kernels ran the inputs after the last
#: pass of 4 in C; 27 x 47 is seed 44's first sweep shape, 3 x 13 has w1 inputs short of a pass.
C8_TAIL_CASES = [
    Case("cortex-m4", 27, 47, 4, 1, "relu", "fp32"),
    Case("cortex-m4", 3, 13, 2, 1, "relu", "fp16"),
    Case("cortex-m4", 50, 70, 4, 2, "swiglu", "fp16"),
    Case("cortex-m7", 19, 45, 4, 2, "swiglu", "fp32"),
    Case("cortex-m7", 27, 47, 5, 2, "gelu", "fp16"),
    Case("cortex-m55", 27, 47, 5, 2, "silu", "fp32"),
    Case("cortex-m55", 3, 13, 2, 1, "relu", "fp32"),
]

#: The layouts a board's kernels read for a scheme (int8 activations) at every shape with at
#: least 4 rows per matrix: never the generic "rows" (colibri/quant/layouts.py).
FAST_LAYOUTS = {
    ("cortex-m4", "int8"): {"r4p", "r4"},
    ("cortex-m7", "int8"): {"r4p", "r4"},
    ("cortex-m55", "int8"): {"r4"},
    ("cortex-m4", "int4"): {"q4r4"},
    ("cortex-m7", "int4"): {"q4r4"},
    ("cortex-m55", "int4"): {"q4h4"},
    ("cortex-m4", "fp32"): {"c8"},
    ("cortex-m7", "fp32"): {"c8"},
    ("cortex-m55", "fp32"): {"c8"},
    ("cortex-m4", "fp16"): {"c8"},
    ("cortex-m7", "fp16"): {"c8"},
}


def test_family_covers_the_shape_kinds() -> None:
    """The drawn family has, on each board, every scheme, and d_model odd, a multiple of 16 not
    of 32 and a multiple of 32; both top-k and every activation appear."""
    cases = family()
    for board in CASES_PER_BOARD:
        mine = [c for c in cases if c.board == board]
        assert {c.scheme for c in mine} == set(SCHEMES), board
        assert any(c.d_model % 2 for c in mine), board
        assert any(c.d_model % 32 == 16 for c in mine), board
        assert any(c.d_model % 32 == 0 for c in mine), board
        for c in mine:
            assert 16 <= c.d_model <= 256 and 16 <= c.d_ff <= 256, c.id
    assert {c.top_k for c in cases} == {1, 2}
    assert {c.act for c in cases} == set(ACTIVATIONS)


@pytest.mark.parametrize(
    "case", family() + ISSUE_40_CASES + TAIL_CASES + C8_TAIL_CASES, ids=lambda c: c.id
)
def test_case_generates_compiles_and_equals_the_mirror(case: Case, tmp_path: Path) -> None:
    require_board(case.board)
    layer = make_toy(
        case.experts, case.d_model, case.d_ff, case.top_k, case.act, seed=SEED, router_bias=True
    )
    x = np.random.default_rng(SEED).standard_normal((TOKENS, case.d_model)).astype(np.float32)
    opts = GenerateOptions(board=case.board, name="f", max_tokens=MAX_TOKENS, quant=case.scheme)
    _, manifest = generate(layer, tmp_path / "gen", opts)
    fast = FAST_LAYOUTS.get((case.board, case.scheme))
    if fast is not None and (fast == {"c8"} or min(case.d_model, case.d_ff) >= 4):
        # every matrix in a fast layout, tails padded inside it (the manifest records which)
        for kind, lay in manifest["weight_layouts"].items():
            assert set(lay.values()) <= fast, f"{case.id}: {kind} {lay}"
    out, _ = run_model(tmp_path / "gen", case.board, x)
    plan = make_plan(case.experts, case.scheme, None, None)
    ref, rq = quant_moe_forward(layer, quantize_layer(layer, plan), x)
    np.testing.assert_array_equal(out.expert_ids, rq.expert_ids)
    want = ref.astype(np.float32)
    if plan.acts[0] == "int8":
        differ = out.output.view(np.uint32) != want.view(np.uint32)
        assert not differ.any(), (
            f"{case.id}: {int(differ.sum())} of {want.size} outputs differ, first at "
            f"{np.argwhere(differ)[0].tolist()}, max |diff| {np.abs(out.output - want).max():.3g}"
        )
    else:
        err = compare(out.output, ref, LAYER_TOLERANCE[(plan.schemes[0], plan.acts[0])])
        assert err is None, f"{case.id}: {err}"
