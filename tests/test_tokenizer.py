"""colibri.tokenizer (Hugging Face byte-level BPE tokenizer.json, no tokenizers dependency) vs
the `tokenizers` library itself, on tokenizers trained here offline: encode / decode on fixed
and random strings, merge order, added and special tokens, Split pre-tokenizers (Qwen2 and
Llama 3 patterns), post-processors; clear errors for corrupt or unsupported files; and
`colibri run --prompt TEXT` on a tiny Mixtral with a tokenizer.json in its checkpoint."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

import pytest
from colibri.errors import ConfigError, InputError
from colibri.frontends.tokenizer import load_tokenizer
from conftest import run_cli
from hf_tiny import require_package

CORPUS = [
    "Hello world! Don't stop believing. 12345 numbers and 3.14 pi.",
    "The quick brown fox jumps over the lazy dog.\n\tTabs  and   spaces",
    "héllo café naïve Ångström 東京 日本語 😀🎉",
    "it's we're they've I'm you'll he'd SHE'S",
    "x² ½ Ⅻ ٣٤ ① snake_case camelCase URL/path//x",
] * 20

#: Fixed strings: ASCII words, punctuation, contractions, digit runs, whitespace runs, leading and
#: trailing whitespace, accented Latin (composed and combining), CJK, emoji, other scripts,
#: White_Space vs Python's \s (U+001C is not White_Space), special tokens, edge cases.
STRINGS = [
    "",
    " ",
    "  ",
    "\n",
    "hello",
    " hello",
    "hello ",
    "Hello world!",
    "Hello, world... (ok?) [yes] {no} <a> #1 $2 %3 @4 ^5 &6 *7",
    "don't",
    "DON'T stop",
    "it's 'S 's'",
    "''",
    "I'll we've they're he'd you'LL",
    "12345678",
    "3.14159 1,000,000 -42 +7 0x1F",
    "a  b   c    d",
    "a\n\nb",
    "Hello\r\n\r\nWorld",
    "\t\tx\t",
    " \n ",
    "   leading",
    "trailing   ",
    "  both  ",
    "héllo café naïve",
    "e\u0301 n\u0303o Å Å",
    "東京 日本語の文章",
    "😀🎉 emoji 👍🏽 👨‍👩‍👧",
    "x² ½ Ⅻ ٣٤ ① ﬁ",
    "Ǆ ǅ ǆ ſ",
    "Привет мир Γειά σου שלום مرحبا नमस्ते",
    "a\x1cb a \x1c b a  \x1c\x1c b",
    "a\x85b a\u00a0b a\u2000 b a\u200bb \u180e x\u3000y",
    "\x00x\x7f",
    "snake_case camelCase HELLOworld",
    "a/b//c",
    "<|endoftext|>",
    "word<|endoftext|>word",
    "hi <|endoftext|> there",
    "x <pad> y",
    "hello<sep>world",
    "x  foo bar  y",
    "<sep><sep>",
]
SPECIALS = ["<|endoftext|>", "<pad>"]
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
    r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _require_tokenizers() -> Any:
    return require_package("tokenizers", "the tokenizer tests (tokenizers is their reference)")


def _fuzz(rng: random.Random, n: int) -> list[str]:
    pieces = [*"abcXYZ 019'\n\t.,!?-_/", "é", "東", "😀", "\u00a0", "\u3000", "²", "\x1c"]
    pieces += ["<sep>", "<|endoftext|>", "foo bar", "'s", "'LL", "  ", "\r\n", "e\u0301"]
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 24))) for _ in range(n)]


def _train(
    pre: Any = None,
    normalizer: Any = None,
    post: Any = None,
    added: list[Any] | None = None,
    model: Any = None,
    specials: list[str] = SPECIALS,
    alphabet: bool = True,
    **trainer: Any,
) -> dict[str, Any]:
    """A BPE tokenizer trained on CORPUS (vocab ~400), as its tokenizer.json dict."""
    tk = _require_tokenizers()
    tok = tk.Tokenizer(model or tk.models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre or tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    if alphabet:
        trainer["initial_alphabet"] = tk.pre_tokenizers.ByteLevel.alphabet()
    bpe = tk.trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, show_progress=False, **trainer
    )
    tok.train_from_iterator(CORPUS, bpe)
    if post is not None:
        tok.post_processor = post
    if added:
        tok.add_tokens(added)
    return dict(json.loads(tok.to_str()))


def _variants() -> dict[str, dict[str, Any]]:
    tk = _require_tokenizers()
    pre, proc, norm = tk.pre_tokenizers, tk.processors, tk.normalizers

    def split(pattern: str, behavior: str = "isolated", invert: bool = False) -> Any:
        return pre.Sequence(
            [
                pre.Split(tk.Regex(pattern), behavior, invert=invert),
                pre.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )

    added = [
        tk.AddedToken("<sep>", special=False),
        tk.AddedToken("foo bar", lstrip=True, rstrip=True),
    ]
    template = proc.TemplateProcessing(
        single="<|endoftext|> $A <pad>", special_tokens=[("<|endoftext|>", 0), ("<pad>", 1)]
    )
    out = {
        "gpt2": _train(),
        "prefix_space": _train(pre.ByteLevel(add_prefix_space=True), added=added),
        "special_tokens": _train(
            post=template,
            added=[
                tk.AddedToken("<sep>", special=True, normalized=False),
                tk.AddedToken("word", single_word=True),
            ],
        ),
        "qwen2_nfc": _train(
            split(QWEN2_SPLIT),
            norm.NFC(),
            proc.ByteLevel(),
            [tk.AddedToken("<|im_start|>", special=True, normalized=False)],
        ),
        "llama3_bos": _train(
            split(LLAMA3_SPLIT),
            post=proc.Sequence(
                [
                    proc.ByteLevel(),
                    proc.TemplateProcessing(
                        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 0)]
                    ),
                ]
            ),
        ),
        "no_regex_roberta": _train(
            pre.ByteLevel(add_prefix_space=True, use_regex=False),
            norm.Sequence([norm.NFKC()]),
            proc.RobertaProcessing(("</s>", 2), ("<s>", 1)),
            specials=["<pad>", "<s>", "</s>"],
        ),
        "subword_affixes": _train(
            model=tk.models.BPE(continuing_subword_prefix="##", end_of_word_suffix="</w>"),
            continuing_subword_prefix="##",
            end_of_word_suffix="</w>",
        ),
        "unk_fused": _train(
            model=tk.models.BPE(unk_token="<unk>", fuse_unk=True),
            specials=["<unk>"],
            alphabet=False,
        ),
        "no_unk": _train(alphabet=False),
    }
    for behavior in ("removed", "isolated", "merged_with_previous", "merged_with_next"):
        for invert in (False, True):
            out[f"split_{behavior}_{invert}"] = _train(split(r"\s+|\p{P}", behavior, invert))
    out["split_contiguous"] = _train(split(r"\s+|\p{P}", "contiguous"))
    qwen = out["qwen2_nfc"]
    out["ignore_merges"] = copy.deepcopy(qwen)
    out["ignore_merges"]["model"]["ignore_merges"] = True
    # Merge lists out of training order: the library's priority queue decides, not a rescan.
    out["reversed_merges"] = copy.deepcopy(qwen)
    out["reversed_merges"]["model"]["merges"].reverse()
    out["shuffled_merges"] = copy.deepcopy(qwen)
    random.Random(1).shuffle(out["shuffled_merges"]["model"]["merges"])
    # An added token whose id in the file is not the one the library gives it.
    out["added_id_mismatch"] = copy.deepcopy(out["prefix_space"])
    for t in out["added_id_mismatch"]["added_tokens"]:
        if t["content"] == "<sep>":
            t["id"] += 50
    return out


@pytest.fixture(scope="module")
def variants(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tokenizers")
    paths = {}
    for name, data in _variants().items():
        paths[name] = root / f"{name}.json"
        paths[name].write_text(json.dumps(data), encoding="utf-8")
    return paths


VARIANT_NAMES = [
    "gpt2",
    "prefix_space",
    "special_tokens",
    "qwen2_nfc",
    "llama3_bos",
    "no_regex_roberta",
    "subword_affixes",
    "unk_fused",
    "no_unk",
    *(
        f"split_{b}_{i}"
        for b in ("removed", "isolated", "merged_with_previous", "merged_with_next")
        for i in (False, True)
    ),
    "split_contiguous",
    "ignore_merges",
    "reversed_merges",
    "shuffled_merges",
    "added_id_mismatch",
]


@pytest.mark.parametrize("name", VARIANT_NAMES)
def test_encode_decode_match_tokenizers(name: str, variants: dict[str, Path]) -> None:
    tk = _require_tokenizers()
    ref = tk.Tokenizer.from_file(str(variants[name]))
    ours = load_tokenizer(variants[name])
    assert ours.vocab_size == ref.get_vocab_size()
    strings = STRINGS + _fuzz(random.Random(name), 600)
    for s in strings:
        ids = ours.encode(s)
        assert ids == ref.encode(s).ids, f"{name}: encode({s!r})"
        assert ours.decode(ids) == ref.decode(ids), f"{name}: decode(encode({s!r}))"
        assert ours.decode(ids, False) == ref.decode(ids, skip_special_tokens=False), s
        assert (
            ours.encode(s, add_special_tokens=False) == ref.encode(s, add_special_tokens=False).ids
        )
    rng = random.Random(7)
    for _ in range(300):  # arbitrary id sequences: partial UTF-8, special tokens, merges
        ids = [rng.randrange(ours.vocab_size) for _ in range(rng.randint(0, 10))]
        assert ours.decode(ids) == ref.decode(ids), ids


def test_roundtrip_and_known_ids(variants: dict[str, Path]) -> None:
    gpt2 = load_tokenizer(variants["gpt2"])
    for s in STRINGS + _fuzz(random.Random(3), 300):
        if "<|endoftext|>" not in s and "<pad>" not in s:  # special tokens decode to nothing
            assert gpt2.decode(gpt2.encode(s)) == s, s
    qwen = load_tokenizer(variants["qwen2_nfc"])
    assert qwen.decode(qwen.encode("Ångström café")) == "Ångström café"
    # The prefix space of add_prefix_space=True stays in the text, as in the library.
    prefixed = load_tokenizer(variants["prefix_space"])
    assert prefixed.decode(prefixed.encode("hello")) == " hello"
    # Special tokens: their id, and the template's BOS / EOS around the text.
    special = load_tokenizer(variants["special_tokens"])
    body = special.encode("hi", add_special_tokens=False)
    assert special.encode("hi") == [0, *body, 1]
    assert special.encode("<sep>", add_special_tokens=False) == [special.added["<sep>"]]
    assert special.decode([0, *body, 1]) == "hi"
    assert special.decode([0, *body], skip_special_tokens=False) == "<|endoftext|>hi"


def test_unknown_ids_decode_to_replacement_character(variants: dict[str, Path]) -> None:
    """Documented difference: the library drops ids it does not know, we show U+FFFD."""
    tok = load_tokenizer(variants["gpt2"])
    hi = tok.encode("hi")
    assert tok.decode([*hi, tok.vocab_size, 10**9, -1, *hi]) == "hi\ufffd\ufffd\ufffdhi"
    assert tok.token(tok.vocab_size) is None


def test_vocab_size_check(variants: dict[str, Path]) -> None:
    tok = load_tokenizer(variants["prefix_space"])
    tok.check_vocab(tok.vocab_size)
    tok.check_vocab(tok.vocab_size + 100)  # padded embeddings are fine
    top = tok.vocab_size - 1
    with pytest.raises(ConfigError, match=rf"token id {top} \('foo bar'\) is outside the vocab"):
        tok.check_vocab(300, "the model")


def test_invalid_text_is_an_input_error(variants: dict[str, Path]) -> None:
    tok = load_tokenizer(variants["gpt2"])
    with pytest.raises(InputError, match="U\\+DC80, a lone surrogate"):
        tok.encode("abc\udc80")


# -- corrupt and unsupported files ---------------------------------------------------------------


def _error(tmp_path: Path, data: Any, raw: str | None = None) -> str:
    path = tmp_path / "tokenizer.json"
    path.write_text(raw if raw is not None else json.dumps(data), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_tokenizer(path)
    return str(info.value)


def test_corrupt_files(tmp_path: Path, variants: dict[str, Path]) -> None:
    text = variants["gpt2"].read_text(encoding="utf-8")
    good = json.loads(text)
    msg = _error(tmp_path, None, text[: len(text) // 2])
    assert "not valid JSON" in msg and "corrupt or truncated" in msg
    assert "expected a JSON object" in _error(tmp_path, [1, 2])
    assert "no 'model' object" in _error(tmp_path, {"version": "1.0"})
    d = copy.deepcopy(good)
    del d["model"]["merges"]
    assert "model.merges is missing; a BPE model needs its merges" in _error(tmp_path, d)
    d = copy.deepcopy(good)
    d["model"]["merges"] = d["model"]["merges"][:5] + ["Ġ zzz"]
    assert "merge 6 ('Ġ' + 'zzz') uses 'zzz', which is not in model.vocab" in _error(tmp_path, d)
    d["model"]["merges"] = ["a b c"]
    assert "merge 1 ('a b c') is not a pair" in _error(tmp_path, d)
    d = copy.deepcopy(good)
    d["model"]["vocab"]["zzz"] = 5
    assert "gives id 5 to both" in _error(tmp_path, d)
    d = copy.deepcopy(good)
    d["model"]["vocab"]["zzz"] = -3
    assert "must be a token id (an integer >= 0), got -3" in _error(tmp_path, d)
    d = copy.deepcopy(good)
    d["model"]["dropout"] = 0.1
    assert "dropout 0.1 makes encoding random" in _error(tmp_path, d)
    missing = tmp_path / "nope.json"
    with pytest.raises(InputError, match="nope.json: tokenizer file not found"):
        load_tokenizer(missing)
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        load_tokenizer(tmp_path / "bin.json")


def test_unsupported_tokenizers(tmp_path: Path, variants: dict[str, Path]) -> None:
    good = json.loads(variants["gpt2"].read_text(encoding="utf-8"))

    def with_(**parts: Any) -> dict[str, Any]:
        d = copy.deepcopy(good)
        d.update(parts)
        return d

    wordpiece = {"type": "WordPiece", "vocab": {"a": 0}, "unk_token": "[UNK]"}
    msg = _error(tmp_path, with_(model=wordpiece))
    assert "model type 'WordPiece' (BERT-style) is not supported" in msg
    assert "supported: byte-level BPE tokenizers" in msg and "--prompt-ids" in msg
    msg = _error(tmp_path, with_(model={"type": "Unigram", "vocab": [["a", 0.0]]}))
    assert "model type 'Unigram' (SentencePiece unigram, e.g. T5) is not supported" in msg
    metaspace = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first"}
    msg = _error(tmp_path, with_(pre_tokenizer=metaspace))
    assert "pre_tokenizer 'Metaspace' is SentencePiece-style (Mixtral" in msg
    mixtral_normalizer = {
        "type": "Sequence",
        "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        ],
    }
    msg = _error(tmp_path, with_(normalizer=mixtral_normalizer, pre_tokenizer=None))
    assert "normalizer 'Prepend' is SentencePiece-style" in msg
    msg = _error(tmp_path, with_(normalizer={"type": "Lowercase"}))
    assert "normalizer 'Lowercase' is not supported (it changes the text)" in msg
    assert "NFC, NFD, NFKC, NFKD" in msg
    msg = _error(tmp_path, with_(pre_tokenizer={"type": "Whitespace"}))
    assert "pre_tokenizer 'Whitespace' is not supported" in msg
    msg = _error(tmp_path, with_(pre_tokenizer=None))
    assert "the pre_tokenizer has no ByteLevel step" in msg
    msg = _error(tmp_path, with_(decoder={"type": "WordPiece", "prefix": "##"}))
    assert "decoder 'WordPiece' is not supported" in msg
    assert "no decoder" in _error(tmp_path, with_(decoder=None))
    msg = _error(tmp_path, with_(post_processor={"type": "Foo"}))
    assert "post_processor 'Foo' is not supported" in msg
    split = {
        "type": "Sequence",
        "pretokenizers": [
            {
                "type": "Split",
                "pattern": {"Regex": r"\w+"},
                "behavior": "Isolated",
                "invert": False,
            },
            {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False},
        ],
    }
    msg = _error(tmp_path, with_(pre_tokenizer=split))
    assert r"regex '\\w+': the escape \w is not supported" in msg
    split["pretokenizers"][0]["pattern"] = {"Regex": r"\p{Han}+"}
    msg = _error(tmp_path, with_(pre_tokenizer=split))
    assert r"property \p{Han} (only general categories) is not supported" in msg
    split["pretokenizers"][0]["pattern"] = {"Regex": r"a++"}
    assert "a possessive quantifier is not supported" in _error(
        tmp_path, with_(pre_tokenizer=split)
    )


# -- colibri run --prompt with a tokenizer.json --------------------------------------------------


def test_cli_prompt_with_checkpoint_tokenizer(tmp_path: Path, variants: dict[str, Path]) -> None:
    """tokenizer.json in the checkpoint: the prompt is our encoding (= the library's), the ids
    are the reference model's greedy continuation, the text line is their decoding."""
    from hf_tiny import make_model, require_torch, save_model

    require_torch()
    from colibri.frontends.hf_model import load_hf_transformer
    from colibri.reference.transformer import generate

    tk = _require_tokenizers()
    tok_path = variants["llama3_bos"]  # Split + ByteLevel, BOS from the template
    tok = load_tokenizer(tok_path)
    ref = tk.Tokenizer.from_file(str(tok_path))
    other = tmp_path / "other.json"
    other.write_bytes(variants["gpt2"].read_bytes())
    plain = load_tokenizer(other)
    vocab = max(tok.vocab_size, plain.vocab_size)
    ckpt = save_model(make_model("mixtral", seed=21, vocab_size=vocab), tmp_path / "ck")
    (ckpt / "tokenizer.json").write_bytes(tok_path.read_bytes())
    model = load_hf_transformer(ckpt)
    gen = tmp_path / "gen"
    run_cli("generate", str(ckpt), "--out", str(gen), "--max-context", "48")
    text = "Hello world! Don't stop 12345 café."
    prompt = tok.encode(text)
    assert prompt == ref.encode(text).ids and prompt[0] == 0  # BOS
    proc = run_cli("run", str(gen), "--prompt", text, "--max-new-tokens", "8")
    new = generate(model, prompt, 8)[len(prompt) :]
    decoded = tok.decode(new)
    assert decoded == ref.decode(new)
    printed = decoded.replace("\r\n", "\n").replace("\r", "\n")  # run_cli reads text mode
    assert proc.stdout.endswith(f"{' '.join(map(str, new))}\n{printed}\n"), proc.stdout

    # --tokenizer FILE wins over the checkpoint's, and decodes --prompt-ids runs too.
    proc = run_cli(
        "run", str(gen), "--prompt", text, "--tokenizer", str(other), "--max-new-tokens", "4"
    )
    ids_line = " ".join(map(str, generate(model, plain.encode(text), 4)[-4:]))
    assert ids_line in proc.stdout.splitlines()
    proc = run_cli(
        "run",
        str(gen),
        "--prompt-ids",
        "3,4,5",
        "--tokenizer",
        str(tok_path),
        "--max-new-tokens",
        "4",
    )
    new = generate(model, [3, 4, 5], 4)[3:]
    shown = tok.decode(new).replace("\r\n", "\n").replace("\r", "\n")
    assert proc.stdout.endswith(f"{' '.join(map(str, new))}\n{shown}\n")


def test_cli_tokenizer_errors(tmp_path: Path, variants: dict[str, Path]) -> None:
    from hf_tiny import make_model, require_torch, save_model

    require_torch()
    ckpt = save_model(make_model("mixtral", seed=22, vocab_size=300), tmp_path / "ck")
    gen = tmp_path / "gen"
    run_cli("generate", str(ckpt), "--out", str(gen), "--max-context", "24")
    # A tokenizer with more ids than the model: the wrong tokenizer, said before running.
    bad = run_cli(
        "run", str(gen), "--prompt", "hi", "--tokenizer", str(variants["gpt2"]), check=False
    )
    assert bad.returncode == 1 and "is outside the vocabulary of the generated model" in bad.stderr
    assert "Traceback" not in bad.stderr
    # An unsupported tokenizer.json in the checkpoint is an error, not a silent byte fallback.
    data = json.loads(variants["gpt2"].read_text(encoding="utf-8"))
    data["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first"}
    (ckpt / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    bad = run_cli("run", str(gen), "--prompt", "hi", check=False)
    assert bad.returncode == 1 and "SentencePiece-style" in bad.stderr
    (ckpt / "tokenizer.json").write_text(json.dumps(data)[:100], encoding="utf-8")
    bad = run_cli("run", str(gen), "--prompt", "hi", check=False)
    assert bad.returncode == 1 and "corrupt or truncated" in bad.stderr
    bad = run_cli(
        "run", str(gen), "--prompt", "hi", "--tokenizer", str(tmp_path / "x"), check=False
    )
    assert bad.returncode == 1 and "tokenizer file not found" in bad.stderr
    # Without a tokenizer, vocab 300 >= 256: the byte-level fallback still works.
    (ckpt / "tokenizer.json").unlink()
    from colibri.frontends.hf_model import load_hf_transformer
    from colibri.reference.transformer import generate

    proc = run_cli("run", str(gen), "--prompt", "hé", "--max-new-tokens", "2")
    new = generate(load_hf_transformer(ckpt), list("hé".encode()), 2)[-2:]
    assert " ".join(map(str, new)) in proc.stdout.splitlines()
