"""Boards as data: load ``boards/<name>.toml`` and answer questions about a board.

The board file is the single source of board facts (toolchain, flags, memory map, QEMU command).
SConstruct, the CLI and the tests all go through this module; the schema is documented in
``boards/README.md``. Flags common to every board (C standard, warnings, ``-ffp-contract=off``)
and to every bare-metal board (section GC, no libc pattern replacement) are defined here once.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import BoardError
from .paths import resource_dir, tools_dir

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib

KINDS = ("host", "linux-user", "baremetal")

#: Every C file of every board. ``-ffp-contract=off`` is mandatory: the numpy reference mirrors
#: the fp32 accumulation order, and a fused multiply-add would change router logits.
COMMON_CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off"]
#: Bare-metal boards: per-function sections for --gc-sections, and no memcpy/memset pattern
#: replacement (the runtime's own loops must stay loops, libc may not be there).
BAREMETAL_CFLAGS = ["-ffunction-sections", "-fdata-sections", "-fno-tree-loop-distribute-patterns"]
BAREMETAL_DEFINES = ["COLIBRI_NO_FILESYSTEM"]
#: --emit-relocs keeps the relocations in the linked ELF (no loaded byte changes): the stack
#: analysis (colibri.targets.stack) reads from them which words of the data are pointers, so a
#: weight whose bits equal a function's address is not taken for one.
BAREMETAL_LDFLAGS = ["-nostartfiles", "-Wl,--gc-sections", "-Wl,--emit-relocs"]

_TypeSpec = type | tuple[type, ...]

_REQUIRED: dict[str, _TypeSpec] = {
    "name": str,
    "description": str,
    "arch": str,
    "cpu": str,
    "kind": str,
    "toolchain_prefix": str,
    "cflags": list,
    "ldflags": list,
    "libs": list,
    "float_abi": str,
    "platform": str,
    "has_filesystem": bool,
    "has_mmap": bool,
    "stack_size": int,
    "install_hint": str,
}
_OPTIONAL: dict[str, _TypeSpec] = {
    "isa": str,
    "variant_of": str,
    "cc": str,
    "defines": list,
    "tool_libs": list,
    "tool_dirs": list,
    "linker_template": str,
    "apt_packages": list,
    "memory": dict,
    "qemu": dict,
}
_QEMU_KEYS: dict[str, _TypeSpec] = {
    "binary": str,
    "args": list,
    "timeout": (int, float),
    "install_hint": str,
}


@dataclass(frozen=True)
class MemoryRegion:
    """A memory region of the real part (the budget; QEMU may map more)."""

    name: str
    origin: int
    size: int

    @property
    def end(self) -> int:
        return self.origin + self.size


@dataclass(frozen=True)
class QemuConfig:
    """How to run an ELF of this board under QEMU; ``{elf}`` in args is the ELF path."""

    binary: str
    args: list[str]
    timeout: float = 120.0
    install_hint: str = ""

    @property
    def cpu(self) -> str | None:
        """The ``-cpu`` model, if the command selects one."""
        for i, arg in enumerate(self.args[:-1]):
            if arg == "-cpu":
                return self.args[i + 1].split(",")[0]
        return None

    @property
    def machine(self) -> str | None:
        """The ``-M`` machine name, if the command selects one."""
        for i, arg in enumerate(self.args[:-1]):
            if arg in ("-M", "-machine"):
                return self.args[i + 1].split(",")[0]
        return None


@dataclass(frozen=True)
class Board:
    """Everything Colibri knows about one board (one ``boards/<name>.toml``)."""

    name: str
    description: str
    arch: str
    cpu: str
    kind: str
    toolchain_prefix: str
    cflags: list[str]
    ldflags: list[str]
    libs: list[str]
    float_abi: str
    platform: str
    has_filesystem: bool
    has_mmap: bool
    stack_size: int
    install_hint: str
    isa: str = ""
    #: An ISA variant of another board (same toolchain, emulator and platform, other -mcpu):
    #: tests that enumerate boards run their matrix on the base board only (see
    #: :func:`matrix_boards`); the variant has its own kernel self-test and forward checks.
    variant_of: str = ""
    cc: str = "gcc"
    defines: list[str] = field(default_factory=list)
    tool_libs: list[str] = field(default_factory=list)
    #: Folders searched after PATH for the toolchain and the emulator (``$VAR`` and ``~``
    #: expanded; an entry naming an unset variable is skipped): where scripts/setup.sh builds a
    #: toolchain no registry has (esp32s3).
    tool_dirs: list[str] = field(default_factory=list)
    linker_template: str = ""
    apt_packages: list[str] = field(default_factory=list)
    memory: dict[str, MemoryRegion] = field(default_factory=dict)
    qemu: QemuConfig | None = None
    path: Path | None = None

    # -- derived facts ------------------------------------------------------------------------

    @property
    def is_baremetal(self) -> bool:
        return self.kind == "baremetal"

    @property
    def elf_suffix(self) -> str:
        """``.elf`` on bare metal, nothing on hosted boards."""
        return ".elf" if self.is_baremetal else ""

    def tool(self, name: str) -> str:
        """A toolchain program, e.g. ``tool("ar")`` -> ``arm-none-eabi-ar``: the bare name when
        it is on PATH (or nowhere), else its full path in the first of ``tool_dirs`` holding it."""
        program = self.toolchain_prefix + name
        if shutil.which(program) is None:
            for folder in self.search_dirs():
                if shutil.which(program, path=str(folder)):
                    return str(folder / program)
        return program

    def search_dirs(self) -> list[Path]:
        """``tool_dirs`` expanded: entries whose variables are unset are left out."""
        dirs = []
        for entry in self.tool_dirs:
            expanded = os.path.expanduser(os.path.expandvars(entry))
            if "$" not in expanded:
                dirs.append(Path(expanded))
        return dirs

    def _qemu_candidates(self) -> list[str]:
        """Every distinct ``qemu.binary`` on PATH, then in ``tool_dirs``, in that order."""
        assert self.qemu is not None
        path = os.environ.get("PATH", "").split(os.pathsep)
        found = (
            shutil.which(self.qemu.binary, path=folder)
            for folder in [*path, *(str(d) for d in self.search_dirs())]
            if folder
        )
        return list(dict.fromkeys(b for b in found if b))

    def _qemu_lacks(self, binary: str) -> list[str]:
        """What ``binary`` lacks of the board's ``-M`` machine and ``-cpu`` CPU."""
        assert self.qemu is not None
        missing = []
        if self.qemu.machine is not None and self.qemu.machine not in _qemu_machines(binary):
            missing.append(f"machine '{self.qemu.machine}'")
        if self.qemu.cpu is not None and self.qemu.cpu not in _qemu_cpus(binary):
            missing.append(f"CPU '{self.qemu.cpu}'")
        return missing

    def qemu_binary(self) -> str | None:
        """The emulator to run this board's programs: the first ``qemu.binary`` on PATH, then in
        ``tool_dirs``, that has the board's ``-M`` machine and ``-cpu`` CPU; None if none has."""
        if self.qemu is None:
            return None
        return next((b for b in self._qemu_candidates() if not self._qemu_lacks(b)), None)

    @property
    def compiler(self) -> str:
        return self.tool(self.cc)

    def all_defines(self) -> list[str]:
        extra = [] if self.has_filesystem else list(BAREMETAL_DEFINES)
        return extra + [d for d in self.defines if d not in extra]

    def compile_flags(self) -> list[str]:
        """Every flag for compiling C for this board (without -I / -D)."""
        flags = list(COMMON_CFLAGS)
        if self.is_baremetal:
            flags += BAREMETAL_CFLAGS
        return flags + list(self.cflags)

    def link_flags(self) -> list[str]:
        """Flags for linking a program (without the linker script, objects and libraries)."""
        flags = list(self.cflags)
        if self.is_baremetal:
            flags += BAREMETAL_LDFLAGS
        return flags + list(self.ldflags)

    def tool_lib_paths(self) -> list[Path]:
        """Host-built helper libraries (``tool_libs``), resolved under :func:`tools_dir`."""
        return [tools_dir() / lib for lib in self.tool_libs]

    def region(self, name: str) -> MemoryRegion:
        try:
            return self.memory[name]
        except KeyError:
            raise BoardError(
                f"board {self.name}: no [memory.{name}] region (has: "
                f"{', '.join(sorted(self.memory)) or 'none'}); add it to {self.path}"
            ) from None

    # -- availability -------------------------------------------------------------------------

    def can_build(self) -> tuple[bool, str]:
        """Whether this board's toolchain is installed; the message says what is missing."""
        compiler = shutil.which(self.compiler)
        if compiler is None:
            where = "on PATH" + "".join(f" or in {d}" for d in self.search_dirs())
            return False, (
                f"board {self.name}: C compiler '{self.compiler}' not found {where}. "
                f"Install: {self.install_hint}"
            )
        for lib in self.tool_lib_paths():
            if not lib.is_file():
                return False, (
                    f"board {self.name}: helper library {lib} is missing (the toolchain lacks "
                    f"functions it needs); run scripts/setup.sh to build it"
                )
        return True, f"board {self.name}: {compiler}"

    def can_run(self) -> tuple[bool, str]:
        """Whether programs for this board can be run here (host, or the QEMU it needs)."""
        if self.kind == "host":
            return True, f"board {self.name}: runs natively"
        if self.qemu is None:
            return False, f"board {self.name}: no [qemu] section in {self.path}"
        hint = self.qemu.install_hint or self.install_hint
        binary = self.qemu_binary()
        if binary is not None:
            return True, f"board {self.name}: {binary}"
        candidates = self._qemu_candidates()
        if not candidates:
            return False, (
                f"board {self.name}: emulator '{self.qemu.binary}' not found on PATH. "
                f"Install: {hint}"
            )
        lacks = [f"{b} has no {' and no '.join(self._qemu_lacks(b))}" for b in candidates]
        return False, f"board {self.name}: {'; '.join(lacks)}. Install: {hint}"


