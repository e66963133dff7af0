"""Size report and budget check of a built firmware (pyelftools).

Flash = allocated sections whose *load* address lies in the board's flash region (code,
rodata, the initial values of .data); RAM = allocated sections whose *run* address lies in the
RAM region (.data, .bss, the arena, the stack); PSRAM (boards with external PSRAM) = sections
whose run address lies there (experts placed in .colibri_psram; their bytes count against the
flash too: on the chip they come from the flash image). Hosted boards (no memory regions) count
file-backed allocated sections as flash and writable ones as RAM.

Breakdowns: by section; by runtime module (symbols defined by each object of libcolibri.a);
by expert (the generated `<name>_e<j>_*` weight arrays and the `<name>_expert_<j>` kernel); and
the same owners per section (``SizeReport.owners``, what the treemap of `colibri size --html`
nests inside each section).

Bare metal: the worst-case stack per entry point and the deepest path, from the report the build
writes beside the ELF (``<elf>.stack.json``, colibri/targets/stack.py), against the board's
stack_size.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elftools.elf.constants import SH_FLAGS
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from ..boards import Board, load_board
from ..errors import BudgetExceeded, ColibriError


@dataclass
class SizeReport:
    board: str
    elf: str
    flash_size: int
    ram_size: int
    flash_used: int = 0
    ram_used: int = 0
    psram_size: int = 0
    psram_used: int = 0
    sections: list[dict[str, Any]] = field(default_factory=list)
    modules: dict[str, dict[str, int]] = field(default_factory=dict)
    experts: dict[int, dict[str, int]] = field(default_factory=dict)
    model: dict[str, int] = field(default_factory=dict)
    #: Regions of a generated transformer's arena (KV cache included), from its manifest.
    arena: list[dict[str, Any]] = field(default_factory=list)
    #: Worst-case stack (bare metal): colibri.targets.stack.StackReport.as_dict().
    stack: dict[str, Any] | None = None
    #: Bytes of each owner per section: {"section", "group" (runtime / expert / model), "name"
    #: (runtime module, "expert <j>", model symbol), "bytes"}; not in as_dict() (the JSON).
    owners: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "board": self.board,
            "elf": self.elf,
            "flash_used": self.flash_used,
            "ram_used": self.ram_used,
            "flash_size": self.flash_size,
            "ram_size": self.ram_size,
            "flash_percent": _pct(self.flash_used, self.flash_size),
            "ram_percent": _pct(self.ram_used, self.ram_size),
            **(
                {"psram_used": self.psram_used, "psram_size": self.psram_size}
                if self.psram_size
                else {}
            ),
            "sections": self.sections,
            "modules": self.modules,
            "experts": {str(k): v for k, v in sorted(self.experts.items())},
            "model": self.model,
            **({"arena": self.arena} if self.arena else {}),
            **({"stack": self.stack} if self.stack else {}),
        }


def _pct(used: int, size: int) -> float | None:
    return round(100.0 * used / size, 2) if size else None


def _ar_members(path: Path) -> dict[str, bytes]:
    """Members of a System V / GNU `ar` archive (libcolibri.a)."""
    data = path.read_bytes()
    if not data.startswith(b"!<arch>\n"):
        raise ColibriError(f"{path}: not an ar archive")
    pos, out, names = 8, {}, b""
    while pos + 60 <= len(data):
        hdr = data[pos : pos + 60]
        name = hdr[:16].decode().strip()
        size = int(hdr[48:58].decode().strip())
        body = data[pos + 60 : pos + 60 + size]
        if name == "//":
            names = body
        elif name.startswith("/") and name[1:].isdigit() and names:
            off = int(name[1:])
            name = names[off : names.index(b"/\n", off)].decode()
            out[name] = body
        elif name not in ("/", "/SYM64/"):
            out[name.rstrip("/")] = body
        pos += 60 + size + (size & 1)
    return out


def runtime_symbols(lib: Path) -> dict[str, str]:
    """symbol name -> runtime module (object file stem) for every symbol libcolibri.a defines."""
    import io

    owner: dict[str, str] = {}
    for member, blob in _ar_members(lib).items():
        elf = ELFFile(io.BytesIO(blob))
        symtab = elf.get_section_by_name(".symtab")
        if not isinstance(symtab, SymbolTableSection):
            continue
        module = member.rsplit(".", 1)[0]
        for sym in symtab.iter_symbols():
            if sym["st_shndx"] != "SHN_UNDEF" and sym["st_info"]["type"] in (
                "STT_FUNC",
                "STT_OBJECT",
            ):
                owner[sym.name] = module
    return owner


def _lma_map(elf: ELFFile) -> list[tuple[int, int, int]]:
    """(p_offset, p_filesz, p_paddr) of PT_LOAD segments, to turn file offsets into LMAs."""
    return [
        (seg["p_offset"], seg["p_filesz"], seg["p_paddr"])
        for seg in elf.iter_segments()
        if seg["p_type"] == "PT_LOAD"
    ]


def analyse(
    elf_path: Path, board: Board, lib: Path | None = None, model_name: str | None = None
) -> SizeReport:
    """Measure a linked ELF against a board's regions."""
    flash = board.memory.get("flash")
    ram = board.memory.get("ram")
    psram = board.memory.get("psram")
    rep = SizeReport(board.name, str(elf_path), flash.size if flash else 0, ram.size if ram else 0)
    rep.psram_size = psram.size if psram else 0
    # The flash chip may be seen through several windows (esp32s3: `flash` for data,
    # `flash_code` for instructions); every one counts against the flash budget.
    flash_windows = [r for n, r in board.memory.items() if n == "flash" or n.startswith("flash_")]
    with open(elf_path, "rb") as f:
        elf = ELFFile(f)
        loads = _lma_map(elf)
        for sec in elf.iter_sections():
            if not sec["sh_flags"] & SH_FLAGS.SHF_ALLOC or sec["sh_size"] == 0:
                continue
            size, vma = int(sec["sh_size"]), int(sec["sh_addr"])
            nobits = sec["sh_type"] == "SHT_NOBITS"
            lma = vma
            if not nobits:
                for off, filesz, paddr in loads:
                    if off <= sec["sh_offset"] < off + max(filesz, 1):
                        lma = paddr + sec["sh_offset"] - off
                        break
            in_psram = psram is not None and psram.origin <= vma < psram.end
            if flash and ram:
                in_flash = not nobits and (
                    in_psram or any(r.origin <= lma < r.end for r in flash_windows)
                )
                in_ram = ram.origin <= vma < ram.origin + ram.size
            else:
                in_flash = not nobits
                in_ram = bool(sec["sh_flags"] & SH_FLAGS.SHF_WRITE)
            rep.flash_used += size if in_flash else 0
            rep.ram_used += size if in_ram else 0
            rep.psram_used += size if in_psram else 0
            rep.sections.append(
                {
                    "name": sec.name,
                    "size": size,
                    "vma": vma,
                    "lma": lma,
                    "flash": in_flash,
                    "ram": in_ram,
                }
            )
        symtab = elf.get_section_by_name(".symtab")
        if isinstance(symtab, SymbolTableSection):
            counted = {s["name"] for s in rep.sections}
            section_of = {
                i: sec.name for i, sec in enumerate(elf.iter_sections()) if sec.name in counted
            }
            placed: dict[tuple[str, str, str], int] = defaultdict(int)
            owners = runtime_symbols(lib) if lib and lib.is_file() else {}
            modules: dict[str, dict[str, int]] = defaultdict(lambda: {"code": 0, "data": 0})
            experts: dict[int, dict[str, int]] = defaultdict(lambda: {"weights": 0, "code": 0})
            model: dict[str, int] = defaultdict(int)
            prefix = re.escape(model_name) if model_name else r"[a-z_][a-z0-9_]*"
            w_re = re.compile(rf"^{prefix}_e(\d+)_(w1|b1|w2|b2|w3)$")
            k_re = re.compile(rf"^{prefix}_expert_(\d+)$")
            seen: set[tuple[str, int]] = set()
            for sym in symtab.iter_symbols():
                kind = sym["st_info"]["type"]
                if kind not in ("STT_FUNC", "STT_OBJECT") or sym["st_size"] == 0:
                    continue
                key = (sym.name, int(sym["st_value"]))
                if key in seen:
                    continue
                seen.add(key)
                size = int(sym["st_size"])
                owner: tuple[str, str] | None = None
                if sym.name in owners:
                    modules[owners[sym.name]]["code" if kind == "STT_FUNC" else "data"] += size
                    owner = ("runtime", owners[sym.name])
                elif m := w_re.match(sym.name):
                    experts[int(m.group(1))]["weights"] += size
                    owner = ("expert", f"expert {int(m.group(1))}")
                elif m := k_re.match(sym.name):
                    experts[int(m.group(1))]["code"] += size
                    owner = ("expert", f"expert {int(m.group(1))}")
                elif model_name and sym.name.startswith(model_name + "_"):
                    model[sym.name[len(model_name) + 1 :]] += size
                    owner = ("model", sym.name[len(model_name) + 1 :])
                shndx = sym["st_shndx"]
                if owner and isinstance(shndx, int) and shndx in section_of:
                    placed[(section_of[shndx], owner[0], owner[1])] += size
            rep.owners = [
                {"section": sec, "group": group, "name": name, "bytes": nbytes}
                for (sec, group, name), nbytes in sorted(placed.items())
            ]
            rep.modules = dict(sorted(modules.items()))
            rep.experts = dict(sorted(experts.items()))
            rep.model = dict(sorted(model.items()))
    return rep


