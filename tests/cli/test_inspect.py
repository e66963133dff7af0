"""`colibri inspect`: dims, parameter counts, bytes per scheme and the board table of every
input format, checked against numbers computed here from the arrays / the transformers model
and against what `colibri generate` actually writes (manifest memory) or refuses (budget)."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import numpy as np
import pytest
from colibri.frontends.load import load_model
from colibri.quant.formats import SCHEMES
from conftest import run_cli


def inspect_json(*args: str) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(run_cli("inspect", *args, "--json").stdout)
    return report


def generated(model: Path, out: Path, *args: str) -> dict[str, Any]:
    """`colibri generate MODEL ARGS` into `out`; its manifest's memory section."""
    run_cli("generate", str(model), "--out", str(out), "--force", *args)
    memory: dict[str, Any] = json.loads((out / "manifest.json").read_text())["memory"]
    return memory


def assert_clean_error(proc: CompletedProcess[str], pattern: str) -> None:
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("colibri: error: "), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert re.search(pattern, proc.stderr), proc.stderr


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 experts, d_model 64, d_ff 128, k 2: fp32 does not fit cortex-m3's flash, int8 does."""
    out = tmp_path_factory.mktemp("inspect") / "toy"
    run_cli(
        "make-toy", "--out", str(out), "--experts", "8", "--hidden", "64", "--ff", "128",
        "--top-k", "2", "--router-bias",
    )  # fmt: skip
    return out / "model.bin"


def layer_numbers(path: Path) -> dict[str, int]:
    """Parameter counts computed from the arrays."""
    layer = load_model(path)
    per_expert = [sum(a.size for _, a in e.tensors()) for e in layer.experts]
    router = layer.router_w.size + (0 if layer.router_b is None else layer.router_b.size)
    return {
        "total": int(router + sum(per_expert)),
        "routed_experts": int(sum(per_expert)),
        "active_per_token": int(router + layer.config.top_k * per_expert[0]),
    }


def test_seed_toy_against_generate(toy: Path, tmp_path: Path) -> None:
    rep = inspect_json(str(toy))
    assert rep["format"] == "seed layout" and rep["architecture"] == "single MoE layer"
    d = rep["dims"]
    assert (d["d_model"], d["d_ff"], d["experts"], d["top_k"], d["activation"]) == (
        64, 128, 8, 2, "gelu",
    )  # fmt: skip
    assert rep["parameters"] == layer_numbers(toy)
    assert rep["dtypes"] == {"float32": 2 + 8 * 4}  # router w + b, w1 b1 w2 b2 per expert
    assert rep["budget_at"] == {"max_tokens": 32}
    for scheme in ("fp32", "int8", "q4k"):  # q4k: one stream of super-blocks across rows
        mem = generated(toy, tmp_path / scheme, "--quant", scheme)
        assert rep["schemes"][scheme]["weight_bytes"] == mem["weight_bytes"]
        assert rep["schemes"][scheme]["arena_bytes"] == mem["arena_size"]
    # the board table against generate --board: refused with a budget error, or generated
    boards = rep["boards"]
    assert boards["host"] == dict.fromkeys(SCHEMES, "fits")
    assert boards["cortex-m3"]["fp32"] == "flash over"
    assert boards["cortex-m3"]["int8"] == "fits"
    for board, scheme in (("cortex-m3", "fp32"), ("cortex-m3", "int8"), ("host", "fp32")):
        proc = run_cli(
            "generate", str(toy), "--board", board, "--quant", scheme,
            "--out", str(tmp_path / f"{board}-{scheme}"), check=False,
        )  # fmt: skip
        if boards[board][scheme] == "fits":
            assert proc.returncode == 0, proc.stderr
        else:
            assert proc.returncode == 1 and "does not fit board" in proc.stderr
            assert "flash: needs" in proc.stderr and "RAM: needs" not in proc.stderr
    # RAM over: a chunk of 512 tokens does not fit the 64 KB of cortex-m3
    big = inspect_json(str(toy), "--max-tokens", "512")
    assert big["boards"]["cortex-m3"]["int8"] == "RAM over"
    assert big["boards"]["cortex-m3"]["fp32"] == "flash+RAM over"
    proc = run_cli(
        "generate", str(toy), "--board", "cortex-m3", "--quant", "int8", "--max-tokens", "512",
        "--out", str(tmp_path / "big"), check=False,
    )  # fmt: skip
    assert (
        proc.returncode == 1 and "RAM: needs" in proc.stderr and "flash: needs" not in proc.stderr
    )
    # the text report says the same
    text = run_cli("inspect", str(toy)).stdout
    assert "architecture: single MoE layer" in text
    assert "dims: d_model 64, d_ff 128, 8 experts, top-k 2, gelu" in text
    assert re.search(rf"^  fp32\s+{rep['schemes']['fp32']['weight_bytes']}\s", text, re.M)
    m3_row = r"^  cortex-m3\s+flash over\s+flash over\s+fits\s+fits\s+fits\s+fits$"  # + q4k, q5k
    assert re.search(m3_row, text, re.M)


