"""colibri.frontends.tokenizer (tokenizer.json through the `tokenizers` library) vs
transformers' PreTrainedTokenizerFast, on tokenizers of every kind a supported checkpoint ships,
trained here offline on Python's own sources: byte-level BPE (GPT-2, Llama 3 style),
SentencePiece-style BPE with byte fallback (Llama 2 / Mixtral style, a Prepend + Replace
normalizer or a Metaspace pre-tokenizer) and Unigram. Also one-line errors for missing, corrupt,
unsupported and wrong-vocabulary files, and `colibri run --prompt TEXT` on a tiny Mixtral."""

from __future__ import annotations

import json
import random
import string
import textwrap
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from colibri.errors import ConfigError, InputError, ModelFormatError
from colibri.frontends.tokenizer import load_tokenizer
from conftest import run_cli
from hf_tiny import require_package

#: A few KB of text that is on every machine with Python: two stdlib modules' sources, plus
#: lines with accents, CJK and emoji so that some non-ASCII tokens are learnt.
EXTRA = ["héllo café naïve Ångström 東京 日本語 😀🎉", "it's we're DON'T 12345 3.14"]
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]
#: Non-ASCII, emoji, whitespace runs, bytes that are in no vocabulary (control characters,
#: unseen scripts: byte fallback, <unk> or byte-level), special tokens, edge cases.
STRINGS = [
    "",
    " ",
    "  ",
    "\n",
    "hello",
    " hello",
    "hello ",
    "Hello, world... (ok?) [yes] {no} <a> #1 $2 %3 @4 ^5 &6 *7",
    "don't it's 'S I'll we've",
    "12345678 3.14159 1,000,000 -42 0x1F",
    "a  b   c    d",
    "a\n\nb\r\n\r\nc",
    "\t\tx\t",
    "   leading",
    "trailing   ",
    "  both  ",
    " \n ",
    "héllo café naïve",
    "e\u0301 n\u0303o Å Å ﬁ x² ½",
    "東京 日本語の文章 龘",
    "😀🎉 emoji 👍🏽 👨\u200d👩\u200d👧",
    "Привет мир Γειά σου שלום مرحبا नमस्ते",
    "\x00x\x7f\x1c a\x85b a\u00a0b a\u3000b",
    "def f(x):\n    return x  # comment\n",
    "<s> hi </s>",
    "x<unk>y<|endoftext|>z",
    "<0x41> ▁ ▁▁x",
]
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
    r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
KINDS = ("gpt2", "llama3", "llama2", "mixtral", "unigram")
#: Kinds whose decode(encode(s)) is s (its NFC for llama3).
LOSSLESS = ("gpt2", "llama3", "llama2")
#: Text those kinds cannot give back: special tokens (skipped), SentencePiece's ▁ (a space).
LOSSY_TEXT = ("<s>", "</s>", "<unk>", "<|endoftext|>", "<|begin_of_text|>", "▁")


def _require_tokenizers() -> Any:
    return require_package("tokenizers", "the tokenizer tests")


def _corpus() -> list[str]:
    text = Path(string.__file__).read_text(encoding="utf-8")
    text += Path(textwrap.__file__).read_text(encoding="utf-8")[:6000]
    return [line for line in text.splitlines() if line.strip()] + EXTRA * 3


def _fuzz(rng: random.Random, n: int) -> list[str]:
    pieces = [*"abcXYZ 019'\n\t.,!?-_/()", "é", "東", "😀", "\u00a0", "\u3000", "²", "\x1c"]
    pieces += ["<s>", "</s>", "<unk>", "  ", "\r\n", "e\u0301", "▁", "<0x41>", "def ", "Ж"]
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 20))) for _ in range(n)]


