"""Static memory plan: every run-time buffer gets a fixed offset in one arena.

The arena holds the runner's I/O chunk (input, output, routing results, the router's
route_temp) followed by the runtime's sparse-forward workspace, whose size is the C macro
COLIBRI_WORKSPACE_BYTES (colibri.h) — :func:`workspace_bytes` computes the same number, and
a test compiles the macro to check they agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from .ir import MoEConfig

ALIGN = 16


def align16(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def workspace_bytes(e: int, k: int, d: int, f: int, gated: bool, t: int) -> int:
    """COLIBRI_WORKSPACE_BYTES(E, K, D, F, GATED, T) of colibri.h."""
    return (
        align16(4 * (2 * e + 2))
        + align16(4 * t * k)
        + 2 * align16(4 * t * d)
        + align16(4 * t * f * (2 if gated else 1))
    )


@dataclass(frozen=True)
class Region:
    name: str
    offset: int
    size: int
    what: str


@dataclass(frozen=True)
class MemoryPlan:
    max_tokens: int
    regions: tuple[Region, ...]

    @property
    def arena_size(self) -> int:
        last = self.regions[-1]
        return align16(last.offset + last.size)

    def region(self, name: str) -> Region:
        return next(r for r in self.regions if r.name == name)


def plan_memory(c: MoEConfig, max_tokens: int) -> MemoryPlan:
    """Lay out the arena for chunks of max_tokens tokens."""
    t, d, k = max_tokens, c.d_model, c.top_k
    items = [
        ("input", 4 * t * d, f"float[{t}][{d}] token chunk"),
        ("output", 4 * t * d, f"float[{t}][{d}] layer output"),
        ("expert_ids", 4 * t * k, f"int32[{t}][{k}] routing"),
        ("gates", 4 * t * k, f"float[{t}][{k}] gate weights"),
        ("route_temp", 4 * t, f"float[{t}] router workspace (per-token log-sum-exp)"),
        (
            "workspace",
            workspace_bytes(c.n_experts, k, d, c.d_ff, c.gated, t),
            "sparse-forward workspace (COLIBRI_WORKSPACE_BYTES)",
        ),
    ]
    regions = []
    off = 0
    for name, size, what in items:
        regions.append(Region(name, off, size, what))
        off = align16(off + size)
    return MemoryPlan(max_tokens, tuple(regions))
