"""Stage 9, the driver: the `colibri` command line and the pipelines it runs.

``pipeline`` is `colibri generate` as its stages in order (load -> IR -> quantise -> analyse ->
plan -> emit -> budget -> write) and `colibri convert` beside it (load -> quantise -> write; a
whole model layer by layer), ``export`` is `colibri export` (read a PyTorch block, write
the container, check it against PyTorch), ``main`` parses the command line and prints one-line
errors.
"""

from __future__ import annotations

import os

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
    ends it quietly (:func:`interrupted`). Sets BLAS_THREADS before numpy loads."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", BLAS_THREADS)
    try:
        from .main import main
    except KeyboardInterrupt:
        return interrupted()
    return main(argv)
