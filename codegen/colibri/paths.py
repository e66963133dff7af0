"""The paths Colibri reads and writes: where its data files (boards, templates, C runtime,
SConstruct) live, and how every output file is written.

From a source checkout the data files are beside the package directory (the repository root);
an installed wheel ships them under ``colibri/data``.

Every output (.clb, .npy, the seed layout, generated directories, reports) goes through
:func:`write_file_atomic` / :func:`write_files_atomic` (normal modes, a full disk or an
unwritable path reported as an OutputError, the old file intact) after
:func:`check_output_file` / :func:`check_output_parent`; this is the one place that does it.
"""

from __future__ import annotations

import functools
import io
import os
import stat
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import BinaryIO

from .errors import OutputError, output_error

_MARKERS = ("boards", "templates", "runtime_c", "SConstruct")


def _is_resource_root(path: Path) -> bool:
    return all((path / marker).exists() for marker in _MARKERS)


def resource_dir() -> Path:
    """Directory holding ``boards/``, ``templates/``, ``runtime_c/`` and ``SConstruct``.

    ``COLIBRI_RESOURCE_DIR`` overrides the search (useful for out-of-tree board collections).
    """
    override = os.environ.get("COLIBRI_RESOURCE_DIR")
    if override:
        return Path(override).resolve()
    package_dir = Path(__file__).resolve().parent
    source_root = package_dir.parent.parent  # codegen/colibri -> the repository root
    if _is_resource_root(source_root):
        return source_root
    return package_dir / "data"


def tools_dir() -> Path:
    """Directory of host tools built by ``scripts/setup.sh`` (icount plugin, libgcc helpers).

    ``COLIBRI_TOOLS_DIR`` overrides the default ``<resource_dir>/build/tools``.
    """
    override = os.environ.get("COLIBRI_TOOLS_DIR")
    if override:
        return Path(override).resolve()
    return resource_dir() / "build" / "tools"


#: The ISA directory of the host board (boards/host.toml): native builds of the runtime add
#: ``runtime_c/arch/x86_64``, whose files compile to nothing on other machines.
HOST_ISA = "x86_64"


def runtime_sources(isa: str = HOST_ISA, root: Path | None = None) -> list[Path]:
    """The C files of libcolibri for a board ISA, chosen as the SConstruct chooses them.

    ``runtime_c/src/*.c`` (the portable kernels and the runtime), with each
    ``runtime_c/arch/<isa>/X.c`` replacing ``src/X.c`` of the same name or added beside them;
    ``root`` defaults to :func:`resource_dir`. Sorted by file name.
    """
    rt = (root if root is not None else resource_dir()) / "runtime_c"
    files = {p.name: p for p in (rt / "src").glob("*.c")}
    if isa:
        files.update({p.name: p for p in (rt / "arch" / isa).glob("*.c")})
    return [files[name] for name in sorted(files)]


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
