"""The colibri pytest plugin (issue 39, item 1): a user's own test file (examples/hil) run with
the qemu and labgrid backends gives the same outputs, routing and instruction counts, recorded
as JUnit XML properties; the pyOCD backend against a fake pyOCD (no board here); the farm's
serial link times out instead of hanging; the plugin is registered as a pytest11 entry point."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import require_board
from hil_util import ROOT, junit_properties, require_module, user_suite

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def test_entry_point_and_extras_declared() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["entry-points"]["pytest11"] == {"colibri": "colibri.hil.plugin"}
    extras = meta["optional-dependencies"]
    assert any(d.startswith("labgrid") for d in extras["hil"])
    assert any(d.startswith("pyocd") for d in extras["hil"])
    assert any(d.startswith("labgrid") for d in extras["test"])  # the labgrid/farm tests


def test_qemu_and_labgrid_backends_agree(tmp_path: Path) -> None:
    """Same user test file, two backends: the built-in QEMU runner and labgrid's QEMUDriver
    (examples/hil/env.yaml); both pass, with identical instruction counts."""
    require_module("labgrid")
    for board in ("cortex-m3", "cortex-m55"):
        require_board(board)
    boards = "cortex-m3,cortex-m55"
    qemu = user_suite(tmp_path / "qemu", boards=boards)
    assert qemu.returncode == 0, qemu.stdout[-4000:]
    env_yaml = str(ROOT / "examples" / "hil" / "env.yaml")
    lg = user_suite(
        tmp_path / "lg", "--colibri-backend", "labgrid", "--lg-env", env_yaml, boards=boards
    )
    assert lg.returncode == 0, lg.stdout[-4000:]
    assert "3 passed" in qemu.stdout and "3 passed" in lg.stdout
    a = junit_properties(tmp_path / "qemu" / "junit.xml")
    b = junit_properties(tmp_path / "lg" / "junit.xml")
    assert set(a) == set(b) and len(a) == 3
    for name in a:
        assert a[name]["backend"] == "qemu" and b[name]["backend"] == "labgrid"
        assert a[name]["board"] == b[name]["board"]
        assert int(a[name]["instructions"]) > 1000
        assert a[name]["instructions"] == b[name]["instructions"], name
        assert a[name]["stack_high_water"] == b[name]["stack_high_water"], name
        assert b[name]["labgrid_target"] == b[name]["board"]


def test_labgrid_backend_refuses_a_target_of_another_machine(tmp_path: Path) -> None:
    require_module("labgrid")
    require_board("cortex-m4")
    env = tmp_path / "env.yaml"
    env.write_text(
        (ROOT / "examples" / "hil" / "env.yaml").read_text().replace("  cortex-m4:", "  other:")
        .replace("  cortex-m3:", "  main:")
    )  # fmt: skip
    proc = user_suite(
        tmp_path / "run", "--colibri-backend", "labgrid", "--lg-env", str(env),
        "-k", "test_model_on_board", boards="cortex-m4",
    )  # fmt: skip
    assert proc.returncode == 1
    assert "emulates machine 'mps2-an385', but board cortex-m4 is 'mps2-an386'" in proc.stdout


def _firmware(tmp_path: Path, board: str = "cortex-m4") -> object:
    from colibri.frontends.seed import make_toy, write_seed
    from colibri.hil.core import load_firmware

    require_board(board, run=False)
    write_seed(make_toy(experts=2, hidden=8, ff=16, top_k=1), tmp_path / "toy")
    return load_firmware(tmp_path / "toy", board, tmp_path / "gen", max_tokens=8)


def test_pyocd_backend_with_a_fake_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Flash, reset, resume and serve semihosting until SYS_EXIT_EXTENDED: the input file is
    read, the output file written (relative to a work directory), the console captured."""
    import fake_pyocd
    from colibri.hil.backends import PyOCDBackend

    fw = _firmware(tmp_path)
    board = fake_pyocd.FakeBoard()
    fake_pyocd.install(monkeypatch, board)
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    cwd = Path.cwd()
    res = PyOCDBackend(target_type="stm32f429zi", probe="0669FF").run(fw, x, timeout=10)  # type: ignore[arg-type]
    assert Path.cwd() == cwd
    assert board.programmed == [str(fw.elf)]  # type: ignore[attr-defined]
    assert board.events[:3] == ["open", "reset_and_halt", "resume"] and board.events[-1] == "close"
    np.testing.assert_array_equal(res.output, 2 * x)
    assert res.expert_ids.tolist() == [[0]] * 3 and res.returncode == 0
    assert "3 tokens done" in res.console and res.stack_high_water == 640
    assert res.properties()["backend"] == "pyocd" and res.properties()["probe"] == "0669FF"


