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


def require_torch() -> None:
    """Skip (locally) or fail (CI) when torch / transformers are not installed."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        if IN_CI:
            pytest.fail(f"CI=true and {exc}: pip install -e '.[test]' installs torch")
        pytest.skip(f"{exc}: pip install -e '.[torch]' to run the Hugging Face peer tests")


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


def make_model(arch: str, seed: int = 0, **overrides: Any) -> Any:
    """A seeded random transformers causal LM of architecture `arch`, fp32, eval mode."""
    import torch
    import transformers

    cls = {
        "mixtral": transformers.MixtralForCausalLM,
        "qwen2_moe": transformers.Qwen2MoeForCausalLM,
        "olmoe": transformers.OlmoeForCausalLM,
    }[arch]
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


def save_model(model: Any, path: Path, **kwargs: Any) -> Path:
    model.save_pretrained(path, **kwargs)
    return path
