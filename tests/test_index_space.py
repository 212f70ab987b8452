"""Index spaces (index, extent, Grid) and arrays as indexables."""
import pickle

import numpy as np
import pytest

from hetflow.errors import ArgumentTypeError, DeviceError, ShapeError
from hetflow.index import (Grid, asarray, empty, extent, extent_of, index, is_device_array,
                           project, rank, root_of, section, zeros)
from hetflow.cuda_compat import cupy_module, simulated


# -- index and extent ---------------------------------------------------------------------
def test_construction_forms_agree():
    assert index(1, 2) == index((1, 2)) == index([1, 2]) == index(np.array([1, 2])) == (1, 2)
    assert index(np.int64(3)) == (3,) and index() == () and extent(()) == ()
    assert type(index(1, 2)[0]) is int and type(extent(np.array([4]))[0]) is int
    assert index(1, 2).rank == 2 and extent(2, 3, 4).size == 24 and extent().size == 1
    assert repr(index(1, -2)) == "index(1, -2)" and repr(extent(3,)) == "extent(3,)"


def test_arithmetic_is_elementwise():
    assert index(1, 2) + index(3, 4) == (4, 6)
    assert index(5, 5) - (1, 2) == (4, 3) and (10, 10) - index(1, 2) == (9, 8)
    assert (1, 1) + index(2, 3) == (3, 4) and isinstance((1, 1) + index(2, 3), index)
    assert 2 * index(1, -3) == index(1, -3) * 2 == (2, -6)
    assert extent(4, 6) * (2, 3) == (8, 18) and extent(9, 7) // (3, 2) == (3, 3)
    assert index(1, 2) + 1 == (2, 3) and -index(1, -2) == (-1, 2)
    assert isinstance(extent(2, 2) + index(1, 1), extent)


def test_comparisons_are_componentwise():
    assert index(0, 0) <= index(1, 2) < extent(2, 3)
    assert not index(1, 3) < extent(2, 3)
    assert not index(0, 2) <= index(1, 1) and not index(1, 1) <= index(0, 2)
    assert index(2, 2) > 1 and index(2, 2) >= (2, 2)
    assert {index(1, 2): "x"}[(1, 2)] == "x"


def test_pickles():
    assert pickle.loads(pickle.dumps(extent(3, 4))) == extent(3, 4)
    assert isinstance(pickle.loads(pickle.dumps(index(1))), index)


@pytest.mark.parametrize("make,err,msg", [
    (lambda: index(1.5, 2), ArgumentTypeError, r"index components must be integers, got 1.5"),
    (lambda: index(1.5), ArgumentTypeError, r"index takes integers or one sequence of integers"),
    (lambda: index("ab"), ArgumentTypeError, r"index components must be integers, got 'a'"),
    (lambda: extent(object()), ArgumentTypeError, r"extent takes integers or one sequence"),
    (lambda: extent(2, -1), ShapeError, r"extent components must be >= 0, got \(2, -1\)"),
    (lambda: index(1, 2) + index(1, 2, 3), ShapeError,
     r"index\(1, 2\) \+ index\(1, 2, 3\): ranks 2 and 3 differ"),
    (lambda: extent(2, 2) - (3, 0), ShapeError, r"extent components must be >= 0"),
    (lambda: index(1) < (1, 2), ShapeError, r"ranks 1 and 2 differ"),
    (lambda: Grid((0,), (1, 2)), ShapeError,
     r"Grid offset \(0,\) and extent \(1, 2\) have different ranks"),
])
def test_bad_index_spaces(make, err, msg):
    with pytest.raises(err, match=msg):
        make()


def test_grid():
    g = Grid((1, 2), (2, 3))
    assert g.offset == index(1, 2) and isinstance(g.extent, extent)
    assert g.rank == 2 and g.size == 6 and g.end == (3, 5)
    assert (2, 4) in g and (3, 4) not in g and (0, 2) not in g and (1, 2, 0) not in g
    assert list(g) == [(i, j) for i in range(1, 3) for j in range(2, 5)]
    assert list(Grid((), ())) == [()]


# -- arrays -----------------------------------------------------------------------------------
def test_asarray_keeps_host_arrays_without_copy():
    a = np.arange(6.0)
    assert asarray(a) is a and asarray(a, device="cpu") is a
    b = asarray([[1, 2], [3, 4]], dtype=np.float32)
    assert b.dtype == np.float32 and b.shape == (2, 2)


