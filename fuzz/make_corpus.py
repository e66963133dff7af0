"""Write the fuzzers' seed corpus from toy models made by the Colibri CLI.

    python fuzz/make_corpus.py OUT_DIR [--python .venv/bin/python]

OUT_DIR/container/*.clb are Colibri containers (`colibri convert`, and `colibri make-toy`'s own
container for gated experts); OUT_DIR/seed/*.bin pack a seed flat layout model for
fuzz_seed.c: u16 config length, u16 router length (little-endian), config.json, router.bin,
model.bin. OUT_DIR/lm/*.clb are whole-model containers (version 2, for fuzz_lm.c) that
`colibri convert` writes from tiny seeded Hugging Face checkpoints (Mixtral, Qwen2-MoE with a
shared expert and a dense layer, OLMoE; fp32 / fp16 / int8 / int4 / q4k / q5k experts, int8 /
int4 / q4k dense matrices, tied and untied heads, calibration heat), each a few KB; they need
torch and transformers in that Python (pip install -e '.[test]', as tests/hf_tiny.py), and are
skipped with a note without them. Only the CLI is used (no import of the colibri package).
"""

from __future__ import annotations

import argparse
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

# (name, make-toy arguments); all small so that a fuzzer run mutates them quickly
TOYS: list[tuple[str, list[str]]] = [
    ("gelu_e4_d8_f16_k2", ["--experts", "4", "--hidden", "8", "--ff", "16", "--top-k", "2"]),
    (
        "relu_e2_d4_f4_k1_bias",
        [
            "--experts",
            "2",
            "--hidden",
            "4",
            "--ff",
            "4",
            "--top-k",
            "1",
            "--activation",
            "relu",
            "--router-bias",
        ],
    ),
    (
        "silu_e8_d4_f4_k3_norm",
        [
            "--experts",
            "8",
            "--hidden",
            "4",
            "--ff",
            "4",
            "--top-k",
            "3",
            "--activation",
            "silu",
            "--norm-topk",
        ],
    ),
    (
        "swiglu_e3_d4_f8_k2",
        [
            "--experts",
            "3",
            "--hidden",
            "4",
            "--ff",
            "8",
            "--top-k",
            "2",
            "--activation",
            "swiglu",
            "--router-bias",
            "--norm-topk",
        ],
    ),
]


# Whole models: (name, architecture, config overrides, `colibri convert` flags). Tiny dims
# (vocab 16, d_model 8, 2 heads / 1 KV head, d_ff 8, 4 experts, 8 positions) keep each file a
# few KB so that fuzz_lm runs thousands of inputs a second.
LMS: list[tuple[str, str, dict[str, object], list[str]]] = [
    ("mixtral_fp32", "mixtral", {}, []),
    (
        "mixtral_int8_dense_int8_heat",
        "mixtral",
        {},
        ["--quant", "int8", "--dense-quant", "int8", "--calib", "CALIB"],
    ),
    (
        "mixtral_fp16_tied",
        "mixtral",
        {"tie_word_embeddings": True},
        ["--quant", "fp16"],
    ),
    ("qwen2_moe_int4", "qwen2_moe", {}, ["--quant", "int4"]),
    (
        "qwen2_moe_dense_int8",
        "qwen2_moe",
        {"num_hidden_layers": 2, "mlp_only_layers": [0]},
        ["--quant", "int8", "--dense-quant", "int8"],
    ),
    ("olmoe_fp32_tied", "olmoe", {"tie_word_embeddings": True, "num_experts_per_tok": 1}, []),
    ("olmoe_int4_heat", "olmoe", {}, ["--quant", "int4", "--calib", "CALIB"]),
    ("mixtral_q4k_dense_q4k", "mixtral", {}, ["--quant", "q4k", "--dense-quant", "q4k"]),
    (
        "qwen2_moe_q5k_dense_int4",
        "qwen2_moe",
        {"num_hidden_layers": 2, "mlp_only_layers": [0], "moe_intermediate_size": 20},
        ["--quant", "q5k", "--dense-quant", "int4", "--calib", "CALIB"],
    ),
]

