"""Accuracy of a quantised layer against fp32, on calibration inputs.

Per layer: max-abs error and relative RMS error of the output, cosine similarity, and routing
agreement (the fraction of tokens whose top-k expert *set* is unchanged). The router stays
fp32, so for a single layer the routing is unchanged by construction; the figure is kept so
that stacked layers (whose inputs move) and a quantised router report it the same way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .ir import MoELayer
from .quantize import QuantExpert, QuantRouter, quant_moe_forward
from .reference import moe_forward


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


def accuracy_report(
    layer: MoELayer,
    qexperts: dict[int, QuantExpert],
    x: np.ndarray,
    router: QuantRouter | None = None,
) -> dict[str, Any]:
    """The manifest's "accuracy" entry (one layer)."""
    ref, r = moe_forward(layer, x)
    y, ids = quant_moe_forward(layer, qexperts, x, router)
    m = error_metrics(y, ref)
    m["routing_agreement"] = routing_agreement(ids, r.expert_ids)
    return {"tokens": int(x.shape[0]), "layers": [{"layer": 0, **m}]}


def format_accuracy(acc: dict[str, Any]) -> str:
    lines = [f"accuracy vs fp32 on {acc['tokens']} calibration tokens:"]
    for m in acc["layers"]:
        lines.append(
            f"  layer {m['layer']}: max-abs {m['max_abs_error']:.3g}, rel-RMS "
            f"{m['rel_rms_error']:.3g}, cosine {m['cosine']:.6f}, routing agreement "
            f"{100 * m['routing_agreement']:.1f}%"
        )
    return "\n".join(lines)
