"""Stage 9, the driver: the `colibri` command line and the pipelines it runs.

``pipeline`` is `colibri generate` as its stages in order (load -> IR -> quantise -> analyse ->
plan -> emit -> budget -> write) and `colibri convert` beside it (load -> quantise -> write; a
whole model layer by layer), ``export`` is `colibri export` (read a PyTorch block, write
the container, check it against PyTorch), ``main`` parses the command line and prints one-line
errors.
"""

from __future__ import annotations

import os
import signal
from types import FrameType
from typing import Any

from ..errors import interrupted

#: numpy's BLAS threads in the command line, unless OPENBLAS_NUM_THREADS is set (issue 38):
#: the reference's products (calibration, the kernels' mirror, accuracy) are a few hundred rows
#: each, where BLAS threads cost more than they give and stall whenever the machine is busy
#: (`generate --calib` on a 13.9 M-parameter Mixtral, 2 cores shared with other jobs:
#: calibrate + quantise + analyse under cProfile 81 s with OpenBLAS's default threads, 20 s
#: with one).
BLAS_THREADS = "1"


def entry(argv: list[str] | None = None) -> int:
    """The `colibri` console script and `python -m colibri`: imports the command line (numpy
    and the rest take a moment) inside the Ctrl-C guard, then runs it; a Ctrl-C at any moment
    ends it quietly (:func:`interrupted`). Sets BLAS_THREADS before numpy loads.

    A Ctrl-C that lands while a C extension imports a module of its own does not always reach
    here as KeyboardInterrupt: numpy's `_multiarray_umath` turns the failed import of
    `datetime` into `ImportError: PyCapsule_Import could not import module "datetime"`. So the
    imports run under a SIGINT handler that records the signal (then raises KeyboardInterrupt
    as Python's own does), and an ImportError after a recorded Ctrl-C is the interrupt."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", BLAS_THREADS)
    seen: list[int] = []

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        seen.append(signum)
        raise KeyboardInterrupt

    previous = _set_sigint(on_sigint)
    try:
        from .main import main
    except KeyboardInterrupt:
        return interrupted()
    except ImportError:
        if seen:
            return interrupted()
        raise
    finally:
        if previous is not None:
            _set_sigint(previous)
    return main(argv)


def _set_sigint(handler: Any) -> Any:
    """signal.signal(SIGINT, handler), returning the previous handler, when Python's own
    handler is the one in place; else None and nothing changed (SIGINT ignored, as in a
    background job, or the caller's own handler, or not the main thread)."""
    if handler is not signal.default_int_handler and (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        return None
    try:
        return signal.signal(signal.SIGINT, handler)
    except ValueError:
        return None
