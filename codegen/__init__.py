"""Colibri: a firmware compiler for Mixture-of-Experts models.

Python reads an MoE model, lays out its expert weights and emits C specialised to that model;
SCons builds it with the C runtime (libcolibri.a) for a board; QEMU runs every target.
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
