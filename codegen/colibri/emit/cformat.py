"""C text of generated code: identifiers and literals (:func:`c_ident`, :func:`c_float`,
:class:`NameTable`: one place that sanitises names and formats numbers, so templates stay free
of formatting logic), and the layout of generated C lines whose length depends on the model
and its name (up to MAX_NAME characters): function signatures and calls, #defines,
assignments, declarations, comments and trailing comments, written the way clang-format
writes them with the repository's ``.clang-format`` (LLVM based, 100 columns, 4-space
indent), so that generated sources are unchanged by ``clang-format``
(tests/emit/test_generated_format.py) without running it: the output never depends on a
tool's version.

Templates own the fixed text; these helpers (Jinja globals, :func:`register`) own the lines
whose breaks depend on names and sizes.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..errors import ConfigError

#: ColumnLimit of the repository's .clang-format.
COLUMN_LIMIT = 100
#: ContinuationIndentWidth (LLVM): a break after an opening parenthesis.
CONTINUATION = 4
#: Costs that choose between the layouts of a parameter list as clang-format 14 does (fitted to
#: its choices, not its internal penalties; on random signatures with long return types and
#: names about 1 in 50 still differs, none in the generated family): a break between
#: parameters, the return type on its own line, an initialisation's "=", a break after the
#: opening parenthesis of a declaration / of a call.
_BREAK = 30
_RETURN_TYPE = 60
_ASSIGN = 25
_AFTER_PAREN = {"decl": 100, "call": 19}


def split_args(args: str | list[str]) -> list[str]:
    """The arguments of a comma-separated list (commas inside parentheses, brackets or braces
    stay in their argument)."""
    if isinstance(args, list):
        return [a.strip() for a in args]
    out: list[str] = []
    depth = 0
    cur = ""
    for ch in args:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def _pack(first: str, col: int, pieces: list[str]) -> list[str]:
    """pieces after `first`, as many on a line as fit, continuation lines starting at `col`."""
    lines: list[str] = []
    cur = first
    fresh = True
    for p in pieces:
        if fresh or len(cur) + 1 + len(p) > COLUMN_LIMIT:
            if not fresh:
                lines.append(cur)
                cur = " " * col
            summed = None
            if len(cur) + len(p) > COLUMN_LIMIT and " + " in p:  # a sum: broken after a "+"
                summed = _pack_sum(cur, p, "") if "(" in p.split(" + ")[0] else None
                if summed is None:  # after the "+", else after the "*" of a + b * c
                    term, rest = p.split(" + ", 1)
                    summed = [cur + term + " +", " " * (col + CONTINUATION) + rest]
                    if not _fits(summed) and " * " in rest:
                        left, right = rest.rsplit(" * ", 1)
                        at = len(cur) + len(term) + 3 + CONTINUATION
                        summed = [f"{cur}{term} + {left} *", " " * at + right]
            if summed:
                lines += summed[:-1]
                cur = summed[-1]
            else:
                cur += p
        else:
            cur += " " + p
        fresh = False
    lines.append(cur)
    return lines


def _fits(lines: list[str]) -> bool:
    return all(len(line) <= COLUMN_LIMIT for line in lines)


def c_call(
    head: str, args: str | list[str], tail: str = "", indent: str = "", kind: str = "call"
) -> str:
    """``head(args)tail`` at `indent`: on one line if it fits, else the arguments packed and
    aligned after the parenthesis, or (kind "decl", a function definition's head) the return
    type on its own line, or a break after the parenthesis — whichever clang-format picks."""
    items = split_args(args)
    pieces = [a + "," for a in items[:-1]] + [(items[-1] if items else "") + ")" + tail]
    if not items:
        pieces = [")" + tail]
    one = f"{indent}{head}({' '.join(pieces)}"
    if len(one) <= COLUMN_LIMIT:
        return one
    options: list[tuple[int, int, list[str]]] = []
    aligned = _pack(f"{indent}{head}(", len(indent) + len(head) + 1, pieces)
    if _fits(aligned):
        options.append((_BREAK * (len(aligned) - 1), 0, aligned))
    if kind == "decl" and " " in head:
        rtype, name = head.rsplit(" ", 1)
        own = [indent + rtype] + _pack(f"{indent}{name}(", len(indent) + len(name) + 1, pieces)
        if _fits(own):
            options.append((_RETURN_TYPE + _BREAK * (len(own) - 2), 1, own))
    if " = " in head:  # an initialisation: the call may start on the next line
        lhs, rhs = head.split(" = ", 1)
        ind2 = indent + " " * CONTINUATION
        own = [f"{indent}{lhs} ="] + _pack(f"{ind2}{rhs}(", len(ind2) + len(rhs) + 1, pieces)
        if _fits(own):
            options.append((_ASSIGN + _BREAK * (len(own) - 2), 1, own))
    broken = [f"{indent}{head}("] + _pack(
        " " * (len(indent) + CONTINUATION), len(indent) + CONTINUATION, pieces
    )
    paren = _AFTER_PAREN[kind] + (
        _BREAK * (len(broken) - 2) if kind == "decl" else _BREAK * (len(broken) - 1)
    )
    if _fits(broken):
        options.append((paren, 2, broken))
    if not options and kind == "decl" and " " in head:  # return type and name on their own lines
        rtype, name = head.rsplit(" ", 1)
        options.append((0, 3, [indent + rtype, f"{indent}{name}("] + broken[1:]))
    if not options:
        options.append((paren, 2, broken))
    return "\n".join(min(options, key=lambda o: (o[0], o[1]))[2])


def c_braced(items: str | list[str], tail: str = "", indent: str = "") -> str:
    """A braced initialiser ``{a, b, c}tail`` after `indent` (Cpp11BracedListStyle: no spaces
    inside the braces); when it does not fit, the items packed and aligned after the brace, or
    one a line when one of them is a braced list itself."""
    parts = split_args(items)
    one = f"{indent}{{{', '.join(parts)}}}{tail}"
    if len(one) <= COLUMN_LIMIT:
        return one
    pad = " " * (len(indent) + 1)
    pieces = [p + "," for p in parts[:-1]] + [parts[-1] + "}" + tail]
    if not any("{" in p for p in parts):
        return "\n".join(_pack(f"{indent}{{", len(pad), pieces))
    return "\n".join([f"{indent}{{{pieces[0]}"] + [pad + p for p in pieces[1:]])


def c_assert(lhs: str | list[str], op: str, rhs: str, message: str) -> str:
    """``_Static_assert(lhs op rhs, "message");`` (lhs: terms added together), broken as
    clang-format breaks it: after the operators, then after the parenthesis."""
    terms = [lhs] if isinstance(lhs, str) else lhs
    cond = f"{' + '.join(terms)} {op} {rhs}"
    msg = f'"{message}");'
    head = "_Static_assert("
    one = f"{head}{cond}, {msg}"
    if len(one) <= COLUMN_LIMIT:
        return one
    col = len(head)
    if col + len(cond) + 1 <= COLUMN_LIMIT:
        cond_lines = [cond + ","]
    elif col + len(" + ".join(terms)) + len(op) + 1 <= COLUMN_LIMIT:
        cond_lines = [f"{' + '.join(terms)} {op}", " " * CONTINUATION + rhs + ","]
    else:
        cond_lines = [terms[0] + " +"]
        cond_lines += [" " * 2 * CONTINUATION + t + " +" for t in terms[1:-1]]
        cond_lines += [" " * 2 * CONTINUATION + f"{terms[-1]} {op}"]
        cond_lines += [" " * CONTINUATION + rhs + ","]
    if col + len(msg) <= COLUMN_LIMIT:
        lines = [head + cond_lines[0]] + [" " * col + c for c in cond_lines[1:]]
        return "\n".join(lines + [" " * col + msg])
    ind = " " * CONTINUATION
    both = f"{ind}{cond}, {msg}"
    if len(both) <= COLUMN_LIMIT:
        return f"{head}\n{both}"
    if len(f"{ind}{cond},") > COLUMN_LIMIT:  # the condition broken after its operator
        cond = f"{' + '.join(terms)} {op}\n{ind}{ind}{rhs}"
    return f"{head}\n{ind}{cond},\n{ind}{msg}"


def c_decl(head: str, params: str | list[str], indent: str = "") -> str:
    """A function definition's head and parameters (:func:`c_call` with kind "decl")."""
    return c_call(head, params, "", indent, kind="decl")


def c_comment(text: str, indent: str = "", open_: str = "/** ", cont: str = " *  ") -> str:
    """A block comment `text` wrapped to the column limit: ``/** text`` then `cont` lines."""
    lines = [indent + open_]
    for word in text.split():
        fresh = lines[-1] in (indent + open_, indent + cont)
        if not fresh and len(lines[-1]) + 1 + len(word) > COLUMN_LIMIT:
            lines.append(indent + cont + word)
        else:
            lines[-1] += word if fresh else " " + word
    if len(lines[-1]) + 3 > COLUMN_LIMIT and " " in lines[-1][len(indent + cont) :]:
        head, word = lines[-1].rsplit(" ", 1)
        lines[-1:] = [head, indent + cont + word]
    lines[-1] += " */"
    return "\n".join(lines)


def c_brief(text: str, indent: str = "") -> str:
    """A one-sentence ``/** @brief text */`` comment, wrapped (continuation under the text)."""
    return c_comment(f"@brief {text}", indent, "/** ", " *         ")


def c_trailing(code: str, comment: str, indent: str = "") -> str:
    """``code /* comment */`` on one line when it fits, else the comment wrapped on the lines
    before the code."""
    one = f"{indent}{code} /* {comment} */"
    # a directive's comment leaves room for a line continuation (" \\")
    if len(one) <= COLUMN_LIMIT - (2 if code.startswith("#") else 0):
        return one
    return c_comment(comment, indent, "/* ", " * ") + "\n" + indent + code


def _pack_sum(first: str, expr: str, tail: str, limit: int = COLUMN_LIMIT) -> list[str] | None:
    """`first` then `expr` + `tail` broken after its " + " operators, the operands packed and
    continued under the first one (after the innermost "(" open at the first break), every
    line within `limit`; None when it has no " + " or a part does not fit."""
    terms = expr.split(" + ")
    if len(terms) < 2:
        return None
    depth: list[int] = []
    for i, ch in enumerate(first + terms[0]):
        if ch == "(":
            depth.append(i + 1)
        elif ch == ")" and depth:
            depth.pop()
    if not depth:
        return None
    col = depth[-1]
    lines = [first + terms[0]]
    rest = terms[1:-1] + [terms[-1] + tail]
    for i, t in enumerate(rest):
        more = 2 if i + 1 < len(rest) else 0  # room for the " +" after it
        if len(lines[-1]) + 3 + len(t) + more <= limit:
            lines[-1] += " + " + t
        else:
            lines[-1] += " +"
            lines.append(" " * col + t)
    return lines if all(len(x) <= limit for x in lines) else None


def c_assign(lhs: str, rhs: str, tail: str = ";", indent: str = "") -> str:
    """``lhs = rhs;`` (or a designated initialiser's ``.f = v,``): on one line if it fits, else
    the value on the next line (4 more columns), else broken after its " + "."""
    one = f"{indent}{lhs} = {rhs}{tail}"
    if len(one) <= COLUMN_LIMIT:
        return one
    nxt = f"{indent}{' ' * CONTINUATION}{rhs}{tail}"
    if len(nxt) <= COLUMN_LIMIT:
        return f"{indent}{lhs} =\n{nxt}"
    same = _pack_sum(f"{indent}{lhs} = ", rhs, tail)
    after = _pack_sum(f"{indent}{' ' * CONTINUATION}", rhs, tail)  # after "=" and a " + "
    after = after and [f"{indent}{lhs} ="] + after
    packed = same or after
    return "\n".join(packed) if packed else one


def c_define(head: str, value: str = "") -> str:
    """``#define head value``: on one line if it fits, else the value on the next lines (4
    columns in, broken after its " + "), each line but the last ending in a backslash at the
    column limit (clang-format's AlignEscapedNewlines: Right)."""
    one = f"#define {head} {value}".rstrip()
    if len(one) <= COLUMN_LIMIT:
        return one
    ind = " " * CONTINUATION
    lines = [f"#define {head}"]
    if len(ind + value) <= COLUMN_LIMIT:
        lines.append(ind + value)
    else:
        lines += _pack_sum(ind, value, "", COLUMN_LIMIT - 2) or [ind + value]
    return "\n".join([x.ljust(COLUMN_LIMIT - 1) + "\\" for x in lines[:-1]] + lines[-1:])


def c_declare(decl: str, declarator: str, tail: str, indent: str = "") -> tuple[str, int]:
    """A declaration ``decl declarator tail`` (tail: " = {" opening an initialiser, or e.g.
    " ATTRIBUTE;") laid out as clang-format does, and how many columns further in the
    initialiser's lines then go (0, or 4 when the declaration is broken): on one line; else
    (an initialiser) the "{" on the next line; else the declarator on the next line; else
    broken before the declarator's "["."""
    one = f"{indent}{decl} {declarator}{tail}"
    if len(one) <= COLUMN_LIMIT:
        return one, 0
    ind = indent + " " * CONTINUATION
    if tail == " = {" and len(one) - 2 <= COLUMN_LIMIT:
        return f"{one[:-2]}\n{ind}{{", CONTINUATION
    if len(ind + declarator + tail) <= COLUMN_LIMIT or "[" not in declarator:
        return f"{indent}{decl}\n{ind}{declarator}{tail}", CONTINUATION
    ident, sub = declarator.split("[", 1)
    return f"{indent}{decl} {ident}\n{ind}[{sub}{tail}", CONTINUATION


def c_aligned_comments(items: list[tuple[str, str]], indent: str = "    ") -> str:
    """Lines ``code /* comment */`` with the comments aligned (clang-format's
    AlignTrailingComments), one per line."""
    width = max((len(code) for code, _ in items), default=0)
    return "\n".join(f"{indent}{code.ljust(width)} /* {comment} */" for code, comment in items)


def register(env: Any) -> None:
    """Make the helpers Jinja globals of `env`."""
    env.globals.update(
        c_call=c_call,
        c_braced=c_braced,
        c_assert=c_assert,
        c_decl=c_decl,
        c_comment=c_comment,
        c_brief=c_brief,
        c_trailing=c_trailing,
        c_aligned_comments=c_aligned_comments,
        c_assign=c_assign,
        c_define=c_define,
        c_declare=c_declare,
    )


# -- identifiers and literals ----------------------------------------------------------------

C_RESERVED = frozenset(
    """auto break case char const continue default do double else enum extern float for goto if
    inline int long register restrict return short signed sizeof static struct switch typedef
    union unsigned void volatile while _Alignas _Alignof _Atomic _Bool _Complex _Generic
    _Imaginary _Noreturn _Static_assert _Thread_local bool true false NULL main asm""".split()
)


#: Longest C name of a model (``--name`` after :func:`c_ident`). The longest identifier derived
#: from it adds 24 characters (``<name>_l<layer>_shared_expert_gate`` below 1000 layers), so
#: every generated identifier and macro stays within the 63 significant characters C11
#: guarantees (5.2.4.1); the generated files are clang-format clean for every length up to it.
MAX_NAME = 32


def model_ident(name: str, what: str = "model name") -> str:
    """The C name of a model called `name` (:func:`c_ident`), refused (ConfigError) when longer
    than MAX_NAME."""
    ident = c_ident(name)
    if len(ident) > MAX_NAME:
        said = f" (C name '{ident}')" if ident != name else ""
        raise ConfigError(
            f"{what} '{name}'{said} is {len(ident)} characters long; allowed: at most "
            f"{MAX_NAME} (pass a shorter --name)"
        )
    return ident


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
