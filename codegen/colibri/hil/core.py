"""What every HIL backend shares: the firmware to load (a ``colibri generate`` directory built
for the board, or a model file generated and built on the fly), the input file the runner reads
and the :class:`HilResult` read back from its output file."""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import ColibriError


@dataclass
class HilResult:
    """One run of a MoE-layer firmware on a board."""

    board: str
    backend: str
    output: np.ndarray  # [T, d_model] float32
    expert_ids: np.ndarray  # [T, top_k] int32: the routing
    gates: np.ndarray  # [T, top_k] float32
    returncode: int
    console: str  # what the firmware printed (semihosting console or serial)
    instructions: int | None = None  # per forward pass region, when counted
    place: str | None = None  # the labgrid place that ran it (farm backend)
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def stack_high_water(self) -> int | None:
        from ..targets.qemu import _HIGH_WATER_RE

        match = _HIGH_WATER_RE.search(self.console)
        return int(match.group(1)) if match else None

    def properties(self) -> dict[str, object]:
        """What the plugin records with ``record_property`` (JUnit XML <property> elements)."""
        props: dict[str, object] = {
            "board": self.board,
            "backend": self.backend,
            "tokens": int(self.output.shape[0]),
            "returncode": self.returncode,
        }
        if self.instructions is not None:
            props["instructions"] = self.instructions
            props["instructions_per_token"] = self.instructions // max(1, self.output.shape[0])
        if self.stack_high_water is not None:
            props["stack_high_water"] = self.stack_high_water
        if self.place is not None:
            props["place"] = self.place
        props.update(self.extra)
        return props


@dataclass(frozen=True)
class Firmware:
    """A built MoE-layer runner: the generated directory, its board and its ELF."""

    gen_dir: Path
    board: str
    elf: Path
    d_model: int


def _is_generated(path: Path) -> bool:
    from ..emit.output import MANIFEST

    return (path / MANIFEST).is_file()


def load_firmware(
    path: str | Path,
    board: str,
    work_dir: Path | None = None,
    max_tokens: int = 32,
) -> Firmware:
    """The firmware for ``board`` from ``path``: a ``colibri generate`` output directory (built
    with ``colibri build``'s code, incrementally), or a model file / seed directory that is
    generated for ``board`` first (into ``work_dir``, default a cache under the system temp,
    keyed by the model's path, size and modification time)."""
    from ..emit.output import manifest_kind
    from ..targets.build import build_model, check_generated

    src = Path(path).resolve()
    if not src.exists():
        raise ColibriError(f"{src}: no such firmware or model")
    if _is_generated(src):
        gen = src
    else:
        from ..cli.main import main as colibri_main

        files = sorted(src.rglob("*")) if src.is_dir() else [src]
        stamp = ";".join(f"{f}:{f.stat().st_mtime_ns}:{f.stat().st_size}" for f in files)
        key = hashlib.sha256(f"{src}:{board}:{max_tokens}:{stamp}".encode()).hexdigest()[:12]
        base = work_dir or Path(tempfile.gettempdir()) / "colibri-hil"
        gen = base / f"{src.stem or 'model'}-{board}-{key}"
        if not _is_generated(gen):
            rc = colibri_main(
                ["generate", str(src), "--board", board, "--out", str(gen),
                 "--max-tokens", str(max_tokens)]
            )  # fmt: skip
            if rc != 0:
                raise ColibriError(f"colibri generate {src} --board {board} failed (exit {rc})")
    manifest = check_generated(gen)
    if manifest_kind(manifest) == "transformer":
        raise ColibriError(
            f"{gen}: a generated transformer; the HIL fixture runs MoE-layer firmware "
            f"(colibri run runs transformers)"
        )
    d_model = int(manifest["model"]["config"]["hidden_size"])
    elf = build_model(gen, board)
    return Firmware(gen_dir=gen, board=board, elf=elf, d_model=d_model)


def input_bytes(x: np.ndarray, d_model: int) -> bytes:
    """The runner's input.bin for rows ``x`` ([T, d_model] float32)."""
    from ..frontends.load import check_input
    from ..targets.lmrun import write_input

    x = check_input(np.asarray(x), d_model)
    with tempfile.TemporaryDirectory(prefix="colibri-hil-") as tmp:
        p = Path(tmp) / "input.bin"
        write_input(p, x)
        return p.read_bytes()


def parse_output(
    raw: bytes, board: str, backend: str, returncode: int, console: str, **kw: object
) -> HilResult:
    """A :class:`HilResult` from the bytes of the runner's output.bin."""
    from ..targets.lmrun import read_output

    with tempfile.TemporaryDirectory(prefix="colibri-hil-") as tmp:
        p = Path(tmp) / "output.bin"
        p.write_bytes(raw)
        out = read_output(p)
    return HilResult(
        board=board,
        backend=backend,
        output=out.output,
        expert_ids=out.expert_ids,
        gates=out.gates,
        returncode=returncode,
        console=console,
        **kw,  # type: ignore[arg-type]
    )
