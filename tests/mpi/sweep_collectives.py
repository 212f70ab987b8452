"""Run under mpiexec by tests/test_mpi_sweep.py: collectives misused across ranks.

``python sweep_collectives.py MODE``:
  shapes: ranks pass arrays of one length but other shapes (native, small and pipelined
      sizes, a user op, a reduce); every rank must raise CommError naming the shapes, and
      the communicator must then reduce right (against mpi4py's own Allreduce);
  first-call: the last rank never calls world(); the others' first call must raise
      CommTimeoutError within its 2 s timeout naming the first call, and their next one
      CommError, never hang in MPI_Comm_dup.
Each rank prints "rank R: MODE ok".
"""
import os
import sys
import time

import numpy as np
from oracle import expect


def shapes(rank):
    from mpi4py import MPI

    from hetflow import collectives
    from hetflow.errors import CommError

    comm = collectives.world(timeout=10)
    # (rows, columns) that differ on rank 0, with one element count everywhere
    for rows, cols, op in [(2, 3, "sum"), (64, 200, "max"), (300, 1000, "sum"), (2, 3, np.fmax)]:
        shape = (cols, rows) if rank == 0 else (rows, cols)
        x = np.full(shape, rank + 1.0)
        expect(CommError, lambda: comm.allreduce(x, op=op), "ranks disagree on shape",
               f"rank 0: ({cols}, {rows})", f"rank 1: ({rows}, {cols})")
    flat = np.arange(6.0) if rank == 0 else np.arange(6.0).reshape(2, 3)
    expect(CommError, lambda: comm.reduce(flat, root=1), "ranks disagree on shape", "rank 0: (6,)")
    x = np.arange(12.0).reshape(3, 4) * (rank + 1)
    want = np.empty_like(x)
    MPI.COMM_WORLD.Allreduce(x, want, op=MPI.SUM)
    np.testing.assert_array_equal(comm.allreduce(x), want)


def first_call(rank, size):
    if rank == size - 1:
        from mpi4py import MPI  # noqa: F401  joins the run, but never calls world()

        time.sleep(4)
        return
    import hetflow
    from hetflow.errors import CommError, CommTimeoutError

    began = time.monotonic()
    expect(CommTimeoutError, lambda: hetflow.world(timeout=2), f"world() on rank {rank}",
           "the first call of world() on every rank", "no answer within 2 s")
    assert time.monotonic() - began < 3.5, time.monotonic() - began
    expect(CommError, hetflow.world, "world() failed on its first call")


if __name__ == "__main__":
    mode = sys.argv[1]
    rank, size = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
    if mode == "shapes":
        shapes(rank)
    else:
        first_call(rank, size)
    print(f"rank {rank}: {mode} ok", flush=True)
