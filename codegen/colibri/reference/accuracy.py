"""Analysis of a quantised model against the fp32 reference, on calibration inputs.

:func:`analyse_layer` is the generator's analysis stage (after quantisation, before planning):
it routes the calibration tokens (--calib, or seeded random ones) to get each expert's heat
(which drives placement) and measures the accuracy report.

Per layer: max-abs error and relative RMS error of the output, cosine similarity, and routing
agreement (the fraction of tokens whose top-k expert *set* is unchanged). The router stays
fp32, so for a single layer the routing is unchanged by construction; the figure is kept so
that stacked layers (whose inputs move) and a quantised router report it the same way.

Per stored expert (:func:`expert_report`): its calibration hits and the relative error of its
output on the calibration tokens routed to it, with the plain scales (``plain``, the method
before issue 15) and as stored (``stored``: scale search, and calibration when --calib was
given), through the kernels' mirror against the fp32 expert. :func:`transformer_accuracy` is
the same report for every MoE layer of a whole transformer calibrated with --calib.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..frontends.export import EXPORT_TOLERANCE, ExportCheckFailed, import_torch, torch_block
from ..frontends.hf import HFConfig
from ..frontends.load import check_input, load_npy
from ..ir.moe import MoELayer
from ..ir.transformer import MoETransformer
from ..options import DEFAULT_CALIB_SEED, DEFAULT_CALIB_TOKENS, GenerateOptions
from ..progress import Tick
from ..quant.calib import ExpertCalib, LayerCalib, output_error, target_energy
from ..quant.formats import QuantExpert, QuantRouter, quantize_expert
from ..quant.model import LayerQuant, TransformerQuant
from .calibration import layer_calibration
from .kernels import quant_moe_forward
from .moe import compare, moe_forward, route

#: Experts listed one per line under each layer by format_accuracy (more: a summary line; the
#: manifest has them all).
MAX_LISTED_EXPERTS = 16


def error_metrics(y: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """max-abs, relative RMS and cosine similarity of y vs ref."""
    y = np.asarray(y, dtype=np.float64).ravel()
    ref = np.asarray(ref, dtype=np.float64).ravel()
    diff = y - ref
    rms_ref = float(np.sqrt(np.mean(ref**2))) if ref.size else 0.0
    rel = float(np.sqrt(np.mean(diff**2))) / rms_ref if rms_ref > 0 else 0.0
    ny, nr = float(np.linalg.norm(y)), float(np.linalg.norm(ref))
    cos = float(np.dot(y, ref) / (ny * nr)) if ny > 0 and nr > 0 else 1.0
    return {
        "max_abs_error": float(np.max(np.abs(diff))) if diff.size else 0.0,
        "rel_rms_error": rel,
        "cosine": cos,
    }


def routing_agreement(ids: np.ndarray, ref_ids: np.ndarray) -> float:
    """Fraction of tokens whose set of k experts is the same."""
    if ids.shape[0] == 0:
        return 1.0
    same = np.all(np.sort(ids, axis=1) == np.sort(ref_ids, axis=1), axis=1)
    return float(np.mean(same))


def _rel(err: float, energy: float) -> float:
    return float(np.sqrt(err / energy)) if energy > 0 else 0.0


def expert_report(
    layer: MoELayer, qexperts: dict[int, QuantExpert], calib: LayerCalib
) -> list[dict[str, Any]]:
    """Per stored expert: scheme, calibration hits and the relative error (sqrt of sum of
    squares over its calibration tokens, vs the fp32 expert) of its output with the plain
    scales and as stored (None when calibration never hit it); with calibration, how it was
    chosen ("method": plain / search / calibrated / blocks / blocks-sample / compensated, and
    the fold's "alpha")."""
    out: list[dict[str, Any]] = []
    for idx, qe in sorted(qexperts.items()):
        st = calib.experts.get(idx)
        hits = st.hits if st is not None else 0
        entry: dict[str, Any] = {"expert": idx, "scheme": qe.scheme, "hits": hits}
        if st is None or hits == 0:
            entry.update(plain=None, stored=None)
        elif qe.calibration is not None:
            cal, energy = qe.calibration, qe.calibration["target_energy"]
            entry.update(
                plain=_rel(cal["plain_error"], energy),
                stored=_rel(cal["error"], energy),
                method=cal["method"],
                alpha=cal["alpha"],
            )
        else:
            entry.update(_errors(layer, idx, qe, st, calib))
        out.append(entry)
    return out


def _errors(
    layer: MoELayer, idx: int, qe: QuantExpert, st: ExpertCalib, calib: LayerCalib
) -> dict[str, float]:
    energy = target_energy(qe, st)
    plain = quantize_expert(layer.experts[idx], qe.scheme, qe.act, f"expert.{idx}", "none")
    return {
        "plain": _rel(output_error(plain, st, calib.run), energy),
        "stored": _rel(output_error(qe, st, calib.run), energy),
    }


def layer_metrics(
    layer: MoELayer, qexperts: dict[int, QuantExpert], x: np.ndarray, router: QuantRouter | None
) -> dict[str, float]:
    """Output errors of the quantised routed experts (their gated sum; a shared expert is left
    out) and routing agreement vs fp32 on rows x."""
    if layer.shared_expert is not None:
        layer = replace(layer, shared_expert=None, shared_gate=None)
    ref, r = moe_forward(layer, x)
    y, rq = quant_moe_forward(layer, qexperts, x, router)
    m = error_metrics(y, ref)
    m["routing_agreement"] = routing_agreement(rq.expert_ids, r.expert_ids)
    return m


def accuracy_report(
    layer: MoELayer,
    qexperts: dict[int, QuantExpert],
    x: np.ndarray,
    router: QuantRouter | None = None,
    calib: LayerCalib | None = None,
) -> dict[str, Any]:
    """The manifest's "accuracy" entry (one layer), with the per-expert report on x's routing
    (or on `calib`, the statistics of x when the caller has them)."""
    m = layer_metrics(layer, qexperts, x, router)
    experts = expert_report(layer, qexperts, calib or layer_calibration(layer, x))
    return {"tokens": int(x.shape[0]), "layers": [{"layer": 0, **m, "experts": experts}]}


def transformer_accuracy(
    model: MoETransformer,
    q: TransformerQuant,
    calib: dict[int, LayerCalib],
    tick: Tick | None = None,
) -> dict[str, Any]:
    """The manifest's "accuracy" entry of a whole transformer calibrated with --calib: per MoE
    layer, the errors of its routed experts' output on a sample of its calibration inputs
    ("inputs" rows) and the per-expert report; `tick(k, n)` after each of the n layers."""
    layers: list[dict[str, Any]] = []
    for k, (i, lc) in enumerate(sorted(calib.items()), start=1):
        moe = model.layers[i].moe
        assert moe is not None
        layers.append(moe_layer_accuracy(i, moe, q, lc))
        if tick is not None:
            tick(k, len(calib))
    return accuracy_entry(layers, [lc.tokens for lc in calib.values()])


def moe_layer_accuracy(
    i: int, moe: MoELayer, q: TransformerQuant, lc: LayerCalib
) -> dict[str, Any]:
    """One layer's entry of :func:`transformer_accuracy` (MoE layer `i` of the model)."""
    m = layer_metrics(moe, q.experts[i], lc.inputs, q.routers.get(i))
    experts = expert_report(moe, q.experts[i], lc)
    return {"layer": i, "inputs": int(lc.inputs.shape[0]), **m, "experts": experts}


def accuracy_entry(layers: list[dict[str, Any]], tokens: list[int]) -> dict[str, Any]:
    """:func:`transformer_accuracy`'s result from its layers' entries (in layer order) and
    each layer's calibration token count."""
    return {"tokens": max(tokens, default=0), "layers": layers}


def _expert_line(e: dict[str, Any]) -> str:
    if e["stored"] is None:
        return f"    expert {e['expert']} ({e['scheme']}): not hit in calibration"
    how = ""
    if e.get("method") == "calibrated":
        how = f" (calibrated, fold alpha {e['alpha']:g})"
    elif e.get("method") is not None:
        how = f" ({e['method']})"
    return (
        f"    expert {e['expert']} ({e['scheme']}): {e['hits']} hits, rel error "
        f"{e['plain']:.3g} plain -> {e['stored']:.3g}{how}"
    )


def format_accuracy(acc: dict[str, Any]) -> str:
    lines = [f"accuracy vs fp32 on {acc['tokens']} calibration tokens:"]
    for m in acc["layers"]:
        lines.append(
            f"  layer {m['layer']}: max-abs {m['max_abs_error']:.3g}, rel-RMS "
            f"{m['rel_rms_error']:.3g}, cosine {m['cosine']:.6f}, routing agreement "
            f"{100 * m['routing_agreement']:.1f}%"
        )
        experts = m.get("experts") or []
        hit = [e for e in experts if e["stored"] is not None]
        if len(experts) <= MAX_LISTED_EXPERTS:
            lines.extend(_expert_line(e) for e in experts)
        elif hit:
            plain = float(np.median([e["plain"] for e in hit]))
            stored = float(np.median([e["stored"] for e in hit]))
            lines.append(
                f"    {len(hit)} of {len(experts)} experts hit; median expert rel error "
                f"{plain:.3g} plain -> {stored:.3g} (per expert in manifest.json)"
            )
    return "\n".join(lines)


def routing_heat(layer: MoELayer, x: np.ndarray) -> np.ndarray:
    """Calibration hits per expert: how many tokens chose it among their top-k."""
    r = route(layer, np.asarray(x, dtype=np.float32))
    return np.bincount(r.expert_ids.ravel(), minlength=layer.config.n_experts).astype(np.int64)


def load_calib(options: GenerateOptions, calib: np.ndarray | None, d_model: int) -> np.ndarray:
    """Calibration tokens: the array given, --calib FILE, or seeded random ones."""
    if calib is None and options.calib:
        calib = load_npy(
            options.calib, "--calib file", f"a [T, {d_model}] float32 .npy of calibration tokens"
        )
    if calib is None:
        return (
            np.random.default_rng(DEFAULT_CALIB_SEED)
            .standard_normal((DEFAULT_CALIB_TOKENS, d_model))
            .astype(np.float32)
        )
    return check_input(np.asarray(calib), d_model, options.calib or "calibration input")


@dataclass(frozen=True)
class Analysis:
    """What the analysis stage found: whether there is anything to report (a plain fp32 model
    generates exactly as before, without a report), whether real calibration data was given,
    each expert's calibration hits and the accuracy report (None without a report)."""

    report: bool
    calibrated: bool
    heat: np.ndarray
    accuracy: dict[str, Any] | None


def analyse_layer(
    layer: MoELayer,
    q: LayerQuant,
    options: GenerateOptions,
    calib: np.ndarray | None = None,
    stats: LayerCalib | None = None,
) -> Analysis:
    """Heat and accuracy of a lone layer on the calibration tokens, when there is something to
    report (quantised, calibrated, a cache or a RAM budget); `stats`: the calibration
    statistics of those tokens when the quantisation stage already has them."""
    c = layer.config
    calibrated = options.calib is not None or calib is not None
    report = q.quantised or calibrated or options.cache != "pinned" or bool(options.ram_budget)
    if not report:
        return Analysis(False, calibrated, np.zeros(c.n_experts, np.int64), None)
    x_cal = load_calib(options, calib, c.d_model)
    heat = routing_heat(layer, x_cal)
    acc = accuracy_report(layer, q.experts, x_cal, q.router, stats)
    return Analysis(True, calibrated, heat, acc)


def check_against_torch(
    layer: MoELayer, cfg: HFConfig, state: dict[str, np.ndarray], tokens: int, seed: int
) -> tuple[float, float]:
    """(max |reference - torch|, max |torch|) on a seeded standard-normal batch."""
    torch = import_torch()
    x = np.random.default_rng(seed).standard_normal((tokens, layer.config.d_model))
    x = x.astype(np.float32)
    block = torch_block(cfg, state)
    with torch.no_grad():
        y_torch = block(torch.from_numpy(x)[None])[0].double().numpy()
    y, _ = moe_forward(layer, x)
    diff = float(np.max(np.abs(y - y_torch)))
    err = compare(y_torch, y, EXPORT_TOLERANCE)
    if err is not None:
        raise ExportCheckFailed(f"{layer.source}: exported block differs from PyTorch: {err}")
    return diff, float(np.max(np.abs(y_torch)))
