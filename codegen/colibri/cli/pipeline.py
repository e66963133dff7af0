"""`colibri generate` and `colibri convert` as pipelines: their stages in order, data flowing
one way.

generate:

    load -> IR -> [calibrate] -> quantise -> analyse -> plan (memory, placement) -> emit ->
    [report] -> budget -> write

and with --calib, of a whole Hugging Face checkpoint, layer by layer as convert (memory holds
one layer's fp32 weights and statistics, the quantised model and the embedding / LM head; the
same files as the loaded model's stages):

    config -> check memory -> calibration ids ->
    [read -> calibrate -> quantise -> analyse -> routing] per layer -> plan -> emit ->
    report -> budget -> write

convert (:func:`convert`), a single MoE block (container version 1):

    check options -> load -> IR -> write

convert, a whole Hugging Face checkpoint (container version 2), layer by layer (memory holds
one layer):

    check options -> config -> check memory -> [read -> quantise -> write] per layer -> file

and with --calib the same, each layer calibrated before it is quantised (the fp32 residual
stream of every calibration sequence carried from layer to layer; the same file as calibrating
the loaded model):

    check options -> config -> check memory -> calibration ids ->
    [read -> calibrate -> quantise -> heat -> write] per layer -> file

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
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..boards import load_board
from ..emit.container import write_container
from ..emit.lmfile import check_max_context, write_lm_container_streamed
from ..emit.model import check_supported, check_supported_layer
from ..emit.model import render as emit
from ..emit.output import FileContent, write_output
from ..errors import ConfigError
from ..frontends.container import ALIGN, ENTRY_SIZE, HEADER_SIZE
from ..frontends.hf import HFCheckpoint, is_whole
from ..frontends.hf_model import (
    check_fits_memory_streamed,
    load_hf_config,
    load_transformer,
    read_decoder_layer,
    read_head,
    read_lm_head,
)
from ..frontends.load import load_model
from ..ir.model import Model, as_model
from ..ir.moe import MoELayer
from ..ir.transformer import (
    DecoderLayer,
    MoETransformer,
    TransformerConfig,
    TransformerHash,
    layer_tensors,
    tail_tensors,
)
from ..options import GenerateOptions
from ..plan.budget import check_fits
from ..plan.model import plan
from ..progress import SILENT, Progress, Stage
from ..quant.calib import (
    CALIBRATED_SCHEMES,
    DEFAULT_CALIB_METHOD,
    LayerCalib,
    check_calib_method,
)
from ..quant.formats import check_scheme
from ..quant.model import (
    TransformerQuant,
    check_dense_scheme,
    quantize_head,
    quantize_layer_all,
    quantize_layer_dense,
    quantize_layer_experts,
    quantize_moe_layer,
    quantize_transformer_as_asked,
    transformer_quant_as_asked,
)
from ..reference.accuracy import (
    accuracy_entry,
    analyse_layer,
    load_calib,
    moe_layer_accuracy,
    transformer_accuracy,
)
from ..reference.calibration import (
    LayerByLayer,
    layer_calibration,
    layer_heat,
    load_calib_ids,
    transformer_calibration,
)
from ..report.routing import (
    RoutingHeat,
    layer_routing,
    moe_layer_routing,
    routing_files,
    routing_summary,
    transformer_routing,
)
from .inspect import hf_report


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
        check_calib_scheme(options)
        with progress.stage("calibrate") as st:
            ids = load_calib_ids(source, model, options.context)
            tstats = transformer_calibration(model, ids, st, _wants_hidden(options))
    q = quantize_transformer_as_asked(
        model,
        options.quant,
        options.act,
        options.dense_quant,
        options.router_quant,
        options.scale_search,
        tstats,
        progress,
        options.calib_method,
    )
    return q, tstats


def quant_as_asked(options: GenerateOptions) -> TransformerQuant | None:
    """transformer_quant_as_asked for the options' --quant, --act, --dense-quant,
    --router-quant and --scale-search."""
    return transformer_quant_as_asked(
        options.quant,
        options.act,
        options.dense_quant,
        options.router_quant,
        options.scale_search,
    )


def check_calib_scheme(options: GenerateOptions) -> None:
    """ConfigError for --calib with a --quant it cannot calibrate."""
    if options.quant not in CALIBRATED_SCHEMES:
        raise ConfigError(
            f"--calib calibrates the routed experts' int8 / int4 / q4k / q5k scales, but "
            f"--quant is {options.quant}: pass --quant int8, int4, q4k or q5k (or drop "
            "--calib)"
        )


def check_calib_method_use(options: GenerateOptions, calib: bool = False) -> None:
    """ConfigError for a --calib-method without --calib (`calib`: calibration data given
    otherwise) or one that does not exist."""
    check_calib_method(options.calib_method)
    if options.calib_method != DEFAULT_CALIB_METHOD and options.calib is None and not calib:
        raise ConfigError(
            f"--calib-method {options.calib_method} chooses how --calib calibrates: pass "
            f"--calib FILE too (or drop --calib-method)"
        )


def _wants_hidden(options: GenerateOptions) -> bool:
    """Whether calibration keeps each expert's hidden activations on its sample rows (only
    --calib-method gptq's error compensation reads them); ConfigError for a --calib-method
    that cannot apply."""
    check_calib_method(options.calib_method)
    return options.calib_method == "gptq"


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
    check_calib_method_use(options, calib is not None)
    if model.decoder is not None:
        check_supported(model.decoder)
        return Quantised(*quantise_transformer(model.decoder, options, calib, progress))
    layer, stats = model.layer, None
    if calib is not None or options.calib is not None:
        with progress.stage("calibrate") as st:
            calib = load_calib(options, calib, layer.config.d_model)
            stats = layer_calibration(layer, calib, st, _wants_hidden(options))
    q = quantize_moe_layer(
        layer,
        options.quant,
        options.expert_quant,
        options.act,
        options.router_quant,
        options.scale_search,
        stats,
        progress,
        options.calib_method,
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
    with progress.stage("analyse", len(qd.stats)) as st:
        return transformer_accuracy(
            model.decoder, qd.q, qd.stats, lambda k, n: st.update(k, f"layer {k}/{n}")
        )


def render(
    model: Model | MoELayer | MoETransformer,
    options: GenerateOptions,
    calib: np.ndarray | None = None,
    progress: Progress = SILENT,
) -> tuple[dict[str, FileContent], dict[str, Any]]:
    """Every stage from the IR to the emitted files and manifest (not yet budget-checked);
    `progress` shows a line per stage (colibri.progress)."""
    m = as_model(model)
    qd = quantise(m, options, calib, progress)
    analysis = analyse(m, qd, options, progress)
    heats: list[RoutingHeat] | None = None
    if qd.stats is not None:  # the report stage of --calib: the routing heat map
        heats = (
            transformer_routing(m.decoder, qd.stats)
            if m.decoder is not None
            else [layer_routing(m.layer, qd.calib)]
        )
    return render_quantised(m, qd.q, analysis, heats, options, progress)


def render_quantised(
    m: Model,
    q: Any,
    analysis: Any,
    heats: list[RoutingHeat] | None,
    options: GenerateOptions,
    progress: Progress = SILENT,
) -> tuple[dict[str, FileContent], dict[str, Any]]:
    """The stages after the analysis: plan, emit and (`heats`: the routing of --calib's
    tokens) the report."""
    board = load_board(options.board)
    with progress.stage("plan"):
        p = plan(m, q, analysis, board, options)
    with progress.stage("emit"):
        files, manifest = emit(m, q, analysis, p, options, board)
    if heats is not None:
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
    """Generate the C sources of `model` (an IR, or a path for the load stage) into out_dir.
    A whole Hugging Face checkpoint's path with --calib (options.calib) is read, calibrated,
    quantised and analysed one layer at a time (:func:`calibrate_streamed`), with the same
    output as the loaded model's."""
    if calib is None and streams(model, options):
        assert isinstance(model, (str, os.PathLike))
        ir, q, analysis, heats = calibrate_streamed(model, options, progress)
        files, manifest = render_quantised(ir, q, analysis, heats, options, progress)
    else:
        ir = (
            load(model, progress=progress)
            if isinstance(model, (str, os.PathLike))
            else as_model(model)
        )
        files, manifest = render(ir, options, calib, progress)
    check_fits(ir, manifest, load_board(options.board), options)
    with progress.stage("write"):
        out = write_output(out_dir, files, manifest, force=force)
    return out, manifest


