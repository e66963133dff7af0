"""The whole-model runtime under a careless caller (issue 37, runtime_c/src/lm_*.c): memory
sized from the caller's context and bounded by a ceiling it gives (colibri_lm_config_t
.max_context / .max_memory, colibri_lm_measure), positions past the ones run refused in C, and a
model file changed after the load caught where its bytes are read: by the per-call check of
the file (truncated, rewritten: COLIBRI_ERR_CHANGED, never SIGBUS) and by the CRC-32 of every
expert read into a slot under a RAM budget (COLIBRI_ERR_CHECKSUM)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from colibri.cli.pipeline import quantise_transformer
from colibri.emit.lmfile import write_lm_container
from colibri.frontends.container import ENTRY, ENTRY_SIZE, HEADER_SIZE, LM_HEADER
from colibri.frontends.hf_model import load_hf_transformer
from colibri.targets.binding import LM, RuntimeStatusError, lm_memory
from conftest import ROOT, run_cli
from hf_tiny import lm_options, make_model, require_torch, save_model

SMALL_CONTEXT = 32
BIG_CONTEXT = 4096  # above COLIBRI_LM_DEFAULT_CONTEXT
DEFAULT_CONTEXT = 2048
N_LAYERS, N_EXPERTS = 2, 8
PROMPT = [3, 17, 5, 60, 9, 41]
ERR_ARG, ERR_NAN, ERR_CHECKSUM, ERR_MEMORY, ERR_POSITION, ERR_CHANGED = -1, -10, -15, -18, -19, -20


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny Mixtral (8 experts x 2 layers, 2 KV heads of 4) as int8 model files of 32 and
    4,096 positions."""
    require_torch()
    tmp = tmp_path_factory.mktemp("hardening")
    hf = make_model("mixtral", seed=91, num_local_experts=N_EXPERTS, num_hidden_layers=N_LAYERS)
    model = load_hf_transformer(save_model(hf, tmp / "ckpt"))
    out = {}
    for name, ctx in (("small", SMALL_CONTEXT), ("big", BIG_CONTEXT)):
        q, _ = quantise_transformer(model, lm_options("host", "lm", ctx, quant="int8"))
        out[name] = write_lm_container(model, q, tmp / f"{name}.clb", ctx)
    return out


def _kv_bytes(path: Path, positions: int) -> int:
    h = dict(zip(("n_layers", "n_kv_heads", "head_dim"), _header(path)))
    return 8 * h["n_layers"] * h["n_kv_heads"] * h["head_dim"] * positions


def _header(path: Path) -> tuple[int, int, int]:
    from colibri.frontends.container import HEADER_FIELDS

    h = dict(zip(HEADER_FIELDS, LM_HEADER.unpack_from(path.read_bytes(), 0)))
    return int(h["n_layers"]), int(h["n_kv_heads"]), int(h["head_dim"])


def test_default_context_is_modest_not_the_files(files: dict[str, Path]) -> None:
    """A file made for 4,096 positions gets a KV cache of 2,048 unless the caller asks for
    more (before: the file's maximum, whatever it was); above the file's: refused."""
    with LM(files["big"]) as lm:
        assert lm.max_context == DEFAULT_CONTEXT
        default_arena = lm.arena_bytes
    with LM(files["big"], max_context=BIG_CONTEXT) as lm:
        assert lm.max_context == BIG_CONTEXT
        assert lm.arena_bytes - default_arena >= _kv_bytes(files["big"], DEFAULT_CONTEXT)
    with LM(files["small"]) as lm:  # a file below the default keeps its own
        assert lm.max_context == SMALL_CONTEXT
    with pytest.raises(RuntimeStatusError) as err:
        LM(files["big"], max_context=BIG_CONTEXT + 1)
    assert err.value.status == ERR_ARG
    m = lm_memory(files["big"])
    assert m["max_context"] == DEFAULT_CONTEXT
    assert m["kv_bytes"] == _kv_bytes(files["big"], DEFAULT_CONTEXT)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"max_context": 8},
        {"threads": 2},
        {"prefill_batch": 3, "max_context": 20},
        {"ram_budget": 40_000},
    ],
    ids=["default", "ctx8", "threads2", "batch3", "budget"],
)
def test_ceiling_is_exact_and_names_the_bytes(files: dict[str, Path], options: dict) -> None:
    """colibri_lm_measure's total is the ceiling that loads and one byte less is refused with
    COLIBRI_ERR_MEMORY, naming the bytes (with a budget: one byte less than one prefill row's
    need); the arena it reports is the one allocated, and the parts add up to the total."""
    path = files["small"]
    m = lm_memory(path, **options)
    parts = ("table_bytes", "arena_bytes", "slot_bytes", "packed_bytes", "pool_bytes")
    assert sum(m[p] for p in parts) == m["total_bytes"]
    assert m["table_bytes"] <= 24 * path.stat().st_size  # the documented bound
    if options.get("ram_budget"):
        assert m["slot_bytes"] > 0
    with LM(path, max_memory=m["total_bytes"], **options) as lm:
        assert lm.arena_bytes == m["arena_bytes"]
        assert lm.max_context == m["max_context"]
        logits = lm.prefill(PROMPT)
    with LM(path, **options) as lm:
        assert np.array_equal(lm.prefill(PROMPT).view(np.uint32), logits.view(np.uint32))
    if options.get("ram_budget"):
        # with a budget the prefill chunk is sized to it and to the ceiling (issue 41): one byte
        # less loads with a shorter chunk, the same logits; only a ceiling that one row does
        # not fit under is refused
        less = m["total_bytes"] - 1
        with LM(path, max_memory=less, **options) as lm:
            assert lm.arena_bytes < m["arena_bytes"]
            assert lm.arena_bytes == lm_memory(path, max_memory=less, **options)["arena_bytes"]
            assert np.array_equal(lm.prefill(PROMPT).view(np.uint32), logits.view(np.uint32))
        m = lm_memory(path, prefill_batch=1, **options)
    with pytest.raises(RuntimeStatusError) as err:
        LM(path, max_memory=m["total_bytes"] - 1, **options)
    assert err.value.status == ERR_MEMORY
    assert f"needs {m['total_bytes']} bytes" in str(err.value)
    assert f"KV cache {m['kv_bytes']} for {m['max_context']} positions" in str(err.value)


