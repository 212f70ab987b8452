"""GPU launches through the plan's fast entry (real GPU) and the dispatcher (simulator):
every argument type numba-cuda accepts gives NumPy's result."""
import numpy as np
import pytest

import hetflow
from hetflow import cshift, interior, transpose


@hetflow.kernel
def mixed(i, a, b, flag, c, x, y, out):
    v = a * x[i] + b * y[i] + (c * c).real
    out[i] = v if flag else -v


@hetflow.kernel
def shifted(i, j, out, src):
    out[i, j] = 2.0 * src[i, j]


def _oracle(a, b, flag, c, x, y):
    v = a * x + b * y + (c * c).real
    return v if flag else -v


CASES = [  # (a, b, flag, c, dtype)
    (2.0, 3, True, 1 + 2j, np.float64),
    (np.float32(1.5), np.int32(-2), False, np.complex64(0.5 - 1j), np.float32),
    (np.int64(7), np.uint16(3), np.bool_(True), 2j, np.float64),
]


def _run(xp, device):
    rng = np.random.default_rng(3)
    for a, b, flag, c, dtype in CASES:
        x, y = rng.random(1001).astype(dtype), rng.random(1001).astype(dtype)
        out = xp.zeros(1001, dtype)
        hetflow.forall(1001, mixed, a, b, flag, c, xp.asarray(x), xp.asarray(y), out, device=device)
        got = out.get() if hasattr(out, "get") else np.asarray(out)
        np.testing.assert_allclose(got, _oracle(a, b, flag, c, x, y).astype(dtype), rtol=1e-6)
    u = rng.random((37, 29))
    for src, want in ((cshift(xp.asarray(u), 1, 3), np.roll(u, -3, 1)),
                      (transpose(xp.asarray(u.T.copy()), 0, 1), u),
                      (interior(xp.asarray(u), 2), u[2:-2, 2:-2])):
        out = xp.zeros(src.shape)
        hetflow.forall(src.shape, shifted, out, src, device=device)
        got = out.get() if hasattr(out, "get") else np.asarray(out)
        np.testing.assert_allclose(got, 2.0 * want)


@pytest.mark.gpu
def test_fast_entry_launches_every_argument_type():
    from hetflow.cuda_compat import cupy_module

    cp = cupy_module()
    _run(cp, "gpu0")
    plans = [p for p in mixed.plans.values() if p.executable.description.kind == "gpu"]
    assert plans and all(p.fast_entry for p in plans)  # launched without the dispatcher


@pytest.mark.simgpu
def test_simulated_gpu_launches_through_the_dispatcher(gpu_device):
    _run(np, gpu_device.id)
    plans = [p for p in mixed.plans.values() if p.executable.description.kind == "gpu"]
    assert plans and all(p.fast_entry is None for p in plans)


@hetflow.kernel
def shifted_copy(i, x, out):
    out[i + 3] = x[i]


@pytest.mark.simgpu
def test_a_launch_writing_rows_beyond_its_extent_brings_them_home(gpu_device):
    """A host array is staged whole on a GPU: every row the kernel wrote comes back, not
    only the rows of the launch indices."""
    x, out = np.arange(4.0), np.full(7, -1.0)
    hetflow.forall(4, shifted_copy, x, out, device=gpu_device.id)
    np.testing.assert_array_equal(out, [-1, -1, -1, 0, 1, 2, 3])
