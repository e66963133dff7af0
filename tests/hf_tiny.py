"""Tiny seeded Hugging Face MoE models built locally (no network): the peer reference.

Weights are redrawn with std 0.3 (norm weights 1 +- 0.1) instead of transformers' 0.02 init,
so routing and next-token choices are decisive rather than near-ties.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"

ARCHS = ("mixtral", "qwen2_moe", "olmoe")


def require_package(name: str, why: str) -> Any:
    """The imported test-only package `name`; skips (locally) or fails (CI, where the set-up
    installs it with pip install -e '.[test]') when it is missing."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as exc:
        if IN_CI:
            pytest.fail(f"CI=true and {exc}: pip install -e '.[test]' installs {name}")
        pytest.skip(f"{exc}: pip install -e '.[test]' to run {why}")


def require_torch() -> None:
    """Skip (locally) or fail (CI) when torch / transformers are not installed."""
    require_package("torch", "the Hugging Face peer tests")
    require_package("transformers", "the Hugging Face peer tests")


def tiny_config(arch: str, **overrides: Any) -> Any:
    import transformers

    common: dict[str, Any] = dict(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts_per_tok=2,
        max_position_embeddings=256,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    if arch == "mixtral":
        common.update(intermediate_size=24, num_local_experts=4)
        cls = transformers.MixtralConfig
    elif arch == "qwen2_moe":
        common.update(
            intermediate_size=28,
            moe_intermediate_size=12,
            shared_expert_intermediate_size=20,
            num_experts=4,
        )
        cls = transformers.Qwen2MoeConfig
    elif arch == "olmoe":
        common.update(intermediate_size=24, num_experts=4)
        cls = transformers.OlmoeConfig
    else:
        raise ValueError(arch)
    common.update(overrides)
    return cls(**common)


def causal_lm_class(arch: str) -> Any:
    """transformers' causal-LM class of `arch`."""
    import transformers

    return {
        "mixtral": transformers.MixtralForCausalLM,
        "qwen2_moe": transformers.Qwen2MoeForCausalLM,
        "olmoe": transformers.OlmoeForCausalLM,
    }[arch]


def make_model(arch: str, seed: int = 0, **overrides: Any) -> Any:
    """A seeded random transformers causal LM of architecture `arch`, fp32, eval mode."""
    import torch

    cls = causal_lm_class(arch)
    torch.manual_seed(seed)
    model = cls(tiny_config(arch, **overrides)).to(torch.float32).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if "norm" in name:
                p.copy_(1.0 + 0.1 * noise)
            else:
                p.copy_(0.3 * noise)
    return model


def short_prompt(seed: int, vocab: int) -> list[int]:
    """A seeded prompt of 3-9 random ids below vocab."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(0, vocab, size=int(rng.integers(3, 10)))]


def save_model(model: Any, path: Path, **kwargs: Any) -> Path:
    model.save_pretrained(path, **kwargs)
    return path


def hf_logits(model: Any, prompt: list[int]) -> Any:
    """transformers' fp32 logits of every prompt position, float64 [T, vocab]."""
    import numpy as np
    import torch

    with torch.no_grad():
        return np.asarray(model(torch.tensor([prompt])).logits[0].double().numpy())


def hf_reference(model: Any, prompt: list[int], n_new: int) -> tuple[Any, list[int]]:
    """transformers' logits of the prompt [T, vocab] and its greedy continuation (n_new ids)."""
    import torch

    with torch.no_grad():
        # An explicit mask: with pad_token_id=0 transformers would mask prompt tokens with id 0.
        ids = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            max_new_tokens=n_new,
            min_new_tokens=n_new,
            pad_token_id=0,
        )[0].tolist()
    return hf_logits(model, prompt), ids[len(prompt) :]


def assert_logits_close(actual: Any, expected: Any, what: str, who: str) -> None:
    """max |actual - expected| <= LOGIT_TOLERANCE, else the worst position and the count."""
    import numpy as np
    from colibri.reference.transformer import LOGIT_TOLERANCE

    diff = np.abs(np.asarray(actual, dtype=np.float64) - expected)
    worst = np.unravel_index(int(np.argmax(diff)), diff.shape)
    assert diff.max() <= LOGIT_TOLERANCE, (
        f"{what}: max |logit diff| {diff.max():.3g} > {LOGIT_TOLERANCE} at position/token "
        f"{worst}: {who} {actual[worst]!r}, transformers {expected[worst]!r}; "
        f"{int((diff > LOGIT_TOLERANCE).sum())} of {diff.size} logits off"
    )