def locate(target: Path, board: Board) -> tuple[Path, Path | None, str | None]:
    """(elf, libcolibri.a or None, model name or None) for an ELF or a generated directory."""
    if target.is_file():
        lib = target.parent.parent / "libcolibri.a"
        return target, lib if lib.is_file() else None, None
    from .build import build_model, check_generated, runner_path

    manifest = check_generated(target)
    elf = runner_path(target, board)
    if not elf.is_file():
        elf = build_model(target, board.name)
    name = str(manifest["options"]["name"])
    from ..emit.cformat import c_ident

    return elf, elf.parent.parent / "libcolibri.a", c_ident(name)


def size_report(target: str | Path, board_name: str) -> SizeReport:
    board = load_board(board_name)
    path = Path(target).resolve()
    elf, lib, name = locate(path, board)
    rep = analyse(elf, board, lib, name)
    if board.is_baremetal:
        from .stack import load_report

        stack = load_report(elf)
        rep.stack = stack.as_dict() if stack else None
    if path.is_dir():
        from ..emit.output import manifest_kind
        from .build import check_generated

        if manifest_kind(manifest := check_generated(path)) == "transformer":
            rep.arena = [
                {"name": r["name"], "size": r["size"], "what": r["what"]}
                for r in manifest["memory"]["regions"]
            ]
    return rep


