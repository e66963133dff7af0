"""The thread-safety contract of colibri.h under ThreadSanitizer (`scons board=host
sanitize=thread`): four threads, one handle each (colibri_init_shared /
colibri_init_shared_static on one model's weights), reproduce a single-threaded run bit for bit
with no race report, for a container, a seed-layout file and generated static models; the
misuse the contract forbids (four threads on one handle) is reported by the same harness, so a
clean run means something. TSAN_OPTIONS=halt_on_error=1: any race fails the program."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from conftest import IN_CI, ROOT, require_tool, run_colibri, run_in_root, scons_cmd

TEST_SOURCE = ROOT / "tests" / "c" / "threads" / "test_threads.c"
TSAN_FLAGS = ["-fsanitize=thread", "-fno-omit-frame-pointer", "-g", "-O1", "-pthread"]
C_FLAGS = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-ffp-contract=off"]
TSAN_ENV = {"TSAN_OPTIONS": "halt_on_error=1:second_deadlock_stack=1"}
SUMMARY = re.compile(r"^(\d+) passed, (\d+) failed$", re.MULTILINE)
RACE = "WARNING: ThreadSanitizer: data race"


def _scons() -> list[str]:
    return scons_cmd()


def _run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return run_in_root(cmd, TSAN_ENV, **kwargs)


def _colibri(*args: str) -> str:
    return run_colibri(TSAN_ENV, *args)


def _require_tsan(tmp: Path) -> None:
    """Skip (locally) or fail (CI) when gcc cannot build and run a TSan program."""
    require_tool("gcc", "gcc")
    src, exe = tmp / "probe.c", tmp / "probe"
    src.write_text("int main(void) { return 0; }\n")
    result = _run(["gcc", *TSAN_FLAGS, str(src), "-o", str(exe)])
    if result.returncode == 0:
        result = _run([str(exe)], timeout=60)
    if result.returncode != 0:
        message = f"gcc -fsanitize=thread does not work here (install libtsan2):\n{result.stderr}"
        if IN_CI:
            pytest.fail(f"{message} (CI=true: scripts/setup.sh installs gcc)")
        pytest.skip(message)


@pytest.fixture(scope="module")
def tsan_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("build_tsan")
    _require_tsan(out)
    result = _run(
        [*_scons(), "-Q", f"-C{ROOT}", "board=host", "sanitize=thread", f"build_dir={out}"],
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (out / "libcolibri.a").exists()
    return out


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A seed-layout toy (8 experts, top-2) and its container toy.clb beside the directory."""
    root = tmp_path_factory.mktemp("threads_toy")
    _colibri(
        "make-toy",
        "--out",
        str(root / "toy"),
        *("--experts", "8", "--hidden", "16", "--ff", "32", "--top-k", "2"),
    )
    _colibri("convert", str(root / "toy" / "model.bin"), "--out", str(root / "toy.clb"))
    return root


def _build(tsan_build: Path, exe: Path, extra: list[str]) -> None:
    cmd = [
        "gcc",
        *C_FLAGS,
        *TSAN_FLAGS,
        f"-I{ROOT / 'runtime_c' / 'include'}",
        f"-I{ROOT / 'runtime_c' / 'tiles'}",
        f"-I{ROOT / 'tests' / 'c'}",
        *extra,
        str(TEST_SOURCE),
        str(tsan_build / "libcolibri.a"),
        "-o",
        str(exe),
        "-lm",
    ]
    result = _run(cmd, timeout=120)
    assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stderr}"


def _assert_clean(result: subprocess.CompletedProcess[str]) -> str:
    output = result.stdout + result.stderr
    assert "ThreadSanitizer" not in output, output[-8000:]
    assert result.returncode == 0, output[-8000:]
    match = SUMMARY.search(result.stdout)
    assert match is not None, output
    assert int(match.group(1)) > 0 and int(match.group(2)) == 0, output
    return result.stdout


