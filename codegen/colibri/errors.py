"""Errors raised by Colibri. Every message names the bad value, what was expected and the fix."""

from __future__ import annotations


class ColibriError(Exception):
    """Base class of every error Colibri reports to a user (the CLI prints the message only)."""


class ModelFormatError(ColibriError):
    """A model file is corrupt, truncated or not in the format it claims to be."""


class ConfigError(ColibriError):
    """A config.json field is missing, has the wrong type or an unsupported value."""


class ShapeError(ColibriError):
    """Tensor dimensions disagree with each other or with the config."""


class InputError(ColibriError):
    """Run-time input (activations, routing arguments) is invalid."""


class BoardError(ColibriError):
    """Unknown board or invalid board file."""


class ToolchainNotFound(BoardError):
    """The board's cross compiler or emulator is not installed."""


class BuildError(ColibriError):
    """The C build failed."""


class BudgetExceeded(ColibriError):
    """The model does not fit the board's flash or RAM budget."""


class HeapUseError(BuildError):
    """Firmware references malloc/free/calloc/realloc."""


class QemuError(ColibriError):
    """The guest program faulted, timed out or exited non-zero."""


class OutputExistsError(ColibriError):
    """The output directory exists and is not a previous Colibri output."""
