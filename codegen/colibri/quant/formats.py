"""Quantise expert weights, and the numpy mirror of the quantised C kernels.

Schemes (one per expert, chosen per model and overridable per expert):

- ``fp32``: the seed layout, unchanged (the existing float path).
- ``fp16``: IEEE binary16 storage, computed in fp32.
- ``int8``: symmetric, one fp32 scale per output channel, q in -127..127.
- ``int4``: blocks of 32 weights along the input dimension with one fp16 scale per block
  (18 bytes per block, 4.5 bits per weight: ggml's q4_0 layout), w = d * (nibble - 8).

Quantised tensors are stored output-channel-major (``w.T`` of the seed layout) so every
output is a dot product over contiguous memory. Activations stay fp32 (``act="fp32"``) or are
quantised to int8 at run time, one scale per block of QK8 = 32 values (``act="int8"``, integer
dot products per block).

The formats are defined once in C (runtime_c/include/colibri_quant.h) and mirrored here as
numpy dtypes (:data:`BLOCK_Q4_DTYPE`); tests/test_quant.py reads the C sizes and offsets
back from a compiled object. The kernels below mirror the C kernels' arithmetic *in the same
fp32 order* (there is no FMA on any board: -ffp-contract=off), so integer accumulators and
matvec outputs are bit-identical; C's ``roundf`` (half away from zero) is mirrored by
:func:`round_half_away`, not ``np.round`` (half to even).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError, ModelFormatError
from ..ir.moe import Expert, MoELayer

#: Weight schemes, in colibri_quant_scheme order.
SCHEMES: tuple[str, ...] = ("fp32", "fp16", "int8", "int4")
#: Activation modes of the quantised kernels.
ACT_MODES: tuple[str, ...] = ("fp32", "int8")
#: Default activation mode per scheme: integer dot products for integer weights.
DEFAULT_ACT: dict[str, str] = {"fp32": "fp32", "fp16": "fp32", "int8": "int8", "int4": "int8"}

QK4 = 32  # COLIBRI_QK4
QK8 = 32  # COLIBRI_QK8: activations per scale of the int8 activation quantiser
Q8_MAX = 127  # COLIBRI_Q8_MAX
FP16_MAX = 65504.0

#: numpy mirror of colibri_block_q4_32 (C struct: uint16_t d; uint8_t qs[16]; 18 bytes).
BLOCK_Q4_DTYPE = np.dtype([("d", "<u2"), ("qs", "u1", (QK4 // 2,))])


def q8_channel_dtype(n_out: int, n_in: int) -> np.dtype:
    """numpy mirror of the generated int8 tensor struct (one per shape, colibri_weights.h):
    ``struct { float scale[n_out]; int8_t q[n_out * n_in]; }``, C padding included (the
    generated header _Static_asserts that sizeof matches this itemsize)."""
    return np.dtype([("scale", "<f4", (n_out,)), ("q", "i1", (n_out * n_in,))], align=True)


#: Bits of storage per weight (scales included, int8's per-channel scale excluded).
BITS_PER_WEIGHT: dict[str, float] = {"fp32": 32.0, "fp16": 16.0, "int8": 8.0, "int4": 4.5}

# -- error bounds, named in one place ---------------------------------------------------------

#: fp16 round trip: relative error <= 2^-11 (half an ulp) for normal values; absolute error
#: <= 2^-25 (half the smallest subnormal step) below the normal range.
FP16_REL_BOUND = 2.0**-11
FP16_ABS_BOUND = 2.0**-25
#: int8 / int4 round trip: |w - deq(q(w))| <= QUANT_STEP_FRACTION * step (step = the channel's
#: or the block's scale), plus one fp32 ulp of the value for the division/multiplication.
QUANT_STEP_FRACTION = 0.5

#: Whole-layer tolerance of C vs the quantised reference (relative to max|ref|, as
#: reference.compare). The matvecs are bit-exact; what differs is libm's erff/expf/tanhf vs
#: numpy (1-2 ulp). With fp32 activations that stays at fp32 size; with int8 activations an
#: ulp can move a hidden value across a rounding boundary, flipping one int8 code: one step
#: of the hidden scale times a weight, ~1e-3 of max|y| at worst for the shapes tested.
LAYER_TOLERANCE: dict[tuple[str, str], float] = {
    ("fp32", "fp32"): 2e-5,
    ("fp16", "fp32"): 2e-5,
    ("int8", "fp32"): 2e-5,
    ("int4", "fp32"): 2e-5,
    ("fp16", "int8"): 5e-3,
    ("int8", "int8"): 5e-3,
    ("int4", "int8"): 5e-3,
}


def round_half_away(x: np.ndarray) -> np.ndarray:
    """C ``roundf``: round half away from zero. Done in float64, where |x| + 0.5 is exact for
    every float32 x (in float32 it would round 0.49999997 + 0.5 up to 1)."""
    x64 = np.asarray(x, dtype=np.float64)
    return np.sign(x64) * np.floor(np.abs(x64) + 0.5)


def check_scheme(scheme: str, what: str = "--quant") -> str:
    s = scheme.lower()
    if s not in SCHEMES:
        raise ConfigError(f"{what}: unknown scheme '{scheme}'; supported: {', '.join(SCHEMES)}")
    return s


# -- fp16 -------------------------------------------------------------------------------------


def quantize_fp16(w: np.ndarray, name: str = "tensor") -> np.ndarray:
    """IEEE binary16 bits (uint16) of w (round to nearest even, numpy's float16 cast)."""
    w = np.asarray(w, dtype=np.float32)
    big = np.abs(w) > FP16_MAX
    if big.any():
        raise ModelFormatError(
            f"{name}: {int(big.sum())} values exceed the fp16 range (|w| <= {FP16_MAX}), "
            f"largest {float(np.abs(w).max()):.6g}; use --quant int8 or fp32 for this expert"
        )
    return w.astype(np.float16).view(np.uint16)


def f16_to_f32(bits: np.ndarray) -> np.ndarray:
    """colibri_f16_to_f32: exact."""
    return np.asarray(bits, dtype=np.uint16).view(np.float16).astype(np.float32)


# -- int8, per output channel ------------------------------------------------------------------


def quantize_int8_per_channel(w_t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """w_t [out, in] -> (q int8 [out, in], scale float32 [out]); q = roundf(w / s), s = max|w|
    / 127 per row (rows of zeros get s = 0 and q = 0)."""
    w_t = np.asarray(w_t, dtype=np.float32)
    amax = np.max(np.abs(w_t), axis=1) if w_t.shape[1] else np.zeros(w_t.shape[0], np.float32)
    scale = (amax / np.float32(Q8_MAX)).astype(np.float32)
    safe = np.where(scale == 0, np.float32(1), scale).astype(np.float32)
    q = round_half_away((w_t / safe[:, None]).astype(np.float32))
    q = np.clip(q, -Q8_MAX, Q8_MAX).astype(np.int8)
    return q, scale


def dequantize_int8(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return (q.astype(np.float32) * scale[:, None]).astype(np.float32)


# -- int4, blocks of 32 along the input --------------------------------------------------------


def q8_blocks(n: int) -> int:
    """COLIBRI_Q8_BLOCKS: scales of a quantised activation row of n values."""
    return (n + QK8 - 1) // QK8


def q4_blocks(n_in: int) -> int:
    """COLIBRI_Q4_BLOCKS: blocks per row (the last one zero-padded)."""
    return (n_in + QK4 - 1) // QK4


def quantize_int4_blocks(w_t: np.ndarray) -> np.ndarray:
    """w_t [out, in] -> BLOCK_Q4_DTYPE [out, blocks]: d = fp16(max|w| / 7) per block, value =
    clamp(roundf(w / d), -8, 7), stored as nibble value + 8."""
    w_t = np.asarray(w_t, dtype=np.float32)
    n_out, n_in = w_t.shape
    nb = q4_blocks(n_in)
    padded = np.zeros((n_out, nb * QK4), dtype=np.float32)
    padded[:, :n_in] = w_t
    blocks = padded.reshape(n_out, nb, QK4)
    amax = np.max(np.abs(blocks), axis=2)
    d16 = (amax / np.float32(7)).astype(np.float32).astype(np.float16)
    # fp16 may round the scale down far enough (subnormal scales, or to 0) that the largest
    # weight would round past 7 and clamp: take the next fp16 up, which always suffices.
    d = d16.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = (amax / np.where(d == 0, np.float32(1), d)).astype(np.float32)
    low = (amax > 0) & ((d == 0) | (ratio >= np.float32(7.5)))
    d16 = np.where(low, np.nextafter(d16, np.float16(np.inf)), d16).astype(np.float16)
    d = d16.astype(np.float32)
    safe = np.where(d == 0, np.float32(1), d).astype(np.float32)
    v = round_half_away((blocks / safe[:, :, None]).astype(np.float32))
    v = np.where(d[:, :, None] == 0, 0, v)
    nib = (np.clip(v, -8, 7) + 8).astype(np.uint8)
    out = np.zeros((n_out, nb), dtype=BLOCK_Q4_DTYPE)
    out["d"] = d16.view(np.uint16)
    out["qs"] = nib[:, :, :16] | (nib[:, :, 16:] << 4)
    return out


def int4_values(blocks: np.ndarray, n_in: int) -> np.ndarray:
    """Signed values -8..7 [out, in] of BLOCK_Q4_DTYPE blocks [out, nb]."""
    qs = blocks["qs"]
    nib = np.concatenate([qs & 0x0F, qs >> 4], axis=2).astype(np.int32) - 8
    return nib.reshape(blocks.shape[0], -1)[:, :n_in]


def dequantize_int4(blocks: np.ndarray, n_in: int) -> np.ndarray:
    d = f16_to_f32(blocks["d"])
    vals = int4_values(blocks, blocks.shape[1] * QK4).astype(np.float32)
    vals = vals.reshape(blocks.shape[0], blocks.shape[1], QK4) * d[:, :, None]
    return vals.reshape(blocks.shape[0], -1)[:, :n_in].astype(np.float32)


# -- quantised tensors and experts --------------------------------------------------------------


@dataclass
class QuantTensor:
    """One weight matrix in a scheme, output-channel-major ``[n_out, n_in]``."""

    scheme: str
    n_out: int
    n_in: int
    data: np.ndarray  # fp32 [out,in] | uint16 [out,in] | int8 [out,in] | BLOCK_Q4 [out,nb]
    scale: np.ndarray | None = None  # int8: float32 [out]

    @property
    def nbytes(self) -> int:
        """Bytes as stored in the generated C (int8: the padded struct)."""
        if self.scheme == "int8":
            return q8_channel_dtype(self.n_out, self.n_in).itemsize
        return int(self.data.nbytes)

    def dequantize(self) -> np.ndarray:
        """float32 [out, in]."""
        if self.scheme == "fp32":
            return np.asarray(self.data, dtype=np.float32)
        if self.scheme == "fp16":
            return f16_to_f32(self.data)
        if self.scheme == "int8":
            assert self.scale is not None
            return dequantize_int8(self.data, self.scale)
        return dequantize_int4(self.data, self.n_in)

    def roundtrip_bound(self, w_t: np.ndarray) -> np.ndarray:
        """Per-element bound of |w - dequantize()| (the error bounds named above)."""
        w_t = np.asarray(w_t, dtype=np.float32)
        ulp = np.spacing(np.abs(w_t)).astype(np.float64)
        if self.scheme == "fp32":
            return np.zeros(w_t.shape)
        if self.scheme == "fp16":
            return np.maximum(FP16_REL_BOUND * np.abs(w_t), FP16_ABS_BOUND) + ulp
        if self.scheme == "int8":
            assert self.scale is not None
            step = self.scale.astype(np.float64)[:, None]
            return QUANT_STEP_FRACTION * step * (1 + 1e-6) + ulp
        d = f16_to_f32(self.data["d"]).astype(np.float64)
        step = np.repeat(d, QK4, axis=1)[:, : self.n_in]
        return QUANT_STEP_FRACTION * step * (1 + 1e-6) + ulp


def quantize_matrix(w_t: np.ndarray, scheme: str, name: str = "tensor") -> QuantTensor:
    """Quantise one [out, in] matrix."""
    w_t = np.ascontiguousarray(w_t, dtype=np.float32)
    n_out, n_in = w_t.shape
    if scheme == "fp32":
        return QuantTensor(scheme, n_out, n_in, w_t)
    if scheme == "fp16":
        return QuantTensor(scheme, n_out, n_in, quantize_fp16(w_t, name))
    if scheme == "int8":
        q, s = quantize_int8_per_channel(w_t)
        return QuantTensor(scheme, n_out, n_in, q, s)
    if scheme == "int4":
        return QuantTensor(scheme, n_out, n_in, quantize_int4_blocks(w_t))
    raise ConfigError(f"unknown scheme '{scheme}'; supported: {', '.join(SCHEMES)}")


@dataclass
class QuantExpert:
    """One expert in a scheme: w1/w3 are [d_ff, d_model], w2 is [d_model, d_ff] (transposed);
    biases stay fp32."""

    scheme: str
    act: str
    w1: QuantTensor
    w2: QuantTensor
    w3: QuantTensor | None
    b1: np.ndarray | None
    b2: np.ndarray | None

    def tensors(self) -> list[tuple[str, QuantTensor | np.ndarray]]:
        items: list[tuple[str, QuantTensor | np.ndarray | None]] = [
            ("w1", self.w1),
            ("b1", self.b1),
            ("w2", self.w2),
            ("b2", self.b2),
            ("w3", self.w3),
        ]
        return [(n, t) for n, t in items if t is not None]

    @property
    def nbytes(self) -> int:
        return sum(int(t.nbytes) for _, t in self.tensors())


def quantize_expert(e: Expert, scheme: str, act: str | None = None, name: str = "") -> QuantExpert:
    """Quantise one expert's matrices (transposed to output-major); biases stay fp32."""
    scheme = check_scheme(scheme)
    act = DEFAULT_ACT[scheme] if act is None else act
    if act not in ACT_MODES:
        raise ConfigError(f"--act: unknown mode '{act}'; supported: {', '.join(ACT_MODES)}")
    return QuantExpert(
        scheme=scheme,
        act=act,
        w1=quantize_matrix(e.w1.T, scheme, f"{name}.w1"),
        w2=quantize_matrix(e.w2.T, scheme, f"{name}.w2"),
        w3=quantize_matrix(e.w3.T, scheme, f"{name}.w3") if e.w3 is not None else None,
        b1=e.b1,
        b2=e.b2,
    )


def parse_expert_quant(spec: str | None, n_experts: int) -> dict[int, str]:
    """``3=int4,7=fp32`` -> {3: 'int4', 7: 'fp32'}."""
    out: dict[int, str] = {}
    if not spec:
        return out
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        idx, sep, scheme = item.partition("=")
        if not sep or not idx.strip().isdigit():
            raise ConfigError(
                f"--expert-quant: '{item}' is not EXPERT=SCHEME (e.g. --expert-quant 3=int4,7=fp32)"
            )
        i = int(idx)
        if not 0 <= i < n_experts:
            raise ConfigError(
                f"--expert-quant: expert {i} does not exist (the model has experts "
                f"0..{n_experts - 1})"
            )
        out[i] = check_scheme(scheme.strip(), "--expert-quant")
    return out


@dataclass
class QuantPlan:
    """Scheme and activation mode of every expert (by expert index)."""

    schemes: list[str]
    acts: list[str]

    def scheme_counts(self) -> dict[str, int]:
        return {s: self.schemes.count(s) for s in SCHEMES if s in self.schemes}

    @property
    def all_fp32(self) -> bool:
        return all(s == "fp32" for s in self.schemes)


def make_plan(
    n_experts: int, quant: str = "fp32", expert_quant: str | None = None, act: str | None = None
) -> QuantPlan:
    """Per-expert schemes from --quant / --expert-quant; act overrides the default mode."""
    base = check_scheme(quant)
    over = parse_expert_quant(expert_quant, n_experts)
    if act is not None and act not in ACT_MODES:
        raise ConfigError(f"--act: unknown mode '{act}'; supported: {', '.join(ACT_MODES)}")
    schemes = [over.get(i, base) for i in range(n_experts)]
    acts = [
        "fp32" if s in ("fp32", "fp16") else (act or DEFAULT_ACT[s]) for s in schemes
    ]  # fp16 has no integer kernel
    return QuantPlan(schemes, acts)


def quantize_layer(layer: MoELayer, plan: QuantPlan) -> dict[int, QuantExpert]:
    """Quantised form of every stored expert (keyed by the storing expert's index). A stored
    expert used by several experts takes the scheme of its own index."""
    out: dict[int, QuantExpert] = {}
    for idx in sorted(set(layer.storage_map())):
        out[idx] = quantize_expert(
            layer.experts[idx], plan.schemes[idx], plan.acts[idx], name=f"expert.{idx}"
        )
    return out


ROUTER_SCHEMES = ("fp32", "fp16", "int8")
#: colibri_model_t.router_scheme of each router scheme (colibri.h).
ROUTER_SCHEME_CODES = {"fp32": 0, "fp16": 1, "int8": 2}


@dataclass(frozen=True)
class QuantRouter:
    """The router's weights as stored (colibri_model_t router_scheme / router_wq / scale)."""

    scheme: str
    data: np.ndarray  # fp32 [E, d], fp16 bits uint16 [E, d] or int8 [E, d]
    scale: np.ndarray | None = None  # int8: float32 [E]

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes) + (int(self.scale.nbytes) if self.scale is not None else 0)

    def dequantized(self) -> np.ndarray:
        """The fp32 weights the C router multiplies by: exactly what it computes per element
        (fp16 -> fp32 is exact; int8: (float)q * scale[e] in fp32)."""
        if self.scheme == "fp16":
            return f16_to_f32(self.data)
        if self.scheme == "int8":
            assert self.scale is not None
            return dequantize_int8(self.data, self.scale)
        return np.asarray(self.data, dtype=np.float32)


def check_router_scheme(scheme: str) -> str:
    if scheme not in ROUTER_SCHEMES:
        raise ConfigError(
            f"--router-quant: unknown scheme '{scheme}'; supported: {', '.join(ROUTER_SCHEMES)}"
        )
    return scheme


def quantize_router(w: np.ndarray, scheme: str) -> QuantRouter:
    """Router weights [E, d] in `scheme` (int8: symmetric per expert row)."""
    check_router_scheme(scheme)
    w = np.asarray(w, dtype=np.float32)
    if scheme == "fp16":
        return QuantRouter("fp16", quantize_fp16(w, "router.weight"))
    if scheme == "int8":
        q, scale = quantize_int8_per_channel(w)
        return QuantRouter("int8", q, scale)
    return QuantRouter("fp32", w)


def expert_matrix_bytes(d_model: int, d_ff: int, gated: bool, scheme: str) -> int:
    """Stored bytes of one expert's matrices (w1, w3 when gated, w2; no biases) in `scheme`."""
    n_in_d = 2 if gated else 1  # matrices [d_ff, d_model] (w1, w3)
    if scheme == "int4":
        return (n_in_d * d_ff * q4_blocks(d_model) + d_model * q4_blocks(d_ff)) * (
            BLOCK_Q4_DTYPE.itemsize
        )
    width = {"fp32": 4, "fp16": 2, "int8": 1}[check_scheme(scheme)]
    if scheme == "int8":
        return (
            n_in_d * q8_channel_dtype(d_ff, d_model).itemsize
            + q8_channel_dtype(d_model, d_ff).itemsize
        )
    return (n_in_d + 1) * d_model * d_ff * width


def weight_bytes_for(layer: MoELayer, scheme: str) -> int:
    """Const weight bytes of the layer if every stored expert used `scheme` (router fp32)."""
    c = layer.config
    mats = expert_matrix_bytes(c.d_model, c.d_ff, c.gated, scheme)
    bias = 4 * (c.d_ff + c.d_model) if layer.experts[0].b1 is not None else 0
    router = 4 * c.n_experts * c.d_model + (4 * c.n_experts if layer.router_b is not None else 0)
    return router + len(set(layer.storage_map())) * (mats + bias)


def bits_per_weight(scheme: str) -> float:
    return BITS_PER_WEIGHT[scheme]


def stored_nbytes(t: QuantTensor | np.ndarray) -> int:
    """Bytes of one stored tensor as the C code holds it (sizeof of its generated symbol, the
    int8 struct's padding included)."""
    if isinstance(t, np.ndarray):
        return int(t.nbytes)
    if t.scheme == "fp32":
        return int(t.data.nbytes)
    if t.scheme == "int8":
        return int(q8_channel_dtype(t.n_out, t.n_in).itemsize)
    return int(t.nbytes)
