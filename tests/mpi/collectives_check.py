"""Run under mpiexec by tests/test_collectives.py: allreduce/reduce against two oracles.

Every result is compared with NumPy's reduction of all ranks' inputs (gathered with
MPI's allgather) and with MPI's own Allreduce on the same data: exactly for integers
and bools, to rounding for floats. Rank 0 prints "collectives ok: N cases" at the end.
"""
import dataclasses
import functools
import sys

import numpy as np
from mpi4py import MPI
from oracle import gather

from hetflow import collectives
from hetflow.errors import ArgumentError, CommError

MPI_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX,
           "land": MPI.LAND, "lor": MPI.LOR, "lxor": MPI.LXOR, "band": MPI.BAND,
           "bor": MPI.BOR, "bxor": MPI.BXOR}
UFUNCS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
          "land": np.logical_and, "lor": np.logical_or, "lxor": np.logical_xor,
          "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}
OPS_BY_KIND = {"f": ("sum", "prod", "min", "max"),
               "i": tuple(UFUNCS),
               "b": ("land", "lor", "lxor", "band", "bor", "bxor")}
DTYPES = (np.float64, np.float32, np.int32, np.int64, np.bool_)
STRUCT = np.dtype([("x", np.float64), ("n", np.int32), ("v", np.float32, (2,))])

comm = collectives.world(timeout=60)
pipelined = collectives.world(timeout=60)  # the same processes, native and small paths off,
pipelined.native_bytes = pipelined.small_bytes = 0  # and halves cut into as many
pipelined.min_segment_bytes = 1  # segments as asked
native_comm = collectives.world(timeout=60)  # MPI's own collective at every size it can do
native_comm.native_bytes = 1 << 62
world = MPI.COMM_WORLD
PATHS = {comm: "default", pipelined: "seed pipelined", native_comm: "native where possible"}
rank, size = comm.rank, comm.size
cases = 0


def data(n, dtype, seed, op="sum"):
    """Rank-dependent input; prod gets values near 1 so float products stay finite."""
    rng = np.random.default_rng(1000 * seed + 17 * rank + n)
    dtype = np.dtype(dtype)
    if dtype.names:
        arr = np.zeros(n, dtype)
        for name in dtype.names:
            arr[name] = data(arr[name].size, dtype.fields[name][0].base, seed + 1
                             ).reshape(arr[name].shape)
        return arr
    if dtype.kind == "b":
        return rng.random(n) < 0.7
    if dtype.kind == "f":
        return (rng.uniform(0.5, 1.5, n) if op == "prod" else rng.normal(0, 10, n)
                ).astype(dtype)
    return rng.integers(-2 ** 20, 2 ** 20, n).astype(dtype)


def numpy_oracle(x, op):
    """NumPy's reduction of every rank's x, in rank order."""
    everyone = gather(x)
    if x.dtype.names:
        result = np.empty_like(everyone[0])
        for name in x.dtype.names:
            result[name] = numpy_oracle_fields([a[name] for a in everyone], op)
        return result
    return numpy_oracle_fields(everyone, op)


def numpy_oracle_fields(arrays, op):
    return functools.reduce(lambda a, b: UFUNCS[op](a, b).astype(a.dtype), arrays)


def native_oracle(x, op):
    """MPI's own Allreduce; None where MPI has no such op for the type."""
    if x.dtype.kind == "b" and op in ("band", "bor", "bxor"):
        return None  # MPI's bitwise ops do not take C_BOOL
    if x.dtype.names:
        result = np.empty_like(x)
        for name in x.dtype.names:
            result[name] = native_oracle(np.ascontiguousarray(x[name]), op)
        return result
    send = np.ascontiguousarray(x)
    recv = np.empty_like(send)
    world.Allreduce(send, recv, op=MPI_OPS[op])
    return recv


def assert_same(got, want, dtype, what):
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.dtype, want.dtype)
    if dtype.names:
        for name in dtype.names:
            assert_same(got[name], want[name], dtype.fields[name][0].base, f"{what}.{name}")
        return
    if dtype.kind == "f":
        rtol = 1e-4 if dtype == np.float32 else 1e-11
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def signed_absmax(a, b, out):
    """The element of larger magnitude, sign kept: a user op no built-in matches."""
    np.copyto(out, np.where(np.abs(a) >= np.abs(b), a, b))


def check(x, op, what, segments=2, roots=(0,), out_view=None):
    """allreduce, and reduce at each of ``roots``, against both oracles."""
    global cases
    want = numpy_oracle(x, op)
    native = native_oracle(x, op)
    if native is not None:
        assert_same(native, want.reshape(native.shape), x.dtype, f"oracles {what}")
    for c in (comm, pipelined, native_comm):
        how = f"{what} ({PATHS[c]} paths)"
        got = c.allreduce(x, op=op, segments=segments)
        assert_same(got, want.reshape(x.shape), x.dtype, f"allreduce {how}")
        if out_view is not None:
            returned = c.allreduce(x, op=op, out=out_view, segments=segments)
            assert returned is out_view
            assert_same(out_view.copy(), want.reshape(x.shape), x.dtype, f"allreduce out {how}")
        for root in roots:
            got = c.reduce(x, op=op, root=root, segments=segments)
            if rank == root:
                assert_same(got, want.reshape(x.shape), x.dtype, f"reduce root {root} {how}")
            else:
                assert got is None, f"reduce {how}: non-root rank {rank} got a result"
    cases += 1


