"""Records of data only read (runtime.deps) go once their readers are done, however long
the data live, and dropping them loses no order: a later writer still waits for the
readers not yet done.

Oracles: the size of deps' table, weak references (is a finished event still alive?),
NumPy results.
"""
import gc
import weakref

import numpy as np

from hetflow.runtime import deps
from hetflow.runtime.events import COMPLETE, LOCK, QUEUED, UserEvent, dependents
from hetflow.runtime.queue import Queue
from test_queue_records import fill, scaled  # the same tiny kernels

T = 120  # seconds: generous, the first launch of a kernel compiles it


def test_records_do_not_grow_over_launches_reading_fresh_live_arrays():
    inputs = [np.full(3, float(k)) for k in range(60)]  # alive throughout, only read
    outs = [np.zeros(3) for _ in inputs]
    with LOCK:
        before = len(deps._data)
    with Queue("cpu0") as q:
        gate = UserEvent()  # every launch waits, so every one is tracked
        refs = [weakref.ref(q.enqueue(scaled, 3, x, out, 2.0, wait_for=gate)) for x, out in zip(inputs, outs)]
        with LOCK:
            assert all(type(deps._data[id(x)]) is deps._Datum for x in inputs)  # pending: recorded
        gate.set_complete()
    gc.collect()
    with LOCK:
        assert len(deps._data) == before
    assert [r for r in refs if r() is not None] == []  # no record keeps a finished reader
    for x, out in zip(inputs, outs):
        np.testing.assert_array_equal(out, 2.0 * x)


def test_a_writer_after_readers_done_out_of_order_waits_for_the_one_pending():
    x, y1, y2 = np.ones(4), np.zeros(4), np.zeros(4)
    with Queue("cpu0", slots=2) as q:
        gate = UserEvent()
        slow = q.enqueue(scaled, 4, x, y1, 2.0, wait_for=gate)
        q.enqueue(scaled, 4, x, y2, 3.0).wait(T)  # the later reader is done first
        w = q.enqueue(fill, 4, x, 5.0)  # write-after-read: after the pending reader
        assert (slow.status, w.status) == (QUEUED, QUEUED)
        gate.set_complete()
    assert slow.profile.ended <= w.profile.started
    np.testing.assert_array_equal(y1, 2.0)  # read x before the writer
    np.testing.assert_array_equal(y2, 3.0)
    np.testing.assert_array_equal(x, 5.0)
    with LOCK:
        assert id(x) not in deps._data


class _Inst:
    """What runtime.deps reads and writes of an instance."""

    __slots__ = ("status", "doomed", "pending", "_needs", "_after", "held", "_error", "_retrieved")

    def __init__(self):
        self.status, self.doomed, self.pending = QUEUED, None, 0
        self._needs = self._after = self.held = self._error = None
        self._retrieved = False


def _done(inst):
    inst.status = COMPLETE
    deps.untrack_locked(inst, True)  # as the queue retires an instance


def test_the_record_goes_with_the_last_reader_done_in_any_order():
    for order in ((0, 1, 2), (2, 1, 0), (1, 2, 0), (0, 2, 1)):
        for write_late in (False, True):
            x = np.zeros(2)
            readers = [_Inst() for _ in range(3)]
            with LOCK:
                for r in readers:
                    deps.track_locked(r, (x,), (deps.READ,))
                for k in order[:-1]:
                    _done(readers[k])
                    assert id(x) in deps._data
                last = readers[order[-1]]
                if write_late:  # waits for the reader not done, and only for it
                    late = _Inst()
                    deps.track_locked(late, (x,), (deps.WRITE,))
                    assert late.pending == 1 and dependents(last._after) == (late,)
                    _done(last)
                    assert id(x) in deps._data  # its writer pending
                    _done(late)
                else:
                    assert deps.pending_locked(x, write=True) == [last]
                    _done(last)
                assert id(x) not in deps._data
