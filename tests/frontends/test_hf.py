"""Hugging Face checkpoints: safetensors reader, MoE blocks vs transformers' modules, errors."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from colibri.errors import ColibriError, ConfigError, ModelFormatError, ShapeError
from colibri.frontends.hf import HFCheckpoint, SafetensorsFile, load_hf_moe_layer, write_safetensors
from colibri.frontends.load import load_model
from colibri.reference.moe import compare, moe_forward
from conftest import require_board
from hf_tiny import make_model, require_torch, save_model

#: The MoE block (float64 reference) vs transformers' fp32 module, relative to max |y|:
#: measured ~1e-7 (fp32 rounding in the module); 1e-5 catches any wrong gate or expert.
HF_BLOCK_TOLERANCE = 1e-5

# (arch, config overrides) of the block tests: renormalisation on/off, k = 1 .. E, Qwen's
# dense layers (mlp_only_layers, decoder_sparse_step).
BLOCK_CASES: list[tuple[str, dict[str, Any]]] = [
    ("mixtral", {}),
    ("mixtral", {"num_local_experts": 8, "num_experts_per_tok": 3, "hidden_size": 24}),
    ("mixtral", {"num_local_experts": 3, "num_experts_per_tok": 3}),
    ("olmoe", {"norm_topk_prob": False}),
    ("olmoe", {"norm_topk_prob": True, "num_experts": 6, "num_experts_per_tok": 1}),
    ("qwen2_moe", {"norm_topk_prob": False}),
    ("qwen2_moe", {"norm_topk_prob": True, "num_hidden_layers": 3, "mlp_only_layers": [1]}),
    ("qwen2_moe", {"num_hidden_layers": 4, "decoder_sparse_step": 2}),
]


@pytest.fixture(autouse=True)
def _torch() -> None:
    require_torch()


def torch_block(model: Any, layer: int, x: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        y = model.model.layers[layer].mlp(torch.from_numpy(x)[None])[0]
    return np.asarray(y.numpy(), dtype=np.float64)


@pytest.mark.parametrize("case", range(len(BLOCK_CASES)))
def test_moe_block_matches_transformers(tmp_path: Path, case: int) -> None:
    arch, overrides = BLOCK_CASES[case]
    model = make_model(arch, seed=10 + case, **overrides)
    path = save_model(model, tmp_path / "ckpt")
    ckpt = HFCheckpoint(path)
    d = model.config.hidden_size
    x = np.random.default_rng(case).standard_normal((13, d)).astype(np.float32)
    checked = 0
    for i in range(model.config.num_hidden_layers):
        if not ckpt.is_moe_layer(i):
            with pytest.raises(ConfigError, match=f"layer {i} is a dense MLP"):
                load_hf_moe_layer(ckpt, i)
            continue
        layer = load_hf_moe_layer(ckpt, i)
        assert layer.config.gated and layer.config.top_k == model.config.num_experts_per_tok
        expect_norm = arch == "mixtral" or bool(model.config.norm_topk_prob)
        assert layer.config.norm_topk_prob == expect_norm
        assert (layer.shared_expert is not None) == (arch == "qwen2_moe")
        y, _ = moe_forward(layer, x)
        err = compare(torch_block(model, i, x), y, HF_BLOCK_TOLERANCE)
        assert err is None, f"{arch} layer {i}: {err}"
        checked += 1
    n_dense = len(overrides.get("mlp_only_layers", []))
    if "decoder_sparse_step" in overrides:
        n_dense = model.config.num_hidden_layers // 2
    assert checked == model.config.num_hidden_layers - n_dense


def test_sharded_checkpoint_reads_like_single_file(tmp_path: Path) -> None:
    model = make_model("mixtral", seed=3)
    single = save_model(model, tmp_path / "single")
    sharded = save_model(model, tmp_path / "sharded", max_shard_size="8KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("model-*.safetensors"))) > 2
    a, b = load_hf_moe_layer(single, 1), load_hf_moe_layer(sharded, 1)
    assert np.array_equal(a.router_w, b.router_w)
    for ea, eb in zip(a.experts, b.experts):
        assert ea.digest() == eb.digest()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_checkpoints(tmp_path: Path, dtype: str) -> None:
    import torch

    model = make_model("olmoe", seed=4).to(getattr(torch, dtype))
    path = save_model(model, tmp_path / dtype)
    layer = load_hf_moe_layer(path, 0)
    block = model.model.layers[0].mlp
    router = block.gate.weight.detach().float().numpy()
    assert np.array_equal(layer.router_w, router)  # fp16 / bf16 -> fp32 is exact
    gate_up = block.experts.gate_up_proj.detach().float().numpy()
    f = layer.config.d_ff
    assert np.array_equal(layer.experts[2].w1, gate_up[2, :f].T)
    assert np.array_equal(layer.experts[2].w3, gate_up[2, f:].T)
    down = block.experts.down_proj.detach().float().numpy()
    assert np.array_equal(layer.experts[3].w2, down[3].T)


def test_reader_agrees_with_safetensors_package(tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    rng = np.random.default_rng(0)
    tensors = {
        "a": rng.standard_normal((3, 5)).astype(np.float32),
        "b": rng.standard_normal((7,)).astype(np.float16),
        "c": rng.standard_normal((2, 2, 2)).astype(np.float64),
        "empty": np.zeros((0, 4), np.float32),
    }
    save_file(tensors, str(tmp_path / "t.safetensors"), metadata={"format": "np"})
    st = SafetensorsFile(tmp_path / "t.safetensors")
    ref = load_file(str(tmp_path / "t.safetensors"))
    for name, arr in ref.items():
        got = st.read(name)
        assert got.dtype == np.float32 and got.shape == arr.shape
        assert np.array_equal(got, arr.astype(np.float32)), name
    assert st.metadata == {"format": "np"}
    write_safetensors({"x": tensors["a"]}, tmp_path / "w.safetensors")
    assert np.array_equal(load_file(str(tmp_path / "w.safetensors"))["x"], tensors["a"])


# -- importer integration ----------------------------------------------------------------------


def test_load_model_detects_checkpoint_and_needs_layer(tmp_path: Path) -> None:
    path = save_model(make_model("qwen2_moe", seed=5, mlp_only_layers=[0]), tmp_path / "q")
    with pytest.raises(ConfigError, match=r"whole Qwen2MoeForCausalLM model.*--layer N.*\[1\]"):
        load_model(path)
    layer = load_model(path, layer=1)
    assert layer.shared_expert is not None and layer.shared_gate is not None
    with pytest.raises(ConfigError, match="out of range.*num_hidden_layers=2"):
        load_model(path, layer=2)


def test_layer_option_rejected_for_single_layer_formats(toy_dir: Path) -> None:
    with pytest.raises(ConfigError, match="--layer 0 applies only to Hugging Face"):
        load_model(toy_dir / "model.bin", layer=0)


def test_shared_expert_rejected_by_container(tmp_path: Path, cli: Any) -> None:
    """The generated C runs a shared expert (test_generated_c_runs_checkpoint_block); the
    container format cannot hold one."""
    path = save_model(make_model("qwen2_moe", seed=6), tmp_path / "q")
    r = cli("convert", str(path), "--layer", "0", "--out", str(tmp_path / "q.clb"), check=False)
    assert r.returncode == 1 and "container format" in r.stderr and "shared expert" in r.stderr
    assert "Traceback" not in r.stderr


def test_cli_reference_on_checkpoint(tmp_path: Path, cli: Any) -> None:
    model = make_model("qwen2_moe", seed=8)
    path = save_model(model, tmp_path / "q")
    x = np.random.default_rng(1).standard_normal((5, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    cli("reference", str(path), "--layer", "1", "--input", str(tmp_path / "x.npy"),
        "--output", str(tmp_path / "y.npy"))  # fmt: skip
    y = np.load(tmp_path / "y.npy")
    assert compare(torch_block(model, 1, x), y, HF_BLOCK_TOLERANCE) is None


@pytest.mark.parametrize("arch", ["mixtral", "olmoe", "qwen2_moe"])
def test_generated_c_runs_checkpoint_block(tmp_path: Path, cli: Any, arch: str) -> None:
    """colibri generate CHECKPOINT --layer N -> C on the host == transformers' block."""
    require_board("host")
    from colibri.cli.main import run_model

    model = make_model(arch, seed=9)
    path = save_model(model, tmp_path / arch)
    cli("generate", str(path), "--layer", "1", "--out", str(tmp_path / "gen"), "--name", "blk")
    x = np.random.default_rng(2).standard_normal((9, 16)).astype(np.float32)
    out, _ = run_model(tmp_path / "gen", "host", x)
    ref = torch_block(model, 1, x)
    assert compare(out.output, ref, HF_BLOCK_TOLERANCE) is None
    layer = load_hf_moe_layer(path, 1)
    assert np.array_equal(out.expert_ids, moe_forward(layer, x)[1].expert_ids)


