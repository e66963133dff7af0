"""Scale of a 353 M-parameter MoE on the host: `colibri generate` and `colibri build` wall time
and peak RSS, binary size and decode tokens/s, per weight scheme, for the compiled runner
(generated C, weights linked in) and the whole-model container (`colibri convert` + the prebuilt
model-file runner), and the container with experts beyond RAM (`--ram-budget` = one quarter of
the routed-expert bytes): its hit rate and decode tokens/s against all-resident.

The model is a random Mixtral made here with transformers' own random init (seed 0): hidden
1024, intermediate 2816, 8 experts top-2, 4 layers, 16 heads / 4 KV heads, vocab 32000
(352.9 M parameters, 1.4 GB of fp32 safetensors). ``--tiny`` swaps in a small config (hidden
64, 4 experts, 2 layers, vocab 256) so a test runs the whole script in seconds.

``--small`` swaps in the 80.6 M-parameter model of benchmarks/budget_table.py (hidden 512,
intermediate 1408, 8 experts top-2, 4 layers, 8 / 4 heads, vocab 8000), which generates and
builds in a fraction of the time.

Schemes: ``fp32``; ``int8`` = ``--quant int8 --dense-quant int8`` (every matrix int8);
``int8e`` = ``--quant int8`` (int8 routed experts, the rest fp32); ``int4`` = ``--quant int4``
(int4 routed experts, the rest fp32). The table gives compiled / container (the ratio of the
median CPU-time decode rates: issue 41's goal is within 10 %, i.e. >= 0.90).

Method:

* Every step is a child process (`colibri generate` / `build` / `convert` through the venv's
  CLI, the runners run directly) under ``/usr/bin/time -f %M``: its wall time
  (``time.perf_counter`` around spawn..reap) and its ``ru_maxrss`` (GNU time's wait4 on it),
  which on Linux is the largest resident set of the child or of any descendant it reaped
  (SCons' compilers: the peak of one process of the tree, not their sum). GNU time rather
  than a direct ``os.wait4``: a child forked from this (torch-importing) process starts with
  its resident set, which Linux counts into the child's ru_maxrss across the exec.
* Decode tokens/s: the runners print no timing, so each engine runs the same 8-token prompt
  generating 1 token (start-up, load, prefill, one step) and generating ``--tokens``; decode
  tokens/s = (tokens - 1) / (t_tokens - t_1), from the wall time and, separately, from the CPU
  time (user + system of the runner, from wait4: on a shared machine a waiting runner's wall
  time grows with the load, its CPU time much less; the runners are single-threaded, so on an
  idle machine both agree). Per repeat the engines are interleaved
  (compiled, container, budget, then the next repeat), and min / median / max over
  ``--repeats`` are reported. The page cache is warm (each file was just written / run).
* Binary size: the compiled runner's executable (weights included); for the container the
  .clb file (the model-file runner itself is shared by every model and reported once).
* Budget: a probe run with an unbounded budget reports the slot size B (the largest routed
  expert, 64-aligned); expert bytes = layers x experts x B; budget = expert bytes // 4. The hit
  rate is the runner's hits / loads over the ``--tokens`` run (prefetch on, the default).

``--two-b`` measures instead a 2.14 B-parameter model of the same family (hidden 2048,
intermediate 5632, 8 experts top-2, 7 layers, 16 / 4 heads, vocab 32000: 8.6 GB of fp32
safetensors, written tensor by tensor by benchmarks/mixtral_ckpt.py): `colibri convert --quant
int4 --dense-quant int8` and the container run on the host (wall time, peak RSS, decode
tokens/s); the checkpoint and container are deleted afterwards.

    python benchmarks/scale_table.py [--out DIR] [--schemes fp32,int8,int4] [--repeats 3]
        [--tokens 32] [--json FILE] [--tiny | --small] [--two-b]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

#: Scheme label -> the quantisation flags of generate / convert.
SCHEMES: dict[str, list[str]] = {
    "fp32": [],
    "int8": ["--quant", "int8", "--dense-quant", "int8"],
    "int8e": ["--quant", "int8"],
    "int4": ["--quant", "int4"],
}
ENGINES = ("compiled", "container", "budget")
PROMPT = [1, 5, 9, 17, 33, 2, 7, 11]
FULL: dict[str, Any] = {
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
}
TINY: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
}
#: --small: budget_table.py's 80.6 M-parameter model.
SMALL: dict[str, Any] = {
    "hidden_size": 512,
    "intermediate_size": 1408,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "vocab_size": 8000,
}
#: --two-b: the same family at 2.14 B parameters (8.6 GB of fp32 safetensors), written tensor by
#: tensor (benchmarks/mixtral_ckpt.py: transformers' init, one shard per layer).
TWO_B: dict[str, Any] = {
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 7,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
}
#: --two-b converts with int4 routed experts and int8 for every other matrix.
TWO_B_FLAGS = ["--quant", "int4", "--dense-quant", "int8"]
#: Issue 10's goals.
GOAL_SECONDS = 60.0
GOAL_RSS_BYTES = 2 * 1024**3
GOAL_BUDGET_RATIO = 0.5
GOAL_TWO_B_RSS_BYTES = 4 * 1024**3


@dataclass
class Child:
    """One child process: wall seconds, peak RSS in bytes, its stdout, and its CPU seconds (user +
    system, of the child and the descendants it reaped: the runner under GNU time)."""

    seconds: float
    rss_bytes: int
    stdout: str
    cpu_seconds: float = 0.0


TIME = "/usr/bin/time"


def run_child(cmd: list[str], cwd: Path | None = None) -> Child:
    """Run cmd, return its wall time and peak RSS; fail loudly on an error.

    The RSS is GNU time's %M (the child's ru_maxrss from wait4, taken by a small parent): a
    child forked straight from this process would report this (torch-sized) process's RSS at
    the fork, which Linux carries over the exec into ru_maxrss. Without /usr/bin/time it falls
    back to os.wait4 on the child (an upper bound)."""
    with tempfile.TemporaryDirectory(prefix="scale-child-") as tmp_name:
        rss_file = Path(tmp_name) / "time.txt"
        full = [TIME, "-f", "%M", "-o", str(rss_file), *cmd] if os.path.exists(TIME) else cmd
        out_path, err_path = Path(tmp_name) / "out", Path(tmp_name) / "err"
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            t0 = time.perf_counter()
            proc = subprocess.Popen(full, cwd=cwd, stdout=out, stderr=err)
            _, status, usage = os.wait4(proc.pid, 0)
            seconds = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        stdout = out_path.read_text(errors="replace")
        if proc.returncode != 0:
            stderr = err_path.read_text(errors="replace")
            raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{stdout}{stderr}")
        kib = usage.ru_maxrss  # KiB on Linux
        if full is not cmd:
            kib = int(rss_file.read_text().split()[-1])
    return Child(seconds, kib * 1024, stdout, usage.ru_utime + usage.ru_stime)


def make_checkpoint(path: Path, config: dict[str, Any]) -> int:
    """A seeded random Mixtral with transformers' init, saved as safetensors; its parameters."""
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.MixtralConfig(
        max_position_embeddings=4096,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,
        **config,
    )
    model = transformers.MixtralForCausalLM(cfg).eval()  # fp32: the default dtype
    n_params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(path)
    del model
    return int(n_params)


