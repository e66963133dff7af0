"""The q4k scheme (formats.py's q4k section): 6-bit scale packing, bits per weight, round trips
within the stated bound, its error against int4 at the same 4.5 bits per weight (random rows
and rows with outliers), importance weighting, and the numpy mirror of colibri_matvec_q4k_q8
against a scalar loop written from the documented operation order and against the C kernel
(kernels_q.c on the host, ctypes), bit for bit; the C struct read back from compiled objects."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
from colibri.errors import ConfigError
from colibri.frontends.container import (
    BLOCK_Q5K_DTYPE,
    q4k_bytes,
    q4k_group_rows,
    q4k_stream_restore,
    q4k_stream_stored,
)
from colibri.quant.formats import (
    BLOCK_Q4K_DTYPE,
    Q4K_BITS_PER_WEIGHT,
    QK_K,
    dequantize_q4k,
    expert_matrix_bytes,
    f16_to_f32,
    make_plan,
    q4k_codes,
    q4k_pack_scales,
    q4k_unpack_scales,
    quantize_matrix,
    reconstruction_error,
)
from colibri.reference.kernels import matvec, matvec_q4k_q8, quantize_rows_q8
from conftest import host_kernels, probe_object, require_board

SHAPES = [(1, 1), (3, 32), (5, 33), (4, 256), (7, 300), (16, 1000), (40, 72)]


def test_scale_packing_round_trips_every_value() -> None:
    rng = np.random.default_rng(1)
    sc = rng.integers(0, 64, (50, 8)).astype(np.uint8)
    m = rng.integers(0, 64, (50, 8)).astype(np.uint8)
    sc[0], m[0] = 63, 63
    sc[1], m[1] = 0, 0
    packed = q4k_pack_scales(sc, m)
    assert packed.shape == (50, 12)
    got_sc, got_m = q4k_unpack_scales(packed)
    assert np.array_equal(got_sc, sc) and np.array_equal(got_m, m)


def test_bits_per_weight_is_four_and_a_half() -> None:
    assert BLOCK_Q4K_DTYPE.itemsize == 144
    assert Q4K_BITS_PER_WEIGHT == 4.5
    t = quantize_matrix(np.ones((3, 2 * QK_K), np.float32), "q4k")
    assert t.nbytes * 8 / t.data.size / QK_K == 4.5
    assert t.nbytes == 3 * 2 * 144
    # d_ff 512, d_model 256, gated: w1 / w3 [512, 256] (one super-block per row), w2 [256, 512]
    assert expert_matrix_bytes(256, 512, True, "q4k") == (2 * 512 * 1 + 256 * 2) * 144


@pytest.mark.parametrize(
    "n_in,group", [(1, 8), (16, 8), (32, 8), (33, 4), (96, 8), (100, 2), (128, 2), (200, 8),
                   (256, 1), (300, 4), (384, 2), (1000, 1)]
)  # fmt: skip
@pytest.mark.parametrize("bits", [4, 5])
def test_super_blocks_run_across_rows(n_in: int, group: int, bits: int) -> None:
    """A matrix is one stream of its rows' sub-blocks in super-blocks of 8, cut after the last
    used one: a group of 8 / gcd(nsub, 8) rows fills whole super-blocks, so d_model 96 or 128
    costs 4.5 bits per weight (5.5 for q5k), not 5.33 / 5.0 as rows of their own did."""
    sb, sub = (144, 16) if bits == 4 else (176, 20)
    nsub = -(-n_in // 32)
    assert q4k_group_rows(n_in) == group and (group * nsub) % 8 == 0
    assert q4k_bytes(group, n_in, bits) == group * nsub // 8 * sb
    for n_out in (1, group, 3 * group + 1, 5 * group - 1):
        subs = n_out * nsub
        want = subs // 8 * sb + (16 + sub * (subs % 8) if subs % 8 else 0)
        assert q4k_bytes(n_out, n_in, bits) == want
        t = quantize_matrix(np.ones((n_out, n_in), np.float32), "q4k" if bits == 4 else "q5k")
        assert t.nbytes == want and t.data.shape == (-(-subs // 8),)
        stored = q4k_stream_stored(t.data, n_out, n_in)
        assert stored.shape == (want,)
        assert np.array_equal(q4k_stream_restore(stored, n_out, n_in, bits), t.data)
    if n_in % 32 == 0:
        assert q4k_bytes(8 * group, n_in, bits) * 8 == 8 * group * n_in * (bits + 0.5)


@pytest.mark.parametrize("scheme", ["q4k", "q5k"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("search", ["mse", "none"])
def test_round_trip_within_bound(shape: tuple[int, int], search: str, scheme: str) -> None:
    rng = np.random.default_rng(shape[0] * 7 + shape[1])
    w = rng.standard_normal(shape).astype(np.float32)
    if shape[0] > 2:
        w[1] = 0.0  # an all-zero row
        w[2] = np.abs(w[2])  # no negative weight: minimum 0
    t = quantize_matrix(w, scheme, search=search)
    dt = BLOCK_Q4K_DTYPE if scheme == "q4k" else BLOCK_Q5K_DTYPE
    assert t.data.dtype == dt and t.data.shape == (-(-shape[0] * -(-shape[1] // 32) // 8),)
    err = np.abs(t.dequantize().astype(np.float64) - w)
    bound = t.roundtrip_bound(w)
    bad = err > bound
    assert not bad.any(), f"{int(bad.sum())} values beyond the bound, worst {err.max():.3g}"
    if shape[0] > 2:
        assert not t.dequantize()[1].any()
    codes = q4k_codes(t.data, *shape)
    assert codes.min() >= 0 and codes.max() <= (15 if scheme == "q4k" else 31)
    if scheme == "q5k" and shape[1] >= 32 and search == "mse":
        assert codes.max() > 15  # the fifth bit is used


def test_q5k_error_below_q4k() -> None:
    """Measured (64 x 1024, seed 38): q5k's squared error is 0.24x q4k's (5.5 vs 4.5 bits)."""
    w = np.random.default_rng(38).standard_normal((64, 1024)).astype(np.float32)
    e4 = reconstruction_error(quantize_matrix(w, "q4k"), w)
    e5 = reconstruction_error(quantize_matrix(w, "q5k"), w)
    assert e5 < 0.35 * e4, (e5, e4)
    assert quantize_matrix(w, "q5k").nbytes * 8 / w.size == 5.5


def _outlier_rows(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    w = rng.standard_normal(shape).astype(np.float32)
    w[:, ::97] *= 20  # one weight in ~100 twenty times the rest
    return w


@pytest.mark.parametrize("kind", ["random", "outliers"])
def test_error_below_int4_at_the_same_bits(kind: str) -> None:
    """Measured (64 x 1024, seed 38): q4k's squared error is 0.77x int4's on Gaussian rows, 0.46x
    with outliers (the plain q4k method: 0.89x, 0.54x)."""
    rng = np.random.default_rng(38)
    shape = (64, 1024)
    w = rng.standard_normal(shape).astype(np.float32) if kind == "random" else None
    w = _outlier_rows(rng, shape) if w is None else w
    e_k = reconstruction_error(quantize_matrix(w, "q4k"), w)
    e_4 = reconstruction_error(quantize_matrix(w, "int4"), w)
    e_plain = reconstruction_error(quantize_matrix(w, "q4k", search="none"), w)
    assert e_k < 0.9 * e_4, (e_k, e_4)
    assert e_k < e_plain, (e_k, e_plain)


def test_importance_lowers_the_weighted_error() -> None:
    rng = np.random.default_rng(5)
    w = rng.standard_normal((32, 512)).astype(np.float32)
    imp = np.exp(2 * rng.standard_normal(512)).astype(np.float32)
    plain = quantize_matrix(w, "q4k")
    weighted = quantize_matrix(w, "q4k", importance=imp)

    def werr(t: object) -> float:
        d = t.dequantize().astype(np.float64) - w  # type: ignore[attr-defined]
        return float(np.sum(imp * d * d))

    assert werr(weighted) < 0.95 * werr(plain)


def _scalar_matvec(
    blocks: np.ndarray, xq: np.ndarray, sx: np.ndarray, n_out: int, n_in: int
) -> np.ndarray:
    """colibri_matvec_q4k_q8 as the header documents it, one output and one sub-block at a
    time in numpy float32 scalars: row o's sub-block b is the stream's o * nsub + b."""
    sc, m = q4k_unpack_scales(blocks["scales"])
    codes = q4k_codes(blocks, n_out, n_in)
    nsub = -(-n_in // 32)
    y = np.zeros(n_out, np.float32)
    for o in range(n_out):
        acc = np.float32(0)
        for b in range(nsub):
            s, j = divmod(o * nsub + b, 8)
            lo, hi = 32 * b, min(n_in, 32 * b + 32)
            isum = int(np.dot(codes[o, lo:hi].astype(np.int64), xq[lo:hi].astype(np.int64)))
            xsum = int(xq[lo:hi].astype(np.int64).sum())
            d = f16_to_f32(blocks["d"][s])
            dmin = f16_to_f32(blocks["dmin"][s])
            acc = np.float32(acc + np.float32(sc[s, j] * isum) * np.float32(d * sx[b]))
            acc = np.float32(acc - np.float32(m[s, j] * xsum) * np.float32(dmin * sx[b]))
        y[o] = acc
    return y


@pytest.mark.parametrize("scheme", ["q4k", "q5k"])
@pytest.mark.parametrize("shape", [(3, 32), (5, 33), (7, 96), (3, 100), (4, 300), (6, 520)])
def test_mirror_follows_the_documented_order(shape: tuple[int, int], scheme: str) -> None:
    rng = np.random.default_rng(shape[1])
    n_out, n_in = shape
    t = quantize_matrix(rng.standard_normal(shape).astype(np.float32), scheme)
    x = (rng.standard_normal((3, n_in)) * 2).astype(np.float32)
    xq, sx = quantize_rows_q8(x)
    got = matvec_q4k_q8(t.data, xq, sx, n_out, n_in)
    for r in range(3):
        want = _scalar_matvec(t.data, xq[r], sx[r], n_out, n_in)
        assert np.array_equal(got[r].view(np.uint32), want.view(np.uint32))
    # and close to the dequantised product (the int8 activations' error only)
    ref = x.astype(np.float64) @ t.dequantize().T.astype(np.float64)
    assert np.abs(matvec(t, x, "int8") - ref).max() <= 0.02 * np.abs(ref).max()


def test_int8_activations_only() -> None:
    assert make_plan(4, "q4k").acts == ["int8"] * 4
    with pytest.raises(ConfigError, match="q4k experts have int8-activation kernels only"):
        make_plan(4, "q4k", act="fp32")
    assert make_plan(4, "int4", "1=q4k").schemes == ["int4", "q4k", "int4", "int4"]


# -- the C kernel (kernels_q.c on the host, ctypes) and the C struct ----------------------------


@pytest.fixture(scope="module")
def kq(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    return host_kernels(tmp_path_factory.mktemp("kq4k"))


def _p(a: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data)


#: Odd shapes: n_in 16 .. 1000 (groups of 8, 4, 2 and 1 rows), n_out no multiple of the group.
C_SHAPES = [(1, 1), (3, 16), (5, 33), (7, 96), (3, 100), (5, 128), (9, 200), (4, 256), (7, 300),
            (3, 384), (9, 1000), (21, 96), (70, 96)]  # fmt: skip


@pytest.mark.parametrize("scheme", ["q4k", "q5k"])
@pytest.mark.parametrize("shape", C_SHAPES)
def test_c_kernel_bit_exact_with_the_mirror(
    kq: ctypes.CDLL, shape: tuple[int, int], scheme: str
) -> None:
    rng = np.random.default_rng(11 * shape[0] + shape[1])
    n_out, n_in = shape
    w = _outlier_rows(rng, shape)
    w[0, : min(n_in, 40)] = 0.0  # a zero sub-block (sc 0)
    t = quantize_matrix(w, scheme)
    bits = 4 if scheme == "q4k" else 5
    n_tok = 3
    x = (rng.standard_normal((n_tok, n_in)) * 2).astype(np.float32)
    xq, sx = quantize_rows_q8(x)
    want = matvec_q4k_q8(t.data, xq, sx, n_out, n_in)
    blocks = q4k_stream_stored(t.data, n_out, n_in)  # as stored: q4k_bytes(n_out, n_in)
    restored = q4k_stream_restore(blocks, n_out, n_in, bits)
    assert blocks.nbytes == t.nbytes and np.array_equal(restored, t.data)
    y = np.zeros(n_out, np.float32)
    for r in range(n_tok):
        getattr(kq, f"colibri_matvec_{scheme}_q8")(
            _p(blocks), _p(np.ascontiguousarray(xq[r])), _p(np.ascontiguousarray(sx[r])),
            _p(y), n_out, n_in,
        )  # fmt: skip
        assert np.array_equal(y.view(np.uint32), want[r].view(np.uint32)), (r, y, want[r])
    # a row split at each multiple of the group: the rows from r0 on, from their bytes
    g = q4k_group_rows(n_in)
    for r0 in range(g, n_out, g):
        part = np.ascontiguousarray(blocks[q4k_bytes(r0, n_in, bits) :])
        yp = np.zeros(n_out - r0, np.float32)
        getattr(kq, f"colibri_matvec_{scheme}_q8")(
            _p(part), _p(np.ascontiguousarray(xq[0])), _p(np.ascontiguousarray(sx[0])),
            _p(yp), n_out - r0, n_in,
        )  # fmt: skip
        assert np.array_equal(yp.view(np.uint32), want[0, r0:].view(np.uint32)), r0
    ldy = n_out + 3
    ym = np.full((n_tok, ldy), 7.0, np.float32)
    xqc, sxc = np.ascontiguousarray(xq), np.ascontiguousarray(sx)
    mm = getattr(kq, f"colibri_matmul_{scheme}_q8")
    mm(_p(blocks), _p(xqc), _p(sxc), _p(ym), ldy, n_out, n_in, n_tok)
    assert np.array_equal(ym[:, :n_out].view(np.uint32), want.view(np.uint32))
    assert np.all(ym[:, n_out:] == 7.0)
    # every row dequantised (the embedding rows of --dense-quant q4k / q5k)
    deq = dequantize_q4k(t.data, n_out, n_in)
    xr = np.zeros(n_in, np.float32)
    for row in range(n_out):
        kq.colibri_dequantize_row_kq(_p(blocks), row, n_in, bits, _p(xr))
        assert np.array_equal(xr.view(np.uint32), deq[row].view(np.uint32)), row


def test_c_matmul_chunks_start_super_blocks(kq: ctypes.CDLL) -> None:
    """A matrix of rows of 96 long enough for several row chunks of the matmul (each a
    multiple of 16 rows, so of the group of 8): the matvec's bits for every token."""
    rng = np.random.default_rng(96)
    n_out, n_in, n_tok = 300, 96, 2
    t = quantize_matrix(rng.standard_normal((n_out, n_in)).astype(np.float32), "q4k")
    xq, sx = quantize_rows_q8((rng.standard_normal((n_tok, n_in)) * 2).astype(np.float32))
    want = matvec_q4k_q8(t.data, xq, sx, n_out, n_in)
    blocks = q4k_stream_stored(t.data, n_out, n_in)
    ym = np.zeros((n_tok, n_out), np.float32)
    xqc, sxc = np.ascontiguousarray(xq), np.ascontiguousarray(sx)
    kq.colibri_matmul_q4k_q8(_p(blocks), _p(xqc), _p(sxc), _p(ym), n_out, n_out, n_in, n_tok)
    assert np.array_equal(ym.view(np.uint32), want.view(np.uint32))


