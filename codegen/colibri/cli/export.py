"""`colibri export`: a PyTorch MoE block -> Colibri container, checked against PyTorch.

The stages: read the block (:func:`colibri.frontends.export.read_block`), write the container,
read it back and compare its numpy reference output on a seeded batch with transformers' own
block module (:func:`colibri.reference.accuracy.check_against_torch`); a block that does not
match leaves no file behind.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from ..emit.container import write_container
from ..errors import ConfigError
from ..frontends.container import read_container
from ..frontends.export import DEFAULT_CHECK_TOKENS, ExportCheckFailed, read_block
from ..ir.moe import MoELayer
from ..progress import SILENT, Progress
from ..reference.accuracy import check_against_torch

T = TypeVar("T")


def _check_tokens(tokens: int) -> None:
    if tokens < 1:
        raise ConfigError(f"--check-tokens must be >= 1, got {tokens}")


def _write_checked(
    progress: Progress,
    write: Callable[[], Path],
    check: Callable[[Path], T],
    remove_on: type[BaseException] = BaseException,
) -> tuple[Path, T]:
    """The write and check stages of both exports: `write` the file (atomically: the writers
    rename a finished temporary file), then `check` it; a `remove_on` exception raised by the
    check removes the file and propagates, so a file that does not match is not left behind."""
    with progress.stage("write"):
        path = write()
    try:
        with progress.stage("check"):
            return path, check(path)
    except remove_on:
        path.unlink(missing_ok=True)
        raise


@dataclass
class ExportResult:
    path: Path
    layer: MoELayer
    max_abs_diff: float
    max_abs_output: float
    tokens: int

    @property
    def vacuous(self) -> bool:
        """PyTorch's output was all zeros: equal outputs verify nothing (issue 39: a block
        whose experts are all zero printed OK with nothing compared)."""
        return not self.max_abs_output > 0.0

    def vacuous_reason(self) -> str:
        """Why the check compared only zeros, for the warning."""
        experts = self.layer.experts
        if all(not np.any(a) for e in experts for _, a in e.tensors()):
            return "every expert's weights are zero"
        return "the block's output is zero on every check token"


def export(
    source: str | os.PathLike[str],
    out: str | os.PathLike[str],
    layer_index: int | None = None,
    config: str | os.PathLike[str] | None = None,
    tokens: int = DEFAULT_CHECK_TOKENS,
    seed: int = 0,
    progress: Progress = SILENT,
) -> ExportResult:
    """Export one MoE block to a Colibri container and check it against PyTorch (`progress`:
    a line per stage)."""
    _check_tokens(tokens)
    with progress.stage("load"):
        layer, cfg, state = read_block(source, layer_index, config)

    def check(path: Path) -> tuple[float, float]:
        written = read_container(path)
        written.source = str(path)
        return check_against_torch(written, cfg, state, tokens, seed)

    path, (diff, scale) = _write_checked(
        progress, lambda: write_container(layer, out), check, ExportCheckFailed
    )
    return ExportResult(path, layer, diff, scale, tokens)


@dataclass
class WholeExportResult:
    path: Path
    layers: int
    max_abs_diff: float
    tokens: int
    max_abs_logit: float = 1.0

    @property
    def vacuous(self) -> bool:
        """The reference logits were all zeros: the comparison verified nothing."""
        return not self.max_abs_logit > 0.0


def export_whole(
    source: str | os.PathLike[str],
    out: str | os.PathLike[str],
    tokens: int = DEFAULT_CHECK_TOKENS,
    seed: int = 0,
    progress: Progress = SILENT,
) -> WholeExportResult:
    """Export a whole Hugging Face checkpoint (no --layer) as a container version 2 (fp32) and
    check it: the C runtime's colibri_lm_forward on the written file (Python binding) against
    the float64 numpy reference, a seeded prompt of min(tokens, 64) ids, within
    LOGIT_TOLERANCE; a file that does not match is removed."""
    from ..emit.lmfile import write_lm_container
    from ..frontends.hf_model import load_transformer
    from ..reference.transformer import LOGIT_TOLERANCE, forward
    from ..targets.binding import LM

    _check_tokens(tokens)
    n = min(tokens, 64)
    with progress.stage("load"):
        model = load_transformer(source)

    def check(path: Path) -> tuple[float, float]:
        ids = np.random.default_rng(seed).integers(0, model.config.vocab_size, n).tolist()
        with LM(path) as lm:
            got = lm.logits(ids)
        ref = forward(model, ids)
        diff = float(np.abs(got - ref).max())
        if not diff <= LOGIT_TOLERANCE:
            raise ExportCheckFailed(
                f"{path}: the C runtime's logits on the written file differ from the numpy "
                f"reference by {diff:.3g} > {LOGIT_TOLERANCE}; the file was removed"
            )
        return diff, float(np.abs(ref).max())

    path, (diff, scale) = _write_checked(
        progress, lambda: write_lm_container(model, None, out, max(n, 64)), check
    )
    return WholeExportResult(path, model.config.n_layers, diff, n, scale)
