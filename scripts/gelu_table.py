#!/usr/bin/env python3
"""The exact GELU's table (colibri_math.h COLIBRI_GELU_Q, codegen/colibri/reference/f32.py
GELU_Q): q(u) = Phi(-(k + u) / 8) on piece k of 48 (|x| < 6), a quartic in u per piece, fitted
to float64 Phi for least relative error (iteratively reweighted least squares), then rounded to
float32. Prints the five coefficient rows and the float32 evaluation's error against float64
x Phi(x) on every multiple of 2^-15 in (-6, 6).

    python scripts/gelu_table.py [--pieces-per-unit 8] [--range 6] [--degree 4]

The committed table was made with the defaults; tests/reference/test_gelu_table.py checks that
this script still gives it (to float32 rounding).
"""

from __future__ import annotations

import argparse
import math

import numpy as np

F32 = np.float32
_ERFC = np.vectorize(math.erfc)


def phi(x: np.ndarray) -> np.ndarray:
    """The standard normal CDF in float64."""
    return np.asarray(0.5 * _ERFC(-np.asarray(x, dtype=np.float64) / math.sqrt(2.0)))


def fit(step: float, span: float, degree: int, iters: int = 30) -> np.ndarray:
    """Coefficients [pieces, degree + 1] (increasing powers of u in 0..1) of Phi(-(k + u) step)
    on each piece k < span / step, fitted for least maximum relative error."""
    pieces = int(round(span / step))
    u = np.linspace(0.0, 1.0, 2000)
    v = np.vander(u, degree + 1, increasing=True)
    out = []
    for k in range(pieces):
        f = phi(-(k + u) * step)
        w = 1.0 / f
        ww = w.copy()
        c = np.zeros(degree + 1)
        for it in range(iters):
            c, *_ = np.linalg.lstsq(v * ww[:, None], f * ww, rcond=None)
            if it < iters - 1:  # weight the worst points up: toward the minimax fit
                e = np.abs(v @ c - f) * w
                ww = ww * np.sqrt(e / e.max() + 1e-3)
        out.append(c)
    return np.asarray(out)


def gelu_f32(coefs: np.ndarray, step: float, x: np.ndarray) -> np.ndarray:
    """colibri_gelu's arithmetic in float32 on |x| < span (Horner in u, x - x q or x q)."""
    x = np.asarray(x, dtype=F32)
    t = np.abs(x) * F32(1.0 / step)
    k = t.astype(np.int32)
    u = t - k.astype(F32)
    c = coefs.astype(F32)
    q = c[k, -1]
    for j in range(c.shape[1] - 2, -1, -1):
        q = q * u + c[k, j]
    m = x * q
    return np.asarray(np.where(x > 0, x - m, m), dtype=F32)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pieces-per-unit", type=int, default=8)
    ap.add_argument("--range", type=float, default=6.0)
    ap.add_argument("--degree", type=int, default=4)
    a = ap.parse_args()
    step = 1.0 / a.pieces_per_unit
    coefs = fit(step, a.range, a.degree)
    n = int(a.range * 2**15)
    x = np.arange(-n + 1, n, dtype=np.float64) / 2**15
    xd = x.astype(F32).astype(np.float64)
    err = np.abs(gelu_f32(coefs, step, x) - xd * phi(xd))
    print(
        f"{len(coefs)} pieces, degree {a.degree}: max abs error {err.max():.3g}, "
        f"abs / max(|x|, 1) {(err / np.maximum(np.abs(xd), 1.0)).max():.3g}"
    )
    for j in range(coefs.shape[1]):
        print(f"Q[{j}]:", ", ".join(f"{float(v):.9g}" for v in coefs[:, j].astype(F32)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
