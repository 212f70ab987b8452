"""Run under mpiexec by tests/test_distributed.py: a rank that dies stops the run.

``python rank_faults.py MODE``: every rank joins an allreduce, then rank 1 dies while
the others are in the next one. MODE says how:
  raise: an exception in user code, outside any hetflow call (nobody catches it);
  thread: the same in a thread of rank 1 (its main thread then waits forever);
  exit: the process ends at once without a word (os._exit: no handler runs);
  kill: SIGKILL.
Survivors that notice print "rank R: CommError: ..." before their error ends the run.
"""
import os
import signal
import sys
import threading
import time

import numpy as np

from hetflow import collectives
from hetflow.errors import CommError

mode = sys.argv[1]
comm = collectives.world()
comm.allreduce(np.ones(8))
if comm.rank == 1:
    time.sleep(0.5)  # the others are in the allreduce by now
    if mode == "raise":
        raise ValueError("user code broke on rank 1")
    if mode == "thread":
        threading.Thread(target=lambda: 1 / 0, name="helper").start()
        threading.Event().wait()
    if mode == "exit":
        os._exit(7)
    os.kill(os.getpid(), signal.SIGKILL)
try:
    comm.allreduce(np.ones(8))
except CommError as exc:
    print(f"rank {comm.rank}: CommError: {exc}", flush=True)
    raise
raise AssertionError(f"rank {comm.rank}: the allreduce completed without rank 1")
