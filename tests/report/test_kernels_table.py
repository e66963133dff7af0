"""benchmarks/kernels_table.py end to end with --tiny on the host (callgrind) and one QEMU board
(the icount plugin's sub_prefix count): the JSON has every field, the counts are positive and
consistent (the kernels are part of the pass, more tokens cost more than one, every figure is the
counts it says it is). Structure and sanity only: no performance thresholds."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import IN_CI, ROOT, require_board

sys.path.insert(0, str(ROOT / "benchmarks"))

import kernels_table  # noqa: E402

SCHEMES = ("int8", "int4")


def _check_scheme(res: dict[str, dict[str, dict[str, int]]], macs: int) -> None:
    passes, kernels = res["instructions"]["pass"], res["instructions"]["kernel"]
    assert set(passes) == set(kernels) == {str(n) for n in kernels_table.TOKENS} | {"group8"}
    for n in passes:
        assert 0 < kernels[n] < passes[n], (n, kernels[n], passes[n])
    # more tokens cost more than one; 9 random tokens need not cost more than 8: how they split
    # between the experts decides which token tiles the multi-token kernels run
    assert passes["1"] < min(passes["8"], passes["9"])
    assert kernels["1"] < min(kernels["8"], kernels["9"])
    per_mac = res["instr_per_mac"]
    assert set(per_mac) == set(kernels_table.COLUMNS)
    assert per_mac["kernel@1"] == pytest.approx(kernels["1"] / macs)
    assert per_mac["kernel@8"] == pytest.approx(kernels["8"] / (8 * macs))
    assert per_mac["pass@1"] == pytest.approx(passes["1"] / macs)
    assert per_mac["pass@8"] == pytest.approx(passes["8"] / (8 * macs))
    assert per_mac["slope"] == pytest.approx((passes["9"] - passes["1"]) / 8 / macs)
    assert per_mac["kslope"] == pytest.approx((kernels["9"] - kernels["1"]) / 8 / macs)
    assert per_mac["group8"] == pytest.approx(kernels["group8"] / (8 * macs))
    assert per_mac["g8/k1"] == pytest.approx(per_mac["group8"] / per_mac["kernel@1"])
    assert all(v > 0 for v in per_mac.values())


def test_group_tokens_all_go_to_expert_0() -> None:
    layer = kernels_table.make_toy(experts=2, hidden=32, ff=64, top_k=1, activation="relu", seed=3)
    x = kernels_table.group_tokens(layer, 8)
    assert x.shape == (8, 32) and x.dtype == np.float32
    assert (kernels_table.route(layer, x).expert_ids[:, 0] == 0).all()


def test_kernels_table_tiny(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if shutil.which("valgrind") is None:
        if IN_CI:
            pytest.fail("CI=true and valgrind is missing: scripts/setup.sh installs it")
        pytest.skip("host instruction counts need valgrind (apt-get install valgrind)")
    require_board("host")
    require_board("cortex-m4")
    out = tmp_path / "kernels.json"
    argv = ["--tiny", "--board", "host", "--board", "cortex-m4", "--json", str(out)]
    argv += [f"--scheme={s}" for s in SCHEMES]
    assert kernels_table.main([*argv, "--workdir", str(tmp_path / "work")]) == 0
    table = capsys.readouterr().out
    assert "kernel@1" in table and "route_gate" in table
    assert "host" in table and "cortex-m4" in table

    report = json.loads(out.read_text())
    model = report["model"]
    assert (model["d_model"], model["d_ff"], model["top_k"]) == (32, 64, 1)
    macs = model["macs_per_token"]
    assert macs == 2 * 32 * 64
    assert set(report["definitions"]) >= set(kernels_table.COLUMNS)
    assert list(report["boards"]) == ["host", "cortex-m4"]
    for name, entry in report["boards"].items():
        assert entry["counted_by"] == ("callgrind" if name == "host" else "QEMU icount")
        assert list(entry["schemes"]) == list(SCHEMES)
        for res in entry["schemes"].values():
            _check_scheme(res, macs)
        router = entry["router"]
        assert (router["tokens"], router["experts"], router["top_k"]) == (16, 64, 2)
        per_token = router["per_token"]
        assert set(per_token) == {"qsort", "plain", "route_gate"}
        assert all(v > 0 for v in per_token.values())
        assert router["route_gate_vs_qsort"] == pytest.approx(
            per_token["qsort"] / per_token["route_gate"]
        )
        assert router["route_gate_vs_plain"] == pytest.approx(
            per_token["plain"] / per_token["route_gate"]
        )


def test_family_shapes_and_summary() -> None:
    """--family: the same seed gives the same shapes; the first is odd by odd; activations and
    top-k cycle; MACs count k experts; the summary's min / median / max and worst shape."""
    shapes = kernels_table.family_shapes(6, 0)
    assert shapes == kernels_table.family_shapes(6, 0)
    assert shapes != kernels_table.family_shapes(6, 1)
    assert shapes[0]["d_model"] % 2 == 1 and shapes[0]["d_ff"] % 2 == 1
    assert [s["activation"] for s in shapes] == ["relu", "silu", "gelu"] * 2
    assert [s["top_k"] for s in shapes] == [1, 2] * 3
    for s in shapes:
        assert 16 <= s["d_model"] <= 192 and 16 <= s["d_ff"] <= 512
        assert s["macs_per_token"] == 2 * s["top_k"] * s["d_model"] * s["d_ff"]
    results = [
        {"instr_per_mac": {c: float(i + 1) for c in kernels_table.COLUMNS}} for i in range(3)
    ]
    results.append({"skipped": "does not fit"})
    summary = kernels_table.family_summary(list(zip(shapes[:4], results, strict=True)))
    assert (summary["shapes"], summary["skipped"]) == (3, 1)
    assert summary["stats"]["slope"] == {"min": 1.0, "median": 2.0, "max": 3.0}
    assert summary["worst"]["shape"] == kernels_table.shape_label(shapes[2])


