"""`colibri export`: PyTorch state_dicts and HF checkpoints -> Colibri container, checked."""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from colibri.cli.export import export
from colibri.errors import ConfigError, ModelFormatError, ShapeError
from colibri.frontends.container import read_container
from colibri.frontends.export import EXPORT_TOLERANCE
from colibri.frontends.hf import load_hf_moe_layer
from colibri.reference.moe import compare, moe_forward
from hf_tiny import make_model, require_torch, save_model


@pytest.fixture(autouse=True)
def _torch() -> None:
    require_torch()


def _max_diff(stdout: str) -> float:
    m = re.search(r"max \|diff\| (\S+) \(max \|y\| (\S+),", stdout)
    assert m, stdout
    assert float(m.group(1)) <= EXPORT_TOLERANCE * float(m.group(2))
    return float(m.group(1))


def _same_layers(a: Any, b: Any) -> None:
    assert a.config == b.config
    assert np.array_equal(a.router_w, b.router_w)
    for ea, eb in zip(a.experts, b.experts):
        assert ea.digest() == eb.digest()


@pytest.mark.parametrize("arch", ["mixtral", "olmoe"])
def test_export_block_state_dict(tmp_path: Path, cli: Any, arch: str) -> None:
    import torch

    model = (
        make_model(arch, seed=31, norm_topk_prob=True)
        if arch == "olmoe"
        else make_model(arch, seed=31)
    )
    ckpt = save_model(model, tmp_path / "ckpt")
    torch.save(model.model.layers[1].mlp.state_dict(), tmp_path / "block.pt")
    r = cli("export", str(tmp_path / "block.pt"), "--config", str(ckpt / "config.json"),
            "--out", str(tmp_path / "block.clb"))  # fmt: skip
    _max_diff(r.stdout)
    exported = read_container(tmp_path / "block.clb")
    _same_layers(exported, load_hf_moe_layer(ckpt, 1))
    x = np.random.default_rng(0).standard_normal((6, 16)).astype(np.float32)
    with torch.no_grad():
        y_torch = model.model.layers[1].mlp(torch.from_numpy(x)[None])[0].numpy()
    assert compare(y_torch, moe_forward(exported, x)[0], EXPORT_TOLERANCE) is None


def test_export_of_zero_experts_says_the_check_was_vacuous(tmp_path: Path, cli: Any) -> None:
    """Issue 39: a block whose experts are all zero gives zeros in PyTorch and in the reference;
    equal zeros verify nothing, so export must not print OK (it warns, and keeps the file)."""
    import torch

    model = make_model("mixtral", seed=37)
    ckpt = save_model(model, tmp_path / "ckpt")
    state = {
        k: torch.zeros_like(v) if k.startswith("experts.") else v
        for k, v in model.model.layers[0].mlp.state_dict().items()
    }
    assert any(k.startswith("experts.") for k in state)
    torch.save(state, tmp_path / "zero.pt")
    r = cli("export", str(tmp_path / "zero.pt"), "--config", str(ckpt / "config.json"),
            "--out", str(tmp_path / "zero.clb"))  # fmt: skip
    assert "OK" not in r.stdout, r.stdout
    assert "VACUOUS" in r.stdout and "every expert's weights are zero" in r.stdout
    assert r.stderr.startswith("colibri: warning: ") and "nothing was verified" in r.stderr
    assert (tmp_path / "zero.clb").is_file()


def test_export_checkpoint_layer(tmp_path: Path, cli: Any) -> None:
    ckpt = save_model(make_model("mixtral", seed=32), tmp_path / "m", max_shard_size="8KB")
    r = cli("export", str(ckpt), "--layer", "0", "--out", str(tmp_path / "l0.clb"),
            "--check-tokens", "20")  # fmt: skip
    assert "(20 tokens)" in r.stdout
    _max_diff(r.stdout)
    _same_layers(read_container(tmp_path / "l0.clb"), load_hf_moe_layer(ckpt, 0))


def test_export_prefixed_checkpoint_layout_state_dict(tmp_path: Path) -> None:
    """A state_dict with per-expert checkpoint names under a model prefix (Mixtral w1/w2/w3)."""
    import torch
    from safetensors.torch import load_file

    ckpt = save_model(make_model("mixtral", seed=33), tmp_path / "m")
    tensors = load_file(str(ckpt / "model.safetensors"))
    prefix = "model.layers.1.block_sparse_moe."
    sd = {k: v for k, v in tensors.items() if k.startswith(prefix)}
    assert f"{prefix}experts.0.w1.weight" in sd
    torch.save(sd, tmp_path / "sd.pt")
    res = export(tmp_path / "sd.pt", tmp_path / "o.clb", config=ckpt / "config.json")
    assert res.max_abs_diff <= EXPORT_TOLERANCE * res.max_abs_output
    _same_layers(read_container(res.path), load_hf_moe_layer(ckpt, 1))