def assert_same_tokens(actual: list[int], expected: list[int], what: str, who: str) -> None:
    """Identical id sequences, else the first index that differs and both sequences."""
    first = next((i for i, (a, b) in enumerate(zip(actual, expected)) if a != b), None)
    assert actual == expected, (
        f"{what}: generated ids differ from index {first}:\n  {who}: {actual}\n"
        f"  transformers: {expected}"
    )


# -- trained tiny models -------------------------------------------------------------------------
#
# A random LM head makes every next-token distribution a draw of iid Gaussian logits: the gap
# between the two best tokens is then as often tiny as for any untrained model, and quantisation
# noise of ~1 % of the logits flips ~2 % of the top-1 choices whatever the scheme's quality.
# Models people deploy are trained; these are the same configs, trained a few hundred seeded
# steps on a synthetic language that needs attention (the token before the previous one) and a
# nonlinear FFN (a parity-selected permutation), so their next-token predictions are as
# decisive as a small trained LM's.


class ToyLanguage:
    """Token t+1 = perm[t-1 is odd][token t] with probability `p_rule`, else uniform."""

    def __init__(self, vocab: int, seed: int, p_rule: float = 0.8) -> None:
        import numpy as np

        rng = np.random.default_rng(seed)
        self.vocab = vocab
        self.perms = np.stack([rng.permutation(vocab), rng.permutation(vocab)])
        self.p_rule = p_rule

    def sample(self, rng: Any, n: int, length: int) -> Any:
        """n sequences [n, length] (int64)."""
        import numpy as np

        x = np.zeros((n, length), dtype=np.int64)
        x[:, :2] = rng.integers(0, self.vocab, (n, 2))
        for t in range(2, length):
            ruled = self.perms[x[:, t - 2] % 2, x[:, t - 1]]
            noise = rng.integers(0, self.vocab, n)
            x[:, t] = np.where(rng.random(n) < self.p_rule, ruled, noise)
        return x

    def rule(self, seqs: Any) -> Any:
        """The rule's next token after every position >= 1 of seqs [n, length]: [n, length - 1]."""
        return self.perms[seqs[:, :-1] % 2, seqs[:, 1:]]


def init_model(arch: str, seed: int = 0, **overrides: Any) -> Any:
    """A seeded causal LM of `arch` with transformers' own initialisation (normal with std
    initializer_range = 0.02, norms 1), fp32, eval mode: the residual stream is mostly the
    token embedding, so the MoE blocks move few next-token choices (see the int8 tests)."""
    import torch

    torch.manual_seed(seed)
    return causal_lm_class(arch)(tiny_config(arch, **overrides)).to(torch.float32).eval()


