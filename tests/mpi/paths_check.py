"""Run under mpiexec by tests/test_collectives.py: every path of allreduce/reduce.

Sizes 0, 1, odd, and one element below, at and above each collective's crossover to
MPI's own collective, over every built-in op, a user op, a structured dtype and a
non-contiguous input; each result against NumPy's reduction of all ranks' inputs
(gathered with MPI's Allgather), each path checked against the one the sizes, op and
dtype call for (``comm.last_path``), and the debug log line naming it.
Rank 0 prints "paths ok: ..." with the count of calls per path.
"""
import collections
import logging
import sys

import numpy as np

from oracle import UFUNCS, oracle

from hetflow import collectives
from hetflow.collectives import host

STRUCT = np.dtype([("x", np.float64), ("n", np.int32)])

comm = collectives.world(timeout=60)
rank, size = comm.rank, comm.size
seen = collections.Counter()


class PathLog(logging.Handler):
    """Keeps the path named by the last debug line of hetflow.collectives."""

    last = None

    def emit(self, record):
        PathLog.last = record.getMessage().rsplit(": ", 1)[1].removesuffix(" path")


logging.getLogger("hetflow.collectives").addHandler(PathLog())
logging.getLogger("hetflow.collectives").setLevel(logging.DEBUG)


def expected_path(name, nbytes, native_op):
    """The path the documented thresholds call for, the rule written out here."""
    if size == 1:
        return "local"
    crossover = host.NATIVE_BYTES[name][2 if size == 2 else 3]
    if native_op and nbytes <= crossover:
        return "native"
    return "small" if nbytes <= 64 << 10 else "pipelined"


def check(name, x, op, ufunc, native_op, root=0):
    want = oracle(x, ufunc)
    if name == "allreduce":
        got = comm.allreduce(x, op=op)
    else:
        got = comm.reduce(x, op=op, root=root)
    path = expected_path(name, x.nbytes, native_op)
    what = f"{name} {x.dtype} {op} n={x.size} on {size} ranks"
    assert comm.last_path == path == PathLog.last, (what, comm.last_path, PathLog.last, path)
    if name == "reduce" and rank != root:
        assert got is None, what
    elif x.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)
    seen[path] += 1


def data(n, dtype, op="sum"):
    rng = np.random.default_rng(31 * rank + n)
    if np.dtype(dtype).kind == "f":
        return rng.uniform(0.5, 1.5, n) if op == "prod" else rng.normal(0, 10, n)
    return rng.integers(0, 1 << 20, n).astype(dtype)


def signed_absmax(a, b, out):
    np.copyto(out, np.where(np.abs(a) >= np.abs(b), a, b))


def main():
    for name in ("allreduce", "reduce"):
        root = size - 1
        around = host.NATIVE_BYTES[name][2 if size == 2 else 3] // 8
        for n in (0, 1, 7, around - 1, around, around + 1):
            for op in ("sum", "prod", "min", "max"):
                check(name, data(n, np.float64, op), op, UFUNCS[op], True, root)
            for op in ("and", "or", "xor", "land", "lor", "lxor"):
                check(name, data(n, np.int64), op, UFUNCS[op], True, root)
        for n in (0, 1, 7, 4099, 3 * around + 1):
            x = data(n, np.float64)
            check(name, x, signed_absmax, lambda a, b: np.where(abs(a) >= abs(b), a, b),
                  False, root)
            s = np.zeros(n, STRUCT)
            s["x"], s["n"] = x, np.arange(n) % 5 + rank
            check(name, s, "max", np.maximum, False, root)
            bools = x > 0  # bitwise ops on bools: MPI takes no C_BOOL for them
            check(name, bools, "xor", np.bitwise_xor, False, root)
        # non-contiguous inputs, packed first: native, then pipelined
        check(name, data(around, np.float64)[::2], "sum", np.add, True, root)
        check(name, data(6 * around + 6, np.int32)[::3], "max", np.maximum, True, root)
    # out overlapping x on the native path: in place, and shifted by two elements
    x = data(101, np.float64)
    want = oracle(x, np.add)
    assert comm.allreduce(x, out=x) is x and comm.last_path in ("native", "local")
    np.testing.assert_allclose(x, want, rtol=1e-11, atol=1e-11, err_msg="in place")
    y = np.concatenate([np.zeros(2), data(99, np.float64)])
    want = oracle(y[2:], np.add)
    comm.allreduce(y[2:], out=y[:-2])
    np.testing.assert_allclose(y[:-2], want, rtol=1e-11, atol=1e-11, err_msg="shifted out")
    if rank == 0:
        counts = " ".join(f"{p} {seen[p]}" for p in sorted(seen))
        print(f"paths ok on {size} ranks: {counts}", flush=True)


if __name__ == "__main__":
    main()
    sys.exit(0)
