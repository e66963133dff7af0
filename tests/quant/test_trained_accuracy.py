"""A real trained MoE (issue 15, point 4): the generated C per quantisation scheme against
transformers' fp32 model on held-out text, so accuracy regressions show.

The model is tests/data/trained_moe (benchmarks/train_trained_moe.py: a 0.84 M-parameter
Mixtral, 8 experts top-2, byte-level BPE of 1024 ids, trained on Python's own documentation;
heldout.txt holds topics it never saw). Every scheme is generated, built and run on the host,
teacher-forced with the logits of every position of EVAL_WINDOWS windows of EVAL_WINDOW held-out
tokens (benchmarks/accuracy_table.py, the harness also run by hand); the figures are next-token
top-1 agreement with transformers over every position and the perplexity ratio C / transformers
(colibri.reference.lm_metrics). The numpy mirror of the same scheme is measured alongside and
the C must agree with it. One scheme also runs on the cortex-m7 QEMU board and must give the
host's figures.

The floors below are what the code meets today (measured figure in each comment, floor slightly
below); the issue's goals (GOAL_*) are where they are meant to go.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import ROOT, require_board
from hf_tiny import require_torch

sys.path.insert(0, str(ROOT / "benchmarks"))

import accuracy_table as harness  # noqa: E402
from colibri.reference.lm_metrics import (  # noqa: E402
    max_abs_diff,
    perplexity,
    top1_agreement,
)
from colibri.reference.transformer import LOGIT_TOLERANCE  # noqa: E402

CHECKPOINT = ROOT / "tests" / "data" / "trained_moe"
#: The committed model, tokenizer, held-out text and calibration ids together.
MAX_COMMITTED_BYTES = 2_000_000
#: 32 windows (3,072 positions): on the issue's 8 (768) one position is 0.13 % and methods that
#: differ by a point swap places from one sample of windows to the next.
EVAL_WINDOWS = 32
EVAL_WINDOW = 96

#: The issue's goals (top-1 agreement, perplexity ratio) per scheme. They are for its size
#: class (3.6 M parameters), which is too large to commit: `python benchmarks/train_trained_moe.py
#: --size large` trains one (ours: held-out perplexity 48.5) and `python
#: benchmarks/accuracy_table.py --checkpoint DIR --windows 32 --calib DIR/calib.npy` measures it;
#: the generated C on the host, 3,072 positions: int8+d8 99.09 %, 1.00122; int4 96.42 %, 1.00204;
#: int4+calib 97.69 %, 0.99988 (all met, C = mirror to the bit). This 0.84 M model, four times
#: smaller (d_model 96), misses them; its floors below guard against regressions.
GOAL = {
    "int8+d8": (0.990, 1.002),
    "int4": (0.960, 1.005),
    "int4+calib": (0.970, 1.005),
}
#: What the generated C meets today on the host: (top-1 floor, perplexity-ratio ceiling), each
#: a little below the figure measured (in the comment: top-1, ratio; 1 position of the 3,072
#: is 0.03 %). A ratio below 1 is quantisation noise that happens to help this small, somewhat
#: over-fitted model on the held-out windows, not a gain to count on. For comparison, llama.cpp's
#: formats on the same weights (weight-only, fp32 activations, mirror): Q8_0 experts 99.58 %,
#: Q8_0 everywhere 98.89 %, Q4_0 experts 93.03 %.
FLOOR = {
    "int8": (0.988, 1.001),  # 99.22 %, 0.99869
    "int8+d8": (0.984, 1.0015),  # 98.73 %, 1.00049 (block-scaled dense int8; 98.21 % before)
    "int4": (0.930, 1.008),  # 93.46 %, 1.00650
    "int4+d8": (0.930, 1.0065),  # 93.52 %, 1.00535
    "int4+calib": (0.948, 1.006),  # 95.15 %, 1.00454 (1.00457 before issue 38: GPTQ by default)
    # issue 38's k-quant-class schemes at 4.5 / 5.5 bits per routed weight (super-blocks across
    # rows; at 5.22 / 6.22, each 96- / 128-input row its own super-blocks: q4k 94.89 %, 1.00435,
    # q5k 97.36 %, 0.99855)
    "q4k": (0.945, 1.006),  # 94.76 %, 1.00564
    "q5k": (0.968, 1.0),  # 97.01 %, 0.99986
}
#: fp32 C vs transformers: the same next-token choices (ties aside) and perplexity.
FP32_TOP1 = 0.998
FP32_RATIO_TOLERANCE = 1e-3
#: C vs the numpy mirror of the same scheme: the mirror repeats every fp32 operation of the C in
#: the C's order and the runtime's own exp (colibri/reference/f32.py), so the logits are the
#: same to the bit at every position (before that: max |C - mirror| 0.03 to 0.11 logits).
C_MIRROR_MAX_DIFF = 0.0
#: The scheme also run on cortex-m7 (the whole model int8: 0.91 MB of flash) and the largest
#: |logit| difference allowed between the board and the host: none (measured 0, see the test).
BOARD_SCHEME = "int8+d8"
BOARD_LOGIT_TOLERANCE = 0.0


@pytest.fixture(scope="module")
def reference() -> harness.Reference:
    require_torch()
    ids = harness.load_ids(CHECKPOINT)
    windows = harness.token_windows(ids, EVAL_WINDOWS, EVAL_WINDOW)
    return harness.hf_reference(harness.load_hf(CHECKPOINT, threads=2), windows)


@pytest.fixture(scope="module")
def model() -> Any:
    from colibri.frontends.hf_model import load_hf_transformer

    return load_hf_transformer(CHECKPOINT)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trained")


@pytest.fixture(scope="module")
def host_rows(reference: harness.Reference, model: Any, work: Path) -> dict[str, harness.Row]:
    """Every scheme measured once on the host (C and mirror), by key; the table is printed."""
    mirror = harness.MirrorQuant(model)
    rows = {}
    for key in ["fp32", *FLOOR]:
        rows[key] = harness.measure_scheme(
            model,
            harness.SCHEMES[key],
            reference,
            "host",
            work,
            CHECKPOINT / "calib.npy",
            mirror,
        )
    print("\n" + harness.markdown_table(reference, list(rows.values())))
    return rows


def _ok(row: harness.Row) -> harness.Row:
    assert row.error is None, f"{row.scheme.flags} on {row.board}: {row.error}"
    assert row.c_logits is not None
    return row


def test_committed_model_is_small_and_real() -> None:
    """≤ 2 MB committed; a Mixtral of 8 experts top-2 whose held-out text is long enough."""
    files = [p for p in CHECKPOINT.iterdir() if p.is_file()]
    total = sum(p.stat().st_size for p in files)
    assert total <= MAX_COMMITTED_BYTES, f"{CHECKPOINT}: {total} bytes committed"
    cfg = json.loads((CHECKPOINT / "config.json").read_text())
    assert cfg["architectures"] == ["MixtralForCausalLM"]
    assert (cfg["num_local_experts"], cfg["num_experts_per_tok"]) == (8, 2)
    calib = np.load(CHECKPOINT / "calib.npy")
    assert calib.ndim == 2 and calib.min() >= 0 and calib.max() < cfg["vocab_size"]


def test_transformers_reference_is_a_trained_model(reference: harness.Reference) -> None:
    """The held-out perplexity of the committed model (train_log.json) and far below the
    vocabulary's 1024 (a model that learnt nothing)."""
    log = json.loads((CHECKPOINT / "train_log.json").read_text())
    # the log measured the protocol: 8 windows of 96 tokens
    windows8 = harness.token_windows(harness.load_ids(CHECKPOINT), 8, EVAL_WINDOW)
    ref8 = harness.hf_reference(harness.load_hf(CHECKPOINT, threads=2), windows8)
    assert ref8.ppl == pytest.approx(log["heldout_perplexity"], rel=1e-3)
    assert reference.ppl < 100