def _build(kind: str, corpus: list[str]) -> dict[str, Any]:
    """A tokenizer.json (as a dict) of `kind`, trained on `corpus` with tokenizers' trainers."""
    tk = _require_tokenizers()
    pre, dec, norm, proc = tk.pre_tokenizers, tk.decoders, tk.normalizers, tk.processors
    if kind in ("gpt2", "llama3"):
        tok = tk.Tokenizer(tk.models.BPE())
        if kind == "gpt2":
            tok.pre_tokenizer = pre.ByteLevel(add_prefix_space=False)
        else:
            tok.normalizer = norm.NFC()
            tok.pre_tokenizer = pre.Sequence(
                [
                    pre.Split(tk.Regex(LLAMA3_SPLIT), "isolated"),
                    pre.ByteLevel(add_prefix_space=False, use_regex=False),
                ]
            )
        tok.decoder = dec.ByteLevel()
        specials = ["<|endoftext|>", "<|begin_of_text|>"]
        trainer = tk.trainers.BpeTrainer(
            vocab_size=500,
            special_tokens=specials,
            initial_alphabet=pre.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(corpus, trainer)
        if kind == "llama3":
            tok.post_processor = proc.Sequence(
                [
                    proc.ByteLevel(),
                    proc.TemplateProcessing(
                        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 1)]
                    ),
                ]
            )
        else:
            tok.post_processor = proc.ByteLevel()
        return dict(json.loads(tok.to_str()))
    if kind in ("llama2", "mixtral"):
        # SentencePiece converted: <unk> <s> </s>, then the 256 <0x..> byte tokens in the model's
        # vocabulary (not added tokens), byte fallback, fused unknowns.
        tok = tk.Tokenizer(tk.models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
        if kind == "llama2":
            tok.normalizer = norm.Sequence([norm.Prepend("▁"), norm.Replace(" ", "▁")])
        else:
            tok.pre_tokenizer = pre.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        tok.decoder = dec.Sequence(
            [dec.Replace("▁", " "), dec.ByteFallback(), dec.Fuse(), dec.Strip(" ", 1, 0)]
        )
        trainer = tk.trainers.BpeTrainer(
            vocab_size=600,
            special_tokens=["<unk>", "<s>", "</s>", *BYTE_TOKENS],
            show_progress=False,
        )
        tok.train_from_iterator(corpus, trainer)
        tok.post_processor = proc.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
        data = dict(json.loads(tok.to_str()))
        data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] not in BYTE_TOKENS]
        return data
    assert kind == "unigram"
    tok = tk.Tokenizer(tk.models.Unigram())
    tok.normalizer = norm.NFKC()
    tok.pre_tokenizer = pre.Metaspace()
    tok.decoder = dec.Metaspace()
    trainer = tk.trainers.UnigramTrainer(
        vocab_size=400,
        special_tokens=["<pad>", "</s>", "<unk>"],
        unk_token="<unk>",
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    tok.post_processor = proc.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return dict(json.loads(tok.to_str()))


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tokenizers")
    corpus = _corpus()
    paths = {}
    for kind in KINDS:
        paths[kind] = root / f"{kind}.json"
        paths[kind].write_text(json.dumps(_build(kind, corpus)), encoding="utf-8")
    return paths


@pytest.mark.parametrize("kind", KINDS)
def test_ids_and_text_match_transformers(kind: str, files: dict[str, Path]) -> None:
    """Our ids are PreTrainedTokenizerFast's, and so is the decoded text (special tokens
    skipped or kept); the lossless kinds give the text back."""
    transformers = require_package("transformers", "the tokenizer tests")
    ref = transformers.PreTrainedTokenizerFast(tokenizer_file=str(files[kind]))
    ours = load_tokenizer(files[kind])
    assert ours.vocab_size == len(ref)
    for s in STRINGS + _fuzz(random.Random(kind), 200):
        ids = ours.encode(s)
        assert ids == ref.encode(s), f"{kind}: encode({s!r})"
        plain = ours.encode(s, add_special_tokens=False)
        assert plain == ref.encode(s, add_special_tokens=False), f"{kind}: {s!r} without specials"
        text = ours.decode(ids)
        assert text == ref.decode(ids, skip_special_tokens=True), f"{kind}: decode of {s!r}"
        kept = ref.decode(ids, skip_special_tokens=False)
        assert ours.decode(ids, skip_special_tokens=False) == kept, f"{kind}: {s!r} with specials"
        if kind in LOSSLESS and not any(t in s for t in LOSSY_TEXT):
            want = unicodedata.normalize("NFC", s) if kind == "llama3" else s
            assert text == want, f"{kind}: decode(encode({s!r})) = {text!r}"
    rng = random.Random(7)
    for _ in range(100):  # arbitrary ids: partial UTF-8, lone byte tokens, specials
        ids = [rng.randrange(ours.vocab_size) for _ in range(rng.randint(0, 10))]
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True), f"{kind}: {ids}"


