"""A view's rank and element type inside a kernel, as NumPy gives them for the view's
array (its extent: tests/test_s26_view_extent.py). Arrays keep all their attributes."""
import numpy as np
import pytest

import hetflow
from hetflow import co_map, cshift, interior, project, section, tile, transpose


@hetflow.kernel
def rank_and_type(i, v, out):
    out[i] = v.ndim * 10 + v.dtype.type(2.75)


@hetflow.kernel
def array_metadata(i, a, out):
    out[i] = a.shape[1] * 1000 + a.size * 10 + a.ndim + len(a) * 100000 + a.dtype.type(0.5)


@hetflow.kernel(boundscheck=True)
def checked_metadata(i, a, v, out):
    out[i] = a.shape[1] * 1000 + a.size * 10 + a.ndim + len(a) * 100000 + v.ndim * 1000000


def _views():
    """Every view kind, over roots of several element types."""
    a = np.arange(48.0).reshape(6, 8)
    return [section(a.astype(np.float32), (1, 2), (3, 4)), transpose(a.astype(np.int32), 0, 1),
            cshift(a, 1, 3), interior(a, (1, 2)), project(a, 0, 2), tile(a, (2, 4)),
            co_map(a, lambda idx: (idx[0], 7 - idx[1]), (6, 8)), section(np.arange(8.0), (2,), (4,))]


def _devices(gpu):
    return ["cpu0"] + ([gpu.id] if gpu is not None else [])


def _check_rank_and_type(devices):
    for v in _views():
        w = v.numpy()  # the view's own array: NumPy's oracle
        for dev in devices:
            out = np.zeros(2)
            hetflow.forall(2, rank_and_type, v, out, device=dev)
            np.testing.assert_array_equal(out, w.ndim * 10 + w.dtype.type(2.75), err_msg=f"{v!r} on {dev}")


def test_rank_and_element_type_of_every_view_kind_are_numpys_on_the_cpu():
    _check_rank_and_type(["cpu0"])


@pytest.mark.simgpu
def test_rank_and_element_type_of_every_view_kind_are_numpys_on_the_simulated_gpu(gpu_device):
    _check_rank_and_type([gpu_device.id])


def _check_arrays(devices):
    a = np.zeros((3, 5), np.float32)
    want = a.shape[1] * 1000 + a.size * 10 + a.ndim + len(a) * 100000
    for dev in devices:
        out = np.zeros(2)
        hetflow.forall(2, array_metadata, a, out, device=dev)
        np.testing.assert_array_equal(out, want + a.dtype.type(0.5), err_msg=dev)
        out = np.zeros(2)
        hetflow.forall(2, checked_metadata, a, transpose(np.zeros((2, 5)), 0, 1), out, device=dev)
        np.testing.assert_array_equal(out, want + 2 * 1000000, err_msg=f"{dev}, checked")


def test_arrays_and_checked_arrays_keep_their_attributes_on_the_cpu():
    _check_arrays(["cpu0"])


@pytest.mark.simgpu
def test_arrays_and_checked_arrays_keep_their_attributes_on_the_simulated_gpu(gpu_device):
    _check_arrays([gpu_device.id])


@pytest.mark.gpu
def test_view_and_array_attributes_on_a_real_gpu(gpu_device):
    """The same as on the CPU, compiled by numba-cuda (its own typing and lowering registries)."""
    _check_rank_and_type([gpu_device.id])
    _check_arrays([gpu_device.id])