def test_fp32_c_agrees_with_transformers(
    host_rows: dict[str, harness.Row], reference: harness.Reference
) -> None:
    row = _ok(host_rows["fp32"])
    assert row.c_logits is not None
    diff = max_abs_diff(row.c_logits, reference.logits)
    assert row.c_top1 >= FP32_TOP1, f"fp32 C top-1 {row.c_top1:.2%}"
    assert abs(row.c_ratio - 1.0) <= FP32_RATIO_TOLERANCE, f"fp32 ppl ratio {row.c_ratio:.6f}"
    assert diff <= LOGIT_TOLERANCE, f"fp32 C vs transformers max |logit diff| {diff:.3g}"


@pytest.mark.parametrize("key", sorted(FLOOR))
def test_scheme_accuracy_on_host(host_rows: dict[str, harness.Row], key: str) -> None:
    """top-1 >= floor and perplexity ratio <= ceiling for the C on the host, and the numpy
    mirror of the scheme gives the same figures."""
    if key.endswith("+calib") and not _calib_supported():
        pytest.skip("this colibri does not calibrate whole transformers (--calib)")
    row = _ok(host_rows[key])
    top1, ratio = FLOOR[key]
    goal = GOAL.get(key)
    print(
        f"\n{row.scheme.flags}: C top-1 {row.c_top1:.2%}, ppl ratio {row.c_ratio:.5f}; mirror "
        f"{row.mirror_top1:.2%}, {row.mirror_ratio:.5f}; max |C - mirror| "
        f"{row.c_mirror_max_diff:.2e}" + (f"; goal {goal[0]:.1%} / {goal[1]}" if goal else "")
    )
    assert row.c_top1 >= top1, f"{row.scheme.flags}: C top-1 {row.c_top1:.2%} < {top1:.2%}"
    assert row.c_ratio <= ratio, f"{row.scheme.flags}: C ppl ratio {row.c_ratio:.5f} > {ratio}"
    assert row.c_mirror_max_diff <= C_MIRROR_MAX_DIFF, (
        f"{row.scheme.flags}: max |C - mirror| logit {row.c_mirror_max_diff:.3g}"
    )
    assert (row.c_top1, row.c_ratio) == (row.mirror_top1, row.mirror_ratio)


