"""The documented sanitizer switch, `scons board=host sanitize=address,undefined`: the C unit
tests linked against the sanitized libcolibri.a, and end-to-end host models built by SCons with
ASan + UBSan, run clean and checked against `colibri reference` with the same flags:

- a single MoE layer (a seed-layout toy from the CLI, exact gelu) in every scheme: fp32 within
  LAYER_TOLERANCE of the float64 reference; fp16, int8 and int4 (int8 activations) and int8 with
  fp32 activations equal to the quantised mirror bit for bit (colibri_gelu is colibri_math.h's,
  no libm); the same routing;
- the whole trained transformer tests/data/trained_moe (a Hugging Face Mixtral), fp32, int8,
  int4 and int8 + int8 dense matrices, teacher-forced on held-out tokens: the logits of every
  prompt position (the quantised ones equal to the numpy mirror bit for bit, fp32 within
  LOGIT_TOLERANCE) and the greedy tokens after the prompt.

Any sanitizer report fails the run (halt_on_error, UBSan without recovery). The sanitized
libcolibri.a is built once (module fixture) and every model is built into the same build_dir,
so SCons compiles only each model's own sources and runner."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from colibri.quant.formats import LAYER_TOLERANCE
from colibri.reference.transformer import LOGIT_TOLERANCE
from colibri.targets.lmrun import SamplingOptions, read_lm_output, write_lm_input
from conftest import ROOT, require_tool, run_colibri, run_in_root, scons_cmd

SANITIZE = "address,undefined"
SAN_FLAGS = [
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=undefined",
    "-fno-omit-frame-pointer",
    "-g",
]
SAN_ENV = {
    "ASAN_OPTIONS": "halt_on_error=1:abort_on_error=0:detect_leaks=1",
    "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
}
RUNNER_IN_MAGIC = 0x49424C43  # "CLBI", runtime_c/runner/main.c
RUNNER_OUT_MAGIC = 0x4F424C43  # "CLBO"
#: The whole transformer: the committed trained checkpoint, a prompt of held-out tokens (from
#: heldout.txt, which the model never saw), greedy tokens after it and the KV cache size.
CHECKPOINT = ROOT / "tests" / "data" / "trained_moe"
PROMPT_TOKENS = 24
MAX_NEW_TOKENS = 4
MAX_CONTEXT = 64


def _scons() -> list[str]:
    return scons_cmd()


def _run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return run_in_root(cmd, SAN_ENV, **kwargs)


def _colibri(*args: str) -> str:
    return run_colibri(SAN_ENV, *args)


def _assert_clean(result: subprocess.CompletedProcess[str]) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "ERROR: AddressSanitizer" not in output, output[-6000:]
    assert "runtime error:" not in output, output[-6000:]


@pytest.fixture(scope="module")
def sanitized_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sanitized libcolibri.a, in the build_dir every model of this module is built into."""
    require_tool("gcc", "gcc")
    out = tmp_path_factory.mktemp("build_asan")
    result = _run(
        [*_scons(), "-Q", f"-C{ROOT}", "board=host", f"sanitize={SANITIZE}", f"build_dir={out}"],
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (out / "libcolibri.a").exists()
    return out


def test_sanitize_rejected_for_other_boards() -> None:
    result = _run([*_scons(), "-Q", "board=cortex-m4", f"sanitize={SANITIZE}"], timeout=120)
    assert result.returncode != 0
    assert "needs board=host" in result.stdout + result.stderr


def test_sanitize_rejects_unknown_sanitizer() -> None:
    result = _run([*_scons(), "-Q", "board=host", "sanitize=address,memory"], timeout=120)
    assert result.returncode != 0
    assert "unknown sanitizer(s) memory" in result.stdout + result.stderr


def test_library_is_instrumented(sanitized_build: Path) -> None:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm not found; install it with: apt-get install binutils")
    symbols = _run([nm, str(sanitized_build / "libcolibri.a")]).stdout
    assert "__asan_report" in symbols
    assert "__ubsan_handle" in symbols


@pytest.mark.parametrize(
    "test_source", sorted((ROOT / "tests" / "c").glob("*.c")), ids=lambda p: p.stem
)
def test_c_unit_tests_sanitized(test_source: Path, sanitized_build: Path, tmp_path: Path) -> None:
    exe = tmp_path / test_source.stem
    cmd = [
        "gcc",
        "-std=c11",
        "-O1",
        "-ffp-contract=off",
        *SAN_FLAGS,
        f"-I{ROOT / 'runtime_c' / 'include'}",
        f"-I{ROOT / 'runtime_c' / 'tiles'}",
        f"-I{ROOT / 'runtime_c' / 'src'}",  # test_crc.c: colibri_internal.h
        f"-I{ROOT / 'tests' / 'c'}",
        str(test_source),
        str(sanitized_build / "libcolibri.a"),
        "-o",
        str(exe),
        "-lm",
    ]
    result = _run(cmd)
    assert result.returncode == 0, result.stderr
    result = _run([str(exe)], timeout=300)
    _assert_clean(result)
    assert " 0 failed" in result.stdout, result.stdout


def _build_model(gen: Path, build: Path) -> Path:
    """SCons with the switch (`colibri build` passes no build variables), into the shared
    build_dir: libcolibri.a is up to date, only the model and its runner are compiled."""
    result = _run(
        [
            *_scons(),
            "-Q",
            f"-C{ROOT}",
            "board=host",
            f"model={gen}",
            f"build_dir={build}",
            f"sanitize={SANITIZE}",
        ],
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    runner = build / gen.name / "colibri_runner"
    assert "__asan_init" in _run(["nm", str(runner)]).stdout
    return runner


def _read_runner_output(path: Path) -> tuple[np.ndarray, np.ndarray]:
    data = path.read_bytes()
    magic, tokens, d_model, top_k, chunk = struct.unpack_from("<5I", data)
    assert magic == RUNNER_OUT_MAGIC
    outputs, ids = [], []
    pos = 20
    for start in range(0, tokens, chunk):
        n = min(chunk, tokens - start)
        outputs.append(np.frombuffer(data, "<f4", n * d_model, pos).reshape(n, d_model))
        pos += 4 * n * d_model
        ids.append(np.frombuffer(data, "<i4", n * top_k, pos).reshape(n, top_k))
        pos += 4 * n * top_k + 4 * n * top_k  # expert ids, then gates
    assert pos == len(data)
    return np.concatenate(outputs), np.concatenate(ids)


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A seed-layout toy layer, its input rows x.npy and the runner's input.bin."""
    out = tmp_path_factory.mktemp("toy")
    _colibri("make-toy", "--out", str(out), "--experts", "6", "--hidden", "16", "--ff", "32")
    rng = np.random.default_rng(14)
    x = rng.standard_normal((45, 16)).astype(np.float32)  # more tokens than one chunk
    np.save(out / "x.npy", x)
    header = struct.pack("<3I", RUNNER_IN_MAGIC, *x.shape)
    (out / "input.bin").write_bytes(header + x.astype("<f4").tobytes())
    return out


#: (id, generate / reference flags, LAYER_TOLERANCE key (weights, activations)): the fp32
#: layer is compared within its tolerance, the quantised ones bit for bit.
LAYER_SCHEMES = [
    ("fp32", [], ("fp32", "fp32")),
    ("fp16", ["--quant", "fp16"], ("fp16", "fp32")),
    ("int8", ["--quant", "int8"], ("int8", "int8")),
    ("int8-act-fp32", ["--quant", "int8", "--act", "fp32"], ("int8", "fp32")),
    ("int4", ["--quant", "int4"], ("int4", "int8")),
]


@pytest.mark.parametrize(("name", "flags", "key"), LAYER_SCHEMES, ids=[s[0] for s in LAYER_SCHEMES])
def test_end_to_end_layer_sanitized(
    name: str,
    flags: list[str],
    key: tuple[str, str],
    toy: Path,
    sanitized_build: Path,
    tmp_path: Path,
) -> None:
    gen = tmp_path / f"toy_{name.replace('-', '_')}"
    _colibri("generate", str(toy / "model.bin"), "--board", "host", "--out", str(gen), *flags)
    runner = _build_model(gen, sanitized_build)

    out = tmp_path / "output.bin"
    _assert_clean(_run([str(runner), str(toy / "input.bin"), str(out)], timeout=120))
    y, expert_ids = _read_runner_output(out)

    y_ref, routing = tmp_path / "y_ref.npy", tmp_path / "routing.npz"
    _colibri(
        "reference",
        str(toy / "model.bin"),
        "--input",
        str(toy / "x.npy"),
        "--output",
        str(y_ref),
        "--routing",
        str(routing),
        *flags,
    )
    want = np.load(y_ref)
    np.testing.assert_array_equal(expert_ids, np.load(routing)["expert_ids"])
    if key[0] == "fp32":
        scale = float(np.max(np.abs(want)))
        np.testing.assert_allclose(y, want, rtol=0, atol=LAYER_TOLERANCE[key] * scale)
    else:
        np.testing.assert_array_equal(y, want.astype(np.float32))


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    """PROMPT_TOKENS held-out token ids (heldout.txt through the checkpoint's tokenizer)."""
    from colibri.frontends.tokenizer import load_tokenizer

    text = (CHECKPOINT / "heldout.txt").read_text(encoding="utf-8")
    ids = load_tokenizer(CHECKPOINT / "tokenizer.json").encode(text[:2000])
    assert len(ids) >= PROMPT_TOKENS
    return [int(t) for t in ids[:PROMPT_TOKENS]]


#: (id, generate / reference flags, max |C - reference| over the logits): the quantised C
#: repeats the numpy mirror bit for bit; fp32 is compared with the float reference.
TRANSFORMER_SCHEMES = [
    ("fp32", [], LOGIT_TOLERANCE),
    ("int8", ["--quant", "int8"], 0.0),
    ("int4", ["--quant", "int4"], 0.0),
    ("int8-dense-int8", ["--quant", "int8", "--dense-quant", "int8"], 0.0),
    ("int4-dense-int4", ["--quant", "int4", "--dense-quant", "int4"], 0.0),
    ("int4-dense-q4k", ["--quant", "int4", "--dense-quant", "q4k"], 0.0),
]


@pytest.mark.parametrize(
    ("name", "flags", "tolerance"), TRANSFORMER_SCHEMES, ids=[s[0] for s in TRANSFORMER_SCHEMES]
)
def test_end_to_end_transformer_sanitized(
    name: str,
    flags: list[str],
    tolerance: float,
    prompt: list[int],
    sanitized_build: Path,
    tmp_path: Path,
) -> None:
    """The whole trained Mixtral, teacher-forced on held-out tokens (logits of every prompt
    position) and then generating greedily, under ASan + UBSan."""
    gen = tmp_path / f"lm_{name.replace('-', '_')}"
    context = ["--max-context", str(MAX_CONTEXT)]
    _colibri("generate", str(CHECKPOINT), "--out", str(gen), *context, *flags)
    runner = _build_model(gen, sanitized_build)

    inp, out = tmp_path / "input.bin", tmp_path / "output.bin"
    write_lm_input(inp, prompt, MAX_NEW_TOKENS, SamplingOptions(), logits=True)
    _assert_clean(_run([str(runner), str(inp), str(out)], timeout=120))
    got = read_lm_output(out, MAX_NEW_TOKENS)
    assert got.logits is not None

    ref_logits = tmp_path / "r.npy"
    stdout = _colibri(
        "reference",
        str(CHECKPOINT),
        "--prompt-ids",
        ",".join(map(str, prompt)),
        "--logits",
        str(ref_logits),
        "--max-new-tokens",
        str(MAX_NEW_TOKENS),
        *context,
        *flags,
    )
    want = np.load(ref_logits)
    assert got.logits.shape == want.shape == (PROMPT_TOKENS, 1024)
    assert np.all(np.isfinite(got.logits))
    diff = float(np.max(np.abs(got.logits.astype(np.float64) - want)))
    assert diff <= tolerance, f"{name}: max |C - reference| logit difference {diff:.3g}"
    match = re.search(r"generated ids: ([0-9, ]+)", stdout)
    assert match, stdout
    assert got.tokens.tolist() == [int(t) for t in match.group(1).replace(",", " ").split()]