def streams(
    model: Model | MoELayer | MoETransformer | str | os.PathLike[str],
    options: GenerateOptions,
    config: str | None = None,
    layer: int | None = None,
) -> bool:
    """Whether `generate` runs `model` layer by layer (:func:`calibrate_streamed`): the path of
    a whole Hugging Face checkpoint, with --calib."""
    return (
        isinstance(model, (str, os.PathLike))
        and options.calib is not None
        and is_whole(model, config, layer)
    )


#: Shares of a layer's step on the line of a streamed `generate --calib` or `convert`: reading
#: it, the fp32 forward over the calibration sequences, the experts' statistics, the
#: quantisation, then (generate) the analysis (about the measured split on the 353 M-parameter
#: Mixtral of benchmarks/scale_table.py). Without --calib the quantisation takes the layer's
#: whole step after its read.
LAYER_SHARES = {
    "read": 0.06,
    "batch": 0.18,
    "statistics": 0.06,
    "quantise": 0.62,
    "analyse": 0.08,
}


class LayerLine:
    """A streamed command's one progress line over the n layers of a checkpoint (the embedding
    and LM head first, as step 0): :meth:`show` puts layer i's part at its share of step i + 1,
    labelled ``layer i+1/n  <label>``."""

    def __init__(self, st: Stage, n: int, calibrated: bool) -> None:
        self.st, self.n = st, n
        shares = dict(LAYER_SHARES)
        if not calibrated:  # the quantisation takes the rest of the layer's step
            shares.update(batch=0.0, statistics=0.0, quantise=1.0 - shares["read"], analyse=0.0)
        self.shares = shares
        self.starts = dict(zip(shares, np.cumsum([0.0, *list(shares.values())[:-1]]), strict=True))

    def show(self, i: int, part: str, k: int, m: int, label: str) -> None:
        at = self.starts[part] + self.shares[part] * k / max(m, 1)
        self.st.update(i + 1 + at, f"layer {i + 1}/{self.n}  {label}")


