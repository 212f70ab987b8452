"""NumPy ufuncs on scalars in kernels run on a GPU as on the CPU (numba-cuda lowers only
some; hetflow adds the ones that are libdevice functions). Oracle: NumPy."""
import numpy as np
import pytest

import hetflow
from hetflow.errors import KernelCompileError


@hetflow.kernel
def unary(i, x, out):
    v = x[i]
    out[i, 0] = np.sqrt(v)
    out[i, 1] = np.exp(v)
    out[i, 2] = np.exp2(v)
    out[i, 3] = np.expm1(v)
    out[i, 4] = np.log1p(v)
    out[i, 5] = np.fabs(v - 1.0)
    out[i, 6] = np.absolute(v - 1.0)
    out[i, 7] = np.floor(3.0 * v)
    out[i, 8] = np.ceil(3.0 * v)
    out[i, 9] = np.trunc(3.0 * v - 1.5)
    out[i, 10] = np.sin(v)  # numba-cuda's own entry


@hetflow.kernel
def binary(i, x, y, out):
    out[i, 0] = np.power(x[i], y[i])
    out[i, 1] = np.fmod(3.0 * x[i], y[i])
    out[i, 2] = np.copysign(x[i], y[i] - 1.0)
    out[i, 3] = np.nextafter(x[i], y[i])


def _expected(x, y):
    up = np.stack([np.sqrt(x), np.exp(x), np.exp2(x), np.expm1(x), np.log1p(x), np.fabs(x - 1),
                   np.absolute(x - 1), np.floor(3 * x), np.ceil(3 * x), np.trunc(3 * x - 1.5), np.sin(x)], axis=1)
    bp = np.stack([np.power(x, y), np.fmod(3 * x, y), np.copysign(x, y - 1), np.nextafter(x, y)], axis=1)
    return up, bp


def _run(device, dtype, n):
    rng = np.random.default_rng(5)
    x = (rng.random(n) * 2 + 0.01).astype(dtype)
    y = (rng.random(n) * 2 + 0.5).astype(dtype)
    up, bp = np.zeros((n, 11), dtype), np.zeros((n, 4), dtype)
    hetflow.forall(n, unary, x, up, device=device)
    hetflow.forall(n, binary, x, y, bp, device=device)
    ref_up, ref_bp = _expected(x, y)
    tol = 1e-5 if dtype == np.float32 else 1e-13  # fmod near 0 loses relative digits: atol too
    np.testing.assert_allclose(up, ref_up, rtol=tol, atol=tol)
    np.testing.assert_allclose(bp[:, :3], ref_bp[:, :3], rtol=tol, atol=tol)
    np.testing.assert_array_equal(bp[:, 3], ref_bp[:, 3])  # nextafter is exact


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_ufuncs_on_a_real_gpu(gpu_device, dtype):
    _run(gpu_device.id, dtype, 10_000)


@pytest.mark.simgpu
def test_ufuncs_on_the_simulated_gpu(gpu_device):
    _run(gpu_device.id, np.float64, 16)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_ufuncs_on_the_cpu(dtype):
    _run("cpu0", dtype, 1000)


@hetflow.kernel
def int_absolute(i, x, out):
    out[i] = np.absolute(x[i])


@pytest.mark.gpu
def test_a_ufunc_loop_without_gpu_code_is_a_compile_error(gpu_device):
    x = np.arange(-4, 4)
    with pytest.raises(KernelCompileError, match=r"int_absolute.*absolute"):
        hetflow.forall(x.size, int_absolute, x, np.zeros_like(x), device=gpu_device.id)
    out = np.zeros_like(x)
    hetflow.forall(x.size, int_absolute, x, out, device="cpu0")  # the CPU has the loop
    np.testing.assert_array_equal(out, np.abs(x))
