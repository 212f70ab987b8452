"""Queue finalisation never deadlocks; timeouts hold with the runtime's lock taken
(issue 18, item 5).

A queue that dies in a reference cycle is finalised by the cyclic garbage collector,
in whatever thread it runs: here inside a queue worker that holds the runtime's lock
(an argument whose ``__del__`` collects is dropped by the worker when it retires the
instance). The scenario runs in a child process so that a deadlock fails the test
instead of hanging it.
"""
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import hetflow
from hetflow.errors import HetflowTimeoutError
from hetflow.runtime import events
from hetflow.runtime.queue import Queue

GC_IN_WORKER = textwrap.dedent("""
    import gc, threading, time
    import numpy as np
    import hetflow
    from hetflow.runtime.queue import Queue

    @hetflow.kernel
    def bump(i, x):
        x[i] = x[i] + 1.0

    class Collecting(np.ndarray):
        def __del__(self):
            gc.collect()  # the collector runs in the thread that drops the array

    def workers():
        return sum(t.name.startswith("hetflow-queue-cpu0") for t in threading.enumerate())

    main = Queue("cpu0")
    y = np.zeros(4)
    gc.set_threshold(1, 1, 1)
    for _ in range({rounds}):
        dead = Queue("cpu0")
        dead.cycle = dead  # only the cyclic collector can finalise it
        del dead
        x = np.zeros(4).view(Collecting)
        main.enqueue(bump, 4, x)
        del x  # the instance holds the last reference: its worker drops it, under the lock
        main.enqueue(bump, 4, y)
        main.finish(timeout=20)
    gc.set_threshold(700, 10, 10)
    gc.collect()
    deadline = time.monotonic() + 20
    while workers() > 1 and time.monotonic() < deadline:  # dead queues' workers stop
        time.sleep(0.05)
    print("done", y[0], workers())
""")


def test_queue_collected_inside_a_worker_holding_the_lock_does_not_deadlock():
    rounds = 25
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(["src", os.environ.get("PYTHONPATH", "")]))
    try:
        out = subprocess.run([sys.executable, "-c", GC_IN_WORKER.format(rounds=rounds)], env=env,
                             capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the queue deadlocked: {exc.stderr!r}")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["done", f"{float(rounds)}", "1"], out.stdout


@hetflow.kernel
def fill(i, x, v):
    x[i] = v


def test_finish_and_wait_time_out_while_the_lock_is_held_elsewhere():
    x = np.zeros(2)
    with Queue("cpu0") as q:
        gate = events.UserEvent()
        ev = q.enqueue(fill, 2, x, 1.0, wait_for=gate)
        raised = []

        def waiter(call):
            try:
                call()
            except HetflowTimeoutError as exc:
                raised.append(exc)

        with events.LOCK:  # as a deadlocked thread would hold it
            threads = [threading.Thread(target=waiter, args=(call,), daemon=True)
                       for call in (lambda: q.finish(timeout=0.2), lambda: ev.wait(0.2))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(10)
            alive = [t.is_alive() for t in threads]
        for t in threads:
            t.join(10)
        assert alive == [False, False] and len(raised) == 2, (alive, raised)
        gate.set_complete()
    np.testing.assert_array_equal(x, 1.0)
