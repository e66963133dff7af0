"""Golden tests: generated C (and the runtime's file-loading path) vs the numpy reference over
50 seeded random shapes: E in 1..64, k in 1..min(E, 8), d_model / d_ff including
non-multiples of 4 and 8, T in 1..300, every activation, gate renormalisation on and off."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from colibri.cli.main import run_model
from colibri.cli.pipeline import generate
from colibri.emit.container import write_container
from colibri.frontends.seed import make_toy, write_seed
from colibri.options import GenerateOptions
from colibri.reference.moe import FP32_TOLERANCE, compare, moe_forward

ACTS = ("gelu", "gelu_tanh", "silu", "relu", "swiglu")
N_CASES = 50


@dataclass(frozen=True)
class Case:
    seed: int
    experts: int
    top_k: int
    hidden: int
    ff: int
    tokens: int
    activation: str
    norm: bool
    bias: bool
    max_tokens: int


def make_case(i: int) -> Case:
    rng = np.random.default_rng(1000 + i)
    experts = int(rng.integers(1, 65)) if i > 2 else (1, 64, 8)[i]
    return Case(
        seed=i,
        experts=experts,
        top_k=int(rng.integers(1, min(experts, 8) + 1)),
        hidden=int(rng.integers(1, 72)),
        ff=int(rng.integers(1, 140)),
        tokens=int(rng.integers(1, 301)) if i > 1 else (1, 300)[i],
        activation=ACTS[i % len(ACTS)],
        norm=bool(rng.integers(0, 2)),
        bias=bool(rng.integers(0, 2)),
        max_tokens=int(rng.choice([1, 7, 16, 32, 64])),
    )


CASES = [make_case(i) for i in range(N_CASES)]


def check_against_reference(
    case: Case,
    y: np.ndarray,
    ids: np.ndarray,
    gates: np.ndarray,
    ref: np.ndarray,
    ref_ids: np.ndarray,
    ref_gates: np.ndarray,
) -> None:
    np.testing.assert_array_equal(ids, ref_ids, err_msg=f"{case}: routing differs")
    err = compare(gates, ref_gates)
    assert err is None, f"{case}: gates: {err}"
    err = compare(y, ref)
    assert err is None, f"{case}: output: {err}"


@pytest.mark.parametrize(
    "case",
    CASES,
    ids=[
        f"case{c.seed}-E{c.experts}k{c.top_k}d{c.hidden}f{c.ff}T{c.tokens}-{c.activation}"
        for c in CASES
    ],
)
def test_generated_c_matches_reference(case: Case, tmp_path: Path) -> None:
    layer = make_toy(
        case.experts,
        case.hidden,
        case.ff,
        case.top_k,
        case.activation,
        seed=case.seed,
        norm_topk_prob=case.norm,
        router_bias=case.bias,
    )
    x = (
        np.random.default_rng(case.seed)
        .standard_normal((case.tokens, case.hidden))
        .astype(np.float32)
    )
    ref, r = moe_forward(layer, x)
    gen = tmp_path / "gen"
    generate(
        layer,
        gen,
        GenerateOptions(board="host", name=f"golden{case.seed}", max_tokens=case.max_tokens),
    )
    out, _ = run_model(gen, "host", x)
    check_against_reference(case, out.output, out.expert_ids, out.gates, ref, r.expert_ids, r.gates)

    # The runtime's own loader on the same model: the container, and the seed layout.
    from colibri.targets.binding import Runtime

    paths = [write_container(layer, tmp_path / "m.clb")]
    if not layer.config.gated:
        paths.append(write_seed(layer, tmp_path / "seed"))
    for p in paths:
        with Runtime(p) as rt:
            y, ids, gates = rt.forward(x)
        check_against_reference(case, y, ids, gates, ref, r.expert_ids, r.gates)


def test_tolerance_is_tight() -> None:
    """The named tolerance is fp32-sized, not a loose 1e-2."""
    assert FP32_TOLERANCE <= 1e-4
