"""`colibri verify` checks a container's metadata JSON against its header (issue 37): every
field present in both must agree, else the file is reported corrupt (it said ok)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from colibri.cli.main import main
from colibri.emit.container import write_container
from colibri.emit.lmfile import write_lm_container
from colibri.frontends.hf import write_safetensors
from colibri.frontends.hf_model import load_hf_transformer
from colibri.frontends.seed import make_toy
from hf_tiny import MIXTRAL_1LAYER_CONFIG, mixtral_tensors_1layer


def _patch(path: Path, old: bytes, new: bytes) -> None:
    """Replace `old` by `new` (the same length) in the file's metadata JSON."""
    assert len(old) == len(new)
    data = path.read_bytes()
    assert data.count(old) == 1, old
    path.write_bytes(data.replace(old, new))


def _verify(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(["verify", str(path)])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.fixture
def v1(tmp_path: Path) -> Path:
    return write_container(make_toy(experts=4, top_k=2, hidden=8, ff=16), tmp_path / "m.clb")


@pytest.fixture
def v2(tmp_path: Path) -> Path:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(MIXTRAL_1LAYER_CONFIG))
    write_safetensors(mixtral_tensors_1layer(), ckpt / "model.safetensors")
    return write_lm_container(load_hf_transformer(ckpt), None, tmp_path / "lm.clb", 16)


def test_good_files_verify(v1: Path, v2: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for p in (v1, v2):
        rc, out, err = _verify(p, capsys)
        assert rc == 0 and out.splitlines()[-1] == "ok", (out, err)
        assert "metadata agrees with the header" in out


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        (b'"k": 2', b'"k": 3', "k"),
        (b'"n_experts": 4', b'"n_experts": 5', "n_experts"),
        (b'"hidden_size": 8', b'"hidden_size": 9', "hidden_size"),
        (b'"intermediate_size": 16', b'"intermediate_size": 17', "intermediate_size"),
        (b'"activation": "gelu"', b'"activation": "relu"', "activation"),
        (b'"norm_topk_prob": false', b'"norm_topk_prob": 0    ', "norm_topk_prob"),
    ],
)
def test_v1_metadata_contradicting_the_header(
    v1: Path, capsys: pytest.CaptureFixture[str], old: bytes, new: bytes, field: str
) -> None:
    _patch(v1, old, new)
    rc, out, err = _verify(v1, capsys)
    assert rc == 1 and "ok" not in out.splitlines()[-1:], out
    assert err.startswith("colibri: error: ") and err.count("\n") == 1, err
    assert f"config.{field}" in err and "contradicts the header" in err, err


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        (b'"n_layers": 1', b'"n_layers": 2', "n_layers"),
        (b'"vocab_size": 16', b'"vocab_size": 17', "vocab_size"),
        (b'"d_model": 8', b'"d_model": 9', "d_model"),
        (b'"n_heads": 2', b'"n_heads": 4', "n_heads"),
        (b'"n_kv_heads": 1', b'"n_kv_heads": 2', "n_kv_heads"),
        (b'"head_dim": 4', b'"head_dim": 2', "head_dim"),
        (b'"rms_norm_eps": 1e-05', b'"rms_norm_eps": 2e-05', "rms_norm_eps"),
        (b'"tie_word_embeddings": false', b'"tie_word_embeddings": true ', "tie_word_embeddings"),
        (b'"qk_norm": false', b'"qk_norm": true ', "qk_norm"),
        (b'"clip_qkv": null', b'"clip_qkv": 8.0 ', "clip_qkv"),
        (b'"sliding_window": null', b'"sliding_window": 4096', "sliding_window"),
        (b'"dense_scheme": "fp32"', b'"dense_scheme": "int8"', "dense_scheme"),
    ],
)
def test_v2_metadata_contradicting_the_header(
    v2: Path, capsys: pytest.CaptureFixture[str], old: bytes, new: bytes, field: str
) -> None:
    _patch(v2, old, new)
    rc, out, err = _verify(v2, capsys)
    assert rc == 1, out
    assert err.startswith("colibri: error: ") and err.count("\n") == 1, err
    assert field in err and "contradicts the header" in err, err
