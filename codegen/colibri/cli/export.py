"""`colibri export`: a PyTorch MoE block -> Colibri container, checked against PyTorch.

The stages: read the block (:func:`colibri.frontends.export.read_block`), write the container,
read it back and compare its numpy reference output on a seeded batch with transformers' own
block module (:func:`colibri.reference.accuracy.check_against_torch`); a block that does not
match leaves no file behind.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from ..frontends.container import read_container, write_container
from ..frontends.export import DEFAULT_CHECK_TOKENS, ExportCheckFailed, read_block
from ..ir.moe import MoELayer
from ..reference.accuracy import check_against_torch


@dataclass
class ExportResult:
    path: Path
    layer: MoELayer
    max_abs_diff: float
    max_abs_output: float
    tokens: int


def export(
    source: str | os.PathLike[str],
    out: str | os.PathLike[str],
    layer_index: int | None = None,
    config: str | os.PathLike[str] | None = None,
    tokens: int = DEFAULT_CHECK_TOKENS,
    seed: int = 0,
) -> ExportResult:
    """Export one MoE block to a Colibri container and check it against PyTorch."""
    if tokens < 1:
        raise ConfigError(f"--check-tokens must be >= 1, got {tokens}")
    layer, cfg, state = read_block(source, layer_index, config)
    path = write_container(layer, out)
    written = read_container(path)
    written.source = str(path)
    try:
        diff, scale = check_against_torch(written, cfg, state, tokens, seed)
    except ExportCheckFailed:
        path.unlink(missing_ok=True)
        raise
    return ExportResult(path, layer, diff, scale, tokens)
