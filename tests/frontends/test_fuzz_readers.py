"""The Python readers under hypothesis: mutated model files raise ColibriError, nothing else.

Valid small files of every format Colibri reads (the container, the seed layout with its
config.json and router.bin, numpy .npz, safetensors with a Hugging Face config.json, a
tokenizer.json) are mutated: bit flips, truncation, spliced bytes, header fields set to edge
values, JSON values replaced. Reading a mutant either works or raises a ColibriError subclass;
an IndexError, ValueError, struct.error, UnicodeDecodeError, MemoryError... escaping is a bug.
A sample of the mutants also goes through `colibri verify` as a subprocess: a failure is exactly
one `colibri: error:` line, never a traceback.

The runs are bounded (`max_examples`, no deadline) and derandomised, so they are the same on
every run and the whole file takes well under a minute on two busy cores
(``COLIBRI_FUZZ_EXAMPLES=N`` raises the count for a long run).
"""

from __future__ import annotations

import copy
import json
import os
import random
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from colibri.emit.container import write_container
from colibri.errors import ColibriError
from colibri.frontends.hf import SafetensorsFile, write_safetensors
from colibri.frontends.load import load_model
from colibri.frontends.seed import load_config, make_toy, write_seed
from hf_tiny import MIXTRAL_1LAYER_CONFIG, mixtral_tensors_1layer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SETTINGS = settings(
    # COLIBRI_FUZZ_EXAMPLES=20000 for a long run; the default keeps the file under a minute
    max_examples=int(os.environ.get("COLIBRI_FUZZ_EXAMPLES", "600")),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)

#: Draw an integer in [lo, hi] (hypothesis' data.draw, or random.Random.randint).
Draw = Callable[[int, int], int]

EDGE_INTS = [0, 1, 2, 3, 7, 8, 64, 127, 128, 255, 256, 4096, 65535, 65536, 2**24, 2**31 - 1]
EDGE_INTS += [2**31, 2**32 - 1, 2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 1]
EDGE_JSON: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    1,
    2**31,
    2**64,
    10**40,
    -(2**63),
    1.5,
    1e308,
    float("nan"),
    "",
    "x",
    "F32",
    "BF16",
    "swiglu",
    "Qwen2MoeForCausalLM",
    "OlmoeForCausalLM",
    "\udcff",
    [],
    [0],
    [2**40, 2**40],
    [[1]],
    ["a", 1],
    {},
    {"a": 1},
    {"type": "BPE"},
]


def mutate_bytes(base: bytes, fields: list[tuple[int, str]], draw: Draw) -> bytes:
    """1-4 random edits of `base`: bit flip, truncation, spliced bytes, appended bytes, or a
    header field (offset, struct format) set to an edge value."""
    buf = bytearray(base)
    for _ in range(draw(1, 4)):
        op = draw(0, 4)
        if op == 0 and buf:
            buf[draw(0, len(buf) - 1)] ^= 1 << draw(0, 7)
        elif op == 1:
            del buf[draw(0, len(buf)) :]
        elif op == 2 and buf:
            pos = draw(0, len(buf) - 1)
            buf[pos : pos + draw(1, 8)] = bytes(draw(0, 255) for _ in range(draw(1, 8)))
        elif op == 3:
            buf += bytes(draw(0, 255) for _ in range(draw(1, 64)))
        elif fields:
            off, fmt = fields[draw(0, len(fields) - 1)]
            size = struct.calcsize(fmt)
            if off + size <= len(buf):
                edges = [v for v in EDGE_INTS if v < 2 ** (8 * size)]
                value = (
                    edges[draw(0, len(edges) - 1)] if draw(0, 1) else draw(0, 2 ** (8 * size) - 1)
                )
                struct.pack_into(fmt, buf, off, value)
    return bytes(buf)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:8]):
            out += _paths(v, (*prefix, i))
    return out


def mutate_json(obj: Any, draw: Draw) -> Any:
    """1-3 random edits of a JSON value: a value replaced by an edge value, a key deleted, or a
    value nested very deeply."""
    obj = json.loads(json.dumps(obj))
    for _ in range(draw(1, 3)):
        paths = _paths(obj)
        path = paths[draw(0, len(paths) - 1)]
        if not path:
            obj = copy.deepcopy(EDGE_JSON[draw(0, len(EDGE_JSON) - 1)])
            continue
        parent = obj
        for key in path[:-1]:
            parent = parent[key]
        op = draw(0, 3)
        if op == 0 and isinstance(parent, dict):
            del parent[path[-1]]
        elif op == 1:
            parent[path[-1]] = DEEP  # json_bytes writes it as 5000 nested lists
        else:
            parent[path[-1]] = copy.deepcopy(EDGE_JSON[draw(0, len(EDGE_JSON) - 1)])
    return obj


