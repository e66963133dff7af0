"""The command line: the make-toy -> generate -> build -> run round trip, determinism, safe
output directories, and bad input reported as one clear line (no traceback, non-zero exit)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess

import numpy as np
import pytest
from colibri.frontends.load import load_model
from colibri.reference.moe import FP32_TOLERANCE, compare, moe_forward
from conftest import require_board, run_cli

Cli = Callable[..., CompletedProcess[str]]


def assert_clean_error(proc: CompletedProcess[str], pattern: str) -> None:
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("colibri: error: "), proc.stderr
    assert re.search(pattern, proc.stderr), proc.stderr


def test_round_trip(cli: Cli, tmp_path: Path) -> None:
    cli(
        "make-toy",
        "--out",
        str(tmp_path / "toy"),
        "--experts",
        "4",
        "--hidden",
        "12",
        "--ff",
        "20",
        "--top-k",
        "2",
        "--activation",
        "silu",
        "--seed",
        "5",
    )
    cli(
        "generate",
        str(tmp_path / "toy" / "model.bin"),
        "--board",
        "host",
        "--out",
        str(tmp_path / "gen"),
    )
    manifest = json.loads((tmp_path / "gen" / "manifest.json").read_text())
    assert manifest["memory"]["arena_size"] > 0
    assert len(manifest["model"]["sha256"]) == 64
    proc = cli("build", str(tmp_path / "gen"), "--board", "host")
    assert "built" in proc.stdout
    x = np.random.default_rng(0).standard_normal((37, 12)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    cli(
        "run",
        str(tmp_path / "gen"),
        "--board",
        "host",
        "--input",
        str(tmp_path / "x.npy"),
        "--output",
        str(tmp_path / "y.npy"),
        "--routing",
        str(tmp_path / "r.npz"),
    )
    layer = load_model(tmp_path / "toy" / "model.bin")
    ref, r = moe_forward(layer, x)
    y = np.load(tmp_path / "y.npy")
    assert y.shape == (37, 12) and y.dtype == np.float32
    assert compare(y, ref) is None
    routing = np.load(tmp_path / "r.npz")
    np.testing.assert_array_equal(routing["expert_ids"], r.expert_ids)
    assert routing["expert_ids"].shape == (37, 2)
    assert compare(routing["gates"], r.gates, FP32_TOLERANCE) is None


def test_toy_defaults_are_the_seed_toy(cli: Cli, tmp_path: Path) -> None:
    cli("make-toy", "--out", str(tmp_path))
    layer = load_model(tmp_path / "model.bin")
    c = layer.config
    assert (c.n_experts, c.d_model, c.d_ff, c.top_k, c.activation) == (2, 8, 16, 1, "gelu")
    assert (tmp_path / "model.bin").stat().st_size == 12 + 2 * 4 * (2 * 8 * 16 + 16 + 8)
    # k = 1 without renormalisation: the gate is the softmax probability, below 1
    _, r = moe_forward(layer, np.ones((1, 8), np.float32))
    assert 0.5 <= r.gates[0, 0] < 1.0


def test_generate_is_deterministic(cli: Cli, tmp_path: Path) -> None:
    cli("make-toy", "--out", str(tmp_path / "toy"), "--experts", "6", "--top-k", "2")
    for out in ("a", "b"):
        cli(
            "generate",
            str(tmp_path / "toy" / "model.bin"),
            "--out",
            str(tmp_path / out),
            "--name",
            "same",
        )
    for f in sorted((tmp_path / "a").iterdir()):
        assert f.read_bytes() == (tmp_path / "b" / f.name).read_bytes(), f.name


def test_convert_then_generate_gives_same_c(cli: Cli, tmp_path: Path) -> None:
    cli("make-toy", "--out", str(tmp_path / "toy"))
    cli("convert", str(tmp_path / "toy" / "model.bin"), "--out", str(tmp_path / "m.clb"))
    cli(
        "generate", str(tmp_path / "toy" / "model.bin"), "--out", str(tmp_path / "a"), "--name", "m"
    )
    cli("generate", str(tmp_path / "m.clb"), "--out", str(tmp_path / "b"), "--name", "m")
    a = (tmp_path / "a" / "colibri_weights.c").read_text().split("*/", 1)[1]
    b = (tmp_path / "b" / "colibri_weights.c").read_text().split("*/", 1)[1]
    assert a == b
    blob = "colibri_weights.bin"
    assert (tmp_path / "a" / blob).read_bytes() == (tmp_path / "b" / blob).read_bytes()


def test_console_script_entry_point_runs() -> None:
    """The `colibri` command that pip installs (the README's quick start) resolves and runs."""
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="console_scripts") if e.name == "colibri"]
    main = ep.load()
    assert main(["boards"]) == 0


