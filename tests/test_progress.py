"""Progress lines of the long steps (colibri.progress): the reporter on a fake terminal, and
`colibri generate` on multi-MB models with stderr on a pseudo-terminal: a line per stage that
counts layers and experts; nothing on stderr with --quiet or when stderr is not a terminal, and
stdout byte-identical in every case."""

from __future__ import annotations

import io
import json
import os
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from colibri.frontends.hf import write_safetensors
from colibri.progress import (
    PROGRESS_MIN_BYTES,
    SILENT,
    Progress,
    Stage,
    TerminalProgress,
    model_bytes,
    progress_for,
)

ROOT = Path(__file__).resolve().parent.parent


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lines(text: str) -> list[str]:
    """What a terminal shows, line by line: each \\r redraws the line (trailing blanks cut)."""
    return [part.split("\r")[-1].rstrip() for part in text.split("\n")]


# -- the reporter ------------------------------------------------------------------------------


def test_counts_go_1_to_n_then_the_final_line_with_the_time() -> None:
    tty, clock = FakeTTY(), Clock()
    progress = TerminalProgress(tty, clock=clock, redraw=0.0)
    with progress.stage("quantise", 4) as st:
        for k in range(1, 5):
            clock.now += 0.5
            st.update(k, f"expert {k}/4")
    out = tty.getvalue()
    draws = out.split("\r")[1:]
    assert [d.split("  ")[1] for d in draws] == [f"expert {k}/4" for k in (1, 2, 3, 4, 4)]
    assert "[#####               ]  25 %" in draws[0]
    assert "[##########          ]  50 %" in draws[1]
    assert out.endswith("\n") and out.count("\n") == 1
    assert lines(out)[0] == "quantise  expert 4/4  [####################] 100 %  2.0 s"


def test_nested_counts_and_a_stage_without_a_total() -> None:
    tty, clock = FakeTTY(), Clock()
    progress = TerminalProgress(tty, clock=clock, redraw=0.0)
    with progress.stage("quantise", 2) as st:
        st.update(0.5, "layer 1/2  expert 4/8")
    with progress.stage("build") as st:
        st.update(None, "step 1: CC a.o")
        clock.now += 3
        st.update(None, "step 2: LINK colibri_runner")
    shown = lines(tty.getvalue())
    assert shown == [
        "quantise  layer 1/2  expert 4/8  [####################] 100 %  0.0 s",
        "build     step 2: LINK colibri_runner  3.0 s",
        "",
    ]
    # a shorter line after a longer one is padded over the old text
    assert "step 2: LINK colibri_runner" in tty.getvalue().split("\r")[-1]


def test_redraws_are_throttled_but_the_final_line_is_not() -> None:
    tty, clock = FakeTTY(), Clock()
    progress = TerminalProgress(tty, clock=clock)  # at most one redraw per 0.1 s
    with progress.stage("load", 1000) as st:
        for k in range(1, 1001):
            st.update(k, f"layer {k}/1000")
    out = tty.getvalue()
    assert out.count("\r") == 2  # the first draw, then the final line
    assert lines(out)[0].startswith("load      layer 1000/1000  [####################] 100 %")


def test_small_models_show_only_the_stages_that_take_long() -> None:
    tty, clock = FakeTTY(), Clock()
    progress = TerminalProgress(tty, always=False, clock=clock, redraw=0.0)
    with progress.stage("plan"):
        clock.now += 0.2
    assert tty.getvalue() == ""
    with progress.stage("build") as st:
        st.update(None, "step 1: CC a.o")  # 0 s in: not yet
        clock.now += 1.5
        st.update(None, "step 2: CC b.o")
    assert lines(tty.getvalue()) == ["build     step 2: CC b.o  1.5 s", ""]


def test_a_failed_stage_ends_its_line_for_the_error_message() -> None:
    tty, clock = FakeTTY(), Clock()
    progress = TerminalProgress(tty, clock=clock, redraw=0.0)
    with pytest.raises(RuntimeError), progress.stage("quantise", 8) as st:
        st.update(3, "expert 3/8")
        raise RuntimeError("boom")
    assert tty.getvalue().endswith("expert 3/8  [#######             ]  37 %\n")
    with pytest.raises(RuntimeError), progress.stage("write"):
        raise RuntimeError("nothing drawn, nothing written")
    assert tty.getvalue().count("\n") == 1