def test_container_and_npz(toy: Path, tmp_path: Path) -> None:
    clb = tmp_path / "toy.clb"
    run_cli("convert", str(toy), "--out", str(clb))
    layer = load_model(toy)
    npz = tmp_path / "toy.npz"
    np.savez(
        npz,
        router_weight=layer.router_w,
        router_bias=layer.router_b,
        w1=np.stack([e.w1 for e in layer.experts]).astype(np.float16),
        w2=np.stack([e.w2 for e in layer.experts]),
        config=np.array(json.dumps(layer.config.to_json())),
    )
    seed = inspect_json(str(toy))
    rep = inspect_json(str(clb))
    assert rep["format"] == "Colibri container"
    assert rep["dtypes"] == {"float32": 2 + 8 * 4}
    for key in ("dims", "parameters", "schemes", "boards"):
        assert rep[key] == seed[key], key
    rep = inspect_json(str(npz))
    assert rep["format"] == "numpy .npz"
    assert rep["dtypes"] == {"float32": 3, "float16": 1}  # as stored, before the conversion
    assert rep["parameters"] == layer_numbers(npz)
    assert rep["dims"]["expert_bias"] is False
    mem = generated(npz, tmp_path / "gen-npz", "--quant", "int8")
    assert rep["schemes"]["int8"]["weight_bytes"] == mem["weight_bytes"]


