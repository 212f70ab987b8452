"""Work stealing over CPU and GPU workers (SPEC §3), the run report and the perf model.

The oracle is a sequential run: every index must be executed exactly once, which the
chunk functions check by counting executions with atomic adds in a ``nogil`` Numba
function (so worker threads really race), or ``out[i] = f(i)`` against NumPy. Workers
that fail raise *before* touching their range, and "GPU-like" workers only execute
launched ranges at ``sync``, so the oracle stays exact under faults too.
"""
import json
import logging
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numba import njit

from hetflow.errors import ArgumentError, DeviceError
from hetflow.runtime.deque import fetch_add
from hetflow.platform.repository import default_root
from hetflow.runtime.perfmodel import FILE_NAME, PerfModel
from hetflow.runtime.deque import DequeSet, aligned_zeros
from hetflow.runtime.steal import Worker, _acquire, _worth_stealing, cpu_chunk_size, gpu_chunk_size, run_loop, split_range


@njit(nogil=True)
def count(lo, hi, counts):
    for i in range(lo, hi):
        fetch_add(counts, i, 1)


@njit(nogil=True)
def square_plus_one(lo, hi, out):
    for i in range(lo, hi):
        out[i] = i * i + 1


class ChunkFailed(Exception):
    """The failure injected into a worker."""


class Device:
    """Executes ranges into ``counts``: synchronously ('cpu') or, like a GPU stream,
    only when ``sync`` is called ('gpu'). ``fail_at=k`` makes the k-th launch raise
    (a GPU then also loses what it had launched); ``fail_at_sync`` makes sync raise.
    ``wait_for``: an event every launch waits for; ``failed``: an event set on failure
    (together they make "this worker fails before that one runs anything" certain)."""

    def __init__(self, name, kind, counts, chunk_size, inflight=1, delay=0.0,
                 fail_at=None, fail_at_sync=False, wait_for=None, failed=None, rolling=False):
        self.kind, self.counts, self.delay = kind, counts, delay
        self.fail_at, self.fail_at_sync = fail_at, fail_at_sync
        self.wait_for, self.failed = wait_for, failed
        self.launches = 0
        self.pending = []
        self.most_in_flight = 0
        gpu = kind == "gpu"
        self.worker = Worker(name, kind, self.run_chunk, chunk_size, f"{kind}-{name}",
                             inflight=inflight if gpu else 1, sync=self.sync if gpu else None,
                             retire=self.retire if gpu and rolling else None)

    def run_chunk(self, lo, hi):
        self.launches += 1
        if self.wait_for is not None:
            assert self.wait_for.wait(timeout=30)
        if self.delay:
            time.sleep(self.delay)
        if self.launches == self.fail_at:
            self.pending.clear()
            self._signal()
            raise ChunkFailed(f"{self.worker.name} failed on launch {self.launches}")
        if self.kind == "cpu":
            count(lo, hi, self.counts)
        else:
            self.pending.append((lo, hi))
            self.most_in_flight = max(self.most_in_flight, len(self.pending))

    def sync(self):
        self._wait()
        for lo, hi in self.pending:
            count(lo, hi, self.counts)
        self.pending.clear()

    def retire(self):
        """Run the oldest launched range alone (``Worker.retire``)."""
        self._wait()
        count(*self.pending.pop(0), self.counts)

    def _wait(self):
        if self.fail_at_sync:
            self.pending.clear()
            self._signal()
            raise ChunkFailed(f"{self.worker.name} failed at sync")

    def _signal(self):
        if self.failed is not None:
            self.failed.set()


def assert_events_partition(report, n):
    """The completed ranges in the report tile [0, n) with no gap and no overlap."""
    spans = sorted((e.lo, e.hi) for e in report.events)
    covered = 0
    for lo, hi in spans:
        assert lo == covered and hi > lo
        covered = hi
    assert covered == n
    assert sum(s.indices for s in report.workers) == n


# -- exactly once --------------------------------------------------------------------------

device_spec = st.tuples(st.sampled_from(["cpu", "gpu"]), st.integers(1, 40),
                        st.integers(1, 3), st.sampled_from([0.0, 0.0, 0.0, 2e-5, 2e-4]),
                        st.sampled_from([None] * 4 + [1, 2, 5]), st.booleans(), st.booleans())


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(0, 300), specs=st.lists(device_spec, min_size=1, max_size=6),
       data=st.data(), schedule=st.sampled_from(["steal", "steal", "static"]),
       threshold=st.integers(0, 2))
