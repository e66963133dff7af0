"""The routing heat map `colibri generate --calib` writes beside the generated C.

For each MoE layer (a lone layer, or every MoE block of a transformer): which experts the fp32
router (the C-identical one, :func:`colibri.reference.moe.route`) chose for each calibration
token, drawn as experts x tokens with the gate weight as the cell's strength; the calibration
hits per expert (tokens that chose it among their top k) as bars against the mean; and the
imbalance figure

    imbalance = max hits / mean hits, mean hits = tokens * k / n_experts

1.0 is a perfectly even load; n_experts / k (every token choosing the same k experts) is the
worst. The page shows at most MAX_TOKENS_SHOWN tokens per layer (evenly spaced); the hits and
the imbalance count every calibration token (for a transformer: every token position of every
calibration sequence). ``routing.md`` holds the same figures as tables, and the manifest a
summary (:func:`routing_summary`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..ir.moe import MoELayer
from ..ir.transformer import MoETransformer
from ..quant.calib import LayerCalib
from ..reference.moe import route
from .html import PALETTE, esc, page, svg, table

#: Tokens drawn per layer in the experts x tokens heat map (evenly spaced when there are more).
MAX_TOKENS_SHOWN = 256
#: Files `generate --calib` adds to the generated directory.
ROUTING_HTML = "routing.html"
ROUTING_MD = "routing.md"


@dataclass(frozen=True)
class RoutingHeat:
    """One MoE layer's routing on the calibration tokens: `hits` [n_experts] over all `tokens`;
    `ids` / `gates` [shown, k] the choices of the tokens drawn, `token_index` [shown] their
    positions among the tokens the choices were taken from (`of` of them)."""

    layer: int | None
    n_experts: int
    top_k: int
    tokens: int
    hits: np.ndarray
    ids: np.ndarray
    gates: np.ndarray
    token_index: np.ndarray
    of: int

    @property
    def mean_hits(self) -> float:
        return float(self.hits.sum()) / self.n_experts

    @property
    def imbalance(self) -> float:
        """max hits / mean hits (module docstring); 0.0 without tokens."""
        mean = self.mean_hits
        return float(self.hits.max()) / mean if mean > 0 else 0.0

    @property
    def idle(self) -> int:
        """Experts no calibration token chose."""
        return int(np.count_nonzero(self.hits == 0))

    @property
    def name(self) -> str:
        return "the MoE layer" if self.layer is None else f"layer {self.layer}"


def _shown(n: int) -> np.ndarray:
    if n <= MAX_TOKENS_SHOWN:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, MAX_TOKENS_SHOWN).round().astype(np.int64))


def _heat(
    layer: MoELayer, x: np.ndarray, index: int | None, hits: np.ndarray | None, tokens: int
) -> RoutingHeat:
    x = np.asarray(x, dtype=np.float32)
    keep = _shown(x.shape[0])
    r = route(layer, x)
    c = layer.config
    if hits is None:
        hits = np.bincount(r.expert_ids.ravel(), minlength=c.n_experts).astype(np.int64)
    return RoutingHeat(
        index,
        c.n_experts,
        int(r.expert_ids.shape[1]),
        tokens,
        np.asarray(hits, dtype=np.int64),
        r.expert_ids[keep],
        np.asarray(r.gates, dtype=np.float64)[keep],
        keep,
        int(x.shape[0]),
    )


def layer_routing(layer: MoELayer, x: np.ndarray) -> RoutingHeat:
    """A lone MoE layer's routing on its calibration rows x [T, d_model]."""
    return _heat(layer, x, None, None, int(np.asarray(x).shape[0]))


def transformer_routing(model: MoETransformer, stats: dict[int, LayerCalib]) -> list[RoutingHeat]:
    """Every MoE layer's routing: hits from the calibration statistics (every token; when
    experts share storage, from the layer's sample of inputs instead), the heat map from the
    sample of the layer's own inputs the statistics keep."""
    return [
        moe_layer_routing(i, layer.moe, stats[i])
        for i, layer in enumerate(model.layers)
        if layer.moe is not None and i in stats
    ]


