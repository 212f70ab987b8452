"""NumPy arguments sharing memory of one array otherwise than as a box of each other
(steps, offsets, transposes, negative steps, hetflow views over slices) on the simulated
GPU and co-executed: one GPU copy of the bytes they span, each argument a strided view of
it, so every device gives the sequential loop's result (NumPy oracles) or, where a written
element is touched through another argument at another index, the same ShapeError."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hetflow
from hetflow import co_map, interior
from hetflow.errors import ShapeError

# every test on the simulated GPU (CI) and on a real one (pytest -m gpu)
pytestmark = pytest.mark.usefixtures("gpu_kind", "tiny_chunks")


@pytest.fixture(params=[pytest.param("simulated", marks=pytest.mark.simgpu),
                        pytest.param("real", marks=pytest.mark.gpu)])
def gpu_kind(request):
    return request.param

BOTH = ["cpu0", "gpu0"]
DEVICES = [pytest.param("gpu0", id="gpu0"), pytest.param(BOTH, id="cpu0+gpu0")]
RACE = r"which overlap in one array at different indices: the result would depend on the order"


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@hetflow.kernel
def from_column(i, col, m):
    m[i, 1] = 2.0 * col[i] + m[i, 2]


@hetflow.kernel
def both(i, x, y):
    x[i] = 100.0 + i
    y[i] = -1.0 - i


@hetflow.kernel
def corner(i, j, m, t):
    m[i, j] = t[i, j] + 0.5


@hetflow.kernel
def twice(i, out, x):
    out[i] = 2.0 * x[i] + 1.0


@hetflow.kernel
def twice2(i, j, out, x):
    out[i, j] = 2.0 * x[i, j] + 1.0


@hetflow.kernel
def fill2(i, j, x, y):
    x[i, j] = 10.0 * i + j
    y[i, j] = -1.0 - j


def test_a_column_read_beside_its_matrix_written(device):
    """``a[:, 0]`` (another stride than ``a``) read and ``a`` written at the same row."""
    a = np.arange(15.0).reshape(5, 3)
    want = a.copy()
    want[:, 1] = 2.0 * want[:, 0] + want[:, 2]
    hetflow.forall(5, from_column, a[:, 0], a, device=device)
    np.testing.assert_array_equal(a, want)


def test_two_written_slices_overlapping_beyond_the_launch(device):
    """``a[:6]`` and ``a[4:]`` share ``a[4:6]``, which a launch of 4 touches through neither."""
    a = np.arange(10.0)
    want = a.copy()
    want[:4] = 100.0 + np.arange(4)
    want[4:8] = -1.0 - np.arange(4)
    hetflow.forall(4, both, a[:6], a[4:], device=device)
    np.testing.assert_array_equal(a, want)


def test_interleaved_steps_and_a_transposed_corner(device):
    a = np.arange(8.0)
    hetflow.forall(4, both, a[::2], a[1::2], device=device)
    np.testing.assert_array_equal(a, np.ravel(np.column_stack((100.0 + np.arange(4), -1.0 - np.arange(4)))))
    m = np.arange(16.0).reshape(4, 4)
    want = m.copy()
    want[:2, :2] = m.T[2:, 2:] + 0.5
    hetflow.forall((2, 2), corner, m, m.T[2:, 2:], device=device)
    np.testing.assert_array_equal(m, want)


def test_a_reversed_slice_beside_a_view_reading_it_backwards(device):
    """Negative strides: ``a[::-1]`` written, a co_map view of ``a`` read at the same element."""
    a = np.arange(6.0)
    backwards = co_map(a, lambda idx: (5 - idx[0],), (6,))
    hetflow.forall(6, twice, a[::-1], backwards, device=device)
    np.testing.assert_array_equal(a, 2.0 * np.arange(6.0) + 1.0)


def test_a_view_over_one_slice_written_beside_another_slice_read(device):
    """``interior(a[2:6], 1)`` written (``a[3:5]``) and ``a[:5]`` read at 2 indices (``a[0:2]``)."""
    a = np.arange(9.0)
    want = a.copy()
    want[3:5] = 2.0 * a[0:2] + 1.0
    hetflow.forall(2, twice, interior(a[2:6], 1), a[:5], device=device)
    np.testing.assert_array_equal(a, want)


@pytest.mark.parametrize("lower", [False, True])
def test_co_executed_rows_bring_home_only_what_the_launch_touched(lower):
    """``x = a[1:]`` written in columns 0-1 of each row, ``y = a[:-1, 2:]`` (``lower``: the
    other way round) written in columns 2-3: row r of x holds row r + 1 of y, which the
    other device may have computed. Each brings home only its columns, so no device
    overwrites the other's results with the values its copy held."""
    for schedule in ("static", "steal"):
        a = np.zeros((9, 4))
        x, y = (a[:-1], a[1:, 2:]) if lower else (a[1:], a[:-1, 2:])
        hetflow.forall((8, 2), fill2, x, y, device=BOTH, schedule=schedule,
                       **({"shares": [0.5, 0.5]} if schedule == "static" else {}))
        want = np.zeros((9, 4))
        wx, wy = (want[:-1], want[1:, 2:]) if lower else (want[1:], want[:-1, 2:])
        wx[:, :2] = 10.0 * np.arange(8)[:, None] + np.arange(2)
        wy[:, :2] = -1.0 - np.arange(2)
        np.testing.assert_array_equal(a, want, err_msg=schedule)


