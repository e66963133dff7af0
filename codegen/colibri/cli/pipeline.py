"""`colibri generate` as one pipeline: its stages in order, data flowing one way.

    load -> IR -> [calibrate] -> quantise -> analyse -> plan (memory, placement) -> emit ->
    [report] -> budget -> write

Each stage is a pure function of the previous stages' results (:mod:`colibri.frontends`,
:mod:`colibri.quant`, :mod:`colibri.reference`, :mod:`colibri.plan`, :mod:`colibri.emit`); the
budget check reads the byte counts the emitter recorded, before anything is written, and the
output directory appears atomically or not at all. With --calib the reference stage first
collects each expert's calibration statistics (:mod:`colibri.reference.calibration`), which the
quantisation stage uses, and the report stage draws the routing heat map of the calibration
tokens (:mod:`colibri.report.routing`: routing.html and routing.md beside the C, a summary in the
manifest).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ..boards import load_board
from ..emit.layer import render_layer
from ..emit.output import FileContent, write_output
from ..emit.transformer import check_supported, render_transformer
from ..errors import ConfigError
from ..frontends.hf import is_hf_checkpoint
from ..frontends.hf_model import load_transformer
from ..frontends.load import load_model
from ..ir.moe import MoELayer
from ..ir.transformer import MoETransformer
from ..options import GenerateOptions
from ..plan.budget import check_layer_budget, check_transformer_budget
from ..plan.model import plan_layer, plan_whole_transformer
from ..progress import SILENT, Progress
from ..quant.calib import CALIBRATED_SCHEMES, LayerCalib
from ..quant.model import (
    LayerQuant,
    TransformerQuant,
    quantize_moe_layer,
    quantize_transformer_as_asked,
)
from ..reference.accuracy import analyse_layer, load_calib, transformer_accuracy
from ..reference.calibration import layer_calibration, load_calib_ids, transformer_calibration
from ..report.routing import (
    RoutingHeat,
    layer_routing,
    routing_files,
    routing_summary,
    transformer_routing,
)

#: What `generate` compiles: one MoE layer, or a whole decoder.
Model = MoELayer | MoETransformer


def load(
    path: str | os.PathLike[str],
    config: str | None = None,
    layer: int | None = None,
    progress: Progress = SILENT,
) -> Model:
    """The load stage: a Hugging Face checkpoint directory without --layer is a whole decoder,
    anything else one MoE layer (format detected from the content)."""
    if layer is None and config is None and is_hf_checkpoint(path):
        return load_transformer(path, progress)
    with progress.stage("load"):
        return load_model(path, config, layer)


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
        with progress.stage("calibrate"):
            ids = load_calib_ids(source, model, options.context)
            tstats = transformer_calibration(model, ids)
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


def quantise_layer(
    layer: MoELayer,
    options: GenerateOptions,
    calib: np.ndarray | None = None,
    progress: Progress = SILENT,
) -> tuple[LayerQuant, LayerCalib | None, np.ndarray | None]:
    """The calibrate + quantise stages of a lone MoE layer as `generate` runs them: the
    quantised layer, the calibration statistics and the calibration rows (None without
    --calib)."""
    stats = None
    if calib is not None or options.calib is not None:
        with progress.stage("calibrate"):
            calib = load_calib(options, calib, layer.config.d_model)
            stats = layer_calibration(layer, calib)
    lq = quantize_moe_layer(
        layer,
        options.quant,
        options.expert_quant,
        options.act,
        options.router_quant,
        options.scale_search,
        stats,
        progress,
    )
    return lq, stats, calib


def render(
    model: Model,
    options: GenerateOptions,
    calib: np.ndarray | None = None,
    progress: Progress = SILENT,
) -> tuple[dict[str, FileContent], dict[str, Any]]:
    """Every stage from the IR to the emitted files and manifest (not yet budget-checked);
    `progress` shows a line per stage (colibri.progress)."""
    board = load_board(options.board)
    if isinstance(model, MoETransformer):
        check_supported(model)
        q, tstats = quantise_transformer(model, options, calib, progress)
        with progress.stage("plan"):
            tplan = plan_whole_transformer(model, q, options.context)
        with progress.stage("emit"):
            files, manifest = render_transformer(model, q, tplan, board, options.name)
        if q is not None and options.scale_search != "mse":
            manifest["options"]["scale_search"] = options.scale_search
        if q is not None and tstats is not None:
            manifest["options"]["calib"] = str(options.calib or "(array)")
            manifest["accuracy"] = transformer_accuracy(model, q, tstats)
            add_routing_report(files, manifest, transformer_routing(model, tstats), options)
        return files, manifest
    lq, stats, calib = quantise_layer(model, options, calib, progress)
    with progress.stage("analyse"):
        analysis = analyse_layer(model, lq, options, calib, stats)
    with progress.stage("plan"):
        lplan = plan_layer(model, lq, analysis, board, options)
    with progress.stage("emit"):
        files, manifest = render_layer(model, lq, analysis, lplan, options, board)
    if calib is not None:
        add_routing_report(files, manifest, [layer_routing(model, calib)], options)
    return files, manifest


def add_routing_report(
    files: dict[str, FileContent],
    manifest: dict[str, Any],
    heats: list[RoutingHeat],
    options: GenerateOptions,
) -> None:
    """The report stage of `generate --calib`: the routing heat map (routing.html,
    routing.md) beside the generated C and its summary in the manifest (the C is unchanged)."""
    files.update(routing_files(heats, options.name))
    manifest["routing"] = routing_summary(heats)


def check_fits(model: Model, manifest: dict[str, Any], options: GenerateOptions) -> None:
    """The budget stage: refuse a model that does not fit the board, naming what would."""
    board = load_board(options.board)
    if isinstance(model, MoETransformer):
        check_transformer_budget(model, manifest, board)
    else:
        check_layer_budget(model, manifest, board, options)


def generate(
    model: Model | str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    options: GenerateOptions,
    force: bool = False,
    calib: np.ndarray | None = None,
    progress: Progress = SILENT,
) -> tuple[Path, dict[str, Any]]:
    """Generate the C sources of `model` (an IR, or a path for the load stage) into out_dir."""
    if isinstance(model, (MoELayer, MoETransformer)):
        ir = model
    else:
        ir = load(model, progress=progress)
    files, manifest = render(ir, options, calib, progress)
    check_fits(ir, manifest, options)
    with progress.stage("write"):
        out = write_output(out_dir, files, manifest, force=force)
    return out, manifest
