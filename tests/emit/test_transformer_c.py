"""The whole decoder-only MoE transformer in generated C (colibri/emit/model.py, lm_main.c):
logits at every prompt position vs transformers, greedy generation identical to transformers on
the host and under QEMU, context overflow, seeded sampling, the CLI and the size report."""

from __future__ import annotations

import re
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from colibri.boards import load_board
from colibri.errors import BudgetExceeded, ConfigError, InputError
from colibri.frontends.hf_model import load_hf_transformer
from colibri.targets.build import build_model
from colibri.targets.lmrun import (
    EXIT_CONTEXT_OVERFLOW,
    SamplingOptions,
    parse_ids,
    read_lm_output,
    run_lm,
    write_lm_input,
)
from colibri.targets.qemu import run_elf
from conftest import require_board, run_cli
from elftools.elf.elffile import ELFFile
from hf_tiny import (
    ARCHS,
    MODEL_CASES,
    N_NEW_TOKENS,
    assert_logits_close,
    assert_same_tokens,
    generate_lm,
    hf_reference,
    make_model,
    require_torch,
    save_model,
    short_prompt,
)

#: Boards every architecture's greedy generation is checked on (the host is in every test).
QEMU_BOARDS = ("cortex-a53", "cortex-m7")
MAX_CONTEXT = 48


@pytest.fixture(autouse=True)
def _torch() -> None:
    require_torch()


def _prompt(seed: int, vocab: int) -> list[int]:
    return short_prompt(300 + seed, vocab)


@pytest.mark.parametrize("case", range(len(MODEL_CASES)))
def test_host_logits_and_greedy_match_transformers(tmp_path: Path, case: int) -> None:
    """Every tiny config of the reference tests: MHA / GQA / MQA, tied heads, biases, QK-norm,
    clip_qkv, sliding window, Qwen's shared expert and dense layers."""
    arch, overrides = MODEL_CASES[case]
    model = make_model(arch, seed=200 + case, **overrides)
    ours = load_hf_transformer(save_model(model, tmp_path / "ckpt"))
    prompt = _prompt(case, model.config.vocab_size)
    ref_logits, ref_ids = hf_reference(model, prompt, N_NEW_TOKENS)
    gen, _ = generate_lm(ours, tmp_path / "gen", "host", "lm", MAX_CONTEXT)
    out, _ = run_lm(gen, "host", prompt, N_NEW_TOKENS, want_logits=True)
    assert out.logits is not None and out.logits.shape == (len(prompt), model.config.vocab_size)
    assert_logits_close(out.logits, ref_logits, f"{arch} case {case}", "C")
    assert_same_tokens(out.tokens.tolist(), ref_ids, f"{arch} case {case} on host", "C")


@pytest.fixture(scope="module")
def arch_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any]]:
    """One default tiny checkpoint per architecture: (path, transformers model)."""
    require_torch()
    out = {}
    for i, arch in enumerate(ARCHS):
        model = make_model(arch, seed=10 + i)
        out[arch] = (save_model(model, tmp_path_factory.mktemp(arch) / "ckpt"), model)
    return out


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("board", QEMU_BOARDS)
def test_board_greedy_matches_transformers(
    board: str, arch: str, tmp_path: Path, arch_models: dict[str, tuple[Path, Any]]
) -> None:
    require_board(board)
    path, model = arch_models[arch]
    prompt = [3, 14, 15, 9, 26, 5]
    ref_logits, ref_ids = hf_reference(model, prompt, N_NEW_TOKENS)
    ours = load_hf_transformer(path)
    gen, manifest = generate_lm(ours, tmp_path / arch, board, arch, MAX_CONTEXT)
    out, _ = run_lm(gen, board, prompt, N_NEW_TOKENS, want_logits=True)
    assert out.logits is not None
    assert_logits_close(out.logits, ref_logits, f"{arch} on {board}", "C")
    assert_same_tokens(out.tokens.tolist(), ref_ids, f"{arch} on {board}", "C")
    host, _ = run_lm(gen, "host", prompt, N_NEW_TOKENS)
    assert out.tokens.tolist() == host.tokens.tolist()
    # The sampler's RNG is integer-only, so seeded sampling agrees across boards as well
    # (observed for these models and seeds; a 1-ulp libm difference at a draw boundary could
    # in principle change a draw).
    opts = SamplingOptions(temperature=0.9, top_k=10, top_p=0.9, seed=1234)
    board_s, _ = run_lm(gen, board, prompt, 16, opts)
    host_s, _ = run_lm(gen, "host", prompt, 16, opts)
    assert board_s.tokens.tolist() == host_s.tokens.tolist()


#: The remaining runnable boards, checked on one architecture (Mixtral).
OTHER_BOARDS = ("cortex-a7", "cortex-m3", "cortex-m4", "cortex-m55", "xtensa-lx106", "esp32s3")


