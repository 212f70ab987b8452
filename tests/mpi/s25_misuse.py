"""Run under mpiexec -n K by tests/test_s25_mpi_robustness.py: calls that fail on some
ranks only, or differ between ranks, fail every rank with the same error, promptly.

Launches over fewer rows than ranks (the last rank has none) whose part fails where
it runs (an element type the CPU cannot run, a scalar the kernel subscripts, a kernel
that does not compile, a kernel that raises on one rank's rows); launches, reductions
and re-cuts that differ between ranks; arrays with no elements reduced as NumPy
reduces them; an array made like another on one rank only. After each misuse a collective proves every rank is still in step, and
a good launch is checked against NumPy on the gathered array. Rank R prints
"rank R: misuse ok".

``python s25_misuse.py program``: a captured program whose part fails on the ranks with
rows stops the run; the last rank, which has none, raises RemoteError naming one of
them instead of waiting for their rows. Rank R prints "rank R: program ok".
"""
import sys
import time

import numpy as np

import hetflow
from hetflow import cluster, collectives
from hetflow.errors import ArgumentError, ArgumentTypeError, CommError, KernelCompileError, KernelRaisedError, \
    RemoteError, ShapeError
from oracle import expect


@hetflow.kernel
def copy(i, out, src):
    out[i] = src[i]


@hetflow.kernel
def add_w(i, out, src, w):
    out[i] = src[i] + w[i]


@hetflow.kernel
def broken(i, out, src):
    out[i] = no_such_function(src[i])  # noqa: F821


@hetflow.kernel
def checked_sqrt(i, out, src):
    if src[i] < 0:
        raise ValueError("a negative value")
    out[i] = np.sqrt(src[i])


def failing_everywhere(comm, error, call, *words):
    """The ``error`` with ``words`` that ``call()`` raises on every rank, well before the
    timeout; the ranks are still in step after it."""
    start = time.monotonic()
    err = expect(error, call, *words)
    assert time.monotonic() - start < comm_timeout / 2, time.monotonic() - start
    assert cluster.zeros(comm.size, comm=comm).sum() == 0.0
    return err


def rowless_launches(comm):
    """A launch of size - 1 rows: the last rank has none, yet raises the others' error."""
    size = comm.size
    ranks = ("ranks " if size > 2 else "rank ") + ", ".join(map(str, range(size - 1)))
    half = cluster.zeros(size, dtype=np.float16, comm=comm)
    failing_everywhere(comm, ArgumentTypeError, lambda: cluster.forall(size - 1, copy, cluster.zeros_like(half), half),
                       f"distributed forall of 'copy' failed on {ranks} (of {size}): kernel 'copy' argument "
                       f"'out': element type float16 is not supported on cpu0")
    u = cluster.asarray(np.arange(float(size)), comm=comm)
    v = cluster.zeros_like(u)
    failing_everywhere(comm, ArgumentTypeError, lambda: cluster.forall(size - 1, add_w, v, u, 1.0),
                       f"distributed forall of 'add_w' failed on {ranks} (of {size}): kernel 'add_w' argument "
                       f"'w': float 1.0 is a scalar, but the kernel subscripts it")
    failing_everywhere(comm, KernelCompileError, lambda: cluster.forall(size - 1, broken, v, u),
                       f"distributed forall of 'broken' failed on {ranks} (of {size}): kernel 'broken'",
                       "failed to compile")
    # a kernel that raises on rank 0's rows only, read through a cshift (halos exchanged first)
    x = np.arange(float(size)) - 0.5  # only row 0 is negative
    w = cluster.asarray(np.roll(x, 1), like=u)
    failing_everywhere(comm, KernelRaisedError,
                       lambda: cluster.forall(size, checked_sqrt, v, hetflow.cshift(w, 0, 1)),
                       f"distributed forall of 'checked_sqrt' failed on rank 0 (of {size}): kernel 'checked_sqrt' "
                       f"raised ValueError", "a negative value")
    y = cluster.asarray(np.arange(float(size)), like=u)
    cluster.forall(size, checked_sqrt, v, hetflow.cshift(y, 0, 1))  # the same launch, good data
    np.testing.assert_allclose(v.allgather(), np.sqrt(np.roll(np.arange(float(size)), -1)), rtol=1e-15)


def launches_that_differ(comm):
    size = comm.size
    u = cluster.asarray(np.arange(2.0 * size), comm=comm)
    v = cluster.zeros_like(u)
    rows = 2 * size - (comm.rank == 0)
    calls = "; ".join(f"rank {r}: ('copy', " for r in range(size))
    err = expect(CommError, lambda: cluster.forall(rows, copy, v, u), "distributed forall of 'copy': the ranks made "
                 "different calls (rank 0: ('copy', ")
    assert str(err).count("('copy', ") == size and calls.split("; ")[-1] in str(err), str(err)
    assert f"({2 * size - 1},)" in str(err) and f"({2 * size},)" in str(err), str(err)
    # with halos to exchange: the check comes before the transfers
    expect(CommError, lambda: cluster.forall(rows, copy, hetflow.section(v, (0,), (rows,)),
                                             hetflow.section(hetflow.cshift(u, 0, 1), (0,), (rows,))),
           "distributed forall of 'copy': the ranks made different calls")
    # a host array on rank 0 only: its plan fails, the others' does not
    src = np.zeros(2 * size) if comm.rank == 0 else u
    failing_everywhere(comm, ShapeError, lambda: cluster.forall(2 * size, copy, v, src),
                       f"distributed forall of 'copy' failed on rank 0 (of {size}): distributed forall of 'copy': "
                       f"argument src is a ndarray, not a distributed array")
    cluster.forall(2 * size, copy, v, hetflow.cshift(u, 0, 1))
    np.testing.assert_array_equal(v.allgather(), np.roll(np.arange(2.0 * size), -1))