def summary(xs: list[float]) -> dict[str, float]:
    """min / median / max of the measured values (NaN: none measurable, see decode_rate)."""
    ok = [x for x in xs if math.isfinite(x)]
    if not ok:
        return {"min": math.nan, "median": math.nan, "max": math.nan}
    return {"min": min(ok), "median": statistics.median(ok), "max": max(ok)}


def decode_rate(tokens: int, t_many: float, t_one: float) -> float:
    """(tokens - 1) / (t_many - t_one); NaN when the difference is lost in the run-to-run noise
    (a tiny model or too few --tokens), never a made-up rate."""
    delta = t_many - t_one
    return (tokens - 1) / delta if delta > 0 else math.nan


class Engine:
    """How to run one engine: a command, in a work dir holding input.bin."""

    def __init__(self, name: str, cmd: list[str], work: Path) -> None:
        self.name, self.cmd, self.work = name, cmd, work

    def run(self, max_new: int) -> Child:
        from colibri.targets.lmrun import SamplingOptions, write_lm_input

        write_lm_input(self.work / "input.bin", PROMPT, max_new, SamplingOptions(), False)
        child = run_child(self.cmd, cwd=self.work)
        if not (self.work / "output.bin").is_file():
            raise RuntimeError(f"{self.name}: no output.bin in {self.work}")
        return child


