"""Progress of the long steps (load, quantise, emit, write, build) on a terminal.

A stage reports how far it is through its work to a :class:`Progress` it is given; the base
class is silent (every stage's default), so no result depends on it, and only the command line
makes a visible one (:func:`progress_for`): when stderr is a terminal and --quiet was not given,
and then for every stage of a model of at least :data:`PROGRESS_MIN_BYTES`, or for any stage
once it has run :data:`PROGRESS_AFTER_SECONDS`. Each stage is one line on stderr, redrawn in
place with a carriage return (no other terminal codes) and finished with the stage's time::

    quantise  layer 3/24  expert 5/8  [########            ]  42 %
    quantise  layer 24/24  expert 8/8  [####################] 100 %  12.3 s

stdout, which scripts parse, is never written; nothing at all is written when stderr is not a
terminal.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TextIO

#: Weights (model file bytes) from which every stage shows its line; smaller models show only
#: the stages that take long.
PROGRESS_MIN_BYTES = 4 * 1024 * 1024
#: A stage of a smaller model shows its line once it has run this long.
PROGRESS_AFTER_SECONDS = 1.0
#: At most one redraw per this many seconds (the final line always).
REDRAW_SECONDS = 0.1
BAR_WIDTH = 20

#: A loop's report of its progress: (items done, items in all).
Tick = Callable[[int, int], None]


class Stage:
    """One stage's line: :meth:`update` as work is done; the ``with`` block's end (or
    :meth:`close`) finishes it."""

    def __init__(self, progress: Progress, name: str, total: float | None) -> None:
        self.progress = progress
        self.name = name
        self.total = total
        self.done = 0.0
        self.detail = ""
        self.start = progress.clock()
        self.drawn_at: float | None = None
        self.width = 0
        self.closed = False

    def update(self, done: float | None = None, detail: str = "") -> None:
        """`done` units of `total` finished (None: one more), `detail` says which."""
        self.done = self.done + 1 if done is None else done
        self.detail = detail
        self.progress.draw(self, final=False)

    def close(self, failed: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        if not failed and self.total is not None:
            self.done = self.total
        self.progress.draw(self, final=True, failed=failed)

    def __enter__(self) -> Stage:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(failed=exc_type is not None)


class Progress:
    """The silent reporter: stages run, nothing is shown."""

    #: Whether stages may be shown (a step that must change how it runs to report, such as the
    #: build reading SCons' output as it comes, does so only then).
    visible = False

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock

    def stage(self, name: str, total: float | None = None) -> Stage:
        """A new stage of `total` units (None: an unknown number of steps)."""
        return Stage(self, name, total)

    def draw(self, stage: Stage, final: bool, failed: bool = False) -> None:
        """Show the stage's line (nothing here)."""


#: The default of every stage.
SILENT = Progress()


def format_line(stage: Stage, elapsed: float | None = None) -> str:
    """``name  detail  [####      ]  42 %`` (with the time when the stage has finished)."""
    parts = [f"{stage.name:<8}", stage.detail] if stage.detail else [f"{stage.name:<8}"]
    if stage.total:
        frac = min(max(stage.done / stage.total, 0.0), 1.0)
        fill = int(BAR_WIDTH * frac)
        parts.append(f"[{'#' * fill}{' ' * (BAR_WIDTH - fill)}] {int(100 * frac):3d} %")
    if elapsed is not None:
        parts.append(f"{elapsed:.1f} s")
    return "  ".join(parts)


class TerminalProgress(Progress):
    """One updating line per stage on `stream` (a terminal); with `always` False a stage shows
    only once it has run `after` seconds."""

    visible = True

    def __init__(
        self,
        stream: TextIO,
        always: bool = True,
        clock: Callable[[], float] = time.monotonic,
        after: float = PROGRESS_AFTER_SECONDS,
        redraw: float = REDRAW_SECONDS,
    ) -> None:
        super().__init__(clock)
        self.stream = stream
        self.always = always
        self.after = after
        self.redraw = redraw

    def draw(self, stage: Stage, final: bool, failed: bool = False) -> None:
        now = self.clock()
        elapsed = now - stage.start
        if failed:  # the error message starts on a line of its own
            if stage.drawn_at is not None:
                self.stream.write("\n")
                self.stream.flush()
            return
        if stage.drawn_at is None and not self.always and elapsed < self.after:
            return
        if not final and stage.drawn_at is not None and now - stage.drawn_at < self.redraw:
            return
        line = format_line(stage, elapsed if final else None)
        pad = " " * max(0, stage.width - len(line))
        self.stream.write("\r" + line + pad + ("\n" if final else ""))
        self.stream.flush()
        stage.width = len(line)
        stage.drawn_at = now


def model_bytes(path: str | os.PathLike[str]) -> int:
    """The size of a model on disk: a file's, or a directory's files' (not its subfolders)."""
    p = Path(path)
    try:
        if p.is_dir():
            return sum(f.stat().st_size for f in p.iterdir() if f.is_file())
        return p.stat().st_size
    except OSError:
        return 0  # the loader reports the problem


def progress_for(stream: TextIO, quiet: bool, nbytes: int = 0) -> Progress:
    """What a command shows on `stream` (its stderr): nothing when quiet or not a terminal;
    every stage for a model of PROGRESS_MIN_BYTES or more, else the stages that take long."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # closed or replaced stream
        tty = False
    if quiet or not tty:
        return SILENT
    return TerminalProgress(stream, always=nbytes >= PROGRESS_MIN_BYTES)