def test_export_bf16_state_dict(tmp_path: Path) -> None:
    import torch

    model = make_model("olmoe", seed=34)
    ckpt = save_model(model, tmp_path / "o")
    block = model.model.layers[0].mlp.to(torch.bfloat16)
    torch.save(block.state_dict(), tmp_path / "bf16.pt")
    res = export(tmp_path / "bf16.pt", tmp_path / "o.clb", config=ckpt / "config.json")
    assert np.array_equal(res.layer.router_w, block.gate.weight.float().detach().numpy())
    assert res.max_abs_diff <= EXPORT_TOLERANCE * res.max_abs_output


# -- errors ------------------------------------------------------------------------------------


@pytest.fixture
def olmoe(tmp_path: Path) -> tuple[Any, Path]:
    model = make_model("olmoe", seed=35)
    return model, save_model(model, tmp_path / "ckpt")


def test_export_needs_config_or_exports_whole(
    tmp_path: Path, olmoe: tuple[Any, Path], cli: Any
) -> None:
    """A state_dict needs --config; a checkpoint without --layer is exported whole (container
    version 2), checked by the C runtime on the written file against the numpy reference."""
    import torch

    model, ckpt = olmoe
    torch.save(model.model.layers[0].mlp.state_dict(), tmp_path / "b.pt")
    r = cli("export", str(tmp_path / "b.pt"), "--out", str(tmp_path / "x.clb"), check=False)
    assert r.returncode == 1 and "pass --config" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "x.clb").exists()
    r = cli("export", str(ckpt), "--out", str(tmp_path / "x.clb"))
    assert "whole model, 2 layers" in r.stdout and "OK" in r.stdout
    assert (tmp_path / "x.clb").read_bytes()[8:12] == b"\x02\0\0\0"


def test_export_shared_expert_not_in_container(tmp_path: Path) -> None:
    ckpt = save_model(make_model("qwen2_moe", seed=36), tmp_path / "q")
    with pytest.raises(ConfigError, match="shared expert.*container format"):
        export(ckpt, tmp_path / "q.clb", layer_index=0)


def test_export_refuses_unsafe_and_odd_pickles(tmp_path: Path, olmoe: tuple[Any, Path]) -> None:
    import torch

    _, ckpt = olmoe
    cfg = ckpt / "config.json"

    class Evil:
        def __reduce__(self) -> tuple[Any, ...]:
            return (print, ("pwned",))

    (tmp_path / "evil.pt").write_bytes(pickle.dumps({"gate.weight": Evil()}, protocol=2))
    with pytest.raises(ModelFormatError, match="weights_only=True"):
        export(tmp_path / "evil.pt", tmp_path / "e.clb", config=cfg)
    torch.save({"gate.weight": 3}, tmp_path / "int.pt")
    with pytest.raises(ModelFormatError, match="'gate.weight' is int, not a tensor"):
        export(tmp_path / "int.pt", tmp_path / "e.clb", config=cfg)
    torch.save([torch.zeros(2)], tmp_path / "list.pt")
    with pytest.raises(ModelFormatError, match="expected a non-empty dict of tensors"):
        export(tmp_path / "list.pt", tmp_path / "e.clb", config=cfg)


def test_export_missing_and_misshaped_tensors(tmp_path: Path, olmoe: tuple[Any, Path]) -> None:
    import torch

    model, ckpt = olmoe
    sd = dict(model.model.layers[0].mlp.state_dict())
    cfg = ckpt / "config.json"
    torch.save({k: v for k, v in sd.items() if k != "experts.down_proj"}, tmp_path / "m.pt")
    with pytest.raises(ModelFormatError, match="tensor 'experts.down_proj' is missing"):
        export(tmp_path / "m.pt", tmp_path / "e.clb", config=cfg)
    torch.save({**sd, "gate.weight": torch.zeros(5, 16)}, tmp_path / "s.pt")
    with pytest.raises(ShapeError, match=r"'gate.weight' has shape \[5, 16\].*implies \[4, 16\]"):
        export(tmp_path / "s.pt", tmp_path / "e.clb", config=cfg)
    assert not (tmp_path / "e.clb").exists()
