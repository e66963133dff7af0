"""Hugging Face tokenizers (``tokenizer.json``) for `colibri run --prompt`, through ``tokenizers``.

The ``tokenizers`` package (the Rust library transformers itself uses) reads the file, so every
``tokenizer.json`` a supported checkpoint ships encodes and decodes as in transformers: byte-level
BPE (GPT-2, Qwen2, Llama 3, OLMoE), SentencePiece-style BPE with byte fallback (Mixtral,
Llama 2: a Metaspace pre-tokenizer or a Prepend + Replace normalizer, ``<0x..>`` byte tokens,
``fuse_unk``), Unigram, WordPiece and WordLevel. This module only turns the library's failures
into one-line errors that name the file and the fix:

- a missing or unreadable file: :class:`~colibri.errors.ConfigError`;
- a file that is not UTF-8 JSON, not a tokenizer.json, of an unknown model type, or that the
  library refuses: :class:`~colibri.errors.ModelFormatError`;
- a tokenizer with ids outside the model's vocabulary (:meth:`Tokenizer.check_vocab`):
  :class:`~colibri.errors.ConfigError`;
- text that is not valid Unicode: :class:`~colibri.errors.InputError`.

As in transformers, the file's ``truncation`` and ``padding`` settings are switched off (a prompt
is never cut or padded), special tokens are skipped when decoding, and ids the tokenizer does not
have decode to nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError, InputError, ModelFormatError

if TYPE_CHECKING:
    import tokenizers

#: model.type values the tokenizers library reads.
MODEL_TYPES = ("BPE", "Unigram", "WordPiece", "WordLevel")
_U32 = 2**32


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


class Tokenizer:
    """A loaded tokenizer.json: :meth:`encode` and :meth:`decode` as transformers'
    ``PreTrainedTokenizerFast`` (``encode(text)`` and ``decode(ids, skip_special_tokens=True)``)."""

    def __init__(self, backend: tokenizers.Tokenizer, source: str) -> None:
        self.backend = backend
        self.source = source
        ids = [*backend.get_vocab(with_added_tokens=True).values(), *backend.encode("").ids]
        #: 1 + the largest id the tokenizer produces (vocabulary, added and template tokens).
        self.vocab_size = 1 + max(ids, default=-1)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; with add_special_tokens the post-processor's tokens (e.g. a
        BOS) too."""
        bad = next((ch for ch in text if 0xD800 <= ord(ch) <= 0xDFFF), None)
        if bad is not None:
            raise InputError(
                f"the text contains U+{ord(bad):04X}, a lone surrogate: not valid Unicode "
                f"(was it given as bytes that are not UTF-8?)"
            )
        try:
            return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)
        except Exception as exc:  # the library raises plain Exception
            raise InputError(
                f"{self.source}: cannot tokenize the text ({_one_line(exc)}); pass --prompt-ids "
                f"instead"
            ) from None

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of token ids (special tokens skipped by default; ids the tokenizer does not
        have, negative ones included, are dropped as the library drops them)."""
        kept = [int(t) for t in ids if 0 <= int(t) < _U32]
        return self.backend.decode(kept, skip_special_tokens=skip_special_tokens)

    def token(self, tid: int) -> str | None:
        """The token string of an id (None when the tokenizer has no such id)."""
        return self.backend.id_to_token(tid) if 0 <= tid < _U32 else None

    def check_vocab(self, vocab_size: int, model: str = "the model") -> None:
        """ConfigError when a token id of the tokenizer is outside [0, vocab_size)."""
        if self.vocab_size <= vocab_size:
            return
        worst = self.vocab_size - 1
        raise ConfigError(
            f"{self.source}: token id {worst} ({self.token(worst)!r}) is outside the vocabulary "
            f"of {model} (vocab_size {vocab_size}); this tokenizer belongs to another model: "
            f"pass the checkpoint's own tokenizer.json with --tokenizer, or --prompt-ids"
        )


def load_tokenizer(path: str | Path) -> Tokenizer:
    """A tokenizer.json file as a :class:`Tokenizer` (ConfigError when missing or unreadable,
    ModelFormatError when corrupt or not a tokenizer the library reads)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(
            f"{p}: tokenizer file not found; pass --tokenizer with the checkpoint's "
            f"tokenizer.json (Hugging Face), or --prompt-ids"
        )
    try:
        text = p.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the tokenizer file ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ModelFormatError(
            f"{p}: not UTF-8 text; expected a Hugging Face tokenizer.json: pass the checkpoint's "
            f"tokenizer.json"
        ) from None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ModelFormatError(
            f"{p}: not valid JSON ({_one_line(exc)}); the file is corrupt or truncated: download "
            f"the checkpoint's tokenizer.json again"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise ModelFormatError(
            f"{p}: no 'model' object, so not a Hugging Face tokenizer.json (tokenizer_config.json "
            f"and vocab files are not enough): pass the checkpoint's tokenizer.json"
        )
    kind = data["model"].get("type")
    if kind is not None and kind not in MODEL_TYPES:
        raise ModelFormatError(
            f"{p}: model type {kind!r} is not supported; supported: {', '.join(MODEL_TYPES)}; "
            f"pass --prompt-ids instead"
        )
    try:
        import tokenizers
    except ImportError:
        raise ConfigError(
            "the tokenizers package is not installed: pip install 'tokenizers>=0.23.1,<0.24' "
            "(a dependency of colibri-moe), or pass --prompt-ids"
        ) from None
    try:
        backend = tokenizers.Tokenizer.from_str(text)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # plain Exception, or a Rust panic (a BaseException)
        raise ModelFormatError(
            f"{p}: tokenizers {tokenizers.__version__} cannot read it ({_one_line(exc)}); the "
            f"file is corrupt or of a newer format: download the checkpoint's tokenizer.json "
            f"again, or pass --prompt-ids"
        ) from None
    backend.no_truncation()
    backend.no_padding()
    return Tokenizer(backend, str(p))
