"""Co-execution under faults (issue 18 items 1-2, issue 16's fault test); oracle: NumPy.

On cpu0 + the simulated gpu0, with a static split that gives the GPU several chunks:
an output written only where a condition holds keeps its old values on the GPU's rows;
a GPU that fails after some of its chunks landed has exactly the others re-run, so a
read-modify-write kernel applies once per index; with coherent arrays (hetflow.array) a
GPU failing mid-program loses no rows. Failures are injected where a device fails: a
chunk's launch, or the wait for what the GPU was given (``retire``, ``sync``).
"""
import gc
import threading
import weakref

import numpy as np
import pytest

import hetflow
from hetflow import cshift, interior, project
from hetflow.cuda_compat import cuda_module
from hetflow.runtime import coexec, staging

pytestmark = pytest.mark.simgpu

N = 512          # 8 simulated-GPU chunks of 64 rows at most


@hetflow.kernel
def keep_positive(i, x, out):
    if x[i] > 0:
        out[i] = x[i]


@hetflow.kernel
def bump(i, out):
    out[i] = out[i] + 1.0


@hetflow.kernel
def bump_where(i, x, out):
    if x[i] > 0:
        out[i] = out[i] + x[i]


@hetflow.kernel
def scale_add(i, a, x, out):
    out[i] = a * out[i] + x[i]


class Fault(RuntimeError):
    """The injected failure of a device."""


def fail_gpu(monkeypatch, at: int, where="run_chunk", every: bool = False):
    """Make the co-executed GPU's ``at``-th call of ``where`` (a GpuChunks method, or a
    tuple of them counted together) raise, and every later one with ``every``: a device
    lost after its earlier chunks ran."""
    calls = {"n": 0}
    for name in (where,) if isinstance(where, str) else where:
        original = getattr(coexec.GpuChunks, name)

        def flaky(self, *args, name=name, original=original):
            calls["n"] += 1
            if calls["n"] == at or (every and calls["n"] > at):
                raise Fault(f"GPU lost at {name} call {calls['n']}")
            return original(self, *args)

        monkeypatch.setattr(coexec.GpuChunks, name, flaky)
    return calls


# Where a GPU that dies while it runs what it was given fails: waiting for its oldest
# chunk in flight (retire) or for the last ones (sync); both, for a GPU that never
# completes anything again.
WAITS = ("retire", "sync")


def both(gpu_device, kernel, *args, shares=(0.1, 0.9), extent=N):
    return hetflow.forall(extent, kernel, *args, device=["cpu0", gpu_device.id], schedule="static",
                          shares=list(shares))


def gpu_rows(report) -> int:
    return sum(w.indices for w in report.workers if w.kind == "gpu")


@pytest.mark.parametrize("coherent", [False, True])
def test_conditional_writes_keep_old_values_on_gpu_rows(gpu_device, coherent):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(N)
    old = rng.standard_normal(N)
    out = hetflow.array(old) if coherent else old.copy()
    report = both(gpu_device, keep_positive, x, out)
    assert gpu_rows(report) > 0
    np.testing.assert_array_equal(np.asarray(out), np.where(x > 0, x, old))


def test_conditional_writes_through_a_view_keep_old_values(gpu_device):
    x = np.random.default_rng(2).standard_normal((N + 2, 3))
    old = np.arange((N + 2) * 3, dtype=np.float64).reshape(N + 2, 3)
    out = old.copy()
    report = both(gpu_device, keep_positive, project(interior(x, 1), 1, 0), project(interior(out, 1), 1, 0))
    assert gpu_rows(report) > 0
    want = old.copy()
    want[1:-1, 1] = np.where(x[1:-1, 1] > 0, x[1:-1, 1], old[1:-1, 1])
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("coherent", [False, True])
@pytest.mark.parametrize("at", [2, 4, 5])
def test_read_modify_write_applies_once_when_the_gpu_fails_after_chunks_landed(gpu_device, monkeypatch,
                                                                             coherent, at):
    fail_gpu(monkeypatch, at)
    start = np.arange(N, dtype=np.float64)
    out = hetflow.array(start) if coherent else start.copy()
    report = both(gpu_device, bump, out)
    np.testing.assert_array_equal(np.asarray(out), start + 1)
    assert report.failures and "GPU lost" in report.failures[0].error
    assert sum(w.indices for w in report.workers) == N   # every index counted once


@pytest.mark.parametrize("coherent", [False, True])
@pytest.mark.parametrize("where,at", [("retire", 2), ("sync", 1)])
def test_a_gpu_failing_while_it_waits_has_only_its_unfinished_chunks_re_run(gpu_device, monkeypatch,
                                                                            coherent, where, at):
    calls = fail_gpu(monkeypatch, at, where)
    rng = np.random.default_rng(3)
    x, start = rng.standard_normal(N), rng.standard_normal(N)
    out = hetflow.array(start) if coherent else start.copy()
    report = both(gpu_device, bump_where, x, out)
    assert calls["n"] >= at and report.failures
    np.testing.assert_array_equal(np.asarray(out), np.where(x > 0, start + x, start))


