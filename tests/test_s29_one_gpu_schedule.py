"""A launch on one GPU under a named schedule runs whole: the GPU has no device to share
rows with, so chunking it would only add launches. Checked against NumPy."""
import numpy as np
import pytest

import hetflow


@hetflow.kernel
def s29_axpy(i, a, x, y, out):
    out[i] = a * x[i] + y[i]


@pytest.mark.parametrize("where", [pytest.param("simulated", marks=pytest.mark.simgpu),
                                   pytest.param("real", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("schedule", ["steal", "static"])
def test_one_gpu_under_a_schedule_runs_the_launch_whole(gpu_device, schedule, where):
    n = 96
    x, y = np.arange(n, dtype=np.float64), np.full(n, 0.5)
    out = np.zeros(n)
    report = hetflow.forall(n, s29_axpy, 2.0, x, y, out, device=gpu_device.id, schedule=schedule)
    np.testing.assert_array_equal(out, 2.0 * x + y)
    assert report.schedule == "one-device"
    assert [(w.device_id, w.chunks, w.indices) for w in report.workers] == [(gpu_device.id, 1, n)]


@pytest.mark.simgpu
def test_one_gpu_still_refuses_an_unknown_schedule(gpu_device):
    with pytest.raises(hetflow.errors.ArgumentError, match="schedule must be 'steal' or 'static', got 'fair'"):
        hetflow.forall(4, s29_axpy, 1.0, np.zeros(4), np.zeros(4), np.zeros(4), device=gpu_device.id,
                       schedule="fair")


def test_one_cpu_under_a_schedule_still_splits_over_its_cores():
    n = 5000
    x, y, out = np.arange(n, dtype=np.float64), np.ones(n), np.zeros(n)
    report = hetflow.forall(n, s29_axpy, 3.0, x, y, out, device="cpu0", schedule="steal")
    np.testing.assert_array_equal(out, 3.0 * x + y)
    assert report.schedule == "steal"
    assert sum(w.indices for w in report.workers) == n