def test_a_written_element_read_at_another_index_is_refused_on_every_device():
    """What hetflow promises: where a written element is touched through another
    argument at another index (the result would depend on the order threads run in), every
    device refuses before anything runs; here ``a[1:]`` written, ``a[:-1]`` read."""
    for device in ("cpu0", "gpu0", BOTH):
        a = np.arange(6.0)
        with pytest.raises(ShapeError, match=r"kernel 'twice' writes argument 'out' \(ndarray<float64>\(5,\)\) "
                                             r"and reads argument 'x' \(ndarray<float64>\(5,\)\), " + RACE):
            hetflow.forall(5, twice, a[1:], a[:-1], device=device)
        np.testing.assert_array_equal(a, np.arange(6.0))


def cut(start: int, length: int, step: int) -> slice:
    """``length`` elements (fewer where the axis ends) from ``start`` by ``step``."""
    stop = start + step * length
    return slice(start, None if stop < 0 else stop, step)


def slicing(n):
    """A non-empty slice of an axis of length ``n``, forwards or backwards."""
    return st.builds(cut, st.integers(0, n - 1), st.integers(1, n), st.sampled_from([1, 2, 3, -1, -2]))


@st.composite
def overlapping(draw):
    """(rank, shape, kernel, the written argument's slicing, the other's, whether the other
    slices the transpose) of one array."""
    rank = draw(st.sampled_from([1, 2]))
    shape = (12,) if rank == 1 else (4, 5)
    pick = [draw(slicing(n)) for n in shape], [draw(slicing(n)) for n in shape]
    flip = rank == 2 and draw(st.booleans())  # the second a transposed view: a.T[...]
    kernel = draw(st.sampled_from(["copy", "both"]))
    return rank, shape, kernel, tuple(pick[0]), tuple(pick[1]), flip


def over(root, first, second, flip):
    return root[first], (root.T if flip else root)[second]


def sequential(rank, kernel, out, x, extent) -> None:
    """The kernel's loop, index by index, in NumPy (the oracle)."""
    for idx in np.ndindex(*extent):
        if kernel == "copy":
            out[idx] = 2.0 * x[idx] + 1.0
        else:
            out[idx] = 100.0 + idx[0] if rank == 1 else 10.0 * idx[0] + idx[1]
            x[idx] = -1.0 - idx[-1]


@settings(max_examples=14, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(overlapping())
def test_random_slicings_equal_the_sequential_loop_or_are_refused_everywhere(case):
    rank, shape, kernel, first, second, flip = case
    size = int(np.prod(shape))
    labels = np.arange(size).reshape(shape)       # element numbers: which elements meet
    out_l, x_l = over(labels, first, second, flip)
    extent = tuple(min(p, q) for p, q in zip(out_l.shape, x_l.shape))
    touched = {}
    for idx in np.ndindex(*extent):
        touched.setdefault(int(out_l[idx]), set()).add(idx)
    race = any(touched.get(int(x_l[idx]), {idx}) != {idx} for idx in np.ndindex(*extent))
    want = np.arange(size, dtype=float).reshape(shape)
    if not race:
        sequential(rank, kernel, *over(want, first, second, flip), extent)
    fn = (twice if rank == 1 else twice2) if kernel == "copy" else (both if rank == 1 else fill2)
    for device in ("cpu0", "gpu0", BOTH):
        a = np.arange(size, dtype=float).reshape(shape)
        if race:
            with pytest.raises(ShapeError, match=RACE):
                hetflow.forall(extent, fn, *over(a, first, second, flip), device=device)
            np.testing.assert_array_equal(a, want, err_msg=f"{device}: refused, yet something ran")
        else:
            hetflow.forall(extent, fn, *over(a, first, second, flip), device=device)
            np.testing.assert_array_equal(a, want, err_msg=f"{device}: {case}")


@pytest.mark.parametrize("schedule", ["gpu0", BOTH])
def test_one_plan_over_copies_laid_out_otherwise_indexes_each_rightly(schedule):
    """One plan (the same host structure), staged first as a contiguous copy of its own,
    then as a strided view of a copy shared with an overlapping argument: the GPU's entry
    must be the one for each launch's device layout (one built for the first read
    ``a[1]`` for ``x[1]``, ``a[2]``, on a real GPU)."""
    b = np.arange(12.0)
    hetflow.forall(2, twice, np.zeros(2), b[0:4:2], device=schedule)   # x: a copy of its own
    a = np.arange(12.0)
    hetflow.forall(2, twice, a[0:2], a[0:4:2], device=schedule)       # x: a view of a's copy
    np.testing.assert_array_equal(a[:4], [1.0, 5.0, 2.0, 3.0])
    other = np.zeros((6, 6))
    hetflow.forall((4, 4), twice2, other[1:-1, 1:-1], interior(np.ones((6, 6)), 1), device=schedule)
    np.testing.assert_array_equal(other[1:-1, 1:-1], 3.0)               # out: a copy of its own
    m = np.arange(36.0).reshape(6, 6)
    want = m.copy()
    want[1:-1, 1:-1] = 2.0 * m[1:-1, 1:-1] + 1.0
    hetflow.forall((4, 4), twice2, m[1:-1, 1:-1], interior(m, 1), device=schedule)  # out: a box of m's
    np.testing.assert_array_equal(m, want)