# -- corrupt and unsupported inputs ------------------------------------------------------------


def _rewrite_header(path: Path, edit: Any) -> None:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    edit(header)
    new = json.dumps(header).encode()
    new += b" " * (-len(new) % 8)
    path.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n :])


@pytest.fixture
def mixtral_dir(tmp_path: Path) -> Path:
    return save_model(make_model("mixtral", seed=11), tmp_path / "mixtral")


def test_unsupported_architecture(mixtral_dir: Path) -> None:
    cfg = json.loads((mixtral_dir / "config.json").read_text())
    cfg["architectures"] = ["LlamaForCausalLM"]
    (mixtral_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="LlamaForCausalLM is not supported.*MixtralForCausalLM"):
        load_model(mixtral_dir, layer=0)


def test_unsupported_activation(mixtral_dir: Path) -> None:
    cfg = json.loads((mixtral_dir / "config.json").read_text())
    cfg["hidden_act"] = "gelu"
    (mixtral_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="hidden_act 'gelu' is not supported"):
        load_hf_moe_layer(mixtral_dir, 0)


def test_missing_tensor(mixtral_dir: Path) -> None:
    from safetensors.numpy import load_file, save_file

    name = "model.layers.1.block_sparse_moe.experts.2.w3.weight"
    path = mixtral_dir / "model.safetensors"
    tensors = load_file(str(path))
    del tensors[name]  # its bytes too: the data section has no holes (the package refuses them)
    save_file(tensors, str(path))
    load_hf_moe_layer(mixtral_dir, 0)
    with pytest.raises(ModelFormatError, match=f"tensor '{name}' is missing"):
        load_hf_moe_layer(mixtral_dir, 1)


