"""Threads and batched prefill of whole-model containers (colibri_lm_config_t.num_threads,
colibri_lm_prefill; runtime_c/src/lm_*.c): logits and greedy tokens are bit-identical for
1, 2, 3 and 4 threads and for a batched prefill against the token-by-token loop, on every
scheme (fp32 included: each output row is computed exactly as before, experts combined in the
same order), on the host (Python binding, model-file runner) and on a Cortex-A53 (qemu-user).
Every job is split, however small (COLIBRI_LM_PAR_MIN_WORK=0). No timing is asserted."""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from colibri.cli.pipeline import quantise_transformer
from colibri.emit.lmfile import write_lm_container
from colibri.errors import BindingValueError
from colibri.frontends.hf_model import load_hf_transformer
from colibri.ir.transformer import MoETransformer
from colibri.paths import runtime_sources
from colibri.targets.binding import LM
from colibri.targets.lmrun import run_lm_file
from conftest import require_board, run_cli
from hf_tiny import MODEL_CASES, lm_options, make_model, require_torch, save_model

MAX_CONTEXT = 48
#: 21 prompt tokens: with prefill_batch 8, chunks of 8, 8 and 5 tokens.
PROMPT = [3, 17, 5, 60, 9, 41, 2, 33, 200, 7, 7, 150, 99, 1, 0, 255, 18, 64, 128, 12, 77]
N_NEW = 6
SCHEMES: dict[str, dict[str, str]] = {
    "fp32": {},
    "int8": {"quant": "int8"},
    "int4": {"quant": "int4"},
    "int8-dense-int8": {"quant": "int8", "dense": "int8"},
}
#: Large enough that the row split runs on every thread (LM_PAR_MIN_WORK), small enough to be
#: quick: 8 experts, top-2 (qwen2_moe: a gated shared expert, i.e. the dense FFN path too).
DIMS = dict(vocab_size=256, hidden_size=128, num_attention_heads=4, num_key_value_heads=2)
OVERRIDES = {
    "mixtral": dict(DIMS, intermediate_size=192, num_local_experts=8),
    "qwen2_moe": dict(
        DIMS,
        intermediate_size=160,
        moe_intermediate_size=96,
        shared_expert_intermediate_size=128,
        num_experts=8,
    ),
}


@pytest.fixture(autouse=True)
def split_every_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """COLIBRI_LM_PAR_MIN_WORK=0: every job is split over the threads, however small (the tiny
    models here would otherwise run most jobs, e.g. every token step's attention, on one)."""
    monkeypatch.setenv("COLIBRI_LM_PAR_MIN_WORK", "0")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, MoETransformer]:
    require_torch()
    out = {}
    for i, (arch, kw) in enumerate(OVERRIDES.items()):
        hf = make_model(arch, seed=90 + i, **kw)
        out[arch] = load_hf_transformer(save_model(hf, tmp_path_factory.mktemp(arch) / "ckpt"))
    return out


def _container(model: MoETransformer, scheme: str, path: Path) -> Path:
    q, _ = quantise_transformer(model, lm_options("host", "lm", MAX_CONTEXT, **SCHEMES[scheme]))
    return write_lm_container(model, q, path, MAX_CONTEXT)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _assert_same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape, what
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64)).max()
    assert np.array_equal(_bits(got), _bits(want)), f"{what}: max |diff| {diff:.3g}"


def _token_loop(clb: Path, threads: int) -> tuple[np.ndarray, list[int]]:
    with LM(clb, threads=threads) as lm:
        return lm.generate(PROMPT, N_NEW)


def _prefilled(clb: Path, threads: int, batch: int, **kw: Any) -> tuple[np.ndarray, list[int]]:
    """Last prompt logits from colibri_lm_prefill, then greedy decode steps."""
    with LM(clb, threads=threads, prefill_batch=batch, **kw) as lm:
        row = lm.prefill(PROMPT)
        last, out = row, []
        for i in range(N_NEW):
            out.append(int(np.argmax(row)))
            if i + 1 < N_NEW:
                row = lm.forward(out[-1], len(PROMPT) + i)
        return last, out