def lmfile_cmd(runner: Path, budget: int) -> list[str]:
    from colibri.targets.lmrun import lmfile_args

    return [str(runner), *lmfile_args(ram_budget=budget)]


def bench_scheme(
    scheme: str, ckpt: Path, root: Path, runner: Path, repeats: int, tokens: int, log: Any
) -> dict[str, Any]:
    from colibri.targets.lmrun import parse_expert_stats, read_lm_output

    script = Path(sys.executable).parent / "colibri"
    cli = [str(script)] if script.exists() else [sys.executable, "-m", "colibri"]
    ctx = max(64, len(PROMPT) + tokens)
    flags = [*SCHEMES[scheme], "--max-context", str(ctx), "-q"]
    sdir = root / scheme
    if sdir.exists():
        shutil.rmtree(sdir)
    sdir.mkdir(parents=True)
    gen = sdir / "gen"
    row: dict[str, Any] = {"scheme": scheme}

    log(f"[{scheme}] generate")
    g = run_child([*cli, "generate", str(ckpt), "--board", "host", "--out", str(gen), *flags])
    row["generate"] = {"seconds": g.seconds, "peak_rss_bytes": g.rss_bytes}
    log(f"[{scheme}] generate {g.seconds:.1f} s, {g.rss_bytes / 2**20:.0f} MiB; build")
    b = run_child([*cli, "build", str(gen), "--board", "host", "-q"])
    row["build"] = {"seconds": b.seconds, "peak_rss_bytes": b.rss_bytes}
    from colibri.boards import load_board
    from colibri.targets.build import build_dir_for, model_name, runner_path

    board = load_board("host")
    gdir = gen.resolve()
    exe = build_dir_for(gdir, board) / model_name(gdir) / runner_path(gdir, board).name
    row["compiled_binary_bytes"] = exe.stat().st_size
    log(f"[{scheme}] build {b.seconds:.1f} s, {b.rss_bytes / 2**20:.0f} MiB; convert")
    clb = sdir / "model.clb"
    c = run_child([*cli, "convert", str(ckpt), "--out", str(clb), *flags])
    row["convert"] = {"seconds": c.seconds, "peak_rss_bytes": c.rss_bytes}
    row["container_bytes"] = clb.stat().st_size
    log(f"[{scheme}] convert {c.seconds:.1f} s, {c.rss_bytes / 2**20:.0f} MiB; runs")

    works = {e: sdir / f"run-{e}" for e in ENGINES}
    for name in ("container", "budget"):
        works[name].mkdir()
        (works[name] / "model.clb").symlink_to(clb.resolve())
    works["compiled"].mkdir()
    # the probe: slot size from an unbounded budget
    probe = Engine("probe", lmfile_cmd(runner, 2**62), works["budget"]).run(1)
    stats = parse_expert_stats(probe.stdout)
    if stats is None:
        raise RuntimeError(f"no expert-slot stats from the budget probe:\n{probe.stdout}")
    cfg = json.loads((ckpt / "config.json").read_text())
    n_experts = int(cfg["num_hidden_layers"]) * int(cfg["num_local_experts"])
    expert_bytes = n_experts * stats["slot_bytes"]
    budget = expert_bytes // 4
    row["expert_bytes"] = expert_bytes
    row["ram_budget_bytes"] = budget
    engines = {
        "compiled": Engine("compiled", [str(exe)], works["compiled"]),
        "container": Engine("container", lmfile_cmd(runner, 0), works["container"]),
        "budget": Engine("budget", lmfile_cmd(runner, budget), works["budget"]),
    }
    tps: dict[str, list[float]] = {e: [] for e in ENGINES}
    cpu_tps: dict[str, list[float]] = {e: [] for e in ENGINES}
    rss: dict[str, list[int]] = {e: [] for e in ENGINES}
    outputs: dict[str, list[int]] = {}
    budget_stats: dict[str, int] | None = None
    for rep in range(repeats):
        for name, eng in engines.items():  # interleaved: one engine after the other
            one = eng.run(1)
            many = eng.run(tokens)
            tps[name].append(decode_rate(tokens, many.seconds, one.seconds))
            cpu_tps[name].append(decode_rate(tokens, many.cpu_seconds, one.cpu_seconds))
            rss[name].append(many.rss_bytes)
            outputs[name] = read_lm_output(eng.work / "output.bin", tokens).tokens.tolist()
            if name == "budget":
                budget_stats = parse_expert_stats(many.stdout)
            log(
                f"[{scheme}] repeat {rep + 1} {name}: {tps[name][-1]:.2f} tok/s wall, "
                f"{cpu_tps[name][-1]:.2f} CPU"
            )
    if budget_stats is None:
        raise RuntimeError("the budget run printed no expert-slot stats")
    for name in ENGINES:
        row[name] = {
            "tokens_per_s": summary(tps[name]),
            "cpu_tokens_per_s": summary(cpu_tps[name]),
            "peak_rss_bytes": max(rss[name]),
        }
    row["same_tokens"] = outputs["compiled"] == outputs["container"] == outputs["budget"]
    row["compiled_vs_container"] = (
        row["compiled"]["cpu_tokens_per_s"]["median"]
        / row["container"]["cpu_tokens_per_s"]["median"]
    )
    loads = budget_stats["loads"]
    row["budget_stats"] = budget_stats
    row["hit_rate"] = budget_stats["hits"] / loads if loads else 0.0
    row["budget_vs_resident"] = (
        row["budget"]["tokens_per_s"]["median"] / row["container"]["tokens_per_s"]["median"]
    )
    row["goals"] = {
        "generate_60s_2GB": g.seconds <= GOAL_SECONDS and g.rss_bytes <= GOAL_RSS_BYTES,
        "build_60s_2GB": b.seconds <= GOAL_SECONDS and b.rss_bytes <= GOAL_RSS_BYTES,
        "budget_half_speed": row["budget_vs_resident"] >= GOAL_BUDGET_RATIO,
    }
    return row


