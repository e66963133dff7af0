"""`colibri size --html / --svg`: the size report as pictures.

Two budget bars (flash and RAM used against the board's regions, the budget line at the region's
size, red past it) and two treemaps: flash by section and RAM by section, each section divided
into what owns its bytes (runtime modules of libcolibri.a, the model's experts, the model's other
symbols, and the rest of the section unattributed, e.g. libc). The HTML page adds the tables of
the text report, so every figure is text in the DOM. `.data` is in both: its initial values in
flash, the variables in RAM.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..targets.size import SizeReport, report_tables
from ..targets.stack import StackReport, format_stack
from .html import PALETTE, budget_bar, esc, legend, page, svg, table, usage_text
from .treemap import Node, treemap_svg

WIDTH = 900
TREEMAP_HEIGHT = 340
GROUP_LABELS = {
    "runtime": "runtime module",
    "expert": "expert (weights + kernel)",
    "model": "model (other)",
    "other": "unattributed (libc, startup, padding)",
}


def region_tree(rep: SizeReport, region: str) -> Node:
    """The treemap of one region ("flash" or "ram"): its sections, each split by owner."""
    owners: dict[str, list[dict[str, Any]]] = {}
    for o in rep.owners:
        owners.setdefault(str(o["section"]), []).append(o)
    used = rep.flash_used if region == "flash" else rep.ram_used
    root = Node("flash" if region == "flash" else "RAM", used)
    for sec in rep.sections:
        if not sec[region]:
            continue
        size = int(sec["size"])
        node = Node(str(sec["name"]), size)
        leaves = [
            Node(str(o["name"]), int(o["bytes"]), str(o["group"]))
            for o in owners.get(node.name, [])
        ]
        rest = size - sum(leaf.size for leaf in leaves)
        if leaves and rest > 0:
            leaves.append(Node("unattributed", rest, "other"))
        node.children = leaves if leaves else [Node(node.name, size, "other")]
        root.children.append(node)
    return root


def figure(rep: SizeReport) -> list[str]:
    """SVG elements of the whole figure: both budget bars, then both treemaps."""
    parts = [
        budget_bar("flash", rep.flash_used, rep.flash_size, WIDTH, 6),
        budget_bar("RAM", rep.ram_used, rep.ram_size, WIDTH, 56),
    ]
    y = 110.0
    for region in ("flash", "ram"):
        tree = region_tree(rep, region)
        label = "flash" if region == "flash" else "RAM"
        parts.append(
            f'<text x="0" y="{y + 12:g}" font-weight="bold">{label} by section and owner: '
            f"{tree.total()} bytes</text>"
        )
        parts.extend(treemap_svg(tree, WIDTH, TREEMAP_HEIGHT, y + 20))
        y += TREEMAP_HEIGHT + 34
    return parts


def figure_height() -> float:
    return 110.0 + 2 * (TREEMAP_HEIGHT + 34)


def size_svg(rep: SizeReport) -> str:
    """A standalone SVG document of the figure."""
    title = f"Size of {Path(rep.elf).name} on {rep.board}"
    height = figure_height() + 24
    body = [
        "<style>text { font-size: 11px; font-family: system-ui, sans-serif; }</style>",
        '<rect width="100%" height="100%" fill="#fff"/>',
        f"<title>{esc(title)}</title>",
        *figure(rep),
    ]
    x = 0.0
    for group, label in GROUP_LABELS.items():  # the legend, along the bottom
        body.append(
            f'<rect x="{x:g}" y="{height - 16:g}" width="10" height="10" fill="{PALETTE[group]}"/>'
            f'<text x="{x + 14:g}" y="{height - 7:g}">{esc(label)}</text>'
        )
        x += 30 + 6.2 * len(label)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + svg(WIDTH, height, body, title) + "\n"


def size_html(rep: SizeReport) -> str:
    """A self-contained HTML page: the figure, then the text report's tables."""
    title = f"Size of {Path(rep.elf).name} on {rep.board}"
    body = [
        f'<p class="note">ELF {esc(rep.elf)}</p>',
        '<ul class="usage">',
        f'<li id="flash-usage">flash: {esc(usage_text(rep.flash_used, rep.flash_size))}</li>',
        f'<li id="ram-usage">RAM: {esc(usage_text(rep.ram_used, rep.ram_size))}</li>',
    ]
    if rep.stack:  # the text report's stack lines (worst case, deepest path, entry points)
        stack = format_stack(StackReport.from_dict(rep.stack))
        body.append(f'<li id="stack-usage">{esc(stack[0].strip())}')
        if stack[1:]:
            body.append("<ul>" + "".join(f"<li>{esc(x.strip())}</li>" for x in stack[1:]) + "</ul>")
        body.append("</li>")
    body.append("</ul>")
    body.append(legend([(PALETTE[g], GROUP_LABELS[g]) for g in GROUP_LABELS]))
    body.append(svg(WIDTH, figure_height(), figure(rep), title))
    for name, head, rows in report_tables(rep):
        numeric = [i for i, v in enumerate(rows[0] if rows else []) if isinstance(v, int)]
        body.append(f"<h2>{esc(name)}</h2>")
        body.append(table(head, rows, numeric=numeric))
    return page(title, body)
