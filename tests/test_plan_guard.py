"""A plan's guard (runtime.launch._guard) says True exactly where the plan's key would be
computed again: checked against ``_key`` itself over random argument tuples, and end to
end, with launches whose arguments change structure from call to call against NumPy.
Where the guard also makes the launch's checks (arrays long enough, no written array passed
twice), a warm launch that fails them raises as a cold one does."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hetflow
from hetflow import cshift, interior, section
from hetflow.errors import ShapeError
from hetflow.runtime.launch import _guard, _key

_A = np.zeros((16, 16))
ROOTS = [_A, np.ones((16, 16)), np.zeros((16, 16), np.float32), np.asfortranarray(np.zeros((16, 16))),
         np.zeros((16, 16))[:, ::2].copy(), _A[::2], np.zeros((16, 16), np.int64)]
ROOTS[4].setflags(write=False)
OPS = [lambda r: r, lambda r: interior(r, 1), lambda r: cshift(r, 0, 1), lambda r: cshift(r, 1, -1),
       lambda r: interior(cshift(r, 0, -1), 1), lambda r: section(r, (1, 1), (4, 4))]
SCALARS = [0.5, 3, -(2**63), 2**63, True, 1 + 2j, np.float32(1.0)]


def _build(spec):
    return tuple(SCALARS[i] if op is None else OPS[op](ROOTS[i]) for op, i in spec)


_item = st.one_of(st.tuples(st.integers(0, len(OPS) - 1), st.integers(0, len(ROOTS) - 1)),
                  st.tuples(st.none(), st.integers(0, len(SCALARS) - 1)))


@st.composite
def _pair(draw):
    """Two specs of one length, the second mostly the first over other roots (equal keys
    are common then, and so are differences in element type, layout and root sharing)."""
    first = draw(st.lists(_item, min_size=1, max_size=5))
    second = [draw(st.one_of(st.just(item), _item, st.tuples(st.just(item[0]), st.integers(0, len(ROOTS) - 1))))
              if item[0] is not None else draw(st.one_of(st.just(item), _item)) for item in first]
    return first, second


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_pair())
def test_the_guard_says_true_exactly_where_the_key_is_the_same(pair):
    first, second = map(_build, pair)
    key = _key(("i",) + tuple(f"p{k}" for k in range(len(first))), 1, first)
    guard = _guard(first, key)
    if guard is None:  # only for argument types the guard cannot write
        assert any(type(a) is np.float32 for a in first)
        return
    if None in key:  # an int beyond int64: no plan is ever made (bind raises)
        assert not guard(first, 0)
        return
    assert guard(first, 0)
    assert guard(second, 0) == (_key(("i",) + tuple(f"p{k}" for k in range(len(second))), 1, second) == key)


def test_a_guard_rejects_other_argument_counts():
    args = (_A, 1.0)
    guard = _guard(args, _key(("i", "x", "s"), 1, args))
    assert guard(args, 0) and not guard((_A,), 0) and not guard((_A, 1.0, 2.0), 0) and not guard((), 0)


@hetflow.kernel
def _blend(i, j, x, y, out):
    out[i, j] = 2.0 * x[i, j] + y[i, j]


def test_launches_changing_argument_structure_each_call_match_numpy():
    rng = np.random.default_rng(0)
    c = rng.random((12, 12))
    f = np.asfortranarray(rng.random((12, 12)))
    s32 = rng.random((12, 12)).astype(np.float32)
    calls = [(c, f), (f, c), (interior(c, 1), interior(f, 1)), (interior(f, 1), cshift(interior(c, 1), 0, 1)),
             (c, c), (s32, c), (interior(c, 1), interior(cshift(c, 1, 1), 1)), (c, f)]
    for x, y in calls * 2:
        out = np.zeros(np.asarray(x).shape)
        hetflow.forall(out.shape, _blend, x, y, out, device="cpu0")
        np.testing.assert_array_equal(out, 2.0 * np.asarray(x) + np.asarray(y))


@hetflow.kernel
def _axpy(i, a, x, y, out):
    out[i] = a * x[i] + y[i]


@hetflow.kernel
def _shift_add(i, x, out):
    out[i] = x[i] + x[i + 1]


def test_a_warm_launch_over_arrays_too_short_raises_as_a_cold_one():
    x, y, out = np.arange(8.0), np.ones(8), np.zeros(8)
    for _ in range(3):  # warm: the kernel's recent guard holds the rows checks
        hetflow.forall(8, _axpy, 2.0, x, y, out, device="cpu0")
    np.testing.assert_array_equal(out, 2.0 * x + 1.0)
    assert _axpy.recent["cpu0"][3].guard_checks  # this test is about the guard's checks
    for short in ("x", "y", "out"):
        args = dict(x=x, y=y, out=out)
        args[short] = np.zeros(5)
        with pytest.raises(ShapeError, match=f"argument '{short}'"):
            hetflow.forall(8, _axpy, 2.0, args["x"], args["y"], args["out"], device="cpu0")
    hetflow.forall(5, _axpy, 2.0, x, y, out, device="cpu0")  # fewer rows than the arrays: fine


def test_a_warm_launch_passing_its_output_as_an_input_read_elsewhere_raises():
    x, out = np.arange(9.0), np.zeros(9)
    for _ in range(3):
        hetflow.forall(8, _shift_add, x, out, device="cpu0")
    np.testing.assert_array_equal(out[:8], x[:8] + x[1:])
    assert _shift_add.recent["cpu0"][3].guard_checks
    with pytest.raises(ShapeError, match="writes argument 'out'"):
        hetflow.forall(8, _shift_add, out, out, device="cpu0")


def test_a_warm_launch_passing_one_array_twice_at_the_same_index_runs():
    x, y = np.arange(6.0), np.arange(6.0)
    for _ in range(2):
        hetflow.forall(6, _axpy, 1.0, x, y, y, device="cpu0")  # y read and written at i only
    np.testing.assert_array_equal(y, 3 * np.arange(6.0))


def test_a_zero_dimensional_array_raises_shape_error_every_time():
    x, out = np.arange(4.0), np.zeros(4)
    hetflow.forall(4, _shift_add, np.arange(5.0), out, device="cpu0")
    for _ in range(2):  # a plan made for the 0-d array: its guard must not call len() on it
        with pytest.raises(ShapeError):
            hetflow.forall(4, _shift_add, np.array(1.0), out, device="cpu0")
    hetflow.forall(3, _shift_add, x, out, device="cpu0")
    np.testing.assert_array_equal(out[:3], x[:3] + x[1:])
