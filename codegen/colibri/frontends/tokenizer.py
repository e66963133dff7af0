"""Hugging Face byte-level BPE tokenizers (``tokenizer.json``) without the ``tokenizers`` package.

`colibri run --prompt TEXT` turns text into token ids with the checkpoint's own tokenizer. This
module reads the ``tokenizer.json`` of GPT-2-style byte-level BPE tokenizers (GPT-2, Qwen2,
Llama 3, OLMoE / GPT-NeoX, RoBERTa) and encodes and decodes exactly like the ``tokenizers``
library does for them (``Tokenizer.from_file(path).encode(text).ids`` and ``.decode(ids)``):

- added tokens (special or not) are split out of the text first, the tokens marked
  ``normalized: false`` on the raw text, then the others on the normalized text, leftmost-longest
  like the library's Aho-Corasick matcher, with ``single_word``, ``lstrip`` and ``rstrip``;
- the normalizer: none, or Unicode normalization (NFC, NFD, NFKC, NFKD, a Sequence of them);
- the pre-tokenizer: ``ByteLevel`` (``add_prefix_space``, ``use_regex`` with GPT-2's regex),
  alone or in a ``Sequence`` with ``Split`` steps (a regex or a string; every split behaviour;
  ``invert``) as Qwen2 and Llama 3 have;
- the model: BPE merges applied by rank exactly as the library does (its priority queue, so even
  merge lists that are not in training order agree), ``ignore_merges``, ``unk_token`` /
  ``fuse_unk``, ``byte_fallback``, ``continuing_subword_prefix``, ``end_of_word_suffix``, one
  cache per word;
- the post-processor: none, ``ByteLevel`` (changes no id), ``TemplateProcessing`` (its "single"
  template, e.g. a BOS token), ``RobertaProcessing`` / ``BertProcessing``, a Sequence of them;
- the decoder: ``ByteLevel``; special tokens are skipped by default, like the library.

The regexes are the library's Oniguruma patterns translated for Python's ``re`` (which has no
``\\p{..}``): ``\\p{L}``, ``\\p{N}`` (any general category), ``\\s`` and ``\\d`` become explicit
character classes built from :mod:`unicodedata` (``\\s`` = the Unicode White_Space property,
as in Oniguruma; Python's own ``\\s`` would also take U+001C..U+001F). Known differences:

- Characters assigned in a Unicode version newer than Python's ``unicodedata``
  (``unicodedata.unidata_version``: 13.0 in Python 3.10, 14.0 in 3.11, 15.0 in 3.12) have no
  category here, so they are neither letters nor numbers (and NFC leaves them alone). The
  library's Oniguruma knows Unicode 16.0: against tokenizers 0.23 on Python 3.11, 9272 letters
  (mostly CJK extension H and I ideographs) and 120 numbers differ; every character Python
  knows gets the same class (L, N, M, P, S, Z, C, White_Space) in both.
- ``single_word`` added tokens decide "word character" by general category (L, M, Nd, Nl, Pc);
  the library uses Rust's ``\\w`` (Alphabetic, M, Nd, Pc, Join_Control). None of the
  tokenizers named above has a ``single_word`` token.
- Ids the tokenizer does not know decode to U+FFFD here; the library drops them silently.
- ``truncation`` and ``padding`` settings of the file are ignored (a prompt is never cut or
  padded), as transformers does when it tokenizes without ``truncation=`` / ``padding=``.

Anything else (WordPiece, Unigram and WordLevel models, SentencePiece-style Metaspace or
byte-fallback tokenizers such as Mixtral's, other normalizers, pre-tokenizers or decoders, BPE
dropout, a corrupt or truncated file) raises :class:`~colibri.errors.ConfigError` naming the
part and what is supported; a missing file and text that is not valid Unicode raise
:class:`~colibri.errors.InputError`.
"""

from __future__ import annotations

import heapq
import json
import re
import sys
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from ..errors import ConfigError, InputError

SUPPORTED = (
    "supported: byte-level BPE tokenizers (model.type 'BPE' with a ByteLevel pre-tokenizer and "
    "decoder, as GPT-2, Qwen2, Llama 3 and OLMoE ship)"
)
#: GPT-2's pre-tokenization regex, as the tokenizers library's ByteLevel pre-tokenizer has it.
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
#: The Unicode White_Space property: what Oniguruma's \s and Rust's char::is_whitespace match.
WHITE_SPACE: tuple[tuple[int, int], ...] = (
    (0x09, 0x0D),
    (0x20, 0x20),
    (0x85, 0x85),
    (0xA0, 0xA0),
    (0x1680, 0x1680),
    (0x2000, 0x200A),
    (0x2028, 0x2029),
    (0x202F, 0x202F),
    (0x205F, 0x205F),
    (0x3000, 0x3000),
)
_WS_CHARS = frozenset(chr(c) for lo, hi in WHITE_SPACE for c in range(lo, hi + 1))
_CACHE_WORDS = 10_000
_NORMAL_FORMS = ("NFC", "NFD", "NFKC", "NFKD")
_BEHAVIORS = ("Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous")

