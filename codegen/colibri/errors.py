"""Errors raised by Colibri. Every message names the bad value, what was expected and the fix."""

from __future__ import annotations

import errno
import os
import sys


class ColibriError(Exception):
    """Base class of every error Colibri reports to a user (the CLI prints the message only)."""


class ModelFormatError(ColibriError):
    """A model file is corrupt, truncated or not in the format it claims to be."""


class ConfigError(ColibriError):
    """A config.json field is missing, has the wrong type or an unsupported value."""


class ShapeError(ColibriError):
    """Tensor dimensions disagree with each other or with the config."""


class InputError(ColibriError):
    """Run-time input (activations, routing arguments) is invalid."""


class BindingValueError(InputError, ValueError):
    """An argument of a Python binding call (colibri.targets.binding) has the right type but a
    bad value: out of range, the wrong shape, NaN / Inf; checked before the C runtime sees it."""


class BindingTypeError(InputError, TypeError):
    """An argument of a Python binding call has the wrong type or dtype."""


class BoardError(ColibriError):
    """Unknown board or invalid board file."""


class ToolchainNotFound(BoardError):
    """The board's cross compiler or emulator is not installed."""


class BuildError(ColibriError):
    """The C build failed."""


class BudgetExceeded(ColibriError):
    """The model does not fit the board's flash or RAM budget."""


class HeapUseError(BuildError):
    """Firmware references malloc/free/calloc/realloc."""


class StackUsageError(BuildError):
    """The firmware's stack cannot be bounded: a dynamic frame, recursion, an unresolved call."""


class QemuError(ColibriError):
    """The guest program faulted, timed out or exited non-zero."""


class OutputExistsError(ColibriError):
    """The output directory exists and is not a previous Colibri output."""


class OutputError(ColibriError):
    """An output cannot be written: its parent is a file, it is not writable, the disk is full."""


def output_error(
    path: str | os.PathLike[str],
    exc: OSError,
    needed: int | None = None,
    about: bool = False,
) -> OutputError:
    """An OSError raised while writing `path` as an OutputError naming the path, the cause and
    the fix (outputs are written to a temporary file first, so the previous one is intact).
    The one full-disk message of every output: the path and `needed` bytes ("about" with
    `about`: an estimate, for outputs whose size is known only once written)."""
    code = exc.errno
    keep = "; the previous output, if any, is unchanged"
    if code in (errno.ENOSPC, errno.EDQUOT):
        need = f" ({'about ' if about else ''}{needed} bytes needed)" if needed else ""
        return OutputError(
            f"{path}: no space left on device{need}; free some space or choose another output "
            f"path{keep}"
        )
    if code in (errno.EACCES, errno.EPERM):
        return OutputError(
            f"{path}: permission denied ({exc.filename or path} is not writable); choose an "
            f"output path in a directory you can write to{keep}"
        )
    if code == errno.EROFS:
        return OutputError(
            f"{path}: read-only file system; choose an output path on a writable one{keep}"
        )
    if code in (errno.ENOTDIR, errno.EEXIST):
        return OutputError(
            f"{path}: a component of the path is a file, not a directory; choose an output path "
            f"whose parent is a directory"
        )
    if code == errno.EISDIR:
        return OutputError(f"{path}: is a directory; pass a file path")
    return OutputError(f"{path}: cannot write: {exc.strerror or exc}{keep}")


def interrupted() -> int:
    """Ctrl-C: one line on stderr, exit status 130 (128 + SIGINT), no traceback (the console
    script's entry, colibri.cli.entry, and colibri.cli.main). Here, in a module the package
    imports first and that imports nothing heavy, so that the guard exists before the command
    line's imports start."""
    try:
        print("colibri: interrupted", file=sys.stderr)
    except (OSError, ValueError, KeyboardInterrupt):
        pass
    return 130