def bench_two_b(
    ckpt: Path, root: Path, runner: Path, repeats: int, tokens: int, log: Any
) -> dict[str, Any]:
    """--two-b: `colibri convert` (int4 experts, int8 dense) and the container run on the host:
    wall time and peak RSS of each, decode tokens/s (as bench_scheme's container engine)."""
    from colibri.targets.lmrun import read_lm_output

    script = Path(sys.executable).parent / "colibri"
    cli = [str(script)] if script.exists() else [sys.executable, "-m", "colibri"]
    ctx = max(64, len(PROMPT) + tokens)
    sdir = root / "two-b"
    if sdir.exists():
        shutil.rmtree(sdir)
    sdir.mkdir(parents=True)
    clb = sdir / "model.clb"
    log("[2B] convert")
    c = run_child(
        [
            *cli,
            "convert",
            str(ckpt),
            "--out",
            str(clb),
            *TWO_B_FLAGS,
            "--max-context",
            str(ctx),
            "-q",
        ]
    )
    row: dict[str, Any] = {"flags": " ".join(TWO_B_FLAGS), "container_bytes": clb.stat().st_size}
    row["convert"] = {"seconds": c.seconds, "peak_rss_bytes": c.rss_bytes}
    log(f"[2B] convert {c.seconds:.1f} s, {c.rss_bytes / 2**20:.0f} MiB; runs")
    work = sdir / "run"
    work.mkdir()
    (work / "model.clb").symlink_to(clb.resolve())
    eng = Engine("container", lmfile_cmd(runner, 0), work)
    tps: list[float] = []
    rss: list[int] = []
    for rep in range(repeats):
        one = eng.run(1)
        many = eng.run(tokens)
        tps.append(decode_rate(tokens, many.seconds, one.seconds))
        rss.append(max(one.rss_bytes, many.rss_bytes))
        log(f"[2B] repeat {rep + 1}: {tps[-1]:.2f} tok/s, {rss[-1] / 2**20:.0f} MiB")
    row["run"] = {"tokens_per_s": summary(tps), "peak_rss_bytes": max(rss)}
    row["tokens"] = read_lm_output(work / "output.bin", tokens).tokens.tolist()
    row["goals"] = {
        "convert_4GB": c.rss_bytes <= GOAL_TWO_B_RSS_BYTES,
        "run_4GB": max(rss) <= GOAL_TWO_B_RSS_BYTES,
    }
    return row


