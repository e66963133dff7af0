"""The HIL backends: each runs a built MoE-layer firmware (:class:`~colibri.hil.core.Firmware`)
on a board over rows ``x`` and returns a :class:`~colibri.hil.core.HilResult`.

* :class:`QemuBackend`: the built-in QEMU runner (:func:`colibri.targets.qemu.run_elf`), what
  ``colibri run`` does.
* :class:`LabgridQemuBackend`: a labgrid target's ``QEMUDriver`` (``--lg-env env.yaml``) powers
  the board on and off and owns the QEMU process; the fixture adds the firmware as the driver's
  kernel image and, to ``extra_args``, semihosting and the instruction-count plugin. The
  firmware's files (input.bin, output.bin) are relative to QEMU's working directory, so QEMU is
  powered on from a work directory. Its console: QEMU 7+ writes the semihosting ``:tt`` stream
  to its stdout, which the driver uses for QMP; what follows the QMP replies is read once QEMU
  has exited (semihosting SYS_EXIT_EXTENDED: its exit status is the firmware's). SYS_WRITE0
  output goes to a file chardev (QEMU cannot share the driver's serial chardev with
  semihosting: "Device 'serialsocket' is in use"), and the driver's serial console (a UART) is
  drained while the firmware runs; both join the console.
* :class:`PyOCDBackend`: a real Cortex-M board through a CMSIS-DAP / ST-Link / J-Link probe:
  pyOCD flashes the ELF, resets it and serves its semihosting (input.bin / output.bin, the
  console and the exit status, SYS_EXIT_EXTENDED) from the host; an optional UART is read too.
  It needs hardware: the test suite checks it with a fake pyOCD only.

The farm backend (labgrid coordinator places) is :class:`colibri.hil.farm.FarmBackend`.
"""

from __future__ import annotations

import io
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..boards import load_board
from ..errors import ColibriError, QemuError
from .core import Firmware, HilResult, input_bytes, parse_output

#: chdir is process-wide: QEMU (labgrid) resolves semihosting paths against its start-up cwd.
_CWD_LOCK = threading.Lock()


class Backend(Protocol):
    name: str

    def run(
        self, fw: Firmware, x: np.ndarray, count_instructions: bool = False,
        timeout: float | None = None,
    ) -> HilResult: ...  # fmt: skip


def check_exit(what: str, code: int | None, console: str, timeout: float) -> None:
    """QemuError for a timeout, a fault, a stack overflow or a non-zero exit status (the same
    verdicts as colibri.targets.qemu.run_elf), with the tail of the console."""
    from ..targets.qemu import (
        _FAULT_RE,
        _STACK_RE,
        FAULT_EXIT_CODE,
        STACK_OVERFLOW_EXIT_CODE,
        _tail,
    )

    if code is None:
        raise QemuError(f"{what} timed out after {timeout:g} s\n{_tail(console, '')}")
    overflow = _STACK_RE.search(console)
    if code == STACK_OVERFLOW_EXIT_CODE or overflow is not None:
        raise QemuError(f"{what}: guest stack overflow\n{_tail(console, '')}")
    fault = _FAULT_RE.search(console)
    if code == FAULT_EXIT_CODE or fault is not None:
        kind = fault.group(1) if fault else "fault"
        raise QemuError(f"{what}: guest {kind}\n{_tail(console, '')}")
    if code != 0:
        raise QemuError(f"{what}: exit code {code}, expected 0\n{_tail(console, '')}")


