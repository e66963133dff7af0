"""The seed articles' formats -> MoELayer IR, and back.

The seed flat layout (file + config.json + router.bin), its directory variant
(expert_{i}.bin) and numpy .npz (docs/format.md); :func:`write_seed` writes the flat layout.
:func:`colibri.frontends.load.load_model` detects the format from a file's first bytes.
"""

from __future__ import annotations

import json
import math
import os
import struct
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, ModelFormatError
from ..ir.moe import ACTIVATIONS, GATED_ACTIVATION, Expert, MoEConfig, MoELayer, parse_config
from ..paths import write_files_atomic

SEED_MAGIC = 0x434F4C49
SEED_VERSION = 1
SEED_HEADER = struct.Struct("<III")


def load_config(path: str | os.PathLike[str]) -> MoEConfig:
    """Read and validate a config.json."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"{path}: config file not found; the seed layout needs a config.json beside the "
            f"model (or pass --config PATH)"
        )
    return parse_config(read_config_json(path), str(path))


def read_config_json(path: Path) -> Any:
    """The JSON value of a config file; ConfigError when it is not UTF-8 JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from exc


def _expert_floats(c: MoEConfig) -> int:
    return 2 * c.d_model * c.d_ff + c.d_ff + c.d_model


def _split_expert(flat: np.ndarray, c: MoEConfig) -> Expert:
    d, f = c.d_model, c.d_ff
    o = 0
    w1 = flat[o : o + d * f].reshape(d, f)
    o += d * f
    b1 = flat[o : o + f]
    o += f
    w2 = flat[o : o + f * d].reshape(f, d)
    o += f * d
    b2 = flat[o : o + d]
    return Expert(w1=w1.copy(), b1=b1.copy(), w2=w2.copy(), b2=b2.copy())


def _read_router(path: Path, c: MoEConfig) -> tuple[np.ndarray, np.ndarray | None]:
    if not path.is_file():
        raise ModelFormatError(
            f"{path}: router weights not found; the seed layout needs router.bin "
            f"(float32 [n_experts x hidden_size]) beside the model"
        )
    raw = path.read_bytes()
    n_w = c.n_experts * c.d_model
    if len(raw) == 4 * n_w:
        return np.frombuffer(raw, "<f4").reshape(c.n_experts, c.d_model).copy(), None
    if len(raw) == 4 * (n_w + c.n_experts):
        arr = np.frombuffer(raw, "<f4")
        return arr[:n_w].reshape(c.n_experts, c.d_model).copy(), arr[n_w:].copy()
    raise ModelFormatError(
        f"{path}: {len(raw)} bytes, expected {4 * n_w} (float32 [{c.n_experts} x "
        f"{c.d_model}]) or {4 * (n_w + c.n_experts)} (with bias) from the config"
    )


def _check_seed_config(c: MoEConfig, source: str) -> None:
    if c.gated:
        raise ConfigError(
            f"{source}: activation 'swiglu' needs a w3 tensor, which the seed layout cannot "
            f"hold; use the .npz or Colibri container format for gated experts"
        )


def read_seed_file(path: Path, config_path: Path | None = None) -> MoELayer:
    """The seed flat layout: COLI header + experts, config.json and router.bin beside it."""
    c = load_config(config_path or path.parent / "config.json")
    _check_seed_config(c, str(config_path or path.parent / "config.json"))
    raw = path.read_bytes()
    if len(raw) < SEED_HEADER.size:
        raise ModelFormatError(f"{path}: truncated: {len(raw)} bytes, the header is 12")
    magic, version, n_experts = SEED_HEADER.unpack_from(raw)
    if magic != SEED_MAGIC:
        raise ModelFormatError(f"{path}: bad magic 0x{magic:08X}, expected 0x{SEED_MAGIC:08X}")
    if version != SEED_VERSION:
        raise ModelFormatError(
            f"{path}: seed layout version {version} is not supported (expected {SEED_VERSION})"
        )
    if n_experts != c.n_experts:
        raise ModelFormatError(
            f"{path}: header says {n_experts} experts, config.json says n_experts="
            f"{c.n_experts}; they must agree"
        )
    per = _expert_floats(c)
    expected = SEED_HEADER.size + 4 * per * n_experts
    if len(raw) < expected:
        raise ModelFormatError(
            f"{path}: truncated: {len(raw)} bytes, expected {expected} for {n_experts} experts "
            f"of hidden_size={c.d_model}, intermediate_size={c.d_ff}"
        )
    if len(raw) != expected:
        raise ModelFormatError(
            f"{path}: {len(raw)} bytes is inconsistent with the config: expected {expected} "
            f"for {n_experts} experts of hidden_size={c.d_model}, intermediate_size={c.d_ff}; "
            f"check hidden_size / intermediate_size in config.json"
        )
    flat = np.frombuffer(raw, "<f4", offset=SEED_HEADER.size).reshape(n_experts, per)
    router_w, router_b = _read_router(path.parent / "router.bin", c)
    layer = MoELayer(
        config=c,
        router_w=router_w,
        router_b=router_b,
        experts=[_split_expert(flat[i], c) for i in range(n_experts)],
        source=str(path),
    )
    return layer.validate()