def test_silent_and_who_gets_what() -> None:
    with SILENT.stage("quantise", 3) as st:
        st.update(1, "expert 1/3")
    assert progress_for(io.StringIO(), quiet=False, nbytes=1 << 30) is SILENT  # not a TTY
    assert progress_for(FakeTTY(), quiet=True, nbytes=1 << 30) is SILENT
    big = progress_for(FakeTTY(), quiet=False, nbytes=PROGRESS_MIN_BYTES)
    small = progress_for(FakeTTY(), quiet=False, nbytes=PROGRESS_MIN_BYTES - 1)
    assert isinstance(big, TerminalProgress) and big.always
    assert isinstance(small, TerminalProgress) and not small.always


def test_model_bytes(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(bytes(10))
    (tmp_path / "b.json").write_bytes(bytes(5))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c").write_bytes(bytes(100))
    assert model_bytes(tmp_path) == 15
    assert model_bytes(tmp_path / "a.bin") == 10
    assert model_bytes(tmp_path / "missing") == 0


def test_the_build_counts_scons_steps() -> None:
    from colibri.targets.build import _scons_counted

    tty = FakeTTY()
    script = (
        "import sys\n"
        "print('CC      [host] /b/obj/runtime/loader.o')\n"
        "sys.stderr.write('warning: x\\n' * 20000)\n"  # more than a pipe holds
        "print('scons: done')\n"
        "print('LINK    [host] /b/m/colibri_runner')\n"
    )
    proc = _scons_counted(
        [sys.executable, "-c", script], dict(os.environ), TerminalProgress(tty, redraw=0.0)
    )
    assert proc.returncode == 0 and proc.stderr.count("warning") == 20000
    assert "scons: done" in proc.stdout
    shown = lines(tty.getvalue())
    assert shown[0].startswith("build     step 2: LINK colibri_runner  ") and shown[1] == ""
    assert "step 1: CC loader.o" in tty.getvalue()


# -- the command line under a pseudo-terminal ------------------------------------------------


def run_colibri(args: list[str], tty: bool) -> tuple[int, bytes, bytes]:
    """`colibri ARGS` with stdout on a pipe and stderr on a pseudo-terminal (tty) or a pipe."""
    cmd = [sys.executable, "-m", "colibri", *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "codegen")}
    if not tty:
        p = subprocess.run(cmd, capture_output=True, env=env, timeout=120)
        return p.returncode, p.stdout, p.stderr
    master, slave = os.openpty()
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave, env=env) as proc:
        os.close(slave)
        err = b""
        while True:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the child closed the terminal (Linux: EIO)
                    chunk = b""
                if not chunk:
                    break
                err += chunk
            elif proc.poll() is not None:
                break
        assert proc.stdout is not None
        out = proc.stdout.read()
        proc.wait(timeout=120)
    os.close(master)
    return proc.returncode, out, err.replace(b"\r\n", b"\n")


def shown_lines(err: bytes) -> list[str]:
    return [line for line in lines(err.decode()) if line]


def check_quiet_cases(args: list[str], out_tty: bytes) -> None:
    """--quiet on a terminal, and no terminal: stderr empty, stdout the same bytes."""
    for quiet, tty in ((True, True), (False, False)):
        rc, out, err = run_colibri(args + (["--quiet"] if quiet else []), tty)
        assert rc == 0, err
        assert err == b"", (quiet, tty, err)
        assert out == out_tty


def test_generate_a_layer_shows_its_stages(tmp_path: Path) -> None:
    toy = tmp_path / "toy"
    rc, _, err = run_colibri(
        ["make-toy", "--out", str(toy), "--experts", "8", "--hidden", "192", "--ff", "384"]
        + ["--activation", "swiglu"],
        tty=False,
    )
    assert rc == 0, err
    assert model_bytes(toy / "model.clb") >= PROGRESS_MIN_BYTES
    args = ["generate", str(toy / "model.clb"), "--out", str(tmp_path / "gen"), "--quant", "int8"]
    rc, out, err = run_colibri(args, tty=True)
    assert rc == 0, err
    shown = shown_lines(err)
    assert [line.split()[0] for line in shown] == [
        "load",
        "quantise",
        "analyse",
        "plan",
        "emit",
        "write",
    ]
    assert shown[1].startswith("quantise  expert 8/8  [####################] 100 %  ")
    assert all(line.endswith(" s") for line in shown)
    redraws = err.decode().split("\n")[1].split("\r")
    counts = [int(d.split()[2].split("/")[0]) for d in redraws if d.startswith("quantise  expert")]
    assert counts == sorted(counts) and counts[-1] == 8
    assert out.startswith(b"generated ") and b"\r" not in out
    check_quiet_cases(args, out)