def print_two_b(row: dict[str, Any], n_params: int, disk_bytes: int) -> None:
    conv, run = row["convert"], row["run"]
    print(
        f"2B model: {n_params / 1e9:.2f} B parameters, {disk_bytes / 1e9:.2f} GB safetensors; "
        f"convert {row['flags']}: {conv['seconds']:.1f} s, {_mib(conv['peak_rss_bytes'])} MiB "
        f"peak RSS, container {_mib(row['container_bytes'])} MiB; run: "
        f"{_tps(run['tokens_per_s'])} tokens/s, {_mib(run['peak_rss_bytes'])} MiB peak RSS"
    )


def _mib(n: float) -> str:
    return f"{n / 2**20:.0f}"


def _tps(s: dict[str, float]) -> str:
    return f"{s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f})"


def print_table(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'scheme':6} {'gen s':>7} {'gen MiB':>8} {'build s':>8} {'build MiB':>9} "
        f"{'conv s':>7} {'conv MiB':>8} {'exe MiB':>8} {'clb MiB':>8}"
    )
    for r in rows:
        print(
            f"{r['scheme']:6} {r['generate']['seconds']:7.1f} "
            f"{_mib(r['generate']['peak_rss_bytes']):>8} {r['build']['seconds']:8.1f} "
            f"{_mib(r['build']['peak_rss_bytes']):>9} {r['convert']['seconds']:7.1f} "
            f"{_mib(r['convert']['peak_rss_bytes']):>8} {_mib(r['compiled_binary_bytes']):>8} "
            f"{_mib(r['container_bytes']):>8}"
        )
    print()
    print("decode tokens/s, median (min-max) and peak RSS MiB of the run")
    print(
        f"{'scheme':6} {'compiled':>24} {'container':>24} {'budget':>24} "
        f"{'budget MiB':>10} {'hit rate':>8} {'budget/res':>10} same"
    )
    for r in rows:
        cells = [f"{_tps(r[e]['tokens_per_s'])} {_mib(r[e]['peak_rss_bytes']):>5}" for e in ENGINES]
        print(
            f"{r['scheme']:6} {cells[0]:>24} {cells[1]:>24} {cells[2]:>24} "
            f"{_mib(r['ram_budget_bytes']):>10} {r['hit_rate']:8.1%} "
            f"{r['budget_vs_resident']:9.2f}x {'yes' if r['same_tokens'] else 'NO'}"
        )
    print()
    print("decode tokens/s from CPU time, median (min-max); compiled / container of the medians")
    print(f"{'scheme':6} {'compiled':>20} {'container':>20} {'budget':>20} {'comp/cont':>9}")
    for r in rows:
        cells = [_tps(r[e]["cpu_tokens_per_s"]) for e in ENGINES]
        print(
            f"{r['scheme']:6} {cells[0]:>20} {cells[1]:>20} {cells[2]:>20} "
            f"{r['compiled_vs_container']:8.2f}x"
        )
    print()
    for r in rows:
        goals = ", ".join(f"{k} {'met' if v else 'NOT met'}" for k, v in r["goals"].items())
        print(f"{r['scheme']}: {goals}")