@dataclasses.dataclass
class Summed:
    """A user op object that cannot be hashed (a dataclass with ``eq``): valid all the same."""
    scale: float = 1.0

    def __call__(self, a, b, out):
        np.add(a, b, out=out)


def check_nan_wins(n):
    """min and max with a NaN on one rank: NaN on every rank, first call and repeats,
    on every path (NumPy's rule; MPI's own MIN/MAX have none: its result differs by rank)."""
    global cases
    x = data(n, np.float64, 11)
    if rank == size - 1:
        x[0] = x[-1] = np.nan
    for op in ("min", "max"):
        want = numpy_oracle(x, op)
        assert np.isnan(want[0]) and np.isnan(want[-1])
        for c in (comm, pipelined, native_comm):
            for repeat in range(2):
                how = f"{op} with NaN n={n} ({PATHS[c]} paths, call {repeat + 1})"
                np.testing.assert_array_equal(c.allreduce(x, op=op), want, err_msg=how)
                got = c.reduce(x, op=op, root=0)
                if rank == 0:
                    np.testing.assert_array_equal(got, want, err_msg=how)
    cases += 1


def main():
    every_root = tuple(range(size))
    # every op on every dtype that takes it, across the small and pipelined paths
    for dtype in DTYPES:
        for op in OPS_BY_KIND[np.dtype(dtype).kind]:
            for n in (0, 1, 2, 7, 13, 101, 1009):
                check(data(n, dtype, 1, op), op, f"{np.dtype(dtype)} {op} n={n}",
                      roots=every_root if n in (13, 1009) else (size - 1,))
    # segment counts, including more segments than elements
    for segments in (1, 3, 5, 64):
        for n in (3, 1009, 65537):
            check(data(n, np.float64, 2), "sum", f"segments={segments} n={n}",
                  segments=segments, roots=every_root)
    # structured elements, field by field
    for op in ("sum", "min", "max"):
        for n in (0, 5, 1009, 20011):
            check(data(n, STRUCT, 3), op, f"struct {op} n={n}", roots=every_root)
    # non-contiguous input and output views, and 2-D shapes
    base = data(2 * 4099, np.float64, 4)
    check(base[::2], "sum", "strided input", out_view=np.empty(2 * 4099)[1::2],
          roots=every_root)
    matrix = np.asfortranarray(data(301 * 7, np.int64, 5).reshape(301, 7))
    check(matrix, "bxor", "fortran-ordered 2-D", out_view=np.empty((7, 301), np.int64).T)
    check(data(12, np.int32, 6).reshape(3, 4)[:, ::2], "max", "2-D strided view")
    check(np.float64(rank + 0.5), "sum", "0-d")
    # in place: out is x
    for c in (comm, pipelined, native_comm):
        x = data(5003, np.float32, 7)
        want = numpy_oracle(x, "sum")
        assert c.allreduce(x, out=x) is x
        assert_same(x, want, x.dtype, "allreduce in place")
    # user-defined callable ops
    for n, c in ((3, comm), (3001, comm), (3001, pipelined)):
        y = data(n, np.float64, 8)
        got = c.allreduce(y, op=lambda a, b, out: np.add(a, b, out=out))
        assert_same(got, native_oracle(y, "sum"), y.dtype, "callable add")
        got = c.allreduce(y, op=signed_absmax)
        everyone = gather(y)
        assert_same(got, functools.reduce(lambda a, b: np.where(abs(a) >= abs(b), a, b),
                                          everyone), y.dtype, "callable signed absmax")
    for n in (1, 1009, 200_003):
        check_nan_wins(n)
    y = data(7, np.float64, 12)
    for repeat in range(2):  # an op object without a hash, first call and repeat
        assert_same(comm.allreduce(y, op=Summed()), native_oracle(y, "sum"), y.dtype, "op object")
    for bad in (dict(root=[0]), dict(segments=[2]), dict(op=["sum"])):
        try:
            comm.reduce(y, **bad)
            raise AssertionError(f"no ArgumentError for {bad}")
        except ArgumentError as exc:
            assert next(iter(bad)) in str(exc), exc
    # a path mismatch is caught like any other: ranks may not set the thresholds differently
    odd = collectives.world(timeout=60)
    odd.small_bytes = odd.native_bytes = 0 if rank == size - 1 else 1 << 16
    if size > 1:
        try:
            odd.allreduce(np.ones(100))
            raise AssertionError("no CommError for differing thresholds")
        except CommError as exc:
            assert "path" in str(exc), exc
    # about a million elements
    check(data(1_000_003, np.float64, 9), "sum", "n=1e6 float64 sum", roots=(size // 2,))
    check(data(1_000_003, np.int32, 10), "bxor", "n=1e6 int32 bxor")
    # the thin wrappers
    assert comm.bcast({"from": rank}, root=size - 1) == {"from": size - 1}
    assert comm.allgather(rank * 3) == [r * 3 for r in range(size)]
    comm.barrier()
    if rank == 0:
        print(f"collectives ok: {cases + 2} cases on {size} ranks", flush=True)


if __name__ == "__main__":
    main()
    sys.exit(0)
