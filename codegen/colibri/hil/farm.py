"""A board farm over labgrid's coordinator: places, each a QEMU board on an exporter's machine.

On each farm machine, ``python -m colibri.hil.farm board --port P`` is the board: it listens on
a TCP port (the network serial port that the machine's ``labgrid-exporter`` exports as a
``NetworkSerialPort``), takes a firmware image and its input file over the connection (a
serial loader protocol, below), runs it under QEMU there and answers with the exit status,
the console and the output file. A client (:class:`FarmBackend`, the pytest plugin's ``farm``
backend) acquires a free place through the coordinator (``labgrid-client acquire``: the
coordinator's lock, so two test runs never share a board), resolves the place's
``NetworkSerialPort`` through labgrid's ``RemotePlace``, talks to the board through labgrid's
``SerialDriver`` and releases the place. A place whose exporter is gone cannot be acquired
(labgrid: "Match ... has no matching remote resource"); a board that stops answering times out.

Protocol (one request at a time per board; a second connection while one runs gets BUSY)::

    client: COLIBRI-LOAD board=<name> elf=<bytes> input=<bytes> count=<0|1> timeout=<s>\\n
            <elf bytes><input.bin bytes>
    board:  COLIBRI-RESULT code=<int> console=<bytes> output=<bytes> instructions=<int|->\\n
            <console bytes><output.bin bytes>
        or  COLIBRI-ERROR message=<bytes>\\n<message>      (QEMU fault, timeout, bad request)
        or  COLIBRI-BUSY\\n                                (another client is using the board)

    client: COLIBRI-STATS\\n   board: COLIBRI-STATS runs=<n> collisions=<n>\\n  (board_stats)
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ColibriError
from .core import Firmware, HilResult, input_bytes, parse_output

MAX_IMAGE = 64 * 1024 * 1024
#: Where this process's next place search starts, per coordinator (runs spread over the farm).
_ROTATION: dict[str, int] = {}


class FarmError(ColibriError):
    """A farm failure: no place, a board gone, a protocol error."""


def _fields(line: str, verb: str) -> dict[str, str]:
    parts = line.strip().split()
    if not parts or parts[0] != verb:
        raise FarmError(f"expected {verb}, got {line.strip()[:80]!r}")
    return dict(p.split("=", 1) for p in parts[1:] if "=" in p)


# -- the board (farm machine side) ---------------------------------------------------------------


class _BoardHandler(socketserver.StreamRequestHandler):
    server: _BoardServer

    def handle(self) -> None:
        line = self.rfile.readline(4096)
        if line.startswith(b"COLIBRI-STATS"):
            s = self.server
            self.wfile.write(f"COLIBRI-STATS runs={s.runs} collisions={s.collisions}\n".encode())
            return
        if not self.server.busy.acquire(blocking=False):
            self.wfile.write(b"COLIBRI-BUSY\n")
            self.server.collisions += 1
            return
        try:
            while line:
                if line.strip():
                    self._serve(line.decode(errors="replace"))
                line = self.rfile.readline(4096)
        except (ConnectionError, OSError):
            return
        finally:
            self.server.busy.release()

    def _error(self, message: str) -> None:
        data = message.encode()
        self.wfile.write(f"COLIBRI-ERROR message={len(data)}\n".encode() + data)
        self.wfile.flush()

    def _serve(self, line: str) -> None:
        from ..boards import load_board
        from ..targets.qemu import run_elf

        try:
            f = _fields(line, "COLIBRI-LOAD")
            board = load_board(f["board"])
            n_elf, n_in = int(f["elf"]), int(f["input"])
            if not (0 < n_elf <= MAX_IMAGE and 0 <= n_in <= MAX_IMAGE):
                raise FarmError(f"bad sizes elf={n_elf} input={n_in}")
        except (ColibriError, KeyError, ValueError) as exc:
            self._error(f"board {self.server.name}: bad request: {exc}")
            return
        elf, data = self.rfile.read(n_elf), self.rfile.read(n_in)
        if len(elf) != n_elf or len(data) != n_in:
            return  # the client went away mid-request
        self.server.runs += 1
        with tempfile.TemporaryDirectory(prefix="colibri-farm-board-") as tmp:
            work = Path(tmp)
            (work / "firmware.elf").write_bytes(elf)
            (work / "input.bin").write_bytes(data)
            try:
                res = run_elf(
                    board, work / "firmware.elf", work, float(f.get("timeout", "120")),
                    count_instructions=f.get("count") == "1",
                )  # fmt: skip
            except ColibriError as exc:
                self._error(f"board {self.server.name} ({board.name}): {exc}")
                return
            out = (work / "output.bin").read_bytes() if (work / "output.bin").is_file() else b""
        console = (res.stdout + res.stderr).encode()
        count = "-" if res.instructions is None else str(res.instructions)
        head = (
            f"COLIBRI-RESULT code={res.returncode} console={len(console)} output={len(out)} "
            f"instructions={count}\n"
        )
        self.wfile.write(head.encode() + console + out)
        self.wfile.flush()


class _BoardServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], name: str) -> None:
        super().__init__(address, _BoardHandler)
        self.name = name
        self.busy = threading.Lock()
        self.runs = 0
        self.collisions = 0


def serve_board(host: str, port: int, name: str, ready_file: Path | None = None) -> None:
    """Serve one QEMU board on host:port until killed (``colibri.hil.farm board``)."""
    with _BoardServer((host, port), name) as server:
        bound = server.server_address[1]
        print(f"colibri farm board {name}: listening on {host}:{bound}", flush=True)
        if ready_file is not None:
            ready_file.write_text(str(bound))
        server.serve_forever()


# -- the client ----------------------------------------------------------------------------------


def _labgrid_client() -> list[str]:
    exe = Path(sys.executable).with_name("labgrid-client")
    if exe.is_file():
        return [str(exe)]
    found = shutil.which("labgrid-client")
    if found is None:
        raise FarmError("the farm backend needs labgrid: pip install 'colibri-moe[hil]'")
    return [found]


class FarmBackend:
    """Runs firmware on the first free place of ``places`` of the labgrid coordinator at
    ``coordinator`` (HOST:PORT), waiting up to ``acquire_timeout`` seconds for one."""

    name = "farm"

    def __init__(
        self, coordinator: str, places: list[str], acquire_timeout: float = 60.0,
        io_timeout: float = 60.0,
    ) -> None:  # fmt: skip
        if not places:
            raise FarmError("the farm backend needs at least one place (--colibri-farm-places)")
        self.coordinator = coordinator
        self.places = list(places)
        self.acquire_timeout = acquire_timeout
        self.io_timeout = io_timeout

    def _client(self, place: str, *args: str, timeout: float = 30.0) -> tuple[int, str]:
        cmd = [*_labgrid_client(), "-x", self.coordinator, "-p", place, *args]
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
            )
        except subprocess.TimeoutExpired:
            return 124, f"labgrid-client {' '.join(args)} timed out after {timeout:g} s"
        return proc.returncode, (proc.stdout + proc.stderr).strip()

    def acquire(self) -> str:
        """Acquire the first free, online place; FarmError (naming why each place could not be
        had) when none is free within acquire_timeout or every place is offline."""
        deadline = time.monotonic() + self.acquire_timeout
        why: dict[str, str] = {}
        while True:
            # start at the next place each time: consecutive runs spread over the farm
            start = _ROTATION.get(self.coordinator, 0) % len(self.places)
            _ROTATION[self.coordinator] = start + 1
            for place in self.places[start:] + self.places[:start]:
                code, text = self._client(place, "acquire")
                if code == 0:
                    return place
                why[place] = text.splitlines()[-1] if text else f"exit {code}"
            offline = [p for p, w in why.items() if "no matching remote resource" in w]
            if len(offline) == len(self.places):
                raise FarmError(
                    "every farm place is offline (its exporter is gone or its board is not "
                    "exported): " + "; ".join(f"{p}: {why[p]}" for p in self.places)
                )
            if time.monotonic() > deadline:
                raise FarmError(
                    f"no free farm place within {self.acquire_timeout:g} s: "
                    + "; ".join(f"{p}: {why[p]}" for p in self.places)
                )
            time.sleep(0.2)

    def release(self, place: str) -> None:
        self._client(place, "release")

    def _sync(self) -> None:
        """Let this process's labgrid session (RemotePlace's) see the acquire that
        labgrid-client just made: a sync round trip with the coordinator."""
        import asyncio

        from labgrid.resource.remote import RemotePlaceManager

        manager = RemotePlaceManager.get()
        session = getattr(manager, "session", None)
        if session is None:
            return  # the first RemotePlace starts the session, which reads the current state
        try:
            session.loop.run_until_complete(
                asyncio.wait_for(session.sync_with_coordinator(), self.io_timeout)
            )
        except (asyncio.TimeoutError, OSError) as exc:
            raise FarmError(
                f"labgrid coordinator {self.coordinator} did not answer in time: {exc}"
            ) from exc

    def _target(self, place: str) -> Any:
        from labgrid import Environment

        self._sync()

        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
            fh.write(
                "targets:\n  main:\n    resources:\n      RemotePlace:\n"
                f"        name: {place}\n    drivers:\n      SerialDriver:\n"
                f"        timeout: {float(self.io_timeout)!r}\n"
                f"options:\n  coordinator_address: '{self.coordinator}'\n"
            )
        try:
            env = Environment(fh.name)
            return env.get_target("main")
        finally:
            os.unlink(fh.name)

    def run(
        self, fw: Firmware, x: np.ndarray, count_instructions: bool = False,
        timeout: float | None = None,
    ) -> HilResult:  # fmt: skip
        timeout = timeout or 120.0
        data = input_bytes(x, fw.d_model)
        elf = fw.elf.read_bytes()
        place = self.acquire()
        try:
            target = self._target(place)
            from labgrid.resource import NetworkSerialPort

            port = target.get_resource(NetworkSerialPort)
            if not port.avail:
                raise FarmError(
                    f"farm place {place}: its serial port {port.host}:{port.port} is not "
                    f"available (exporter gone?)"
                )
            serial = target.get_driver("SerialDriver", activate=False)
            try:
                target.activate(serial)
            except Exception as exc:
                raise FarmError(
                    f"farm place {place}: cannot open the board's serial port "
                    f"{port.host}:{port.port}: {exc}"
                ) from exc
            try:
                link = _Link(serial, f"farm place {place} ({port.host}:{port.port})")
                head = (
                    f"COLIBRI-LOAD board={fw.board} elf={len(elf)} input={len(data)} "
                    f"count={int(count_instructions)} timeout={timeout:g}\n"
                )
                serial.write(head.encode() + elf + data)
                reply = link.line(time.monotonic() + timeout + self.io_timeout)
                if reply.startswith("COLIBRI-BUSY"):
                    raise FarmError(
                        f"farm place {place}: the board is busy with another client although "
                        f"this run holds the place's lock (a collision)"
                    )
                deadline = time.monotonic() + self.io_timeout
                if reply.startswith("COLIBRI-ERROR"):
                    n = int(_fields(reply, "COLIBRI-ERROR")["message"])
                    raise FarmError(link.exact(n, deadline).decode(errors="replace"))
                f = _fields(reply, "COLIBRI-RESULT")
                console = link.exact(int(f["console"]), deadline).decode(errors="replace")
                raw = link.exact(int(f["output"]), deadline)
            finally:
                target.deactivate(serial)
        finally:
            self.release(place)
        count = None if f["instructions"] == "-" else int(f["instructions"])
        return parse_output(
            raw, fw.board, self.name, int(f["code"]), console, instructions=count, place=place
        )


class _Link:
    """Reads from labgrid's SerialDriver with deadlines and a clear message when the board
    stops answering or the connection drops."""

    def __init__(self, serial: Any, what: str) -> None:
        self.serial = serial
        self.what = what
        self.buf = b""

    def _more(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise FarmError(
                f"{self.what}: no answer from the board in time (board or exporter gone?)"
            )
        try:
            chunk = self.serial.read(size=1, timeout=min(left, 1.0), max_size=1 << 20)
        except Exception as exc:  # pexpect TIMEOUT is a normal "nothing yet"
            if type(exc).__name__ == "TIMEOUT":
                return
            raise FarmError(f"{self.what}: the connection to the board broke: {exc}") from exc
        if not chunk:
            raise FarmError(
                f"{self.what}: the board closed the connection (board or exporter gone?)"
            )
        self.buf += chunk

    def line(self, deadline: float) -> str:
        while b"\n" not in self.buf:
            self._more(deadline)
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode(errors="replace")

    def exact(self, n: int, deadline: float) -> bytes:
        while len(self.buf) < n:
            self._more(deadline)
        data, self.buf = self.buf[:n], self.buf[n:]
        return data


def board_stats(host: str, port: int, timeout: float = 10.0) -> dict[str, int]:
    """A farm board's counters: runs served and collisions (a client refused as BUSY)."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(b"COLIBRI-STATS\n")
        reply = sock.makefile("rb").readline().decode()
    return {k: int(v) for k, v in _fields(reply, "COLIBRI-STATS").items()}


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on host right now (bind to 0, read it back, close)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m colibri.hil.farm")
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("board", help="serve a QEMU board on a TCP port (a farm machine's board)")
    b.add_argument("--host", default="127.0.0.1")
    b.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    b.add_argument("--name", default="qemu-board")
    b.add_argument("--ready-file", type=Path, help="write the bound port here once listening")
    a = parser.parse_args(argv)
    serve_board(a.host, a.port, a.name, a.ready_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
