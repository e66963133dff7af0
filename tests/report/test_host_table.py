"""benchmarks/host_table.py end to end on its --tiny model (one round): the JSON has every field
with sane values (no wall-clock thresholds), Colibri at 1 and 2 threads generates the same
tokens, the runner's timing line is read, and PyTorch runs beside it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import ROOT, require_board
from hf_tiny import require_torch

sys.path.insert(0, str(ROOT / "benchmarks"))

import host_table  # noqa: E402


def test_host_table_tiny(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    require_torch()
    require_board("host")
    out = tmp_path / "host.json"
    argv = ["--tiny", "--rounds", "1", "--tokens", "6", "--prompt", "12", "--schemes", "int8"]
    assert host_table.main([*argv, "--out", str(tmp_path / "work"), "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "fraction of bandwidth" in table and "colibri int8 x2" in table
    result = json.loads(out.read_text())
    assert result["same_tokens"] is True
    assert 1e8 < result["bandwidth_bytes_per_s"] < 1e12
    assert 1e8 < result["bandwidth_2_threads_bytes_per_s"] < 2e12
    assert result["cpu"]["model"] and result["cpu"]["cores"] >= 1
    assert "CPU: " in table and "GB/s (2 threads)" in table
    assert result["prompt_tokens"] == 12 and result["decode_tokens"] == 6
    engines = {r["engine"]: r for r in result["rows"]}
    assert set(engines) == {
        "colibri int8 x1",
        "colibri int8 x2",
        "pytorch fp32 x1",
        "pytorch fp32 x2",
    }
    for r in engines.values():
        d = r["decode_tokens_per_s"]
        assert 0 < d["min"] <= d["median"] <= d["max"]
        assert r["prefill_tokens_per_s"]["median"] > 0
        assert r["bytes_per_token"] > 0 and r["bandwidth_fraction"] > 0
        # the fraction is taken against the fastest read: never above the 1 GiB one's
        assert 0 < r["bandwidth_fraction"] <= r["bandwidth_fraction_1gib"]
        assert 1e8 < r["working_set_bandwidth_bytes_per_s"] < 1e13
        assert r["working_set_bytes"] > 0
    assert (
        engines["colibri int8 x1"]["working_set_bytes"]
        == (tmp_path / "work" / "int8.clb").stat().st_size
    )
    # Colibri's int8 bytes per token: every matrix int8, so under PyTorch's fp32 bytes
    assert (
        engines["colibri int8 x1"]["bytes_per_token"]
        < engines["pytorch fp32 x1"]["bytes_per_token"]
    )
    assert engines["colibri int8 x1"]["vs_torch"] is not None
    assert engines["colibri int8 x2"]["vs_one_thread"] is not None


def test_host_table_sampled_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--sampled adds a sampled run per scheme and thread count, interleaved with the greedy one:
    its rate over greedy's is reported, and its tokens equal between thread counts."""
    require_board("host")
    out = tmp_path / "host.json"
    argv = ["--tiny", "--rounds", "1", "--tokens", "8", "--prompt", "6", "--schemes", "int8"]
    argv += ["--no-torch", "--sampled", "--out", str(tmp_path / "work"), "--json", str(out)]
    assert host_table.main(argv) == 0
    table = capsys.readouterr().out
    assert "decode ÷ greedy decode" in table
    result = json.loads(out.read_text())
    assert result["same_tokens"] is True
    engines = {r["engine"]: r for r in result["rows"]}
    assert set(engines) == {
        "colibri int8 x1",
        "colibri int8 x2",
        "colibri int8 x1 sampled",
        "colibri int8 x2 sampled",
    }
    for t in (1, 2):
        greedy, sampled = engines[f"colibri int8 x{t}"], engines[f"colibri int8 x{t} sampled"]
        assert greedy["sampling"] == "greedy" and greedy["vs_greedy"] is None
        assert sampled["sampling"] == host_table.SAMPLED
        want = sampled["decode_tokens_per_s"]["median"] / greedy["decode_tokens_per_s"]["median"]
        assert sampled["vs_greedy"] == pytest.approx(want)
        # the sampled row's other ratios are taken against the greedy rows, not itself
        assert sampled["vs_one_thread"] == pytest.approx(
            sampled["decode_tokens_per_s"]["median"]
            / engines["colibri int8 x1"]["decode_tokens_per_s"]["median"]
        )
    work = tmp_path / "work" / "int8"
    sampled_tokens = (work / "t1-sampled" / "output.bin").read_bytes()
    assert sampled_tokens != (work / "t1" / "output.bin").read_bytes()


