"""Views built afresh share one lowering when their chains are equal, and only then.

The lowering cache is keyed by a view chain's signature (operators, their numbers, the
root's type and shape), not by the view objects: launches that build
their views anew each time, as programs write them, lower each chain once. Oracle:
NumPy (np.roll, slicing, fancy indexing) on the same data.
"""
import gc
import importlib
import weakref
from collections import OrderedDict

import numpy as np
import pytest

import hetflow
from hetflow import co_map, cshift, interior, section, transpose
from hetflow.index.lowering import function_key, lowering, shared_lowering
from hetflow.runtime.launch import _key

# the module (hetflow.index's own ``lowering`` is the function)
lowering_module = importlib.import_module("hetflow.index.lowering")


@hetflow.kernel
def copy2(i, j, src, dst):
    dst[i, j] = src[i, j]


@hetflow.kernel
def stencil(i, j, new, centre, north, south, west, east, alpha):
    new[i, j] = centre[i, j] + alpha * (north[i, j] + south[i, j] + west[i, j] + east[i, j]
                                        - 4.0 * centre[i, j])


@pytest.fixture
def lowered(monkeypatch):
    """An empty shared cache, and the list of the prefixes of the views actually lowered."""
    calls = []
    real = lowering_module._lower

    def counting(view, prefix, root=None):
        calls.append(prefix)
        return real(view, prefix, root)

    monkeypatch.setattr(lowering_module, "_SHARED", OrderedDict())
    monkeypatch.setattr(lowering_module, "_lower", counting)
    return calls


def _step_views(u, v):
    return (interior(v, 1), interior(u, 1), interior(cshift(u, 0, -1), 1),
            interior(cshift(u, 0, 1), 1), interior(cshift(u, 1, -1), 1),
            interior(cshift(u, 1, 1), 1), 0.1)


def _numpy_step(u, v, alpha=0.1):
    out = v.copy()
    c = u[1:-1, 1:-1]
    out[1:-1, 1:-1] = c + alpha * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] - 4 * c)
    return out


def test_fresh_equal_views_are_lowered_once_per_launch_site(lowered):
    rng = np.random.default_rng(1)
    u, v = rng.random((12, 10)), np.zeros((12, 10))
    for step in range(4):  # views built afresh every step, swapping the arrays
        expect = _numpy_step(u, v)
        hetflow.forall((10, 8), stencil, *_step_views(u, v))
        np.testing.assert_array_equal(v, expect)
        if step == 0:
            assert len(lowered) == 6  # one per view argument
        u, v = v, u
    assert len(lowered) == 6


def test_equal_chains_over_other_arrays_share_the_lowering(lowered):
    a, b = np.zeros((6, 7)), np.ones((6, 7))
    first = shared_lowering(interior(cshift(a, 0, 2), 1), "x_")
    again = shared_lowering(interior(cshift(b, 0, 2), 1), "x_")
    assert again is first and first.root is None and len(lowered) == 1
    assert lowering(interior(cshift(b, 0, 2), 1), "x_").root is b  # bound to its own root
    assert shared_lowering(interior(cshift(b, 0, 2), 1), "y_") is not first  # other names


def _shifter(k):
    return lambda idx: ((idx[0] + k) % 6, idx[1])


def _shifter_default(k=1):
    return lambda idx, k=k: ((idx[0] + k) % 6, idx[1])


def _rows_reversed(idx):
    return (5 - idx[0], idx[1])


# (make a view of a, its NumPy meaning): each pair differs from the first entry in one thing
VARIANTS = {
    "base": (lambda a: interior(cshift(a, 0, 1), 1), lambda a: np.roll(a, -1, 0)[1:-1, 1:-1]),
    "shift": (lambda a: interior(cshift(a, 0, 2), 1), lambda a: np.roll(a, -2, 0)[1:-1, 1:-1]),
    "dim": (lambda a: interior(cshift(a, 1, 1), 1), lambda a: np.roll(a, -1, 1)[1:-1, 1:-1]),
    "delta": (lambda a: section(interior(cshift(a, 0, 1), 2), (0, 0), (2, 4)),
              lambda a: np.roll(a, -1, 0)[2:4, 2:6]),
    "operator": (lambda a: interior(transpose(a, 0, 1), 1), lambda a: a.T[1:-1, 1:-1]),
}


def _check_variant(a, make, meaning):
    view = make(a)
    out = np.zeros(view.shape)
    hetflow.forall(view.shape, copy2, view, out)
    np.testing.assert_array_equal(out, meaning(a))


@pytest.mark.parametrize("name", [n for n in VARIANTS if n != "base"])
def test_views_differing_in_a_number_or_an_operator_do_not_share(lowered, name):
    a = np.arange(48.0).reshape(6, 8)
    base, variant = VARIANTS["base"][0](a), VARIANTS[name][0](a)
    assert base.signature != variant.signature
    assert shared_lowering(base, "v_") is not shared_lowering(variant, "v_")
    for make, meaning in (VARIANTS["base"], VARIANTS[name]):
        _check_variant(a, make, meaning)


