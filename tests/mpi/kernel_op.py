"""Run under mpiexec by tests/test_collectives.py: a hetflow kernel as the reduction op.

The kernel's results are compared with MPI's own Allreduce (MAX, and SUM of squares
merged by a kernel that adds). Rank 0 prints "kernel op ok".
"""
import numpy as np
from mpi4py import MPI

import hetflow
from hetflow import collectives


@hetflow.kernel
def bigger(i, a, b, out):
    out[i] = max(a[i], b[i])


@hetflow.kernel
def add(i, a, b, out):
    out[i] = a[i] + b[i]


def main():
    comm = collectives.world(timeout=60)
    rng = np.random.default_rng(comm.rank)
    for n in (1, 13, 5003, 100_003):  # small path and pipelined path
        x = rng.integers(-1000, 1000, n).astype(np.int64)
        want = np.empty_like(x)
        MPI.COMM_WORLD.Allreduce(x, want, op=MPI.MAX)
        np.testing.assert_array_equal(comm.allreduce(x, op=bigger), want)
        y = rng.random(n)
        want = np.empty_like(y)
        MPI.COMM_WORLD.Allreduce(y, want, op=MPI.SUM)
        got = comm.reduce(y, op=add, root=comm.size - 1)
        if comm.rank == comm.size - 1:
            np.testing.assert_allclose(got, want, rtol=1e-12)
    if comm.rank == 0:
        print("kernel op ok", flush=True)


if __name__ == "__main__":
    main()