@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe"])
def test_hf_checkpoint(arch: str, tmp_path: Path) -> None:
    from hf_tiny import make_model, require_torch, save_model

    require_torch()
    extra = {"mlp_only_layers": [0]} if arch == "qwen2_moe" else {}
    model = make_model(arch, **extra)
    ckpt = save_model(model, tmp_path / arch)
    cfg = model.config
    rep = inspect_json(str(ckpt))
    assert rep["format"] == "Hugging Face checkpoint"
    assert rep["architecture"] == cfg.architectures[0]
    d = rep["dims"]
    n_exp = cfg.num_local_experts if arch == "mixtral" else cfg.num_experts
    d_ff = cfg.intermediate_size if arch == "mixtral" else cfg.moe_intermediate_size
    assert (d["layers"], d["d_model"], d["heads"], d["kv_heads"], d["vocab"]) == (
        cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads,
        cfg.num_key_value_heads, cfg.vocab_size,
    )  # fmt: skip
    assert d["head_dim"] == cfg.hidden_size // cfg.num_attention_heads
    assert (d["experts"], d["d_ff"], d["top_k"], d["activation"]) == (
        n_exp, d_ff, cfg.num_experts_per_tok, "swiglu",
    )  # fmt: skip
    if arch == "qwen2_moe":
        assert d["shared_experts"] == {"layers": 1, "d_ff": cfg.shared_expert_intermediate_size}
        assert d["dense_layers"] == {"layers": [0], "d_ff": cfg.intermediate_size}
        assert d["moe_layers"] == [1]
    else:
        assert d["shared_experts"] is None and d["dense_layers"] is None
    # parameters, from transformers' own model
    params = dict(model.named_parameters())
    total = sum(p.numel() for p in params.values())
    routed = sum(
        p.numel() for n, p in params.items() if ".experts." in n and "shared_expert" not in n
    )
    per_expert = routed // (n_exp * len(d["moe_layers"]))
    active = total - routed + len(d["moe_layers"]) * cfg.num_experts_per_tok * per_expert
    assert rep["parameters"] == {
        "total": total,
        "routed_experts": routed,
        "active_per_token": active,
    }
    from safetensors import safe_open

    names = []
    for shard in ckpt.glob("*.safetensors"):
        with safe_open(str(shard), "np") as st:
            names += list(st.keys())
    assert rep["dtypes"] == {"float32": len(names)}
    # bytes and arena against generate
    for scheme, dense in (("fp32", "fp32"), ("int8", "fp32"), ("int4", "int8")):
        label = scheme if dense == "fp32" else f"{scheme}+dense-int8"
        mem = generated(
            ckpt, tmp_path / label, "--quant", scheme, "--dense-quant", dense, "--board", "host"
        )
        assert rep["schemes"][label]["weight_bytes"] == mem["weight_bytes"], label
        assert rep["schemes"][label]["arena_bytes"] == mem["arena_size"], label
    assert set(rep["boards"]["cortex-m3"].values()) == {"fits"}
    # a KV cache of 4096 positions does not fit cortex-m3's RAM; generate refuses it too
    big = inspect_json(str(ckpt), "--max-context", "4096")
    assert big["budget_at"] == {"max_context": 4096}
    assert big["boards"]["cortex-m3"]["int8"] == "RAM over"
    assert big["boards"]["host"]["int8"] == "fits"
    proc = run_cli(
        "generate", str(ckpt), "--board", "cortex-m3", "--quant", "int8", "--max-context",
        "4096", "--out", str(tmp_path / "big"), check=False,
    )  # fmt: skip
    assert proc.returncode == 1 and "RAM: needs" in proc.stderr


@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe"])
def test_whole_model_container(arch: str, tmp_path: Path) -> None:
    """Issue 39: `inspect lm.clb` (a whole-model container, version 2) describes it like the
    checkpoint it came from: the same dims and parameters, the stored schemes, the weight bytes
    and arena `generate` with the same flags gives, and the boards it fits."""
    from hf_tiny import make_model, require_torch, save_model

    require_torch()
    extra = {"mlp_only_layers": [0]} if arch == "qwen2_moe" else {}
    ckpt = save_model(make_model(arch, **extra), tmp_path / arch)
    hf = inspect_json(str(ckpt), "--max-context", "32")
    flags = ("--quant", "int8", "--dense-quant", "int8", "--max-context", "32")
    clb = tmp_path / "lm.clb"
    run_cli("convert", str(ckpt), "--out", str(clb), *flags)
    rep = inspect_json(str(clb))
    assert rep["format"].startswith("Colibri container (version 2, whole model")
    assert rep["architecture"] == hf["architecture"]
    assert rep["dims"] == hf["dims"]
    assert rep["parameters"] == hf["parameters"]
    assert rep["budget_at"] == {"max_context": 32}
    assert rep["file"]["file_bytes"] == clb.stat().st_size
    assert rep["file"]["schemes"]["experts"] == "int8"
    assert rep["file"]["schemes"]["dense"] == "int8"
    assert "host" in rep["file"]["runs_on"] and "cortex-m4" not in rep["file"]["runs_on"]
    assert set(rep["dtypes"]) == {"float32", "int8", "int32"}
    mem = generated(ckpt, tmp_path / "gen", *flags, "--board", "host")
    assert rep["schemes"] == {
        "int8+dense-int8": {
            "quant": "int8",
            "dense_quant": "int8",
            "weight_bytes": mem["weight_bytes"],
            "arena_bytes": mem["arena_size"],
        }
    }
    assert rep["boards"] == {
        b: {"int8+dense-int8": v["int8+dense-int8"]} for b, v in hf["boards"].items()
    }
    text = run_cli("inspect", str(clb)).stdout
    assert "routed experts int8" in text and "runs as a model file" in text
    proc = run_cli("inspect", str(clb), "--max-context", "8", check=False)
    assert_clean_error(proc, "carries its own config and --max-context")


