"""GPU arrays run where they live. A launch over device arrays with no device named runs on
the GPU that holds them; one named for another GPU is an ArgumentError, raised before
anything is launched (a kernel reading another GPU's memory faults, and the fault ends
the process's CUDA context). The real-GPU tests need a machine with two GPUs; the rest
check how a GPU array's GPU is told, with stand-ins for the arrays and the device table."""
import sys

import numpy as np
import pytest

import hetflow
from hetflow.errors import ArgumentError
from hetflow.index.arrays import gpu_ordinal
from hetflow.platform.devices import Device
from hetflow.runtime import forall as forall_module
from hetflow.runtime.forall import holding_gpu
from hetflow.runtime.queue import Queue

devices_module = sys.modules["hetflow.platform.devices"]  # (hetflow.platform.devices is its function)


class _CupyLike:
    """What CuPy's arrays show of their GPU: ``device.id``."""

    __cuda_array_interface__ = {"data": (0, False), "shape": (1,), "typestr": "<f8", "version": 3}

    def __init__(self, ordinal):
        self.device = type("Device", (), {"id": ordinal})()


class _NumbaLike:
    """What Numba's device arrays show of theirs: ``gpu_data.context.device.id``."""

    __cuda_array_interface__ = _CupyLike.__cuda_array_interface__

    def __init__(self, ordinal):
        device = type("Device", (), {"id": ordinal})()
        self.gpu_data = type("Pointer", (), {"context": type("Context", (), {"device": device})()})()


def _gpu(ordinal):
    return Device(id=f"gpu{ordinal}", kind="gpu", vendor="NVIDIA", name="stand-in", version="9.0",
                  compute_units=132, simd_width=32, global_memory=1 << 30, local_memory=1 << 16, fp64=True,
                  atomics=True, host_shared=False, ordinal=ordinal)


def test_a_gpu_arrays_ordinal_is_read_from_cupy_and_numba_arrays():
    assert [gpu_ordinal(_CupyLike(k)) for k in (0, 1, 3)] == [0, 1, 3]
    assert [gpu_ordinal(_NumbaLike(k)) for k in (0, 2)] == [0, 2]


@pytest.mark.simgpu
def test_the_simulators_arrays_have_no_ordinal_and_run_on_its_gpu():
    from numba import cuda

    a = cuda.to_device(np.zeros(4))
    assert gpu_ordinal(a) is None
    assert holding_gpu(a).id == "gpu0"


def test_the_holding_gpu_is_the_one_of_the_arrays_ordinal(monkeypatch):
    table = (hetflow.get_device("cpu0"), _gpu(0), _gpu(1))
    monkeypatch.setattr(devices_module, "devices", lambda: table)
    assert holding_gpu(_CupyLike(1)).id == "gpu1"
    assert holding_gpu(_NumbaLike(0)).id == "gpu0"
    assert forall_module._default_devices((2.0, _CupyLike(1))) == (table[2],)
    monkeypatch.setattr(devices_module, "devices", lambda: table[:1])
    assert holding_gpu(_CupyLike(1)) is None  # no GPU at all


def test_a_launch_over_another_gpus_array_is_refused_only_where_there_are_several(monkeypatch):
    from types import SimpleNamespace

    from hetflow.runtime.launch import check_residence

    kernel, plan = SimpleNamespace(name="bump"), SimpleNamespace(data=("a", "x"), device_arrays=True)
    table = (hetflow.get_device("cpu0"), _gpu(0), _gpu(1))
    monkeypatch.setattr(devices_module, "devices", lambda: table)
    with pytest.raises(ArgumentError, match=r"kernel 'bump' argument 'x' is an array in the memory of gpu1, "
                                            r"but the launch runs on gpu0"):
        check_residence(kernel, table[1], plan, (2.0, _CupyLike(1)))
    check_residence(kernel, table[1], plan, (2.0, _CupyLike(0)))  # its own GPU
    check_residence(kernel, table[2], plan, (2.0, _CupyLike(1)))
    # a plan whose arguments hold no GPU array (coherent arrays, host arrays) has nothing to check
    check_residence(kernel, table[1], SimpleNamespace(data=("a", "x"), device_arrays=False), (2.0, _CupyLike(1)))
    one_gpu = table[:2]
    monkeypatch.setattr(devices_module, "devices", lambda: one_gpu)
    check_residence(kernel, table[1], plan, (2.0, _CupyLike(1)))  # one GPU: nothing to check