def test_header_lies_about_shape(mixtral_dir: Path) -> None:
    name = "model.layers.0.block_sparse_moe.gate.weight"
    _rewrite_header(mixtral_dir / "model.safetensors", lambda h: h[name].update(shape=[4, 17]))
    with pytest.raises(ModelFormatError, match=f"'{name}'.*needs 272.*inconsistent"):
        HFCheckpoint(mixtral_dir)


def test_hole_in_data_section(mixtral_dir: Path) -> None:
    """A header entry dropped but its bytes left: the safetensors package refuses the hole,
    as a one-line ModelFormatError."""
    name = "model.layers.1.block_sparse_moe.experts.2.w3.weight"
    _rewrite_header(mixtral_dir / "model.safetensors", lambda h: h.pop(name))
    with pytest.raises(ModelFormatError, match="not a valid safetensors file.*invalid offset"):
        HFCheckpoint(mixtral_dir)


def test_bf16_is_read_through_the_raw_bits(tmp_path: Path) -> None:
    """numpy has no bfloat16: those tensors bypass the package's numpy reader."""
    values = np.array([[1.0, -2.5], [0.0078125, 2.0**100]], np.float32)
    bits = (values.view(np.uint32) >> 16).astype("<u2")
    header = {"w": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path = tmp_path / "bf16.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bits.tobytes())
    got = SafetensorsFile(path).read("w")
    assert got.dtype == np.float32 and np.array_equal(got, values)


def test_header_offsets_outside_file(mixtral_dir: Path) -> None:
    name = "model.norm.weight"

    def edit(h: dict[str, Any]) -> None:
        h[name]["data_offsets"] = [10**9, 10**9 + 64]

    _rewrite_header(mixtral_dir / "model.safetensors", edit)
    with pytest.raises(ModelFormatError, match=f"'{name}'.*outside the data section"):
        HFCheckpoint(mixtral_dir)


def test_truncated_and_garbage_files(mixtral_dir: Path) -> None:
    st = mixtral_dir / "model.safetensors"
    raw = st.read_bytes()
    st.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ModelFormatError, match="outside the data section"):
        HFCheckpoint(mixtral_dir)
    st.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(ModelFormatError, match="header length .* does not fit"):
        HFCheckpoint(mixtral_dir)
    st.write_bytes(struct.pack("<Q", 4) + b"{{{{")
    with pytest.raises(ModelFormatError, match="not valid JSON"):
        HFCheckpoint(mixtral_dir)
    st.write_bytes(b"abc")
    with pytest.raises(ModelFormatError, match="truncated"):
        HFCheckpoint(mixtral_dir)


