"""libFuzzer harnesses of every C entry point that reads a file (fuzz/): colibri_init
(fuzz_container, fuzz_seed), colibri_lm_* (fuzz_lm) and colibri_init_shared (fuzz_shared).
Build them with clang and ASan + UBSan, check that the allocation limit of fuzz/fuzz_common.h
and the live-bytes bound of fuzz/fuzz_live.h trip when they should and hold on hostile files,
then fuzz each harness for at least 60 s from a seed corpus made by the CLI (no crash, no
sanitizer report, no allocation beyond the documented bounds)."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from conftest import ROOT
from hf_tiny import make_model, require_torch, save_model

FUZZ_DIR = ROOT / "fuzz"
HARNESSES = ("fuzz_container", "fuzz_seed", "fuzz_lm", "fuzz_shared")
DICTS = {
    "fuzz_container": "container.dict",
    "fuzz_seed": "seed.dict",
    "fuzz_lm": "lm.dict",
    "fuzz_shared": "container.dict",
}
# Corpus directories of fuzz/make_corpus.py each harness starts from.
CORPUS = {
    "fuzz_container": ("container",),
    "fuzz_seed": ("seed",),
    "fuzz_lm": ("lm",),
    "fuzz_shared": ("container", "seed"),
}
# Whole-model files are up to 13 KB (fuzz/make_corpus.py).
MAX_LEN = {"fuzz_lm": 16384}
# CI runs each harness for 60 s; COLIBRI_FUZZ_SECONDS may ask for longer, never shorter.
FUZZ_SECONDS = max(60, int(os.environ.get("COLIBRI_FUZZ_SECONDS", "60")))
# Inputs up to 8 KiB: no allocation may be larger than the input (fuzz_common.h);
# libFuzzer's own limits catch anything that slips past the hook.
FUZZ_FLAGS = [
    "-timeout=10",
    "-rss_limit_mb=2048",
    "-malloc_limit_mb=64",
    "-print_final_stats=1",
]
SAN_ENV = {
    "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=1:allocator_may_return_null=0",
    "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
}
EXECS = re.compile(r"^stat::number_of_executed_units:\s*(\d+)$", re.MULTILINE)
RATE = re.compile(r"^stat::average_exec_per_sec:\s*(\d+)$", re.MULTILINE)
LARGEST = re.compile(r"largest runtime allocation (\d+) bytes \(input (\d+) bytes\)")
LIVE_PEAK = re.compile(r"largest live peak (\d+) bytes \(input (\d+) bytes")
TABLE = re.compile(r"largest table_bytes (\d+) bytes \(input (\d+) bytes")
FAILURE_MARKERS = (
    "ERROR:",
    "runtime error:",
    "colibri fuzz: allocation of",
    "live bytes for a",
    "deadly signal",
)


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def _require_clang() -> None:
    if shutil.which("clang") is None:
        message = "clang not found; install it with: apt-get install clang libclang-rt-14-dev"
        if _in_ci():
            pytest.fail(f"{message} (CI=true: toolchains the setup installs must not be skipped)")
        pytest.skip(message)


def _build(out: Path, *sources: Path, objects: Path | None = None) -> None:
    """fuzz/build.sh into out; objects: the runtime objects of an earlier build to link."""
    env = dict(os.environ)
    if objects is not None:
        env["FUZZ_OBJ_DIR"] = str(objects)
    result = subprocess.run(
        ["bash", str(FUZZ_DIR / "build.sh"), str(out), *map(str, sources)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        check=False,
    )
    assert result.returncode == 0, f"fuzz/build.sh failed:\n{result.stdout}{result.stderr}"


def _run(exe: Path, args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, **SAN_ENV)
    return subprocess.run(
        [str(exe), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=timeout,
        check=False,
    )


def _assert_clean(result: subprocess.CompletedProcess[str]) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    for marker in FAILURE_MARKERS:
        assert marker not in output, output[-6000:]


@pytest.fixture(scope="module")
def harness_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _require_clang()
    out = tmp_path_factory.mktemp("fuzz_bin")
    _build(out)
    return out


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fuzz_corpus")
    result = subprocess.run(
        [sys.executable, str(FUZZ_DIR / "make_corpus.py"), str(out), "--python", sys.executable],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(p.name for p in (out / "container").iterdir())
    assert sorted(p.name for p in (out / "seed").iterdir())
    return out


def _lm_corpus(corpus: Path) -> Path:
    """The whole-model corpus (written only with torch / transformers installed)."""
    lm = corpus / "lm"
    if not lm.is_dir():
        require_torch()
        pytest.fail("fuzz/make_corpus.py wrote no whole-model corpus with torch installed")
    return lm


def test_allocation_limit_trips(harness_dir: Path, tmp_path: Path) -> None:
    """The hook is live: a harness that allocates past the limit while armed is a crash."""
    canary = tmp_path / "fuzz_canary.c"
    canary.write_text(
        '#include "fuzz_common.h"\n'
        "int LLVMFuzzerInitialize(int *argc, char ***argv);\n"
        "int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);\n"
        "int LLVMFuzzerInitialize(int *argc, char ***argv)\n{\n"
        "    (void)argc;\n    (void)argv;\n    fuzz_setup();\n    return 0;\n}\n"
        "int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)\n{\n"
        "    (void)data;\n"
        '    fuzz_live_arm2(4u * size, size, "4 x the files (colibri_init)", size);\n'
        "    void *volatile p = malloc(size + 1u);\n"
        "    fuzz_live_disarm();\n    free(p);\n    return 0;\n}\n"
    )
    _build(tmp_path, canary, objects=harness_dir / "obj")
    sample = tmp_path / "input"
    sample.write_bytes(b"x" * 100)
    result = _run(tmp_path / "fuzz_canary", [str(sample)], tmp_path, timeout=60)
    assert result.returncode != 0
    assert "colibri fuzz: allocation of 101 bytes for a 100-byte input" in result.stderr


def _hostile_inputs(corpus: Path) -> dict[str, bytes]:
    """Corpus files with header fields that used to drive allocations (issue 14)."""
    clb = (corpus / "container" / "relu_e2_d4_f4_k1_bias.clb").read_bytes()  # 1,872 bytes today

    def patched(offset: int, fmt: str, value: int) -> bytes:
        data = bytearray(clb)
        struct.pack_into(fmt, data, offset, value)
        return bytes(data)

    seed = (corpus / "seed" / "relu_e2_d4_f4_k1_bias.bin").read_bytes()
    config_len, router_len = struct.unpack_from("<HH", seed)
    config = b'{"n_experts": 2, "k": 1, "hidden_size": 4, "intermediate_size": 67108864}'
    hostile_seed = struct.pack("<HH", len(config), router_len) + config + seed[4 + config_len :]
    return {
        "d_ff_2_26.clb": patched(28, "<I", 1 << 26),
        "d_ff_2_20.clb": patched(28, "<I", 1 << 20),
        "d_model_2_24.clb": patched(24, "<I", 1 << 24),
        "experts_65535.clb": patched(16, "<I", 65535),
        "n_tensors_max.clb": patched(40, "<I", 0xFFFFFFFF),
        "tensor_nbytes_huge.clb": patched(128 + 80, "<Q", 1 << 62),
        "d_ff_2_26_seed.bin": hostile_seed,
    }


def test_hostile_headers_allocate_nothing_large(
    harness_dir: Path, corpus_dir: Path, tmp_path: Path
) -> None:
    for name, data in _hostile_inputs(corpus_dir).items():
        path = tmp_path / name
        path.write_bytes(data)
        exe = harness_dir / ("fuzz_seed" if name.endswith(".bin") else "fuzz_container")
        result = _run(exe, [str(path)], tmp_path, timeout=60)
        _assert_clean(result)
        largest = LARGEST.search(result.stderr)
        assert largest is not None, result.stderr[-3000:]
        assert int(largest.group(1)) <= len(data), f"{name}: {largest.group(0)}"
        peak = LIVE_PEAK.search(result.stderr)  # colibri.h: colibri_init holds <= 4 F at once
        assert peak is not None, result.stderr[-3000:]
        assert int(peak.group(1)) <= 4 * len(data), f"{name}: {peak.group(0)}"


def test_live_bound_trips(harness_dir: Path, tmp_path: Path) -> None:
    """fuzz_live.h's hook is live: two allocations, each under the bound, whose sum while both
    are held exceeds it, are a crash; freeing one first keeps the peak under it."""
    canary = tmp_path / "fuzz_live_canary.c"
    canary.write_text(
        '#include "fuzz_live.h"\n'
        "int LLVMFuzzerInitialize(int *argc, char ***argv);\n"
        "int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);\n"
        "int LLVMFuzzerInitialize(int *argc, char ***argv)\n{\n"
        "    (void)argc;\n    (void)argv;\n    fuzz_live_setup(NULL);\n    return 0;\n}\n"
        "int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)\n{\n"
        '    fuzz_live_arm(size, "the canary\'s bound", size);\n'
        "    void *volatile a = malloc(size / 2u + 1u);\n"
        "    if (data[0] == 'f') {\n        free(a);\n        a = NULL;\n    }\n"
        "    void *volatile b = malloc(size / 2u + 1u);\n"
        "    fuzz_live_disarm();\n    free(a);\n    free(b);\n    return 0;\n}\n"
    )
    _build(tmp_path, canary, objects=harness_dir / "obj")
    held, freed = tmp_path / "held", tmp_path / "freed"
    held.write_bytes(b"h" * 100)
    freed.write_bytes(b"f" * 100)
    result = _run(tmp_path / "fuzz_live_canary", [str(held)], tmp_path, timeout=60)
    assert result.returncode != 0
    assert "colibri fuzz: 102 live bytes for a 100-byte input exceed the canary's bound" in (
        result.stderr
    )
    result = _run(tmp_path / "fuzz_live_canary", [str(freed)], tmp_path, timeout=60)
    _assert_clean(result)
    assert "largest live peak 51 bytes (input 100 bytes" in result.stderr


def _set_crcs(data: bytearray) -> None:
    """Recompute every tensor CRC-32 of a version-2 container (docs/format.md, section 1b)."""
    n_tensors, table = struct.unpack_from("<I", data, 20)[0], struct.unpack_from("<Q", data, 32)[0]
    for i in range(n_tensors):
        entry = table + 96 * i
        offset, nbytes = struct.unpack_from("<QQ", data, entry + 72)
        struct.pack_into("<I", data, entry + 92, zlib.crc32(data[offset : offset + nbytes]))


def _entry_offset(data: bytes | bytearray, name: str) -> int:
    """The blob offset of tensor `name` of a version-2 container."""
    n_tensors, table = struct.unpack_from("<I", data, 20)[0], struct.unpack_from("<Q", data, 32)[0]
    for i in range(n_tensors):
        entry = table + 96 * i
        if data[entry : entry + 48].rstrip(b"\0") == name.encode():
            return int(struct.unpack_from("<Q", data, entry + 72)[0])
    raise KeyError(name)


def _run_lm(harness_dir: Path, path: Path, tmp_path: Path, context: int | None = None) -> str:
    """fuzz_lm on one file: clean, and its stderr."""
    env = {} if context is None else {"COLIBRI_FUZZ_LM_CONTEXT": str(context)}
    result = subprocess.run(
        [str(harness_dir / "fuzz_lm"), "-rss_limit_mb=4096", str(path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=dict(os.environ, **SAN_ENV, **env),
        timeout=300,
        check=False,
    )
    _assert_clean(result)
    return result.stderr


def test_lm_hostile_d_ff_loads_small(harness_dir: Path, corpus_dir: Path, tmp_path: Path) -> None:
    """Issue 37: one layer descriptor's d_ff set to 2^24 with the CRCs fixed (an 8 KB file
    asked malloc for 19.6 GB before the runtime checked shapes before sizing): now refused,
    with at most the tables allocated (table_bytes <= 24 x the file, the live peak too)."""
    data = bytearray((_lm_corpus(corpus_dir) / "mixtral_fp32.clb").read_bytes())
    struct.pack_into("<i", data, _entry_offset(data, "layer.0.desc") + 12, 1 << 24)
    _set_crcs(data)
    path = tmp_path / "d_ff_2_24.clb"
    path.write_bytes(bytes(data))
    for context in (0, 8):
        stderr = _run_lm(harness_dir, path, tmp_path, context)
        peak = LIVE_PEAK.search(stderr)
        assert peak is not None, stderr[-3000:]
        assert int(peak.group(1)) <= 24 * len(data), peak.group(0)
        assert "0 inputs loaded" in stderr, stderr[-3000:]


def test_lm_many_kv_heads_bounded(harness_dir: Path, tmp_path: Path) -> None:
    """Issue 37: a valid file of 4,096 KV heads and 16,384 positions (colibri convert) had a
    1.08 GB arena at load; the KV cache is now sized from the caller's context (default 2048,
    here 16), and fuzz_lm's live-bytes bound (the measured total) holds."""
    require_torch()
    model = make_model(
        "mixtral",
        hidden_size=8,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=4096,
        num_key_value_heads=4096,
        head_dim=2,
        max_position_embeddings=16384,
        vocab_size=16,
        num_local_experts=2,
        num_experts_per_tok=1,
    )
    ckpt = save_model(model, tmp_path / "ckpt")
    clb = tmp_path / "kv4096.clb"
    convert = subprocess.run(
        [sys.executable, "-m", "colibri", "convert", str(ckpt), "--out", str(clb), "-q"]
        + ["--dense-quant", "int8", "--max-context", "16384"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert convert.returncode == 0, convert.stderr
    kv_full = 8 * 1 * 4096 * 2 * 16384  # the 16,384-position KV cache: 1.07 GB
    # context 16: a few MB (the activations of 8,192-wide attention rows); the default 2048:
    # the 134 MB KV cache of 2,048 positions and those activations, a quarter of the old arena
    for context, ceiling in ((16, 16 << 20), (0, kv_full // 4)):
        stderr = _run_lm(harness_dir, clb, tmp_path, context)
        peak = LIVE_PEAK.search(stderr)
        assert peak is not None, stderr[-3000:]
        assert " 0 inputs loaded" not in stderr, stderr[-3000:]
        assert int(peak.group(1)) <= ceiling, f"context {context}: {peak.group(0)}"


def test_shared_handle_blocks_bounded(harness_dir: Path, corpus_dir: Path, tmp_path: Path) -> None:
    """Issue 37: colibri_init_shared allocated one block of descriptor + workspace + slots,
    up to 2.47x the model's files (1,232 B for a 504-byte seed model); now three blocks, none
    larger than the files, at most 3x together (colibri.h, "Memory"), for every corpus file."""
    for path in sorted((corpus_dir / "seed").iterdir()) + sorted(
        (corpus_dir / "container").iterdir()
    ):
        result = _run(harness_dir / "fuzz_shared", [str(path)], tmp_path, timeout=60)
        _assert_clean(result)
        peak = LIVE_PEAK.search(result.stderr)
        assert peak is not None, result.stderr[-3000:]
        assert int(peak.group(1)) <= 3 * path.stat().st_size, f"{path.name}: {peak.group(0)}"
        assert "0 shared handles made" not in result.stderr, f"{path.name}: no shared handle"


@pytest.mark.parametrize("harness", HARNESSES)
def test_fuzz_short_run(harness: str, harness_dir: Path, corpus_dir: Path, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for part in CORPUS[harness]:
        source = _lm_corpus(corpus_dir) if part == "lm" else corpus_dir / part
        for path in source.iterdir():
            shutil.copyfile(path, corpus / path.name)
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    args = [
        f"-max_total_time={FUZZ_SECONDS}",
        f"-dict={FUZZ_DIR / DICTS[harness]}",
        f"-artifact_prefix={artifacts}/",
        f"-max_len={MAX_LEN.get(harness, 8192)}",
        *FUZZ_FLAGS,
        str(corpus),
    ]
    result = _run(harness_dir / harness, args, tmp_path, timeout=FUZZ_SECONDS + 240)
    _assert_clean(result)
    assert not list(artifacts.iterdir()), "libFuzzer wrote crash artifacts"
    execs, rate = EXECS.search(result.stderr), RATE.search(result.stderr)
    assert execs is not None and rate is not None, result.stderr[-3000:]
    assert int(execs.group(1)) > 1000
    print(f"{harness}: {execs.group(1)} executions, {rate.group(1)} exec/s")