@pytest.mark.parametrize("where,at", [("run_chunk", 2), ("run_chunk", 4), ("retire", 1), ("sync", 1)])
def test_rows_resident_only_on_a_failing_gpu_are_neither_lost_nor_applied_twice(gpu_device, monkeypatch,
                                                                               where, at):
    start = np.arange(N, dtype=np.float64)
    out = hetflow.array(start)
    hetflow.forall(N, bump, out, device=gpu_device.id)       # current on the GPU alone now
    assert out.valid == (gpu_device.id,)
    fail_gpu(monkeypatch, at, where)
    report = both(gpu_device, bump, out)
    assert report.failures
    np.testing.assert_array_equal(out.numpy(), start + 2)


def test_a_dead_gpu_holding_the_only_copy_of_rows_it_was_updating_says_they_are_lost(gpu_device, monkeypatch):
    out = hetflow.array(np.zeros(N))
    hetflow.forall(N, bump, out, device=gpu_device.id)
    fail_gpu(monkeypatch, 1, where=WAITS, every=True)      # it never completes anything again
    # the 4 chunks of 64 rows in flight at its first wait (the GPU's inflight) are lost
    with pytest.raises(hetflow.errors.DeviceError, match=r"rows \[\(51, 307\)\] were current only on gpu0, which failed"):
        both(gpu_device, bump, out)


def test_a_dead_gpu_loses_nothing_that_is_current_elsewhere(gpu_device, monkeypatch):
    start = np.arange(N, dtype=np.float64)
    out = hetflow.array(start)
    fail_gpu(monkeypatch, 1, where=WAITS, every=True)
    report = both(gpu_device, bump, out)
    assert report.failures and gpu_rows(report) == 0
    np.testing.assert_array_equal(out.numpy(), start + 1)
    assert gpu_device.id not in out.valid


@hetflow.kernel
def bump_both(i, out, v):
    out[i] = out[i] + 1.0
    v[i] = v[i] + 2.0


def test_a_gpu_dying_before_its_results_come_home_has_them_re_run_once(gpu_device, monkeypatch):
    def lost(self, ranges):
        raise Fault("GPU lost before the merge")

    monkeypatch.setattr(coexec.GpuChunks, "merge_back", lost)
    out = np.arange(N, dtype=np.float64)
    u = np.arange((N + 2) * 3, dtype=np.float64).reshape(N + 2, 3)
    want_out, want_u = out + 1, u.copy()
    want_u[1:-1, 1] += 2
    report = both(gpu_device, bump_both, out, project(interior(u, 1), 1, 0))   # a plain array and a view
    assert gpu_rows(report) > 0
    np.testing.assert_array_equal(out, want_out)
    np.testing.assert_array_equal(u, want_u)


@hetflow.kernel
def heat(i, j, new, c, n, s, w, e):
    new[i, j] = c[i, j] + 0.1 * (n[i, j] + s[i, j] + w[i, j] + e[i, j] - 4.0 * c[i, j])


@hetflow.kernel
def relax(i, j, u):
    u[i, j] = 0.75 * u[i, j] + 0.5


def program(u, v, steps, device):
    """``steps`` heat steps (``u`` into ``v``, then swapped), each followed by an update
    in place; on hetflow arrays. Returns the last grid."""
    split = {"schedule": "static", "shares": [0.25, 0.75]} if len(device) > 1 else {}
    for _ in range(steps):
        hetflow.forall((u.shape[0] - 2, u.shape[1] - 2), heat, interior(v, 1), interior(u, 1),
                       interior(cshift(u, 0, -1), 1), interior(cshift(u, 0, 1), 1),
                       interior(cshift(u, 1, -1), 1), interior(cshift(u, 1, 1), 1), device=device, **split)
        hetflow.forall(v.shape, relax, v, device=device, **split)
        u, v = v, u
    return u


# The GPU's 13th chunk and 4th retire are in the second in-place update, with a chunk of
# it already run; its 21st chunk is in the third.
@pytest.mark.parametrize("where,at,every", [("run_chunk", 13, False), ("retire", 4, False),
                                            ("run_chunk", 13, True), ("run_chunk", 21, False)])
