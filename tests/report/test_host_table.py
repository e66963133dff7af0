"""benchmarks/host_table.py end to end on its --tiny model (one round): the JSON has every field
with sane values (no wall-clock thresholds), Colibri at 1 and 2 threads generates the same
tokens, the runner's timing line is read, and PyTorch runs beside it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import ROOT, require_board
from hf_tiny import require_torch

sys.path.insert(0, str(ROOT / "benchmarks"))

import host_table  # noqa: E402


def test_host_table_tiny(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    require_torch()
    require_board("host")
    out = tmp_path / "host.json"
    argv = ["--tiny", "--rounds", "1", "--tokens", "6", "--prompt", "12", "--schemes", "int8"]
    assert host_table.main([*argv, "--out", str(tmp_path / "work"), "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "fraction of bandwidth" in table and "colibri int8 x2" in table
    result = json.loads(out.read_text())
    assert result["same_tokens"] is True
    assert 1e8 < result["bandwidth_bytes_per_s"] < 1e12
    assert 1e8 < result["bandwidth_2_threads_bytes_per_s"] < 2e12
    assert result["cpu"]["model"] and result["cpu"]["cores"] >= 1
    assert "CPU: " in table and "GB/s (2 threads)" in table
    assert result["prompt_tokens"] == 12 and result["decode_tokens"] == 6
    engines = {r["engine"]: r for r in result["rows"]}
    assert set(engines) == {
        "colibri int8 x1",
        "colibri int8 x2",
        "pytorch fp32 x1",
        "pytorch fp32 x2",
    }
    for r in engines.values():
        d = r["decode_tokens_per_s"]
        assert 0 < d["min"] <= d["median"] <= d["max"]
        assert r["prefill_tokens_per_s"]["median"] > 0
        assert r["bytes_per_token"] > 0 and r["bandwidth_fraction"] > 0
    # Colibri's int8 bytes per token: every matrix int8, so under PyTorch's fp32 bytes
    assert (
        engines["colibri int8 x1"]["bytes_per_token"]
        < engines["pytorch fp32 x1"]["bytes_per_token"]
    )
    assert engines["colibri int8 x1"]["vs_torch"] is not None
    assert engines["colibri int8 x2"]["vs_one_thread"] is not None
