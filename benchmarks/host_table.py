"""Decode and prefill speed on the host, side by side in one run: Colibri's whole-model container
(int8 and int4 schemes, 1 and 2 threads) against PyTorch eager fp32 (transformers), with each
engine's decode speed as a fraction of the machine's measured single-thread read bandwidth.

The model is issue 13's random Mixtral made with transformers' random init (seed 0; hidden 1024,
intermediate 2816, 8 experts top-2, 4 layers, 16 / 4 heads, vocab 32000: 352.9 M parameters);
``--tiny`` swaps in a small config so a test runs the whole script in seconds.

Schemes (`colibri convert` flags): ``int8`` = ``--quant int8 --dense-quant int8``; ``int4`` =
``--quant int4 --dense-quant int8``; ``int4+d4`` = ``--quant int4 --dense-quant int4`` and
``fp32`` (no flags) on request.

Method:

* **Timing** comes from the runner itself: with ``COLIBRI_TIMING=1`` in its environment the
  model-file runner prints ``colibri: timing: prefill P tokens S ns, decode D tokens T ns``
  (CLOCK_MONOTONIC around the prompt and around the decode steps, excluding start-up, file
  checks and sampling-free I/O). Decode tok/s = D / T; prefill tok/s = P / S with a
  ``--prompt``-token prompt (64 by default: the issue's batched-prefill goal).
* **PyTorch eager fp32** runs in this process (`torch.set_num_threads(threads)`, no grad):
  one forward over the prompt (prefill), then one token at a time with the KV cache (decode),
  greedy, each timed with ``time.perf_counter``.
* **llama.cpp** (``--llama-cpp SRC``, optional: a llama.cpp source tree with its tools built,
  e.g. the one the ``llama-cpp-python`` sdist vendors, built with ``cmake -B build
  -DGGML_NATIVE=ON && cmake --build build --target llama-bench llama-quantize``): the same
  checkpoint converted by llama.cpp's own ``convert_hf_to_gguf.py`` to an f32 GGUF (the random
  checkpoint has no tokenizer, so llama.cpp's bundled 32000-token LLaMA vocabulary names the
  tokens; nothing reads them), quantised by ``llama-quantize`` with its defaults to the type of
  each scheme (int8: Q8_0, int4: Q4_0), timed by ``llama-bench`` (one repetition a round):
  prefill = its ``pp`` test of the prompt, decode = its ``tg`` test of the decoded tokens at a
  context depth of the prompt (``-d``), as Colibri decodes after the prompt. Its bytes per
  token come from the GGUF's tensor table (the vendored ``gguf-py`` reads it) with the same rule
  as Colibri's (the ``*_exps`` tensors are the routed experts).
* **Interleaving:** per round every engine runs once (Colibri int8 / int4 / ... at 1 thread,
  then 2 threads, then llama.cpp, then PyTorch at 1 and 2 threads), ``--rounds`` rounds;
  min / median / max per engine. The page cache is warm (each container was just written and
  run once).
* **Sampled decode** (``--sampled``): every Colibri scheme and thread count also decodes with
  temperature 0.8, top-k 40, top-p 0.95 (seed 1), interleaved with the greedy runs; the runner's
  decode time includes drawing every token, so "decode ÷ greedy decode" is what sampling costs
  (issue 41: at least 0.95). Its tokens differ from greedy's but not between thread counts.
* **Bandwidth:** a small C program (compiled here with the host compiler, ``-O2
  -march=native``) sums a 1 GiB buffer 12 times with one thread, four independent 32-byte vector
  streams, two passes in three also prefetching into L2 (8 or 32 KB ahead: Colibri's packed x86
  kernels prefetch so on Intel CPUs, where one core reads faster with it), and reports the best
  GB/s; it runs before the first and after the last round, and
  the larger figure is used. Two copies at once after the rounds give the two-thread figure
  (their sum), printed beside it: what a second decode thread can add if decode is memory-bound.
  The same program also reads buffers the size of each engine's working set, before and
  after the rounds: its weight file (over a decode every expert comes round) and its bytes per
  token (what one token reads). A last-level cache that holds either (480 MiB on some Xeons)
  reads it faster than DRAM, so the fraction of bandwidth is taken against the fastest of these
  figures and the 1 GiB one (the strictest), and the fraction of the 1 GiB figure is printed
  beside it. The header also names the CPU and its ISA extensions (/proc/cpuinfo) and the load
  average.
* **Bytes per decoded token** are read from the container's tensor table: every tensor except
  the routed experts, the embedding and the RoPE tables, plus one embedding row and
  top_k / n_experts of the routed-expert bytes per layer (exactly top_k experts run per layer
  and token; all experts of a layer have the same size). PyTorch's figure is the same count
  for fp32 weights (4 bytes per parameter). The KV cache (under 1 MB here) is left out.
  Fraction of bandwidth = bytes per token x tok/s / bandwidth.

    python benchmarks/host_table.py [--schemes int8,int4] [--threads 1,2] [--rounds 5]
        [--tokens 64] [--prompt 64] [--no-torch] [--llama-cpp SRC [--llama-cpp-bin DIR]]
        [--sampled] [--json FILE] [--tiny] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "codegen"))

from scale_table import FULL, TINY, make_checkpoint  # noqa: E402

SCHEMES: dict[str, list[str]] = {
    "fp32": [],
    "int8": ["--quant", "int8", "--dense-quant", "int8"],
    "int4": ["--quant", "int4", "--dense-quant", "int8"],
    "int4+d4": ["--quant", "int4", "--dense-quant", "int4"],  # issue 41 item 5: all 4-bit
}
#: Issue 13's goals (single thread unless said).
GOALS = {
    "int8_bandwidth_fraction": 0.80,
    "int4_bandwidth_fraction": 0.70,
    "int8_vs_torch": 5.0,
    "prefill_vs_decode": 4.0,
    "two_threads": 1.6,
}
#: llama.cpp's quantisation type beside each Colibri scheme (the same bits per weight class).
LLAMA_TYPES = {"int8": "Q8_0", "int4": "Q4_0", "int4+d4": "Q4_0", "fp32": "F32"}
#: --sampled: the settings llama.cpp's and most chat front ends' defaults are near (top-k 40,
#: top-p 0.95); decode then ranks the 40 best by partial selection (colibri_sample)
SAMPLED = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "seed": 1}
SAMPLED_TAG = " sampled"
TIMING = re.compile(r"colibri: timing: prefill (\d+) tokens (\d+) ns, decode (\d+) tokens (\d+) ns")

BANDWIDTH_C = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef uint64_t v4u64 __attribute__((vector_size(32)));

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    /* argv[1]: the buffer size in bytes (default 1 GiB), rounded down to 128 bytes */
    const size_t bytes = argc > 1 ? (size_t)strtoull(argv[1], NULL, 10) & ~(size_t)127
                                  : (size_t)1 << 30;
    if (bytes == 0) {
        return 2;
    }
    v4u64 *buf = aligned_alloc(64, bytes);
    if (buf == NULL) {
        return 1;
    }
    memset(buf, 1, bytes);
    const size_t n = bytes / sizeof(v4u64);
    double best = 0.0;
    uint64_t total = 0;
    for (int r = 0; r < 12; r++) {
        /* one round in three the hardware prefetchers alone, the others also a software
         * prefetch into L2 8 or 32 KB ahead (what the x86 packed kernels do on Intel CPUs,
         * where it reads faster); the best of all rounds counts. The address is an integer:
         * past the end of the buffer a prefetch hint reads nothing, a pointer there would be
         * undefined. */
        const uintptr_t ahead = (r % 3 == 0) ? 0u : (r % 3 == 1) ? 8192u : 32768u;
        v4u64 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
        const double t0 = now();
        for (size_t i = 0; i < n; i += 4) { /* four independent 32-byte streams of adds */
            if (ahead != 0u) {
                const uintptr_t a = (uintptr_t)&buf[i] + ahead;
                __builtin_prefetch((const void *)a, 0, 2);
                __builtin_prefetch((const void *)(a + 64u), 0, 2);
            }
            s0 += buf[i];
            s1 += buf[i + 1];
            s2 += buf[i + 2];
            s3 += buf[i + 3];
        }
        const double dt = now() - t0;
        const v4u64 s = s0 + s1 + s2 + s3;
        total += s[0] + s[1] + s[2] + s[3];
        const double gbs = (double)bytes / dt / 1e9;
        best = gbs > best ? gbs : best;
    }
    printf("%.3f %llu\n", best, (unsigned long long)(total & 1u));
    free(buf);
    return 0;
}
"""


