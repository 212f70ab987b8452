"""Run under mpiexec -n K by tests/test_s26_mpi_dtypes.py: structured dtypes of one
size but other fields ('|V16' both) count as different dtypes across ranks.

``python s26_dtypes.py fields``: asarray of x whose fields differ on rank 0, and
zeros whose dtype's fields differ on rank 0, fail every rank with CommError naming
each rank's dtype; the ranks stay in step after it. asarray of a structured x from
root 0 keeps its fields (checked against NumPy). Rank R prints "rank R: fields ok".
"""
import sys

import numpy as np

from hetflow import cluster, collectives
from hetflow.errors import CommError
from oracle import expect

PAIRS = np.dtype([("a", "f8"), ("b", "i8")])
SWAPPED = np.dtype([("x", "i8"), ("y", "f8")])  # also '|V16', and zeros have the same bytes


def in_step(comm):
    x = np.arange(2.0 * comm.size)
    np.testing.assert_array_equal(cluster.asarray(x, comm=comm).allgather(), x)


def fields(comm):
    n = 4 * comm.size
    mine = SWAPPED if comm.rank == 0 else PAIRS
    assert mine.str == PAIRS.str  # what the ranks compared before
    expect(CommError, lambda: cluster.asarray(np.zeros(n, mine), comm=comm),
           "its shape or dtype differs between ranks",
           f"rank 0: ({n},) {SWAPPED}", f"rank 1: ({n},) {PAIRS}")
    in_step(comm)
    expect(CommError, lambda: cluster.zeros(n, mine, comm=comm),
           "ranks made different distributed arrays as", repr(SWAPPED), repr(PAIRS))
    in_step(comm)
    x = np.zeros(n, PAIRS)
    if comm.rank == 0:
        x["a"], x["b"] = np.arange(n) / 2, np.arange(n) * 3
    got = cluster.asarray(x, root=0, comm=comm).allgather()
    assert got.dtype == PAIRS, got.dtype
    np.testing.assert_array_equal(got["a"], np.arange(n) / 2)
    np.testing.assert_array_equal(got["b"], np.arange(n) * 3)


def main(mode):
    comm = collectives.world(timeout=20)
    {"fields": fields}[mode](comm)
    print(f"rank {comm.rank}: {mode} ok", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
