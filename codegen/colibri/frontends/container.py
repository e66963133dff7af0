"""The Colibri container (.clb): read and write. Byte layout: docs/format.md.

Also the atomic file writer every output file goes through (:func:`write_file_atomic`: normal
modes, a full disk or an unwritable path reported as an OutputError, the old file intact)."""

from __future__ import annotations

import functools
import io
import json
import os
import stat
import struct
import tempfile
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from .. import __version__
from ..errors import ModelFormatError, OutputError, ShapeError, output_error
from ..ir.moe import Expert, MoEConfig, MoELayer, validate_sharing_map

MAGIC = b"CLBRMOE\0"
VERSION = 1
ALIGN = 64
HEADER_SIZE = 128
ENTRY_SIZE = 96
NAME_SIZE = 48
NO_EXPERT = 0xFFFFFFFF

# header: magic, version, alignment, E, k, d, f, activation, flags, n_tensors, meta_bytes,
#         table_offset, meta_offset, data_offset, file_size, vocab_size, reserved
_HEADER = struct.Struct("<8s10I4QI44x")
# entry: name, dtype, ndim, shape[4], offset, nbytes, expert, crc32
_ENTRY = struct.Struct("<48sII4IQQII")
assert _HEADER.size == HEADER_SIZE and _ENTRY.size == ENTRY_SIZE
#: The tensor-table entry, shared by version 2 (whole models, colibri.emit.lmfile).
ENTRY = _ENTRY

DTYPES: dict[int, np.dtype] = {
    0: np.dtype("<f4"),
    1: np.dtype("<f2"),
    2: np.dtype("i1"),
    4: np.dtype("<i4"),
}
DTYPE_CODES = {v: k for k, v in DTYPES.items()}


