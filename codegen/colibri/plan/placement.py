"""Expert placement from routing heat: which experts live where, in which order, with which
kernel variant.

Calibration tokens are routed with the fp32 router (the one the firmware runs); each expert's
heat is the number of (token, slot) pairs that chose it. The hottest stored experts that fit
the RAM budget are pinned in RAM (their arrays lose `const`, so the startup code copies them
from flash into .data: no flash wait states on the hot path) and get the *speed* kernel (the
FFN body inlined into the expert's kernel, dimensions constant). On a board with external PSRAM
(esp32s3), the next hottest that fit the PSRAM budget are placed in PSRAM (section
.colibri_psram: faster than the flash behind the same cache on the chip); the others stay in
flash,
ordered by heat (hot first, so a flash cache or an external-memory prefetch sees the likely
experts together) with the *compact* kernel (one shared out-of-line FFN body). Both kernel
variants run the same operations in the same order: outputs are bit-identical.

Without calibration data nothing is moved: index order, flash, the default kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..ir.moe import MoELayer
from ..quant.formats import QuantExpert

KERNELS = ("default", "speed", "compact")


@dataclass(frozen=True)
class Placement:
    """Where one stored expert lives and which kernel runs it."""

    index: int
    scheme: str
    act: str
    placement: str
    kernel: str
    nbytes: int
    heat: int  # calibration hits of every expert that uses these weights


def plan_placement(
    layer: MoELayer,
    qexperts: dict[int, QuantExpert],
    heat: np.ndarray,
    ram_budget: int,
    calibrated: bool,
    psram_budget: int = 0,
    sizes: dict[int, int] | None = None,
) -> list[Placement]:
    """Placements of the stored experts, in storage order (hottest first when calibrated):
    "ram" within ram_budget bytes, then "psram" within psram_budget bytes, else "flash"; an
    expert no calibration token chose stays in flash. sizes: each stored expert's bytes as the
    generated C holds them (its layouts' padding included); default QuantExpert.nbytes."""
    nbytes = {i: (sizes or {}).get(i, q.nbytes) for i, q in qexperts.items()}
    storage = layer.storage_map()
    stored_heat = {idx: 0 for idx in qexperts}
    for i, owner in enumerate(storage):
        stored_heat[owner] += int(heat[i])
    if not calibrated:
        return [
            Placement(i, q.scheme, q.act, "flash", "default", nbytes[i], stored_heat[i])
            for i, q in sorted(qexperts.items())
        ]
    order = sorted(qexperts, key=lambda i: (-stored_heat[i], i))
    out = []
    used = used_psram = 0
    n_hot = max(1, len(order) // 4)  # no RAM budget: the hottest quarter gets the speed kernel
    for rank, i in enumerate(order):
        q = qexperts[i]
        ram = stored_heat[i] > 0 and used + nbytes[i] <= ram_budget
        used += nbytes[i] if ram else 0
        psram = not ram and stored_heat[i] > 0 and used_psram + nbytes[i] <= psram_budget
        used_psram += nbytes[i] if psram else 0
        hot = ram or (ram_budget == 0 and stored_heat[i] > 0 and rank < n_hot)
        out.append(
            Placement(
                i,
                q.scheme,
                q.act,
                "ram" if ram else "psram" if psram else "flash",
                "speed" if hot else "compact",
                nbytes[i],
                stored_heat[i],
            )
        )
    return out


def format_placement_report(manifest: dict[str, Any]) -> str:
    """The per-expert placement table and the layout savings of a generated model."""
    q, lay = manifest["quantization"], manifest["layout"]
    lines = [
        f"weights: {q['weight_bytes']} bytes ({q['fp32_weight_bytes']} as fp32, "
        f"{q['bytes_saved']} saved), router {q['router']}; {lay['unique_experts']} of "
        f"{lay['n_experts']} experts stored ({lay['sharing']}: {lay['sharing_saved_bytes']} "
        f"bytes, {lay['sharing_saved_percent']}% saved); cache {lay['cache']}"
        + (f" ({lay['cache_slots']} slots)" if lay["cache_slots"] else ""),
        f"{'expert':>6}  {'stored':>6}  {'scheme':<6}  {'act':<5}  {'placement':<9}  "
        f"{'kernel':<7}  {'bytes':>9}  {'calib hits':>10}",
    ]
    for e in manifest["experts"]:
        lines.append(
            f"{e['expert']:>6}  {e['stored_as']:>6}  {e['scheme']:<6}  {e['act']:<5}  "
            f"{e['placement']:<9}  {e['kernel']:<7}  {e['bytes']:>9}  {e['calib_hits']:>10}"
        )
    return "\n".join(lines)