def _generate_same(
    clb: Path,
    prompt: list[int],
    threads: int,
    batch: int,
    ref: tuple[np.ndarray, list[int]],
    what: str,
) -> int:
    """Greedy generation and a batched prefill at (threads, batch) give ref's logits and tokens
    bit for bit; returns the handle's packed bytes."""
    with LM(clb, threads=threads, prefill_batch=batch) as lm:
        got, ids = lm.generate(prompt, N_NEW)
        last = lm.prefill(prompt)
        packed = lm.packed_bytes
    _assert_same(got, ref[0], what)
    _assert_same(last, ref[0][len(prompt) - 1], what + ", prefill")
    assert ids == ref[1], what
    return packed


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("arch", OVERRIDES)
def test_threads_and_prefill_bit_identical(
    models: dict[str, MoETransformer], tmp_path: Path, arch: str, scheme: str
) -> None:
    clb = _container(models[arch], scheme, tmp_path / "m.clb")
    ref_logits, ref_ids = _token_loop(clb, 1)
    for threads in (2, 3, 4):
        logits, ids = _token_loop(clb, threads)
        _assert_same(logits, ref_logits, f"{arch} {scheme}: {threads} threads, token loop")
        assert ids == ref_ids, f"{arch} {scheme}: {threads} threads"
    for threads, batch in ((1, 0), (1, 8), (2, 8), (3, 5), (4, 0), (2, 1)):
        last, ids = _prefilled(clb, threads, batch)
        what = f"{arch} {scheme}: prefill batch {batch}, {threads} threads"
        _assert_same(last, ref_logits[-1], what)
        assert ids == ref_ids, what


@pytest.mark.parametrize("case", range(len(MODEL_CASES)))
def test_attention_split_over_kv_heads(tmp_path: Path, case: int) -> None:
    """The attention is split over the threads by KV head (prefill and token steps): every
    tiny model of hf_tiny.MODEL_CASES (MHA, GQA, MQA with fewer KV heads than threads, sliding
    window, QK-norm, QKV clipping, biases) gives the same bits with 3 threads as with 1."""
    require_torch()
    arch, kw = MODEL_CASES[case]
    hf = make_model(arch, seed=70 + case, **kw)
    model = load_hf_transformer(save_model(hf, tmp_path / "ckpt"))
    clb = _container(model, "int8", tmp_path / "m.clb")
    prompt = [t % model.config.vocab_size for t in PROMPT]
    with LM(clb) as lm:
        ref, ref_ids = lm.generate(prompt, N_NEW)
    for threads, batch in ((3, 0), (3, 1), (2, 5)):
        what = f"{arch} case {case}: {threads} threads, prefill batch {batch}"
        _generate_same(clb, prompt, threads, batch, (ref, ref_ids), what)


def test_prefill_with_ram_budget_and_continuation(
    models: dict[str, MoETransformer], tmp_path: Path
) -> None:
    """With an expert RAM budget the prefill runs token steps (same logits); a prefill may
    continue at any position (two halves give the whole prompt's logits)."""
    clb = _container(models["mixtral"], "int8", tmp_path / "m.clb")
    ref_logits, ref_ids = _token_loop(clb, 1)
    with LM(clb) as lm:
        slot = lm.stats()["expert_bytes"] // 16  # 16 experts of one layer... of two: 16 total
    last, ids = _prefilled(clb, 2, 8, ram_budget=4 * slot)
    _assert_same(last, ref_logits[-1], "prefill with a RAM budget")
    assert ids == ref_ids
    with LM(clb, threads=2, prefill_batch=4) as lm:
        lm.prefill(PROMPT[:10])
        _assert_same(lm.prefill(PROMPT[10:], pos=10), ref_logits[-1], "prefill in two calls")


