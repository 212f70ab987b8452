"""Another process that loads a GPU on demand (for the benchmarks that adapt to it).

The process runs float32 matmuls of ``size``^2 and ``copy_mb`` MiB host-to-device
copies in a loop between a "go" and a "stop" read from its standard input, and reports
how many loop steps it ran.
"""
from __future__ import annotations

import subprocess
import sys
import threading

from hetflow.errors import DeviceError

HOG = r"""
import os, select, sys
import cupy as cp
ordinal, size, copy_mb = (int(a) for a in sys.argv[1:4])
cp.cuda.Device(ordinal).use()
a = cp.random.random((size, size), dtype=cp.float32)
b = cp.random.random((size, size), dtype=cp.float32)
host = cp.asnumpy(cp.ones(copy_mb << 18, dtype=cp.float32))
dev = cp.empty(host.shape, host.dtype)
pending = []

def step():
    a @ b
    dev.set(host)
    cp.cuda.Device().synchronize()

def command():
    while not pending:
        data = os.read(0, 64).decode()
        if not data:
            return "quit"
        pending.extend(data.split())
    return pending.pop(0)

step()
print("ready", flush=True)
while command() == "go":
    count = 0
    while not pending and not select.select([0], [], [], 0)[0]:
        step()
        count += 1
    command()                          # "stop" (or end of input)
    print(f"idle {count}", flush=True)
"""


class GpuHog:
    """Another process that, on demand, keeps the GPU busy with matmuls and copies."""

    def __init__(self, ordinal, size, copy_mb):
        self.proc = subprocess.Popen([sys.executable, "-c", HOG, str(ordinal), str(size), str(copy_mb)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, bufsize=1)
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            self.close()
            raise DeviceError(f"the GPU load process did not start: {self.proc.stderr.read()[-2000:]}")

    def _send(self, command):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def during(self, run, delay):
        """Run ``run()`` with the load starting ``delay`` s after it; (result, load steps)."""
        started = threading.Event()

        def go():
            self._send("go")
            started.set()

        timer = threading.Timer(delay, go)
        timer.start()
        try:
            result = run()
        finally:
            timer.cancel()
            timer.join()
            steps = 0
            if started.is_set():
                self._send("stop")
                steps = int(self.proc.stdout.readline().split()[1])
        return result, steps

    def close(self):
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
