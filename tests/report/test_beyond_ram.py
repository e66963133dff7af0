"""benchmarks/beyond_ram.py and its cgroup helper (benchmarks/memcap.py): the helper makes a
capped memory group, a child joins it before exec, its peak and limit hits are read, a child over
the cap is killed, and the group is gone afterwards (also after an exception); the script's
smallest path runs Colibri alone on the tiny model under a cap and says how to get llama.cpp.
Both skip with the reason when this is not root or there is no memory controller."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
from conftest import ROOT, require_board
from hf_tiny import require_torch

sys.path.insert(0, str(ROOT / "benchmarks"))

import memcap  # noqa: E402


def _require_cap() -> None:
    if os.geteuid() != 0:
        pytest.skip("making a memory cgroup needs root")
    try:
        memcap.find_hierarchy()
    except memcap.CapUnavailable as e:
        pytest.skip(str(e))


def test_find_hierarchy_names_what_is_missing(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text("proc /proc proc rw 0 0\n")
    own = tmp_path / "cgroup"
    own.write_text("0::/\n")
    with pytest.raises(memcap.CapUnavailable, match="no cgroup file system is mounted"):
        memcap.find_hierarchy(mounts, own)
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("hugetlb\n")
    mounts.write_text(f"cgroup2 {v2} cgroup2 rw 0 0\n")
    with pytest.raises(memcap.CapUnavailable, match="controllers: hugetlb"):
        memcap.find_hierarchy(mounts, own)
    # v1 memory beside a v2 without it: v1, this process's group in it
    v1 = tmp_path / "v1"
    mounts.write_text(f"cgroup2 {v2} cgroup2 rw 0 0\ncgroup {v1} cgroup rw,memory 0 0\n")
    own.write_text("4:memory:/a/b\n0::/\n")
    h = memcap.find_hierarchy(mounts, own)
    assert (h.version, h.own) == (1, v1 / "a" / "b")
    # v2 with memory wins
    (v2 / "cgroup.controllers").write_text("cpu memory\n")
    own.write_text("4:memory:/a/b\n0::/x\n")
    h = memcap.find_hierarchy(mounts, own)
    assert (h.version, h.own) == (2, v2 / "x")


def test_parse_cap() -> None:
    import beyond_ram

    assert beyond_ram.parse_cap("1/4") == Fraction(1, 4)
    assert beyond_ram.parse_cap("0.125") == Fraction(1, 8)
    assert beyond_ram.parse_cap("64M") == 64 << 20
    assert beyond_ram.cap_label(Fraction(1, 2)) == "1/2"
    with pytest.raises(ValueError):
        beyond_ram.parse_cap("3/2")


def test_memory_cap_child_peak_kill_cleanup() -> None:
    _require_cap()
    py = [sys.executable, "-c"]
    with memcap.MemoryCap(96 << 20) as cap:
        assert cap.path.is_dir() and 0 < cap.limit() <= 96 << 20
        where = subprocess.run(
            [*py, "b = bytearray(32 << 20); print(open('/proc/self/cgroup').read())"],
            preexec_fn=cap.enter,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert cap.name in where
        assert 32 << 20 <= cap.peak_bytes() <= 96 << 20
        over = subprocess.run(
            [*py, "b = bytearray(200 << 20)"], preexec_fn=cap.enter, capture_output=True
        )
        assert over.returncode != 0  # killed by the cap (or a MemoryError), never 200 MB in
        assert cap.failures() > 0
        path = cap.path
    assert not path.exists()
    with pytest.raises(KeyboardInterrupt), memcap.MemoryCap(64 << 20) as cap:
        child = subprocess.Popen([*py, "import time; time.sleep(60)"], preexec_fn=cap.enter)
        path = cap.path
        raise KeyboardInterrupt  # as a Ctrl-C would: the child is killed, the group removed
    assert child.wait(timeout=10) != 0
    assert not path.exists()


def test_beyond_ram_tiny_colibri_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _require_cap()
    require_torch()
    require_board("host")
    import beyond_ram
    import plots

    out = tmp_path / "beyond.json"
    argv = ["--model", "tiny", "--caps", "48M", "--rounds", "1", "--tokens", "6"]
    assert beyond_ram.main([*argv, "--out", str(tmp_path / "work"), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "llama.cpp is left out: pass --llama-cpp SRC" in text
    result = json.loads(out.read_text())
    assert result["cgroup"]["version"] in (1, 2)
    assert result["container_bytes"] > 0 and result["colibri_slot_bytes"] > 0
    (row,) = result["rows"]
    assert row["cap"] == "48M" and row["cap_bytes"] == 48 << 20
    cell = row["colibri"]
    assert cell["failed"] == [] and cell["decode_tokens_per_s"]["median"] > 0
    assert 0 <= cell["hit_rate"]["median"] <= 1
    assert 0 < cell["budget_bytes"] < 48 << 20
    assert 1 << 20 < cell["peak_rss_bytes"] < 48 << 20
    assert "llama.cpp" not in row
    assert [x["round"] for x in result["load_average"]] == [1]
    if plots.pyplot() is not None:
        assert plots.png_beside(out).stat().st_size > 1000
