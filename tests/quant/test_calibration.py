"""Calibration that uses routing (issue 15, point 3): statistics from the tokens the router
sends to each expert only, the activation-aware fold exact in float64, calibrated experts
closer to fp32 on their calibration tokens, experts never hit as without calibration, the
per-expert accuracy report, and `colibri generate CKPT --quant int4 --calib ids.npy` end to end
with clear errors for bad calibration input."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from colibri.cli.main import main
from colibri.cli.pipeline import generate
from colibri.errors import ConfigError, InputError
from colibri.frontends.hf_model import load_hf_transformer
from colibri.frontends.seed import make_toy
from colibri.ir.moe import MoELayer
from colibri.options import GenerateOptions
from colibri.quant.calib import (
    ExpertCalib,
    LayerCalib,
    fold_expert,
    fold_scales,
    output_error,
    quantize_expert_calibrated,
)
from colibri.quant.formats import divide_rows, quantize_expert, quantize_matrix
from colibri.quant.model import quantize_moe_layer, quantize_transformer
from colibri.reference.accuracy import accuracy_report, format_accuracy
from colibri.reference.calibration import (
    MAX_EXPERT_ROWS,
    check_calib_ids,
    expert_runner,
    layer_calibration,
    load_calib_ids,
    split_sequences,
    transformer_calibration,
)
from colibri.reference.moe import activation, ffn, route
from colibri.reference.transformer import forward
from hf_tiny import ARCHS, make_model, require_torch, save_model


def _gated_layer(seed: int = 0, n_experts: int = 4, d: int = 64, f: int = 128) -> MoELayer:
    """A SwiGLU layer whose experts have a few hidden channels carrying large activations (the
    case activation-aware scaling is for): w1 / w3 columns of 4 channels scaled up 6x."""
    layer = make_toy(n_experts, d, f, 2, "swiglu", seed=seed)
    rng = np.random.default_rng(seed)
    for ex in layer.experts:
        hot = rng.choice(f, 4, replace=False)
        assert ex.w3 is not None
        ex.w1[:, hot] *= 6.0
        ex.w3[:, hot] *= 6.0
    return layer


def _x(n: int, d: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)


# -- statistics ----------------------------------------------------------------------------------


def test_statistics_come_from_routed_tokens_only() -> None:
    """Hand-checked: a router that sends a token to the expert named by its largest of the
    first three coordinates (k = 1); expert 3 is never chosen."""
    layer = make_toy(4, 4, 6, 1, "swiglu", seed=2)
    layer.router_w = np.array(
        [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [-1, -1, -1, 0]], np.float32
    )
    x = np.array(
        [
            [3, 0, 0, 1],  # -> 0
            [0, 2, 1, -1],  # -> 1
            [4, 1, 0, 2],  # -> 0
            [0, 0, 5, 0.5],  # -> 2
            [1, 2.5, 0, -3],  # -> 1
            [2, 0, 1, 0],  # -> 0
        ],
        np.float32,
    )
    routed = {0: [0, 2, 5], 1: [1, 4], 2: [3], 3: []}
    lc = layer_calibration(layer, x)
    assert lc.tokens == 6
    for e, rows in routed.items():
        st = lc.experts[e]
        assert st.hits == len(rows)
        if not rows:
            assert st.rows.shape == (0, 4) and not st.x2.any() and not st.h2.any()
            continue
        xe = x[rows].astype(np.float64)
        ex = layer.experts[e]
        assert ex.w3 is not None
        g = xe @ ex.w1.astype(np.float64)
        h = g / (1 + np.exp(-g)) * (xe @ ex.w3.astype(np.float64))
        np.testing.assert_allclose(st.x2, np.mean(xe**2, axis=0), rtol=1e-12)
        np.testing.assert_allclose(st.h2, np.mean(h**2, axis=0), rtol=1e-10)
        np.testing.assert_allclose(st.habs, np.mean(np.abs(h), axis=0), rtol=1e-10)
        assert np.array_equal(st.rows, x[rows])
        np.testing.assert_allclose(st.target, ffn(ex, layer, x[rows]), rtol=1e-12)


def test_statistics_of_a_plain_activation_layer() -> None:
    layer = make_toy(3, 8, 12, 2, "gelu", seed=4)
    x = _x(50, 8)
    lc = layer_calibration(layer, x)
    ids = route(layer, x).expert_ids
    assert sum(lc.experts[e].hits for e in range(3)) == 100
    for e in range(3):
        rows = np.nonzero(np.any(ids == e, axis=1))[0]
        assert lc.experts[e].hits == rows.size
        ex = layer.experts[e]
        g = x[rows].astype(np.float64) @ ex.w1.astype(np.float64)
        h = activation("gelu", g if ex.b1 is None else g + ex.b1)
        np.testing.assert_allclose(lc.experts[e].h2, np.mean(h**2, axis=0), rtol=1e-9)


def test_row_sample_is_bounded_and_spread() -> None:
    layer = make_toy(1, 4, 4, 1, "relu", seed=0)
    n = 5 * MAX_EXPERT_ROWS + 3
    x = np.arange(n * 4, dtype=np.float32).reshape(n, 4) / n
    lc = layer_calibration(layer, x)
    rows = lc.experts[0].rows
    assert lc.experts[0].hits == n and rows.shape[0] == MAX_EXPERT_ROWS
    first = (rows[:, 0] * n / 4).round().astype(int)
    assert first[0] == 0 and first[-1] > 0.9 * n and np.all(np.diff(first) > 0)


def test_capture_hook_sees_every_moe_input() -> None:
    require_torch()
    hf = make_model("mixtral", 3)
    model = _ir(hf)
    seen: dict[int, np.ndarray] = {}
    ids = [1, 5, 9, 2, 7]
    plain = forward(model, ids)
    logits = forward(model, ids, capture=lambda i, h: seen.setdefault(i, h))
    assert np.array_equal(plain, logits)
    moe = [i for i, layer in enumerate(model.layers) if layer.moe is not None]
    assert sorted(seen) == moe and all(seen[i].shape == (5, model.config.d_model) for i in moe)
    # calibration's pass skips the LM head (and any layer after the last MoE block): the same
    # captures, no logits
    quick: dict[int, np.ndarray] = {}
    none = forward(model, ids, capture=lambda i, h: quick.setdefault(i, h), logits=False)
    assert none.shape == (5, 0) and sorted(quick) == moe
    assert all(np.array_equal(quick[i], seen[i]) for i in moe)
    stats = transformer_calibration(model, [np.array(ids), np.array(ids[:3])])
    assert sorted(stats) == moe
    for lc in stats.values():
        assert lc.tokens == 8
        k = model.layers[moe[0]].moe.config.top_k
        assert sum(st.hits for st in lc.experts.values()) == 8 * k


# -- the fold -----------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.25, 0.5, 1.0])
def test_fold_is_exact_in_float64(alpha: float) -> None:
    """Scaling hidden channel j by 1 / s_j (w3 column / s_j, w2 row * s_j) leaves the expert's
    output unchanged (only the fp32 rounding of the scaled weights moves it)."""
    layer = _gated_layer()
    x = _x(64, 64)
    lc = layer_calibration(layer, x)
    for e, ex in enumerate(layer.experts):
        s = fold_scales(lc.experts[e].habs, alpha)
        assert s is not None and np.all(s > 0) and np.ptp(s) > 0
        y0 = ffn(ex, layer, x)
        y1 = ffn(fold_expert(ex, s), layer, x)
        assert np.max(np.abs(y1 - y0)) <= 1e-6 * np.max(np.abs(y0))
    assert fold_scales(lc.experts[0].habs, 0.0) is None


def test_fold_scales_are_bounded() -> None:
    habs = np.array([0.0, 1e-12, 1.0, 1e6, np.nan])
    s = fold_scales(habs, 1.0)
    assert s is not None and np.all(np.isfinite(s))
    assert s.max() <= 64.0 and s.min() >= 1 / 64.0


@pytest.mark.parametrize("scheme", ["int4", "int8", "q4k"])
def test_divide_rows_keeps_codes(scheme: str) -> None:
    # q4k rows of 256: each row its own super-block (q4k_group_rows 1), so its d / dmin alone
    w = _x(48, 256 if scheme == "q4k" else 64, seed=3)
    t = quantize_matrix(w, scheme)
    s = np.random.default_rng(0).uniform(0.1, 8.0, 48).astype(np.float32)
    d = divide_rows(t, s)
    assert d is not None
    want = t.dequantize() / s[:, None]
    if scheme == "q4k":  # d * sc * q - dmin * m, each fp16 factor rounded: row-relative bound
        bound = 2e-3 * np.abs(want).max(axis=1, keepdims=True)
        assert np.all(np.abs(d.dequantize() - want) <= bound)
    else:
        np.testing.assert_allclose(d.dequantize(), want, rtol=2e-3, atol=0)
    if scheme == "int4":
        assert np.array_equal(d.data["qs"], t.data["qs"])
        assert divide_rows(t, np.full(48, 1e-9, np.float32)) is None  # past the fp16 range
    if scheme == "q4k":
        assert np.array_equal(d.data["qs"], t.data["qs"])
        assert np.array_equal(d.data["scales"], t.data["scales"])


def test_divide_rows_refuses_q4k_rows_sharing_super_blocks() -> None:
    """Rows of 64 (2 sub-blocks): 4 rows share each super-block's d / dmin, so no row can be
    divided alone; the fold quantises the divided weights instead (calib._fold_candidates)."""
    t = quantize_matrix(_x(48, 64, seed=3), "q4k")
    assert divide_rows(t, np.full(48, 2.0, np.float32)) is None


# -- calibrated quantisation ---------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["int4", "int8", "q4k", "q5k"])
def test_calibration_reduces_expert_error(scheme: str) -> None:
    """On their calibration tokens, calibrated experts are never worse than the plain method
    or the uncalibrated search (both are candidates), and on this layer's outlier channels the
    fold wins clearly."""
    layer = _gated_layer(seed=5)
    x = _x(400, 64, seed=6)
    lc = layer_calibration(layer, x)
    q_cal = quantize_moe_layer(layer, scheme, calib=lc).experts
    q_search = quantize_moe_layer(layer, scheme).experts
    q_plain = quantize_moe_layer(layer, scheme, search="none").experts
    ratios = []
    for e, st in lc.experts.items():
        assert st.hits > 0
        err = {k: output_error(q[e], st, lc.run) for k, q in
               (("cal", q_cal), ("search", q_search), ("plain", q_plain))}  # fmt: skip
        assert err["cal"] <= err["search"] * (1 + 1e-12), err
        assert err["cal"] <= err["plain"] * (1 + 1e-12), err
        cal = q_cal[e].calibration
        assert cal is not None and cal["error"] == pytest.approx(err["cal"], rel=1e-9)
        ratios.append(err["cal"] / err["plain"])
    print(f"{scheme}: calibrated / plain output error per expert: {np.round(ratios, 3)}")
    assert np.mean(ratios) < 0.8
    assert any(q_cal[e].calibration["method"] == "calibrated" for e in q_cal)  # type: ignore[index]


def test_experts_never_hit_fall_back() -> None:
    """An expert the router never picks in calibration is quantised as without calibration
    (same bytes), and the report says it was not hit."""
    layer = make_toy(4, 32, 64, 1, "swiglu", seed=7, router_bias=True)
    assert layer.router_b is not None
    layer.router_b[2] = -1e3
    x = _x(100, 32)
    lc = layer_calibration(layer, x)
    assert lc.experts[2].hits == 0
    cal = quantize_moe_layer(layer, "int4", calib=lc).experts
    plain = quantize_moe_layer(layer, "int4").experts
    assert cal[2].calibration is None
    for name in ("w1", "w2", "w3"):
        assert getattr(cal[2], name).data.tobytes() == getattr(plain[2], name).data.tobytes()
    direct = quantize_expert_calibrated(layer.experts[2], "int4", None, None, lc.run, True)
    assert direct.w2.data.tobytes() == plain[2].w2.data.tobytes()
    report = accuracy_report(layer, cal, x, None, lc)["layers"][0]["experts"]
    assert report[2] == {"expert": 2, "scheme": "int4", "hits": 0, "plain": None, "stored": None}
    assert all(r["stored"] is not None for i, r in enumerate(report) if i != 2)


def test_fp16_and_fp32_experts_are_not_calibrated() -> None:
    layer = _gated_layer(seed=2)
    lc = layer_calibration(layer, _x(64, 64))
    q = quantize_moe_layer(layer, "int4", "1=fp16,2=fp32", calib=lc).experts
    assert q[1].calibration is None and q[2].calibration is None
    assert q[0].calibration is not None


def test_calibrated_quantisation_is_deterministic() -> None:
    layer = _gated_layer(seed=3)
    x = _x(200, 64)
    a = quantize_moe_layer(layer, "int4", calib=layer_calibration(layer, x)).experts
    b = quantize_moe_layer(layer, "int4", calib=layer_calibration(layer, x)).experts
    for e in a:
        for t, u in zip(a[e].tensors(), b[e].tensors()):
            assert (
                np.asarray(getattr(t[1], "data", t[1])).tobytes()
                == np.asarray(getattr(u[1], "data", u[1])).tobytes()
            )


def test_calibration_with_plain_scales() -> None:
    """--scale-search none --calib: the fold is still tried, with the plain scales (error
    compensation, whose scales come from the search, is not)."""
    layer = _gated_layer(seed=8)
    lc = layer_calibration(layer, _x(300, 64))
    q = quantize_moe_layer(layer, "int4", search="none", calib=lc).experts
    assert {q[e].calibration["method"] for e in q} <= {"plain", "calibrated"}  # type: ignore[index]


def test_layer_report_states_errors_per_expert(tmp_path: Path) -> None:
    layer = _gated_layer(seed=9)
    x = _x(300, 64)
    opts = GenerateOptions(name="cal", quant="int4", calib="calib")
    _, manifest = generate(layer, tmp_path / "g", opts, calib=x)
    experts = manifest["accuracy"]["layers"][0]["experts"]
    assert [e["expert"] for e in experts] == [0, 1, 2, 3]
    for e in experts:
        assert e["hits"] > 0 and e["stored"] <= e["plain"]
        assert e["method"] in ("plain", "search", "calibrated", "blocks", "blocks-sample")
    text = format_accuracy(manifest["accuracy"])
    assert "expert 0 (int4):" in text and "plain ->" in text
    # without --calib the report (on seeded random tokens) states the same figures, uncalibrated
    _, m2 = generate(layer, tmp_path / "h", GenerateOptions(name="cal", quant="int4"))
    e2 = m2["accuracy"]["layers"][0]["experts"]
    assert all("method" not in e and e["stored"] <= e["plain"] for e in e2 if e["hits"])


def test_runner_is_the_kernels_mirror() -> None:
    layer = _gated_layer(seed=1)
    x = _x(20, 64)
    qe = quantize_expert(layer.experts[0], "int4")
    from colibri.reference.kernels import quant_expert_ffn

    run = expert_runner(layer)
    assert np.array_equal(run(qe, x), quant_expert_ffn(qe, "silu", True, x))
    st = ExpertCalib(
        20, np.ones(64), np.ones(128), np.ones(128), x, ffn(layer.experts[0], layer, x)
    )
    lc = LayerCalib(20, {0: st}, run, x)
    assert output_error(qe, st, lc.run) > 0


# -- whole transformers: --calib token ids or text ----------------------------------------------


def _ir(hf: Any) -> Any:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        save_model(hf, Path(d))
        return load_hf_transformer(Path(d))


@pytest.fixture(scope="module")
def mixtral_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_torch()
    return save_model(make_model("mixtral", 11), tmp_path_factory.mktemp("mixtral_calib"))


def test_load_calib_ids(mixtral_ckpt: Path, tmp_path: Path) -> None:
    model = load_hf_transformer(mixtral_ckpt)
    ids = np.arange(40, dtype=np.int32) % 64
    np.save(tmp_path / "ids.npy", ids)
    seqs = load_calib_ids(tmp_path / "ids.npy", model, 16)
    assert [len(s) for s in seqs] == [16, 16, 8]
    assert np.array_equal(np.concatenate(seqs), ids)
    two = load_calib_ids(np.stack([ids[:20], ids[20:]]).astype(np.uint8), model, 64)
    assert [len(s) for s in two] == [20, 20]
    assert [len(s) for s in split_sequences(np.zeros((2, 5), np.int64), 2)] == [2, 2, 1] * 2


@pytest.mark.parametrize(
    "arr, needle",
    [
        (np.zeros((4, 16), np.float32), "--layer N"),
        (np.zeros((2, 2, 2), np.int64), "shape (2, 2, 2)"),
        (np.zeros((0,), np.int64), "no token ids"),
        (np.zeros((1, 0), np.int64), "no token ids"),
        (np.array([1, 64, 3]), "token id 64 is outside the vocabulary (0..63"),
        (np.array([1, -1]), "token id -1"),
        (np.array([True, False]), "dtype bool"),
    ],
)
def test_bad_calib_ids_are_refused(arr: np.ndarray, needle: str) -> None:
    with pytest.raises(InputError) as exc:
        check_calib_ids(arr, 64, "ids.npy")
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def _cli_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    rc = main(list(argv))
    err = capsys.readouterr().err
    assert rc == 1 and err.startswith("colibri: error: ") and err.count("\n") == 1, err
    return err


def test_bad_calib_files_give_one_line_errors(
    mixtral_ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["generate", str(mixtral_ckpt), "--out", str(tmp_path / "o"), "--quant", "int4"]
    np.save(tmp_path / "acts.npy", _x(8, 16))
    assert "--layer N" in _cli_error(capsys, *base, "--calib", str(tmp_path / "acts.npy"))
    assert "not found" in _cli_error(capsys, *base, "--calib", str(tmp_path / "none.npy"))
    (tmp_path / "t.txt").write_text("some text\n")
    err = _cli_error(capsys, *base, "--calib", str(tmp_path / "t.txt"))
    assert "tokenizer.json" in err and "integer .npy" in err  # vocab 64: no byte fallback
    (tmp_path / "b.txt").write_bytes(b"\xff\xfe\x00text")
    assert "not UTF-8" in _cli_error(capsys, *base, "--calib", str(tmp_path / "b.txt"))
    (tmp_path / "e.txt").write_text("  \n")
    assert "empty" in _cli_error(capsys, *base, "--calib", str(tmp_path / "e.txt"))
    np.save(tmp_path / "ids.npy", np.array([1, 2, 99]))
    assert "token id 99" in _cli_error(capsys, *base, "--calib", str(tmp_path / "ids.npy"))
    np.save(tmp_path / "ok.npy", np.array([1, 2, 3]))
    fp32 = ["generate", str(mixtral_ckpt), "--out", str(tmp_path / "o"), "--quant", "fp32"]
    assert "pass --quant int8, int4, q4k or q5k" in _cli_error(
        capsys, *fp32, "--calib", str(tmp_path / "ok.npy")
    )
    assert not (tmp_path / "o").exists()
    with pytest.raises(ConfigError, match="--scale-search"):
        quantize_transformer(load_hf_transformer(mixtral_ckpt), "int4", search="best")


def test_cli_generate_int4_with_calib(
    mixtral_ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`colibri generate CKPT --quant int4 --calib ids.npy` generates, records the option and
    reports every expert's hits and error before / after; the calibrated mirror is at least
    as close to fp32 on the calibration tokens' MoE inputs as the uncalibrated one."""
    ids = np.random.default_rng(3).integers(0, 64, (6, 24))
    np.save(tmp_path / "ids.npy", ids)
    out = tmp_path / "gen"
    rc = main(
        ["generate", str(mixtral_ckpt), "--out", str(out), "--quant", "int4", "--max-context",
         "24", "--calib", str(tmp_path / "ids.npy")]
    )  # fmt: skip
    stdout = capsys.readouterr().out
    assert rc == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["options"]["calib"] == str(tmp_path / "ids.npy")
    acc = manifest["accuracy"]
    assert acc["tokens"] == ids.size
    model = load_hf_transformer(mixtral_ckpt)
    n_exp = next(layer.moe.config.n_experts for layer in model.layers if layer.moe)
    for layer in acc["layers"]:
        experts = layer["experts"]
        assert n_exp is None or len(experts) == n_exp
        assert sum(e["hits"] for e in experts) == ids.size * 2  # k = 2
        for e in experts:
            if e["hits"]:
                assert e["stored"] <= e["plain"] + 1e-12
            else:
                assert e["stored"] is None
    assert "rel error" in stdout and "plain ->" in stdout
    # the same through the pipeline function, and the uncalibrated model for comparison
    lc = transformer_calibration(model, load_calib_ids(tmp_path / "ids.npy", model, 24))
    cal = quantize_transformer(model, "int4", calib=lc)
    unc = quantize_transformer(model, "int4")
    for i, layer_cal in lc.items():
        moe = model.layers[i].moe
        assert moe is not None
        from colibri.reference.accuracy import layer_metrics

        a = layer_metrics(moe, cal.experts[i], layer_cal.inputs, None)["rel_rms_error"]
        b = layer_metrics(moe, unc.experts[i], layer_cal.inputs, None)["rel_rms_error"]
        print(f"layer {i}: rel-RMS calibrated {a:.4g}, uncalibrated {b:.4g}")
        assert a <= b * 1.05


