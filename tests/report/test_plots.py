"""The benchmarks' PNG plots (benchmarks/plots.py): drawn from a small JSON beside it as a valid
PNG, and skipped with a one-line note when matplotlib is missing. Only the plot functions run
here, never the (slow) benchmarks themselves."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest
from conftest import IN_CI, ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import plots  # noqa: E402
from boards_table import plot_boards  # noqa: E402
from train_trained_moe import loss_steps, plot_train_log  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _require_matplotlib() -> None:
    if plots.pyplot() is None:
        if IN_CI:
            pytest.fail("matplotlib is not installed (CI=true: the test extra installs it)")
        pytest.skip("matplotlib not installed (pip install '.[bench]')")


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR", path
    assert data[-8:-4] == b"IEND", f"{path}: truncated"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_train_log_plot_is_a_png_beside_the_json(tmp_path: Path) -> None:
    _require_matplotlib()
    log = {"steps": 120, "parameters": 1000, "heldout_perplexity": 9.5}
    log["losses_every_50_steps"] = [7.0, 4.5, 3.0, 2.9]  # steps 0, 50, 100, 119
    path = tmp_path / "train_log.json"
    path.write_text(json.dumps(log))
    png = plot_train_log(path)
    assert png == tmp_path / "train_log.png"
    width, height = _png_size(png)
    assert width > 300 and height > 200
    assert loss_steps(4, 120) == [0, 50, 100, 119] and loss_steps(2, 51) == [0, 50]
    first = png.read_bytes()
    plot_train_log(path)
    assert png.read_bytes() == first  # no timestamp: the same JSON, the same file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train_log.json", "train_log.png"]


def test_boards_plot(tmp_path: Path) -> None:
    _require_matplotlib()
    rows = [
        {"board": "host", "flash_used": 9000, "flash_size": 0, "ram_used": 100, "ram_size": 0},
        {"board": "cortex-m4", "flash_used": 155244, "flash_size": 1048576, "ram_used": 15868,
         "ram_size": 262144},
        {"board": "cortex-m3", "flash_used": 300000, "flash_size": 262144, "ram_used": 9000,
         "ram_size": 65536},
    ]  # fmt: skip
    path = tmp_path / "boards.json"
    path.write_text(json.dumps({"boards": rows}))
    png = plot_boards(path)
    assert png is not None and _png_size(png)[0] > 300


def test_plot_is_skipped_without_matplotlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(plots, "pyplot", lambda: None)
    path = tmp_path / "x.json"
    path.write_text("{}")
    assert (
        plots.line_plot(path, [0, 1], {"a": [1.0, 2.0]}, title="t", xlabel="x", ylabel="y") is None
    )
    assert plots.bar_plot(path, ["a"], {"b": [1.0]}, title="t", ylabel="y") is None
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(line.startswith("plot skipped: matplotlib") for line in lines)
    assert not (tmp_path / "x.png").exists()
