"""Experts beyond RAM on the model-file path (runtime_c/src/lm_file.c, issue 10 point 3): with
an expert RAM budget the routed experts stay in the file and pass through a few slots (LRU,
next-layer prefetch into the slots); the logits are the all-resident run's bit for bit, the
counters add up and the prefetch raises the hit rate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from colibri.cli.pipeline import quantise_transformer
from colibri.emit.lmfile import write_lm_container
from colibri.frontends.hf_model import load_hf_transformer
from colibri.targets.binding import LM, RuntimeStatusError
from hf_tiny import lm_options, make_model, require_torch, save_model

MAX_CONTEXT = 32
PROMPT = [3, 17, 5, 60, 9, 41]
N_NEW = 16
N_EXPERTS, N_LAYERS, TOP_K = 8, 3, 2
ERR_BUDGET = -17


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny Mixtral with 8 experts x 3 layers as int8 and int4 model files."""
    require_torch()
    tmp = tmp_path_factory.mktemp("budget")
    hf = make_model("mixtral", seed=77, num_local_experts=N_EXPERTS, num_hidden_layers=N_LAYERS)
    model = load_hf_transformer(save_model(hf, tmp / "ckpt"))
    out = {}
    for scheme in ("int8", "int4"):
        q, _ = quantise_transformer(model, lm_options("host", "lm", MAX_CONTEXT, quant=scheme))
        out[scheme] = write_lm_container(model, q, tmp / f"{scheme}.clb", MAX_CONTEXT)
    return out


def _decode(path: Path, **kw: Any) -> tuple[np.ndarray, list[int], dict[str, int]]:
    """Logits of the prompt and of N_NEW greedy steps, the generated ids, the stats."""
    with LM(path, **kw) as lm:
        ids, rows = list(PROMPT), []
        for pos in range(len(PROMPT) + N_NEW):
            rows.append(lm.forward(ids[pos], pos))
            if pos + 1 >= len(PROMPT):
                ids.append(int(np.argmax(rows[-1])))
        return np.stack(rows), ids[len(PROMPT) :], lm.stats()


