"""Open any supported input: model files (format detected from the content) and .npy arrays.

Model formats (docs/format.md): the Colibri container, the seed flat layout and its directory
variant, numpy .npz, and one MoE block of a Hugging Face checkpoint (``--layer``). The format is
detected from the file's first bytes, never from its name alone.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, InputError, ModelFormatError
from ..ir.moe import MoELayer
from ..paths import check_output_file, write_file_atomic
from .container import MAGIC as CONTAINER_MAGIC
from .container import read_container
from .hf import HFCheckpoint, check_architectures, is_hf_checkpoint, load_hf_moe_layer
from .seed import SEED_MAGIC, read_npz, read_seed_dir, read_seed_file


def load_model(
    path: str | os.PathLike[str],
    config: str | os.PathLike[str] | None = None,
    layer: int | None = None,
) -> MoELayer:
    """Read any supported model; the format is detected from the content.

    A Hugging Face checkpoint directory (config.json with "architectures") is a whole model:
    `layer` picks the decoder layer whose MoE block is imported (colibri.frontends.hf)."""
    p = Path(path)
    cfg = Path(config) if config is not None else None
    if not p.exists():
        raise ModelFormatError(f"{p}: no such file or directory")
    check_architectures(p)
    if p.is_dir() and is_hf_checkpoint(p):
        return _load_hf_block(p, layer)
    if layer is not None:
        raise ConfigError(
            f"{p}: --layer {layer} applies only to Hugging Face checkpoint directories "
            f'(config.json with "architectures"); this model is a single MoE layer'
        )
    if p.is_dir():
        if (p / "expert_0.bin").is_file():
            return read_seed_dir(p, cfg)
        for name in ("model.clb", "model.bin", "model.npz"):
            if (p / name).is_file():
                return load_model(p / name, cfg)
        raise ModelFormatError(
            f"{p}: directory holds no model: expected expert_0.bin (directory variant), "
            f"model.clb, model.bin (seed layout) or model.npz"
        )
    with open(p, "rb") as f:
        head = f.read(8)
    if head.startswith(CONTAINER_MAGIC[:7]):
        return read_container(p)
    if head.startswith(b"PK"):
        return read_npz(p, cfg)
    if len(head) >= 4:
        if struct.unpack_from("<I", head)[0] == SEED_MAGIC:
            return read_seed_file(p, cfg)
    if len(head) < 4:
        raise ModelFormatError(f"{p}: truncated: {len(head)} bytes, not a model file")
    raise ModelFormatError(
        f"{p}: unrecognised model file (first bytes {head[:8].hex()}): expected a Colibri "
        f"container ({CONTAINER_MAGIC[:7].decode()}), the seed layout (magic 0x{SEED_MAGIC:08X}) "
        f"or a numpy .npz"
    )


def _load_hf_block(path: Path, layer: int | None) -> MoELayer:
    ckpt = HFCheckpoint(path)
    if layer is None:
        n = ckpt.n_layers
        moe = [i for i in range(n) if ckpt.is_moe_layer(i)]
        raise ConfigError(
            f"{path}: a whole {ckpt.arch.name} model ({n} decoder layers); pass --layer N to "
            f"import the MoE block of one layer (MoE layers: {moe}) — generating C for the "
            f"whole transformer is not supported yet"
        )
    return load_hf_moe_layer(ckpt, layer)


def load_npy(path: str | Path, what: str = "input file", expected: str = "") -> np.ndarray:
    """One array from a .npy file, with an error naming the file (and `expected`, e.g. the
    shape wanted) when it is missing, unreadable or an archive."""
    p = Path(path)
    hint = f" ({expected})" if expected else ""
    if not p.is_file():
        raise InputError(f"{p}: {what} not found{hint}")
    try:
        arr = np.load(p, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise InputError(f"{p}: not a readable .npy file ({exc}){hint}") from exc
    if not isinstance(arr, np.ndarray):
        raise InputError(f"{p}: expected a single array (.npy), got an archive{hint}")
    return arr


def save_npy(path: str | os.PathLike[str], arr: np.ndarray) -> Path:
    """Write one array as .npy atomically (".npy" appended when missing, as np.save does); a
    full disk or an unwritable path is an OutputError and a previous file stays intact. An
    existing character device or FIFO (/dev/null, a pipe) is written into as it is."""
    p = Path(path)
    if p.suffix != ".npy" and not check_output_file(p, stream=True):
        p = p.with_name(p.name + ".npy")
    arr = np.asanyarray(arr)
    return write_file_atomic(
        p, lambda f: np.save(f, arr, allow_pickle=False), arr.nbytes + 128, stream=True
    )


def save_npz(path: str | os.PathLike[str], **arrays: np.ndarray) -> Path:
    """Write arrays as an .npz archive atomically (".npz" appended when missing); an existing
    character device or FIFO is written into."""
    p = Path(path)
    if p.suffix != ".npz" and not check_output_file(p, stream=True):
        p = p.with_name(p.name + ".npz")
    needed = sum(np.asanyarray(a).nbytes for a in arrays.values()) + 256 * len(arrays)
    members: dict[str, Any] = dict(arrays)  # numpy's stubs type **kwds as savez's own options
    return write_file_atomic(p, lambda f: np.savez(f, **members), needed, stream=True)


def check_input(x: np.ndarray, d_model: int, source: str = "input") -> np.ndarray:
    """Validate a [T, d_model] float input (clear errors for shape, dtype and NaN)."""
    arr = np.asarray(x)
    if arr.ndim == 1 and arr.size == d_model:
        arr = arr.reshape(1, d_model)
    if arr.ndim != 2 or arr.shape[1] != d_model:
        raise InputError(
            f"{source}: shape {arr.shape}, expected [T, {d_model}] (T tokens of d_model={d_model})"
        )
    if arr.dtype.kind != "f":
        raise InputError(f"{source}: dtype {arr.dtype}, expected float32")
    if arr.shape[0] == 0:
        raise InputError(f"{source}: no tokens (T = 0)")
    if not np.all(np.isfinite(arr)):
        bad = int(np.count_nonzero(~np.isfinite(arr)))
        raise InputError(f"{source}: {bad} NaN/Inf values; the router cannot rank experts on them")
    return np.ascontiguousarray(arr, dtype=np.float32)
