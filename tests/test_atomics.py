"""hetflow.atomic: histograms and atomic min/max/cas on every CPU worker and the simulated
GPU, checked against NumPy and sequential oracles; the warning for scattered writes
without atomics."""
import logging
import warnings

import numba
import numpy as np
import pytest

import hetflow
from hetflow import atomic

N = 1 << 17       # above cpu.INLINE_LIMIT: the launch runs over every core
BINS = 64


@hetflow.kernel
def histogram(i, x, h):
    atomic.add(h, int(x[i] * h.shape[0]), 1)


@hetflow.kernel
def histogram_2d(i, x, y, h):
    hetflow.atomic.add(h, (int(x[i] * h.shape[0]), int(y[i] * h.shape[1])), 1)


@hetflow.kernel
def racy_histogram(i, x, h):
    b = int(x[i] * h.shape[0])
    h[b] += 1


@hetflow.kernel
def tickets(i, counter, order):
    t = atomic.add(counter, 0, 1)
    order[t] = i


@hetflow.kernel
def extremes(i, x, lo, hi):
    b = int(x[i] * lo.shape[0])
    atomic.min(lo, b, x[i])
    atomic.max(hi, (b,), x[i])


@hetflow.kernel
def first_claim(i, x, owner, won):
    won[i] = atomic.cas(owner, int(x[i] * owner.shape[0]), -1, i) == -1


def _samples(n=N, seed=0):
    return np.random.default_rng(seed).random(n)


def _parallel_cpu():
    if numba.get_num_threads() < 2:
        pytest.skip("one CPU thread: nothing runs in parallel")


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32, np.uint64, np.float32, np.float64])
def test_histogram_with_atomics_equals_numpy_on_every_cpu_worker(dtype):
    _parallel_cpu()
    x = _samples()
    expected = np.histogram(x, BINS, (0, 1))[0]
    for run in range(5):
        h = np.zeros(BINS, dtype)
        report = hetflow.forall(N, histogram, x, h, device="cpu0")
        np.testing.assert_array_equal(h, expected, err_msg=f"run {run}")
        assert len(report.workers) > 1


def test_histogram_with_atomics_on_work_stealing_workers():
    _parallel_cpu()
    x = _samples(seed=1)
    h = np.zeros(BINS, np.int64)
    report = hetflow.forall(N, histogram, x, h, device="cpu0", schedule="steal")
    np.testing.assert_array_equal(h, np.histogram(x, BINS, (0, 1))[0])
    assert sum(w.indices for w in report.workers) == N


def test_two_dimensional_index():
    _parallel_cpu()
    x, y = _samples(seed=2), _samples(seed=3)
    h = np.zeros((8, 16), np.int64)
    hetflow.forall(N, histogram_2d, x, y, h, device="cpu0")
    np.testing.assert_array_equal(h, np.histogram2d(x, y, (8, 16), ((0, 1), (0, 1)))[0])


def test_add_returns_the_old_value_to_exactly_one_index_each():
    counter, order = np.zeros(1, np.int64), np.full(N, -1, np.int64)
    with warnings.catch_warnings():  # a store at an index an atomic handed out does not race
        warnings.simplefilter("error")
        hetflow.forall(N, tickets, counter, order, device="cpu0")
    assert counter[0] == N
    np.testing.assert_array_equal(np.sort(order), np.arange(N))  # every ticket drawn once


def test_min_and_max_equal_a_sequential_oracle():
    x = _samples(seed=4)
    lo, hi = np.full(BINS, np.inf), np.full(BINS, -np.inf)
    hetflow.forall(N, extremes, x, lo, hi, device="cpu0")
    want_lo, want_hi = np.full(BINS, np.inf), np.full(BINS, -np.inf)
    b = (x * BINS).astype(np.int64)
    np.minimum.at(want_lo, b, x)
    np.maximum.at(want_hi, b, x)
    np.testing.assert_array_equal(lo, want_lo)
    np.testing.assert_array_equal(hi, want_hi)


