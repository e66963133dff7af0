"""Quantisation: round trips within the named bounds, the C kernels bit-exact against the numpy
mirror (ctypes on a host build of kernels_q.c), the block format read back from compiled
objects, generated C vs the quantised reference for every scheme, layout savings, the accuracy
report, and the budget that only int4 meets."""

from __future__ import annotations

import ctypes
import json
import zlib
from pathlib import Path

import numpy as np
import pytest
from colibri.cli.main import run_model
from colibri.cli.pipeline import generate, render
from colibri.errors import BudgetExceeded, ModelFormatError, ShapeError
from colibri.frontends.seed import make_toy
from colibri.options import GenerateOptions
from colibri.quant.formats import (
    BLOCK_Q4_DTYPE,
    LAYER_TOLERANCE,
    QK4,
    QK8,
    SCHEMES,
    c8_order,
    c8_restore,
    f16_to_f32,
    make_plan,
    q4h4_order,
    q4h4_restore,
    q4r4_order,
    q4r4_restore,
    q8_blocks,
    quantize_fp16,
    quantize_int4_blocks,
    quantize_int8_per_channel,
    quantize_layer,
    quantize_matrix,
    r4_order,
    r4_restore,
    r4p_order,
    r4p_restore,
    round_half_away,
)
from colibri.quant.model import quantize_moe_layer
from colibri.reference.calibration import layer_calibration
from colibri.reference.kernels import (
    dot_q4_q8,
    dot_q8,
    matvec_f16_f32,
    matvec_q4_f32,
    matvec_q4_q8,
    matvec_q8_f32,
    matvec_q8_q8,
    matvec_q8b_f32,
    matvec_q8b_q8,
    quant_moe_forward,
    quantize_rows_q8,
)
from colibri.reference.moe import compare, moe_forward
from conftest import host_kernels, probe_object, require_board, run_cli

SHAPES = [(1, 1), (3, 32), (5, 33), (17, 64), (8, 100), (40, 36)]


def _matrix(rng: np.random.Generator, shape: tuple[int, int], kind: int) -> np.ndarray:
    w = rng.standard_normal(shape).astype(np.float32)
    if kind == 1:
        w *= np.float32(1e-3) * rng.random(shape[0]).astype(np.float32)[:, None]
    if kind == 2 and shape[0] > 1:
        w[0] = 0.0  # an all-zero channel
    return w


# -- round trips --------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", [0, 1, 2])
def test_roundtrip_within_named_bound(scheme: str, shape: tuple[int, int], kind: int) -> None:
    w = _matrix(np.random.default_rng(zlib.crc32(f"{scheme}{shape}{kind}".encode())), shape, kind)
    t = quantize_matrix(w, scheme)
    err = np.abs(t.dequantize().astype(np.float64) - w)
    bound = t.roundtrip_bound(w)
    bad = err > bound
    assert not bad.any(), (
        f"{scheme} {shape}: {int(bad.sum())} elements over the bound; worst "
        f"{float(err.max()):.3g} vs {float(bound.ravel()[np.argmax(err)]):.3g}"
    )
    if scheme == "fp32":
        assert np.array_equal(t.dequantize(), w)


def test_roundtrip_storage_sizes() -> None:
    w = np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32)
    assert quantize_matrix(w, "fp16").nbytes == 64 * 128 * 2
    assert quantize_matrix(w, "int8").nbytes == 64 * 128 + 4 * 64
    assert quantize_matrix(w, "int4").nbytes == 64 * 128 * 18 // 32  # 4.5 bits per weight


def test_round_half_away_matches_c_roundf() -> None:
    vals = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 0.49999997, -0.49999997, 126.5, 0.0], np.float32)
    assert round_half_away(vals).tolist() == [1, 2, 3, -1, -3, 0, -0, 127, 0]


def test_fp16_out_of_range_is_refused() -> None:
    with pytest.raises(Exception, match="fp16 range"):
        quantize_fp16(np.array([[1e6]], np.float32), "expert.0.w1")