def walk_layers(
    ckpt: HFCheckpoint,
    c: TransformerConfig,
    walk: LayerByLayer | None,
    hidden: bool,
    line: LayerLine,
) -> Iterator[tuple[int, DecoderLayer, LayerCalib | None]]:
    """Each decoder layer of `ckpt` in order, read and checked, with (walk given, up to the
    last MoE layer) its calibration: the fp32 forward of the calibration sequences through it
    and its experts' statistics (:class:`LayerByLayer`). The caller quantises and drops it."""
    n = c.n_layers
    last_moe = max((i for i in range(n) if ckpt.is_moe_layer(i)), default=-1)
    for i in range(n):
        line.show(i, "read", 0, 1, "read")
        layer = read_decoder_layer(ckpt, c, i)
        check_supported_layer(i, layer)
        lcal: LayerCalib | None = None
        if walk is not None and i <= last_moe:

            def part(what: str, k: int, m: int, i: int = i) -> None:
                label = f"batch {k}/{m}" if what == "batch" else f"statistics  expert {k}/{m}"
                line.show(i, what, k, m, f"calibrate  {label}")

            lcal = walk.advance(i, layer, hidden, part)
        yield i, layer, lcal
        del layer, lcal  # not held while the next layer is read


def calibrate_streamed(
    path: str | os.PathLike[str], options: GenerateOptions, progress: Progress = SILENT
) -> tuple[Model, TransformerQuant, dict[str, Any], list[RoutingHeat]]:
    """The load, calibrate, quantise, analyse and routing stages of `generate CKPT --calib`,
    one decoder layer at a time as `convert --calib` (:func:`convert_streamed`): each layer is
    read and hashed, run over the calibration sequences (:class:`LayerByLayer`), its experts'
    statistics collected, quantised, its accuracy and routing taken, then its statistics and
    the fp32 weights that were quantised dropped (:func:`drop_quantised`). Returns the model
    (its quantised matrices' fp32 weights dropped; its hash and storage maps kept), the
    quantised weights, the manifest's accuracy entry and the routing heat map, each equal to
    the loaded model's stages (so the generated files are the same bytes)."""
    calib = options.calib
    if calib is None:
        raise ConfigError("generate streams a checkpoint to calibrate it: pass --calib FILE")
    ckpt = HFCheckpoint(path)
    c = load_hf_config(ckpt)
    check_calib_method_use(options)
    check_calib_scheme(options)
    q = quant_as_asked(options)
    assert q is not None  # a calibrated scheme is quantised
    check_fits_memory_streamed(ckpt)
    search, method = options.scale_search, options.calib_method
    hidden = _wants_hidden(options)
    n = c.n_layers
    accuracy: list[dict[str, Any]] = []
    tokens: list[int] = []
    heats: list[RoutingHeat] = []
    layers: list[DecoderLayer] = []
    with progress.stage("layers", n + 1) as st:
        st.update(0, "embedding / LM head")
        model = read_head(ckpt, c)
        digest = TransformerHash(c)
        digest.update([("embed", model.embed)])
        walk = LayerByLayer(model, load_calib_ids(calib, model, options.context))
        quantize_head(q, model, search)
        if q.dense_scheme != "fp32":  # stored quantised (an untied LM head read again last)
            model.embed = _dropped(model.embed)
            model.lm_head = model.embed if c.tie_word_embeddings else _dropped(model.lm_head)
        line = LayerLine(st, n, calibrated=True)
        for i, layer, lcal in walk_layers(ckpt, c, walk, hidden, line):
            digest.update(layer_tensors(i, layer))
            analysed = lcal is not None and layer.moe is not None

            def quant(k: int, m: int, i: int = i, analysed: bool = analysed) -> None:
                # the last expert's count is the analysis' start: drawn at once, the line's
                # redraw limit (colibri.progress.REDRAW_SECONDS) would hide "analyse" instead
                if k < m or not analysed:
                    line.show(i, "quantise", k, m, f"quantise  expert {k}/{m}")

            quantize_layer_experts(q, i, layer, search, lcal, quant, method)
            quantize_layer_dense(q, i, layer, search)
            if analysed:
                assert lcal is not None and layer.moe is not None
                line.show(i, "analyse", 0, 1, "analyse")
                accuracy.append(moe_layer_accuracy(i, layer.moe, q, lcal))
                tokens.append(lcal.tokens)
                heats.append(moe_layer_routing(i, layer.moe, lcal))
            del lcal
            drop_quantised(layer, q)
            layers.append(layer)
        st.update(n + 1, f"layer {n}/{n}")
    if q.dense_scheme != "fp32" and not c.tie_word_embeddings:  # the hash reads it
        digest.update(tail_tensors(replace(model, lm_head=read_lm_head(ckpt, c))))
    else:
        digest.update(tail_tensors(model))
    model.layers, model.sha256 = layers, digest.hexdigest()
    return as_model(model), q, accuracy_entry(accuracy, tokens), heats