@functools.cache
def _qemu_names(binary: str, option: str) -> frozenset[str]:
    """The first word of each line of ``binary <option> help`` (its machines or CPUs)."""
    try:
        out = subprocess.run(
            [binary, option, "help"], capture_output=True, text=True, timeout=30, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return frozenset()
    return frozenset(line.split()[0] for line in out.splitlines() if line.strip())


def _qemu_cpus(binary: str) -> frozenset[str]:
    return _qemu_names(binary, "-cpu")


def _qemu_machines(binary: str) -> frozenset[str]:
    """Machine names (the list's heading line, "Supported machines are:", gives "Supported",
    which no board names)."""
    return _qemu_names(binary, "-machine")


def boards_dir() -> Path:
    return resource_dir() / "boards"


def _check_type(where: str, key: str, value: Any, expected: type | tuple[type, ...]) -> None:
    wrong_bool = isinstance(value, bool) and bool not in _as_tuple(expected)  # bool is an int
    if wrong_bool or not isinstance(value, expected):
        raise BoardError(f"{where}: '{key}' must be {_type_name(expected)}, got {value!r}")
    if isinstance(value, list) and not all(isinstance(v, str) for v in value):
        raise BoardError(f"{where}: '{key}' must be a list of strings, got {value!r}")


def _as_tuple(expected: type | tuple[type, ...]) -> tuple[type, ...]:
    return expected if isinstance(expected, tuple) else (expected,)


def _type_name(expected: type | tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in _as_tuple(expected))


def _parse_memory(where: str, raw: dict[str, Any]) -> dict[str, MemoryRegion]:
    regions: dict[str, MemoryRegion] = {}
    for name, spec in raw.items():
        if not isinstance(spec, dict) or set(spec) != {"origin", "size"}:
            raise BoardError(f"{where}: [memory.{name}] must have exactly 'origin' and 'size'")
        for key in ("origin", "size"):
            _check_type(f"{where} [memory.{name}]", key, spec[key], int)
        if spec["size"] <= 0 or spec["origin"] < 0:
            raise BoardError(f"{where}: [memory.{name}] needs origin >= 0 and size > 0")
        regions[name] = MemoryRegion(name, spec["origin"], spec["size"])
    return regions


def _parse_qemu(where: str, raw: dict[str, Any]) -> QemuConfig:
    unknown = set(raw) - set(_QEMU_KEYS)
    if unknown:
        raise BoardError(
            f"{where}: unknown key(s) in [qemu]: {', '.join(sorted(unknown))} "
            f"(allowed: {', '.join(_QEMU_KEYS)})"
        )
    for key in ("binary", "args"):
        if key not in raw:
            raise BoardError(f"{where}: [qemu] needs '{key}'")
    for key, value in raw.items():
        _check_type(f"{where} [qemu]", key, value, _QEMU_KEYS[key])
    return QemuConfig(
        binary=raw["binary"],
        args=list(raw["args"]),
        timeout=float(raw.get("timeout", 120)),
        install_hint=raw.get("install_hint", ""),
    )


def board_from_file(path: Path) -> Board:
    """Parse and validate one board file."""
    where = str(path)
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except OSError as exc:
        raise BoardError(f"{where}: cannot read board file: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise BoardError(f"{where}: invalid TOML: {exc}") from exc

    unknown = set(raw) - set(_REQUIRED) - set(_OPTIONAL)
    if unknown:
        raise BoardError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))}; the schema is in "
            f"boards/README.md"
        )
    missing = [k for k in _REQUIRED if k not in raw]
    if missing:
        raise BoardError(f"{where}: missing key(s) {', '.join(missing)} (see boards/README.md)")
    for key, value in raw.items():
        _check_type(where, key, value, {**_REQUIRED, **_OPTIONAL}[key])

    if raw["name"] != path.stem:
        raise BoardError(f"{where}: name '{raw['name']}' must match the file name '{path.stem}'")
    if raw["kind"] not in KINDS:
        raise BoardError(f"{where}: kind '{raw['kind']}' is not one of {', '.join(KINDS)}")
    if raw["stack_size"] <= 0:
        raise BoardError(f"{where}: stack_size must be > 0, got {raw['stack_size']}")

    fields = dict(raw)
    fields["memory"] = _parse_memory(where, raw.get("memory", {}))
    fields["qemu"] = _parse_qemu(where, raw["qemu"]) if "qemu" in raw else None
    board = Board(**fields, path=path)

    if board.is_baremetal:
        for region in ("flash", "ram"):
            board.region(region)
        if board.platform and not board.linker_template:
            raise BoardError(f"{where}: a bare-metal board with a platform needs linker_template")
    if board.variant_of:
        base = path.parent / f"{board.variant_of}.toml"
        if board.variant_of == board.name or not base.is_file():
            raise BoardError(f"{where}: variant_of '{board.variant_of}' is not another board file")
    if board.kind != "host" and board.qemu is None and board.platform:
        raise BoardError(f"{where}: kind '{board.kind}' needs a [qemu] section to run programs")
    return board


