"""One forall co-executed by CPU cores and the (simulated) GPU; oracle: NumPy."""
import gc
import logging
import weakref

import numpy as np
import pytest

import hetflow
from hetflow import cshift, interior
from hetflow.runtime import coexec, perfmodel


@hetflow.kernel
def axpy(i, a, x, y, out):
    out[i] = a * x[i] + y[i]


@hetflow.kernel
def jacobi(i, j, new, n, s, w, e):
    new[i, j] = 0.25 * (n[i, j] + s[i, j] + w[i, j] + e[i, j])


@hetflow.kernel
def shift_write(i, x, out):
    out[i + 1] = x[i]


def _jacobi_numpy(u):
    out = u.copy()
    out[1:-1, 1:-1] = 0.25 * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:])
    return out


def test_cpu_only_steal_schedule_matches_numpy():
    x, y = np.arange(5000.0), np.ones(5000)
    out = np.zeros(5000)
    report = hetflow.forall(5000, axpy, 2.0, x, y, out, schedule="steal")
    np.testing.assert_array_equal(out, 2 * x + 1)
    assert sum(w.indices for w in report.workers) == 5000
    assert coexec.last_report() is report


def test_shares_are_per_device():
    with pytest.raises(hetflow.errors.ArgumentError, match=r"shares must be 1 non-negative numbers, one per device \(cpu0\)"):
        hetflow.forall(4, axpy, 1.0, np.zeros(4), np.zeros(4), np.zeros(4), schedule="static", shares=[0.5, 0.5])


def test_bad_schedule():
    with pytest.raises(hetflow.errors.ArgumentError, match="schedule must be 'steal' or 'static'"):
        hetflow.forall(4, axpy, 1.0, np.zeros(4), np.zeros(4), np.zeros(4), schedule="random")


@pytest.mark.simgpu
@pytest.mark.parametrize("schedule", ["steal", "static"])
def test_cpu_and_simulated_gpu_together(gpu_device, schedule):
    n = 600
    rng = np.random.default_rng(3)
    x, y = rng.random(n), rng.random(n)
    out = np.zeros(n)
    report = hetflow.forall(n, axpy, 3.0, x, y, out, device=["cpu0", gpu_device.id], schedule=schedule)
    np.testing.assert_array_equal(out, 3.0 * x + y)
    kinds = {w.kind for w in report.workers if w.indices}
    assert sum(w.indices for w in report.workers) == n
    assert "cpu" in kinds or "gpu" in kinds


@hetflow.kernel(boundscheck=True)
def axpy_checked(i, a, x, y, out):
    out[i] = a * x[i] + y[i]


@hetflow.kernel
def fails_at(i, x, bad):
    if i == bad:
        raise ValueError("bad row")
    x[i] += 1.0


@pytest.mark.simgpu
def test_beside_a_gpu_the_cores_are_one_worker_each_index_once(gpu_device):
    """The cores but one per GPU run as one worker (a team) whose chunks go over Numba's
    threading layer; in checked mode (its parallel pieces run on Python threads) one
    worker per core."""
    n = 5000
    x, y, out = np.arange(n, dtype=np.float64), np.ones(n), np.zeros(n)
    report = hetflow.forall(n, axpy, 2.0, x, y, out, device=["cpu0", gpu_device.id], schedule="static",
                            shares=[0.5, 0.5])
    np.testing.assert_array_equal(out, 2.0 * x + 1.0)
    assert [(w.name, w.kind) for w in report.workers if w.kind == "cpu"] == [("cpu0/cores", "cpu")]
    ranges = sorted((e.lo, e.hi) for e in report.events)
    assert ranges[0][0] == 0 and ranges[-1][1] == n and all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    cores = max(1, hetflow.get_device("cpu0").compute_units - 1)
    out[:] = 0.0
    report = hetflow.forall(n, axpy_checked, 2.0, x, y, out, device=["cpu0", gpu_device.id], schedule="static",
                            shares=[0.5, 0.5])
    np.testing.assert_array_equal(out, 2.0 * x + 1.0)
    assert [w.name for w in report.workers if w.kind == "cpu"] == [f"cpu0/core{k}" for k in range(cores)]


def test_a_team_of_two_threads_runs_every_row_once():
    """The team a CPU beside a GPU becomes (here without the GPU, two threads of it),
    its parallel entry compiled in its setup, in a loop of its own."""
    from hetflow.runtime.launch import bind
    from hetflow.runtime.steal import run_loop

    n = 300_000
    x, y, out = np.arange(n, dtype=np.float64), np.ones(n), np.zeros(n)
    launch = bind(axpy, n, (2.0, x, y, out), hetflow.get_device("cpu0"))
    compiled = []
    worker = coexec._team_worker(launch, n, 2, 2, (), compiled)
    assert worker.name == "cpu0/cores" and worker.setup is not None
    report = run_loop(n, [worker])
    np.testing.assert_array_equal(out, 2.0 * x + 1.0)
    assert report.workers[0].indices == n and len(compiled) == 1
    few = coexec._team_worker(launch, 1000, 2, 2, (), compiled)  # too few rows for two: the chunk entry
    assert few.setup is None