def test_idle_pool_sleeps(models: dict[str, MoETransformer], tmp_path: Path) -> None:
    """Between jobs a waiting thread spins for at most LM_SPIN_NS (0.2 ms), then blocks: an
    idle pool of 3 workers burns (almost) no CPU time. Process CPU time over 0.5 s of idling
    after a step stays under 50 ms (spinning all along would be 1.5 s)."""
    clb = _container(models["mixtral"], "int8", tmp_path / "m.clb")
    with LM(clb, threads=4) as lm:
        lm.generate(PROMPT[:4], 2)
        time.sleep(0.05)  # the spin ends
        cpu0 = time.process_time()
        time.sleep(0.5)
        idle = time.process_time() - cpu0
    assert idle < 0.05, f"an idle pool used {idle * 1e3:.0f} ms of CPU in 0.5 s"


def test_bad_arguments(models: dict[str, MoETransformer], tmp_path: Path) -> None:
    clb = _container(models["mixtral"], "int8", tmp_path / "m.clb")
    # the binding refuses these before C sees them (issue 37); C's own checks: tests/c
    for kw in ({"threads": -1}, {"threads": 257}, {"prefill_batch": -1}):
        with pytest.raises(BindingValueError, match=next(iter(kw))):
            LM(clb, **kw)
    with LM(clb, threads=3) as lm:  # freed with its workers idle, after nothing ran
        pass
    with LM(clb, threads=3, prefill_batch=4) as lm:
        with pytest.raises(BindingValueError, match="ids is empty"):
            lm.prefill([])
        with pytest.raises(BindingValueError, match=r"ids\[2\] must be in 0\.\."):
            lm.prefill([1, 2, lm.vocab_size])
        with pytest.raises(BindingValueError, match="context overflow"):
            lm.prefill(PROMPT * 3)  # 63 > 48 positions
        lm.prefill(PROMPT)  # the handle still works


@pytest.mark.parametrize("board", ["host", "cortex-a53"])
def test_runner_threads_and_prefill(
    models: dict[str, MoETransformer], tmp_path: Path, board: str
) -> None:
    """The model-file runner on the board: its token steps with one thread (prompt logits
    asked for) are the reference; with 1-4 threads the prompt prefilled in batches gives the
    same greedy tokens, and 2 and 4 threads the same prompt logits bit for bit (on the host:
    the binding's too)."""
    if board != "host":
        require_board(board)
    for scheme in ("int8-dense-int8", "int4", "fp32"):
        clb = _container(models["qwen2_moe"], scheme, tmp_path / f"{scheme}.clb")
        ref, _ = run_lm_file(clb, board, PROMPT, N_NEW, want_logits=True, threads=1)
        assert ref.logits is not None
        if board == "host":
            ref_logits, ref_ids = _token_loop(clb, 1)
            _assert_same(ref.logits, ref_logits, f"{scheme}: runner vs binding")
            assert ref.tokens.tolist() == ref_ids
        for threads in (1, 2, 3, 4):
            out, _ = run_lm_file(clb, board, PROMPT, N_NEW, threads=threads)
            assert out.tokens.tolist() == ref.tokens.tolist(), f"{board} {scheme} {threads}"
        for threads in (2, 4):
            out, _ = run_lm_file(clb, board, PROMPT, N_NEW, want_logits=True, threads=threads)
            assert out.logits is not None
            _assert_same(out.logits, ref.logits, f"{board} {scheme}: {threads} threads")
            assert out.tokens.tolist() == ref.tokens.tolist()


