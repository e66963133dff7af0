"""The runner's file protocol (runtime_c/runner/main.c): token input, output + routing."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ColibriError

IN_MAGIC = 0x49424C43  # "CLBI"
OUT_MAGIC = 0x4F424C43  # "CLBO"


@dataclass
class RunOutput:
    output: np.ndarray  # [T, d] float32
    expert_ids: np.ndarray  # [T, k] int32
    gates: np.ndarray  # [T, k] float32


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
