"""Colibri: a firmware compiler for Mixture-of-Experts models.

Python reads an MoE model, lays out its expert weights and emits C specialised to that model;
SCons builds it with the C runtime (libcolibri.a) for a board; QEMU runs every target.

One folder per stage, in the order data flows (a module imports only its own or earlier
stages; tests/test_stages.py checks it):

    ir -> frontends -> quant -> reference -> plan -> emit -> targets -> report -> cli

The modules at this level are read by every stage: ``errors`` (the ColibriError family),
``paths`` (where boards, templates and the runtime live, and the atomic writer of every output
file), ``boards`` (boards/*.toml, also read by the SConstruct), ``options`` (what `colibri
generate` was asked for), ``progress`` (the progress lines of long steps, silent unless the
command line asks) and ``hostmem`` (the memory this machine has, checked before a long step).
"""

from __future__ import annotations

from .errors import (
    BoardError,
    BudgetExceeded,
    BuildError,
    ColibriError,
    ConfigError,
    InputError,
    ModelFormatError,
    QemuError,
    ShapeError,
    ToolchainNotFound,
)

__version__ = "0.1.0"

__all__ = [
    "BoardError",
    "BudgetExceeded",
    "BuildError",
    "ColibriError",
    "ConfigError",
    "InputError",
    "ModelFormatError",
    "QemuError",
    "ShapeError",
    "ToolchainNotFound",
    "__version__",
]
