"""The queue as a StarPU or CUDA-stream user meets it: data order through every kind of
view, on the CPU and the simulated GPU, across queues; failures, waits and closing.

Oracles are sequential NumPy runs of the same operations, never hetflow's own results.
"""
import gc
import threading
import weakref

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numpy.lib.stride_tricks import as_strided, sliding_window_view

import hetflow
from hetflow import section
from hetflow.errors import EventFailedError, HetflowTimeoutError
from hetflow.runtime import cpu, deps
from test_queue_dag import bend, diff

T = 60  # seconds: generous, a kernel's first launch compiles it
N = 6   # length of a launch (the simulated GPU runs a thread per index)


@hetflow.kernel
def axpy(i, a, x, y):
    y[i] = a * y[i] + x[i]


@hetflow.kernel
def inc(i, x):
    x[i] += 1.0


@hetflow.kernel
def window_sum(i, w, out):
    out[i] = w[i, 0] + w[i, 1] + w[i, 2]


@hetflow.kernel
def raises_at_2(i, x):
    x[i] = 1.0
    if i == 2:
        raise ValueError("index two is bad")


def _np_axpy(a, x, y):
    y[...] = a * y + x


def _np_bend(x):
    x[...] = 0.5 * x * x - 0.25


def _np_diff(x, y, z):
    z[...] = x - y


# kernel, its NumPy oracle, scalars, arrays
KERNELS = {"axpy": (axpy, _np_axpy, 1, 2), "bend": (bend, _np_bend, 0, 1), "diff": (diff, _np_diff, 0, 3)}
# Windows of N elements into two base arrays of 2N: (base, offset). Windows of one base
# overlap or touch, so launches over different windows are ordered through their root.
WINDOWS = [(0, 0), (0, 3), (0, 6), (1, 0), (1, 6)]


def _overlap(s, t) -> bool:
    return s != t and WINDOWS[s][0] == WINDOWS[t][0] and abs(WINDOWS[s][1] - WINDOWS[t][1]) < N


@st.composite
def programs(draw):
    """Launches over windows (none overlapping within one launch), each on a queue."""
    ops = []
    for _ in range(draw(st.integers(1, 10))):
        name = draw(st.sampled_from(sorted(KERNELS)))
        arity = KERNELS[name][3]
        wins = draw(st.lists(st.integers(0, len(WINDOWS) - 1), min_size=arity, max_size=arity, unique=True)
                    .filter(lambda ws: not any(_overlap(s, t) for s in ws for t in ws)))
        ops.append((name, wins, draw(st.integers(0, 1))))
    return ops, draw(st.integers(0, 2**32 - 1)), draw(st.booleans())


@pytest.mark.simgpu
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_random_programs_over_views_on_two_queues_match_numpy(program):
    """NumPy slices or hetflow sections of NumPy or coherent arrays, launched on a CPU
    queue and a simulated GPU queue at random: data order holds across both."""
    ops, seed, coherent = program
    init = [np.random.default_rng(seed).random(2 * N) for _ in range(2)]
    want = [b.copy() for b in init]
    for name, wins, _ in ops:
        scalars = (0.5,) * KERNELS[name][2]
        KERNELS[name][1](*scalars, *(want[WINDOWS[w][0]][WINDOWS[w][1]:WINDOWS[w][1] + N] for w in wins))

    if coherent:
        bases = [hetflow.array(b.copy()) for b in init]
        views = [section(bases[b], (o,), (N,)) for b, o in WINDOWS]
    else:
        bases = [b.copy() for b in init]
        views = [bases[b][o:o + N] for b, o in WINDOWS]
    with hetflow.Queue("cpu0") as on_cpu, hetflow.Queue("gpu0") as on_gpu:
        for name, wins, where in ops:
            (on_cpu, on_gpu)[where].enqueue(KERNELS[name][0], N, *(0.5,) * KERNELS[name][2],
                                            *(views[w] for w in wins))
    for got, ref in zip(bases, want):
        np.testing.assert_array_equal(np.asarray(got), ref)


def _strided_views(x):
    """Views of ``x`` NumPy makes through another object than ``x`` itself."""
    return {"sliding_window_view": lambda: sliding_window_view(x, 3),
            "as_strided": lambda: as_strided(x, (x.size - 2, 3), (x.strides[0],) * 2, writeable=False),
            "frombuffer": lambda: sliding_window_view(np.frombuffer(x.data), 3)}