def test_a_gpu_failing_mid_program_loses_no_data(gpu_device, monkeypatch, where, at, every):
    """Issue 16: a program of launches over coherent arrays on cpu0 + gpu0, the GPU
    failing in a middle one (for good, with ``every``), gives the single-device grid."""
    grid = np.random.default_rng(5).random((66, 6))
    want = program(hetflow.array(grid), hetflow.array(grid), 3, ["cpu0"]).numpy()
    u, v = hetflow.array(grid), hetflow.array(grid)
    calls = fail_gpu(monkeypatch, at, where, every)
    got = program(u, v, 3, ["cpu0", gpu_device.id])
    assert calls["n"] >= at
    np.testing.assert_array_equal(got.numpy(), want)


def test_a_merge_that_cannot_be_redone_from_the_host_is_named_not_applied_twice(gpu_device, monkeypatch):
    def lost(self, ranges):
        raise Fault("GPU lost before the merge")

    start = np.arange(N, dtype=np.float64)
    out = hetflow.array(start)
    hetflow.forall(N, bump, out, device=gpu_device.id)       # the only current copy is the GPU's
    monkeypatch.setattr(coexec.GpuChunks, "merge_back", lost)
    u = np.zeros((N + 2, 3))
    with pytest.raises(hetflow.errors.DeviceError, match=r"cannot re-run rows \[\(51, 512\)\] on cpu0: rows "
                                                    r"\[\(51, 512\)\] of <hetflow Buffer .* updated in place"):
        both(gpu_device, bump_both, out, project(interior(u, 1), 1, 0))
    np.testing.assert_array_equal(out.numpy(), start + 2)      # each row's update landed once


def test_a_recovered_fault_keeps_the_launch_s_arrays_alive_no_longer_than_the_call(gpu_device, monkeypatch):
    # The failed worker's exception holds its frames, which hold the loop: a cycle that
    # kept the arrays (and their registered memory) until the collector's next pass.
    fail_gpu(monkeypatch, 2)
    out = np.arange(N, dtype=np.float64)
    alive = weakref.ref(out)
    gc.disable()
    try:
        report = both(gpu_device, bump, out)
        assert report.failures
        np.testing.assert_array_equal(out, np.arange(N) + 1.0)
        del out, report
        assert alive() is None
    finally:
        gc.enable()


def test_a_gpu_that_cannot_allocate_its_copies_raises_device_error_or_leaves_its_rows(gpu_device, monkeypatch):
    def full(*args, **kwargs):
        raise MemoryError("out of device memory (injected)")

    monkeypatch.setattr(cuda_module(), "device_array", full)
    x, out = np.arange(N, dtype=np.float64), np.zeros(N)
    with pytest.raises(hetflow.errors.DeviceError, match=r"gpu0: cannot allocate 4096 bytes .* kernel 'scale_add'"):
        hetflow.forall(N, scale_add, 2.0, x, out, device=gpu_device.id)       # alone: the launch fails
    np.testing.assert_array_equal(out, np.zeros(N))
    report = both(gpu_device, scale_add, 2.0, x, out)                          # beside the cores: they take its rows
    assert report.failures and "cannot allocate" in report.failures[0].error and gpu_rows(report) == 0
    np.testing.assert_array_equal(out, x)


@hetflow.kernel
def bump_or_raise(i, out):
    if i == 250:
        raise ValueError("bad row")
    out[i] = out[i] + 1.0


@hetflow.kernel
def copy_rows(i, x, y):
    y[i] = x[i]


def cpu_starts_after_a_gpu_chunk(monkeypatch, fail_from=None):
    """The CPU's chunks wait until the GPU ran one (its rows then hold the launch's
    writes on the GPU's copy), and raise from their ``fail_from``-th on, if given."""
    ran = threading.Event()
    original_chunk, original_runner = coexec.GpuChunks.run_chunk, coexec._cpu_runner

    def run_chunk(self, lo, hi):
        original_chunk(self, lo, hi)
        ran.set()

    def runner(*args, **kwargs):
        run, calls = original_runner(*args, **kwargs), {"n": 0}

        def late(lo, hi):
            assert ran.wait(30)
            calls["n"] += 1
            if fail_from is not None and calls["n"] >= fail_from:
                raise Fault("CPU lost")
            run(lo, hi)
        return late

    monkeypatch.setattr(coexec.GpuChunks, "run_chunk", run_chunk)
    monkeypatch.setattr(coexec, "_cpu_runner", runner)


def read_everywhere(gpu_device, out):
    """``out`` as a launch on the GPU, one on the CPU and the host read each see it."""
    seen = []
    for device in (gpu_device.id, "cpu0"):
        y = np.full(N, -1.0)
        hetflow.forall(N, copy_rows, out, y, device=device)
        seen.append(y)
    return seen + [np.asarray(out)]