def test_int8_and_int4_codes() -> None:
    w = np.array([[1.0, -0.5, 0.25, 0.0]], np.float32)
    q, s = quantize_int8_per_channel(w)
    assert s[0] == np.float32(1.0) / np.float32(127) and q.tolist() == [[127, -64, 32, 0]]
    blocks = quantize_int4_blocks(w)
    assert blocks.dtype == BLOCK_Q4_DTYPE and blocks.shape == (1, 1)
    # d = 1/7: values 7, -3.5 -> -4 (half away), 1.75 -> 2, 0 -> nibbles 15, 4, 10, 8
    qs = blocks["qs"][0, 0]
    assert [qs[0] & 15, qs[1] & 15, qs[2] & 15, qs[3] & 15] == [15, 4, 10, 8]
    assert f16_to_f32(blocks["d"])[0, 0] == np.float32(np.float16(1.0 / 7.0))


# -- the C kernels, bit-exact --------------------------------------------------------------------


@pytest.fixture(scope="module")
def kq(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    return host_kernels(tmp_path_factory.mktemp("kq"))


def _p(a: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data)


def _same_bits(actual: np.ndarray, expected: np.ndarray, what: str) -> None:
    a = np.ascontiguousarray(actual, np.float32).view(np.uint32)
    e = np.ascontiguousarray(expected, np.float32).view(np.uint32)
    bad = a != e
    if bad.any():
        i = np.unravel_index(int(np.argmax(bad)), bad.shape)
        pytest.fail(
            f"{what}: {int(bad.sum())} of {bad.size} values differ; first at {i}: actual "
            f"{actual[i]!r}, expected {expected[i]!r}"
        )


def test_f16_conversion_exact_for_every_bit_pattern(kq: ctypes.CDLL) -> None:
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    ours = np.array([kq.colibri_f16_to_f32(int(b)) for b in bits], np.float32)
    ref = f16_to_f32(bits)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(ours), nan)
    _same_bits(ours[~nan], ref[~nan], "f16 -> f32")