def test_every_index_runs_exactly_once(n, specs, data, schedule, threshold):
    counts = np.zeros(n, dtype=np.int64)
    devices = [Device(f"w{i}", kind, counts, chunk, inflight, delay, fail_at,
                      fail_at_sync=kind == "gpu" and fail_at is not None and at_sync, rolling=rolling)
               for i, (kind, chunk, inflight, delay, fail_at, at_sync, rolling) in enumerate(specs)]
    weights = data.draw(st.lists(st.integers(0, 3), min_size=len(specs), max_size=len(specs)))
    shares = weights if sum(weights) else None
    try:
        report = run_loop(n, [d.worker for d in devices], schedule=schedule, shares=shares,
                          steal_threshold=threshold)
    except DeviceError as exc:
        assert all(d.fail_at is not None for d in devices)
        assert len(exc.report.failures) == len(devices)
        assert counts.max(initial=0) <= 1           # nothing ever ran twice
        return
    assert np.array_equal(counts, np.ones(n, dtype=np.int64))
    assert_events_partition(report, n)
    failed = {f.worker for f in report.failures}
    assert failed == {s.name for s in report.workers if s.failed}
    assert failed <= {d.worker.name for d in devices if d.fail_at is not None}


@pytest.mark.parametrize("n", [0, 1])
@pytest.mark.parametrize("schedule", ["steal", "static"])
def test_empty_and_one_element_ranges_terminate(n, schedule):
    counts = np.zeros(n, dtype=np.int64)
    devices = [Device(f"w{i}", kind, counts, 4, inflight=2)
               for i, kind in enumerate(["gpu", "cpu", "cpu", "cpu"])]
    report = run_loop(n, [d.worker for d in devices], schedule=schedule)
    assert np.array_equal(counts, np.ones(n, dtype=np.int64))
    assert report.n == n and sum(s.indices for s in report.workers) == n


def test_result_matches_numpy_with_many_small_chunks():
    n = 10_007
    out = np.zeros(n, dtype=np.int64)
    workers = [Worker(f"cpu{i}", "cpu", lambda lo, hi: square_plus_one(lo, hi, out), 13 + i,
                      "cpu0") for i in range(4)]
    run_loop(n, workers, shares=[5, 1, 0, 2])
    i = np.arange(n, dtype=np.int64)
    assert np.array_equal(out, i * i + 1)


# -- stealing ---------------------------------------------------------------------------------

def test_idle_workers_steal_from_a_worker_that_holds_everything():
    n = 400
    counts = np.zeros(n, dtype=np.int64)
    thieves_ran = threading.Event()
    slow = Device("slow", "cpu", counts, 4)

    def slow_chunk(lo, hi):
        # Block the owner until a thief has run a chunk: the thieves start with nothing,
        # so this only ends if stealing works (the timeout turns a hang into a failure).
        assert thieves_ran.wait(timeout=30)
        slow.run_chunk(lo, hi)

    def thief_chunk(lo, hi):
        count(lo, hi, counts)
        thieves_ran.set()

    workers = [Worker("slow", "cpu", slow_chunk, 4, "cpu0"),
               Worker("t1", "cpu", thief_chunk, 4, "cpu0"),
               Worker("t2", "cpu", thief_chunk, 4, "cpu0")]
    report = run_loop(n, workers, shares=[1, 0, 0])
    assert np.array_equal(counts, np.ones(n, dtype=np.int64))
    stats = report.by_name
    assert stats["t1"].steals + stats["t2"].steals > 0
    assert stats["slow"].steals == 0
    assert report.steals_by_direction()["cpu->cpu"] == report.steals
    stolen = [e for e in report.events if e.stolen_from is not None]
    assert stolen and all(e.stolen_from == "slow" and e.worker != "slow" for e in stolen)


def test_a_core_holding_the_last_range_gives_the_rest_up_to_an_idle_worker():
    # One chunk of the whole loop: without giving up the rest of a held range, whoever
    # takes it runs every index while the other waits (the tail of a loop).
    n = 2000
    counts = np.zeros(n, dtype=np.int64)

    def slow(lo, hi):                # 20 us per index, the GIL released: 40 ms in all
        time.sleep(2e-5 * (hi - lo))
        count(lo, hi, counts)

    workers = [Worker("a", "cpu", slow, n, "cpu0"), Worker("b", "cpu", slow, n, "cpu0")]
    report = run_loop(n, workers, shares=[1, 0])
    assert np.array_equal(counts, np.ones(n, dtype=np.int64))
    assert_events_partition(report, n)
    assert min(w.indices for w in report.workers) > 0


def test_the_drain_estimate_is_what_the_deques_hold_over_the_live_workers_speed():
    from hetflow.runtime.deque import DequeSet, aligned_zeros
    from hetflow.runtime.steal import _drain_seconds
    d, dead = DequeSet(3, 8), aligned_zeros(3)
    for q, entries in enumerate((3, 0, 2)):
        for k in range(entries):
            d.push(q, 10 * k, 10 * k + 10)
    chunk_sizes = np.array([100, 400, 50], dtype=np.int64)
    assert _drain_seconds(d.state, dead, np.zeros(3), chunk_sizes) == np.inf  # nothing measured
    per_index = np.array([1e-6, 1e-8, 0.0])  # 1e6 and 1e8 indices/s; the third not measured
    left = 3 * 100 + 2 * 50
    assert _drain_seconds(d.state, dead, per_index, chunk_sizes) == pytest.approx(left / (1e6 + 1e8))
    dead[1] = 1                              # a failed worker runs nothing more
    assert _drain_seconds(d.state, dead, per_index, chunk_sizes) == pytest.approx(left / 1e6)