def test_unsupported_dtype(mixtral_dir: Path) -> None:
    _rewrite_header(
        mixtral_dir / "model.safetensors", lambda h: h["model.norm.weight"].update(dtype="I8")
    )
    with pytest.raises(ModelFormatError, match="dtype 'I8' is not supported; supported: F32"):
        HFCheckpoint(mixtral_dir)


def test_missing_shard(tmp_path: Path) -> None:
    path = save_model(make_model("olmoe", seed=12), tmp_path / "o", max_shard_size="8KB")
    shards = sorted(path.glob("model-*.safetensors"))
    shards[1].unlink()
    with pytest.raises(ModelFormatError, match=f"{shards[1].name}: shard listed in .* missing"):
        load_model(path, layer=0)


def test_config_disagrees_with_tensors(mixtral_dir: Path) -> None:
    cfg = json.loads((mixtral_dir / "config.json").read_text())
    cfg["intermediate_size"] = 20
    (mixtral_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ShapeError, match=r"shape \[24, 16\], but config.json implies \[20, 16\]"):
        load_hf_moe_layer(mixtral_dir, 0)


def test_config_missing_field_and_bad_k(mixtral_dir: Path) -> None:
    cfg = json.loads((mixtral_dir / "config.json").read_text())
    (mixtral_dir / "config.json").write_text(json.dumps({**cfg, "num_experts_per_tok": 9}))
    with pytest.raises(ConfigError, match="num_experts_per_tok=9 is larger than"):
        load_hf_moe_layer(mixtral_dir, 0)
    del cfg["num_local_experts"]
    (mixtral_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="missing field 'num_local_experts'"):
        load_hf_moe_layer(mixtral_dir, 0)


def test_pickle_only_checkpoint_is_refused(mixtral_dir: Path) -> None:
    (mixtral_dir / "model.safetensors").rename(mixtral_dir / "pytorch_model.bin")
    with pytest.raises(ModelFormatError, match="pytorch_model.bin are pickle files"):
        load_model(mixtral_dir, layer=0)


def test_cli_prints_one_line_error(mixtral_dir: Path, cli: Any) -> None:
    r = cli("reference", str(mixtral_dir), "--input", "x.npy", "--output", "y.npy", check=False)
    assert r.returncode == 1
    assert r.stderr.startswith("colibri: error:") and "--layer N" in r.stderr
    assert issubclass(ConfigError, ColibriError)