@dataclass(frozen=True)
class TensorEntry:
    """One row of the tensor table."""

    name: str
    dtype: int
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    expert: int
    crc32: int


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


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
        return _HEADER.pack(
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


def _entry_bytes(t: TableEntry, offset: int, nbytes: int, crc: int) -> bytes:
    name = t.name.encode()
    if len(name) >= NAME_SIZE:
        raise ShapeError(f"tensor name {t.name!r} is longer than {NAME_SIZE - 1} bytes")
    if len(t.shape) > 4:
        raise ShapeError(f"tensor {t.name!r} has {len(t.shape)} dimensions; at most 4")
    shape = list(t.shape) + [0] * (4 - len(t.shape))
    return _ENTRY.pack(
        name.ljust(NAME_SIZE, b"\0"), t.dtype, len(t.shape), *shape, offset, nbytes, t.expert, crc
    )


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


def container_image(tensors: list[TableEntry], meta: bytes, header: HeaderFn) -> ContainerImage:
    """A container image (either version): the 128-byte header that `header(n_tensors,
    table_offset, meta_offset, data_offset, file_size)` packs, the tensor table with each
    blob's CRC-32, the metadata, then every blob at a multiple of ALIGN in table order."""
    table_offset = HEADER_SIZE
    meta_offset = table_offset + ENTRY_SIZE * len(tensors)
    data_offset = _align(meta_offset + len(meta))
    entries: list[bytes] = []
    blobs: list[tuple[int, Buffer]] = []
    cursor = data_offset
    for t in tensors:
        nbytes = _nbytes(t.data)
        entries.append(_entry_bytes(t, cursor, nbytes, zlib.crc32(t.data)))
        blobs.append((cursor, t.data))
        cursor = _align(cursor + nbytes)
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
        data_offset = _align(meta_offset + len(meta))
        file_size = data_offset + cursor
        head = header(len(records), HEADER_SIZE, meta_offset, data_offset, file_size)
        head += b"".join(_entry_bytes(t, data_offset + off, n, crc) for t, off, n, crc in records)
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


# -- atomic output files (every file Colibri writes: .clb, .npy, the seed layout) -------------


@functools.cache
def umask() -> int:
    """The process umask, read once: from /proc/self/status (no change to the process), else
    by setting and restoring it."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def file_mode() -> int:
    """The mode of a new output file: 0666 & ~umask, as open() would give it."""
    return 0o666 & ~umask()


def dir_mode() -> int:
    """The mode of a new output directory: 0777 & ~umask, as mkdir would give it."""
    return 0o777 & ~umask()


def check_output_parent(path: str | os.PathLike[str], create: bool = True) -> Path:
    """Create (with `create`) the parent directories of an output `path`, or raise OutputError
    when a component of it is a file or cannot be created; returns the absolute path."""
    path = Path(path).resolve()
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputError(
            f"{path}: {ancestor} is a file, not a directory; choose an output path whose "
            f"parent is a directory"
        )
    if not create:
        return path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise output_error(path, exc) from None
    return path


#: File types an output must not replace, as named in the error.
_SPECIAL_KINDS = {
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
}
#: ... and those a streamed output (an array of `run` / `reference`) is written into.
_STREAMABLE = (stat.S_IFCHR, stat.S_IFIFO)


def _stat_kind(path: str | os.PathLike[str], follow: bool) -> int | None:
    """The file type bits (stat.S_IFMT) of `path`, following a final symlink with `follow`;
    None when there is nothing there (or it cannot be read: the write reports that)."""
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except (OSError, ValueError):
        return None
    return stat.S_IFMT(st.st_mode)


def check_output_file(path: str | os.PathLike[str], stream: bool = False) -> bool:
    """Refuse (OutputError) an output `path` that an atomic rename must not replace: a device
    node, FIFO or socket, or a symbolic link to somewhere outside the link's own directory
    (a link inside it is followed: its target is replaced). With `stream` (the arrays `run` and
    `reference` write), an existing character device or FIFO (also through a link: /dev/null,
    /dev/stdout, a pipe) is allowed: returns True, and the output is to be written into it.
    Returns False for a regular file, a directory (callers decide) or nothing there."""
    p = Path(path)
    here = _stat_kind(p, follow=False)
    if here is None:
        return False
    kind = _stat_kind(p, follow=True)
    if stream and kind in _STREAMABLE:
        return True
    if here == stat.S_IFLNK:
        target = p.resolve()
        home = p.absolute().parent.resolve()
        if not target.is_relative_to(home):
            raise OutputError(
                f"{path}: is a symbolic link to {target}, outside the output's directory {home}, "
                f"not a regular file the output may replace; remove the link or pass {target} "
                f"itself"
            )
    if kind in _SPECIAL_KINDS:
        into = (
            " (only run / reference arrays are written into a device or FIFO)" if not stream else ""
        )
        raise OutputError(
            f"{path}: is {_SPECIAL_KINDS[kind]}, not a regular file; an output is written to a "
            f"temporary file renamed over the path, which would replace it{into}: pass the path "
            f"of a regular file or a new one"
        )
    return False


#: Bytes an output needs: a number, or a function estimating it (called only for a full
#: disk's message: outputs written piece by piece whose size is known only at the end).
Needed = int | Callable[[], int] | None


def _needed_bytes(files_bytes: int, needed: Needed) -> tuple[int | None, bool]:
    """(bytes, whether an estimate) of a full disk's message."""
    about = callable(needed)
    try:
        extra = needed() if callable(needed) else (needed or 0)
    except Exception:  # an estimate that fails leaves the number out, not the message
        return None, False
    return (files_bytes + extra) or None, about


def write_file_atomic(
    path: str | os.PathLike[str],
    data: bytes | bytearray | Callable[[BinaryIO], None],
    needed: Needed = None,
    stream: bool = False,
) -> Path:
    """Write `data` (bytes, or a function writing to a binary file, `needed` bytes if known) to
    `path` atomically: a temporary sibling with the normal mode (0666 & ~umask), flushed to
    disk, then renamed over `path`. Any failure (a full disk, no permission, the parent a file)
    is an OutputError naming the path and leaves a previous `path` intact; so is a `path` that
    is not a regular file (:func:`check_output_file`), except that with `stream` an existing
    character device or FIFO is written into. Returns `path`."""
    return write_files_atomic({path: data}, needed, stream)[0]


def _write_into(
    target: Path, data: bytes | bytearray | Callable[[BinaryIO], None], needed: Needed
) -> None:
    """Write `data` into an existing character device or FIFO (no temporary, no rename; a
    writer function writes to memory first: np.save asks a file for its position)."""
    if isinstance(data, (bytes, bytearray)):
        blob: bytes | bytearray | memoryview = data
    else:
        buf = io.BytesIO()
        data(buf)
        blob = buf.getbuffer()
    try:
        with open(target, "wb") as f:
            f.write(blob)
    except OSError as exc:
        raise output_error(target, exc, *_needed_bytes(len(blob), needed)) from None


def write_files_atomic(
    files: Mapping[str | os.PathLike[str], bytes | bytearray | Callable[[BinaryIO], None]],
    needed: Needed = None,
    stream: bool = False,
) -> list[Path]:
    """:func:`write_file_atomic` for several files that belong together (a model and its
    config): every one is written to a temporary first and renamed into place only when all
    are written, so a failure leaves all previous files as they were."""
    known = sum(len(d) for d in files.values() if isinstance(d, (bytes, bytearray)))
    temps: list[tuple[str, Path, Path]] = []  # temporary, absolute destination, as given
    into = [Path(p) for p in files if check_output_file(p, stream)]  # all checked first
    try:
        for path, data in files.items():
            target = Path(path)
            if target in into:
                _write_into(target, data, needed)
                continue
            full = check_output_parent(target)
            if full.is_dir():
                raise OutputError(
                    f"{target}: is a directory; pass a file path (e.g. {target / 'model.clb'})"
                )
            try:
                fd, tmp = tempfile.mkstemp(dir=full.parent, prefix=f".{full.name}.", suffix=".tmp")
            except OSError as exc:
                raise output_error(target, exc, *_needed_bytes(known, needed)) from None
            temps.append((tmp, full, target))
            try:
                with os.fdopen(fd, "wb") as f:
                    os.fchmod(f.fileno(), file_mode())
                    if isinstance(data, (bytes, bytearray)):
                        f.write(data)
                    else:
                        data(f)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as exc:
                raise output_error(target, exc, *_needed_bytes(known, needed)) from None
        for tmp, full, target in temps:
            try:
                os.replace(tmp, full)
            except OSError as exc:
                raise output_error(target, exc, *_needed_bytes(known, needed)) from None
    except BaseException:
        for tmp, _, _ in temps:
            Path(tmp).unlink(missing_ok=True)
        raise
    return [Path(p) for p in files]


def read_table(data: bytes, source: str) -> tuple[tuple[int, ...], list[TensorEntry], dict]:
    """Parse and check the header, tensor table and metadata of a container image."""
    if len(data) < HEADER_SIZE:
        raise ModelFormatError(
            f"{source}: truncated Colibri container: {len(data)} bytes, the header alone is "
            f"{HEADER_SIZE}"
        )
    h = _HEADER.unpack_from(data, 0)
    if h[0] != MAGIC:
        raise ModelFormatError(f"{source}: bad magic {h[0]!r}, expected {MAGIC!r}")
    version, align, e, k, d, f, act, flags, n_t, meta_bytes = h[1:11]
    table_off, meta_off, data_off, file_size, _vocab = h[11:16]
    if version == 2:
        raise ModelFormatError(
            f"{source}: a whole-model container (version 2), not a single MoE block: run it "
            f"with `colibri run {source} --prompt-ids 1,5,9` (or colibri.targets.binding.LM)"
        )
    if version != VERSION:
        raise ModelFormatError(
            f"{source}: container version {version} is not supported (this Colibri reads "
            f"version {VERSION}); re-convert the model with `colibri convert`"
        )
    if file_size > len(data):
        raise ModelFormatError(
            f"{source}: truncated: header says {file_size} bytes, file has {len(data)}"
        )
    if file_size != len(data):
        raise ModelFormatError(
            f"{source}: file is {len(data)} bytes but its header says {file_size}"
        )
    if align != ALIGN or table_off != HEADER_SIZE or meta_off != table_off + n_t * ENTRY_SIZE:
        raise ModelFormatError(f"{source}: inconsistent container header (table/alignment)")
    if meta_off + meta_bytes > data_off or data_off % ALIGN or data_off > len(data):
        raise ModelFormatError(f"{source}: inconsistent container header (metadata/data offset)")
    entries = []
    for i in range(n_t):
        name_b, dtype, ndim, s0, s1, s2, s3, off, nb, expert, crc = _ENTRY.unpack_from(
            data, table_off + i * ENTRY_SIZE
        )
        name = name_b.rstrip(b"\0").decode("utf-8", "replace")
        if dtype not in DTYPES or not 1 <= ndim <= 4:
            raise ModelFormatError(f"{source}: tensor '{name}' has unknown dtype {dtype}/ndim")
        shape = (s0, s1, s2, s3)[:ndim]
        if off % ALIGN or off < data_off or off + nb > len(data):
            raise ModelFormatError(
                f"{source}: tensor '{name}' at offset {off} (+{nb} bytes) lies outside the "
                f"file or is misaligned; the file is truncated or corrupt"
            )
        if int(np.prod(shape)) * DTYPES[dtype].itemsize != nb:
            raise ModelFormatError(f"{source}: tensor '{name}' size does not match its shape")
        if zlib.crc32(data[off : off + nb]) != crc:
            raise ModelFormatError(f"{source}: tensor '{name}' fails its CRC-32 check (corrupt)")
        entries.append(TensorEntry(name, dtype, shape, off, nb, expert, crc))
    try:
        meta = json.loads(data[meta_off : meta_off + meta_bytes].decode())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ModelFormatError(f"{source}: metadata is not valid JSON ({exc})") from exc
    if not isinstance(meta, dict):
        raise ModelFormatError(f"{source}: metadata is not a JSON object; the file is corrupt")
    return (e, k, d, f, act, flags), entries, meta


def read_container(path: str | os.PathLike[str]) -> MoELayer:
    """Read a container into the IR (tensors copied out of the file)."""
    from ..ir.moe import ACTIVATIONS, FLAG_GATED, FLAG_NORM_TOPK, MAX_TOP_K

    path = Path(path)
    data = path.read_bytes()
    source = str(path)
    (e, k, d, f, act, flags), entries, meta = read_table(data, source)
    if act >= len(ACTIVATIONS):
        raise ModelFormatError(f"{source}: unknown activation code {act}")
    if min(e, d, f) < 1 or not 1 <= k <= min(e, MAX_TOP_K):
        raise ModelFormatError(
            f"{source}: header says n_experts={e}, k={k}, d_model={d}, d_ff={f}; each must be "
            f">= 1 and k <= n_experts (at most {MAX_TOP_K}): the file is corrupt"
        )
    meta_config = meta.get("config")
    vocab = meta_config.get("vocab_size") if isinstance(meta_config, dict) else None
    if vocab is not None and (isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1):
        raise ModelFormatError(
            f"{source}: metadata config.vocab_size {vocab!r} is not an integer >= 1; the file "
            f"is corrupt"
        )
    config = MoEConfig(
        n_experts=e,
        top_k=k,
        d_model=d,
        d_ff=f,
        activation=ACTIVATIONS[act],
        gated=bool(flags & FLAG_GATED),
        norm_topk_prob=bool(flags & FLAG_NORM_TOPK),
        vocab_size=vocab,
    )
    by_name = {t.name: t for t in entries}

    def get(name: str, required: bool = True) -> np.ndarray | None:
        t = by_name.get(name)
        if t is None:
            if required:
                raise ModelFormatError(f"{source}: tensor '{name}' is missing")
            return None
        arr = np.frombuffer(
            data, dtype=DTYPES[t.dtype], count=int(np.prod(t.shape)), offset=t.offset
        )
        return arr.reshape(t.shape).copy()

    share = get("expert_sharing_map", required=False)
    if share is None and e > len(entries):  # every expert needs its own tensors
        raise ModelFormatError(
            f"{source}: header says {e} experts but the file has {len(entries)} tensors and no "
            f"expert_sharing_map: the file is corrupt"
        )
    storage = [int(v) for v in share] if share is not None else list(range(e))
    validate_sharing_map(storage, e, source)
    experts: dict[int, Expert] = {}
    for i in sorted(set(storage)):
        w1, w2 = get(f"expert.{i}.w1"), get(f"expert.{i}.w2")
        assert w1 is not None and w2 is not None
        experts[i] = Expert(
            w1=w1,
            w2=w2,
            b1=get(f"expert.{i}.b1", required=False),
            b2=get(f"expert.{i}.b2", required=False),
            w3=get(f"expert.{i}.w3", required=False),
        )
    router_w = get("router.weight")
    assert router_w is not None
    layer = MoELayer(
        config=config,
        router_w=router_w,
        router_b=get("router.bias", required=False),
        experts=[experts[storage[i]] for i in range(e)],
        sharing_map=storage if share is not None else None,
        source=source,
        metadata=meta,
    )
    try:
        return layer.validate()
    except ShapeError as exc:
        raise ModelFormatError(str(exc)) from exc
