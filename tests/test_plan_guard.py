"""A plan's guard (runtime.launch._guard) says True exactly where the plan's key would be
computed again: checked against ``_key`` itself over random argument tuples, and end to
end, with launches whose arguments change structure from call to call against NumPy."""
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hetflow
from hetflow import cshift, interior, section
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
        assert not guard(first)
        return
    assert guard(first)
    assert guard(second) == (_key(("i",) + tuple(f"p{k}" for k in range(len(second))), 1, second) == key)


def test_a_guard_rejects_other_argument_counts():
    args = (_A, 1.0)
    guard = _guard(args, _key(("i", "x", "s"), 1, args))
    assert guard(args) and not guard((_A,)) and not guard((_A, 1.0, 2.0)) and not guard(())


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
