"""colibri.reference.f32 against the C it mirrors, bit for bit: colibri_expf / colibri_silu /
colibri_erff / colibri_tanhf / colibri_gelu / colibri_gelu_tanh (colibri_math.h), RMSNorm,
linear, RoPE, attention and SwiGLU (transformer_ops.c) and the router's gates (router.c), built
for the host as a shared library and called through ctypes; and the documented accuracy of the
erf, tanh and GELUs against float64."""

from __future__ import annotations

import ctypes
import math
import shutil
import subprocess

import numpy as np
import pytest
from colibri.reference import f32
from conftest import KERNEL_CFLAGS, ROOT

SHIM = r"""
#include "colibri_math.h"
#include <stdint.h>
void shim_expf(const float *x, float *y, int32_t n)
{
    for (int32_t i = 0; i < n; i++) {
        y[i] = colibri_expf(x[i]);
    }
}
void shim_silu(const float *x, float *y, int32_t n)
{
    for (int32_t i = 0; i < n; i++) {
        y[i] = colibri_silu(x[i]);
    }
}
void shim_erf(const float *x, float *y, int32_t n)
{
    for (int32_t i = 0; i < n; i++) {
        y[i] = colibri_erff(x[i]);
    }
}
void shim_tanh(const float *x, float *y, int32_t n)
{
    for (int32_t i = 0; i < n; i++) {
        y[i] = colibri_tanhf(x[i]);
    }
}
void shim_gelu(const float *x, float *y, int32_t n)
{
    for (int32_t i = 0; i < n; i++) {
        y[i] = colibri_gelu(x[i]);
    }
}
void shim_gelu_tanh(const float *x, float *y, int32_t n)
{
    for (int32_t i = 0; i < n; i++) {
        y[i] = colibri_gelu_tanh(x[i]);
    }
}
"""

F = ctypes.POINTER(ctypes.c_float)


class AttentionShape(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_int32)
        for name in ("n_heads", "n_kv_heads", "head_dim", "max_context", "window")
    ]


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no host C compiler")
    out = tmp_path_factory.mktemp("f32")
    shim = out / "shim.c"
    shim.write_text(SHIM)
    src = ROOT / "runtime_c" / "src"
    so = out / "libf32.so"
    subprocess.run(
        [cc, *KERNEL_CFLAGS, "-shared", "-fPIC", "-I", str(ROOT / "runtime_c" / "include")]
        + [str(shim)]
        + [str(src / n) for n in ("transformer_ops.c", "router.c", "kernels_q.c")]
        + [str(p) for p in sorted((ROOT / "runtime_c" / "arch" / "x86_64").glob("*.c"))]
        + ["-o", str(so), "-lm"],
        check=True,
    )
    return ctypes.CDLL(str(so))


def _p(a: np.ndarray) -> ctypes._Pointer[ctypes.c_float]:  # type: ignore[name-defined]
    assert a.dtype == np.float32 and a.flags.c_contiguous
    return a.ctypes.data_as(F)


def _same_bits(a: np.ndarray, b: np.ndarray, what: str) -> None:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert a.shape == b.shape, what
    differ = a.view(np.uint32) != b.view(np.uint32)
    differ &= ~(np.isnan(a) & np.isnan(b))
    if differ.any():
        i = np.flatnonzero(differ.reshape(-1))[0]
        pytest.fail(
            f"{what}: {int(differ.sum())} of {a.size} differ, first at {i}: "
            f"C {a.reshape(-1)[i]!r} mirror {b.reshape(-1)[i]!r}"
        )


def _exp_inputs() -> np.ndarray:
    rng = np.random.default_rng(0)
    edges = [0.0, -0.0, 1.0, -1.0, -87.0, -87.00001, -86.99999, 88.3, 88.376, 88.38, 88.5, 88.72]
    edges += [88.7228394, 88.72284, 88.7229, 89.0, 1e30, -1e30, np.inf, -np.inf, np.nan, 1e-40]
    parts = [
        np.asarray(edges, dtype=np.float32),
        rng.uniform(-100, 100, 400_000).astype(np.float32),
        rng.uniform(-1, 1, 200_000).astype(np.float32),
        np.linspace(88.0, 88.8, 50_000, dtype=np.float32),
        np.linspace(-87.5, -86.5, 50_000, dtype=np.float32),
    ]
    return np.concatenate(parts)


def test_exp_and_silu_match_c_bit_for_bit(lib: ctypes.CDLL) -> None:
    x = _exp_inputs()
    for name, mirror in (("shim_expf", f32.exp_f32), ("shim_silu", f32.silu_f32)):
        y = np.empty_like(x)
        getattr(lib, name)(_p(x), _p(y), ctypes.c_int32(x.size))
        _same_bits(y, mirror(x), name)