@pytest.mark.parametrize("device", ["cpu0", pytest.param("gpu0", marks=pytest.mark.simgpu)])
@pytest.mark.parametrize("how", sorted(_strided_views(np.zeros(3))))
def test_a_strided_window_view_is_read_after_the_writer_of_its_array(device, how):
    """A reader of ``sliding_window_view(x, 3)`` waits for the pending writer of ``x``
    (its memory is ``x``'s, held through NumPy's stride-tricks object)."""
    x, out = np.zeros(N + 2), np.full(N, -1.0)
    gate = hetflow.UserEvent()
    with hetflow.Queue(device) as q:
        writer = q.enqueue(inc, N + 2, x, wait_for=gate)
        reader = q.enqueue(window_sum, N, _strided_views(x)[how](), out)
        with pytest.raises(HetflowTimeoutError, match=f"event {reader.id} .*still queued"):
            reader.wait(0.2)  # held back by the writer, which waits for the gate
        gate.set_complete()
    assert writer.status == reader.status == "complete"
    np.testing.assert_array_equal(out, np.full(N, 3.0))  # x after its writer: all ones


def test_strided_views_name_the_array_they_view_as_their_datum():
    x = np.zeros(10)
    for view in (*(f() for f in _strided_views(x).values()), x[::2].T, x.reshape(2, 5)[1]):
        assert deps.datum(view) is x
    assert deps.datum(np.frombuffer(bytearray(16))) is not x


@pytest.mark.parametrize("device", ["cpu0", pytest.param("gpu0", marks=pytest.mark.simgpu)])
def test_a_failure_names_kernel_and_event_cancels_readers_and_spares_the_rest(device):
    x, y, z = np.zeros(N), np.zeros(N), np.zeros(N)
    with hetflow.Queue(device) as q:
        failing = q.enqueue(raises_at_2, N, x)
        reader = q.enqueue(axpy, N, 1.0, x, y)
        free = q.enqueue(inc, N, z)
        with pytest.raises(EventFailedError, match=rf"event {failing.id} \(kernel 'raises_at_2'\) failed on "
                                                   rf"{device}: .*index two is bad") as info:
            failing.wait(T)
        assert isinstance(info.value.__cause__, hetflow.errors.KernelRaisedError)
        with pytest.raises(EventFailedError, match=rf"event {reader.id} \(kernel 'axpy'\) was cancelled: it "
                                                   rf"depends on event {failing.id} \(kernel 'raises_at_2'\)"):
            reader.wait(T)
        free.wait(T)
    np.testing.assert_array_equal(z, 1.0)
    np.testing.assert_array_equal(y, 0.0)


def test_waits_on_failed_and_foreign_events_twice_and_timeouts():
    gate = hetflow.UserEvent()
    x = np.zeros(N)
    with hetflow.Queue("cpu0") as first, hetflow.Queue("cpu0") as second:
        failing = first.enqueue(raises_at_2, N, np.zeros(N))
        assert isinstance(failing.exception(T), EventFailedError)
        doomed = second.enqueue(inc, N, np.zeros(N), wait_for=[failing, failing])
        held = first.enqueue(inc, N, x, wait_for=gate)
        after = second.enqueue(inc, N, x, wait_for=(held, held, gate))
        with pytest.raises(HetflowTimeoutError, match=rf"event {after.id} \(kernel 'inc'\) did not finish"):
            after.wait(0.1)
        with pytest.raises(HetflowTimeoutError, match="queue finish: 1 instance"):
            second.finish(0.1)
        gate.set_complete()
        with pytest.raises(EventFailedError, match=f"depends on event {failing.id}"):
            doomed.wait(T)
    np.testing.assert_array_equal(x, 2.0)


def test_ten_thousand_small_tasks_finish_and_leave_nothing_behind(monkeypatch):
    """10^4 tiny instances pending at once (a chain held by a gate, and a fan-out reading
    its result) all run, and once done nothing keeps them or their data's records."""
    # Each launch on the calling thread: on a loaded machine one preempted run of these
    # two rows can send the next ones to the CPU's thread pool (cpu.run), which is slow
    # and not what is tested here.
    monkeypatch.setattr(cpu, "INLINE_SECONDS", 1.0)
    x, y = np.zeros(2), np.zeros(2)
    outs = [np.zeros(2) for _ in range(5000)]
    gate = hetflow.UserEvent()
    with hetflow.Queue("cpu0", run_here=False) as q:
        first = weakref.ref(q.enqueue(inc, 2, x, wait_for=gate))
        for _ in range(4999):
            q.enqueue(inc, 2, x)
        for out in outs:
            q.enqueue(axpy, 2, 1.0, x, out)
        last = q.enqueue(axpy, 2, 1.0, x, y)
        assert q.status()["cpu0"]["running"] == 0
        gate.set_complete()
    assert last.status == "complete" and first() is None
    np.testing.assert_array_equal(x, 5000.0)
    np.testing.assert_array_equal(np.array(outs), 5000.0)
    assert not any(id(a) in deps._data for a in (x, y, *outs))