@pytest.mark.simgpu
def test_a_queue_refuses_an_array_of_a_gpu_outside_its_context(monkeypatch):
    """The simulator's gpu0 in the queue, a stand-in gpu1 in the device table holding the array."""
    with Queue(["cpu0", "gpu0"]) as q:
        lanes = q.devices
        monkeypatch.setattr(devices_module, "devices", lambda: (*lanes, _gpu(1)))
        with pytest.raises(ArgumentError, match=r"argument 0 is an array in the memory of gpu1, which is "
                                                r"not in this queue's context \(cpu0, gpu0\)"):
            q.enqueue(_bump, 1, _CupyLike(1))


# -- two real GPUs -----------------------------------------------------------------------------
@hetflow.kernel
def _bump(i, x):
    x[i] += 1.0


@hetflow.kernel
def _scale(i, j, out, src):
    out[i, j] = 3.0 * src[i, j]


@hetflow.kernel
def _bigger(a, b):
    return a if a > b else b


@hetflow.kernel
def _plus(a, b):
    return a + b


@hetflow.kernel
def _product(i, x, y):
    return x[i] * y[i]


@hetflow.kernel
def _negated(v):
    return -v


def _two_gpus():
    gpus = [d for d in hetflow.devices() if d.kind == "gpu" and not d.simulated]
    if len(gpus) < 2:
        pytest.skip("needs two GPUs")
    from hetflow.cuda_compat import cupy_module

    return cupy_module()


@pytest.fixture(autouse=True)
def _gpu0_current_after():
    """gpu0 current after each test: a launch leaves its GPU current (as cudaSetDevice
    would), and later tests make their CuPy arrays on the current GPU and name gpu0."""
    yield
    if len([d for d in hetflow.devices() if d.kind == "gpu" and not d.simulated]) > 1:
        from hetflow.cuda_compat import cupy_module

        cupy_module().cuda.Device(0).use()


def _zeros(cp, ordinal, n):
    """``n`` zeros in GPU ``ordinal``'s memory (a launch leaves its own GPU current)."""
    with cp.cuda.Device(ordinal):
        return cp.zeros(n)


def _total(x) -> float:
    with x.device:
        return float(x.sum())


@pytest.mark.gpu
def test_a_launch_over_arrays_of_the_second_gpu_runs_there():
    cp = _two_gpus()
    rng = np.random.default_rng(5)
    start, u = rng.random(10_001), rng.random((40, 33))
    with cp.cuda.Device(1):
        x, src, out = cp.asarray(start), cp.asarray(u), cp.zeros((38, 31))
    report = hetflow.forall(x.size, _bump, x)
    assert report.workers[0].device_id == "gpu1"
    report = hetflow.forall(out.shape, _scale, out, hetflow.interior(src, 1))  # a view: its root's GPU
    assert report.workers[0].device_id == "gpu1"
    with cp.cuda.Device(1):
        np.testing.assert_array_equal(x.get(), start + 1.0)
        np.testing.assert_array_equal(out.get(), 3.0 * u[1:-1, 1:-1])
        assert float(hetflow.reduce(x, _bigger)) == start.max() + 1.0  # the compiled path, on gpu1


@pytest.mark.gpu
def test_numba_device_arrays_of_the_second_gpu_run_there():
    _two_gpus()
    from numba import cuda

    with cuda.gpus[1]:
        x = cuda.to_device(np.arange(1000.0))
    assert hetflow.forall(1000, _bump, x).workers[0].device_id == "gpu1"
    with cuda.gpus[1]:
        np.testing.assert_array_equal(x.copy_to_host(), np.arange(1000.0) + 1.0)


@pytest.mark.gpu
def test_naming_another_gpu_than_the_arrays_is_an_argument_error_and_harms_nothing():
    cp = _two_gpus()
    x = _zeros(cp, 1, 1000)
    with pytest.raises(ArgumentError, match=r"argument 'x' is an array in the memory of gpu1, but the launch "
                                            r"runs on gpu0"):
        hetflow.forall(x.size, _bump, x, device="gpu0")
    with Queue(["cpu0", "gpu0", "gpu1"]) as q, pytest.raises(ArgumentError, match="memory of gpu1"):
        q.enqueue(_bump, x.size, x, device="gpu0")
    with Queue("gpu0") as q, pytest.raises(ArgumentError, match="memory of gpu1"):
        q.enqueue(_bump, x.size, x)
    with Queue(["cpu0", "gpu0"]) as q, pytest.raises(ArgumentError, match="gpu1, which is not in this queue"):
        q.enqueue(_bump, x.size, x)
    # nothing ran, and both GPUs still work (no fault ended a CUDA context)
    y = _zeros(cp, 0, 1000)
    hetflow.forall(y.size, _bump, y, device="gpu0")
    hetflow.forall(x.size, _bump, x, device="gpu1")
    assert _total(y) == _total(x) == 1000.0


