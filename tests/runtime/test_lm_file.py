"""Whole models in the container (format version 2, colibri/emit/lmfile.py, runtime_c/src/lm_*.c,
runtime_c/runner/lmfile_main.c): the file run by the prebuilt model-file runner gives the
generated C's logits bit for bit (every scheme, host and cortex-a53), fp32 matches transformers,
the Python reader reads back what was written, every bad file is a named status (never a crash)
and the CLI converts and runs it."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from colibri.cli.pipeline import quantise_transformer
from colibri.emit.lmfile import lm_container_bytes, write_lm_container
from colibri.errors import BindingValueError, ModelFormatError
from colibri.frontends.container import (
    ENTRY,
    ENTRY_SIZE,
    HEADER_FIELDS,
    HEADER_SIZE,
    read_lm_container,
)
from colibri.frontends.hf_model import load_hf_transformer
from colibri.ir.transformer import MoETransformer
from colibri.paths import runtime_sources
from colibri.targets.binding import LM, RuntimeStatusError
from colibri.targets.lmrun import run_lm, run_lm_file
from conftest import require_board, run_cli
from hf_tiny import (
    ARCHS,
    assert_logits_close,
    assert_same_tokens,
    generate_lm,
    hf_reference,
    lm_options,
    make_model,
    require_torch,
    save_model,
)

MAX_CONTEXT = 32
PROMPT = [3, 17, 5, 60, 9, 41]
N_NEW = 8
#: The schemes of the issue: fp32, int8 / int4 routed experts, int8 experts + int8 dense; q4k /
#: q5k routed experts (issue 38); and 4- / 5-bit dense matrices (issue 41 item 5).
SCHEMES: dict[str, dict[str, str]] = {
    "fp32": {},
    "int8": {"quant": "int8"},
    "int4": {"quant": "int4"},
    "int8-dense-int8": {"quant": "int8", "dense": "int8"},
    "q4k": {"quant": "q4k"},
    "q5k": {"quant": "q5k"},
    # every other matrix (attention, shared expert / dense MLP, embedding, LM head) 4- / 5-bit
    "int4-dense-int4": {"quant": "int4", "dense": "int4"},
    "int4-dense-q4k": {"quant": "int4", "dense": "q4k"},
    "q5k-dense-q5k": {"quant": "q5k", "dense": "q5k"},
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[MoETransformer, Any]]:
    """One seeded tiny checkpoint per architecture: (our IR, transformers model)."""
    require_torch()
    out = {}
    for i, arch in enumerate(ARCHS):
        hf = make_model(arch, seed=70 + i)
        path = save_model(hf, tmp_path_factory.mktemp(arch) / "ckpt")
        out[arch] = (load_hf_transformer(path), hf)
    return out


def _container(model: MoETransformer, scheme: str, path: Path) -> Path:
    """The container of `model` quantised as `colibri generate` would (the same pipeline)."""
    q, _ = quantise_transformer(model, lm_options("host", "lm", MAX_CONTEXT, **SCHEMES[scheme]))
    return write_lm_container(model, q, path, MAX_CONTEXT)


def _assert_bit_identical(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape, what
    diff = np.abs(got.astype(np.float64) - want)
    worst = np.unravel_index(diff.argmax(), diff.shape)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (
        f"{what}: max |logit diff| {diff.max():.3g} at {worst}"
    )


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("arch", ARCHS)
def test_container_equals_generated_c_on_host(
    models: dict[str, tuple[MoETransformer, Any]], tmp_path: Path, arch: str, scheme: str
) -> None:
    """Prompt logits and greedy tokens of the container (model-file runner and the Python
    binding) are the generated C's, bit for bit: the same stored bytes, the same operations in
    the same order (fp32 included)."""
    ours, _ = models[arch]
    clb = _container(ours, scheme, tmp_path / "m.clb")
    gen, _ = generate_lm(ours, tmp_path / "gen", "host", "lm", MAX_CONTEXT, **SCHEMES[scheme])
    ref, _ = run_lm(gen, "host", PROMPT, N_NEW, want_logits=True)
    out, _ = run_lm_file(clb, "host", PROMPT, N_NEW, want_logits=True)
    assert out.logits is not None and ref.logits is not None
    _assert_bit_identical(out.logits, ref.logits, f"{arch} {scheme}: model file vs generated C")
    assert out.tokens.tolist() == ref.tokens.tolist()
    with LM(clb) as lm:
        logits, ids = lm.generate(PROMPT, N_NEW)
    _assert_bit_identical(logits.astype(np.float32), ref.logits, f"{arch} {scheme}: binding")
    assert ids == ref.tokens.tolist()


@pytest.mark.parametrize(
    ("arch", "scheme"),
    [(a, "int8-dense-int8") for a in ARCHS]
    + [("mixtral", "int4"), ("qwen2_moe", "int4-dense-int4")],
)
def test_container_equals_generated_c_on_cortex_a53(
    models: dict[str, tuple[MoETransformer, Any]], tmp_path: Path, arch: str, scheme: str
) -> None:
    """The same on a Cortex-A53 (qemu-aarch64): the prebuilt runner mmaps the file there too."""
    require_board("cortex-a53")
    ours, _ = models[arch]
    clb = _container(ours, scheme, tmp_path / "m.clb")
    gen, _ = generate_lm(ours, tmp_path / "gen", "cortex-a53", "lm", MAX_CONTEXT, **SCHEMES[scheme])
    ref, _ = run_lm(gen, "cortex-a53", PROMPT, N_NEW, want_logits=True)
    out, _ = run_lm_file(clb, "cortex-a53", PROMPT, N_NEW, want_logits=True)
    assert out.logits is not None and ref.logits is not None
    _assert_bit_identical(out.logits, ref.logits, f"{arch} {scheme} on cortex-a53")
    assert out.tokens.tolist() == ref.tokens.tolist()


@pytest.mark.parametrize("arch", ARCHS)
def test_fp32_container_matches_transformers(
    models: dict[str, tuple[MoETransformer, Any]], tmp_path: Path, arch: str
) -> None:
    ours, hf = models[arch]
    clb = _container(ours, "fp32", tmp_path / "m.clb")
    ref_logits, ref_ids = hf_reference(hf, PROMPT, 16)
    with LM(clb) as lm:
        logits, ids = lm.generate(PROMPT, 16)
    assert_logits_close(logits, ref_logits, f"{arch} fp32 container", "C (model file)")
    assert_same_tokens(ids, ref_ids, f"{arch} fp32 container", "C (model file)")


def test_reader_reads_back_what_was_written(
    models: dict[str, tuple[MoETransformer, Any]], tmp_path: Path
) -> None:
    ours, _ = models["qwen2_moe"]
    opts = lm_options("host", "lm", MAX_CONTEXT, quant="int4", dense="int8", router="int8")
    q, _ = quantise_transformer(ours, opts)
    assert q is not None
    path = write_lm_container(ours, q, tmp_path / "m.clb", MAX_CONTEXT)
    assert path.read_bytes() == lm_container_bytes(ours, q, MAX_CONTEXT)  # deterministic
    c = read_lm_container(path)
    c_ = ours.config
    assert (c.header["version"], c.header["n_layers"], c.header["vocab_size"]) == (
        2,
        c_.n_layers,
        c_.vocab_size,
    )
    assert c.header["max_context"] == MAX_CONTEXT and c.header["dense_scheme"] == 2
    assert all(off % 64 == 0 for off in [c.header["data_offset"]])
    np.testing.assert_array_equal(c.tensors["embed"], q.dense["embed"].data)
    np.testing.assert_array_equal(c.tensors["embed.scale"], q.dense["embed"].scale)
    e0 = q.experts[0][0]
    np.testing.assert_array_equal(c.tensors["layer.0.expert.0.w1"], e0.w1.data)
    np.testing.assert_array_equal(c.tensors["layer.0.router"], q.routers[0].data)
    np.testing.assert_array_equal(c.tensors["layer.0.ffn.w2.scale"], q.dense_ffn[0].w2.scale)
    assert c.tensors["layer.0.desc"].tolist()[:4] == [1, 4, 2, 12]
    assert c.meta["quantization"]["scheme"] == "int4"


# -- bad files: one named status each, never a crash ---------------------------------------------


def _entries(data: bytes) -> dict[str, int]:
    n = struct.unpack_from("<I", data, 20)[0]
    out = {}
    for i in range(n):
        name = ENTRY.unpack_from(data, HEADER_SIZE + i * ENTRY_SIZE)[0].rstrip(b"\0").decode()
        out[name] = HEADER_SIZE + i * ENTRY_SIZE
    return out


def _set_header(data: bytearray, field: str, value: int) -> None:
    offsets = {"version": 8, "n_layers": 28, "vocab_size": 64, "head_dim": 80, "file_size": 56}
    fmt = "<Q" if field == "file_size" else "<I"
    struct.pack_into(fmt, data, offsets[field], value)


def _corrupt(kind: str, good: bytes) -> bytearray:
    d = bytearray(good)
    ents = _entries(good)
    fn = ents["final_norm"]
    fn_off, fn_bytes = struct.unpack_from("<QQ", d, fn + 72)
    if kind == "truncated":
        return d[:-1]
    if kind == "header-only":
        return d[:100]
    if kind == "bad-magic":
        d[0:8] = b"NOTCLB\0\0"
    elif kind == "version-1":
        _set_header(d, "version", 1)
    elif kind == "longer-than-header":
        d += b"\0" * 64
    elif kind == "no-layers":
        _set_header(d, "n_layers", 0)
    elif kind == "odd-head-dim":
        _set_header(d, "head_dim", 7)
    elif kind == "huge-vocab":
        _set_header(d, "vocab_size", 1 << 24)
    elif kind == "blob-past-end":
        struct.pack_into("<Q", d, fn + 72, len(d) + 64)
    elif kind == "misaligned-blob":
        struct.pack_into("<Q", d, fn + 72, fn_off + 4)
    elif kind == "shape-vs-bytes":
        struct.pack_into("<I", d, fn + 56, struct.unpack_from("<I", d, fn + 56)[0] + 1)
    elif kind == "missing-tensor":
        d[fn : fn + 10] = b"final_nork"
    elif kind == "duplicate-tensor":
        d[fn : fn + 48] = d[ents["embed"] : ents["embed"] + 48]
    elif kind == "wrong-dtype":
        struct.pack_into("<I", d, fn + 48, 4)  # int32, same bytes
    elif kind == "bad-crc":
        d[fn_off] ^= 0x40
    elif kind == "nan-weight":
        struct.pack_into("<f", d, fn_off, float("nan"))
        struct.pack_into("<I", d, fn + 92, zlib.crc32(bytes(d[fn_off : fn_off + fn_bytes])))
    elif kind == "bad-expert-table":
        t = ents["layer.0.experts"]
        off = struct.unpack_from("<Q", d, t + 72)[0]
        struct.pack_into("<i", d, off, 99)  # expert 0's owner out of range
        nb = struct.unpack_from("<Q", d, t + 80)[0]
        struct.pack_into("<I", d, t + 92, zlib.crc32(bytes(d[off : off + nb])))
    elif kind in ("q4k-fp32-acts", "unknown-scheme"):
        t = ents["layer.0.experts"]
        off = struct.unpack_from("<Q", d, t + 72)[0]
        scheme, act = (4, 0) if kind == "q4k-fp32-acts" else (6, 1)
        struct.pack_into("<ii", d, off + 4, scheme, act)  # expert 0's scheme and act
        nb = struct.unpack_from("<Q", d, t + 80)[0]
        struct.pack_into("<I", d, t + 92, zlib.crc32(bytes(d[off : off + nb])))
    else:
        raise AssertionError(kind)
    return d


#: kind -> the colibri_status colibri_lm_init must return (colibri.h).
BAD_FILES = {
    "truncated": -5,
    "header-only": -5,
    "bad-magic": -3,
    "version-1": -4,
    "longer-than-header": -6,
    "no-layers": -7,
    "odd-head-dim": -7,
    "huge-vocab": -5,
    "blob-past-end": -5,
    "misaligned-blob": -14,
    "shape-vs-bytes": -6,
    "missing-tensor": -14,
    "duplicate-tensor": -14,
    "wrong-dtype": -13,
    "bad-crc": -15,
    "nan-weight": -16,
    "bad-expert-table": -12,
    "q4k-fp32-acts": -12,  # q4k / q5k experts have int8-activation kernels only
    "unknown-scheme": -12,
}


@pytest.fixture(scope="module")
def good_file(
    models: dict[str, tuple[MoETransformer, Any]], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    return _container(models["olmoe"][0], "int4", tmp_path_factory.mktemp("good") / "m.clb")


@pytest.mark.parametrize("kind", BAD_FILES)
def test_bad_file_is_a_named_status(good_file: Path, tmp_path: Path, kind: str) -> None:
    bad = tmp_path / "bad.clb"
    bad.write_bytes(bytes(_corrupt(kind, good_file.read_bytes())))
    with pytest.raises(RuntimeStatusError) as err:
        LM(bad)
    assert err.value.status == BAD_FILES[kind], str(err.value)


#: Damage to a layer's calibration heat (layer.0.heat, f32 [n_experts]) -> colibri_status:
#: checked whatever the load flags (the pinning ranks experts by it).
BAD_HEAT = {
    "heat-nan": -16,
    "heat-inf": -16,
    "heat-negative": -7,
    "heat-dtype": -13,
    "heat-shape": -6,
}


@pytest.fixture(scope="module")
def heat_file(
    models: dict[str, tuple[MoETransformer, Any]], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    model = models["olmoe"][0]
    heat = {
        i: np.linspace(0.0, 0.5, layer.moe.config.n_experts, dtype=np.float32)
        for i, layer in enumerate(model.layers)
        if layer.moe is not None
    }
    q, _ = quantise_transformer(model, lm_options("host", "lm", MAX_CONTEXT, **SCHEMES["int4"]))
    path = tmp_path_factory.mktemp("heat") / "m.clb"
    return write_lm_container(model, q, path, MAX_CONTEXT, heat=heat)


@pytest.mark.parametrize("kind", BAD_HEAT)
def test_bad_heat_is_a_named_status(heat_file: Path, tmp_path: Path, kind: str) -> None:
    d = bytearray(heat_file.read_bytes())
    e = _entries(d)["layer.0.heat"]
    off, nb = struct.unpack_from("<QQ", d, e + 72)
    if kind == "heat-dtype":
        struct.pack_into("<I", d, e + 48, 4)  # int32, same bytes
    elif kind == "heat-shape":
        struct.pack_into("<5I", d, e + 52, 2, 2, nb // 8, 0, 0)  # [2, E / 2], same bytes
    else:
        value = {"heat-nan": float("nan"), "heat-inf": float("inf"), "heat-negative": -0.25}
        struct.pack_into("<f", d, off + 4, value[kind])
        struct.pack_into("<I", d, e + 92, zlib.crc32(bytes(d[off : off + nb])))
    bad = tmp_path / "bad.clb"
    bad.write_bytes(bytes(d))
    for verify in (True, False):
        with pytest.raises(RuntimeStatusError) as err:
            LM(bad, verify=verify)
        assert err.value.status == BAD_HEAT[kind], (verify, str(err.value))
    with LM(heat_file, verify=False) as lm:  # the file as written loads, heat and all
        assert lm.logits(PROMPT[:2]).shape[0] == 2


def test_random_corruption_never_crashes(good_file: Path, tmp_path: Path) -> None:
    """Random bytes of the header, table and descriptors flipped: init succeeds or fails with
    a status, in this process (a crash would take pytest down)."""
    good = good_file.read_bytes()
    data_offset = struct.unpack_from("<Q", good, 48)[0]
    rng = np.random.default_rng(5)
    bad = tmp_path / "r.clb"
    statuses = set()
    for _ in range(300):
        d = bytearray(good)
        for pos in rng.integers(0, data_offset, int(rng.integers(1, 4))):
            d[pos] ^= 1 << int(rng.integers(0, 8))
        bad.write_bytes(bytes(d))
        try:
            with LM(bad, verify=False) as lm:
                lm.logits([1, 2])
            statuses.add(0)
        except RuntimeStatusError as exc:
            statuses.add(exc.status)
    assert len(statuses) > 3, statuses


def test_header_fields_and_context_option(good_file: Path) -> None:
    h = read_lm_container(good_file).header
    assert set(HEADER_FIELDS) <= set(h)
    with LM(good_file, max_context=8) as lm:
        assert lm.max_context == 8
        with pytest.raises(BindingValueError, match="pos must be in 0..7"):
            lm.forward(1, 8)  # context overflow, refused by the binding (issue 37)
    with pytest.raises(RuntimeStatusError) as err:
        LM(good_file, max_context=MAX_CONTEXT + 1)  # beyond the RoPE tables
    assert err.value.status == -1


# -- CLI ------------------------------------------------------------------------------------------


def test_cli_convert_and_run(tmp_path: Path) -> None:
    require_torch()
    ckpt = save_model(make_model("mixtral", seed=90), tmp_path / "ckpt")
    clb = tmp_path / "m.clb"
    r = run_cli(
        "convert",
        str(ckpt),
        "--out",
        str(clb),
        "--quant",
        "int4",
        "--dense-quant",
        "int8",
        "--max-context",
        "24",
    )
    assert "whole MixtralForCausalLM" in r.stdout
    r = run_cli("verify", str(clb))
    assert "colibri_lm_init accepts it" in r.stdout and r.stdout.strip().endswith("ok")
    r = run_cli("run", str(clb), "--prompt-ids", "1,2,3", "--max-new-tokens", "4")
    ids = [int(t) for t in r.stdout.split()]
    assert len(ids) == 4
    with LM(clb) as lm:
        assert lm.generate([1, 2, 3], 4)[1] == ids
    r = run_cli("run", str(clb), "--prompt-ids", "1,2,3", "--max-new-tokens", "30", check=False)
    assert r.returncode == 1 and "context overflow" in r.stderr
    clb.write_bytes(clb.read_bytes()[:-3])
    r = run_cli("run", str(clb), "--prompt-ids", "1,2,3", "--max-new-tokens", "4", check=False)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "truncated" in r.stderr
    r = run_cli(
        "convert",
        str(ckpt),
        "--layer",
        "0",
        "--out",
        str(tmp_path / "l.clb"),
        "--quant",
        "int8",
        check=False,
    )
    assert r.returncode == 1 and "single-block container" in r.stderr


def test_per_expert_scheme_mix_matches_the_mirror(
    models: dict[str, tuple[MoETransformer, Any]], tmp_path: Path
) -> None:
    """Each expert's scheme and activation mode is its own (the expert table): int8, int4 and
    fp16 experts in one layer, int4 with fp32 activations, run through the numpy mirror of the
    generated C bit for bit; an fp32 expert in the mix (the mirror's fp32 expert is float64)
    within LOGIT_TOLERANCE."""
    from colibri.quant.formats import quantize_expert
    from colibri.reference.transformer import LOGIT_TOLERANCE, KVCache, forward

    ours, _ = models["mixtral"]
    q, _ = quantise_transformer(ours, lm_options("host", "lm", MAX_CONTEXT, quant="int8"))
    assert q is not None
    for layer, idx, scheme, act in (
        (0, 1, "int4", "int8"),
        (0, 2, "fp16", "fp32"),
        (1, 0, "int4", "fp32"),
        (1, 3, "fp32", "fp32"),
    ):
        moe = ours.layers[layer].moe
        assert moe is not None
        q.experts[layer][idx] = quantize_expert(moe.experts[idx], scheme, act)
    clb = write_lm_container(ours, q, tmp_path / "mix.clb", MAX_CONTEXT)
    table = read_lm_container(clb).tensors["layer.0.experts"]
    assert table[:, 1].tolist() == [2, 3, 1, 2] and table[:, 2].tolist() == [1, 1, 0, 1]
    with LM(clb) as lm:
        got = lm.logits(PROMPT)
    want = forward(ours, PROMPT, KVCache(), quant=q)
    assert np.abs(got - want).max() <= LOGIT_TOLERANCE
    moe1 = ours.layers[1].moe
    assert moe1 is not None
    q.experts[1][3] = quantize_expert(moe1.experts[3], "int8", "int8")  # no fp32: bit for bit
    clb = write_lm_container(ours, q, tmp_path / "mix2.clb", MAX_CONTEXT)
    with LM(clb) as lm:
        got = lm.logits(PROMPT)
    want = forward(ours, PROMPT, KVCache(), quant=q).astype(np.float32)
    _assert_bit_identical(got, want, "per-expert mix vs the mirror")


def test_cli_prompt_uses_the_embedded_tokenizer(tmp_path: Path) -> None:
    """`convert` stores the checkpoint's tokenizer.json in the file (a tensor the runtime skips),
    so `colibri run FILE --prompt TEXT` needs nothing beside the file."""
    require_torch()
    tokenizers = pytest.importorskip("tokenizers")
    words = [f"w{i}" for i in range(63)]
    tok = tokenizers.Tokenizer(
        tokenizers.models.WordLevel(
            {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}, "[UNK]"
        )
    )
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    ckpt = save_model(make_model("olmoe", seed=91), tmp_path / "ckpt")
    tok.save(str(ckpt / "tokenizer.json"))
    clb = tmp_path / "m.clb"
    r = run_cli("convert", str(ckpt), "--out", str(clb), "--max-context", "16")
    assert "tokenizer.json" in r.stdout
    (ckpt / "tokenizer.json").unlink()  # the file alone must do
    r = run_cli("run", str(clb), "--prompt", "w4 w9 w12", "--max-new-tokens", "3")
    ids_line, text = r.stdout.splitlines()[:2]
    with LM(clb) as lm:
        _, ids = lm.generate([5, 10, 13], 3)
    assert ids_line.split() == [str(i) for i in ids]
    assert text.split() == [words[i - 1] if i else "[UNK]" for i in ids], r.stdout


def test_model_file_runner_under_asan_and_ubsan(
    good_file: Path, heat_file: Path, tmp_path: Path
) -> None:
    """The model-file runner built with ASan + UBSan (leaks included): the good file gives the
    binding's logits bit for bit, and 150 damaged files (random bits anywhere, truncations) end
    with an exit status, never a sanitizer report."""
    import subprocess

    from colibri.targets.lmrun import SamplingOptions, lmfile_args, read_lm_output, write_lm_input
    from conftest import ROOT, require_tool

    cc = require_tool("gcc", "gcc")
    rt = ROOT / "runtime_c"
    exe = tmp_path / "lmfile_asan"
    subprocess.run(
        [cc, "-std=c11", "-O1", "-g", "-ffp-contract=off", "-fno-omit-frame-pointer"]
        + ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]
        + [f"-I{rt / 'include'}", f"-I{rt / 'src'}", f"-I{rt / 'platform'}"]
        + [str(p) for p in runtime_sources()]
        + [
            str(rt / "runner" / "lmfile_main.c"),
            str(rt / "platform" / "posix" / "platform_posix.c"),
        ]
        + ["-lm", "-o", str(exe)],
        check=True,
    )
    env = {"ASAN_OPTIONS": "halt_on_error=1:detect_leaks=1", "UBSAN_OPTIONS": "halt_on_error=1"}
    write_lm_input(tmp_path / "in.bin", PROMPT[:3], 3, SamplingOptions(), True)

    def run(path: Path, **config: int) -> subprocess.CompletedProcess[str]:
        args = [str(exe), *lmfile_args(path, tmp_path / "in.bin", tmp_path / "out.bin", **config)]
        r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=60)
        assert "Sanitizer" not in r.stderr and "runtime error" not in r.stderr, r.stderr[-3000:]
        assert r.returncode >= 0, r.stderr[-3000:]
        return r

    assert run(good_file).returncode == 0
    out = read_lm_output(tmp_path / "out.bin", 3)
    with LM(good_file) as lm:
        want, ids = lm.generate(PROMPT[:3], 3)
    assert out.logits is not None
    _assert_bit_identical(out.logits, want, "sanitized runner vs binding")
    assert out.tokens.tolist() == ids
    # experts beyond RAM: two slots (top_k) filled with pread, prefetch on and off
    for flags in (0, 1):
        assert run(good_file, ram_budget=2500, flags=flags).returncode == 0
        got = read_lm_output(tmp_path / "out.bin", 3)
        assert got.logits is not None
        _assert_bit_identical(got.logits, want, "sanitized runner with a RAM budget")
    # pinned hot experts (a file with heat): auto and explicit, prefetch on and off
    with LM(heat_file) as lm:
        want_heat, _ = lm.generate(PROMPT[:3], 3)
        budget = int(lm.stats()["expert_bytes"])  # a slot an expert: auto pins half
    for flags, pin in ((0, 0), (1, 0), (0, 2)):
        r = run(heat_file, ram_budget=budget, flags=flags, pinned=pin)
        assert r.returncode == 0 and " pinned 0 " not in r.stdout, r.stdout
        got = read_lm_output(tmp_path / "out.bin", 3)
        assert got.logits is not None
        _assert_bit_identical(got.logits, want_heat, "sanitized runner, pinned experts")
    assert run(heat_file, ram_budget=budget, pinned=100000).returncode == 10 + 17  # no room
    good = good_file.read_bytes()
    rng = np.random.default_rng(11)
    bad = tmp_path / "bad.clb"
    codes: set[int] = set()
    for i in range(150):
        d = bytearray(good)
        limit = struct.unpack_from("<Q", good, 48)[0] if i % 2 else len(d)
        for pos in rng.integers(0, limit, int(rng.integers(1, 5))):
            d[pos] ^= 1 << int(rng.integers(0, 8))
        if i % 5 == 0:
            d = d[: int(rng.integers(0, len(d)))]
        bad.write_bytes(bytes(d))
        codes.add(run(bad, ram_budget=100000 if i % 3 == 0 else 0).returncode)
    assert len(codes) > 3, codes


@pytest.mark.parametrize("scheme", ["q4k", "q5k"])
def test_old_q4k_row_layout_is_refused(
    models: dict[str, tuple[MoETransformer, Any]], tmp_path: Path, scheme: str
) -> None:
    """A container whose q4k / q5k matrices say dtype 5 / 6 (each row its own super-blocks,
    before issue 38's streams across rows) is refused by name in Python and with
    COLIBRI_ERR_FORMAT by the runtime, never read as the new layout."""
    good = _container(models["olmoe"][0], scheme, tmp_path / "good.clb")
    d = bytearray(good.read_bytes())
    ents = _entries(bytes(d))
    name = "layer.0.expert.0.w1"
    new = struct.unpack_from("<I", d, ents[name] + 48)[0]
    assert new == {"q4k": 7, "q5k": 8}[scheme]
    struct.pack_into("<I", d, ents[name] + 48, new - 2)
    bad = tmp_path / "old.clb"
    bad.write_bytes(bytes(d))
    with pytest.raises(ModelFormatError, match=rf"{scheme} in the old row layout.*convert"):
        read_lm_container(bad)
    with pytest.raises(RuntimeStatusError) as err:
        LM(bad)
    assert err.value.status == -14, str(err.value)
