"""The pieces every report page is made of: a self-contained HTML page (inline CSS, inline SVG,
no script, no network), tables, the budget bar, and atomic writing.

Every figure a picture shows is also text in the DOM (a label, an SVG ``<title>`` or a table
cell), so a page dumped by a headless browser, or read by a screen reader, carries the numbers.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from html import escape
from pathlib import Path

from ..paths import write_file_atomic

#: Colours of the owners of bytes (treemap leaves, legends).
PALETTE: dict[str, str] = {
    "runtime": "#4e79a7",
    "expert": "#f28e2b",
    "model": "#59a14f",
    "other": "#bab0ac",
    "used": "#4e79a7",
    "over": "#e15759",
    "budget": "#d62728",
    "heat": "#c0392b",
}

CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; max-width: 1100px; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: .6em 0; }
th, td { padding: 2px 10px; border-bottom: 1px solid #ddd; text-align: left; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
svg text { font-size: 11px; font-family: system-ui, sans-serif; }
.legend span { display: inline-block; margin-right: 1.2em; }
.legend i { display: inline-block; width: .9em; height: .9em; margin-right: .3em;
  vertical-align: middle; }
.note { color: #555; }
"""


def esc(value: object) -> str:
    """Text or attribute content, escaped."""
    return escape(str(value), quote=True)


def page(title: str, body: Sequence[str]) -> str:
    """A complete HTML document: one title, inline CSS, the body's parts in order."""
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{esc(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
        f"<h1>{esc(title)}</h1>\n" + "\n".join(body) + "\n</body>\n</html>\n"
    )


def table(
    head: Sequence[str],
    rows: Sequence[Sequence[object]],
    numeric: Sequence[int] = (),
    cls: str = "",
) -> str:
    """An HTML table; columns listed in `numeric` are right-aligned."""
    num = set(numeric)

    def cell(tag: str, i: int, v: object) -> str:
        attr = ' class="num"' if i in num else ""
        return f"<{tag}{attr}>{esc(v)}</{tag}>"

    out = ["<table" + (f' class="{esc(cls)}"' if cls else "") + ">"]
    out.append("<tr>" + "".join(cell("th", i, h) for i, h in enumerate(head)) + "</tr>")
    out.extend("<tr>" + "".join(cell("td", i, v) for i, v in enumerate(r)) + "</tr>" for r in rows)
    out.append("</table>")
    return "\n".join(out)


def legend(items: Sequence[tuple[str, str]]) -> str:
    """A row of colour swatches: (colour, label)."""
    spans = "".join(
        f'<span><i style="background:{esc(c)}"></i>{esc(label)}</span>' for c, label in items
    )
    return f'<p class="legend">{spans}</p>'


def percent(used: int, size: int) -> str:
    return f"{100.0 * used / size:.1f}%" if size else "-"


def usage_text(used: int, size: int) -> str:
    """'155244 / 1048576 bytes (14.8%)', or '155244 bytes' without a budget (the text size
    report's wording)."""
    return f"{used} / {size} bytes ({percent(used, size)})" if size else f"{used} bytes"


def budget_bar(label: str, used: int, size: int, width: int = 760, y: float = 0.0) -> str:
    """SVG group (height 46): a bar of `used` bytes against the board's `size`, with the budget
    line at `size` (red where the used part runs past it); hosted boards (size 0) have no
    budget and say so."""
    x0, bar_w, bar_h = 70.0, float(width - 80), 18.0
    parts = [
        f'<g class="budget" data-label="{esc(label)}" data-used="{used}" data-size="{size}" '
        f'transform="translate(0,{y:g})">',
        f'<text x="0" y="{bar_h - 5:g}" font-weight="bold">{esc(label)}</text>',
    ]
    if not size:
        parts.append(
            f'<rect x="{x0:g}" y="0" width="{bar_w:g}" height="{bar_h:g}" '
            f'fill="{PALETTE["used"]}"><title>{esc(label)}: {used} bytes</title></rect>'
        )
        parts.append(
            f'<text x="{x0:g}" y="{bar_h + 14:g}">{esc(label)}: {used} bytes '
            f"(no {esc(label)} region on this board: no budget)</text>"
        )
    else:
        scale = bar_w / max(used, size)
        fit_w = min(used, size) * scale
        budget_x = x0 + size * scale
        parts.append(
            f'<rect x="{x0:g}" y="0" width="{bar_w:g}" height="{bar_h:g}" fill="#eee" '
            f'stroke="#999"/>'
        )
        parts.append(
            f'<rect x="{x0:g}" y="0" width="{fit_w:.2f}" height="{bar_h:g}" '
            f'fill="{PALETTE["used"]}"><title>{esc(label)} used: {used} bytes</title></rect>'
        )
        if used > size:
            parts.append(
                f'<rect x="{budget_x:.2f}" y="0" width="{(used - size) * scale:.2f}" '
                f'height="{bar_h:g}" fill="{PALETTE["over"]}"><title>{used - size} bytes over '
                f"the budget</title></rect>"
            )
        parts.append(
            f'<line class="budget-line" x1="{budget_x:.2f}" x2="{budget_x:.2f}" y1="-4" '
            f'y2="{bar_h + 4:g}" stroke="{PALETTE["budget"]}" stroke-width="2">'
            f"<title>budget: {size} bytes</title></line>"
        )
        over = f", {used - size} bytes over" if used > size else ""
        parts.append(
            f'<text x="{x0:g}" y="{bar_h + 16:g}">{esc(label)}: '
            f"{usage_text(used, size)}; budget {size} bytes{over}</text>"
        )
    parts.append("</g>")
    return "\n".join(parts)


def svg(width: float, height: float, body: Sequence[str], label: str = "") -> str:
    """An inline SVG element (also valid as a standalone .svg document)."""
    aria = f' role="img" aria-label="{esc(label)}"' if label else ""
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:g}" height="{height:g}" '
        f'viewBox="0 0 {width:g} {height:g}"{aria}>\n' + "\n".join(body) + "\n</svg>"
    )


def write_report(path: str | os.PathLike[str], text: str) -> Path:
    """Write a report file atomically (a temporary sibling renamed into place, as every Colibri
    output): a failed write leaves no partial file and names the path."""
    return write_file_atomic(path, text.encode("utf-8"))
