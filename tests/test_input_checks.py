"""Inputs checked before anything runs: map-reduce extents, co_map reach, hetflow.array's
data, scans of Buffers and the allocations' shapes and dtypes. Oracle: NumPy."""
import numpy as np
import pytest

import hetflow
from hetflow import Buffer, co_map, interior
from hetflow.errors import ArgumentError, ArgumentTypeError, IndexOutOfBoundsError, ShapeError
from hetflow.index import arrays, operators

RNG = np.random.default_rng(7)


@hetflow.kernel
def value(i, x):
    return x[i]


@hetflow.kernel
def copy(i, out, x):
    out[i] = x[i]


@hetflow.kernel
def value2(i, j, a):
    return a[i, j]


@hetflow.kernel
def guarded(i, x, n):
    if i < n:
        return x[i]
    return 0.0


@hetflow.kernel
def add_scalar(i, x, s):
    x[i] = x[i] + s[()]


@hetflow.kernel
def double(i, x):
    x[i] = 2.0 * x[i]


# -- map-reduce: the extent checked as forall checks it -------------------------------------
@pytest.mark.parametrize("n", [11, 100, 100_000])
def test_map_reduce_over_more_indices_than_an_array_has_is_a_shape_error(n):
    x = RNG.random(10)
    with pytest.raises(ShapeError, match=rf"kernel 'value' argument 'x': array of extent \(10,\) does not "
                                         rf"fit the launch extent \({n},\)"):
        hetflow.reduce(n, value, x)


def test_map_reduce_says_what_forall_says():
    x = RNG.random(10)
    with pytest.raises(ShapeError) as by_forall:
        hetflow.forall(11, copy, np.zeros(11), x)
    with pytest.raises(ShapeError) as by_reduce:
        hetflow.reduce(11, value, x)
    assert str(by_reduce.value) == str(by_forall.value).replace("'copy'", "'value'")


def test_map_reduce_over_a_view_must_match_its_extent():
    x = np.arange(10.0)
    with pytest.raises(ShapeError, match=r"kernel 'value' argument 'x': view of extent \(8,\) does not fit "
                                         r"the launch extent \(10,\) \(a view must match it exactly\)"):
        hetflow.reduce(10, value, interior(x, 1))
    assert hetflow.reduce(8, value, interior(x, 1)) == x[1:-1].sum()


def test_map_reduce_checks_every_axis_and_spares_guarded_accesses():
    a = RNG.random((3, 4))
    with pytest.raises(ShapeError, match=r"argument 'a': array of extent \(3, 4\) does not fit the launch "
                                         r"extent \(3, 5\)"):
        hetflow.reduce((3, 5), value2, a)
    assert np.isclose(hetflow.reduce((3, 4), value2, a), a.sum())
    assert np.isclose(hetflow.reduce((2, 3), value2, a), a[:2, :3].sum())  # an array may be larger
    x = RNG.random(10)
    assert np.isclose(hetflow.reduce(16, guarded, x, 10), x.sum())  # if i < n: no extent check


def test_map_reduce_extent_is_checked_on_the_gpu_and_co_executed(gpu_device):
    x = RNG.random(10)
    for device in (gpu_device.id, ["cpu0", gpu_device.id]):
        with pytest.raises(ShapeError, match=r"array of extent \(10,\) does not fit the launch extent \(11,\)"):
            hetflow.reduce(11, value, x, device=device)
        with pytest.raises(ShapeError, match=r"view of extent \(8,\) does not fit"):
            hetflow.reduce(10, value, interior(x, 1), device=device)
        assert np.isclose(hetflow.reduce(8, value, interior(x, 1), device=device), x[1:-1].sum())


# -- co_map: every index checked when the view is made --------------------------------------
def test_co_map_reaching_outside_at_a_later_index_fails_at_creation():
    x = np.arange(10.0)
    with pytest.raises(ShapeError, match=r"co_map: f reaches parent index 10 on dim 0, outside the parent "
                                         r"extent \(10,\), at index \(4,\) \(f gives \(10,\)\)"):
        co_map(x, lambda idx: (idx[0] + 6,), (5,))
    v = co_map(x, lambda idx: (idx[0] + 5,), (5,))  # the largest shift that fits
    out = np.zeros(5)
    hetflow.forall(5, copy, out, v)
    np.testing.assert_array_equal(out, x[5:])


def test_co_map_reaching_outside_at_index_zero_is_a_shape_error():
    with pytest.raises(ShapeError, match=r"co_map: f reaches parent index -1 on dim 0, outside the parent "
                                         r"extent \(10,\), at index \(0,\)"):
        co_map(np.zeros(10), lambda idx: (idx[0] - 1,), (5,))


def test_co_map_names_the_first_offending_index_in_c_order():
    u = np.arange(20.0).reshape(4, 5)
    with pytest.raises(ShapeError, match=r"parent index 5 on dim 1, outside the parent extent \(4, 5\), "
                                         r"at index \(2, 3\) \(f gives \(2, 5\)\)"):  # before (3, 2)
        co_map(u, lambda idx: (idx[0], idx[0] + idx[1]), (4, 4))
    v = co_map(u, lambda idx: (3 - idx[1], 4 - idx[0]), (4, 4))  # fits: matches NumPy
    i, j = np.indices((4, 4))
    np.testing.assert_array_equal(v.numpy(), u[3 - j, 4 - i])


def test_co_map_of_rank_zero_is_checked():
    x = np.arange(5.0)
    assert co_map(x, lambda idx: (4,), ()).numpy() == x[4]
    with pytest.raises(ShapeError, match=r"parent index 5 on dim 0, outside the parent extent \(5,\), "
                                         r"at index \(\)"):
        co_map(x, lambda idx: (5,), ())


