"""libFuzzer harnesses of colibri_init (fuzz/): build them with clang and ASan + UBSan, check
that the allocation limit of fuzz/fuzz_common.h trips when it should and holds on hostile
headers, then fuzz each harness for at least 60 s from a seed corpus made by the CLI (no crash,
no sanitizer report, no allocation beyond the limit)."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

FUZZ_DIR = ROOT / "fuzz"
HARNESSES = ("fuzz_container", "fuzz_seed")
DICTS = {"fuzz_container": "container.dict", "fuzz_seed": "seed.dict"}
CORPUS = {"fuzz_container": "container", "fuzz_seed": "seed"}
# CI runs each harness for 60 s; COLIBRI_FUZZ_SECONDS may ask for longer, never shorter.
FUZZ_SECONDS = max(60, int(os.environ.get("COLIBRI_FUZZ_SECONDS", "60")))
# Inputs up to 8 KiB: no allocation may be larger than the input (fuzz_common.h);
# libFuzzer's own limits catch anything that slips past the hook.
FUZZ_FLAGS = [
    "-max_len=8192",
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
FAILURE_MARKERS = ("ERROR:", "runtime error:", "colibri fuzz: allocation of", "deadly signal")


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
        "    (void)data;\n    fuzz_arm(size);\n"
        "    void *volatile p = malloc(size + 1u);\n"
        "    fuzz_disarm();\n    free(p);\n    return 0;\n}\n"
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


@pytest.mark.parametrize("harness", HARNESSES)
def test_fuzz_short_run(harness: str, harness_dir: Path, corpus_dir: Path, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    shutil.copytree(corpus_dir / CORPUS[harness], corpus)
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    args = [
        f"-max_total_time={FUZZ_SECONDS}",
        f"-dict={FUZZ_DIR / DICTS[harness]}",
        f"-artifact_prefix={artifacts}/",
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
