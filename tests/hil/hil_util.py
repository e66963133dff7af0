"""Helpers of the HIL plugin tests: run a user's test suite (examples/hil) in a subprocess with
the colibri pytest plugin, and read its JUnit XML."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from importlib.metadata import entry_points
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "hil" / "test_firmware.py"
IN_CI = os.environ.get("CI", "").lower() == "true"


def require_module(name: str, extra: str = "test") -> None:
    """Skip (locally) or fail (CI, where `pip install -e .[test]` installs it) without `name`."""
    try:
        __import__(name)
    except ImportError:
        message = f"{name} is not installed (pip install -e '.[{extra}]')"
        if IN_CI:
            pytest.fail(f"CI=true and {message}")
        pytest.skip(message)


def plugin_args() -> list[str]:
    """`-p colibri.hil.plugin` unless the installed package already registers it (pytest11)."""
    names = {e.name for e in entry_points(group="pytest11")}
    return [] if "colibri" in names else ["-p", "colibri.hil.plugin"]


def user_suite(
    tmp: Path, *args: str, boards: str = "cortex-m3", timeout: float = 110.0,
    env: dict[str, str] | None = None, wait: bool = True,
) -> subprocess.CompletedProcess[str] | subprocess.Popen[str]:  # fmt: skip
    """pytest on examples/hil/test_firmware.py (its own pytest.ini) with the plugin, JUnit XML
    in tmp/junit.xml; wait=False returns the running process."""
    tmp.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pytest", *plugin_args(), "-p", "no:cacheprovider", "-q",
        f"--basetemp={tmp / 'basetemp'}", f"--junitxml={tmp / 'junit.xml'}", str(EXAMPLE), *args,
    ]  # fmt: skip
    full_env = {**os.environ, "COLIBRI_BOARDS": boards, **(env or {})}
    full_env.pop("PYTEST_XDIST_WORKER", None)
    full_env.pop("PYTEST_ADDOPTS", None)
    if not wait:
        return subprocess.Popen(
            cmd, cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True,
        )  # fmt: skip
    return subprocess.run(
        cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout
    )


def junit_properties(path: Path) -> dict[str, dict[str, str]]:
    """{testcase name: {property: value}} of a JUnit XML file (xunit1)."""
    cases: dict[str, dict[str, str]] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        props = {p.get("name", ""): p.get("value", "") for p in case.iter("property")}
        cases[case.get("name", "")] = props
    return cases
