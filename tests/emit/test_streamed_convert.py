"""Containers written buffer by buffer and whole models converted one layer at a time: the bytes
are those of the in-memory images (the independent reference: `lm_container_bytes` of the whole
model quantised at once, `container_bytes`), and the converter's peak memory does not grow with
the model's weights. Also the big-model checkpoint writer (benchmarks/mixtral_ckpt.py), checked
against transformers."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT
from hf_tiny import assert_logits_close, hf_logits, require_torch

sys.path.insert(0, str(ROOT / "benchmarks"))

import mixtral_ckpt  # noqa: E402
from colibri.cli.main import main  # noqa: E402
from colibri.emit.container import (  # noqa: E402
    TableEntry,
    byte_view,
    container_bytes,
    container_image,
    write_container,
    write_container_streamed,
)
from colibri.emit.lmfile import lm_container_bytes  # noqa: E402
from colibri.frontends.container import ALIGN  # noqa: E402
from colibri.frontends.hf_model import load_transformer  # noqa: E402
from colibri.frontends.seed import make_toy  # noqa: E402
from colibri.options import GenerateOptions  # noqa: E402
from colibri.quant.model import quantize_transformer_as_asked  # noqa: E402
from colibri.reference.transformer import forward  # noqa: E402

SMALL = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 300,
}


@pytest.fixture(scope="module")
def small_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ckpt") / "mixtral"
    mixtral_ckpt.write_checkpoint(path, SMALL, seed=5)
    return path


def _header(n: int, table: int, meta: int, data: int, size: int) -> bytes:
    return b"H" * 8 + np.array([n, table, meta, data, size], "<u8").tobytes() + bytes(88)


def test_streamed_image_equals_the_planned_one(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype("<f4") for s in ((3, 5), (7,), (0,), (2, 2, 2))]
    arrays.append(np.arange(11, dtype=np.int8))
    entries = [TableEntry(f"t{i}", byte_view(a), 0, a.shape, i) for i, a in enumerate(arrays)]
    image = container_image(entries, b'{"m": 1}', _header)
    expected = bytes(image.tobytes())
    assert all(off % ALIGN == 0 for off, _ in image.blobs)
    planned = io.BytesIO()
    image.write(planned)
    assert planned.getvalue() == expected
    with open(tmp_path / "streamed", "w+b") as f:
        size = write_container_streamed(f, iter(entries), b'{"m": 1}', _header, tmp_path)
    assert size == len(expected)
    assert (tmp_path / "streamed").read_bytes() == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["streamed"]  # the spool is gone


def test_version_1_file_is_the_image(tmp_path: Path) -> None:
    layer = make_toy(experts=4, hidden=32, ff=48, top_k=2, activation="swiglu", seed=3)
    path = write_container(layer, tmp_path / "toy.clb")
    assert path.read_bytes() == bytes(container_bytes(layer))


@pytest.mark.parametrize(
    "flags",
    [
        [],
        ["--quant", "int8", "--dense-quant", "int8"],
        ["--quant", "int4"],
        ["--quant", "int4", "--dense-quant", "fp16", "--router-quant", "int8"],
    ],
    ids=["fp32", "int8-d8", "int4", "int4-f16-r8"],
)
def test_streamed_convert_is_the_whole_model_container(
    small_ckpt: Path, tmp_path: Path, flags: list[str]
) -> None:
    out = tmp_path / "model.clb"
    assert main(["convert", str(small_ckpt), "--out", str(out), "-q", *flags]) == 0
    opts = dict(zip(flags[::2], flags[1::2]))
    model = load_transformer(small_ckpt)
    q = quantize_transformer_as_asked(
        model,
        opts.get("--quant", "fp32"),
        None,
        opts.get("--dense-quant", "fp32"),
        opts.get("--router-quant", "fp32"),
    )
    context = GenerateOptions().context
    assert out.read_bytes() == bytes(lm_container_bytes(model, q, context))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.clb"]


def _peak_rss_of_convert(ckpt: Path, out: Path) -> int:
    """VmHWM (bytes) of a fresh interpreter converting `ckpt`: the peak of its own address
    space, not inherited from this process across the exec (as ru_maxrss would be)."""
    code = (
        "import sys\n"
        "from colibri.cli.main import main\n"
        "assert main(sys.argv[1:]) == 0\n"
        "for line in open('/proc/self/status'):\n"
        "    if line.startswith('VmHWM:'):\n"
        "        print(int(line.split()[1]) * 1024)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT / "codegen"))
    args = ["convert", str(ckpt), "--out", str(out), "-q"]
    done = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, check=True
    )
    return int(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_convert_memory_does_not_grow_with_the_layers(small_ckpt: Path, tmp_path: Path) -> None:
    """Two checkpoints alike but for their depth (2 and 8 layers of 13 MB): converting the
    deeper one holds one layer at a time, so its peak grows by far less than its extra 79 MB of
    weights (holding the model would grow it by at least that; measured: by 0 MB), and it is
    within 1.5 layers of the peak of converting a model of almost no weights (holding two
    layers, as a loop that keeps the previous layer while reading the next, is not)."""
    config = dict(SMALL, hidden_size=256, intermediate_size=1024, vocab_size=512)
    base = _peak_rss_of_convert(small_ckpt, tmp_path / "small.clb")
    peaks, weights = [], []
    for layers in (2, 8):
        ckpt = tmp_path / f"l{layers}"
        n = mixtral_ckpt.write_checkpoint(ckpt, dict(config, num_hidden_layers=layers))
        weights.append(4 * n)
        peaks.append(_peak_rss_of_convert(ckpt, tmp_path / f"l{layers}.clb"))
    extra = weights[1] - weights[0]
    layer = extra // 6
    assert extra > 70 << 20
    assert peaks[1] - peaks[0] < extra // 4, (peaks, weights)
    assert peaks[1] - base < 3 * layer // 2, (base, peaks, layer)


def test_checkpoint_writer_is_a_transformers_mixtral(small_ckpt: Path) -> None:
    """The checkpoint benchmarks/mixtral_ckpt.py streams out loads in transformers, and its
    logits match colibri's numpy reference of the same files."""
    require_torch()
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(small_ckpt).eval()
    assert sum(p.numel() for p in hf.parameters()) == mixtral_ckpt.parameters(SMALL)
    prompt = [1, 5, 9, 17, 250, 2]
    ours = forward(load_transformer(small_ckpt), prompt)
    assert_logits_close(ours, hf_logits(hf, prompt), "mixtral_ckpt writer", "colibri")


def test_int8_codes_in_chunks_are_the_whole_matrix_codes(monkeypatch: pytest.MonkeyPatch) -> None:
    """int8_codes works a chunk of rows at a time (bounded temporaries); with chunks of 3 rows
    the codes are those of the formula on the whole matrix (zero scales give 0)."""
    from colibri.quant import formats

    rng = np.random.default_rng(2)
    w = rng.standard_normal((10, 7)).astype(np.float32)
    s = (np.abs(w).max(axis=1) / 127).astype(np.float32)
    s[4] = 0
    expected = np.clip(
        np.where(s[:, None] == 0, 0, formats.round_half_away(w / np.where(s == 0, 1, s)[:, None])),
        -127,
        127,
    )
    monkeypatch.setattr(formats, "SEARCH_CHUNK", 21)
    got = formats.int8_codes(w, s)
    assert got.dtype == np.int8
    np.testing.assert_array_equal(got, expected.astype(np.int8))
