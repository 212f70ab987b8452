"""Another process that loads a GPU on demand (for the benchmarks that adapt to it).

The process runs, in a loop between a "go" and a "stop" read from its standard input,
steps of a float32 matmul of ``size``^2 beside ``copy_mb`` MiB copied to the GPU and as
much back, each on a stream of its own, and reports how many steps it ran. The copies
go through page-locked host memory, so they run at the bus's speed: a loop over host
arrays, which the bus bounds, feels the load as much as a kernel that computes does.
"""
from __future__ import annotations

import subprocess
import sys
import threading

from hetflow.errors import DeviceError

HOG = r"""
import os, select, sys
import cupy as cp
import numpy as np
ordinal, size, copy_mb = (int(a) for a in sys.argv[1:4])
cp.cuda.Device(ordinal).use()
a = cp.random.random((size, size), dtype=cp.float32)
b = cp.random.random((size, size), dtype=cp.float32)
count = copy_mb << 18
up_host, down_host = (np.frombuffer(cp.cuda.alloc_pinned_memory(count * 4), np.float32, count)
                      for _ in range(2))
up_host[...] = 1.0
up_dev, down_dev = cp.empty(count, cp.float32), cp.ones(count, cp.float32)
streams = [cp.cuda.Stream(non_blocking=True) for _ in range(3)]
pending = []

def step():
    with streams[0]:
        a @ b
    up_dev.set(up_host, stream=streams[1])
    down_dev.get(stream=streams[2], out=down_host, blocking=False)
    for s in streams:
        s.synchronize()

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
    """Another process that, on demand, keeps the GPU busy with matmuls and its bus with copies."""

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
