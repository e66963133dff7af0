"""PNG plots the benchmarks write beside their JSON (``x.json`` -> ``x.png``).

matplotlib with the Agg backend (no display needed) is optional: ``pip install '.[bench]'``
(the ``test`` extra has it too). Without it a benchmark still writes its JSON and prints one line
saying the plot was skipped. PNGs are written through a temporary sibling renamed into place and
carry no timestamp, so the same JSON gives the same file.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: Plot size in inches at DPI.
FIGSIZE = (7.0, 4.0)
DPI = 110


def pyplot() -> Any | None:
    """matplotlib.pyplot on the Agg backend, or None when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png_beside(json_path: str | os.PathLike[str]) -> Path:
    return Path(json_path).with_suffix(".png")


def _skipped(json_path: str | os.PathLike[str]) -> None:
    print(f"plot skipped: matplotlib is not installed (pip install '.[bench]'); {json_path} only")


def _save(plt: Any, fig: Any, json_path: str | os.PathLike[str]) -> Path:
    out = png_beside(json_path)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    os.close(fd)
    try:
        fig.tight_layout()
        fig.savefig(tmp, format="png", dpi=DPI, metadata={"Software": None})
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    finally:
        plt.close(fig)
        Path(tmp).unlink(missing_ok=True)
    return out


def _figure(json_path: str | os.PathLike[str]) -> tuple[Any, Any, Any] | None:
    """(pyplot, figure, axes) of a new plot, or None (said) when matplotlib is missing."""
    plt = pyplot()
    if plt is None:
        _skipped(json_path)
        return None
    fig, ax = plt.subplots(figsize=FIGSIZE)
    return plt, fig, ax


def _finish(
    plt: Any,
    fig: Any,
    ax: Any,
    json_path: str | os.PathLike[str],
    title: str,
    xlabel: str,
    ylabel: str,
    legend: bool,
) -> Path:
    """Title, axis labels, a light grid and (several series) the legend; then saved."""
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if legend:
        ax.legend(fontsize=7)
    return _save(plt, fig, json_path)


def line_plot(
    json_path: str | os.PathLike[str],
    x: Sequence[float],
    series: Mapping[str, Sequence[float]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
) -> Path | None:
    """Lines of `series` over `x`, each point marked and the last one labelled with its value."""
    fig_ax = _figure(json_path)
    if fig_ax is None:
        return None
    plt, fig, ax = fig_ax
    for name, ys in series.items():
        ax.plot(list(x)[: len(ys)], list(ys), marker="o", label=name)
        if ys:
            ax.annotate(f"{ys[-1]:g}", (list(x)[len(ys) - 1], ys[-1]), textcoords="offset points",
                        xytext=(4, 4))  # fmt: skip
    return _finish(plt, fig, ax, json_path, title, xlabel, ylabel, len(series) > 1)


def bar_plot(
    json_path: str | os.PathLike[str],
    labels: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    title: str,
    ylabel: str,
    limit: float | None = None,
    limit_label: str = "budget",
) -> Path | None:
    """Grouped bars (one group per label, one bar per series) with an optional horizontal
    limit line (a budget)."""
    fig_ax = _figure(json_path)
    if fig_ax is None:
        return None
    plt, fig, ax = fig_ax
    n = max(len(series), 1)
    width = 0.8 / n
    for i, (name, ys) in enumerate(series.items()):
        xs = [j + (i - (n - 1) / 2) * width for j in range(len(ys))]
        bars = ax.bar(xs, list(ys), width, label=name)
        ax.bar_label(bars, fmt="%g", fontsize=7)
    if limit is not None:
        ax.axhline(limit, color="#d62728", linestyle="--", linewidth=1.2, label=limit_label)
    ax.set_xticks(range(len(labels)), list(labels), rotation=20, ha="right")
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend()
    return _save(plt, fig, json_path)


def scatter_plot(
    json_path: str | os.PathLike[str],
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    logx: bool = True,
) -> Path | None:
    """Points (x, y) of each series, a marker each (log x by default): a sweep's cases."""
    fig_ax = _figure(json_path)
    if fig_ax is None:
        return None
    plt, fig, ax = fig_ax
    for name, (xs, ys) in series.items():
        ax.plot(list(xs), list(ys), marker="o", linestyle="none", label=name)
    if logx:
        ax.set_xscale("log")
    return _finish(plt, fig, ax, json_path, title, xlabel, ylabel, len(series) > 1)