def test_scale_search_none_is_recorded(mixtral_ckpt: Path, tmp_path: Path) -> None:
    model = load_hf_transformer(mixtral_ckpt)
    opts = GenerateOptions(name="m", quant="int4", scale_search="none", max_context=16)
    _, manifest = generate(model, tmp_path / "n", opts)
    assert manifest["options"]["scale_search"] == "none" and "accuracy" not in manifest
    _, m2 = generate(model, tmp_path / "m", replace(opts, scale_search="mse"))
    assert "scale_search" not in m2["options"]
    assert m2["files"] != manifest["files"]  # different stored scales


@pytest.mark.parametrize("arch", ARCHS)
def test_transformer_report_per_architecture(arch: str, tmp_path: Path) -> None:
    """Every architecture (Qwen2-MoE's shared expert left out of the routed experts' figures):
    int8 routed experts within 5 % rel-RMS of fp32 on their calibration inputs, and no expert
    worse than with the plain scales."""
    require_torch()
    ours = load_hf_transformer(save_model(make_model(arch, 5), tmp_path / "ckpt"))
    ids = np.random.default_rng(0).integers(0, ours.config.vocab_size, (4, 20))
    opts = GenerateOptions(name="m", quant="int8", max_context=32)
    _, manifest = generate(ours, tmp_path / "g", opts, calib=ids)
    acc = manifest["accuracy"]
    assert manifest["options"]["calib"] == "(array)" and acc["tokens"] == 80
    assert [m["layer"] for m in acc["layers"]] == [
        i for i, layer in enumerate(ours.layers) if layer.moe is not None
    ]
    for m in acc["layers"]:
        assert m["rel_rms_error"] < 0.05 and m["routing_agreement"] == 1.0, m
        assert all(e["stored"] <= e["plain"] for e in m["experts"] if e["hits"])


