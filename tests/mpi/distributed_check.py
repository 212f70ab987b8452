"""Run under mpiexec -n K by tests/test_distributed.py: distributed arrays and the
distributed heat solver against NumPy.

Every check compares with NumPy on the whole array (each rank builds the same global
inputs from a fixed seed). ``python distributed_check.py OUT.npy`` also runs the heat
solver of examples/heat_distributed.py (64x64, 21 steps) and saves rank 0's grid to
OUT.npy, for the driver to compare runs on different numbers of ranks. Rank 0 prints
"distributed ok on K ranks".
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
def stencil(i, out, left, centre, right):
    out[i] = left[i] + 10.0 * centre[i] + 100.0 * right[i]


@hetflow.kernel
def far(i, out, back2, ahead2):
    out[i] = back2[i] - ahead2[i]


def check_arrays(comm):
    rank, size = comm.rank, comm.size
    rng = np.random.default_rng(11)
    x = rng.random((37, 5))
    a = cluster.asarray(x, comm=comm)
    assert a.block.shape == (a.stop - a.start, 5)
    np.testing.assert_array_equal(a.allgather(), x)
    whole = a.gather(root=size - 1)
    assert (whole is None) == (rank != size - 1)
    if whole is not None:
        np.testing.assert_array_equal(whole, x)
    # scattered from one rank: the others pass nothing
    b = cluster.asarray(x * 2 if rank == 0 else None, comm=comm, root=0)
    np.testing.assert_array_equal(b.allgather(), x * 2)
    # reductions: the communicator's allreduce over the blocks' own reductions
    np.testing.assert_allclose(a.sum(), x.sum(), rtol=1e-13)
    assert a.min() == x.min() and a.max() == x.max()
    ints = cluster.asarray(np.arange(1, 38, dtype=np.int64), comm=comm)
    assert ints.sum() == 703 and ints.reduce("prod") == np.prod(np.arange(1, 38, dtype=np.int64))
    assert ints.reduce(lambda p, q, out: np.maximum(p, q, out=out)) == 37
    small = np.full(40, 100, np.int8)  # typed as NumPy's: a sum of int8 widens, no wrap
    got = cluster.asarray(small, comm=comm).sum()
    assert got == small.sum() == 4000 and got.dtype == small.sum().dtype, got
    holes = np.arange(40, dtype=np.float64)
    holes[0] = np.nan  # in rank 0's block only: NaN wins on every rank, as in NumPy
    holey = cluster.asarray(holes, comm=comm)
    assert np.isnan(holey.min()) and np.isnan(holey.max())
    # distributed along dim 1: gathers and reductions work along any dimension
    c = cluster.asarray(x.T.copy(), comm=comm, dim=1)
    np.testing.assert_array_equal(c.allgather(), x.T)
    np.testing.assert_allclose(c.sum(), x.sum(), rtol=1e-13)
    return x


def check_stencils(comm):
    n = 37
    x = np.random.default_rng(5).random(n)
    u = cluster.asarray(x, comm=comm)
    y = cluster.zeros_like(u)
    # the cshifts wrap at the ends of the array: the periodic halos carry them across ranks
    cluster.forall(n, stencil, y, cluster.cshift(u, 0, -1), u, cluster.cshift(u, 0, 1))
    want = np.roll(x, 1) + 10.0 * x + 100.0 * np.roll(x, -1)
    np.testing.assert_allclose(y.allgather(), want, rtol=1e-15)
    # a reach of 2 needs a halo of 2: refused the same way on every rank, before any message
    expect(ShapeError, lambda: cluster.forall(n, far, y, cluster.cshift(u, 0, -2), cluster.cshift(u, 0, 2)),
           "halo of at least 2")
    w = cluster.asarray(x, comm=comm, halo=2)
    z = cluster.zeros_like(w)
    cluster.forall(n, far, z, cluster.cshift(w, 0, -2), cluster.cshift(w, 0, 2))
    np.testing.assert_allclose(z.allgather(), np.roll(x, 2) - np.roll(x, -2), rtol=1e-15)
    # a new partition moves rows between neighbours; results stay the same
    sizes = u.distribution.apportion([r + 1 for r in range(comm.size)])
    assert u.distribution.resize(sizes) == (comm.size > 1)
    np.testing.assert_array_equal(u.allgather(), x)
    np.testing.assert_allclose(y.allgather(), want, rtol=1e-15)
    y2 = cluster.zeros_like(u)
    cluster.forall(n, stencil, y2, cluster.cshift(u, 0, -1), u, cluster.cshift(u, 0, 1))
    np.testing.assert_array_equal(y2.allgather(), y.allgather())


def check_mismatch(comm):
    # ranks that make different arrays all learn it, and can go on
    expect(CommError, lambda: cluster.zeros((10 + (comm.rank == comm.size - 1), 3), comm=comm),
           "ranks made different distributed arrays")
    assert cluster.zeros((8, 3), comm=comm).sum() == 0.0
    # a root that differs between ranks: every rank learns it (one rank read another's data)
    expect(CommError, lambda: cluster.asarray(np.arange(12.0), comm=comm, root=comm.rank),
           "ranks passed different roots to cluster.asarray: rank 0: root=0; rank 1: root=1")
    # Python objects cannot cross between ranks: refused where the array is made
    expect(ArgumentTypeError, lambda: cluster.asarray(np.array([1, "a"] * 6, dtype=object), comm=comm),
           "dtype object holds Python objects")
    assert cluster.asarray(np.arange(6.0), comm=comm, root=0).sum() == 15.0


def main(out):
    comm = collectives.world(timeout=60)
    with cluster.distributed(comm):
        check_arrays(comm)
        check_stencils(comm)
        if comm.size > 1:
            check_mismatch(comm)
    grid = heat.solve(64, 21, comm=comm)
    if comm.rank == 0:
        error = float(np.max(np.abs(grid - heat.numpy_solve(64, 21))))
        assert error <= 1e-12, error
        np.save(out, grid)
        print(f"distributed ok on {comm.size} ranks", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
