"""scripts/gelu_table.py still makes the exact GELU's committed table (f32.GELU_Q, the same
numbers as colibri_math.h's, which test_f32_ops / the mathfns selftests hold bit-exact), and the
table's float32 GELU is within the bound colibri_math.h states."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
from colibri.reference import f32

ROOT = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gelu_table", ROOT / "scripts" / "gelu_table.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gelu_table"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_script_reproduces_the_committed_table() -> None:
    g = _script()
    coefs = g.fit(1.0 / 8, 6.0, 4).astype(np.float32).T  # [5, 48]
    table = np.asarray(f32.GELU_Q, dtype=np.float32)[:, : coefs.shape[1]]
    assert table.shape == coefs.shape == (5, 48)
    # a least-squares solve may differ in its last bits between BLAS builds: within 4 float32 ulp
    ulp = np.spacing(np.maximum(np.abs(table), np.float32(1e-30)))
    assert np.all(np.abs(coefs - table) <= 4 * ulp), np.max(np.abs(coefs - table) / ulp)


def test_table_gelu_error_bound() -> None:
    g = _script()
    x = np.arange(-6 * 2**12 + 1, 6 * 2**12, dtype=np.float64) / 2**12
    xd = x.astype(np.float32).astype(np.float64)
    ref = xd * g.phi(xd)
    ours = f32.gelu_f32(x.astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(ours - ref)) <= 2.4e-7
    assert np.array_equal(ours, g.gelu_f32(np.asarray(f32.GELU_Q).T[:48], 1.0 / 8, x))
