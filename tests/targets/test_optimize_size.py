"""`--optimize size` (issue 40, item 4): the expert kernels in the portable layout (rows) on
every core, calling the library's matrix kernels, so expert kinds share their code. On the
Cortex-M4 (DSP tiles) and M55 (Helium tiles): the manifest records rows for every matrix, the
outputs equal the numpy mirror bit for bit (integer schemes, the same bits as --optimize speed),
and the code each expert kind's kernel reaches (`colibri size`, the stack report's kernels) and
its stack are smaller than speed's. An unknown choice is refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from colibri.cli.main import run_model
from colibri.cli.pipeline import generate
from colibri.errors import ConfigError
from colibri.frontends.seed import make_toy
from colibri.options import GenerateOptions
from colibri.quant.formats import make_plan, quantize_layer
from colibri.reference.kernels import quant_moe_forward
from colibri.targets.build import build_model
from colibri.targets.stack import load_report
from conftest import require_board

CASES = [
    ("cortex-m4", "int8", 96, 160, "relu"),
    ("cortex-m4", "int4", 64, 128, "swiglu"),
    ("cortex-m55", "int8", 96, 160, "silu"),
]


def _kernel0(gen: Path, board: str) -> dict[str, int]:
    rep = load_report(build_model(gen, board))
    assert rep is not None
    k = next(k for k in rep.kernels if k["name"] == "o_expert_0")
    return {"code": int(k["code"]), "stack": int(k["bound"])}


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[4]}")
def test_size_is_smaller_and_equals_the_mirror(
    case: tuple[str, str, int, int, str], tmp_path: Path
) -> None:
    board, scheme, d_model, d_ff, act = case
    require_board(board)
    layer = make_toy(4, d_model, d_ff, 2, act, seed=11)
    x = np.random.default_rng(3).standard_normal((9, d_model)).astype(np.float32)
    plan = make_plan(4, scheme, None, None)
    ref, rq = quant_moe_forward(layer, quantize_layer(layer, plan), x)
    footprint = {}
    for optimize in ("speed", "size"):
        gen = tmp_path / optimize
        opts = GenerateOptions(board=board, name="o", max_tokens=8, quant=scheme, optimize=optimize)
        _, manifest = generate(layer, gen, opts)
        layouts = {v for lay in manifest["weight_layouts"].values() for v in lay.values()}
        assert (layouts == {"rows"}) == (optimize == "size"), (optimize, layouts)
        out, _ = run_model(gen, board, x)
        np.testing.assert_array_equal(out.expert_ids, rq.expert_ids)
        want = ref.astype(np.float32)
        assert (out.output.view(np.uint32) == want.view(np.uint32)).all(), optimize
        footprint[optimize] = _kernel0(gen, board)
    assert footprint["size"]["code"] < footprint["speed"]["code"], footprint
    assert footprint["size"]["stack"] <= footprint["speed"]["stack"], footprint


def test_unknown_choice_is_refused(tmp_path: Path) -> None:
    layer = make_toy(2, 16, 32, 1, "relu", seed=1)
    with pytest.raises(ConfigError, match="--optimize: unknown choice 'fast'; supported: speed"):
        generate(layer, tmp_path / "g", GenerateOptions(optimize="fast"))
    assert not (tmp_path / "g").exists()