PROBE = r"""
#include <stddef.h>
#include <stdint.h>
#include "colibri_quant.h"
const uint32_t colibri_probe_layout[10] = {
    (uint32_t)sizeof(colibri_block_q4k), (uint32_t)offsetof(colibri_block_q4k, d),
    (uint32_t)offsetof(colibri_block_q4k, dmin), (uint32_t)offsetof(colibri_block_q4k, scales),
    (uint32_t)offsetof(colibri_block_q4k, qs),
    (uint32_t)sizeof(colibri_block_q5k), (uint32_t)offsetof(colibri_block_q5k, d),
    (uint32_t)offsetof(colibri_block_q5k, dmin), (uint32_t)offsetof(colibri_block_q5k, scales),
    (uint32_t)offsetof(colibri_block_q5k, qs)};
"""


@pytest.mark.parametrize("board", ["host", "cortex-m4", "esp32s3"])
def test_block_layout_read_back_from_object(board: str, tmp_path: Path) -> None:
    """colibri_block_q4k / q5k as each compiler lays them out == BLOCK_Q4K / Q5K_DTYPE."""
    require_board(board, run=False)
    values = probe_object(board, PROBE, tmp_path)["colibri_probe_layout"][0]
    want = []
    for dt in (BLOCK_Q4K_DTYPE, BLOCK_Q5K_DTYPE):
        fields = dt.fields
        assert fields is not None and dt.names is not None
        want += [dt.itemsize] + [fields[f][1] for f in dt.names]
    assert values == want