class QemuBackend:
    """The built-in runner: QEMU (or the host) started by colibri.targets.qemu.run_elf."""

    name = "qemu"

    def run(
        self, fw: Firmware, x: np.ndarray, count_instructions: bool = False,
        timeout: float | None = None,
    ) -> HilResult:  # fmt: skip
        from ..targets.qemu import run_elf

        board = load_board(fw.board)
        data = input_bytes(x, fw.d_model)
        with tempfile.TemporaryDirectory(prefix="colibri-hil-") as tmp:
            work = Path(tmp)
            (work / "input.bin").write_bytes(data)
            res = run_elf(board, fw.elf, work, timeout, count_instructions)
            raw = (work / "output.bin").read_bytes() if (work / "output.bin").is_file() else b""
        return parse_output(
            raw, fw.board, self.name, res.returncode, res.stdout + res.stderr,
            instructions=res.instructions,
        )  # fmt: skip


def qemu_machine(board_name: str) -> tuple[str, str]:
    """(binary, machine) of a QEMU board file (its ``-M``/``-machine`` argument)."""
    board = load_board(board_name)
    if board.qemu is None or board.kind != "baremetal":
        raise ColibriError(f"board {board_name}: not a bare-metal QEMU board")
    args = list(board.qemu.args)
    for flag in ("-M", "-machine"):
        if flag in args:
            return board.qemu.binary, args[args.index(flag) + 1].split(",")[0]
    raise ColibriError(f"board {board_name}: its [qemu] args name no -M machine")


class LabgridQemuBackend:
    """A labgrid target whose QEMUDriver starts the board (see the module docstring)."""

    name = "labgrid"

    def __init__(self, target: Any) -> None:
        self.target = target

    def driver(self) -> Any:
        try:
            return self.target.get_driver("QEMUDriver", activate=False)
        except Exception as exc:  # labgrid.exceptions.NoDriverFoundError
            raise ColibriError(
                f"labgrid target {self.target.name!r} has no QEMUDriver in its environment "
                f"({exc}); the labgrid backend runs firmware through one"
            ) from exc

    def run(
        self, fw: Firmware, x: np.ndarray, count_instructions: bool = False,
        timeout: float | None = None,
    ) -> HilResult:  # fmt: skip
        from ..targets.qemu import _parse_plugin_output, _plugin_args

        drv = self.driver()
        board = load_board(fw.board)
        _, machine = qemu_machine(fw.board)
        if drv.machine != machine:
            raise ColibriError(
                f"labgrid target {self.target.name!r}: its QEMUDriver emulates machine "
                f"{drv.machine!r}, but board {fw.board} is {machine!r}; use the environment "
                f"file's target for {fw.board}"
            )
        timeout = timeout or (board.qemu.timeout if board.qemu else 120.0)
        config = self.target.env.config
        image_key = drv.kernel or "colibri_firmware"
        images = config.data.setdefault("images", {})
        saved = (drv.kernel, drv.extra_args, images.get(image_key))
        with tempfile.TemporaryDirectory(prefix="colibri-hil-lg-") as tmp:
            work = Path(tmp)
            (work / "input.bin").write_bytes(input_bytes(x, fw.d_model))
            console_file = work / "semihosting-console.txt"
            extra = [
                drv.extra_args,
                f"-chardev file,id=colibri_semihost,path={console_file}",
                "-semihosting-config enable=on,target=native,chardev=colibri_semihost",
            ]
            if count_instructions:
                extra += _plugin_args(fw.elf, work / "icount.txt")
            images[image_key] = str(fw.elf)
            drv.kernel = image_key
            drv.extra_args = " ".join(a for a in extra if a)
            serial = b""
            stdout = ""
            code: int | None = None
            try:
                self.target.activate(drv)
                with _CWD_LOCK:
                    cwd = os.getcwd()
                    os.chdir(work)
                    try:
                        drv.on()
                    finally:
                        os.chdir(cwd)
                child = drv._child  # the QEMU process the driver started
                deadline = time.monotonic() + timeout
                while (left := deadline - time.monotonic()) > 0:
                    try:
                        serial += drv.read(size=4096, timeout=min(0.2, left))
                    except Exception:  # pexpect TIMEOUT: nothing on the serial console
                        pass
                    if child.poll() is not None:
                        code = child.returncode
                        break
                if code is None:
                    child.kill()
                    child.wait(5)
                # QEMU 7+ writes the semihosting ":tt" stream to its own stdout, which the
                # driver uses for QMP: what follows the QMP replies is the firmware's console
                stdout = _read_rest(child.stdout)
                # QEMU exited by itself (semihosting SYS_EXIT): the driver would send it "quit"
                drv.status = 0
                drv._child = None
            finally:
                self.target.deactivate(drv)
                drv.kernel, drv.extra_args = saved[0], saved[1]
                if saved[2] is None:
                    images.pop(image_key, None)
                else:
                    images[image_key] = saved[2]
            console = console_file.read_text(errors="replace") if console_file.is_file() else ""
            console += stdout + serial.decode(errors="replace")
            check_exit(
                f"labgrid target {self.target.name} ({fw.board}): {fw.elf.name}",
                code, console, timeout,
            )  # fmt: skip
            instructions = _parse_plugin_output(work / "icount.txt") if count_instructions else None
            out = work / "output.bin"
            raw = out.read_bytes() if out.is_file() else b""
        return parse_output(
            raw, fw.board, self.name, code or 0, console, instructions=instructions,
            extra={"labgrid_target": self.target.name},
        )  # fmt: skip