def test_a_kernel_that_raises_leaves_every_copy_of_a_coherent_array_agreeing(gpu_device, monkeypatch):
    # The GPU's rows hold the launch's writes on its copy when the CPU's rows raise: that
    # copy was still counted current beside a host copy without them.
    cpu_starts_after_a_gpu_chunk(monkeypatch)
    out = hetflow.array(np.zeros(N))
    with pytest.raises(hetflow.errors.KernelRaisedError, match="bad row"):
        both(gpu_device, bump_or_raise, out, shares=(0.5, 0.5))   # row 250 is the CPU's
    monkeypatch.undo()
    on_gpu, on_cpu, host = read_everywhere(gpu_device, out)
    assert on_gpu[256:].sum() >= 64                           # the GPU's first chunk ran
    np.testing.assert_array_equal(on_gpu, host)
    np.testing.assert_array_equal(on_cpu, host)
    assert set(np.unique(host)) <= {0.0, 1.0} and host[250] == 0.0


def test_every_worker_failing_leaves_every_copy_of_a_coherent_array_agreeing(gpu_device, monkeypatch):
    cpu_starts_after_a_gpu_chunk(monkeypatch, fail_from=2)
    fail_gpu(monkeypatch, 2, every=True)
    out = hetflow.array(np.zeros(N))
    with pytest.raises(hetflow.errors.DeviceError, match="every worker failed"):
        both(gpu_device, bump, out, shares=(0.5, 0.5))
    monkeypatch.undo()
    on_gpu, on_cpu, host = read_everywhere(gpu_device, out)
    assert on_gpu.sum() >= 64                                 # rows ran before the failures
    np.testing.assert_array_equal(on_gpu, host)
    np.testing.assert_array_equal(on_cpu, host)
    assert set(np.unique(host)) <= {0.0, 1.0}


def run_alone_on(monkeypatch, device):
    """The performance model's choice, as its history would make it: ``device`` alone."""
    monkeypatch.setattr(coexec, "_alone", lambda *args: device)


@pytest.mark.parametrize("coherent", [False, True])
def test_a_gpu_run_alone_that_fails_has_its_rows_run_on_the_cpu_once(gpu_device, monkeypatch, coherent):
    # A device list keeps its fault tolerance when the model runs the launch on one GPU:
    # the raw failure reached the caller, at every later launch too.
    run_alone_on(monkeypatch, gpu_device)
    fail_gpu(monkeypatch, 1, every=True)
    start = np.arange(N, dtype=np.float64)
    out = hetflow.array(start) if coherent else start.copy()
    for launch in range(1, 3):
        report = hetflow.forall(N, bump, out, device=["cpu0", gpu_device.id])
        np.testing.assert_array_equal(np.asarray(out), start + launch)
        assert {w.device_id for w in report.workers} == {"cpu0"} and sum(w.indices for w in report.workers) == N
        assert report.failures[0].device_id == gpu_device.id and "GPU lost" in report.failures[0].error


def test_a_gpu_run_alone_that_fails_after_pieces_landed_has_only_the_rest_rerun(gpu_device, monkeypatch):
    run_alone_on(monkeypatch, gpu_device)
    monkeypatch.setattr(staging, "PIECE_RUN_BYTES", 64)  # 8 pieces of 64 rows, 4 in flight
    fail_gpu(monkeypatch, 6)                                     # pieces 1-2 landed, 3-5 did not
    start = np.arange(N, dtype=np.float64)
    out = start.copy()
    report = hetflow.forall(N, bump, out, device=["cpu0", gpu_device.id])
    np.testing.assert_array_equal(out, start + 1)               # read-modify-write, once per row
    assert report.failures[0].requeued == ((128, N),) and sum(w.indices for w in report.workers) == N - 128


def test_a_gpu_run_alone_that_fails_without_a_cpu_to_take_over_raises_device_error(gpu_device, monkeypatch):
    fail_gpu(monkeypatch, 1)
    with pytest.raises(hetflow.errors.DeviceError, match=r"gpu0 failed running kernel 'bump': Fault\('GPU lost"):
        hetflow.forall(N, bump, np.zeros(N), device=gpu_device.id)


@pytest.mark.parametrize("alone", [False, True])
def test_a_graph_drops_a_gpu_that_failed_in_a_launch(gpu_device, monkeypatch, alone):
    # The run report's failure becomes a device_failed event, so drop-lost-devices places
    # the next iterations on the CPU; before, the dead GPU was tried at every iteration.
    if alone:
        run_alone_on(monkeypatch, gpu_device)
    calls = fail_gpu(monkeypatch, 1, every=True)
    out = np.zeros(N)
    with hetflow.graph() as g:
        hetflow.forall(N, bump, out, device=["cpu0", gpu_device.id],
                       **({} if alone else dict(schedule="static", shares=[0.5, 0.5])))
    g.run(iterations=4)
    np.testing.assert_array_equal(out, np.full(N, 4.0))
    assert calls["n"] == 1
    assert "drop-lost-devices" in g.diff(0, len(g.versions) - 1)