Ranges = list[tuple[int, int]]


# -- GPT-2's byte <-> unicode table --------------------------------------------------------------


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table: every byte as a printable character (printable Latin-1 bytes as
    themselves, the other 68 as U+0100 onwards), so byte strings are vocabulary strings."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


@lru_cache(maxsize=1)
def unicode_to_bytes() -> dict[str, int]:
    return {c: b for b, c in bytes_to_unicode().items()}


def _byte_level(text: str) -> str:
    table = bytes_to_unicode()
    return "".join(table[b] for b in text.encode("utf-8"))


# -- Oniguruma patterns for Python's re ----------------------------------------------------------


@lru_cache(maxsize=1)
def _category_table() -> dict[str, Ranges]:
    """Code point ranges of every two-letter general category (unicodedata's Unicode)."""
    table: dict[str, Ranges] = {}
    category = unicodedata.category
    prev = category("\0")
    start = 0
    for cp in range(1, sys.maxunicode + 1):
        cat = category(chr(cp))
        if cat != prev:
            table.setdefault(prev, []).append((start, cp - 1))
            prev, start = cat, cp
    table.setdefault(prev, []).append((start, sys.maxunicode))
    return table


def _union(ranges: Iterable[tuple[int, int]]) -> Ranges:
    out: Ranges = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(hi, out[-1][1]))
        else:
            out.append((lo, hi))
    return out


def _complement(ranges: Ranges) -> Ranges:
    out: Ranges = []
    nxt = 0
    for lo, hi in ranges:
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= sys.maxunicode:
        out.append((nxt, sys.maxunicode))
    return out


@cache
def category_ranges(name: str) -> tuple[tuple[int, int], ...]:
    """Ranges of a general category: one letter (L, N, ...), two (Lu, Nd, ...), or LC / L&."""
    table = _category_table()
    if name in ("LC", "L&"):
        cats = ["Lu", "Ll", "Lt"]
    elif len(name) == 1 and name in "LMNPSZC":
        cats = [c for c in table if c[0] == name] + (["Cn"] if name == "C" else [])
    elif len(name) == 2 and name[0] in "LMNPSZC":
        cats = [name]
        if name not in table and name != "Cn":
            raise KeyError(name)
    else:
        raise KeyError(name)
    return tuple(_union(r for c in cats for r in table.get(c, [])))


def _esc(cp: int) -> str:
    return f"\\U{cp:08x}" if cp > 0xFFFF else f"\\u{cp:04x}"


def _class_body(ranges: Iterable[tuple[int, int]]) -> str:
    return "".join(_esc(lo) if lo == hi else f"{_esc(lo)}-{_esc(hi)}" for lo, hi in ranges)


def _class_item(ranges: Ranges, negate: bool, in_class: bool) -> str:
    if in_class:
        return _class_body(_complement(ranges) if negate else ranges)
    return ("[^" if negate else "[") + _class_body(ranges) + "]"


_GROUP_OPENERS = ("(?:", "(?=", "(?!", "(?<=", "(?<!", "(?i:")
_SIMPLE_ESCAPES = "rntfv"
_QUANTIFIERS = "*+?}"


