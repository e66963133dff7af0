"""Expert caches of generated (static) models: NONE / LRU / PINNED give identical outputs on
the host and under QEMU; LRU eviction order, pinned experts never evicted, fewer slots than k,
and the counters of colibri_get_stats, read through ctypes from a host build of the generated
sources + the runtime."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from colibri.cli.main import run_model
from colibri.cli.pipeline import generate
from colibri.frontends.seed import make_toy
from colibri.ir.moe import MoELayer
from colibri.options import GenerateOptions
from colibri.paths import runtime_sources
from colibri.reference.moe import compare, moe_forward
from conftest import ROOT, require_board

POLICIES = [("pinned", 0), ("none", 0), ("lru", 1), ("lru", 2), ("lru", 6)]


def _model() -> tuple[MoELayer, np.ndarray]:
    layer = make_toy(6, 24, 40, 2, "gelu", seed=8, router_bias=True)
    x = np.random.default_rng(2).standard_normal((40, 24)).astype(np.float32)
    return layer, x


@pytest.mark.parametrize("board", ["host", "cortex-m4", "xtensa-lx106"])
def test_quantised_outputs_identical_under_every_policy(board: str, tmp_path: Path) -> None:
    """Mixed int8 / int4 / fp16 / fp32 experts: the loader copies each expert's stored bytes
    (part_bytes) into RAM slots and the kernels read them there, bit-identical to pinned."""
    require_board(board)
    layer, x = _model()
    runs = {}
    for policy, slots in POLICIES:
        tag = f"q{policy}{slots}"
        opts = GenerateOptions(
            board=board,
            name=tag,
            max_tokens=8,
            quant="int8",
            expert_quant="1=int4,2=fp16,3=fp32",
            cache=policy,
            cache_slots=slots,
        )
        generate(layer, tmp_path / tag, opts)
        out, _ = run_model(tmp_path / tag, board, x)
        runs[tag] = out.output
    first = runs["qpinned0"]
    for tag, y in runs.items():
        assert np.array_equal(y, first), f"{board}: {tag} differs from pinned"


@pytest.mark.parametrize("board", ["host", "cortex-m4", "xtensa-lx106"])
def test_outputs_identical_under_every_policy(board: str, tmp_path: Path) -> None:
    require_board(board)
    layer, x = _model()
    ref, r = moe_forward(layer, x)
    runs = {}
    for policy, slots in POLICIES:
        tag = f"{policy}{slots}"
        opts = GenerateOptions(board=board, name=tag, max_tokens=8, cache=policy, cache_slots=slots)
        _, man = generate(layer, tmp_path / tag, opts)
        if slots or policy == "none":
            assert any(reg["name"] == "slots" for reg in man["memory"]["regions"])
        out, _ = run_model(tmp_path / tag, board, x)
        np.testing.assert_array_equal(out.expert_ids, r.expert_ids)
        assert compare(out.output, ref) is None
        runs[tag] = out.output
    first = runs["pinned0"]
    for tag, y in runs.items():
        assert np.array_equal(y, first), f"{board}: {tag} differs from pinned"


class _Stats(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("loads", "hits", "misses", "evictions")]


@pytest.fixture
def static_model(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A factory: generate with a cache policy, build the sources + runtime as a host .so."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no host C compiler")

    def make(policy: str, slots: int) -> ctypes.CDLL:
        layer, _ = _model()
        gen = tmp_path / f"{policy}{slots}"
        generate(layer, gen, GenerateOptions(name="cm", cache=policy, cache_slots=slots))
        so = gen / "libcm.so"
        srcs = sorted(str(p) for p in gen.glob("*.c"))
        srcs += [str(p) for p in runtime_sources()]
        subprocess.run(
            [cc, "-std=c11", "-O2", "-ffp-contract=off", "-shared", "-fPIC", "-D_GNU_SOURCE"]
            + ["-I", str(gen), "-I", str(ROOT / "runtime_c" / "include")]
            + ["-I", str(ROOT / "runtime_c" / "tiles"), *srcs]
            + ["-o", str(so), "-lm"],
            check=True,
        )
        lib = ctypes.CDLL(str(so))
        model = ctypes.c_void_p()
        assert lib.cm_setup(ctypes.byref(model), None) == 0
        lib.model = model  # type: ignore[attr-defined]
        return lib

    return make


def _load(lib: ctypes.CDLL, e: int) -> int:
    w = ctypes.c_void_p()
    assert lib.colibri_load_expert(lib.model, e, ctypes.byref(w)) == 0  # type: ignore[attr-defined]
    assert w.value
    return int(w.value)


def _stats(lib: ctypes.CDLL) -> tuple[int, int, int, int]:
    s = _Stats()
    assert lib.colibri_get_stats(lib.model, ctypes.byref(s)) == 0  # type: ignore[attr-defined]
    return (s.loads, s.hits, s.misses, s.evictions)


def test_lru_eviction_order(static_model) -> None:  # type: ignore[no-untyped-def]
    lib = static_model("lru", 2)
    a, b = _load(lib, 0), _load(lib, 1)  # two misses fill both slots
    assert a != b and _stats(lib) == (2, 0, 2, 0)
    assert _load(lib, 0) == a  # hit: 0 is now the most recent
    c = _load(lib, 2)  # miss: evicts 1 (least recently used), takes its slot
    assert c == b and _stats(lib) == (4, 1, 3, 1)
    assert _load(lib, 0) == a  # 0 survived
    assert _load(lib, 1) == c  # 1 comes back into the slot of 2 (now the LRU)
    assert _stats(lib) == (6, 2, 4, 2)
    assert lib.colibri_reset_stats(lib.model) == 0  # type: ignore[attr-defined]
    assert _stats(lib) == (0, 0, 0, 0)


def test_pinned_never_evicts(static_model) -> None:  # type: ignore[no-untyped-def]
    lib = static_model("pinned", 0)
    first = [_load(lib, e) for e in range(6)]
    for _ in range(3):
        assert [_load(lib, e) for e in range(6)] == first
    assert _stats(lib) == (24, 24, 0, 0)


def test_none_fetches_every_time(static_model) -> None:  # type: ignore[no-untyped-def]
    lib = static_model("none", 0)
    for e in (0, 0, 1):
        _load(lib, e)
    assert _stats(lib) == (3, 0, 3, 0)


def test_fewer_slots_than_k_forward(static_model) -> None:  # type: ignore[no-untyped-def]
    """k = 2 with one LRU slot: every expert of a token is fetched in turn; output unchanged."""
    layer, x = _model()
    lib = static_model("lru", 1)
    t, d, k = x.shape[0], 24, 2
    y = np.zeros((t, d), np.float32)
    ids = np.zeros((t, k), np.int32)
    gates = np.zeros((t, k), np.float32)
    temp = np.zeros(t, np.float32)
    st = lib.colibri_forward(
        lib.model,  # type: ignore[attr-defined]
        *(ctypes.c_void_p(a.ctypes.data) for a in (x, y)),
        t,
        d,
        k,
        *(ctypes.c_void_p(a.ctypes.data) for a in (ids, gates, temp)),
    )
    assert st == 0
    ref, r = moe_forward(layer, x)
    np.testing.assert_array_equal(ids, r.expert_ids)
    assert compare(y, ref) is None
    loads, hits, misses, evictions = _stats(lib)
    active = len(np.unique(r.expert_ids))
    assert loads == hits + misses and misses >= active and evictions == misses - 1


def test_lru_with_sharing_map_and_cli_report(tmp_path: Path) -> None:
    """Experts sharing weights share cache slots; the CLI prints the cache in its report."""
    from colibri.frontends.seed import write_seed
    from conftest import run_cli

    layer, x = _model()
    layer.sharing_map = [0, 0, 2, 2, 4, 4]
    layer.experts = [layer.experts[j] for j in layer.sharing_map]  # as an importer gives it
    write_seed(layer, tmp_path / "m")
    gen = tmp_path / "g"
    opts = GenerateOptions(name="g", max_tokens=8, cache="lru", cache_slots=2)
    _, man = generate(layer, gen, opts)
    assert man["layout"]["unique_experts"] == 3 and man["layout"]["cache_slots"] == 2
    out, _ = run_model(gen, "host", x)
    ref, r = moe_forward(layer, x)
    np.testing.assert_array_equal(out.expert_ids, r.expert_ids)
    assert compare(out.output, ref) is None
    proc = run_cli(
        "generate", str(tmp_path / "m" / "model.bin"), "--out", str(tmp_path / "c"),
        "--cache", "lru", "--cache-slots", "3",
    )  # fmt: skip
    assert "cache lru (3 slots)" in proc.stdout
    quant = run_cli(
        "generate", str(tmp_path / "m" / "model.bin"), "--out", str(tmp_path / "d"),
        "--cache", "lru", "--quant", "int8",
    )  # fmt: skip
    assert "cache lru (2 slots)" in quant.stdout and "int8" in quant.stdout