def board_names() -> list[str]:
    """The names of the board files (``boards/<name>.toml``), sorted; no file is parsed."""
    return sorted(p.stem for p in boards_dir().glob("*.toml"))


def unknown_board(name: str) -> str:
    """The message for a board name without a board file: it lists the boards there are."""
    return f"unknown board '{name}'; available boards: {', '.join(board_names()) or 'none'}"


def load_board(name: str) -> Board:
    """Load ``boards/<name>.toml``; unknown names list the boards that exist."""
    path = boards_dir() / f"{name}.toml"
    if not name or "/" in name or not path.is_file():
        raise BoardError(unknown_board(name))
    return board_from_file(path)


def list_boards() -> list[Board]:
    """Every board file, sorted by name."""
    return [board_from_file(p) for p in sorted(boards_dir().glob("*.toml"))]


def matrix_boards() -> list[Board]:
    """The boards the full test matrix runs on: every board that is not a ``variant_of``
    another (a variant differs only in its kernels, which its own tests cover)."""
    return [b for b in list_boards() if not b.variant_of]


def linker_template_dir() -> Path:
    return resource_dir() / "templates" / "linker"


def render_linker_script(board: Board, path: str | Path, guard_size: int | None = None) -> Path:
    """Render the board's linker script (bare metal) to ``path`` and return it. ``guard_size``:
    bytes of the stack guard below the stack (None: the template's default; the SConstruct
    passes :func:`colibri.targets.stack.stack_guard_size` for model runners)."""
    import jinja2

    if not board.linker_template:
        raise BoardError(f"board {board.name} has no linker_template (kind {board.kind})")
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(linker_template_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["hex"] = lambda value: f"0x{int(value):08X}"
    try:
        template = env.get_template(board.linker_template)
    except jinja2.TemplateNotFound:
        raise BoardError(
            f"board {board.name}: linker template '{board.linker_template}' not found in "
            f"{linker_template_dir()}"
        ) from None
    text = template.render(
        board=board, memory=board.memory, stack_size=board.stack_size, guard_size=guard_size
    )
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.is_file() or out.read_text() != text:  # keep the timestamp when unchanged
        out.write_text(text)
    return out


def qemu_command(board: Board, elf: str | Path, extra: list[str] | None = None) -> list[str]:
    """The command that runs ``elf`` on this board; ``extra`` goes right after the binary.

    For the host board this is just the ELF. Commas in the ELF path are doubled where the
    placeholder sits inside a QEMU option list (``loader,file={elf},...``).
    """
    elf = str(elf)
    if board.kind == "host":
        return [elf]
    if board.qemu is None:
        raise BoardError(f"board {board.name}: no [qemu] section in {board.path}")
    args = []
    for arg in board.qemu.args:
        if "{image}" in arg:
            raise BoardError(
                f"board {board.name}: running needs a flash image (esptool.py merge_bin), "
                f"which Colibri does not make yet"
            )
        value = elf if arg == "{elf}" else elf.replace(",", ",,")
        args.append(arg.replace("{elf}", value))
    return [board.qemu_binary() or board.qemu.binary, *(extra or []), *args]