def _read_rest(pipe: Any) -> str:
    """What is left on QEMU's stdout once it has exited, without the QMP JSON lines."""
    if pipe is None:
        return ""
    try:
        text = pipe.read().decode(errors="replace")
    except (OSError, ValueError):
        return ""
    lines = text.splitlines(keepends=True)
    return "".join(line for line in lines if not line.lstrip().startswith('{"'))


# -- pyOCD ---------------------------------------------------------------------------------------

#: Arm semihosting operations the agent below adds to pyOCD's (which leaves exit unimplemented).
SYS_EXIT = 0x18
SYS_EXIT_EXTENDED = 0x20
ADP_STOPPED_APPLICATION_EXIT = 0x20026


class PyOCDBackend:
    """A real Cortex-M board through pyOCD (module docstring). ``target_type`` is pyOCD's
    target name (``pyocd list --targets``), ``probe`` the probe's unique id (None: the only
    one connected), ``uart`` an optional serial device whose output joins the console."""

    name = "pyocd"

    def __init__(
        self,
        target_type: str | None = None,
        probe: str | None = None,
        frequency: int | None = None,
        uart: str | None = None,
        baudrate: int = 115200,
    ) -> None:
        self.target_type = target_type
        self.probe = probe
        self.frequency = frequency
        self.uart = uart
        self.baudrate = baudrate

    def _session(self) -> Any:
        try:
            from pyocd.core.helpers import ConnectHelper
        except ImportError as exc:
            raise ColibriError(
                "the pyocd backend needs pyOCD: pip install 'colibri-moe[hil]' (or pyocd)"
            ) from exc
        options: dict[str, Any] = {}
        if self.frequency:
            options["frequency"] = self.frequency
        kwargs: dict[str, Any] = {"options": options, "blocking": False}
        if self.target_type:
            kwargs["target_override"] = self.target_type
        session = ConnectHelper.session_with_chosen_probe(unique_id=self.probe, **kwargs)
        if session is None:
            raise ColibriError(
                "pyocd: no debug probe found"
                + (f" with unique id {self.probe}" if self.probe else "")
                + " (pyocd list shows the connected probes)"
            )
        return session

    def run(
        self, fw: Firmware, x: np.ndarray, count_instructions: bool = False,
        timeout: float | None = None,
    ) -> HilResult:  # fmt: skip
        from pyocd.core.target import Target
        from pyocd.flash.file_programmer import FileProgrammer

        timeout = timeout or 120.0
        data = input_bytes(x, fw.d_model)
        uart_text = io.StringIO()
        stop = threading.Event()
        with tempfile.TemporaryDirectory(prefix="colibri-hil-pyocd-") as tmp:
            work = Path(tmp)
            (work / "input.bin").write_bytes(data)
            reader = self._uart_reader(uart_text, stop)
            session = self._session()
            with session:
                target = session.board.target
                FileProgrammer(session).program(str(fw.elf))
                target.reset_and_halt()
                agent = make_semihost_agent(target.get_target_context(), work)
                target.resume()
                deadline = time.monotonic() + timeout
                try:
                    while agent.exit_code is None and time.monotonic() < deadline:
                        if target.get_state() != Target.State.HALTED:
                            time.sleep(0.001)
                            continue
                        if not agent.check_and_handle_semihost_request():
                            pc = target.read_core_register("pc")
                            raise QemuError(
                                f"pyocd: {fw.board} halted outside a semihosting call at "
                                f"pc={pc:#x} (a breakpoint or a lockup)\n" + agent.console_text()
                            )
                        if agent.exit_code is None:
                            target.resume()
                finally:
                    agent.cleanup()
                    if agent.exit_code is None:
                        target.halt()
            stop.set()
            if reader is not None:
                reader.join(2)
            console = agent.console_text() + uart_text.getvalue()
            check_exit(f"pyocd ({fw.board}): {fw.elf.name}", agent.exit_code, console, timeout)
            out = work / "output.bin"
            raw = out.read_bytes() if out.is_file() else b""
        extra: dict[str, object] = {"probe": self.probe or "(only probe)"}
        return parse_output(raw, fw.board, self.name, agent.exit_code or 0, console, extra=extra)

    def _uart_reader(self, sink: io.StringIO, stop: threading.Event) -> threading.Thread | None:
        if not self.uart:
            return None
        import serial  # pyserial (labgrid's pyserial-labgrid provides it too)

        port = serial.Serial(self.uart, self.baudrate, timeout=0.1)

        def pump() -> None:
            with port:
                while not stop.is_set():
                    sink.write(port.read(256).decode(errors="replace"))

        thread = threading.Thread(target=pump, daemon=True)
        thread.start()
        return thread