def test_sweep_shapes() -> None:
    """--sweep: the same seed gives the same shapes, d_model / d_ff in 16..1024, the first odd
    by odd, the second multiples of 16 but not of 32; every activation and k 1 / 2 in turn;
    4..16 experts; MACs count w3 for swiglu."""
    shapes = kernels_table.sweep_shapes(10, 40)
    assert shapes == kernels_table.sweep_shapes(10, 40)
    assert shapes != kernels_table.sweep_shapes(10, 41)
    assert shapes[0]["d_model"] % 2 == 1 and shapes[0]["d_ff"] % 2 == 1
    assert shapes[1]["d_model"] % 32 == 16 and shapes[1]["d_ff"] % 32 == 16
    assert [s["activation"] for s in shapes] == list(kernels_table.SWEEP_ACTIVATIONS) * 2
    assert [s["top_k"] for s in shapes] == [1, 2] * 5
    for s in shapes:
        assert 16 <= s["d_model"] <= 1024 and 16 <= s["d_ff"] <= 1024
        assert 4 <= s["experts"] <= 16
        matrices = 3 if s["activation"] == "swiglu" else 2
        assert s["macs_per_token"] == matrices * s["top_k"] * s["d_model"] * s["d_ff"]


#: The sweep test's schemes: every integer kind, and fp32 (c8 tails at the odd shape).
SWEEP_SCHEMES = ("int8", "int4", "q4k", "fp32")


