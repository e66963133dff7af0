"""The runner's file protocol (runtime_c/runner/main.c): token input, output + routing."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import ColibriError, InputError

IN_MAGIC = 0x49424C43  # "CLBI"
OUT_MAGIC = 0x4F424C43  # "CLBO"


@dataclass
class RunOutput:
    output: np.ndarray  # [T, d] float32
    expert_ids: np.ndarray  # [T, k] int32
    gates: np.ndarray  # [T, k] float32


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


def write_input(path: Path, x: np.ndarray) -> None:
    t, d = x.shape
    path.write_bytes(struct.pack("<III", IN_MAGIC, t, d) + np.ascontiguousarray(x, "<f4").tobytes())


def read_output(path: Path) -> RunOutput:
    if not path.is_file():
        raise ColibriError(f"{path}: the runner wrote no output file")
    raw = path.read_bytes()
    if len(raw) < 20:
        raise ColibriError(f"{path}: output file truncated ({len(raw)} bytes)")
    magic, t, d, k, chunk = struct.unpack_from("<5I", raw)
    if magic != OUT_MAGIC:
        raise ColibriError(f"{path}: not a runner output file (magic 0x{magic:08X})")
    out = np.empty((t, d), np.float32)
    ids = np.empty((t, k), np.int32)
    gates = np.empty((t, k), np.float32)
    off = 20
    done = 0
    while done < t:
        n = min(chunk, t - done)
        need = n * (d + 2 * k) * 4
        if off + need > len(raw):
            raise ColibriError(f"{path}: output file truncated after {done} tokens")
        out[done : done + n] = np.frombuffer(raw, "<f4", n * d, off).reshape(n, d)
        off += n * d * 4
        ids[done : done + n] = np.frombuffer(raw, "<i4", n * k, off).reshape(n, k)
        off += n * k * 4
        gates[done : done + n] = np.frombuffer(raw, "<f4", n * k, off).reshape(n, k)
        off += n * k * 4
        done += n
    return RunOutput(out, ids, gates)