def measure_bandwidth(work: Path, nbytes: int | None = None) -> float:
    """Single-thread read bandwidth in bytes/s: best of 12 passes (8 of them with software
    prefetch) over a buffer of 1 GiB, or of ``nbytes`` (a model's working set, which a large
    last-level cache may hold)."""
    src, exe = work / "bandwidth.c", work / "bandwidth"
    if not exe.exists() or not src.exists() or src.read_text() != BANDWIDTH_C:
        src.write_text(BANDWIDTH_C)
        cc = shutil.which("cc") or "gcc"
        subprocess.run([cc, "-O2", "-march=native", str(src), "-o", str(exe)], check=True)
    cmd = [str(exe.resolve())] + ([str(nbytes)] if nbytes is not None else [])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return float(out.split()[0]) * 1e9


def measure_bandwidth_2(work: Path) -> float:
    """Read bandwidth of two threads (two copies of the program at once, their sum): what the
    second core adds, i.e. how far two decode threads could go if memory-bound."""
    measure_bandwidth(work)  # builds the program
    exe = work / "bandwidth"
    procs = [subprocess.Popen([str(exe)], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate()[0] for p in procs]
    return sum(float(o.split()[0]) for o in outs) * 1e9


def cpu_description() -> dict[str, Any]:
    """The CPU model and the ISA extensions the x86 kernel levels look for (Linux)."""
    model, flags = "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    wanted = ("avx2", "fma", "f16c", "avx_vnni", "avx512bw", "avx512vl", "avx512_vnni")
    return {"model": model, "isa": [f for f in wanted if f in flags], "cores": os.cpu_count()}


def summary(xs: list[float]) -> dict[str, float]:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def decode_bytes_per_token(clb: Path, top_k: int, n_experts: int) -> dict[str, int]:
    """Weight bytes one decoded token reads, from the container's tensor table."""
    from colibri.frontends.container import (
        ENTRY,
        ENTRY_SIZE,
        HEADER_FIELDS,
        HEADER_SIZE,
        LM_HEADER,
        NO_EXPERT,
    )

    with open(clb, "rb") as f:
        head = dict(zip(HEADER_FIELDS, LM_HEADER.unpack_from(f.read(HEADER_SIZE), 0)))
        table = f.read(ENTRY_SIZE * int(head["n_tensors"]))
    dense = expert = embed = 0
    for i in range(int(head["n_tensors"])):
        fields = ENTRY.unpack_from(table, i * ENTRY_SIZE)
        name = fields[0].rstrip(b"\0").decode()
        nbytes, exp_id = int(fields[8]), int(fields[9])
        if exp_id != NO_EXPERT:
            expert += nbytes
        elif name == "embed" or name.startswith("embed."):
            embed += nbytes
        elif not name.startswith("rope."):
            dense += nbytes
    per_token = dense + embed // int(head["vocab_size"]) + expert * top_k // n_experts
    return {"dense": dense, "experts": expert, "embedding": embed, "per_token": per_token}


class ColibriEngine:
    """The prebuilt model-file runner on one container, at a thread count."""

    def __init__(
        self,
        name: str,
        runner: Path,
        clb: Path,
        threads: int,
        work: Path,
        sampling: dict[str, Any] | None = None,
    ) -> None:
        self.name, self.runner, self.clb, self.threads = name, runner, clb, threads
        self.work, self.sampling = work, sampling
        work.mkdir(parents=True, exist_ok=True)

    def run(self, prompt: list[int], max_new: int) -> tuple[dict[str, float], list[int]]:
        from colibri.targets.lmrun import (
            SamplingOptions,
            lmfile_args,
            read_lm_output,
            write_lm_input,
        )

        sampling = SamplingOptions(**self.sampling) if self.sampling else SamplingOptions()
        write_lm_input(self.work / "input.bin", prompt, max_new, sampling, False)
        cmd = [str(self.runner), *lmfile_args(self.clb, threads=self.threads)]
        env = dict(os.environ, COLIBRI_TIMING="1")
        proc = subprocess.run(cmd, cwd=self.work, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"{self.name}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}")
        m = TIMING.search(proc.stdout)
        if m is None:
            raise RuntimeError(f"{self.name}: the runner printed no timing line:\n{proc.stdout}")
        p_n, p_ns, d_n, d_ns = (int(g) for g in m.groups())
        tokens = read_lm_output(self.work / "output.bin", max_new).tokens.tolist()
        return {"prefill": p_n / (p_ns * 1e-9), "decode": d_n / (d_ns * 1e-9)}, tokens


#: Runs llama.cpp's convert_hf_to_gguf.py (argv: SRC, VOCAB, then the converter's arguments).
#: VOCAB "llama-spm": llama.cpp's bundled LLaMA SentencePiece vocabulary in place of the
#: checkpoint's tokenizer (the random checkpoint has none); "gpt2": the checkpoint's own
#: byte-level BPE tokenizer.json with GPT-2's pre-tokenizer (the trained checkpoints, whose
#: hash the converter does not know), so llama-imatrix tokenizes text as the checkpoint does.
#: LlamaModel is in the script itself in older trees and in its conversion package in newer ones.
LLAMA_CONVERT = """
import importlib.util, sys
src = sys.argv.pop(1)
vocab = sys.argv.pop(1)
sys.path[:0] = [src, src + "/gguf-py"]
sys.argv[0] = src + "/convert_hf_to_gguf.py"
spec = importlib.util.spec_from_file_location("convert_hf_to_gguf", sys.argv[0])
mod = importlib.util.module_from_spec(spec)
sys.modules["convert_hf_to_gguf"] = mod
spec.loader.exec_module(mod)
llama = getattr(mod, "LlamaModel", None)
if llama is None:
    import conversion.llama
    llama = conversion.llama.LlamaModel
def set_vocab(self):
    if vocab == "gpt2":
        self.get_vocab_base_pre = lambda tokenizer: "gpt-2"
        self._set_vocab_gpt2()
    else:
        self._set_vocab_builtin("llama-spm", self.hparams["vocab_size"])
llama.set_vocab = set_vocab
mod.main()
"""


def _run_llama_step(what: str, cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise SystemExit(f"--llama-cpp: {what} failed (exit {proc.returncode}):\n{tail}")


def llama_tool(bindir: Path, name: str) -> Path:
    exe = bindir / name
    if not exe.is_file():
        raise SystemExit(
            f"--llama-cpp: {exe} is missing; build it in the llama.cpp tree with "
            f"`cmake -B build -DGGML_NATIVE=ON && cmake --build build --target llama-bench "
            f"llama-quantize` (or name the directory of the binaries with --llama-cpp-bin)"
        )
    return exe


def llama_gguf(
    src: Path,
    bindir: Path,
    ckpt: Path,
    root: Path,
    qtype: str,
    vocab: str = "llama-spm",
    imatrix: Path | None = None,
) -> Path:
    """The checkpoint as a GGUF of llama.cpp type qtype (F32, Q8_0, Q4_0, Q4_K_M, ...): converted
    once to F32 by llama.cpp's converter (vocabulary `vocab`, see LLAMA_CONVERT), then quantised
    by llama-quantize with its default rules, with the importance matrix `imatrix` if given."""
    f32 = root / "llama-F32.gguf"
    if not f32.exists():
        tmp = f32.with_suffix(".part")
        _run_llama_step(
            "llama.cpp's convert_hf_to_gguf.py",
            [sys.executable, "-c", LLAMA_CONVERT, str(src), vocab, str(ckpt), "--outtype", "f32"]
            + ["--outfile", str(tmp)],
        )
        tmp.replace(f32)
    if qtype == "F32":
        return f32
    out = root / f"llama-{qtype}{'-imatrix' if imatrix is not None else ''}.gguf"
    if not out.exists():
        tmp = out.with_suffix(".part")
        quantize = llama_tool(bindir, "llama-quantize")
        extra = ["--imatrix", str(imatrix)] if imatrix is not None else []
        _run_llama_step("llama-quantize", [str(quantize), *extra, str(f32), str(tmp), qtype])
        tmp.replace(out)
    return out


def gguf_bytes_per_token(
    tensors: list[tuple[str, int]], top_k: int, n_experts: int, vocab: int
) -> int:
    """Weight bytes one decoded token reads from a GGUF's (name, bytes) tensor table, by the rule
    of decode_bytes_per_token: the routed experts (``*_exps``) top_k / n_experts of them, one row
    of the token embedding, everything else whole."""
    dense = experts = embed = 0
    for name, nbytes in tensors:
        if "_exps" in name:
            experts += nbytes
        elif name.startswith("token_embd"):
            embed += nbytes
        else:
            dense += nbytes
    return dense + embed // vocab + experts * top_k // n_experts


def gguf_tensors(src: Path, gguf: Path) -> list[tuple[str, int]]:
    """(name, bytes) of every tensor of a GGUF, read by the gguf-py of the llama.cpp tree."""
    sys.path.insert(0, str(src / "gguf-py"))
    try:
        from gguf import GGUFReader  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(src / "gguf-py"))
    return [(t.name, int(t.n_bytes)) for t in GGUFReader(str(gguf), "r").tensors]


def llama_bench_rate(report: list[dict[str, Any]], n_prompt: int, n_gen: int) -> float:
    """tokens/s of the llama-bench test (JSON output) with n_prompt and n_gen."""
    for test in report:
        if int(test["n_prompt"]) == n_prompt and int(test["n_gen"]) == n_gen:
            return float(test["avg_ts"])
    raise RuntimeError(f"llama-bench reported no test with n_prompt {n_prompt}, n_gen {n_gen}")


class LlamaCppEngine:
    """llama.cpp's llama-bench on one GGUF, at a thread count: prefill = the pp test of the
    prompt, decode = the tg test of the decoded tokens after the prompt (context depth)."""

    def __init__(self, bench: Path, gguf: Path, qtype: str, threads: int) -> None:
        self.bench, self.gguf, self.threads, self.qtype = bench, gguf, threads, qtype
        self.name = f"llama.cpp {qtype} x{threads}"

    def _run(self, args: list[str]) -> list[dict[str, Any]]:
        cmd = [str(self.bench), "-m", str(self.gguf), "-t", str(self.threads), "-r", "1"]
        proc = subprocess.run([*cmd, "-o", "json", *args], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{self.name}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}")
        report: list[dict[str, Any]] = json.loads(proc.stdout)
        return report

    def run(self, prompt: list[int], max_new: int) -> tuple[dict[str, float], list[int]]:
        n_p, n_d = len(prompt), max_new - 1  # the first new token comes out of the prefill
        pp = llama_bench_rate(self._run(["-p", str(n_p), "-n", "0"]), n_p, 0)
        tg = llama_bench_rate(self._run(["-p", "0", "-n", str(n_d), "-d", str(n_p)]), 0, n_d)
        return {"prefill": pp, "decode": tg}, []


class TorchEngine:
    """transformers' Mixtral in fp32, eager, greedy with the KV cache."""

    def __init__(self, ckpt: Path, threads: int) -> None:
        import torch
        import transformers

        self.torch, self.threads = torch, threads
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            ckpt, torch_dtype=torch.float32
        ).eval()
        self.name = f"pytorch fp32 x{threads}"

    def run(self, prompt: list[int], max_new: int) -> tuple[dict[str, float], list[int]]:
        import warnings

        torch = self.torch
        torch.set_num_threads(self.threads)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # transformers' cache-API deprecation notices
            ids = torch.tensor([prompt])
            t0 = time.perf_counter()
            out = self.model(input_ids=ids, use_cache=True)
            t_prefill = time.perf_counter() - t0
            past, tokens = out.past_key_values, [int(out.logits[0, -1].argmax())]
            t0 = time.perf_counter()
            for _ in range(max_new - 1):
                out = self.model(
                    input_ids=torch.tensor([[tokens[-1]]]), past_key_values=past, use_cache=True
                )
                past = out.past_key_values
                tokens.append(int(out.logits[0, -1].argmax()))
            t_decode = time.perf_counter() - t0
        rates = {"prefill": len(prompt) / t_prefill, "decode": (max_new - 1) / t_decode}
        return rates, tokens