def _blocking_pair(owner_kind, owner_chunk, thief_kind, thief_chunk, n):
    """An owner holding the whole range that waits, in its first chunk, for the thief."""
    counts = np.zeros(n, dtype=np.int64)
    thief_ran = threading.Event()
    owner = Device("owner", owner_kind, counts, owner_chunk)
    thief = Device("thief", thief_kind, counts, thief_chunk)

    def owner_chunk_fn(lo, hi):
        assert thief_ran.wait(timeout=30)
        owner.run_chunk(lo, hi)

    def thief_chunk_fn(lo, hi):
        thief.run_chunk(lo, hi)
        thief_ran.set()

    workers = [Worker("owner", owner_kind, owner_chunk_fn, owner_chunk, "dev-owner",
                      sync=owner.sync if owner_kind == "gpu" else None),
               Worker("thief", thief_kind, thief_chunk_fn, thief_chunk, "dev-thief",
                      sync=thief.sync if thief_kind == "gpu" else None)]
    return counts, workers


def test_gpu_steals_cpu_chunks_and_merges_neighbours():
    counts, workers = _blocking_pair("cpu", 4, "gpu", 16, n=200)
    report = run_loop(200, workers, shares=[1, 0])
    assert np.array_equal(counts, np.ones(200, dtype=np.int64))
    assert report.by_name["thief"].steals_succeeded["gpu->cpu"] >= 4
    gpu_ranges = [e.hi - e.lo for e in report.events if e.worker == "thief"]
    assert max(gpu_ranges) == 16          # four adjacent CPU chunks in one launch
    assert_events_partition(report, 200)


def test_cpu_steals_from_gpu_and_splits_the_large_chunk():
    counts, workers = _blocking_pair("gpu", 64, "cpu", 4, n=640)
    report = run_loop(640, workers, shares=[1, 0])
    assert np.array_equal(counts, np.ones(640, dtype=np.int64))
    assert report.by_name["thief"].steals_succeeded["cpu->gpu"] >= 1
    mine = [e for e in report.events if e.worker == "thief"]
    # it stole a 64-index chunk, ran 4 of it and pushed the rest onto its own deque
    # (a remainder of at most twice its chunk size is run whole)
    assert mine[0].stolen_from == "owner" and mine[0].hi - mine[0].lo == 4
    assert max(e.hi - e.lo for e in mine) <= 8
    assert_events_partition(report, 640)


def test_a_core_takes_its_next_own_chunks_while_they_follow_on():
    from hetflow.runtime.steal import EPOCH, _gather_own
    d, ctl = DequeSet(1, 16), aligned_zeros(16)
    for k in range(9, -1, -1):             # chunks of 4, the first one at the bottom
        d.push(0, 4 * k, 4 * k + 4)
    st, lo, hi = d.pop(0)
    assert (st, lo, hi) == (0, 0, 4)
    assert tuple(_gather_own(d.state, d.buf, d.capacity, ctl, 0, lo, hi, 10)) == (0, 12)
    assert d.size(0) == 7 and ctl[EPOCH] == 0
    d.push(0, 100, 104)                      # rows that do not follow on (a range pushed back)
    assert tuple(_gather_own(d.state, d.buf, d.capacity, ctl, 0, 12, 16, 100)) == (12, 16)
    assert d.size(0) == 8 and ctl[EPOCH] == 1  # put back where it was, and the push counted
    assert d.pop(0)[1:] == (100, 104)


def test_many_cores_on_short_chunks_take_several_at_once(monkeypatch):
    """With GIL_S per core above TAIL_S, a core whose chunks take less than that runs
    several of its own adjacent chunks in one call; every index still runs once."""
    from hetflow.runtime import steal
    monkeypatch.setattr(steal, "GIL_S", 4e-3)  # two cores make 8 ms: 40 chunks of 0.2 ms
    n = 400
    counts = np.zeros(n, dtype=np.int64)
    devices = [Device(f"w{i}", "cpu", counts, 4, delay=2e-4) for i in range(2)]
    report = run_loop(n, [d.worker for d in devices])
    assert np.array_equal(counts, np.ones(n, dtype=np.int64))
    assert_events_partition(report, n)
    assert max(e.hi - e.lo for e in report.events) > 8  # several chunks of 4 in one call
    assert sum(d.launches for d in devices) < n // 4 // 2


