"""Seeded toy models (`colibri make-toy`)."""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError
from ..ir.moe import ACTIVATIONS, GATED_ACTIVATION, Expert, MoELayer, parse_config


def make_toy(
    experts: int = 2,
    hidden: int = 8,
    ff: int = 16,
    top_k: int = 1,
    activation: str = "gelu",
    seed: int = 0,
    norm_topk_prob: bool = False,
    router_bias: bool = False,
) -> MoELayer:
    """A random MoE layer; the defaults are the seed articles' toy (2 experts, 8 -> 16, k=1).

    Weights are N(0, 1/fan_in) so activations stay O(1) for any size.
    """
    if activation not in (*ACTIVATIONS, GATED_ACTIVATION):
        raise ConfigError(
            f"unknown activation '{activation}'; supported: "
            f"{', '.join((*ACTIVATIONS, GATED_ACTIVATION))}"
        )
    cfg = parse_config(
        {
            "n_experts": experts,
            "k": top_k,
            "hidden_size": hidden,
            "intermediate_size": ff,
            "activation": activation,
            "norm_topk_prob": norm_topk_prob,
        },
        "make-toy options",
    )
    rng = np.random.default_rng(seed)

    def normal(shape: tuple[int, ...], fan_in: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)

    gated = cfg.gated
    exps = []
    for _ in range(experts):
        exps.append(
            Expert(
                w1=normal((hidden, ff), hidden),
                b1=None if gated else normal((ff,), hidden),
                w2=normal((ff, hidden), ff),
                b2=None if gated else normal((hidden,), ff),
                w3=normal((hidden, ff), hidden) if gated else None,
            )
        )
    router_w = normal((experts, hidden), 1) * np.float32(0.5)
    router_b = normal((experts,), 1) * np.float32(0.1) if router_bias else None
    return MoELayer(cfg, router_w, router_b, exps, source=f"toy(seed={seed})").validate()