def test_llama_cpp_bytes_per_token_rule() -> None:
    """The GGUF rule is Colibri's: routed experts top_k / n_experts of them, one embedding row,
    the rest whole."""
    tensors = [
        ("token_embd.weight", 32000 * 100),
        ("output.weight", 5000),
        ("blk.0.attn_q.weight", 300),
        ("blk.0.ffn_gate_inp.weight", 40),
        ("blk.0.ffn_up_exps.weight", 8000),
        ("blk.0.ffn_down_exps.weight", 8000),
        ("blk.0.ffn_gate_exps.weight", 8000),
    ]
    got = host_table.gguf_bytes_per_token(tensors, top_k=2, n_experts=8, vocab=32000)
    assert got == 5000 + 300 + 40 + 100 + 3 * 8000 * 2 // 8


def test_llama_cpp_engine_reads_llama_bench(tmp_path: Path) -> None:
    """LlamaCppEngine runs llama-bench twice a round (the prompt's pp test; the tg test of the
    decoded tokens at the prompt's depth) and reads the rates from its JSON; here a stand-in
    llama-bench records its arguments."""
    log = tmp_path / "args.txt"
    bench = tmp_path / "llama-bench"
    bench.write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        f"open({str(log)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
        "a = sys.argv[1:]\n"
        "p, n = int(a[a.index('-p') + 1]), int(a[a.index('-n') + 1])\n"
        "print(json.dumps([{'n_prompt': p, 'n_gen': n, 'avg_ts': 100.0 + p + n}]))\n"
    )
    bench.chmod(0o755)
    engine = host_table.LlamaCppEngine(bench, tmp_path / "m.gguf", "Q8_0", 2)
    assert engine.name == "llama.cpp Q8_0 x2"
    rates, tokens = engine.run(list(range(12)), 6)
    assert rates == {"prefill": 112.0, "decode": 105.0} and tokens == []
    calls = log.read_text().splitlines()
    assert len(calls) == 2
    for call in calls:
        assert f"-m {tmp_path / 'm.gguf'} -t 2 -r 1 -o json" in call
    assert calls[0].endswith("-p 12 -n 0") and calls[1].endswith("-p 0 -n 5 -d 12")
    with pytest.raises(RuntimeError, match="no test with n_prompt 3"):
        host_table.llama_bench_rate([{"n_prompt": 0, "n_gen": 5, "avg_ts": 1.0}], 3, 0)


def test_ratios_against_llama_cpp() -> None:
    def row(engine: str, scheme: str, threads: int, dec: float, pre: float) -> dict[str, object]:
        return {
            "engine": engine,
            "scheme": scheme,
            "threads": threads,
            "decode_tokens_per_s": {"median": dec},
            "prefill_tokens_per_s": {"median": pre},
        }

    rows = [
        row("colibri int8 x1", "int8", 1, 120.0, 400.0),
        row("colibri int4 x1", "int4", 1, 150.0, 450.0),
        row("llama.cpp Q8_0 x1", "Q8_0", 1, 100.0, 500.0),
        row("pytorch fp32 x1", "fp32", 1, 30.0, 200.0),
    ]
    host_table._ratios(rows)
    assert rows[0]["vs_llama_cpp"] == 1.2 and rows[0]["prefill_vs_llama_cpp"] == 0.8
    assert rows[1]["vs_llama_cpp"] is None  # no Q4_0 row in this run
    assert rows[2]["vs_llama_cpp"] is None and rows[2]["vs_torch"] == 100.0 / 30.0
    assert rows[0]["vs_torch"] == 4.0


def test_llama_cpp_errors_name_the_fix(tmp_path: Path) -> None:
    """A missing llama.cpp tool names how to build it; a failing conversion step shows its
    output instead of a bare CalledProcessError."""
    with pytest.raises(SystemExit, match="llama-bench is missing; build it"):
        host_table.llama_tool(tmp_path, "llama-bench")
    with pytest.raises(SystemExit, match=r"llama-quantize failed \(exit 3\):\n.*no such type"):
        fail = "import sys; print('no such type'); sys.exit(3)"
        host_table._run_llama_step("llama-quantize", [sys.executable, "-c", fail])
