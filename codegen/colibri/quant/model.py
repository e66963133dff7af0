"""Quantisation of a whole model: what `colibri generate` stores with --quant and its kin.

A lone MoE layer (:func:`quantize_moe_layer` -> :class:`LayerQuant`): each stored expert in its
scheme (``--quant``, per expert ``--expert-quant``, activations ``--act``) and the router
(``--router-quant``). A whole transformer (:func:`quantize_transformer` ->
:class:`TransformerQuant`): the routed experts of every MoE layer in one scheme
(:mod:`colibri.quant.formats`), and with ``dense`` fp16 / int8 / int4 / q4k / q5k
(``--dense-quant``) every other matrix: attention q/k/v/o, Qwen's shared expert and dense
MLPs, the token embedding and the LM head (one table when tied); routers on request. Norms,
biases and the shared expert's gate stay fp32. :func:`colibri.reference.transformer.forward`
runs the result through the kernels' mirror.

int8 / int4 scales come from the scale search (``--scale-search mse``, the default; ``none``:
the plain method), and with calibration statistics (``--calib``, per MoE layer a
:class:`~colibri.quant.calib.LayerCalib`) every routed expert that calibration hit is chosen by
its measured output error (:func:`colibri.quant.calib.quantize_expert_calibrated`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..errors import ConfigError
from ..ir.moe import MoELayer
from ..ir.transformer import DecoderLayer, MoETransformer
from ..progress import SILENT, Progress, Stage, Tick
from .calib import DEFAULT_CALIB_METHOD, LayerCalib, quantize_expert_calibrated
from .formats import (
    DEFAULT_SCALE_SEARCH,
    QuantExpert,
    QuantPlan,
    QuantRouter,
    QuantTensor,
    check_router_scheme,
    check_scale_search,
    check_scheme,
    make_plan,
    quantize_expert,
    quantize_layer,
    quantize_matrix,
    quantize_router,
)


@dataclass
class LayerQuant:
    """The stored form of a lone MoE layer: per-expert schemes, the quantised stored experts
    (keyed by the storing expert's index) and the router."""

    plan: QuantPlan
    experts: dict[int, QuantExpert]
    router: QuantRouter

    @property
    def quantised(self) -> bool:
        """Whether anything is stored in another scheme than fp32."""
        return any(q.scheme != "fp32" for q in self.experts.values()) or (
            self.router.scheme != "fp32"
        )


def quantize_experts(
    layer: MoELayer,
    plan: QuantPlan,
    search: str = DEFAULT_SCALE_SEARCH,
    calib: LayerCalib | None = None,
    tick: Tick | None = None,
    method: str = DEFAULT_CALIB_METHOD,
) -> dict[int, QuantExpert]:
    """Every stored expert of the layer in its plan's scheme (keyed by the storing expert's
    index), calibrated by `calib` when given (experts it never hit as without; `method`: the
    --calib-method); `tick(done, total)` follows the experts."""
    check_scale_search(search)
    if calib is None:
        return quantize_layer(layer, plan, search, tick)
    out: dict[int, QuantExpert] = {}
    stored = sorted(set(layer.storage_map()))
    for n, idx in enumerate(stored, start=1):
        out[idx] = quantize_expert_calibrated(
            layer.experts[idx],
            plan.schemes[idx],
            plan.acts[idx],
            calib.experts.get(idx),
            calib.run,
            layer.config.gated,
            f"expert.{idx}",
            search,
            method,
        )
        if tick is not None:
            tick(n, len(stored))
    return out


def quantize_moe_layer(
    layer: MoELayer,
    quant: str = "fp32",
    expert_quant: str | None = None,
    act: str | None = None,
    router: str = "fp32",
    search: str = DEFAULT_SCALE_SEARCH,
    calib: LayerCalib | None = None,
    progress: Progress = SILENT,
    method: str = DEFAULT_CALIB_METHOD,
) -> LayerQuant:
    """Quantise a lone MoE layer as `colibri generate --quant --expert-quant --act
    --router-quant --scale-search [--calib --calib-method]` asks (`progress`: a line counting
    the experts)."""
    plan = make_plan(layer.config.n_experts, quant, expert_quant, act)
    with progress.stage("quantise", len(set(layer.storage_map()))) as st:
        experts = quantize_experts(
            layer, plan, search, calib, lambda k, n: st.update(k, f"expert {k}/{n}"), method
        )
    return LayerQuant(plan, experts, quantize_router(layer.router_w, router))


#: Schemes of --dense-quant: every matrix that is not a routed expert (embedding and LM head
#: included, as llama.cpp keeps token_embd in the quantisation type) in one of them.
DENSE_SCHEMES = ("fp32", "fp16", "int8", "int4", "q4k", "q5k")
#: The attention projections of every layer, as named in the IR and the generated C.
ATTENTION_PROJECTIONS = ("wq", "wk", "wv", "wo")


@dataclass
class TransformerQuant:
    """The quantised weights of a transformer, as `colibri generate --quant SCHEME [--act MODE]
    [--dense-quant SCHEME]` stores them: the routed experts of every MoE layer (layer index ->
    stored expert index -> QuantExpert) and, when dense_scheme is not fp32, the rest
    (``dense``: "embed", "lm_head" (absent when tied), "l<i>.wq" .. "l<i>.wo" as [out, in];
    ``dense_ffn``: layer index -> its shared expert or dense MLP) and, with router_scheme fp16 /
    int8, the routers (dequantised per element before the fp32 accumulation, as the C router
    does)."""

    scheme: str
    act: str
    experts: dict[int, dict[int, QuantExpert]]
    dense_scheme: str = "fp32"
    dense_act: str = "fp32"
    dense: dict[str, QuantTensor] = field(default_factory=dict)
    dense_ffn: dict[int, QuantExpert] = field(default_factory=dict)
    #: --router-quant: every MoE layer's router (layer index -> QuantRouter) when not fp32.
    router_scheme: str = "fp32"
    routers: dict[int, QuantRouter] = field(default_factory=dict)

    def lm_head(self) -> QuantTensor:
        """The LM head's tensor (the embedding's when tied)."""
        return self.dense.get("lm_head", self.dense["embed"])


def check_dense_scheme(dense: str) -> str:
    dense = check_scheme(dense, "--dense-quant")
    if dense not in DENSE_SCHEMES:
        raise ConfigError(
            f"--dense-quant {dense} is not supported; supported: {', '.join(DENSE_SCHEMES)}"
        )
    return dense


def quantize_transformer(
    model: MoETransformer,
    scheme: str = "int8",
    act: str | None = None,
    dense: str = "fp32",
    router: str = "fp32",
    search: str = DEFAULT_SCALE_SEARCH,
    calib: dict[int, LayerCalib] | None = None,
    progress: Progress = SILENT,
    method: str = DEFAULT_CALIB_METHOD,
) -> TransformerQuant:
    """Quantise the routed experts of every MoE layer (colibri.quant.formats; calibrated per
    layer by calib[layer index] when given) and, with dense fp16 / int8 / int4 / q4k / q5k,
    every other matrix; act is the activation mode of int8/int4 matrices (default int8: integer
    dot products; fp16 has no integer kernel and keeps fp32); search is the int8 / int4 scale
    search. `progress` shows one line counting the layers and their experts."""
    q = new_transformer_quant(scheme, act, dense, router, search)
    with progress.stage("quantise", _quant_steps(model, q.dense_scheme)) as st:
        _quantize_transformer(q, model, search, calib, st, method)
    return q


def _quant_steps(model: MoETransformer, dense: str) -> int:
    """Steps of the quantise line: each MoE layer's experts, and with --dense-quant each
    layer's other matrices and the embedding / LM head."""
    moe = sum(layer.moe is not None for layer in model.layers)
    return moe + (len(model.layers) + 1 if dense != "fp32" else 0)


def _quantize_transformer(
    q: TransformerQuant,
    model: MoETransformer,
    search: str,
    calib: dict[int, LayerCalib] | None,
    st: Stage,
    method: str = DEFAULT_CALIB_METHOD,
) -> None:
    """Every layer of `model` into `q` (its schemes set by :func:`new_transformer_quant`)."""
    n_layers = len(model.layers)
    step = 0
    for i, layer in enumerate(model.layers):
        if layer.moe is None:
            continue
        lcal = calib.get(i) if calib is not None else None

        def tick(k: int, n: int, i: int = i, step: int = step) -> None:
            st.update(step + k / n, f"layer {i + 1}/{n_layers}  expert {k}/{n}")

        quantize_layer_experts(q, i, layer, search, lcal, tick, method)
        step += 1
    if q.dense_scheme == "fp32":
        return
    quantize_head(q, model, search)
    step += 1
    st.update(step, "embedding / LM head")
    for i, layer in enumerate(model.layers):
        quantize_layer_dense(q, i, layer, search)
        step += 1
        st.update(step, f"layer {i + 1}/{n_layers}  dense")


def new_transformer_quant(
    scheme: str, act: str | None, dense: str, router: str, search: str = DEFAULT_SCALE_SEARCH
) -> TransformerQuant:
    """An empty TransformerQuant with its schemes and activation modes checked and set; the
    ``quantize_*`` functions below fill it (all at once, or one layer at a time)."""
    check_scale_search(search)
    plan_act = make_plan(1, scheme, None, act).acts[0]
    q = TransformerQuant(scheme=scheme, act=plan_act, experts={})
    q.router_scheme = check_router_scheme(router)
    q.dense_scheme = check_dense_scheme(dense)
    if q.dense_scheme in ("q4k", "q5k") and act == "fp32":
        raise ConfigError(
            f"--act fp32 with --dense-quant {q.dense_scheme}: {q.dense_scheme} matrices have "
            f"int8-activation kernels only; drop --act fp32, or pick --dense-quant int8 or int4"
        )
    if q.dense_scheme != "fp32":
        q.dense_act = make_plan(1, q.dense_scheme, None, act).acts[0]
    return q


def quantize_layer_experts(
    q: TransformerQuant,
    i: int,
    layer: DecoderLayer,
    search: str = DEFAULT_SCALE_SEARCH,
    calib: LayerCalib | None = None,
    tick: Tick | None = None,
    method: str = DEFAULT_CALIB_METHOD,
) -> None:
    """The routed experts (and with --router-quant the router) of MoE layer `i` into q."""
    if layer.moe is None:
        return
    plan = make_plan(layer.moe.config.n_experts, q.scheme, None, _act_arg(q.scheme, q.act))
    q.experts[i] = quantize_experts(layer.moe, plan, search, calib, tick, method)
    if q.router_scheme != "fp32":
        q.routers[i] = quantize_router(layer.moe.router_w, q.router_scheme)


def _act_arg(scheme: str, act: str) -> str | None:
    """The --act that gives `act` for `scheme` (None: the scheme's default)."""
    return None if scheme in ("fp32", "fp16") else act


def quantize_head(q: TransformerQuant, model: MoETransformer, search: str) -> None:
    """With --dense-quant, the embedding and the LM head (of `model` only these are read)."""
    if q.dense_scheme == "fp32":
        return
    # int8: one scale per block of 32 inputs (as llama.cpp's Q8_0), not per output channel:
    # measured on the 3.6 M-parameter trained Mixtral (benchmarks/accuracy_table.py), top-1
    # 98.73 % -> 99.12 % with the attention projections block-scaled, for 3 % more bytes.
    blocks = q.dense_scheme == "int8"
    dense = q.dense_scheme
    q.dense["embed"] = quantize_matrix(model.embed, dense, "embed", search, blocks=blocks)
    if not model.config.tie_word_embeddings:
        q.dense["lm_head"] = quantize_matrix(model.lm_head, dense, "lm_head", search, blocks=blocks)


def quantize_layer_dense(
    q: TransformerQuant, i: int, layer: DecoderLayer, search: str = DEFAULT_SCALE_SEARCH
) -> None:
    """With --dense-quant, the attention projections and the shared expert / dense MLP of
    layer `i` into q."""
    if q.dense_scheme == "fp32":
        return
    blocks = q.dense_scheme == "int8"
    for n in ATTENTION_PROJECTIONS:
        w = getattr(layer.attention, n)
        q.dense[f"l{i}.{n}"] = quantize_matrix(
            w.T, q.dense_scheme, f"l{i}.{n}", search, blocks=blocks
        )
    ffn = layer.mlp if layer.moe is None else layer.moe.shared_expert
    if ffn is not None:
        q.dense_ffn[i] = quantize_expert(ffn, q.dense_scheme, q.dense_act, f"l{i}.ffn", search)


def quantize_layer_all(
    q: TransformerQuant,
    i: int,
    layer: DecoderLayer,
    search: str = DEFAULT_SCALE_SEARCH,
    calib: LayerCalib | None = None,
    tick: Tick | None = None,
    method: str = DEFAULT_CALIB_METHOD,
) -> TransformerQuant:
    """Everything of layer `i` (experts, router, dense matrices) into a copy of q's schemes
    holding only that layer: what a container streamed one layer at a time stores for it
    (`calib`: the layer's calibration statistics; `tick(k, n)` after each stored expert)."""
    lq = replace(q, experts={}, dense={}, dense_ffn={}, routers={})
    quantize_layer_experts(lq, i, layer, search, calib, tick, method)
    quantize_layer_dense(lq, i, layer, search)
    return lq


def quantize_transformer_as_asked(
    model: MoETransformer,
    quant: str = "fp32",
    act: str | None = None,
    dense: str = "fp32",
    router: str = "fp32",
    search: str = DEFAULT_SCALE_SEARCH,
    calib: dict[int, LayerCalib] | None = None,
    progress: Progress = SILENT,
    method: str = DEFAULT_CALIB_METHOD,
) -> TransformerQuant | None:
    """The quantisation stage of a whole transformer: None when everything stays fp32 (the
    generated C then holds no quantisation code), else every layer quantised as
    :func:`quantize_transformer` does, into :func:`transformer_quant_as_asked`'s schemes."""
    q = transformer_quant_as_asked(quant, act, dense, router, search)
    if q is not None:
        with progress.stage("quantise", _quant_steps(model, q.dense_scheme)) as st:
            _quantize_transformer(q, model, search, calib, st, method)
    return q


def transformer_quant_as_asked(
    quant: str = "fp32",
    act: str | None = None,
    dense: str = "fp32",
    router: str = "fp32",
    search: str = DEFAULT_SCALE_SEARCH,
) -> TransformerQuant | None:
    """The schemes of a whole transformer's quantisation as --quant, --act, --dense-quant,
    --router-quant and --scale-search ask them, checked: an empty TransformerQuant for the
    ``quantize_*`` functions to fill (all layers at once, or one at a time), or None when
    everything stays fp32. --act without an int8/int4 matrix to apply to is an error."""
    quant = check_scheme(quant)
    dense = check_dense_scheme(dense)
    integer_dense = dense not in ("fp32", "fp16")
    q: TransformerQuant | None = None
    if quant != "fp32" or dense != "fp32" or router != "fp32":
        q = new_transformer_quant(quant, act, dense, router, search)
    if act is not None and (q is None or (q.scheme in ("fp32", "fp16") and not integer_dense)):
        raise ConfigError(
            "--act applies to int8/int4 matrices: pass --quant int8|int4 or --dense-quant "
            "int8|int4 too"
        )
    return q
