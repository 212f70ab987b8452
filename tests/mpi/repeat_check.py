"""Run under mpiexec by tests/test_collectives_repeat.py: repeated calls.

A call whose arguments all ranks agreed on is checked once: its repetitions skip the
argument check, and native ones run through the prepared call
(hetflow.collectives.native.NativeCall, TreeReduce). Checked here, each against NumPy's reduction
of all ranks' inputs (gathered with MPI's Allgather):

* every built-in op on float64 and int64, sizes 0, 1, 7 and one element below, at and
  above each crossover, allreduce and reduce to every root, each called three times
  (the first checked, the others prepared), with out None, out = x and a separate out;
* repetitions the prepared call declines (a non-contiguous x or out, an out that
  overlaps x, an out of the wrong shape, a read-only x as its own out): the general
  path takes them, right results and right errors; 0-d arrays;
* how many argument checks ran (agreement.agree is counted): one per signature with
  check=True, one per call with check='always', none with check=False;
* a threshold changed after a call was prepared: the new path is taken;
* prepared calls past MAX_PREPARED_BYTES of buffers are dropped;
* the pipelined path with its reductions in a helper thread (reduce_thread), small
  segments, every root;
* ranks that agreed on two signatures, then disagree (one rank calls the other
  signature) with check='always': CommError naming what differs, on every rank.

Rank 0 prints "repeat ok: N calls, C checks, P native and T tree repetitions" at the
end: repetitions of reduces up to native.TREE_BYTES (all of them at 2 ranks) take the
tree path (TreeReduce), the others the native one.

``repeat_check.py absent allreduce|reduce`` instead: the last rank never makes the
third call of a prepared allreduce (reduce to rank 0); the others must raise
CommTimeoutError after the 2 s timeout, naming the unchecked repetition, and the
communicator must refuse further use. Each rank prints "rank R: absent NAME ok".
"""
import collections
import sys

import numpy as np
from mpi4py import MPI
from oracle import UFUNCS, oracle

from hetflow import collectives
from hetflow.collectives import agreement, host, native
from hetflow.collectives.ops import resolve_op
from hetflow.errors import CommError, CommTimeoutError, ShapeError

FLOAT_OPS = ("sum", "prod", "min", "max")

comm = collectives.world(timeout=30)
rank, size = comm.rank, comm.size
checks = 0
calls = 0
prepared = collections.Counter()  # repetitions served by prepared calls, by path
_agree = agreement.agree


def counted_agree(*args):
    global checks
    checks += 1
    return _agree(*args)


agreement.agree = counted_agree


def data(n, dtype, op, seed):
    rng = np.random.default_rng(97 * seed + 31 * rank + n)
    if np.dtype(dtype).kind == "f":
        return rng.uniform(0.5, 1.5, n) if op == "prod" else rng.normal(0, 10, n)
    return rng.integers(0, 1 << 20, n).astype(dtype)


def verify(got, want, what):
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def call(c, name, x, op, root, **kwargs):
    global calls
    calls += 1
    if name == "allreduce":
        return c.allreduce(x, op=op, **kwargs)
    return c.reduce(x, op=op, root=root, **kwargs)


def repeated(name, n, dtype, op, root):
    """Three calls of one signature: checked once, then prepared (native path)."""
    for seed in range(3):
        x = data(n, dtype, op, seed)
        want = oracle(x, UFUNCS[op])
        is_root = name == "allreduce" or rank == root
        out = (None, x, np.empty_like(x))[seed]
        before = checks
        got = call(comm, name, x, op, root, out=out)
        what = f"{name} {op} {x.dtype} n={n} root {root} call {seed} on {size} ranks"
        assert checks - before == (seed == 0 and size > 1), (what, checks - before)
        if is_root:
            assert out is None or got is out, what
            verify(got, want, what)
        else:
            assert got is None, what
        key = host.prepared_key(op, x, 2, None if name == "allreduce" else root)
        if size == 1 or x.nbytes > host.native_crossover(name, size):
            assert key not in comm._prepared, what
            continue
        tree = name == "reduce" and (x.nbytes <= native.TREE_BYTES or size == 2)
        assert key in comm._prepared, what
        assert comm.last_path == ("tree" if tree and seed else "native"), what
        prepared[comm.last_path] += seed > 0
        persistent = isinstance(comm._prepared[key], native.PersistentAllreduce)
        nan_rule = native.nan_rule(resolve_op(op), x.dtype) is not None  # its own buffers, no persistent call
        assert persistent == (name == "allreduce" and x.nbytes <= native.PERSISTENT_BYTES and not nan_rule), what
        assert isinstance(comm._prepared[key], native.NanNativeCall) == (nan_rule and not tree), what
        prepared["persistent"] += seed > 0 and persistent