def _dropped(a: np.ndarray) -> np.ndarray:
    """A stand-in for fp32 weights the generated C stores quantised: the same shape, dtype and
    nbytes (what the plan and the manifest read), no memory, NaN if anything reads it."""
    return np.broadcast_to(np.float32(np.nan), a.shape)


def drop_quantised(layer: DecoderLayer, q: TransformerQuant) -> None:
    """Replace the fp32 matrices of `layer` that `q` stores quantised by :func:`_dropped`
    stand-ins (the routed experts with --quant, the attention projections, shared expert and
    dense MLP with --dense-quant), keeping its storage map, norms, routers and biases."""
    moe = layer.moe
    if moe is not None:
        moe.storage = moe.storage_map()
    ffns = []
    if moe is not None and q.scheme != "fp32":
        ffns += moe.experts
    if q.dense_scheme != "fp32":
        a = layer.attention
        a.wq, a.wk, a.wv, a.wo = (_dropped(w) for w in (a.wq, a.wk, a.wv, a.wo))
        ffn = layer.mlp if moe is None else moe.shared_expert
        ffns += [ffn] if ffn is not None else []
    for e in ffns:
        e.w1, e.w2 = _dropped(e.w1), _dropped(e.w2)
        e.w3 = _dropped(e.w3) if e.w3 is not None else None