@pytest.mark.parametrize("board", OTHER_BOARDS)
def test_other_boards_greedy(
    board: str, tmp_path: Path, arch_models: dict[str, tuple[Path, Any]]
) -> None:
    require_board(board)
    path, model = arch_models["mixtral"]
    prompt = [3, 14, 15, 9, 26, 5]
    _, ref_ids = hf_reference(model, prompt, N_NEW_TOKENS)
    gen, _ = generate_lm(load_hf_transformer(path), tmp_path / "g", board, "mx", 40)
    out, _ = run_lm(gen, board, prompt, N_NEW_TOKENS)
    assert_same_tokens(out.tokens.tolist(), ref_ids, f"mixtral on {board}", "C")


# -- context overflow ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mixtral_gen(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(checkpoint, generated host directory with --max-context 16) of a tiny Mixtral."""
    require_torch()
    tmp = tmp_path_factory.mktemp("mixtral16")
    ckpt = save_model(make_model("mixtral", seed=2), tmp / "ckpt")
    gen, _ = generate_lm(load_hf_transformer(ckpt), tmp / "gen", "host", "mx", 16)
    return ckpt, gen


def test_context_overflow_is_an_error(mixtral_gen: tuple[Path, Path]) -> None:
    _, gen = mixtral_gen
    out, _ = run_lm(gen, "host", [1, 2, 3, 4], 12)  # exactly fills the 16 positions
    assert out.tokens.shape == (12,)
    with pytest.raises(InputError, match=r"context overflow: 4 prompt \+ 13 new tokens = 17 "):
        run_lm(gen, "host", [1, 2, 3, 4], 13)
    with pytest.raises(InputError, match=r"token id 64 is outside the vocabulary \(0..63\)"):
        run_lm(gen, "host", [1, 64], 2)


@pytest.mark.parametrize("board", ["host", "cortex-m7"])
def test_firmware_refuses_overflow_itself(
    board: str, mixtral_gen: tuple[Path, Path], tmp_path: Path
) -> None:
    """Bypassing the Python check, the runner stops before touching the KV cache."""
    require_board(board)
    ckpt, _ = mixtral_gen
    gen, _ = generate_lm(load_hf_transformer(ckpt), tmp_path / "g", board, "mx", 16)
    exe = build_model(gen, board)
    write_lm_input(tmp_path / "input.bin", [1, 2, 3], 14, SamplingOptions(), False)
    res = run_elf(load_board(board), exe, tmp_path, expected_returncode=EXIT_CONTEXT_OVERFLOW)
    assert "context overflow" in res.stdout + res.stderr


def test_max_context_and_budget_errors(mixtral_gen: tuple[Path, Path], tmp_path: Path) -> None:
    ckpt, _ = mixtral_gen
    model = load_hf_transformer(ckpt)
    with pytest.raises(ConfigError, match="--max-context must be between 1 and"):
        generate_lm(model, tmp_path / "z", "host", "mx", 0)
    # 2 layers x 2 kv heads x 4 head_dim x 2 x 4 bytes = 128 bytes per position: 8192 positions
    # are a 1 MB KV cache, over the cortex-m7's 512 KB of RAM.
    with pytest.raises(BudgetExceeded, match=r"(?s)RAM: .*reduce --max-context.*KV cache: 1048576"):
        generate_lm(model, tmp_path / "big", "cortex-m7", "mx", 8192)
    assert not (tmp_path / "big").exists()


# -- sampling ------------------------------------------------------------------------------------


def test_seeded_sampling_is_deterministic_and_in_range(mixtral_gen: tuple[Path, Path]) -> None:
    import torch

    ckpt, gen = mixtral_gen
    prompt = [5, 6, 7]
    n = 12
    opts = SamplingOptions(temperature=1.0, top_k=3, top_p=1.0, seed=42)
    a, _ = run_lm(gen, "host", prompt, n, opts)
    b, _ = run_lm(gen, "host", prompt, n, opts)
    assert a.tokens.tolist() == b.tokens.tolist()
    others = [
        run_lm(gen, "host", prompt, n, SamplingOptions(1.0, 3, 1.0, s))[0].tokens.tolist()
        for s in (1, 2, 3)
    ]
    assert any(o != a.tokens.tolist() for o in others)
    # top-k = 3: every sampled token is among the 3 best of transformers' logits at its step.
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    for seq in [a.tokens.tolist(), *others]:
        ids = prompt + seq
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0].numpy()
        for t, tok in enumerate(seq):
            row = logits[len(prompt) - 1 + t]
            assert 0 <= tok < 64
            assert tok in np.argsort(-row)[:3], f"step {t}: token {tok} not in the top 3"
    greedy, _ = run_lm(gen, "host", prompt, n)
    for limit in (SamplingOptions(1.5, 1, 1.0, 9), SamplingOptions(1.5, 0, 1e-6, 9)):
        assert run_lm(gen, "host", prompt, n, limit)[0].tokens.tolist() == greedy.tokens.tolist()
    with pytest.raises(InputError, match="--top-p"):
        run_lm(gen, "host", prompt, n, SamplingOptions(1.0, 0, 0.0, 0))


