"""Generated C is formatted as the hand-written C is (issue 36): every generated .c / .h of a
representative family — every weight scheme (fp32, fp16, int8, int4, mixed) and activation
mode, every expert activation, cache policies, calibrated placements (speed / compact kernels),
a shared expert, quantised routers, lone layers and whole transformers (Mixtral, Qwen2-MoE with
a dense layer, OLMoE), on each kind of board whose code differs (host, Cortex-M4 / M55 layouts,
Cortex-A, ESP32-S3) — is unchanged by `clang-format --dry-run --Werror` with the repository's
.clang-format, and no line is longer than its column limit. Generation only, nothing is
compiled (the golden and HIL tests do that)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from colibri.cli import pipeline
from colibri.emit.cformat import MAX_NAME
from colibri.emit.output import as_binary
from colibri.frontends.hf import write_safetensors
from colibri.frontends.seed import make_toy
from colibri.options import GenerateOptions
from conftest import ROOT, require_tool

#: Boards whose generated code differs: x86, the Cortex-M4 / M7 layouts (r4p, q4r4, c8), the
#: Cortex-M55's (r4, q4h4, c8 fp32), a Cortex-A and the ESP32-S3 (portable kernels, PSRAM arena).
BOARDS = ("host", "cortex-m4", "cortex-m55", "cortex-a53", "esp32s3")
#: (quant, expert_quant, act) of the lone-layer cases: every scheme, both activation modes of
#: the integer ones, and a mixed layer (one expert in each scheme).
SCHEMES: tuple[tuple[str, str | None, str | None], ...] = (
    ("fp32", None, None),
    ("fp16", None, None),
    ("int8", None, None),
    ("int8", None, "fp32"),
    ("int4", None, None),
    ("int4", None, "fp32"),
    ("int8", "0=fp32,1=fp16,2=int4", None),
)
ACTIVATIONS = ("gelu", "gelu_tanh", "silu", "relu", "swiglu")
COLUMN_LIMIT = 100
#: Model names (--name) of the whole family: the default, and one of 10 characters.
NAMES = ("model", "mixtral_l3")
#: Names of other lengths up to the longest --name (MAX_NAME; the generated names and macros grow
#: with it), each over a subset of the family that still renders every template: every board,
#: both kinds of model, each scheme and each dense scheme once (tests/emit: issue 36).
LONG_NAMES = ("m", "moe_block_16char", "a_model_name_of_31_characters_x", "x" * MAX_NAME)


def _write_text(out: Path, files: dict[str, Any]) -> list[Path]:
    """The generated C sources of one case written into `out` (not the weights blob)."""
    out.mkdir(parents=True)
    written = []
    for fname, content in sorted(files.items()):
        if fname.endswith((".c", ".h")):
            path = out / fname
            data = as_binary(content)
            assert isinstance(data, bytes)
            path.write_bytes(data)
            written.append(path)
    return written


def _qwen2_checkpoint(out: Path) -> Path:
    """A 2-layer Qwen2-MoE checkpoint written without torch: layer 0 an MoE block with a gated
    shared expert, layer 1 a dense MLP (mlp_only_layers), q/k/v biases."""
    d, f_moe, f_shared, f_dense, n_exp, vocab, hq, hkv = 32, 64, 40, 48, 4, 40, 32, 16
    config = {
        "architectures": ["Qwen2MoeForCausalLM"],
        "hidden_size": d,
        "intermediate_size": f_dense,
        "moe_intermediate_size": f_moe,
        "shared_expert_intermediate_size": f_shared,
        "num_experts": n_exp,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 2,
        "mlp_only_layers": [1],
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-6,
    }
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab, d),
        "model.norm.weight": (d,),
        "lm_head.weight": (vocab, d),
    }

    def ffn(prefix: str, f: int) -> None:
        shapes.update(
            {
                f"{prefix}gate_proj.weight": (f, d),
                f"{prefix}up_proj.weight": (f, d),
                f"{prefix}down_proj.weight": (d, f),
            }
        )

    for i in range(2):
        p = f"model.layers.{i}."
        shapes.update(
            {
                f"{p}input_layernorm.weight": (d,),
                f"{p}post_attention_layernorm.weight": (d,),
                f"{p}self_attn.q_proj.weight": (hq, d),
                f"{p}self_attn.q_proj.bias": (hq,),
                f"{p}self_attn.k_proj.weight": (hkv, d),
                f"{p}self_attn.k_proj.bias": (hkv,),
                f"{p}self_attn.v_proj.weight": (hkv, d),
                f"{p}self_attn.v_proj.bias": (hkv,),
                f"{p}self_attn.o_proj.weight": (d, hq),
            }
        )
    p = "model.layers.0.mlp."
    shapes[f"{p}gate.weight"] = (n_exp, d)
    shapes[f"{p}shared_expert_gate.weight"] = (1, d)
    for e in range(n_exp):
        ffn(f"{p}experts.{e}.", f_moe)
    ffn(f"{p}shared_expert.", f_shared)
    ffn("model.layers.1.mlp.", f_dense)
    return _checkpoint(out, config, shapes)


def _olmoe_checkpoint(out: Path) -> Path:
    """A 1-layer OLMoE checkpoint (QK-norm, clip_qkv, attention biases, tied embeddings)."""
    d, f, n_exp, vocab, hq = 32, 32, 4, 24, 32
    config = {
        "architectures": ["OlmoeForCausalLM"],
        "hidden_size": d,
        "intermediate_size": f,
        "num_experts": n_exp,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "attention_bias": True,
        "clip_qkv": 0.8,
        "tie_word_embeddings": True,
        "vocab_size": vocab,
    }
    p = "model.layers.0."
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab, d),
        "model.norm.weight": (d,),
        f"{p}input_layernorm.weight": (d,),
        f"{p}post_attention_layernorm.weight": (d,),
        f"{p}mlp.gate.weight": (n_exp, d),
    }
    for n, (o, i) in {"q": (hq, d), "k": (hq, d), "v": (hq, d), "o": (d, hq)}.items():
        shapes[f"{p}self_attn.{n}_proj.weight"] = (o, i)
        shapes[f"{p}self_attn.{n}_proj.bias"] = (o,)
    shapes[f"{p}self_attn.q_norm.weight"] = (hq,)
    shapes[f"{p}self_attn.k_norm.weight"] = (hq,)
    for e in range(n_exp):
        for n, s in (("gate_proj", (f, d)), ("up_proj", (f, d)), ("down_proj", (d, f))):
            shapes[f"{p}mlp.experts.{e}.{n}.weight"] = s
    return _checkpoint(out, config, shapes)


def _checkpoint(out: Path, config: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> Path:
    """config.json + model.safetensors of seeded small random tensors (norms near 1)."""
    out.mkdir(parents=True)
    rng = np.random.default_rng(36)
    tensors = {}
    for name, shape in sorted(shapes.items()):
        t = 0.1 * rng.standard_normal(shape)
        tensors[name] = (t + 1.0 if "norm" in name else t).astype(np.float32)
    (out / "config.json").write_text(json.dumps(config))
    write_safetensors(tensors, out / "model.safetensors")
    return out


def _layer_cases(
    name: str | None = None, subset: bool = False
) -> Iterator[tuple[str, Any, GenerateOptions, np.ndarray | None]]:
    """(case name, model, options, calibration tokens) of the lone-layer family, every model
    called `name` when given (else NAMES in turn, and the default); `subset`: each scheme on
    one or two boards, one cache / placement case per scheme."""
    for b, board in enumerate(BOARDS):
        for s, (quant, expert_quant, act) in enumerate(SCHEMES):
            if subset and s % len(BOARDS) != b:
                continue
            activation = ACTIVATIONS[(b + s) % len(ACTIVATIONS)]
            model = make_toy(4, 32, 64, 2, activation, seed=s)
            opts = GenerateOptions(
                board=board,
                name=name or NAMES[s % 2],
                quant=quant,
                expert_quant=expert_quant,
                act=act,
                scale_search="none",
            )
            what = f"{board}-{quant}{'-mixed' if expert_quant else ''}-{act or 'dflt'}-{activation}"
            what += f"-{opts.name}"
            yield what, model, opts, None
    relu = make_toy(4, 32, 64, 2, "relu", seed=7)
    shared = make_toy(24, 32, 64, 2, "gelu", seed=9)  # experts 1..22 share expert 0's weights
    shared.experts[1:23] = [shared.experts[0]] * 22
    named = {"name": name} if name else {}
    opts = GenerateOptions(quant="int8", scale_search="none", **named)
    yield "host-int8-sharing", shared, opts, None
    swiglu = make_toy(4, 32, 64, 2, "swiglu", seed=8)
    calib = np.random.default_rng(0).standard_normal((16, 32)).astype(np.float32)
    for board in ("host", "cortex-m4"):
        for q, quant in enumerate(("fp32", "int8", "int4")):
            for a, (model, act) in enumerate(((relu, "relu"), (swiglu, "swiglu"))):
                if subset and (q + a) % 2 != (board == "host"):
                    continue
                base = GenerateOptions(board=board, quant=quant, scale_search="none", **named)
                yield (
                    f"{board}-{quant}-{act}-lru",
                    model,
                    _with(base, cache="lru", cache_slots=2),
                    None,
                )
                yield f"{board}-{quant}-{act}-placed", model, _with(base, ram_budget=9000), calib
        yield (
            f"{board}-router",
            relu,
            GenerateOptions(board=board, quant="int8", router_quant="int8", **named),
            None,
        )
    # experts in the ESP32-S3's PSRAM (weights.c's clb_psram_push block)
    psram = GenerateOptions(board="esp32s3", quant="int8", scale_search="none", **named)
    yield "esp32s3-int8-psram", relu, _with(psram, ram_budget=9000, psram_budget=60000), calib


def _with(opts: GenerateOptions, **kw: Any) -> GenerateOptions:
    return GenerateOptions(**{**opts.__dict__, **kw})


def generate_family(out: Path, name: str | None = None, subset: bool = False) -> list[Path]:
    """Every generated .c / .h of the family, written under `out` (one directory per case):
    every model called `name` when given; `subset`: the part of it that renders every template
    (every board, each scheme and each transformer configuration once)."""
    named = {"name": name} if name else {}
    files: list[Path] = []
    for what, model, opts, calib in _layer_cases(name, subset):
        rendered, _ = pipeline.render(model, opts, calib)
        files += _write_text(out / what, rendered)
    qwen = pipeline.load(_qwen2_checkpoint(out / "ckpt-qwen2"))
    olmoe = pipeline.load(_olmoe_checkpoint(out / "ckpt-olmoe"))
    shared = pipeline.load(out / "ckpt-qwen2", layer=0)  # a lone layer with a shared expert
    for board in ("host", "cortex-m4"):
        rendered, _ = pipeline.render(shared, GenerateOptions(board=board, **named))
        files += _write_text(out / f"{board}-shared-expert", rendered)
    lm_cases = (
        ("fp32", "fp32", None),
        ("int8", "int8", None),
        ("int8", "int8", "fp32"),
        ("int4", "fp16", None),
        ("fp16", "fp32", None),
        ("int4", "int4", None),  # 4- / 5-bit dense matrices (issue 41 item 5)
        ("int4", "int4", "fp32"),
        ("q5k", "q4k", None),
    )
    for b, board in enumerate(BOARDS):
        for c, (quant, dense, act) in enumerate(lm_cases):
            if subset and c != b:
                continue
            for arch, model in (("qwen2", qwen), ("olmoe", olmoe)):
                opts = GenerateOptions(
                    board=board,
                    max_context=8,
                    quant=quant,
                    dense_quant=dense,
                    act=act,
                    scale_search="none",
                    **named,
                )
                rendered, _ = pipeline.render(model, opts)
                what = f"{board}-{arch}-{quant}-{dense}-{act or 'dflt'}"
                files += _write_text(out / what, rendered)
    return files


def clang_format_changes(clang_format: str, files: list[Path]) -> list[str]:
    """The lines of `files` clang-format would change (with the repository's .clang-format),
    as "path:line: the line", in order."""
    proc = subprocess.run(
        [clang_format, f"--style=file:{ROOT / '.clang-format'}", "--dry-run", *map(str, files)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    found: dict[tuple[str, int], str] = {}
    lines = proc.stderr.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"(.+):(\d+):\d+: warning: code should be clang-formatted", line)
        if m:
            found.setdefault((m[1], int(m[2])), lines[i + 1] if i + 1 < len(lines) else "")
    return [f"{path}:{n}: {text}" for (path, n), text in found.items()]


def long_lines(files: list[Path]) -> list[str]:
    """Lines longer than the column limit, as path:line: length."""
    out = []
    for path in files:
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            if len(line) > COLUMN_LIMIT:
                out.append(f"{path}:{n}: {len(line)} columns")
    return out


def test_generated_c_is_clang_format_clean(tmp_path: Path) -> None:
    clang_format = require_tool("clang-format", "clang-format")
    bad = tmp_path / "bad.c"  # the check itself sees a misformatted line
    bad.write_text("static int  f(void){return 1;}\n")
    assert [c.split(": ", 1)[0] for c in clang_format_changes(clang_format, [bad])] == [f"{bad}:1"]
    files = generate_family(tmp_path / "family")
    assert len(files) > 200
    changes = clang_format_changes(clang_format, files)
    assert not changes, f"{len(changes)} lines clang-format would change:\n" + "\n".join(
        changes[:40]
    )
    assert not long_lines(files)


@pytest.mark.parametrize("name", LONG_NAMES, ids=lambda n: f"{len(n)}chars")
def test_any_name_length_is_clang_format_clean(tmp_path: Path, name: str) -> None:
    """Names of 1, 16, 31 and MAX_NAME characters over the family's subset: the lines whose
    breaks depend on the name go through emit/cformat.py's helpers."""
    clang_format = require_tool("clang-format", "clang-format")
    assert len(name) in (1, 16, 31, MAX_NAME)
    files = generate_family(tmp_path / "family", name, subset=True)
    assert len(files) > 60
    assert all(name in p.read_text() for p in files if p.name.endswith("_model.h"))
    changes = clang_format_changes(clang_format, files)
    assert not changes, f"{len(changes)} lines clang-format would change:\n" + "\n".join(
        changes[:40]
    )
    assert not long_lines(files)


if __name__ == "__main__":  # the figures of issue 36: lines to reformat, longest line (--name N)
    import sys
    import tempfile

    name = sys.argv[sys.argv.index("--name") + 1] if "--name" in sys.argv else None
    with tempfile.TemporaryDirectory() as tmp:
        found = generate_family(Path(tmp) / "family", name)
        changes = clang_format_changes(shutil.which("clang-format") or "clang-format", found)
        longest = max(
            (len(line), str(p.relative_to(tmp)))
            for p in found
            for line in p.read_text().splitlines()
        )
        print(f"{len(found)} files, {len(changes)} lines to reformat, longest line {longest}")
        if "-v" in sys.argv:
            print("\n".join(changes))
