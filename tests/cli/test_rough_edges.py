"""The newcomer's rough edges of issue 39 (item 4): what the CLI says matches what it does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from colibri.boards import load_board
from colibri.cli.main import build_parser
from colibri.cli.pipeline import generate
from colibri.frontends.seed import make_toy
from colibri.options import GenerateOptions
from colibri.plan.memory import plan_memory
from colibri.plan.model import default_ram_budget


def option_help(command: str, option: str) -> str:
    """The help text of one option of a subcommand, on one line."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    action = next(a for a in sub.choices[command]._actions if option in a.option_strings)
    return " ".join(str(action.help).split())


# -- generate --ram-budget: the default the help states is the one the planner uses ------------


def placements(tmp_path: Path, board: str, calib: bool, ram_budget: int | None = None) -> list[str]:
    layer = make_toy(experts=4, hidden=16, ff=32, top_k=2, seed=3)
    x = np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32)
    opts = GenerateOptions(board=board, name="m", quant="int8", ram_budget=ram_budget)
    _, manifest = generate(
        layer, tmp_path / f"g-{board}-{calib}-{ram_budget}", opts, calib=x if calib else None
    )
    return [e["placement"] for e in manifest["experts"]]


def test_ram_budget_help_states_the_real_default(tmp_path: Path) -> None:
    text = option_help("generate", "--ram-budget")
    assert "all in flash" not in text  # the old help: wrong with --calib on an MCU board
    assert "without --calib 0" in text and "with --calib on a board with flash and RAM" in text
    assert "half of the RAM the arena, the stack and 4 KB" in text
    assert "on hosted boards 0" in text
    # ... and that is what the planner does
    m4 = load_board("cortex-m4")
    plan = plan_memory(make_toy(experts=4, hidden=16, ff=32, top_k=2).config, 32, 0, False, True)
    ram = m4.memory["ram"].size
    assert default_ram_budget(m4, plan) == (ram - plan.arena_size - m4.stack_size - 4096) // 2
    assert default_ram_budget(load_board("host"), plan) == 0
    assert set(placements(tmp_path, "cortex-m4", calib=False)) == {"flash"}
    assert set(placements(tmp_path, "cortex-m4", calib=True)) == {"ram"}  # all fit
    assert set(placements(tmp_path, "cortex-m4", calib=True, ram_budget=0)) == {"flash"}
    assert set(placements(tmp_path, "host", calib=True)) == {"flash"}
