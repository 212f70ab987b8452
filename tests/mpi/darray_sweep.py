"""Run under mpiexec -n K by tests/test_darray_sweep.py: distributed arrays of every rank
and dtype, their views read by kernels, reductions, gathers and scatters, rows moved,
programs run again, and misuse, each against NumPy on the whole array.

Row counts are not divisible by the ranks (down to one row per rank); cshifts along
dim 0 wrap at the array's ends, which lie on the first and the last rank. Every misuse
must fail on every rank with a hetflow error naming what was wrong, after which the
ranks go on together (a collective proves none is left waiting). Rank R prints
"rank R: darray sweep ok".
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import heat_distributed as heat  # noqa: E402

import hetflow  # noqa: E402
from hetflow import cluster, collectives  # noqa: E402
from hetflow.errors import ArgumentTypeError, CommError, ShapeError  # noqa: E402
from oracle import expect  # noqa: E402


@hetflow.kernel
def copy1(i, out, src):
    out[i] = src[i]


@hetflow.kernel
def copy2(i, j, out, src):
    out[i, j] = src[i, j]


@hetflow.kernel
def copy3(i, j, k, out, src):
    out[i, j, k] = src[i, j, k]


COPY = {1: copy1, 2: copy2, 3: copy3}


def copied(out, into, view, extent):
    """``out`` as every rank sees it after a copy of ``view`` into ``into`` (``out`` or
    a view of it)."""
    cluster.forall(extent, COPY[len(extent)], into, view)
    return out.allgather()


def shifted(u, dim, shift):
    """The whole of ``cshift(u, dim, shift)``, read by a kernel."""
    out = cluster.zeros_like(u)
    return copied(out, out, hetflow.cshift(u, dim, shift), u.shape)


def check_cshifts(comm):
    """Every dim, shifts of one row and of more than the array (ends on other ranks)."""
    size = comm.size
    for shape in ((2 * size + 1,), (size + 2, 3), (size, 3, 2)):  # (size, ...): one row per rank
        x = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
        u = cluster.asarray(x, comm=comm)
        n = shape[0]
        for dim in range(len(shape)):
            for shift in (-1, 1, n - 1, -n - 1, 2 * n + 1):
                np.testing.assert_array_equal(shifted(u, dim, shift), np.roll(x, -shift, axis=dim),
                                              err_msg=f"{shape} {dim} {shift}")


def check_interior_and_sections(comm):
    n = 2 * comm.size + 3
    x = np.random.default_rng(3).random((n, 5))
    u = cluster.asarray(x, comm=comm, halo=2)
    # the heat stencil's views: interior of cshifts along both dims
    for dim, shift in ((0, -1), (0, 1), (1, -1), (1, 1)):
        y = cluster.zeros_like(u)
        got = copied(y, hetflow.interior(y, 1), hetflow.interior(hetflow.cshift(u, dim, shift), 1), (n - 2, 3))
        want = np.zeros_like(x)
        want[1:-1, 1:-1] = np.roll(x, -shift, axis=dim)[1:-1, 1:-1]
        np.testing.assert_array_equal(got, want)
    # a section of the last rows read into the first: periodic, two rows back
    y = cluster.zeros_like(u)
    got = copied(y, hetflow.section(y, (0, 0), (2, 3)), hetflow.section(u, (n - 2, 1), (2, 3)), (2, 3))
    want = np.zeros_like(x)
    want[0:2, 0:3] = x[n - 2:, 1:4]
    np.testing.assert_array_equal(got, want)


def check_dtypes(comm):
    n = 2 * comm.size + 1
    for dtype in (np.int32, np.int8, np.float32, np.complex128, np.bool_):
        x = (np.arange(n * 2).reshape(n, 2) % 5 - 1).astype(dtype)
        u = cluster.asarray(x, comm=comm)
        np.testing.assert_array_equal(shifted(u, 0, -1), np.roll(x, 1, axis=0))
        if dtype != np.bool_:
            got, want = u.sum(), x.sum()
            assert got == want and got.dtype == want.dtype, (dtype, got, want)
        if dtype != np.complex128:
            assert u.min() == x.min() and u.max() == x.max(), dtype
    x = np.random.default_rng(4).random(1000).astype(np.float32)
    got = cluster.asarray(x, comm=comm).sum()
    assert got.dtype == np.float32 and abs(got - x.sum()) <= 1e-4 * x.sum(), (got, x.sum())


def check_round_trips(comm):
    """Scatter from one rank, gather on another, scatter that again: the same array."""
    last = comm.size - 1
    x = np.arange(7 * comm.size * (comm.size + 1), dtype=np.int64).reshape(7 * comm.size, comm.size + 1)
    a = cluster.asarray(x if comm.rank == last else None, comm=comm, root=last, parts=range(1, comm.size + 1))
    whole = a.gather(root=min(1, last))
    b = cluster.asarray(whole, comm=comm, root=min(1, last), dim=1, halo=0)
    np.testing.assert_array_equal(b.allgather(), x)
    assert a.sum() == x.sum() == b.sum()


def check_rows_moved(comm):
    """Rows moved by hand, then a launch."""
    n = 4 * comm.size + 1
    x = np.random.default_rng(6).random(n)
    u = cluster.asarray(x, comm=comm)
    u.distribution.resize(u.distribution.apportion([r + 1 for r in range(comm.size)]))
    np.testing.assert_array_equal(shifted(u, 0, n - 1), np.roll(x, 1))


def check_program_after_rows_moved(comm):
    """A program run again after its rows were moved outside it: its parts follow them."""
    program, u, _ = heat.setup(12, comm, threshold=100.0)  # no rebalance: the new cut stays
    program.run(2)
    sizes = u.distribution.apportion([comm.size - r for r in range(comm.size)])
    u.distribution.resize(sizes)
    program.run(1)
    program.run(2)
    np.testing.assert_allclose(u.allgather(), heat.numpy_solve(12, 10), rtol=0, atol=1e-12)
    assert u.distribution.sizes == sizes and program.partitions[-1] == (2, sizes), program.partitions


def misuse_rows(comm):
    size = comm.size
    expect(ShapeError, lambda: cluster.zeros((size - 1, 2), comm=comm),
           f"distributing {size - 1} rows over {size} ranks", f"rank {size - 1} would get 0 rows")


def misuse_root_x(comm):
    """The root's x is not an array: the others learn it instead of waiting for rows."""
    expect(ArgumentTypeError, lambda: cluster.asarray([[1.0], []] if comm.rank == 0 else None, comm=comm, root=0),
           "cluster.asarray: x on rank 0, the root, is not an array (ValueError")


