"""benchmarks/scale_table.py end to end on its --tiny model (one scheme, one repeat): the JSON
has every field with sane values (no wall-clock thresholds), the table is printed, and the
compiled runner, the container and the budgeted container generate the same tokens."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from conftest import ROOT, require_board
from hf_tiny import require_torch

sys.path.insert(0, str(ROOT / "benchmarks"))

import plots  # noqa: E402
import scale_table  # noqa: E402


def _timed(step: dict[str, float]) -> None:
    assert 0 < step["seconds"] < 600
    assert 1 << 20 < step["peak_rss_bytes"] < 8 << 30  # a real process, not an absurd figure


def _tps(summary: dict[str, float]) -> None:
    """Ordered positive rates, or NaN throughout when the tiny model's decode time was lost in
    the noise (scale_table.decode_rate): never a made-up figure."""
    values = [summary["min"], summary["median"], summary["max"]]
    assert all(map(math.isnan, values)) or 0 < values[0] <= values[1] <= values[2]


def test_scale_table_tiny(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    require_torch()
    require_board("host")
    out = tmp_path / "scale.json"
    argv = ["--tiny", "--repeats", "1", "--schemes", "int8", "--tokens", "8"]
    assert scale_table.main([*argv, "--out", str(tmp_path / "work"), "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "decode tokens/s" in table and "int8" in table and "from CPU time" in table
    if plots.pyplot() is not None:
        assert plots.png_beside(out).stat().st_size > 1000

    result = json.loads(out.read_text())
    model = result["model"]
    assert model["arch"] == "mixtral" and model["hidden_size"] == scale_table.TINY["hidden_size"]
    assert 100_000 < model["parameters"] < 1_000_000
    assert result["tokens"] == 8 and result["repeats"] == 1
    assert result["lmfile_runner_bytes"] > 0
    (row,) = result["schemes"]
    assert row["scheme"] == "int8"
    for step in ("generate", "build", "convert"):
        _timed(row[step])
    assert row["compiled_binary_bytes"] > 0 and row["container_bytes"] > 0
    n_experts = model["num_hidden_layers"] * model["num_local_experts"]
    assert row["expert_bytes"] > 0 and row["expert_bytes"] % n_experts == 0
    assert row["ram_budget_bytes"] == row["expert_bytes"] // 4
    for engine in scale_table.ENGINES:
        _tps(row[engine]["tokens_per_s"])
        _tps(row[engine]["cpu_tokens_per_s"])
        assert row[engine]["peak_rss_bytes"] > 0
    stats = row["budget_stats"]
    assert stats["loads"] == stats["hits"] + stats["misses"] > 0
    assert stats["n_slots"] * stats["slot_bytes"] <= row["ram_budget_bytes"]
    assert 0.0 <= row["hit_rate"] <= 1.0
    assert row["hit_rate"] == pytest.approx(stats["hits"] / stats["loads"])
    assert math.isnan(row["budget_vs_resident"]) or row["budget_vs_resident"] > 0
    assert math.isnan(row["compiled_vs_container"]) or row["compiled_vs_container"] > 0
    assert row["same_tokens"] is True
    assert set(row["goals"]) == {"generate_60s_2GB", "build_60s_2GB", "budget_half_speed"}
    assert all(isinstance(v, bool) for v in row["goals"].values())


def test_scale_table_two_b_tiny(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--two-b on the small config: the checkpoint written tensor by tensor converts and runs
    from the container; the report has the convert and run figures; the big files are gone."""
    require_board("host")
    out = tmp_path / "two_b.json"
    argv = ["--two-b", "--tiny", "--repeats", "1", "--tokens", "4", "--json", str(out)]
    assert scale_table.main([*argv, "--out", str(tmp_path / "work")]) == 0
    assert "2B model:" in capsys.readouterr().out
    result = json.loads(out.read_text())
    fp32 = 4 * result["model"]["parameters"]
    assert fp32 < result["model"]["safetensors_bytes"] < fp32 + (64 << 10)  # + the headers
    row = result["two_b"]
    _timed(row["convert"])
    assert row["container_bytes"] > 0 and len(row["tokens"]) == 4
    assert 1 << 20 < row["run"]["peak_rss_bytes"] < 8 << 30
    _tps(row["run"]["tokens_per_s"])
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == []
