"""Execution queues (SPEC §2): events, priorities, failures, timeouts, cycles, kernel
release, buffers, device status and placement.

Oracles are NumPy and the order the test itself knows the instances must respect;
execution order is read from the events' profiling times, never asserted as timings.
Instances held back behind a UserEvent become ready all at once, under the runtime's
lock, which makes priority and placement decisions deterministic.
"""
import gc
import os
import subprocess
import sys
import textwrap
import threading
import time
import weakref

import numpy as np
import pytest

import hetflow
from hetflow.errors import (ArgumentError, ArgumentTypeError, EventFailedError, HetflowTimeoutError,
                            InvalidContextError, KernelError, ShapeError)
from hetflow.runtime import cpu, status
from hetflow.runtime import queue as queue_module
from hetflow.runtime.buffers import Buffer
from hetflow.runtime.events import UserEvent
from hetflow.runtime.launch import bind
from hetflow.runtime.queue import Queue, release

T = 120  # seconds: generous, the first launch of a kernel compiles it


@hetflow.kernel
def axpy(i, a, x, y):
    y[i] = a * y[i] + x[i]


@hetflow.kernel
def fill(i, x, v):
    x[i] = v


@hetflow.kernel
def checked_inc(i, x):
    if x[i] < 0:
        raise ValueError("negative input")
    x[i] = x[i] + 1.0


@hetflow.kernel
def shift_write(i, x, y):
    y[i + 1] = x[i]


def ran_before(first, second):
    assert first.profile.ended <= second.profile.started, (first.profile, second.profile)


# -- events ------------------------------------------------------------------------------
def test_enqueue_returns_at_once_and_the_event_completes():
    x, y = np.arange(8.0), np.ones(8)
    gate = UserEvent()
    with Queue("cpu0") as q:
        ev = q.enqueue(axpy, 8, 2.0, x, y, wait_for=gate)
        assert ev.status == "queued" and not ev.done
        time.sleep(0.05)
        assert ev.status == "queued"  # still waiting for the gate
        gate.set_complete()
        ev.wait(T)
        assert ev.status == "complete" and ev.exception() is None
    np.testing.assert_array_equal(y, 2.0 * np.ones(8) + np.arange(8.0))


def test_profile_has_times_device_and_launch_shape():
    x = np.zeros(5)
    with Queue("cpu0") as q:
        ev = q.enqueue(fill, 5, x, 3.0)
        ev.wait(T)
    p = ev.profile
    assert p.queued <= p.submitted <= p.started <= p.ended
    assert p.duration == p.ended - p.started
    assert (p.device, p.blocks, p.threads, p.parts) == ("cpu0", 1, 1, None)
    np.testing.assert_array_equal(x, 3.0)


def _spinner():
    """A new kernel each call, whose time is its ``rounds``: no run of it is timed yet, so
    its launches go to the queue's worker."""
    @hetflow.kernel
    def spin(i, x, rounds):
        for _ in range(rounds):
            x[i] = x[i] * 0.5 + 1.0
    return spin


def _every_timed_run_tiny(monkeypatch) -> None:
    """Count any timed run as tiny: what runs in the enqueuing thread then does not
    depend on how fast the machine ran the warm-up launches."""
    monkeypatch.setattr(queue_module, "RUN_HERE_S", 1.0)


def _threads_running_cpu(monkeypatch) -> list:
    """Record the thread each CPU launch runs in (patched before the queue's workers start)."""
    ran, real = [], cpu.run

    def recording(launch, workers):
        ran.append(threading.get_ident())
        return real(launch, workers)
    monkeypatch.setattr(cpu, "run", recording)
    return ran


def test_a_tiny_ready_instance_on_an_idle_cpu_runs_in_the_enqueuing_thread(monkeypatch):
    _every_timed_run_tiny(monkeypatch)
    ran = _threads_running_cpu(monkeypatch)
    x, y = np.arange(4.0), np.ones(4)
    with Queue("cpu0") as q:
        for _ in range(2):  # the first run compiles, the second times the plan
            q.enqueue(axpy, 4, 2.0, x, y).wait(T)
        del ran[:]
        ev = q.enqueue(axpy, 4, 2.0, x, y)
        assert ev.status == "complete" and ran == [threading.get_ident()]
        after = q.enqueue(checked_inc, 4, y, wait_for=ev)  # its dependents go on as usual
        after.wait(T)
    np.testing.assert_array_equal(y, 8.0 + 7.0 * x + 1.0)  # y <- 2y + x three times, then + 1