def test_a_team_runs_exactly_its_rows_and_names_a_failing_one():
    from hetflow.errors import KernelRaisedError
    from hetflow.runtime import cpu
    from hetflow.runtime.launch import bind

    x = np.zeros(1000)
    launch = bind(fails_at, x.size, (x, -1), hetflow.get_device("cpu0"))
    cpu.compile_launch(launch)
    cpu.compile_parallel(launch)
    run = cpu.team_runner(launch, 2)
    run(100, 357)
    run(900, 903)
    want = np.zeros(1000)
    want[100:357] = want[900:903] = 1.0
    np.testing.assert_array_equal(x, want)
    launch = bind(fails_at, x.size, (x, 500), hetflow.get_device("cpu0"))
    with pytest.raises(KernelRaisedError, match=r"bad row"):
        cpu.team_runner(launch, 2)(400, 600)


@hetflow.kernel
def count_visits(i, hits):
    hetflow.atomic.add(hits, i, 1)


@pytest.mark.parametrize("claim", [True, False])
@pytest.mark.parametrize("parts, lo, hi", [(97, 5, 1000), (16, 0, 16), (3, 10, 11), (40, 0, 1003)])
def test_the_parallel_entry_runs_each_row_once_whether_threads_claim_pieces_or_not(parts, lo, hi, claim):
    """Numba's threads claim the pieces from a shared counter (a team's), or each runs a
    fixed share (a whole launch's): more pieces than threads, pieces of unequal length and
    more pieces than rows leave no row run twice or not at all."""
    from hetflow.runtime import cpu
    from hetflow.runtime.launch import bind

    hits = np.zeros(1100, dtype=np.int64)
    launch = bind(count_visits, hits.size, (hits,), hetflow.get_device("cpu0"))
    cpu.compile_launch(launch)
    cpu._run_parallel(launch, min(parts, hi - lo), lo, hi, claim)
    want = np.zeros_like(hits)
    want[lo:hi] = 1
    np.testing.assert_array_equal(hits, want)


@pytest.mark.simgpu
def test_views_co_executed_merge_rows_back(gpu_device):
    u = np.random.default_rng(4).random((40, 12))
    v = u.copy()
    args = (interior(v, 1), interior(cshift(u, 0, -1), 1), interior(cshift(u, 0, 1), 1),
            interior(cshift(u, 1, -1), 1), interior(cshift(u, 1, 1), 1))
    hetflow.forall(args[0].shape, jacobi, *args, device=["cpu0", gpu_device.id], shares=[0.5, 0.5])
    np.testing.assert_array_equal(v, _jacobi_numpy(u))


@pytest.mark.simgpu
def test_streamed_rows_through_pinned_buffers_reused_across_chunks(gpu_device, monkeypatch):
    # Every chunk's rows move through page-locked buffers, one set per chunk in flight,
    # reused after each sync: a buffer overwritten too early would corrupt a result.
    monkeypatch.setattr(coexec.GpuChunks, "PINNED_BYTES", 0)
    made = []
    original = coexec.GpuChunks._pinned
    monkeypatch.setattr(coexec.GpuChunks, "_pinned",
                        lambda self, key, like: made.append(key) or original(self, key, like))
    n = 4000
    x, y = np.random.default_rng(8).random(n), np.random.default_rng(9).random(n)
    out = np.full(n, np.nan)
    report = hetflow.forall(n, axpy, 3.0, x, y, out, device=["cpu0", gpu_device.id],
                            schedule="static", shares=[0.0, 1.0])
    np.testing.assert_array_equal(out, 3.0 * x + y)
    gpu_chunks = sum(w.chunks for w in report.workers if w.kind == "gpu")
    # x and y in, out back (axpy overwrites out's rows: nothing of it to copy in); a slot
    # per chunk in flight, reused after each sync
    assert gpu_chunks > 4 and len(made) == 3 * gpu_chunks
    assert {key[:2] for key in made} == {("in", 0), ("in", 1), ("out", 0)}
    assert {slot for *_, slot in made} == set(range(4))


@hetflow.kernel
def transposed_copy(i, j, out, x):
    out[i, j] = x[i, j] + 1.0


