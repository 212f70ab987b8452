"""Run under mpiexec by tests/test_s25_mpi_robustness.py: a rank whose program ends early.

``python s25_ended.py MODE``: every rank joins an allreduce and makes a distributed
array; then rank 1's program ends while the others wait for it. MODE says where:
  exit1 / exit0: sys.exit(1) / sys.exit(0) while the others are in an allreduce;
  halo: sys.exit(0) while the others exchange halos with it;
  late: rank 1 ends after its last call and rank 2 is slow to make its own: the others'
      waits do not need rank 1 any more, and must not fail on its account.
The others print "rank R: MODE ok" once their wait failed with CommError naming rank 1
(late: once their calls completed with the right results), well before the comm timeout.
"""
import sys
import time

import numpy as np

from hetflow import cluster, collectives
from hetflow.errors import CommError
from oracle import expect

mode = sys.argv[1]
comm = collectives.world()  # the default timeout (300 s): ending soon owes nothing to it
u = cluster.asarray(np.arange(6.0 * comm.size), comm=comm)
comm.allreduce(np.ones(8))
start = time.monotonic()
if mode == "late":
    if comm.rank == 2:
        time.sleep(3)  # rank 1 has ended by now
    total = comm.reduce(np.arange(4.0) + comm.rank, root=0)
    whole = u.gather()
    if comm.rank == 0:
        np.testing.assert_array_equal(total, sum(np.arange(4.0) + r for r in range(comm.size)))
        np.testing.assert_array_equal(whole, np.arange(6.0 * comm.size))
    print(f"rank {comm.rank}: {mode} ok", flush=True)
    sys.exit(0)
if comm.rank == 1:
    time.sleep(0.5)  # the others are waiting by now
    sys.exit(1 if mode == "exit1" else 0)
call = u.exchange_halos if mode == "halo" else lambda: comm.allreduce(np.ones(8))
expect(CommError, call, f"rank {comm.rank}: rank 1 ended its program", "the run cannot go on without it")
assert time.monotonic() - start < 10, time.monotonic() - start
print(f"rank {comm.rank}: {mode} ok", flush=True)