def test_compare_and_swap_lets_one_index_per_element_win():
    x = _samples(seed=5)
    owner, won = np.full(BINS, -1, np.int64), np.zeros(N, np.bool_)
    hetflow.forall(N, first_claim, x, owner, won, device="cpu0")
    b = (x * BINS).astype(np.int64)
    assert won.sum() == len(np.unique(b))
    np.testing.assert_array_equal(b[owner], np.arange(BINS))      # each owner lies in its bin
    np.testing.assert_array_equal(np.flatnonzero(won), np.sort(owner))


def test_plain_python_semantics():
    a = np.array([5, 3], np.int64)
    assert (atomic.add(a, 1, 4), a[1]) == (3, 7)
    assert (atomic.min(a, 0, 9), a[0]) == (5, 5)
    assert (atomic.max(a, (0,), 9), a[0]) == (5, 9)
    assert (atomic.cas(a, 0, 1, 2), a[0]) == (9, 9)   # no swap: 9 != 1
    assert (atomic.cas(a, 0, 9, 2), a[0]) == (9, 2)
    f = np.array([np.nan, 1.0])
    assert np.isnan(atomic.min(f, 0, 0.5)) and f[0] == 0.5   # a NaN operand is ignored
    with pytest.raises(IndexError):
        atomic.add(a, 2, 1)
    with pytest.raises(IndexError):
        atomic.add(a, -1, 1)   # never wrapped, as on a GPU


def test_plain_python_refuses_what_compiled_code_refuses_and_wraps_as_it_does():
    # The simulator's threads run these: they took int8, bool and complex arrays, cas of
    # floats, and raised OverflowError where compiled code wraps.
    for dtype in (np.int8, np.bool_, np.complex128, np.float16):
        with pytest.raises(TypeError, match=r"hetflow.atomic.add: needs an array of int32, int64"):
            atomic.add(np.zeros(2, dtype), 0, 1)
    with pytest.raises(TypeError, match=r"hetflow.atomic.cas: needs an array of int32, int64, uint32, uint64"):
        atomic.cas(np.zeros(2), 0, 0.0, 1.5)
    with pytest.raises(IndexError, match=r"the index of a 2-D array must be 2 integer\(s\); got 1"):
        atomic.add(np.zeros((2, 2), np.int64), 1, 1)
    u, i = np.zeros(1, np.uint32), np.full(1, 2**31 - 1, np.int32)
    assert (atomic.add(u, 0, -1), u[0]) == (0, 2**32 - 1)
    assert (atomic.add(i, 0, 1), i[0]) == (2**31 - 1, -2**31)


@hetflow.kernel
def nan_and_out_of_bounds(i, f, a, k):
    atomic.max(f, i, 2.0)
    atomic.add(a, k, 1)


def test_compiled_edge_cases_match_the_python_ones():
    f, a = np.array([np.nan, 3.0]), np.zeros(2, np.int64)
    hetflow.forall(2, nan_and_out_of_bounds, f, a, 0, device="cpu0")
    np.testing.assert_array_equal(f, [2.0, 3.0])
    with pytest.raises(hetflow.errors.KernelRaisedError, match="out of bounds"):
        hetflow.forall(2, nan_and_out_of_bounds, f, a, 2, device="cpu0")


def test_an_unsupported_element_type_fails_to_compile_naming_atomic():
    with pytest.raises(hetflow.errors.KernelCompileError, match=r"add\(array\(int8"):
        hetflow.forall(4, histogram, _samples(4), np.zeros(4, np.int8), device="cpu0")


def test_a_kernel_compiled_from_its_function_object_uses_atomics():
    _parallel_cpu()
    namespace = {"hetflow": hetflow}
    exec("def hist(i, x, h):\n    hetflow.atomic.add(h, int(x[i] * h.shape[0]), 1)\n", namespace)
    k = hetflow.kernel(namespace["hist"])
    assert k.compilable and not k.has_source
    x = _samples(seed=6)
    h = np.zeros(BINS, np.int64)
    hetflow.forall(N, k, x, h, device="cpu0")
    np.testing.assert_array_equal(h, np.histogram(x, BINS, (0, 1))[0])


# -- the warning for scattered writes ---------------------------------------------------------
def test_scattered_writes_without_atomics_warn_naming_kernel_and_array():
    _parallel_cpu()
    with pytest.warns(hetflow.errors.ScatteredWriteWarning, match=r"'racy_histogram' writes 'h'.*hetflow\.atomic") as caught:
        hetflow.forall(N, racy_histogram, _samples(), np.zeros(BINS, np.int64), device="cpu0")
    assert caught[0].filename == __file__  # the user's call, not hetflow's code