def test_co_map_f_must_work_on_index_arrays():
    with pytest.raises(ArgumentTypeError, match=r"co_map: f must work elementwise on integer index arrays, "
                                                r"as creation calls it; it raised ValueError"):
        co_map(np.zeros(10), lambda idx: (idx[0] if idx[0] < 5 else 9,), (8,))


def test_co_map_larger_than_the_bound_is_checked_at_its_corners(monkeypatch):
    monkeypatch.setattr(operators, "CHECKED_INDICES", 4)
    x = np.arange(10.0)
    with pytest.raises(ShapeError, match=r"at index \(7,\)"):  # an affine f: its last corner
        co_map(x, lambda idx: (2 * idx[0] - 4 * (idx[0] > 3),), (8,))
    spike = co_map(x, lambda idx: (idx[0] + 10 * (idx[0] == 3),), (8,))  # outside only at index 3
    assert spike[2] == x[2]
    with pytest.raises(IndexOutOfBoundsError, match=r"co_map: f reaches parent index 13 on dim 0"):
        spike.numpy()


# -- scan of a Buffer -----------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(7,), (3, 4)])
def test_scan_of_a_buffer_over_all_elements(shape):
    data = RNG.random(shape)
    b = hetflow.array(data)
    out = hetflow.scan(b, "sum")
    assert type(out) is np.ndarray
    np.testing.assert_allclose(out, np.cumsum(data))
    excl = hetflow.scan(b, "max", inclusive=False)
    np.testing.assert_array_equal(excl[1:], np.maximum.accumulate(data.ravel())[:-1])
    assert excl[0] == -np.inf
    np.testing.assert_allclose(hetflow.scan(b, "sum", axis=0), np.cumsum(data, axis=0))


def test_scan_of_a_buffer_reads_its_current_contents(gpu_device):
    data = np.arange(6.0)
    b = hetflow.array(data)
    hetflow.forall(6, double, b, device=gpu_device.id)  # current on the GPU alone
    for device in ("cpu0", gpu_device.id):
        out = hetflow.scan(b, "sum", device=device)
        assert type(out) is np.ndarray
        np.testing.assert_allclose(out, np.cumsum(2 * data))


# -- hetflow.array takes data as np.array does ----------------------------------------------
@pytest.mark.parametrize("data", [(2, 3), [2, 3], 5, np.int64(4), True, 2.5, (), [[1, 2], [3, 4]]])
def test_array_holds_what_np_array_makes(data):
    b = hetflow.array(data)
    want = np.array(data)
    assert b.shape == want.shape and b.dtype == want.dtype
    np.testing.assert_array_equal(b.numpy(), want)


def test_array_converts_with_dtype_and_refuses_bad_data():
    b = hetflow.array((2, 3), dtype=np.float32)
    assert b.dtype == np.float32 and b.numpy().tolist() == [2.0, 3.0]
    with pytest.raises(ArgumentTypeError, match=r"Buffer: 'bogus' is not a NumPy dtype"):
        hetflow.array(3, dtype="bogus")
    with pytest.raises(ArgumentError, match=r"Buffer needs numeric data .* got str of dtype <U3"):
        hetflow.array("abc")


def test_a_zero_d_array_is_read_in_kernels():
    s = hetflow.array(2.5)
    x = np.arange(4.0)
    hetflow.forall(4, add_scalar, x, s)
    np.testing.assert_array_equal(x, np.arange(4.0) + 2.5)


def test_buffer_still_allocates_by_shape():
    assert Buffer((2, 3)).shape == (2, 3) and not Buffer((2, 3)).numpy().any()
    assert Buffer(4).numpy().tolist() == [0.0] * 4
    assert Buffer(np.int64(3), dtype=np.int32).numpy().dtype == np.int32
    assert Buffer(True).shape == ()  # a bool is data, never a shape
    with pytest.raises(ArgumentError, match=r"Buffer shape \(2, -1\) has a negative dimension"):
        Buffer((2, -1))


# -- zeros / empty: hetflow's errors ----------------------------------------------------------
@pytest.mark.parametrize("alloc", [hetflow.zeros, hetflow.empty, arrays.zeros])
def test_allocations_refuse_bad_shapes_and_dtypes(alloc):
    name = alloc.__name__
    with pytest.raises(ShapeError, match=rf"{name}: bad shape \(-1, 2\): extent components must be >= 0"):
        alloc((-1, 2))
    with pytest.raises(ArgumentTypeError, match=rf"{name}: bad shape \(2.5,\): extent components must be "
                                                r"integers, got 2.5"):
        alloc((2.5,))
    with pytest.raises(ArgumentTypeError, match=rf"{name}: dtype 'bogus' is not a NumPy dtype"):
        alloc(3, "bogus")
    a = alloc([2, np.int64(3)], np.int32)
    assert a.shape == (2, 3) and a.dtype == np.int32


def test_allocations_in_a_graph_are_checked_when_recorded():
    with hetflow.graph():
        with pytest.raises(ShapeError, match=r"zeros: bad shape \(-1,\)"):
            hetflow.zeros((-1,))
        with pytest.raises(ArgumentTypeError, match=r"empty: bad shape \(2.5,\)"):
            hetflow.empty((2.5,))


def test_zeros_match_numpy():
    np.testing.assert_array_equal(hetflow.zeros((2, 3)), np.zeros((2, 3)))
    assert hetflow.zeros(4, np.int16).dtype == np.int16
