"""C literals and identifiers for generated code: one place that sanitises names and formats
numbers, so templates stay free of formatting logic."""

from __future__ import annotations

import re

import numpy as np

from ..errors import ConfigError

C_RESERVED = frozenset(
    """auto break case char const continue default do double else enum extern float for goto if
    inline int long register restrict return short signed sizeof static struct switch typedef
    union unsigned void volatile while _Alignas _Alignof _Atomic _Bool _Complex _Generic
    _Imaginary _Noreturn _Static_assert _Thread_local bool true false NULL main asm""".split()
)


def c_ident(name: str) -> str:
    """A valid, non-reserved C identifier derived from name (lower case, [a-z0-9_])."""
    s = re.sub(r"[^0-9a-zA-Z_]", "_", name).lower().strip("_")
    s = re.sub(r"_+", "_", s)
    if not s:
        s = "model"
    if s[0].isdigit():
        s = "m_" + s
    if s in C_RESERVED or s.startswith("colibri"):
        s = "m_" + s
    return s


class NameTable:
    """Allocates identifiers and refuses collisions (two sources mapping to one C name)."""

    def __init__(self) -> None:
        self._by_c: dict[str, str] = {}

    def add(self, source: str, c_name: str) -> str:
        if c_name in C_RESERVED:
            raise ConfigError(f"generated identifier '{c_name}' is a C reserved word")
        prev = self._by_c.get(c_name)
        if prev is not None and prev != source:
            raise ConfigError(
                f"generated identifier '{c_name}' would name both '{prev}' and '{source}'"
            )
        self._by_c[c_name] = source
        return c_name


def c_float(v: float) -> str:
    """A float32 literal that round-trips exactly (%.9g), e.g. 1.0f, -2.5e-07f."""
    f = float(np.float32(v))
    if not np.isfinite(f):
        raise ConfigError(f"cannot emit non-finite weight {f!r}")
    s = f"{f:.9g}"
    if "e" not in s and "." not in s:
        s += ".0"
    return s + "f"