def mixtral_tensors(layers: int, d: int, f: int, experts: int, vocab: int) -> dict[str, Any]:
    """A seeded Mixtral checkpoint's tensors (4 heads of d / 4, 2 kv heads), numpy only."""
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
                f"{p}block_sparse_moe.gate.weight": (experts, d),
            }
        )
        for e in range(experts):
            for name, shape in (("w1", (f, d)), ("w3", (f, d)), ("w2", (d, f))):
                shapes[f"{p}block_sparse_moe.experts.{e}.{name}.weight"] = shape
    return {k: (0.1 * rng.standard_normal(s)).astype(np.float32) for k, s in shapes.items()}


def test_generate_a_transformer_counts_layers_and_experts(tmp_path: Path) -> None:
    ckpt = tmp_path / "mixtral"
    ckpt.mkdir()
    layers, experts = 3, 8
    config = {
        "architectures": ["MixtralForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 256,
        "num_local_experts": experts,
        "num_experts_per_tok": 2,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 128,
        "rms_norm_eps": 1e-5,
    }
    (ckpt / "config.json").write_text(json.dumps(config))
    write_safetensors(mixtral_tensors(layers, 64, 256, experts, 128), ckpt / "model.safetensors")
    assert model_bytes(ckpt) >= PROGRESS_MIN_BYTES
    args = ["generate", str(ckpt), "--out", str(tmp_path / "gen"), "--quant", "int8"]
    args += ["--max-context", "16"]
    rc, out, err = run_colibri(args, tty=True)
    assert rc == 0, err
    shown = shown_lines(err)
    assert [line.split()[0] for line in shown] == ["load", "quantise", "plan", "emit", "write"]
    assert shown[0].startswith("load      layer 3/3  [####################] 100 %  ")
    assert shown[1].startswith("quantise  layer 3/3  expert 8/8  [####################] 100 %  ")
    # redrawn at most every 0.1 s: the first count and the last are always drawn, the
    # percentages in between only grow
    draws = err.decode().split("\n")[1].split("\r")[1:]
    assert draws[0].startswith("quantise  layer 1/3  expert 1/8  ")
    percents = [int(d.split("]")[1].split("%")[0]) for d in draws]
    assert percents == sorted(percents) and percents[-1] == 100
    check_quiet_cases(args, out)


# -- calibration (issue 39: the calibrate stage drew nothing for a minute) ------------------------


class Recorder(Progress):
    """Every draw of every stage: (stage, done, total, detail, final)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, float, float | None, str, bool]] = []

    def draw(self, stage: Stage, final: bool, failed: bool = False) -> None:
        self.calls.append((stage.name, stage.done, stage.total, stage.detail, final))

    def of(self, name: str) -> list[tuple[str, float, float | None, str, bool]]:
        return [c for c in self.calls if c[0] == name]


def check_counts(calls: list[tuple[str, float, float | None, str, bool]]) -> None:
    """Counts only grow, and the stage ends with its total done."""
    done = [c[1] for c in calls]
    assert done == sorted(done), done
    *_, (_, last, total, _, final) = calls
    assert final and total and last == total


def test_calibrating_a_layer_reports_each_expert() -> None:
    from colibri.cli.pipeline import quantise
    from colibri.frontends.seed import make_toy
    from colibri.ir.model import as_model
    from colibri.options import GenerateOptions

    layer = make_toy(experts=6, hidden=16, ff=32, top_k=2, seed=4)
    x = np.random.default_rng(0).standard_normal((40, 16)).astype(np.float32)
    rec = Recorder()
    quantise(as_model(layer), GenerateOptions(quant="int8"), calib=x, progress=rec)
    calls = rec.of("calibrate")
    updates = [c for c in calls if not c[4]]
    assert len(updates) >= 2 * 6, calls  # every expert's batch statistics and its samples
    assert any(c[3].startswith("40 tokens  expert ") for c in updates), updates
    assert updates[-1][3] == "statistics  expert 6/6"
    check_counts(calls)


def test_calibrating_a_transformer_reports_batches_layers_and_experts(tmp_path: Path) -> None:
    from colibri.cli.pipeline import quantise_transformer
    from colibri.frontends.hf_model import load_transformer
    from colibri.options import GenerateOptions

    ckpt = tmp_path / "mixtral"
    ckpt.mkdir()
    layers, experts = 2, 4
    config = {
        "architectures": ["MixtralForCausalLM"],
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_local_experts": experts,
        "num_experts_per_tok": 2,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 64,
        "rms_norm_eps": 1e-5,
    }
    (ckpt / "config.json").write_text(json.dumps(config))
    write_safetensors(mixtral_tensors(layers, 16, 32, experts, 64), ckpt / "model.safetensors")
    model = load_transformer(ckpt)
    ids = np.random.default_rng(1).integers(0, 64, (3, 10))
    rec = Recorder()
    opts = GenerateOptions(quant="int8", max_context=16)
    quantise_transformer(model, opts, calib=ids, progress=rec)
    calls = rec.of("calibrate")
    details = [c[3] for c in calls if not c[4]]
    for b in (1, 2, 3):  # every batch (sequence) through every MoE layer
        for layer in (1, 2):
            assert any(d.startswith(f"batch {b}/3  layer {layer}/2  expert ") for d in details)
    for layer in (1, 2):  # then every stored expert's statistics
        assert f"statistics  layer {layer}/2  expert {experts}/{experts}" in details
    assert calls[-1][2] == 3 * 2 + 2 * experts
    check_counts(calls)


def test_calibrated_generate_and_convert_draw_every_stage(tmp_path: Path) -> None:
    """Issue 38: `generate --calib` draws a counting line for each stage it runs (calibrate,
    quantise, analyse, then plan / emit), and `convert --calib` (streamed) one line through
    every layer's calibrate and quantise parts: no stage runs without one."""
    from colibri.cli.pipeline import convert, render
    from colibri.frontends.hf_model import load_transformer
    from colibri.options import GenerateOptions

    ckpt = tmp_path / "mixtral"
    ckpt.mkdir()
    config = {
        "architectures": ["MixtralForCausalLM"],
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 64,
        "rms_norm_eps": 1e-5,
    }
    (ckpt / "config.json").write_text(json.dumps(config))
    write_safetensors(mixtral_tensors(2, 32, 64, 4, 64), ckpt / "model.safetensors")
    ids = np.random.default_rng(2).integers(0, 64, (2, 12))
    np.save(tmp_path / "ids.npy", ids)
    opts = GenerateOptions(quant="int4", max_context=16, calib=str(tmp_path / "ids.npy"))
    rec = Recorder()
    render(load_transformer(ckpt), opts, progress=rec)
    names = list(dict.fromkeys(c[0] for c in rec.calls))
    assert names == ["calibrate", "quantise", "analyse", "plan", "emit"], names
    for name in ("calibrate", "quantise", "analyse"):
        calls = rec.of(name)
        assert any(not c[4] for c in calls), (name, calls)  # counted while it runs
        check_counts(calls)
    assert rec.of("analyse")[-2][3] == "layer 2/2"
    # convert streams: one line whose count goes through each layer's calibration (the forward
    # over every sequence, then each expert's statistics) and quantisation
    rec = Recorder()
    convert(ckpt, tmp_path / "m.clb", opts, progress=rec)
    names = list(dict.fromkeys(c[0] for c in rec.calls))
    assert names == ["convert"], names
    calls = rec.of("convert")
    check_counts(calls)
    details = {c[3] for c in calls}
    for layer in (1, 2):
        assert f"layer {layer}/2  calibrate  batch 2/2" in details, details
        assert f"layer {layer}/2  calibrate  statistics  expert 4/4" in details, details
        assert f"layer {layer}/2  quantise  expert 4/4" in details, details
    # generate of the checkpoint's path streams as convert: one line through each layer's
    # read, calibrate, quantise and analyse parts, then plan, emit and write
    from colibri.cli.pipeline import generate

    rec = Recorder()
    generate(ckpt, tmp_path / "gen", opts, progress=rec)
    names = list(dict.fromkeys(c[0] for c in rec.calls))
    assert names == ["layers", "plan", "emit", "write"], names
    calls = rec.of("layers")
    check_counts(calls)
    assert any(not c[4] for c in calls)  # counted while it runs
    details = {c[3] for c in calls}
    for layer in (1, 2):
        for part in ("read", "calibrate  batch 2/2", "calibrate  statistics  expert 4/4"):
            assert f"layer {layer}/2  {part}" in details, details
        for part in ("quantise  expert 3/4", "analyse"):  # (expert 4/4: analyse's start)
            assert f"layer {layer}/2  {part}" in details, details