# -- convert ------------------------------------------------------------------------------------


@dataclass
class Converted:
    """What `convert` wrote: the file, and for its summary line either the single MoE block
    (`layer`, version 1) or the whole model's config, quantisation (None: all fp32) and
    whether the file holds the tokenizer and the calibration heat (version 2)."""

    path: Path
    layer: MoELayer | None = None
    config: TransformerConfig | None = None
    q: TransformerQuant | None = None
    tokenizer: bool = False
    heat: bool = False


def convert(
    model: str | os.PathLike[str],
    out: str | os.PathLike[str],
    options: GenerateOptions,
    config: str | None = None,
    layer: int | None = None,
    progress: Progress = SILENT,
) -> Converted:
    """`colibri convert`: a Hugging Face checkpoint directory without `layer` becomes a whole
    model container (version 2, :func:`convert_whole`), anything else one MoE block's
    (version 1): check options -> load -> write. `options` holds the quantisation flags (a
    single block takes none: its container stores fp32)."""
    if is_whole(model, config, layer):
        return convert_whole(model, out, options, progress)
    check_block_options(options)
    with progress.stage("load"):
        block = load_model(model, config, layer)
    with progress.stage("write"):
        path = write_container(block, out)
    return Converted(path, layer=block)


def check_block_options(options: GenerateOptions) -> None:
    """The check options stage of a single block: a version-1 container stores fp32 weights,
    so a quantisation flag is an error, not silently ignored."""
    asked = [
        flag
        for flag, on in (
            ("--quant", options.quant != "fp32"),
            ("--expert-quant", options.expert_quant is not None),
            ("--router-quant", options.router_quant != "fp32"),
            ("--act", options.act is not None),
            ("--dense-quant", options.dense_quant != "fp32"),
            ("--calib", options.calib is not None),
            ("--max-context", options.max_context is not None),
        )
        if on
    ]
    if asked:
        raise ConfigError(
            f"{', '.join(asked)}: a single-block container (version 1) stores fp32 weights; "
            f"quantised containers are whole models (a Hugging Face checkpoint without --layer), "
            f"or generate C (`colibri generate ... --quant`)"
        )


def convert_whole(
    model: str | os.PathLike[str],
    out: str | os.PathLike[str],
    options: GenerateOptions,
    progress: Progress = SILENT,
) -> Converted:
    """`colibri convert CKPT --out F.clb` of a whole Hugging Face checkpoint: the container
    version 2 holds exactly what `generate` with the same flags stores (colibri.emit.lmfile),
    with the checkpoint's tokenizer.json when it has one. The layers are read, calibrated (with
    --calib), quantised and written one at a time (:func:`convert_streamed`), so memory holds
    one layer, not the model."""
    if options.expert_quant is not None:
        raise ConfigError(
            "--expert-quant: a single MoE layer option (pass --layer N); a whole transformer "
            "takes --quant, --act, --calib, --router-quant and --dense-quant"
        )
    tok = Path(model) / "tokenizer.json"
    tok_bytes = tok.read_bytes() if tok.is_file() else None
    check_calib_method_use(options)
    return convert_streamed(model, out, options, tok_bytes, progress)