def test_static_schedule_runs_only_own_chunks():
    n, shares = 1000, [3, 1, 0, 2]
    counts = np.zeros(n, dtype=np.int64)
    devices = [Device(f"w{i}", "cpu", counts, 7) for i in range(4)]
    report = run_loop(n, [d.worker for d in devices], schedule="static", shares=shares)
    assert np.array_equal(counts, np.ones(n, dtype=np.int64))
    bounds = np.rint(np.cumsum(shares) / sum(shares) * n).astype(int)
    expected = np.diff(np.concatenate(([0], bounds)))
    assert [s.indices for s in report.workers] == expected.tolist()
    assert report.steals == 0 and all(e.stolen_from is None for e in report.events)
    for w, lo, hi in zip(report.workers, np.concatenate(([0], bounds[:-1])), bounds):
        mine = [e for e in report.events if e.worker == w.name]
        assert all(lo <= e.lo and e.hi <= hi for e in mine)


# -- faults -----------------------------------------------------------------------------------

def test_cpu_worker_failing_on_kth_chunk_loses_and_duplicates_nothing(caplog):
    n = 500
    out = np.zeros(n, dtype=np.int64)
    calls = {"bad": 0}
    bad_failed = threading.Event()

    def bad_chunk(lo, hi):
        calls["bad"] += 1
        if calls["bad"] == 3:
            bad_failed.set()
            raise ChunkFailed("core went away")
        square_plus_one(lo, hi, out)

    def good_chunk(lo, hi):
        assert bad_failed.wait(timeout=30)
        square_plus_one(lo, hi, out)

    workers = [Worker("bad", "cpu", bad_chunk, 5, "cpu0"),
               Worker("good", "cpu", good_chunk, 5, "cpu0")]
    with caplog.at_level(logging.WARNING, logger="hetflow.runtime.steal"):
        report = run_loop(n, workers, shares=[1, 0])
    i = np.arange(n)
    assert np.array_equal(out, i * i + 1)
    assert_events_partition(report, n)
    (failure,) = report.failures
    assert failure.worker == "bad" and "core went away" in failure.error
    assert len(failure.requeued) == 1 and failure.requeued[0][1] - failure.requeued[0][0] == 5
    assert report.by_name["bad"].failed and report.by_name["bad"].chunks == 2
    assert "worker bad on cpu0 failed" in caplog.text


def test_gpu_failing_at_sync_gives_back_its_chunks_in_flight():
    n = 300
    counts = np.zeros(n, dtype=np.int64)
    gpu_failed = threading.Event()
    gpu = Device("gpu", "gpu", counts, 20, inflight=3, fail_at_sync=True, failed=gpu_failed)
    cpu = Device("cpu", "cpu", counts, 5, wait_for=gpu_failed)
    report = run_loop(n, [gpu.worker, cpu.worker], shares=[1, 0])
    assert np.array_equal(counts, np.ones(n, dtype=np.int64))
    (failure,) = report.failures
    assert failure.worker == "gpu" and "failed at sync" in failure.error
    assert len(failure.requeued) == 3     # all three launched, none synchronised
    assert report.by_name["gpu"].chunks == 0
    assert report.by_name["cpu"].indices == n
    assert_events_partition(report, n)


def test_a_gpu_that_retires_chunks_keeps_its_inflight_in_flight_and_completes_them_in_order():
    n = 400
    counts = np.zeros(n, dtype=np.int64)
    gpu = Device("gpu", "gpu", counts, 20, inflight=3, rolling=True)
    report = run_loop(n, [gpu.worker], shares=[1])
    assert np.array_equal(counts, np.ones(n, dtype=np.int64))
    assert gpu.most_in_flight == 3                 # never more, and the pipeline was kept full
    ends = [(e.t_end, e.lo) for e in report.events]
    assert [lo for _, lo in sorted(ends)] == list(range(0, n, 20))   # one at a time, oldest first
    assert len({t for t, _ in ends}) > n // 20 - 3  # only the last ones complete together (sync)
    assert_events_partition(report, n)


def test_a_gpu_failing_as_it_retires_a_chunk_gives_back_what_it_had_in_flight():
    n = 300
    counts = np.zeros(n, dtype=np.int64)
    gpu_failed = threading.Event()
    gpu = Device("gpu", "gpu", counts, 20, inflight=3, fail_at_sync=True, failed=gpu_failed, rolling=True)
    cpu = Device("cpu", "cpu", counts, 5, wait_for=gpu_failed)
    report = run_loop(n, [gpu.worker, cpu.worker], shares=[1, 0])
    assert np.array_equal(counts, np.ones(n, dtype=np.int64))
    (failure,) = report.failures
    assert len(failure.requeued) == 3 and report.by_name["gpu"].chunks == 0
    assert_events_partition(report, n)


@pytest.mark.parametrize("latency,worth", [(0.0, True), (0.030, True), (0.060, False)])
def test_a_gpu_steals_a_core_s_chunk_only_where_its_latency_still_lets_it_finish_first(latency, worth):
    # The core (worker 1) has two chunks of 1000 indices queued, at 20 us an index: it
    # reaches the far one after its range in hand and the near one, in 60 ms (counting
    # the range in hand as one chunk). The GPU (worker 0) runs an index in 1 ns, but each
    # chunk it takes costs it ``latency`` beyond that (a GPU loaded by another process).
    d = DequeSet(2, 4)
    d.push(1, 0, 1000)
    d.push(1, 1000, 2000)
    per_index, chunk_sizes = np.array([1e-9, 20e-6]), np.array([100_000, 1000], dtype=np.int64)
    got = _worth_stealing(d.state, np.zeros(2, dtype=np.int64), per_index, np.array([latency, 0.0]),
                          chunk_sizes, 0, 1, 100_000)
    assert got is worth
    # a core thief has no latency: the GPU's own test stands as before
    assert _worth_stealing(d.state, np.zeros(2, dtype=np.int64), per_index[::-1].copy(), np.zeros(2),
                           chunk_sizes[::-1].copy(), 0, 1, 1000) is False