@pytest.mark.parametrize("shape", SHAPES)
def test_integer_accumulators_bit_exact(kq: ctypes.CDLL, shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(shape[0] * 1000 + shape[1])
    n_out, n_in = shape
    w = rng.standard_normal((n_out, n_in)).astype(np.float32)
    x = (rng.standard_normal((1, n_in)) * 3).astype(np.float32)
    x[0, 0] = 0.0
    x[0, 32:64] = 0.0  # a block of zeros: scale 0
    x[0, min(70, n_in - 1)] = 40.0  # one outlier: only its own block's scale grows
    xq = np.zeros(n_in, np.int8)
    sx = np.full(q8_blocks(n_in), np.nan, np.float32)
    kq.colibri_quantize_row_q8(_p(x), _p(xq), _p(sx), n_in)
    ref_xq, ref_sx = quantize_rows_q8(x)
    assert np.array_equal(xq, ref_xq[0])
    _same_bits(sx, ref_sx[0], "block scales")
    for b in range(q8_blocks(n_in)):  # every block's largest |x| maps to +-127 (or is zero)
        blk = np.abs(xq[b * QK8 : (b + 1) * QK8].astype(np.int32))
        assert blk.max() == (127 if sx[b] > 0 else 0), (b, blk.max(), sx[b])
    q, _ = quantize_int8_per_channel(w)
    acc8 = [kq.colibri_dot_q8(_p(q[o]), _p(xq), n_in) for o in range(n_out)]
    assert acc8 == dot_q8(q, ref_xq)[0].tolist()
    blocks = np.ascontiguousarray(quantize_int4_blocks(w))
    nb = blocks.shape[1]
    ref4 = dot_q4_q8(blocks, ref_xq, n_in)[0]
    for o in range(n_out):
        for b in range(nb):
            n = min(QK4, n_in - b * QK4)
            blk = ctypes.c_void_p(blocks.ctypes.data + (o * nb + b) * BLOCK_Q4_DTYPE.itemsize)
            got = kq.colibri_dot_q4_q8(blk, ctypes.c_void_p(xq.ctypes.data + b * QK4), n)
            assert got == ref4[o, b], (o, b, got, ref4[o, b])


def test_quantize_row_blocks_bit_exact(kq: ctypes.CDLL) -> None:
    """colibri_quantize_row_q8 (whole blocks take a SIMD path on x86-64) against the mirror, bit
    for bit: ties at .5 codes, -0.0, subnormals beside normal values, blocks whose max |x| is
    tiny, infinite or NaN, scales over many binades, and a partial last block."""
    rng = np.random.default_rng(2024)
    n = 32 * 40 + 13
    x = rng.standard_normal(n).astype(np.float32)
    x *= np.exp2(rng.integers(-60, 60, n // 32 + 1)).astype(np.float32).repeat(32)[:n]
    x[0:32] = (np.arange(32, dtype=np.float32) - 16.0) * 0.5  # amax 8: codes at .5 ties
    x[32:64] = x[0:32] * np.float32(127.0 / 8.0)  # exact halves after the scaling
    x[64:96] = 0.0
    x[65] = -0.0
    x[70] = np.float32(1e-40)  # a subnormal in an all-zero block
    x[96:128] = np.float32(1e-40)
    x[100] = np.float32(2.0**-101)  # max |x| just below the SIMD path's 2^-100
    x[128:160] = np.float32(3.0)
    x[130] = np.float32(2.0**-100)
    x[131] = np.float32(-1e-42)
    x[160:192] = rng.standard_normal(32).astype(np.float32) * np.float32(2.0**-100)
    x[200] = np.inf
    x[230] = -np.inf
    x[260] = np.nan
    x[290] = np.float32(3.0e38)
    x[300] = np.float32(-3.4e38)
    xq = np.zeros(n, np.int8)
    sx = np.full(q8_blocks(n), np.nan, np.float32)
    kq.colibri_quantize_row_q8(_p(x), _p(xq), _p(sx), n)
    ref_xq, ref_sx = quantize_rows_q8(x[None, :])
    assert np.array_equal(xq, ref_xq[0]), np.flatnonzero(xq != ref_xq[0])[:8]
    _same_bits(sx, ref_sx[0], "block scales")


def test_zero_row_quantises_to_zero(kq: ctypes.CDLL) -> None:
    x = np.zeros((1, 7), np.float32)
    xq = np.ones(7, np.int8)
    sx = np.ones(1, np.float32)
    kq.colibri_quantize_row_q8(_p(x), _p(xq), _p(sx), 7)
    assert sx[0] == 0.0 and not xq.any() and not quantize_rows_q8(x)[0].any()


@pytest.mark.parametrize("shape", SHAPES)
def test_matvec_outputs_bit_exact(kq: ctypes.CDLL, shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(7 + shape[0] + 31 * shape[1])
    n_out, n_in = shape
    w = rng.standard_normal((n_out, n_in)).astype(np.float32)
    x = rng.standard_normal((1, n_in)).astype(np.float32)
    y = np.zeros(n_out, np.float32)
    xq, sx = quantize_rows_q8(x)
    c_sx = _p(np.ascontiguousarray(sx[0]))

    w16 = np.ascontiguousarray(quantize_fp16(w))
    kq.colibri_matvec_f16_f32(_p(w16), _p(x), _p(y), n_out, n_in)
    _same_bits(y, matvec_f16_f32(w16, x)[0], "f16 x f32")

    q, s = quantize_int8_per_channel(w)
    kq.colibri_matvec_q8_f32(_p(q), _p(s), _p(x), _p(y), n_out, n_in)
    _same_bits(y, matvec_q8_f32(q, s, x)[0], "q8 x f32")
    kq.colibri_matvec_q8_q8(_p(q), _p(s), _p(xq), c_sx, _p(y), n_out, n_in)
    _same_bits(y, matvec_q8_q8(q, s, xq, sx)[0], "q8 x q8")

    qb = quantize_matrix(w, "int8", blocks=True)  # one scale per block of 32 inputs
    assert qb.blocked and qb.scale is not None
    sb = np.ascontiguousarray(qb.scale)
    assert np.abs(qb.dequantize() - w).max() <= np.abs(qb.roundtrip_bound(w)).max() + 1e-7
    kq.colibri_matvec_q8b_f32(_p(qb.data), _p(sb), _p(x), _p(y), n_out, n_in)
    _same_bits(y, matvec_q8b_f32(qb.data, sb, x)[0], "q8b x f32")
    kq.colibri_matvec_q8b_q8(_p(qb.data), _p(sb), _p(xq), c_sx, _p(y), n_out, n_in)
    _same_bits(y, matvec_q8b_q8(qb.data, sb, xq, sx)[0], "q8b x q8")

    blocks = np.ascontiguousarray(quantize_int4_blocks(w))
    kq.colibri_matvec_q4_f32(_p(blocks), _p(x), _p(y), n_out, n_in)
    _same_bits(y, matvec_q4_f32(blocks, x, n_in)[0], "q4 x f32")
    kq.colibri_matvec_q4_q8(_p(blocks), _p(xq), c_sx, _p(y), n_out, n_in)
    _same_bits(y, matvec_q4_q8(blocks, xq, sx, n_in)[0], "q4 x q8")


# -- one definition of the block format: C struct vs numpy dtype --------------------------------

PROBE = r"""
#include <stddef.h>
#include <stdint.h>
#include "colibri_quant.h"
const uint32_t colibri_probe_layout[4] = {
    (uint32_t)sizeof(colibri_block_q4_32), (uint32_t)offsetof(colibri_block_q4_32, d),
    (uint32_t)offsetof(colibri_block_q4_32, qs), (uint32_t)sizeof(((colibri_block_q4_32 *)0)->qs)};
const colibri_block_q4_32 colibri_probe_blocks[3] = {{0}};
"""


@pytest.mark.parametrize("board", ["host", "cortex-m4", "cortex-m3", "xtensa-lx106"])
def test_block_layout_read_back_from_object(board: str, tmp_path: Path) -> None:
    require_board(board, run=False)
    syms = probe_object(board, PROBE, tmp_path)
    values = syms["colibri_probe_layout"][0]
    blocks_size = syms["colibri_probe_blocks"][1]
    fields = BLOCK_Q4_DTYPE.fields
    assert fields is not None
    assert values == [
        BLOCK_Q4_DTYPE.itemsize,
        fields["d"][1],
        fields["qs"][1],
        fields["qs"][0].itemsize,
    ]
    assert blocks_size == 3 * BLOCK_Q4_DTYPE.itemsize


@pytest.mark.parametrize("shape", [(4, 16), (5, 32), (7, 48), (8, 128), (13, 64)])
def test_r4_layout_order_and_inverse(shape: tuple[int, int]) -> None:
    """Layout r4 (colibri_qinline.h): per group of 4 rows and chunk of 16 inputs, the chunk of
    row 0, 1, 2, 3; the last n_out % 4 rows row-major; r4_restore undoes it."""
    n_out, n_in = shape
    codes = np.arange(n_out * n_in, dtype=np.int64).reshape(n_out, n_in)
    stored = r4_order(codes)
    assert stored.shape == (n_out * n_in,)
    for g in range(n_out // 4):
        for c in range(n_in // 16):
            for r in range(4):
                at = g * 4 * n_in + c * 64 + r * 16
                np.testing.assert_array_equal(
                    stored[at : at + 16], codes[4 * g + r, 16 * c : 16 * c + 16]
                )
    tail = n_out // 4 * 4 * n_in
    np.testing.assert_array_equal(stored[tail:], codes[n_out // 4 * 4 :].ravel())
    np.testing.assert_array_equal(r4_restore(stored, n_out, n_in), codes)


@pytest.mark.parametrize("shape", [(4, 32), (5, 64), (7, 96), (8, 128), (13, 256)])
def test_q4r4_layout_order_and_inverse(shape: tuple[int, int]) -> None:
    """Layout q4r4 (colibri_qinline_q4.h): per group of 4 rows and block, the 4 fp16 scales,
    then each row's nibbles with weights (8s+k, 8s+k+2) and (8s+k+4, 8s+k+6) (k = 0, 1) in the
    halfword lanes of word s; the last n_out % 4 rows plain; q4r4_restore undoes it."""
    n_out, n_in = shape
    nb = n_in // QK4
    rng = np.random.default_rng(n_out)
    blocks = np.zeros((n_out, nb), BLOCK_Q4_DTYPE)
    blocks["d"] = rng.integers(0, 1 << 16, (n_out, nb))
    blocks["qs"] = rng.integers(0, 256, (n_out, nb, 16))
    stored = q4r4_order(blocks)
    assert stored.dtype == np.uint8 and stored.size == blocks.nbytes
    nib = np.concatenate([blocks["qs"] & 15, blocks["qs"] >> 4], axis=-1)  # [out, nb, 32]
    for g in range(n_out // 4):
        for b in range(nb):
            at = (g * nb + b) * 72
            d = stored[at : at + 8].view("<u2")
            np.testing.assert_array_equal(d, blocks["d"][4 * g : 4 * g + 4, b])
            for r in range(4):
                words = stored[at + 8 + 16 * r : at + 24 + 16 * r].view("<u4")
                for s_ in range(4):
                    for k in range(4):  # lane k: bits 4k and 16 + 4k
                        lo = (int(words[s_]) >> (4 * k)) & 15
                        hi = (int(words[s_]) >> (16 + 4 * k)) & 15
                        i = 8 * s_ + (k & 1) + 4 * (k >> 1)
                        assert (lo, hi) == (nib[4 * g + r, b, i], nib[4 * g + r, b, i + 2])
    tail = n_out // 4 * 4 * nb * 18
    assert stored[tail:].tobytes() == blocks[n_out // 4 * 4 :].tobytes()
    back = q4r4_restore(stored, n_out, n_in)
    assert back.tobytes() == blocks.tobytes()


@pytest.mark.parametrize("shape", [(4, 32), (5, 64), (7, 96), (13, 256)])
def test_q4h4_layout_order_and_inverse(shape: tuple[int, int]) -> None:
    """Layout q4h4 (colibri_qinline_q4.h, Helium): per group of 4 rows and block, the 4 fp16
    scales, then each row's 16 bytes of nibbles as in the plain block; the last n_out % 4 rows
    plain; the size of the plain blocks; q4h4_restore undoes it."""
    n_out, n_in = shape
    nb = n_in // QK4
    rng = np.random.default_rng(n_out + 1)
    blocks = np.zeros((n_out, nb), BLOCK_Q4_DTYPE)
    blocks["d"] = rng.integers(0, 1 << 16, (n_out, nb))
    blocks["qs"] = rng.integers(0, 256, (n_out, nb, 16))
    stored = q4h4_order(blocks)
    assert stored.dtype == np.uint8 and stored.size == blocks.nbytes
    for g in range(n_out // 4):
        for b in range(nb):
            at = (g * nb + b) * 72
            np.testing.assert_array_equal(
                stored[at : at + 8].view("<u2"), blocks["d"][4 * g : 4 * g + 4, b]
            )
            for r in range(4):
                np.testing.assert_array_equal(
                    stored[at + 8 + 16 * r : at + 24 + 16 * r], blocks["qs"][4 * g + r, b]
                )
    tail = n_out // 4 * 4 * nb * 18
    assert stored[tail:].tobytes() == blocks[n_out // 4 * 4 :].tobytes()
    assert q4h4_restore(stored, n_out, n_in).tobytes() == blocks.tobytes()


@pytest.mark.parametrize(
    "shape", [(8, 4), (16, 12), (24, 20), (64, 128), (4, 16), (12, 8), (8, 6), (27, 47), (1, 1)]
)
def test_c8_layout_order_and_inverse(shape: tuple[int, int]) -> None:
    """Layout c8 (colibri_qinline_f.h, fp32): per block of 8 outputs, for each input i the 8
    weights w[8b .. 8b + 7][i]; the n_out % 8 outputs after the last whole block are a last
    block of that width, [n_in][n_out % 8] (c8 tails: any shape is stored in c8, none falls
    back to the seed layout); c8_restore undoes it."""
    n_out, n_in = shape
    w = np.arange(n_out * n_in, dtype=np.float32).reshape(n_out, n_in)
    stored = c8_order(w)
    assert stored.shape == (n_out * n_in,)
    for b in range(n_out // 8):
        for i in range(n_in):
            at = b * 8 * n_in + i * 8
            np.testing.assert_array_equal(stored[at : at + 8], w[8 * b : 8 * b + 8, i])
    full, r = n_out // 8 * 8, n_out % 8
    for i in range(n_in):
        at = full * n_in + i * r
        np.testing.assert_array_equal(stored[at : at + r], w[full:, i])
    np.testing.assert_array_equal(c8_restore(stored, n_out, n_in), w)


@pytest.mark.parametrize("shape", [(0, 4), (4, 0)])
def test_c8_layout_refuses_empty_shapes(shape: tuple[int, int]) -> None:
    with pytest.raises(ShapeError, match="layout c8"):
        c8_order(np.zeros(shape, np.float32))


@pytest.mark.parametrize(
    ("board", "d_model", "d_ff", "want"),
    [
        ("cortex-m4", 32, 48, {"w1": "c8", "w3": "c8", "w2": "c8"}),
        ("cortex-m55", 20, 24, {"w1": "c8", "w3": "c8", "w2": "c8"}),  # 20 outputs: a tail
        ("cortex-m7", 27, 45, {"w1": "c8", "w3": "c8", "w2": "c8"}),  # tails of both
        ("host", 32, 48, {"w1": "rows", "w3": "rows", "w2": "rows"}),
    ],
)
def test_fp32_experts_record_their_layout(
    board: str, d_model: int, d_ff: int, want: dict[str, str], tmp_path: Path
) -> None:
    """fp32 experts are stored in layout c8 on the cores with a fused dot-form kernel, whatever
    the shape (its tails too), the seed layout elsewhere; the manifest says which, and the blob
    holds it."""
    layer = make_toy(2, d_model, d_ff, 1, "relu", seed=5)
    gen, manifest = generate(layer, tmp_path / "g", GenerateOptions(board=board, name="f"))
    assert manifest["weight_layouts"] == {"f_ffn": want}
    blob = (gen / "colibri_weights.bin").read_bytes()
    w1 = layer.experts[0].w1  # [d_model][d_ff], the seed layout
    seed = np.ascontiguousarray(w1, "<f4").tobytes()
    stored = c8_order(np.ascontiguousarray(w1.T)).astype("<f4").tobytes()
    assert (stored if want["w1"] == "c8" else seed) in blob


@pytest.mark.parametrize("shape", [(4, 32), (5, 64), (7, 96), (13, 256)])
def test_r4p_layout_pairs_and_inverse(shape: tuple[int, int]) -> None:
    """Layout r4p (colibri_qinline.h, Cortex-M4 / M7): layout r4 of the codes with every odd
    code of the group rows stored as c[2j+1] - (c[2j] < 0), so each little-endian halfword of
    the stored bytes read as int16 is 256 c[2j+1] + c[2j]; the tail rows unchanged; r4p_restore
    undoes it, extreme codes included."""
    n_out, n_in = shape
    rng = np.random.default_rng(n_out * n_in)
    codes = rng.integers(-127, 128, size=(n_out, n_in)).astype(np.int8)
    codes[0, :4] = [-127, -127, -1, 127]  # the corrected byte at both ends of its range
    stored = r4p_order(codes)
    assert stored.dtype == np.int8 and stored.shape == (n_out * n_in,)
    g = n_out // 4 * 4
    halves = stored[: g * n_in].view("<i2").astype(np.int64)
    rows = r4_restore(r4_order(codes), n_out, n_in)  # the plain codes, r4 order below
    plain = r4_order(rows)[: g * n_in].astype(np.int64)
    np.testing.assert_array_equal(halves, 256 * plain[1::2] + plain[0::2])
    np.testing.assert_array_equal(stored[g * n_in :], codes[g:].ravel())
    np.testing.assert_array_equal(r4p_restore(stored, n_out, n_in), codes)


def test_r4p_layout_refuses_what_it_cannot_hold() -> None:
    with pytest.raises(ShapeError, match="layout r4p"):
        r4p_order(np.zeros((8, 48), np.int8))  # inputs not whole blocks of 32
    with pytest.raises(ModelFormatError, match="-127, 127"):
        r4p_order(np.full((4, 32), -128, np.int8))


@pytest.mark.parametrize("shape", [(3, 16), (4, 20), (8, 8)])
def test_r4_layout_refuses_shapes_it_cannot_hold(shape: tuple[int, int]) -> None:
    with pytest.raises(ShapeError, match="layout r4"):
        r4_order(np.zeros(shape, np.int8))


# -- generated C vs the quantised reference (host) ---------------------------------------------

GEN_CASES = [
    # (scheme, act, activation, experts, d_model, d_ff, k, bias, expert_quant)
    ("fp16", None, "gelu", 4, 40, 36, 2, True, None),
    ("int8", None, "gelu_tanh", 5, 33, 70, 2, False, None),
    ("int8", "fp32", "silu", 4, 40, 36, 1, True, None),
    ("int4", None, "relu", 6, 64, 48, 3, True, None),
    ("int4", "fp32", "gelu", 4, 31, 65, 2, False, None),
    ("int8", None, "swiglu", 4, 32, 40, 2, False, None),
    ("int4", None, "swiglu", 3, 40, 33, 2, True, None),
    ("fp16", None, "swiglu", 3, 16, 24, 2, True, None),
    ("int8", None, "gelu", 8, 24, 40, 2, True, "1=int4,2=fp32,3=fp16"),
]


def _quant_run(case: tuple, board: str, tmp_path: Path, tokens: int = 37) -> None:
    scheme, act, activation, experts, d, f, k, bias, eq = case
    layer = make_toy(experts, d, f, k, activation, seed=experts + d, router_bias=bias)
    if not bias:
        for e in layer.experts:
            e.b1 = e.b2 = None
    x = np.random.default_rng(d).standard_normal((tokens, d)).astype(np.float32)
    opts = GenerateOptions(
        board=board, name="q", max_tokens=16, quant=scheme, act=act, expert_quant=eq
    )
    generate(layer, tmp_path / "q", opts)
    out, _ = run_model(tmp_path / "q", board, x)
    plan = make_plan(experts, scheme, eq, act)
    ref, rq = quant_moe_forward(layer, quantize_layer(layer, plan), x)
    np.testing.assert_array_equal(out.expert_ids, rq.expert_ids, err_msg=f"{board} {case}: routing")
    np.testing.assert_array_equal(out.expert_ids, moe_forward(layer, x)[1].expert_ids)
    tol = max(LAYER_TOLERANCE[(s, a)] for s, a in zip(plan.schemes, plan.acts))
    err = compare(out.output, ref, tol)
    assert err is None, f"{board} {case}: {err}"


@pytest.mark.parametrize(
    "case", GEN_CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}-E{c[3]}" for c in GEN_CASES]
)
def test_generated_quantised_matches_reference(case: tuple, tmp_path: Path) -> None:
    _quant_run(case, "host", tmp_path)


@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
@pytest.mark.parametrize("dims", [(3, 5, 7), (4, 40, 36), (2, 33, 70)])
def test_weight_bytes_estimate_matches_generation(dims: tuple, activation: str) -> None:
    """The budget suggestion's estimate is the generated size, padding included."""
    from colibri.quant.formats import weight_bytes_for

    layer = make_toy(*dims, 1, activation, seed=1)
    for scheme in SCHEMES:
        _, man = render(layer, GenerateOptions(quant=scheme))
        assert man["memory"]["weight_bytes"] == weight_bytes_for(layer, scheme), scheme


def test_generation_is_deterministic() -> None:
    layer = make_toy(4, 40, 36, 2, "gelu", seed=3)
    opts = GenerateOptions(name="d", quant="int4", expert_quant="0=int8,1=fp16")
    assert render(layer, opts) == render(layer, opts)


# -- layout: sharing --------------------------------------------------------------------------


def test_sharing_map_saves_75_percent(tmp_path: Path) -> None:
    """The seed example: 8 experts sharing 2 weight sets are stored 75% smaller."""
    layer = make_toy(8, 16, 32, 2, "gelu", seed=5)
    layer.sharing_map = [0, 0, 0, 0, 4, 4, 4, 4]
    x = np.random.default_rng(0).standard_normal((20, 16)).astype(np.float32)
    _, man = generate(layer, tmp_path / "s", GenerateOptions(name="s", quant="int8"), calib=x)
    lay = man["layout"]
    assert lay["unique_experts"] == 2 and lay["sharing_saved_percent"] == 75.0
    assert [e["bytes"] > 0 for e in man["experts"]] == [i in (0, 4) for i in range(8)]
    out, _ = run_model(tmp_path / "s", "host", x)
    stored = quantize_moe_layer(layer, "int8", calib=layer_calibration(layer, x)).experts
    ref, _ = quant_moe_forward(layer, stored, x)  # calib=x calibrates the stored experts
    assert compare(out.output, ref, LAYER_TOLERANCE[("int8", "int8")]) is None
    text = (tmp_path / "s" / "colibri_weights.c").read_text()
    assert "s_e0_w1" in text and "s_e1_w1" not in text and "(also used by experts 1, 2, 3)" in text


# -- accuracy report and the CLI ---------------------------------------------------------------


def test_cli_generate_reports_accuracy_and_placement(tmp_path: Path) -> None:
    from colibri.frontends.seed import write_seed

    layer = make_toy(6, 32, 64, 2, "gelu", seed=2)
    write_seed(layer, tmp_path / "m")
    x = np.random.default_rng(1).standard_normal((50, 32)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    proc = run_cli(
        "generate",
        str(tmp_path / "m" / "model.bin"),
        "--out",
        str(tmp_path / "g"),
        "--quant",
        "int8",
        "--expert-quant",
        "3=int4,5=fp32",
        "--calib",
        str(tmp_path / "x.npy"),
    )
    assert "routing agreement 100.0%" in proc.stdout and "rel-RMS" in proc.stdout
    assert "calib hits" in proc.stdout
    man = json.loads((tmp_path / "g" / "manifest.json").read_text())
    schemes = [e["scheme"] for e in man["experts"]]
    assert schemes == ["int8", "int8", "int8", "int4", "int8", "fp32"]
    hits = [e["calib_hits"] for e in man["experts"]]
    assert sum(hits) == 50 * 2
    acc = man["accuracy"]["layers"][0]
    assert 0 < acc["rel_rms_error"] < 0.1 and acc["cosine"] > 0.99
    assert acc["routing_agreement"] == 1.0
    bad = run_cli(
        "generate", str(tmp_path / "m" / "model.bin"), "--out", str(tmp_path / "h"),
        "--expert-quant", "9=int4", check=False,
    )  # fmt: skip
    assert bad.returncode == 1 and "expert 9 does not exist" in bad.stderr


def test_accuracy_orders_schemes(tmp_path: Path) -> None:
    layer = make_toy(4, 64, 64, 2, "gelu", seed=9)
    errs = {}
    for scheme in SCHEMES:  # q4k / q5k have int8-activation kernels only
        act = "int8" if scheme in ("q4k", "q5k") else "fp32"
        _, man = render(layer, GenerateOptions(name="a", quant=scheme, act=act))
        errs[scheme] = man.get("accuracy", {"layers": [{"rel_rms_error": 0.0}]})["layers"][0]
    rel = [errs[s]["rel_rms_error"] for s in ("fp32", "fp16", "int8", "int4")]
    assert rel[0] == 0.0 and rel[1] < 1e-3 < rel[3] and rel[1] < rel[2] < rel[3] < 0.2, rel
    assert errs["q5k"]["rel_rms_error"] < errs["q4k"]["rel_rms_error"] < 0.2, errs


def test_quantised_lru_slots_fit_the_packed_experts() -> None:
    """Tiny dims make a quantised expert (parts at 16-byte offsets) larger than its fp32 form:
    the slots are sized for the largest packed expert, and the kernels read the slot."""
    layer = make_toy(4, 1, 1, 1, "gelu")
    files, man = render(
        layer, GenerateOptions(quant="int8", expert_quant="1=fp16", cache="lru", cache_slots=2)
    )
    slots = next(r for r in man["memory"]["regions"] if r["name"] == "slots")
    # per slot: int8 w1 struct (8 bytes) @0, b1 @16, w2 struct (8) @32, b2 @48 -> 52 -> 64 bytes
    assert "m->slot_floats = 16;" in files["colibri_model.c"]
    assert slots["size"] >= 2 * 64
    assert "(const void *)w->w1" in files["colibri_model.c"]


# -- the model that fits cortex-m4 only as int4 ---------------------------------------------------


def _m4_model():  # type: ignore[no-untyped-def]
    # 16 experts x (2 x 128 x 256): 4.2 MB fp32, 1.1 MB int8, 0.6 MB int4; 1 MB flash
    return make_toy(16, 128, 256, 2, "gelu", seed=11)


def test_fp32_over_budget_suggests_int4(tmp_path: Path) -> None:
    layer = _m4_model()
    for scheme in ("fp32", "int8"):
        with pytest.raises(BudgetExceeded, match=r"flash: .*\n.*\n  Quantised weights fit the "
                           r"flash: --quant int4 \(\d+ bytes"):  # fmt: skip
            generate(layer, tmp_path / "m4", GenerateOptions(board="cortex-m4", quant=scheme))
        assert not (tmp_path / "m4").exists()


def test_int4_fits_and_runs_on_cortex_m4(tmp_path: Path) -> None:
    require_board("cortex-m4")
    from colibri.targets.size import size_report

    layer = _m4_model()
    x = np.random.default_rng(4).standard_normal((6, 128)).astype(np.float32)
    opts = GenerateOptions(board="cortex-m4", name="m4", quant="int4", max_tokens=8)
    generate(layer, tmp_path / "m4", opts)
    out, _ = run_model(tmp_path / "m4", "cortex-m4", x)
    ref, rq = quant_moe_forward(layer, quantize_layer(layer, make_plan(16, "int4")), x)
    np.testing.assert_array_equal(out.expert_ids, rq.expert_ids)
    assert compare(out.output, ref, LAYER_TOLERANCE[("int4", "int8")]) is None
    rep = size_report(tmp_path / "m4", "cortex-m4")
    assert rep.flash_used <= rep.flash_size and len(rep.experts) == 16
    assert all(v["weights"] == 2 * 128 * 256 * 18 // 32 + 4 * (128 + 256)
               for v in rep.experts.values())  # fmt: skip