def test_cli_threads(models: dict[str, MoETransformer], tmp_path: Path) -> None:
    """`colibri run model.clb --threads N` prints the binding's greedy ids; a bad count is a
    usage error."""
    clb = _container(models["mixtral"], "int8", tmp_path / "m.clb")
    _, ref_ids = _token_loop(clb, 1)
    ids = ",".join(map(str, PROMPT))
    args = ("run", str(clb), "--prompt-ids", ids, "--max-new-tokens", str(N_NEW))
    r = run_cli(*args, "--threads", "2")
    assert r.stdout.splitlines()[0].split() == [str(i) for i in ref_ids]
    bad = run_cli(*args, "--threads", "-1", check=False)
    assert bad.returncode != 0 and "--threads" in bad.stderr


@pytest.mark.parametrize("sanitizer", ["thread", "address,undefined"])
def test_runner_under_sanitizers(
    models: dict[str, MoETransformer], tmp_path: Path, sanitizer: str
) -> None:
    """The model-file runner built with TSan (the pool's hand-offs: no race report) or ASan +
    UBSan (leaks included: the workers joined, everything freed), 3 threads: the prompt
    prefilled in batches of 4 and decoded, then its logits by token steps, each giving the
    binding's results bit for bit; again with a quarter expert RAM budget and every prediction
    read ahead (the reader thread's slot hand-offs, the prefill's waves of experts)."""
    import subprocess

    from colibri.targets.lmrun import SamplingOptions, lmfile_args, read_lm_output, write_lm_input
    from conftest import ROOT, require_tool

    cc = require_tool("gcc", "gcc")
    rt = ROOT / "runtime_c"
    exe = tmp_path / "lmfile_san"
    flags = [f"-fsanitize={sanitizer}", "-fno-omit-frame-pointer", "-g", "-O1", "-pthread"]
    if "undefined" in sanitizer:
        flags.append("-fno-sanitize-recover=undefined")
    build = subprocess.run(
        [cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off", *flags]
        + [f"-I{rt / 'include'}", f"-I{rt / 'src'}", f"-I{rt / 'platform'}"]
        + [str(p) for p in runtime_sources()]
        + [
            str(rt / "runner" / "lmfile_main.c"),
            str(rt / "platform" / "posix" / "platform_posix.c"),
        ]
        + ["-lm", "-o", str(exe)],
        capture_output=True,
        text=True,
    )
    if build.returncode != 0 and sanitizer == "thread" and "tsan" in build.stderr:
        pytest.skip(f"gcc -fsanitize=thread does not link here: {build.stderr[-500:]}")
    assert build.returncode == 0, build.stderr[-3000:]
    env = {
        "TSAN_OPTIONS": "halt_on_error=1:second_deadlock_stack=1",
        "ASAN_OPTIONS": "halt_on_error=1:detect_leaks=1",
        "UBSAN_OPTIONS": "halt_on_error=1",
    }
    from colibri.targets.binding import LM_PREFETCH_ALWAYS

    clb = _container(models["qwen2_moe"], "int8-dense-int8", tmp_path / "m.clb")
    ref_logits, ref_ids = _token_loop(clb, 1)
    with LM(clb) as lm:
        quarter = lm.stats()["expert_bytes"] // 4
    budgets: tuple[dict[str, int], ...] = ({}, {"ram_budget": quarter, "flags": LM_PREFETCH_ALWAYS})
    for want_logits, budget in itertools.product((False, True), budgets):
        write_lm_input(tmp_path / "in.bin", PROMPT, N_NEW, SamplingOptions(), want_logits)
        io = (clb, tmp_path / "in.bin", tmp_path / "out.bin")
        args = [str(exe), *lmfile_args(*io, threads=3, prefill_batch=4, **budget)]
        r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
        output = r.stdout + r.stderr
        assert "Sanitizer" not in output and "runtime error" not in output, output[-4000:]
        assert r.returncode == 0, output[-4000:]
        out = read_lm_output(tmp_path / "out.bin", N_NEW)
        assert out.tokens.tolist() == ref_ids
        if want_logits:
            assert out.logits is not None
            _assert_same(out.logits, ref_logits, f"{sanitizer}: runner prompt logits")


def _has_avx512_vnni() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return all(f in flags for f in ("avx512f", "avx512bw", "avx512vl", "avx512_vnni"))


@pytest.mark.parametrize("scheme", ["int8", "int4", "int8-dense-int8"])
def test_packed_matrices_same_bits(
    models: dict[str, MoETransformer],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    scheme: str,
) -> None:
    """On x86-64 with AVX-512 VNNI colibri_lm_init repacks every int8 / int4 matrix that runs
    with int8 activations (experts, attention, dense MLP, LM head) for the packed kernels
    (lm_pack.c); COLIBRI_LM_PACK=0 keeps the row-major kernels. Logits and tokens are the
    same bits either way: token loop, batched prefill, 1-3 threads; both architectures."""
    packs = _has_avx512_vnni() and "COLIBRI_X86_LEVEL" not in os.environ
    for arch, model in models.items():
        clb = _container(model, scheme, tmp_path / f"{arch}.clb")
        monkeypatch.setenv("COLIBRI_LM_PACK", "0")
        with LM(clb) as lm:
            assert lm.packed_bytes == 0
            ref, ref_ids = lm.generate(PROMPT, N_NEW)
        monkeypatch.delenv("COLIBRI_LM_PACK")
        for threads, batch in ((1, 0), (2, 8), (3, 5)):
            what = f"{arch} {scheme}: packed, {threads} threads, prefill batch {batch}"
            packed = _generate_same(clb, PROMPT, threads, batch, (ref, ref_ids), what)
            assert (packed > 0) == packs, f"{what}: {packed} bytes packed"


@pytest.mark.parametrize("scheme", ["int4", "int8-dense-int8"])
def test_l2_prefetch_distance_same_bits(
    models: dict[str, MoETransformer], tmp_path: Path, scheme: str
) -> None:
    """The packed x86 kernels prefetch into L2 some bytes ahead of their stream
    (COLIBRI_X86_PREFETCH: 8192 by default on Intel CPUs, 0 elsewhere): the model-file runner
    gives the same logits and tokens with it off, the default, a distance under a line, one far
    past the end of every matrix and a malformed value (read as 0), prompt prefilled in
    batches, 1 and 2 threads."""
    import os
    import subprocess

    from colibri.targets.lmrun import (
        SamplingOptions,
        lmfile_args,
        lmfile_runner,
        read_lm_output,
        write_lm_input,
    )

    exe = lmfile_runner("host")
    clb = _container(models["qwen2_moe"], scheme, tmp_path / "m.clb")
    write_lm_input(tmp_path / "in.bin", PROMPT, N_NEW, SamplingOptions(), True)
    _, ref_ids = _token_loop(clb, 1)
    outputs: dict[tuple[str | None, int], bytes] = {}
    for value in (None, "0", "8", "8192", "1048576", "junk"):
        env = {k: v for k, v in os.environ.items() if k != "COLIBRI_X86_PREFETCH"}
        if value is not None:
            env["COLIBRI_X86_PREFETCH"] = value
        for threads in (1, 2):
            out_bin = tmp_path / "out.bin"
            args = lmfile_args(clb, tmp_path / "in.bin", out_bin, threads=threads, prefill_batch=8)
            r = subprocess.run(
                [str(exe), *args], capture_output=True, text=True, env=env, timeout=300
            )
            assert r.returncode == 0, (value, threads, r.stdout[-2000:], r.stderr[-2000:])
            out = read_lm_output(out_bin, N_NEW)
            assert out.tokens.tolist() == ref_ids, (value, threads)
            assert out.logits is not None
            outputs[(value, threads)] = out_bin.read_bytes()
    first = outputs[(None, 1)]
    for key, raw in outputs.items():
        assert raw == first, f"COLIBRI_X86_PREFETCH={key[0]}, {key[1]} threads: other bits"
