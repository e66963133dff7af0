"""The Colibri container (.clb) written: version 1 (one MoE block, :func:`write_container`)
and the image of either version (:func:`container_image`, :func:`write_container_streamed`;
version 2's tensors and header: :mod:`colibri.emit.lmfile`). The byte format (header structs,
tensor-table entry, dtype codes, alignment) is :mod:`colibri.frontends.container`'s, which
also reads both versions back; files are written atomically
(:func:`colibri.paths.write_file_atomic`).
"""

from __future__ import annotations

import json
import os
import tempfile
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from .. import __version__
from ..frontends.container import (
    ALIGN,
    DTYPE_CODES,
    ENTRY_SIZE,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    NO_EXPERT,
    VERSION,
    align,
    pack_entry,
)
from ..ir.moe import MoELayer
from ..paths import write_file_atomic


def _layer_tensors(layer: MoELayer) -> tuple[list[tuple[str, np.ndarray, int]], list[int]]:
    storage = layer.storage_map()
    tensors: list[tuple[str, np.ndarray, int]] = [("router.weight", layer.router_w, NO_EXPERT)]
    if layer.router_b is not None:
        tensors.append(("router.bias", layer.router_b, NO_EXPERT))
    for i, expert in enumerate(layer.experts):
        if storage[i] != i:
            continue
        for name, arr in expert.tensors():
            tensors.append((f"expert.{i}.{name}", arr, i))
    if storage != list(range(layer.config.n_experts)):
        tensors.append(("expert_sharing_map", np.asarray(storage, dtype="<i4"), NO_EXPERT))
    return tensors, storage


def write_container(layer: MoELayer, path: str | os.PathLike[str]) -> Path:
    """Write `layer` as a Colibri container, atomically (temporary file, then rename), buffer by
    buffer from views of its arrays (no copy of the weights)."""
    image = container_image_of(layer)
    return write_file_atomic(path, image.write, image.size)


def container_bytes(layer: MoELayer) -> bytearray:
    """The Colibri container image of `layer` (in memory: tests and small layers)."""
    return container_image_of(layer).tobytes()


def container_image_of(layer: MoELayer) -> ContainerImage:
    """The Colibri container image of `layer`, planned (views of its arrays)."""
    layer.validate()
    layer.require_no_shared_expert("the Colibri container format")
    c = layer.config
    tensors, _ = _layer_tensors(layer)
    meta = json.dumps(
        {"config": c.to_json(), "producer": f"colibri {__version__}"}, sort_keys=True
    ).encode()

    def header(
        n_tensors: int, table_offset: int, meta_offset: int, data_offset: int, file_size: int
    ) -> bytes:
        return HEADER.pack(
            MAGIC,
            VERSION,
            ALIGN,
            c.n_experts,
            c.top_k,
            c.d_model,
            c.d_ff,
            c.activation_code,
            layer.flags,
            n_tensors,
            len(meta),
            table_offset,
            meta_offset,
            data_offset,
            file_size,
            c.vocab_size or 0,
        )

    blobs = [
        TableEntry(
            name,
            byte_view(np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))),
            DTYPE_CODES[np.dtype(arr.dtype).newbyteorder("<")],
            tuple(arr.shape),
            expert,
        )
        for name, arr, expert in tensors
    ]
    return container_image(blobs, meta, header)


#: A blob's bytes: bytes, or a view of an array's (:func:`byte_view`).
Buffer = bytes | bytearray | memoryview


def byte_view(arr: np.ndarray) -> memoryview:
    """The bytes of an array in C order as a flat view (no copy when it is C-contiguous)."""
    return np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data


def _nbytes(data: Buffer) -> int:
    return memoryview(data).nbytes


@dataclass(frozen=True)
class TableEntry:
    """One tensor of a container image: its name, bytes (any buffer: a view is not copied),
    dtype code, logical shape (up to 4 dims) and expert index (NO_EXPERT for the others)."""

    name: str
    data: Buffer
    dtype: int
    shape: tuple[int, ...]
    expert: int


#: header(n_tensors, table_offset, meta_offset, data_offset, file_size) -> the 128-byte header.
HeaderFn = Callable[[int, int, int, int, int], bytes]