def test_atomics_silence_the_warning():
    _parallel_cpu()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hetflow.forall(N, histogram, _samples(), np.zeros(BINS, np.int64), device="cpu0")


# -- the simulated GPU -------------------------------------------------------------------------
@pytest.mark.simgpu
@pytest.mark.parametrize("dtype", [np.int32, np.float64])
def test_histogram_with_atomics_on_the_simulated_gpu(gpu_device, dtype):
    x = _samples(48, seed=7)
    for run in range(3):
        h = np.zeros(8, dtype)
        hetflow.forall(48, histogram, x, h, device=gpu_device.id)
        np.testing.assert_array_equal(h, np.histogram(x, 8, (0, 1))[0], err_msg=f"run {run}")


@pytest.mark.simgpu
def test_min_max_cas_on_the_simulated_gpu(gpu_device):
    x = _samples(40, seed=8)
    lo, hi = np.full(4, np.inf), np.full(4, -np.inf)
    hetflow.forall(40, extremes, x, lo, hi, device=gpu_device.id)
    b = (x * 4).astype(np.int64)
    for k in range(4):
        assert (lo[k], hi[k]) == (x[b == k].min(), x[b == k].max())
    owner, won = np.full(4, -1, np.int64), np.zeros(40, np.bool_)
    hetflow.forall(40, first_claim, x, owner, won, device=gpu_device.id)
    assert won.sum() == 4 and (b[owner] == np.arange(4)).all()


@pytest.mark.simgpu
def test_atomics_over_cpu_and_gpu_run_on_one_device_without_a_warning(gpu_device, caplog):
    x = _samples(64, seed=9)
    h = np.zeros(8, np.int64)
    with caplog.at_level(logging.INFO), warnings.catch_warnings():
        warnings.simplefilter("error")
        report = hetflow.forall(64, histogram, x, h, device=["cpu0", gpu_device.id])
    np.testing.assert_array_equal(h, np.histogram(x, 8, (0, 1))[0])
    assert report.schedule == "one-device"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "writes 'h' outside the rows" in caplog.text


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32, np.uint64, np.float32, np.float64])
def test_atomics_on_a_real_gpu(gpu_device, dtype):
    x, y = _samples(1 << 20, seed=10), _samples(1 << 20, seed=11)
    for run in range(3):
        h = np.zeros(BINS, dtype)
        hetflow.forall(x.shape[0], histogram, x, h, device=gpu_device.id)
        np.testing.assert_array_equal(h, np.histogram(x, BINS, (0, 1))[0], err_msg=f"run {run}")
    h2 = np.zeros((8, 16), dtype)
    hetflow.forall(x.shape[0], histogram_2d, x, y, h2, device=gpu_device.id)
    np.testing.assert_array_equal(h2, np.histogram2d(x, y, (8, 16), ((0, 1), (0, 1)))[0])
    lo, hi = np.full(BINS, np.inf), np.full(BINS, -np.inf)
    hetflow.forall(x.shape[0], extremes, x, lo, hi, device=gpu_device.id)
    b = (x * BINS).astype(np.int64)
    want_lo, want_hi = np.full(BINS, np.inf), np.full(BINS, -np.inf)
    np.minimum.at(want_lo, b, x)
    np.maximum.at(want_hi, b, x)
    np.testing.assert_array_equal(lo, want_lo)
    np.testing.assert_array_equal(hi, want_hi)
    owner, won = np.full(BINS, -1, np.int64), np.zeros(x.shape[0], np.bool_)
    hetflow.forall(x.shape[0], first_claim, x, owner, won, device=gpu_device.id)
    assert won.sum() == BINS and (b[owner] == np.arange(BINS)).all()
    counter, order = np.zeros(1, np.int64), np.full(x.shape[0], -1, np.int64)
    hetflow.forall(x.shape[0], tickets, counter, order, device=gpu_device.id)
    np.testing.assert_array_equal(np.sort(order), np.arange(x.shape[0]))