def translate_pattern(pattern: str, where: str) -> str:
    """An Oniguruma regex of a tokenizer.json as a Python ``re`` pattern with the same matches:
    ``\\p{..}`` / ``\\P{..}`` (general categories), ``\\s``, ``\\S``, ``\\d``, ``\\D`` become
    explicit classes; ``^`` / ``$`` match at line boundaries as in Oniguruma. Constructs whose
    meaning differs and no tokenizer needs (``\\w``, ``\\b``, possessive quantifiers, atomic
    groups, named groups, back-references, class intersections) raise ConfigError."""

    def bad(what: str) -> ConfigError:
        return ConfigError(
            f"{where}: regex {pattern!r}: {what} is not supported; supported: literals, "
            f"classes, \\p{{..}} general categories, \\s \\S \\d \\D, groups (?: (?= (?! (?<= "
            f"(?<! (?i:, greedy and lazy quantifiers"
        )

    out: list[str] = []
    i, n = 0, len(pattern)
    in_class = False
    while i < n:
        c = pattern[i]
        if c == "\\":
            if i + 1 >= n:
                raise bad("a trailing backslash")
            e = pattern[i + 1]
            if e in "pP":
                if i + 2 < n and pattern[i + 2] == "{":
                    end = pattern.find("}", i + 3)
                    if end < 0:
                        raise bad("an unterminated \\p{")
                    name, i = pattern[i + 3 : end], end + 1
                elif i + 2 < n:
                    name, i = pattern[i + 2], i + 3
                else:
                    raise bad("a bare \\p")
                negate = e == "P"
                if name.startswith("^"):
                    negate, name = not negate, name[1:]
                try:
                    ranges = list(category_ranges(name))
                except KeyError:
                    raise bad(f"property \\{e}{{{name}}} (only general categories)") from None
                out.append(_class_item(ranges, negate, in_class))
                continue
            if e in "sS":
                out.append(_class_item(list(WHITE_SPACE), e == "S", in_class))
            elif e in "dD":
                out.append(_class_item(list(category_ranges("Nd")), e == "D", in_class))
            elif e in _SIMPLE_ESCAPES:
                out.append("\\" + e)
            elif e == "x":
                m = re.match(r"\{([0-9A-Fa-f]{1,8})\}|([0-9A-Fa-f]{1,2})", pattern[i + 2 :])
                if m is None:
                    raise bad("a malformed \\x escape")
                cp = int(m.group(1) or m.group(2), 16)
                if cp > sys.maxunicode:
                    raise bad(f"code point \\x{{{cp:x}}}")
                out.append(_esc(cp))
                i += 2 + m.end()
                continue
            elif e == "u":
                m = re.match(r"[0-9A-Fa-f]{4}", pattern[i + 2 :])
                if m is None:
                    raise bad("a malformed \\u escape")
                out.append("\\u" + m.group(0))
                i += 6
                continue
            elif e == "z" and not in_class:
                out.append("\\Z")
            elif e == "A" and not in_class:
                out.append("\\A")
            elif e.isascii() and e.isalnum():
                raise bad(f"the escape \\{e}")
            else:
                out.append(re.escape(e) if e not in "\\]" else "\\" + e)
            i += 2
            continue
        if in_class:
            if c == "[":
                raise bad("a nested class or POSIX bracket")
            if c == "&" and pattern.startswith("&&", i):
                raise bad("a class intersection (&&)")
            if c == "]":
                in_class = False
            out.append(c)
            i += 1
            continue
        if c == "[":
            in_class = True
            out.append("[")
            i += 1
            if pattern.startswith("^", i):
                out.append("^")
                i += 1
            if pattern.startswith("]", i):
                raise bad("an empty class or ']' first in a class")
            continue
        if c == "(":
            if pattern.startswith("(?", i):
                opener = next((g for g in _GROUP_OPENERS if pattern.startswith(g, i)), None)
                if opener is None:
                    raise bad(f"the group {pattern[i : i + 4]!r}")
                out.append(opener)
                i += len(opener)
                continue
            out.append(c)
        elif c in _QUANTIFIERS and pattern.startswith("+", i + 1):
            raise bad("a possessive quantifier")
        elif c == "^":
            out.append("(?m:^)")
        elif c == "$":
            out.append("(?m:$)")
        else:
            out.append(c)
        i += 1
    if in_class:
        raise bad("an unterminated class")
    translated = "".join(out)
    try:
        re.compile(translated)
    except re.error as exc:
        raise ConfigError(f"{where}: regex {pattern!r} is not a valid pattern ({exc})") from None
    return translated


@lru_cache(maxsize=32)
def compile_pattern(pattern: str, where: str = "regex") -> re.Pattern[str]:
    return re.compile(translate_pattern(pattern, where))


def find_matches(rx: re.Pattern[str], text: str) -> list[tuple[int, int, bool]]:
    """(start, end, is_match) pieces covering `text`, as the library's Pattern::find_matches:
    Oniguruma's iteration, which skips an empty match right after the previous match."""
    if not text:
        return [(0, 0, False)]
    pieces: list[tuple[int, int, bool]] = []
    prev = 0
    pos = 0
    last_end: int | None = None
    while pos <= len(text):
        m = rx.search(text, pos)
        if m is None:
            break
        s, e = m.span()
        if s == e and last_end == e:
            pos += 1
            continue
        pos = last_end = e
        if prev != s:
            pieces.append((prev, s, False))
        pieces.append((s, e, True))
        prev = e
    if prev != len(text):
        pieces.append((prev, len(text), False))
    return pieces


def split_pieces(text: str, matches: list[tuple[int, int, bool]], behavior: str) -> list[str]:
    """The library's NormalizedString::split for one SplitDelimiterBehavior (empties dropped)."""
    spans: list[list[int]] = []  # [start, end, remove]
    if behavior == "Isolated":
        spans = [[s, e, 0] for s, e, _ in matches]
    elif behavior == "Removed":
        spans = [[s, e, int(m)] for s, e, m in matches]
    elif behavior in ("Contiguous", "MergedWithPrevious"):
        previous = False
        for s, e, m in matches:
            glue = m == previous if behavior == "Contiguous" else m and not previous
            if glue and spans:
                spans[-1][1] = e
            else:
                spans.append([s, e, 0])
            previous = m
    elif behavior == "MergedWithNext":
        previous = False
        for s, e, m in reversed(matches):
            if m and not previous and spans:
                spans[-1][0] = s
            else:
                spans.append([s, e, 0])
            previous = m
        spans.reverse()
    else:  # checked when loading
        raise ValueError(behavior)
    return [text[s:e] for s, e, remove in spans if not remove and e > s]


