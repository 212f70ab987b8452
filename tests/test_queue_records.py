"""What the runtime keeps per datum (runtime.deps): a finished writer is not kept alive
by the data it wrote, and dropping a record that says nothing any more loses no order.

Oracles: weak references (is an event still alive?) and NumPy results.
"""
import gc
import weakref

import numpy as np

import hetflow
from hetflow.runtime import deps
from hetflow.runtime.events import CANCELLED, COMPLETE, FAILED, LOCK, QUEUED, UserEvent, dependents
from hetflow.runtime import queue as queue_module
from hetflow.runtime.queue import Queue

T = 120  # seconds: generous, the first launch of a kernel compiles it


@hetflow.kernel
def fill(i, x, v):
    x[i] = v


@hetflow.kernel
def scaled(i, x, out, a):
    out[i] = a * x[i]


def test_finished_writers_are_not_kept_alive_by_their_data():
    outs = [np.zeros(3) for _ in range(40)]
    with Queue("cpu0") as q:
        refs = [weakref.ref(q.enqueue(fill, 3, out, float(k))) for k, out in enumerate(outs)]
    gc.collect()
    assert [r for r in refs if r() is not None] == []
    for k, out in enumerate(outs):  # the data live on, written
        np.testing.assert_array_equal(out, float(k))


def test_order_holds_on_data_whose_writer_finished_long_ago():
    x, y = np.zeros(4), np.zeros(4)
    with Queue("cpu0", slots=2) as q:
        q.enqueue(fill, 4, x, 2.0).wait(T)      # x's writer done: nothing to wait for
        gate = UserEvent()
        w = q.enqueue(fill, 4, x, 5.0, wait_for=gate)
        r = q.enqueue(scaled, 4, x, y, 3.0)     # reads x: after w (read-after-write)
        w2 = q.enqueue(fill, 4, x, 7.0)         # writes x: after r (write-after-read)
        assert (w.status, r.status, w2.status) == ("queued", "queued", "queued")
        gate.set_complete()
    assert w.profile.ended <= r.profile.started and r.profile.ended <= w2.profile.started
    np.testing.assert_array_equal(y, 15.0)
    np.testing.assert_array_equal(x, 7.0)


def test_a_fan_out_over_fresh_outputs_matches_numpy():
    x = np.arange(5.0)
    outs = [np.zeros(5) for _ in range(30)]
    with Queue("cpu0") as q:
        q.enqueue(fill, 5, x, 1.5)
        for k, out in enumerate(outs):
            q.enqueue(scaled, 5, x, out, float(k))
        q.enqueue(fill, 5, x, -1.0)  # after every reader (write-after-read)
    for k, out in enumerate(outs):
        np.testing.assert_array_equal(out, np.full(5, 1.5) * k)
    np.testing.assert_array_equal(x, -1.0)


def test_a_tiny_instance_waiting_for_nothing_runs_at_once_and_leaves_no_record(monkeypatch):
    """Run in the enqueuing thread under the runtime's lock (runtime.queue's docstring):
    settled when enqueue returns, with nothing kept for its data; one that would wait is
    queued as before."""
    monkeypatch.setattr(queue_module, "RUN_HERE_S", 1.0)  # every timed run is tiny
    x, y = np.zeros(4), np.zeros(4)
    with Queue("cpu0") as q:
        for _ in range(2):  # compiled, then timed
            q.enqueue(fill, 4, x, 1.0).wait(T)
            q.enqueue(scaled, 4, x, y, 2.0).wait(T)
        gate = UserEvent()
        reader = q.enqueue(scaled, 4, x, y, 3.0, wait_for=gate)  # waits: x gets a record listing it
        with LOCK:
            assert id(x) in deps._data
        gate.set_complete()
        reader.wait(T)
        with LOCK:
            assert id(x) not in deps._data  # its reader done, the record went with it
        tracked, track = [], queue_module.track_locked
        monkeypatch.setattr(queue_module, "track_locked", lambda inst, *a: (tracked.append(inst), track(inst, *a)))
        now = q.enqueue(fill, 4, x, 7.0)  # waits for nothing: run here, untracked
        assert now.status == COMPLETE and now.device == "cpu0" and tracked == []
        assert now.profile.queued <= now.profile.started <= now.profile.ended
        with LOCK:
            assert id(x) not in deps._data and id(y) not in deps._data
        gate = UserEvent()
        reader = q.enqueue(scaled, 4, x, y, 3.0, wait_for=gate)
        writer = q.enqueue(fill, 4, x, 9.0)  # would wait for the reader (write-after-read): queued
        assert (reader.status, writer.status) == (QUEUED, QUEUED) and tracked == [reader, writer]
        gate.set_complete()
    np.testing.assert_array_equal(y, 21.0)  # the reader ran before the writer
    np.testing.assert_array_equal(x, 9.0)


# -- the dependency rules on data without weak references (runtime.deps directly) -----------
class _Opaque:
    """A datum without weak references."""

    __slots__ = ()


class _Inst:
    """What runtime.deps reads and writes of an instance."""

    __slots__ = ("status", "doomed", "pending", "_needs", "_after", "held", "_error", "_retrieved")

    def __init__(self):
        self.status, self.doomed, self.pending = QUEUED, None, 0
        self._needs = self._after = self.held = self._error = None
        self._retrieved = False


def _done(inst, status=COMPLETE):
    inst.status = status
    if inst.held is not None:  # as the queue retires an instance
        deps.untrack_locked(inst, status is COMPLETE)


def test_pinned_data_order_like_any_and_are_forgotten_once_unused():
    obj = _Opaque()
    w, r1, r2, w2 = _Inst(), _Inst(), _Inst(), _Inst()
    with LOCK:
        deps.track_locked(w, (obj,), (deps.WRITE,))
        deps.track_locked(r1, (obj,), (deps.READ,))
        deps.track_locked(r2, (obj,), (deps.READ,))
        deps.track_locked(w2, (obj,), (deps.READ | deps.WRITE,))
        # r1, r2 read after w; w2 reads after w and writes after the readers.
        assert (r1.pending, r2.pending, w2.pending) == (1, 1, 3)
        assert set(dependents(w._needs)) == {r1, r2, w2}
        assert dependents(r1._after) == dependents(r2._after) == (w2,)
        assert deps.pending_locked(obj, write=True) == [w2]  # the last writer, no readers since
        for inst in (w, r1, r2):
            _done(inst)
        _done(w2)
        assert deps.pending_locked(obj, write=True) == [] and deps.last_writer_locked(obj) is None
        late = _Inst()
        deps.track_locked(late, (obj,), (deps.READ,))
        assert late.pending == 0 and late.doomed is None
        _done(late)


def test_a_failed_lone_writer_poisons_weakly_referenced_data_only():
    for obj, poisons in ((np.zeros(2), True), (_Opaque(), False)):
        w, r = _Inst(), _Inst()
        with LOCK:
            deps.track_locked(w, (obj,), (deps.WRITE,))
            w._error = RuntimeError("failed")
            _done(w, FAILED)
            deps.track_locked(r, (obj,), (deps.READ,))
            assert (r.doomed is not None) is poisons and r.pending == 0
            _done(r, CANCELLED if poisons else COMPLETE)
            deps.host_wrote_locked(obj)  # the application writes it: no longer poisoned
            again = _Inst()
            deps.track_locked(again, (obj,), (deps.READ,))
            assert again.doomed is None
            _done(again)