def _calib_supported() -> bool:
    import inspect

    from colibri.quant.model import quantize_transformer_as_asked

    return "calib" in inspect.signature(quantize_transformer_as_asked).parameters


def test_cortex_m7_gives_the_host_figures(
    host_rows: dict[str, harness.Row], reference: harness.Reference, model: Any, work: Path
) -> None:
    """BOARD_SCHEME built for cortex-m7 (QEMU) on the same windows gives the host's logits bit
    for bit, so the same top-1 and perplexity: the integer paths are exact on both, and the
    float parts are the same IEEE fp32 operations in the same order (-ffp-contract=off on every
    board), sqrtf is correctly rounded everywhere, and exp is the runtime's own colibri_expf,
    not the C library's. Measured max |m7 - host| = 0."""
    require_board("cortex-m7")
    host = _ok(host_rows[BOARD_SCHEME])
    row = _ok(
        harness.measure_scheme(
            model, harness.SCHEMES[BOARD_SCHEME], reference, "cortex-m7", work, mirror=None
        )
    )
    assert row.c_logits is not None and host.c_logits is not None
    diff = max_abs_diff(row.c_logits, host.c_logits)
    print(
        f"\n{row.scheme.flags} cortex-m7: top-1 {row.c_top1:.2%} (host {host.c_top1:.2%}), "
        f"ppl ratio {row.c_ratio:.6f} (host {host.c_ratio:.6f}), max |m7 - host| {diff:.2e}, "
        f"flash {row.flash}"
    )
    assert diff <= BOARD_LOGIT_TOLERANCE, f"cortex-m7 vs host max |logit diff| {diff:.3g}"
    assert top1_agreement(row.c_logits, reference.logits) == host.c_top1
    assert perplexity(row.c_logits, reference.windows) == host.c_ppl
