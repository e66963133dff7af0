"""Command-line inputs are read exactly (issue 37): `--prompt-ids 1,,2` is not `1,2`, and
config.json fields are range-checked wherever a Hugging Face config is read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from colibri.cli.main import main
from colibri.errors import InputError
from colibri.frontends.hf import write_safetensors
from colibri.targets.lmrun import parse_ids
from hf_tiny import MIXTRAL_1LAYER_CONFIG, mixtral_tensors_1layer


@pytest.mark.parametrize(
    ("text", "want"),
    [("1,5,9", [1, 5, 9]), ("1, 5, 9", [1, 5, 9]), (" 7 ", [7]), ("1 5 9", [1, 5, 9])],
)
def test_prompt_ids_good(text: str, want: list[int]) -> None:
    assert parse_ids(text) == want


@pytest.mark.parametrize(
    ("text", "msg"),
    [
        ("1,,2", "item 2 is empty"),
        ("1,2,", "item 3 is empty"),
        (",1", "item 1 is empty"),
        ("1, ,2", "item 2 is empty"),
        ("1,x", "item 2 is 'x'"),
        ("1,2.5", "item 2 is '2.5'"),
        ("1_0", "item 1 is '1_0'"),
        ("0x10", "item 1 is '0x10'"),
        ("1 2,3", "item 1 is '1 2'"),
        ("", "--prompt-ids is empty"),
        ("  ", "--prompt-ids is empty"),
        ("١٢", "item 1 is"),
    ],
)
def test_prompt_ids_bad(text: str, msg: str) -> None:
    with pytest.raises(InputError, match=msg):
        parse_ids(text)


# -- config.json fields: range-checked at convert (and wherever an HF config is read) ---------


def _checkpoint(tmp_path: Path, **changes: Any) -> Path:
    config = dict(MIXTRAL_1LAYER_CONFIG)
    for key, value in changes.items():
        if value is _DROP:
            config.pop(key, None)
        else:
            config[key] = value
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir(exist_ok=True)
    (ckpt / "config.json").write_text(json.dumps(config))
    write_safetensors(mixtral_tensors_1layer(), ckpt / "model.safetensors")
    return ckpt


_DROP = object()

BAD_CONFIGS = [
    ({"rms_norm_eps": 0}, "rms_norm_eps", "0"),
    ({"rms_norm_eps": float("nan")}, "rms_norm_eps", "nan"),
    ({"rms_norm_eps": float("inf")}, "rms_norm_eps", "inf"),
    ({"rms_norm_eps": -1e-6}, "rms_norm_eps", "-1e-06"),
    ({"max_position_embeddings": -5}, "max_position_embeddings", "-5"),
    ({"max_position_embeddings": 0}, "max_position_embeddings", "0"),
    ({"max_position_embeddings": 1.5}, "max_position_embeddings", "1.5"),
    ({"rope_theta": float("nan")}, "rope_theta", "nan"),
    ({"rope_theta": float("inf")}, "rope_theta", "inf"),
    ({"num_attention_heads": 3}, "num_attention_heads", "3"),  # 8 % 3
    ({"num_attention_heads": 0}, "num_attention_heads", "0"),
    ({"num_key_value_heads": 3}, "num_key_value_heads", "3"),
    ({"num_key_value_heads": 0}, "num_key_value_heads", "0"),
    ({"head_dim": 0}, "head_dim", "0"),
    ({"head_dim": -4}, "head_dim", "-4"),
    ({"num_experts_per_tok": 3}, "num_experts_per_tok", "3"),
    ({"num_experts_per_tok": 0}, "num_experts_per_tok", "0"),
    ({"hidden_size": -8}, "hidden_size", "-8"),
    ({"vocab_size": 0}, "vocab_size", "0"),
    ({"clip_qkv": float("nan")}, "clip_qkv", "nan"),
    ({"clip_qkv": -1}, "clip_qkv", "-1"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings", "'false'"),
]


@pytest.mark.parametrize(("changes", "field", "value"), BAD_CONFIGS)
def test_convert_range_checks_config_fields(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict, field: str, value: str
) -> None:
    ckpt = _checkpoint(tmp_path, **changes)
    out = tmp_path / "m.clb"
    assert main(["convert", str(ckpt), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("colibri: error: ") and err.count("\n") == 1, err
    assert field in err and value in err, err
    assert not out.exists()


def test_convert_good_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ckpt = _checkpoint(tmp_path, max_position_embeddings=4096, rope_theta=1e6, head_dim=4)
    assert main(["convert", str(ckpt), "--out", str(tmp_path / "m.clb")]) == 0, capsys.readouterr()


def test_container_with_a_bad_config_is_not_config_json_missing(tmp_path: Path) -> None:
    """A .clb written from an unchecked config (rms_norm_eps 0, before convert checked it) is
    refused by the runtime with COLIBRI_ERR_CONFIG, whose C text says "config.json missing":
    the binding and the model-file runner's error say what is wrong instead."""
    import dataclasses
    from subprocess import CompletedProcess

    from colibri.emit.lmfile import write_lm_container
    from colibri.frontends.hf_model import load_hf_transformer
    from colibri.targets.binding import LM, RuntimeStatusError
    from colibri.targets.lmrun import EXIT_RUNTIME_ERROR, _runner_failure

    model = load_hf_transformer(_checkpoint(tmp_path))
    model.config = dataclasses.replace(model.config, rms_norm_eps=0.0)
    clb = write_lm_container(model, None, tmp_path / "m.clb", 16)
    with pytest.raises(RuntimeStatusError) as err:
        LM(clb)
    assert "config.json" not in str(err.value) and "model config stored in the file" in str(
        err.value
    )
    said = "colibri: colibri_lm_init failed: config.json missing, or a field missing or invalid"
    result = CompletedProcess([], EXIT_RUNTIME_ERROR + 7, said + "\n", "")
    failure = _runner_failure(result, clb, 0, 0)
    assert failure is not None and "config.json" not in str(failure)
    assert "rms_norm_eps" in str(failure)