def test_exp_is_accurate() -> None:
    """colibri_expf stays within 2 ulp of exp on [-87, ln FLT_MAX], is 0 below, inf above."""
    x = np.random.default_rng(1).uniform(-87, 88.72, 200_000).astype(np.float32)
    got = f32.exp_f32(x).astype(np.float64)
    true = np.exp(x.astype(np.float64))
    ulp = np.spacing(true.astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(got - true) / ulp) <= 2.0
    assert f32.exp_f32(np.float32([-88.0, -1e30]))[0] == 0.0
    assert np.all(np.isinf(f32.exp_f32(np.float32([88.73, 1e30]))))
    assert np.isnan(f32.exp_f32(np.float32([np.nan]))[0])
    top = np.float32(88.72)
    assert f32.exp_f32(np.float32([top]))[0] == pytest.approx(math.exp(float(top)), rel=2.5e-7)


def _gelu_inputs() -> np.ndarray:
    """Every multiple of 2^-15 in [-10, 10], 2 million random bit patterns (every exponent,
    subnormals, NaNs), the branch edges of colibri_erff / colibri_tanhf / the GELUs and their
    neighbours, +-0, +-inf, NaN, +-FLT_MAX and the smallest subnormal."""
    grid = (np.arange(-10 * 2**15, 10 * 2**15 + 1) / 2**15).astype(np.float32)
    bits = np.random.default_rng(4).integers(0, 2**32, 2_000_000, dtype=np.uint64)
    edges = np.float32([0.875, 4.0, 0.625, -11.0, 5.66, 44.36, 1e-45, 3.4028235e38])
    with np.errstate(over="ignore"):  # FLT_MAX steps to inf
        edges = np.concatenate([edges, -edges, np.nextafter(edges, np.float32(np.inf))])
        edges = np.concatenate([edges, np.nextafter(edges, np.float32(-np.inf))])
    special = np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40])
    return np.concatenate([grid, bits.astype(np.uint32).view(np.float32), edges, special])


GELU_FUNCS = (
    ("shim_erf", f32.erf_f32),
    ("shim_tanh", f32.tanh_f32),
    ("shim_gelu", f32.gelu_f32),
    ("shim_gelu_tanh", f32.gelu_tanh_f32),
)


def test_erf_tanh_gelu_match_c_bit_for_bit(lib: ctypes.CDLL) -> None:
    x = _gelu_inputs()
    for name, mirror in GELU_FUNCS:
        y = np.empty_like(x)
        getattr(lib, name)(_p(x), _p(y), ctypes.c_int32(x.size))
        _same_bits(y, mirror(x), name)


