"""Error-compensated quantisation (colibri.quant.gptq) against the scale search it builds on."""

from __future__ import annotations

import numpy as np
import pytest
from colibri.errors import ConfigError
from colibri.quant.formats import QuantTensor, quantize_matrix
from colibri.quant.gptq import gptq_matrix, hessian


def _correlated_inputs(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    """Rows that mostly live in a 24-dimensional subspace, as hidden states do."""
    basis = np.random.default_rng(99).standard_normal((24, d))
    x = rng.standard_normal((n, 24)) @ basis + 0.1 * rng.standard_normal((n, d))
    return x.astype(np.float32)


def _output_error(t: QuantTensor, w_t: np.ndarray, x: np.ndarray) -> float:
    ref = x.astype(np.float64) @ w_t.astype(np.float64).T
    got = x.astype(np.float64) @ t.dequantize().astype(np.float64).T
    return float(np.sum((got - ref) ** 2))


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_identity_statistics_give_the_scale_search(scheme: str) -> None:
    """With H = I there is nothing to compensate: the weights are the scale search's."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((6, 70)).astype(np.float32)
    a = gptq_matrix(w, scheme, np.eye(70)).dequantize()
    b = quantize_matrix(w, scheme).dequantize()
    assert np.array_equal(a, b)


#: Measured: GPTQ leaves 0.16 (int8) / 0.15 (int4) of the search's output error on these rows.
@pytest.mark.parametrize("scheme,gain", [("int8", 0.3), ("int4", 0.3)])
def test_output_error_on_calibration_rows_falls(scheme: str, gain: float) -> None:
    rng = np.random.default_rng(2)
    d_in, d_out = 96, 40
    w = rng.standard_normal((d_out, d_in)).astype(np.float32)
    x = _correlated_inputs(rng, 400, d_in)
    plain = _output_error(quantize_matrix(w, scheme), w, x)
    comp = _output_error(gptq_matrix(w, scheme, hessian(x)), w, x)
    assert comp < gain * plain, (comp, plain)
    held_out = _correlated_inputs(np.random.default_rng(3), 400, d_in)  # same distribution
    assert _output_error(gptq_matrix(w, scheme, hessian(x)), w, held_out) < _output_error(
        quantize_matrix(w, scheme), w, held_out
    )


def test_stored_format_is_unchanged() -> None:
    """Codes within range, int4 scales fp16 of either sign, int8 scales fp32: the same
    QuantTensor the kernels read (they are not changed by compensation)."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((5, 64)).astype(np.float32)
    x = _correlated_inputs(rng, 100, 64)
    t4 = gptq_matrix(w, "int4", hessian(x))
    assert t4.data.dtype == quantize_matrix(w, "int4").data.dtype and t4.data.shape == (5, 2)
    t8 = gptq_matrix(w, "int8", hessian(x))
    assert t8.data.dtype == np.int8 and np.abs(t8.data.astype(np.int32)).max() <= 127
    assert t8.scale is not None and t8.scale.dtype == np.float32


def test_silent_inputs_and_bad_statistics() -> None:
    rng = np.random.default_rng(5)
    w = rng.standard_normal((4, 40)).astype(np.float32)
    x = _correlated_inputs(rng, 50, 40)
    x[:, 7] = 0.0  # an input that never moved in calibration keeps its weights' rounding
    t = gptq_matrix(w, "int4", hessian(x))
    assert np.abs(t.dequantize()[:, 7] - w[:, 7]).max() <= np.abs(w[:, 7]).max() / 7
    with pytest.raises(ConfigError, match="inputs"):
        gptq_matrix(w, "int4", np.eye(39))
    with pytest.raises(ConfigError, match="int8"):
        gptq_matrix(w, "fp16", np.eye(40))
    h = hessian(x)
    h[3, 3] = np.nan
    with pytest.raises(ConfigError, match="NaN"):
        gptq_matrix(w, "int8", h)


# -- block-local compensation (the default --calib method's candidate) ---------------------------


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_block_compensation_with_identity_blocks_is_the_scale_search(scheme: str) -> None:
    from colibri.quant.gptq import block_compensated_matrix

    rng = np.random.default_rng(2)
    w = rng.standard_normal((6, 70)).astype(np.float32)
    a = block_compensated_matrix(w, scheme, np.tile(np.eye(32), (3, 1, 1)))
    assert np.array_equal(a.dequantize(), quantize_matrix(w, scheme).dequantize())


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_block_compensation_lowers_the_output_error(scheme: str) -> None:
    """Through the blocks' own second moments (one pass: block_moments), the output error on
    correlated inputs falls below the scale search's, in the same stored format."""
    from colibri.quant.gptq import block_compensated_matrix, block_moments

    rng = np.random.default_rng(3)
    w = rng.standard_normal((48, 96)).astype(np.float32)
    x = _correlated_inputs(rng, 400, 96)
    t = block_compensated_matrix(w, scheme, block_moments(x) / 400)
    assert t.scheme == scheme and (t.n_out, t.n_in) == (48, 96)
    plain = _output_error(quantize_matrix(w, scheme), w, x)
    comp = _output_error(t, w, x)
    print(f"{scheme}: block-compensated / search output error {comp / plain:.3f}")
    assert comp < 0.9 * plain
    with pytest.raises(ConfigError, match="calibration blocks"):
        block_compensated_matrix(w, scheme, np.zeros((2, 32, 32)))