def test_sampler_distribution_matches_softmax(
    mixtral_gen: tuple[Path, Path], tmp_path: Path
) -> None:
    """One token from 400 seeds: frequencies follow softmax(logits / T) of the prompt's last
    position (top-k 0, top-p 1), and top-p 0.5 keeps to the nucleus."""
    _, gen = mixtral_gen
    exe = build_model(gen, "host")
    board = load_board("host")
    prompt = [5, 6, 7]
    temperature, n = 1.5, 400

    def draw(seed: int, top_p: float) -> tuple[int, np.ndarray]:
        opts = SamplingOptions(temperature, 0, top_p, seed)
        write_lm_input(tmp_path / "input.bin", prompt, 1, opts, True)
        run_elf(board, exe, tmp_path)
        out = read_lm_output(tmp_path / "output.bin", 1)
        assert out.logits is not None
        return int(out.tokens[0]), out.logits[-1].astype(np.float64)

    draws = [draw(seed, 1.0) for seed in range(n)]
    row = draws[0][1]
    p = np.exp((row - row.max()) / temperature)
    p /= p.sum()
    freq = np.bincount([t for t, _ in draws], minlength=row.size) / n
    bound = 4.0 * np.sqrt(p * (1.0 - p) / n) + 0.01
    worst = int(np.argmax(np.abs(freq - p) - bound))
    assert np.all(np.abs(freq - p) <= bound), (
        f"token {worst}: frequency {freq[worst]:.3f}, softmax {p[worst]:.3f} "
        f"(bound {bound[worst]:.3f})"
    )
    order = np.argsort(-p, kind="stable")
    keep = int(np.searchsorted(np.cumsum(p[order]), 0.5) + 1)
    nucleus = set(order[:keep].tolist())
    picked = {draw(seed, 0.5)[0] for seed in range(60)}
    assert picked <= nucleus and len(picked) >= min(2, keep)


# -- CLI, protocol, size report -------------------------------------------------------------------


def test_cli_generate_and_run(mixtral_gen: tuple[Path, Path], tmp_path: Path) -> None:
    ckpt, _ = mixtral_gen
    gen = tmp_path / "cli"
    proc = run_cli("generate", str(ckpt), "--out", str(gen), "--max-context", "40")
    assert "KV cache 5120 bytes for 40 positions" in proc.stdout
    args = ["run", str(gen), "--prompt-ids", "1,5,9", "--max-new-tokens", "8"]
    proc = run_cli(*args, "--output", str(tmp_path / "ids.npy"), "--logits", str(tmp_path / "l"))
    line = proc.stdout.strip().splitlines()[-1]
    ids = np.load(tmp_path / "ids.npy")
    assert ids.dtype == np.int32 and line == " ".join(str(int(t)) for t in ids) and len(ids) == 8
    assert np.load(tmp_path / "l.npy").shape == (3, 64)
    direct, _ = run_lm(gen, "host", [1, 5, 9], 8)
    assert direct.tokens.tolist() == ids.tolist()
    bad = run_cli(
        "generate",
        str(ckpt),
        "--layer",
        "0",
        "--out",
        str(tmp_path / "x"),
        "--max-context",
        "8",
        check=False,
    )
    assert bad.returncode == 1 and "--max-context applies to whole transformers" in bad.stderr
    bad = run_cli(*args[:2], "--prompt-ids", "1,2", "--max-new-tokens", "39", check=False)
    assert bad.returncode == 1 and "context overflow" in bad.stderr
    bad = run_cli("run", str(gen), "--input", "x.npy", "--output", "y.npy", check=False)
    assert bad.returncode == 1 and "--input / --routing are for single MoE" in bad.stderr
    bad = run_cli("run", str(gen), check=False)
    assert bad.returncode == 1 and "pass either --prompt-ids 1,5,9 or --prompt" in bad.stderr


def test_cli_byte_level_prompt(tmp_path: Path) -> None:
    """--prompt TEXT: one token per UTF-8 byte (vocab >= 256), generated bytes printed as text."""
    ckpt = save_model(make_model("olmoe", seed=4, vocab_size=256), tmp_path / "ckpt")
    gen = tmp_path / "gen"
    run_cli("generate", str(ckpt), "--out", str(gen), "--max-context", "24")
    proc = run_cli("run", str(gen), "--prompt", "héllo", "--max-new-tokens", "6")
    ids_line, text_line = proc.stdout.rstrip("\n").split("\n")[-2:]
    ids = [int(t) for t in ids_line.split()]
    direct, _ = run_lm(gen, "host", list("héllo".encode()), 6)
    assert ids == direct.tokens.tolist()
    assert text_line == bytes(ids).decode("utf-8", errors="replace")
    small = tmp_path / "small"
    run_cli("generate", str(ckpt.parent / "ckpt"), "--out", str(small), "--max-context", "8")
    bad = run_cli("run", str(small), "--prompt", "a", "--prompt-ids", "1", check=False)
    assert bad.returncode == 1 and "either --prompt-ids 1,5,9 or --prompt" in bad.stderr


