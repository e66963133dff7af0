"""What `colibri generate` is asked for: one options object that every stage reads.

A lone MoE layer uses ``max_tokens`` (tokens per chunk), the cache options and ``ram_budget``;
a whole transformer uses ``max_context`` and ``dense_quant``. ``quant``, ``act``,
``router_quant``, ``scale_search``, ``calib`` (a layer: [T, d_model] activations; a
transformer: token ids or text) and ``calib_method`` apply to both.
:meth:`GenerateOptions.as_dict` is what the manifest records.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

DEFAULT_MAX_TOKENS = 32
#: Calibration tokens when no --calib file is given (seeded, standard normal).
DEFAULT_CALIB_TOKENS = 64
DEFAULT_CALIB_SEED = 0


CACHE_POLICIES = ("pinned", "lru", "none")
#: --optimize: what the generated expert kernels favour. speed (default): the core's fast
#: layouts and inline tiles, one specialised kernel per expert kind; size: the portable layout
#: (rows) on every core, each kind's kernel calling the library's matrix kernels (themselves
#: ISA-dispatched at compile time), so expert kinds share their code.
OPTIMIZE = ("speed", "size")


@dataclass(frozen=True)
class GenerateOptions:
    """What `colibri generate` was asked for (recorded in the manifest)."""

    board: str = "host"
    name: str = "model"
    max_tokens: int = DEFAULT_MAX_TOKENS
    quant: str = "fp32"
    expert_quant: str | None = None
    act: str | None = None
    cache: str = "pinned"
    cache_slots: int = 0
    calib: str | None = None
    ram_budget: int | None = None
    #: bytes of hot experts placed in external PSRAM (boards with [memory.psram]); None: all of
    #: it when calibrated, else 0
    psram_budget: int | None = None
    router_quant: str = "fp32"
    #: Whole transformers only: KV-cache positions (None: DEFAULT_MAX_CONTEXT) and the scheme
    #: of every matrix besides the routed experts and routers.
    max_context: int | None = None
    dense_quant: str = "fp32"
    #: How int8 / int4 scales are chosen: "mse" (search, the default) or "none" (plain).
    scale_search: str = "mse"
    #: How --calib chooses the experts' weights (colibri.quant.calib.CALIB_METHODS):
    #: "importance" (the default) or "gptq" (adds the error-compensated candidate).
    calib_method: str = "importance"
    #: What the expert kernels favour (OPTIMIZE): "speed" (the default) or "size".
    optimize: str = "speed"

    def kernel_isa(self, isa: str) -> str:
        """The core ISA the expert kernels' layouts and tiles are chosen for: the board's
        (``speed``), or none (``size``: the portable layouts, colibri.quant.layouts)."""
        return "" if self.optimize == "size" else isa

    @property
    def context(self) -> int:
        """KV-cache positions of a whole transformer: max_context, or DEFAULT_MAX_CONTEXT."""
        return DEFAULT_MAX_CONTEXT if self.max_context is None else self.max_context

    def as_dict(self) -> dict[str, Any]:
        """board, name and max_tokens, then only the fields that differ from their defaults, so
        that fp32 outputs stay byte-identical to earlier versions."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("board", "name", "max_tokens") or value != f.default:
                out[f.name] = value
        return out


DEFAULT_MAX_CONTEXT = 64
#: Largest --max-context accepted (positions are int32 in C; far above any MCU's RAM).
MAX_CONTEXT_LIMIT = 1 << 20