def trained_model(
    arch: str, seed: int, steps: int = 400, **overrides: Any
) -> tuple[Any, ToyLanguage, float]:
    """init_model(arch, seed) trained `steps` AdamW steps (batch 32 x 32
    tokens, lr 1e-2, one CPU thread so the run is repeatable) on ToyLanguage(seed): (model in
    eval mode, the language, last batch's loss)."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    model = init_model(arch, seed, **overrides)
    vocab = model.config.vocab_size
    lang = ToyLanguage(vocab, seed)
    rng = np.random.default_rng(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model.train()
        for _ in range(steps):
            x = torch.from_numpy(lang.sample(rng, 32, 33))
            logits = model(x[:, :-1]).logits
            loss = F.cross_entropy(logits.reshape(-1, vocab), x[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    return model.eval(), lang, loss.item()


def lm_options(
    board: str,
    name: str,
    max_context: int,
    quant: str = "fp32",
    act: str | None = None,
    dense: str = "fp32",
    router: str = "fp32",
) -> Any:
    """GenerateOptions of a whole transformer, in the order the tests spell them."""
    from colibri.options import GenerateOptions

    return GenerateOptions(
        board=board,
        name=name,
        max_context=max_context,
        quant=quant,
        act=act,
        dense_quant=dense,
        router_quant=router,
    )


def generate_lm(
    model: Any, out: Path, board: str, name: str, max_context: int, **kw: Any
) -> tuple[Path, dict[str, Any]]:
    """`colibri generate` of a whole transformer through the pipeline (tests' shorthand)."""
    from colibri.cli.pipeline import generate

    force = kw.pop("force", False)
    return generate(model, out, lm_options(board, name, max_context, **kw), force=force)


def render_lm(model: Any, board: str, name: str, max_context: int, *args: Any, **kw: Any) -> Any:
    """Generated files and manifest of a whole transformer, without writing them."""
    from colibri.cli.pipeline import render

    return render(model, lm_options(board, name, max_context, *args, **kw))


N_NEW_TOKENS = 32

# Seeded tiny configs per architecture: layers, heads / kv-heads (MHA, GQA, MQA), experts, k,
# vocab, head_dim, tied embeddings, attention biases, QKV clipping, sliding window, Qwen's
# dense layers.
MODEL_CASES: list[tuple[str, dict[str, Any]]] = [
    ("mixtral", {}),
    (
        "mixtral",
        {
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "num_local_experts": 6,
            "num_experts_per_tok": 1,
            "vocab_size": 97,
            "head_dim": 6,
        },
    ),
    (
        "mixtral",
        {
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "tie_word_embeddings": True,
            "sliding_window": 5,
            "rope_parameters": {"rope_type": "default", "rope_theta": 500.0},
        },
    ),
    ("qwen2_moe", {}),
    (
        "qwen2_moe",
        {
            "num_hidden_layers": 3,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "hidden_size": 32,
            "num_experts": 8,
            "num_experts_per_tok": 3,
            "norm_topk_prob": True,
            "mlp_only_layers": [1],
            "vocab_size": 80,
        },
    ),
    (
        "qwen2_moe",
        {
            "num_hidden_layers": 4,
            "decoder_sparse_step": 2,
            "qkv_bias": False,
            "num_key_value_heads": 4,
        },
    ),
    ("olmoe", {}),
    (
        "olmoe",
        {
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "num_experts": 8,
            "num_experts_per_tok": 4,
            "norm_topk_prob": True,
            "attention_bias": True,
            "clip_qkv": 0.8,
            "vocab_size": 50,
        },
    ),
    ("olmoe", {"num_key_value_heads": 1, "tie_word_embeddings": True, "num_experts_per_tok": 1}),
]


#: config.json of the checkpoint mixtral_tensors_1layer() fills.
MIXTRAL_1LAYER_CONFIG: dict[str, Any] = {
    "architectures": ["MixtralForCausalLM"],
    "hidden_size": 8,
    "intermediate_size": 16,
    "num_local_experts": 2,
    "num_experts_per_tok": 1,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 16,
    "rms_norm_eps": 1e-5,
}


def mixtral_tensors_1layer() -> dict[str, Any]:
    """The tensors of a 1-layer Mixtral (d_model 8, d_ff 16, 2 experts, vocab 16, 2 heads /
    1 kv head) as float32 numpy arrays, seeded: a checkpoint written without torch."""
    import numpy as np

    rng = np.random.default_rng(0)
    p = "model.layers.0."
    shapes = {
        "model.embed_tokens.weight": (16, 8),
        "model.norm.weight": (8,),
        "lm_head.weight": (16, 8),
        f"{p}input_layernorm.weight": (8,),
        f"{p}post_attention_layernorm.weight": (8,),
        f"{p}self_attn.q_proj.weight": (8, 8),
        f"{p}self_attn.k_proj.weight": (4, 8),
        f"{p}self_attn.v_proj.weight": (4, 8),
        f"{p}self_attn.o_proj.weight": (8, 8),
        f"{p}block_sparse_moe.gate.weight": (2, 8),
    }
    for e in range(2):
        for name, shape in (("w1", (16, 8)), ("w3", (16, 8)), ("w2", (8, 16))):
            shapes[f"{p}block_sparse_moe.experts.{e}.{name}.weight"] = shape
    return {k: (0.1 * rng.standard_normal(s)).astype(np.float32) for k, s in shapes.items()}