DEEP = "<deeply nested>"


def json_bytes(obj: Any) -> bytes:
    text = json.dumps(obj).replace(json.dumps(DEEP), "[" * 5000 + "1" + "]" * 5000)
    return text.encode("utf-8", "surrogatepass")


def hyp_draw(data: Any) -> Draw:
    return lambda lo, hi: data.draw(st.integers(lo, hi))


# -- valid small files -------------------------------------------------------------------------

CONTAINER_FIELDS = [(8 + 4 * i, "<I") for i in range(10)] + [(48 + 8 * i, "<Q") for i in range(4)]
CONTAINER_FIELDS += [(80, "<I")]
for _e in range(3):
    _base = 128 + 96 * _e
    CONTAINER_FIELDS += [(_base + 48 + 4 * i, "<I") for i in range(6)]
    CONTAINER_FIELDS += [(_base + 72, "<Q"), (_base + 80, "<Q"), (_base + 88, "<I")]
SEED_FIELDS = [(0, "<I"), (4, "<I"), (8, "<I")]

TOKENIZER: dict[str, Any] = {
    "version": "1.0",
    "truncation": None,
    "padding": None,
    "added_tokens": [
        {
            "id": 5,
            "content": "<s>",
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
    ],
    "normalizer": None,
    "pre_tokenizer": {"type": "Whitespace"},
    "post_processor": None,
    "decoder": None,
    "model": {
        "type": "BPE",
        "dropout": None,
        "unk_token": None,
        "continuing_subword_prefix": None,
        "end_of_word_suffix": None,
        "fuse_unk": False,
        "byte_fallback": False,
        "vocab": {"a": 0, "b": 1, "ab": 2, "c": 3, "abc": 4},
        "merges": ["a b", "ab c"],
    },
}

HF_CONFIG: dict[str, Any] = {
    **MIXTRAL_1LAYER_CONFIG,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    # fields of the other architectures, for the mutations to reach their checks
    "num_experts": 2,
    "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 16,
    "mlp_only_layers": [],
    "decoder_sparse_step": 1,
    "norm_topk_prob": False,
    "head_dim": 4,
    "sliding_window": None,
    "use_sliding_window": False,
    "rope_scaling": None,
}


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("bases")
    layer = make_toy(experts=3, hidden=4, ff=8, top_k=2, seed=1)
    write_seed(layer, root / "seed")
    write_container(layer, root / "m.clb")
    npz_arrays = {
        "router_weight": layer.router_w,
        "w1": np.stack([e.w1 for e in layer.experts]),
        "w2": np.stack([e.w2 for e in layer.experts]),
        "b1": np.stack([e.b1 for e in layer.experts if e.b1 is not None]),
        "b2": np.stack([e.b2 for e in layer.experts if e.b2 is not None]),
        "config": np.array(json.dumps(layer.config.to_json())),
    }
    np.savez(root / "m.npz", **npz_arrays)
    write_safetensors(mixtral_tensors_1layer(), root / "model.safetensors")
    st_raw = (root / "model.safetensors").read_bytes()
    (n,) = struct.unpack_from("<Q", st_raw)
    return {
        "root": root,
        "container": (root / "m.clb").read_bytes(),
        "seed": (root / "seed" / "model.bin").read_bytes(),
        "router": (root / "seed" / "router.bin").read_bytes(),
        "config": json.loads((root / "seed" / "config.json").read_text()),
        "npz": (root / "m.npz").read_bytes(),
        "npz_arrays": npz_arrays,
        "st_header": json.loads(st_raw[8 : 8 + n]),
        "st_data": st_raw[8 + n :],
    }


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mutants")


def only_colibri_errors(fn: Callable[[], Any]) -> None:
    """Run a reader; a ColibriError is the expected outcome of a bad file, anything else fails."""
    try:
        fn()
    except ColibriError:
        pass


# -- writers of one mutant per format (shared by the hypothesis tests and the CLI sample) -------


def container_mutant(bases: dict[str, Any], d: Path, draw: Draw) -> Path:
    data = bases["container"]
    if draw(0, 3) == 0:  # the JSON metadata (its length changes: the header keeps the old one)
        meta_off, meta_bytes = (
            struct.unpack_from("<QQ", data, 56)[0],
            struct.unpack_from("<I", data, 44)[0],
        )
        meta = json.loads(data[meta_off : meta_off + meta_bytes])
        new = json_bytes(mutate_json(meta, draw))[:meta_bytes].ljust(meta_bytes, b" ")
        data = data[:meta_off] + new + data[meta_off + meta_bytes :]
    else:
        data = mutate_bytes(data, CONTAINER_FIELDS, draw)
    (d / "m.clb").write_bytes(data)
    return d / "m.clb"


def seed_mutant(bases: dict[str, Any], d: Path, draw: Draw) -> Path:
    (d / "seed").mkdir(exist_ok=True)
    which = draw(0, 2)
    model, router, config = bases["seed"], bases["router"], json_bytes(bases["config"])
    if which == 0:
        model = mutate_bytes(model, SEED_FIELDS, draw)
    elif which == 1:
        router = mutate_bytes(router, [], draw)
    elif draw(0, 1):
        config = json_bytes(mutate_json(bases["config"], draw))
    else:
        config = mutate_bytes(config, [], draw)
    (d / "seed" / "model.bin").write_bytes(model)
    (d / "seed" / "router.bin").write_bytes(router)
    (d / "seed" / "config.json").write_bytes(config)
    return d / "seed" / "model.bin"


NPZ_DTYPES = ("<f4", "<f8", "<f2", "<i4", "u1", "?", "<c8", "<U3", ">f4")


def npz_mutant(bases: dict[str, Any], d: Path, draw: Draw) -> Path:
    """Bytes mutated, or a valid archive whose arrays have wrong shapes, dtypes or config."""
    if draw(0, 1):
        (d / "m.npz").write_bytes(mutate_bytes(bases["npz"], [], draw))
        return d / "m.npz"
    arrays = dict(bases["npz_arrays"])
    keys = sorted(arrays)
    key = keys[draw(0, len(keys) - 1)]
    op = draw(0, 3)
    if op == 0:
        del arrays[key]
    elif op == 1 and key == "config":
        config = json.loads(str(arrays["config"]))
        arrays["config"] = np.array(
            json_bytes(mutate_json(config, draw)).decode("utf-8", "replace")
        )
    elif op == 1:
        arrays[key] = arrays[key].astype(NPZ_DTYPES[draw(0, len(NPZ_DTYPES) - 1)])
    elif op == 2:
        shape = tuple(draw(0, 5) for _ in range(draw(0, 4)))
        arrays[key] = np.zeros(shape, NPZ_DTYPES[draw(0, len(NPZ_DTYPES) - 1)])
    elif key != "config":
        bad = arrays[key].astype(np.float32).copy()
        if bad.size:
            bad.flat[draw(0, bad.size - 1)] = (np.nan, np.inf, -np.inf, 1e38)[draw(0, 3)]
        arrays[key] = bad
    np.savez(d / "m.npz", **arrays)
    return d / "m.npz"


def safetensors_mutant(bases: dict[str, Any], d: Path, draw: Draw) -> Path:
    ckpt = d / "ckpt"
    ckpt.mkdir(exist_ok=True)
    header, blob = bases["st_header"], bases["st_data"]
    which = draw(0, 2)
    config = HF_CONFIG
    if which == 0:
        header = mutate_json(header, draw)
    elif which == 1:
        config = mutate_json(HF_CONFIG, draw)
    raw = json_bytes(header)
    raw += b" " * (-len(raw) % 8)
    data = struct.pack("<Q", len(raw)) + raw + blob
    if which == 2:
        data = mutate_bytes(data, [(0, "<Q")], draw)
    (ckpt / "model.safetensors").write_bytes(data)
    (ckpt / "config.json").write_bytes(json_bytes(config))
    return ckpt


def tokenizer_mutant(bases: dict[str, Any], d: Path, draw: Draw) -> Path:
    if draw(0, 2):
        data = json_bytes(mutate_json(TOKENIZER, draw))
    else:
        data = mutate_bytes(json_bytes(TOKENIZER), [], draw)
    (d / "tokenizer.json").write_bytes(data)
    return d / "tokenizer.json"


# -- hypothesis: only ColibriError escapes -----------------------------------------------------


def test_the_bases_are_valid(bases: dict[str, Any]) -> None:
    root = bases["root"]
    load_model(root / "m.clb")
    load_model(root / "seed" / "model.bin")
    load_model(root / "m.npz")
    st_file = SafetensorsFile(root / "model.safetensors")
    assert len(st_file.tensors) == 16


@SETTINGS
@given(st.data())
def test_container(bases: dict[str, Any], work: Path, data: Any) -> None:
    path = container_mutant(bases, work, hyp_draw(data))
    only_colibri_errors(lambda: load_model(path))


@SETTINGS
@given(st.data())
def test_seed_layout_and_config(bases: dict[str, Any], work: Path, data: Any) -> None:
    path = seed_mutant(bases, work, hyp_draw(data))
    only_colibri_errors(lambda: load_model(path))
    only_colibri_errors(lambda: load_config(path.parent / "config.json"))


@SETTINGS
@given(st.data())
def test_npz(bases: dict[str, Any], work: Path, data: Any) -> None:
    path = npz_mutant(bases, work, hyp_draw(data))
    only_colibri_errors(lambda: load_model(path))


@SETTINGS
@given(st.data())
def test_safetensors_and_hf_config(bases: dict[str, Any], work: Path, data: Any) -> None:
    from colibri.frontends.hf_model import load_transformer

    ckpt = safetensors_mutant(bases, work, hyp_draw(data))

    def read_all() -> None:
        f = SafetensorsFile(ckpt / "model.safetensors")
        for name in f.tensors:
            f.read(name)

    only_colibri_errors(read_all)
    only_colibri_errors(lambda: load_model(ckpt, layer=0))
    only_colibri_errors(lambda: load_transformer(ckpt))


@SETTINGS
@given(st.data())
def test_tokenizer(work: Path, data: Any) -> None:
    pytest.importorskip("tokenizers")
    from colibri.frontends.tokenizer import load_tokenizer

    path = tokenizer_mutant({}, work, hyp_draw(data))

    def use() -> None:
        tok = load_tokenizer(path)
        tok.decode(tok.encode("ab abc c"))
        tok.check_vocab(16)

    only_colibri_errors(use)


@pytest.mark.parametrize(("offset", "value"), [(16, 2**32 - 1), (20, 2**32 - 1), (20, 0)])
def test_container_header_dimensions_are_bounded(
    bases: dict[str, Any], tmp_path: Path, offset: int, value: int
) -> None:
    """n_experts = 2^32 - 1 in the header used to build a 4-billion-entry list (24 GB)."""
    data = bytearray(bases["container"])
    struct.pack_into("<I", data, offset, value)
    (tmp_path / "m.clb").write_bytes(bytes(data))
    with pytest.raises(ColibriError, match="the file is corrupt"):
        load_model(tmp_path / "m.clb")


def test_safetensors_overlapping_offsets_are_refused(tmp_path: Path) -> None:
    path = write_safetensors(
        {"a": np.zeros(4, np.float32), "b": np.ones(4, np.float32)}, tmp_path / "m.safetensors"
    )
    raw = path.read_bytes()
    (n,) = struct.unpack_from("<Q", raw)
    header = json.loads(raw[8 : 8 + n])
    header["b"]["data_offsets"] = [8, 24]  # shares bytes 8..16 with "a" [0, 16]
    new = json.dumps(header).encode()
    new += b" " * (-len(new) % 8)
    path.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n :])
    with pytest.raises(ColibriError, match="'a' and 'b' overlap"):
        SafetensorsFile(path)


# -- the CLI on a sample of mutants: one error line, never a traceback --------------------------

MUTANTS: dict[str, Callable[[dict[str, Any], Path, Draw], Path]] = {
    "container": container_mutant,
    "seed": seed_mutant,
    "npz": npz_mutant,
    "safetensors": safetensors_mutant,
}


@pytest.mark.parametrize("fmt", sorted(MUTANTS))
def test_cli_verify_on_mutants(fmt: str, bases: dict[str, Any], tmp_path: Path) -> None:
    rng = random.Random(f"colibri-{fmt}")
    for i in range(4):
        d = tmp_path / str(i)
        d.mkdir()
        path = MUTANTS[fmt](bases, d, rng.randint)
        proc = subprocess.run(
            [sys.executable, "-m", "colibri", "verify", str(path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert "Traceback" not in proc.stderr, proc.stderr
        if proc.returncode == 0:
            assert proc.stdout.rstrip().endswith("ok"), proc.stdout
            continue
        lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("colibri: error:")]
        assert proc.returncode == 1 and len(lines) == 1, proc.stderr
        assert proc.stderr.startswith("colibri: error: "), proc.stderr
