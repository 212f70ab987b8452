"""A view's attributes inside a kernel: its rank and element type, as NumPy gives them for
the view's array; its extent (shape, size, len), which a kernel is not passed, refused
naming the kernel, the argument and the attribute. Arrays keep all of them."""
import re

import numpy as np
import pytest

import hetflow
from hetflow import co_map, cshift, interior, project, section, tile, transpose
from hetflow.errors import KernelCompileError, KernelRaisedError


@hetflow.kernel
def rank_and_type(i, v, out):
    out[i] = v.ndim * 10 + v.dtype.type(2.75)


@hetflow.kernel
def view_shape(i, a, out):
    out[i] = a.shape[0] + out.shape[0]


@hetflow.kernel
def view_size(i, a, out):
    out[i] = a.size


@hetflow.kernel
def view_len(i, a, out):
    out[i] = len(a)


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


@pytest.mark.parametrize("kernel, attr", [(view_shape, "shape"), (view_size, "size")])
def test_a_views_extent_is_refused_at_compile_time_naming_kernel_argument_and_attribute(kernel, attr):
    a, out = np.arange(8.0), np.zeros(4)
    with pytest.raises(KernelCompileError) as info:
        hetflow.forall(4, kernel, section(a, (2,), (4,)), out, device="cpu0")
    message = str(info.value)
    assert f"kernel {kernel.name!r}" in message
    assert re.search(rf"view argument 'a' \(hetflow\.view\d+_cpu\(array\(float64, 1d, C\), a\)\): its {attr} is "
                     rf"not known inside a kernel", message)
    assert "pass the extent as a scalar argument" in message
    assert not out.any()


def test_len_of_a_view_fails_to_compile_naming_kernel_and_argument():
    with pytest.raises(KernelCompileError, match=r"kernel 'view_len'.*len\(hetflow\.view\d+_cpu\(array\(float64, "
                                                 r"1d, C\), a\)\)"):
        hetflow.forall(4, view_len, section(np.arange(8.0), (2,), (4,)), np.zeros(4), device="cpu0")


@pytest.mark.simgpu
@pytest.mark.parametrize("kernel, attr", [(view_shape, "shape"), (view_size, "size"), (view_len, "len()")])
def test_a_views_extent_is_refused_on_the_simulated_gpu(gpu_device, kernel, attr):
    with pytest.raises(KernelRaisedError, match=rf"kernel {kernel.name!r} raised AttributeError.*view argument "
                                                rf"'a': its {re.escape(attr)} is not known inside a kernel"):
        hetflow.forall(4, kernel, section(np.arange(8.0), (2,), (4,)), np.zeros(4), device=gpu_device.id)


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
def test_view_and_array_attributes_and_refusals_on_a_real_gpu(gpu_device):
    """The same as on the CPU, compiled by numba-cuda (its own typing and lowering registries)."""
    _check_rank_and_type([gpu_device.id])
    _check_arrays([gpu_device.id])
    for kernel, attr in [(view_shape, "shape"), (view_size, "size")]:
        with pytest.raises(KernelCompileError, match=rf"kernel {kernel.name!r}.*view argument 'a' .*its {attr} is "
                                                     rf"not known inside a kernel"):
            hetflow.forall(4, kernel, section(np.arange(8.0), (2,), (4,)), np.zeros(4), device=gpu_device.id)