@pytest.mark.parametrize("latency,taken", [(0.0, 10), (0.150, 4), (0.230, 0)])
def test_a_gpu_gathers_a_core_s_chunks_only_while_it_would_finish_them_all_first(latency, taken):
    # The core (worker 1) holds a range and has ten chunks of 1000 indices queued, at 20 ms
    # a chunk: it finishes the far one of s queued after (s + 1) x 20 ms. The GPU (worker
    # 0, chunk size 100,000) runs them in no time but ``latency`` (its chunks in flight):
    # it gathers while that is shorter, down to s = 7 queued at 150 ms; none at 230 ms.
    d = DequeSet(2, 16)
    for k in range(10):
        d.push(1, 1000 * k, 1000 * (k + 1))
    per_index, chunk_sizes = np.array([1e-9, 20e-6]), np.array([100_000, 1000], dtype=np.int64)
    st_, lo, hi, victim = _acquire(d.state, d.buf, d.capacity, aligned_zeros(16), np.zeros(2, dtype=np.int64),
                                   np.zeros(8, dtype=np.int64), np.array([0, 1]), 0, True, 100_000, 0,
                                   per_index, np.array([latency, 0.0]), chunk_sizes, 100_000)
    if taken == 0:
        assert victim == -1 and hi == lo
        return
    assert victim == 1 and (lo, hi) == (0, 1000 * taken)


def test_a_failed_gpu_whose_launched_chunks_still_complete_has_only_the_rest_re_run():
    n = 300
    counts = np.zeros(n, dtype=np.int64)
    gpu_failed = threading.Event()
    gpu = Device("gpu", "gpu", counts, 20, inflight=3, failed=gpu_failed)

    def salvage():                      # the stream still runs the two launched before
        landed = len(gpu.pending)
        for lo, hi in gpu.pending:
            count(lo, hi, counts)
        gpu.pending.clear()
        return landed

    gpu.worker.salvage = salvage
    original = gpu.run_chunk

    def run_chunk(lo, hi):              # the third launch fails, keeping what is in flight
        if gpu.launches == 2:
            gpu.launches += 1
            gpu._signal()
            raise ChunkFailed("gpu failed on launch 3")
        return original(lo, hi)

    gpu.worker.run_chunk = run_chunk
    cpu = Device("cpu", "cpu", counts, 5, wait_for=gpu_failed)
    report = run_loop(n, [gpu.worker, cpu.worker], shares=[1, 0])
    assert np.array_equal(counts, np.ones(n, dtype=np.int64))
    (failure,) = report.failures
    assert failure.requeued == ((40, 60),)   # the two that landed are not run again
    assert report.by_name["gpu"].chunks == 2 and report.by_name["gpu"].indices == 40
    assert_events_partition(report, n)


def test_failed_worker_chunks_are_recovered_under_static_schedule():
    n = 120
    counts = np.zeros(n, dtype=np.int64)
    devices = [Device("a", "cpu", counts, 4, fail_at=2), Device("b", "cpu", counts, 4)]
    report = run_loop(n, [d.worker for d in devices], schedule="static")
    assert np.array_equal(counts, np.ones(n, dtype=np.int64))
    assert report.by_name["a"].failed and report.by_name["b"].indices == n - 4


def test_all_workers_failing_raises_device_failure_naming_them():
    counts = np.zeros(50, dtype=np.int64)
    devices = [Device("a", "cpu", counts, 5, fail_at=1),
               Device("g", "gpu", counts, 10, inflight=2, fail_at_sync=True)]
    with pytest.raises(DeviceError, match=r"every worker failed: .*a \(cpu-a\).*g \(gpu-g\)"
                                            r".*first error: ChunkFailed") as info:
        run_loop(50, [d.worker for d in devices])
    assert isinstance(info.value.__cause__, ChunkFailed)
    assert len(info.value.report.failures) == 2
    assert counts.max() == 0


def test_faults_raise_stops_at_the_first_failure():
    counts = np.zeros(200, dtype=np.int64)
    a_failed = threading.Event()
    devices = [Device("a", "cpu", counts, 5, fail_at=2, failed=a_failed),
               Device("b", "cpu", counts, 5, wait_for=a_failed)]
    with pytest.raises(DeviceError, match=r"worker a on cpu-a failed: ChunkFailed"):
        run_loop(200, [d.worker for d in devices], faults="raise", shares=[1, 0])
    assert counts.max() <= 1