def test_generate_refuses_foreign_directory(cli: Cli, tmp_path: Path) -> None:
    cli("make-toy", "--out", str(tmp_path / "toy"))
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    proc = cli("generate", str(tmp_path / "toy" / "model.bin"), "--out", str(foreign), check=False)
    assert_clean_error(proc, "is not empty and holds no Colibri manifest")
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]


def test_failed_generate_leaves_no_directory(cli: Cli, tmp_path: Path) -> None:
    cli("make-toy", "--out", str(tmp_path / "toy"))
    (tmp_path / "toy" / "model.bin").write_bytes(b"\x49\x4c\x4f\x43" + b"\0" * 20)
    proc = cli(
        "generate", str(tmp_path / "toy" / "model.bin"), "--out", str(tmp_path / "gen"), check=False
    )
    assert_clean_error(proc, "")
    assert not (tmp_path / "gen").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".gen")] == []


@pytest.mark.parametrize(
    ("mutate", "pattern"),
    [
        (
            lambda d: (d / "model.bin").write_bytes(b"XXXX" + (d / "model.bin").read_bytes()[4:]),
            "unrecognised model file",
        ),
        (
            lambda d: (d / "model.bin").write_bytes((d / "model.bin").read_bytes()[:100]),
            "truncated",
        ),
        (
            lambda d: (d / "config.json").write_text('{"n_experts": 2, "k": 1, "hidden_size": 8}'),
            "missing field 'intermediate_size'",
        ),
        (
            lambda d: (d / "config.json").write_text(
                '{"n_experts": 2, "k": 5, "hidden_size": 8, "intermediate_size": 16}'
            ),
            "'k' = 5 is larger than 'n_experts' = 2",
        ),
        (
            lambda d: (d / "config.json").write_text(
                '{"n_experts": 2, "k": 1, "hidden_size": 8, "intermediate_size": 16, '
                '"activation": "mish"}'
            ),
            "unknown activation 'mish'",
        ),
    ],
    ids=["magic", "truncated", "missing-field", "k-gt-E", "activation"],
)
def test_bad_model_is_one_clear_line(
    cli: Cli, tmp_path: Path, mutate: Callable[[Path], object], pattern: str
) -> None:
    cli("make-toy", "--out", str(tmp_path / "toy"))
    mutate(tmp_path / "toy")
    proc = cli(
        "generate", str(tmp_path / "toy" / "model.bin"), "--out", str(tmp_path / "g"), check=False
    )
    assert_clean_error(proc, pattern)


def test_run_rejects_bad_input(cli: Cli, tmp_path: Path) -> None:
    cli("make-toy", "--out", str(tmp_path / "toy"))
    cli("generate", str(tmp_path / "toy" / "model.bin"), "--out", str(tmp_path / "gen"))
    np.save(tmp_path / "wrong.npy", np.zeros((3, 5), np.float32))
    proc = cli(
        "run",
        str(tmp_path / "gen"),
        "--input",
        str(tmp_path / "wrong.npy"),
        "--output",
        str(tmp_path / "y.npy"),
        check=False,
    )
    assert_clean_error(proc, r"shape \(3, 5\), expected \[T, 8\]")
    bad = np.ones((2, 8), np.float32)
    bad[1, 3] = np.nan
    np.save(tmp_path / "nan.npy", bad)
    proc = cli(
        "run",
        str(tmp_path / "gen"),
        "--input",
        str(tmp_path / "nan.npy"),
        "--output",
        str(tmp_path / "y.npy"),
        check=False,
    )
    assert_clean_error(proc, "1 NaN/Inf values")
    proc = cli(
        "run",
        str(tmp_path / "nothere"),
        "--input",
        str(tmp_path / "nan.npy"),
        "--output",
        str(tmp_path / "y.npy"),
        check=False,
    )
    assert_clean_error(proc, "input file not found|not a generated model directory")
    proc = cli(
        "generate",
        str(tmp_path / "toy" / "model.bin"),
        "--out",
        str(tmp_path / "g2"),
        "--board",
        "no-such-board",
        check=False,
    )
    assert_clean_error(proc, "unknown board 'no-such-board'")


def test_python_dash_m_and_version(cli: Cli) -> None:
    proc = cli("--version")
    assert proc.stdout.startswith("colibri ")


def test_demo_is_the_readme_main_job(tmp_path: Path) -> None:
    """`colibri demo` (the README's first command after the set-up): host and cortex-m4 runs
    match the numpy reference, and the size report is printed."""
    require_board("cortex-m4")
    proc = run_cli("demo", "--workdir", str(tmp_path / "demo"))
    out = proc.stdout
    assert out.count("vs numpy reference: OK") == 2 and out.count("routing identical: True") == 2
    assert "Size report: colibri_runner.elf on cortex-m4" in out and "flash:" in out
    assert re.search(r"instructions for 5 tokens: \d+", out)
    assert out.rstrip().endswith("demo passed")
