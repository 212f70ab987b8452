"""Run under mpiexec -n K by tests/test_s26_mpi.py: misuse by some ranks only fails
every rank with a hetflow error naming the rank, promptly (well within the timeout),
and the ranks stay in step after it (checked against NumPy).

``python s26_sweep.py arrays``: asarray with other values, shapes or dtypes on one rank;
arrays whose own checks fail on one rank only (its shape leaves a rank no rows, an
element type of Python objects). Rank R prints "rank R: arrays ok".
``python s26_sweep.py order``: ranks calling different collectives (allreduce and bcast,
allgather and barrier) fail every rank, naming each rank's call; the ranks are still in
step after it (checked against plain Python). Rank R prints "rank R: order ok".
``python s26_sweep.py world``: inside cluster.distributed(), rank 1 raises while the
others wait in an allreduce of hetflow.world() (not the session's communicator): they
raise its error within a second, as in the cluster's own calls. Rank R prints
"rank R: world ok".
"""
import sys
import time

import numpy as np

from hetflow import cluster, collectives
from hetflow.errors import ArgumentTypeError, CommError, RemoteError, ShapeError
from oracle import expect

TIMEOUT = 20


def promptly(comm, error, call, *words):
    """The ``error`` with ``words`` that ``call()`` raises on every rank, well before the
    timeout; the ranks are still in step after it."""
    start = time.monotonic()
    err = expect(error, call, *words)
    assert time.monotonic() - start < TIMEOUT / 2, time.monotonic() - start
    x = np.arange(2.0 * comm.size)
    np.testing.assert_array_equal(cluster.asarray(x, comm=comm).allgather(), x)
    return err


def arrays(comm):
    size, last = comm.size, comm.size - 1
    x = np.arange(4.0 * size)
    mine = x + (comm.rank == last)  # the last rank's values differ
    others = ", ".join(map(str, range(last)))
    promptly(comm, CommError, lambda: cluster.asarray(mine, comm=comm),
             "cluster.asarray: every rank must pass the same x, but its values differ between ranks "
             f"(rank{'s' if last > 1 else ''} {others} | rank {last}; alike within each group", "root=r")
    y = x.astype(np.float32) if comm.rank == 0 else x
    promptly(comm, CommError, lambda: cluster.asarray(y, comm=comm),
             f"its shape or dtype differs between ranks (rank 0: ({4 * size},) float32; rank 1: ({4 * size},) float64")
    # a structured element's padding holds anything: only its fields count
    record = np.dtype([("a", "u1"), ("b", "f8")], align=True)
    s = np.empty(3 * size, record)
    s.view(np.uint8)[:] = comm.rank  # padding differs by rank
    s["a"], s["b"] = np.arange(3 * size), 0.5
    got = cluster.asarray(s, comm=comm).allgather()
    np.testing.assert_array_equal(got["a"], np.arange(3 * size))
    np.testing.assert_array_equal(got["b"], 0.5)
    # the last rank's own check fails: a shape leaving a rank no rows
    rows = 1 if comm.rank == last else 4 * size
    promptly(comm, ShapeError, lambda: cluster.zeros(rows, comm=comm),
             f"making a distributed array failed on rank {last} (of {size}): distributing 1 rows over {size} ranks")
    kind = object if comm.rank == 0 else np.float64
    promptly(comm, ArgumentTypeError, lambda: cluster.zeros(4 * size, dtype=kind, comm=comm),
             f"making a distributed array failed on rank 0 (of {size}): ", "Python objects")


def world(comm):
    def body():
        if comm.rank == 1:
            time.sleep(0.2)  # the others are waiting in the allreduce by now
            raise ShapeError("injected on rank 1")
        comm.allreduce(np.ones(3))

    start = time.monotonic()
    if comm.rank == 1:
        expect(ShapeError, lambda: cluster.run_distributed(body, comm=comm), "injected on rank 1")
    else:
        err = expect(ShapeError, lambda: cluster.run_distributed(body, comm=comm),
                     "rank 1 raised ShapeError: injected on rank 1")
        assert isinstance(err, RemoteError), type(err).__mro__
    assert time.monotonic() - start < 2, time.monotonic() - start
    time.sleep(2)  # rank 1 has not ended: the others heard its notice, not its end


def order(comm):
    """Ranks that call different collectives at one point (each signature's first call)."""
    first = (lambda: comm.allreduce(np.ones(3))) if comm.rank == 0 else (lambda: comm.bcast(1))
    others = ", ".join(f"rank {r}: bcast" for r in range(1, comm.size))
    promptly(comm, CommError, first, f"ranks called different collectives (rank 0: allreduce, {others})")
    odd = (lambda: comm.barrier()) if comm.rank == comm.size - 1 else (lambda: comm.allgather(comm.rank))
    promptly(comm, CommError, odd, "ranks called different collectives (rank 0: allgather", "barrier)")
    np.testing.assert_array_equal(comm.allreduce(np.full(3, comm.rank)), np.full(3, sum(range(comm.size))))
    assert comm.allgather(comm.rank) == list(range(comm.size)) and comm.bcast(comm.rank, root=1) == 1


def main(mode):
    comm = collectives.world(timeout=TIMEOUT)
    {"arrays": arrays, "world": world, "order": order}[mode](comm)
    print(f"rank {comm.rank}: {mode} ok", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
