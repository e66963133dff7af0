"""A random Mixtral checkpoint written tensor by tensor, for models larger than the RAM that
transformers' ``from_config`` + ``save_pretrained`` would need (the whole model at once).

Same names, shapes, config.json and init as transformers' ``MixtralForCausalLM`` with
``initializer_range`` (normal(0, 0.02) for every linear and the embedding, ones for the RMS
norms), fp32, one safetensors shard per decoder layer (plus one for the embedding, the final
norm and the LM head) and ``model.safetensors.index.json``. Each tensor is drawn from its own
seeded generator and streamed to its shard, so memory stays at one tensor whatever the model.

    python benchmarks/mixtral_ckpt.py OUT_DIR [--hidden 2048] [--ff 5632] [--layers 7] ...
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

#: transformers' MixtralConfig default initializer_range.
INIT_STD = 0.02
#: Rows drawn at once (memory: rows x columns x 4 bytes).
ROWS_PER_DRAW = 256


def mixtral_config(config: dict[str, Any]) -> dict[str, Any]:
    """config.json of a Mixtral with the given sizes (the rest as transformers' defaults)."""
    return {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "hidden_act": "silu",
        "initializer_range": INIT_STD,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1e6,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "attention_dropout": 0.0,
        "router_aux_loss_coef": 0.001,
        "output_router_logits": False,
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
        **config,
    }


def shard_tensors(config: dict[str, Any]) -> list[tuple[str, list[tuple[str, tuple[int, ...]]]]]:
    """(shard file name, [(tensor name, shape)]) of every shard, in write order."""
    d = int(config["hidden_size"])
    f = int(config["intermediate_size"])
    e = int(config["num_local_experts"])
    n_layers = int(config["num_hidden_layers"])
    heads = int(config["num_attention_heads"])
    kv = int(config["num_key_value_heads"])
    hd = int(config.get("head_dim") or d // heads)
    vocab = int(config["vocab_size"])
    total = n_layers + 1
    shards = []
    for i in range(n_layers):
        p = f"model.layers.{i}"
        names: list[tuple[str, tuple[int, ...]]] = [
            (f"{p}.input_layernorm.weight", (d,)),
            (f"{p}.post_attention_layernorm.weight", (d,)),
            (f"{p}.self_attn.q_proj.weight", (heads * hd, d)),
            (f"{p}.self_attn.k_proj.weight", (kv * hd, d)),
            (f"{p}.self_attn.v_proj.weight", (kv * hd, d)),
            (f"{p}.self_attn.o_proj.weight", (d, heads * hd)),
            (f"{p}.block_sparse_moe.gate.weight", (e, d)),
        ]
        for j in range(e):
            q = f"{p}.block_sparse_moe.experts.{j}"
            names += [
                (f"{q}.w1.weight", (f, d)),
                (f"{q}.w2.weight", (d, f)),
                (f"{q}.w3.weight", (f, d)),
            ]
        shards.append((f"model-{i + 1:05d}-of-{total:05d}.safetensors", names))
    rest = [
        ("model.embed_tokens.weight", (vocab, d)),
        ("model.norm.weight", (d,)),
        ("lm_head.weight", (vocab, d)),
    ]
    shards.append((f"model-{total:05d}-of-{total:05d}.safetensors", rest))
    return shards


def parameters(config: dict[str, Any]) -> int:
    """Parameters of the checkpoint `config` describes."""
    return sum(int(np.prod(s)) for _, names in shard_tensors(config) for _, s in names)


def _draws(name: str, shape: tuple[int, ...], seed: int, index: int) -> Iterator[np.ndarray]:
    """The tensor's values, a few rows at a time (ones for the norms)."""
    if name.endswith("norm.weight"):
        yield np.ones(shape, "<f4")
        return
    rng = np.random.default_rng([seed, index])
    rows, cols = shape
    for r in range(0, rows, ROWS_PER_DRAW):
        n = min(ROWS_PER_DRAW, rows - r)
        block = rng.standard_normal((n, cols), dtype=np.float32)
        block *= np.float32(INIT_STD)
        yield block.astype("<f4", copy=False)


def write_checkpoint(path: Path, config: dict[str, Any], seed: int = 0) -> int:
    """Write the checkpoint (config.json, shards, index) into `path`; returns its parameters."""
    path.mkdir(parents=True, exist_ok=True)
    full = mixtral_config(config)
    (path / "config.json").write_text(json.dumps(full, indent=2) + "\n")
    weight_map: dict[str, str] = {}
    index = 0
    total_bytes = 0
    for shard, names in shard_tensors(config):
        header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for name, shape in names:
            nbytes = 4 * int(np.prod(shape))
            header[name] = {
                "dtype": "F32",
                "shape": list(shape),
                "data_offsets": [offset, offset + nbytes],
            }
            offset += nbytes
            weight_map[name] = shard
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        with open(path / shard, "wb") as out:
            out.write(struct.pack("<Q", len(raw)))
            out.write(raw)
            for name, shape in names:
                for block in _draws(name, shape, seed, index):
                    out.write(memoryview(block).cast("B"))
                index += 1
        total_bytes += offset
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total_bytes}, "weight_map": weight_map}, indent=2)
        + "\n"
    )
    return parameters(config)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ff", type=int, default=5632)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--layers", type=int, default=7)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    config = {
        "hidden_size": a.hidden,
        "intermediate_size": a.ff,
        "num_local_experts": a.experts,
        "num_experts_per_tok": a.top_k,
        "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads,
        "vocab_size": a.vocab,
    }
    n = write_checkpoint(a.out, config, a.seed)
    print(f"wrote {a.out}: {n:,} parameters ({4 * n / 1e9:.2f} GB fp32)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
