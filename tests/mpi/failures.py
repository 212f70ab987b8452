"""Run under mpiexec by tests/test_collectives.py: how collectives fail.

``python failures.py MODE`` with MODE one of
  absent-small, absent-native, absent-user-op, absent-check, absent-data: the last rank
      never calls allreduce (a small message with the argument check; one with
      check=False, on the native path; one of a user op, on the small path; a large one
      with the argument check; a large one with check=False); the others must raise
      CommTimeoutError after the 2 s timeout, and the communicator must refuse
      further use;
  mismatch: ranks disagree on length, dtype, op, root or path; every rank must raise
      CommError naming what differs, and the communicator must stay usable;
  mismatch-unchecked: lengths differ with check=False; where MPI fails, every error
      raised is hetflow's CommError;
  local: an op that does not fit the dtype raises ArgumentTypeError on the calling rank alone,
      before any message is sent (the others never call and nothing hangs).
Each rank prints "rank R: MODE ok".
"""
import sys
import time

import numpy as np

from hetflow import collectives
from hetflow.errors import ArgumentTypeError, CommError, CommTimeoutError


def expect(exc_type, fn, *words):
    try:
        fn()
    except exc_type as exc:
        message = str(exc)
        for word in words:
            assert word in message, f"{word!r} not in {message!r}"
        return exc
    raise AssertionError(f"{exc_type.__name__} not raised")


def absent(comm, n, check, op="sum"):
    last = comm.size - 1
    if comm.rank == last:  # alive, but never arrives (a rank that ended is another failure: s25_ended.py)
        time.sleep(4)
        return
    x = np.ones(n)
    exc = expect(CommTimeoutError, lambda: comm.allreduce(x, op=op, check=check),
                 "no answer within 2 s", "allreduce")
    assert isinstance(exc, TimeoutError)
    expect(CommError, lambda: comm.allreduce(x), "unusable", "timed out")


def mismatch(comm):
    r, last = comm.rank, comm.size - 1
    cut = collectives.world(timeout=2)  # the same processes, segment floors that differ
    cut.min_segment_bytes = 1 + (r == last)
    cases = [
        # (what differs, this rank's call)
        ("length", lambda: comm.allreduce(np.ones(10 + (r == last)))),
        ("length", lambda: comm.allreduce(np.ones(100_000 + (r == last)))),
        ("length", lambda: comm.allreduce(np.ones(10 if r == last else 100_000))),
        ("dtype", lambda: comm.allreduce(np.ones(50, np.float32 if r == last else np.float64))),
        ("op", lambda: comm.allreduce(np.ones(50), op="max" if r == last else "sum")),
        ("root", lambda: comm.reduce(np.ones(50_000), root=1 if r == last else 0)),
        ("segments", lambda: comm.allreduce(np.ones(50_000), segments=2 + (r == last))),
        ("segments", lambda: cut.allreduce(np.ones(50_000))),
    ]
    for field, call in cases:
        expect(CommError, call, "ranks disagree on", field, f"rank {last}")
    # nothing was left in flight: the communicator still works
    got = comm.allreduce(np.full(1000, r + 1.0))
    assert np.all(got == comm.size * (comm.size + 1) / 2), got[:3]


def mismatch_unchecked(comm):
    """check=False: a length that differs between ranks is not found before the data
    moves; where MPI then fails, the error is hetflow's CommError naming the collective
    (never mpi4py's own exception)."""
    r = comm.rank
    try:
        comm.allreduce(np.ones(100_000 + r), check=False)
    except CommError as exc:
        assert "allreduce on rank" in str(exc) and "check=True" in str(exc), str(exc)


def local(comm):
    if comm.rank == 0:
        expect(ArgumentTypeError, lambda: comm.allreduce(np.ones(8), op="band"), "band", "float64")
        expect(ArgumentTypeError, lambda: comm.reduce(np.ones(8, np.complex128), op="max"), "max")
    got = comm.allreduce(np.arange(5, dtype=np.int64), op="bor")
    assert np.array_equal(got, np.arange(5)), got


def main(mode):
    comm = collectives.world(timeout=2)
    if mode == "absent-small":
        absent(comm, 10, True)
    elif mode == "absent-native":
        absent(comm, 10, False)
    elif mode == "absent-user-op":
        absent(comm, 10, False, op=lambda a, b, out: np.add(a, b, out=out))
    elif mode == "absent-check":
        absent(comm, 200_000, True)
    elif mode == "absent-data":
        absent(comm, 200_000, False)
    elif mode == "mismatch":
        mismatch(comm)
    elif mode == "mismatch-unchecked":
        mismatch_unchecked(comm)
    elif mode == "local":
        local(comm)
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(f"rank {comm.rank}: {mode} ok", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