def test_hf_reads_headers_only(tmp_path: Path) -> None:
    """A checkpoint whose data section is garbage (NaN everywhere) still inspects: only the
    headers are read. A header that lies is a one-line error."""
    from colibri.frontends.hf import write_safetensors

    d, f, e, v = 8, 12, 4, 16
    cfg = {
        "architectures": ["MixtralForCausalLM"],
        "hidden_size": d,
        "intermediate_size": f,
        "num_local_experts": e,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "vocab_size": v,
    }
    shapes = {
        "model.embed_tokens.weight": (v, d),
        "lm_head.weight": (v, d),
        "model.norm.weight": (d,),
        "model.layers.0.input_layernorm.weight": (d,),
        "model.layers.0.post_attention_layernorm.weight": (d,),
        "model.layers.0.self_attn.q_proj.weight": (d, d),
        "model.layers.0.self_attn.k_proj.weight": (d // 2, d),
        "model.layers.0.self_attn.v_proj.weight": (d // 2, d),
        "model.layers.0.self_attn.o_proj.weight": (d, d),
        "model.layers.0.block_sparse_moe.gate.weight": (e, d),
    }
    for j in range(e):
        for n, s in (("w1", (f, d)), ("w3", (f, d)), ("w2", (d, f))):
            shapes[f"model.layers.0.block_sparse_moe.experts.{j}.{n}.weight"] = s
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(cfg))
    write_safetensors({k: np.full(s, np.nan, np.float32) for k, s in shapes.items()},
                      ckpt / "model.safetensors")  # fmt: skip
    rep = inspect_json(str(ckpt))
    assert rep["parameters"]["total"] == sum(int(np.prod(s)) for s in shapes.values())
    assert rep["parameters"]["routed_experts"] == e * 3 * d * f
    proc = run_cli("inspect", str(ckpt), "--config", str(ckpt / "config.json"), check=False)
    assert_clean_error(proc, "--config applies to single-layer models")
    # a tensor missing, then a header whose shape disagrees with config.json
    del shapes["model.layers.0.self_attn.o_proj.weight"]
    write_safetensors({k: np.zeros(s, np.float32) for k, s in shapes.items()},
                      ckpt / "model.safetensors")  # fmt: skip
    assert_clean_error(run_cli("inspect", str(ckpt), check=False), r"o_proj.weight' is missing")
    shapes["model.layers.0.self_attn.o_proj.weight"] = (d, d + 1)
    write_safetensors({k: np.zeros(s, np.float32) for k, s in shapes.items()},
                      ckpt / "model.safetensors")  # fmt: skip
    assert_clean_error(run_cli("inspect", str(ckpt), check=False), r"has shape \[8, 9\]")


def test_bad_input_is_one_line(toy: Path, tmp_path: Path) -> None:
    assert_clean_error(
        run_cli("inspect", str(tmp_path / "nope.bin"), check=False), "no such file or directory"
    )
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x00\x01\x02\x03garbage" * 8)
    assert_clean_error(run_cli("inspect", str(junk), check=False), "unrecognised model file")
    clb = tmp_path / "toy.clb"
    run_cli("convert", str(toy), "--out", str(clb))
    data = bytearray(clb.read_bytes())
    data[-5] ^= 0xFF  # a weight byte: the tensor's CRC-32 no longer matches
    clb.write_bytes(bytes(data))
    assert_clean_error(run_cli("inspect", str(clb), check=False), "CRC-32")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"architectures": ["MixtralForCausalLM"]}))
    (ckpt / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40))
    assert_clean_error(run_cli("inspect", str(ckpt), check=False), "header length")
    assert_clean_error(
        run_cli("inspect", str(toy), "--max-context", "8", check=False), "--max-context applies"
    )
    proc = run_cli("inspect", str(toy), "--max-tokens", "0", check=False)
    assert proc.returncode == 2 and "--max-tokens" in proc.stderr