def test_a_cpu_failing_inside_a_long_range_gives_back_only_what_it_did_not_run():
    n = 6400
    counts = np.zeros(n, dtype=np.int64)
    # One range: its first piece (1/64 of it) runs, the call for the rest fails.
    bad, good = Device("bad", "cpu", counts, n, fail_at=2), Device("good", "cpu", counts, 100)
    report = run_loop(n, [bad.worker, good.worker], schedule="static", shares=[1, 0])
    assert np.array_equal(counts, np.ones(n, dtype=np.int64))
    assert_events_partition(report, n)
    assert report.by_name["bad"].indices == n // 64
    assert report.failures[0].requeued == ((n // 64, n),)


def test_a_stop_reaches_a_cpu_worker_inside_a_long_range():
    n = 6400
    counts = np.zeros(n + 10, dtype=np.int64)
    started = threading.Event()

    def slow(lo, hi):                # 0.1 ms per index: the whole range would take 0.64 s
        time.sleep(1e-4 * (hi - lo))
        count(lo, hi, counts)
        started.set()

    failing = Device("a", "cpu", counts, 10, fail_at=1, wait_for=started)
    workers = [Worker("long", "cpu", slow, n, "cpu0"), failing.worker]
    with pytest.raises(DeviceError, match="worker a on cpu-a failed"):
        run_loop(n + 10, workers, schedule="static", shares=[n, 10], faults="raise")
    assert counts.max() <= 1
    assert 0 < counts[:n].sum() < n   # it left its range at a piece boundary


class Abort(BaseException):
    """Not an Exception: models Ctrl-C inside a chunk function."""


def test_base_exception_in_a_chunk_stops_the_loop_and_propagates():
    counts = np.zeros(400, dtype=np.int64)

    def chunk(lo, hi):
        if lo >= 200:
            raise Abort()
        count(lo, hi, counts)

    workers = [Worker(f"w{i}", "cpu", chunk, 4, "cpu0") for i in range(3)]
    with pytest.raises(Abort):
        run_loop(400, workers)
    assert counts.max() <= 1


# -- bad input ----------------------------------------------------------------------------

def _ok_worker(name="w"):
    return Worker(name, "cpu", lambda lo, hi: None, 4, "cpu0")


@pytest.mark.parametrize("kwargs,message", [
    (dict(kind="fpga"), "kind must be 'cpu' or 'gpu', got 'fpga'"),
    (dict(run_chunk=3), "run_chunk must be callable"),
    (dict(chunk_size=0), "chunk_size must be a positive integer, got 0"),
    (dict(chunk_size=2.5), "chunk_size must be a positive integer, got 2.5"),
    (dict(inflight=0), "inflight must be a positive integer, got 0"),
    (dict(inflight=2), "inflight=2 needs a sync callable"),
    (dict(retire=lambda: None), "retire needs a sync callable"),
])
def test_worker_rejects_bad_fields(kwargs, message):
    fields = dict(name="w", kind="cpu", run_chunk=lambda lo, hi: None, chunk_size=4,
                  device_id="cpu0")
    fields.update(kwargs)
    with pytest.raises(ArgumentError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Worker(**fields)


@pytest.mark.parametrize("args,kwargs,message", [
    ((-1, None), {}, "non-negative integer, got -1"),
    ((2.0, None), {}, "non-negative integer, got 2.0"),
    ((True, None), {}, "non-negative integer, got True"),
    ((5, []), {}, "at least one worker"),
    ((5, ["w"]), {}, "must be hetflow.runtime.steal.Worker instances"),
    ((5, "dup"), {}, "names must be unique"),
    ((5, None), dict(schedule="guided"), "schedule must be 'steal' or 'static', got 'guided'"),
    ((5, None), dict(faults="ignore"), "faults must be 'recover' or 'raise', got 'ignore'"),
    ((5, None), dict(shares=[1]), r"one entry per worker \(2\), got shape \(1,\)"),
    ((5, None), dict(shares=[1, -1]), "non-negative and not all zero"),
    ((5, None), dict(shares=[0, 0]), "non-negative and not all zero"),
    ((5, None), dict(shares=[1, float("nan")]), "must be finite"),
    ((5, None), dict(steal_threshold=-1), "steal_threshold must be a non-negative integer"),
])
def test_run_loop_rejects_bad_input(args, kwargs, message):
    n, workers = args
    if workers is None:
        workers = [_ok_worker("a"), _ok_worker("b")]
    elif workers == "dup":
        workers = [_ok_worker("a"), _ok_worker("a")]
    with pytest.raises(ArgumentError, match=message):
        run_loop(n, workers, **kwargs)


# -- helpers ---------------------------------------------------------------------------------

def test_split_range_rounds_cumulative_shares():
    assert split_range(10, np.array([0.5, 0.5])) == [(0, 5), (5, 10)]
    assert split_range(10, np.array([0.0, 1.0])) == [(0, 0), (0, 10)]
    assert split_range(7, np.array([1 / 3, 1 / 3, 1 / 3])) == [(0, 2), (2, 5), (5, 7)]


def test_chunk_size_helpers():
    assert gpu_chunk_size(132, 32, 64) == 132 * 32 * 64
    assert gpu_chunk_size(132, 32, 64, waves=2) == 2 * 132 * 32 * 64
    assert cpu_chunk_size(1000, 2) == 8             # ceil(1000 / (2 * 64))
    assert cpu_chunk_size(10, 4, minimum=8) == 8
    assert cpu_chunk_size(0, 4) == 1


# -- report ----------------------------------------------------------------------------------

def test_report_summary_and_dict():
    counts = np.zeros(100, dtype=np.int64)
    c_failed = threading.Event()
    devices = [Device("g", "gpu", counts, 20, inflight=2, wait_for=c_failed),
               Device("c", "cpu", counts, 5, fail_at=2, failed=c_failed)]
    report = run_loop(100, [d.worker for d in devices], shares=[1, 3])
    text = report.summary()
    assert "FAILED" in text and "failure: c (cpu-c)" in text and "n=100" in text
    data = json.loads(json.dumps(report.to_dict()))
    assert [w["name"] for w in data["workers"]] == ["g", "c"]
    assert sum(w["indices"] for w in data["workers"]) == 100
    assert sum(e["hi"] - e["lo"] for e in data["events"]) == 100
    assert data["failures"][0]["worker"] == "c"
    assert all(w["busy_s"] >= 0 and w["idle_s"] >= 0 for w in data["workers"])


def test_report_false_keeps_counters_but_no_events():
    counts = np.zeros(64, dtype=np.int64)
    devices = [Device(f"w{i}", "cpu", counts, 4) for i in range(2)]
    report = run_loop(64, [d.worker for d in devices], report=False)
    assert report.events == [] and sum(s.chunks for s in report.workers) == 16


# -- performance model ------------------------------------------------------------------------

def test_perfmodel_shares_are_equal_without_history(tmp_path):
    model = PerfModel(tmp_path / FILE_NAME)
    assert model.shares("k", ["cpu", "cpu", "gpu"]) == [1 / 3] * 3


def test_perfmodel_moving_average_and_shares(tmp_path):
    model = PerfModel(tmp_path / FILE_NAME, alpha=0.5)
    model.observe("k", "cpu", 100.0)
    model.observe("k", "cpu", 300.0)
    model.observe("k", "gpu", 1600.0)
    assert model.throughput("k", "cpu") == pytest.approx(200.0)
    assert model.shares("k", ["cpu", "cpu", "gpu"]) == pytest.approx([0.1, 0.1, 0.8])
    # a device never measured is predicted at the mean of the known ones
    assert model.shares("k", ["cpu", "gpu", "npu"]) == pytest.approx([2 / 27, 16 / 27, 9 / 27])
    assert model.throughput("other", "cpu") is None


def test_perfmodel_learns_from_a_report_and_persists(tmp_path, monkeypatch):
    monkeypatch.setenv("HETFLOW_CACHE_DIR", str(tmp_path))
    assert default_root() == tmp_path
    counts = np.zeros(2000, dtype=np.int64)
    devices = [Device("fast", "cpu", counts, 50), Device("slow", "cpu", counts, 50,
                                                         delay=2e-3)]
    report = run_loop(2000, [d.worker for d in devices], schedule="static")
    model = PerfModel()
    model.update("count", report)
    on_disk = json.loads((tmp_path / FILE_NAME).read_text())
    assert set(on_disk["entries"]["count"]) == {"cpu-fast", "cpu-slow"}
    assert [p.name for p in tmp_path.iterdir()] == [FILE_NAME]     # no temporary left
    fresh = PerfModel()
    fast, slow = fresh.shares("count", ["cpu-fast", "cpu-slow"])
    expected = report.by_name["fast"].throughput / (report.by_name["fast"].throughput
                                                   + report.by_name["slow"].throughput)
    assert fast == pytest.approx(expected) and fast > slow


def test_perfmodel_save_merges_with_other_writers(tmp_path):
    path = tmp_path / FILE_NAME
    one, two = PerfModel(path), PerfModel(path)
    one.observe("k", "cpu", 10.0)
    two.observe("k", "gpu", 90.0)
    one.save()
    two.save()
    assert PerfModel(path).shares("k", ["cpu", "gpu"]) == pytest.approx([0.1, 0.9])


@pytest.mark.parametrize("content", ["{not json", json.dumps({"version": 99, "entries": {}}),
                                     json.dumps([1, 2])])
def test_perfmodel_ignores_an_unreadable_history(tmp_path, caplog, content):
    path = tmp_path / FILE_NAME
    path.write_text(content)
    with caplog.at_level(logging.WARNING, logger="hetflow.runtime.perfmodel"):
        assert PerfModel(path).shares("k", ["a", "b"]) == [0.5, 0.5]
    assert "ignoring" in caplog.text and str(path) in caplog.text


def test_perfmodel_rejects_bad_input(tmp_path):
    with pytest.raises(ArgumentError, match=r"alpha must lie in \(0, 1\], got 0"):
        PerfModel(tmp_path / FILE_NAME, alpha=0)
    model = PerfModel(tmp_path / FILE_NAME)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ArgumentError, match="throughput must be positive and finite"):
            model.observe("k", "cpu", bad)
    with pytest.raises(ArgumentError, match="at least one device key"):
        model.shares("k", [])


# -- a real (simulated) GPU kernel as a worker ---------------------------------------------

@pytest.mark.simgpu
def test_simulated_gpu_kernel_and_cpu_cores_share_one_loop():
    from hetflow.cuda_compat import cuda_module

    cuda = cuda_module()
    n = 256
    out = np.zeros(n, dtype=np.int64)
    d_out = cuda.to_device(out)
    stream = cuda.stream()

    @cuda.jit
    def fill(lo, hi, arr):
        i = lo + cuda.grid(1)
        while i < hi:
            arr[i] = i * i + 1
            i += cuda.gridsize(1)

    gpu = Worker("gpu0", "gpu", lambda lo, hi: fill[1, 32, stream](lo, hi, d_out), 64,
                 "gpu0", inflight=2, sync=stream.synchronize)
    cpus = [Worker(f"core{i}", "cpu", lambda lo, hi: square_plus_one(lo, hi, out), 8, "cpu0")
            for i in range(2)]
    report = run_loop(n, [gpu] + cpus)
    on_gpu = d_out.copy_to_host()
    for e in report.events:
        if e.worker == "gpu0":
            out[e.lo:e.hi] = on_gpu[e.lo:e.hi]
    i = np.arange(n)
    assert np.array_equal(out, i * i + 1)
    assert_events_partition(report, n)


def test_a_worker_still_in_setup_is_left_behind_when_the_others_finish():
    n = 200
    counts = np.zeros(n, dtype=np.int64)
    seen = {}

    def slow_setup(stopped):         # a GPU copying data in: gives up once the loop is over
        deadline = time.perf_counter() + 30
        while not stopped() and time.perf_counter() < deadline:
            time.sleep(0.001)
        seen["stopped"] = stopped()

    cpu = Device("c", "cpu", counts, 10)
    gpu = Device("g", "gpu", counts, 50, inflight=2)
    gpu.worker.setup = slow_setup
    report = run_loop(n, [gpu.worker, cpu.worker], shares=[0.8, 0.2])
    assert np.array_equal(counts, np.ones(n, dtype=np.int64))
    assert seen["stopped"] and report.by_name["g"].indices == 0 and report.by_name["c"].indices == n
    assert report.by_name["c"].steals_succeeded["cpu->gpu"] >= 1 and not report.failures


def test_a_worker_whose_setup_fails_leaves_its_chunks_to_the_others():
    n = 120
    counts = np.zeros(n, dtype=np.int64)

    def broken(stopped):
        raise ChunkFailed("no memory for the copy")

    gpu, cpu = Device("g", "gpu", counts, 40, inflight=2), Device("c", "cpu", counts, 8)
    gpu.worker.setup = broken
    report = run_loop(n, [gpu.worker, cpu.worker], schedule="static", shares=[0.5, 0.5])
    assert np.array_equal(counts, np.ones(n, dtype=np.int64))
    assert report.by_name["g"].failed and "no memory for the copy" in report.failures[0].error


def test_perfmodel_that_cannot_save_warns_and_keeps_its_history(tmp_path, caplog):
    blocked = tmp_path / "file"
    blocked.write_text("")                         # the cache directory's place holds a file
    model = PerfModel(blocked / FILE_NAME)
    with caplog.at_level(logging.WARNING, logger="hetflow.runtime.perfmodel"):
        model.record("k", "a", 1.0)                # a launch's measurement: no exception
    assert "could not save the performance history" in caplog.text
    assert model.throughput("k", "a") == 1.0


def test_perfmodel_saves_at_most_every_interval_and_the_rest_at_exit(tmp_path, monkeypatch):
    import atexit

    hooks = []
    monkeypatch.setattr(atexit, "register", hooks.append)
    counts = np.zeros(100, dtype=np.int64)
    model = PerfModel(tmp_path / FILE_NAME)
    model.update("k", run_loop(100, [Device("a", "cpu", counts, 10).worker]))   # saved now
    first = json.loads((tmp_path / FILE_NAME).read_text())["entries"]["k"]["cpu-a"]["samples"]
    model.update("k", run_loop(100, [Device("a", "cpu", counts, 10).worker]))   # within the interval
    on_disk = json.loads((tmp_path / FILE_NAME).read_text())["entries"]["k"]["cpu-a"]["samples"]
    assert first == on_disk == 1 and len(hooks) == 1
    hooks[0]()                                                                  # the process exits
    assert json.loads((tmp_path / FILE_NAME).read_text())["entries"]["k"]["cpu-a"]["samples"] == 2
