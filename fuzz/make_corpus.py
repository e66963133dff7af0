"""Write the fuzzers' seed corpus from toy models made by the Colibri CLI.

    python fuzz/make_corpus.py OUT_DIR [--python .venv/bin/python]

OUT_DIR/container/*.clb are Colibri containers (`colibri convert`, and `colibri make-toy`'s own
container for gated experts); OUT_DIR/seed/*.bin pack a seed flat layout model for
fuzz_seed.c: u16 config length, u16 router length (little-endian), config.json, router.bin,
model.bin. Only the CLI is used (no import of the colibri package).
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
