"""A labgrid board farm on this machine: a coordinator and two farm "machines" (an exporter and
its QEMU board each) on 127.0.0.1, with free ports chosen at start-up, and the places farm-a and
farm-b matched to their boards. What tests/hil/test_farm.py runs the HIL matrix on; run it by hand
to try the farm (README.md):

    python examples/hil_farm/localfarm.py      # prints the coordinator address; Ctrl-C stops it

Every process runs in its own process group and is killed (SIGTERM, then SIGKILL) on stop(); the
coordinator keeps its state (places.yaml) in a temporary directory removed with it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
HOST = "127.0.0.1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _tool(name: str) -> str:
    exe = Path(sys.executable).with_name(name)
    found = str(exe) if exe.is_file() else shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} not found: pip install 'colibri-moe[hil]' (labgrid)")
    return found


def _wait_port(port: int, timeout: float, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode} while starting")
        try:
            with socket.create_connection((HOST, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on {HOST}:{port} within {timeout:g} s")


def _descendants(pid: int) -> list[int]:
    """Process ids of pid's children, grandchildren, ... (Linux /proc)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


class LocalFarm:
    """Coordinator + exporters + boards on 127.0.0.1 (a context manager)."""

    MACHINES = ("a", "b")

    def __init__(self, timeout: float = 30.0) -> None:
        self.timeout = timeout
        self.tmp = Path(tempfile.mkdtemp(prefix="colibri-farm-"))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.coordinator = ""
        self.board_ports: dict[str, int] = {}

    @property
    def places(self) -> list[str]:
        return [f"farm-{m}" for m in self.MACHINES]

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> None:
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        self.procs[name] = subprocess.Popen(
            cmd, cwd=self.tmp, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        log.close()

    def client(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """labgrid-client -x COORDINATOR ARGS (bounded by the farm's timeout)."""
        proc = subprocess.run(
            [_tool("labgrid-client"), "-x", self.coordinator, *args],
            capture_output=True, text=True, timeout=self.timeout, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        if check and proc.returncode != 0:
            raise RuntimeError(f"labgrid-client {' '.join(args)}: {proc.stdout}{proc.stderr}")
        return proc

    def log(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace") if path.is_file() else ""

    def start(self) -> LocalFarm:
        port = _free_port()
        self.coordinator = f"{HOST}:{port}"
        self._spawn("coordinator", [_tool("labgrid-coordinator"), "-l", self.coordinator])
        _wait_port(port, self.timeout, self.procs["coordinator"], "labgrid-coordinator")
        for m in self.MACHINES:
            self.start_machine(m)
        for m in self.MACHINES:
            place = f"farm-{m}"
            self.client("-p", place, "create")
            self.client("-p", place, "add-match", f"exporter-{m}/qemu-arm-{m}/NetworkSerialPort")
            self.client("-p", place, "set-tags", "arch=arm", f"machine={m}")
        return self

    def start_machine(self, m: str) -> None:
        """Farm machine m: its board (QEMU behind a TCP serial port) and its exporter, waiting
        until the coordinator lists the board's serial port as available."""
        bport = _free_port()
        self.board_ports[m] = bport
        self._spawn(
            f"board-{m}",
            [sys.executable, "-m", "colibri.hil.farm", "board", "--host", HOST,
             "--port", str(bport), "--name", f"board-{m}"],
        )  # fmt: skip
        _wait_port(bport, self.timeout, self.procs[f"board-{m}"], f"board {m}")
        self._spawn(
            f"exporter-{m}",
            [_tool("labgrid-exporter"), "-c", self.coordinator, "-n", f"exporter-{m}",
             "--hostname", HOST, str(HERE / f"exporter-{m}.yaml")],
            env={"COLIBRI_BOARD_PORT": str(bport)},
        )  # fmt: skip
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            out = self.client("resources", check=False).stdout
            if f"exporter-{m}/qemu-arm-{m}/NetworkSerialPort" in out:
                return
            if self.procs[f"exporter-{m}"].poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(
            f"exporter {m} did not register its board within {self.timeout:g} s:\n"
            + self.log(f"exporter-{m}")[-2000:]
        )

    def kill_machine(self, m: str) -> None:
        """Farm machine m goes down: its exporter, its board and the QEMU the board may be
        running (its own process group) are killed (SIGKILL)."""
        board = self.procs.get(f"board-{m}")
        children = _descendants(board.pid) if board is not None else []
        for name in (f"exporter-{m}", f"board-{m}"):
            self._kill(name, signal.SIGKILL)
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _kill(self, name: str, sig: int = signal.SIGTERM) -> None:
        proc = self.procs.get(name)
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def stop(self) -> None:
        for name in reversed(list(self.procs)):
            self._kill(name)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> LocalFarm:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    with LocalFarm() as farm:
        print(f"coordinator {farm.coordinator}; places {', '.join(farm.places)}")
        print(
            f"run: pytest examples/hil --colibri-backend farm "
            f"--colibri-farm-coordinator {farm.coordinator} "
            f"--colibri-farm-places {','.join(farm.places)}"
        )
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
