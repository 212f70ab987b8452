"""Structured (record) arrays and views of them on the CPU and on a GPU, simulated or real.

Staging copies them to the GPU and back like any array. A whole record stored into an
element (``out[i] = a[i]``) runs on a real GPU; Numba's CUDA simulator cannot store one.

Oracle: the same updates made with NumPy.
"""
import numpy as np
import pytest

import hetflow
from hetflow import interior, section

REC = np.dtype([("x", "f8"), ("y", "i4")])
NESTED = np.dtype([("x", "f8"), ("p", [("a", "i2"), ("b", "f4")])])


@hetflow.kernel
def bump(i, a):
    a[i].x = a[i].x + 1.0


@hetflow.kernel
def bump2(i, j, a):
    a[i, j].y = a[i, j].y + 3 * i + j


@hetflow.kernel
def weigh(i, a, out):
    out[i] = 2.0 * a[i].x + a[i].y


@hetflow.kernel
def copy_records(i, a, out):
    out[i] = a[i]


def records(n, dtype=REC):
    a = np.zeros(n, dtype)
    a["x"] = np.arange(n) * 0.5
    if "y" in dtype.names:
        a["y"] = np.arange(n) - 3
    return a


def grid(dtype=REC):
    a = np.zeros((5, 6), dtype)
    a["x"] = np.arange(30).reshape(5, 6)
    a["y"] = np.arange(30).reshape(5, 6) % 7
    return a


def _bumped2(a, rows, cols):
    """NumPy's bump2 over the box ``a[rows, cols]``."""
    want = a.copy()
    box = want["y"][rows, cols]
    i, j = np.indices(box.shape)
    box += 3 * i + j
    return want


def _views_match_numpy(device):
    a = records(12)
    want = a.copy()
    want["x"][2:10:2] += 1.0
    hetflow.forall(4, bump, a[2:10:2], device=device)  # a strided slice
    np.testing.assert_array_equal(a, want)

    b = grid()
    want = _bumped2(b, slice(1, -1), slice(1, -1))
    hetflow.forall((3, 4), bump2, interior(b, 1), device=device)
    np.testing.assert_array_equal(b, want)

    c = grid()
    want = _bumped2(c, slice(2, 4), slice(1, 4))
    hetflow.forall((2, 3), bump2, section(c, (2, 1), (2, 3)), device=device)
    np.testing.assert_array_equal(c, want)

    r = records(7).view(np.recarray)
    out = np.zeros(7)
    hetflow.forall(7, weigh, r, out, device=device)
    np.testing.assert_array_equal(out, 2.0 * r.x + r.y)


def test_structured_arrays_and_views_on_the_cpu():
    _views_match_numpy("cpu0")
    for dtype in (REC, NESTED, np.dtype([("x", "f8"), ("y", "i4")], align=True)):
        a, out = records(9, dtype), np.zeros(9, dtype)
        hetflow.forall(9, copy_records, a, out, device="cpu0")
        np.testing.assert_array_equal(out, a)


@pytest.mark.simgpu
def test_structured_arrays_and_views_on_the_simulated_gpu(gpu_device):
    _views_match_numpy(gpu_device.id)


@pytest.mark.simgpu
def test_structured_views_co_executed_with_the_cpu(gpu_device):
    b = grid()
    want = _bumped2(b, slice(1, -1), slice(1, -1))
    hetflow.forall((3, 4), bump2, interior(b, 1), device=["cpu0", gpu_device.id], shares=[0.5, 0.5])
    np.testing.assert_array_equal(b, want)


@pytest.mark.gpu
def test_whole_record_stores_run_on_a_real_gpu(gpu_device):
    for dtype in (REC, NESTED):
        a, out = records(1000, dtype), np.zeros(1000, dtype)
        hetflow.forall(1000, copy_records, a, out, device=gpu_device)
        np.testing.assert_array_equal(out, a)