def misuse_one_x(comm):
    last = comm.size - 1
    expect(ArgumentTypeError, lambda: cluster.asarray(np.ones(4) if comm.rank != last else [[1], []], comm=comm),
           f"cluster.asarray: x is not an array on rank {last} (ValueError")


def misuse_gather_roots(comm):
    u = cluster.zeros(comm.size, comm=comm)
    expect(CommError, lambda: u.gather(root=comm.rank), f"ranks passed different roots to {u.name}.gather: "
           + "; ".join(f"rank {r}: root={r}" for r in range(comm.size)))


def misuse_shapes(comm):
    """Arrays of different widths in a launch that only rank 0 has rows of."""
    a = cluster.zeros((2 * comm.size, 3), comm=comm)
    narrow = cluster.zeros_like(a, shape=(2 * comm.size, 2))
    expect(ShapeError, lambda: cluster.forall((1, 3), copy2, hetflow.section(narrow, (0, 0), (1, 2)),
                                              hetflow.section(a, (0, 0), (1, 3))),
           "kernel 'copy2' argument 'out': view of extent (1, 2) does not fit the launch extent (1, 3)")


def misuse_communicators(comm):
    """An array of another communicator (each process's own one-rank one), and a host array."""
    x = np.zeros((2 * comm.size, 3))
    a = cluster.asarray(x, comm=comm)
    alone = cluster.asarray(x, comm=collectives.SelfCommunicator(30))
    expect(ShapeError, lambda: cluster.forall(x.shape, copy2, alone, a),
           "its arrays belong to different communicators", f"out: {alone.name} over 1 rank(s)",
           f"src: {a.name} over {comm.size} rank(s)")
    expect(ShapeError, lambda: cluster.forall(x.shape, copy2, a, x),
           "argument src is a ndarray, not a distributed array")


MISUSE = (misuse_rows, misuse_root_x, misuse_one_x, misuse_gather_roots, misuse_shapes, misuse_communicators)


def main():
    comm = collectives.world(timeout=20)
    with cluster.distributed(comm):
        check_cshifts(comm)
        check_interior_and_sections(comm)
        check_dtypes(comm)
        check_round_trips(comm)
        check_rows_moved(comm)
        check_program_after_rows_moved(comm)
    if comm.size > 1:  # outside distributed(), which would turn one rank's error into the others'
        for misuse in MISUSE:
            misuse(comm)
            assert cluster.zeros(comm.size, comm=comm).sum() == 0.0  # every rank is still here
    print(f"rank {comm.rank}: darray sweep ok", flush=True)


if __name__ == "__main__":
    main()
