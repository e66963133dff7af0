"""The Python readers of whole-model containers under mutation: `colibri reference F.clb`
(colibri.emit.lmfile.read_lm_model, then the numpy reference's forward pass), `colibri inspect
F.clb` (colibri.cli.inspect.lm_file_report) and `colibri verify F.clb`, on mutants of the
fuzzers' whole-model corpus (fuzz/make_corpus.py: fp32 / fp16 / int8 / int4 / q4k / q5k experts,
int8 / int4 / q4k dense matrices, tied heads, shared experts, dense layers, heat).

The mutator rewrites the CRC-32s and the file size after most edits (as fuzz/fuzz_lm.c's does),
so the mutants reach the shape and range checks: header fields and table entries set to edge
values, tensor bytes replaced (NaN, Inf, huge and tiny floats, random), the metadata JSON edited,
bits flipped anywhere.

Checked:
- only a ColibriError escapes the readers and the forward pass, and the CLI prints one
  `colibri: error:` line, never a traceback;
- against the C runtime (colibri_lm_init through the binding, default load flags) on the
  mutants of the binary parts: every file the C refuses, the Python readers refuse too, so
  `colibri reference` never computes logits for a file `colibri run` cannot run; the Python
  readers refuse a file the C takes only where the C does not look: a header field that no
  longer agrees with the metadata JSON (which the C does not read), or a RoPE table that is not
  the header's rope_theta's (the C runs the stored tables, the reference computes them);
- where both take the file, the reference's logits are the C's bit for bit for quantised
  files (the numpy mirror) and within 1e-4 for fp32 ones (the float64 reference); where the C's
  fp32 forward pass overflows and the float64 one does not (an fp32 file holding a weight above
  1e30), the C refuses the step (COLIBRI_ERR_NAN: NaN / Inf in a router input or the logits),
  never returns logits that differ; where both forward passes meet NaN / Inf, both refuse.

``COLIBRI_FUZZ_EXAMPLES=N`` raises the number of mutants (default 240 per test).
"""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import sys
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from colibri.cli.inspect import lm_file_report
from colibri.emit.lmfile import read_lm_model
from colibri.errors import ColibriError
from colibri.frontends.container import (
    ENTRY,
    ENTRY_SIZE,
    HEADER_FIELDS,
    HEADER_SIZE,
    LM_HEADER,
    NAME_SIZE,
)
from colibri.reference.transformer import KVCache, forward
from conftest import ROOT
from hf_tiny import require_torch

EXAMPLES = int(os.environ.get("COLIBRI_FUZZ_EXAMPLES", "240"))
FIELD = {name: i for i, name in enumerate(HEADER_FIELDS)}
PROMPT = [1, 2, 3]
EDGE_DIMS = [0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 255, 256, 65536, 2**31 - 1]
EDGE_DIMS += [2**32 - 1]
EDGE_WORDS = [
    struct.pack("<f", float("nan")),
    struct.pack("<f", float("inf")),
    struct.pack("<f", 1e38),
    struct.pack("<f", 2.0e-38),
    b"\xff\xff\xff\xff",
    b"\x00\x7c\x00\xfc",  # fp16 +Inf, -Inf
]


