"""Every `--board` option lists the boards (issue 39, item 4.8): the help of each command and
benchmark that takes one names every board file (boards/*.toml), and an unknown board is a
one-line error listing them, before anything is read."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
from colibri.boards import board_names
from colibri.cli.main import build_parser, main

ROOT = Path(__file__).resolve().parents[2]
BOARDS = board_names()


def board_commands() -> list[str]:
    """The subcommands with a --board option."""
    parser = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(
        name
        for name, p in sub.choices.items()
        if any("--board" in a.option_strings for a in p._actions)
    )


def test_the_boards_are_the_board_files() -> None:
    assert {"host", "cortex-m4", "cortex-a53"} <= set(BOARDS)
    assert BOARDS == sorted(p.stem for p in (ROOT / "boards").glob("*.toml"))
    assert {"generate", "build", "run", "size", "demo"} <= set(board_commands())


@pytest.mark.parametrize("command", board_commands())
def test_board_help_lists_every_board(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    board_help = text[text.index("--board") :]
    for name in BOARDS:
        assert name in board_help, (command, name, board_help[:400])


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "model.bin", "--out", "g", "--board", "cortex-m99"],
        ["build", "gen", "--board", "cortex-m99"],
        ["run", "gen", "--board", "cortex-m99"],
        ["size", "a.elf", "--board", "cortex-m99"],
        ["demo", "--board", "cortex-m99"],
    ],
)
def test_an_unknown_board_lists_the_boards(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("colibri: error: argument --board: unknown board 'cortex-m99'"), err
    assert err.count("\n") == 1
    assert "available boards: " + ", ".join(BOARDS) in err


@pytest.mark.parametrize(
    "script",
    ["router_table.py", "quant_table.py", "matvec_table.py", "kernels_table.py"],
)
def test_benchmark_board_help_lists_every_board(script: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    board_help = text[text.index("--board BOARD") :]
    for name in BOARDS:
        assert name in board_help, (script, name)
