"""reduce, scan and sort over several devices (the CPU and the simulated GPU): every
block exactly once, partials combined in index order. Oracles: NumPy, sequential folds."""
import numpy as np
import pytest

import hetflow
from hetflow import interior, reduce, scan, sort
from hetflow.runtime import reductions
from hetflow.runtime.reductions import Blocking

RNG = np.random.default_rng(7)
pytestmark = pytest.mark.simgpu


@hetflow.kernel
def first_nonzero(a, b):
    """Associative, not commutative."""
    return a if a != 0 else b


@hetflow.kernel
def negated(v):
    return -v


@pytest.fixture
def devices(gpu_device, monkeypatch):
    """The CPU and the simulated GPU; a few elements a block, so tiny inputs make
    several blocks for the devices to share."""
    monkeypatch.setitem(reductions.BLOCKING, "cpu", Blocking(grain=2, most=6))
    return ["cpu0", gpu_device.id]


def test_reduce_all_and_along_an_axis(devices):
    x = RNG.integers(-100, 100, (6, 7))
    assert reduce(x, "sum", device=devices) == x.sum()
    assert reduce(x, "max", device=devices) == x.max()
    np.testing.assert_array_equal(reduce(x, "sum", axis=1, device=devices), x.sum(1))
    np.testing.assert_array_equal(reduce(x, "min", axis=0, device=devices), x.min(0))


def test_reduce_keeps_index_order_for_non_commutative_ops(devices):
    d = np.zeros(40, np.int64)
    d[[13, 29]] = [5, 9]
    assert reduce(d, first_nonzero, commutative=False, device=devices) == 5


def test_float_reduce_is_the_one_cpu_grouping_bit_for_bit(devices):
    """With several devices the blocks are the CPU's, folded in index order: the same
    bits as the compiled path on the CPU alone (a view takes that path), every run."""
    a = RNG.random((8, 9)) * 1e3
    inner = interior(a, 1)
    alone = reduce(inner, "sum", device="cpu0")
    together = [reduce(inner, "sum", device=devices) for _ in range(3)]
    assert all(t == alone for t in together)
    assert np.isclose(alone, a[1:-1, 1:-1].sum(), rtol=1e-13)


@pytest.mark.parametrize("inclusive", [True, False])
def test_scan_of_all_elements(devices, inclusive):
    x = RNG.integers(-50, 50, 37)
    want = np.cumsum(x)
    if not inclusive:
        want = np.concatenate([[0], want[:-1]])
    got = scan(x, "sum", inclusive=inclusive, device=devices)
    assert got.shape == (37,)
    np.testing.assert_array_equal(got, want)


def test_scan_non_commutative_and_along_an_axis(devices):
    d = np.zeros(30, np.int64)
    d[[11, 20]] = [3, 4]
    want = np.where(np.arange(30) < 11, 0, 3)
    np.testing.assert_array_equal(scan(d, first_nonzero, device=devices), want)
    x = RNG.integers(0, 9, (5, 6))
    np.testing.assert_array_equal(scan(x, "max", axis=1, device=devices), np.maximum.accumulate(x, 1))


def test_sort_with_keys_and_of_views(devices):
    x = RNG.integers(0, 20, 25).astype(np.float64)
    np.testing.assert_array_equal(sort(x, key=negated, device=devices), -np.sort(-x, kind="stable"))
    a = RNG.random((6, 6))
    np.testing.assert_array_equal(sort(interior(a, 1), axis=None, device=devices), np.sort(a[1:-1, 1:-1], axis=None))
