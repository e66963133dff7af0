"""Packaging hook: the C runtime, templates, boards and SConstruct travel inside the wheel as
colibri/data/, so `pip install .` (not only `-e`) gives a CLI that can generate and build;
LICENSE goes there too (for `scons install` from an installed package) besides the wheel's
.dist-info, where setuptools puts it by default. All metadata lives in pyproject.toml."""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
DATA = ("SConstruct", "boards", "templates", "runtime_c", "tools", "LICENSE")
IGNORE = shutil.ignore_patterns("build", "__pycache__", "*.o", "*.a", "*.so", "*.elf")


class BuildPyWithData(build_py):
    """build_py that also copies the non-Python resources into colibri/data."""

    def run(self) -> None:
        super().run()
        dest = Path(self.build_lib) / "colibri" / "data"
        for item in DATA:
            src = ROOT / item
            if src.is_dir():
                shutil.copytree(src, dest / item, ignore=IGNORE, dirs_exist_ok=True)
            elif src.is_file():
                dest.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / item)


setup(cmdclass={"build_py": BuildPyWithData})
