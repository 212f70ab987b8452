"""Run under mpiexec -n K by tests/test_s26_mpi.py: a failure on one rank raises, on every
other rank, an error of the failing rank's hetflow class naming that rank and carrying
its message (also a RemoteError); a failure of another class is a plain RemoteError
saying which class it was.

``python s26_remote.py MODE``, MODE one of
  program: a captured program whose kernel raises on rank 1's rows only (KernelRaisedError,
      naming the program's graph);
  shape: rank 1 raises ShapeError inside cluster.distributed() while the others reduce;
  foreign: rank 1 raises ValueError there (no hetflow class: RemoteError elsewhere).
Rank R prints "rank R: MODE ok".
"""
import sys
import time

import numpy as np

import hetflow
from hetflow import cluster, collectives
from hetflow.errors import CommError, KernelRaisedError, RemoteError, ShapeError
from oracle import expect

TIMEOUT = 20


@hetflow.kernel
def checked_sqrt(i, out, src):
    if src[i] < 0:
        raise ValueError("a negative value")
    out[i] = np.sqrt(src[i])


def program(comm):
    n = 4 * comm.size
    x = np.arange(float(n))
    x[5] = -1.0  # read by rank 1's row 4 only
    u = cluster.asarray(x, comm=comm)
    v = cluster.zeros_like(u)
    with hetflow.graph("sqrt") as g:  # the others wait for rank 1 at its halo rows or report
        cluster.forall(n, checked_sqrt, v, hetflow.cshift(u, 0, 1))
    run = cluster.DistributedProgram(g).run
    if comm.rank == 1:
        return expect(KernelRaisedError, lambda: run(5), "graph 'sqrt' ", "kernel 'checked_sqrt' raised ValueError",
                      "a negative value")
    err = expect(KernelRaisedError, lambda: run(5), "rank 1 raised KernelRaisedError: graph 'sqrt' ",
                 "kernel 'checked_sqrt' raised ValueError", "a negative value")
    assert isinstance(err, RemoteError), type(err).__mro__


def shape(comm):
    def body():
        u = cluster.asarray(np.arange(2.0 * comm.size), comm=comm)
        if comm.rank == 1:
            hetflow.section(np.zeros(4), (3,), (2,))  # out of range: ShapeError on rank 1 only
        u.sum()

    if comm.rank == 1:
        return expect(ShapeError, lambda: cluster.run_distributed(body, comm=comm), "section")
    err = expect(ShapeError, lambda: cluster.run_distributed(body, comm=comm), "rank 1 raised ShapeError: ", "section")
    assert isinstance(err, RemoteError), type(err).__mro__


def foreign(comm):
    def body():
        u = cluster.asarray(np.arange(2.0 * comm.size), comm=comm)
        if comm.rank == 1:
            raise ValueError("injected on rank 1")
        u.sum()

    if comm.rank == 1:
        return expect(ValueError, lambda: cluster.run_distributed(body, comm=comm), "injected on rank 1")
    err = expect(RemoteError, lambda: cluster.run_distributed(body, comm=comm), "rank 1 raised ValueError: injected")
    assert not isinstance(err, ValueError), type(err).__mro__


def main(mode):
    comm = collectives.world(timeout=TIMEOUT)
    start = time.monotonic()
    {"program": program, "shape": shape, "foreign": foreign}[mode](comm)
    assert time.monotonic() - start < TIMEOUT / 2, time.monotonic() - start
    # the run is stopped everywhere: later calls are refused at once, as CommError
    err = expect(CommError, lambda: cluster.asarray([1.0, 2.0, 3.0, 4.0], comm=comm))
    assert not isinstance(err, (ShapeError, KernelRaisedError)), type(err).__mro__
    print(f"rank {comm.rank}: {mode} ok", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
