"""Hardware-in-the-loop matrix: every board x three models, run under QEMU (or natively on the
host), outputs compared with the numpy reference under FP32_TOLERANCE; cross-board agreement;
deterministic instruction counts; no heap in firmware; budgets that fail when they should."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from colibri.boards import load_board, matrix_boards
from colibri.cli.main import run_model
from colibri.cli.pipeline import generate
from colibri.errors import BudgetExceeded
from colibri.frontends.seed import make_toy
from colibri.ir.moe import MoELayer
from colibri.options import GenerateOptions
from colibri.reference.moe import FP32_TOLERANCE, compare, moe_forward
from conftest import require_board

#: The matrix runs on every board but ISA variants (cortex-a76: its tests are test_variants.py).
BOARDS = [b.name for b in matrix_boards()]
QEMU_BOARDS = [b.name for b in matrix_boards() if b.kind != "host"]
BAREMETAL = [b.name for b in matrix_boards() if b.kind == "baremetal"]

MODELS = {
    # the seed articles' toy
    "toy": dict(experts=2, hidden=8, ff=16, top_k=1, activation="gelu", seed=0, tokens=5),
    # 8 experts, k = 2, d_model 64
    "e8k2": dict(
        experts=8,
        hidden=64,
        ff=40,
        top_k=2,
        activation="silu",
        seed=1,
        tokens=24,
        norm_topk_prob=True,
    ),
    # 32 experts, T >= 64 so that grouping sees many tokens per expert, chunked by 32
    "e32": dict(
        experts=32,
        hidden=20,
        ff=24,
        top_k=4,
        activation="gelu_tanh",
        seed=2,
        tokens=96,
        router_bias=True,
    ),
}


def _model(name: str) -> tuple[MoELayer, np.ndarray]:
    spec = dict(MODELS[name])
    tokens = int(spec.pop("tokens"))  # type: ignore[call-overload]
    layer = make_toy(**spec)  # type: ignore[arg-type]
    x = np.random.default_rng(42).standard_normal((tokens, layer.config.d_model))
    return layer, x.astype(np.float32)


@pytest.fixture(scope="module")
def outputs() -> dict[tuple[str, str], np.ndarray]:
    return {}


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("board", BOARDS)
def test_board_matches_reference(
    board: str, model: str, tmp_path: Path, outputs: dict[tuple[str, str], np.ndarray]
) -> None:
    require_board(board)
    layer, x = _model(model)
    ref, r = moe_forward(layer, x)
    gen = tmp_path / model
    generate(layer, gen, GenerateOptions(board=board, name=model, max_tokens=32))
    out, _ = run_model(gen, board, x)
    np.testing.assert_array_equal(out.expert_ids, r.expert_ids, err_msg=f"{board}/{model}")
    err = compare(out.output, ref)
    assert err is None, f"{board}/{model}: {err}"
    assert compare(out.gates, r.gates) is None
    outputs[(board, model)] = out.output


def test_boards_agree(outputs: dict[tuple[str, str], np.ndarray]) -> None:
    """The same model gives the same output on every board that ran (within the tolerance)."""
    runs = {b: y for (b, m), y in outputs.items() if m == "e8k2"}
    if len(runs) < 2:
        pytest.skip("fewer than two boards ran the e8k2 model in this session")
    host = runs.get("host", next(iter(runs.values())))
    scale = float(np.abs(host).max())
    for board, y in runs.items():
        assert float(np.abs(y - host).max()) <= 2 * FP32_TOLERANCE * scale, board


@pytest.mark.parametrize("board", QEMU_BOARDS)
def test_instruction_counts_are_deterministic(board: str, tmp_path: Path) -> None:
    require_board(board)
    layer, x = _model("toy")
    generate(layer, tmp_path / "toy", GenerateOptions(board=board, name="toy", max_tokens=8))
    counts = [
        run_model(tmp_path / "toy", board, x, count_instructions=True)[1].instructions
        for _ in range(2)
    ]
    assert counts[0] is not None and counts[0] > 1000, counts
    assert counts[0] == counts[1], counts


@pytest.mark.parametrize("board", BAREMETAL)
def test_firmware_has_no_heap(board: str, tmp_path: Path) -> None:
    require_board(board, run=False)
    from colibri.targets.build import build_model
    from colibri.targets.elfcheck import check_no_heap

    layer, _ = _model("e8k2")
    generate(layer, tmp_path / "m", GenerateOptions(board=board, name="m"))
    check_no_heap(build_model(tmp_path / "m", board))


def test_too_large_for_cortex_m3_fails_before_flashing(tmp_path: Path) -> None:
    """~200 KB of arena cannot fit the M3's 64 KB of RAM: generate refuses, naming the bytes
    over budget and the largest consumers, and writes nothing."""
    layer = make_toy(experts=4, hidden=64, ff=128, top_k=2)
    with pytest.raises(
        BudgetExceeded,
        match=r"RAM: needs ~\d+ bytes .* bytes over budget; "
        r"largest consumers: workspace",
    ) as info:
        generate(
            layer, tmp_path / "big", GenerateOptions(board="cortex-m3", name="big", max_tokens=256)
        )
    assert "--max-tokens" in str(info.value)
    assert not (tmp_path / "big").exists()
    flash_heavy = make_toy(experts=16, hidden=64, ff=128, top_k=2)  # 2.1 MB of weights
    with pytest.raises(
        BudgetExceeded,
        match=r"flash: needs ~\d+ bytes .* largest consumers: "
        r"expert \d+: \d+ bytes",
    ):
        generate(flash_heavy, tmp_path / "big", GenerateOptions(board="cortex-m3", name="big"))


def test_link_time_budget_check(tmp_path: Path) -> None:
    """A model generated for a larger board and built for cortex-m3 fails the link with a
    budget error (the linker script's region check), not a corrupt image."""
    require_board("cortex-m3", run=False)
    from colibri.targets.build import build_model

    layer = make_toy(experts=4, hidden=64, ff=128, top_k=2)
    generate(
        layer, tmp_path / "big", GenerateOptions(board="cortex-m7", name="big", max_tokens=128)
    )
    with pytest.raises(BudgetExceeded, match="overflow"):
        build_model(tmp_path / "big", "cortex-m3")


def test_size_report_json(tmp_path: Path) -> None:
    require_board("cortex-m4", run=False)
    from colibri.targets.size import size_report

    layer, _ = _model("e8k2")
    generate(layer, tmp_path / "m", GenerateOptions(board="cortex-m4", name="m"))
    rep = size_report(tmp_path / "m", "cortex-m4").as_dict()
    for key in ("flash_used", "ram_used", "flash_size", "ram_size"):
        assert isinstance(rep[key], int) and rep[key] > 0, key
    weights = sum(e.nbytes for e in layer.experts)
    assert sum(v["weights"] for v in rep["experts"].values()) == weights
    assert len(rep["experts"]) == 8 and all(v["code"] > 0 for v in rep["experts"].values())
    assert {"router", "sparse_forward", "loader"} <= set(rep["modules"])
    assert rep["flash_used"] > weights and rep["ram_used"] > 8192
    board = load_board("cortex-m4")
    assert rep["flash_size"] == board.memory["flash"].size
