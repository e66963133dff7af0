"""A stand-in for pyOCD (no probe or board here): the modules colibri.hil.backends.PyOCDBackend
imports, with a "board" whose firmware is a script of Arm semihosting calls behaving like the
Colibri runner (open input.bin, read it, write output.bin, print on ":tt", SYS_EXIT_EXTENDED).
The semihosting agent mirrors pyOCD's: requests dispatched through ``_REQUEST_MAP``, files
through the I/O handler's ``open`` / ``_std_open``, fds 1-2 through the console handler."""

from __future__ import annotations

import io
import struct
import sys
import types
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np

SYS_OPEN, SYS_CLOSE, SYS_WRITE, SYS_READ, SYS_EXIT_EXTENDED = 0x01, 0x02, 0x05, 0x06, 0x20
OPEN_MODES = ["r", "rb", "r+", "r+b", "w", "wb", "w+", "w+b", "a", "ab", "a+", "a+b"]


class Context:
    """Target memory (a dict of blocks) and the pending semihosting request."""

    def __init__(self) -> None:
        self.mem: dict[int, bytes] = {}
        self.next_addr = 0x20000000
        self.request: tuple[int, int] | None = None
        self.result: int | None = None

    def put(self, data: bytes) -> int:
        addr = self.next_addr
        self.mem[addr] = data
        self.next_addr += (len(data) + 0x100) & ~0xFF
        return addr

    def read_bytes(self, addr: int, n: int) -> bytes:
        for base, data in self.mem.items():
            if base <= addr < base + max(len(data), 1):
                return data[addr - base : addr - base + n]
        raise AssertionError(f"read of unmapped {addr:#x}")

    def read_memory_block32(self, addr: int, n: int) -> list[int]:
        return list(struct.unpack(f"<{n}I", self.read_bytes(addr, 4 * n)))

    def write_memory_block8(self, addr: int, data: bytes) -> None:
        self.mem[addr] = bytes(data)


def runner_script(ctx: Context, exit_code: int = 0, fault: bool = False) -> Any:
    """The firmware: yields (op, args) semihosting requests, reading each result from ctx."""

    def call(op: int, *words: int) -> Any:
        ctx.request = (op, ctx.put(struct.pack(f"<{len(words)}I", *words)))
        yield
        return ctx.result

    name = ctx.put(b"input.bin\0")
    fd = yield from call(SYS_OPEN, name, 1, 9)  # "rb"
    buf = ctx.put(bytes(12))
    yield from call(SYS_READ, fd, buf, 12)
    magic, t, d = struct.unpack("<3I", ctx.mem[buf])
    rows = ctx.put(bytes(4 * t * d))
    yield from call(SYS_READ, fd, rows, 4 * t * d)
    x = np.frombuffer(ctx.mem[rows], "<f4").reshape(t, d)
    if fault:
        text = ctx.put(b"colibri: HardFault pc=0x1234\n")
        tt = yield from call(SYS_OPEN, ctx.put(b":tt\0"), 4, 3)
        yield from call(SYS_WRITE, tt, text, len(ctx.mem[text]))
        yield from call(SYS_EXIT_EXTENDED, 0x20026, 99)
        return
    out = struct.pack("<5I", 0x4F424C43, t, d, 1, 32)
    out += (2 * x).astype("<f4").tobytes() + np.zeros((t, 1), "<i4").tobytes()
    out += np.ones((t, 1), "<f4").tobytes()
    ofd = yield from call(SYS_OPEN, ctx.put(b"output.bin\0"), 5, 10)  # "wb"
    data = ctx.put(out)
    yield from call(SYS_WRITE, ofd, data, len(out))
    yield from call(SYS_CLOSE, ofd)
    tt = yield from call(SYS_OPEN, ctx.put(b":tt\0"), 4, 3)
    text = b"colibri: model fake: %d tokens done\nstack high-water: 640 of 4096 bytes\n" % t
    yield from call(SYS_WRITE, tt, ctx.put(text), len(text))
    # the runner's exit: SYS_EXIT_EXTENDED with {ADP_Stopped_ApplicationExit, code}
    yield from call(SYS_EXIT_EXTENDED, 0x20026, exit_code & 0xFFFFFFFF)


class FakeTarget:
    class State(Enum):
        RUNNING = 1
        HALTED = 2

    def __init__(self, board: FakeBoard) -> None:
        self.board = board
        self.ctx = Context()
        self.script: Any = None
        self.state = FakeTarget.State.HALTED

    def reset_and_halt(self) -> None:
        self.board.events.append("reset_and_halt")
        self.ctx = Context()
        self.script = runner_script(self.ctx, self.board.exit_code, self.board.fault)
        self.state = FakeTarget.State.HALTED

    def get_target_context(self) -> Context:
        return self.ctx

    def resume(self) -> None:
        self.board.events.append("resume")
        self.state = FakeTarget.State.RUNNING

    def halt(self) -> None:
        self.board.events.append("halt")
        self.state = FakeTarget.State.HALTED

    def get_state(self) -> Any:
        if self.state is FakeTarget.State.RUNNING:
            try:  # the core runs up to its next BKPT 0xAB
                next(self.script)
            except StopIteration:
                return FakeTarget.State.RUNNING  # spins forever (no exit call)
            self.state = FakeTarget.State.HALTED
        return self.state

    def read_core_register(self, name: str) -> int:
        return 0x1234


