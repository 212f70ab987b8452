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


@pytest.mark.gpu
def test_fast_entry_launches_host_and_numba_device_arrays():
    """Host arrays staged on the GPU (as numba-cuda device arrays), and numba-cuda's device
    arrays passed directly, launch through the fast entry too."""
    from numba import cuda

    _run(np, "gpu0")
    x = np.random.default_rng(4).random(1001)
    out = cuda.device_array(1001)
    hetflow.forall(1001, mixed, 2.0, 3, True, 1j, cuda.to_device(x), cuda.to_device(x), out, device="gpu0")
    np.testing.assert_allclose(out.copy_to_host(), _oracle(2.0, 3, True, 1j, x, x))
    plans = [p for p in mixed.plans.values() if p.executable.description.kind == "gpu"]
    assert len(plans) >= 2 and all(p.fast_entry for p in plans)  # launched without the dispatcher


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


@hetflow.kernel
def many_live(i, x, out):
    """Sixteen float64 values live across a loop: more registers than the occupancy bound
    leaves (32 a thread), so compiled under it the entry would spill."""
    v = x[i]
    a0, a1, a2, a3, a4, a5, a6, a7 = v, v + 1.0, v + 2.0, v + 3.0, v + 4.0, v + 5.0, v + 6.0, v + 7.0
    b0, b1, b2, b3, b4, b5, b6, b7 = v * 2.0, v * 3.0, v * 4.0, v * 5.0, v * 6.0, v * 7.0, v * 8.0, v * 9.0
    for _ in range(8):
        a0, a1, a2, a3 = a0 * 0.5 + b7, a1 * 0.5 + a0, a2 * 0.5 + a1, a3 * 0.5 + a2
        a4, a5, a6, a7 = a4 * 0.5 + a3, a5 * 0.5 + a4, a6 * 0.5 + a5, a7 * 0.5 + a6
        b0, b1, b2, b3 = b0 * 0.25 + a7, b1 * 0.25 + b0, b2 * 0.25 + b1, b3 * 0.25 + b2
        b4, b5, b6, b7 = b4 * 0.25 + b3, b5 * 0.25 + b4, b6 * 0.25 + b5, b7 * 0.25 + b6
    out[i] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + b0 + b1 + b2 + b3 + b4 + b5 + b6 + b7


@pytest.mark.gpu
def test_entries_run_at_full_occupancy_unless_they_need_their_registers():
    """GPU entries are compiled for 8 blocks of 256 threads a multiprocessor (32 registers
    a thread); one that would spill more than a few registers under that bound is
    compiled again without it. Both give NumPy's result."""
    from hetflow.cli.demo import heat_step
    from hetflow.runtime import gpu
    from hetflow.runtime.launch import bind

    cp = pytest.importorskip("cupy")
    dev = hetflow.get_device("gpu0")
    u, v = np.random.default_rng(5).random((70, 70)), np.zeros((70, 70))
    gu, gv = cp.asarray(u), cp.asarray(v)
    args = (interior(gv, 1), interior(gu, 1), interior(cshift(gu, 0, -1), 1), interior(cshift(gu, 0, 1), 1),
            interior(cshift(gu, 1, -1), 1), interior(cshift(gu, 1, 1), 1), 0.1)
    hetflow.forall((68, 68), heat_step, *args, device=dev)
    c = u[1:-1, 1:-1]
    want = c + 0.1 * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] - 4.0 * c)
    np.testing.assert_allclose(gv.get()[1:-1, 1:-1], want)
    assert bind(heat_step, (68, 68), args, dev).plan.fast_entry.compiled.regs_per_thread <= 32

    x = np.random.default_rng(6).random(1000)
    out = cp.zeros(1000)
    hetflow.forall(1000, many_live, cp.asarray(x), out, device=dev)
    want = np.zeros(1000)
    many_live.pyfunc(np.arange(1000), x, want)  # the kernel's own code, run by NumPy on whole arrays
    np.testing.assert_allclose(out.get(), want)
    fast = bind(many_live, 1000, (cp.asarray(x), out), dev).plan.fast_entry
    assert fast.compiled.local_mem_per_thread <= gpu.SPILL_BYTES


@pytest.mark.simgpu
def test_what_numba_cuda_cannot_compile_is_hetflows_compile_error(gpu_device):
    """Compiling a GPU entry, by the dispatcher or for the fast entry, fails as
    KernelCompileError naming kernel and device, whichever of numba-cuda's errors it was."""
    from numba.core.errors import TypingError

    from hetflow.errors import KernelCompileError
    from hetflow.runtime.gpu import compile_errors
    from hetflow.runtime.launch import bind

    x = np.zeros(4)
    launch = bind(shifted_copy, 4, (x, np.zeros(7)), gpu_device)
    for exc in (NotImplementedError("no lowering for absolute(int64)"), TypingError("cannot type it")):
        with pytest.raises(KernelCompileError, match=rf"shifted_copy.*{gpu_device.id}"):
            with compile_errors(launch):
                raise exc


@hetflow.kernel
def add_one(i, x):
    x[i] += 1.0


@pytest.mark.gpu
def test_synchronize_waits_for_every_launch_enqueued_on_the_gpu(gpu_device):
    """Launches over CuPy arrays return once enqueued; ``Device.synchronize`` returns only
    when they have run (a CUDA event recorded after them has completed), from another
    thread's launches too."""
    import threading

    import cupy

    x = cupy.zeros(1 << 25)
    elsewhere = cupy.zeros(1 << 25)

    def launch_from_another_thread():
        for _ in range(20):
            hetflow.forall(elsewhere.size, add_one, elsewhere, device=gpu_device.id)
        other_done.record()

    other_done = cupy.cuda.Event(disable_timing=True)
    t = threading.Thread(target=launch_from_another_thread)
    t.start()
    for _ in range(20):
        hetflow.forall(x.size, add_one, x, device=gpu_device.id)
    done = cupy.cuda.Event(disable_timing=True)
    done.record()
    t.join()
    gpu_device.synchronize()
    assert done.done and other_done.done
    assert float(x.min()) == float(x.max()) == 20.0 == float(elsewhere.max()) == float(elsewhere.min())


@pytest.mark.simgpu
def test_synchronize_on_the_simulator_and_on_a_cpu(gpu_device):
    """Under the simulator (launches run as they are made) and on a CPU, synchronize
    returns with the launches' results in place."""
    for device in (gpu_device, hetflow.get_device("cpu0")):
        x = np.zeros(64)
        hetflow.forall(x.size, add_one, x, device=device.id)
        device.synchronize()
        np.testing.assert_array_equal(x, 1.0)
