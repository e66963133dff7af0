"""`colibri generate` as one pipeline: its stages in order, data flowing one way.

    load -> IR -> [calibrate] -> quantise -> analyse -> plan (memory, placement) -> emit ->
    [report] -> budget -> write

The load stage gives the one model IR (:class:`~colibri.ir.model.Model`: kind "layer", one MoE
block alone, or "transformer", a whole decoder) and every later stage takes it, dispatching on
its kind where the two kinds still differ. Each stage is a pure function of the previous
stages' results (:mod:`colibri.frontends`, :mod:`colibri.quant`, :mod:`colibri.reference`,
:mod:`colibri.plan`, :mod:`colibri.emit`); the budget check reads the byte counts the emitter
recorded, before anything is written, and the output directory appears atomically or not at
all. With --calib the reference stage first collects each expert's calibration statistics
(:mod:`colibri.reference.calibration`), which the quantisation stage uses, and the report stage
draws the routing heat map of the calibration tokens (:mod:`colibri.report.routing`:
routing.html and routing.md beside the C, a summary in the manifest).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..boards import load_board
from ..emit.model import check_supported
from ..emit.model import render as emit
from ..emit.output import FileContent, write_output
from ..errors import ConfigError
from ..frontends.hf import is_whole
from ..frontends.hf_model import load_transformer
from ..frontends.load import load_model
from ..ir.model import Model, as_model
from ..ir.moe import MoELayer
from ..ir.transformer import MoETransformer
from ..options import GenerateOptions
from ..plan.budget import check_fits
from ..plan.model import plan
from ..progress import SILENT, Progress
from ..quant.calib import CALIBRATED_SCHEMES, LayerCalib
from ..quant.model import (
    TransformerQuant,
    quantize_moe_layer,
    quantize_transformer_as_asked,
)
from ..reference.accuracy import analyse_layer, load_calib, transformer_accuracy
from ..reference.calibration import layer_calibration, load_calib_ids, transformer_calibration
from ..report.routing import layer_routing, routing_files, routing_summary, transformer_routing


def load(
    path: str | os.PathLike[str],
    config: str | None = None,
    layer: int | None = None,
    progress: Progress = SILENT,
) -> Model:
    """The load stage: a Hugging Face checkpoint directory without --layer is a whole decoder,
    anything else one MoE layer (format detected from the content)."""
    if is_whole(path, config, layer):
        return as_model(load_transformer(path, progress))
    with progress.stage("load"):
        return as_model(load_model(path, config, layer))


def quantise_transformer(
    model: MoETransformer,
    options: GenerateOptions,
    calib: np.ndarray | None = None,
    progress: Progress = SILENT,
) -> tuple[TransformerQuant | None, dict[int, LayerCalib] | None]:
    """The calibrate + quantise stages of a whole transformer as `generate` runs them: the
    quantised weights (None: all fp32) and the calibration statistics (None without --calib).
    benchmarks/accuracy_table.py runs the numpy mirror on exactly this."""
    source = calib if calib is not None else options.calib
    tstats: dict[int, LayerCalib] | None = None
    if source is not None:
        if options.quant not in CALIBRATED_SCHEMES:
            raise ConfigError(
                f"--calib calibrates the routed experts' int8 / int4 scales, but --quant is "
                f"{options.quant}: pass --quant int8 or --quant int4 (or drop --calib)"
            )
        with progress.stage("calibrate") as st:
            ids = load_calib_ids(source, model, options.context)
            tstats = transformer_calibration(model, ids, st)
    q = quantize_transformer_as_asked(
        model,
        options.quant,
        options.act,
        options.dense_quant,
        options.router_quant,
        options.scale_search,
        tstats,
        progress,
    )
    return q, tstats


@dataclass
class Quantised:
    """What the calibrate + quantise stages give the later ones: the quantised weights (a lone
    layer's LayerQuant; a transformer's TransformerQuant, None when all fp32), the calibration
    statistics and a lone layer's calibration rows (None without --calib)."""

    q: Any
    stats: Any = None
    calib: Any = None


def quantise(
    model: Model,
    options: GenerateOptions,
    calib: np.ndarray | None = None,
    progress: Progress = SILENT,
) -> Quantised:
    """The calibrate + quantise stages of either kind as `generate` runs them."""
    if model.decoder is not None:
        check_supported(model.decoder)
        return Quantised(*quantise_transformer(model.decoder, options, calib, progress))
    layer, stats = model.layer, None
    if calib is not None or options.calib is not None:
        with progress.stage("calibrate") as st:
            calib = load_calib(options, calib, layer.config.d_model)
            stats = layer_calibration(layer, calib, st)
    q = quantize_moe_layer(
        layer,
        options.quant,
        options.expert_quant,
        options.act,
        options.router_quant,
        options.scale_search,
        stats,
        progress,
    )
    return Quantised(q, stats, calib)


def analyse(model: Model, qd: Quantised, options: GenerateOptions, progress: Progress) -> Any:
    """The analyse stage (the numpy reference on the quantised weights): a lone layer's
    accuracy report and expert heat; a calibrated transformer's accuracy (else None)."""
    if model.decoder is None:
        with progress.stage("analyse"):
            return analyse_layer(model.layer, qd.q, options, qd.calib, qd.stats)
    if qd.q is None or qd.stats is None:
        return None
    return transformer_accuracy(model.decoder, qd.q, qd.stats)


def render(
    model: Model | MoELayer | MoETransformer,
    options: GenerateOptions,
    calib: np.ndarray | None = None,
    progress: Progress = SILENT,
) -> tuple[dict[str, FileContent], dict[str, Any]]:
    """Every stage from the IR to the emitted files and manifest (not yet budget-checked);
    `progress` shows a line per stage (colibri.progress)."""
    m = as_model(model)
    board = load_board(options.board)
    qd = quantise(m, options, calib, progress)
    analysis = analyse(m, qd, options, progress)
    with progress.stage("plan"):
        p = plan(m, qd.q, analysis, board, options)
    with progress.stage("emit"):
        files, manifest = emit(m, qd.q, analysis, p, options, board)
    if qd.stats is not None:  # the report stage of --calib: the routing heat map
        heats = (
            transformer_routing(m.decoder, qd.stats)
            if m.decoder is not None
            else [layer_routing(m.layer, qd.calib)]
        )
        files.update(routing_files(heats, options.name))
        manifest["routing"] = routing_summary(heats)
    return files, manifest


def generate(
    model: Model | MoELayer | MoETransformer | str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    options: GenerateOptions,
    force: bool = False,
    calib: np.ndarray | None = None,
    progress: Progress = SILENT,
) -> tuple[Path, dict[str, Any]]:
    """Generate the C sources of `model` (an IR, or a path for the load stage) into out_dir."""
    ir = (
        load(model, progress=progress) if isinstance(model, (str, os.PathLike)) else as_model(model)
    )
    files, manifest = render(ir, options, calib, progress)
    check_fits(ir, manifest, load_board(options.board), options)
    with progress.stage("write"):
        out = write_output(out_dir, files, manifest, force=force)
    return out, manifest