def declined():
    """Repetitions the prepared call hands to the general path."""
    x = data(64, np.float64, "sum", 5)
    comm.allreduce(x)  # prepared from here on
    strided = data(128, np.float64, "sum", 6)[::2]
    verify(comm.allreduce(strided), oracle(strided, np.add), "strided x")
    out = np.empty((64, 2))[:, 0]
    got = comm.allreduce(x, out=out)
    assert got is out and comm.last_path == ("native" if size > 1 else "local")
    verify(out, oracle(x, np.add), "strided out")
    y = np.concatenate([np.zeros(2), data(64, np.float64, "sum", 7)])
    want = oracle(y[2:66], np.add)
    comm.allreduce(y[2:66], out=y[:64])
    verify(y[:64], want, "out overlapping x")
    try:
        comm.allreduce(x, out=np.empty(65))
    except ShapeError as exc:
        assert "shape" in str(exc), exc
    else:
        raise AssertionError("an out of the wrong shape was taken")
    read_only = data(64, np.float64, "sum", 8)
    read_only.flags.writeable = False
    comm.allreduce(read_only)
    try:
        comm.allreduce(read_only, out=read_only)  # x itself as out, prepared
    except ShapeError as exc:
        assert "read-only" in str(exc), exc
    else:
        raise AssertionError("a read-only out was written")
    for _ in range(3):  # 0-d arrays, prepared too
        scalar = np.array(rank + 1.0)
        got = comm.allreduce(scalar)
        assert got.shape == () and got == size * (size + 1) / 2, got
    comm.allreduce(x)  # every rank made the same calls: still in step


def check_modes():
    """check=True checks a signature once, 'always' every call, False never."""
    x = data(33, np.float64, "max", 8)
    want = oracle(x, np.maximum)
    for mode, expected in ((True, 1), (True, 0), ("always", 1), ("always", 1), (False, 0)):
        before = checks
        verify(comm.allreduce(x, op="max", check=mode), want, f"check={mode!r}")
        assert checks - before == expected * (size > 1), (mode, checks - before)


def threshold_change():
    """Changing native_bytes drops the prepared calls: the new path is taken."""
    c = collectives.world(timeout=30)
    x = data(100, np.float64, "sum", 9)
    want = oracle(x, np.add)
    verify(c.allreduce(x), want, "before")
    verify(c.allreduce(x), want, "prepared")
    assert c.last_path == "local" if size == 1 else c.last_path == "native" and c._prepared
    c.native_bytes = 0
    verify(c.allreduce(x), want, "native path off")
    assert c.last_path == ("small" if size > 1 else "local"), c.last_path


def prepared_bytes_bounded():
    """Prepared calls whose buffers would pass MAX_PREPARED_BYTES are dropped first."""
    c = collectives.world(timeout=30)
    bound, native.MAX_PREPARED_BYTES = native.MAX_PREPARED_BYTES, 20_000
    try:
        for n in (1000, 1001, 1002):
            x = data(n, np.float64, "sum", 13)
            want = oracle(x, np.add)
            for _ in range(2):
                got = c.reduce(x, root=0)
                if rank == 0:
                    verify(got, want, f"reduce n={n} under a byte bound")
        held = sum(call.nbytes for call in c._prepared.values())
        assert held == c._prepared_bytes <= 20_000, (held, c._prepared_bytes)
        if rank == 0 and size > 1:  # the root keeps an inbox per call: one was dropped
            assert len(c._prepared) <= 2, len(c._prepared)
    finally:
        native.MAX_PREPARED_BYTES = bound