def prompt_ids(n: int, vocab: int) -> list[int]:
    return [(7 * i + 1) % vocab for i in range(n)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="work directory (default: a temporary one)")
    ap.add_argument("--schemes", default="int8,int4")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64, help="decoded tokens per run")
    ap.add_argument("--prompt", type=int, default=64, help="prompt tokens (prefill)")
    ap.add_argument("--no-torch", action="store_true", help="leave PyTorch out")
    ap.add_argument(
        "--llama-cpp", type=Path, metavar="SRC", help="a llama.cpp source tree with its tools built"
    )
    ap.add_argument(
        "--llama-cpp-bin",
        type=Path,
        metavar="DIR",
        help="where llama-bench and llama-quantize are (default: SRC/build/bin)",
    )
    ap.add_argument(
        "--sampled",
        action="store_true",
        help="also decode every Colibri scheme and thread count sampled (temperature 0.8, top-k "
        "40, top-p 0.95, seed 1), interleaved with the greedy runs: its decode rate over greedy's",
    )
    ap.add_argument("--json", type=Path)
    ap.add_argument("--tiny", action="store_true", help="a small model (for the test)")
    args = ap.parse_args(argv)
    schemes = [s for s in args.schemes.split(",") if s]
    if not schemes or any(s not in SCHEMES for s in schemes):
        ap.error(f"--schemes: choose from {', '.join(SCHEMES)}")
    try:
        threads = sorted({int(t) for t in args.threads.split(",") if t})
    except ValueError:
        ap.error("--threads: a comma-separated list of thread counts")
    if not threads or threads[0] < 1 or args.rounds < 1 or args.tokens < 2 or args.prompt < 1:
        ap.error("--threads >= 1, --rounds >= 1, --tokens >= 2, --prompt >= 1")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    from colibri.targets.lmrun import lmfile_runner

    config = TINY if args.tiny else FULL
    with tempfile.TemporaryDirectory(prefix="host-table-") as tmp_name:
        root = args.out or Path(tmp_name)
        root.mkdir(parents=True, exist_ok=True)
        ckpt = root / "ckpt"
        if not (ckpt / "config.json").exists():
            log(f"checkpoint {ckpt}")
            make_checkpoint(ckpt, config)
        n_params = _parameters(ckpt)
        runner = lmfile_runner("host")
        script = Path(sys.executable).parent / "colibri"
        cli = [str(script)] if script.exists() else [sys.executable, "-m", "colibri"]
        cfg = json.loads((ckpt / "config.json").read_text())
        top_k, n_exp = int(cfg["num_experts_per_tok"]), int(cfg["num_local_experts"])
        ctx = ["--max-context", str(args.prompt + args.tokens + 8)]
        engines: list[Any] = []
        bytes_per_token: dict[str, int] = {}
        for s in schemes:
            clb = root / f"{s}.clb"
            log(f"[{s}] convert")
            subprocess.run(
                [*cli, "convert", str(ckpt), "--out", str(clb), *SCHEMES[s], "-q", *ctx],
                check=True,
                env=dict(os.environ, PYTHONPATH=str(HERE.parent / "codegen")),
            )
            bytes_per_token[s] = decode_bytes_per_token(clb, top_k, n_exp)["per_token"]
            for t in threads:
                engines.append(
                    ColibriEngine(f"colibri {s} x{t}", runner, clb, t, root / s / f"t{t}")
                )
                if args.sampled:
                    name = f"colibri {s} x{t}{SAMPLED_TAG}"
                    work = root / s / f"t{t}-sampled"
                    engines.append(ColibriEngine(name, runner, clb, t, work, SAMPLED))
        if args.llama_cpp is not None:
            bindir = args.llama_cpp_bin or args.llama_cpp / "build" / "bin"
            bench = llama_tool(bindir, "llama-bench")
            for s in schemes:
                qtype = LLAMA_TYPES[s]
                if qtype in bytes_per_token:  # int4 and int4+d4 share Q4_0
                    continue
                log(f"[llama.cpp {qtype}] convert and quantise")
                gguf = llama_gguf(args.llama_cpp, bindir, ckpt, root, qtype)
                bytes_per_token[qtype] = gguf_bytes_per_token(
                    gguf_tensors(args.llama_cpp, gguf), top_k, n_exp, int(cfg["vocab_size"])
                )
                for t in threads:
                    engines.append(LlamaCppEngine(bench, gguf, qtype, t))
        if not args.no_torch:
            for t in threads:
                engines.append(TorchEngine(ckpt, t))
            bytes_per_token["fp32-torch"] = 4 * n_params - _torch_skip_bytes(ckpt)
        vocab = int(config["vocab_size"])
        prompt = prompt_ids(args.prompt, vocab)
        # what each engine keeps reading over a decode: its whole weight file (every expert
        # comes round), and per token its bytes per token; a last-level cache that holds
        # either reads it faster than the 1 GiB buffer
        working_set = {s: (root / f"{s}.clb").stat().st_size for s in schemes}
        if not args.no_torch:
            working_set["fp32-torch"] = 4 * n_params
        for e in engines:
            if isinstance(e, LlamaCppEngine):
                working_set[e.qtype] = e.gguf.stat().st_size
        buffers = {k: sorted({n, bytes_per_token[k]}) for k, n in working_set.items()}

        def best_reads() -> dict[str, float]:
            return {k: max(measure_bandwidth(root, n) for n in ns) for k, ns in buffers.items()}

        bw_before = measure_bandwidth(root)
        ws_before = best_reads()
        rates: dict[str, dict[str, list[float]]] = {
            e.name: {"prefill": [], "decode": []} for e in engines
        }
        tokens: dict[str, list[int]] = {}
        for r in range(args.rounds):
            for e in engines:
                got, toks = e.run(prompt, args.tokens)
                for k in ("prefill", "decode"):
                    rates[e.name][k].append(got[k])
                tokens[e.name] = toks
                log(
                    f"round {r + 1} {e.name}: decode {got['decode']:.1f} tok/s, "
                    f"prefill {got['prefill']:.1f} tok/s"
                )
        bandwidth = max(bw_before, measure_bandwidth(root))
        ws_after = best_reads()
        bw_ws = {k: max(ws_before[k], ws_after[k]) for k in buffers}
        bandwidth_2 = measure_bandwidth_2(root)
    rows = []
    for e in engines:
        scheme = e.name.split()[1]
        key = "fp32-torch" if e.name.startswith("pytorch") else scheme
        dec, pre = summary(rates[e.name]["decode"]), summary(rates[e.name]["prefill"])
        rows.append(
            {
                "engine": e.name,
                "scheme": scheme,
                "threads": e.threads,
                "decode_tokens_per_s": dec,
                "prefill_tokens_per_s": pre,
                "bytes_per_token": bytes_per_token[key],
                # against the fastest read (1 GiB, weight file, bytes per token): the strictest
                "bandwidth_fraction": bytes_per_token[key]
                * dec["median"]
                / max(bandwidth, bw_ws[key]),
                "bandwidth_fraction_1gib": bytes_per_token[key] * dec["median"] / bandwidth,
                "working_set_bytes": working_set[key],
                "working_set_bandwidth_bytes_per_s": bw_ws[key],
                "prefill_vs_decode": pre["median"] / dec["median"],
                "sampling": dict(e.sampling) if getattr(e, "sampling", None) else "greedy",
            }
        )
    _ratios(rows)
    result = {
        "model": {"arch": "mixtral", "parameters": n_params, **config},
        "prompt_tokens": args.prompt,
        "decode_tokens": args.tokens,
        "rounds": args.rounds,
        "bandwidth_bytes_per_s": bandwidth,
        "bandwidth_2_threads_bytes_per_s": bandwidth_2,
        "cpu": cpu_description(),
        "load_average": os.getloadavg(),
        "rows": rows,
        # every thread count of a scheme generates the same tokens (bit-identical promise), and
        # so does every thread count of its sampled runs (the same seed)
        "same_tokens": all(
            len(
                {
                    tuple(tokens[e.name])
                    for e in engines
                    if e.name.startswith(f"colibri {scheme} ")
                    and e.name.endswith(SAMPLED_TAG) == sampled
                }
            )
            <= 1
            for scheme in schemes
            for sampled in (False, True)
        ),
    }
    _print(result)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