def plot(json_path: Path, rows: list[dict[str, Any]]) -> Path | None:
    import plots

    labels = [r["scheme"] for r in rows]
    series = {e: [round(r[e]["tokens_per_s"]["median"], 1) for r in rows] for e in ENGINES}
    return plots.bar_plot(
        json_path, labels, series, title="Decode tokens/s on the host", ylabel="tokens/s"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="work directory (default: a temporary one)")
    ap.add_argument("--schemes", default="fp32,int8,int4")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32, help="generated tokens of a timed run")
    ap.add_argument("--json", type=Path, help="write the results here (and a PNG beside it)")
    ap.add_argument("--tiny", action="store_true", help="a small model (for the test)")
    ap.add_argument("--small", action="store_true", help="the 80.6 M-parameter model")
    ap.add_argument(
        "--two-b",
        action="store_true",
        help="instead: a 2.14 B-parameter model (8.6 GB of safetensors; with --tiny the small "
        "one), converted with int4 experts / int8 dense and run from the container",
    )
    args = ap.parse_args(argv)
    schemes = [s for s in args.schemes.split(",") if s]
    bad = [s for s in schemes if s not in SCHEMES]
    if bad or not schemes:
        ap.error(f"--schemes: unknown {bad}; choose from {', '.join(SCHEMES)}")
    if args.repeats < 1 or args.tokens < 2:
        ap.error("--repeats must be >= 1 and --tokens >= 2")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    from colibri.targets.lmrun import lmfile_runner

    if args.two_b:
        return main_two_b(args, log)
    config = TINY if args.tiny else SMALL if args.small else FULL
    with tempfile.TemporaryDirectory(prefix="scale-") as tmp_name:
        root = args.out or Path(tmp_name)
        root.mkdir(parents=True, exist_ok=True)
        ckpt = root / "ckpt"
        log(f"checkpoint {ckpt}")
        t0 = time.perf_counter()
        n_params = make_checkpoint(ckpt, config)
        log(f"{n_params / 1e6:.1f} M parameters in {time.perf_counter() - t0:.1f} s")
        runner = lmfile_runner("host")
        rows = [
            bench_scheme(s, ckpt, root, runner, args.repeats, args.tokens, log) for s in schemes
        ]
    result = {
        "model": {"arch": "mixtral", "parameters": n_params, **config},
        "prompt_tokens": len(PROMPT),
        "tokens": args.tokens,
        "repeats": args.repeats,
        "cpus": os.cpu_count(),
        "lmfile_runner_bytes": runner.stat().st_size,
        "schemes": rows,
    }
    print(f"{n_params / 1e6:.1f} M parameters, {args.tokens} tokens, {args.repeats} repeat(s)")
    print_table(rows)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        plot(args.json, rows)
    return 0


def main_two_b(args: argparse.Namespace, log: Any) -> int:
    """--two-b: write the checkpoint tensor by tensor, convert it, run it; print and save."""
    import mixtral_ckpt
    from colibri.targets.lmrun import lmfile_runner

    config = TINY if args.tiny else TWO_B
    with tempfile.TemporaryDirectory(prefix="scale-2b-") as tmp_name:
        root = args.out or Path(tmp_name)
        root.mkdir(parents=True, exist_ok=True)
        ckpt = root / "ckpt-2b"
        log(f"checkpoint {ckpt}")
        t0 = time.perf_counter()
        n_params = mixtral_ckpt.write_checkpoint(ckpt, config)
        disk = sum(p.stat().st_size for p in ckpt.glob("*.safetensors"))
        log(
            f"{n_params / 1e9:.2f} B parameters, {disk / 1e9:.2f} GB in "
            f"{time.perf_counter() - t0:.1f} s"
        )
        runner = lmfile_runner("host")
        row = bench_two_b(ckpt, root, runner, args.repeats, args.tokens, log)
        if args.out is not None:  # the big files go; the numbers stay
            shutil.rmtree(ckpt)
            shutil.rmtree(root / "two-b")
    result = {
        "model": {"arch": "mixtral", "parameters": n_params, "safetensors_bytes": disk, **config},
        "prompt_tokens": len(PROMPT),
        "tokens": args.tokens,
        "repeats": args.repeats,
        "cpus": os.cpu_count(),
        "two_b": row,
    }
    print_two_b(row, n_params, disk)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
