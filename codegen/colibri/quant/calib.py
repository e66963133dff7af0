"""Calibrated quantisation of routed experts (issue 15, point 3; issue 38): what --calib changes.

The statistics come from the reference stage (:mod:`colibri.reference.calibration`: the fp32
model run once over the calibration tokens, each expert seeing only the tokens its router sends
it) as plain arrays (:class:`ExpertCalib`), with a function that runs a quantised expert as the
generated C does (:data:`ExpertRunner`, the kernels' numpy mirror), so this stage imports no
later one. For every stored int8 / int4 expert that calibration hit, candidates are measured on
its own calibration tokens and the one whose output is closest to the fp32 expert's kept:

- the plain method and the uncalibrated scale search (so calibration never does worse there);
- the scale search weighted by the expert's input second moments E[x^2] (w1, w3) and hidden
  ones E[h^2] (w2), combined with, for gated (SwiGLU) experts, an activation-aware fold of the
  hidden channels (AWQ-style): h_j = silu(w1 x)_j * (w3 x)_j, so dividing w3's output j by s_j
  and multiplying w2's input j by s_j leaves the expert unchanged in real arithmetic while the
  channels that carry large activations get finer steps in w2 (and smaller values in the int8
  activation row). s_j = E[|h_j|]^alpha, normalised to geometric mean 1 and bounded by
  FOLD_LIMIT (0 = no fold);
- block-local error compensation ("blocks", :func:`colibri.quant.gptq.block_compensated_matrix`):
  each matrix rounded column by column, the rounding error of each column spread over the
  later columns of its group of GROUP inputs through the inverse of the group's second moments
  (w1 / w3: the expert's routed inputs; w2: its hidden activations), summed in the one pass
  over every routed token ("blocks") and over the sample rows ("blocks-sample", when the
  sample is not every token): a GROUP x GROUP solve per group, no whole-matrix one;
- with ``--calib-method gptq`` only, whole-matrix error compensation (:mod:`colibri.quant.gptq`,
  GPTQ): the same through the inverse of the expert's whole H = X^T X of its sample rows, for
  experts with at least GPTQ_MIN_ROWS calibration rows.

The default method, "importance", measures the folds of IMPORTANCE_ALPHAS on at most
IMPORTANCE_EVAL_MACS multiply-adds of rows per candidate: every statistic comes from one pass
of the calibration tokens and no whole-matrix solve runs (measured: 8 s for a 1024 x 2816
int4 expert, 5 s int8, on one core). "gptq" (the method before issue 38, plus the block
candidates) measures every alpha of FOLD_ALPHAS and the GPTQ candidate on up to EVAL_MACS per
candidate, and needs the hidden activations of the sample rows kept. On the trained test
model (3,072 held-out positions) both give int4 95.15 % next-token top-1 agreement with fp32,
93.46 % without calibration.

The fold lives in the stored weights only; the kernels are unchanged. Experts never hit in
calibration, and fp32 / fp16 experts, are quantised as without calibration.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from ..errors import ConfigError
from ..frontends.container import q4k_group_rows
from ..ir.moe import Expert
from .formats import (
    DEFAULT_SCALE_SEARCH,
    KQUANT_BITS,
    QuantExpert,
    check_choice,
    check_scale_search,
    divide_rows,
    quantize_expert,
    quantize_matrix,
)
from .gptq import GPTQ_SCHEMES, block_compensated_matrix, gptq_matrix, hessian

#: The quantised expert on rows x [n, d_model] -> [n, d_model], as the generated C computes it.
ExpertRunner = Callable[[QuantExpert, np.ndarray], np.ndarray]

#: Exponents of the fold's channel scales s_j = E[|h_j|]^alpha tried per expert (0: no fold).
FOLD_ALPHAS: tuple[float, ...] = (0.0, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0)
#: Bound of the fold's scales after normalisation: 1 / FOLD_LIMIT <= s_j <= FOLD_LIMIT.
FOLD_LIMIT = 64.0
#: Multiply-adds one candidate's measurement may cost, and the fewest rows it uses (experts of
#: the test models, < 10^5 weights, are measured on every row).
EVAL_MACS = 2 * 10**8
EVAL_MIN_ROWS = 64
#: Calibration rows an expert needs before the error-compensated candidate (colibri.quant.gptq)
#: is tried: with fewer, H = X^T X is mostly damping and the compensation fits the sample.
GPTQ_MIN_ROWS = 32
#: Schemes calibration applies to (fp32 / fp16 have no scales to choose). q4k experts get the
#: plain, searched, importance-weighted and folded candidates only (no error compensation:
#: colibri.quant.gptq's GPTQ_SCHEMES).
CALIBRATED_SCHEMES = ("int8", "int4", "q4k", "q5k")
#: --calib-method: "importance" (the default: the importance-weighted search and a few folds,
#: measured on a subsample of rows) or "gptq" (every fold of FOLD_ALPHAS, the uncalibrated
#: search and the error-compensated candidate, measured on every row up to EVAL_MACS).
CALIB_METHODS: tuple[str, ...] = ("importance", "gptq")
DEFAULT_CALIB_METHOD = "importance"
#: The fold exponents the default method measures.
IMPORTANCE_ALPHAS: tuple[float, ...] = (0.0, 0.25, 0.5)
#: Whether the default method also measures the uncalibrated search (three more searched
#: matrices per expert).
IMPORTANCE_UNCALIBRATED = True
#: Multiply-adds one candidate's measurement may cost in the default method (at least
#: EVAL_MIN_ROWS rows; the test models' experts are measured on every row).
IMPORTANCE_EVAL_MACS = 2 * 10**7


@dataclass
class ExpertCalib:
    """Calibration statistics of one stored expert, over the tokens routed to it: `hits`
    tokens; mean x^2 of its input [d_model] and mean h^2 and |h| of its hidden activation
    [d_ff] (float64); a deterministic sample of those tokens' inputs `rows` [n, d_model]
    (float32), the fp32 expert's output on them `target` [n, d_model] and its hidden
    activation on them `hidden_rows` [n, d_ff] (float64; None: not collected, then the
    error-compensated candidate is not tried)."""

    hits: int
    x2: np.ndarray
    h2: np.ndarray
    habs: np.ndarray
    rows: np.ndarray
    target: np.ndarray
    hidden_rows: np.ndarray | None = None
    #: Mean x_b^T x_b of the input's / hidden activation's blocks of QK4 channels over every
    #: routed token ([nb, QK4, QK4] float64; None: not collected, then the block-compensated
    #: candidate is not tried).
    xblk: np.ndarray | None = None
    hblk: np.ndarray | None = None
    #: The same over the sample rows only (`rows`, and the hidden activations on them).
    xblk_sample: np.ndarray | None = None
    hblk_sample: np.ndarray | None = None


@dataclass
class LayerCalib:
    """Calibration of one MoE layer: calibration tokens seen, statistics by stored expert index
    (experts never hit have hits 0), the runner of its quantised experts and a sample of the
    layer's own calibration inputs [n, d_model] (float32, for the layer's accuracy report)."""

    tokens: int
    experts: dict[int, ExpertCalib]
    run: ExpertRunner
    inputs: np.ndarray


def eval_rows(qe: QuantExpert, n_rows: int, macs: int = EVAL_MACS) -> np.ndarray:
    """Indices of the calibration rows a candidate is measured on: all of them, or for a large
    expert an evenly spread `macs` / (weights) of them (at least EVAL_MIN_ROWS), so that
    choosing among the candidates stays bounded per expert at any size."""
    weights = sum(t.n_out * t.n_in for t in (qe.w1, qe.w2, qe.w3) if t is not None)
    keep = max(EVAL_MIN_ROWS, macs // max(1, weights))
    if n_rows <= keep:
        return np.arange(n_rows)
    return np.unique(np.linspace(0, n_rows - 1, keep).round().astype(np.int64))


def output_error(
    qe: QuantExpert, stats: ExpertCalib, run: ExpertRunner, idx: np.ndarray | None = None
) -> float:
    """sum ||run(qe, rows) - target||^2 over the expert's calibration rows `idx` (float64;
    default a spread subset of them for large experts: :func:`eval_rows`)."""
    idx = eval_rows(qe, stats.rows.shape[0]) if idx is None else idx
    y = np.asarray(run(qe, stats.rows[idx]), dtype=np.float64)
    return float(np.sum((y - stats.target[idx]) ** 2))


def target_energy(qe: QuantExpert, stats: ExpertCalib, idx: np.ndarray | None = None) -> float:
    """sum ||target||^2 over the rows :func:`output_error` measures (its relative scale)."""
    idx = eval_rows(qe, stats.rows.shape[0]) if idx is None else idx
    return float(np.sum(stats.target[idx] ** 2))


def fold_scales(habs: np.ndarray, alpha: float) -> np.ndarray | None:
    """s_j = E[|h_j|]^alpha normalised to geometric mean 1 (over the channels that were ever
    non-zero), clipped to [1 / FOLD_LIMIT, FOLD_LIMIT]; None when there is nothing to scale."""
    habs = np.asarray(habs, dtype=np.float64)
    live = np.isfinite(habs) & (habs > 0)
    if alpha == 0 or not live.any():
        return None
    floor = float(habs[live].max()) * 1e-6
    logs = alpha * np.log(np.maximum(np.where(live, habs, floor), floor))
    logs -= float(np.mean(logs[live]))
    s = np.exp(np.clip(logs, -np.log(FOLD_LIMIT), np.log(FOLD_LIMIT)))
    return s.astype(np.float32)


def fold_expert(e: Expert, s: np.ndarray) -> Expert:
    """The gated expert with hidden channel j divided by s_j > 0: w3[:, j] / s_j and w2[j, :] *
    s_j (fp32). silu(x w1 + b1)_j * (x w3)_j / s_j * s_j w2[j] is the same function in real
    arithmetic; in fp32 the weights move by their rounding only."""
    if e.w3 is None:
        raise ConfigError("fold_expert: the fold needs a gated (SwiGLU) expert with w3")
    s = np.asarray(s, dtype=np.float32)
    return replace(e, w2=(e.w2 * s[:, None]).astype(np.float32), w3=(e.w3 / s).astype(np.float32))


def check_calib_method(method: str) -> str:
    return check_choice(method, CALIB_METHODS, "--calib-method", "method")


def _fold_candidates(
    e: Expert,
    base: QuantExpert,
    stats: ExpertCalib,
    scheme: str,
    name: str,
    search: str,
    alphas: tuple[float, ...],
) -> list[tuple[str, float, QuantExpert]]:
    """The calibrated candidates folded with each non-zero alpha (w3's rows divided as stored,
    w2 folded and searched again with its hidden importances divided by s^2)."""
    out: list[tuple[str, float, QuantExpert]] = []
    for alpha in alphas:
        s = fold_scales(stats.habs, alpha) if alpha != 0 else None
        if s is None:
            continue
        assert base.w3 is not None
        w3 = divide_rows(base.w3, s)
        if w3 is None and scheme in KQUANT_BITS and q4k_group_rows(base.w3.n_in) > 1:
            # q4k / q5k rows sharing super-blocks: the folded w3 quantised afresh (its input
            # importances those of the base's w3)
            folded = fold_expert(e, s).w3
            assert folded is not None
            w3 = quantize_matrix(folded.T, scheme, f"{name}.w3", search, stats.x2)
        if w3 is None:
            continue
        h_imp = stats.h2 / s.astype(np.float64) ** 2 if search != "none" else None
        w2 = quantize_matrix(fold_expert(e, s).w2.T, scheme, f"{name}.w2", search, h_imp)
        out.append(("calibrated", alpha, replace(base, w2=w2, w3=w3)))
    return out


def _block_compensated(
    e: Expert, base: QuantExpert, scheme: str, xb: np.ndarray, hb: np.ndarray
) -> QuantExpert:
    """The expert with every matrix rounded by :func:`block_compensated_matrix` (w1 / w3
    through the input's group moments xb, w2 through the hidden activation's hb)."""
    return replace(
        base,
        w1=block_compensated_matrix(e.w1.T, scheme, xb),
        w3=block_compensated_matrix(e.w3.T, scheme, xb) if e.w3 is not None else None,
        w2=block_compensated_matrix(e.w2.T, scheme, hb),
    )


def quantize_expert_calibrated(
    e: Expert,
    scheme: str,
    act: str | None,
    stats: ExpertCalib | None,
    run: ExpertRunner,
    gated: bool,
    name: str = "",
    search: str = DEFAULT_SCALE_SEARCH,
    method: str = DEFAULT_CALIB_METHOD,
) -> QuantExpert:
    """The expert in `scheme` chosen by its output error on its calibration rows (module
    docstring; `method` "importance" or "gptq"); without hits (or for fp32 / fp16) the
    uncalibrated :func:`quantize_expert`. The result's ``calibration`` says what was chosen:
    method ("plain", "search", "calibrated" or "compensated"), the fold's alpha and the
    measured errors."""
    check_scale_search(search)
    check_calib_method(method)
    if stats is None or stats.hits == 0 or scheme not in CALIBRATED_SCHEMES:
        return quantize_expert(e, scheme, act, name, search)
    gptq = method == "gptq"
    plain = quantize_expert(e, scheme, act, name, "none")
    candidates: list[tuple[str, float, QuantExpert]] = [("plain", 0.0, plain)]
    if search != "none" and (gptq or IMPORTANCE_UNCALIBRATED):
        candidates.append(("search", 0.0, quantize_expert(e, scheme, act, name, search)))
    folds = gated and e.w3 is not None
    if search != "none":
        base = quantize_expert(e, scheme, act, name, search, stats.x2, stats.h2)
        candidates.append(("calibrated", 0.0, base))
    else:
        base = plain
    alphas = (FOLD_ALPHAS if gptq else IMPORTANCE_ALPHAS) if folds else ()
    candidates += _fold_candidates(e, base, stats, scheme, name, search, alphas)
    rows_ok = stats.hidden_rows is not None and stats.rows.shape[0] >= GPTQ_MIN_ROWS
    compensate = search != "none" and scheme in GPTQ_SCHEMES
    if compensate:  # its scales come from the search
        sources: list[tuple[str, np.ndarray | None, np.ndarray | None]] = [
            ("blocks", stats.xblk, stats.hblk)
        ]
        if stats.rows.shape[0] >= GPTQ_MIN_ROWS and stats.rows.shape[0] < stats.hits:
            sources.append(("blocks-sample", stats.xblk_sample, stats.hblk_sample))
        for label, xb, hb in sources:
            if xb is None or hb is None:
                continue
            candidates.append((label, 0.0, _block_compensated(e, base, scheme, xb, hb)))
    if gptq and rows_ok and compensate:  # its scales come from the search
        assert stats.hidden_rows is not None
        hx = hessian(stats.rows)
        hh = hessian(stats.hidden_rows)
        compensated = replace(
            base,
            w1=gptq_matrix(e.w1.T, scheme, hx),
            w3=gptq_matrix(e.w3.T, scheme, hx) if e.w3 is not None else None,
            w2=gptq_matrix(e.w2.T, scheme, hh),
        )
        candidates.append(("compensated", 0.0, compensated))
    idx = eval_rows(plain, stats.rows.shape[0], EVAL_MACS if gptq else IMPORTANCE_EVAL_MACS)
    errors = [output_error(qe, stats, run, idx) for _, _, qe in candidates]
    best = int(np.argmin(errors))  # the first of equals: plain, then search, then small alpha
    chosen, alpha, qe = candidates[best]
    qe.calibration = {
        "method": chosen,
        "alpha": alpha,
        "error": errors[best],
        "plain_error": errors[0],
        "target_energy": target_energy(qe, stats, idx),
    }
    return qe
