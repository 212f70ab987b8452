"""hetflow.atomic on views: each view index names one root element, which the operation
updates; oracle a sequential NumPy run over the root indices the view maps to."""
import numpy as np
import pytest

import hetflow
from hetflow import atomic, co_map, cshift, interior, project, section, transpose
from hetflow.errors import KernelCompileError, KernelRaisedError

BINS = 4


@hetflow.kernel
def histogram(i, x, h):
    atomic.add(h, int(x[i] * BINS), 1)


@hetflow.kernel
def histogram_by_keyword(i, x, h):
    atomic.add(ary=h, idx=int(x[i] * BINS), val=1)


@hetflow.kernel
def extremes(i, x, lo, hi):
    b = int(x[i] * BINS)
    atomic.min(lo, (b % 2, b // 2), x[i])
    atomic.max(hi, (b % 2, b // 2), x[i])


@hetflow.kernel
def tickets(i, counter, order):
    order[i] = atomic.add(counter, 0, 1)


@hetflow.kernel
def first_claim(i, x, owner):
    atomic.cas(owner, int(x[i] * BINS), -1, i)


@hetflow.kernel
def one_index(i, h):
    atomic.add(h, i, 1)


def _samples(n, seed):
    return np.random.default_rng(seed).random(n)


# (name, root, the view of it, the root index of each view index 0..BINS-1)
def _bins():
    return [
        ("section", np.zeros(10, np.int64), lambda r: section(r, (3,), (BINS,)), (np.arange(3, 7),)),
        ("cshift", np.zeros(BINS, np.int64), lambda r: cshift(r, 0, 3), ((np.arange(BINS) + 3) % BINS,)),
        ("interior", np.zeros(6, np.int64), lambda r: interior(r, (1,)), (np.arange(1, 5),)),
        ("project of a transpose", np.zeros((3, BINS), np.int64), lambda r: project(transpose(r, 0, 1), 1, 2),
         (np.full(BINS, 2), np.arange(BINS))),
        ("co_map", np.zeros(10, np.int64), lambda r: co_map(r, lambda idx: (9 - idx[0],), (BINS,)),
         (9 - np.arange(BINS),)),
    ]


def _check_histograms(kernel, devices, n=48):
    x = _samples(n, seed=3)
    counts = np.histogram(x, BINS, (0, 1))[0]
    for name, root, view, roots in _bins():
        for dev in devices:
            h = root.copy()
            hetflow.forall(n, kernel, x, view(h), device=dev)
            want = root.copy()
            np.add.at(want, roots, counts)
            np.testing.assert_array_equal(h, want, err_msg=f"{name} on {dev}")


def _check_min_max_cas_and_old_values(device, n=40):
    x = _samples(n, seed=4)
    b = (x * BINS).astype(np.int64)
    lo, hi = np.full((2, 2), np.inf), np.full((2, 2), -np.inf)
    hetflow.forall(n, extremes, x, transpose(lo, 0, 1), transpose(hi, 0, 1), device=device)
    want_lo, want_hi = np.full((2, 2), np.inf), np.full((2, 2), -np.inf)
    for k in range(n):  # view index (b % 2, b // 2) of a transpose: root index (b // 2, b % 2)
        r = (b[k] // 2, b[k] % 2)
        want_lo[r], want_hi[r] = min(want_lo[r], x[k]), max(want_hi[r], x[k])
    np.testing.assert_array_equal(lo, want_lo)
    np.testing.assert_array_equal(hi, want_hi)
    owner = np.full(BINS + 2, -1, np.int64)
    hetflow.forall(n, first_claim, x, section(owner, (1,), (BINS,)), device=device)
    assert owner[0] == owner[-1] == -1
    np.testing.assert_array_equal(b[owner[1:-1]], np.arange(BINS))
    counter, order = np.zeros(3, np.int64), np.full(n, -1, np.int64)
    hetflow.forall(n, tickets, section(counter, (1,), (1,)), order, device=device)
    np.testing.assert_array_equal(np.sort(order), np.arange(n))  # each old value handed out once
    np.testing.assert_array_equal(counter, [0, n, 0])


def test_add_through_every_view_kind_equals_numpy_on_the_cpu():
    _check_histograms(histogram, ["cpu0"])


def test_min_max_cas_through_views_equal_a_sequential_run_on_the_cpu():
    _check_min_max_cas_and_old_values("cpu0")


@pytest.mark.simgpu
def test_add_through_every_view_kind_equals_numpy_on_the_simulated_gpu(gpu_device):
    _check_histograms(histogram, [gpu_device.id], n=16)


@pytest.mark.simgpu
def test_min_max_cas_through_views_equal_a_sequential_run_on_the_simulated_gpu(gpu_device):
    _check_min_max_cas_and_old_values(gpu_device.id, n=16)


@pytest.mark.simgpu
def test_an_atomic_passed_its_view_by_keyword_writes_it_back_from_the_gpu(gpu_device):
    assert histogram_by_keyword.access(1).atomic == {"h"}
    assert histogram_by_keyword.access(1).writes("h")
    _check_histograms(histogram_by_keyword, ["cpu0", gpu_device.id], n=16)


@pytest.mark.simgpu
def test_co_executed_atomics_through_a_view_give_numpys_sum(gpu_device):
    x = _samples(64, seed=5)
    h = np.zeros(10, np.int64)
    hetflow.forall(64, histogram, x, section(h, (3,), (BINS,)), device=["cpu0", gpu_device.id])
    want = np.zeros(10, np.int64)
    want[3:7] = np.histogram(x, BINS, (0, 1))[0]
    np.testing.assert_array_equal(h, want)


def test_an_element_type_atomics_do_not_take_fails_to_compile_naming_the_view():
    with pytest.raises(KernelCompileError, match=r"kernel 'histogram'.*add\(hetflow\.view\d+_cpu\(array\(int16, "
                                                 r"1d, C\)\)"):
        hetflow.forall(4, histogram, _samples(4, 0), section(np.zeros(8, np.int16), (2,), (BINS,)), device="cpu0")


@pytest.mark.simgpu
def test_a_view_index_of_the_wrong_rank_is_refused_on_the_simulated_gpu(gpu_device):
    with pytest.raises(KernelRaisedError, match=r"kernel 'one_index' raised IndexError.*hetflow\.atomic\.add: "
                                                r"the index of view argument 'h', a view of rank 2, must be 2 integer\(s\); "
                                                r"got \d"):
        hetflow.forall(2, one_index, transpose(np.zeros((2, 2)), 0, 1), device=gpu_device.id)


def test_a_view_index_of_the_wrong_rank_fails_to_compile_on_the_cpu():
    with pytest.raises(KernelCompileError, match=r"kernel 'one_index'.*add\(hetflow\.view\d+_cpu\(array\(float64, "
                                                 r"2d, C\)\), int64, Literal\[int\]\(1\)\)"):
        hetflow.forall(2, one_index, transpose(np.zeros((2, 2)), 0, 1), device="cpu0")


@hetflow.kernel(boundscheck=True)
def checked_histogram(i, x, h):
    atomic.add(h, int(x[i] * BINS), 1)


def _check_checked(device):
    x = _samples(16, seed=6)
    counts = np.histogram(x, BINS, (0, 1))[0]
    h = np.zeros(10, np.int64)
    hetflow.forall(16, checked_histogram, x, section(h, (3,), (BINS,)), device=device)
    np.testing.assert_array_equal(h[3:7], counts)
    plain = np.zeros(BINS, np.int64)
    hetflow.forall(16, checked_histogram, x, plain, device=device)
    np.testing.assert_array_equal(plain, counts)
    with pytest.raises(hetflow.errors.IndexOutOfBoundsError,
                       match=r"kernel 'checked_histogram' indexed view 'h' out of bounds: root index 10 on axis 0"):
        hetflow.forall(16, checked_histogram, x * 2, section(np.zeros(10, np.int64), (3,), (BINS,)), device=device)
    with pytest.raises(hetflow.errors.IndexOutOfBoundsError,
                       match=r"kernel 'checked_histogram' indexed 'h' out of bounds: index -\d+ on axis 0"):
        hetflow.forall(16, checked_histogram, -x - 0.3, np.zeros(BINS, np.int64), device=device)


def test_checked_atomics_on_views_and_arrays_on_the_cpu():
    _check_checked("cpu0")


@pytest.mark.simgpu
def test_checked_atomics_on_views_and_arrays_on_the_simulated_gpu(gpu_device):
    _check_checked(gpu_device.id)


@pytest.mark.gpu
def test_atomics_through_views_on_a_real_gpu(gpu_device):
    """Every view kind, min/max/cas, the keyword form, co-execution and checked atomics,
    compiled by numba-cuda and run on the GPU (thousands of threads contending)."""
    _check_histograms(histogram, [gpu_device.id], n=4096)
    _check_histograms(histogram_by_keyword, [gpu_device.id], n=4096)
    _check_min_max_cas_and_old_values(gpu_device.id, n=4096)
    x = _samples(1 << 16, seed=5)
    h = np.zeros(10, np.int64)
    hetflow.forall(1 << 16, histogram, x, section(h, (3,), (BINS,)), device=["cpu0", gpu_device.id])
    want = np.zeros(10, np.int64)
    want[3:7] = np.histogram(x, BINS, (0, 1))[0]
    np.testing.assert_array_equal(h, want)
    _check_checked(gpu_device.id)
