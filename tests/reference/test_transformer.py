"""Whole decoder-only MoE transformers: numpy reference vs transformers, KV cache, sampling."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from colibri.errors import ConfigError, InputError, ShapeError
from colibri.frontends.hf_model import load_hf_transformer
from colibri.reference.transformer import KVCache, forward, generate, sample_next
from hf_tiny import (
    MODEL_CASES,
    N_NEW_TOKENS,
    assert_logits_close,
    assert_same_tokens,
    hf_reference,
    make_model,
    require_torch,
    save_model,
    short_prompt,
)


@pytest.fixture(autouse=True)
def _torch() -> None:
    require_torch()


def _prompt(case: int, vocab: int) -> list[int]:
    return short_prompt(100 + case, vocab)


@pytest.mark.parametrize("case", range(len(MODEL_CASES)))
def test_logits_and_greedy_generation_match_transformers(tmp_path: Path, case: int) -> None:
    arch, overrides = MODEL_CASES[case]
    model = make_model(arch, seed=200 + case, **overrides)
    ours = load_hf_transformer(save_model(model, tmp_path / "ckpt"))
    vocab = model.config.vocab_size
    prompt = _prompt(case, vocab)

    ref, hf_new = hf_reference(model, prompt, N_NEW_TOKENS)
    assert_logits_close(forward(ours, prompt), ref, f"{arch} case {case}", "ours")
    ours_ids = generate(ours, prompt, N_NEW_TOKENS)
    assert len(ours_ids) == len(prompt) + N_NEW_TOKENS
    assert_same_tokens(ours_ids, prompt + hf_new, f"{arch} case {case}", "ours")


def test_kv_cache_matches_full_pass(tmp_path: Path) -> None:
    model = make_model("qwen2_moe", seed=7, num_hidden_layers=3, mlp_only_layers=[0])
    ours = load_hf_transformer(save_model(model, tmp_path / "q"))
    ids = [1, 9, 4, 33, 2, 8, 60, 5]
    full = forward(ours, ids)
    cache = KVCache()
    parts = [forward(ours, ids[:3], cache), forward(ours, ids[3:4], cache)]
    parts += [forward(ours, [t], cache) for t in ids[4:]]
    assert cache.length == len(ids)
    assert np.max(np.abs(np.concatenate(parts) - full)) < 1e-12


def test_tied_checkpoint_has_no_lm_head(tmp_path: Path) -> None:
    path = save_model(make_model("olmoe", seed=1, tie_word_embeddings=True), tmp_path / "o")
    ours = load_hf_transformer(path)
    assert ours.config.tie_word_embeddings and ours.lm_head is ours.embed


# -- sampling ----------------------------------------------------------------------------------


def test_sampling_is_seeded_and_greedy_limits_agree(tmp_path: Path) -> None:
    ours = load_hf_transformer(save_model(make_model("mixtral", seed=2), tmp_path / "m"))
    prompt = [5, 6, 7]
    kw = {"temperature": 0.9, "top_k": 10, "top_p": 0.9}
    a = generate(ours, prompt, 12, seed=42, **kw)  # type: ignore[arg-type]
    b = generate(ours, prompt, 12, seed=42, **kw)  # type: ignore[arg-type]
    assert a == b
    assert any(generate(ours, prompt, 12, seed=s, **kw) != a for s in range(43, 48))  # type: ignore[arg-type]
    greedy = generate(ours, prompt, 12)
    assert generate(ours, prompt, 12, temperature=1.5, top_k=1, seed=3) == greedy
    assert generate(ours, prompt, 12, temperature=1.5, top_p=1e-9, seed=3) == greedy
    stop = greedy[len(prompt) + 2]
    assert generate(ours, prompt, 12, eos_token_id=stop)[-1] == stop


def test_sample_next_distribution() -> None:
    logits = np.array([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    rng = np.random.default_rng(0)
    n = 40000
    draws = np.array([sample_next(logits, rng, temperature=0.7) for _ in range(n)])
    p = np.exp(logits / 0.7)
    p /= p.sum()
    freq = np.bincount(draws, minlength=6) / n
    assert np.max(np.abs(freq - p)) < 4 * np.sqrt(p.max() / n)
    # top_k = 3: only the three best ids; top_p = 0.8: the smallest set reaching 0.8.
    topk = {sample_next(logits, rng, temperature=1.0, top_k=3) for _ in range(2000)}
    assert topk == {0, 1, 2}
    q = np.exp(logits) / np.exp(logits).sum()
    need = int(np.searchsorted(np.cumsum(q), 0.8) + 1)
    topp = {sample_next(logits, rng, temperature=1.0, top_p=0.8) for _ in range(2000)}
    assert topp == set(range(need))
    assert sample_next(np.array([1.0, 3.0, 3.0])) == 1  # greedy ties: lower id


def test_sampling_argument_errors() -> None:
    with pytest.raises(InputError, match="top_p"):
        sample_next(np.zeros(3), np.random.default_rng(0), temperature=1.0, top_p=0.0)
    with pytest.raises(InputError, match="needs a random generator"):
        sample_next(np.zeros(3), None, temperature=1.0)


# -- errors ------------------------------------------------------------------------------------


def test_token_out_of_vocabulary(tmp_path: Path) -> None:
    ours = load_hf_transformer(save_model(make_model("mixtral", seed=3), tmp_path / "m"))
    with pytest.raises(InputError, match=r"token id 64 is outside the vocabulary \(0..63\)"):
        forward(ours, [1, 64])
    with pytest.raises(InputError, match="prompt is empty"):
        generate(ours, [], 3)


def test_unsupported_rope_and_sliding_window(tmp_path: Path) -> None:
    path = save_model(make_model("qwen2_moe", seed=4), tmp_path / "q")
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(
        json.dumps({**cfg, "rope_parameters": {"rope_type": "linear", "factor": 2.0}})
    )
    with pytest.raises(ConfigError, match="rope type 'linear' is not supported"):
        load_hf_transformer(path)
    (path / "config.json").write_text(json.dumps({**cfg, "use_sliding_window": True}))
    with pytest.raises(ConfigError, match="use_sliding_window=true is not supported"):
        load_hf_transformer(path)


def test_legacy_rope_theta_field(tmp_path: Path) -> None:
    """Older config.json files carry rope_theta at the top level (no rope_parameters)."""
    path = save_model(make_model("olmoe", seed=5), tmp_path / "o")
    cfg = json.loads((path / "config.json").read_text())
    theta = cfg.pop("rope_parameters")["rope_theta"]
    (path / "config.json").write_text(
        json.dumps({**cfg, "rope_theta": 1234.0, "rope_scaling": None})
    )
    assert load_hf_transformer(path).config.rope_theta == 1234.0
    assert theta == 10000.0


def test_attention_config_errors(tmp_path: Path) -> None:
    path = save_model(make_model("mixtral", seed=6), tmp_path / "m")
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "num_key_value_heads": 3}))
    with pytest.raises(ConfigError, match="num_attention_heads=4 is not a multiple of .*=3"):
        load_hf_transformer(path)
    (path / "config.json").write_text(json.dumps({**cfg, "num_attention_heads": 2}))
    with pytest.raises(
        ShapeError, match=r"k_proj.weight' has shape \[8, 16\], but config.json implies \[16, 16\]"
    ):
        load_hf_transformer(path)
    (path / "config.json").write_text(json.dumps({**cfg, "vocab_size": 65}))
    with pytest.raises(ShapeError, match=r"embed_tokens.weight' has shape \[64, 16\]"):
        load_hf_transformer(path)
