"""`colibri size --html / --svg`: the page opened in headless Chromium shows the size report's
exact figures (flash and RAM used against the board's budget, every section, runtime module and
expert), the treemap tiles its boxes in proportion to the bytes, and the pieces (budget bar,
atomic writing) behave at their edges."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest
from colibri.cli.pipeline import generate
from colibri.errors import OutputError
from colibri.frontends.seed import make_toy
from colibri.options import GenerateOptions
from colibri.report.html import budget_bar, write_report
from colibri.report.treemap import Node, Rect, layout, squarify
from conftest import dump_dom, require_board, run_cli


class _Dom(HTMLParser):
    """Text content (whitespace collapsed) and every element's attributes of a dumped page."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.text: list[str] = []
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {k: v or "" for k, v in attrs}))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def all_text(self) -> str:
        return " ".join(" ".join(self.text).split())

    def find(self, tag: str, **want: str) -> list[dict[str, str]]:
        return [
            a
            for t, a in self.elements
            if t == tag and all(a.get(k.replace("_", "-")) == v for k, v in want.items())
        ]


@pytest.fixture(scope="module")
def demo_m4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model (8 experts, d_model 32, d_ff 64, k 2) generated for cortex-m4."""
    require_board("cortex-m4", run=False)
    layer = make_toy(experts=8, hidden=32, ff=64, top_k=2, activation="gelu", seed=7)
    out = tmp_path_factory.mktemp("size_html") / "demo"
    generate(layer, out, GenerateOptions(board="cortex-m4", name="demo", max_tokens=8))
    return out


def test_size_page_in_chromium_shows_the_report(demo_m4: Path, tmp_path: Path) -> None:
    page, picture = tmp_path / "report.html", tmp_path / "report.svg"
    proc = run_cli(
        "size", str(demo_m4), "--board", "cortex-m4", "--json", "--html", str(page),
        "--svg", str(picture),
    )  # fmt: skip
    rep = json.loads(proc.stdout)  # "wrote ..." goes to stderr with --json
    assert f"wrote {page}" in proc.stderr
    text = run_cli("size", str(demo_m4), "--board", "cortex-m4").stdout

    dom = _Dom(dump_dom(page))
    shown = dom.all_text()
    # the text report's usage lines, exactly (whitespace collapsed), and the budget
    for line in text.splitlines():
        if line.strip().startswith(("flash:", "RAM:", "stack:")):
            assert " ".join(line.split()) in shown, line
    flash_used, flash_size = rep["flash_used"], rep["flash_size"]
    assert flash_size > 0 and f"flash: {flash_used} / {flash_size} bytes" in shown
    assert f"RAM: {rep['ram_used']} / {rep['ram_size']} bytes" in shown
    for label, used, size in (
        ("flash", flash_used, flash_size),
        ("RAM", rep["ram_used"], rep["ram_size"]),
    ):
        bar = dom.find("g", data_label=label)
        assert bar and bar[0]["data-used"] == str(used) and bar[0]["data-size"] == str(size)
        assert f"{label}: {used} / {size} bytes" in shown and f"budget {size} bytes" in shown
    assert len(dom.find("line", **{"class": "budget-line"})) == 2
    # every section, runtime module and expert figure of the JSON report is on the page
    cells = set(re.findall(r"\d+", shown))
    for s in rep["sections"]:
        assert str(s["size"]) in cells, s
        assert dom.find("rect", data_name=s["name"], data_bytes=str(s["size"])), s
    for mod, v in rep["modules"].items():
        assert mod in shown and str(v["code"]) in cells and str(v["data"]) in cells
    assert len(rep["experts"]) == 8
    for e, v in rep["experts"].items():
        assert f"expert {e}" in shown and str(v["weights"]) in cells
        tiles = dom.find("rect", data_name=f"expert {e}")
        assert sorted(int(t["data-bytes"]) for t in tiles) == sorted([v["weights"], v["code"]])
    # the treemaps' roots are the used bytes
    assert dom.find("g", **{"class": "treemap", "data_name": "flash"})[0]["data-bytes"] == str(
        flash_used
    )
    # the SVG is a well-formed standalone document with the same bars
    root = ET.parse(picture).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert f'data-used="{flash_used}"' in picture.read_text()


def test_squarify_tiles_the_box_in_proportion() -> None:
    sizes = [137012.0, 17692.0, 476.0, 64.0, 3.0]
    box = Rect(10.0, 20.0, 300.0, 200.0)
    rects = squarify(sizes, box)
    total = sum(sizes)
    for s, r in zip(sizes, rects):
        assert r.w * r.h == pytest.approx(box.w * box.h * s / total, rel=1e-9)
        assert box.x - 1e-9 <= r.x and r.x + r.w <= box.x + box.w + 1e-9
        assert box.y - 1e-9 <= r.y and r.y + r.h <= box.y + box.h + 1e-9
    for i, a in enumerate(rects):  # no two overlap
        for b in rects[i + 1 :]:
            dx = min(a.x + a.w, b.x + b.w) - max(a.x, b.x)
            dy = min(a.y + a.h, b.y + b.h) - max(a.y, b.y)
            assert dx <= 1e-9 or dy <= 1e-9
    # squarified: the big item is not a sliver
    big = rects[0]
    assert max(big.w / big.h, big.h / big.w) < 2
    assert squarify([0.0, 0.0], box) == [Rect(10.0, 20.0, 0.0, 0.0)] * 2


def test_nested_layout_keeps_children_inside_their_parent() -> None:
    root = Node("flash", 1000, children=[Node(".text", 300), Node(".rodata", 700)])
    root.children[1].children = [Node("expert 0", 400, "expert"), Node("expert 1", 200, "expert")]
    placed = {p.path: p.rect for p in layout(root, Rect(0, 0, 400, 300))}
    assert set(placed) == {
        "flash",
        "flash / .rodata",
        "flash / .text",
        "flash / .rodata / expert 0",
        "flash / .rodata / expert 1",
    }
    parent = placed["flash / .rodata"]
    for name in ("expert 0", "expert 1"):
        r = placed[f"flash / .rodata / {name}"]
        assert parent.x <= r.x and r.x + r.w <= parent.x + parent.w + 1e-9
        assert parent.y <= r.y and r.y + r.h <= parent.y + parent.h + 1e-9
    e0, e1 = placed["flash / .rodata / expert 0"], placed["flash / .rodata / expert 1"]
    assert e0.w * e0.h == pytest.approx(2 * e1.w * e1.h)


def test_budget_bar_edges() -> None:
    hosted = budget_bar("flash", 1234, 0)
    assert "1234 bytes" in hosted and "no budget" in hosted and "budget-line" not in hosted
    over = budget_bar("RAM", 300, 200)
    assert "100 bytes over" in over and "budget 200 bytes" in over and "150.0%" in over


def test_report_is_written_atomically(tmp_path: Path) -> None:
    out = write_report(tmp_path / "r.html", "<p>one</p>")
    assert out.read_text() == "<p>one</p>"
    write_report(out, "<p>two</p>")
    assert out.read_text() == "<p>two</p>" and [p.name for p in tmp_path.iterdir()] == ["r.html"]
    (tmp_path / "file").write_text("")
    with pytest.raises(OutputError, match="file"):
        write_report(tmp_path / "file" / "r.html", "x")


def test_missing_chromium_fails_in_ci(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """CI never skips the browser check: without Chromium it fails, naming the package."""
    import conftest

    monkeypatch.setattr(conftest, "IN_CI", True)
    monkeypatch.setattr(conftest.shutil, "which", lambda name: None)
    with pytest.raises(pytest.fail.Exception, match="chromium-headless-shell"):
        dump_dom(tmp_path / "x.html")
    monkeypatch.setattr(conftest, "IN_CI", False)
    with pytest.raises(pytest.skip.Exception, match="chromium-headless-shell"):
        dump_dom(tmp_path / "x.html")