def test_run_here_false_runs_every_instance_on_a_worker(monkeypatch):
    _every_timed_run_tiny(monkeypatch)
    ran = _threads_running_cpu(monkeypatch)
    x, y = np.arange(4.0), np.ones(4)
    with Queue("cpu0", run_here=False) as q:
        for _ in range(3):  # timed from the second on: tiny, yet queued
            q.enqueue(axpy, 4, 2.0, x, y).wait(T)
        slow, spin = np.zeros(1), _spinner()
        busy = q.enqueue(spin, 1, slow, 100_000)
        behind = q.enqueue(axpy, 4, 2.0, x, y)  # ready behind a busy worker: not taken here either
        q.finish(T)
    assert threading.get_ident() not in ran and len(ran) == 5
    assert behind.profile.started >= busy.profile.ended
    np.testing.assert_array_equal(y, 16.0 + 15.0 * x)  # y <- 2y + x four times
    with pytest.raises(ArgumentTypeError, match="run_here must be True or False"):
        Queue("cpu0", run_here="no")


def test_a_failure_in_the_enqueuing_thread_is_the_event_s_and_cancels_its_dependents(monkeypatch):
    _every_timed_run_tiny(monkeypatch)
    _threads_running_cpu(monkeypatch)
    with Queue("cpu0") as q:
        for _ in range(2):
            q.enqueue(checked_inc, 2, np.zeros(2)).wait(T)
        bad, out = np.array([1.0, -1.0]), np.zeros(2)
        failing = q.enqueue(checked_inc, 2, bad)  # returns: the failure is the event's, not enqueue's
        assert failing.status == "failed"
        reader = q.enqueue(axpy, 2, 1.0, bad, out)
        assert reader.status == "cancelled"
        with pytest.raises(EventFailedError, match="negative input"):
            q.finish(T)
    np.testing.assert_array_equal(out, 0.0)


def test_the_run_here_bound_follows_the_faster_of_the_last_two_timed_runs(monkeypatch):
    """A launch is tiny below the indices its plan's faster recent run would run in
    RUN_HERE_S; one slow run (a pause) leaves the bound, two move it; a run that compiled
    is not timed."""
    x = np.zeros(8)
    launch = bind(fill, 2, (x, 1.0), hetflow.get_device("cpu0"))
    plan = launch.plan
    plan.compiled, plan.tiny_below, plan.last_below = False, 0.0, 0.0  # (other tests timed it)
    clock = iter([])
    monkeypatch.setattr(queue_module, "perf_counter", lambda: next(clock))

    def run_taking(seconds):
        nonlocal clock
        clock = iter([0.0, seconds])
        assert queue_module._run_on_cpu(launch, 1)[0] is None

    run_taking(5e-6)                           # compiles (or finds its code): not timed
    assert plan.tiny_below == 0.0
    run_taking(5e-6)                           # 2 indices in 5 us: tiny below 2 * RUN_HERE_S / 5 us
    bound = 2 * queue_module.RUN_HERE_S / 5e-6
    assert plan.tiny_below == pytest.approx(bound)
    run_taking(1.0)                            # slow once: the faster run still counts
    assert plan.tiny_below == pytest.approx(bound)
    run_taking(1.0)                            # slow twice: nothing is tiny
    assert plan.tiny_below == 0.0
    np.testing.assert_array_equal(x[:2], 1.0)


def test_an_instance_predicted_long_goes_to_a_worker_and_none_overtakes_a_ready_one(monkeypatch):
    ran = _threads_running_cpu(monkeypatch)
    x, y, slow, spin = np.arange(4.0), np.ones(4), np.zeros(2), _spinner()
    with Queue("cpu0") as q:
        q.enqueue(spin, 1, slow, 1).wait(T)  # compiled: not timed, so the spins below are queued
        for _ in range(2):
            q.enqueue(axpy, 4, 2.0, x, y).wait(T)
        del ran[:]
        big = np.ones(100_000)
        q.enqueue(axpy, big.size, 2.0, big, big).wait(T)  # 25000 times the indices timed
        assert threading.get_ident() not in ran
        busy = q.enqueue(spin, 1, slow[:1], 100_000_000)  # runs on the worker for a while
        waiting = q.enqueue(spin, 1, slow[1:], 1)           # ready, waits behind it
        tiny = q.enqueue(axpy, 4, 2.0, x, y)
        q.finish(T)
    assert busy.profile.ended > tiny.profile.queued  # the device was busy when the tiny one came
    assert waiting.profile.started <= tiny.profile.started
    assert threading.get_ident() not in ran
    np.testing.assert_array_equal(big, 3.0)
    np.testing.assert_array_equal(y, 8.0 + 7.0 * x)  # y <- 2y + x three times


