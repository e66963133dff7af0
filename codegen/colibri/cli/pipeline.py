"""`colibri generate` as one pipeline: its stages in order, data flowing one way.

    load -> IR -> quantise -> analyse -> plan (memory, placement) -> emit -> budget -> write

Each stage is a pure function of the previous stages' results (:mod:`colibri.frontends`,
:mod:`colibri.quant`, :mod:`colibri.reference`, :mod:`colibri.plan`, :mod:`colibri.emit`); the
budget check reads the byte counts the emitter recorded, before anything is written, and the
output directory appears atomically or not at all.
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
from ..frontends.hf import is_hf_checkpoint
from ..frontends.hf_model import load_transformer
from ..frontends.load import load_model
from ..ir.moe import MoELayer
from ..ir.transformer import MoETransformer
from ..options import DEFAULT_MAX_CONTEXT, GenerateOptions
from ..plan.budget import check_layer_budget, check_transformer_budget
from ..plan.model import plan_layer, plan_whole_transformer
from ..quant.model import quantize_moe_layer, quantize_transformer_as_asked
from ..reference.accuracy import analyse_layer

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


def render(
    model: Model, options: GenerateOptions, calib: np.ndarray | None = None
) -> tuple[dict[str, FileContent], dict[str, Any]]:
    """Every stage from the IR to the emitted files and manifest (not yet budget-checked)."""
    board = load_board(options.board)
    if isinstance(model, MoETransformer):
        check_supported(model)
        max_context = DEFAULT_MAX_CONTEXT if options.max_context is None else options.max_context
        q = quantize_transformer_as_asked(
            model, options.quant, options.act, options.dense_quant, options.router_quant
        )
        tplan = plan_whole_transformer(model, q, max_context)
        return render_transformer(model, q, tplan, board.name, options.name)
    lq = quantize_moe_layer(
        model, options.quant, options.expert_quant, options.act, options.router_quant
    )
    analysis = analyse_layer(model, lq, options, calib)
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