def test_pyocd_backend_reports_exit_status_fault_and_no_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fake_pyocd
    from colibri.errors import ColibriError, QemuError
    from colibri.hil.backends import PyOCDBackend

    fw = _firmware(tmp_path)
    x = np.zeros((2, 8), np.float32)
    fake_pyocd.install(monkeypatch, fake_pyocd.FakeBoard(exit_code=3))
    with pytest.raises(QemuError, match="exit code 3, expected 0"):
        PyOCDBackend().run(fw, x, timeout=10)  # type: ignore[arg-type]
    fake_pyocd.install(monkeypatch, fake_pyocd.FakeBoard(fault=True))
    with pytest.raises(QemuError, match="guest HardFault"):
        PyOCDBackend().run(fw, x, timeout=10)  # type: ignore[arg-type]
    fake_pyocd.install(monkeypatch, None)
    with pytest.raises(ColibriError, match="no debug probe found with unique id 42"):
        PyOCDBackend(probe="42").run(fw, x, timeout=10)  # type: ignore[arg-type]


def test_farm_link_times_out_with_a_clear_message() -> None:
    """A board that stops answering (its machine died mid-run) fails the run at the deadline."""
    from colibri.hil.farm import FarmError, _Link

    class Silent:
        def read(self, size: int = 1, timeout: float = 0.0, max_size: int = 0) -> bytes:
            time.sleep(min(timeout, 0.05))
            raise type("TIMEOUT", (Exception,), {})("nothing")

    link = _Link(Silent(), "farm place farm-b (127.0.0.1:1)")
    start = time.monotonic()
    with pytest.raises(FarmError, match=r"farm-b .*no answer from the board in time"):
        link.line(time.monotonic() + 0.5)
    assert time.monotonic() - start < 3

    class Closed:
        def read(self, size: int = 1, timeout: float = 0.0, max_size: int = 0) -> bytes:
            return b""

    with pytest.raises(FarmError, match="closed the connection"):
        _Link(Closed(), "farm place farm-a").exact(4, time.monotonic() + 5)


def test_labgrid_backend_times_out_then_runs_again(tmp_path: Path) -> None:
    """In process: a run past its timeout raises (QEMU killed, the driver deactivated and its
    kernel / extra_args restored); the same target then runs the firmware, with the built-in
    runner's outputs and instruction count."""
    require_module("labgrid")
    require_board("cortex-m3")
    from colibri.errors import QemuError
    from colibri.hil.backends import LabgridQemuBackend, QemuBackend
    from labgrid import Environment

    target = Environment(str(ROOT / "examples" / "hil" / "env.yaml")).get_target("cortex-m3")
    drv = target.get_driver("QEMUDriver", activate=False)
    before = (drv.kernel, drv.extra_args)
    fw = _firmware(tmp_path, "cortex-m3")
    x = np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32)
    backend = LabgridQemuBackend(target)
    many = np.zeros((20000, 8), np.float32)  # seconds of guest time
    with pytest.raises(QemuError, match="timed out after 0.3 s"):
        backend.run(fw, many, timeout=0.3)  # type: ignore[arg-type]
    assert (drv.kernel, drv.extra_args) == before and drv._child is None
    got = backend.run(fw, x, count_instructions=True, timeout=30)  # type: ignore[arg-type]
    ref = QemuBackend().run(fw, x, count_instructions=True)  # type: ignore[arg-type]
    np.testing.assert_array_equal(got.output, ref.output)
    np.testing.assert_array_equal(got.expert_ids, ref.expert_ids)
    assert got.instructions == ref.instructions and got.instructions is not None
    assert "4 tokens done" in got.console