def test_special_tokens_bytes_and_unknowns(files: dict[str, Path]) -> None:
    llama2 = load_tokenizer(files["llama2"])
    assert llama2.encode("hi")[0] == 1 and llama2.token(1) == "<s>"  # BOS from the template
    assert llama2.encode("hi", add_special_tokens=False)[0] != 1
    # A character in no vocabulary becomes its UTF-8 bytes (<0xD0> <0x96> for Ж) and back.
    body = llama2.encode("Ж", add_special_tokens=False)
    assert [llama2.token(t) for t in body][-2:] == ["<0xD0>", "<0x96>"]
    assert llama2.decode(body) == "Ж"
    unigram = load_tokenizer(files["unigram"])
    unk = unigram.encode("Ж", add_special_tokens=False)
    assert [unigram.token(t) for t in unk][-1] == "<unk>" and unigram.decode(unk) == ""
    gpt2 = load_tokenizer(files["gpt2"])
    hi = gpt2.encode("hi")
    # Ids the tokenizer does not have (a padded embedding's, negative ones) are dropped.
    assert gpt2.decode([*hi, gpt2.vocab_size, 10**12, -1, *hi]) == "hihi"
    assert gpt2.token(gpt2.vocab_size) is None and gpt2.token(-1) is None
    with pytest.raises(InputError, match="U\\+DC80, a lone surrogate"):
        gpt2.encode("abc\udc80")


def test_file_settings_never_cut_or_pad(tmp_path: Path, files: dict[str, Path]) -> None:
    data = json.loads(files["gpt2"].read_text(encoding="utf-8"))
    data["truncation"] = {"direction": "Right", "max_length": 2, "strategy": "LongestFirst"}
    data["truncation"]["stride"] = 0
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    text = "a long prompt of many words"
    assert load_tokenizer(path).encode(text) == load_tokenizer(files["gpt2"]).encode(text)


def test_vocab_size_check(files: dict[str, Path]) -> None:
    tok = load_tokenizer(files["llama2"])
    tok.check_vocab(tok.vocab_size)
    tok.check_vocab(tok.vocab_size + 100)  # padded embeddings are fine
    top = tok.vocab_size - 1
    with pytest.raises(ConfigError, match=rf"token id {top} \('.+'\) is outside the vocabulary"):
        tok.check_vocab(300, "the model")


# -- corrupt, missing and unsupported files ------------------------------------------------------


def _error(tmp_path: Path, text: str | bytes, kind: type[Exception] = ModelFormatError) -> str:
    path = tmp_path / "tokenizer.json"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    with pytest.raises(kind) as info:
        load_tokenizer(path)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg, msg
    return msg