def test_sweep_on_cortex_m4(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--sweep 1 --seed 3 (23x43 relu k1, 6 experts) on cortex-m4 int8 / int4 / q4k / fp32, no
    CMSIS-NN checkout (CI has none): every case measured, with the code its expert kernel
    reaches and that kernel's stack from the build's stack report, every run equal to the
    numpy mirror (bit for bit with int8 activations, fp32 within its tolerance), every matrix
    in the board's fast layout (fp32: c8, its tails included), no problem; the summary; JSON
    and its PNG."""
    require_board("cortex-m4")
    out = tmp_path / "sweep.json"
    argv = ["--sweep", "1", "--seed", "3", "--board", "cortex-m4", "--json", str(out)]
    argv += [f"--scheme={s}" for s in SWEEP_SCHEMES]
    assert kernels_table.main([*argv, "--workdir", str(tmp_path / "work")]) == 0
    table = capsys.readouterr().out
    assert "23x43 relu k1 e6" in table and "worst slope" in table
    assert "Problems: 0" in table and "3 bit-exact" in table and "1 within" in table
    report = json.loads(out.read_text())
    assert report["sweep"]["problems"] == []
    cases = report["sweep"]["cases"]
    assert [(c["board"], c["scheme"]) for c in cases] == [("cortex-m4", s) for s in SWEEP_SCHEMES]
    for case in cases:
        mirror = case["colibri"]["mirror"]
        assert [m["run"] for m in mirror] == ["1", "8", "9", "group8"]
        exact = case["scheme"] != "fp32"
        assert all(m["ok"] and (m["how"] == "bit-exact") == exact for m in mirror), mirror
        assert case["colibri"]["generic"] == []
        if case["scheme"] == "fp32":
            assert case["colibri"]["layouts"] == {"kt_ffn": {"w1": "c8", "w2": "c8", "w3": "c8"}}
        row = case["row"]
        assert row["slope"] > 0 and row["pass@1"] > 0
        kernel = case["colibri"]["kernel"]
        assert row["code"] == kernel["code"] > 0 and row["stack"] == kernel["stack"] > 0
        assert kernel["guard"] >= 512 and kernel["frame"][1] <= kernel["stack"]
        assert row["cmsis"] is None and row["x cmsis"] is None
    summary = report["sweep"]["summary"]
    assert set(summary) == {f"cortex-m4 {s}" for s in SWEEP_SCHEMES}
    for entry in summary.values():
        assert (entry["measured"], entry["skipped"]) == (1, 0)
        assert entry["worst slope"]["shape"] == "23x43 relu k1 e6"
    if kernels_table.plots.pyplot() is not None:
        assert out.with_suffix(".png").stat().st_size > 0


def test_sweep_arguments() -> None:
    with pytest.raises(SystemExit):
        kernels_table.main(["--cmsis-nn", "/nonexistent"])  # without --sweep
    with pytest.raises(SystemExit):
        kernels_table.main(["--sweep", "2", "--family", "2"])
    assert kernels_table.main(["--sweep", "1", "--cmsis-nn", "/nonexistent"]) == 2


def test_sweep_case_problems() -> None:
    """What keeps a sweep case from issue 40's goal, each named: a failure, a run that differs
    from the mirror, a fallback to the generic layout; a clean case has none."""
    ok = {"ok": True, "how": "bit-exact"}
    clean = {"mirror": [{"run": "1", **ok}, {"run": "8", **ok}], "generic": []}
    assert kernels_table.case_problems(clean) == []
    assert kernels_table.case_problems({"failed": "BuildError: x"}) == ["failed: BuildError: x"]
    wrong = {
        "mirror": [{"run": "1", **ok}, {"run": "8", "ok": False, "how": "bit-exact", "error": "e"}],
        "generic": ["kt_ffn.w2"],
    }
    assert kernels_table.case_problems(wrong) == [
        "mirror (bit-exact), 8 tokens: e",
        "generic layout rows: kt_ffn.w2",
    ]


def test_sweep_fits_the_chunk_then_the_experts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A case whose RAM is short runs with fewer tokens per chunk (9, 4, 2, 1) before fewer
    experts; one whose flash is short with half the experts (down to max(2, k)); the label says
    which (the Cortex-M3's 64 KB of RAM skipped most of the sweep's shapes at 9 tokens)."""
    tried: list[tuple[int, int]] = []

    def fake(board: object, scheme: str, shape: dict, work: Path) -> dict:
        chunk = shape.get("max_tokens", 9)
        tried.append((chunk, shape["experts"]))
        if chunk > 2:
            return {"skipped": "the model does not fit board b: RAM: needs ~9 bytes over budget"}
        if shape["experts"] > 4:
            return {"skipped": "the model does not fit board b: flash: needs ~9 bytes"}
        return {"experts": shape["experts"], "max_tokens": chunk}

    monkeypatch.setattr(kernels_table, "measure_scheme", fake)
    shape = kernels_table.sweep_shapes(1, 3)[0] | {"experts": 16}
    res = kernels_table.measure_fitting(None, "int8", shape, Path("."))
    assert tried == [(9, 16), (4, 16), (2, 16), (2, 8), (2, 4)]
    assert res == {"experts": 4, "max_tokens": 2}
    assert kernels_table.sweep_label(shape, 4, 2).endswith(" e4 t2")
    assert kernels_table.sweep_label(shape, 4).endswith(" e4")
