"""`colibri generate` as one pipeline: its stages in order, data flowing one way.

    load -> IR -> [calibrate] -> quantise -> analyse -> plan (memory, placement) -> emit ->
    budget -> write

Each stage is a pure function of the previous stages' results (:mod:`colibri.frontends`,
:mod:`colibri.quant`, :mod:`colibri.reference`, :mod:`colibri.plan`, :mod:`colibri.emit`); the
budget check reads the byte counts the emitter recorded, before anything is written, and the
output directory appears atomically or not at all. With --calib the reference stage first
collects each expert's calibration statistics (:mod:`colibri.reference.calibration`), which the
quantisation stage uses.
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
from ..quant.calib import CALIBRATED_SCHEMES, LayerCalib
from ..quant.model import (
    LayerQuant,
    TransformerQuant,
    quantize_moe_layer,
    quantize_transformer_as_asked,
)
from ..reference.accuracy import analyse_layer, load_calib, transformer_accuracy
from ..reference.calibration import layer_calibration, load_calib_ids, transformer_calibration

#: What `generate` compiles: one MoE layer, or a whole decoder.
Model = MoELayer | MoETransformer


def load(
    path: str | os.PathLike[str], config: str | None = None, layer: int | None = None
) -> Model:
    """The load stage: a Hugging Face checkpoint directory without --layer is a whole decoder,
    anything else one MoE layer (format detected from the content)."""
    if layer is None and config is None and is_hf_checkpoint(path):
        return load_transformer(path)
    return load_model(path, config, layer)


def quantise_transformer(
    model: MoETransformer, options: GenerateOptions, calib: np.ndarray | None = None
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
        tstats = transformer_calibration(model, load_calib_ids(source, model, options.context))
    q = quantize_transformer_as_asked(
        model,
        options.quant,
        options.act,
        options.dense_quant,
        options.router_quant,
        options.scale_search,
        tstats,
    )
    return q, tstats


def quantise_layer(
    layer: MoELayer, options: GenerateOptions, calib: np.ndarray | None = None
) -> tuple[LayerQuant, LayerCalib | None, np.ndarray | None]:
    """The calibrate + quantise stages of a lone MoE layer as `generate` runs them: the
    quantised layer, the calibration statistics and the calibration rows (None without
    --calib)."""
    stats = None
    if calib is not None or options.calib is not None:
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
    )
    return lq, stats, calib


def render(
    model: Model, options: GenerateOptions, calib: np.ndarray | None = None
) -> tuple[dict[str, FileContent], dict[str, Any]]:
    """Every stage from the IR to the emitted files and manifest (not yet budget-checked)."""
    board = load_board(options.board)
    if isinstance(model, MoETransformer):
        check_supported(model)
        q, tstats = quantise_transformer(model, options, calib)
        tplan = plan_whole_transformer(model, q, options.context)
        files, manifest = render_transformer(model, q, tplan, board.name, options.name)
        if q is not None and options.scale_search != "mse":
            manifest["options"]["scale_search"] = options.scale_search
        if q is not None and tstats is not None:
            manifest["options"]["calib"] = str(options.calib or "(array)")
            manifest["accuracy"] = transformer_accuracy(model, q, tstats)
        return files, manifest
    lq, stats, calib = quantise_layer(model, options, calib)
    analysis = analyse_layer(model, lq, options, calib, stats)
    lplan = plan_layer(model, lq, analysis, board, options)
    return render_layer(model, lq, analysis, lplan, options)


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
) -> tuple[Path, dict[str, Any]]:
    """Generate the C sources of `model` (an IR, or a path for the load stage) into out_dir."""
    ir = model if isinstance(model, (MoELayer, MoETransformer)) else load(model)
    files, manifest = render(ir, options, calib)
    check_fits(ir, manifest, options)
    return write_output(out_dir, files, manifest, force=force), manifest
