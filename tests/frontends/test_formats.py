"""Importers and the container: round trips and every kind of bad input."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from colibri.emit.container import write_container
from colibri.errors import ColibriError, ConfigError, ModelFormatError, ShapeError
from colibri.frontends.container import read_container
from colibri.frontends.load import load_model
from colibri.frontends.seed import make_toy, write_seed
from colibri.ir.moe import Expert, MoELayer


def assert_same(a: MoELayer, b: MoELayer) -> None:
    assert a.config == b.config
    np.testing.assert_array_equal(a.router_w, b.router_w)
    for ea, eb in zip(a.experts, b.experts):
        for (na, xa), (nb, xb) in zip(ea.tensors(), eb.tensors()):
            assert na == nb
            np.testing.assert_array_equal(xa, xb)


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "silu", "relu"])
def test_seed_round_trip(tmp_path: Path, activation: str) -> None:
    layer = make_toy(experts=3, hidden=5, ff=7, top_k=2, activation=activation, seed=3)
    write_seed(layer, tmp_path)
    back = load_model(tmp_path / "model.bin")
    assert_same(layer, back)
    assert back.config.activation == activation


def test_seed_router_bias(tmp_path: Path) -> None:
    layer = make_toy(experts=4, hidden=6, ff=5, top_k=2, router_bias=True)
    write_seed(layer, tmp_path)
    back = load_model(tmp_path / "model.bin")
    assert back.router_b is not None
    np.testing.assert_array_equal(back.router_b, layer.router_b)


def test_directory_variant(tmp_path: Path) -> None:
    layer = make_toy(experts=3, hidden=4, ff=6, top_k=1)
    write_seed(layer, tmp_path / "flat")
    raw = (tmp_path / "flat" / "model.bin").read_bytes()[12:]
    per = (2 * 4 * 6 + 6 + 4) * 4
    d = tmp_path / "dir"
    d.mkdir()
    for i in range(3):
        (d / f"expert_{i}.bin").write_bytes(raw[i * per : (i + 1) * per])
    (d / "router.bin").write_bytes((tmp_path / "flat" / "router.bin").read_bytes())
    (d / "config.json").write_text((tmp_path / "flat" / "config.json").read_text())
    assert_same(layer, load_model(d))
    (d / "expert_2.bin").unlink()
    with pytest.raises(ModelFormatError, match=r"expert_2\.bin: missing"):
        load_model(d)


def test_npz(tmp_path: Path) -> None:
    layer = make_toy(experts=3, hidden=4, ff=6, top_k=2, activation="swiglu")
    np.savez(
        tmp_path / "m.npz",
        router_weight=layer.router_w,
        w1=np.stack([e.w1 for e in layer.experts]),
        w2=np.stack([e.w2 for e in layer.experts]),
        w3=np.stack([e.w3 for e in layer.experts if e.w3 is not None]),
        config=json.dumps(layer.config.to_json()),
    )
    back = load_model(tmp_path / "m.npz")
    assert back.config.gated
    assert_same(layer, back)


@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_container_round_trip(tmp_path: Path, activation: str) -> None:
    layer = make_toy(experts=5, hidden=12, ff=20, top_k=2, activation=activation, router_bias=True)
    p = write_container(layer, tmp_path / "m.clb")
    raw = p.read_bytes()
    assert raw[:8] == b"CLBRMOE\0"
    back = read_container(p)
    assert_same(layer, back)
    # every blob 64-byte aligned, experts contiguous and in order
    from colibri.frontends.container import read_table

    _, entries, meta = read_table(raw, "m.clb")
    assert all(e.offset % 64 == 0 for e in entries)
    experts = [e.expert for e in entries if e.expert != 0xFFFFFFFF]
    assert experts == sorted(experts)
    assert meta["config"]["n_experts"] == 5


def test_container_dedups_identical_experts(tmp_path: Path) -> None:
    base = make_toy(experts=2, hidden=8, ff=16, top_k=1, seed=1)
    experts = [base.experts[i % 2] for i in range(8)]
    cfg = base.config.__class__(**{**base.config.__dict__, "n_experts": 8})
    rw = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    layer = MoELayer(cfg, rw, None, [Expert(e.w1, e.w2, e.b1, e.b2) for e in experts])
    p = write_container(layer, tmp_path / "shared.clb")
    full = write_container(make_toy(experts=8, hidden=8, ff=16), tmp_path / "full.clb")
    back = read_container(p)
    assert back.storage_map() == [0, 1, 0, 1, 0, 1, 0, 1]
    expert_bytes = sum(e.nbytes for e in experts)
    assert p.stat().st_size < full.stat().st_size - 0.7 * expert_bytes
    assert_same(layer, back)


def test_container_rejects_corruption(tmp_path: Path) -> None:
    p = write_container(make_toy(experts=2, hidden=8, ff=16), tmp_path / "m.clb")
    raw = bytearray(p.read_bytes())
    bad = tmp_path / "bad.clb"
    bad.write_bytes(raw[: len(raw) - 10])
    with pytest.raises(ModelFormatError, match="truncated"):
        load_model(bad)
    flipped = bytearray(raw)
    flipped[-5] ^= 0xFF
    bad.write_bytes(bytes(flipped))
    with pytest.raises(ModelFormatError, match="CRC-32"):
        load_model(bad)
    v2 = bytearray(raw)
    v2[8:12] = struct.pack("<I", 7)
    bad.write_bytes(bytes(v2))
    with pytest.raises(ModelFormatError, match="version 7 is not supported"):
        load_model(bad)


# -- seed layout: bad input, one specific error each ---------------------------------------------


def _seed(tmp_path: Path, **kw: object) -> Path:
    write_seed(make_toy(**kw), tmp_path)  # type: ignore[arg-type]
    return tmp_path / "model.bin"


def test_wrong_magic(tmp_path: Path) -> None:
    p = _seed(tmp_path)
    raw = bytearray(p.read_bytes())
    raw[0:4] = b"\0\0\0\0"
    p.write_bytes(bytes(raw))
    with pytest.raises(ModelFormatError, match="unrecognised model file"):
        load_model(p)


def test_wrong_version(tmp_path: Path) -> None:
    p = _seed(tmp_path)
    raw = bytearray(p.read_bytes())
    raw[4:8] = struct.pack("<I", 2)
    p.write_bytes(bytes(raw))
    with pytest.raises(ModelFormatError, match="version 2 is not supported"):
        load_model(p)


def test_truncated(tmp_path: Path) -> None:
    p = _seed(tmp_path)
    p.write_bytes(p.read_bytes()[:-4])
    with pytest.raises(ModelFormatError, match="truncated"):
        load_model(p)
    p.write_bytes(p.read_bytes()[:2])
    with pytest.raises(ModelFormatError, match="truncated"):
        load_model(p)


def test_size_inconsistent_with_config(tmp_path: Path) -> None:
    p = _seed(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["intermediate_size"] = 8
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFormatError, match="inconsistent with the config"):
        load_model(p)


def test_expert_count_mismatch(tmp_path: Path) -> None:
    p = _seed(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["n_experts"] = 3
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFormatError, match="header says 2 experts"):
        load_model(p)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("k", 3, r"'k' = 3 is larger than 'n_experts' = 2"),
        ("k", 0, r"field 'k' must be >= 1"),
        ("k", -1, r"field 'k' must be >= 1"),
        ("activation", "tanh", r"unknown activation 'tanh'"),
        ("hidden_size", "8", r"field 'hidden_size' must be an integer"),
        ("norm_topk_prob", "yes", r"'norm_topk_prob' must be true or false"),
    ],
)
def test_bad_config_values(tmp_path: Path, field: str, value: object, message: str) -> None:
    p = _seed(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg[field] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=message) as info:
        load_model(p)
    assert "config.json" in str(info.value)


@pytest.mark.parametrize("field", ["n_experts", "k", "hidden_size", "intermediate_size"])
def test_missing_config_field(tmp_path: Path, field: str) -> None:
    p = _seed(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg[field]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=rf"config\.json: missing field '{field}'"):
        load_model(p)


def test_malformed_config(tmp_path: Path) -> None:
    p = _seed(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"config\.json: not valid JSON"):
        load_model(p)
    (tmp_path / "config.json").unlink()
    with pytest.raises(ConfigError, match="config file not found"):
        load_model(p)


def test_router_size_mismatch(tmp_path: Path) -> None:
    p = _seed(tmp_path)
    (tmp_path / "router.bin").write_bytes(b"\0" * 12)
    with pytest.raises(ModelFormatError, match=r"router\.bin: 12 bytes, expected 64"):
        load_model(p)


def test_nan_weights(tmp_path: Path) -> None:
    p = _seed(tmp_path)
    raw = bytearray(p.read_bytes())
    raw[12:16] = struct.pack("<f", float("nan"))
    p.write_bytes(bytes(raw))
    with pytest.raises(ModelFormatError, match=r"expert\.0\.w1' contains 1 NaN/Inf"):
        load_model(p)


def test_shape_mismatch_in_ir() -> None:
    layer = make_toy()
    layer.experts[1].w2 = layer.experts[1].w2[:, :3]
    with pytest.raises(ShapeError, match=r"expert\.1\.w2' has shape \(16, 3\), expected \(16, 8\)"):
        layer.validate()


def test_all_errors_are_colibri_errors() -> None:
    for cls in (ConfigError, ModelFormatError, ShapeError):
        assert issubclass(cls, ColibriError)
