"""Stage 9, the driver: the `colibri` command line and the pipelines it runs.

``pipeline`` is `colibri generate` as its stages in order (load -> IR -> quantise -> analyse ->
plan -> emit -> budget -> write) and `colibri convert` beside it (load -> quantise -> write; a
whole model layer by layer), ``export`` is `colibri export` (read a PyTorch block, write
the container, check it against PyTorch), ``main`` parses the command line and prints one-line
errors.
"""

from __future__ import annotations

from ..errors import interrupted


def entry(argv: list[str] | None = None) -> int:
    """The `colibri` console script and `python -m colibri`: imports the command line (numpy
    and the rest take a moment) inside the Ctrl-C guard, then runs it; a Ctrl-C at any moment
    ends it quietly (:func:`interrupted`)."""
    try:
        from .main import main
    except KeyboardInterrupt:
        return interrupted()
    return main(argv)