def _parameters(ckpt: Path) -> int:
    from safetensors import safe_open

    n = 0
    for f in sorted(ckpt.glob("*.safetensors")):
        with safe_open(str(f), "np") as st:
            for k in st.keys():
                shape = st.get_slice(k).get_shape()
                size = 1
                for s in shape:
                    size *= int(s)
                n += size
    return n


def _torch_skip_bytes(ckpt: Path) -> int:
    """fp32 bytes of the weights a decoded token does not read: all experts but top_k per
    layer, and all embedding rows but one."""
    cfg = json.loads((ckpt / "config.json").read_text())
    d, f = int(cfg["hidden_size"]), int(cfg["intermediate_size"])
    e, k, n_l = (
        int(cfg[x]) for x in ("num_local_experts", "num_experts_per_tok", "num_hidden_layers")
    )
    vocab = int(cfg["vocab_size"])
    return 4 * (n_l * (e - k) * 3 * d * f + (vocab - 1) * d)


def _ratios(rows: list[dict[str, Any]]) -> None:
    """Per row: speed against PyTorch fp32 at the same thread count, against itself at one
    thread, and (Colibri rows) against llama.cpp's type of the same scheme at the same thread
    count, decode and prefill (medians of the same run)."""
    by = {
        (r["scheme"] if not r["engine"].startswith("pytorch") else "torch", r["threads"]): r
        for r in rows
        if r.get("sampling", "greedy") == "greedy"
    }

    def med(r: dict[str, Any], what: str = "decode") -> float:
        return float(r[f"{what}_tokens_per_s"]["median"])

    for r in rows:
        torch_row = by.get(("torch", r["threads"]))
        base = by.get((r["scheme"] if not r["engine"].startswith("pytorch") else "torch", 1))
        r["vs_torch"] = med(r) / med(torch_row) if torch_row else None
        r["vs_one_thread"] = med(r) / med(base) if base else None
        llama = None
        if r["engine"].startswith("colibri") and r["scheme"] in LLAMA_TYPES:
            llama = by.get((LLAMA_TYPES[r["scheme"]], r["threads"]))
        r["vs_llama_cpp"] = med(r) / med(llama) if llama else None
        r["prefill_vs_llama_cpp"] = med(r, "prefill") / med(llama, "prefill") if llama else None
        sampled = r.get("sampling", "greedy") != "greedy"
        greedy = by.get((r["scheme"], r["threads"])) if sampled else None
        r["vs_greedy"] = med(r) / med(greedy) if greedy else None