def test_the_enqueuing_thread_takes_a_tiny_instance_waiting_for_a_busy_worker(monkeypatch):
    _every_timed_run_tiny(monkeypatch)
    x, y, z, slow, spin = np.arange(4.0), np.ones(4), np.ones(4), np.zeros(1), _spinner()
    gate = UserEvent()
    with Queue("cpu0") as q:
        q.enqueue(spin, 1, slow, 1).wait(T)  # compiled: not timed, so the spin below is queued
        for _ in range(2):
            q.enqueue(axpy, 4, 2.0, x, y).wait(T)
        held = q.enqueue(axpy, 4, 2.0, x, y, wait_for=gate)
        busy = q.enqueue(spin, 1, slow, 100_000_000)  # runs on the one worker for a while
        while busy.status == "queued":
            time.sleep(0.001)
        gate.set_complete()                      # held is ready now: it waits for the worker
        later = q.enqueue(axpy, 4, 2.0, x, z)    # ready behind it: this thread runs held
        assert held.status == "complete"
        q.finish(T)
    assert held.profile.ended < busy.profile.ended  # it did not wait for the worker
    assert held.profile.started <= later.profile.started
    np.testing.assert_array_equal(y, 8.0 + 7.0 * x)  # y <- 2y + x three times
    np.testing.assert_array_equal(z, 2.0 + x)


def _settling_fails_once(monkeypatch) -> None:
    """Make hetflow's own bookkeeping raise the first time an instance lets go of its data
    (a fault of the runtime, not of any kernel): ``untrack_locked`` where it was tracked,
    ``drop_locked`` where it ran at once, untracked."""
    calls = []

    def failing_once(real):
        def failing(*args):
            if not calls:
                calls.append(args)
                raise RuntimeError("injected fault")
            return real(*args)
        return failing
    for name in ("untrack_locked", "drop_locked"):
        monkeypatch.setattr(queue_module, name, failing_once(getattr(queue_module, name)))


@pytest.mark.parametrize("here", [False, True], ids=["worker", "enqueuing-thread"])
def test_a_fault_settling_an_instance_fails_it_and_the_queue_goes_on(monkeypatch, here):
    """Not a hang (a dead worker, an instance 'running' forever) nor an exception out of
    enqueue: the instance fails, what reads its data is cancelled, later work runs."""
    if here:
        _every_timed_run_tiny(monkeypatch)
    ran = _threads_running_cpu(monkeypatch)
    spin, x, y, z = _spinner(), np.zeros(2), np.zeros(2), np.zeros(2)
    with Queue("cpu0") as q:
        for _ in range(2 if here else 0):  # compiled, then timed: tiny
            q.enqueue(spin, 2, np.zeros(2), 1).wait(T)
        _settling_fails_once(monkeypatch)
        del ran[:]
        bad = q.enqueue(spin, 2, x, 1)
        reader = q.enqueue(axpy, 2, 1.0, x, y)
        with pytest.raises(EventFailedError, match="failed to settle it: RuntimeError: injected fault"):
            bad.wait(T)
        with pytest.raises(EventFailedError, match="cancelled"):
            reader.wait(T)
        q.enqueue(spin, 2, z, 3).wait(T)
        q.finish(T)
    assert (ran[0] == threading.get_ident()) == here
    np.testing.assert_array_equal(x, 1.0)  # the kernel ran; its reader did not
    np.testing.assert_array_equal(y, 0.0)
    np.testing.assert_array_equal(z, 1.75)


def test_implicit_dependencies_order_raw_war_waw():
    x, y, z = np.ones(4), np.ones(4), np.zeros(4)
    gate = UserEvent()
    with Queue("cpu0", slots=3) as q:
        w1 = q.enqueue(axpy, 4, 2.0, x, y, wait_for=gate)   # writes y
        r1 = q.enqueue(axpy, 4, 1.0, y, z)                   # reads y: after w1 (RAW)
        w2 = q.enqueue(fill, 4, y, 7.0)                      # writes y: after w1 (WAW), r1 (WAR)
        other = q.enqueue(fill, 4, x.copy(), 1.0)            # unrelated
        other.wait(T)
        assert w1.status == r1.status == w2.status == "queued"
        gate.set_complete()
    ran_before(w1, r1)
    ran_before(w1, w2)
    ran_before(r1, w2)
    np.testing.assert_array_equal(z, 3.0)   # 1 * 0 + (2 * 1 + 1)
    np.testing.assert_array_equal(y, 7.0)


def test_slices_of_one_array_and_views_are_one_datum():
    x = np.zeros(8)
    out = np.zeros(4)
    gate = UserEvent()
    with Queue("cpu0", slots=2) as q:
        a = q.enqueue(fill, 4, x[:4], 1.0, wait_for=gate)
        b = q.enqueue(fill, 4, x[4:], 2.0)           # disjoint, but the same array: ordered
        c = q.enqueue(axpy, 4, 1.0, hetflow.section(x, (4,), (4,)), out)  # a view of x: after b
        gate.set_complete()
    ran_before(a, b)
    ran_before(b, c)
    np.testing.assert_array_equal(out, 2.0)


def test_priority_decides_among_ready_instances():
    gate = UserEvent()
    priorities = [1, 5, 3, 5, -2, 0]
    outs = [np.zeros(2) for _ in priorities]
    with Queue("cpu0", slots=1) as q:
        events = [q.enqueue(fill, 2, out, float(k), priority=p, wait_for=gate)
                  for k, (p, out) in enumerate(zip(priorities, outs))]
        gate.set_complete()
    by_start = sorted(range(len(events)), key=lambda k: events[k].profile.started)
    expected = sorted(range(len(events)), key=lambda k: (-priorities[k], k))  # FIFO among equals
    assert by_start == expected


