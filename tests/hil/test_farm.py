"""The board farm over labgrid's coordinator (issue 39, item 2): a coordinator and two exporters
on 127.0.0.1 (examples/hil_farm/localfarm.py, free ports chosen at run time), each exporting a
QEMU board behind a network serial port; the colibri plugin's farm backend runs the user's HIL
matrix across both places, holding each place's lock while it runs. Two runs at once share the
farm without a collision; a killed farm machine fails its tests with a clear message, not a hang.
Every subprocess is bounded by a timeout and the farm is torn down by its fixture."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import require_board
from hil_util import ROOT, junit_properties, require_module, user_suite

sys.path.insert(0, str(ROOT / "examples" / "hil_farm"))

MATRIX = "cortex-m3,cortex-m4,cortex-m7,cortex-m55"


@pytest.fixture(scope="module")
def farm() -> Iterator[object]:
    require_module("labgrid")
    for board in MATRIX.split(","):
        require_board(board)
    from localfarm import LocalFarm

    with LocalFarm(timeout=30) as f:
        yield f


def _farm_args(farm: object, places: str | None = None, acquire: float = 60) -> list[str]:
    return [
        "--colibri-backend", "farm",
        "--colibri-farm-coordinator", farm.coordinator,  # type: ignore[attr-defined]
        "--colibri-farm-places", places or ",".join(farm.places),  # type: ignore[attr-defined]
        "--colibri-farm-acquire-timeout", str(acquire),
        "-k", "test_model_on_board",
    ]  # fmt: skip


def _stats(farm: object) -> dict[str, dict[str, int]]:
    from colibri.hil.farm import board_stats

    ports = farm.board_ports  # type: ignore[attr-defined]
    return {m: board_stats("127.0.0.1", p) for m, p in ports.items()}


def _acquired(farm: object) -> str:
    return str(farm.client("places", "-a", check=False).stdout)  # type: ignore[attr-defined]


def test_matrix_runs_across_both_places(farm: object, tmp_path: Path) -> None:
    before = _stats(farm)
    proc = user_suite(tmp_path, *_farm_args(farm), boards=MATRIX)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "4 passed" in proc.stdout
    cases = junit_properties(tmp_path / "junit.xml")
    assert len(cases) == 4
    for name, props in cases.items():
        assert props["backend"] == "farm" and props["board"] in name, props
        assert int(props["instructions"]) > 1000 and props["returncode"] == "0", props
    assert {p["place"] for p in cases.values()} == {"farm-a", "farm-b"}
    after = _stats(farm)
    assert sum(after[m]["runs"] - before[m]["runs"] for m in after) == 4
    assert all(s["collisions"] == 0 for s in after.values()), after
    # every place released after the run
    assert "acquired: " not in farm.client("-p", "farm-a", "show").stdout.replace(  # type: ignore[attr-defined]
        "acquired: None", ""
    )


def test_two_runs_share_the_farm_without_collisions(farm: object, tmp_path: Path) -> None:
    before = _stats(farm)
    runs = []
    for i in range(2):
        (tmp_path / f"run{i}").mkdir()
        runs.append(
            user_suite(
                tmp_path / f"run{i}",
                *_farm_args(farm, acquire=90),
                boards="cortex-m3,cortex-m4",
                wait=False,
            )  # fmt: skip
        )
    outputs = []
    try:
        for proc in runs:
            out, _ = proc.communicate(timeout=110)  # type: ignore[union-attr]
            outputs.append(out)
    finally:
        for proc in runs:
            if proc.poll() is None:  # type: ignore[union-attr]
                proc.kill()  # type: ignore[union-attr]
                proc.wait()  # type: ignore[union-attr]
    for proc, out in zip(runs, outputs):
        assert proc.returncode == 0, out[-4000:]  # type: ignore[union-attr]
        assert "2 passed" in out
    after = _stats(farm)
    assert sum(after[m]["runs"] - before[m]["runs"] for m in after) == 4
    # a collision (a board asked to run while another client had it) would be counted here
    assert all(after[m]["collisions"] == before[m]["collisions"] for m in after), after


CLIENT = """
import sys
from pathlib import Path

import numpy as np
from colibri.hil.core import load_firmware
from colibri.hil.farm import FarmBackend

coordinator, model, work = sys.argv[1:4]
fw = load_firmware(model, "cortex-m3", Path(work))
backend = FarmBackend(coordinator, ["farm-b"], acquire_timeout=30, io_timeout=10)
try:
    backend.run(fw, np.zeros((20000, 16), np.float32), count_instructions=False, timeout=100)
except Exception as exc:
    print("ERROR", type(exc).__name__, exc)
    sys.exit(3)
print("no error")
"""


def test_killed_farm_machine_fails_its_tests_clearly(farm: object, tmp_path: Path) -> None:
    """Runs last in this module. Machine b dies in the middle of a run on its place: the run
    fails at once naming the place (not at its 100 s timeout), and releases the place. Then a
    run bound to the dead machine's place fails within seconds, naming the place and why."""
    from conftest import run_cli

    run_cli("make-toy", "--out", str(tmp_path / "toy"), "--hidden", "16", "--ff", "32")
    (tmp_path / "client.py").write_text(CLIENT)
    client = subprocess.Popen(
        [sys.executable, str(tmp_path / "client.py"), farm.coordinator,  # type: ignore[attr-defined]
         str(tmp_path / "toy"), str(tmp_path / "gen")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    runs = _stats(farm)["b"]["runs"]
    try:
        deadline = time.monotonic() + 60
        while _stats(farm)["b"]["runs"] == runs:  # until board b has started the firmware
            assert client.poll() is None and time.monotonic() < deadline, client.stdout.read()  # type: ignore[union-attr]
            time.sleep(0.05)
        farm.kill_machine("b")  # type: ignore[attr-defined]
        start = time.monotonic()
        out, _ = client.communicate(timeout=60)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    assert client.returncode == 3, out
    assert "ERROR FarmError farm place farm-b" in out, out
    assert "connection to the board broke" in out or "closed the connection" in out, out
    assert time.monotonic() - start < 20
    assert "acquired: None" in farm.client("-p", "farm-b", "show").stdout  # type: ignore[attr-defined]

    start = time.monotonic()
    proc = user_suite(tmp_path, *_farm_args(farm, places="farm-b", acquire=20), boards="cortex-m3")
    elapsed = time.monotonic() - start
    assert proc.returncode == 1, proc.stdout[-4000:]
    assert "1 failed" in proc.stdout
    assert "FarmError" in proc.stdout and "farm-b" in proc.stdout
    assert "offline" in proc.stdout or "no free farm place" in proc.stdout, proc.stdout[-3000:]
    assert elapsed < 60, elapsed
    # the other machine still serves: the farm carries on without b
    ok = user_suite(tmp_path / "after", *_farm_args(farm), boards="cortex-m3")
    assert ok.returncode == 0, ok.stdout[-4000:]
    assert junit_properties(tmp_path / "after" / "junit.xml").popitem()[1]["place"] == "farm-a"