def _print(result: dict[str, Any]) -> None:
    m = result["model"]
    print(
        f"{m['parameters'] / 1e6:.1f} M parameters; prompt {result['prompt_tokens']}, "
        f"{result['decode_tokens']} decoded tokens, {result['rounds']} interleaved rounds; "
        f"read bandwidth {result['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s (1 thread), "
        f"{result['bandwidth_2_threads_bytes_per_s'] / 1e9:.1f} GB/s (2 threads); "
        f"load average {result['load_average'][0]:.2f}"
    )
    cpu = result["cpu"]
    print(f"CPU: {cpu['model']}, {cpu['cores']} cores; {' '.join(cpu['isa']) or 'no AVX2'}")
    print()
    llama = any(r.get("vs_llama_cpp") is not None for r in result["rows"])
    head = (
        "| engine | decode tok/s (min / median / max) | prefill tok/s (median) | "
        "prefill ÷ decode | MB / token | working set MB, best read GB/s | fraction of bandwidth | "
        "fraction of 1 GiB bandwidth | × PyTorch | × 1 thread |"
    )
    print(head + (" × llama.cpp (decode / prefill) |" if llama else ""))
    print("|---" * (11 if llama else 10) + "|")
    for r in result["rows"]:
        d = r["decode_tokens_per_s"]
        vt = f"{r['vs_torch']:.2f}" if r["vs_torch"] is not None else "–"
        v1 = f"{r['vs_one_thread']:.2f}" if r["vs_one_thread"] is not None else "–"
        line = (
            f"| {r['engine']} | {d['min']:.1f} / {d['median']:.1f} / {d['max']:.1f} | "
            f"{r['prefill_tokens_per_s']['median']:.1f} | {r['prefill_vs_decode']:.2f} | "
            f"{r['bytes_per_token'] / 1e6:.1f} | {r['working_set_bytes'] / 1e6:.0f}, "
            f"{r['working_set_bandwidth_bytes_per_s'] / 1e9:.1f} | "
            f"{r['bandwidth_fraction']:.2f} | {r['bandwidth_fraction_1gib']:.2f} | {vt} | {v1} |"
        )
        if llama:
            vl = r.get("vs_llama_cpp")
            line += f" {vl:.2f} / {r['prefill_vs_llama_cpp']:.2f} |" if vl is not None else " – |"
        print(line)
    sampled = [r for r in result["rows"] if r.get("vs_greedy") is not None]
    if sampled:
        print()
        print("| sampled engine (T 0.8, top-k 40, top-p 0.95) | decode ÷ greedy decode (medians) |")
        print("|---|---|")
        for r in sampled:
            print(f"| {r['engine']} | {r['vs_greedy']:.3f} |")


if __name__ == "__main__":
    sys.exit(main())