def test_corrupt_and_unsupported_files(tmp_path: Path, files: dict[str, Path]) -> None:
    text = files["llama2"].read_text(encoding="utf-8")
    msg = _error(tmp_path, text[: len(text) // 2])
    assert "not valid JSON" in msg and "corrupt or truncated" in msg
    assert "not valid JSON" in _error(tmp_path, "")
    assert "not UTF-8 text" in _error(tmp_path, b"\xff\xfe\x00")
    assert "no 'model' object" in _error(tmp_path, "[1, 2]")
    assert "no 'model' object" in _error(tmp_path, '{"version": "1.0"}')
    msg = _error(tmp_path, '{"model": {"type": "Foo", "vocab": {}}}')
    assert "model type 'Foo' is not supported; supported: BPE, Unigram" in msg
    data = json.loads(text)
    data["model"]["merges"] = [["a", "b", "c"]]
    msg = _error(tmp_path, json.dumps(data))
    assert "tokenizers 0." in msg and "cannot read it" in msg and "download" in msg
    data = json.loads(text)
    data["pre_tokenizer"] = {"type": "NoSuchPreTokenizer"}
    assert "cannot read it" in _error(tmp_path, json.dumps(data))
    missing = tmp_path / "nope.json"
    with pytest.raises(ConfigError, match="nope.json: tokenizer file not found; pass --tok"):
        load_tokenizer(missing)
    with pytest.raises(ConfigError, match="tokenizer file not found"):
        load_tokenizer(tmp_path)  # a directory


# -- colibri run --prompt with a tokenizer.json --------------------------------------------------


def _printed(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")  # run_cli reads text mode


def test_cli_prompt_with_tokenizers(tmp_path: Path, files: dict[str, Path]) -> None:
    """A Mixtral-style tokenizer.json in the checkpoint: the prompt is its encoding (BOS
    included), the ids are the reference model's greedy continuation, the text line is their
    decoding; --tokenizer FILE (a byte-level one) wins and decodes --prompt-ids runs too."""
    from hf_tiny import make_model, require_torch, save_model

    require_torch()
    from colibri.frontends.hf_model import load_hf_transformer
    from colibri.reference.transformer import generate

    sp = load_tokenizer(files["mixtral"])
    byte_level = load_tokenizer(files["gpt2"])
    vocab = max(sp.vocab_size, byte_level.vocab_size)
    ckpt = save_model(make_model("mixtral", seed=21, vocab_size=vocab), tmp_path / "ck")
    (ckpt / "tokenizer.json").write_bytes(files["mixtral"].read_bytes())
    model = load_hf_transformer(ckpt)
    gen = tmp_path / "gen"
    run_cli("generate", str(ckpt), "--out", str(gen), "--max-context", "48")
    text = "Hello wörld!  def 東京 😀"
    prompt = sp.encode(text)
    assert prompt[0] == 1  # <s>
    proc = run_cli("run", str(gen), "--prompt", text, "--max-new-tokens", "8")
    new = generate(model, prompt, 8)[len(prompt) :]
    assert proc.stdout.endswith(f"{' '.join(map(str, new))}\n{_printed(sp.decode(new))}\n")

    proc = run_cli(
        "run",
        str(gen),
        "--prompt",
        text,
        "--tokenizer",
        str(files["gpt2"]),
        "--max-new-tokens",
        "4",
    )
    new = generate(model, byte_level.encode(text), 4)[-4:]
    assert proc.stdout.endswith(f"{' '.join(map(str, new))}\n{_printed(byte_level.decode(new))}\n")
    proc = run_cli(
        "run",
        str(gen),
        "--prompt-ids",
        "3,4,5",
        "--tokenizer",
        str(files["gpt2"]),
        "--max-new-tokens",
        "4",
    )
    new = generate(model, [3, 4, 5], 4)[3:]
    assert proc.stdout.endswith(f"{' '.join(map(str, new))}\n{_printed(byte_level.decode(new))}\n")


def test_cli_tokenizer_errors(tmp_path: Path, files: dict[str, Path]) -> None:
    from hf_tiny import make_model, require_torch, save_model

    require_torch()
    ckpt = save_model(make_model("mixtral", seed=22, vocab_size=300), tmp_path / "ck")
    gen = tmp_path / "gen"
    run_cli("generate", str(ckpt), "--out", str(gen), "--max-context", "24")

    def fails(*args: str) -> str:
        proc = run_cli("run", str(gen), "--prompt", "hi", *args, check=False)
        assert proc.returncode == 1 and proc.stderr.startswith("colibri: error: "), proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
        return proc.stderr

    # More ids than the model: the wrong tokenizer, said before anything runs.
    msg = fails("--tokenizer", str(files["unigram"]))
    assert "is outside the vocabulary of the generated model (vocab_size 300)" in msg
    assert "tokenizer file not found" in fails("--tokenizer", str(tmp_path / "x.json"))
    # A corrupt tokenizer.json in the checkpoint is an error, not a silent byte fallback.
    (ckpt / "tokenizer.json").write_text(files["gpt2"].read_text(encoding="utf-8")[:100])
    assert "corrupt or truncated" in fails()
    # Without a tokenizer, vocab 300 >= 256: one token per UTF-8 byte still works.
    (ckpt / "tokenizer.json").unlink()
    from colibri.frontends.hf_model import load_hf_transformer
    from colibri.reference.transformer import generate

    proc = run_cli("run", str(gen), "--prompt", "hé", "--max-new-tokens", "2")
    new = generate(load_hf_transformer(ckpt), list("hé".encode()), 2)[-2:]
    assert " ".join(map(str, new)) in proc.stdout.splitlines()
