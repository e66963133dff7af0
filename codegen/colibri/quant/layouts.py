"""The layout stage: which stored layout (:data:`colibri.quant.formats.LAYOUTS`) each weight
matrix of an expert kind takes on a core, and the width of the quantised activation rows its
kernels then read.

The fast layouts r4 / r4p (int8) and q4r4 / q4h4 (int4) read whole chunks of inputs; a matrix whose
n_in is not a whole number of them is stored with zero columns up to the next one
(:func:`colibri.quant.formats.stored_width`) and its kernel reads an activation row padded with
zero codes to the same width, so no shape falls back to the generic layout ``rows`` for want
of whole chunks; the float layout c8 (fp32 / fp16) holds any shape, its kernels running the
outputs after the last block of 8 and the inputs after the last pass of 4 in C (c8 tails).
The plan sizes the activation rows and the cache slots from what is chosen
here (:func:`act_row_width`, :func:`colibri.quant.formats.QuantTensor.stored_in`); the emitter
stores the matrices and writes the kernels from it (colibri/emit/experts.py), and records the
choice in the manifest (``weight_layouts``).
"""

from __future__ import annotations

from .formats import R4_CHUNK, R4_ROWS, c8_fits, stored_width

#: Board ISAs (boards/*.toml ``isa``) whose int8 x int8 expert kernels read layout r4
#: (colibri_qinline.h): the Cortex-M4 / M7 DSP extension and Helium.
R4_ISAS = ("armv7em_dsp", "mve")
#: Of those, the ISAs whose kernels read layout r4p instead (colibri_qinline.h: one SXTB16 per 4
#: weights instead of two; inputs padded to whole blocks of 32): the Cortex-M4 / M7.
R4P_ISAS = ("armv7em_dsp",)
#: Board ISAs whose int4 x int8 expert kernels read layout q4r4 (colibri_qinline_q4.h): the
#: Cortex-M4 / M7 DSP extension.
Q4R4_ISAS = ("armv7em_dsp",)
#: Board ISAs whose int4 x int8 expert kernels read layout q4h4 (colibri_qinline_q4.h: the
#: groups of q4r4 with the plain nibble order, one pointer and one load of 4 scales per block):
#: Helium.
Q4H4_ISAS = ("mve",)
#: Board ISAs whose fp16 expert kernels read layout c8 (colibri_qinline_f.h colibri_qf_f16_c8):
#: the Cortex-M4 / M7 FPU converts fp16 by VCVTB / VCVTT (Helium reads the plain rows).
F16C8_ISAS = ("armv7em_dsp",)
#: Board ISAs whose fp32 experts read layout c8 with fused multiply-adds (colibri_qinline_f.h):
#: the Cortex-M4 / M7 single-precision FPU (VFMA, VLDM) and Helium (VFMA by a scalar).
C8_ISAS = ("armv7em_dsp", "mve")


def layouts(isa: str, scheme: str, act: str, d_model: int, d_ff: int) -> dict[str, str]:
    """Stored layout of each weight part of an expert kind on a core: r4 / r4p (int8 weights,
    :func:`_int8_layout`) or q4r4 / q4h4 (int4 weights) where the core's kernel reads four rows at
    once (int8 activations) and the matrix has at least four rows (any n_in: its rows padded
    to whole chunks), c8 (fp16 weights, any shape: its tails run in C) where it converts eight
    outputs' weights at once."""
    if isa in F16C8_ISAS and scheme == "fp16":
        up16 = "c8" if c8_fits(d_ff, d_model) else "rows"
        down16 = "c8" if c8_fits(d_model, d_ff) else "rows"
        return {"w1": up16, "w3": up16, "w2": down16}
    if isa in Q4R4_ISAS and scheme == "int4" and act == "int8":
        up4 = "q4r4" if d_ff >= R4_ROWS else "rows"
        down4 = "q4r4" if d_model >= R4_ROWS else "rows"
        return {"w1": up4, "w3": up4, "w2": down4}
    if isa in Q4H4_ISAS and scheme == "int4" and act == "int8":
        up4 = "q4h4" if d_ff >= R4_ROWS else "rows"
        down4 = "q4h4" if d_model >= R4_ROWS else "rows"
        return {"w1": up4, "w3": up4, "w2": down4}
    fast = isa in R4_ISAS and scheme == "int8" and act == "int8"
    up = _int8_layout(isa, fast, d_ff, d_model)
    down = _int8_layout(isa, fast, d_model, d_ff)
    return {"w1": up, "w3": up, "w2": down}


def _int8_layout(isa: str, fast: bool, n_out: int, n_in: int) -> str:
    """r4p, r4 or rows for an int8 x int8 matrix [n_out, n_in] on a core (see layouts): on the
    R4P cores r4p (padded to blocks of 32 where n_in is not whole ones), but r4 for n_in of
    at most one chunk of 16 (r4p would pad it to twice its width or more); r4 on the others
    (padded to chunks of 16)."""
    if not fast or n_out < R4_ROWS:
        return "rows"
    return "r4p" if isa in R4P_ISAS and n_in > R4_CHUNK else "r4"


def fp32_layouts(isa: str, d_model: int, d_ff: int) -> dict[str, str]:
    """Stored layout of each weight part of an fp32 expert on a core: c8 (column blocks of
    the seed layout, read by colibri_qinline_f.h's dot-form kernels; any shape, its tails run
    in C) where the core has a fast path, else the seed layout (``rows``)."""
    fast = isa in C8_ISAS
    up = "c8" if fast and c8_fits(d_ff, d_model) else "rows"
    down = "c8" if fast and c8_fits(d_model, d_ff) else "rows"
    return {"w1": up, "w3": up, "w2": down}


def input_widths(lay: dict[str, str], d_model: int, d_ff: int) -> tuple[int, int]:
    """Codes per quantised activation row that an expert kind in layouts `lay` reads: (the
    input row of w1 / w3, the hidden row of w2), each its width padded as its matrices' rows
    are (:func:`colibri.quant.formats.stored_width`)."""
    return stored_width(lay["w1"], d_model), stored_width(lay["w2"], d_ff)


def act_row_width(isa: str, scheme: str, act: str, d_model: int, d_ff: int) -> int:
    """Codes of the widest quantised activation row an expert kind's kernel on `isa` reads
    (max(d_model, d_ff) unless its layouts pad: :func:`input_widths`); 0 when its activations
    stay fp32."""
    if act != "int8" or scheme == "fp32":
        return 0
    return max(input_widths(layouts(isa, scheme, act, d_model, d_ff), d_model, d_ff))
