"""Memory of the machine Colibri runs on: how much a step may use, checked before it starts.

A model that cannot fit is refused before the long step (loading a checkpoint), naming the
bytes it needs and the limit that stops it, instead of being killed by the kernel halfway
through. The limit is the smallest of: the kernel's estimate of memory available without
swapping (``MemAvailable`` of /proc/meminfo), the cgroup's (v2 ``memory.max`` less
``memory.current``: containers, CI runners) and the process's address-space limit
(``RLIMIT_AS`` less what is already mapped: ``ulimit -v``). Anything unreadable (another OS)
is no limit.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass
from pathlib import Path

from .errors import ColibriError


class HostMemoryError(ColibriError):
    """The machine has too little memory for a step (refused before it starts)."""


@dataclass(frozen=True)
class MemoryLimit:
    bytes: int
    source: str  # what sets it, for the message


def _meminfo_available(meminfo: Path) -> MemoryLimit | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                kib = int(line.split()[1])
                return MemoryLimit(kib * 1024, "MemAvailable in /proc/meminfo")
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_headroom(proc_cgroup: Path, root: Path) -> MemoryLimit | None:
    try:
        lines = proc_cgroup.read_text().splitlines()
        rel = next(line.split(":", 2)[2] for line in lines if line.startswith("0::"))
        d = root / rel.lstrip("/")
        while True:
            limit_file = d / "memory.max"
            if limit_file.is_file():
                text = limit_file.read_text().strip()
                if text != "max":
                    used = int((d / "memory.current").read_text().strip())
                    return MemoryLimit(max(int(text) - used, 0), f"cgroup limit {limit_file}")
            if d == root or d.parent == d:
                return None
            d = d.parent
    except (OSError, ValueError, StopIteration, IndexError):
        return None


def _address_space_headroom(status: Path) -> MemoryLimit | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    mapped = 0
    try:
        for line in status.read_text().splitlines():
            if line.startswith("VmSize:"):
                mapped = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return MemoryLimit(max(soft - mapped, 0), "the address-space limit (ulimit -v)")


def available_memory(
    meminfo: Path = Path("/proc/meminfo"),
    proc_cgroup: Path = Path("/proc/self/cgroup"),
    cgroup_root: Path = Path("/sys/fs/cgroup"),
    status: Path = Path("/proc/self/status"),
) -> MemoryLimit | None:
    """The tightest of the limits above, or None when none is known."""
    limits = [
        lim
        for lim in (
            _meminfo_available(meminfo),
            _cgroup_headroom(proc_cgroup, cgroup_root),
            _address_space_headroom(status),
        )
        if lim is not None
    ]
    return min(limits, key=lambda lim: lim.bytes) if limits else None


def check_memory(needed: int, what: str, detail: str, fix: str) -> None:
    """Refuse a step that needs more than the machine has (HostMemoryError), naming both."""
    limit = available_memory()
    if limit is not None and needed > limit.bytes:
        raise HostMemoryError(
            f"{what} needs at least {needed:,} bytes of memory ({detail}), but only "
            f"{limit.bytes:,} are available ({limit.source}); {fix}"
        )