def test_views_of_roots_differing_in_shape_do_not_share(lowered):
    a, other = np.arange(48.0).reshape(6, 8), np.arange(48.0).reshape(8, 6)
    make, meaning = VARIANTS["base"]
    assert make(a).signature != make(other).signature
    assert shared_lowering(make(a), "r_") is not shared_lowering(make(other), "r_")
    _check_variant(a, make, meaning)
    _check_variant(other, make, meaning)


@pytest.mark.parametrize("other", [np.arange(48, dtype=np.float32).reshape(6, 8),  # dtype
                                   np.arange(96.0).reshape(6, 16)[:, ::2]])  # strides
def test_views_of_roots_differing_in_dtype_or_strides_share_the_lowering_not_the_launch(lowered, other):
    """A lowering is index arithmetic over the root's shape: the element type and layout
    change the compiled code (the launch's key), not the indices."""
    a = np.arange(48.0).reshape(6, 8)
    make, meaning = VARIANTS["base"]
    assert make(a).signature is make(other).signature
    assert shared_lowering(make(a), "r_") is shared_lowering(make(other), "r_")
    _check_variant(a, make, meaning)
    _check_variant(other, make, meaning)
    out = np.zeros((4, 6))
    assert _key(copy2.params, 2, (make(a), out)) != _key(copy2.params, 2, (make(other), out))  # plans differ


def _rows(f):
    return co_map(np.arange(36.0).reshape(6, 6), f, (6, 6))


def test_co_map_functions_share_by_code_and_captured_values(lowered):
    assert shared_lowering(_rows(_shifter(1)), "c_") is shared_lowering(_rows(_shifter(1)), "c_")
    assert len(lowered) == 1  # a fresh function of the same code and values hits
    distinct = [_shifter(2), _shifter(np.int64(2)), _shifter_default(1), _shifter_default(2),
                _rows_reversed]
    lows = [shared_lowering(_rows(f), "c_") for f in [_shifter(1)] + distinct]
    assert len({id(low) for low in lows}) == len(lows)  # another value, type, default or code


def test_co_map_functions_compute_their_own_results(lowered):
    a = np.arange(36.0).reshape(6, 6)
    i = np.arange(6)
    for f, rows in [(_shifter(1), (i + 1) % 6), (_shifter(3), (i + 3) % 6),
                    (_shifter_default(2), (i + 2) % 6), (_rows_reversed, 5 - i),
                    (_shifter(1), (i + 1) % 6)]:  # one after the other, one cache
        out = np.zeros((6, 6))
        hetflow.forall((6, 6), copy2, co_map(a, f, (6, 6)), out)
        np.testing.assert_array_equal(out, a[rows, :])


def test_co_map_capturing_an_unhashable_value_is_lowered_afresh(lowered):
    rows = np.array([2, 0, 1, 5, 4, 3])
    a = np.arange(36.0).reshape(6, 6)

    def permuted(idx):
        return (rows[idx[0]], idx[1])

    for _ in range(2):
        out = np.zeros((6, 6))
        hetflow.forall((6, 6), copy2, co_map(a, permuted, (6, 6)), out)
        np.testing.assert_array_equal(out, a[rows, :])
    assert not lowering_module._SHARED  # not cached, and still right


def test_function_key_tells_methods_of_other_objects_apart():
    class Shift:
        def __init__(self, k):
            self.k = k

        def __call__(self, idx):
            return (idx[0] + self.k,)

        def rows(self, idx):
            return (idx[0] + self.k,)

    one, two = Shift(1), Shift(2)
    assert function_key(one.rows) != function_key(two.rows)
    assert function_key(one) != function_key(two)
    assert function_key(_shifter(1)) == function_key(_shifter(1))


def test_the_cache_is_bounded_least_recently_used_first(lowered, monkeypatch):
    monkeypatch.setattr(lowering_module, "_SHARED_SIZE", 2)
    a = np.zeros((6, 6))
    first = shared_lowering(cshift(a, 0, 1), "b_")
    second = shared_lowering(cshift(a, 0, 2), "b_")
    assert shared_lowering(cshift(a, 0, 1), "b_") is first  # now the most recent
    shared_lowering(cshift(a, 0, 3), "b_")  # evicts the least recent: shift 2
    assert len(lowering_module._SHARED) == 2
    assert shared_lowering(cshift(a, 0, 1), "b_") is first
    assert shared_lowering(cshift(a, 0, 2), "b_") is not second  # lowered again


def test_the_cache_keeps_no_array_alive(lowered):
    a = np.zeros((8, 8))
    out = np.zeros((6, 6))
    hetflow.forall((6, 6), copy2, interior(cshift(a, 1, 1), 1), out)
    assert lowering_module._SHARED
    gone = weakref.ref(a)
    del a
    gc.collect()
    assert gone() is None