@dataclass
class ContainerImage:
    """A container image (either version) planned but not joined: the header, tensor table and
    metadata (``head``, padded to the data offset) and every blob at its offset. :meth:`write`
    streams it buffer by buffer; :meth:`tobytes` joins it (tests, small files)."""

    head: bytes
    blobs: list[tuple[int, Buffer]]
    size: int

    def write(self, f: BinaryIO) -> None:
        f.write(self.head)
        pos = len(self.head)
        for off, data in self.blobs:
            if off > pos:
                f.write(bytes(off - pos))
            f.write(data)
            pos = off + _nbytes(data)

    def tobytes(self) -> bytearray:
        buf = bytearray(self.size)
        buf[: len(self.head)] = self.head
        for off, data in self.blobs:
            buf[off : off + _nbytes(data)] = memoryview(data).cast("B")
        return buf


def _entry(t: TableEntry, offset: int, nbytes: int, crc: int) -> bytes:
    return pack_entry(t.name, t.dtype, t.shape, offset, nbytes, t.expert, crc)


def container_image(tensors: list[TableEntry], meta: bytes, header: HeaderFn) -> ContainerImage:
    """A container image (either version): the 128-byte header that `header(n_tensors,
    table_offset, meta_offset, data_offset, file_size)` packs, the tensor table with each
    blob's CRC-32, the metadata, then every blob at a multiple of ALIGN in table order."""
    table_offset = HEADER_SIZE
    meta_offset = table_offset + ENTRY_SIZE * len(tensors)
    data_offset = align(meta_offset + len(meta))
    entries: list[bytes] = []
    blobs: list[tuple[int, Buffer]] = []
    cursor = data_offset
    for t in tensors:
        nbytes = _nbytes(t.data)
        entries.append(_entry(t, cursor, nbytes, zlib.crc32(t.data)))
        blobs.append((cursor, t.data))
        cursor = align(cursor + nbytes)
    file_size = blobs[-1][0] + _nbytes(blobs[-1][1])
    head = header(len(tensors), table_offset, meta_offset, data_offset, file_size)
    head += b"".join(entries) + meta
    head += bytes(data_offset - len(head))
    return ContainerImage(head, blobs, file_size)


def write_container_streamed(
    f: BinaryIO,
    tensors: Iterable[TableEntry],
    meta: bytes,
    header: HeaderFn,
    spool_dir: str | os.PathLike[str] | None = None,
) -> int:
    """Write a container image whose tensors are produced one by one (`tensors`, any
    iterable: each blob may be dropped once it is yielded) to the seekable file `f`, without
    holding them: the blobs go to a spool file in f's directory (their CRC-32 taken as they
    pass), then the header, table and metadata to `f`, then the spool is copied in by the
    kernel. The bytes are those of :func:`container_image` on the same tensors (`spool_dir`:
    where the spool goes, best the output's directory). Returns the file size."""
    records: list[tuple[TableEntry, int, int, int]] = []
    with tempfile.TemporaryFile(dir=spool_dir) as spool:
        cursor = 0
        for t in tensors:
            nbytes = _nbytes(t.data)
            pad = -cursor % ALIGN
            if pad:
                spool.write(bytes(pad))
                cursor += pad
            crc = zlib.crc32(t.data)
            records.append(
                (TableEntry(t.name, b"", t.dtype, t.shape, t.expert), cursor, nbytes, crc)
            )
            spool.write(t.data)
            cursor += nbytes
        spool.flush()
        meta_offset = HEADER_SIZE + ENTRY_SIZE * len(records)
        data_offset = align(meta_offset + len(meta))
        file_size = data_offset + cursor
        head = header(len(records), HEADER_SIZE, meta_offset, data_offset, file_size)
        head += b"".join(_entry(t, data_offset + off, n, crc) for t, off, n, crc in records)
        head += meta
        head += bytes(data_offset - len(head))
        f.write(head)
        f.flush()
        _copy_file(spool, f, cursor)
    return file_size


def _copy_file(src: BinaryIO, dst: BinaryIO, nbytes: int) -> None:
    """Append the first `nbytes` of `src` to `dst` (the kernel copies where it can)."""
    src.seek(0)
    out_fd, in_fd = dst.fileno(), src.fileno()
    done = 0
    try:
        while done < nbytes:
            n = os.copy_file_range(in_fd, out_fd, nbytes - done)
            if n == 0:
                break
            done += n
    except (AttributeError, OSError):  # not here: copy what is left (a full disk recurs below)
        pass
    if done < nbytes:  # no copy_file_range (another OS, filesystem): in chunks
        src.seek(done)
        while done < nbytes:
            chunk = src.read(min(1 << 24, nbytes - done))
            if not chunk:
                raise OSError(f"spool file ended after {done} of {nbytes} bytes")
            dst.write(chunk)
            done += len(chunk)
    dst.flush()
