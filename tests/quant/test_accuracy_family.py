"""benchmarks/accuracy_family.py: the parts that run without llama.cpp (the GGUF -> transformers
mapping and dequantisation on a tiny GGUF written with the gguf package, the tables, the goals,
the message when llama.cpp is absent)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import accuracy_family as fam  # noqa: E402


def test_rope_permutation_round_trips_and_pairs_the_halves() -> None:
    w = np.arange(16 * 3, dtype=np.float32).reshape(16, 3)
    p = fam.permute_rope(w, 2)
    assert np.array_equal(fam.unpermute_rope(p, 2), w)
    # head 0 holds rows 0..7: halves (0..3) and (4..7) interleave as 0, 4, 1, 5, ...
    assert p[:8, 0].tolist() == [0.0, 12.0, 3.0, 15.0, 6.0, 18.0, 9.0, 21.0]


def test_hf_tensors_names_every_mixtral_tensor() -> None:
    cfg = {"num_attention_heads": 4, "num_key_value_heads": 2}
    ex = np.zeros((3, 5, 4), np.float32)
    got = fam.hf_tensors("blk.1.ffn_down_exps.weight", ex, cfg)
    assert sorted(got) == [
        f"model.layers.1.block_sparse_moe.experts.{e}.w2.weight" for e in range(3)
    ]
    assert list(fam.hf_tensors("output.weight", ex[0], cfg)) == ["lm_head.weight"]
    assert list(fam.hf_tensors("blk.0.ffn_gate_inp.weight", ex[0], cfg)) == [
        "model.layers.0.block_sparse_moe.gate.weight"
    ]
    with pytest.raises(KeyError):
        fam.hf_tensors("rope_freqs.weight", ex[0], cfg)


def _gguf() -> Any:
    try:
        return fam.gguf_module(fam.DEFAULT_LLAMA)  # installed, or $COLIBRI_LLAMA_CPP/gguf-py
    except ImportError:
        pytest.skip("the gguf package is not installed (pip install gguf)")


def test_gguf_checkpoint_dequantises_a_tiny_gguf(tmp_path: Path) -> None:
    gguf = _gguf()
    from safetensors.numpy import load_file

    rng = np.random.default_rng(1)
    cfg = {"num_attention_heads": 2, "num_key_value_heads": 1}
    ref = tmp_path / "ref"
    ref.mkdir()
    (ref / "config.json").write_text(json.dumps(cfg))
    hf = {
        "model.embed_tokens.weight": rng.standard_normal((4, 32)).astype(np.float32),
        "model.layers.0.self_attn.q_proj.weight": rng.standard_normal((32, 32)).astype(np.float32),
        "model.layers.0.self_attn.k_proj.weight": rng.standard_normal((16, 32)).astype(np.float32),
    }
    experts = rng.standard_normal((2, 8, 32)).astype(np.float32)
    q8 = gguf.GGMLQuantizationType.Q8_0
    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("token_embd.weight", hf["model.embed_tokens.weight"])
    q = fam.permute_rope(hf["model.layers.0.self_attn.q_proj.weight"], 2)
    w.add_tensor("blk.0.attn_q.weight", gguf.quants.quantize(q, q8), raw_dtype=q8)
    k = fam.permute_rope(hf["model.layers.0.self_attn.k_proj.weight"], 1)
    w.add_tensor("blk.0.attn_k.weight", k)
    w.add_tensor("blk.0.ffn_gate_exps.weight", gguf.quants.quantize(experts, q8), raw_dtype=q8)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    info = fam.gguf_checkpoint(path, ref, tmp_path / "out", gguf)
    assert info["types"] == {"F32": 2, "Q8_0": 2}
    assert info["expert_bytes"] == 2 * 8 * 34  # 32 weights a Q8_0 block: 32 bytes + fp16 scale
    got = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert json.loads((tmp_path / "out" / "config.json").read_text()) == cfg
    for name in ("model.embed_tokens.weight", "model.layers.0.self_attn.k_proj.weight"):
        assert np.array_equal(got[name], hf[name])  # F32: exact
    qname = "model.layers.0.self_attn.q_proj.weight"
    want_q = fam.unpermute_rope(gguf.quants.dequantize(gguf.quants.quantize(q, q8), q8), 2)
    assert np.array_equal(got[qname], want_q)
    assert np.abs(got[qname] - hf[qname]).max() <= np.abs(hf[qname]).max() / 127
    for e in range(2):
        g = got[f"model.layers.0.block_sparse_moe.experts.{e}.w1.weight"]
        assert g.shape == (8, 32) and np.abs(g - experts[e]).max() <= np.abs(experts).max() / 127


def _row(kind: str, top1: float, kl: float, ratio: float = 1.0, bpw: float = 4.5) -> dict[str, Any]:
    return {"kind": kind, "top1": top1, "ppl_ratio": ratio, "kl": kl, "bpw": bpw, "expert_bpw": bpw}


def _results() -> list[dict[str, Any]]:
    info = {"corpus": "pydoc", "size": "small", "parameters": 10, "seed": 0, "steps": 5}
    a = {
        "int8+d8": dict(_row("colibri", 0.995, 0.001, 1.001, 8.5), flags="--quant int8"),
        "q4k": dict(_row("colibri", 0.95, 0.02), flags="--quant q4k"),
        "q4k+calib": dict(_row("colibri", 0.96, 0.01), flags="--quant q4k --calib"),
        "Q8_0": _row("llama", 0.994, 0.001, 1.0, 8.5),
        "Q4_K_M": _row("llama", 0.94, 0.03),
        "Q4_K_M+imatrix": _row("llama", 0.97, 0.009),
        "F32": {"kind": "llama", "roundtrip": "exact"},
    }
    b = {k: dict(v) for k, v in a.items()}
    b["q4k"].update(top1=0.90, kl=0.01)  # worse top-1, better KL than member a
    b["int8+d8"]["error"] = "does not fit"
    del b["int8+d8"]["top1"]
    return [
        {"member": "a", "rows": a, "info": info, "reference_ppl": 50.0, "windows": [8, 96]},
        {"member": "b", "rows": b, "info": info, "reference_ppl": 40.0, "windows": [8, 96]},
    ]


def test_worst_rows_take_each_figure_from_the_worst_member() -> None:
    worst = fam.worst_rows(_results())
    assert worst["q4k"]["top1"] == 0.90 and worst["q4k"]["top1_member"] == "b"
    assert worst["q4k"]["kl"] == 0.02 and worst["q4k"]["kl_member"] == "a"
    assert worst["int8+d8"]["top1_member"] == "a"  # b's row has an error, no figures
    assert "F32" not in worst


def test_report_tables_and_goals() -> None:
    text = fam.report(_results())
    assert "| --quant q4k | 90.00 % (b) | 1.0000 (a) | 0.02000 (a) | 4.50 | 4.50 |" in text
    assert "| llama.cpp Q4_K_M+imatrix | 97.00 % |" in text
    assert "| --quant int8 | n/a: does not fit |" in text
    lines = fam.goals(_results())
    assert lines[0].startswith("a: int8+d8 top-1 99.50 % vs Q8_0 99.40 %") and lines[0].endswith(
        ": met"
    )
    assert lines[1].endswith("MISSED")  # q4k+calib top-1 below Q4_K_M+imatrix
    assert lines[2].endswith("met")  # q4k vs Q4_K_M without imatrix (no q4k+d8 rows)
    assert lines[3].endswith("n/a")  # member b's int8+d8 row could not be measured


def test_missing_llama_cpp_says_how_to_get_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert fam.llama_bindir(None, None) is None
    assert "cmake --build build --target llama-quantize llama-imatrix" in capsys.readouterr().err
    (tmp_path / "convert_hf_to_gguf.py").write_text("")
    assert fam.llama_bindir(tmp_path, None) is None
    err = capsys.readouterr().err
    assert "lacks llama-quantize, llama-imatrix" in err and "--no-llama" in err
