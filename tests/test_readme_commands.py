"""The README's shell commands run as quoted, so the README cannot drift (issue 39, item 4.12).

Every ```sh block of README.md is preceded by a marker comment:

- ``<!-- test: run -->``: its commands run here, one line at a time, in order with every other
  such block, in one temporary directory (``colibri`` is this checkout's CLI);
- ``<!-- test: skip REASON -->``: not run, and the reason (hardware, a toolchain or network it
  needs, or a run too long for this test) must be given;
- ``<!-- test: output ... -->`` before a plain ``` block: the block is exactly the standard
  output of the last command run before it (the size report).

The inputs the README's commands take but do not make are made here first: ``x.npy`` (rows of
``toy``'s d_model), ``mixtral-ckpt/`` (a seeded 4-layer Mixtral checkpoint, written with numpy)
and ``block.pt`` (its layer 3 MoE block as a PyTorch state_dict, for `colibri export`).
A command that needs a board's toolchain or emulator skips the rest (locally) or fails (CI),
as every board test does.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from conftest import ROOT, require_board

README = ROOT / "README.md"
MARKER = re.compile(r"^<!-- test: (run|skip|output)\b ?(.*?) ?-->$")
#: Boards whose toolchain (and emulator) the run blocks need, checked before anything runs.
BOARDS = ("host", "cortex-m4", "cortex-m7", "cortex-a53")
#: Seconds one command may take (a cross build of the runtime on a busy 2-core machine).
COMMAND_TIMEOUT = 600


@dataclass
class Block:
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    marker: str | None  # run / skip / output, or None
    reason: str


def readme_blocks(text: str) -> list[Block]:
    """The fenced code blocks of a Markdown text with the marker comment right before each
    (blank lines between them allowed)."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].startswith("```"):
            i += 1
            continue
        start, lang = i, lines[i][3:].strip()
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        k = start - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        m = MARKER.match(lines[k].strip()) if k >= 0 else None
        blocks.append(
            Block(
                start + 1,
                lang,
                "\n".join(lines[start + 1 : j]),
                m.group(1) if m else None,
                m.group(2).strip() if m else "",
            )
        )
        i = j + 1
    return blocks


def commands(block: Block) -> list[str]:
    """The block's command lines (comments and blank lines left out)."""
    out = []
    for line in block.text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def test_every_shell_block_is_run_or_says_why_not() -> None:
    blocks = readme_blocks(README.read_text())
    shell = [b for b in blocks if b.lang in ("sh", "bash", "shell", "console")]
    assert len(shell) >= 8
    for b in shell:
        assert b.marker in ("run", "skip"), (
            f"README.md:{b.line}: a ```{b.lang} block without <!-- test: run --> or "
            f"<!-- test: skip REASON --> before it"
        )
        if b.marker == "skip":
            assert len(b.reason.split()) >= 3, f"README.md:{b.line}: say why it is not run"
    for b in blocks:
        if b.marker == "output":
            assert b.lang == "", f"README.md:{b.line}: an output block has no language"
    assert sum(b.marker == "run" for b in shell) >= 5


def test_markers_are_read() -> None:
    text = "a\n\n<!-- test: skip needs a board here -->\n\n```sh\nx --y  # z\n\n# c\n```\n"
    (b,) = readme_blocks(text)
    assert (b.marker, b.reason, b.line, commands(b)) == (
        "skip",
        "needs a board here",
        5,
        ["x --y  # z"],
    )


# -- the run ----------------------------------------------------------------------------------