def test_byte_prompt_needs_byte_vocabulary(mixtral_gen: tuple[Path, Path]) -> None:
    _, gen = mixtral_gen
    bad = run_cli("run", str(gen), "--prompt", "hi", check=False)
    assert bad.returncode == 1 and "this model has 64: pass --prompt-ids" in bad.stderr


def test_parse_ids_and_output_protocol(tmp_path: Path) -> None:
    assert parse_ids("1,5, 9") == [1, 5, 9]
    with pytest.raises(InputError, match="comma-separated integers"):
        parse_ids("1,x")
    raw = struct.pack("<4I", 0x47424C43, 4, 1, 1) + np.arange(4, dtype="<f4").tobytes()
    (tmp_path / "o.bin").write_bytes(raw + np.array([3, 2], "<i4").tobytes())
    out = read_lm_output(tmp_path / "o.bin", 2)
    assert out.tokens.tolist() == [3, 2] and out.logits is not None
    from colibri.errors import ColibriError

    (tmp_path / "o.bin").write_bytes(raw)
    with pytest.raises(ColibriError, match="the run stopped early"):
        read_lm_output(tmp_path / "o.bin", 2)


#: Per (experts, dense matrices) scheme: the functions its Cortex-M image must not hold.
#: fp32: no quantised kernel at all; int8: no int4 / fp16 kernel and no many-token matmul. Never
#: the generic colibri_tf_mat_rows (every scheme's kernels), only the model's own <name>_mat_rows.
UNCALLED_KERNELS = {
    ("fp32", "fp32"): r"colibri_(mat(vec|mul)_\w+_(q8|f32)|quantize_row_q8|dot_q\w+)",
    ("int8", "int8"): r"colibri_(mat(vec|mul)_(q4|f16)_\w+|matmul_\w+|dot_q4\w*)",
}


@pytest.mark.parametrize("quant", list(UNCALLED_KERNELS), ids="-".join)
def test_image_links_only_the_kernels_its_schemes_call(
    quant: tuple[str, str], tmp_path: Path, arch_models: dict[str, tuple[Path, Any]]
) -> None:
    """The step's matrix product is the generated <name>_mat_rows (one kernel), so the linker
    drops every other scheme's (issue 36: the shared step linked them all, +6.5 KB of .text)."""
    require_board("cortex-m4")
    path, _ = arch_models["mixtral"]
    experts, dense = quant
    model = load_hf_transformer(path)
    gen, _ = generate_lm(model, tmp_path / "g", "cortex-m4", "mx", 16, quant=experts, dense=dense)
    with build_model(gen, "cortex-m4").open("rb") as f:
        symtab = ELFFile(f).get_section_by_name(".symtab")
        funcs = {s.name for s in symtab.iter_symbols() if s["st_info"]["type"] == "STT_FUNC"}
    assert "mx_mat_rows" in funcs
    assert "colibri_linear_f32" in funcs or experts != "fp32"
    forbidden = re.compile(UNCALLED_KERNELS[quant] + r"|colibri_tf_(mat|swiglu)_rows")
    assert sorted(f for f in funcs if forbidden.fullmatch(f)) == []


def test_size_report_shows_kv_cache(mixtral_gen: tuple[Path, Path], tmp_path: Path) -> None:
    require_board("cortex-m7")
    ckpt, _ = mixtral_gen
    gen, manifest = generate_lm(load_hf_transformer(ckpt), tmp_path / "m7", "cortex-m7", "mx", 64)
    assert manifest["kind"] == "transformer"
    assert manifest["memory"]["kv_cache_bytes"] == 64 * 128
    proc = run_cli("size", str(gen), "--board", "cortex-m7")
    assert "kv_cache                      8192" in proc.stdout
    assert "transformer_ops" in proc.stdout


def test_generation_is_deterministic(mixtral_gen: tuple[Path, Path], tmp_path: Path) -> None:
    ckpt, _ = mixtral_gen
    model = load_hf_transformer(ckpt)
    a, _ = generate_lm(model, tmp_path / "a", "host", "mx", 16)
    b, _ = generate_lm(model, tmp_path / "b", "host", "mx", 16)
    for f in sorted(p.name for p in a.iterdir() if p.is_file()):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