def read_seed_dir(path: Path, config_path: Path | None = None) -> MoELayer:
    """The directory variant: router.bin, expert_0.bin ... expert_{E-1}.bin, config.json."""
    c = load_config(config_path or path / "config.json")
    _check_seed_config(c, str(config_path or path / "config.json"))
    per = _expert_floats(c)
    experts = []
    for i in range(c.n_experts):
        p = path / f"expert_{i}.bin"
        if not p.is_file():
            raise ModelFormatError(
                f"{p}: missing; config.json says n_experts={c.n_experts}, so expert_0.bin .. "
                f"expert_{c.n_experts - 1}.bin must exist"
            )
        raw = p.read_bytes()
        if len(raw) != 4 * per:
            what = "truncated" if len(raw) < 4 * per else "too large"
            raise ModelFormatError(
                f"{p}: {what}: {len(raw)} bytes, expected {4 * per} for hidden_size={c.d_model}, "
                f"intermediate_size={c.d_ff}"
            )
        experts.append(_split_expert(np.frombuffer(raw, "<f4"), c))
    router_w, router_b = _read_router(path / "router.bin", c)
    return MoELayer(c, router_w, router_b, experts, source=str(path)).validate()


#: What numpy and zipfile raise on a corrupt archive member.
_NPZ_ERRORS = (
    OSError,
    ValueError,
    EOFError,
    KeyError,
    TypeError,
    OverflowError,
    NotImplementedError,
    RuntimeError,
    struct.error,
    zlib.error,
    zipfile.BadZipFile,
)


def npz_members(zf: zipfile.ZipFile) -> Iterator[tuple[zipfile.ZipInfo, Any, np.dtype]]:
    """(member, shape, dtype) of every .npy member of an .npz, from its header alone."""
    for info in zf.infolist():
        if info.filename.endswith(".npy"):
            with zf.open(info) as f:
                version = np.lib.format.read_magic(f)
                if version == (1, 0):
                    shape, _, dtype = np.lib.format.read_array_header_1_0(f)
                else:
                    shape, _, dtype = np.lib.format.read_array_header_2_0(f)
            yield info, shape, dtype


def _read_npz_arrays(path: Path) -> dict[str, np.ndarray]:
    """Every array of an .npz, each member's header checked against its stored size before the
    array is read (a header cannot make numpy allocate more than the archive holds)."""
    try:
        with zipfile.ZipFile(path) as zf:
            for info, shape, dtype in npz_members(zf):
                need = math.prod(shape) * dtype.itemsize
                if dtype.hasobject or need > info.file_size:
                    raise ModelFormatError(
                        f"{path}: member {info.filename} says {dtype} {list(shape)} "
                        f"({need} bytes) but holds {info.file_size} bytes; the .npz is corrupt"
                    )
        with np.load(path, allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}
    except _NPZ_ERRORS as exc:
        raise ModelFormatError(
            f"{path}: not a readable .npz file ({type(exc).__name__}: {exc})"
        ) from None


