"""What the runtime keeps per datum (runtime.deps): a finished writer is not kept alive
by the data it wrote, and dropping a record that says nothing any more loses no order.

Oracles: weak references (is an event still alive?) and NumPy results.
"""
import gc
import weakref

import numpy as np

import hetflow
from hetflow.runtime.events import UserEvent
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