def reduce_thread():
    """The pipelined path, reducing in a helper thread, against NumPy."""
    c = collectives.world(timeout=30)
    c.reduce_thread = True
    c.native_bytes = c.small_bytes = 0
    c.min_segment_bytes = 64  # many segments: the helper overlaps most of them
    for n in (0, 1, 7, 1000, 4099):
        for op, dtype in (("sum", np.float64), ("max", np.int64)):
            x = data(n, dtype, op, 12)
            want = oracle(x, UFUNCS[op])
            for segments in (1, 3, 8):
                verify(c.allreduce(x, op=op, segments=segments), want,
                       f"threaded allreduce {op} n={n} segments={segments}")
                for root in range(size):
                    got = c.reduce(x, op=op, root=root, segments=segments)
                    if rank == root:
                        verify(got, want, f"threaded reduce {op} n={n} root {root}")
    assert c.last_path == ("pipelined" if size > 1 else "local"), c.last_path
    assert host.reduce_helper.cache_info().currsize == (size > 1)  # the helper was used


def disagree_after_agreeing():
    """With check='always', ranks that call two agreed signatures out of step fail
    cleanly on every rank."""
    last = size - 1
    a, b = data(10, np.float64, "sum", 10), data(1000, np.float64, "sum", 11)
    comm.allreduce(a)
    comm.allreduce(b)
    try:
        comm.allreduce(b if rank == last else a, check="always")
    except CommTimeoutError:
        raise
    except CommError as exc:
        assert "ranks disagree on" in str(exc) and "length" in str(exc), exc
    else:
        raise AssertionError("no CommError")
    comm.allreduce(a)  # nothing left in flight: still usable


def absent(name):
    """The last rank leaves out a repetition: the others time out, and say why (a
    reduce's rank whose subtree lacks the last rank may return: it only sends)."""
    c = collectives.world(timeout=2)
    x = np.ones(10)
    call(c, name, x, "sum", 0)
    call(c, name, x, "sum", 0)
    if rank != size - 1:
        try:
            call(c, name, x, "sum", 0)
        except CommTimeoutError as exc:
            assert "no answer within 2 s" in str(exc) and "check='always'" in str(exc), exc
            try:
                call(c, name, x, "sum", 0)
            except CommError as exc:
                assert "unusable" in str(exc), exc
            else:
                raise AssertionError("a communicator that timed out was used")
        else:
            assert name == "reduce" and rank != 0, "a repetition nobody answered returned"
    MPI.COMM_WORLD.Barrier()  # the last rank makes no other call meanwhile
    print(f"rank {rank}: absent {name} ok", flush=True)


def main():
    for name in ("allreduce", "reduce"):
        crossover = host.NATIVE_BYTES[name][2 if size == 2 else 3] // 8
        roots = range(size) if name == "reduce" else [0]
        for n in (0, 1, 7, crossover - 1, crossover, crossover + 1):
            for root in roots:
                for op in FLOAT_OPS:
                    repeated(name, n, np.float64, op, root)
                for op in UFUNCS:
                    if op not in FLOAT_OPS or n < 8:
                        repeated(name, n, np.int64, op, root)
    declined()
    check_modes()
    threshold_change()
    prepared_bytes_bounded()
    reduce_thread()
    if size > 1:
        disagree_after_agreeing()
    if rank == 0:
        print(f"repeat ok: {calls} calls, {checks} checks, {prepared['native']} native and "
              f"{prepared['tree']} tree repetitions on "
              f"{size} ranks", flush=True)
        print(f"persistent repetitions: {prepared['persistent']}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["absent"]:
        absent(sys.argv[2])
    else:
        main()
    sys.exit(0)