def test_large_experts_are_measured_on_a_spread_subset_of_rows() -> None:
    """Choosing among a dozen candidates stays bounded at any size: an expert of 3 x 1024 x
    2816 weights is measured on EVAL_MACS / weights rows spread over its sample, a small one
    on every row."""
    from colibri.quant.calib import EVAL_MACS, EVAL_MIN_ROWS, eval_rows
    from colibri.quant.formats import QuantExpert, QuantTensor

    def expert(d: int, f: int) -> QuantExpert:
        def t(o: int, i: int) -> QuantTensor:
            return QuantTensor("int8", o, i, np.zeros((o, i), np.int8), np.ones(o, np.float32))

        return QuantExpert("int8", "int8", t(f, d), t(d, f), t(f, d), None, None)

    assert np.array_equal(eval_rows(expert(64, 128), 512), np.arange(512))
    big = eval_rows(expert(1024, 2816), 512)
    assert len(big) == max(EVAL_MIN_ROWS, EVAL_MACS // (3 * 1024 * 2816))
    assert big[0] == 0 and big[-1] == 511 and np.all(np.diff(big) > 0)


# -- --calib-method (issue 38: importance-weighted by default, GPTQ on request) -------------------


def test_default_method_runs_no_gptq_and_the_option_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The default --calib-method (importance) never runs the error-compensated solve nor
    keeps the hidden rows it needs; --calib-method gptq runs it on every matrix of every
    expert with enough rows, and keeps its candidates (so it is never worse on every row)."""
    import colibri.quant.calib as calib_mod
    from colibri.cli.pipeline import quantise
    from colibri.ir.model import as_model

    calls: list[tuple[int, int]] = []
    real = calib_mod.gptq_matrix

    def counting(w_t: np.ndarray, scheme: str, h: np.ndarray) -> Any:
        calls.append(w_t.shape)
        return real(w_t, scheme, h)

    monkeypatch.setattr(calib_mod, "gptq_matrix", counting)
    layer = _gated_layer(seed=9)
    x = _x(300, 64, seed=4)
    qd = quantise(as_model(layer), GenerateOptions(quant="int4"), calib=x)
    assert calls == []
    assert all(st.hidden_rows is None for st in qd.stats.experts.values())
    methods = {qe.calibration["method"] for qe in qd.q.experts.values()}  # type: ignore[index]
    assert methods <= {"plain", "search", "calibrated", "blocks", "blocks-sample"}, methods
    opts = GenerateOptions(quant="int4", calib_method="gptq")
    qg = quantise(as_model(layer), opts, calib=x)
    hit = [e for e, st in qg.stats.experts.items() if st.rows.shape[0] >= 32]
    assert hit and len(calls) == 3 * len(hit)
    assert all(qg.stats.experts[e].hidden_rows is not None for e in hit)
    for e in hit:  # gptq measures a superset of the default's candidates on the same rows
        st = qg.stats.experts[e]
        assert qg.q.experts[e].calibration["error"] <= output_error(  # type: ignore[index]
            qd.q.experts[e], st, qg.stats.run
        ) * (1 + 1e-12)


def test_calib_method_flag(
    mixtral_ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--calib-method gptq is recorded in the manifest, the default is not; without --calib
    it is refused; --help documents it."""
    ids = np.random.default_rng(4).integers(0, 64, (2, 16))
    np.save(tmp_path / "ids.npy", ids)
    base = ["generate", str(mixtral_ckpt), "--quant", "int4", "--max-context", "16"]
    calib = ["--calib", str(tmp_path / "ids.npy")]
    assert main([*base, "--out", str(tmp_path / "a"), *calib, "--calib-method", "gptq"]) == 0
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["options"]["calib_method"] == "gptq"
    assert main([*base, "--out", str(tmp_path / "b"), *calib]) == 0
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert "calib_method" not in manifest["options"]
    capsys.readouterr()
    assert main([*base, "--out", str(tmp_path / "c"), "--calib-method", "gptq"]) == 1
    assert "--calib-method gptq chooses how --calib calibrates: pass --calib FILE" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    assert "--calib-method {importance,gptq}" in capsys.readouterr().out


@pytest.mark.parametrize(("quant", "dense"), [("int8", "int8"), ("int4", "fp32")])
def test_streamed_convert_calib_is_the_whole_model_conversion(
    mixtral_ckpt: Path, tmp_path: Path, quant: str, dense: str
) -> None:
    """Issue 38 item 3: `convert --calib` reads, calibrates, quantises and writes one layer at a
    time (memory: one layer); its file is byte for byte the whole-model path's (the loaded
    model's transformer_calibration, quantize_transformer_as_asked, expert_heat and
    write_lm_container), sequences cut at --max-context included."""
    from colibri.cli.pipeline import convert
    from colibri.emit.lmfile import write_lm_container
    from colibri.quant.model import quantize_transformer_as_asked
    from colibri.reference.calibration import expert_heat

    ids = np.random.default_rng(38).integers(0, 64, (3, 20))
    np.save(tmp_path / "ids.npy", ids)
    opts = GenerateOptions(
        quant=quant, dense_quant=dense, max_context=16, calib=str(tmp_path / "ids.npy")
    )
    got = convert(mixtral_ckpt, tmp_path / "streamed.clb", opts)
    assert got.heat
    model = load_hf_transformer(mixtral_ckpt)
    lc = transformer_calibration(model, load_calib_ids(tmp_path / "ids.npy", model, 16))
    q = quantize_transformer_as_asked(model, quant, None, dense, calib=lc)
    tok = mixtral_ckpt / "tokenizer.json"
    whole = write_lm_container(
        model,
        q,
        tmp_path / "whole.clb",
        16,
        tok.read_bytes() if tok.is_file() else None,
        expert_heat(model, lc),
    )
    assert (tmp_path / "streamed.clb").read_bytes() == whole.read_bytes()


@pytest.mark.parametrize(
    ("arch", "quant", "dense"),
    [
        ("mixtral", "int8", "int8"),
        ("mixtral", "int4", "fp32"),
        *((a, "int8", "int4") for a in ARCHS),
    ],
)
def test_streamed_generate_calib_is_the_loaded_models(
    arch: str, quant: str, dense: str, tmp_path: Path
) -> None:
    """Issue 38 item 3: `generate CKPT --calib` reads, calibrates, quantises and analyses one
    layer at a time and drops the fp32 weights it quantised (memory: one layer's fp32); every
    generated file (C, weights blob, manifest with the model hash, accuracy and routing
    report) is byte for byte the loaded model's, sequences cut at --max-context included."""
    from colibri.cli.pipeline import streams

    require_torch()
    ckpt = save_model(make_model(arch, 7), tmp_path / "ckpt")
    model = load_hf_transformer(ckpt)
    ids = np.random.default_rng(38).integers(0, model.config.vocab_size, (3, 20))
    np.save(tmp_path / "ids.npy", ids)
    opts = GenerateOptions(
        name="m", quant=quant, dense_quant=dense, max_context=16, calib=str(tmp_path / "ids.npy")
    )
    assert streams(ckpt, opts) and not streams(model, opts)
    generate(ckpt, tmp_path / "streamed", opts)
    generate(model, tmp_path / "whole", opts)  # the loaded model's stages (an IR never streams)
    names = sorted(p.name for p in (tmp_path / "whole").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "streamed").iterdir())
    assert "routing.md" in names and "transformer_weights.bin" in names
    for name in names:
        got = (tmp_path / "streamed" / name).read_bytes()
        assert got == (tmp_path / "whole" / name).read_bytes(), name