def test_user_event_failure_cancels_what_waits_for_it():
    gate = UserEvent()
    x = np.zeros(2)
    with Queue("cpu0") as q:
        ev = q.enqueue(fill, 2, x, 1.0, wait_for=gate)
        gate.set_failed(RuntimeError("sensor offline"))
        with pytest.raises(EventFailedError, match=rf"{ev.id}.*depends on event {gate.id} \(user event\), "
                                                             r"which failed"):
            ev.wait(T)
        with pytest.raises(EventFailedError, match="sensor offline") as info:
            gate.wait()
        assert isinstance(info.value.__cause__, RuntimeError)
    assert ev.status == "cancelled"
    np.testing.assert_array_equal(x, 0.0)


def test_user_event_is_set_once():
    gate = UserEvent()
    gate.set_complete()
    with pytest.raises(ArgumentError, match="already complete"):
        gate.set_failed(ValueError("late"))


# -- failures ------------------------------------------------------------------------------
def test_failure_cancels_dependents_and_spares_unrelated_work():
    bad = np.array([1.0, -1.0])
    downstream, unrelated = np.zeros(2), np.zeros(2)
    with Queue("cpu0") as q:
        failing = q.enqueue(checked_inc, 2, bad)
        reader = q.enqueue(axpy, 2, 1.0, bad, downstream)          # reads bad: RAW
        second = q.enqueue(checked_inc, 2, downstream)             # reads downstream: transitive
        free = q.enqueue(fill, 2, unrelated, 5.0)
        with pytest.raises(EventFailedError) as info:
            q.finish(T)
    msg = str(info.value)
    assert f"event {failing.id} (kernel 'checked_inc') failed on cpu0" in msg and "negative input" in msg
    cause = info.value.__cause__  # the kernel's own exception, wrapped naming the kernel
    assert isinstance(cause, hetflow.errors.KernelRaisedError) and isinstance(cause.__cause__, ValueError)
    assert failing.status == "failed" and free.status == "complete"
    assert reader.status == second.status == "cancelled"
    err = reader.exception()
    assert isinstance(err, EventFailedError)
    assert f"depends on event {failing.id} (kernel 'checked_inc'), which failed" in str(err)
    assert (f"depends on event {reader.id} (kernel 'axpy'), which was cancelled because event "
            f"{failing.id} (kernel 'checked_inc') failed") in str(second.exception())
    np.testing.assert_array_equal(unrelated, 5.0)
    np.testing.assert_array_equal(downstream, 0.0)


def test_poisoned_data_until_the_failure_is_reported():
    x = np.array([-1.0, 2.0])
    out, fresh = np.zeros(2), np.zeros(2)
    with Queue("cpu0") as q:
        failing = q.enqueue(checked_inc, 2, x)
        while not failing.done:
            time.sleep(0.01)
        late = q.enqueue(axpy, 2, 1.0, x, out)  # enqueued after the failure: still cancelled
        assert late.status == "cancelled"
        with pytest.raises(EventFailedError):
            failing.wait()                       # the application has seen it now
        x[0] = 1.0
        q.enqueue(axpy, 2, 1.0, x, fresh).wait(T)
        # out's last writer was cancelled: poisoned until that too is reported (finish).
        assert q.enqueue(axpy, 2, 1.0, x, out).status == "cancelled"
        q.finish(T)
        q.enqueue(axpy, 2, 1.0, x, out).wait(T)
    np.testing.assert_array_equal(fresh, x)
    np.testing.assert_array_equal(out, x)


def test_finish_raises_each_failure_once():
    with Queue("cpu0") as q:
        q.enqueue(checked_inc, 1, np.array([-1.0]))
        with pytest.raises(EventFailedError):
            q.finish(T)
        q.finish(T)  # reported already


def test_timeouts_raise_instead_of_hanging():
    gate = UserEvent()
    with Queue("cpu0") as q:
        ev = q.enqueue(fill, 2, np.zeros(2), 1.0, wait_for=gate)
        with pytest.raises(HetflowTimeoutError, match=rf"event {ev.id} \(kernel 'fill'\) did not finish within "
                                                      r"0.05 s \(still queued\)"):
            ev.wait(timeout=0.05)
        with pytest.raises(HetflowTimeoutError, match=r"1 instance\(s\) still pending after 0.05 s"):
            q.finish(timeout=0.05)
        gate.set_complete()
        ev.wait(T)


