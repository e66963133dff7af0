"""`colibri verify FILE`: read a model with every check the readers have and say what passed.

A Colibri container (header fields, tensor table, each tensor's CRC-32, the metadata JSON
against the header, shapes, NaN / Inf), the seed layout and its directory variant, numpy .npz
(config, sizes, shapes, NaN / Inf) or a Hugging Face checkpoint directory (config.json, every
safetensors header, every tensor read and checked for NaN / Inf, then the whole model's shapes
against its config). Each step that passed is reported through `say`; the first problem is
raised as the reader's ColibriError.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path

from ..errors import ModelFormatError, ToolchainNotFound
from ..frontends.container import MAGIC as CONTAINER_MAGIC
from ..frontends.container import (
    check_lm_meta,
    check_meta_against_header,
    read_container,
    read_table,
)
from ..frontends.hf import HFCheckpoint, check_architectures, is_hf_checkpoint
from ..frontends.load import load_model
from ..frontends.seed import SEED_MAGIC
from ..ir.moe import MoELayer


def _check_v1_meta(source: str, data: bytes) -> int:
    from ..ir.moe import ACTIVATIONS, FLAG_GATED, FLAG_NORM_TOPK, GATED_ACTIVATION

    (e, k, d, f, act, flags), _, meta = read_table(data, source)
    cfg = meta.get("config")
    if not isinstance(cfg, dict):
        raise ModelFormatError(f"{source}: metadata has no 'config' object; the file is corrupt")
    vocab = struct.unpack_from("<I", data, 80)[0]  # the header's vocab_size (0: none)
    if act >= len(ACTIVATIONS):
        raise ModelFormatError(f"{source}: unknown activation code {act}")
    activation = GATED_ACTIVATION if flags & FLAG_GATED else ACTIVATIONS[act]
    return check_meta_against_header(
        source,
        cfg,
        [
            ("n_experts", "n_experts", e),
            ("k", "top_k", k),
            ("hidden_size", "d_model", d),
            ("intermediate_size", "d_ff", f),
            ("activation", "activation and flags", activation),
            ("norm_topk_prob", "flags (norm_topk_prob)", bool(flags & FLAG_NORM_TOPK)),
            ("vocab_size", "vocab_size", vocab or None),
        ],
        "config",
    )


def _layer_summary(layer: MoELayer) -> str:
    c = layer.config
    values = int(layer.router_w.size) + sum(
        int(a.size) for e in layer.experts for _, a in e.tensors()
    )
    act = "swiglu" if c.gated else c.activation
    return (
        f"{c.n_experts} experts, d_model {c.d_model}, d_ff {c.d_ff}, k {c.top_k}, {act}; "
        f"shapes agree with the config; {values} weights, none NaN or Inf"
    )


def _verify_hf(path: Path, say: Callable[[str], None]) -> None:
    from ..frontends.hf_model import load_transformer

    ckpt = HFCheckpoint(path)
    say(f"config.json: {ckpt.arch.name}, {ckpt.n_layers} decoder layers")
    files = ckpt.shard_files()
    say(
        f"safetensors: {len(files)} file(s), {len(ckpt.names())} tensors; headers, dtypes, "
        f"data_offsets inside the files and not overlapping"
    )
    values = 0
    for name in ckpt.names():
        values += int(ckpt.tensor(name).size)  # reads it and refuses NaN / Inf
    say(f"weights: {values} values read, none NaN or Inf")
    model = load_transformer(path)
    c = model.config
    say(
        f"model: {c.n_layers} layers, d_model {c.d_model}, vocab {c.vocab_size}; every tensor "
        f"the architecture needs is present with the shape config.json implies"
    )


def _verify_lm_file(p: Path, say: Callable[[str], None]) -> None:
    """A whole-model container (version 2): the Python reader's checks, NaN / Inf, then the C
    runtime's colibri_lm_init (every tensor the model uses, with its dtype and shape)."""

    from ..frontends.container import read_lm_container
    from ..targets.binding import LM, RuntimeStatusError

    c = read_lm_container(p)
    h = c.header
    say(f"{p}: Colibri container version 2 (whole model), {h['file_size']} bytes")
    say(
        f"header: {h['n_layers']} layers, d_model {h['d_model']}, vocab {h['vocab_size']}, "
        f"max_context {h['max_context']}; tensor table: {len(c.tensors)} entries inside the file, "
        f"64-byte aligned, in order, sizes match shapes, CRC-32 of each"
    )
    n = check_lm_meta(str(p), h, c.meta)
    say(f"metadata agrees with the header ({n} fields in both)")
    from ..emit.lmfile import lm_model

    lm_model(c, str(p), lean=True)  # the tensors already read, CRC-checked
    say(
        "model: every tensor in the scheme its tables name and the shape the header gives, "
        "layer descriptors and expert tables in range, RoPE tables those of rope_theta"
    )
    say("weights: no fp32 value NaN or Inf")
    try:
        with LM(p) as lm:
            say(
                f"runtime: colibri_lm_init accepts it (every tensor present with its dtype and "
                f"shape); {lm.arena_bytes} bytes of arena for {lm.max_context} positions"
            )
    except ToolchainNotFound as exc:
        say(f"runtime check skipped: {exc}")
    except RuntimeStatusError as exc:
        raise ModelFormatError(str(exc)) from None


def verify_model(
    path: str | os.PathLike[str],
    config: str | os.PathLike[str] | None = None,
    say: Callable[[str], None] = print,
) -> None:
    """Check the model at `path` completely; report each passed step with `say`, raise the
    first problem (a ColibriError)."""
    p = Path(path)
    if not p.exists():
        raise ModelFormatError(f"{p}: no such file or directory")
    check_architectures(p)
    if p.is_dir() and is_hf_checkpoint(p) and config is None:
        say(f"{p}: Hugging Face checkpoint directory")
        _verify_hf(p, say)
        return
    head = b""
    if p.is_file():
        with open(p, "rb") as f:
            head = f.read(8)
    from ..frontends.container import is_lm_container

    if head.startswith(CONTAINER_MAGIC[:7]) and is_lm_container(p):
        _verify_lm_file(p, say)
        return
    if head.startswith(CONTAINER_MAGIC[:7]):
        data = p.read_bytes()
        say(f"{p}: Colibri container, {len(data)} bytes")
        _, entries, _ = read_table(data, str(p))
        say(
            "header: magic, version, alignment, table / metadata / data offsets, file size; "
            f"tensor table: {len(entries)} entries inside the file, 64-byte aligned, sizes "
            "match shapes, CRC-32 of each"
        )
        n = _check_v1_meta(str(p), data)
        say(f"metadata agrees with the header ({n} fields in both)")
        layer = read_container(p)
    else:
        kind = "directory" if p.is_dir() else "file"
        if head.startswith(b"PK"):
            kind = "numpy .npz"
        elif len(head) >= 4 and struct.unpack_from("<I", head)[0] == SEED_MAGIC:
            kind = "seed layout (COLI header, config.json and router.bin beside it)"
        say(f"{p}: {kind}")
        layer = load_model(p, config)
        say("header and sizes: consistent with config.json")
    say(f"weights: {_layer_summary(layer)}")