# -- the parts of a tokenizer.json ---------------------------------------------------------------


def _kind(obj: Any, what: str, where: str) -> str:
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: {what} must be a JSON object, got {type(obj).__name__}")
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise ConfigError(f"{where}: {what} has no 'type' string")
    return kind


def _flag(obj: Mapping[str, Any], key: str, default: bool, where: str) -> bool:
    v = obj.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ConfigError(f"{where}: '{key}' must be true or false, got {v!r}")
    return v


def _sentencepiece(what: str, kind: str, where: str) -> ConfigError:
    return ConfigError(
        f"{where}: {what} '{kind}' is SentencePiece-style (Mixtral, Llama 2, Mistral): not "
        f"supported; {SUPPORTED}. Pass --prompt-ids instead"
    )


def _parse_normalizer(obj: Any, where: str) -> list[str]:
    """The Unicode normalization forms to apply in order (empty: none)."""
    if obj is None:
        return []
    kind = _kind(obj, "normalizer", where)
    if kind in _NORMAL_FORMS:
        return [kind]
    if kind == "Sequence":
        parts = obj.get("normalizers")
        if not isinstance(parts, list):
            raise ConfigError(f"{where}: normalizer Sequence needs a 'normalizers' list")
        return [form for p in parts for form in _parse_normalizer(p, where)]
    if kind in ("Prepend", "Replace"):
        raise _sentencepiece("normalizer", kind, where)
    raise ConfigError(
        f"{where}: normalizer '{kind}' is not supported (it changes the text); supported: none, "
        f"NFC, NFD, NFKC, NFKD or a Sequence of them"
    )


@dataclass(frozen=True)
class _ByteLevelStep:
    add_prefix_space: bool
    use_regex: bool


@dataclass(frozen=True)
class _SplitStep:
    rx: re.Pattern[str]
    behavior: str
    invert: bool


_PreStep = _ByteLevelStep | _SplitStep


def _parse_pre_tokenizer(obj: Any, where: str) -> list[_PreStep]:
    if obj is None:
        return []
    kind = _kind(obj, "pre_tokenizer", where)
    if kind == "ByteLevel":
        return [
            _ByteLevelStep(
                _flag(obj, "add_prefix_space", True, where), _flag(obj, "use_regex", True, where)
            )
        ]
    if kind == "Sequence":
        parts = obj.get("pretokenizers")
        if not isinstance(parts, list):
            raise ConfigError(f"{where}: pre_tokenizer Sequence needs a 'pretokenizers' list")
        return [step for p in parts for step in _parse_pre_tokenizer(p, where)]
    if kind == "Split":
        pat = obj.get("pattern")
        if isinstance(pat, dict) and isinstance(pat.get("Regex"), str):
            rx = compile_pattern(pat["Regex"], where)
        elif isinstance(pat, dict) and isinstance(pat.get("String"), str):
            rx = re.compile(re.escape(pat["String"]) if pat["String"] else "(?!)")
        else:
            raise ConfigError(f"{where}: Split pre-tokenizer needs a pattern {{'Regex': ...}}")
        behavior = obj.get("behavior")
        if behavior not in _BEHAVIORS:
            raise ConfigError(
                f"{where}: Split behavior {behavior!r} is not one of {', '.join(_BEHAVIORS)}"
            )
        return [_SplitStep(rx, behavior, _flag(obj, "invert", False, where))]
    if kind == "Metaspace":
        raise _sentencepiece("pre_tokenizer", kind, where)
    raise ConfigError(
        f"{where}: pre_tokenizer '{kind}' is not supported; supported: ByteLevel, or a Sequence "
        f"of Split and ByteLevel; {SUPPORTED}"
    )


def _parse_decoder(obj: Any, where: str) -> None:
    if obj is None:
        raise ConfigError(f"{where}: no decoder; {SUPPORTED}")
    kind = _kind(obj, "decoder", where)
    if kind == "ByteLevel":
        return
    if kind == "Sequence" and isinstance(obj.get("decoders"), list) and obj["decoders"]:
        for d in obj["decoders"]:
            _parse_decoder(d, where)
        return
    if kind in ("Metaspace", "ByteFallback", "Replace", "Fuse", "Strip"):
        raise _sentencepiece("decoder", kind, where)
    raise ConfigError(f"{where}: decoder '{kind}' is not supported; {SUPPORTED}")


