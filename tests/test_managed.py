"""Managed memory: host arrays that GPU launches use in place (oracle: NumPy)."""
import numpy as np
import pytest

import hetflow
from hetflow.errors import DeviceError
from hetflow.index import managed as managed_module
from hetflow.index.managed import device_view


@hetflow.kernel
def jacobi(i, j, n, s, e, w, out):
    out[i, j] = 0.25 * (n[i, j] + s[i, j] + e[i, j] + w[i, j])


def step(u, v, device):
    """One Jacobi step of u's interior into v's, through views, on ``device``."""
    inner = hetflow.interior(v, 1)
    views = [hetflow.interior(hetflow.cshift(u, d, s), 1) for d, s in ((0, -1), (0, 1), (1, 1), (1, -1))]
    hetflow.forall(inner, jacobi, *views, inner, device=device)


def numpy_step(u):
    v = u.copy()
    v[1:-1, 1:-1] = 0.25 * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, 2:] + u[1:-1, :-2])
    return v


def alternate_devices(size, gpu):
    """Steps alternating between the GPU and the CPU on managed arrays, checked by NumPy."""
    rng = np.random.default_rng(5)
    start = rng.random((size, size))
    u, v = hetflow.zeros((size, size), device="managed"), hetflow.empty((size, size), device="managed")
    u[...] = start
    v[...] = start
    expected = start
    for k in range(4):
        step(u, v, gpu if k % 2 == 0 else "cpu0")
        expected = numpy_step(expected)
        np.testing.assert_allclose(v, expected, rtol=1e-14)
        u, v = v, u
    return u


def test_managed_memory_needs_a_cuda_device(monkeypatch):
    monkeypatch.setattr(managed_module, "cuda_available", lambda: False)
    with pytest.raises(DeviceError, match="device='managed' needs CUDA managed memory"):
        hetflow.empty(4, device="managed")


@pytest.mark.simgpu
def test_managed_arrays_move_between_the_simulated_gpu_and_the_cpu(gpu_device):
    u = alternate_devices(8, gpu_device.id)
    assert type(u) is np.ndarray and device_view(u) is None   # the simulator copies


@pytest.mark.gpu
def test_managed_arrays_are_used_in_place_on_a_real_gpu(gpu_device):
    u = alternate_devices(64, gpu_device.id)
    assert type(u) is np.ndarray and not u[..., 0].flags.c_contiguous
    inner = u[1:-1, 2:]
    dev = device_view(inner)                                  # the same memory, no copy
    assert dev.device_ctypes_pointer.value == inner.ctypes.data
    assert dev.shape == inner.shape and dev.strides == inner.strides
    assert device_view(np.zeros(3)) is None                   # ordinary host memory is copied