@pytest.mark.simgpu
@pytest.mark.parametrize("shares", [[0.0, 1.0], [0.5, 0.5]])
def test_whole_copies_move_in_pieces_and_only_computed_rows_come_back(gpu_device, monkeypatch, shares):
    monkeypatch.setattr(coexec.GpuChunks, "PIECE_BYTES", 256)   # 40 x 12 float64: 15 pieces
    copied_home = []
    original = coexec.GpuChunks.merge_back
    monkeypatch.setattr(coexec.GpuChunks, "merge_back",
                        lambda self, ranges: copied_home.extend(ranges) or original(self, ranges))
    u = np.random.default_rng(6).random((40, 12))
    v = u.copy()
    args = (interior(v, 1), interior(cshift(u, 0, -1), 1), interior(cshift(u, 0, 1), 1),
            interior(cshift(u, 1, -1), 1), interior(cshift(u, 1, 1), 1))
    report = hetflow.forall(args[0].shape, jacobi, *args, device=["cpu0", gpu_device.id],
                            schedule="static", shares=shares)
    np.testing.assert_array_equal(v, _jacobi_numpy(u))
    gpu_rows = sum(w.indices for w in report.workers if w.kind == "gpu")
    assert gpu_rows == round(38 * shares[1]) and sum(hi - lo for lo, hi in copied_home) == gpu_rows


@pytest.mark.simgpu
def test_a_written_view_that_is_no_box_of_its_root_merges_through_index_arrays(gpu_device):
    x = np.random.default_rng(7).random((16, 10))
    out = np.zeros((10, 16))
    target = hetflow.transpose(out, 0, 1)
    assert target.root_box() is None
    hetflow.forall(x.shape, transposed_copy, target, x, device=["cpu0", gpu_device.id],
                   schedule="static", shares=[0.5, 0.5])
    np.testing.assert_array_equal(out, (x + 1.0).T)


@pytest.mark.simgpu
def test_gpu_failing_mid_loop_loses_nothing(gpu_device, monkeypatch):
    calls = {"n": 0}
    original = coexec.GpuChunks.run_chunk

    def flaky(self, lo, hi):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("GPU fell off the bus")
        return original(self, lo, hi)

    monkeypatch.setattr(coexec.GpuChunks, "run_chunk", flaky)
    n = 700
    x = np.arange(n, dtype=np.float64)
    out = np.zeros(n)
    report = hetflow.forall(n, axpy, 1.0, x, x, out, device=["cpu0", gpu_device.id],
                            schedule="static", shares=[0.2, 0.8])
    np.testing.assert_array_equal(out, 2 * x)
    assert report.failures and "fell off the bus" in report.failures[0].error


@pytest.mark.simgpu
def test_kernel_writing_elsewhere_runs_on_one_device(gpu_device, caplog):
    x = np.arange(10.0)
    out = np.zeros(11)
    with caplog.at_level(logging.WARNING):
        hetflow.forall(10, shift_write, x, out, device=["cpu0", gpu_device.id])
    np.testing.assert_array_equal(out[1:], x)
    assert "running it on" in caplog.text


@pytest.mark.gpu
def test_cpu_and_real_gpu_together(gpu_device, tmp_path, monkeypatch):
    # A history of its own: with the history of an earlier run in the cache directory, the
    # model runs the GPU alone once to time it (coexec._alone), and no core would run a row.
    model = perfmodel.PerfModel(tmp_path / perfmodel.FILE_NAME)
    monkeypatch.setattr(coexec, "perf_model", lambda: model)
    n = 20_000_000
    rng = np.random.default_rng(5)
    x, y = rng.random(n), rng.random(n)
    out = np.zeros(n)
    report = hetflow.forall(n, axpy, 3.0, x, y, out, device=["cpu0", gpu_device.id])
    np.testing.assert_allclose(out, 3.0 * x + y, rtol=1e-15)
    assert {w.kind for w in report.workers if w.indices} == {"cpu", "gpu"}
    u = rng.random((2000, 1000))
    v = u.copy()
    args = (interior(v, 1), interior(cshift(u, 0, -1), 1), interior(cshift(u, 0, 1), 1),
            interior(cshift(u, 1, -1), 1), interior(cshift(u, 1, 1), 1))
    hetflow.forall(args[0].shape, jacobi, *args, device=["cpu0", gpu_device.id])
    np.testing.assert_allclose(v, _jacobi_numpy(u), rtol=1e-15)


@pytest.mark.simgpu
@pytest.mark.parametrize("devices", [["cpu0"], ["cpu0", "gpu0"]])
def test_a_loop_keeps_no_reference_to_its_arrays_once_it_returns(gpu_device, devices):
    # The worker threads are kept between loops; an idle one used to hold its last job,
    # and through it the user's arrays (and their registered host memory on a real GPU).
    devices = [gpu_device.id if d == "gpu0" else d for d in devices]

    def run():
        x = np.arange(300.0)
        out = np.zeros_like(x)
        hetflow.forall(x.size, axpy, 2.0, x, x, out, device=devices, schedule="static",
                       shares=[1 / len(devices)] * len(devices))
        np.testing.assert_array_equal(out, 3.0 * x)
        return weakref.ref(x), weakref.ref(out)

    refs = run()
    gc.collect()
    assert [r() for r in refs] == [None, None]
