"""The newcomer's rough edges of issue 39 (item 4): what the CLI says matches what it does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
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


# -- colibri reference lm.clb: the numpy reference of the whole model the file stores ----------


def mixtral_checkpoint(path: Path) -> Path:
    """A 1-layer Mixtral checkpoint written with numpy only (tests/hf_tiny.py)."""
    import json

    from colibri.frontends.hf import write_safetensors
    from hf_tiny import MIXTRAL_1LAYER_CONFIG, mixtral_tensors_1layer

    path.mkdir()
    (path / "config.json").write_text(json.dumps(MIXTRAL_1LAYER_CONFIG))
    write_safetensors(mixtral_tensors_1layer(), path / "model.safetensors")
    return path


@pytest.mark.parametrize(
    "flags",
    [
        (),
        ("--quant", "int8", "--dense-quant", "int8"),
        ("--quant", "int4", "--router-quant", "fp16"),
    ],
    ids=["fp32", "int8-dense-int8", "int4-router-fp16"],
)
def test_reference_of_a_whole_model_container(flags: tuple[str, ...], tmp_path: Path) -> None:
    """Issue 39: `reference lm.clb --prompt-ids` answered with the single-layer usage; it runs
    the numpy reference of the whole model the file stores, which is exactly `reference CKPT`
    with the flags the file was converted with."""
    from conftest import run_cli

    ckpt = mixtral_checkpoint(tmp_path / "ckpt")
    clb = tmp_path / "lm.clb"
    run_cli("convert", str(ckpt), "--out", str(clb), "--max-context", "16", *flags)
    gen = ("--prompt-ids", "1,5,9", "--max-new-tokens", "4")
    got = run_cli("reference", str(clb), *gen, "--logits", str(tmp_path / "a.npy"))
    want = run_cli(
        "reference", str(ckpt), *gen, "--logits", str(tmp_path / "b.npy"), "--max-context", "16",
        *flags,
    )  # fmt: skip
    assert got.stdout.replace("a.npy", "b.npy") == want.stdout
    assert "generated ids: " in got.stdout
    a, b = np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy")
    assert a.shape == (3, 16) and np.array_equal(a, b)


def test_reference_of_a_container_is_what_run_computes(tmp_path: Path) -> None:
    """On integer schemes the C runtime on the file gives the reference's logits bit for bit:
    `reference lm.clb` is what a user checks `run lm.clb` against."""
    from conftest import require_board, run_cli

    require_board("host")
    ckpt = mixtral_checkpoint(tmp_path / "ckpt")
    clb = tmp_path / "lm.clb"
    run_cli("convert", str(ckpt), "--out", str(clb), "--quant", "int8", "--dense-quant", "int8")
    gen = ("--prompt-ids", "1,5,9", "--max-new-tokens", "4")
    ran = run_cli("run", str(clb), "--board", "host", *gen, "--logits", str(tmp_path / "r.npy"))
    ref = run_cli("reference", str(clb), *gen, "--logits", str(tmp_path / "a.npy"))
    assert ref.stdout.splitlines()[-1] == "generated ids: " + ran.stdout.split("\n")[0].replace(
        " ", ","
    )
    assert np.array_equal(np.load(tmp_path / "r.npy"), np.load(tmp_path / "a.npy"))


def test_reference_of_a_container_refuses_what_the_file_fixed(tmp_path: Path) -> None:
    from conftest import run_cli

    ckpt = mixtral_checkpoint(tmp_path / "ckpt")
    clb = tmp_path / "lm.clb"
    run_cli("convert", str(ckpt), "--out", str(clb), "--quant", "int8")
    for extra, needle in (
        (("--prompt-ids", "1,5", "--logits", "x.npy", "--quant", "int4"), "--quant: "),
        (("--input", "x.npy", "--output", "y.npy"), "--input, --output: "),
        (("--prompt-ids", "1,5"), "needs --prompt-ids 1,5,9 and --logits"),
        (("--prompt-ids", "1,5", "--max-new-tokens", "64"), "exceed --max-context 64"),
    ):
        proc = run_cli("reference", str(clb), *extra, check=False)
        assert proc.returncode == 1, proc.stdout
        assert proc.stderr.startswith("colibri: error: ") and needle in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1 and "single MoE layer" not in proc.stderr
