"""Worst-case stack of a bare-metal firmware, computed at build time.

Inputs: the linked ELF and the ``.su`` files GCC writes beside each object with
``-fstack-usage`` (SConstruct compiles every bare-metal object with it). The call graph comes
from the ELF's disassembly (``<prefix>objdump -d``):

* direct calls and tail calls (``bl``/``blx <f>``, ``b <f>`` out of the function; Xtensa
  ``call0``/``callx0`` through an ``l32r`` literal, ``j <f>``) become edges;
* an indirect call (``blx rN``, ``bx rN``, ``callx0`` through a register not loaded from a literal)
  calls every *address-taken* function: every function whose address is stored in a data section
  (``.rodata``/``.data``; the vector table excluded). In a Colibri firmware that set is the
  generated models' kernel dispatch tables (``<name>_kernels``: expert -> kernel), so an indirect
  call in ``sparse_forward.c`` resolves to the generated expert kernels. Functions whose address
  an ARM literal load (``ldr rN, [pc, #i]``) brings into a register count as address-taken too.
  Only words that a relocation wrote count (bare-metal boards link with ``--emit-relocs``, which
  keeps the relocations in the ELF), so a word of the weights whose bits happen to equal a
  function's address (the sweep of issue 40 met ``main``'s in a q5k blob: a false recursion
  main -> colibri_forward -> colibri_sparse_forward -> main) is data, not a pointer; an ELF
  without relocations falls back to every word.
  With no address-taken function at all (a model without a kernel table) an indirect call can
  reach nothing and adds nothing; the report lists it (``unreachable_indirect``).

Frame sizes: from ``.su`` (``static``, or ``dynamic,bounded``: GCC's number is then an upper
bound). A ``dynamic`` (unbounded: VLA, ``alloca``) frame fails the analysis, naming the function.
Functions without a ``.su`` entry (newlib, libgcc, assembly) get a frame read from their
disassembly: the sum of *every* stack-pointer decrement in the body (``push``/``stmdb sp!``,
``vpush``, ``sub sp, #N``, pre-indexed stores to ``[sp, #-N]!``; Xtensa ``addi a1, a1, -N``,
``entry a1, N``), which is conservative (two pushes on different paths both count); a
register-sized decrement there is dynamic and fails too.

Recursion (a cycle reachable from an entry point) fails the analysis, naming the cycle. The
worst case of an entry point is the deepest path from it, frame sizes added along the path
(tail calls add too: conservative). The firmware's bound is that of the ELF entry point (the
reset handler, which calls ``main``); public API functions and exception handlers are reported
on their own. :func:`check_stack_budget` fails a build whose bound exceeds the board's
``stack_size``, naming the deepest path.

Exception handlers are reported but not added to the bound: the arm_semihost fault handler
(``runtime_c/platform/arm_semihost/startup.c``) disables the stack guards and moves SP to a fault
stack of its own above the main stack (``__fault_stack_top - _estack`` bytes) before its C part
runs, and the program ends there (only the 32-byte hardware exception frame, 104 with FP state,
lands below the faulting SP). :func:`check_fault_stack` fails a build whose handler's worst case
does not fit that fault stack, whatever ``stack_check`` says. The report also gives the guard
below the stack (``__stack_limit - __stack_guard``) and the largest frames reachable from the
entry point. An MPU guard (ARMv7-M) catches an overflow only if some store lands in it: a
function whose frame moves SP into the guard without storing there, then calls a leaf whose
frame ends below the guard and stores only there, steps over it. So the guard must hold the two
largest frames plus 8 bytes: :func:`stack_guard_size` sizes it from the ``.su`` files before the
link (the SConstruct renders each model runner's linker script with it) and :func:`check_guard`
fails a build whose reachable frames (libc's read from the disassembly too) do not fit, whatever
``stack_check`` says.
"""

from __future__ import annotations

import bisect
import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..boards import Board
from ..errors import BudgetExceeded, StackUsageError

#: Public entry points reported on their own when the firmware contains them (a generated
#: transformer's ``<name>_lm_setup`` / ``<name>_lm_step`` match the suffixes).
API_ENTRY_POINTS = (
    "main",
    "colibri_init",
    "colibri_init_static",
    "colibri_forward",
    "colibri_sparse_forward",
    "colibri_sample",
)
API_ENTRY_SUFFIXES = ("_lm_setup", "_lm_step")
#: The generated expert kernels (``<name>_expert_<j>``, what colibri_model_t.kernels points
#: at): each one's stack and the code it reaches are reported on their own (StackReport.kernels).
KERNEL_NAME = re.compile(r"_expert_\d+$")

_ARM_CONDS = "eq|ne|cs|hs|cc|lo|mi|pl|vs|vc|hi|ls|ge|lt|gt|le|al"
_ARM_CALL = re.compile(rf"^blx?({_ARM_CONDS})?(\.[nw])?$")
_ARM_BRANCH = re.compile(rf"^(b({_ARM_CONDS})?|cbn?z)(\.[nw])?$")
_TARGET = re.compile(r"\b([0-9a-f]+) <([^>]+)>")
_INSN = re.compile(r"^\s*([0-9a-f]+):\s+([a-z][\w.]*)\s*(.*)$")


