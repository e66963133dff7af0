"""Experts beyond RAM under a real memory cap (issue 41, item 3): Colibri's model-file runner
and llama.cpp (its default mmap of the GGUF) each run inside a memory cgroup whose limit is a
fraction of the model file (1/2, 1/4 and 1/8 by default), so the file cannot stay in the page
cache; decode tokens/s, Colibri's expert hit rate, bytes read from storage, peak RSS and the
group's peak are reported side by side, with JSON and a PNG.

The model is the random Mixtral of benchmarks/scale_table.py (transformers' init, seed 0;
``--model 353m``: hidden 1024, intermediate 2816, 8 experts top-2, 4 layers, 16 / 4 heads,
vocab 32000), or the smaller one of benchmarks/budget_table.py (``--model 80m``: hidden 512,
intermediate 1408, 8 / 4 heads, vocab 8000), or a tiny one for the test (``--model tiny``).
Scheme ``int8`` (the default) is `colibri convert --quant int8 --dense-quant int8` against
llama.cpp's Q8_0; ``int4`` is `--quant int4 --dense-quant int8` against Q4_0.

Method:

* **The cap** (benchmarks/memcap.py): a memory cgroup made per run under this process's own
  group, cgroup v2 ``memory.max`` where the memory controller is on v2, else cgroup v1
  ``memory.limit_in_bytes`` (v1 charges page cache too). The child joins it before exec and
  the group is removed after the run, also on an error or Ctrl-C. Root is needed. The cap of a
  fraction is that fraction of the Colibri container's size (both engines get the same bytes;
  the GGUF's size is printed beside it); ``--caps`` also takes sizes (``64M``).
* **Cold and equal starts:** before every run the engine's model file is evicted from the
  page cache (posix_fadvise DONTNEED), so every run reads it from storage under its cap.
* **Colibri** runs with default flags (prefetch on, one compute thread) and an expert RAM
  budget matched to the cap: the cap minus the runner's own memory (what colibri_lm_measure
  counts besides the slots, asked once through the runner's "memory needed" line, plus 8 MiB
  of code, libc and touched pages of the mapping) minus ``--headroom`` of the cap for the page
  cache the reads pass through; never below top_k slots. Where the packed copy of the dense
  matrices (x86 with AVX-512 VNNI) leaves no room for top_k slots, the run has it off
  (``COLIBRI_LM_PACK=0``: the matrices are read from the file through the page cache, so the
  budget is then top_k slots, leaving the cache the rest; said in the table). The cap
  less 8 MiB is also the runtime's ``max_memory``, so a model that cannot fit is refused with
  what it needs.
  Timing from the runner (``COLIBRI_TIMING=1``: the decode loop's wall time), hit rate and
  expert bytes read from its stats line.
* **llama.cpp** (``--llama-cpp SRC``; without it, or when its tools are missing, Colibri runs
  alone and the script says how to get them): the checkpoint converted and quantised as
  benchmarks/host_table.py does (its ``llama_gguf``), timed by ``llama-bench -r 1`` with the
  model mapped (``-lm mmap``, or ``-mmp 1`` where llama-bench is older):
  decode = its ``tg`` test of ``--tokens - 1`` tokens at a context depth of the prompt.
* **Every run** is under GNU time: peak RSS (``%M``), bytes read from storage (``%I`` x 512:
  the kernel's block-input count, page faults of a mapping included) and major faults
  (``%F``); the cgroup's peak charge (RSS + page cache) and limit hits beside them. Bytes per
  token = bytes read over the run / (prompt + generated tokens).
* **Interleaving:** ``--rounds`` rounds; in each, every cap, and at each cap both engines one
  after the other (the order alternating between rounds). min / median / max per engine and
  cap; the load average is recorded before and after every round (the machine is shared).

    python benchmarks/beyond_ram.py [--model 353m|80m|tiny] [--scheme int8|int4]
        [--caps 1/2,1/4,1/8] [--rounds 3] [--tokens 32] [--prompt 8] [--headroom 0.1]
        [--llama-cpp SRC [--llama-cpp-bin DIR]] [--json FILE] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from fractions import Fraction
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "codegen"))

import memcap  # noqa: E402
from host_table import (  # noqa: E402
    LLAMA_TYPES,
    SCHEMES,
    TIMING,
    llama_bench_rate,
    llama_gguf,
    prompt_ids,
)
from scale_table import FULL, SMALL, TINY, make_checkpoint  # noqa: E402

MODELS: dict[str, dict[str, Any]] = {
    "353m": FULL,
    "80m": SMALL,
    "tiny": TINY,
}
ENGINES = ("colibri", "llama.cpp")
#: Issue 41's goal: under a cap of 1/4 of the file, Colibri decode >= 2x llama.cpp's.
GOAL_CAP = Fraction(1, 4)
GOAL_RATIO = 2.0
TIME = "/usr/bin/time"
#: The runner's line when its max_memory ceiling is too low (lmfile_main.c print_memory).
NEEDED = re.compile(r"memory needed: (\d+) bytes .*expert slots (\d+), packed (\d+)")
#: The runner's memory besides what colibri_lm_measure counts: code, libc, stack, the pages of
#: the mapping a token touches (norms, routers, an embedding row).
OVERHEAD_BYTES = 8 << 20
LLAMA_HOWTO = (
    "llama.cpp is left out: pass --llama-cpp SRC, a llama.cpp source tree with llama-bench and "
    "llama-quantize built (`cmake -B build -DGGML_NATIVE=ON && cmake --build build --target "
    "llama-bench llama-quantize`; the llama-cpp-python sdist vendors one)"
)


def parse_cap(text: str) -> Fraction | int:
    """'1/4' or '0.25' -> a fraction of the model file; '64M' / '1G' / '5000000' -> bytes."""
    t = text.strip()
    m = re.fullmatch(r"(\d+)([KMG])", t, re.IGNORECASE)
    if m:
        return int(m.group(1)) << {"K": 10, "M": 20, "G": 30}[m.group(2).upper()]
    if t.isdigit() and int(t) > 1:
        return int(t)
    f = Fraction(t)
    if not 0 < f <= 1:
        raise ValueError(f"a fraction of the file in (0, 1], not {t}")
    return f


def cap_label(cap: Fraction | int) -> str:
    return f"{cap.numerator}/{cap.denominator}" if isinstance(cap, Fraction) else _mib(cap) + "M"


def _mib(n: float) -> str:
    return f"{n / 2**20:.0f}"


def summary(xs: list[float]) -> dict[str, float] | None:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)} if xs else None


def timed(
    cmd: list[str], cap: memcap.MemoryCap | None, cwd: Path, env: dict[str, str]
) -> dict[str, Any]:
    """Run cmd (under the cap's group when given) with GNU time: exit code, stdout, stderr
    tail, peak RSS, bytes read from storage, major faults."""
    with tempfile.TemporaryDirectory(prefix="beyond-ram-") as tmp:
        tfile = Path(tmp) / "time"
        full = [TIME, "-f", "%M %I %F", "-o", str(tfile), *cmd]
        proc = subprocess.run(
            full,
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            preexec_fn=cap.enter if cap is not None else None,
        )
        fields = tfile.read_text().split() if tfile.exists() else []
    out: dict[str, Any] = {"exit": proc.returncode, "stdout": proc.stdout}
    if proc.returncode != 0:
        out["error"] = (proc.stdout + proc.stderr)[-600:] or f"exit {proc.returncode}"
    if len(fields) >= 3 and fields[-3].isdigit():
        rss_kib, blocks, majors = (int(x) for x in fields[-3:])
        out.update(peak_rss_bytes=rss_kib * 1024, read_bytes=blocks * 512, major_faults=majors)
    return out


class Colibri:
    """The prebuilt model-file runner on one container, one compute thread, default flags."""

    name = "colibri"

    def __init__(self, runner: Path, clb: Path, work: Path, prompt: list[int], tokens: int):
        from colibri.targets.lmrun import SamplingOptions, write_lm_input

        self.runner, self.clb, self.work, self.tokens = runner, clb, work, tokens
        work.mkdir(parents=True, exist_ok=True)
        write_lm_input(work / "input.bin", prompt, tokens, SamplingOptions(), False)
        self.env = dict(os.environ, COLIBRI_TIMING="1")
        self.slot_bytes = 0
        self.top_k = 0
        self.base_rss = 0
        self.heap_bytes = 0
        self.packed_bytes = 0

    def cmd(self, budget: int, max_memory: int = 0) -> list[str]:
        from colibri.targets.lmrun import lmfile_args

        args = lmfile_args(self.clb.resolve(), ram_budget=budget, max_memory=max_memory)
        return [str(self.runner), *args]

    def probe(self, top_k: int) -> None:
        """Slot size (an unbounded budget) and the runner's own memory: what the runtime says
        it allocates besides the slots (its "memory needed" line, asked with a 1-byte ceiling)
        plus OVERHEAD_BYTES."""
        from colibri.targets.lmrun import parse_expert_stats

        self.top_k = top_k
        first = timed(self.cmd(2**62), None, self.work, self.env)
        stats = parse_expert_stats(first["stdout"])
        if first["exit"] != 0 or stats is None:
            raise RuntimeError(f"colibri probe failed: {first.get('error', first['stdout'])}")
        self.slot_bytes = stats["slot_bytes"]
        need = timed(self.cmd(top_k * self.slot_bytes, 1), None, self.work, self.env)
        m = NEEDED.search(need["stdout"])
        if m is None:
            raise RuntimeError(f"colibri probe: no memory line: {need.get('error', '')}")
        self.heap_bytes = int(m.group(1)) - int(m.group(2))
        self.packed_bytes = int(m.group(3))
        self.base_rss = self.heap_bytes + OVERHEAD_BYTES

    def plan(self, cap_bytes: int, headroom: float) -> tuple[int, bool]:
        """(expert budget, packed copy on) under a cap: the packed copy of the dense matrices
        (x86 with AVX-512 VNNI) stays on unless it leaves no room for top_k slots."""
        room = cap_bytes - self.base_rss - int(headroom * cap_bytes)
        minimum = self.top_k * self.slot_bytes
        if room < minimum and self.packed_bytes > 0 and room + self.packed_bytes >= minimum:
            # the dense matrices then stream from the file through the page cache: top_k slots
            # leave it the most room (measured at 1/8 of the 353 M file: 194 MB read a token
            # with 2 slots, 292 MB with 3)
            return minimum, False
        return max(room, minimum), True

    def run(self, cap: memcap.MemoryCap, headroom: float) -> dict[str, Any]:
        from colibri.targets.lmrun import parse_expert_stats

        budget, pack = self.plan(cap.limit_bytes, headroom)
        env = self.env if pack else dict(self.env, COLIBRI_LM_PACK="0")
        memcap.drop_file_cache(self.clb)
        # the cap less the overhead as the runtime's ceiling: a model that cannot fit is refused
        # with what it needs (exit 28) rather than killed by the cgroup mid-run
        ceiling = max(cap.limit_bytes - OVERHEAD_BYTES, 1)
        got = timed(self.cmd(budget, ceiling), cap, self.work, env)
        need = NEEDED.search(got["stdout"])
        if got["exit"] != 0 and need is not None:
            got["error"] = (
                f"does not fit: the runtime needs {_mib(int(need.group(1)))} MiB besides code "
                f"(expert slots {_mib(int(need.group(2)))} MiB) under a ceiling of "
                f"{_mib(ceiling)} MiB"
            )
        m = TIMING.search(got["stdout"])
        if got["exit"] == 0 and m is not None:
            _, _, d_n, d_ns = (int(g) for g in m.groups())
            got["decode_tokens_per_s"] = d_n / (d_ns * 1e-9)
            stats = parse_expert_stats(got["stdout"])
            if stats is not None:
                got["stats"] = stats
                got["hit_rate"] = stats["hits"] / stats["loads"] if stats["loads"] else 0.0
        elif got["exit"] == 0:
            got["error"] = "the runner printed no timing line"
        got["budget_bytes"] = budget
        got["packed"] = pack
        return got


class LlamaCpp:
    """llama-bench on one GGUF, mmap on (its default, said explicitly), one thread."""

    name = "llama.cpp"

    def __init__(self, bench: Path, gguf: Path, prompt: int, tokens: int) -> None:
        self.bench, self.gguf, self.prompt, self.n_gen = bench, gguf, prompt, tokens - 1
        # newer llama-bench names its loading `-lm mmap` (auto may pick another); older `-mmp 1`
        usage = subprocess.run([str(bench), "--help"], capture_output=True, text=True)
        self.mmap = (
            ["-lm", "mmap"] if "--load-mode" in usage.stdout + usage.stderr else ["-mmp", "1"]
        )

    def run(self, cap: memcap.MemoryCap) -> dict[str, Any]:
        memcap.drop_file_cache(self.gguf)
        cmd = [str(self.bench), "-m", str(self.gguf), "-t", "1", "-r", "1", *self.mmap]
        cmd += ["-p", "0", "-n", str(self.n_gen), "-d", str(self.prompt), "-o", "json"]
        got = timed(cmd, cap, self.gguf.parent, dict(os.environ))
        if got["exit"] == 0:
            try:
                got["decode_tokens_per_s"] = llama_bench_rate(
                    json.loads(got["stdout"]), 0, self.n_gen
                )
            except (ValueError, RuntimeError) as e:
                got["error"] = f"llama-bench output: {e}"
        return got


def _cell(runs: list[dict[str, Any]], tokens: int) -> dict[str, Any]:
    """One engine at one cap over the rounds."""
    ok = [r for r in runs if "decode_tokens_per_s" in r]
    cell: dict[str, Any] = {
        "runs": len(runs),
        "failed": [r.get("error", "")[-300:] for r in runs if "decode_tokens_per_s" not in r],
        "decode_tokens_per_s": summary([r["decode_tokens_per_s"] for r in ok]),
        "peak_rss_bytes": max((r.get("peak_rss_bytes", 0) for r in runs), default=0),
        "group_peak_bytes": max((r.get("group_peak_bytes", 0) for r in runs), default=0),
        "limit_hits": max((r.get("limit_hits", 0) for r in runs), default=0),
        "read_bytes": summary([r["read_bytes"] for r in ok if "read_bytes" in r]),
        "major_faults": summary([r["major_faults"] for r in ok if "major_faults" in r]),
    }
    if ok and "read_bytes" in ok[0]:
        cell["read_bytes_per_token"] = statistics.median(r["read_bytes"] for r in ok) / tokens
    if ok and "hit_rate" in ok[0]:
        cell["hit_rate"] = summary([r["hit_rate"] for r in ok])
        cell["expert_bytes_read"] = summary([r["stats"]["bytes_read"] for r in ok])
        cell["budget_bytes"] = ok[0]["budget_bytes"]
        cell["packed"] = ok[0]["packed"]
        cell["slots"] = ok[0]["stats"]["n_slots"]
    return cell


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="353m")
    ap.add_argument("--scheme", choices=("int8", "int4"), default="int8")
    ap.add_argument(
        "--caps", default="1/2,1/4,1/8", help="fractions of the model file, or sizes (64M)"
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32, help="generated tokens per run")
    ap.add_argument("--prompt", type=int, default=8, help="prompt tokens")
    ap.add_argument(
        "--headroom",
        type=float,
        default=0.1,
        help="share of the cap left out of Colibri's budget for the page cache (default 0.1)",
    )
    ap.add_argument("--llama-cpp", type=Path, metavar="SRC", help="a llama.cpp tree, tools built")
    ap.add_argument("--llama-cpp-bin", type=Path, metavar="DIR", help="default: SRC/build/bin")
    ap.add_argument("--json", type=Path, help="write the results here (and a PNG beside it)")
    ap.add_argument("--out", type=Path, help="work directory, kept (default: a temporary one)")
    args = ap.parse_args(argv)
    try:
        caps = [parse_cap(c) for c in args.caps.split(",") if c.strip()]
    except ValueError as e:
        ap.error(f"--caps: {e}")
    if not caps or args.rounds < 1 or args.tokens < 2 or args.prompt < 1:
        ap.error("--caps non-empty, --rounds >= 1, --tokens >= 2, --prompt >= 1")
    if not 0 <= args.headroom < 1:
        ap.error("--headroom in [0, 1)")
    if not os.path.exists(TIME):
        ap.error(f"{TIME} (GNU time) is needed for peak RSS and bytes read")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    try:  # fail early and clearly without a memory controller or root
        with memcap.MemoryCap(64 << 20):
            pass
    except memcap.CapUnavailable as e:
        print(f"beyond_ram: {e}", file=sys.stderr)
        return 2

    from colibri.targets.lmrun import lmfile_runner

    config = MODELS[args.model]
    tokens_per_run = args.prompt + args.tokens
    with tempfile.TemporaryDirectory(prefix="beyond-ram-") as tmp_name:
        root = args.out or Path(tmp_name)
        root.mkdir(parents=True, exist_ok=True)
        ckpt = root / f"ckpt-{args.model}"
        if not (ckpt / "config.json").exists():
            log(f"checkpoint {ckpt}")
            make_checkpoint(ckpt, config)
        clb = root / f"{args.model}-{args.scheme}.clb"
        if not clb.exists():
            log(f"convert {args.scheme}")
            script = Path(sys.executable).parent / "colibri"
            cli = [str(script)] if script.exists() else [sys.executable, "-m", "colibri"]
            part = clb.with_suffix(".part")
            subprocess.run(
                [*cli, "convert", str(ckpt), "--out", str(part), *SCHEMES[args.scheme], "-q"]
                + ["--max-context", str(tokens_per_run + 8)],
                check=True,
                env=dict(os.environ, PYTHONPATH=str(HERE.parent / "codegen")),
            )
            part.replace(clb)
        file_bytes = clb.stat().st_size
        prompt = prompt_ids(args.prompt, int(config["vocab_size"]))
        colibri = Colibri(lmfile_runner("host"), clb, root / "run-colibri", prompt, args.tokens)
        colibri.probe(int(config["num_experts_per_tok"]))
        log(
            f"colibri: {_mib(file_bytes)} MiB file, slot {_mib(colibri.slot_bytes)} MiB, own RSS "
            f"{_mib(colibri.base_rss)} MiB"
        )
        llama: LlamaCpp | None = None
        llama_note = LLAMA_HOWTO
        gguf_bytes = 0
        if args.llama_cpp is not None:
            bindir = args.llama_cpp_bin or args.llama_cpp / "build" / "bin"
            missing = [t for t in ("llama-bench", "llama-quantize") if not (bindir / t).is_file()]
            if missing:
                llama_note = f"{', '.join(missing)} not in {bindir}; " + LLAMA_HOWTO
            else:
                qtype = LLAMA_TYPES[args.scheme]
                log(f"llama.cpp {qtype}: convert and quantise")
                gguf = llama_gguf(args.llama_cpp, bindir, ckpt, root, qtype)
                gguf_bytes = gguf.stat().st_size
                llama = LlamaCpp(bindir / "llama-bench", gguf, args.prompt, args.tokens)
                llama_note = f"llama.cpp {qtype} (llama-bench, mmap)"
        if llama is None:
            print(llama_note)
        cap_bytes = {
            cap_label(c): int(c * file_bytes) if isinstance(c, Fraction) else c for c in caps
        }
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {
            k: {e: [] for e in ENGINES} for k in cap_bytes
        }
        loads: list[dict[str, Any]] = []
        for rnd in range(args.rounds):
            loads.append({"round": rnd + 1, "before": os.getloadavg()})
            for label, nbytes in cap_bytes.items():
                order = list(ENGINES) if rnd % 2 == 0 else list(reversed(ENGINES))
                for eng in order:
                    if eng == "llama.cpp" and llama is None:
                        continue
                    with memcap.MemoryCap(nbytes) as cap:
                        if eng == "colibri":
                            got = colibri.run(cap, args.headroom)
                        else:
                            assert llama is not None
                            got = llama.run(cap)
                        got["group_peak_bytes"] = cap.peak_bytes()
                        got["limit_hits"] = cap.failures()
                    got.pop("stdout", None)
                    runs[label][eng].append(got)
                    rate = got.get("decode_tokens_per_s")
                    log(
                        f"round {rnd + 1} cap {label} ({_mib(nbytes)} MiB) {eng}: "
                        + (f"{rate:.1f} tok/s" if rate else f"FAILED {got.get('error', '')[-200:]}")
                        + f", {got.get('read_bytes', 0) / 1e6:.0f} MB read"
                    )
            loads[-1]["after"] = os.getloadavg()
    rows = []
    for label, nbytes in cap_bytes.items():
        row: dict[str, Any] = {"cap": label, "cap_bytes": nbytes}
        for eng in ENGINES:
            if runs[label][eng]:
                row[eng] = _cell(runs[label][eng], tokens_per_run)
        c, ll = row.get("colibri"), row.get("llama.cpp")
        if c and ll and c["decode_tokens_per_s"] and ll["decode_tokens_per_s"]:
            row["colibri_vs_llama"] = (
                c["decode_tokens_per_s"]["median"] / ll["decode_tokens_per_s"]["median"]
            )
        rows.append(row)
    goal_row = next((r for r in rows if r["cap"] == cap_label(GOAL_CAP)), None)
    result = {
        "model": {"name": args.model, "arch": "mixtral", **config},
        "scheme": args.scheme,
        "container_bytes": file_bytes,
        "gguf_bytes": gguf_bytes,
        "llama_cpp": llama_note,
        "cgroup": {
            "version": memcap.find_hierarchy().version,
            "parent": str(memcap.find_hierarchy().own),
        },
        "colibri_slot_bytes": colibri.slot_bytes,
        "colibri_own_rss_bytes": colibri.base_rss,
        "colibri_heap_bytes": colibri.heap_bytes,
        "colibri_packed_bytes": colibri.packed_bytes,
        "headroom": args.headroom,
        "colibri_env": {k: v for k, v in os.environ.items() if k.startswith("COLIBRI_LM")},
        "prompt_tokens": args.prompt,
        "tokens": args.tokens,
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
        "load_average": loads,
        "rows": rows,
        "goal_quarter_cap_2x": (
            goal_row.get("colibri_vs_llama", 0.0) >= GOAL_RATIO if goal_row else None
        ),
    }
    print_table(result)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        plot(args.json, rows)
    return 0


def _tps(s: dict[str, float] | None) -> str:
    return f"{s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f})" if s else "failed"


def print_table(result: dict[str, Any]) -> None:
    print(
        f"{result['model']['name']} {result['scheme']}: container {_mib(result['container_bytes'])}"
        f" MiB, GGUF {_mib(result['gguf_bytes'])} MiB; {result['tokens']} tokens after a "
        f"{result['prompt_tokens']}-token prompt, {result['rounds']} round(s); cgroup "
        f"v{result['cgroup']['version']}"
    )
    print(
        f"{'cap':>5} {'MiB':>5} {'engine':10} {'decode tok/s':>20} {'hit':>6} {'MB/tok':>7} "
        f"{'RSS MiB':>7} {'group MiB':>9} {'budget MiB':>10}"
    )
    for r in result["rows"]:
        for eng in ENGINES:
            c = r.get(eng)
            if c is None:
                continue
            hit = f"{c['hit_rate']['median']:.1%}" if "hit_rate" in c else "-"
            per_tok = c.get("read_bytes_per_token")
            print(
                f"{r['cap']:>5} {_mib(r['cap_bytes']):>5} {eng:10} "
                f"{_tps(c['decode_tokens_per_s']):>20} {hit:>6} "
                f"{(per_tok or 0) / 1e6:7.1f} {_mib(c['peak_rss_bytes']):>7} "
                f"{_mib(c['group_peak_bytes']):>9} "
                f"{_mib(c['budget_bytes']) if 'budget_bytes' in c else '-':>10}"
                + ("" if c.get("packed", True) else "  (packed copy off: no room)")
            )
            for err in c["failed"]:
                print(f"      failed: {' '.join(err.split())[-160:]}")
        if "colibri_vs_llama" in r:
            print(f"{r['cap']:>5}       colibri / llama.cpp decode: {r['colibri_vs_llama']:.2f}x")
    goal = result["goal_quarter_cap_2x"]
    if goal is not None and any("colibri_vs_llama" in r for r in result["rows"]):
        print(f"goal: under a 1/4 cap, colibri >= 2x llama.cpp: {'met' if goal else 'NOT met'}")
    print("load average per round:", [(x["before"], x["after"]) for x in result["load_average"]])


def plot(json_path: Path, rows: list[dict[str, Any]]) -> Path | None:
    import plots

    labels = [f"cap {r['cap']}" for r in rows]
    series = {
        eng: [
            round(r[eng]["decode_tokens_per_s"]["median"], 1)
            if r.get(eng) and r[eng]["decode_tokens_per_s"]
            else 0.0
            for r in rows
        ]
        for eng in ENGINES
        if any(eng in r for r in rows)
    }
    return plots.bar_plot(
        json_path,
        labels,
        series,
        title="Decode tokens/s under a memory cap (cgroup)",
        ylabel="tokens/s",
    )


if __name__ == "__main__":
    sys.exit(main())