def _id(v: Any, what: str, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ConfigError(f"{where}: {what} must be a token id (an integer >= 0), got {v!r}")
    return v


def _parse_post_processor(obj: Any, where: str) -> tuple[list[int], list[int]]:
    """(ids before, ids after) the text's ids when encoding with special tokens."""
    if obj is None:
        return [], []
    kind = _kind(obj, "post_processor", where)
    if kind == "ByteLevel":
        return [], []
    if kind == "Sequence":
        parts = obj.get("processors")
        if not isinstance(parts, list):
            raise ConfigError(f"{where}: post_processor Sequence needs a 'processors' list")
        before: list[int] = []
        after: list[int] = []
        for p in parts:
            b, a = _parse_post_processor(p, where)
            before, after = b + before, after + a
        return before, after
    if kind in ("RobertaProcessing", "BertProcessing"):
        cls, sep = obj.get("cls"), obj.get("sep")
        if not (isinstance(cls, list) and len(cls) == 2 and isinstance(sep, list)):
            raise ConfigError(f"{where}: {kind} needs 'cls' and 'sep' as [token, id]")
        if len(sep) != 2:
            raise ConfigError(f"{where}: {kind} needs 'sep' as [token, id]")
        return [_id(cls[1], f"{kind} cls id", where)], [_id(sep[1], f"{kind} sep id", where)]
    if kind == "TemplateProcessing":
        single, specials = obj.get("single"), obj.get("special_tokens")
        if not isinstance(single, list) or not isinstance(specials, dict):
            raise ConfigError(f"{where}: TemplateProcessing needs 'single' and 'special_tokens'")
        before, after = [], []
        seen_text = False
        for piece in single:
            if isinstance(piece, dict) and "Sequence" in piece:
                seen_text = True
                continue
            name = piece.get("SpecialToken", {}).get("id") if isinstance(piece, dict) else None
            spec = specials.get(name) if isinstance(name, str) else None
            ids = spec.get("ids") if isinstance(spec, dict) else None
            if not isinstance(ids, list):
                raise ConfigError(
                    f"{where}: TemplateProcessing item {piece!r} names no special token with ids"
                )
            (after if seen_text else before).extend(_id(t, f"id of {name!r}", where) for t in ids)
        return before, after
    raise ConfigError(
        f"{where}: post_processor '{kind}' is not supported; supported: ByteLevel, "
        f"TemplateProcessing, RobertaProcessing, BertProcessing or a Sequence of them"
    )


class _BPE:
    """The library's BPE model: symbols merged through a priority queue by (rank, position)."""

    def __init__(self, model: dict[str, Any], where: str) -> None:
        vocab = model.get("vocab")
        if not isinstance(vocab, dict) or not vocab:
            raise ConfigError(f"{where}: model.vocab must be a non-empty {{token: id}} object")
        self.vocab: dict[str, int] = {}
        self.vocab_r: dict[int, str] = {}
        for tok, i in vocab.items():
            i = _id(i, f"model.vocab[{tok!r}]", where)
            if i in self.vocab_r:
                raise ConfigError(
                    f"{where}: model.vocab gives id {i} to both {self.vocab_r[i]!r} and {tok!r}; "
                    f"the file is corrupt"
                )
            self.vocab[tok] = i
            self.vocab_r[i] = tok
        dropout = model.get("dropout")
        if dropout not in (None, 0, 0.0):
            raise ConfigError(
                f'{where}: BPE dropout {dropout!r} makes encoding random; set "dropout": null'
            )
        prefix = model.get("continuing_subword_prefix")
        suffix = model.get("end_of_word_suffix")
        unk = model.get("unk_token")
        for key, v in (("continuing_subword_prefix", prefix), ("end_of_word_suffix", suffix)):
            if v is not None and not isinstance(v, str):
                raise ConfigError(f"{where}: model.{key} must be a string or null")
        self.prefix: str | None = prefix
        self.suffix: str | None = suffix
        if unk is not None and not isinstance(unk, str):
            raise ConfigError(f"{where}: model.unk_token must be a string or null")
        self.unk_token: str | None = unk
        self.fuse_unk = _flag(model, "fuse_unk", False, where)
        self.byte_fallback = _flag(model, "byte_fallback", False, where)
        self.ignore_merges = _flag(model, "ignore_merges", False, where)
        self.merges = self._parse_merges(model.get("merges"), where)
        self.cache: dict[str, tuple[int, ...]] = {}
        self.where = where

    def _parse_merges(self, merges: Any, where: str) -> dict[tuple[int, int], tuple[int, int]]:
        if merges is None:
            raise ConfigError(f"{where}: model.merges is missing; a BPE model needs its merges")
        if not isinstance(merges, list):
            raise ConfigError(f"{where}: model.merges must be a list")
        skip = len(self.prefix) if self.prefix else 0
        out: dict[tuple[int, int], tuple[int, int]] = {}
        for rank, m in enumerate(merges):
            if isinstance(m, str):
                pair = m.split(" ")
            elif isinstance(m, list) and all(isinstance(p, str) for p in m):
                pair = m
            else:
                pair = []
            if len(pair) != 2:
                raise ConfigError(
                    f'{where}: merge {rank + 1} ({m!r}) is not a pair "a b" or ["a", "b"]'
                )
            a, b = pair
            new = a + b[skip:]
            for part in (a, b, new):
                if part not in self.vocab:
                    raise ConfigError(
                        f"{where}: merge {rank + 1} ({a!r} + {b!r}) uses {part!r}, which is not "
                        f"in model.vocab; the file is corrupt or truncated"
                    )
            out[(self.vocab[a], self.vocab[b])] = (rank, self.vocab[new])
        return out

    def tokenize(self, word: str) -> tuple[int, ...]:
        if not word:
            return ()
        if self.ignore_merges and word in self.vocab:
            return (self.vocab[word],)
        hit = self.cache.get(word)
        if hit is not None:
            return hit
        ids = self._merge_word(word)
        if len(self.cache) >= _CACHE_WORDS:
            self.cache.clear()
        self.cache[word] = ids
        return ids

    def _unk_id(self) -> int:
        assert self.unk_token is not None
        if self.unk_token not in self.vocab:
            raise ConfigError(f"{self.where}: unk_token {self.unk_token!r} is not in model.vocab")
        return self.vocab[self.unk_token]

    def _merge_word(self, word: str) -> tuple[int, ...]:
        ids: list[int] = []
        unk: int | None = None
        last = len(word) - 1
        for i, ch in enumerate(word):
            s = ch
            if i > 0 and self.prefix:
                s = self.prefix + s
            if i == last and self.suffix:
                s = s + self.suffix
            tid = self.vocab.get(s)
            if tid is not None:
                if unk is not None:
                    ids.append(unk)
                    unk = None
                ids.append(tid)
                continue
            if self.byte_fallback:
                codes = [self.vocab.get(f"<0x{b:02X}>") for b in s.encode("utf-8")]
                if all(c is not None for c in codes):
                    ids.extend(c for c in codes if c is not None)
                    continue
            if self.unk_token is not None:
                if unk is not None and not self.fuse_unk:
                    ids.append(unk)
                if unk is None or not self.fuse_unk:
                    unk = self._unk_id()
        if unk is not None:
            ids.append(unk)
        return tuple(self._merge_all(ids))

    def _merge_all(self, c: list[int]) -> list[int]:
        n = len(c)
        prev = list(range(-1, n - 1))
        nxt = [*range(1, n), -1]
        alive = [True] * n
        merges = self.merges
        # (rank, pos, new_id), popped in the library's order (rank, then pos; a rank is one pair).
        queue: list[tuple[int, int, int]] = []
        for i in range(n - 1):
            entry = merges.get((c[i], c[i + 1]))
            if entry is not None:
                queue.append((entry[0], i, entry[1]))
        heapq.heapify(queue)
        while queue:
            _, pos, new = heapq.heappop(queue)
            if not alive[pos] or nxt[pos] == -1:
                continue
            right = nxt[pos]
            entry = merges.get((c[pos], c[right]))
            if entry is None or entry[1] != new:
                continue
            c[pos] = new
            nxt[pos] = nxt[right]
            alive[right] = False
            if nxt[right] != -1:
                prev[nxt[right]] = pos
            if prev[pos] >= 0:
                entry = merges.get((c[prev[pos]], new))
                if entry is not None:
                    heapq.heappush(queue, (entry[0], prev[pos], entry[1]))
            if nxt[pos] != -1:
                entry = merges.get((new, c[nxt[pos]]))
                if entry is not None:
                    heapq.heappush(queue, (entry[0], pos, entry[1]))
        return [t for t, ok in zip(c, alive) if ok]


@dataclass(frozen=True)
class AddedToken:
    content: str
    special: bool
    single_word: bool
    lstrip: bool
    rstrip: bool
    normalized: bool


def _is_word_char(ch: str) -> bool:
    cat = unicodedata.category(ch)
    return cat[0] in "LM" or cat in ("Nd", "Nl", "Pc")


# -- the tokenizer -------------------------------------------------------------------------------


class Tokenizer:
    """A Hugging Face byte-level BPE tokenizer: :meth:`encode` and :meth:`decode` as the
    ``tokenizers`` library's (see the module docstring for what is supported)."""

    def __init__(self, data: Any, source: str = "tokenizer.json") -> None:
        where = source
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: expected a JSON object (a Hugging Face tokenizer.json)")
        model = data.get("model")
        if not isinstance(model, dict):
            raise ConfigError(f"{where}: no 'model' object; not a Hugging Face tokenizer.json")
        kind = model.get("type", "BPE" if "merges" in model else None)
        if kind != "BPE":
            what = {
                "WordPiece": " (BERT-style)",
                "Unigram": " (SentencePiece unigram, e.g. T5)",
                "WordLevel": " (whole words)",
            }.get(str(kind), "")
            raise ConfigError(
                f"{where}: model type {kind!r}{what} is not supported; {SUPPORTED}. Pass "
                f"--prompt-ids instead"
            )
        self.source = source
        self.normal_forms = _parse_normalizer(data.get("normalizer"), where)
        self.steps = _parse_pre_tokenizer(data.get("pre_tokenizer"), where)
        if not any(isinstance(s, _ByteLevelStep) for s in self.steps):
            style = " (byte_fallback: SentencePiece-style, e.g. Mixtral)"
            raise ConfigError(
                f"{where}: the pre_tokenizer has no ByteLevel step"
                f"{style if model.get('byte_fallback') else ''}; {SUPPORTED}. Pass --prompt-ids "
                f"instead"
            )
        _parse_decoder(data.get("decoder"), where)
        self.bos_ids, self.eos_ids = _parse_post_processor(data.get("post_processor"), where)
        self.model = _BPE(model, where)
        self._load_added(data.get("added_tokens", []), where)
        self.vocab_size = 1 + max(
            [*self.model.vocab_r, *self.added_r, *self.bos_ids, *self.eos_ids]
        )

    # added tokens, as the library's AddedVocabulary

    def _load_added(self, tokens: Any, where: str) -> None:
        if tokens is None:
            tokens = []
        if not isinstance(tokens, list):
            raise ConfigError(f"{where}: 'added_tokens' must be a list")
        parsed: list[AddedToken] = []
        for t in tokens:
            if not isinstance(t, dict) or not isinstance(t.get("content"), str):
                raise ConfigError(f"{where}: added token {t!r} has no 'content' string")
            _id(t.get("id"), f"the id of added token {t['content']!r}", where)
            special = _flag(t, "special", False, where)
            parsed.append(
                AddedToken(
                    t["content"],
                    special,
                    _flag(t, "single_word", False, where),
                    _flag(t, "lstrip", False, where),
                    _flag(t, "rstrip", False, where),
                    _flag(t, "normalized", not special, where),
                )
            )
        # The library re-derives the ids: a token the model knows keeps the model's id, the
        # others are numbered after the model's vocabulary (the file's ids match for every
        # file the library wrote).
        self.special_set = {t.content for t in parsed if t.special and t.content}
        self.added: dict[str, int] = {}
        self.added_r: dict[int, AddedToken] = {}
        n_model = len(self.model.vocab)
        for t in parsed:
            if not t.content or t.content in self.added:
                continue
            new = self.model.vocab.get(t.content)
            if new is None:
                top = max(self.added.values(), default=None)
                new = top + 1 if top is not None and top >= n_model else n_model
            self.added[t.content] = new
            self.added_r[new] = t
        raw = [t for t in self.added_r.values() if not t.normalized]
        norm = [t for t in self.added_r.values() if t.normalized]
        self._raw_matcher = self._matcher({t.content: self.added[t.content] for t in raw})
        self._norm_matcher = self._matcher(
            {self._normalize(t.content): self.added[t.content] for t in norm}
        )

    @staticmethod
    def _matcher(patterns: dict[str, int]) -> tuple[re.Pattern[str], dict[str, int]] | None:
        """Leftmost-longest over literal strings (the library's Aho-Corasick, LeftmostLongest)."""
        patterns = {p: i for p, i in patterns.items() if p}
        if not patterns:
            return None
        alts = sorted(patterns, key=len, reverse=True)
        return re.compile("|".join(re.escape(p) for p in alts)), patterns

    def _split_added(
        self, text: str, matcher: tuple[re.Pattern[str], dict[str, int]] | None
    ) -> list[tuple[str, int | None]]:
        if matcher is None:
            return [(text, None)]
        rx, ids = matcher
        out: list[tuple[str, int | None]] = []
        offset = 0
        for m in rx.finditer(text):
            start, stop = m.span()
            tid = ids[m.group(0)]
            tok = self.added_r[tid]
            if tok.single_word:
                before_ok = start == 0 or not _is_word_char(text[start - 1])
                after_ok = stop == len(text) or not _is_word_char(text[stop])
                if not (before_ok and after_ok):
                    continue
            if tok.lstrip:
                new_start = start
                while new_start > 0 and text[new_start - 1] in _WS_CHARS:
                    new_start -= 1
                start = max(new_start, offset)
            if tok.rstrip:
                while stop < len(text) and text[stop] in _WS_CHARS:
                    stop += 1
            if offset < start:
                out.append((text[offset:start], None))
            out.append((text[start:stop], tid))
            offset = stop
        if offset != len(text):
            out.append((text[offset:], None))
        return out

    def _normalize(self, text: str) -> str:
        for form in self.normal_forms:
            text = unicodedata.normalize(form, text)  # type: ignore[arg-type]
        return text

    # pre-tokenization

    def _pre_tokenize(self, text: str) -> list[str]:
        words = [text]
        for step in self.steps:
            nxt: list[str] = []
            for w in words:
                if isinstance(step, _ByteLevelStep):
                    if step.add_prefix_space and not w.startswith(" "):
                        w = " " + w
                    parts = [w]
                    if step.use_regex:
                        parts = split_pieces(w, find_matches(_gpt2_regex(), w), "Isolated")
                    nxt.extend(_byte_level(p) for p in parts if p)
                else:
                    matches = find_matches(step.rx, w)
                    if step.invert:
                        matches = [(s, e, not m) for s, e, m in matches]
                    nxt.extend(split_pieces(w, matches, step.behavior))
            words = nxt
        return words

    # public API

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; with add_special_tokens the post-processor's tokens (e.g. a
        BOS) too, like ``tokenizers``' ``encode(text).ids``."""
        bad = next((ch for ch in text if 0xD800 <= ord(ch) <= 0xDFFF), None)
        if bad is not None:
            raise InputError(
                f"the text contains U+{ord(bad):04X}, a lone surrogate: not valid Unicode "
                f"(was it given as bytes that are not UTF-8?)"
            )
        ids: list[int] = list(self.bos_ids) if add_special_tokens else []
        for piece, tid in self._split_added(text, self._raw_matcher):
            if tid is not None:
                ids.append(tid)
                continue
            if not piece:
                continue
            for sub, sub_id in self._split_added(self._normalize(piece), self._norm_matcher):
                if sub_id is not None:
                    ids.append(sub_id)
                elif sub:
                    for word in self._pre_tokenize(sub):
                        ids.extend(self.model.tokenize(word))
        if add_special_tokens:
            ids.extend(self.eos_ids)
        return ids

    def token(self, tid: int) -> str | None:
        """The token string of an id (None when the tokenizer has no such id)."""
        tok = self.added_r.get(tid)
        return tok.content if tok is not None else self.model.vocab_r.get(tid)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of token ids, like ``tokenizers``' ``decode(ids)`` (special tokens skipped by
        default; invalid UTF-8 as U+FFFD). An id the tokenizer does not have decodes to U+FFFD
        (the library drops it)."""
        table = unicode_to_bytes()
        raw = bytearray()
        for t in ids:
            tok = self.token(int(t))
            if tok is None:
                raw += "\ufffd".encode()
                continue
            if skip_special_tokens and tok in self.special_set:
                continue
            if all(ch in table for ch in tok):
                raw += bytes(table[ch] for ch in tok)
            else:
                raw += tok.encode("utf-8", errors="surrogatepass")
        return raw.decode("utf-8", errors="replace")

    def check_vocab(self, vocab_size: int, model: str = "the model") -> None:
        """ConfigError when a token id of the tokenizer is outside [0, vocab_size)."""
        if self.vocab_size <= vocab_size:
            return
        ids = [*self.model.vocab_r, *self.added_r, *self.bos_ids, *self.eos_ids]
        worst = max(ids)
        raise ConfigError(
            f"{self.source}: token id {worst} ({self.token(worst)!r}) is outside the vocabulary "
            f"of {model} (vocab_size {vocab_size}); this tokenizer belongs to another model: "
            f"pass the checkpoint's own tokenizer.json with --tokenizer, or --prompt-ids"
        )


@lru_cache(maxsize=1)
def _gpt2_regex() -> re.Pattern[str]:
    return compile_pattern(GPT2_PATTERN, "ByteLevel")


def load_tokenizer(path: str | Path) -> Tokenizer:
    """A tokenizer.json file as a :class:`Tokenizer` (InputError when missing, ConfigError when
    corrupt or unsupported)."""
    p = Path(path)
    if not p.is_file():
        raise InputError(
            f"{p}: tokenizer file not found; pass the tokenizer.json of the checkpoint (a Hugging "
            f"Face byte-level BPE tokenizer)"
        )
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{p}: cannot read the tokenizer file ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not UTF-8 text; expected a Hugging Face tokenizer.json") from None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ConfigError(
            f"{p}: not valid JSON ({exc}); the file is corrupt or truncated: download the "
            f"checkpoint's tokenizer.json again"
        ) from None
    return Tokenizer(data, str(p))