def reductions_that_differ(comm):
    x = np.arange(3.0 * comm.size)
    u = cluster.asarray(x, comm=comm)
    for _ in range(3):  # agreed and prepared: the collective no longer checks its repetitions
        assert u.sum() == x.sum()
    failing_everywhere(comm, ArgumentError, lambda: u.reduce("median" if comm.rank == 0 else "sum"),
                       f"{u.name}.reduce failed on rank 0 (of {comm.size}): unknown reduction op 'median'")
    failing_everywhere(comm, CommError, lambda: u.reduce("max" if comm.rank == 0 else "sum"),
                       f"{u.name}.reduce: the ranks made different calls (rank 0: ('{u.name}', 'max'); "
                       f"rank 1: ('{u.name}', 'sum')")
    assert u.max() == x.max() and u.sum() == x.sum()


def recuts_that_differ(comm):
    size = comm.size
    u = cluster.asarray(np.arange(4.0 * size), comm=comm)
    sizes = [4] * size
    sizes[0], sizes[-1] = (5, 3) if comm.rank == 0 else (3, 5)
    failing_everywhere(comm, CommError, lambda: u.distribution.resize(sizes),
                       f"resizing the blocks of {4 * size} rows: the ranks made different calls")
    bad = [4] * size if comm.rank else [4] * (size - 1) + [5]
    failing_everywhere(comm, ShapeError, lambda: u.distribution.resize(bad),
                       f"resizing the blocks of {4 * size} rows failed on rank 0 (of {size}): a partition of "
                       f"{4 * size} rows over {size} ranks needs {size} sizes adding up to {4 * size}")
    assert u.distribution.sizes == (4,) * size
    u.distribution.resize([3] + [4] * (size - 2) + [5])
    np.testing.assert_array_equal(u.allgather(), np.arange(4.0 * size))


def arrays_on_other_distributions(comm):
    """An array made like another on rank 0 only: alike in every other way, it would not
    move with that one on the other ranks."""
    u = cluster.zeros((2 * comm.size, 3), comm=comm)
    x = np.zeros((2 * comm.size, 3))
    err = failing_everywhere(comm, CommError, lambda: cluster.asarray(x, like=u) if comm.rank == 0
                             else cluster.asarray(x, comm=comm),
                             "ranks made different distributed arrays as", "(shape, dtype, dim, halo, blocks, place, "
                             "distribution): rank 0: ((", f"\"{u.name}'s\")")
    assert str(err).count(f"{u.name}'s") == 1, str(err)


def empty_arrays(comm):
    size = comm.size
    for dtype, ops in ((np.float64, ("sum", "prod")), (np.int8, ("sum", "prod", "band")), (np.bool_, ("land", "lor"))):
        x = np.zeros((size, 0), dtype)
        a = cluster.asarray(x, comm=comm)
        for op in ops:
            ufunc = {"sum": np.add, "prod": np.multiply, "band": np.bitwise_and, "land": np.logical_and,
                     "lor": np.logical_or}[op]
            got, want = a.reduce(op), ufunc.reduce(x, axis=None)
            assert got == want and got.dtype == want.dtype, (dtype, op, got, want)
        failing_everywhere(comm, ShapeError, a.min, f"{a.name}.reduce: {a.name} ({size}, 0) has no elements, "
                           f"and op 'min' has no identity on {np.dtype(dtype)}")
    failing_everywhere(comm, ArgumentTypeError, lambda: cluster.zeros((size, 3), dim=True, comm=comm),
                       "distributed array: dim must be an integer, got True")


def rowless_program(comm):
    """Launches of size - 1 rows over float16 arrays, captured and run as a program."""
    size = comm.size
    u = cluster.zeros(size, dtype=np.float16, comm=comm)
    v = cluster.zeros_like(u)
    first = (0,), (size - 1,)
    with hetflow.graph("rowless") as g:
        cluster.forall(size - 1, copy, hetflow.section(v, *first), hetflow.section(hetflow.cshift(u, 0, 1), *first))
        cluster.forall(size - 1, copy, hetflow.section(u, *first), hetflow.section(hetflow.cshift(v, 0, 1), *first))
    program = cluster.DistributedProgram(g)
    start = time.monotonic()
    if comm.rank == size - 1:
        err = expect(RemoteError, lambda: program.run(2), "raised ArgumentTypeError",
                     "element type float16 is not supported on cpu0")
        assert any(f"rank {r} raised" in str(err) for r in range(size - 1)), str(err)  # one with rows
    else:
        expect(ArgumentTypeError, lambda: program.run(2), "element type float16 is not supported on cpu0")
    assert time.monotonic() - start < comm_timeout / 2, time.monotonic() - start


comm_timeout = 20


def main(what):
    comm = collectives.world(timeout=comm_timeout)
    if what == "program":
        rowless_program(comm)
    else:
        for check in (rowless_launches, launches_that_differ, reductions_that_differ, recuts_that_differ,
                      arrays_on_other_distributions, empty_arrays):
            check(comm)
    print(f"rank {comm.rank}: {what} ok", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "misuse")
