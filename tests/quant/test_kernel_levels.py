"""Every kernel level of the host (x86-64: base, AVX2, AVX-VNNI, AVX-512 VNNI, chosen at run
time; runtime_c/arch/x86_64) against the numpy mirror, bit for bit: the matvecs and the
multi-token matmuls (row t of a matmul is the matvec of row t), including row ranges as threads
split them and n_in / n_out off the SIMD widths."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from colibri.quant.formats import (
    BLOCK_Q4_DTYPE,
    q8_blocks,
    quantize_fp16,
    quantize_int4_blocks,
    quantize_int8_per_channel,
    quantize_matrix,
)
from colibri.reference.f32 import linear_f32
from colibri.reference.kernels import (
    matvec_f16_f32,
    matvec_q4_f32,
    matvec_q4_q8,
    matvec_q8_f32,
    matvec_q8_q8,
    matvec_q8b_f32,
    matvec_q8b_q8,
    quantize_rows_q8,
)
from conftest import host_kernels

LEVELS = {"base": 0, "avx2": 1, "avxvnni": 2, "avx512vnni": 3}
SHAPES = [(1, 1), (7, 31), (9, 64), (17, 100), (24, 257)]
#: tokens per matmul (runtime_c/arch/x86_64): AVX2 runs tiles of 2..8 tokens (int4: 2..16; the
#: token loop four at a time, then one by one) and the matvec for one left: 9 = 8 + 1,
#: 17 = 8 + 8 + 1 (int4: 16 + 1); AVX-VNNI tiles of 4 and the matvec for the 1-3 left: 2 and 3
#: the matvec only, 7 = 4 + 3, 9 = 4 + 4 + 1;
#: AVX-512 VNNI tiles of 1..8 (test_int_matmuls_every_token_count below runs 1..34)
N_TOKS = [2, 3, 4, 5, 7, 8, 9, 17]


@pytest.fixture(scope="module")
def kq(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    lib = host_kernels(tmp_path_factory.mktemp("kq_levels"))
    lib.colibri_kernel_level_name.restype = ctypes.c_char_p
    return lib


def _p(a: np.ndarray, offset: int = 0) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data + offset)


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


@pytest.mark.parametrize("level", list(LEVELS))
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("n_tok", N_TOKS)
def test_levels_match_the_mirror(
    kq: ctypes.CDLL, level: str, shape: tuple[int, int], n_tok: int
) -> None:
    if kq.colibri_kernel_set_level(LEVELS[level]) != LEVELS[level]:
        pytest.skip(f"this CPU has no {level} (or the host is not x86-64)")
    assert kq.colibri_kernel_level_name(kq.colibri_kernel_level()).decode() == level
    n_out, n_in = shape
    rng = np.random.default_rng(n_out * 7919 + n_in * 31 + n_tok)
    w = rng.standard_normal((n_out, n_in)).astype(np.float32)
    x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
    xq, sx = quantize_rows_q8(x)
    xq, sx = np.ascontiguousarray(xq), np.ascontiguousarray(sx)
    bias = rng.standard_normal(n_out).astype(np.float32)
    w16 = np.ascontiguousarray(quantize_fp16(w))
    q, s = quantize_int8_per_channel(w)
    qb = quantize_matrix(w, "int8", blocks=True)
    assert qb.scale is not None
    sb = np.ascontiguousarray(qb.scale)
    q4 = np.ascontiguousarray(quantize_int4_blocks(w))
    nb = q8_blocks(n_in)
    # (name, mirror [T, n_out], matvec(x row t, y), matmul(y, ldy, o0, o1))
    cases = [
        (
            "f32",
            linear_f32(x, w, bias),
            None,
            lambda y, ldy, o0, o1: kq.colibri_matmul_f32(
                _p(w, o0 * n_in * 4),
                _p(bias, o0 * 4),
                _p(x),
                _p(y, o0 * 4),
                ldy,
                o1 - o0,
                n_in,
                n_tok,
            ),
        ),
        (
            "f16 x f32",
            matvec_f16_f32(w16, x),
            lambda t, y: kq.colibri_matvec_f16_f32(
                _p(w16), _p(x, t * n_in * 4), _p(y), n_out, n_in
            ),
            lambda y, ldy, o0, o1: kq.colibri_matmul_f16_f32(
                _p(w16, o0 * n_in * 2), _p(x), _p(y, o0 * 4), ldy, o1 - o0, n_in, n_tok
            ),
        ),
        (
            "q8 x f32",
            matvec_q8_f32(q, s, x),
            None,
            lambda y, ldy, o0, o1: kq.colibri_matmul_q8_f32(
                _p(q, o0 * n_in), _p(s, o0 * 4), _p(x), _p(y, o0 * 4), ldy, o1 - o0, n_in, n_tok
            ),
        ),
        (
            "q8b x f32",
            matvec_q8b_f32(qb.data, sb, x),
            None,
            lambda y, ldy, o0, o1: kq.colibri_matmul_q8b_f32(
                _p(qb.data, o0 * n_in),
                _p(sb, o0 * nb * 4),
                _p(x),
                _p(y, o0 * 4),
                ldy,
                o1 - o0,
                n_in,
                n_tok,
            ),
        ),
        (
            "q4 x f32",
            matvec_q4_f32(q4, x, n_in),
            None,
            lambda y, ldy, o0, o1: kq.colibri_matmul_q4_f32(
                _p(q4, o0 * nb * 18), _p(x), _p(y, o0 * 4), ldy, o1 - o0, n_in, n_tok
            ),
        ),
        (
            "q8 x q8",
            matvec_q8_q8(q, s, xq, sx),
            lambda t, y: kq.colibri_matvec_q8_q8(
                _p(q), _p(s), _p(xq, t * n_in), _p(sx, t * nb * 4), _p(y), n_out, n_in
            ),
            lambda y, ldy, o0, o1: kq.colibri_matmul_q8_q8(
                _p(q, o0 * n_in),
                _p(s, o0 * 4),
                _p(xq),
                _p(sx),
                _p(y, o0 * 4),
                ldy,
                o1 - o0,
                n_in,
                n_tok,
            ),
        ),
        (
            "q8b x q8",
            matvec_q8b_q8(qb.data, sb, xq, sx),
            lambda t, y: kq.colibri_matvec_q8b_q8(
                _p(qb.data), _p(sb), _p(xq, t * n_in), _p(sx, t * nb * 4), _p(y), n_out, n_in
            ),
            lambda y, ldy, o0, o1: kq.colibri_matmul_q8b_q8(
                _p(qb.data, o0 * n_in),
                _p(sb, o0 * nb * 4),
                _p(xq),
                _p(sx),
                _p(y, o0 * 4),
                ldy,
                o1 - o0,
                n_in,
                n_tok,
            ),
        ),
        (
            "q4 x q8",
            matvec_q4_q8(q4, xq, sx, n_in),
            lambda t, y: kq.colibri_matvec_q4_q8(
                _p(q4), _p(xq, t * n_in), _p(sx, t * nb * 4), _p(y), n_out, n_in
            ),
            lambda y, ldy, o0, o1: kq.colibri_matmul_q4_q8(
                _p(q4, o0 * nb * 18), _p(xq), _p(sx), _p(y, o0 * 4), ldy, o1 - o0, n_in, n_tok
            ),
        ),
    ]
    ldy = n_out + 3
    split = n_out // 2 + 1 if n_out > 1 else n_out  # two row ranges, as two threads take them
    for name, want, matvec, matmul in cases:
        if matvec is not None:
            for t in range(n_tok):
                y = np.full(n_out, np.nan, np.float32)
                matvec(t, y)
                _same_bits(y, want[t], f"{level} matvec {name} row {t}")
        y = np.full((n_tok, ldy), -7.0, np.float32)
        matmul(y, ldy, 0, split)
        if split < n_out:
            matmul(y, ldy, split, n_out)
        _same_bits(y[:, :n_out], want, f"{level} matmul {name}")
        assert (y[:, n_out:] == -7.0).all(), f"{level} matmul {name} wrote beyond n_out"
    kq.colibri_kernel_set_level(3)


#: shapes for the int8 / int4 x int8 matvecs of the AVX-512 VNNI level (two int8 blocks or four
#: int4 blocks a step, groups of eight rows, the last group overlapping when n_out % 8 != 0, the
#: 256-bit matvec below eight rows): n_out < 8, 8, odd, < 16; n_in a partial block, one block,
#: odd block counts, not a multiple of 64 / 128, and past the prepared chunk (64 steps: int8 4096
#: inputs, int4 8192)
Z_SHAPES = [
    (3, 100),
    (7, 64),
    (8, 32),
    (8, 1),
    (9, 63),
    (11, 96),
    (15, 130),
    (16, 160),
    (17, 1000),
    (24, 1024),
    (13, 4130),
    (9, 8300),
]


@pytest.mark.parametrize("level", list(LEVELS))
@pytest.mark.parametrize("shape", Z_SHAPES)
def test_int_matvecs_extreme_codes(kq: ctypes.CDLL, level: str, shape: tuple[int, int]) -> None:
    """Random codes over the whole int8 range (-128 and 127 included, weights and activations)
    and random nibbles (past n_in too), random scales of both signs: every level's q8 x q8,
    q8b x q8 and q4 x q8 matvec (and a matmul of five tokens: a tile and one matvec) against the
    mirror, bit for bit."""
    if kq.colibri_kernel_set_level(LEVELS[level]) != LEVELS[level]:
        pytest.skip(f"this CPU has no {level} (or the host is not x86-64)")
    n_out, n_in = shape
    n_tok = 5
    rng = np.random.default_rng(n_out * 131 + n_in)
    nb = q8_blocks(n_in)
    q = rng.integers(-128, 128, (n_out, n_in), dtype=np.int8)
    q[0, :] = -128
    q[-1, ::2] = 127
    xq = rng.integers(-128, 128, (n_tok, n_in), dtype=np.int8)
    xq[0, :] = -128
    xq[1, ::3] = 127
    sx = rng.standard_normal((n_tok, nb)).astype(np.float32)
    s = rng.standard_normal(n_out).astype(np.float32)
    sb = rng.standard_normal((n_out, nb)).astype(np.float32)
    q4 = np.zeros((n_out, nb), dtype=BLOCK_Q4_DTYPE)
    q4["qs"] = rng.integers(0, 256, (n_out, nb, 16), dtype=np.uint8)
    q4["d"] = rng.standard_normal((n_out, nb)).astype(np.float16).view(np.uint16)
    q4[0]["qs"] = 0xF0  # nibbles 0 and 15
    cases = [
        (
            "q8 x q8",
            matvec_q8_q8(q, s, xq, sx),
            lambda t, y: kq.colibri_matvec_q8_q8(
                _p(q), _p(s), _p(xq, t * n_in), _p(sx, t * nb * 4), _p(y), n_out, n_in
            ),
            lambda y: kq.colibri_matmul_q8_q8(
                _p(q), _p(s), _p(xq), _p(sx), _p(y), n_out, n_out, n_in, n_tok
            ),
        ),
        (
            "q8b x q8",
            matvec_q8b_q8(q, sb, xq, sx),
            lambda t, y: kq.colibri_matvec_q8b_q8(
                _p(q), _p(sb), _p(xq, t * n_in), _p(sx, t * nb * 4), _p(y), n_out, n_in
            ),
            lambda y: kq.colibri_matmul_q8b_q8(
                _p(q), _p(sb), _p(xq), _p(sx), _p(y), n_out, n_out, n_in, n_tok
            ),
        ),
        (
            "q4 x q8",
            matvec_q4_q8(q4, xq, sx, n_in),
            lambda t, y: kq.colibri_matvec_q4_q8(
                _p(q4), _p(xq, t * n_in), _p(sx, t * nb * 4), _p(y), n_out, n_in
            ),
            lambda y: kq.colibri_matmul_q4_q8(
                _p(q4), _p(xq), _p(sx), _p(y), n_out, n_out, n_in, n_tok
            ),
        ),
    ]
    for name, want, matvec, matmul in cases:
        for t in range(n_tok):
            y = np.full(n_out, np.nan, np.float32)
            matvec(t, y)
            _same_bits(y, want[t], f"{level} matvec {name} row {t}")
        y = np.full((n_tok, n_out), np.nan, np.float32)
        matmul(y)
        _same_bits(y, want, f"{level} matmul {name}")
    kq.colibri_kernel_set_level(3)


def _int_mats(
    rng: np.random.Generator, w: np.ndarray, xq: np.ndarray, sx: np.ndarray, extremes: bool
) -> tuple[np.ndarray, ...]:
    """w quantised three ways (int8 per row: q, s; int8 per block: qbd, sb; int4: q4) and the
    activation rows; extremes: int8 weights and codes all -128 / 127, int4 nibbles 0 / 15."""
    q, s = quantize_int8_per_channel(w)
    qb = quantize_matrix(w, "int8", blocks=True)
    assert qb.scale is not None
    qbd, sb = np.ascontiguousarray(qb.data), np.ascontiguousarray(qb.scale)
    q4 = np.ascontiguousarray(quantize_int4_blocks(w))
    if extremes:
        xq = rng.choice(np.array([-128, 127], np.int8), size=xq.shape)
        q = rng.choice(np.array([-128, 127], np.int8), size=q.shape)
        qbd = rng.choice(np.array([-128, 127], np.int8), size=qbd.shape)
        q4["qs"] = rng.choice(np.array([0x00, 0xFF, 0x0F, 0xF0], np.uint8), size=q4["qs"].shape)
    return q, s, qbd, sb, q4, np.ascontiguousarray(xq), np.ascontiguousarray(sx)


#: multi-token int kernels (the AVX-512 VNNI level: sixteen rows per register, weights repacked
#: 32 blocks at a time, token tiles of 1..8): n_out below, at and off 16 (the masked last group),
#: n_in with a partial last block and more than one range of 32 blocks
INT_SHAPES = [(5, 40), (16, 32), (33, 1100), (19, 2090)]


@pytest.mark.parametrize("level", list(LEVELS))
@pytest.mark.parametrize("shape", INT_SHAPES)
@pytest.mark.parametrize("extremes", [False, True])
def test_int_matmuls_every_token_count(
    kq: ctypes.CDLL, level: str, shape: tuple[int, int], extremes: bool
) -> None:
    """colibri_matmul_q8_q8 / q8b_q8 / q4_q8 for 1..34 tokens, bit for bit with the mirror;
    extremes: int8 weights and codes all -128 / 127, int4 nibbles 0 / 15."""
    if kq.colibri_kernel_set_level(LEVELS[level]) != LEVELS[level]:
        pytest.skip(f"this CPU has no {level} (or the host is not x86-64)")
    n_out, n_in = shape
    n_max = 34  # the AVX2 int4 tiles of 16: 17 = 16 + 1, 33 = 16 + 16 + 1, 34 = 16 + 16 + 2
    rng = np.random.default_rng(n_out * 131 + n_in + int(extremes))
    w = rng.standard_normal((n_out, n_in)).astype(np.float32)
    x = rng.standard_normal((n_max, n_in)).astype(np.float32)
    xq, sx = quantize_rows_q8(x)
    q, s, qbd, sb, q4, xq, sx = _int_mats(rng, w, xq, sx, extremes)
    ldy = n_out + 3
    for n_tok in range(1, n_max + 1):
        cases = [
            ("q8 x q8", matvec_q8_q8(q, s, xq[:n_tok], sx[:n_tok]), kq.colibri_matmul_q8_q8,
             (_p(q), _p(s))),
            ("q8b x q8", matvec_q8b_q8(qbd, sb, xq[:n_tok], sx[:n_tok]),
             kq.colibri_matmul_q8b_q8, (_p(qbd), _p(sb))),
            ("q4 x q8", matvec_q4_q8(q4, xq[:n_tok], sx[:n_tok], n_in), kq.colibri_matmul_q4_q8,
             (_p(q4),)),
        ]  # fmt: skip
        for name, want, fn, wargs in cases:
            y = np.full((n_tok, ldy), -7.0, np.float32)
            fn(*wargs, _p(xq), _p(sx), _p(y), ldy, n_out, n_in, n_tok)
            _same_bits(y[:, :n_out], want, f"{level} matmul {name} n_tok {n_tok}")
            assert (y[:, n_out:] == -7.0).all(), f"{level} matmul {name} wrote beyond n_out"
    kq.colibri_kernel_set_level(3)


#: packed matrices (colibri_x86_pack, the AVX-512 VNNI level): n_out at and off 16 (a masked
#: last group), n_in one block, a few (odd: a half-used int4 pair), and more than one batch of
#: corrections for 64 tokens
PACKED_SHAPES = [(16, 32), (17, 96), (45, 160), (100, 1024), (33, 8192), (20, 2848)]
PACK_KINDS = {"q8 x q8": 0, "q8b x q8": 1, "q4 x q8": 2}


@pytest.mark.parametrize("shape", PACKED_SHAPES)
@pytest.mark.parametrize("extremes", [False, True])
def test_packed_matrices_match_the_mirror(
    kq: ctypes.CDLL, shape: tuple[int, int], extremes: bool
) -> None:
    """The packed layout whole models use on AVX-512 VNNI (lm_pack.c packs every int8 / int4
    matrix with int8 activations at init): packed once, then 1..9 and 64 tokens, the rows
    split at every multiple of 16 as the threads split them (two calls), bit for bit with the
    mirror; extremes: int8 weights and codes all -128 / 127, int4 nibbles 0 / 15."""
    kq.colibri_x86_packed_bytes.restype = ctypes.c_size_t
    if kq.colibri_kernel_set_level(LEVELS["avx512vnni"]) != LEVELS["avx512vnni"]:
        assert kq.colibri_x86_packed_bytes(0, 16, 32) == 0, "packed kernels below AVX-512 VNNI"
        pytest.skip("this CPU has no avx512vnni (or the host is not x86-64): nothing is packed")
    n_out, n_in = shape
    nb = q8_blocks(n_in)
    rng = np.random.default_rng(n_out * 17 + n_in + int(extremes))
    w = rng.standard_normal((n_out, n_in)).astype(np.float32)
    xq, sx = quantize_rows_q8(rng.standard_normal((64, n_in)).astype(np.float32))
    q, s, qbd, sb, q4, xq, sx = _int_mats(rng, w, xq, sx, extremes)
    mats = {"q8 x q8": (q, s), "q8b x q8": (qbd, sb), "q4 x q8": (q4, s)}
    ldy = n_out + 5
    for name, kind in PACK_KINDS.items():
        wq, sc = mats[name]
        size = kq.colibri_x86_packed_bytes(kind, n_out, n_in)
        # 64-byte registers per group of 16 rows: int8 8 a block (+ 1 of block scales), int4 9
        # a pair of blocks (two blocks' nibbles, their fp16 d)
        regs = {0: 8 * nb, 1: 9 * nb, 2: 9 * ((nb + 1) // 2)}[kind]
        assert size == (n_out + 15) // 16 * regs * 64, name
        raw = np.zeros(size + 64, np.uint8)
        packed = raw[(-raw.ctypes.data) % 64 :][:size]  # 64-byte aligned
        kq.colibri_x86_pack(kind, _p(wq), _p(sc), n_out, n_in, _p(packed))
        for n_tok in [*range(1, 10), 64]:
            if name == "q8 x q8":
                want = matvec_q8_q8(q, s, xq[:n_tok], sx[:n_tok])
            elif name == "q8b x q8":
                want = matvec_q8b_q8(qbd, sb, xq[:n_tok], sx[:n_tok])
            else:
                want = matvec_q4_q8(q4, xq[:n_tok], sx[:n_tok], n_in)
            for split in range(0, n_out, 16):
                y = np.full((n_tok, ldy), np.nan, np.float32)
                for r0, r1 in ((0, split), (split, n_out)):
                    kq.colibri_x86_matmul_packed(
                        kind,
                        _p(packed),
                        _p(s, 4 * r0),
                        n_out,
                        n_in,
                        r0,
                        r1,
                        _p(xq),
                        _p(sx),
                        _p(y, 4 * r0),
                        ldy,
                        n_tok,
                    )
                _same_bits(y[:, :n_out], want, f"packed {name} {n_tok} tokens, split {split}")
                assert np.isnan(y[:, n_out:]).all(), f"packed {name}: wrote past n_out"
    assert kq.colibri_x86_packed_bytes(0, 15, 32) == 0  # fewer than 16 rows: not packed
    assert kq.colibri_x86_packed_bytes(0, 16, 40) == 0  # a partial block: not packed


@pytest.mark.parametrize("level", list(LEVELS))
def test_elementwise_match_the_base(kq: ctypes.CDLL, level: str) -> None:
    """colibri_silu_mul_f32 (SwiGLU's mix, colibri_expf inside), colibri_exp_shift_f32 (the
    attention's softmax numerators) and colibri_axpy_f32: every level the same bits as the base
    level's scalar code, over lengths off the SIMD width and inputs across colibri_expf's
    branches (below -87, above ln FLT_MAX, where 2^n overflows, infinities, NaN)."""
    kq.colibri_axpy_f32.argtypes = [
        ctypes.c_void_p,
        ctypes.c_float,
        ctypes.c_void_p,
        ctypes.c_int32,
    ]
    kq.colibri_silu_mul_f32.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    kq.colibri_exp_shift_f32.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_float]
    rng = np.random.default_rng(5)
    edges = np.array(
        [0.0, -0.0, 87.0, -87.0, 87.5, -88.72, -88.73, -88.7228394, 88.7228394, 200.0, -200.0,
         1e-30, -1e-30, np.inf, -np.inf, np.nan, 3.4e38, -3.4e38, 1.0, -1.0],
        np.float32,
    )  # fmt: skip
    for n in (1, 7, 8, 9, 64, 1000, 2816):
        h0 = (rng.standard_normal(n) * rng.choice([1.0, 10.0, 100.0], n)).astype(np.float32)
        h0[: min(n, edges.size)] = edges[: min(n, edges.size)]
        g = rng.standard_normal(n).astype(np.float32)
        x = rng.standard_normal(n).astype(np.float32)
        y0 = rng.standard_normal(n).astype(np.float32)
        out = {}
        for lv in ("base", level):
            if kq.colibri_kernel_set_level(LEVELS[lv]) != LEVELS[lv]:
                pytest.skip(f"this CPU has no {lv} (or the host is not x86-64)")
            h, y = h0.copy(), y0.copy()
            kq.colibri_silu_mul_f32(_p(h), _p(g), n)
            kq.colibri_axpy_f32(_p(y), 0.37, _p(x), n)
            e = [h0.copy() for _ in range(3)]
            for ej, m in zip(e, (0.0, 1.5, -3.0), strict=True):  # x - m across the branches
                kq.colibri_exp_shift_f32(_p(ej), n, m)
            out[lv] = (h, y, *e)
        _same_bits(out[level][0], out["base"][0], f"{level} silu_mul n={n}")
        _same_bits(out[level][1], out["base"][1], f"{level} axpy n={n}")
        for j in range(2, 5):
            _same_bits(out[level][j], out["base"][j], f"{level} exp_shift n={n} case {j}")
    kq.colibri_kernel_set_level(3)


@pytest.mark.parametrize("level", list(LEVELS))
def test_quantize_row_matches_the_mirror(kq: ctypes.CDLL, level: str) -> None:
    """colibri_quantize_row_q8 (every matrix's input; AVX-512 blocks at that level): the codes
    and block scales of the numpy mirror (quantize_rows_q8) at every level, over lengths with a
    partial last block, blocks of zeros, of values below 2^-100 and near 2^-120, with an
    infinity or a NaN, of huge values and of exact half-way codes."""
    kq.colibri_quantize_row_q8.argtypes = [
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int32,
    ]
    if kq.colibri_kernel_set_level(LEVELS[level]) != LEVELS[level]:
        pytest.skip(f"this CPU has no {level} (or the host is not x86-64)")
    rng = np.random.default_rng(23)
    for n in (1, 31, 32, 33, 100, 320, 1024, 2816):
        x = (rng.standard_normal(n) * rng.choice([1e-3, 1.0, 1e3], n)).astype(np.float32)
        if n >= 320:
            x[0:32] = 0.0
            x[32:64] = rng.standard_normal(32).astype(np.float32) * np.float32(1e-31)
            x[64:96] = rng.standard_normal(32).astype(np.float32) * np.float32(2e-36)
            x[100], x[140], x[170] = np.inf, np.nan, -np.inf
            x[192:224] = rng.choice([-3e38, 3e38, 1.0], 32).astype(np.float32)
            x[224:256] = (np.arange(32, dtype=np.float32) - 16.0) * np.float32(0.5)  # x.5 codes
            x[256] = np.float32(127.0)
        nb = (n + 31) // 32
        xq = np.zeros(n, np.int8)
        sx = np.zeros(nb, np.float32)
        kq.colibri_quantize_row_q8(_p(x), _p(xq), _p(sx), n)
        with np.errstate(all="ignore"):
            eq, es = quantize_rows_q8(x[None, :])
        assert np.array_equal(xq, np.asarray(eq).reshape(-1)[:n]), (level, n)
        _same_bits(sx, np.asarray(es, np.float32).reshape(-1)[:nb], f"{level} sx n={n}")
    kq.colibri_kernel_set_level(3)


@pytest.mark.parametrize("level", list(LEVELS))
def test_wsum_matches_the_base(kq: ctypes.CDLL, level: str) -> None:
    """colibri_wsum_f32 (the attention's weighted sum of value rows, its sums held in registers
    on x86): every level the same bits as the base level's row-by-row code and as one
    numpy's float32 steps row by row (a = w[t] / sum, out + a * v), over widths off 8 and 64
    (tails), 1..70 rows, a row stride wider than the width, and weights with zeros, tiny and
    huge values and a NaN."""
    f32p, i32, sz = ctypes.c_void_p, ctypes.c_int32, ctypes.c_size_t
    kq.colibri_wsum_f32.argtypes = [f32p, f32p, ctypes.c_float, f32p, sz, i32, i32]
    rng = np.random.default_rng(17)
    for d, n in ((1, 1), (7, 3), (8, 70), (9, 5), (63, 9), (64, 33), (65, 2), (128, 64), (200, 17)):
        stride = d + 3
        v = rng.standard_normal(n * stride).astype(np.float32)
        w = np.exp(rng.standard_normal(n)).astype(np.float32)
        w[0] = 0.0
        if n > 3:
            w[1], w[2], w[3] = 1e-30, 3e30, np.nan if d == 63 else 2.0
        total = np.float32(w[np.isfinite(w)].sum())
        ref = np.zeros(d, np.float32)
        with np.errstate(all="ignore"):
            for t in range(n):
                ref = ref + (w[t] / total) * v[t * stride : t * stride + d]
        out = {}
        for lv in ("base", level):
            if kq.colibri_kernel_set_level(LEVELS[lv]) != LEVELS[lv]:
                pytest.skip(f"this CPU has no {lv} (or the host is not x86-64)")
            o = np.full(d, 7.0, np.float32)  # overwritten, never added to
            kq.colibri_wsum_f32(_p(o), _p(w), total, _p(v), stride, n, d)
            out[lv] = o
        _same_bits(out["base"], ref, f"base wsum d={d} n={n}")
        _same_bits(out[level], out["base"], f"{level} wsum d={d} n={n}")
    kq.colibri_kernel_set_level(3)


@pytest.mark.parametrize("level", list(LEVELS))
def test_argmax_matches_the_base(kq: ctypes.CDLL, level: str) -> None:
    """colibri_argmax_f32 (greedy sampling): the first index of the largest value at every
    level, ties and +-0 included, lengths off 8, and -1 for NaN or an infinity anywhere
    (the SIMD body or the scalar tail)."""
    if kq.colibri_kernel_set_level(LEVELS[level]) != LEVELS[level]:
        pytest.skip(f"this CPU has no {level} (or the host is not x86-64)")
    kq.colibri_argmax_f32.restype = ctypes.c_int32
    rng = np.random.default_rng(11)
    for n in (1, 5, 8, 9, 17, 1000, 32000):
        x = rng.standard_normal(n).astype(np.float32)
        assert kq.colibri_argmax_f32(_p(x), n) == int(np.argmax(x)), n
        x[:] = np.round(x)  # many ties: the first wins
        assert kq.colibri_argmax_f32(_p(x), n) == int(np.argmax(x)), n
        for bad in (np.nan, np.inf, -np.inf):
            for at in {0, n // 2, n - 1}:
                y = x.copy()
                y[at] = bad
                assert kq.colibri_argmax_f32(_p(y), n) == -1, (n, bad, at)
    z = np.array([-1.0, -0.0, 0.0, -0.0], np.float32)
    assert kq.colibri_argmax_f32(_p(z), 4) == 1
    kq.colibri_kernel_set_level(3)