@pytest.mark.gpu
def test_a_launch_runs_on_its_gpu_whichever_gpu_the_application_made_current():
    cp = _two_gpus()
    x0, x1 = _zeros(cp, 0, 1000), _zeros(cp, 1, 1000)
    for current in (0, 1, 0, 1):  # the application switches between hetflow's launches
        with cp.cuda.Device(current):
            hetflow.forall(1000, _bump, x0, device="gpu0")
            hetflow.forall(1000, _bump, x1)
            hetflow.forall(1000, _bump, x0)
    assert (_total(x0), _total(x1)) == (8000.0, 4000.0)


@pytest.mark.gpu
def test_a_queue_on_every_device_runs_each_instance_on_its_arrays_gpu():
    cp = _two_gpus()
    x1, x0 = _zeros(cp, 1, 5000), _zeros(cp, 0, 5000)
    with Queue() as q:
        events = [q.enqueue(_bump, 5000, x) for x in (x1, x0, x1)]
        q.finish()
    assert [e.device for e in events] == ["gpu1", "gpu0", "gpu1"]
    assert (_total(x0), _total(x1)) == (5000.0, 10000.0)


@pytest.mark.gpu
def test_reduce_scan_sort_and_map_reduce_of_the_second_gpus_arrays_run_there_whatever_is_current():
    cp = _two_gpus()
    rng = np.random.default_rng(8)
    host, other = rng.random(50_000), rng.random(50_000)
    with cp.cuda.Device(1):
        x, y = cp.asarray(host), cp.asarray(other)
    with cp.cuda.Device(0):  # the application's current GPU is not the data's: temporaries follow the data
        assert float(hetflow.reduce(x, _bigger)) == host.max()
        np.testing.assert_allclose(hetflow.scan(x, "sum").get(), np.cumsum(host), rtol=1e-10)
        np.testing.assert_allclose(hetflow.scan(x, _plus).get(), np.cumsum(host), rtol=1e-10)
        np.testing.assert_array_equal(hetflow.sort(x).get(), np.sort(host))
        np.testing.assert_array_equal(hetflow.sort(x, key=_negated).get(), np.sort(host)[::-1])
        assert np.isclose(float(hetflow.reduce(x.size, _product, x, y)), host @ other, rtol=1e-10)
        assert cp.cuda.runtime.getDevice() == 0  # and the application's choice stands after them


def test_a_negative_gpu_ordinal_is_refused():
    with pytest.raises(hetflow.errors.ArgumentTypeError, match=r"unknown device -1: use None"):
        hetflow.zeros(3, device=-1)


@pytest.mark.gpu
def test_an_array_on_a_gpu_the_machine_lacks_is_a_device_error():
    import cupy

    count = cupy.cuda.runtime.getDeviceCount()
    for device in (count, f"gpu{count}", f"cuda:{count}"):
        with pytest.raises(hetflow.errors.DeviceError,
                           match=rf"no GPU {count} to place an array on: this machine has {count}"):
            hetflow.zeros(3, device=device)


@pytest.mark.simgpu
def test_a_plan_knows_whether_its_arguments_hold_gpu_arrays(gpu_device):
    """What check_residence skips on: a coherent array (its copy is the launch's GPU's) or a
    host array holds no other GPU's memory; a GPU array, plain or under a view, may."""
    from numba import cuda

    from hetflow.runtime.launch import bind

    on_gpu = cuda.to_device(np.zeros(4))
    assert bind(_bump, 4, (on_gpu,), gpu_device).plan.device_arrays
    assert bind(_bump, 2, (hetflow.interior(on_gpu, 1),), gpu_device).plan.device_arrays
    assert not bind(_bump, 4, (hetflow.array(np.zeros(4)),), gpu_device).plan.device_arrays
    assert not bind(_bump, 4, (np.zeros(4),), gpu_device).plan.device_arrays
