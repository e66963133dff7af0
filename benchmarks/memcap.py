"""A memory cap for one child process: a memory cgroup of its own (cgroup v2 ``memory.max`` where
the memory controller is on v2, else cgroup v1 ``memory.limit_in_bytes``), made as a child of
this process's own memory cgroup so that every limit above still holds. Both versions charge the
page cache a process fills to its group, so a file larger than the cap cannot stay cached.

Use (root needed to make groups)::

    with MemoryCap(256 << 20) as cap:
        subprocess.run(cmd, preexec_fn=cap.enter)   # the child joins before exec
        peak = cap.peak_bytes()                      # RSS + page cache, the group's high mark

The group is removed on leaving the ``with`` (also on an exception or Ctrl-C): processes still
in it are killed first. `drop_file_cache` evicts a file's pages (posix_fadvise DONTNEED) so that
each run starts cold; pages charged to another group before the run would otherwise not count.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

#: Where the cgroup file systems are looked for (the mount table names the rest).
MOUNTS = Path("/proc/self/mounts")
CGROUP_OF_SELF = Path("/proc/self/cgroup")


class CapUnavailable(RuntimeError):
    """No memory cgroup can be made here; the message names what is missing."""


@dataclass(frozen=True)
class Hierarchy:
    """A mounted hierarchy with the memory controller: its version and this process's group."""

    version: int  # 1 or 2
    mount: Path  # where the hierarchy is mounted
    own: Path  # this process's group in it (a directory under mount)


def _mounts(mounts: Path) -> list[tuple[str, Path, str]]:
    """(fstype, mount point, options) of the cgroup file systems."""
    out = []
    for line in mounts.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
            out.append((parts[2], Path(parts[1]), parts[3]))
    return out


def find_hierarchy(mounts: Path = MOUNTS, self_cgroup: Path = CGROUP_OF_SELF) -> Hierarchy:
    """The memory controller's hierarchy: cgroup v2 when its cgroup.controllers lists memory,
    else a cgroup v1 mount with the memory option; CapUnavailable naming what is missing."""
    groups: dict[str, str] = {}  # controller list ("" = v2) -> path of this process
    for line in self_cgroup.read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        groups[ctrls] = path
    found = _mounts(mounts)
    seen = []
    for fstype, point, _ in found:
        if fstype == "cgroup2":
            names = (point / "cgroup.controllers").read_text().split()
            seen.append(f"cgroup v2 at {point} (controllers: {' '.join(names) or 'none'})")
            if "memory" in names:
                return Hierarchy(2, point, point / groups.get("", "/").lstrip("/"))
    for fstype, point, opts in found:
        if fstype == "cgroup" and "memory" in opts.split(","):
            key = next((k for k in groups if "memory" in k.split(",")), None)
            own = groups.get(key, "/") if key is not None else "/"
            return Hierarchy(1, point, point / own.lstrip("/"))
    raise CapUnavailable(
        "no memory cgroup controller: "
        + ("; ".join(seen) if seen else "no cgroup file system is mounted")
        + "; and no cgroup v1 hierarchy is mounted with the memory controller (mount one: "
        "`mount -t cgroup -o memory none /sys/fs/cgroup/memory`, or enable memory in the v2 "
        "root's cgroup.subtree_control)"
    )


class MemoryCap:
    """One memory cgroup with a limit of `limit_bytes` (page cache included); see the module."""

    def __init__(self, limit_bytes: int, name: str | None = None) -> None:
        if limit_bytes <= 0:
            raise ValueError(f"the cap must be positive, not {limit_bytes}")
        self.limit_bytes = int(limit_bytes)
        self.hierarchy = find_hierarchy()
        self.name = name or f"colibri-cap-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.path = self.hierarchy.own / self.name
        self._made = False

    # files by version
    def _limit_file(self) -> Path:
        return self.path / (
            "memory.max" if self.hierarchy.version == 2 else "memory.limit_in_bytes"
        )

    def _procs_file(self) -> Path:
        return self.path / "cgroup.procs"

    def __enter__(self) -> MemoryCap:
        if os.geteuid() != 0 and not os.access(self.hierarchy.own, os.W_OK):
            raise CapUnavailable(
                f"making a memory cgroup under {self.hierarchy.own} needs root (or a delegated "
                "group): run as root"
            )
        try:
            self.path.mkdir()
        except OSError as e:
            raise CapUnavailable(f"cannot make the memory cgroup {self.path}: {e}") from e
        self._made = True
        try:
            swap = self.path / "memory.swap.max"
            if self.hierarchy.version == 2 and swap.exists():
                swap.write_text("0")  # the cap is on memory, not moved to swap
            self._limit_file().write_text(str(self.limit_bytes))
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def enter(self) -> None:
        """Move the calling process into the group (a Popen preexec_fn: the child, before exec)."""
        with open(self._procs_file(), "w") as f:
            f.write(str(os.getpid()))

    def limit(self) -> int:
        """The limit the kernel set (v1 rounds down to pages)."""
        text = self._limit_file().read_text().strip()
        return -1 if text == "max" else int(text)

    def peak_bytes(self) -> int:
        """The group's high-water mark of charged memory (RSS + page cache) since it was made:
        v1 memory.max_usage_in_bytes, v2 memory.peak (kernel 5.19+; -1 without it)."""
        if self.hierarchy.version == 1:
            return int((self.path / "memory.max_usage_in_bytes").read_text())
        peak = self.path / "memory.peak"
        return int(peak.read_text()) if peak.exists() else -1

    def failures(self) -> int:
        """How often the limit was hit (v1 memory.failcnt; v2 memory.events' max)."""
        if self.hierarchy.version == 1:
            return int((self.path / "memory.failcnt").read_text())
        for line in (self.path / "memory.events").read_text().splitlines():
            key, value = line.split()
            if key == "max":
                return int(value)
        return 0

    def pids(self) -> list[int]:
        if not self._made or not self.path.exists():
            return []
        return [int(p) for p in self._procs_file().read_text().split()]

    def close(self) -> None:
        """Kill what is still in the group, then remove it (idempotent)."""
        if not self._made:
            return
        for _ in range(50):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)
        for _ in range(50):
            try:
                self.path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.02)  # the last exiting task leaves the group asynchronously
        self._made = False


def drop_file_cache(path: str | os.PathLike[str]) -> None:
    """Evict a file's clean pages from the page cache (posix_fadvise DONTNEED on all of it), so
    a run starts cold and its reads are charged to its own group."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