def _true_gelus(x64: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64 gelu (by erfc for x < 0, where 1 + erf cancels) and gelu_tanh (as the sigmoid
    x / (1 + exp(-2u)), which equals 0.5 x (1 + tanh u) without its cancellation)."""
    erfc = np.frompyfunc(math.erfc, 1, 1)
    g = 0.5 * x64 * np.asarray(erfc(-x64 / math.sqrt(2.0)), dtype=np.float64)
    u = math.sqrt(2.0 / math.pi) * (x64 + 0.044715 * x64**3)
    with np.errstate(over="ignore"):
        gt = x64 / (1.0 + np.exp(-2.0 * u))
    return g, gt


def test_erf_tanh_gelu_are_accurate() -> None:
    """The bounds colibri_math.h documents, against float64: erf <= 1.41 ulp, tanh <= 1.22 ulp
    (every finite input); on [-10, 10] gelu <= 2.4e-7 absolute (<= 6.7e-8 max(|x|, 1)),
    <= 1.7 ulp for x >= -1 and relative <= 1.7e-7 for x >= -3, <= 3.3e-6 for x >= -5.9 (its
    table's q = Phi(-|x|) keeps the negative tail); gelu_tanh <= 5.2e-7 absolute (<= 1.2e-7
    max(|x|, 1)), <= 2.4 ulp for x >= -1; the special values."""
    x = _gelu_inputs()
    x = x[np.isfinite(x)]
    x64 = x.astype(np.float64)
    erf = np.frompyfunc(math.erf, 1, 1)

    def ulps(got: np.ndarray, true: np.ndarray) -> np.ndarray:
        ulp = np.spacing(np.abs(true).astype(np.float32)).astype(np.float64)
        return np.abs(got.astype(np.float64) - true) / ulp

    assert ulps(f32.erf_f32(x), np.asarray(erf(x64), dtype=np.float64)).max() <= 1.41
    assert ulps(f32.tanh_f32(x), np.tanh(x64)).max() <= 1.22
    inside = (x >= -10) & (x <= 10)
    g, gt = _true_gelus(x64[inside])
    xi = x[inside]
    for mirror, true, bound, scaled, ulp in (
        (f32.gelu_f32, g, 2.4e-7, 6.7e-8, 1.7),
        (f32.gelu_tanh_f32, gt, 5.2e-7, 1.2e-7, 2.4),
    ):
        got = mirror(xi).astype(np.float64)
        err = np.abs(got - true)
        assert err.max() <= bound
        assert (err / np.maximum(np.abs(x64[inside]), 1.0)).max() <= scaled
        assert ulps(got[xi >= -1], true[xi >= -1]).max() <= ulp
    got = f32.gelu_f32(xi).astype(np.float64)
    for lo, rel in ((-3.0, 1.7e-7), (-5.9, 3.3e-6)):
        sel = (xi >= lo) & (np.abs(g) > 1e-30)  # not the subnormal results near 0
        assert (np.abs(got[sel] - g[sel]) / np.abs(g[sel])).max() <= rel
    special = np.float32([np.inf, -np.inf, np.nan, -0.0])
    for fn, want in (
        (f32.erf_f32, [1.0, -1.0, np.nan, -0.0]),
        (f32.tanh_f32, [1.0, -1.0, np.nan, -0.0]),
        (f32.gelu_f32, [np.inf, -0.0, np.nan, -0.0]),
        (f32.gelu_tanh_f32, [np.inf, -0.0, np.nan, -0.0]),
    ):
        got = fn(special)
        np.testing.assert_array_equal(got, np.float32(want))
        assert np.array_equal(np.signbit(got), np.signbit(np.float32(want)))


def test_transformer_ops_match_c(lib: ctypes.CDLL) -> None:
    rng = np.random.default_rng(2)
    n_in, n_out, t_len = 96, 40, 5
    x = rng.standard_normal((t_len, n_in)).astype(np.float32)
    w = rng.standard_normal((n_out, n_in)).astype(np.float32)
    b = rng.standard_normal(n_out).astype(np.float32)
    nw = rng.uniform(0.5, 1.5, n_in).astype(np.float32)
    want = f32.linear_f32(x, w, b)
    norm = f32.rmsnorm_f32(x, nw, 1e-5)
    for t in range(t_len):
        y = np.empty(n_out, np.float32)
        lib.colibri_linear_f32(_p(x[t]), _p(w), _p(b), _p(y), n_in, n_out)
        _same_bits(y, want[t], "colibri_linear_f32")
        y = np.empty(n_in, np.float32)
        lib.colibri_rmsnorm_f32(_p(x[t]), _p(nw), _p(y), n_in, ctypes.c_float(1e-5))
        _same_bits(y, norm[t], "colibri_rmsnorm_f32")
    # SwiGLU: gate / up [f][d], down [d][f]
    d, f = 32, 48
    wg = rng.standard_normal((f, d)).astype(np.float32)
    wu = rng.standard_normal((f, d)).astype(np.float32)
    wd = rng.standard_normal((d, f)).astype(np.float32)
    xs = (rng.standard_normal((3, d)) * 3).astype(np.float32)
    want = f32.swiglu_f32(xs, wg, wu, wd)
    for t in range(3):
        y, scratch = np.empty(d, np.float32), np.empty(2 * f, np.float32)
        lib.colibri_swiglu_f32(_p(xs[t]), _p(wg), _p(wu), _p(wd), _p(y), d, f, _p(scratch))
        _same_bits(y, want[t], "colibri_swiglu_f32")


def test_rmsnorm_past_fp32s_sum_of_squares(lib: ctypes.CDLL) -> None:
    """Rows whose sum of squares overflows fp32 (activations above about 1.8e19): summed again
    scaled by a power of two, the C and the mirror give the same bits, close to float64's
    RMSNorm; a row holding NaN or Inf is all NaN (it used to be 0 but for the Inf: a forward
    pass whose activations overflowed ended in logits of 0 without an error). The many-rows
    form (prefill) gives the same bits for any mix of such rows."""
    rng = np.random.default_rng(11)
    nw = rng.uniform(0.5, 1.5, 24).astype(np.float32)
    rows = [rng.standard_normal(24).astype(np.float32) * np.float32(scale) for scale in
            (1.0, 3e18, 2e19, 1e30, 1e38)]  # fmt: skip
    rows.append(np.where(np.arange(24) == 5, np.float32(np.inf), rows[0]).astype(np.float32))
    rows.append(np.where(np.arange(24) == 7, np.float32(np.nan), rows[2]).astype(np.float32))
    x = np.stack(rows)
    want = f32.rmsnorm_f32(x, nw, 1e-5)
    for t in range(len(rows)):
        y = np.empty(24, np.float32)
        lib.colibri_rmsnorm_f32(_p(x[t]), _p(nw), _p(y), 24, ctypes.c_float(1e-5))
        _same_bits(y, want[t], f"colibri_rmsnorm_f32 row {t}")
    # colibri_rmsnorm_rows_f32: four rows' sums at a time, the same bits row by row, for every
    # row count (the rows past a group of four one by one), out of place and in place
    f = lib.colibri_rmsnorm_rows_f32
    f.argtypes = [F, F, F, ctypes.c_int32, ctypes.c_int32, ctypes.c_size_t, ctypes.c_float]
    for n_rows in range(1, len(rows) + 1):
        for start in (0, len(rows) - n_rows):
            xs = x[start : start + n_rows].copy()
            y = np.full_like(xs, 7.0)
            f(_p(xs), _p(nw), _p(y), n_rows, 24, 24, 1e-5)
            _same_bits(y, want[start : start + n_rows], f"rows {start}..+{n_rows}")
            f(_p(xs), _p(nw), _p(xs), n_rows, 24, 24, 1e-5)
            _same_bits(xs, want[start : start + n_rows], f"rows {start}..+{n_rows} in place")
    x64 = x[:5].astype(np.float64)
    exact = nw * x64 / np.sqrt((x64 * x64).mean(axis=-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(want[:5], exact, rtol=2e-6, atol=0)
    assert np.isnan(want[5:]).all()


@pytest.mark.parametrize("window", [0, 5])
def test_rope_and_attention_match_c(lib: ctypes.CDLL, window: int) -> None:
    """A prompt of 12 positions, one token at a time through the C (as <name>_lm_step), and
    in one pass through the mirror."""
    rng = np.random.default_rng(3 + window)
    n_heads, n_kv, hd, ctx, t_len = 4, 2, 16, 16, 12
    q = rng.standard_normal((t_len, n_heads * hd)).astype(np.float32)
    k = rng.standard_normal((t_len, n_kv * hd)).astype(np.float32)
    v = rng.standard_normal((t_len, n_kv * hd)).astype(np.float32)
    ang = rng.uniform(0, 6, (t_len, hd // 2))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    qm = f32.rope_f32(q.reshape(t_len, n_heads, hd).transpose(1, 0, 2), cos, sin)
    km = f32.rope_f32(k.reshape(t_len, n_kv, hd).transpose(1, 0, 2), cos, sin)
    vm = v.reshape(t_len, n_kv, hd).transpose(1, 0, 2).copy()
    want = f32.attention_f32(qm, km, vm, np.arange(t_len), window)
    shape = AttentionShape(n_heads, n_kv, hd, ctx, window)
    kc = np.zeros(n_kv * ctx * hd, np.float32)
    vc = np.zeros_like(kc)
    scores = np.zeros(ctx, np.float32)
    for pos in range(t_len):
        qp, kp = q[pos].copy(), k[pos].copy()
        cs, sn = cos[pos].copy(), sin[pos].copy()
        lib.colibri_rope_f32(_p(qp), n_heads, hd, _p(cs), _p(sn))
        lib.colibri_rope_f32(_p(kp), n_kv, hd, _p(cs), _p(sn))
        _same_bits(qp, qm[:, pos].reshape(-1), "colibri_rope_f32")
        out = np.zeros(n_heads * hd, np.float32)
        vp = v[pos].copy()
        st = lib.colibri_attention_f32(
            ctypes.byref(shape), pos, _p(qp), _p(kp), _p(vp), _p(kc), _p(vc), _p(scores), _p(out)
        )
        assert st == 0
        _same_bits(out, want[pos], f"colibri_attention_f32 at {pos}")


@pytest.mark.parametrize(("n_exp", "k"), [(8, 2), (60, 4), (64, 1), (65, 2), (130, 8)])
def test_router_gates_match_c(lib: ctypes.CDLL, n_exp: int, k: int) -> None:
    """colibri_route_gate's ids and fp32 gates, one block of 64 or several (the running max
    rescales the sum), ties included."""
    rng = np.random.default_rng(n_exp * 10 + k)
    t_len = 64
    logits = (rng.standard_normal((t_len, n_exp)) * 4).astype(np.float32)
    logits[::7, 3] = logits[::7, 1]  # ties
    logits[::5] = np.sort(logits[::5], axis=1)  # the max in the last block
    ids = np.zeros((t_len, k), np.int32)
    gates = np.zeros((t_len, k), np.float32)
    st = lib.colibri_route_gate(
        _p(logits), t_len, n_exp, k, ids.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
        _p(gates), None,
    )  # fmt: skip
    assert st == 0
    order = np.argsort(-logits.astype(np.float64), axis=1, kind="stable")[:, :k]
    np.testing.assert_array_equal(ids, order)
    _same_bits(gates, f32.route_gates_f32(logits, ids, norm_topk=False), "gates")
    normed = f32.route_gates_f32(logits, ids, norm_topk=True)
    assert np.allclose(normed.sum(axis=1), 1.0, atol=1e-6)
