"""Every forall returns its run report; device names 'all' and 'gpu' pick what exists.

Oracle: NumPy for the results; the report is checked against the launch's own extent.
"""
import importlib
import json

import numpy as np
import pytest

import hetflow
from hetflow.runtime.report import RunReport

devices_module = importlib.import_module("hetflow.platform.devices")  # the package's name is the function


@hetflow.kernel
def axpy(i, a, x, y, out):
    out[i] = a * x[i] + y[i]


@hetflow.kernel
def shift_write(i, x, out):
    out[i + 1] = x[i]


@pytest.fixture
def cpu_only(monkeypatch):
    """A machine whose device table holds the CPU alone."""
    cpu = devices_module.cpu_device()
    monkeypatch.setattr(devices_module, "devices", lambda refresh=False: (cpu,))
    return cpu


def _axpy_case(n):
    rng = np.random.default_rng(n)
    x, y = rng.random(n), rng.random(n)
    return x, y, np.zeros(n)


@pytest.mark.parametrize("extent", [1, 37, (6, 5)])
def test_a_one_device_forall_returns_its_report(extent):
    @hetflow.kernel
    def fill(i, j, out):
        out[i, j] = 10 * i + j

    shape = extent if isinstance(extent, tuple) else (extent, 1)
    out = np.zeros(shape)
    report = hetflow.forall(shape, fill, out, device="cpu0")
    np.testing.assert_array_equal(out, np.add.outer(10 * np.arange(shape[0]), np.arange(shape[1])))
    assert isinstance(report, RunReport)
    assert (report.n, report.schedule) == (shape[0], "one-device")
    [worker] = report.workers
    assert (worker.name, worker.kind, worker.device_id) == ("cpu0", "cpu", "cpu0")
    assert (worker.chunks, worker.indices, worker.steals) == (1, shape[0], 0)
    assert [(e.lo, e.hi) for e in report.events] == [(0, shape[0])]
    assert report.failures == [] and report.wall_s >= 0
    assert "cpu0" in report.summary() and "schedule=one-device" in report.summary()
    assert json.loads(json.dumps(report.to_dict()))["workers"][0]["indices"] == shape[0]


def test_each_call_has_its_own_report():
    x, y, out = _axpy_case(8)
    first = hetflow.forall(8, axpy, 1.0, x, y, out)
    second = hetflow.forall(4, axpy, 1.0, x, y, out)
    assert (first.n, second.n) == (8, 4)
    assert first.workers[0].indices == 8


def test_a_launch_on_coherent_arrays_returns_its_report():
    x, y = hetflow.array(np.arange(12.0)), hetflow.array(np.ones(12))
    out = hetflow.array(np.zeros(12))
    report = hetflow.forall(12, axpy, 2.0, x, y, out, device="cpu0")
    np.testing.assert_array_equal(out.numpy(), 2.0 * np.arange(12.0) + 1)
    assert (report.n, report.workers[0].indices) == (12, 12)


def test_gpu_runs_on_the_cpu_where_there_is_none(cpu_only):
    assert devices_module.find_devices("gpu") == (cpu_only,)
    x, y, out = _axpy_case(50)
    report = hetflow.forall(50, axpy, 2.0, x, y, out, device="gpu")
    np.testing.assert_array_equal(out, 2.0 * x + y)
    # cpu0 alone; on a loaded machine its first launch may time the rows dear and use two threads
    assert {w.device_id for w in report.workers} == {"cpu0"}


def test_all_is_the_cpu_alone_on_a_cpu_only_machine(cpu_only):
    x, y, out = _axpy_case(50)
    report = hetflow.forall(50, axpy, 2.0, x, y, out, device="all")
    np.testing.assert_array_equal(out, 2.0 * x + y)
    assert report.schedule == "one-device"


def test_an_unknown_device_name_still_fails():
    with pytest.raises(hetflow.errors.DeviceError, match="no device with id 'gpus'"):
        hetflow.forall(1, axpy, 1.0, *_axpy_case(1), device="gpus")


@pytest.mark.simgpu
def test_gpu_and_all_name_the_machines_devices(gpu_device):
    gpus = tuple(d for d in hetflow.devices() if d.kind == "gpu")
    assert devices_module.find_devices("gpu") == gpus
    assert devices_module.find_devices("all") == hetflow.devices()
    n = 64
    x, y, out = _axpy_case(n)
    report = hetflow.forall(n, axpy, 3.0, x, y, out, device="all")
    np.testing.assert_array_equal(out, 3.0 * x + y)
    # every device, or the one that the performance model says finishes sooner alone
    ran = {w.device_id for w in report.workers}
    assert ran <= {d.id for d in hetflow.devices()} and (len(ran) > 1 or report.schedule == "one-device")
    assert sum(w.indices for w in report.workers) == n


@pytest.mark.simgpu
def test_one_simulated_gpu_launch_returns_its_report(gpu_device):
    x, y, out = _axpy_case(16)
    report = hetflow.forall(16, axpy, 2.0, x, y, out, device=gpu_device.id)
    np.testing.assert_array_equal(out, 2.0 * x + y)
    assert [(w.name, w.kind, w.indices) for w in report.workers] == [(gpu_device.id, "gpu", 16)]


@pytest.mark.simgpu
def test_a_kernel_run_on_one_of_several_devices_returns_that_report(gpu_device):
    x = np.arange(10.0)
    out = np.zeros(11)
    report = hetflow.forall(10, shift_write, x, out, device=["cpu0", gpu_device.id])
    np.testing.assert_array_equal(out[1:], x)
    assert report.schedule == "one-device" and len(report.workers) == 1


@hetflow.kernel
def _heavy(i, x):
    s = 0.0
    for k in range(20_000):
        s += np.sin(k * 1e-3 + i)
    x[i] = s


def test_a_cpu_launch_over_several_cores_names_its_workers_as_co_execution_does():
    import numba

    if numba.get_num_threads() < 2:
        pytest.skip("one CPU thread: the launch runs on one")
    x = np.zeros(2000)
    hetflow.forall(2000, _heavy, x, device="cpu0")  # the first launch measures the rows' cost
    report = hetflow.forall(2000, _heavy, x, device="cpu0")
    names = [w.name for w in report.workers]
    assert len(names) > 1 and names == [f"cpu0/core{k}" for k in range(len(names))]
    assert sum(w.indices for w in report.workers) == 2000
    np.testing.assert_allclose(x[:3], [np.sin(np.arange(20_000) * 1e-3 + i).sum() for i in range(3)])
