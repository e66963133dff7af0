"""pytest plugin (entry point ``pytest11: colibri``): the ``colibri_board`` fixture.

A user's test suite loads a firmware on a board and checks what comes back::

    def test_toy(colibri_board):
        res = colibri_board.run("gen/toy", x)        # a `colibri generate` dir, or a model file
        assert res.output.shape == x.shape
        assert res.instructions is not None           # per forward pass, when the backend counts

The board is ``--colibri-board`` (default cortex-m3) or the fixture's indirect parameter
(``@pytest.mark.parametrize("colibri_board", ["cortex-m3", "cortex-m4"], indirect=True)``); the
backend is ``--colibri-backend``:

* ``qemu`` (default): the built-in QEMU runner.
* ``labgrid``: labgrid's ``--lg-env ENV.yaml``; the environment's target named after the board
  (else ``main``) must have a ``QEMUDriver`` for that board's machine.
* ``farm``: places of a labgrid coordinator (``--colibri-farm-coordinator HOST:PORT``,
  ``--colibri-farm-places a,b``), each a QEMU board on a farm machine (colibri.hil.farm).
* ``pyocd``: a real Cortex-M board through a debug probe (``--colibri-pyocd-target``,
  ``--colibri-pyocd-probe``, ``--colibri-pyocd-uart``); needs hardware.

Every run records JUnit XML properties (``--junitxml``): board, backend, tokens, returncode,
instructions, instructions_per_token, stack_high_water and, on the farm, place.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

BACKENDS = ("qemu", "labgrid", "farm", "pyocd")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("colibri", "Colibri hardware in the loop")
    group.addoption(
        "--colibri-backend", choices=BACKENDS, default="qemu",
        help="where colibri_board runs firmware: qemu (built-in runner, default), labgrid "
        "(--lg-env with a QEMUDriver), farm (labgrid coordinator places), pyocd (real board)",
    )  # fmt: skip
    group.addoption(
        "--colibri-board", default="cortex-m3", help="board file name (default cortex-m3)"
    )
    group.addoption("--colibri-timeout", type=float, default=None, help="seconds per run")
    group.addoption("--colibri-no-count", action="store_true", help="do not count instructions")
    group.addoption(
        "--colibri-farm-coordinator", default=None,
        help="labgrid coordinator HOST:PORT (default $LG_COORDINATOR or 127.0.0.1:20408)",
    )  # fmt: skip
    group.addoption(
        "--colibri-farm-places", default=None,
        help="comma-separated labgrid places to run on (default $COLIBRI_FARM_PLACES)",
    )  # fmt: skip
    group.addoption(
        "--colibri-farm-acquire-timeout", type=float, default=60.0,
        help="seconds to wait for a free place (default 60)",
    )  # fmt: skip
    group.addoption(
        "--colibri-pyocd-target", default=None, help="pyOCD target type, e.g. stm32f429zi"
    )
    group.addoption("--colibri-pyocd-probe", default=None, help="debug probe unique id")
    group.addoption("--colibri-pyocd-uart", default=None, help="serial device of the board's UART")


class ColibriBoard:
    """What ``colibri_board`` returns: a board and a backend to run firmware on."""

    def __init__(
        self, name: str, backend: Any, record: Any = None, count: bool = True,
        timeout: float | None = None, work_dir: Path | None = None,
    ) -> None:  # fmt: skip
        self.name = name
        self.backend = backend
        self._record = record
        self._count = count
        self._timeout = timeout
        self._work_dir = work_dir
        self.results: list[Any] = []

    @property
    def backend_name(self) -> str:
        return str(self.backend.name)

    def load(self, firmware: str | os.PathLike[str], max_tokens: int = 32) -> Any:
        """Build (or generate and build, for a model file) the firmware for this board."""
        from .core import load_firmware

        return load_firmware(Path(firmware), self.name, self._work_dir, max_tokens)

    def run(
        self, firmware: Any, x: np.ndarray, count_instructions: bool | None = None,
        timeout: float | None = None,
    ) -> Any:  # fmt: skip
        """Run ``firmware`` (a path, or what :meth:`load` returned) over rows ``x``; returns a
        :class:`colibri.hil.core.HilResult` and records its properties for the JUnit XML."""
        from .core import Firmware

        fw = firmware if isinstance(firmware, Firmware) else self.load(firmware)
        count = self._count if count_instructions is None else count_instructions
        if self.backend_name == "pyocd":
            count = False  # no instruction counter on a real core (use the DWT in firmware)
        res = self.backend.run(fw, x, count, timeout or self._timeout)
        self.results.append(res)
        if self._record is not None:
            for key, value in res.properties().items():
                if key not in ("board", "backend"):  # recorded once by the fixture
                    self._record(key, value)
        return res


def make_backend(config: pytest.Config, request: pytest.FixtureRequest, board: str) -> Any:
    from . import backends

    kind = config.getoption("--colibri-backend")
    if kind == "qemu":
        return backends.QemuBackend()
    if kind == "labgrid":
        env = request.getfixturevalue("env")  # labgrid's plugin: skips without --lg-env
        target = env.get_target(board) or env.get_target("main")
        if target is None:
            pytest.fail(f"labgrid environment has no target named {board!r} or 'main'")
        return backends.LabgridQemuBackend(target)
    if kind == "farm":
        from .farm import FarmBackend

        coordinator = (
            config.getoption("--colibri-farm-coordinator")
            or os.environ.get("LG_COORDINATOR")
            or "127.0.0.1:20408"
        )
        places = config.getoption("--colibri-farm-places") or os.environ.get(
            "COLIBRI_FARM_PLACES", ""
        )
        return FarmBackend(
            coordinator,
            [p for p in places.split(",") if p],
            acquire_timeout=config.getoption("--colibri-farm-acquire-timeout"),
        )
    return backends.PyOCDBackend(
        target_type=config.getoption("--colibri-pyocd-target"),
        probe=config.getoption("--colibri-pyocd-probe"),
        uart=config.getoption("--colibri-pyocd-uart"),
    )


@pytest.fixture
def colibri_board(
    request: pytest.FixtureRequest, record_property: Any, tmp_path_factory: pytest.TempPathFactory
) -> ColibriBoard:
    """A board to run Colibri firmware on (module docstring); ``request.param`` (indirect
    parametrisation) names the board, else ``--colibri-board``."""
    config = request.config
    board = getattr(request, "param", None) or config.getoption("--colibri-board")
    backend = make_backend(config, request, board)
    record_property("board", board)
    record_property("backend", backend.name)
    return ColibriBoard(
        board,
        backend,
        record=record_property,
        count=not config.getoption("--colibri-no-count"),
        timeout=config.getoption("--colibri-timeout"),
        work_dir=tmp_path_factory.getbasetemp() / "colibri-hil",
    )
