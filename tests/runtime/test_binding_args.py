"""The Python binding checks every argument before C sees it (issue 37): a bad shape, dtype,
NaN / Inf, an integer out of range or a short sharing map is a named Python error
(BindingValueError / BindingTypeError, ValueError / TypeError subclasses naming the argument),
never a read past a C buffer, a silently truncated integer or wrong output."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from colibri.emit.container import write_container
from colibri.errors import BindingTypeError, BindingValueError, InputError
from colibri.frontends.seed import make_toy
from colibri.reference.moe import moe_forward
from colibri.targets.binding import LM, Runtime
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

E, D, F, K = 4, 8, 16, 2
BAD = (BindingValueError, BindingTypeError)


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    layer = make_toy(experts=E, hidden=D, ff=F, top_k=K, seed=5)
    return layer, write_container(layer, tmp_path_factory.mktemp("toy") / "m.clb")


@pytest.fixture(scope="module")
def rt(toy: tuple[Any, Path]) -> Any:
    with Runtime(toy[1]) as r:
        yield r


def test_errors_are_value_and_type_errors() -> None:
    assert issubclass(BindingValueError, ValueError) and issubclass(BindingValueError, InputError)
    assert issubclass(BindingTypeError, TypeError) and issubclass(BindingTypeError, InputError)


@pytest.mark.parametrize(
    "shape", [(3, 7), (3, 9), (D,), (), (2, D, 1), (1, 2 * D)], ids=lambda s: str(s)
)
def test_forward_refuses_wrong_shapes(rt: Any, shape: tuple[int, ...]) -> None:
    """(3, 7), (8,) or a scalar read past the input in C colibri_route (ASan); (3, 9) gave
    silently wrong output."""
    with pytest.raises(BindingValueError, match=r"x must have shape \(tokens, 8\)"):
        rt.forward(np.ones(shape, np.float32))


def test_forward_one_token_hint(rt: Any) -> None:
    with pytest.raises(BindingValueError, match=r"reshape\(1, -1\)"):
        rt.forward(np.ones(D, np.float32))


@pytest.mark.parametrize("dtype", [bool, np.complex64, object, "U3"])
def test_forward_refuses_non_real_dtypes(rt: Any, dtype: Any) -> None:
    with pytest.raises(BindingTypeError, match="x must hold real numbers"):
        rt.forward(np.zeros((2, D), dtype=dtype))


def test_forward_refuses_ragged_lists(rt: Any) -> None:
    with pytest.raises(BindingTypeError, match="ragged or mixed"):
        rt.forward([[1.0] * D, [1.0]])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 1e39])
def test_forward_refuses_non_finite(rt: Any, bad: float) -> None:
    x = np.zeros((2, D), np.float64)
    x[1, 3] = bad
    with pytest.raises(
        BindingValueError,
        match=r"x\[1, 3\] is [-a-z0-9.+]+( \(beyond .*)?: the runtime needs finite",
    ):
        rt.forward(x)


def test_forward_converts_real_dtypes(rt: Any, toy: tuple[Any, Path]) -> None:
    x = np.random.default_rng(1).standard_normal((3, D))
    ref, _ = moe_forward(toy[0], x.astype(np.float32))
    for arr in (x, x.astype(np.float16).astype(np.float64), x.tolist()):
        y, ids, gates = rt.forward(arr)
        assert y.shape == (3, D) and ids.shape == (3, K) and gates.shape == (3, K)
    np.testing.assert_allclose(rt.forward(x)[0], ref, rtol=1e-4, atol=1e-5)
    y, ids, _ = rt.forward(np.zeros((0, D), np.float32))  # no tokens: empty outputs
    assert y.shape == (0, D) and ids.shape == (0, K)
    y, ids, _ = rt.forward(np.arange(2 * D, dtype=np.int64).reshape(2, D))
    assert np.isfinite(y).all()


@pytest.mark.parametrize(
    ("kw", "err", "msg"),
    [
        ({"top_k": 0}, BindingValueError, "top_k must be in 1..4"),
        ({"top_k": E + 1}, BindingValueError, "top_k must be in 1..4"),
        ({"top_k": 2**32 + 1}, BindingValueError, "top_k"),
        ({"top_k": 1.0}, BindingTypeError, "top_k must be an integer"),
        ({"top_k": True}, BindingTypeError, "top_k must be an integer"),
        ({"d_model": D + 1}, BindingValueError, "d_model must be in 8..8"),
    ],
)
def test_forward_integer_arguments(rt: Any, kw: dict[str, Any], err: type, msg: str) -> None:
    with pytest.raises(err, match=msg):
        rt.forward(np.zeros((1, D), np.float32), **kw)


def test_forward_top_k_within_range_works(rt: Any) -> None:
    for k in range(1, E + 1):
        _, ids, _ = rt.forward(np.ones((2, D), np.float32), top_k=np.int64(k))
        assert ids.shape == (2, k)


def test_init_arguments(toy: tuple[Any, Path]) -> None:
    path = toy[1]
    with pytest.raises(BindingValueError, match="cache_policy must be one of 'none', 'lru'"):
        Runtime(path, cache_policy="bogus")
    with pytest.raises(BindingValueError, match="lru_cache_size must be in 0..256"):
        Runtime(path, cache_policy="lru", lru_cache_size=2**32 + 1)
    with pytest.raises(BindingValueError, match="lru_cache_size must be in 1..256"):
        Runtime(path, cache_policy="lru", lru_cache_size=0)
    with pytest.raises(BindingValueError, match="model_path must be a non-empty path without NUL"):
        Runtime(str(path) + "\0.junk")
    with pytest.raises(BindingTypeError, match="model_path must be a path"):
        Runtime(3)  # type: ignore[arg-type]
    with Runtime(path, cache_policy="lru", lru_cache_size=2) as r:
        assert r.forward(np.ones((1, D)))[0].shape == (1, D)


@pytest.mark.parametrize(
    ("share", "msg"),
    [
        ([0, 0], "sharing_map has 2 entries but the model has 4 experts"),
        ([0, 0, 2, 2, 2], "sharing_map\\[4\\] must be in 0..4|has 5 entries"),
        ([0, 0, 2, 2, 0, 0], "sharing_map has 6 entries but the model has 4 experts"),
        ([0, -1, 2, 3], "sharing_map\\[1\\] must be in 0..3, got -1"),
        ([0, 2**32, 2, 3], "sharing_map\\[1\\] must be in 0..3"),
        ([], "sharing_map must have one entry per expert"),
        ([1, 2, 2, 3], "sharing_map\\[0\\] = 1 but sharing_map\\[1\\] = 2"),
    ],
)
def test_sharing_map_length_and_values(toy: tuple[Any, Path], share: list[int], msg: str) -> None:
    """A map shorter than the experts was read past its end by colibri_init."""
    with pytest.raises(BindingValueError, match=msg):
        Runtime(toy[1], sharing_map=share)


def test_sharing_map_good(toy: tuple[Any, Path]) -> None:
    with Runtime(toy[1], sharing_map=[0, 0, 2, 2]) as r:
        assert r.forward(np.ones((2, D)))[1].shape == (2, K)


def test_closed_handle(toy: tuple[Any, Path]) -> None:
    r = Runtime(toy[1])
    r.close()
    for call in (lambda: r.forward(np.ones((1, D))), r.stats):
        with pytest.raises(InputError, match="closed"):
            call()


# -- property: random shapes, dtypes, integers ---------------------------------------------

DTYPES = [np.float32, np.float64, np.float16, np.int32, np.uint8, bool, np.complex64]


@st.composite
def forward_calls(draw: Any) -> tuple[np.ndarray, Any]:
    ndim = draw(st.integers(0, 3))
    shape = tuple(
        draw(st.sampled_from([0, 1, 3, D - 1, D, D + 1, 2 * D]))
        if i == ndim - 1
        else draw(st.integers(0, 4))
        for i in range(ndim)
    )
    dtype = draw(st.sampled_from(DTYPES))
    x = np.asarray(draw(st.integers(0, 2**31 - 1)) % 7, dtype=np.float64) * np.ones(shape)
    if x.size and draw(st.booleans()):
        x.flat[draw(st.integers(0, x.size - 1))] = draw(
            st.sampled_from([np.nan, np.inf, 1e39, -3.5, 0.25])
        )
    with np.errstate(all="ignore"):
        x = x.astype(dtype)
    top_k = draw(
        st.one_of(
            st.none(),
            st.integers(-(2**33), 2**33),
            st.integers(-1, E + 2),
            st.sampled_from([1.0, "2", True]),
        )
    )
    return x, top_k


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(call=forward_calls())
def test_forward_property(rt: Any, call: tuple[np.ndarray, Any]) -> None:
    x, top_k = call
    k_ok = top_k is None or (type(top_k) is int and 1 <= top_k <= E)
    x_ok = x.dtype.kind in "fiu" and x.ndim == 2 and x.shape[1] == D
    if x_ok:
        with np.errstate(all="ignore"):
            x_ok = bool(np.isfinite(x.astype(np.float32)).all())
    if k_ok and x_ok:
        y, ids, gates = rt.forward(x, top_k=top_k)
        k = K if top_k is None else top_k
        assert y.shape == (x.shape[0], D) and ids.shape == (x.shape[0], k)
        assert np.isfinite(y).all() and ((0 <= ids) & (ids < E)).all()
    else:
        with pytest.raises(BAD) as err:
            rt.forward(x, top_k=top_k)
        assert ("top_k" if not k_ok else "x") in str(err.value)


# -- the whole-model binding (LM) ---------------------------------------------------------


@pytest.fixture(scope="module")
def lm_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from colibri.emit.lmfile import write_lm_container
    from colibri.frontends.hf_model import load_hf_transformer
    from hf_tiny import make_model, require_torch, save_model

    require_torch()
    tmp = tmp_path_factory.mktemp("lm")
    model = load_hf_transformer(save_model(make_model("mixtral", seed=3), tmp / "ckpt"))
    return write_lm_container(model, None, tmp / "lm.clb", 16)


def test_lm_integer_arguments(lm_file: Path) -> None:
    """Token ids and positions >= 2^32 were truncated to int32 by ctypes."""
    with LM(lm_file) as lm:
        v, ctx = lm.vocab_size, lm.max_context
        ok = lm.forward(1, 0)
        for token, pos, msg in [
            (2**32 + 1, 0, f"token must be in 0..{v - 1}, got {2**32 + 1}"),
            (-1, 0, "token must be in"),
            (v, 0, "token must be in"),
            (1, 2**32, f"pos must be in 0..{ctx - 1}"),
            (1, -1, "pos must be in"),
            (1, ctx, "pos must be in"),
        ]:
            with pytest.raises(BindingValueError, match=msg):
                lm.forward(token, pos)
        for token in (1.0, "1", None, True):
            with pytest.raises(BindingTypeError, match="token must be an integer"):
                lm.forward(token, 0)  # type: ignore[arg-type]
        with pytest.raises(BindingValueError, match=r"ids\[1\] must be in"):
            lm.prefill([1, 2**32 + 1])
        with pytest.raises(BindingValueError, match="ids is empty"):
            lm.prefill([])
        with pytest.raises(BindingValueError, match="context overflow"):
            lm.prefill([1] * (ctx + 1))
        with pytest.raises(BindingValueError, match=r"pos must be in 0\.\.1, got 5: positions"):
            lm.forward(1, 5)  # positions 1..4 never run: C attended to garbage (NaN logits)
        lm.prefill([1] * (ctx - 1))
        with pytest.raises(BindingValueError, match="context overflow"):
            lm.prefill([1, 2], pos=ctx - 1)
        lm.forward(1, 0)  # a rewind: position 1 is to be run again
        with pytest.raises(BindingValueError, match=r"pos must be in 0\.\.1, got 2"):
            lm.forward(1, 2)
        with pytest.raises(BindingTypeError, match="ids must be a 1-D array of integers"):
            lm.prefill(np.ones(3, np.float32))  # type: ignore[arg-type]
        with pytest.raises(BindingValueError, match="max_new must be in"):
            lm.generate([1], -1)
        with pytest.raises(BindingValueError, match="context overflow"):
            lm.generate([1, 2], ctx)
        assert np.array_equal(lm.forward(np.int64(1), np.int32(0)), ok)
        assert np.array_equal(lm.prefill(np.array([1], np.int64)), ok)
    for kw, msg in [
        ({"threads": 257}, "threads must be in 0..256"),
        ({"threads": -1}, "threads must be in 0..256"),
        ({"prefill_batch": -1}, "prefill_batch must be in 0..4096"),
        ({"max_context": 2**32 + 4}, "max_context must be in"),
        ({"ram_budget": -1}, "ram_budget must be in"),
    ]:
        with pytest.raises(BindingValueError, match=msg):
            LM(lm_file, **kw)
    with pytest.raises(BindingTypeError, match="verify must be True or False"):
        LM(lm_file, verify="no")  # type: ignore[arg-type]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    calls=st.lists(
        st.tuples(
            st.one_of(st.integers(-(2**40), 2**40), st.integers(-2, 300)),
            st.one_of(st.integers(-(2**40), 2**40), st.integers(-2, 20)),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_lm_forward_property(lm_file: Path, calls: list[tuple[int, int]]) -> None:
    """Random token / position calls on one handle: a good one (an id of the vocabulary, a
    position no later than the first not yet run) gives finite logits, any other a named
    error and leaves the handle usable."""
    with LM(lm_file) as lm:
        filled = 0
        for token, pos in calls:
            if 0 <= token < lm.vocab_size and 0 <= pos < lm.max_context and pos <= filled:
                row = lm.forward(token, pos)
                assert row.shape == (lm.vocab_size,) and np.isfinite(row).all()
                filled = pos + 1
            else:
                with pytest.raises(BindingValueError, match="token|pos"):
                    lm.forward(token, pos)


@pytest.mark.parametrize(
    "kw",
    [
        {"temperature": float("inf")},
        {"temperature": float("nan")},
        {"temperature": -0.5},
        {"top_p": float("nan")},
        {"top_p": 0.0},
        {"top_k": -1},
        {"top_k": 2**32},
        {"seed": 2**64},
    ],
)
def test_sampling_options_ranges(kw: dict[str, Any]) -> None:
    from colibri.targets.lmrun import SamplingOptions

    with pytest.raises(InputError, match="temperature|top-p|top-k|seed"):
        SamplingOptions(**kw).check(1000)
    SamplingOptions(temperature=0.7, top_p=0.9, top_k=40, seed=2**64 - 1).check(1000)
