"""Issue 9's one code path: an MoE block is emitted by `colibri.emit.model.emit_block` whether it
is a lone layer (`--layer L` of a checkpoint) or layer L of the whole decoder, from the same
quantised experts and router, and lands in the weights blob as the same bytes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from colibri.cli import pipeline
from colibri.emit import model as emit_model
from colibri.frontends.hf import write_safetensors
from colibri.options import GenerateOptions
from hf_tiny import MIXTRAL_1LAYER_CONFIG, mixtral_tensors_1layer


def _checkpoint(tmp_path: Path) -> Path:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(MIXTRAL_1LAYER_CONFIG))
    write_safetensors(mixtral_tensors_1layer(), ckpt / "model.safetensors")
    return ckpt


def _blocks(
    monkeypatch: pytest.MonkeyPatch, model: Any, options: GenerateOptions
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The emit_block calls of one render: (arguments, the block it returned), and the files."""
    calls: list[dict[str, Any]] = []
    real = emit_model.emit_block

    def spy(w: Any, m: Any, key: str, sym: str, qexperts: Any, qrouter: Any, *a: Any, **kw: Any):
        block = real(w, m, key, sym, qexperts, qrouter, *a, **kw)
        n = len(w.name) + 1  # the keys: symbols without the model name
        entries = {e["symbol"][n:]: e for e in w.blob_entries}
        calls.append({"key": key, "qexperts": qexperts, "block": block, "w": w, "entries": entries})
        return block

    with monkeypatch.context() as mp:
        mp.setattr(emit_model, "emit_block", spy)
        files, _ = pipeline.render(model, options)
    return calls, files


def _bytes(call: dict[str, Any], key: str) -> bytes:
    e = call["entries"][key]
    return call["w"].blob().tobytes()[e["offset"] : e["offset"] + e["size"]]


@pytest.mark.parametrize("quant", ["fp32", "int8", "int4"])
def test_a_block_is_one_code_path_in_both_kinds(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, quant: str
) -> None:
    ckpt = _checkpoint(tmp_path)
    extra = {} if quant == "fp32" else {"quant": quant}
    whole = pipeline.load(ckpt)
    lone = pipeline.load(ckpt, layer=0)
    assert whole.kind == "transformer" and lone.kind == "layer"
    wcalls, wfiles = _blocks(monkeypatch, whole, GenerateOptions(board="host", **extra))
    lcalls, lfiles = _blocks(monkeypatch, lone, GenerateOptions(board="host", **extra))
    assert len(wcalls) == 1 and len(lcalls) == 1  # one block each, through the one function
    wc, lc = wcalls[0], lcalls[0]
    assert (wc["key"], lc["key"]) == ("l0_", "")
    wb, lb = wc["block"], lc["block"]
    assert wb["storage"] == lb["storage"]
    assert wb["router"]["scheme"] == lb["router"]["scheme"] == "fp32"
    assert _bytes(wc, "l0_router_w") == _bytes(lc, "router_w")
    strip = ("index", "scheme", "act", "nbytes")
    assert [{k: s[k] for k in strip} for s in wb["stored"]] == [
        {k: s[k] for k in strip} for s in lb["stored"]
    ]
    # every stored tensor of every expert: the same bytes in both weights blobs
    for s in wb["stored"]:
        j = s["index"]
        wparts = sorted(n for n in wc["entries"] if n.startswith(f"l0_e{j}_"))
        lparts = sorted(n for n in lc["entries"] if n.startswith(f"e{j}_"))
        assert [n[len("l0_") :] for n in wparts] == lparts and lparts
        for wn, ln in zip(wparts, lparts):
            assert _bytes(wc, wn) == _bytes(lc, ln), (quant, wn)
    # and each block's wrappers call the generated kernel of its kind in both files
    for s in wb["stored"]:
        assert s["ffn"] in wfiles["transformer_model.c"]
    for s in lb["stored"]:
        assert s["ffn"] in lfiles["colibri_model.c"]