def moe_layer_routing(i: int, moe: MoELayer, st: LayerCalib) -> RoutingHeat:
    """The routing of MoE layer `i` of a transformer from its calibration statistics (one
    entry of :func:`transformer_routing`)."""
    n = moe.config.n_experts
    hits: np.ndarray | None = None
    tokens = int(st.inputs.shape[0])
    if moe.storage_map() == list(range(n)):  # hits per stored expert are per expert
        hits = np.array([st.experts[e].hits if e in st.experts else 0 for e in range(n)])
        tokens = st.tokens
    return _heat(moe, st.inputs, i, hits, tokens)


def routing_summary(heats: Sequence[RoutingHeat]) -> dict[str, Any]:
    """What the manifest records: per layer tokens, hits, mean, imbalance and idle experts."""
    return {
        "imbalance": "max hits / mean hits (1.0: every expert equally loaded)",
        "files": [ROUTING_HTML, ROUTING_MD],
        "layers": [
            {
                "layer": h.layer,
                "tokens": h.tokens,
                "hits": [int(v) for v in h.hits],
                "mean_hits": round(h.mean_hits, 3),
                "max_hits": int(h.hits.max()),
                "imbalance": round(h.imbalance, 3),
                "idle_experts": h.idle,
            }
            for h in heats
        ],
    }


def format_routing(summary: dict[str, Any]) -> str:
    """The text report's lines: the imbalance of each layer and the files."""
    lines = []
    for lay in summary["layers"]:
        where = "routing" if lay["layer"] is None else f"routing of layer {lay['layer']}"
        lines.append(
            f"{where}: {lay['tokens']} calibration tokens, hits per expert max {lay['max_hits']} "
            f"/ mean {lay['mean_hits']:g}: imbalance {lay['imbalance']:.2f} (max / mean), "
            f"{lay['idle_experts']} experts never chosen"
        )
    lines.append(f"routing heat map: {' and '.join(summary['files'])} in the output directory")
    return "\n".join(lines)


# -- Markdown ------------------------------------------------------------------------------------


def _hits_rows(h: RoutingHeat) -> list[list[str]]:
    total = max(int(h.hits.sum()), 1)
    mean = h.mean_hits
    return [
        [
            str(e),
            str(int(v)),
            f"{100.0 * v / total:.1f}%",
            f"{v / mean:.2f}" if mean else "-",
        ]
        for e, v in enumerate(h.hits)
    ]


HITS_HEAD = ["expert", "hits", "share", "hits / mean"]


def routing_markdown(heats: Sequence[RoutingHeat], title: str) -> str:
    """The routing tables in Markdown: a layer x expert summary (several layers), then per layer
    the hits of every expert and the imbalance."""
    out = [f"# {title}", "", "Imbalance = max hits / mean hits (1.0: even load).", ""]

    def md(head: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "|".join("---:" if i else "---" for i in range(len(head))) + "|")
        out.extend("| " + " | ".join(r) + " |" for r in rows)
        out.append("")

    if len(heats) > 1:
        out.append("## Hits per layer and expert")
        out.append("")
        n = max(h.n_experts for h in heats)
        md(
            ["layer", *(str(e) for e in range(n)), "imbalance"],
            [[str(h.layer), *(str(int(v)) for v in h.hits), f"{h.imbalance:.2f}"] for h in heats],
        )
    for h in heats:
        out.append(f"## {h.name[0].upper()}{h.name[1:]}")
        out.append("")
        out.append(
            f"{h.tokens} calibration tokens, top {h.top_k} of {h.n_experts} experts; mean hits "
            f"{h.mean_hits:g}, max {int(h.hits.max())}: imbalance {h.imbalance:.2f}; "
            f"{h.idle} experts never chosen."
        )
        out.append("")
        md(HITS_HEAD, _hits_rows(h))
    return "\n".join(out)


# -- HTML ----------------------------------------------------------------------------------------

CELL_H = 12.0
LEFT = 70.0
WIDTH = 900.0


