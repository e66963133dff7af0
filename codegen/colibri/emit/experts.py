"""The expert kernels: one description of an expert's FFN kernel for every model kind and scheme.

A quantised expert runs a generated FFN kernel with its dimensions fixed (colibri_quant.h
matvecs, activations quantised to int8 per block of 32 into an ``act_q`` row when its mode is
int8). Whether the expert sits in a lone MoE layer or in layer 17 of a transformer, the
kernel is described by :func:`ffn_kernel` and written by the one macro ``ffn_kernel`` of
``templates/common/experts.j2``; only what differs is a parameter: a lone layer's kernel takes
bias pointers and its dimensions from the header's macros and keeps its ``act_q`` rows (a group
of up to max_tokens tokens: it quantises them all, then runs each matrix over the group) in its
scratch after the hidden rows (the calling handle's workspace, so handles sharing the kernels
never share the row: colibri_model_t.kernel_scratch_bytes); a transformer's SwiGLU experts have
no biases, one kernel per d_ff, and use the ``act_q`` region of the transformer's one static
arena (a generated transformer is a single instance).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ..ir.moe import Expert
from ..quant.formats import QuantExpert, QuantTensor
from ..quant.layouts import (  # noqa: F401 (the layout stage's names, as emit/ knew them)
    C8_ISAS,
    F16C8_ISAS,
    Q4H4_ISAS,
    Q4R4_ISAS,
    R4_ISAS,
    R4P_ISAS,
    fp32_layouts,
    input_widths,
    layouts,
)

#: Parts of an expert in the order of the kernels' parameters.
PARTS = ("w1", "b1", "w2", "b2", "w3")
#: Board ISAs whose generated transformer packs its int8 / int4 matrices at setup for the CPU's
#: packed kernels where it has them (colibri_transformer.h colibri_pack_matrices: x86-64 hosts
#: with AVX-512 VNNI, chosen at run time; elsewhere every packed pointer stays NULL).
PACK_ISAS = ("x86_64",)


#: The activations a lone layer's quantised kernels run through ``{name}_act_row`` (colibri_math.h
#: colibri_<act>_row: the scalar function's bits, vectorised or with its common case branch-free);
#: relu runs colibri_qi_relu_row (int8 activations) and SwiGLU colibri_swiglu_row.
ROW_ACTIVATIONS = ("silu", "gelu", "gelu_tanh")


def packed_kernel(k: dict[str, Any]) -> dict[str, Any]:
    """A transformer's int8 / int4 (int8 activations) kernel `k` taking, first, its expert's
    three packed copies ``pk`` (w1, w2, w3; NULL: that matrix runs its plain kernel), run by
    colibri_matmul_packed with the bits of the plain kernel. `k` unchanged where a weight part
    is in another layout than rows."""
    if any(v != "rows" for v in k["layouts"].values()) or k["group"] != 1:
        return k
    if k["scheme"] not in ("int8", "int4"):  # q4k: no packed kernel, its portable one runs
        return k
    kind = "COLIBRI_PACK_Q8" if k["scheme"] == "int8" else "COLIBRI_PACK_Q4"
    return {
        **k,
        "params": "const void *const *pk, " + k["params"],
        "brief": k["brief"] + ", from the packed copies pk (w1, w2, w3) where not NULL",
        "pack": {"kind": kind, "scaled": k["scheme"] == "int8"},
    }


#: Board ISAs whose fp32 experts in the seed layout run their i-outer loops through
#: colibri_axpy_f32, which x86-64 dispatches by CPUID (AVX2 where the CPU has it; a separate
#: multiply and add per element in the same order, so the same bits as the plain loop).
AXPY_ISAS = ("x86_64",)


def fp32_expert(e: Expert) -> QuantExpert:
    """An fp32 expert of the MoE IR as the generated kernels take it (QuantTensor [out][in],
    stored in the seed layout or layout c8: :func:`fp32_layouts`)."""

    def t(a: np.ndarray) -> QuantTensor:
        return QuantTensor("fp32", int(a.shape[1]), int(a.shape[0]), a.T)

    w3 = t(e.w3) if e.w3 is not None else None
    return QuantExpert("fp32", "fp32", t(e.w1), t(e.w2), w3, e.b1, e.b2)


def with_layout(t: QuantTensor, part: str, kernel: dict[str, Any]) -> QuantTensor:
    """`t` (weight part `part` of an expert run by `kernel`) in the layout the kernel reads."""
    return replace(t, layout=kernel["layouts"].get(part, "rows"))


def weight_types(
    name: str, scheme: str, d_model: int, d_ff: int, widths: tuple[int, int] | None = None
) -> tuple[str, str]:
    """C pointer types of (w1 / w3 [d_ff][d_model], w2 [d_model][d_ff]) in `scheme`; widths:
    their stored row widths where the layouts pad them (:func:`input_widths`)."""
    if scheme == "int8":
        win, wff = widths or (d_model, d_ff)
        return f"const {name}_q8_{d_ff}x{win}_t *", f"const {name}_q8_{d_model}x{wff}_t *"
    pointer = {
        "fp32": "const float *",
        "fp16": "const uint16_t *",
        "int4": "const colibri_block_q4_32 *",
        "q4k": "const uint8_t *",
        "q5k": "const uint8_t *",
    }[scheme]
    return pointer, pointer


def kernel_params(
    name: str,
    scheme: str,
    d_model: int,
    d_ff: int,
    bias: bool,
    widths: tuple[int, int] | None = None,
) -> str:
    """The weight parameters of an FFN kernel: w1, (b1,) w2, (b2,) w3 (widths: as
    :func:`weight_types`)."""
    t_in, t_out = weight_types(name, scheme, d_model, d_ff, widths)
    types = {"w1": t_in, "b1": "const float *", "w2": t_out, "b2": "const float *", "w3": t_in}
    return ", ".join(f"{types[p]}{p}" for p in PARTS if bias or p[0] == "w")


def ffn_kernel(
    name: str,
    prefix: str,
    scheme: str,
    act: str,
    d_model: int,
    d_ff: int,
    gated: bool,
    lone_layer: bool,
    isa: str = "",
    group: int = 1,
    shared: bool = False,
) -> dict[str, Any]:
    """What the ``ffn_kernel`` macro needs to write the kernel of one kind of expert (scheme,
    activation mode, d_ff) of model `name` (macro prefix `prefix`) on a core (`isa`: the weight
    layouts its kernel reads, :func:`layouts`; fp32 experts: :func:`fp32_layouts`, the seed
    layout read by an i-outer ``matvec_in`` helper, or layout c8). group: the most tokens whose
    int8 rows its act_q region holds (a lone layer's max_tokens; a transformer runs one token):
    an int8-activation kernel quantises that many rows, then runs each matrix over all of them
    (colibri_matmul_*, or the inline multi-token kernel), reading the weights once per group.
    shared: a lone layer's shared expert (its own d_ff, fp32: ``{name}_shared_ffn``)."""
    fp32 = scheme == "fp32"
    lay = fp32_layouts(isa, d_model, d_ff) if fp32 else layouts(isa, scheme, act, d_model, d_ff)
    # codes per quantised input / hidden row the matrices read (wider where a layout pads)
    win, wff = input_widths(lay, d_model, d_ff) if act == "int8" else (d_model, d_ff)
    widths = {"widths": (win, wff), "pad_in": win != d_model, "pad_ff": wff != d_ff}
    if lone_layer and shared:
        return {
            **ffn_kernel(name, prefix, scheme, act, d_model, d_ff, gated, True, isa, group),
            "fn": f"{name}_shared_ffn",
            "matvec_in": f"{name}_shared_matvec_in",
            "brief": f"FFN of the shared expert (d_ff {d_ff}) over n tokens",
            "f": str(d_ff),
            "f_stride": f"{d_ff}u",
        }
    if lone_layer:  # the lone layer's header has <P>_D_FF; biases are optional at run time
        return {
            "fn": f"{name}_ffn" if fp32 else f"{name}_ffn_{scheme}_{act}",
            "matvec_in": f"{name}_matvec_in",
            "brief": f"FFN of one {scheme} expert ({act} activations) over n tokens",
            "storage": "static inline",
            "params": kernel_params(name, scheme, d_model, d_ff, True, (win, wff)),
            "scheme": scheme,
            "act": act,
            "gated": gated,
            "bias": True,
            "act_fn": f"{name}_act",
            "rows": 2 if gated else 1,
            "f": f"{prefix}_D_FF",
            "f_stride": f"{prefix}_D_FF",
            "nin": f"{win}" if win != d_model else f"{prefix}_D_MODEL",
            "nff": f"{wff}" if wff != d_ff else f"{prefix}_D_FF",
            **widths,
            "d_ff": d_ff,
            "act_q_in_scratch": True,
            "layouts": lay,
            "axpy": fp32 and isa in AXPY_ISAS,
            "group": group,
            "pack": None,
        }
    return {
        "fn": f"{name}_ffn_fp32_f{d_ff}" if fp32 else f"{name}_ffn_{scheme}_{act}_f{d_ff}",
        "matvec_in": f"{name}_matvec_in_f{d_ff}",
        "brief": f"SwiGLU FFN of one {scheme} expert ({act} activations, d_ff {d_ff}) over n "
        "tokens",
        "storage": "static",
        "params": kernel_params(name, scheme, d_model, d_ff, False, (win, wff)),
        "scheme": scheme,
        "act": act,
        "gated": True,
        "bias": False,
        "act_fn": f"{name}_silu",
        "rows": 2,
        "f": str(d_ff),
        "f_stride": f"{d_ff}u",
        "nin": f"{win}" if win != d_model else f"{prefix}_D_MODEL",
        "nff": f"{wff}",
        **widths,
        "d_ff": d_ff,
        "act_q_in_scratch": False,
        "layouts": lay,
        "axpy": fp32 and isa in AXPY_ISAS,
        "group": 1,
        "pack": None,  # packed_kernel: the host's packed copies
    }