def report_tables(rep: SizeReport) -> list[tuple[str, list[str], list[list[Any]]]]:
    """The report's tables, (title, header, rows), for the text report and the HTML page."""
    t: list[tuple[str, list[str], list[list[Any]]]] = [
        (
            "Sections",
            ["section", "bytes", "flash", "RAM"],
            [
                [s["name"], s["size"], "x" if s["flash"] else "", "x" if s["ram"] else ""]
                for s in rep.sections
            ],
        ),
        (
            "Runtime modules",
            ["runtime module", "code", "data"],
            [[m, v["code"], v["data"]] for m, v in rep.modules.items()],
        ),
        (
            "Experts",
            ["expert", "weights", "kernel"],
            [[f"expert {e}", v["weights"], v["code"]] for e, v in rep.experts.items()],
        ),
        ("Model (other symbols)", ["model (other)", "bytes"], [list(x) for x in rep.model.items()]),
        (
            "Arena regions",
            ["arena region", "bytes", "what"],
            [[r["name"], r["size"], r["what"]] for r in rep.arena],
        ),
    ]
    return [t[0]] + [x for x in t[1:] if x[2]]


def _fmt_row(cols: list[str], widths: list[int]) -> str:
    return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cols, widths)))


def format_report(rep: SizeReport) -> str:
    lines = [f"Size report: {Path(rep.elf).name} on {rep.board}"]

    def usage(used: int, size: int) -> str:
        return f"{used} / {size} bytes ({100.0 * used / size:.1f}%)" if size else f"{used} bytes"

    lines.append(f"  flash: {usage(rep.flash_used, rep.flash_size)}")
    lines.append(f"  RAM:   {usage(rep.ram_used, rep.ram_size)}")
    if rep.psram_size:
        lines.append(f"  PSRAM: {usage(rep.psram_used, rep.psram_size)}")
    if rep.stack:
        from .stack import StackReport, format_stack

        lines.extend(format_stack(StackReport.from_dict(rep.stack)))
    for _, head, rows in report_tables(rep):
        widths = [22] + [6 if h in ("flash", "RAM") else 0 if h == "what" else 10 for h in head[1:]]
        lines.append("")
        lines.extend(_fmt_row([str(c) for c in row], widths) for row in [head, *rows])
    return "\n".join(lines)


def size_report_text(target: str | Path, board_name: str) -> str:
    return format_report(size_report(target, board_name))


def check_elf_budget(rep: SizeReport) -> None:
    """Fail if a linked ELF exceeds its board's regions (exact)."""
    problems = []
    if rep.flash_size and rep.flash_used > rep.flash_size:
        problems.append(
            f"flash {rep.flash_used} > {rep.flash_size} "
            f"({rep.flash_used - rep.flash_size} bytes over)"
        )
    if rep.ram_size and rep.ram_used > rep.ram_size:
        problems.append(
            f"RAM {rep.ram_used} > {rep.ram_size} ({rep.ram_used - rep.ram_size} bytes over)"
        )
    if rep.psram_size and rep.psram_used > rep.psram_size:
        problems.append(
            f"PSRAM {rep.psram_used} > {rep.psram_size} "
            f"({rep.psram_used - rep.psram_size} bytes over)"
        )
    if rep.stack and rep.stack.get("entry"):
        worst, size = int(rep.stack["worst"]), int(rep.stack["stack_size"])
        if worst > size:
            path = " -> ".join(f"{n} ({b})" for n, b in rep.stack["entry"]["path"])
            problems.append(
                f"stack worst case {worst} > stack_size {size} ({worst - size} bytes over; "
                f"deepest path: {path})"
            )
    if problems:
        big = sorted(rep.sections, key=lambda s: -s["size"])[:3]
        raise BudgetExceeded(
            f"{rep.elf} does not fit {rep.board}: "
            + "; ".join(problems)
            + "; largest sections: "
            + ", ".join(f"{s['name']} {s['size']}" for s in big)
        )