def _mix(strength: float) -> str:
    """White -> the heat colour; strength in [0, 1]."""
    s = min(max(strength, 0.0), 1.0)
    r0, g0, b0 = (int(PALETTE["heat"][i : i + 2], 16) for i in (1, 3, 5))
    return "#" + "".join(f"{round(255 + (c - 255) * s):02x}" for c in (r0, g0, b0))


def _columns(h: RoutingHeat) -> str:
    shown = h.ids.shape[0]
    text = f"{shown} of {h.of}" if shown < h.of else f"all {shown}"
    if h.of < h.tokens:
        text += f" tokens of an evenly spread sample of the {h.tokens}"
    return text + (", evenly spaced" if shown < h.of else "")


def heat_svg(h: RoutingHeat) -> str:
    """Experts (rows) x calibration tokens (columns); a chosen cell's strength is its gate."""
    shown = h.ids.shape[0]
    cell_w = max(min((WIDTH - LEFT - 10) / max(shown, 1), 24.0), 1.0)
    height = h.n_experts * CELL_H + 40
    parts = [
        f'<rect x="{LEFT:g}" y="0" width="{cell_w * shown:.2f}" height="{h.n_experts * CELL_H:g}" '
        f'fill="#fafafa" stroke="#ccc"/>'
    ]
    for e in range(h.n_experts):
        if h.n_experts <= 64 or e % max(h.n_experts // 32, 1) == 0:
            parts.append(
                f'<text x="{LEFT - 4:g}" y="{e * CELL_H + CELL_H - 2:g}" text-anchor="end">'
                f"expert {e}</text>"
            )
    for col in range(shown):
        tok = int(h.token_index[col])
        for slot in range(h.ids.shape[1]):
            e, g = int(h.ids[col, slot]), float(h.gates[col, slot])
            parts.append(
                f'<rect x="{LEFT + col * cell_w:.2f}" y="{e * CELL_H:g}" width="{cell_w:.2f}" '
                f'height="{CELL_H:g}" fill="{_mix(0.25 + 0.75 * g)}"><title>token {tok}: expert '
                f"{e}, gate {g:.3f}</title></rect>"
            )
    parts.append(
        f'<text x="{LEFT:g}" y="{h.n_experts * CELL_H + 16:g}">calibration tokens '
        f"(columns: {_columns(h)}); colour: gate weight of the chosen expert</text>"
    )
    return svg(WIDTH, height, parts, f"routing heat map of {h.name}")


def hits_svg(h: RoutingHeat) -> str:
    """Hits per expert as bars, with the mean as a line."""
    bar_h = CELL_H
    height = h.n_experts * bar_h + 40
    room = WIDTH - LEFT - 120
    top = max(int(h.hits.max()), 1)
    parts = []
    for e, v in enumerate(h.hits):
        w = room * int(v) / top
        parts.append(
            f'<rect x="{LEFT:g}" y="{e * bar_h + 1:g}" width="{w:.2f}" height="{bar_h - 2:g}" '
            f'fill="{PALETTE["expert"]}" data-expert="{e}" data-hits="{int(v)}"><title>expert '
            f"{e}: {int(v)} hits</title></rect>"
        )
        parts.append(
            f'<text x="{LEFT - 4:g}" y="{e * bar_h + bar_h - 2:g}" text-anchor="end">expert '
            f"{e}</text>"
        )
        parts.append(f'<text x="{LEFT + w + 4:.2f}" y="{e * bar_h + bar_h - 2:g}">{int(v)}</text>')
    mx = LEFT + room * h.mean_hits / top
    parts.append(
        f'<line x1="{mx:.2f}" x2="{mx:.2f}" y1="0" y2="{h.n_experts * bar_h:g}" '
        f'stroke="{PALETTE["budget"]}" stroke-dasharray="4 3" stroke-width="1.5"><title>mean '
        f"{h.mean_hits:g} hits</title></line>"
    )
    parts.append(
        f'<text x="{LEFT:g}" y="{h.n_experts * bar_h + 16:g}">hits per expert of {h.tokens} '
        f"tokens (dashed: mean {h.mean_hits:g}); imbalance {h.imbalance:.2f}</text>"
    )
    return svg(WIDTH, height, parts, f"hits per expert of {h.name}")


def summary_svg(heats: Sequence[RoutingHeat]) -> str:
    """Layers (rows) x experts (columns), coloured by hits / the layer's max hits."""
    n = max(h.n_experts for h in heats)
    cell_w = max(min((WIDTH - LEFT - 110) / n, 28.0), 2.0)
    top_y = 14.0  # a row of expert numbers above the columns
    height = top_y + len(heats) * CELL_H * 1.5 + 40
    parts = []
    step = max(1, int(18 // cell_w) + 1)  # every expert, or every step-th when they are narrow
    for e in range(0, n, step):
        parts.append(
            f'<text x="{LEFT + (e + 0.5) * cell_w:.2f}" y="10" text-anchor="middle">{e}</text>'
        )
    for row, h in enumerate(heats):
        y = top_y + row * CELL_H * 1.5
        top = max(int(h.hits.max()), 1)
        parts.append(f'<text x="{LEFT - 4:g}" y="{y + CELL_H:g}" text-anchor="end">{h.name}</text>')
        for e, v in enumerate(h.hits):
            parts.append(
                f'<rect x="{LEFT + e * cell_w:.2f}" y="{y:g}" width="{cell_w:.2f}" '
                f'height="{CELL_H * 1.5:g}" fill="{_mix(int(v) / top)}" stroke="#fff" '
                f'stroke-width="0.5"><title>{h.name}, expert {e}: {int(v)} hits</title></rect>'
            )
        parts.append(
            f'<text x="{LEFT + n * cell_w + 6:.2f}" y="{y + CELL_H:g}">imbalance '
            f"{h.imbalance:.2f}</text>"
        )
    parts.append(
        f'<text x="{LEFT:g}" y="{top_y + len(heats) * CELL_H * 1.5 + 16:g}">experts 0..{n - 1} '
        f"(columns), colour: hits / the layer's most-hit expert</text>"
    )
    return svg(WIDTH, height, parts, "hits per layer and expert")


def routing_html(heats: Sequence[RoutingHeat], title: str) -> str:
    """The routing page: a layer x expert summary (several layers), then per layer the heat
    map, the hits bars and the hits table with the imbalance."""
    body = [
        '<p class="note">Imbalance = max hits / mean hits over the experts (1.0: every expert '
        "equally loaded); hits = calibration tokens that chose the expert among their top k.</p>"
    ]
    if len(heats) > 1:
        body.append("<h2>Hits per layer and expert</h2>")
        body.append(summary_svg(heats))
        body.append(
            table(
                ["layer", "tokens", "mean hits", "max hits", "imbalance", "idle experts"],
                [
                    [h.layer, h.tokens, f"{h.mean_hits:g}", int(h.hits.max()), f"{h.imbalance:.2f}"]
                    + [h.idle]
                    for h in heats
                ],
                numeric=[1, 2, 3, 4, 5],
            )
        )
    for h in heats:
        anchor = "layer" if h.layer is None else f"layer-{h.layer}"
        body.append(f'<h2 id="{anchor}">Routing of {esc(h.name)}</h2>')
        body.append(
            f'<p class="imbalance" data-imbalance="{h.imbalance:.3f}">{h.tokens} calibration '
            f"tokens, top {h.top_k} of {h.n_experts} experts: mean hits {h.mean_hits:g}, max "
            f"{int(h.hits.max())}, <b>imbalance {h.imbalance:.2f}</b>; {h.idle} experts never "
            f"chosen.</p>"
        )
        body.append(heat_svg(h))
        body.append(hits_svg(h))
        body.append(table(HITS_HEAD, _hits_rows(h), numeric=[1, 2, 3]))
    return page(title, body)


def routing_files(heats: Sequence[RoutingHeat], model_name: str) -> dict[str, str]:
    """The files `generate --calib` adds: routing.html and routing.md."""
    title = f"Routing heat of {model_name} on its calibration tokens"
    return {ROUTING_HTML: routing_html(heats, title), ROUTING_MD: routing_markdown(heats, title)}
