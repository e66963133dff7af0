"""An example user test suite for Colibri firmware on boards: the same file runs on the built-in
QEMU runner, on a labgrid environment's QEMUDriver, on a labgrid board farm and on a real board
through pyOCD; only the command line changes (README.md).

The firmware is a model file (a seed-layout toy made here with `colibri make-toy`) generated and
built for each board by the fixture; pass a `colibri generate` output directory instead to test
exactly the firmware you ship (COLIBRI_FIRMWARE=gen/mymodel).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

#: Cortex-M boards of the matrix (an indirect parameter of the colibri_board fixture).
BOARDS = os.environ.get("COLIBRI_BOARDS", "cortex-m3,cortex-m4,cortex-m7,cortex-m55").split(",")


@pytest.fixture(scope="session")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The firmware to test: $COLIBRI_FIRMWARE, else a toy MoE layer made with the CLI."""
    given = os.environ.get("COLIBRI_FIRMWARE")
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("model") / "toy"
    subprocess.run(
        [sys.executable, "-m", "colibri", "make-toy", "--out", str(out), "--experts", "4",
         "--hidden", "16", "--ff", "32", "--top-k", "2", "--seed", "3"],
        check=True, capture_output=True,
    )  # fmt: skip
    return out


@pytest.fixture(scope="session")
def rows() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((6, 16)).astype(np.float32)


@pytest.mark.parametrize("colibri_board", BOARDS, indirect=True)
def test_model_on_board(colibri_board, model: Path, rows: np.ndarray) -> None:
    res = colibri_board.run(model, rows)
    assert res.returncode == 0
    assert res.output.shape == rows.shape and np.isfinite(res.output).all()
    # routing: top-k distinct experts per token, gates in (0, 1]
    assert res.expert_ids.shape == (rows.shape[0], 2)
    assert ((res.expert_ids >= 0) & (res.expert_ids < 4)).all()
    assert (res.expert_ids[:, 0] != res.expert_ids[:, 1]).all()
    assert ((res.gates > 0) & (res.gates <= 1)).all()
    if res.backend != "pyocd":  # QEMU counts instructions; a real core does not here
        assert res.instructions is not None and res.instructions > 1000


@pytest.mark.parametrize("colibri_board", BOARDS[:1], indirect=True)
def test_matches_reference(colibri_board, model: Path, rows: np.ndarray) -> None:
    """The board's output is the numpy reference's (colibri reference) within its tolerance."""
    from colibri.frontends.load import load_model
    from colibri.reference.moe import compare, moe_forward

    res = colibri_board.run(model, rows)
    ref, routing = moe_forward(load_model(str(model)), rows)
    np.testing.assert_array_equal(res.expert_ids, routing.expert_ids)
    assert compare(res.output, ref) is None