def make_semihost_agent(context: Any, work: Path) -> Any:
    """pyOCD's SemihostAgent with files relative to ``work``, the console captured and
    SYS_EXIT / SYS_EXIT_EXTENDED recorded in ``agent.exit_code`` (pyOCD leaves them
    unimplemented)."""
    from pyocd.debug import semihost

    class FileIO(semihost.InternalSemihostIOHandler):
        def _std_open(self, fnptr: int, fnlen: int, mode: str) -> Any:
            special, name = super()._std_open(fnptr, fnlen, mode)
            if special is None and name and not os.path.isabs(name):
                name = str(work / name)
            return special, name

    class Agent(semihost.SemihostAgent):
        exit_code: int | None = None

        def console_text(self) -> str:
            return str(self._console_buf.getvalue().decode(errors="replace"))

        def handle_sys_exit(self, args: int) -> int:
            # 32-bit Arm: r1 is the reason itself; only ApplicationExit means success
            self.exit_code = 0 if args == ADP_STOPPED_APPLICATION_EXIT else 1
            return 0

        def handle_sys_exit_extended(self, args: int) -> int:
            reason, code = self.context.read_memory_block32(args, 2)
            self.exit_code = (
                int(np.int32(np.uint32(code))) if reason == ADP_STOPPED_APPLICATION_EXIT else 1
            )
            return 0

        _REQUEST_MAP = {
            **semihost.SemihostAgent._REQUEST_MAP,
            SYS_EXIT: handle_sys_exit,
            SYS_EXIT_EXTENDED: handle_sys_exit_extended,
        }

    buf = io.BytesIO()
    agent = Agent(
        context, io_handler=FileIO(), console=semihost.ConsoleIOHandler(io.BytesIO(), buf)
    )
    agent._console_buf = buf
    return agent