# Run with the corpus's Python: writes OUT/<name>/ checkpoints (seeded weights, as
# tests/hf_tiny.py) and OUT/calib.npy; argv: OUT, then JSON [[name, arch, overrides], ...].
_WRITE_CHECKPOINTS = """
import json, sys
from pathlib import Path
import numpy as np
import torch
import transformers
out = Path(sys.argv[1])
np.save(out / "calib.npy", np.arange(24, dtype=np.int64).reshape(2, 12) % 16)
classes = {
    "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM,
                dict(num_local_experts=4)),
    "qwen2_moe": (transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM,
                  dict(num_experts=4, moe_intermediate_size=8, shared_expert_intermediate_size=8)),
    "olmoe": (transformers.OlmoeConfig, transformers.OlmoeForCausalLM, dict(num_experts=4)),
}
for name, arch, overrides in json.loads(sys.argv[2]):
    config_cls, model_cls, extra = classes[arch]
    kw = dict(vocab_size=16, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
              num_attention_heads=2, num_key_value_heads=1, num_experts_per_tok=2,
              max_position_embeddings=16, bos_token_id=None, eos_token_id=None,
              pad_token_id=None, tie_word_embeddings=False)
    kw.update(extra)
    kw.update(overrides)
    torch.manual_seed(0)
    model = model_cls(config_cls(**kw)).to(torch.float32).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1.0 + 0.1 * noise if "norm" in pname else 0.3 * noise)
    model.save_pretrained(out / name)
"""


def make_lm_corpus(out: Path, python: str, tmp: Path) -> list[Path]:
    """Whole-model containers under out/lm (none, with a note, without torch / transformers)."""
    import json

    spec = json.dumps([[name, arch, overrides] for name, arch, overrides, _ in LMS])
    result = subprocess.run(
        [python, "-c", _WRITE_CHECKPOINTS, str(tmp), spec],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        if "No module named" in result.stderr:
            print(f"make_corpus: no whole-model corpus ({result.stderr.strip().splitlines()[-1]})")
            return []
        raise RuntimeError(f"writing the tiny checkpoints failed:\n{result.stderr}")
    (out / "lm").mkdir(parents=True, exist_ok=True)
    written = []
    for name, _, _, flags in LMS:
        clb = out / "lm" / f"{name}.clb"
        args = [str(tmp / "calib.npy") if f == "CALIB" else f for f in flags]
        _cli(
            python, "convert", str(tmp / name), "--out", str(clb), "--max-context", "8", "-q", *args
        )
        written.append(clb)
    return written


def pack_seed(model_dir: Path) -> bytes:
    """The fuzz_seed.c input for a seed-layout model directory."""
    config = (model_dir / "config.json").read_bytes()
    router = (model_dir / "router.bin").read_bytes()
    model = (model_dir / "model.bin").read_bytes()
    if len(config) > 0xFFFF or len(router) > 0xFFFF:
        raise ValueError(f"{model_dir}: config.json or router.bin larger than 64 KiB")
    return struct.pack("<HH", len(config), len(router)) + config + router + model


def _cli(python: str, *args: str) -> None:
    result = subprocess.run(
        [python, "-m", "colibri", *args], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"colibri {' '.join(args)} failed:\n{result.stderr}")


def make_corpus(out: Path, python: str = sys.executable) -> list[Path]:
    """Write the corpus under `out`; returns the files written."""
    written: list[Path] = []
    (out / "container").mkdir(parents=True, exist_ok=True)
    (out / "seed").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in TOYS:
            toy = Path(tmp) / name
            _cli(python, "make-toy", "--out", str(toy), *args)
            clb = out / "container" / f"{name}.clb"
            if (toy / "model.bin").exists():
                _cli(python, "convert", str(toy / "model.bin"), "--out", str(clb))
                seed = out / "seed" / f"{name}.bin"
                seed.write_bytes(pack_seed(toy))
                written.append(seed)
            else:  # gated experts: make-toy writes a container (the seed layout has no W3)
                shutil.copyfile(toy / "model.clb", clb)
            written.append(clb)
        written += make_lm_corpus(out, python, Path(tmp))
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="corpus directory")
    parser.add_argument("--python", default=sys.executable, help="Python with colibri installed")
    ns = parser.parse_args()
    for path in make_corpus(ns.out, ns.python):
        print(f"{path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