def convert_streamed(
    model: str | os.PathLike[str],
    out: str | os.PathLike[str],
    options: GenerateOptions,
    tokenizer: bytes | None = None,
    progress: Progress = SILENT,
) -> Converted:
    """Convert one decoder layer at a time: read it, (with --calib) run the fp32 reference of
    the calibration sequences through it and collect its experts' statistics
    (:class:`colibri.reference.calibration.LayerByLayer`), quantise it, write it (with its
    experts' calibration heat), drop it. The file is byte for byte the whole-model
    conversion's; the `convert` line shows each layer's parts."""
    ckpt = HFCheckpoint(model)
    c = load_hf_config(ckpt)
    check_max_context(options.context)
    if options.calib is not None:
        check_calib_scheme(options)
    q = quant_as_asked(options)
    check_fits_memory_streamed(ckpt)
    search, method = options.scale_search, options.calib_method
    hidden = _wants_hidden(options)
    n = c.n_layers
    heated = False
    with progress.stage("convert", n + 1) as st:
        st.update(0, "embedding / LM head")
        head = read_head(ckpt, c)
        walk: LayerByLayer | None = None
        if options.calib is not None:
            walk = LayerByLayer(head, load_calib_ids(options.calib, head, options.context))
        if q is not None:
            quantize_head(q, head, search)
        line = LayerLine(st, n, calibrated=walk is not None)

        def layers() -> Iterator[tuple[DecoderLayer, TransformerQuant | None, np.ndarray | None]]:
            nonlocal heated
            for i, layer, lcal in walk_layers(ckpt, c, walk, hidden, line):

                def quant(k: int, m: int, i: int = i) -> None:
                    line.show(i, "quantise", k, m, f"quantise  expert {k}/{m}")

                lq = (
                    quantize_layer_all(q, i, layer, search, lcal, quant, method)
                    if q is not None
                    else None
                )
                heat = None
                if lcal is not None and layer.moe is not None:
                    heat, heated = layer_heat(layer.moe, lcal), True
                del lcal
                yield layer, lq, heat
                del layer, lq, heat

        def needed() -> int:  # only for a full disk's message
            return streamed_bytes(model, options, tokenizer)

        path = write_lm_container_streamed(
            out, head, q, options.context, layers(), tokenizer, needed
        )
    return Converted(path, None, c, q, tokenizer is not None, heated)


def streamed_bytes(
    model: str | os.PathLike[str], options: GenerateOptions, tokenizer: bytes | None
) -> int:
    """About the disk space a layer-by-layer convert needs: twice the file (its tensors go
    to a spool file beside it, then are copied in), the file's size estimated as `colibri
    inspect` does from the safetensors headers (weights of the scheme, RoPE tables)."""
    quant, dense = check_scheme(options.quant), check_dense_scheme(options.dense_quant)
    rep = hf_report(Path(model), options.context)
    # inspect tabulates dense fp32 / int8: fp16 is bounded by fp32's, 4- / 5-bit by int8's
    shown = {"fp16": "fp32", "int4": "int8", "q4k": "int8", "q5k": "int8"}.get(dense, dense)
    v = next(v for v in rep.variants if v.quant == quant and v.dense_quant == shown)
    # a table entry and alignment per tensor: the checkpoint's, and as many again (scales,
    # layer descriptors), plus the header and metadata
    tensors = 2 * len(HFCheckpoint(model).names())
    overhead = HEADER_SIZE + tensors * (ENTRY_SIZE + ALIGN) + 4096
    return 2 * (v.weight_bytes + len(tokenizer or b"") + overhead)
