"""One datum passed as several arguments (runtime.deps merges their access modes).

An instance that reads and writes one array through two arguments must wait for that
array's last writer as a reader does (read-after-write: cancelled if the writer failed),
and never for itself. Oracles: NumPy, and the dependency rules of SPEC §2.
"""
import numpy as np
import pytest

import hetflow
from hetflow.runtime.events import UserEvent
from hetflow.runtime.queue import Queue

T = 120  # seconds: generous, the first launch of a kernel compiles it
N = 4


@hetflow.kernel
def put(i, x, v):
    x[i] = v


@hetflow.kernel
def doubled_into(i, out, x):  # writes its first argument, reads its second
    out[i] = 2.0 * x[i]


@hetflow.kernel
def doubled_from(i, x, out):  # reads its first argument, writes its second
    out[i] = 2.0 * x[i]


@pytest.mark.parametrize("kernel", [doubled_into, doubled_from])
def test_an_array_passed_twice_chains_in_order(kernel):
    y = np.arange(1.0, N + 1)
    expected = y.copy()
    with Queue("cpu0") as q:
        for _ in range(5):
            q.enqueue(kernel, N, y, y)
            expected = 2.0 * expected
    np.testing.assert_array_equal(y, expected)


@pytest.mark.parametrize("kernel", [doubled_into, doubled_from])
def test_an_array_passed_twice_is_read_after_its_failed_writer(kernel):
    y = np.ones(N)
    gate = UserEvent()
    with Queue("cpu0") as q:
        w = q.enqueue(put, N, y, 5.0, wait_for=gate)
        r = q.enqueue(kernel, N, y, y)  # reads y: cancelled with its writer
        gate.set_failed(RuntimeError("upstream lost"))
        q.finish(T)  # raises kernel failures only: these are cancellations
    assert (w.status, r.status) == ("cancelled", "cancelled")
    np.testing.assert_array_equal(y, 1.0)


def test_two_slices_of_one_array_are_one_datum_read_and_written():
    x = np.arange(2.0 * N)
    gate = UserEvent()
    with Queue("cpu0") as q:
        w = q.enqueue(put, N, x[N:], 3.0, wait_for=gate)
        r = q.enqueue(doubled_into, N, x[:N], x[N:])  # after w: it reads what w writes
        assert r.status == "queued"
        gate.set_complete()
    assert w.profile.ended <= r.profile.started
    np.testing.assert_array_equal(x, [6.0] * N + [3.0] * N)