def mixtral_checkpoint(path: Path) -> dict[str, np.ndarray]:
    """A seeded 4-layer Mixtral (d_model 16, d_ff 32, 4 experts top-2, vocab 64) written with
    numpy; returns its tensors."""
    from colibri.frontends.hf import write_safetensors

    layers, d, f, e, vocab = 4, 16, 32, 4, 64
    config = {
        "architectures": ["MixtralForCausalLM"],
        "hidden_size": d,
        "intermediate_size": f,
        "num_local_experts": e,
        "num_experts_per_tok": 2,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-5,
    }
    rng = np.random.default_rng(0)
    hd = d // 4
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab, d),
        "model.norm.weight": (d,),
        "lm_head.weight": (vocab, d),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update(
            {
                f"{p}input_layernorm.weight": (d,),
                f"{p}post_attention_layernorm.weight": (d,),
                f"{p}self_attn.q_proj.weight": (d, d),
                f"{p}self_attn.k_proj.weight": (2 * hd, d),
                f"{p}self_attn.v_proj.weight": (2 * hd, d),
                f"{p}self_attn.o_proj.weight": (d, d),
                f"{p}block_sparse_moe.gate.weight": (e, d),
            }
        )
        for j in range(e):
            for name, shape in (("w1", (f, d)), ("w3", (f, d)), ("w2", (d, f))):
                shapes[f"{p}block_sparse_moe.experts.{j}.{name}.weight"] = shape
    tensors = {k: (0.2 * rng.standard_normal(s)).astype(np.float32) for k, s in shapes.items()}
    for k in tensors:
        if k.endswith("norm.weight") or "layernorm" in k:
            tensors[k] = (1.0 + 0.1 * rng.standard_normal(tensors[k].shape)).astype(np.float32)
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    write_safetensors(tensors, path / "model.safetensors")
    return tensors


def make_inputs(work: Path) -> None:
    """What the README's commands read but do not write."""
    np.save(work / "x.npy", np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32))
    tensors = mixtral_checkpoint(work / "mixtral-ckpt")
    import torch

    prefix = "model.layers.3.block_sparse_moe."
    block = {
        k[len(prefix) :]: torch.from_numpy(v) for k, v in tensors.items() if k.startswith(prefix)
    }
    torch.save(block, work / "block.pt")


def cli_shim(bin_dir: Path) -> None:
    """`colibri` on PATH: this checkout's CLI under the test's Python."""
    bin_dir.mkdir()
    shim = bin_dir / "colibri"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m colibri "$@"\n')
    shim.chmod(0o755)


def test_readme_commands_run(tmp_path: Path) -> None:
    from hf_tiny import require_torch

    require_torch()  # colibri export (and block.pt)
    for board in BOARDS:
        require_board(board)
    work = tmp_path / "work"
    work.mkdir()
    make_inputs(work)
    cli_shim(tmp_path / "bin")
    env = dict(os.environ)
    env["PATH"] = f"{tmp_path / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "codegen"), *filter(None, [env.get("PYTHONPATH")])]
    )
    env.pop("COLIBRI_RESOURCE_DIR", None)
    last_out: str | None = None
    ran = 0
    for b in readme_blocks(README.read_text()):
        if b.marker == "output":
            assert last_out is not None, f"README.md:{b.line}: output block before any command"
            shown = [line.rstrip() for line in last_out.rstrip("\n").splitlines()]
            assert shown == b.text.rstrip("\n").splitlines(), (
                f"README.md:{b.line}: the quoted output has drifted from the command's; today:\n"
                f"{last_out}"
            )
            continue
        if b.marker != "run":
            continue
        for cmd in commands(b):
            proc = subprocess.run(
                ["bash", "-c", cmd],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=COMMAND_TIMEOUT,
            )
            assert proc.returncode == 0, (
                f"README.md:{b.line}: `{cmd}` failed ({proc.returncode}):\n"
                f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
            )
            last_out = proc.stdout
            ran += 1
    assert ran >= 20
    # the commands made what they say
    for path in ("toy.clb", "y.npy", "y_ref.npy", "r.npz", "lm.clb", "b.clb", "l.npy"):
        assert (work / path).is_file(), path
    for gen in ("gen/toy", "gen/l3", "gen/q", "gen/mix", "gen/lru", "gen/lm", "gen/demo"):
        assert (work / gen / "manifest.json").is_file(), gen