# -- deferred instances and cycles ---------------------------------------------------------
def test_deferred_instance_runs_only_once_submitted():
    x = np.zeros(3)
    with Queue("cpu0") as q:
        ev = q.enqueue(fill, 3, x, 4.0, defer=True)
        with pytest.raises(ArgumentError, match=rf"deferred instance\(s\) never submitted: event {ev.id}"):
            q.finish(T)
        time.sleep(0.05)
        assert ev.status == "queued" and ev.profile.submitted is None
        q.submit(ev)
        ev.wait(T)
    np.testing.assert_array_equal(x, 4.0)


def test_a_long_deferred_chain_runs_in_order_once_submitted():
    # Each submit without wait_for must not walk everything that waits (it once did:
    # quadratic, 1.5 ms per submit at 10,000 instances).
    x = np.zeros(1)
    with Queue("cpu0") as q:
        events = [q.enqueue(checked_inc, 1, x, defer=True) for _ in range(3000)]
        for ev in events:
            q.submit(ev)
        q.finish(T)
    assert x[0] == 3000
    for first, second in zip(events, events[1:]):
        ran_before(first, second)


def test_cycle_through_wait_for_is_rejected():
    with Queue("cpu0") as q:
        a = q.enqueue(fill, 2, np.zeros(2), 1.0, defer=True)
        b = q.enqueue(fill, 2, np.zeros(2), 2.0, wait_for=a, defer=True)
        with pytest.raises(ArgumentError, match=rf"event {a.id} \(kernel 'fill'\) cannot wait for event "
                                                       rf"{b.id}.*event {a.id} .* -> event {b.id} .* -> event {a.id}"):
            q.submit(a, wait_for=[b])
        with pytest.raises(ArgumentError):
            q.submit(a, wait_for=a)
        assert a.status == "queued" and a.profile.submitted is None  # still deferred
        q.submit(a)
        q.submit(b)
    assert a.status == b.status == "complete"
    ran_before(a, b)


def test_cycle_through_an_implicit_dependency_is_rejected():
    x, y = np.zeros(2), np.zeros(2)
    with Queue("cpu0") as q:
        writer = q.enqueue(fill, 2, x, 1.0, defer=True)
        reader = q.enqueue(axpy, 2, 1.0, x, y)  # waits for writer through x
        with pytest.raises(ArgumentError, match=f"event {reader.id}"):
            q.submit(writer, wait_for=[reader])
        q.submit(writer)
    np.testing.assert_array_equal(y, 1.0)


def test_submit_misuse():
    with Queue("cpu0") as q, Queue("cpu0") as other:
        ev = q.enqueue(fill, 1, np.zeros(1), 1.0)
        with pytest.raises(ArgumentError, match="already submitted"):
            q.submit(ev)
        deferred = q.enqueue(fill, 1, np.zeros(1), 1.0, defer=True)
        with pytest.raises(ArgumentError, match="is not a pending instance of this queue"):
            other.submit(deferred)
        with pytest.raises(ArgumentError, match="is not a pending instance"):
            q.submit(UserEvent())
        q.submit(deferred)


def test_closing_cancels_never_submitted_instances():
    q = Queue("cpu0")
    ev = q.enqueue(fill, 1, np.zeros(1), 1.0, defer=True)
    after = q.enqueue(fill, 1, np.zeros(1), 2.0, wait_for=ev)
    q.close()
    assert ev.status == after.status == "cancelled"
    with pytest.raises(EventFailedError, match="never submitted before its queue closed"):
        ev.wait()
    with pytest.raises(EventFailedError, match=f"depends on event {ev.id} .*, which was cancelled$"):
        after.wait()
    with pytest.raises(ArgumentError, match="this queue is closed"):
        q.enqueue(fill, 1, np.zeros(1), 1.0)


# -- kernel objects -------------------------------------------------------------------------
def _make_kernel():
    @hetflow.kernel
    def triple(i, x):
        x[i] = 3.0 * x[i]

    return triple


def test_released_kernel_lives_until_its_instances_finish():
    k = _make_kernel()
    ref = weakref.ref(k)
    x = np.ones(4)
    gate = UserEvent()
    with Queue("cpu0") as q:
        q.enqueue(k, 4, x).wait(T)
        pending = q.enqueue(k, 4, x, wait_for=gate)
        release(k)
        with pytest.raises(KernelError, match="kernel 'triple' was released"):
            q.enqueue(k, 4, x)
        with pytest.raises(KernelError, match="already released"):
            release(k)
        del k
        gc.collect()
        assert ref() is not None  # the pending instance holds it
        gate.set_complete()
        pending.wait(T)
    gc.collect()
    assert ref() is None  # dropped from every runtime table
    np.testing.assert_array_equal(x, 9.0)


def test_release_without_pending_instances_drops_at_once():
    k = _make_kernel()
    ref = weakref.ref(k)
    with Queue("cpu0") as q:
        q.enqueue(k, 2, np.ones(2))
    release(k)
    del k
    gc.collect()
    assert ref() is None