class DLPackProducer:
    """A foreign array that is only reachable through the DLPack protocol."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def test_asarray_takes_dlpack_producers_without_copy():
    a = np.arange(4.0)
    b = asarray(DLPackProducer(a))
    b[1] = 10.0
    assert a[1] == 10.0 and b.shape == (4,)


def test_asarray_materialises_views():
    a = np.arange(12.0).reshape(3, 4)
    out = asarray(project(a, 1, 2))
    assert np.array_equal(out, a[:, 2]) and not np.shares_memory(out, a)


def test_zeros_and_empty():
    z = zeros((2, 3), np.int32)
    assert z.shape == (2, 3) and z.dtype == np.int32 and not z.any()
    assert empty(extent(4), np.float32).shape == (4,) and zeros(3).dtype == np.float64


def test_rank_extent_root_of_arrays():
    a = np.zeros((2, 3, 4))
    assert rank(a) == 3 and extent_of(a) == (2, 3, 4) and root_of(a) is a
    assert rank(np.float64(1.0)) == 0 and not is_device_array(a)


@pytest.mark.skipif(cupy_module() is not None, reason="CuPy with a GPU is present")
@pytest.mark.skipif(simulated(), reason="the simulator's GPU places arrays in host memory")
@pytest.mark.parametrize("call", [
    lambda: asarray(np.zeros(2), device="gpu"), lambda: zeros(3, device="cuda:0"),
    lambda: empty(3, device=0), lambda: empty(3, device="gpu0")])
def test_gpu_placement_without_cupy_fails_clearly(call):
    with pytest.raises(DeviceError, match="needs CuPy with a CUDA GPU, and none is available"):
        call()


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "gpux", "tpu0", 1.5, object()])
def test_unknown_devices_are_rejected(device):
    with pytest.raises(ArgumentTypeError, match="unknown device"):
        zeros(2, device=device)


@pytest.mark.parametrize("device", ["cpu", "cpu0", "host"])
def test_host_placements_give_numpy_arrays(device):
    a = zeros((2, 3), device=device)
    assert type(a) is np.ndarray and a.shape == (2, 3) and not a.any()


@pytest.mark.simgpu
def test_simulated_device_arrays_are_host_indexables():
    from hetflow.cuda_compat import cuda_module
    d = cuda_module().to_device(np.arange(6.0).reshape(2, 3))
    v = section(d, (0, 1), (2, 2))
    assert np.array_equal(v.numpy(), np.arange(6.0).reshape(2, 3)[:, 1:])
    v[1, 1] = -1.0
    assert d.copy_to_host()[1, 2] == -1.0


# -- real GPU (run by the lead on a GPU machine) -------------------------------------------------
@pytest.mark.gpu
def test_cupy_round_trip_and_views():
    cupy = cupy_module()
    a = np.arange(24.0).reshape(4, 6)
    g = asarray(a, device="gpu")
    assert isinstance(g, cupy.ndarray) and asarray(g) is g
    back = asarray(g, device="cpu")
    assert isinstance(back, np.ndarray) and np.array_equal(back, a)
    v = section(g, (1, 2), (2, 3))
    assert np.array_equal(v.numpy(), a[1:3, 2:5])
    assert isinstance(v.cupy(), cupy.ndarray) and np.array_equal(v.cupy().get(), a[1:3, 2:5])
    v[0, 0] = -5.0
    assert float(g[1, 2]) == -5.0
    v.assign(0.0)
    assert not cupy.any(g[1:3, 2:5])
    z = zeros((2, 2), np.float32, device="cuda:0")
    assert isinstance(z, cupy.ndarray) and z.dtype == np.float32


@pytest.mark.gpu
def test_foreign_gpu_arrays_are_taken_without_copy():
    from hetflow.cuda_compat import cuda_module
    cupy = cupy_module()
    d = cuda_module().to_device(np.arange(4.0))  # __cuda_array_interface__, not CuPy
    c = asarray(d)
    assert isinstance(c, cupy.ndarray)
    c[0] = 9.0
    assert d.copy_to_host()[0] == 9.0
    src = cupy.arange(3.0)
    via_dlpack = asarray(DLPackProducer(src))
    via_dlpack[2] = 7.0
    assert float(src[2]) == 7.0