def test_a_with_block_that_raises_closes_the_queue_and_finish_reports_later():
    x = np.zeros(N)
    with pytest.raises(KeyError):
        with hetflow.Queue("cpu0") as q:
            failing = q.enqueue(raises_at_2, N, np.zeros(N))
            q.enqueue(inc, N, x)
            raise KeyError("the block's own error")
    with pytest.raises(hetflow.errors.ArgumentError, match="this queue is closed"):
        q.enqueue(inc, N, x)
    with pytest.raises(EventFailedError, match=f"event {failing.id}"):
        q.finish(T)  # the pending work ran; its failure is still the queue's to report
    q.finish(T)
    q.close()
    q.close()
    np.testing.assert_array_equal(x, 1.0)


@pytest.mark.parametrize("timeout", [1e10, 10**400, float("inf")], ids=["1e10", "10**400", "inf"])
@pytest.mark.parametrize("wait", ["event", "user event", "finish", "buffer read"])
def test_a_timeout_beyond_what_threading_takes_waits_as_none_does(wait, timeout):
    """``wait(1e10)`` meant "as long as it takes": it waits, where it raised OverflowError."""
    gate = hetflow.UserEvent()
    buffer = hetflow.array(np.zeros(N))
    with hetflow.Queue("cpu0") as q:
        event = q.enqueue(inc, N, buffer, wait_for=gate)
        opener = threading.Timer(0.2, gate.set_complete)
        opener.start()
        {"event": lambda: event.wait(timeout), "user event": lambda: gate.wait(timeout),
         "finish": lambda: q.finish(timeout), "buffer read": lambda: buffer.read(timeout=timeout)}[wait]()
        assert gate.done
    opener.join()
    np.testing.assert_array_equal(buffer.read(), 1.0)


def test_failures_waited_on_one_by_one_are_not_kept_until_finish():
    """A program that handles each failure through ``wait`` and never calls ``finish``:
    the queue let go of them (and of the data the raise's frames hold), where it kept
    every one; ``finish`` still raises the one failure nobody retrieved."""
    alive = []

    def fail_and_handle():
        data = np.zeros(1000)
        alive.append(weakref.ref(data))
        with pytest.raises(EventFailedError, match="index two is bad"):
            q.enqueue(raises_at_2, 3, data).wait(T)

    with hetflow.Queue("cpu0") as q:
        for _ in range(100):
            fail_and_handle()
        unseen = q.enqueue(raises_at_2, 3, np.zeros(3))
        for _ in range(100):
            fail_and_handle()
        gc.collect()
        assert sum(ref() is not None for ref in alive) < 40
        with pytest.raises(EventFailedError, match=f"event {unseen.id} "):
            q.finish(T)


@pytest.mark.parametrize("run_here", [True, False], ids=["run-here", "worker"])
@pytest.mark.parametrize("report", ["wait", "exception", "finish"])
def test_data_a_failed_launch_wrote_is_freed_once_the_failure_is_reported(report, run_here):
    """The record of poisoned data kept its failed writer after the failure was reported,
    and through the error the frames that raised it (or the run's), whose locals hold the
    data: the data, and its record, were never freed."""
    def fail_and_report(q):
        data = np.zeros(N)
        failing = q.enqueue(raises_at_2, N, data)
        if report == "wait":
            with pytest.raises(EventFailedError):
                failing.wait(T)
        elif report == "exception":
            assert isinstance(failing.exception(T), EventFailedError)
        else:
            with pytest.raises(EventFailedError, match="index two is bad"):
                q.finish(T)
        return weakref.ref(data)

    with hetflow.Queue("cpu0", run_here=run_here) as q:
        refs = [fail_and_report(q) for _ in range(5)]
        q.finish(T)  # (nothing left to report)
    gc.collect()
    assert sum(ref() is not None for ref in refs) == 0
    # Reported, the data is no longer poisoned: a reader of it runs (before: the same).
    data = np.zeros(N)
    with hetflow.Queue("cpu0", run_here=run_here) as q:
        failing = q.enqueue(raises_at_2, N, data)
        assert isinstance(failing.exception(T), EventFailedError)
        reader = q.enqueue(axpy, N, 1.0, data, np.zeros(N))
    assert reader.status == "complete"