# -- bad input -----------------------------------------------------------------------------------
def test_bad_enqueue_arguments():
    x = np.zeros(4)
    with Queue("cpu0") as q:
        with pytest.raises(ArgumentTypeError, match="takes 3 data argument"):
            q.enqueue(axpy, 4, 1.0, x)
        with pytest.raises(ShapeError, match="does not fit the launch extent"):
            q.enqueue(fill, 8, x, 1.0)
        with pytest.raises(ArgumentTypeError, match="not a hetflow kernel"):
            q.enqueue(len, 4, x)
        with pytest.raises(ArgumentError, match="wait_for must hold hetflow events, got int"):
            q.enqueue(fill, 4, x, 1.0, wait_for=[3])
        with pytest.raises(ArgumentError, match="wait_for must be an event or events, got float"):
            q.enqueue(fill, 4, x, 1.0, wait_for=2.5)
        with pytest.raises(ArgumentError, match="priority must be an int, got str"):
            q.enqueue(fill, 4, x, 1.0, priority="high")
        with pytest.raises(ArgumentError, match=r"device 'gpu7' is not in this queue's context \(cpu0\)"):
            q.enqueue(fill, 4, x, 1.0, device="gpu7")
        with pytest.raises(ArgumentError, match="device 'gpu7' is not in this queue's context"):
            q.set_device_busy("gpu7")
        q.enqueue(fill, 4, x, 1.0).wait(T)  # nothing was left behind by the failed calls
    np.testing.assert_array_equal(x, 1.0)
    with pytest.raises(ArgumentTypeError, match="not a hetflow kernel"):
        release(print)


def test_bad_queue_options():
    with pytest.raises(ArgumentError, match="slots for cpu0 must be a positive int, got 0"):
        Queue("cpu0", slots=0)
    with pytest.raises(ArgumentError, match="slots name devices outside the queue's context: gpu3"):
        Queue("cpu0", slots={"gpu3": 1})
    with pytest.raises(ArgumentError, match="max_depth must be a positive number, got 'deep'"):
        Queue("cpu0", max_depth="deep")
    with pytest.raises(ArgumentError, match="unknown Queue option.*max_dept\\b"):
        Queue("cpu0", max_dept=3)


def test_queue_on_an_empty_context_is_refused_and_leaves_it_alone():
    ctx = hetflow.Context(hetflow.LogicalDevice(()))  # a selection that matched nothing ([] is refused)
    with pytest.raises(ArgumentError, match="has no devices to run on"):
        Queue(ctx)
    assert ctx.refcount == 1
    ctx.release()


def test_queue_retains_its_context():
    ctx = hetflow.Context("cpu0")
    q = Queue(ctx)
    ctx.release()  # the application lets go; the queue still holds it
    x = np.zeros(2)
    q.enqueue(fill, 2, x, 2.0).wait(T)
    q.close()
    with pytest.raises(InvalidContextError):
        ctx.devices
    with pytest.raises(InvalidContextError):
        Queue(ctx)
    np.testing.assert_array_equal(x, 2.0)


# -- buffers ------------------------------------------------------------------------------------
def test_buffer_read_write_map_against_numpy():
    buf = Buffer(np.arange(6.0))
    x = np.ones(6)
    with Queue("cpu0") as q:
        q.enqueue(axpy, 6, 2.0, x, buf)
        np.testing.assert_array_equal(buf.read(T), 2.0 * np.arange(6.0) + 1.0)
        buf.write(5.0)
        q.enqueue(axpy, 6, 1.0, x, buf)
        host = buf.map(T)
        np.testing.assert_array_equal(host, 6.0)
        host[0] = -3.0  # the host writes through the mapping
        q.enqueue(axpy, 6, 1.0, x, buf)
        np.testing.assert_array_equal(buf.read(T), [-2.0, 7, 7, 7, 7, 7])
    assert Buffer((2, 3), dtype=np.int32).read().dtype == np.int32
    assert Buffer(4).shape == (4,) and Buffer(4).valid == ("host",)


def test_buffer_host_access_waits_for_pending_writers():
    buf = Buffer(3)
    gate = UserEvent()
    with Queue("cpu0") as q:
        q.enqueue(fill, 3, buf, 1.0, wait_for=gate)
        with pytest.raises(HetflowTimeoutError):
            buf.read(timeout=0.05)
        gate.set_complete()
        np.testing.assert_array_equal(buf.read(T), 1.0)


def test_buffer_whose_writer_failed_raises_until_written():
    buf = Buffer([-1.0, 1.0])
    with Queue("cpu0") as q:
        q.enqueue(checked_inc, 2, buf)
        with pytest.raises(EventFailedError, match="negative input"):
            buf.read(T)
        buf.write([0.0, 0.0])
        q.enqueue(checked_inc, 2, buf)
        np.testing.assert_array_equal(buf.read(T), [1.0, 1.0])


