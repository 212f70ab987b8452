"""An exception raised by a kernel's own code is the kernel's, not a device fault (issue 23
item 3): it reaches the caller as a KernelRaisedError naming the kernel, the device and
the rows, with the original as __cause__, and co-execution does not run the rows again
elsewhere; a fault of the device is still recovered. Oracles: NumPy, the raised types."""
import numpy as np
import pytest

import hetflow
from hetflow.errors import DeviceError, IndexOutOfBoundsError, KernelError, KernelRaisedError
from hetflow.runtime import coexec
from hetflow.runtime.steal import Worker, run_loop


@hetflow.kernel
def picky(i, x, out):
    if x[i] > 5:
        raise ValueError("too big")
    out[i] = x[i]


@hetflow.kernel(boundscheck=True)
def shifted(i, x, out):
    out[i] = x[i + 1]


@hetflow.kernel
def double(i, x, out):
    out[i] = 2.0 * x[i]


DEVICES = ["cpu0", pytest.param("gpu0", marks=pytest.mark.simgpu),
           pytest.param(["cpu0", "gpu0"], marks=pytest.mark.simgpu, id="cpu0+gpu0")]


@pytest.mark.parametrize("device", DEVICES)
def test_a_raise_in_the_kernel_names_kernel_device_and_rows(device):
    x = np.arange(10.0)
    with pytest.raises(KernelRaisedError) as info:
        hetflow.forall(10, picky, x, np.zeros(10), device=device)
    err = info.value
    assert isinstance(err, KernelError) and not isinstance(err, DeviceError)
    assert "kernel 'picky' raised ValueError" in str(err) and "too big" in str(err)
    assert isinstance(err.__cause__, ValueError)
    assert err.kernel == "picky" and err.device in ("cpu0", "gpu0")
    lo, hi = err.rows
    assert lo < hi and x[lo:hi].max() > 5  # the chunk that raised holds a row above 5


def test_a_raise_in_a_whole_parallel_launch_is_the_kernels():
    x = np.arange(100_000.0)  # past the inline limit: Numba's parallel layer runs it
    with pytest.raises(KernelRaisedError, match="kernel 'picky' raised ValueError on cpu0") as info:
        hetflow.forall(x.size, picky, x, np.zeros(x.size))
    assert isinstance(info.value.__cause__, ValueError)


@hetflow.kernel
def fails_at(i, x, bad):
    if i == bad:
        raise ValueError("bad row")
    x[i] += 1.0


@pytest.mark.parametrize("where", [0.0, 0.5, 1.0])
def test_a_raise_on_any_of_numbas_threads_is_the_kernels(where):
    """Numba's threads lose what they raise (only the calling thread's came out: a raise in
    the last rows of a whole launch used to return as if all went well)."""
    n = 100_000  # past the inline limit: Numba's parallel layer runs it
    bad = min(n - 1, int(where * n))
    with pytest.raises(KernelRaisedError, match="kernel 'fails_at' raised ValueError on cpu0") as info:
        hetflow.forall(n, fails_at, np.zeros(n), bad, device="cpu0")
    lo, hi = info.value.rows
    assert lo <= bad < hi and isinstance(info.value.__cause__, ValueError)


def test_a_raise_lost_on_numbas_threads_that_does_not_come_again_is_still_the_kernels(monkeypatch):
    """The piece that raised is run again to raise the kernel's own exception; where that
    run does not raise (a kernel whose raise depends on what it wrote), the error still
    names the kernel and the piece's rows."""
    from hetflow.runtime import cpu

    n = 100_000
    monkeypatch.setattr(cpu, "chunk_runner", lambda launch: lambda lo, hi: None)  # the run again: no raise
    with pytest.raises(KernelRaisedError, match=r"kernel 'fails_at' raised RuntimeError on cpu0 in rows "
                                                r"\[\d+, \d+\): it raised on one of Numba's threads, "
                                                r"which lost the exception, and not when run again") as info:
        hetflow.forall(n, fails_at, np.zeros(n), n - 1, device="cpu0")
    lo, hi = info.value.rows
    assert lo <= n - 1 < hi


@pytest.mark.simgpu
def test_a_checked_kernel_out_of_bounds_co_executed_is_raised_not_recovered():
    with pytest.raises(IndexOutOfBoundsError, match="kernel 'shifted'"):
        hetflow.forall(10, shifted, np.arange(10.0), np.zeros(10), device=["cpu0", "gpu0"],
                       schedule="static", shares=[0.5, 0.5])


@pytest.mark.simgpu
def test_a_device_fault_is_still_recovered(monkeypatch):

    def lost(self, lo, hi):
        raise RuntimeError("GPU fell off the bus")

    monkeypatch.setattr(coexec.GpuChunks, "run_chunk", lost)
    x = np.arange(300.0)
    out = np.zeros(300)
    report = hetflow.forall(300, double, x, out, device=["cpu0", "gpu0"], schedule="static",
                            shares=[0.5, 0.5])
    np.testing.assert_array_equal(out, 2 * x)
    assert report.failures and "fell off the bus" in report.failures[0].error


def test_run_loop_stops_at_a_kernel_exception_and_recovers_a_fault():
    ran = np.zeros(40, dtype=int)

    def fine(lo, hi):
        ran[lo:hi] += 1

    def kernel_raises(lo, hi):
        raise KernelRaisedError("kernel 'k' raised ValueError", "k")

    def device_dies(lo, hi):
        raise RuntimeError("worker died")

    with pytest.raises(KernelRaisedError):
        run_loop(40, [Worker("a", "cpu", fine, 5, "cpu0"), Worker("b", "cpu", kernel_raises, 5, "cpu0")],
                 schedule="static")
    ran[:] = 0
    report = run_loop(40, [Worker("a", "cpu", fine, 5, "cpu0"), Worker("b", "cpu", device_dies, 5, "cpu0")],
                      schedule="static")
    assert (ran == 1).all() and report.failures