def test_cli_max_memory_and_max_context(files: dict[str, Path]) -> None:
    """`colibri run model.clb`: --max-memory below the need is one line with the bytes;
    --max-context below the request or above the file is one line; a context between them
    gives the same tokens as the default (which is the request's positions)."""
    path = str(files["small"])
    base = ["run", path, "--prompt-ids", "3,17,5", "--max-new-tokens", "4"]
    ok = run_cli(*base)
    assert ok.returncode == 0, ok.stderr
    same = run_cli(*base, "--max-context", "20")
    assert same.returncode == 0 and same.stdout == ok.stdout
    low = run_cli(*base, "--max-memory", "1K", check=False)
    assert low.returncode != 0
    assert "memory needed" not in low.stderr  # the runner's line becomes the CLI's phrase
    assert "the model needs" in low.stderr and "over --max-memory 1024 bytes" in low.stderr
    assert len(low.stderr.strip().splitlines()) == 1, low.stderr
    for ctx, why in (("5", "between the request's 7 positions"), ("64", "and the file's 32")):
        bad = run_cli(*base, "--max-context", ctx, check=False)
        assert bad.returncode != 0 and why in bad.stderr, bad.stderr


def _c_forward(lm: LM, token: int, pos: int) -> int:
    """colibri_lm_forward called directly (the binding checks positions before C does)."""
    out = ctypes.POINTER(ctypes.c_float)()
    return int(lm._lib.colibri_lm_forward(lm._handle, token, pos, ctypes.byref(out)))


def _c_prefill(lm: LM, ids: list[int], pos: int) -> int:
    arr = (ctypes.c_int32 * len(ids))(*ids)
    out = ctypes.POINTER(ctypes.c_float)()
    return int(lm._lib.colibri_lm_prefill(lm._handle, arr, len(ids), pos, ctypes.byref(out)))


def test_positions_past_the_run_ones_are_refused_in_c(files: dict[str, Path]) -> None:
    """Before: a position beyond the tokens run returned OK and attended to KV rows never
    written (zero logits on a fresh handle, a freed handle's data on a reused block)."""
    with LM(files["small"]) as lm:
        assert _c_forward(lm, 3, 1) == ERR_POSITION  # fresh handle: only 0 may run
        assert _c_prefill(lm, [3, 4], 1) == ERR_POSITION
        assert _c_forward(lm, 3, 0) == 0
        assert _c_forward(lm, 4, 1) == 0
        assert _c_forward(lm, 5, 3) == ERR_POSITION  # 2 is next
        assert _c_prefill(lm, [5, 6, 7], 2) == 0  # positions 2..4
        assert _c_forward(lm, 8, 5) == 0
        assert _c_forward(lm, 8, 1) == 0  # a rewind: 2.. forgotten
        assert _c_forward(lm, 8, 3) == ERR_POSITION
        assert _c_forward(lm, 8, 2) == 0


def _entries(path: Path) -> dict[str, tuple[int, int]]:
    """name -> (offset, nbytes) of the file's tensor table."""
    data = path.read_bytes()
    from colibri.frontends.container import HEADER_FIELDS

    n = int(dict(zip(HEADER_FIELDS, LM_HEADER.unpack_from(data, 0)))["n_tensors"])
    out = {}
    for i in range(n):
        e = ENTRY.unpack_from(data, HEADER_SIZE + i * ENTRY_SIZE)
        out[e[0].rstrip(b"\0").decode()] = (int(e[7]), int(e[8]))
    return out