def test_bad_buffer_arguments():
    with pytest.raises(ArgumentError, match="negative dimension"):
        Buffer((2, -1))
    with pytest.raises(ArgumentTypeError, match="'nonsense' is not a NumPy dtype"):
        Buffer(3, dtype="nonsense")
    with pytest.raises(ArgumentError, match="needs numeric data"):
        Buffer([object()])
    with pytest.raises(ArgumentError, match=r"needs numeric data \(bool, integer, float or complex\), "
                                            r"got list of dtype <U1"):
        Buffer(["a"])
    with pytest.raises(ArgumentError, match=r"cannot write data of shape \(4,\) into a Buffer of shape \(3,\)"):
        Buffer(3).write(np.ones(4))
    with pytest.raises(ArgumentError, match=r"cannot write data of shape \(3, 1\) into a Buffer of shape \(3,\)"):
        Buffer(3).write(np.ones((3, 1)))


# -- device status and placement --------------------------------------------------------------
def test_set_busy_overrides_and_restores():
    try:
        status.set_busy("gpu0", True)
        assert status.forced_busy("gpu0") is True
        status.set_busy("gpu0", False)
        assert status.forced_busy("gpu0") is False
    finally:
        status.set_busy("gpu0", None)
    assert status.forced_busy("gpu0") is None


def test_sampler_caches_within_its_ttl():
    cpu = hetflow.get_device("cpu0")
    cached = status.Sampler(ttl=3600)
    first = cached.sample(cpu)
    assert cached.sample(cpu) is first
    assert 0 < first.memory_used <= first.memory_total and 0.0 <= first.utilization <= 1.0
    fresh = status.Sampler(ttl=0)
    assert fresh.sample(cpu) is not fresh.sample(cpu)


def test_queue_status_reports_each_device():
    gate = UserEvent()
    with Queue("cpu0") as q:
        q.enqueue(fill, 1, np.zeros(1), 1.0, wait_for=gate)
        q.enqueue(fill, 1, np.zeros(1), 1.0)
        time.sleep(0.05)
        st = q.status()
        assert set(st) == {"cpu0"} and st["cpu0"]["busy"] is False and st["cpu0"]["slots"] == 1
        gate.set_complete()


@pytest.mark.simgpu
def test_work_meant_for_a_busy_gpu_runs_on_the_cpu():
    x = np.arange(4.0)
    with Queue(hetflow.Context(["cpu0", "gpu0"])) as q:
        try:
            q.set_device_busy("gpu0", True)
            on_cpu = q.enqueue(axpy, 4, 2.0, x, np.zeros(4), device="gpu0")
            on_cpu.wait(T)
            q.set_device_busy("gpu0", False)
            y = np.ones(4)
            on_gpu = q.enqueue(axpy, 4, 2.0, x, y, device="gpu0")
            on_gpu.wait(T)
        finally:
            status.set_busy("gpu0", None)
    assert on_cpu.profile.device == "cpu0"
    assert on_gpu.profile.device == "gpu0" and on_gpu.profile.threads == 16
    np.testing.assert_array_equal(y, 2.0 + np.arange(4.0))


@pytest.mark.simgpu
def test_placement_respects_the_queue_depth_threshold():
    gate = UserEvent()
    outs = [np.zeros(2) for _ in range(5)]
    with Queue(hetflow.Context(["cpu0", "gpu0"]), max_depth=2, max_memory=1.0,
               balance_simulated=True) as q:
        events = [q.enqueue(fill, 2, out, 1.0, wait_for=gate) for out in outs]
        gate.set_complete()
    # All five become ready at once: two fill the CPU's depth, two the GPU's, the last
    # finds both at the threshold and goes home.
    assert [e.profile.device for e in events] == ["cpu0", "cpu0", "gpu0", "gpu0", "cpu0"]
    for out in outs:
        np.testing.assert_array_equal(out, 1.0)


@pytest.mark.simgpu
def test_large_instance_is_split_over_devices():
    n = 64
    x, y = np.arange(float(n)), np.ones(n)
    with Queue(hetflow.Context(["cpu0", "gpu0"]), split_min=16, max_memory=1.0,
               balance_simulated=True) as q:
        split = q.enqueue(axpy, n, 3.0, x, y)
        whole = q.enqueue(shift_write, n - 1, x, np.zeros(n))  # writes y[i + 1]: not by rows
    p = split.profile
    assert p.device == ("cpu0", "gpu0") and p.blocks is None
    covered = sorted((lo, hi) for _, lo, hi in p.parts)
    assert covered[0][0] == 0 and covered[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(covered, covered[1:]))  # every row exactly once
    np.testing.assert_array_equal(y, 3.0 + np.arange(float(n)))
    assert isinstance(whole.profile.device, str)