class FakeBoard:
    """What the fake probe is connected to; records what the backend did."""

    def __init__(self, exit_code: int = 0, fault: bool = False) -> None:
        self.exit_code = exit_code
        self.fault = fault
        self.events: list[str] = []
        self.programmed: list[str] = []
        self.target = FakeTarget(self)


class FakeSession:
    def __init__(self, board: FakeBoard) -> None:
        self.board = board

    def __enter__(self) -> FakeSession:
        self.board.events.append("open")
        return self

    def __exit__(self, *exc: object) -> None:
        self.board.events.append("close")


def install(monkeypatch: Any, board: FakeBoard | None) -> None:
    """Put fake pyocd modules in sys.modules (board None: no probe connected)."""

    def session_with_chosen_probe(unique_id: str | None = None, **kw: Any) -> Any:
        return None if board is None else FakeSession(board)

    class FileProgrammer:
        def __init__(self, session: FakeSession) -> None:
            self.session = session

        def program(self, path: str) -> None:
            assert Path(path).is_file()
            self.session.board.programmed.append(path)

    class SemihostIOHandler:
        agent: Any = None

        def _std_open(self, fnptr: int, fnlen: int, mode: str) -> tuple[Any, str]:
            name = self.agent.get_data(fnptr, fnlen).decode()
            if name == ":tt":
                return {"r": 0, "w": 1, "a": 2}[mode], name
            return None, name

        def cleanup(self) -> None:
            pass

    class InternalSemihostIOHandler(SemihostIOHandler):
        def __init__(self) -> None:
            self.files: dict[int, Any] = {}

        def open(self, fnptr: int, fnlen: int, mode: str) -> int:
            special, name = self._std_open(fnptr, fnlen, mode)
            if special is not None:
                return int(special)
            fd = 3 + len(self.files)
            self.files[fd] = open(name, mode)  # noqa: SIM115
            return fd

        def read(self, fd: int, ptr: int, length: int) -> int:
            data = self.files[fd].read(length)
            self.agent.context.write_memory_block8(ptr, data)
            return length - len(data)

        def write(self, fd: int, ptr: int, length: int) -> int:
            self.files[fd].write(self.agent.get_data(ptr, length))
            return 0

        def close(self, fd: int) -> int:
            self.files.pop(fd).close()
            return 0

        def cleanup(self) -> None:
            for f in self.files.values():
                f.close()

    class ConsoleIOHandler(SemihostIOHandler):
        def __init__(self, stdin_file: Any, stdout_file: Any = None) -> None:
            self._stdout_file = stdout_file or stdin_file

        def write(self, fd: int, ptr: int, length: int) -> int:
            self._stdout_file.write(self.agent.get_data(ptr, length))
            return 0

    class SemihostAgent:
        def __init__(self, context: Context, io_handler: Any = None, console: Any = None):
            self.context = context
            self.io_handler = io_handler
            self.io_handler.agent = self
            self.console = console or io_handler
            self.console.agent = self

        def get_data(self, ptr: int, length: int) -> bytes:
            return self.context.read_bytes(ptr, length)

        def _get_args(self, args: int, n: int) -> list[int]:
            return self.context.read_memory_block32(args, n)

        def check_and_handle_semihost_request(self) -> bool:
            if self.context.request is None:
                return False
            op, args = self.context.request
            self.context.request = None
            handler = self._REQUEST_MAP.get(op)
            self.context.result = handler(self, args) if handler else -1
            return True

        def handle_sys_open(self, args: int) -> int:
            ptr, mode, length = self._get_args(args, 3)
            return int(self.io_handler.open(ptr, length, OPEN_MODES[mode]))

        def handle_sys_close(self, args: int) -> int:
            return int(self.io_handler.close(self._get_args(args, 1)[0]))

        def handle_sys_write(self, args: int) -> int:
            fd, ptr, length = self._get_args(args, 3)
            handler = self.console if fd in (1, 2) else self.io_handler
            return int(handler.write(fd, ptr, length))

        def handle_sys_read(self, args: int) -> int:
            fd, ptr, length = self._get_args(args, 3)
            return int(self.io_handler.read(fd, ptr, length))

        def cleanup(self) -> None:
            self.io_handler.cleanup()

        _REQUEST_MAP = {
            SYS_OPEN: handle_sys_open,
            SYS_CLOSE: handle_sys_close,
            SYS_WRITE: handle_sys_write,
            SYS_READ: handle_sys_read,
        }

    def module(name: str, **attrs: Any) -> types.ModuleType:
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, mod)
        return mod

    module("pyocd")
    module("pyocd.core")
    module("pyocd.core.helpers", ConnectHelper=types.SimpleNamespace(
        session_with_chosen_probe=session_with_chosen_probe))  # fmt: skip
    module("pyocd.core.target", Target=FakeTarget)
    module("pyocd.flash")
    module("pyocd.flash.file_programmer", FileProgrammer=FileProgrammer)
    module("pyocd.debug")
    module(
        "pyocd.debug.semihost", SemihostAgent=SemihostAgent,
        InternalSemihostIOHandler=InternalSemihostIOHandler, ConsoleIOHandler=ConsoleIOHandler,
    )  # fmt: skip
    _ = io