@pytest.fixture(scope="module")
def file_exe(tsan_build: Path) -> Path:
    exe = tsan_build / "test_threads"
    _build(tsan_build, exe, [])
    return exe


def test_library_is_tsan_instrumented(tsan_build: Path) -> None:
    nm = require_tool("nm", "binutils")
    symbols = _run([nm, str(tsan_build / "libcolibri.a")]).stdout
    assert "__tsan_func_entry" in symbols
    assert "__asan_report" not in symbols


def test_sanitize_thread_cannot_combine_with_address() -> None:
    result = _run([*_scons(), "-Q", "board=host", "sanitize=address,thread"], timeout=120)
    assert result.returncode != 0
    assert "thread and address cannot be combined" in result.stdout + result.stderr


def test_four_threads_on_file_models(file_exe: Path, toy: Path) -> None:
    """Container and seed layout: 3 threads make their handle with colibri_init_shared /
    _static while thread 0 runs on the base; handles outliving base are released by the
    worker threads (the reference count)."""
    stdout = _assert_clean(
        _run([str(file_exe), str(toy / "toy.clb"), str(toy / "toy" / "model.bin")], timeout=120)
    )
    assert stdout.count("4 threads, 1152 forwards, 0 mismatches") == 2, stdout


def test_one_handle_in_four_threads_is_reported(file_exe: Path, toy: Path) -> None:
    """The control: what the contract forbids is what TSan catches in this harness."""
    result = _run([str(file_exe), "--one-handle", str(toy / "toy.clb")], timeout=120)
    assert result.returncode != 0
    assert RACE in result.stderr, result.stderr[-4000:]


@pytest.mark.parametrize(
    ("quant", "scratch"),
    [
        ([], 0),
        (["--quant", "int8", "--act", "fp32"], 0),
        (["--quant", "int8", "--act", "int8"], 32 * (4 * 1 + 32)),
        (["--quant", "int4"], 32 * (4 * 1 + 32)),
    ],
    ids=["fp32", "int8-weights", "int8-int8", "int4-int8"],
)
def test_four_threads_on_generated_model(
    tsan_build: Path, toy: Path, tmp_path: Path, quant: list[str], scratch: int
) -> None:
    """A generated static model (const weights, LRU slots; quantised weights exercise packed
    slots): handles from colibri_init_shared_static in heap arenas and colibri_init_shared.
    With int8 activations (int8-int8, and int4 whose activations are int8 by default) each
    kernel quantises its rows into the calling handle's workspace, after the hidden rows
    (colibri_model_t.kernel_scratch_bytes: the rows of max(d_model 16, d_ff 32) values of a
    group of up to max_tokens (default 32) tokens)."""
    gen = tmp_path / "gen" / "toy"
    _colibri(
        "generate",
        str(toy / "toy" / "model.bin"),
        "--board",
        "host",
        "--cache",
        "lru",
        "--cache-slots",
        "3",
        *quant,
        "--out",
        str(gen),
    )
    source = (gen / "colibri_model.c").read_text()
    # int8 activations: the kernels quantise their rows (colibri_qinline.h's quantiser, its
    # out-of-line copy in colibri_qi_shared.h)
    assert ("colibri_qs_quantize_row_pad" in source) == (scratch > 0)
    assert "_ACT_Q_OFFSET" not in source + (gen / "colibri_model.h").read_text()
    exe = tmp_path / "test_threads_gen"
    _build(
        tsan_build,
        exe,
        [
            "-DCOLIBRI_TEST_GENERATED",
            f"-I{gen}",
            f"-Wa,-I{gen}",
            *map(str, sorted(gen.glob("*.c"))),
        ],
    )
    stdout = _assert_clean(_run([str(exe)], timeout=120))
    assert f"kernel scratch {scratch} bytes" in stdout, stdout
    assert stdout.count("4 threads, 1152 forwards, 0 mismatches") == 2, stdout