def read_npz(path: Path, config_path: Path | None = None) -> MoELayer:
    """numpy .npz with router_weight, w1, w2 (+ router_bias, b1, b2, w3, config)."""
    arrays = _read_npz_arrays(path)
    cfg: Any
    if config_path is not None or "config" not in arrays:
        c = load_config(config_path or path.parent / "config.json")
    else:
        try:
            cfg = json.loads(str(arrays["config"]))
        except (json.JSONDecodeError, RecursionError) as exc:
            raise ConfigError(f"{path}: array 'config' is not JSON text ({exc})") from exc
        c = parse_config(cfg, f"{path}:config")
    for required in ("router_weight", "w1", "w2"):
        if required not in arrays:
            raise ModelFormatError(
                f"{path}: array '{required}' is missing (have: {', '.join(sorted(arrays))})"
            )

    def f32(name: str) -> np.ndarray | None:
        a = arrays.get(name)
        if a is None:
            return None
        if a.dtype.kind != "f":
            raise ModelFormatError(f"{path}: array '{name}' has dtype {a.dtype}, expected float")
        return np.ascontiguousarray(a, dtype=np.float32)

    w1, w2, b1, b2, w3 = f32("w1"), f32("w2"), f32("b1"), f32("b2"), f32("w3")
    assert w1 is not None and w2 is not None
    n = c.n_experts
    for name, arr in (("w1", w1), ("w2", w2), ("b1", b1), ("b2", b2), ("w3", w3)):
        want = 3 if name.startswith("w") else 2
        if arr is not None and arr.ndim != want:
            raise ModelFormatError(
                f"{path}: array '{name}' has {arr.ndim} dimensions {list(arr.shape)}, expected "
                f"{want} ([n_experts, ...])"
            )
        if arr is not None and arr.shape[0] != n:
            raise ModelFormatError(
                f"{path}: array '{name}' has {arr.shape[0]} experts, config says n_experts={n}"
            )
    experts = [
        Expert(
            w1=w1[i],
            w2=w2[i],
            b1=None if b1 is None else b1[i],
            b2=None if b2 is None else b2[i],
            w3=None if w3 is None else w3[i],
        )
        for i in range(n)
    ]
    router_w = f32("router_weight")
    assert router_w is not None
    return MoELayer(c, router_w, f32("router_bias"), experts, source=str(path)).validate()


def write_seed(layer: MoELayer, out_dir: str | os.PathLike[str], name: str = "model.bin") -> Path:
    """Write the seed flat layout (model.bin, router.bin, config.json) into out_dir."""
    c = layer.config
    if c.gated:
        raise ConfigError("the seed layout cannot hold gated (swiglu) experts; use the container")
    out = Path(out_dir)
    parts = [SEED_HEADER.pack(SEED_MAGIC, SEED_VERSION, c.n_experts)]
    for e in layer.experts:
        b1 = e.b1 if e.b1 is not None else np.zeros(c.d_ff, np.float32)
        b2 = e.b2 if e.b2 is not None else np.zeros(c.d_model, np.float32)
        for arr in (e.w1, b1, e.w2, b2):
            parts.append(np.ascontiguousarray(arr, "<f4").tobytes())
    router = [np.ascontiguousarray(layer.router_w, "<f4").tobytes()]
    if layer.router_b is not None:
        router.append(np.ascontiguousarray(layer.router_b, "<f4").tobytes())
    write_files_atomic(
        {
            out / name: b"".join(parts),
            out / "router.bin": b"".join(router),
            out / "config.json": (json.dumps(c.to_json(), indent=2) + "\n").encode(),
        }
    )
    return out / name


# -- seeded toy models (`colibri make-toy`) ----------------------------------------------------
def make_toy(
    experts: int = 2,
    hidden: int = 8,
    ff: int = 16,
    top_k: int = 1,
    activation: str = "gelu",
    seed: int = 0,
    norm_topk_prob: bool = False,
    router_bias: bool = False,
) -> MoELayer:
    """A random MoE layer; the defaults are the seed articles' toy (2 experts, 8 -> 16, k=1).

    Weights are N(0, 1/fan_in) so activations stay O(1) for any size.
    """
    if activation not in (*ACTIVATIONS, GATED_ACTIVATION):
        raise ConfigError(
            f"unknown activation '{activation}'; supported: "
            f"{', '.join((*ACTIVATIONS, GATED_ACTIVATION))}"
        )
    cfg = parse_config(
        {
            "n_experts": experts,
            "k": top_k,
            "hidden_size": hidden,
            "intermediate_size": ff,
            "activation": activation,
            "norm_topk_prob": norm_topk_prob,
        },
        "make-toy options",
    )
    rng = np.random.default_rng(seed)

    def normal(shape: tuple[int, ...], fan_in: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)

    gated = cfg.gated
    exps = []
    for _ in range(experts):
        exps.append(
            Expert(
                w1=normal((hidden, ff), hidden),
                b1=None if gated else normal((ff,), hidden),
                w2=normal((ff, hidden), ff),
                b2=None if gated else normal((hidden,), ff),
                w3=normal((hidden, ff), hidden) if gated else None,
            )
        )
    router_w = normal((experts, hidden), 1) * np.float32(0.5)
    router_b = normal((experts,), 1) * np.float32(0.1) if router_bias else None
    return MoELayer(cfg, router_w, router_b, exps, source=f"toy(seed={seed})").validate()
