"""Ctrl-C during a long co-executed forall: the workers stop and KeyboardInterrupt
reaches the caller soon, not when the loop ends; the runtime stays usable.

A child process starts a loop that would run about a minute (every CPU worker holds
one chunk of costly rows, which used to run to its end before the stop was seen), gets
SIGINT, and must report the KeyboardInterrupt well before that; then, in the same
process, a follow-up forall is checked against NumPy.
"""
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

CHILD = textwrap.dedent("""
    import signal, sys, threading, time
    import numpy as np
    import hetflow

    # Python leaves SIGINT ignored when it starts with it ignored (a suite run as a
    # background job): Ctrl-C must raise KeyboardInterrupt here all the same.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    @hetflow.kernel
    def costly(i, reps, x, out):
        acc = 0.0
        k = 0
        while k < reps[i]:
            acc += (x[i] + k) * 1e-9
            k += 1
        out[i] = acc

    def oracle(reps, x):
        acc = np.zeros_like(x)
        for k in range(int(reps.max(initial=0))):
            acc = np.where(k < reps, acc + (x + k) * 1e-9, acc)
        return acc

    def arrays(cpu_rows, gpu_rows, cpu_reps, gpu_reps):
        reps = np.concatenate([np.full(cpu_rows, cpu_reps), np.full(gpu_rows, gpu_reps)])
        x = np.linspace(0.0, 1.0, cpu_rows + gpu_rows)
        return reps.astype(np.int64), x, np.zeros_like(x)

    mode = sys.argv[1]
    cores = hetflow.get_device("cpu0").compute_units
    if mode == "cpu":
        opts = dict(device="cpu0", schedule="steal")
        cpu_workers, gpu_rows = cores, 0
    else:                 # the simulated GPU: cheap rows of its own, in 64-row chunks
        opts = dict(device=["cpu0", "gpu0"], schedule="steal")
        cpu_workers, gpu_rows = max(1, cores - 1), 64 * 400
    # About a minute per CPU worker: one 32768-row chunk each (the smallest CPU chunk).
    cpu_rows = 32768 * cpu_workers
    shares = dict(shares=[cpu_rows, gpu_rows]) if gpu_rows else {}

    small = arrays(40, 24 if gpu_rows else 0, 3, 2)
    hetflow.forall(small[0].shape[0], costly, *small, **opts)  # compile on every device
    reps, x, out = arrays(cpu_rows, gpu_rows, 2_400_000, 40)
    print("ready", flush=True)
    try:
        hetflow.forall(cpu_rows + gpu_rows, costly, reps, x, out, **opts, **shares)
        print("finished", flush=True)
    except KeyboardInterrupt:
        busy = [t.name for t in threading.enumerate()
                if t.name.startswith("hetflow-") and t.name != "hetflow-idle"]
        print("interrupted; workers still running:", busy, flush=True)
    reps, x, out = arrays(500, 300 if gpu_rows else 0, 5, 4)
    hetflow.forall(out.shape[0], costly, reps, x, out, **opts)
    np.testing.assert_allclose(out, oracle(reps, x), rtol=1e-12)
    print("follow-up ok", flush=True)
""")

BOUND_S = 10.0  # after SIGINT; the loop itself would run about a minute


def _lines(proc):
    """The child's stdout lines on a queue (None at the end), read by a thread."""
    q = queue.Queue()

    def pump():
        for line in proc.stdout:
            q.put(line.rstrip("\n"))
        q.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return q


def _next(q, timeout):
    try:
        return q.get(timeout=timeout)
    except queue.Empty:
        return f"(nothing within {timeout} s)"


@pytest.mark.parametrize("mode", ["cpu", pytest.param("cpu+gpu", marks=pytest.mark.simgpu)])
def test_ctrl_c_stops_a_long_co_executed_forall_and_the_runtime_stays_usable(tmp_path, mode):
    script = tmp_path / "child.py"  # kernels need a source file
    script.write_text(CHILD)
    stderr = tmp_path / "stderr"
    with open(stderr, "w") as errors:
        proc = subprocess.Popen([sys.executable, str(script), mode], stdout=subprocess.PIPE,
                                stderr=errors, text=True)
    try:
        lines = _lines(proc)
        assert _next(lines, 120) == "ready", stderr.read_text()
        time.sleep(1.0)                  # the loop is under way: binding takes microseconds
        proc.send_signal(signal.SIGINT)
        sent = time.perf_counter()
        line = _next(lines, BOUND_S)
        assert line == "interrupted; workers still running: []", (line, time.perf_counter() - sent)
        assert _next(lines, 60) == "follow-up ok", stderr.read_text()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
