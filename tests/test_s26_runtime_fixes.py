"""Runtime fixes: an event wait's timeout covers the wait for the runtime's lock; a queue's
finish timeout names the queue and what is stuck; one slow timed run of a small CPU
launch does not send the next ones to the thread pool."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import hetflow
from hetflow.errors import HetflowTimeoutError
from hetflow.runtime import cpu
from hetflow.runtime.events import LOCK, UserEvent
from hetflow.runtime.launch import bind
from hetflow.runtime.queue import Queue

T = 30.0  # a wait that only a hang would exhaust


@hetflow.kernel
def s26_add_one(i, x):
    x[i] += 1.0


def test_an_event_wait_counts_the_wait_for_the_lock_in_its_timeout():
    """The lock held for most of the timeout: the wait still ends after about the
    timeout, not after the lock's wait plus a whole timeout more."""
    gate = UserEvent()
    holding = threading.Event()

    def hold():
        with LOCK:
            holding.set()
            time.sleep(0.9)

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait(T)
    began = time.perf_counter()
    try:
        with pytest.raises(HetflowTimeoutError, match=rf"event {gate.id} \(user event\) did not finish within 1.0 s"):
            gate.wait(1.0)
        took = time.perf_counter() - began
    finally:
        holder.join(T)
    assert took < 1.6  # the lock's 0.9 s and a second full timeout would be 1.9 s


def test_a_finish_timeout_names_the_queue_and_the_first_pending_instances():
    gate = UserEvent()
    x = np.zeros(2)
    with Queue("cpu0", run_here=False) as q:
        events = [q.enqueue(s26_add_one, 2, x, wait_for=gate if k == 0 else ()) for k in range(5)]
        with pytest.raises(HetflowTimeoutError) as info:
            q.finish(0.1)
        message = str(info.value)
        assert "5 instance(s) still pending after 0.1 s in <hetflow Queue on cpu0>" in message
        first, second = events[0], events[1]  # the second waits for the first's write of x
        assert f"event {first.id} (kernel 's26_add_one'): queued, waiting for 1 event(s)" in message
        assert f"event {second.id} (kernel 's26_add_one'): queued, waiting for 1 event(s)" in message
        assert f"event {events[3].id} " not in message and message.count("; and 2 more;") == 1
        assert "user event never set" in message
        gate.set_complete()
        q.finish(T)
    np.testing.assert_array_equal(x, np.full(2, 5.0))


def test_one_slow_run_of_a_small_launch_leaves_the_next_inline(monkeypatch):
    """A small launch's rows run on the calling thread by the smaller of the plan's last
    two row costs: one preempted run leaves the next launch inline; two move it."""
    x = np.zeros(4)
    launch = bind(s26_add_one, 4, (x,), hetflow.get_device("cpu0"))
    assert cpu.run(launch, 2) == [(0, 4)]  # a few microseconds of work: inline, timed
    cpu._learn(launch, 4, 1.0)  # a run the machine preempted: a quarter second a row

    def pooled(*args):
        raise AssertionError("a small launch went to the thread pool")

    monkeypatch.setattr(cpu, "_threads", pooled)
    monkeypatch.setattr(cpu, "_parallel", pooled)
    assert cpu.run(launch, 2) == [(0, 4)]  # the faster of the last two runs decides
    np.testing.assert_array_equal(x, np.full(4, 2.0))
    cpu._learn(launch, 4, 1.0)
    cpu._learn(launch, 4, 1.0)  # slow twice: the launch is spread over the cores
    with pytest.raises(AssertionError, match="thread pool"):
        cpu.run(launch, 2)


@hetflow.kernel
def refuses_negatives(i, x):
    if x[i] < 0:
        raise ValueError("negative reading")
    x[i] = 2.0 * x[i]


def test_a_cancelled_event_says_why_the_first_one_failed():
    """A chain of cancellations names the failure that started it and what it raised, in
    words, at every link (a user reading one error learns why without walking the chain)."""
    x, y, z = np.array([1.0, -1.0]), np.zeros(2), np.zeros(2)
    gate = UserEvent()
    with Queue("cpu0") as q:
        failing = q.enqueue(refuses_negatives, 2, x)
        reader = q.enqueue(refuses_negatives, 2, x)  # reads what the failing one writes
        gated = q.enqueue(refuses_negatives, 2, y, wait_for=gate)
        gate.set_failed(RuntimeError("sensor offline"))
        later = q.enqueue(refuses_negatives, 2, z, wait_for=reader)
        for ev in (reader, later):
            with pytest.raises(hetflow.errors.EventFailedError, match=r"ValueError.*negative reading\)$"):
                ev.wait(T)
        assert f"which was cancelled because {failing} failed" in str(later.exception())
        with pytest.raises(hetflow.errors.EventFailedError, match=r"which failed \(RuntimeError: sensor offline\)$"):
            gated.wait(T)
        with pytest.raises(hetflow.errors.EventFailedError):
            q.finish(T)
    np.testing.assert_array_equal(y, 0.0)
    np.testing.assert_array_equal(z, 0.0)
