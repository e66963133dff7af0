"""A squarified treemap (Bruls, Huizing and van Wijk, 2000) and its SVG.

Each node's rectangle has an area proportional to its bytes; the children of a node fill its
rectangle below a header strip with its name. Squarifying lays the children, largest first, in
rows along the shorter side of the space left, adding a child to the current row while that
does not make the row's worst aspect ratio worse, so rectangles stay close to squares. Every
rectangle carries an SVG ``<title>`` with its path and exact bytes, and a label when it is large
enough to hold one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .html import PALETTE, esc

#: Height of a parent's header strip (its name), pixels.
HEADER = 16.0
#: Smallest rectangle that gets a text label (width, height), pixels.
LABEL_MIN = (46.0, 24.0)


@dataclass
class Node:
    """A treemap node: a name, bytes, the colour group of a leaf, its children."""

    name: str
    size: int
    group: str = "other"
    children: list[Node] = field(default_factory=list)

    def total(self) -> int:
        """The node's bytes: its own size, at least the sum of its children's."""
        return max(self.size, sum(c.total() for c in self.children))


@dataclass(frozen=True)
class Rect:
    x: float
    y: float
    w: float
    h: float


def _worst(row: Sequence[float], side: float) -> float:
    """The worst aspect ratio of a row of areas laid along a side of this length."""
    s = sum(row)
    return max(max(side * side * a / (s * s), s * s / (side * side * a)) for a in row)


def squarify(sizes: Sequence[float], box: Rect) -> list[Rect]:
    """Rectangles tiling `box` with areas proportional to `sizes` (in the given order; pass
    them largest first for the squarest layout). Zero sizes get empty rectangles."""
    total = float(sum(sizes))
    out = [Rect(box.x, box.y, 0.0, 0.0) for _ in sizes]
    if total <= 0 or box.w <= 0 or box.h <= 0:
        return out
    scale = box.w * box.h / total
    items = [(i, s * scale) for i, s in enumerate(sizes) if s > 0]
    x, y, w, h = box.x, box.y, box.w, box.h
    i = 0
    while i < len(items):
        side = min(w, h)
        row = [items[i]]
        i += 1
        while i < len(items) and _worst([a for _, a in row] + [items[i][1]], side) <= _worst(
            [a for _, a in row], side
        ):
            row.append(items[i])
            i += 1
        area = sum(a for _, a in row)
        last = i == len(items)  # the last row takes what is left (no rounding gap)
        if w >= h:  # a column on the left
            cw = w if last else area / h
            yy = y
            for j, a in row:
                out[j] = Rect(x, yy, cw, a / cw)
                yy += a / cw
            x, w = x + cw, w - cw
        else:  # a row at the top
            rh = h if last else area / w
            xx = x
            for j, a in row:
                out[j] = Rect(xx, y, a / rh, rh)
                xx += a / rh
            y, h = y + rh, h - rh
    return out


@dataclass(frozen=True)
class Placed:
    node: Node
    rect: Rect
    depth: int
    path: str


def layout(root: Node, box: Rect) -> list[Placed]:
    """Every node of the tree with its rectangle (parents before their children)."""
    placed: list[Placed] = []

    def visit(node: Node, rect: Rect, depth: int, path: str) -> None:
        placed.append(Placed(node, rect, depth, path))
        kids = sorted((c for c in node.children if c.total() > 0), key=lambda c: -c.total())
        if not kids:
            return
        header = HEADER if rect.h > 2 * HEADER else 0.0
        pad = 2.0 if rect.w > 8 and rect.h > 8 else 0.0
        inner = Rect(
            rect.x + pad, rect.y + header, max(rect.w - 2 * pad, 0.0), max(rect.h - header - pad, 0)
        )
        # the children fill the parent in proportion to the parent's bytes (a remainder stays
        # empty when the parent is larger than its children)
        rest = node.total() - sum(c.total() for c in kids)
        sizes = [float(c.total()) for c in kids] + ([float(rest)] if rest > 0 else [])
        for child, r in zip(kids, squarify(sizes, inner)):
            visit(child, r, depth + 1, f"{path} / {child.name}")

    visit(root, box, 0, root.name)
    return placed


def _fill(p: Placed) -> str:
    if p.node.children:
        return "#f7f7f7" if p.depth % 2 else "#ffffff"
    return PALETTE.get(p.node.group, PALETTE["other"])


def treemap_svg(root: Node, width: float, height: float, y: float = 0.0) -> list[str]:
    """SVG elements of the treemap of `root` in a width x height box at vertical offset y."""
    out = [f'<g class="treemap" data-name="{esc(root.name)}" data-bytes="{root.total()}">']
    for p in layout(root, Rect(0.0, y, width, height)):
        r, n = p.rect, p.node
        if r.w <= 0 or r.h <= 0:
            continue
        title = f"{p.path}: {n.total()} bytes"
        out.append(
            f'<rect x="{r.x:.2f}" y="{r.y:.2f}" width="{r.w:.2f}" height="{r.h:.2f}" '
            f'fill="{_fill(p)}" stroke="#fff" stroke-width="{1 if n.children else 0.5}" '
            f'data-name="{esc(n.name)}" data-bytes="{n.total()}"><title>{esc(title)}</title>'
            f"</rect>"
        )
        text = f"{n.name} {n.total()}"
        if n.children and r.h > 2 * HEADER and r.w > 30:
            out.append(_label(r.x + 3, r.y + 12, text, r.w - 6, "#222", bold=True))
        elif not n.children and r.w >= LABEL_MIN[0] and r.h >= LABEL_MIN[1]:
            out.append(_label(r.x + 3, r.y + 12, n.name, r.w - 6, "#fff"))
            out.append(_label(r.x + 3, r.y + 24, f"{n.total()} bytes", r.w - 6, "#fff"))
    out.append("</g>")
    return out


def _label(x: float, y: float, text: str, room: float, colour: str, bold: bool = False) -> str:
    """A text label cut to the room it has (about 6 pixels per character)."""
    chars = max(int(room / 6.2), 1)
    shown = text if len(text) <= chars else text[: max(chars - 1, 1)] + "…"
    weight = ' font-weight="bold"' if bold else ""
    return (
        f'<text x="{x:.2f}" y="{y:.2f}" fill="{colour}"{weight} pointer-events="none">'
        f"{esc(shown)}</text>"
    )