@pytest.mark.simgpu
def test_buffer_copies_stay_coherent_across_devices():
    buf = Buffer(np.arange(4.0))
    x = np.ones(4)
    with Queue(hetflow.Context(["cpu0", "gpu0"])) as q:
        q.enqueue(axpy, 4, 2.0, x, buf, device="gpu0").wait(T)
        assert buf.valid == ("gpu0",)                  # written on the GPU only
        q.enqueue(axpy, 4, 1.0, x, buf, device="cpu0").wait(T)
        assert buf.valid == ("host",)                  # copied back, then written on the CPU
        out = np.zeros(4)
        q.enqueue(axpy, 4, 1.0, buf, out, device="gpu0").wait(T)
        assert buf.valid == ("gpu0", "host")           # read on the GPU: both copies current
        np.testing.assert_array_equal(buf.read(T), 2.0 * np.arange(4.0) + 2.0)
        np.testing.assert_array_equal(out, 2.0 * np.arange(4.0) + 2.0)


@pytest.mark.simgpu
def test_gpu_arrays_cannot_go_to_the_cpu():
    from hetflow.cuda_compat import cuda_module

    on_gpu = cuda_module().to_device(np.zeros(4))
    with Queue(hetflow.Context(["cpu0", "gpu0"])) as q:
        with pytest.raises(ArgumentError, match="argument 2 is a GPU array: it cannot run on cpu0"):
            q.enqueue(axpy, 4, 1.0, np.ones(4), on_gpu, device="cpu0")
        q.enqueue(axpy, 4, 1.0, np.ones(4), on_gpu).wait(T)
        assert q.status()["gpu0"]["running"] == 0
    np.testing.assert_array_equal(on_gpu.copy_to_host(), 1.0)
    with Queue(hetflow.Context(["cpu0"])) as q, \
            pytest.raises(ArgumentError, match="argument 0 is a GPU array: it cannot run on cpu0"):
        q.enqueue(fill, 4, on_gpu, 1.0, device="cpu0")


# -- a real GPU loaded by another process ---------------------------------------------------------
LOAD = textwrap.dedent("""
    import time, cupy as cp
    a = cp.random.random((4096, 4096), dtype=cp.float32)
    end = time.time() + {seconds}
    while time.time() < end:
        a = a @ a; a /= cp.linalg.norm(a)
        cp.cuda.Device().synchronize()
""")


def _wait_for(predicate, seconds):
    end = time.time() + seconds
    while time.time() < end:
        if predicate():
            return True
        time.sleep(0.2)
    return False


@pytest.mark.gpu
def test_gpu_busy_with_another_process_sends_work_to_the_cpu():
    pytest.importorskip("pynvml")
    pytest.importorskip("cupy")
    gpu = hetflow.get_device("gpu0")
    sampler = status.Sampler(ttl=0)
    load = subprocess.Popen([sys.executable, "-c", LOAD.format(seconds=60)], env=dict(os.environ))
    try:
        assert _wait_for(lambda: (sampler.sample(gpu).others or 0) >= 0.5, 30), sampler.sample(gpu)
        x = np.arange(1024.0)
        with Queue(hetflow.Context(["cpu0", "gpu0"]), sampler=status.Sampler(ttl=0)) as q:
            ev = q.enqueue(axpy, 1024, 2.0, x, np.zeros(1024), device="gpu0")
        assert ev.profile.device == "cpu0"
    finally:
        load.kill()
        load.wait()
    assert _wait_for(lambda: (sampler.sample(gpu).others or 0) < 0.5, 30)
    y = np.zeros(1024)
    with Queue(hetflow.Context(["cpu0", "gpu0"]), sampler=status.Sampler(ttl=0)) as q:
        ev = q.enqueue(axpy, 1024, 2.0, x, y, device="gpu0")
    assert ev.profile.device == "gpu0"
    np.testing.assert_array_equal(y, x)


def test_a_queue_whose_context_was_released_once_too_often_refuses_work():
    """The application's extra release takes the queue's own reference: the next enqueue
    raises InvalidContextError there, and closing the queue does not raise."""
    from hetflow.errors import InvalidContextError

    ctx = hetflow.Context("cpu0")
    q = hetflow.Queue(ctx)
    x = np.zeros(4)
    q.enqueue(hetflow.library.fill, 4, 1.0, x).wait(timeout=30)
    ctx.release()
    ctx.release()  # one too many: the queue's reference
    with pytest.raises(InvalidContextError, match="was released"):
        q.enqueue(hetflow.library.fill, 4, 2.0, x)
    q.close()
    np.testing.assert_array_equal(x, 1.0)


@pytest.mark.simgpu
def test_two_slots_on_the_simulated_gpu_run_every_launch(gpu_device):
    # The simulator runs one launch at a time: two slots made 7 of 8 launches fail with
    # "'Thread' object has no attribute 'blockIdx'".
    xs = [np.full(200, float(k)) for k in range(8)]
    ys = [np.zeros(200) for _ in range(8)]
    with Queue([gpu_device.id], slots=2) as q:
        events = [q.enqueue(axpy, 200, 2.0, x, y) for x, y in zip(xs, ys)]
        q.finish(T)
    assert all(e.exception(T) is None for e in events)
    for x, y in zip(xs, ys):
        np.testing.assert_array_equal(y, x)