@pytest.fixture(autouse=True)
def _quiet_overflow() -> Iterator[None]:
    """The mutants' weights overflow fp32 on purpose: the outcome is checked, not warned."""
    with np.errstate(all="ignore"):
        yield


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The fuzzers' whole-model corpus, made by fuzz/make_corpus.py."""
    require_torch()
    out = tmp_path_factory.mktemp("lm_corpus")
    result = subprocess.run(
        [sys.executable, str(ROOT / "fuzz" / "make_corpus.py"), str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    files = {p.name: p.read_bytes() for p in sorted((out / "lm").glob("*.clb"))}
    assert len(files) >= 9, sorted(files)
    return files


def fix_checksums(buf: bytearray) -> bytearray:
    """Every table entry's CRC-32 over its bytes as they now are, and the header's file size."""
    h = list(LM_HEADER.unpack_from(buf, 0))
    for i in range(min(int(h[FIELD["n_tensors"]]), 10_000)):
        at = HEADER_SIZE + i * ENTRY_SIZE
        if at + ENTRY_SIZE > len(buf):
            break
        e = list(ENTRY.unpack_from(buf, at))
        off, nbytes = e[7], e[8]
        if off + nbytes <= len(buf):
            e[10] = zlib.crc32(bytes(buf[off : off + nbytes]))
            ENTRY.pack_into(buf, at, *e)
    h[FIELD["file_size"]] = len(buf)
    LM_HEADER.pack_into(buf, 0, *h)
    return buf


def _set_meta(buf: bytearray, meta: Any) -> bool:
    """The metadata replaced in place (False when it does not fit before the data)."""
    h = list(LM_HEADER.unpack_from(buf, 0))
    mo, do = h[FIELD["meta_offset"]], h[FIELD["data_offset"]]
    raw = json.dumps(meta).encode()
    if mo + len(raw) > do:
        return False
    buf[mo:do] = raw + bytes(do - mo - len(raw))
    h[FIELD["meta_bytes"]] = len(raw)
    LM_HEADER.pack_into(buf, 0, *h)
    return True


def mutant(base: bytes, rng: random.Random, binary_only: bool = False) -> bytes | None:
    """One mutant of `base` (None when the edit drawn does not apply); `binary_only`: never
    the metadata JSON (what the C reads too)."""
    buf = bytearray(base)
    h = LM_HEADER.unpack_from(buf, 0)
    n = int(h[FIELD["n_tensors"]])
    op = rng.randrange(4 if binary_only else 6)
    if op == 0:  # a table entry's field
        at = HEADER_SIZE + rng.randrange(n) * ENTRY_SIZE
        e = list(ENTRY.unpack_from(buf, at))
        k = rng.randrange(1, 10)
        if 3 <= k <= 6:  # a dimension
            e[k] = rng.choice([*EDGE_DIMS, e[k] + 1, max(e[k] - 1, 0), 2 * e[k]])
        elif k <= 2:  # dtype, ndim
            e[k] = rng.choice([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 255, 2**32 - 1])
        elif k <= 8:  # offset, size
            e[k] = rng.choice([0, 64, e[k] + 64, max(e[k] - 64, 0), 2**63, len(buf)])
        else:  # expert index
            e[k] = rng.choice([0, 1, 2**32 - 1, e[k] ^ 1])
        ENTRY.pack_into(buf, at, *e)
    elif op == 1:  # a header field
        values = list(h)
        k = rng.randrange(2, len(values))
        if isinstance(values[k], float):
            values[k] = rng.choice([0.0, -1.0, float("nan"), float("inf"), 1e30, 1e-30])
        else:
            values[k] = rng.choice([*EDGE_DIMS[:-1], values[k] + 1, max(values[k] - 1, 0)])
        LM_HEADER.pack_into(buf, 0, *values)
    elif op == 2:  # a tensor's bytes
        e = ENTRY.unpack_from(buf, HEADER_SIZE + rng.randrange(n) * ENTRY_SIZE)
        off, nbytes = e[7], e[8]
        for _ in range(rng.randint(1, 6) if nbytes >= 4 else 0):
            at = off + rng.randrange(nbytes - 3)
            buf[at : at + 4] = rng.choice([*EDGE_WORDS, rng.randbytes(4)])
    elif op == 3:  # bits anywhere
        for _ in range(rng.randint(1, 4)):
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
    else:  # the metadata: a config / quantization value, a key dropped, the sections' types
        mo, mb = h[FIELD["meta_offset"]], h[FIELD["meta_bytes"]]
        meta = json.loads(bytes(buf[mo : mo + mb]))
        section = rng.choice(["config", "quantization"])
        keys = list(meta[section])
        key = rng.choice(keys)
        edit = rng.randrange(3)
        if edit == 0:
            meta[section][key] = rng.choice(
                [0, 1, -1, 3, 9, 2**31, 2**64, 1.5, float("nan"), None, True, "x", "q5k", [], {}]
            )
        elif edit == 1:
            del meta[section][key]
        else:
            meta[section] = rng.choice(["x", [], 7, None])
        if not _set_meta(buf, meta):
            return None
    return bytes(fix_checksums(buf) if rng.random() < 0.9 else buf)


def _python(path: Path, lean: bool) -> np.ndarray | None:
    """The reference's logits of PROMPT after the readers (None: the file is refused with a
    ColibriError); anything else raises."""
    try:
        lm_file_report(path)
    except ColibriError:
        pass
    try:
        model, q, max_context = read_lm_model(path, lean=lean)
    except ColibriError:
        return None
    if max_context < len(PROMPT):
        return np.zeros(0, np.float32)
    return np.asarray(forward(model, PROMPT, KVCache(), quant=q)[-1], np.float32)


def test_the_readers_raise_only_colibri_errors(bases: dict[str, bytes], tmp_path: Path) -> None:
    rng = random.Random("colibri-lm-reader")
    outcomes: Counter[str] = Counter()
    for i in range(EXAMPLES):
        name = rng.choice(sorted(bases))
        data = mutant(bases[name], rng)
        if data is None:
            continue
        path = tmp_path / f"{i}.clb"
        path.write_bytes(data)
        try:
            logits = _python(path, lean=i % 2 == 1)
            outcomes["refused" if logits is None else "read and run"] += 1
        except ColibriError:  # the forward pass met NaN / Inf (the weights are fuzzed)
            outcomes["read, NaN / Inf in the forward pass"] += 1
        except Exception as exc:  # noqa: BLE001 - the point of the test
            raise AssertionError(f"mutant {i} of {name}: {type(exc).__name__}: {exc}") from exc
        path.unlink()
    print(dict(outcomes))
    assert outcomes["refused"] > EXAMPLES // 10 and outcomes["read and run"] > EXAMPLES // 10


def test_python_refuses_what_the_c_refuses(bases: dict[str, bytes], tmp_path: Path) -> None:
    from conftest import require_board

    require_board("host")
    from colibri.targets.binding import LM, RuntimeStatusError

    rng = random.Random("colibri-lm-reader-vs-c")
    seen: Counter[str] = Counter()
    for i in range(EXAMPLES):
        name = rng.choice(sorted(bases))
        data = mutant(bases[name], rng, binary_only=True)
        if data is None:
            continue
        path = tmp_path / f"{i}.clb"
        path.write_bytes(data)
        why = ""
        try:
            read_lm_model(path)
        except ColibriError as exc:
            why = str(exc)
        c_logits: np.ndarray | None = None
        c_ok, c_forward = False, ""
        try:
            with LM(path) as lm:
                c_ok = True
                if lm.max_context >= len(PROMPT):
                    c_logits = np.asarray(lm.prefill(PROMPT), np.float32)
        except (RuntimeStatusError, ColibriError) as exc:
            c_forward = str(exc) if c_ok else ""
        where = f"mutant {i} of {name}"
        assert c_ok or why, f"{where}: the C refuses it, the Python readers take it"
        if why:
            allowed = ("RoPE table", "metadata")
            assert not c_ok or any(a in why for a in allowed), f"{where}: only Python: {why}"
            seen["both refuse" if not c_ok else "Python only (metadata, RoPE table)"] += 1
            continue
        model, q, _ = read_lm_model(path)
        huge = q is None and max(float(np.abs(w).max()) for w in _fp32_weights(path)) > 1e30
        try:
            ref = _python(path, lean=False)
        except ColibriError as exc:  # the reference's forward pass met NaN / Inf
            assert huge or q is not None, f"{where}: {exc}"
            assert c_forward, f"{where}: only the reference's forward pass fails: {exc}"
            seen["NaN / Inf in both forward passes"] += 1
            continue
        assert ref is not None
        if c_forward:  # the C's forward pass found NaN / Inf where fp32 overflowed
            assert huge and "NaN or Inf" in c_forward, f"{where}: {c_forward}"
            seen["fp32, a weight above 1e30: the C's forward refuses"] += 1
            continue
        if c_logits is None:
            seen["both take it (context < 3)"] += 1
            continue
        if q is not None:
            assert np.array_equal(ref, c_logits, equal_nan=True), where
            seen["both take it, bit-exact"] += 1
        else:
            np.testing.assert_allclose(ref, c_logits, rtol=1e-4, atol=1e-4, err_msg=where)
            seen["both take it, within 1e-4"] += 1
    print(dict(seen))
    assert seen["both refuse"] > EXAMPLES // 10
    assert seen["both take it, bit-exact"] > EXAMPLES // 10
    assert seen["both take it, within 1e-4"] > EXAMPLES // 20


def _fp32_weights(path: Path) -> list[np.ndarray]:
    from colibri.frontends.container import read_lm_container

    return [a for a in read_lm_container(path).tensors.values() if a.dtype == np.float32]


@pytest.mark.parametrize("command", ["reference", "inspect", "verify"])
def test_cli_on_mutants_prints_one_error_line(
    command: str, bases: dict[str, bytes], tmp_path: Path
) -> None:
    rng = random.Random(f"colibri-lm-cli-{command}")
    refused = 0
    for i in range(6):
        name = rng.choice(sorted(bases))
        data = None
        while data is None:
            data = mutant(bases[name], rng)
        path = tmp_path / f"{i}.clb"
        path.write_bytes(data)
        args = [str(path)]
        if command == "reference":
            args += ["--prompt-ids", "1,2", "--max-new-tokens", "1"]
        proc = subprocess.run(
            [sys.executable, "-m", "colibri", command, *args],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert "Traceback" not in proc.stderr, proc.stderr
        if proc.returncode != 0:
            refused += 1
            errors = [line for line in proc.stderr.splitlines() if line.startswith("colibri:")]
            assert len(errors) == 1 and errors[0].startswith("colibri: error:"), proc.stderr


def test_a_name_is_compared_up_to_its_nul(bases: dict[str, bytes], tmp_path: Path) -> None:
    """Bytes after a name's NUL are padding to the C (strcmp): the Python reader ignores them
    too, instead of missing the tensor."""
    buf = bytearray(bases["mixtral_int8_dense_int8_heat.clb"])
    for i in range(int(LM_HEADER.unpack_from(buf, 0)[FIELD["n_tensors"]])):
        at = HEADER_SIZE + i * ENTRY_SIZE
        raw = bytes(buf[at : at + NAME_SIZE])
        if raw.split(b"\0", 1)[0] == b"final_norm":
            buf[at + NAME_SIZE - 1] = ord("x")
    path = tmp_path / "m.clb"
    path.write_bytes(bytes(fix_checksums(buf)))
    model, _, _ = read_lm_model(path)
    assert model.final_norm.shape == (model.config.d_model,)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("alignment", 63, "inconsistent header offsets"),
        ("table_offset", 129, "inconsistent header offsets"),
        ("n_heads", 3, "contradicts the header"),
        ("head_dim", 5, "contradicts the header"),
    ],
)
def test_header_fields_the_c_refuses(
    bases: dict[str, bytes], tmp_path: Path, field: str, value: int, message: str
) -> None:
    buf = bytearray(bases["qwen2_moe_q5k_dense_int4.clb"])
    values = list(LM_HEADER.unpack_from(buf, 0))
    values[FIELD[field]] = value
    LM_HEADER.pack_into(buf, 0, *values)
    path = tmp_path / "m.clb"
    path.write_bytes(bytes(buf))
    with pytest.raises(ColibriError, match=message):
        read_lm_model(path)
    with pytest.raises(ColibriError):
        lm_file_report(path)


def test_an_expert_table_row_out_of_range_is_named(bases: dict[str, bytes], tmp_path: Path) -> None:
    """q4k experts with fp32 activations (act 0): no kernel; the C refuses the table."""
    base = bases["mixtral_q4k_dense_q4k.clb"]
    off = tensor_offsets(base)["layer.0.experts"]
    buf = bytearray(base)
    struct.pack_into("<i", buf, off + 8, 0)  # row 0's act
    path = tmp_path / "m.clb"
    path.write_bytes(bytes(fix_checksums(buf)))
    with pytest.raises(ColibriError, match=r"expert table row 0 \[owner 0, scheme 4, act 0\]"):
        read_lm_model(path)


def _edit_entry(
    buf: bytearray, index: int, name: bytes | None = None, off: int | None = None
) -> None:
    """Table entry `index` given another name and / or data offset."""
    at = HEADER_SIZE + index * ENTRY_SIZE
    fields = list(ENTRY.unpack_from(buf, at))
    fields[0] = fields[0] if name is None else name.ljust(NAME_SIZE, b"\0")
    fields[7] = fields[7] if off is None else off
    ENTRY.pack_into(buf, at, *fields)


@pytest.mark.parametrize("edit", ["empty name", "duplicate name", "misaligned", "before the last"])
def test_misplaced_table_entries_are_refused_by_every_reader(
    bases: dict[str, bytes], tmp_path: Path, edit: str
) -> None:
    """A table entry the C refuses (an empty name, a name twice, data not aligned or not after
    the previous tensor's) is refused by the whole-model reader and by `colibri inspect`'s table
    reader alike, naming the entry (inspect read such a table and reported on it)."""
    from conftest import require_board

    buf = bytearray(bases["mixtral_int8_dense_int8_heat.clb"])
    first = ENTRY.unpack_from(buf, HEADER_SIZE)
    second = ENTRY.unpack_from(buf, HEADER_SIZE + ENTRY_SIZE)
    if edit == "empty name":
        _edit_entry(buf, 1, name=b"")
    elif edit == "duplicate name":
        _edit_entry(buf, 1, name=first[0].split(b"\0", 1)[0])
    elif edit == "misaligned":
        _edit_entry(buf, 1, off=int(second[7]) + 4)
    else:
        _edit_entry(buf, 1, off=int(first[7]))  # the first tensor's bytes again
    path = tmp_path / "m.clb"
    path.write_bytes(bytes(fix_checksums(buf)))
    message = "appears twice" if edit == "duplicate name" else r"tensor 1 \('.*'\) is misplaced"
    with pytest.raises(ColibriError, match=message):
        read_lm_model(path)
    with pytest.raises(ColibriError, match=message):
        lm_file_report(path)
    require_board("host")
    from colibri.targets.binding import LM, RuntimeStatusError

    with pytest.raises((RuntimeStatusError, ColibriError)):
        LM(path).close()


def tensor_offsets(base: bytes) -> dict[str, int]:
    """Each tensor's byte offset in the container `base`."""
    n = int(LM_HEADER.unpack_from(base, 0)[FIELD["n_tensors"]])
    out = {}
    for i in range(n):
        e = ENTRY.unpack_from(base, HEADER_SIZE + i * ENTRY_SIZE)
        out[e[0].split(b"\0", 1)[0].decode()] = int(e[7])
    return out
