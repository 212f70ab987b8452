"""Run under mpiexec by tests/test_collectives.py: GPU buffers.

CuPy arrays go through NCCL send/recv with reductions on a compute stream (or, with
HETFLOW_NCCL=0 or where ranks share a GPU, through host memory). Results are compared
with NumPy's reduction of all ranks' inputs (gathered over MPI) and, where every rank
has a GPU of its own, for sum/max/min/prod with NCCL's own allReduce. Rank 0 prints
"gpu collectives ok: N cases".
"""
import functools
import os

import numpy as np
from mpi4py import MPI

from hetflow import collectives
from hetflow.cuda_compat import cupy_module

cp = cupy_module()
assert cp is not None, "needs CuPy and a GPU"
from cupy.cuda import nccl  # noqa: E402

comm = collectives.world(timeout=120)
pipelined = collectives.world(timeout=120)  # the same processes, small-message path off,
pipelined.small_bytes = 0  # and halves cut into as many segments as asked
pipelined.min_segment_bytes = 1
world = MPI.COMM_WORLD
local = int(world.Split_type(MPI.COMM_TYPE_SHARED).Get_rank())
cp.cuda.Device(local % cp.cuda.runtime.getDeviceCount()).use()
# NCCL allows one rank per GPU: with fewer GPUs than ranks there is no native oracle.
bus_ids = world.allgather((os.uname().nodename,
                           cp.cuda.runtime.deviceGetPCIBusId(cp.cuda.Device().id)))
native = None
if len(set(bus_ids)) == len(bus_ids):
    uid = comm.bcast(nccl.get_unique_id() if comm.rank == 0 else None)
    native = nccl.NcclCommunicator(comm.size, uid, comm.rank)

UFUNCS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
          "land": np.logical_and, "lor": np.logical_or, "band": np.bitwise_and,
          "bxor": np.bitwise_xor}
NCCL_OPS = {"sum": nccl.NCCL_SUM, "prod": nccl.NCCL_PROD, "min": nccl.NCCL_MIN,
            "max": nccl.NCCL_MAX}
NCCL_TYPES = {np.dtype(np.float32): nccl.NCCL_FLOAT32, np.dtype(np.float64): nccl.NCCL_FLOAT64,
              np.dtype(np.int32): nccl.NCCL_INT32, np.dtype(np.int64): nccl.NCCL_INT64}
CASES = [(np.float32, ("sum", "prod", "min", "max")), (np.float64, ("sum", "max")),
         (np.int32, ("sum", "min", "band", "bxor", "land")), (np.int64, ("prod", "bxor")),
         (np.bool_, ("land", "lor", "band"))]
cases = 0


def data(n, dtype, op, seed):
    rng = np.random.default_rng(100 * seed + comm.rank)
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return rng.random(n) < 0.7
    if dtype.kind == "f":
        return (rng.uniform(0.5, 1.5, n) if op == "prod" else rng.normal(0, 10, n)).astype(dtype)
    return rng.integers(-2 ** 20, 2 ** 20, n).astype(dtype)


def assert_same(got, want, what):
    got = cp.asnumpy(got)
    assert got.shape == want.shape and got.dtype == want.dtype, what
    if want.dtype.kind == "f":
        rtol = 1e-4 if want.dtype == np.float32 else 1e-11
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def oracles(host, op):
    everyone = world.allgather(np.ascontiguousarray(host))
    want = functools.reduce(lambda a, b: UFUNCS[op](a, b).astype(a.dtype), everyone)
    want = want.reshape(host.shape)
    if native is not None and op in NCCL_OPS and host.dtype in NCCL_TYPES and host.size:
        x = cp.ascontiguousarray(cp.asarray(host))
        y = cp.empty_like(x)
        stream = cp.cuda.get_current_stream()
        native.allReduce(x.data.ptr, y.data.ptr, x.size, NCCL_TYPES[host.dtype],
                         NCCL_OPS[op], stream.ptr)
        stream.synchronize()
        assert_same(y, want, f"NCCL against NumPy, {host.dtype} {op}")
    return want


def check(x, op, what, segments=2, roots=(0,), out=None):
    global cases
    want = oracles(cp.asnumpy(x), op)
    for c in (comm, pipelined):
        how = f"{what} ({'small path allowed' if c.small_bytes else 'pipelined path'})"
        assert_same(c.allreduce(x, op=op, segments=segments), want, f"allreduce {how}")
        if out is not None:
            assert c.allreduce(x, op=op, out=out, segments=segments) is out
            assert_same(out, want, f"allreduce out= {how}")
        for root in roots:
            got = c.reduce(x, op=op, root=root, segments=segments)
            if comm.rank == root:
                assert isinstance(got, cp.ndarray), type(got)
                assert_same(got, want, f"reduce root {root} {how}")
            else:
                assert got is None
    cases += 1


def main():
    every_root = tuple(range(comm.size))
    for dtype, ops in CASES:
        for op in ops:
            for n in (0, 1, 7, 1009, 100_003):
                x = cp.asarray(data(n, dtype, op, 1))
                check(x, op, f"{np.dtype(dtype)} {op} n={n}",
                      roots=every_root if n == 1009 else (comm.size - 1,))
    for segments in (1, 3, 8):
        x = cp.asarray(data(1_000_003, np.float32, "sum", 2))
        check(x, "sum", f"segments={segments}", segments=segments, roots=every_root)
    base = cp.asarray(data(2 * 50_001, np.float64, "sum", 3))
    check(base[::2], "sum", "strided input", out=cp.empty(2 * 50_001)[1::2])
    matrix = cp.asarray(data(301 * 7, np.int64, "bxor", 4).reshape(301, 7)).T
    check(matrix, "bxor", "transposed 2-D", out=cp.empty((7, 301), np.int64))
    for c in (comm, pipelined):
        x = cp.asarray(data(10_007, np.float32, "sum", 5))
        want = oracles(cp.asnumpy(x), "sum")
        assert c.allreduce(x, out=x) is x
        assert_same(x, want, "in place")
    y = cp.asarray(data(20_011, np.float64, "max", 6))
    # a user op gets CuPy arrays over NCCL, NumPy arrays when staged through the host
    got = comm.allreduce(y, op=lambda a, b, out: cp.get_array_module(out).maximum(
        a, b, out=out))
    assert_same(got, oracles(cp.asnumpy(y), "max"), "callable op on CuPy arrays")
    comm.barrier()
    if comm.rank == 0:
        oracle = "NumPy and NCCL" if native is not None else "NumPy (ranks share a GPU)"
        print(f"gpu collectives ok: {cases} cases on {comm.size} ranks against {oracle}",
              flush=True)


if __name__ == "__main__":
    main()