def _same_bits(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape, what
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (
        f"{what}: max |logit diff| {np.abs(got - want).max():.3g}"
    )


@pytest.mark.parametrize("prefetch", [True, False], ids=["prefetch", "no-prefetch"])
@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_quarter_budget_is_bit_identical(
    files: dict[str, Path], scheme: str, prefetch: bool
) -> None:
    want, want_ids, base = _decode(files[scheme])
    assert base["n_slots"] == 0 and base["loads"] == 0 and base["expert_bytes"] > 0
    budget = base["expert_bytes"] // 4
    got, ids, s = _decode(files[scheme], ram_budget=budget, prefetch=prefetch)
    _same_bits(got, want, f"{scheme} budget {budget}")
    assert ids == want_ids
    n_tokens = len(PROMPT) + N_NEW
    per_expert = base["expert_bytes"] // (N_EXPERTS * N_LAYERS)
    assert s["n_slots"] == budget // s["slot_bytes"] and TOP_K <= s["n_slots"] < N_EXPERTS
    assert s["slot_bytes"] >= per_expert and s["slot_bytes"] % 64 == 0
    assert s["loads"] == n_tokens * N_LAYERS * TOP_K
    assert s["hits"] + s["misses"] == s["loads"] and s["misses"] > s["n_slots"]
    fills = s["misses"] + s["prefetches"]  # demand and prefetch loads into slots
    assert s["bytes_read"] == fills * per_expert
    assert s["evictions"] == fills - s["n_slots"]  # the slots fill first, then evict
    if prefetch:
        assert 0 < s["prefetch_hits"] <= min(s["prefetches"], s["hits"])
    else:
        assert s["prefetches"] == 0 and s["prefetch_hits"] == 0


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_prefetch_raises_the_hit_rate(files: dict[str, Path], scheme: str) -> None:
    """The prefetch loads the next layer's predicted experts into slots, so more of the
    layers' uses are hits than with LRU alone (a count, the same on every run)."""
    _, _, base = _decode(files[scheme])
    budget = base["expert_bytes"] // 4
    _, _, on = _decode(files[scheme], ram_budget=budget)
    _, _, off = _decode(files[scheme], ram_budget=budget, prefetch=False)
    assert on["loads"] == off["loads"]
    assert on["hits"] > off["hits"], (on, off)
    assert on["misses"] < off["misses"]


def test_budget_of_every_expert_reads_each_once(files: dict[str, Path]) -> None:
    want, _, base = _decode(files["int8"])
    got, _, s = _decode(files["int8"], ram_budget=10 * base["expert_bytes"])
    _same_bits(got, want, "budget above the experts' bytes")
    assert s["n_slots"] == N_EXPERTS * N_LAYERS  # at most one slot an expert
    assert s["evictions"] == 0 and s["misses"] <= N_EXPERTS * N_LAYERS
    assert s["hits"] == s["loads"] - s["misses"]


def test_budget_below_top_k_is_refused(files: dict[str, Path]) -> None:
    _, _, base = _decode(files["int4"])
    with LM(files["int4"], ram_budget=10**6) as lm:
        slot = lm.stats()["slot_bytes"]
    with pytest.raises(RuntimeStatusError) as err:
        LM(files["int4"], ram_budget=TOP_K * slot - 1)  # room for one expert, top_k is 2
    assert err.value.status == ERR_BUDGET
    assert "budget" in str(err.value) and "\n" not in str(err.value)
    with LM(files["int4"], ram_budget=TOP_K * slot) as lm:  # exactly top_k slots: runs
        assert lm.stats()["n_slots"] == TOP_K
        lm.logits(PROMPT)


def test_budget_zero_is_unchanged(files: dict[str, Path]) -> None:
    want, _, base = _decode(files["int4"])
    got, _, s = _decode(files["int4"], ram_budget=0, prefetch=False)
    _same_bits(got, want, "budget 0")
    assert s == base and s["loads"] == s["n_slots"] == s["slot_bytes"] == 0


# -- the model-file runner and the CLI -----------------------------------------------------------


def _runner_with_budget(path: Path, board: str) -> None:
    from colibri.targets.lmrun import run_lm_file

    want, _ = run_lm_file(path, board, PROMPT, N_NEW, want_logits=True)
    assert want.expert_stats is None and want.logits is not None
    with LM(path) as lm:
        expert_bytes = lm.stats()["expert_bytes"]
    for prefetch in (True, False):
        got, _ = run_lm_file(
            path,
            board,
            PROMPT,
            N_NEW,
            want_logits=True,
            ram_budget=expert_bytes // 4,
            prefetch=prefetch,
        )
        assert got.logits is not None
        _same_bits(got.logits, want.logits, f"{board} runner, quarter budget")
        assert got.tokens.tolist() == want.tokens.tolist()
        s = got.expert_stats
        assert s is not None
        assert s["loads"] == (len(PROMPT) + N_NEW - 1) * N_LAYERS * TOP_K
        assert s["hits"] + s["misses"] == s["loads"]
        fills = s["misses"] + s["prefetches"]
        assert s["bytes_read"] == fills * expert_bytes // (N_EXPERTS * N_LAYERS)
        assert (s["prefetch_hits"] > 0) == prefetch


def test_runner_with_budget_on_host(files: dict[str, Path]) -> None:
    _runner_with_budget(files["int8"], "host")


def test_runner_with_budget_on_cortex_a53(files: dict[str, Path]) -> None:
    from conftest import require_board

    require_board("cortex-a53")
    _runner_with_budget(files["int4"], "cortex-a53")


def test_cli_ram_budget(files: dict[str, Path]) -> None:
    from conftest import run_cli

    clb = str(files["int8"])
    args = ["run", clb, "--prompt-ids", "1,2,3", "--max-new-tokens", "6"]
    want = run_cli(*args).stdout.split()
    r = run_cli(*args, "--ram-budget", "8K")  # 8192 bytes: 5 slots of this model's experts
    assert r.stdout.split() == want
    assert "expert slots: 5 x" in r.stderr and "prefetch hits" in r.stderr, r.stderr
    r = run_cli(*args, "--ram-budget", "8K", "--no-prefetch")
    assert r.stdout.split() == want and "0 prefetches" in r.stderr, r.stderr
    r = run_cli(*args, "--ram-budget", "2000", check=False)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--ram-budget 2000 bytes holds fewer than top_k" in r.stderr
    r = run_cli(*args, "--ram-budget", "lots", check=False)
    assert r.returncode == 2 and "byte count" in r.stderr


def test_byte_size_suffixes() -> None:
    import argparse

    from colibri.cli.argtypes import byte_size

    parse = byte_size(0, 1 << 40)
    assert parse("65536") == 65536 and parse("512K") == 512 << 10
    assert parse("64M") == parse("64MiB") == parse("64mb") == 64 << 20 and parse("2G") == 2 << 30
    for bad in ("", "K", "1.5M", "-1", "2T0", "4T1"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(bad)