_CHANGE_SCRIPT = """
import os, sys
from colibri.targets.binding import LM, RuntimeStatusError
path, how = sys.argv[1], sys.argv[2]
lm = LM(path)
lm.forward(3, 0)
st = os.stat(path)
if how == "truncate":
    os.truncate(path, st.st_size // 2)
else:
    with open(path, "r+b") as f:
        f.seek(st.st_size - 100)
        f.write(bytes(100))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
try:
    lm.forward(17, 1)
    print("status 0")
except RuntimeStatusError as e:
    print("status", e.status)
lm.close()
"""


@pytest.mark.parametrize("how", ["truncate", "rewrite"])
def test_file_changed_after_load_is_a_status(
    files: dict[str, Path], tmp_path: Path, how: str
) -> None:
    """Before: a file truncated after the load killed the process with SIGBUS at the next
    token; now the call says COLIBRI_ERR_CHANGED before it reads anything (run in a child
    process, so a regression cannot take the test run down with it)."""
    path = tmp_path / "m.clb"
    path.write_bytes(files["small"].read_bytes())
    env = dict(os.environ, PYTHONPATH=str(ROOT / "codegen"))
    r = subprocess.run(
        [sys.executable, "-c", _CHANGE_SCRIPT, str(path), how],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
    assert r.stdout.strip() == f"status {ERR_CHANGED}", r.stdout + r.stderr[-2000:]


@pytest.mark.parametrize(
    ("chunk", "ahead", "last"),
    [
        (None, False, False),
        ("4096", False, False),
        (None, True, False),
        ("100", False, True),
        ("100", True, True),
    ],
    ids=["inline", "two-threads", "read-ahead", "two-threads-last-byte", "read-ahead-last-byte"],
)
def test_budgeted_expert_changed_in_place_is_a_checksum_error(
    files: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    chunk: str | None,
    ahead: bool,
    last: bool,
) -> None:
    """Before: with a RAM budget, an expert changed in the file after the load (the file's
    size and times kept, so nothing at the file level shows it) was read into a slot and run:
    logits off by 2.78, status OK. Now every read is checked against the tensor's CRC-32;
    with verify=False (COLIBRI_LOAD_SKIP_CHECKSUM) it is not, as documented. two-threads:
    4 KiB chunks (COLIBRI_LM_READ_CHUNK), so each miss is read by the reader thread and the
    caller together and checked from its chunks' combined CRC-32s: the same status.
    read-ahead: every prediction read ahead by the reader thread, a small expert's parts with
    one system call (lm_slot.whole), four slots so that there are slots to read into.
    last-byte: 100-byte chunks, and only the last byte of each part changed, in its last chunk,
    a partial one (a part of several chunks is checked from its chunks' CRC-32s combined, a
    part of one chunk by its own CRC-32 with no combining step)."""
    if chunk is not None:
        monkeypatch.setenv("COLIBRI_LM_READ_CHUNK", chunk)
    path = tmp_path / "m.clb"
    original = files["small"].read_bytes()
    with LM(files["small"], ram_budget=1 << 30) as lm:
        slot = lm.stats()["slot_bytes"]
    parts = [v for k, v in _entries(files["small"]).items() if k.startswith("layer.1.expert.")]
    ids = [int(t) for t in np.random.default_rng(5).integers(0, 64, 24)]
    outcomes = {}
    for verify in (True, False):
        path.write_bytes(original)
        st = os.stat(path)
        # two slots (top_k): layer 1's experts are read from the file at nearly every token
        n_slots, prefetch = (4, "always") if ahead else (2, False)
        with LM(path, ram_budget=n_slots * slot, prefetch=prefetch, pin=0, verify=verify) as lm:
            lm.forward(ids[0], 0)
            data = bytearray(original)
            for offset, nbytes in parts:  # every stored part of layer 1's experts
                if last:
                    data[offset + nbytes - 1] ^= 0x5A
                else:
                    data[offset : offset + nbytes] = bytes(
                        b ^ 0x5A for b in data[offset : offset + nbytes]
                    )
            with open(path, "r+b") as f:
                f.write(data)
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # the file looks untouched
            status = 0
            try:
                for pos, t in enumerate(ids[1:], start=1):
                    lm.forward(t, pos)
            except RuntimeStatusError as e:
                status = e.status
            outcomes[verify] = (status, lm.stats()["misses"], lm.stats()["prefetches"])
    assert outcomes[True][0] == ERR_CHECKSUM, outcomes
    # unchecked, the changed weights run: the steps either return logits or meet the NaN /
    # Inf those bytes make (COLIBRI_ERR_NAN, colibri_tfi_logits), never a checksum error
    assert outcomes[False][0] in (0, ERR_NAN) and outcomes[False][1] > 2, outcomes
    assert not ahead or outcomes[False][2] > 0, outcomes  # the reader read ahead
