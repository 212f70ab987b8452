"""Views as a user composes them, over every kind of root, against NumPy.

Random chains of view operators (built by ``view_chains``, whose oracle never calls
hetflow's transforms) over C, Fortran, strided, reversed and coherent (``hetflow.array``)
roots: the extent each view reports, its ``numpy()``, and a kernel reading and writing
through it on cpu0 (a few on the simulated gpu0), against NumPy's slicing, ``np.roll``
and ``np.swapaxes`` of the root's values.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hetflow
from hetflow import cshift, interior, project, section, transpose
from hetflow.index import extent_of, is_view
from test_buffer_sweep import twice_plus_one_1, twice_plus_one_2, twice_plus_one_3
from view_chains import OPS

# co_map steps (flip, stride, broadcast) call tuple slicing, which kernels cannot compile:
# their views are checked through numpy() only.
KERNEL_OPS = ("project", "cshift", "interior", "transpose", "section", "partition", "tile")
ROOTS = ("c", "fortran", "strided", "reversed", "coherent")


@hetflow.kernel
def read1(i, src, dst):
    dst[i] = src[i]


@hetflow.kernel
def read2(i, j, src, dst):
    dst[i, j] = src[i, j]


@hetflow.kernel
def read3(i, j, k, src, dst):
    dst[i, j, k] = src[i, j, k]


READ = {1: read1, 2: read2, 3: read3}
WRITE = {1: twice_plus_one_1, 2: twice_plus_one_2, 3: twice_plus_one_3}  # (out, x): out = x * 2 + 1


def make_root(kind, values):
    """An array holding ``values`` laid out as ``kind`` says."""
    if kind == "fortran":
        return np.asfortranarray(values)
    if kind == "strided":  # every other row of a larger array
        big = np.zeros((2 * values.shape[0],) + values.shape[1:])
        big[::2] = values
        return big[::2]
    if kind == "reversed":  # negative strides along dim 0
        return values[::-1].copy()[::-1]
    if kind == "coherent":
        return hetflow.array(values.copy())
    return values.copy()


def host_values(root):
    """The root's values as a NumPy array (a coherent array's host copy)."""
    return root.numpy() if hasattr(root, "map") else np.asarray(root)


@st.composite
def rooted_chains(draw, ops):
    """(root, values, view, ids, names): a chain of 1-4 operators over a rank 1-3 root of
    a kind from ROOTS; ``ids`` are the C-order flat indices into ``values`` the view
    selects, and every view of the chain reports the extent of its NumPy counterpart."""
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    values = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape) * 1.5 + 0.25
    root = make_root(draw(st.sampled_from(ROOTS)), values)
    ids = np.arange(values.size).reshape(shape)
    data = draw(st.data())
    view, names = root, []
    for _ in range(draw(st.integers(1, 4))):
        name = draw(st.sampled_from(ops))
        step = OPS[name](data, view, ids)
        if step is None:
            continue
        (view, ids), names = step, names + [name]
        assert view.extent == ids.shape, names
        assert view.cotransform_extent(extent_of(view.parent)) == view.extent, names
    return root, values, view, ids, names


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rooted_chains(tuple(OPS)))
def test_views_over_every_root_read_what_numpy_selects(chain):
    root, values, view, ids, names = chain
    if not is_view(view):
        return
    np.testing.assert_array_equal(view.numpy(), values.reshape(-1)[ids], err_msg=str(names))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rooted_chains(KERNEL_OPS))
def test_kernels_read_views_as_numpy_selects(chain):
    root, values, view, ids, names = chain
    if ids.ndim == 0:  # a launch has at least one dimension
        return
    out = np.full(ids.shape, -1.0)
    hetflow.forall(ids.shape, READ[ids.ndim], view, out, device="cpu0")
    np.testing.assert_array_equal(out, values.reshape(-1)[ids], err_msg=str(names))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rooted_chains(KERNEL_OPS))
def test_kernels_write_through_views_where_numpy_selects(chain):
    root, values, view, ids, names = chain
    if ids.ndim == 0:
        return
    src = np.arange(ids.size, dtype=np.float64).reshape(ids.shape) - 7.5
    hetflow.forall(ids.shape, WRITE[ids.ndim], view, src, device="cpu0")
    expect = values.copy()
    expect.reshape(-1)[ids.reshape(-1)] = (src * 2.0 + 1.0).reshape(-1)
    np.testing.assert_array_equal(host_values(root), expect, err_msg=str(names))


# -- shifts beyond the int64 range: reduced before index arrays add them -----------------
@pytest.mark.parametrize("shift", [2**70 + 1, -(2**70) - 3, np.uint64(2**64 - 1), np.int64(-7)])
@pytest.mark.parametrize("dim", [0, 1])
def test_cshift_by_any_integer_is_np_roll_by_its_remainder(shift, dim):
    a = np.arange(20.0).reshape(4, 5)
    expect = np.roll(a, -(int(shift) % a.shape[dim]), axis=dim)
    view = cshift(a, dim, shift)
    np.testing.assert_array_equal(view.numpy(), expect)
    assert view[3, 4] == expect[3, 4]
    out = np.zeros((4, 5))
    hetflow.forall((4, 5), read2, view, out, device="cpu0")
    np.testing.assert_array_equal(out, expect)


# -- NumPy integers are integers -----------------------------------------------------
A = np.arange(24.0).reshape(4, 6)
NUMPY_INTEGER_VIEWS = [
    (lambda: section(A, (np.int64(1), np.int32(0)), (np.uint8(2), np.int16(3))), A[1:3, 0:3]),
    (lambda: cshift(A, np.int8(1), np.int64(-7)), np.roll(A, 7, axis=1)),
    (lambda: interior(A, np.int64(1)), A[1:-1, 1:-1]),
    (lambda: interior(A, (np.uint32(1), np.int64(2))), A[1:-1, 2:-2]),
    (lambda: transpose(A, np.int32(0), np.int64(1)), A.T),
    (lambda: project(A, np.uint16(1), np.int64(2)), A[:, 2]),
    (lambda: hetflow.tile(A, (np.int64(2), np.int64(3)))[np.int64(1), np.int64(1)], A[2:4, 3:6]),
    (lambda: hetflow.partition(A, np.int64(3), np.int32(0))[np.int64(-1)], np.array_split(A, 3)[-1]),
    (lambda: hetflow.co_map(A, lambda i: (3 - i[0], i[1]), (np.int64(4), np.int64(6))), A[::-1]),
]


@pytest.mark.parametrize("make, expect", NUMPY_INTEGER_VIEWS)
def test_numpy_integer_parameters_are_accepted(make, expect):
    view = make()
    assert view.extent == expect.shape
    np.testing.assert_array_equal(view.numpy(), expect)


def test_numpy_integer_parameters_lower_into_kernels():
    view = transpose(cshift(section(A, (np.int64(1), np.int64(0)), (np.int64(3), np.int64(6))),
                            np.int64(1), np.uint64(2**64 - 1)), 0, 1)
    out = np.zeros((6, 3))
    hetflow.forall((6, 3), read2, view, out, device="cpu0")
    np.testing.assert_array_equal(out, np.roll(A[1:4], -((2**64 - 1) % 6), axis=1).T)


# -- edges: zero-extent, size-1, rank 0 -------------------------------------------------
def test_zero_extent_sections_launch_nothing_and_write_nothing():
    a = np.arange(24.0).reshape(4, 6)
    empty = cshift(section(a, (2, 0), (0, 6)), 1, -13)
    assert empty.extent == (0, 6) and empty.numpy().shape == (0, 6)
    hetflow.forall((0, 6), twice_plus_one_2, empty, np.zeros((0, 6)), device="cpu0")
    np.testing.assert_array_equal(a, np.arange(24.0).reshape(4, 6))


def test_size_one_dims_and_rank_zero_views_match_numpy():
    a = np.arange(6.0).reshape(1, 6, 1)
    view = transpose(cshift(a, 0, -5), 0, 2)
    np.testing.assert_array_equal(view.numpy(), np.swapaxes(a, 0, 2))
    out = np.zeros((1, 6, 1))
    hetflow.forall((1, 6, 1), read3, view, out, device="cpu0")
    np.testing.assert_array_equal(out, np.swapaxes(a, 0, 2))
    point = project(project(project(a, 2, 0), 0, 0), 0, 4)
    assert point.extent == () and point.numpy() == a[0, 4, 0] and point[()] == a[0, 4, 0]


def test_view_repr_names_the_chain_and_the_root():
    root = hetflow.array(np.zeros((4, 6), np.float32))
    v = cshift(interior(root, 1), 1, -1)
    assert repr(v) == "cshift(interior(Buffer<float32>(4, 6), delta=index(1, 1)), dim=1, shift=-1)"
    assert str(v) == repr(v)
    assert repr(hetflow.partition(v, 2, 0)) == (
        "partition(cshift(interior(Buffer<float32>(4, 6), delta=index(1, 1)), dim=1, shift=-1), "
        "dim=0, sizes=(1, 1))")


# -- the simulated GPU ---------------------------------------------------------------
SIM_CHAINS = [
    ("fortran", lambda r: transpose(cshift(r, 1, -9), 0, 1), lambda v: np.roll(v, 9, axis=1).T),
    ("strided", lambda r: section(cshift(r, 0, 7), (1, 1), (2, 3)), lambda v: np.roll(v, -7, axis=0)[1:3, 1:4]),
    ("coherent", lambda r: interior(transpose(r, 0, 1), 1), lambda v: v.T[1:-1, 1:-1]),
]


@pytest.mark.simgpu
@pytest.mark.parametrize("kind, make, meaning", SIM_CHAINS, ids=[c[0] for c in SIM_CHAINS])
def test_gpu_kernels_read_and_write_views_as_numpy(kind, make, meaning):
    values = np.arange(12.0).reshape(3, 4)
    root = make_root(kind, values)
    view = make(root)
    out = np.zeros(view.extent)
    hetflow.forall(view.extent, read2, view, out, device="gpu0")
    np.testing.assert_array_equal(out, meaning(values))
    src = np.arange(out.size, dtype=np.float64).reshape(out.shape)
    hetflow.forall(view.extent, twice_plus_one_2, view, src, device="gpu0")
    expect = values.copy()
    expect.reshape(-1)[meaning(np.arange(12).reshape(3, 4)).reshape(-1)] = (src * 2.0 + 1.0).reshape(-1)
    np.testing.assert_array_equal(host_values(root), expect)
