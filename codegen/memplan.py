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


#: Bytes of colibri_expert_weights_t on a 64-bit target (5 pointers + 5 uint32 part sizes,
#: padded to 8); 32-bit targets need 40, so a plan sized with this fits every board (the
#: generated C _Static_asserts it).
EXPERT_WEIGHTS_STRUCT_BYTES = 64


def slot_bytes(n_slots: int, expert_floats: int) -> int:
    """COLIBRI_SLOT_BYTES(N, EF) of colibri.h, with the 64-bit size of the pointer struct."""
    if n_slots <= 0:
        return 0
    return (
        align16(8 * n_slots)
        + align16(n_slots * EXPERT_WEIGHTS_STRUCT_BYTES)
        + align16(4 * n_slots)
        + align16(4 * n_slots * expert_floats)
    )


def expert_floats(c: MoEConfig, bias: bool) -> int:
    """COLIBRI_EXPERT_FLOATS(D, F, GATED, BIAS)."""
    return c.d_model * c.d_ff * (3 if c.gated else 2) + ((c.d_model + c.d_ff) if bias else 0)


@dataclass(frozen=True)
class Region:
    name: str
    offset: int
    size: int
    what: str


def lay_out(items: list[tuple[str, int, str]]) -> tuple[Region, ...]:
    """Regions back to back in the given order, each at a 16-byte aligned offset."""
    regions = []
    off = 0
    for name, size, what in items:
        regions.append(Region(name, off, size, what))
        off = align16(off + size)
    return tuple(regions)


@dataclass(frozen=True)
class ArenaPlan:
    """One static arena: named regions at fixed offsets (see lay_out)."""

    regions: tuple[Region, ...]

    @property
    def arena_size(self) -> int:
        last = self.regions[-1]
        return align16(last.offset + last.size)

    def region(self, name: str) -> Region:
        return next(r for r in self.regions if r.name == name)


@dataclass(frozen=True)
class MemoryPlan(ArenaPlan):
    """The arena of one MoE layer processed in chunks of max_tokens tokens."""

    max_tokens: int = 0


def plan_memory(
    c: MoEConfig,
    max_tokens: int,
    slots: int = 0,
    bias: bool = False,
    act_q: bool = False,
    slot_floats: int = 0,
) -> MemoryPlan:
    """Lay out the arena for chunks of max_tokens tokens.

    slots: expert cache slots of an LRU/NONE static model (they must follow the workspace,
    where colibri_init_static carves them), each of slot_floats floats (0: the fp32 expert
    size, COLIBRI_EXPERT_FLOATS); act_q: an int8 row buffer for the per-token
    quantised activations of integer kernels (max(d_model, d_ff) bytes)."""
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
    if slots:
        items.append(
            (
                "slots",
                slot_bytes(slots, slot_floats or expert_floats(c, bias)),
                f"{slots} expert cache slot(s) (COLIBRI_SLOT_BYTES)",
            )
        )
    if act_q:
        n = max(c.d_model, c.d_ff)
        items.append(("act_q", n, f"int8[{n}] per-token quantised activations"))
    return MemoryPlan(regions=lay_out(items), max_tokens=max_tokens)
