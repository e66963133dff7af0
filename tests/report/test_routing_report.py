"""`colibri generate --calib` writes the routing heat map (routing.html, routing.md) beside the
generated C and a summary in the manifest: hits per expert equal to the placement's calibration
hits (a lone layer) and the calibration statistics' (a transformer), the imbalance is max hits /
mean hits, the generated C is what it was without the report, and Chromium renders the page with
the figures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from colibri.cli.main import main
from colibri.cli.pipeline import generate, render
from colibri.emit.output import GENERATED_FILES
from colibri.frontends.hf_model import load_hf_transformer
from colibri.frontends.seed import make_toy, write_seed
from colibri.ir.moe import MoELayer
from colibri.options import GenerateOptions
from colibri.report.routing import MAX_TOKENS_SHOWN, ROUTING_HTML, ROUTING_MD, layer_routing
from conftest import dump_dom
from hf_tiny import make_model, require_torch, save_model


def _layer_and_calib() -> tuple[MoELayer, np.ndarray]:
    layer = make_toy(experts=8, hidden=32, ff=64, top_k=2, activation="gelu", seed=7)
    x = np.random.default_rng(3).standard_normal((300, 32)).astype(np.float32)
    return layer, x


def test_layer_calib_writes_heat_map_and_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    layer, x = _layer_and_calib()
    write_seed(layer, tmp_path / "toy")
    np.save(tmp_path / "calib.npy", x)
    out = tmp_path / "gen"
    rc = main(
        ["generate", str(tmp_path / "toy" / "model.bin"), "--out", str(out), "--quant", "int8",
         "--calib", str(tmp_path / "calib.npy"), "--name", "demo"]
    )  # fmt: skip
    stdout = capsys.readouterr().out
    assert rc == 0
    manifest = json.loads((out / "manifest.json").read_text())
    summary = manifest["routing"]
    assert summary["files"] == [ROUTING_HTML, ROUTING_MD]
    (lay,) = summary["layers"]
    hits = [e["calib_hits"] for e in manifest["experts"]]
    assert lay["hits"] == hits and lay["tokens"] == 300 and sum(hits) == 300 * 2
    mean = 300 * 2 / 8
    assert lay["mean_hits"] == mean and lay["imbalance"] == round(max(hits) / mean, 3)
    assert f"imbalance {max(hits) / mean:.2f} (max / mean)" in stdout
    assert "routing.html and routing.md" in stdout
    # the report files are beside the C, not among the generated (hashed) files
    assert set(manifest["files"]) == {*GENERATED_FILES["layer"], "colibri_weights.bin"}
    md = (out / ROUTING_MD).read_text()
    assert f"imbalance {max(hits) / mean:.2f}" in md
    for e, h in enumerate(hits):
        assert f"| {e} | {h} |" in md

    dom = dump_dom(out / ROUTING_HTML)
    text = " ".join(dom.split())
    assert f"imbalance {max(hits) / mean:.2f}" in text and "300 calibration tokens" in text
    for e, h in enumerate(hits):
        assert f'data-expert="{e}" data-hits="{h}"' in dom and f"expert {e}: {h} hits" in dom
    # experts x tokens: one cell per (token shown, slot)
    assert dom.count("<title>token ") == min(300, MAX_TOKENS_SHOWN) * 2


def test_report_leaves_the_c_unchanged(tmp_path: Path) -> None:
    """The routing files are the only files the report adds; the C is the emitted C."""
    layer, x = _layer_and_calib()
    opts = GenerateOptions(board="host", name="demo", quant="int8")
    files, manifest = render(layer, opts, x)
    assert set(files) - set(manifest["files"]) == {ROUTING_HTML, ROUTING_MD}
    _, plain = generate(layer, tmp_path / "plain", opts)
    assert "routing" not in plain and not (tmp_path / "plain" / ROUTING_HTML).exists()
    _, again = generate(layer, tmp_path / "cal", opts, calib=x)
    assert again["files"] == manifest["files"]
    for f in GENERATED_FILES["layer"]:
        assert (tmp_path / "cal" / f).read_text() == files[f]


def test_imbalance_of_a_skewed_router() -> None:
    """All tokens to the same expert: max hits = tokens, imbalance = n_experts / k."""
    layer, x = _layer_and_calib()
    layer.router_w[:] = 0
    layer.router_b = np.zeros(8, np.float32)
    layer.router_b[5] = 10.0
    heat = layer_routing(layer, x[:10])
    assert heat.hits[5] == 10 and heat.imbalance == pytest.approx(8 / 2) and heat.idle == 6


def test_transformer_calib_heat_per_moe_layer(tmp_path: Path) -> None:
    require_torch()
    model = load_hf_transformer(save_model(make_model("mixtral", 5), tmp_path / "ckpt"))
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, (4, 20))
    _, manifest = generate(
        model, tmp_path / "g", GenerateOptions(name="m", quant="int8", max_context=32), calib=ids
    )
    acc, routing = manifest["accuracy"], manifest["routing"]
    assert [lay["layer"] for lay in routing["layers"]] == [m["layer"] for m in acc["layers"]]
    for lay, m in zip(routing["layers"], acc["layers"]):
        assert lay["tokens"] == 80 and sum(lay["hits"]) == 80 * 2
        assert lay["hits"] == [e["hits"] for e in m["experts"]]
    page = (tmp_path / "g" / ROUTING_HTML).read_text()
    assert "Hits per layer and expert" in page
    assert all(f"Routing of layer {lay['layer']}" in page for lay in routing["layers"])
