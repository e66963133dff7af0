"""Command-line values checked when they are parsed: every numeric option has a range.

Each numeric option of every command takes one of the argparse ``type`` functions below, so a
bad value (``--max-tokens 0``, ``--top-p 2``, ``--timeout nan``) is refused before anything is
read or written, with one line naming the option, the value and the range.
:class:`ColibriArgumentParser` prints argparse's own errors (unknown option, missing argument)
as that same one line, ``colibri: error: ...``, with exit status 2; :func:`interrupted` is
Ctrl-C's one line.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from ..boards import board_names, unknown_board

#: Ranges of the numeric options (inclusive). README "Using it" documents them.
MAX_TOKENS = 1 << 20  # generate --max-tokens: tokens per chunk
MAX_RAM_BUDGET = (1 << 32) - 1  # generate --ram-budget: a 32-bit address space
MAX_LAYER = (1 << 16) - 1  # --layer: checked against num_hidden_layers when the model is read
MAX_TOY_EXPERTS = 1024
MAX_TOY_DIM = 1 << 16  # make-toy --hidden / --ff
MAX_TOY_BYTES = 1 << 30  # make-toy: the weights of all experts together
MAX_SEED = (1 << 64) - 1
MAX_CHECK_TOKENS = 1 << 16  # export --check-tokens
MAX_TIMEOUT = 7 * 24 * 3600.0  # run --timeout: seconds
MAX_TEMPERATURE = 1e4
MAX_SAMPLING_TOP_K = 1 << 24  # run --top-k (also checked against the vocabulary)


class ColibriArgumentParser(argparse.ArgumentParser):
    """argparse with the CLI's one-line errors: ``colibri: error: <what>`` and exit status 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"colibri: error: {message} (see `{self.prog} --help`)\n")
        sys.exit(2)


def _in_range(value: int, lo: int, hi: int, what: str, shown: str | None = None) -> int:
    """value when lo <= value <= hi, else the one-line error (naming `shown`, or the value)."""
    if not lo <= value <= hi:
        said = value if shown is None else shown
        raise argparse.ArgumentTypeError(f"{said} is out of range; allowed: {lo}..{hi}{what}")
    return value


def int_range(lo: int, hi: int, unit: str = "") -> Callable[[str], int]:
    """An argparse type: a decimal integer in [lo, hi]; `unit` is said in the message."""
    what = f" {unit}" if unit else ""

    def parse(text: str) -> int:
        try:
            value = int(text.strip(), 10)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not an integer; allowed: {lo}..{hi}{what}"
            ) from None
        return _in_range(value, lo, hi, what)

    parse.__name__ = "integer"
    return parse


#: Suffixes of byte_size (binary multiples).
_BYTE_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def byte_size(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse type: a byte count in [lo, hi], decimal with an optional K / M / G / T
    suffix (binary: 64M = 64 * 2**20; KiB, MB and the like read the same)."""

    def parse(text: str) -> int:
        t = text.strip().upper().removesuffix("B").removesuffix("I")
        num, suffix = (t[:-1], t[-1]) if t and t[-1] in "KMGT" else (t, "")
        try:
            value = int(num, 10) * _BYTE_SUFFIXES[suffix]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a byte count such as 65536, 512K or 64M"
            ) from None
        return _in_range(value, lo, hi, " bytes", text)

    parse.__name__ = "byte count"
    return parse


def pin_count(text: str) -> int | str:
    """An argparse type for `run --pin`: "auto", or a slot count 0..MAX_PIN (0: no pinning)."""
    from ..targets.binding import MAX_PIN  # colibri_lm_config_t.pinned_slots is an int32

    if text.strip().lower() == "auto":
        return "auto"
    try:
        value = int(text.strip(), 10)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither 'auto' nor a slot count; allowed: auto, 0..{MAX_PIN}"
        ) from None
    return _in_range(value, 0, MAX_PIN, " slots")


def float_range(
    lo: float, hi: float, unit: str = "", lo_open: bool = False
) -> Callable[[str], float]:
    """An argparse type: a finite number in [lo, hi] (or (lo, hi] when lo_open)."""
    what = f" {unit}" if unit else ""
    allowed = f"{'>' if lo_open else '>='} {lo:g} and <= {hi:g}{what}"

    def parse(text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a number; allowed: {allowed}"
            ) from None
        low_ok = value > lo if lo_open else value >= lo
        if not math.isfinite(value) or not low_ok or value > hi:
            raise argparse.ArgumentTypeError(f"{text} is out of range; allowed: {allowed}")
        return value

    parse.__name__ = "number"
    return parse


def model_name(text: str) -> str:
    """An argparse type: generate's --name, whose C name (lower case, [a-z0-9_]) is at most
    MAX_NAME characters (the one-line error names the limit)."""
    from ..emit.cformat import model_ident
    from ..errors import ConfigError

    try:
        model_ident(text, "--name")
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


model_name.__name__ = "name"


def board_name(text: str) -> str:
    """An argparse type: the name of a board file (boards/<name>.toml); an unknown name is the
    one-line error listing the boards."""
    name = text.strip()
    if name not in board_names():
        raise argparse.ArgumentTypeError(unknown_board(text))
    return name


board_name.__name__ = "board"


def board_help(default: str | None = None, what: str = "board") -> str:
    """The help text of a --board option: the boards there are (boards/*.toml) and the
    default."""
    said = f" (default {default})" if default else ""
    return f"{what}{said}: {', '.join(board_names())}; `colibri boards` lists them"


def add_board_argument(s: argparse.ArgumentParser, default: str | None, **kw: Any) -> None:
    """--board with its type check and the list of boards in its help (every command's)."""
    help_text = kw.pop("help", None) or board_help(default)
    s.add_argument("--board", type=board_name, default=default, help=help_text, **kw)