@dataclass
class FunctionInfo:
    """One function of the ELF: frame size, where it came from, and its callees (addresses)."""

    name: str
    addr: int
    size: int
    frame: int = 0
    source: str = "disassembly"  #: "su" (GCC's -fstack-usage) or "disassembly" (estimated)
    dynamic: bool = False
    calls: set[int] = field(default_factory=set)
    indirect: bool = False


@dataclass
class StackEntry:
    """Worst case of one entry point: bytes, and the deepest path (function, frame)."""

    name: str
    bound: int
    path: list[tuple[str, int]]

    def path_text(self) -> str:
        return " -> ".join(f"{n} ({b})" for n, b in self.path)


@dataclass
class StackReport:
    board: str
    elf: str
    stack_size: int
    entry: StackEntry | None = None
    api: list[StackEntry] = field(default_factory=list)
    handlers: list[StackEntry] = field(default_factory=list)
    #: Functions whose frame was read from the disassembly (no .su): name -> bytes.
    estimated: dict[str, int] = field(default_factory=dict)
    #: Address-taken functions an indirect call may reach (the dispatch tables).
    indirect_targets: list[str] = field(default_factory=list)
    #: Functions with an indirect call that can reach nothing (no address-taken function).
    unreachable_indirect: list[str] = field(default_factory=list)
    #: Problems that make the bound unusable (dynamic frames, recursion); empty when sound.
    problems: list[str] = field(default_factory=list)
    #: Bytes of the guard below the stack (``__stack_limit - __stack_guard``; 0 if none).
    guard: int = 0
    #: The largest frame reachable from the entry point: (function, bytes).
    largest_frame: tuple[str, int] | None = None
    #: Bytes of the fault handler's own stack above the main stack (``__fault_stack_top -
    #: _estack``; 0 if none).
    fault_stack: int = 0
    #: The two largest frames reachable from the entry point, added, plus 8: the least MPU guard
    #: no overflow can step over (see the module doc).
    guard_need: int = 0
    #: Each expert kernel (KERNEL_NAME): its worst-case stack ("bound"), its largest frame
    #: ("frame": [function, bytes]) and the bytes of code it reaches ("code": the sizes of every
    #: function reachable from it, itself included, each once: what one expert kind costs in
    #: flash when nothing else shares it), "calls" the functions reached, by name.
    kernels: list[dict[str, Any]] = field(default_factory=list)

    @property
    def worst(self) -> int:
        return self.entry.bound if self.entry else 0

    def as_dict(self) -> dict[str, Any]:
        def one(e: StackEntry) -> dict[str, Any]:
            return {"name": e.name, "bound": e.bound, "path": [list(p) for p in e.path]}

        return {
            "board": self.board,
            "elf": self.elf,
            "stack_size": self.stack_size,
            "worst": self.worst,
            "entry": one(self.entry) if self.entry else None,
            "api": [one(e) for e in self.api],
            "handlers": [one(e) for e in self.handlers],
            "estimated": self.estimated,
            "indirect_targets": self.indirect_targets,
            "unreachable_indirect": self.unreachable_indirect,
            "problems": self.problems,
            "guard": self.guard,
            "largest_frame": list(self.largest_frame) if self.largest_frame else None,
            "fault_stack": self.fault_stack,
            "guard_need": self.guard_need,
            "kernels": self.kernels,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StackReport:
        def one(e: dict[str, Any] | None) -> StackEntry | None:
            if e is None:
                return None
            return StackEntry(e["name"], int(e["bound"]), [(str(n), int(b)) for n, b in e["path"]])

        return cls(
            board=d["board"],
            elf=d["elf"],
            stack_size=int(d["stack_size"]),
            entry=one(d["entry"]),
            api=[e for e in (one(x) for x in d["api"]) if e],
            handlers=[e for e in (one(x) for x in d["handlers"]) if e],
            estimated={str(k): int(v) for k, v in d["estimated"].items()},
            indirect_targets=list(d["indirect_targets"]),
            unreachable_indirect=list(d.get("unreachable_indirect", [])),
            problems=list(d["problems"]),
            guard=int(d.get("guard", 0)),
            largest_frame=(str(lf[0]), int(lf[1])) if (lf := d.get("largest_frame")) else None,
            fault_stack=int(d.get("fault_stack", 0)),
            guard_need=int(d.get("guard_need", 0)),
            kernels=list(d.get("kernels", [])),
        )


# -- inputs -----------------------------------------------------------------------------------


def read_su_files(paths: list[str | Path]) -> dict[tuple[str, str], tuple[int, str]]:
    """(object stem, function) -> (bytes, qualifiers) from GCC ``.su`` files.

    Keyed by the ``.su`` file's stem (``startup.su`` for ``startup.o`` from ``startup.c``), which
    the ELF's ``STT_FILE`` symbols name for the static functions that follow them, so statics of
    the same name in different objects (or defined in a shared header) stay apart."""
    out: dict[tuple[str, str], tuple[int, str]] = {}
    for path in paths:
        p = Path(path)
        if not p.is_file():
            continue
        for line in p.read_text(errors="replace").splitlines():
            parts = line.split("\t")
            if len(parts) != 3:
                continue
            where, nbytes, qual = parts
            name = where.rpartition(":")[2]  # "path/file.c:LINE:COL:name"
            old = out.get((p.stem, name))
            if old is None or int(nbytes) > old[0]:  # clones of one function share a name
                out[(p.stem, name)] = (int(nbytes), qual.strip())
    return out


def su_name(symbol: str, su: dict[tuple[str, str], tuple[int, str]], src: str | None) -> str:
    """The name a function's symbol has in the ``.su`` files: the symbol itself, or for a GCC
    clone (``f.constprop.0``; Xtensa's assembler spells it ``f$constprop$0``) the clone's name
    without its number (``f.constprop``), which is how ``-fstack-usage`` names it. Without a
    match in `su` the symbol (its frame is then read from the disassembly)."""
    if any(key[1] == symbol for key in su if src is None or key[0] == src):
        return symbol
    base = re.sub(r"\.\d+$", "", symbol.replace("$", "."))
    if base != symbol and any(key[1] == base for key in su if src is None or key[0] == src):
        return base
    return symbol


def _elf_functions(elf_path: Path) -> tuple[list[FunctionInfo], dict[int, str], str, int, Any]:
    """Functions (with their source file for locals), vector-table range and machine."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    f = open(elf_path, "rb")
    elf = ELFFile(f)
    machine = elf["e_machine"]
    thumb = machine == "EM_ARM"
    symtab = elf.get_section_by_name(".symtab")
    if not isinstance(symtab, SymbolTableSection):
        raise StackUsageError(f"{elf_path}: no symbol table (do not strip the firmware)")
    funcs: dict[int, FunctionInfo] = {}
    files: dict[int, str] = {}
    current_file = ""
    for sym in symtab.iter_symbols():
        kind = sym["st_info"]["type"]
        if kind == "STT_FILE":
            current_file = sym.name
            continue
        if kind != "STT_FUNC" or sym["st_shndx"] == "SHN_UNDEF":
            continue
        addr = int(sym["st_value"]) & (~1 if thumb else ~0)
        local = sym["st_info"]["bind"] == "STB_LOCAL"
        old = funcs.get(addr)
        # aliases (memcpy / __aeabi_memcpy): keep a global name, the largest size
        if old is None or (old.size < int(sym["st_size"])) or (not local and old.name in files):
            funcs[addr] = FunctionInfo(sym.name, addr, int(sym["st_size"]))
            if local:
                files[addr] = Path(current_file).stem
            else:
                files.pop(addr, None)
    entry = int(elf["e_entry"]) & (~1 if thumb else ~0)
    ordered = sorted(funcs.values(), key=lambda fn: fn.addr)
    for fn, nxt in zip(ordered, ordered[1:]):
        if fn.size == 0:  # assembly without .size: up to the next function
            fn.size = nxt.addr - fn.addr
    return ordered, files, machine, entry, (f, elf)


def _relocated_words(elf: Any) -> set[int] | None:
    """Addresses of the words a relocation wrote (the ELF's relocation sections, kept by
    ``--emit-relocs``), or None when the ELF has none (every word may then be a pointer)."""
    from elftools.elf.relocation import RelocationSection

    words: set[int] | None = None
    for sec in elf.iter_sections():
        if isinstance(sec, RelocationSection):
            words = words if words is not None else set()
            words.update(int(rel["r_offset"]) for rel in sec.iter_relocations())
    return words


def _address_taken(
    elf: Any, funcs: dict[int, FunctionInfo], thumb: bool, relocated: set[int] | None = None
) -> tuple[set[int], set[int]]:
    """(functions stored in data sections, vector-table handlers); with `relocated`
    (:func:`_relocated_words`) only the words a relocation wrote outside the vector table."""
    from elftools.elf.constants import SH_FLAGS

    taken: set[int] = set()
    vectors: set[int] = set()
    for sec in elf.iter_sections():
        flags = sec["sh_flags"]
        if not flags & SH_FLAGS.SHF_ALLOC or sec["sh_type"] == "SHT_NOBITS":
            continue
        is_vectors = sec.name in (".isr_vector", ".vectors")
        if flags & SH_FLAGS.SHF_EXECINSTR and not is_vectors:
            continue
        data = sec.data()
        start = int(sec["sh_addr"])
        for off in range(-start % 4, len(data) - 3, 4):
            if relocated is not None and not is_vectors and start + off not in relocated:
                continue
            word = int.from_bytes(data[off : off + 4], "little")
            if thumb and not word & 1:
                continue
            addr = word & ~1 if thumb else word
            if addr in funcs:
                (vectors if is_vectors else taken).add(addr)
    return taken, vectors


def _symbol_span(elf: Any, low: str, high: str) -> int:
    """Bytes between the symbols ``low`` and ``high``, 0 when the ELF lacks either."""
    symtab = elf.get_section_by_name(".symtab")
    addr = {}
    for name in (low, high):
        syms = symtab.get_symbol_by_name(name) if symtab is not None else None
        if not syms:
            return 0
        addr[name] = int(syms[0]["st_value"])
    return max(0, addr[high] - addr[low])


def _stack_guard_size(elf: Any) -> int:
    """Bytes between ``__stack_guard`` and ``__stack_limit`` (the linker script's guard below
    the stack), 0 when the ELF has no such symbols."""
    return _symbol_span(elf, "__stack_guard", "__stack_limit")


def _reg_count(reglist: str) -> tuple[int, int]:
    """(core registers, bytes) of an ARM register list such as ``{r4, r5, r6, r7, lr}``."""
    nbytes = 0
    count = 0
    for item in reglist.strip("{} ").split(","):
        item = item.strip()
        if not item:
            continue
        lo, _, hi = item.partition("-")
        size = 8 if lo.startswith("d") else 4
        n = 1
        if hi:
            n = int(re.sub(r"\D", "", hi)) - int(re.sub(r"\D", "", lo)) + 1
        count += n
        nbytes += size * n
    return count, nbytes


def _imm(text: str) -> int | None:
    m = re.search(r"#(-?(?:0x[0-9a-f]+|\d+))", text)
    return int(m.group(1), 0) if m else None


def _arm_frame_step(mnem: str, ops: str) -> tuple[int, bool]:
    """(bytes this instruction takes from the stack, dynamic?) for ARM/Thumb."""
    base = mnem.split(".")[0]
    ops_l = ops.split("@")[0].strip()
    if base in ("push", "vpush") or (
        base in ("stmdb", "stmfd", "vstmdb") and ops_l.startswith("sp!")
    ):
        return _reg_count(ops_l[ops_l.index("{") :])[1], False
    if base in ("sub", "subw", "subs") and re.match(r"^sp,\s*(sp,\s*)?", ops_l):
        rest = re.sub(r"^sp,\s*(sp,\s*)?", "", ops_l)
        if rest.startswith("#"):
            return max(_imm(rest) or 0, 0), False
        return 0, True
    if base in ("add", "addw") and re.match(r"^sp,\s*(sp,\s*)?#-", ops_l):
        return -(_imm(ops_l) or 0), False
    if base.startswith(("str", "vstr")) and re.search(r"\[sp,\s*#-\d+\]!", ops_l):
        return -(_imm(ops_l[ops_l.index("[") :]) or 0), False
    return 0, False


def _xtensa_frame_step(mnem: str, ops: str) -> tuple[int, bool]:
    parts = [p.strip() for p in ops.split(",")]
    if mnem in ("addi", "addi.n", "addmi") and parts[:2] == ["a1", "a1"] and len(parts) > 2:
        value = int(parts[2], 0)
        return (-value if value < 0 else 0), False
    if mnem == "entry" and parts[:1] == ["a1"] and len(parts) > 1:
        return int(parts[1], 0), False
    if mnem in ("sub", "movsp") and parts[:1] == ["a1"]:
        return 0, True
    return 0, False


def _disassemble(board: Board, elf_path: Path) -> str:
    objdump = shutil.which(board.tool("objdump"))
    if objdump is None:
        raise StackUsageError(
            f"board {board.name}: {board.tool('objdump')} not found (it comes with the compiler; "
            f"install: {board.install_hint})"
        )
    with tempfile.TemporaryDirectory(prefix="colibri-stack-") as tmp:
        target = _without_property_relocs(board, elf_path, Path(tmp))
        proc = subprocess.run(
            [objdump, "-d", "--no-show-raw-insn", str(target)],
            capture_output=True,
            text=True,
            check=False,
        )
    if proc.returncode != 0:
        raise StackUsageError(f"{objdump} -d {elf_path} failed: {proc.stderr.strip()}")
    return proc.stdout


#: The relocations of the Xtensa property tables that ``--emit-relocs`` keeps: binutils 2.40's
#: objdump reads the tables (.xt.prop / .xt.lit: where each function's code and literal pools
#: lie) with them applied again, calls the table invalid and then decodes literal pools as
#: instructions, losing its place and hiding real calls (a ``call0 route_block`` in
#: ``colibri_route`` on xtensa-lx106: the bound came out 32 bytes under the measured use).
XT_PROPERTY_RELOCS = (".rela.xt.prop", ".rela.xt.lit", ".rela.xt.insn")


def _without_property_relocs(board: Board, elf_path: Path, tmp: Path) -> Path:
    """elf_path, or a copy in tmp without XT_PROPERTY_RELOCS when it has any (the tables and
    every other relocation stay; the disassembly reads only the copy)."""
    from elftools.elf.elffile import ELFFile

    with elf_path.open("rb") as f:
        names = {sec.name for sec in ELFFile(f).iter_sections()}
    drop = [n for n in XT_PROPERTY_RELOCS if n in names]
    if not drop:
        return elf_path
    objcopy = shutil.which(board.tool("objcopy"))
    if objcopy is None:
        raise StackUsageError(
            f"board {board.name}: {board.tool('objcopy')} not found (it comes with the compiler; "
            f"install: {board.install_hint})"
        )
    copy = tmp / elf_path.name
    args = [objcopy, *(a for n in drop for a in ("--remove-section", n)), str(elf_path), str(copy)]
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise StackUsageError(f"{objcopy} {elf_path} failed: {proc.stderr.strip()}")
    return copy


def _read_word(elf: Any, addr: int) -> int | None:
    for seg in elf.iter_segments():
        if seg["p_type"] != "PT_LOAD":
            continue
        va = int(seg["p_vaddr"])
        if va <= addr and addr + 4 <= va + int(seg["p_filesz"]):
            data = seg.data()
            return int.from_bytes(data[addr - va : addr - va + 4], "little")
    return None


def _scan_code(
    text: str,
    funcs: list[FunctionInfo],
    machine: str,
    elf: Any,
    relocated: set[int] | None = None,
) -> set[int]:
    """Fill calls / indirect / estimated frame of every function from the disassembly; return
    the functions whose address a PC-relative literal load brings into a register (ARM
    ``ldr rN, [pc, #i]`` of a function's address: a pointer made in code, e.g. passed as a
    callback; with `relocated`, only a literal a relocation wrote), which an indirect call may
    reach as well as those stored in data."""
    literal_taken: set[int] = set()
    starts = [fn.addr for fn in funcs]
    by_addr = {fn.addr: fn for fn in funcs}
    arm = machine == "EM_ARM"
    xtensa = machine == "EM_XTENSA"

    def owner(addr: int) -> FunctionInfo | None:
        i = bisect.bisect_right(starts, addr) - 1
        if i < 0:
            return None
        fn = funcs[i]
        return fn if addr < fn.addr + max(fn.size, 1) else None

    literal_regs: dict[str, int] = {}
    current: FunctionInfo | None = None
    for line in text.splitlines():
        m = _INSN.match(line)
        if not m:
            continue
        addr = int(m.group(1), 16)
        mnem, ops = m.group(2), m.group(3)
        fn = owner(addr)
        if fn is not current:
            literal_regs = {}
            current = fn
        if fn is None:
            continue
        tgt = _TARGET.search(ops)
        target = owner(int(tgt.group(1), 16)) if tgt else None
        if (
            arm
            and mnem.split(".")[0] == "ldr"
            and "[pc" in ops
            and tgt is not None
            and (relocated is None or int(tgt.group(1), 16) in relocated)
        ):
            value = _read_word(elf, int(tgt.group(1), 16))
            if value is not None and value & 1 and (value & ~1) in by_addr:
                literal_taken.add(value & ~1)
        if arm:
            step, dyn = _arm_frame_step(mnem, ops)
            fn.frame += max(step, 0)
            fn.dynamic |= dyn
            if _ARM_CALL.match(mnem):
                if target is not None:
                    fn.calls.add(target.addr)
                elif tgt is None:
                    fn.indirect = True
            elif _ARM_BRANCH.match(mnem):
                if target is not None and target is not fn:
                    fn.calls.add(target.addr)  # tail call
            elif mnem.split(".")[0] == "bx" and not ops.startswith("lr"):
                fn.indirect = True
            elif re.match(r"^(mov|ldr)(\.w)?$", mnem) and ops.startswith("pc,"):
                if not re.search(r"\[sp\]|\[sp,", ops):
                    fn.indirect = True
        elif xtensa:
            step, dyn = _xtensa_frame_step(mnem, ops)
            fn.frame += max(step, 0)
            fn.dynamic |= dyn
            reg = ops.split(",")[0].strip()
            if mnem == "l32r" and tgt is not None:
                value = _read_word(elf, int(tgt.group(1), 16))
                if value is not None:
                    literal_regs[reg] = value
                continue
            if re.match(r"^call(0|4|8|12)$", mnem) and target is not None:
                # a call enters a function at its start; one into the middle of a function is
                # data inside the code (jump padding, a literal) that the linear disassembly
                # misread as an instruction (seen in windowed-ABI code: "call12 <f+0x13c>")
                if tgt is not None and int(tgt.group(1), 16) == target.addr:
                    fn.calls.add(target.addr)
            elif re.match(r"^callx(0|4|8|12)$", mnem):
                value = literal_regs.get(reg)
                if value is not None and value in by_addr:
                    fn.calls.add(value)
                else:
                    fn.indirect = True
            elif (
                mnem in ("j", "j.l")
                and target is not None
                and target is not fn
                and tgt is not None
                and int(tgt.group(1), 16) == target.addr
            ):
                # a tail call enters a function at its start; a jump into the middle of another
                # function is a literal pool or table that the linear disassembly misread
                fn.calls.add(target.addr)
            elif mnem == "jx":
                fn.indirect = True
            if reg in literal_regs and mnem not in ("callx0", "callx4", "callx8", "callx12"):
                literal_regs.pop(reg, None)  # overwritten
        else:
            raise StackUsageError(f"stack analysis does not know the machine {machine}")
    return literal_taken


# -- analysis ---------------------------------------------------------------------------------

#: What an assembly start-up calls, first match: the xtensa_sim platform's C start
#: (platform_sim.c: main, then the guard check and the high-water line), else main.
START_FUNCTIONS = ("clb_xtensa_start", "main")


def analyse_stack(
    elf_path: str | Path,
    board: Board,
    su_files: list[str | Path],
    stack_size: int | None = None,
    kernel_roots: tuple[str, ...] = (),
) -> StackReport:
    """Worst-case stack per entry point of a linked bare-metal ELF (see the module doc);
    `kernel_roots`: functions reported in StackReport.kernels besides the expert kernels."""
    elf_path = Path(elf_path)
    funcs, files, machine, entry_addr, (fh, elf) = _elf_functions(elf_path)
    try:
        relocated = _relocated_words(elf)
        literal_taken = _scan_code(_disassemble(board, elf_path), funcs, machine, elf, relocated)
        by_addr = {fn.addr: fn for fn in funcs}
        taken, vectors = _address_taken(elf, by_addr, machine == "EM_ARM", relocated)
        guard = _stack_guard_size(elf)
        fault_stack = _symbol_span(elf, "_estack", "__fault_stack_top")
    finally:
        fh.close()
    su = read_su_files(su_files)
    su_by_name: dict[str, list[tuple[int, str]]] = {}
    for (_src, name), value in su.items():
        su_by_name.setdefault(name, []).append(value)
    rep = StackReport(
        board.name,
        str(elf_path),
        stack_size or board.stack_size,
        guard=guard,
        fault_stack=fault_stack,
    )
    for fn in funcs:
        hit = None
        src = files.get(fn.addr)
        name = su_name(fn.name, su, src)
        if src is not None and (src, name) in su:
            hit = su[(src, name)]
        elif len(su_by_name.get(name, [])) >= 1 and src is None:
            hit = max(su_by_name[name])
        if hit is not None:
            fn.frame, fn.source = hit[0], "su"
            fn.dynamic = "dynamic" in hit[1] and "bounded" not in hit[1]
    indirect_targets = sorted(taken | literal_taken)
    rep.indirect_targets = sorted(by_addr[a].name for a in indirect_targets)

    def callees(fn: FunctionInfo) -> list[int]:
        out = sorted(fn.calls)
        if fn.indirect:
            out += [a for a in indirect_targets if a not in fn.calls]
        return out

    memo: dict[int, tuple[int, list[int]]] = {}
    problems: list[str] = []
    reported: set[str] = set()

    def problem(msg: str) -> None:
        if msg not in reported:
            reported.add(msg)
            problems.append(msg)

    def deepest(addr: int, stack: list[int]) -> tuple[int, list[int]]:
        if addr in memo:
            return memo[addr]
        fn = by_addr[addr]
        if fn.dynamic:
            how = "-fstack-usage says 'dynamic'" if fn.source == "su" else "sp moved by a register"
            problem(
                f"function {fn.name} has a dynamic stack frame ({how}: a variable-length array "
                f"or alloca); its stack use cannot be bounded"
            )
        if fn.indirect and not indirect_targets:
            # No function's address is stored in data or loaded from a literal, so no pointer
            # to call exists: the call site is dead in this firmware (a generated model whose
            # experts run colibri_expert_ffn_f32 has no kernel table: kernels == NULL).
            if fn.name not in rep.unreachable_indirect:
                rep.unreachable_indirect.append(fn.name)
        best, best_path = 0, []
        stack.append(addr)
        for callee in callees(fn):
            if callee in stack:
                cycle = [by_addr[a].name for a in stack[stack.index(callee) :]]
                problem(
                    "recursion: " + " -> ".join(cycle + [by_addr[callee].name]) + " (the "
                    "MCU stack must be bounded: make it iterative)"
                )
                continue
            depth, path = deepest(callee, stack)
            if depth > best:
                best, best_path = depth, path
        stack.pop()
        result = (fn.frame + best, [addr, *best_path])
        memo[addr] = result
        return result

    def entry(addr: int) -> StackEntry:
        depth, path = deepest(addr, [])
        return StackEntry(
            by_addr[addr].name, depth, [(by_addr[a].name, by_addr[a].frame) for a in path]
        )

    if entry_addr not in by_addr:
        raise StackUsageError(f"{elf_path}: the entry point {entry_addr:#x} is not a function")
    # The start-up always calls main, or the platform's C start function that calls it
    # (START_FUNCTIONS); an assembly start-up objdump cannot follow (Xtensa literal pools in
    # startup.S) may hide the call, so the edge is added when the scan missed it.
    for name in START_FUNCTIONS:
        first = [fn.addr for fn in funcs if fn.name == name and files.get(fn.addr) is None]
        if first:
            if first[0] != entry_addr:
                by_addr[entry_addr].calls.add(first[0])
            break
    rep.entry = entry(entry_addr)
    if memo:
        big = max((by_addr[a] for a in memo), key=lambda fn: (fn.frame, fn.name))
        rep.largest_frame = (big.name, big.frame)
        frames = sorted((by_addr[a].frame for a in memo), reverse=True)
        rep.guard_need = sum(frames[:2]) + 8
    for fn in funcs:
        if fn.name in API_ENTRY_POINTS or fn.name.endswith(API_ENTRY_SUFFIXES):
            if fn.addr != entry_addr and (files.get(fn.addr) is None):
                rep.api.append(entry(fn.addr))
    for addr in sorted(vectors - {entry_addr}):
        rep.handlers.append(entry(addr))
    rep.kernels = [
        kernel_entry(entry(fn.addr), reached(fn.addr, by_addr, callees), by_addr)
        for fn in funcs
        if KERNEL_NAME.search(fn.name) or fn.name in kernel_roots
    ]
    rep.estimated = {
        by_addr[a].name: by_addr[a].frame for a in sorted(memo) if by_addr[a].source != "su"
    }
    rep.problems = problems
    return rep


def reached(
    root: int, by_addr: dict[int, FunctionInfo], callees: Callable[[FunctionInfo], list[int]]
) -> set[int]:
    """The addresses of the functions reachable from `root` (itself included) by the call
    graph."""
    seen = {root}
    todo = [root]
    while todo:
        for callee in callees(by_addr[todo.pop()]):
            if callee not in seen:
                seen.add(callee)
                todo.append(callee)
    return seen


def kernel_entry(
    e: StackEntry, funcs: set[int], by_addr: dict[int, FunctionInfo]
) -> dict[str, Any]:
    """StackReport.kernels' entry of one expert kernel: its stack (e) and the code of the
    functions it reaches (funcs)."""
    big = max((by_addr[a] for a in funcs), key=lambda fn: (fn.frame, fn.name))
    return {
        "name": e.name,
        "bound": e.bound,
        "frame": [big.name, big.frame],
        "code": sum(by_addr[a].size for a in funcs),
        "calls": sorted(by_addr[a].name for a in funcs),
    }


# -- report and check -------------------------------------------------------------------------


def report_path(elf: str | Path) -> Path:
    """Where the build writes the stack report of a firmware: ``<elf>.stack.json``."""
    return Path(str(elf) + ".stack.json")


def write_report(rep: StackReport, path: str | Path | None = None) -> Path:
    out = Path(path) if path else report_path(rep.elf)
    out.write_text(json.dumps(rep.as_dict(), indent=2) + "\n")
    return out


def load_report(elf: str | Path) -> StackReport | None:
    """The stack report the build wrote beside ``elf``, or None (not bare metal / old build)."""
    path = report_path(elf)
    if not path.is_file():
        return None
    try:
        return StackReport.from_dict(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError):
        return None


def format_stack(rep: StackReport) -> list[str]:
    """Lines for ``colibri size``: budget, worst case per entry point, the deepest path."""
    lines = []
    head = f"  stack: worst case {rep.worst} / {rep.stack_size} bytes (board stack_size)"
    if rep.stack_size:
        head += f" ({100.0 * rep.worst / rep.stack_size:.1f}%)"
    lines.append(head)
    if rep.entry:
        lines.append(f"    deepest path: {rep.entry.path_text()}")
    for e in rep.api:
        lines.append(f"    {e.name}: {e.bound} bytes")
    for e in rep.handlers:
        on = f" (on the {rep.fault_stack}-byte fault stack)" if rep.fault_stack else ""
        lines.append(f"    {e.name}: {e.bound} bytes{on}")
    if rep.estimated:
        est = sorted(rep.estimated.items(), key=lambda kv: -kv[1])[:5]
        lines.append(
            "    frames read from the disassembly (no .su): "
            + ", ".join(f"{n} {b}" for n, b in est)
            + (f", ... ({len(rep.estimated)} in all)" if len(rep.estimated) > 5 else "")
        )
    if rep.guard >= 32 and rep.largest_frame and rep.guard_need > rep.guard:
        name, nbytes = rep.largest_frame
        lines.append(
            f"    WARNING: the two largest frames + 8 ({rep.guard_need} bytes; {name} {nbytes}) "
            f"exceed the {rep.guard}-byte MPU guard under the stack: an overflow could step "
            f"over the guard"
        )
    lines += format_kernels(rep.kernels)
    for p in rep.problems:
        lines.append(f"    PROBLEM: {p}")
    return lines


def _ids_text(ids: list[int]) -> str:
    """Expert numbers as ranges: 0-3, 5."""
    runs: list[list[int]] = []
    for i in sorted(ids):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def format_kernels(kernels: list[dict[str, Any]]) -> list[str]:
    """One line per expert kind (the kernels that reach the same functions besides themselves):
    its experts, the code one of them reaches, its worst-case stack and largest frame."""
    kinds: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for k in kernels:
        kinds.setdefault(tuple(c for c in k["calls"] if c != k["name"]), []).append(k)
    lines = []
    for group in kinds.values():
        ids = [int(k["name"].rsplit("_", 1)[1]) for k in group if KERNEL_NAME.search(k["name"])]
        what = f"expert kernel{'s' if len(ids) > 1 else ''} {_ids_text(ids)}"
        if len(ids) < len(group):
            what = ", ".join(k["name"] for k in group)
        code = max(int(k["code"]) for k in group)
        worst = max(group, key=lambda k: int(k["bound"]))
        fname, fbytes = worst["frame"]
        lines.append(
            f"    {what}: code {code} bytes "
            f"(every function reached), stack {worst['bound']} bytes (largest frame {fname} "
            f"{fbytes})"
        )
    return lines


#: The smallest MPU guard: what the linker script uses when nothing asks for more.
MIN_MPU_GUARD = 512
#: The smallest Xtensa guard: the two 64-byte blocks the ESP32-S3's data breakpoints watch.
MIN_XTENSA_GUARD = 128
#: Xtensa windowed ABI: a window spill stores up to 48 bytes below the stack pointer of the frame
#: after the one spilled (the call12 extra save area), beyond the frames themselves.
XTENSA_SPILL_BYTES = 48


def stack_guard_size(board: Board, su_files: list[str | Path]) -> int | None:
    """Bytes of the guard below the stack for a program whose frames are in ``su_files`` (before
    the link), so that the two largest frames + 8 fit it (see the module doc): ARMv7-M, the
    least power of two (one MPU region) >= that, at least MIN_MPU_GUARD; Xtensa, the least
    multiple of 64 >= that plus XTENSA_SPILL_BYTES, at least MIN_XTENSA_GUARD (the painted guard
    whose top the ESP32-S3's data breakpoints watch: templates/linker/xtensa_*.ld.j2). None
    elsewhere (the template's default)."""
    frames = sorted((f for f, _ in read_su_files(su_files).values()), reverse=True)
    need = sum(frames[:2]) + 8
    if board.arch == "xtensa":
        return max(MIN_XTENSA_GUARD, (need + XTENSA_SPILL_BYTES + 63) // 64 * 64)
    if board.arch not in ("armv7-m", "armv7e-m"):
        return None
    size = MIN_MPU_GUARD
    while size < need:
        size *= 2
    return size


def check_guard(rep: StackReport) -> None:
    """Fail (StackUsageError) when an MPU guard (>= 32 bytes) is smaller than the two largest
    reachable frames + 8: an overflow could step over it. Applies with ``stack_check=0`` too."""
    if rep.guard >= 32 and rep.guard_need > rep.guard:
        name, nbytes = rep.largest_frame or ("?", 0)
        raise StackUsageError(
            f"stack guard on {rep.board}: the {rep.guard}-byte MPU guard below the stack is "
            f"smaller than the two largest frames + 8 ({rep.guard_need} bytes; the largest: "
            f"{name}, {nbytes}): an overflow could step over it"
        )


def check_fault_stack(rep: StackReport) -> None:
    """Fail (StackUsageError) when an exception handler's worst case does not fit the fault stack
    it runs on (``rep.fault_stack`` bytes; no check when the firmware has none): the overflow
    report itself would overflow. Applies with ``stack_check=0`` too."""
    if rep.fault_stack <= 0:
        return
    for h in rep.handlers:
        if h.bound > rep.fault_stack:
            raise StackUsageError(
                f"stack of the fault handler on {rep.board}: {h.name} needs {h.bound} bytes > "
                f"the {rep.fault_stack}-byte fault stack (templates/linker/cortex_m.ld.j2); "
                f"deepest path: {h.path_text()}"
            )


def check_stack_budget(rep: StackReport) -> None:
    """Fail on dynamic frames or recursion (StackUsageError) or when the worst case exceeds the
    board's stack_size (BudgetExceeded), naming the deepest path."""
    if rep.problems:
        raise StackUsageError(
            f"stack analysis of {rep.elf} ({rep.board}): " + "; ".join(rep.problems)
        )
    if rep.entry and rep.worst > rep.stack_size:
        raise BudgetExceeded(
            f"stack budget exceeded on {rep.board}: worst case {rep.worst} bytes > stack_size "
            f"{rep.stack_size} ({rep.worst - rep.stack_size} bytes over); deepest path: "
            f"{rep.entry.path_text()}. Raise stack_size in boards/{rep.board}.toml (or build "
            f"with stack_size=N) or shrink the frames on that path"
        )
