"""`pip install .` (not only -e) gives a working CLI: the runtime, templates, boards and the
SConstruct travel inside the wheel, and a model generated and built from the installed copy
runs and matches the reference."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
from conftest import ROOT


def test_wheel_carries_resources_and_works(tmp_path: Path) -> None:
    wheel_dir = tmp_path / "wheel"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheel_dir),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    wheel = next(wheel_dir.glob("*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "colibri/cli/main.py",
        "colibri/emit/model.py",
        "colibri/data/templates/common/experts.j2",
        "colibri/data/SConstruct",
        "colibri/data/boards/host.toml",
        "colibri/data/boards/cortex-m4.toml",
        "colibri/data/templates/layer/colibri_model.c.j2",
        "colibri/data/runtime_c/include/colibri.h",
        "colibri/data/runtime_c/runner/main.c",
    ):
        assert needed in names, needed
    assert not any("/build/" in n or n.endswith((".o", ".a", ".elf")) for n in names)
    # the MIT licence (pyproject.toml's license) travels in the wheel's metadata and data
    licences = [n for n in names if ".dist-info/" in n and n.rsplit("/", 1)[-1] == "LICENSE"]
    assert licences, sorted(n for n in names if ".dist-info/" in n)
    assert "colibri/data/LICENSE" in names
    text = zipfile.ZipFile(wheel).read(licences[0]).decode()
    assert text.startswith("MIT License") and "Copyright (c) 2026 The Colibri authors" in text

    target = tmp_path / "site"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(target),
            str(wheel),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    env = dict(os.environ, PYTHONPATH=str(target))
    env.pop("COLIBRI_RESOURCE_DIR", None)
    work = tmp_path / "elsewhere"
    work.mkdir()

    def cli(*args: str) -> str:
        p = subprocess.run(
            [sys.executable, "-m", "colibri", *args],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
        )
        assert p.returncode == 0, f"{args}: {p.stdout}\n{p.stderr}"
        return p.stdout

    probe = subprocess.run(
        [sys.executable, "-c", "import colibri; print(colibri.__file__)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    assert probe.stdout.startswith(str(target)), probe.stdout + probe.stderr
    cli("make-toy", "--out", "toy")
    cli("generate", "toy/model.bin", "--out", "gen")
    x = np.random.default_rng(3).standard_normal((3, 8)).astype(np.float32)
    np.save(work / "x.npy", x)
    cli("run", "gen", "--input", "x.npy", "--output", "y.npy")
    from colibri.frontends.load import load_model
    from colibri.reference.moe import compare, moe_forward

    ref, _ = moe_forward(load_model(work / "toy" / "model.bin"), x)
    assert compare(np.load(work / "y.npy"), ref) is None
