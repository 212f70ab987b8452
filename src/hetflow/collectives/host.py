"""Global ``reduce`` and ``allreduce`` across processes (SPEC §5), on host buffers.

Each call takes one of these paths, chosen from the size, the rank count, the op and
the dtype (:func:`choose_path`; the choice is ``comm.last_path`` and a debug log line):

* ``native``: MPI's own ``MPI_Iallreduce``/``MPI_Ireduce``, for built-in ops on
  dtypes MPI reduces itself, up to the crossover :data:`NATIVE_BYTES` measured by
  ``hetflow bench allreduce`` (below it MPI's C code beats any Python schedule);
  repetitions of an agreed call run prepared (:mod:`hetflow.collectives.native`), a
  reduce's as a ``tree`` of point-to-point messages;
* ``small``: recursive doubling on whole vectors fused with the argument check
  (:mod:`hetflow.collectives.agreement`), for small messages of user ops and other dtypes;
* ``pipelined``: SPEC §5's pipelined halving, everything else.

The argument check runs on the first call of each signature per communicator
(:func:`agreement.ensure_agreed`), on every call with ``check='always'``.
The schedule comes from :mod:`hetflow.collectives.schedule`; this module runs it over MPI.
In a step of the distribution phase the sent half is cut into ``segments`` pieces:
segment j goes to the partner while the partner's segment j arrives (Isend/Irecv),
and meanwhile the previously received segment j-1 is reduced in place into the kept
half, polling MPI between chunks of that reduction so the transfer keeps moving.

Input that is not contiguous is packed first; the first reduction reads the packed
input and writes the result buffer, so no extra copy of the input is made.
GPU arrays go to :mod:`hetflow.collectives.gpu`.
"""
from __future__ import annotations

import concurrent.futures
import functools
import logging
import os
import sys

import numpy as np

from hetflow.collectives import agreement, native, schedule
from hetflow.collectives.native import mpi_op_name, same_memory
from hetflow.collectives.ops import BuiltinOp, resolve_op
from hetflow.errors import ArgumentError, CommError, ShapeError

# Reduce a received segment in chunks of about this many bytes, polling MPI between
# chunks: MPICH moves a large message only inside MPI calls (see docs/collectives.md).
PROGRESS_CHUNK_BYTES = 1 << 20

# Segments are never smaller than this: below it a segment's extra round trip costs
# more than the locality it buys (docs/collectives.md).
MIN_SEGMENT_BYTES = 1 << 20

# Messages up to this size take the small-message path: recursive doubling on whole
# vectors, fused with the argument check (hetflow.collectives.agreement); at most
# agreement.MAX_SMALL_BYTES. Below it, the pipelined path's extra exchanges cost more
# than they save (docs/collectives.md has the measurements).
SMALL_BYTES = 64 << 10

# Messages up to NATIVE_BYTES[collective][rank-count class] bytes of a built-in op on a
# dtype MPI reduces take the native path (repeated reduces: the tree, native.TREE_BYTES);
# larger ones the pipelined halving. Classes: 2 ranks, and 3 or more. From `hetflow
# bench allreduce`: where its "seed" column (the seed algorithm against what the native
# path runs) crosses 1. 2 ranks: allreduce, the dev box and the H100 host agree, the
# seed wins from 1 MiB; reduce, the tree beats the seed at 1 MiB (1.07-1.09x MPI_Reduce
# against 0.85-0.90x, dev box) and ties at 2 MiB. 3 or more: the quiet 32-core host's
# 4-rank figures, not yet re-measured (docs/collectives.md).
NATIVE_BYTES = {"allreduce": {2: 512 << 10, 3: 1 << 20},
                "reduce": {2: 1 << 20, 3: 256 << 10}}

NATIVE, SMALL, PIPELINED, LOCAL = native.NATIVE, "small", "pipelined", "local"
ALWAYS = "always"  # check= value: check every call, not just a signature's first

log = logging.getLogger("hetflow.collectives")


def allreduce(comm, x, op="sum", out=None, segments=2, check=True):
    """Reduce ``x`` over all processes of ``comm``; every process gets the result."""
    return _collective(comm, "allreduce", x, op, 0, out, segments, check, to_all=True)


def reduce(comm, x, op="sum", root=0, out=None, segments=2, check=True):
    """Reduce ``x`` over all processes of ``comm`` to ``root``; others get None."""
    return _collective(comm, "reduce", x, op, root, out, segments, check, to_all=False)


def _collective(comm, name, x, op, root, out, segments, check, to_all):
    comm._ensure_usable()
    reduce_op = resolve_op(op)
    _check_segments(segments)
    _check_root(root, comm.size)
    _check_check(check)
    try:
        if _on_device(x) or _on_device(out):
            from hetflow.collectives import gpu

            comm.last_path = "gpu"  # staged through the host, it becomes the host path
            return gpu.collective(comm, name, x, reduce_op, root, out, segments, check, to_all)
        x = np.asarray(x)
        result = reduce_host(comm, name, x, reduce_op, root, out, segments, check, to_all)
    except _mpi_exception() as exc:  # MPI's own error: as hetflow's, naming what and where
        raise CommError(f"{name} on rank {comm.rank}: MPI failed ({exc})"
                        + ("; with check=False, arguments that differ between ranks are not "
                           "found before the data moves: call with check=True to find them"
                           if not check else "")) from exc
    if check is True and comm.last_path == NATIVE:  # agreed on: prepare its repetitions
        comm._prepare(prepared_key(op, x, segments, None if to_all else root),
                      lambda: native.prepare(comm, name, x, reduce_op, root, to_all,
                                             functools.partial(_general, comm, name, op,
                                                               root, segments, to_all)))
    return result


def _general(comm, name, op, root, segments, to_all, x, out):
    """A checked call on the general path: what a prepared call hands back."""
    return _collective(comm, name, x, op, root, out, segments, True, to_all)


def prepared_key(op, x, segments, root):
    """The key of a prepared native call (``Communicator._prepared``); ``root`` None
    for allreduce. Built the same way by ``MPICommunicator``'s lookups."""
    return (op, x.dtype, x.shape, segments, root)


def _mpi_exception():
    """mpi4py's exception class once MPI is loaded (an exception no call raises, before)."""
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi.Exception if mpi is not None else _NoMPI


class _NoMPI(Exception):
    """Stands for mpi4py's exception class while MPI is not loaded."""


def reduce_host(comm, name, x, reduce_op, root, out, segments, check, to_all):
    """The collective on a host array ``x``, arguments other than arrays checked."""
    reduce_op.check(x.dtype)
    is_root = to_all or comm.rank == root
    if is_root:
        _check_out(x, out)
    else:
        out = None  # significant at the root only, as in MPI
    path = choose_path(comm, name, x, reduce_op)
    comm.last_path = path
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s of %d bytes (%s, op %s) on rank %d of %d: %s path", name, x.nbytes,
                  x.dtype, reduce_op.name, comm.rank, comm.size, path)
    if path == LOCAL:
        return run_host(comm, x, reduce_op, root, out, segments, to_all, is_root)
    transport = comm._transport(name)
    if check or path == SMALL:
        head = agreement.header(name, x.shape, x.dtype, reduce_op, 0 if to_all else root,
                                (segments, comm.min_segment_bytes), "host", path)
    if check:  # the same native call on every path: ranks on different paths meet
        agreement.ensure_agreed(comm, transport, head, always=check == ALWAYS)
    if path == NATIVE:
        return native.run(comm, name, x, reduce_op, root, out, to_all, is_root)
    if path == SMALL:  # checks again, in its own messages: free, and kept with check off
        value = agreement.small_allreduce(comm, transport, head, reduce_op,
                                          np.ascontiguousarray(x).reshape(-1))
        return _deliver(value, x, out) if is_root else None
    return run_host(comm, x, reduce_op, root, out, segments, to_all, is_root, transport)


def choose_path(comm, name, x, reduce_op) -> str:
    """The path a ``name`` collective of ``x`` with ``reduce_op`` takes on ``comm``.

    A function of what every rank agrees on (size, dtype, op, rank count, the
    communicator's thresholds), so all ranks choose alike when their calls match.
    """
    if comm.size == 1:
        return LOCAL
    limit = comm.native_bytes
    if limit is None:
        limit = native_crossover(name, comm.size)
    if x.nbytes <= limit and mpi_op_name(reduce_op, x.dtype):
        return NATIVE
    return SMALL if is_small(comm, x.nbytes) else PIPELINED


@functools.lru_cache(maxsize=64)  # on every call's critical path: latency counts
def native_crossover(name, size) -> int:
    """The crossover of ``name`` at ``size`` ranks: HETFLOW_COMM_NATIVE_BYTES when set
    (one size for both collectives, read once; to try crossovers on a new machine),
    else the measured one (:data:`NATIVE_BYTES`)."""
    value = os.environ.get("HETFLOW_COMM_NATIVE_BYTES")
    if value is not None:
        if not value.isdigit():
            raise ArgumentError("HETFLOW_COMM_NATIVE_BYTES must be a number of bytes, "
                                    f"not {value!r}")
        return int(value)
    classes = NATIVE_BYTES[name]
    return classes[max(c for c in classes if c <= max(size, 2))]


def is_small(comm, nbytes) -> bool:
    """Whether a message of ``nbytes`` takes the small-message path on ``comm``."""
    return nbytes <= min(comm.small_bytes, agreement.MAX_SMALL_BYTES)


def _deliver(value, x, out):
    result = out if out is not None else np.empty(x.shape, x.dtype)
    result[...] = value.reshape(x.shape)
    return result


def run_host(comm, x, reduce_op, root, out, segments, to_all, is_root, transport=None):
    """Run the pipelined schedule on host arrays; the result where there is one."""
    n = x.size
    steps = schedule.plan(comm.rank, comm.size, n, root, to_all)
    result = out if out is not None else (np.empty(x.shape, x.dtype) if is_root else None)
    if result is not None and result.flags.c_contiguous:
        work = result.reshape(-1)  # build the result in place
    elif result is not None:
        work = np.empty(n, x.dtype)
    else:  # a non-root process of reduce: its partial results are scratch
        work = comm._buffer("work", n * x.itemsize).view(x.dtype)
    source = _packed_source(x, work)
    if steps:
        helper = reduce_helper() if comm.reduce_thread and isinstance(reduce_op, BuiltinOp) \
            else None
        HostPipeline(transport, reduce_op, source, work, _scratch(comm, steps, x.dtype),
                     segments, min_segment_bytes=comm.min_segment_bytes,
                     helper=helper).run(steps)
    elif not same_memory(source, work):
        work[...] = source
    if result is not None and not result.flags.c_contiguous:
        result[...] = work.reshape(result.shape)
    return result


class HostPipeline:
    """Runs one process's steps over MPI, overlapping transfers and reductions."""

    def __init__(self, transport, reduce_op, source, work, scratch, segments,
                 chunk_bytes=None, min_segment_bytes=None, helper=None):
        self.transport = transport
        self.op = reduce_op
        self.source = source  # where sends and the first reduction read from
        self.work = work  # where the result is built
        self.scratch = scratch  # where segments to be reduced are received
        self.segments = segments
        self.min_segment_bytes = min_segment_bytes or MIN_SEGMENT_BYTES
        self.helper = helper  # an executor reducing while this thread moves data, or None
        chunk_bytes = chunk_bytes or PROGRESS_CHUNK_BYTES
        self.chunk = max(1, chunk_bytes // max(1, work.itemsize))  # elements

    def run(self, steps):
        for step in steps:
            if step.pipelined:
                self.pipelined_step(step)
            else:
                self.move_step(step)
            if step.reduce:
                self.source = self.work  # later steps send reduced data

    def pipelined_step(self, step):
        """Exchange halves with the partner segment by segment, reducing as they come."""
        sends = self._split(step.send)
        recvs = self._split(step.recv)
        if step.send and step.recv and _overlap(step.send, step.recv):
            # Recursive doubling sends the range it reduces into: no segment may be
            # reduced before the whole send has left.
            sends, recvs = sends and [step.send], recvs and [step.recv]
        base = step.recv[0] if step.recv else 0
        received = None  # the segment received last, still to be reduced
        for j in range(max(len(sends), len(recvs))):
            requests = []
            if j < len(recvs):
                lo, hi = recvs[j]
                requests.append(self.transport.irecv(self.scratch[lo - base:hi - base],
                                                     step.partner, step.tag))
            if j < len(sends):
                lo, hi = sends[j]
                requests.append(self.transport.isend(self.source[lo:hi],
                                                     step.partner, step.tag))
            reducing = None
            if received is not None and self.helper is not None:
                reducing = self.helper.submit(self.combine, received, base, [])
            elif received is not None:
                self.combine(received, base, requests)
            self.transport.wait(requests, step)
            if reducing is not None:
                reducing.result()
            received = recvs[j] if j < len(recvs) else None
        if received is not None:
            self.combine(received, base, [])

    def _split(self, rng):
        if not rng:
            return []
        count = schedule.segment_count(rng, self.segments, self.work.itemsize,
                                       self.min_segment_bytes)
        return schedule.split(rng, count)

    def move_step(self, step):
        """Send and receive whole ranges, received data going straight into place."""
        requests = []
        if step.recv and step.recv[1] > step.recv[0]:
            lo, hi = step.recv
            requests.append(self.transport.irecv(self.work[lo:hi], step.partner, step.tag))
        if step.send and step.send[1] > step.send[0]:
            lo, hi = step.send
            requests.append(self.transport.isend(self.source[lo:hi], step.partner, step.tag))
        if requests:
            self.transport.wait(requests, step)

    def combine(self, segment, base, requests):
        """Reduce received ``segment`` into the kept data, polling ``requests`` meanwhile."""
        lo, hi = segment
        pending = bool(requests)
        for start in range(lo, hi, self.chunk):
            stop = min(hi, start + self.chunk)
            self.op.combine(self.source[start:stop],
                            self.scratch[start - base:stop - base],
                            self.work[start:stop])
            if pending:
                pending = not self.transport.test(requests)


@functools.lru_cache(maxsize=1)
def reduce_helper() -> concurrent.futures.ThreadPoolExecutor:
    """The thread that reduces segments while the calling thread drives MPI
    (``Communicator.reduce_thread``): NumPy's ufuncs release the GIL, and MPICH's
    single-copy transfers run in whichever thread polls, so the two overlap on two
    cores instead of taking turns on one (docs/collectives.md)."""
    return concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="hetflow-reduce")


def _scratch(comm, steps, dtype):
    length = max((hi - lo for s in steps if s.reduce and s.recv for lo, hi in [s.recv]),
                 default=0)
    return comm._buffer("scratch", length * dtype.itemsize).view(dtype)


def _packed_source(x, work):
    """``x`` as a contiguous vector that the pipeline may read while writing ``work``."""
    if not x.flags.c_contiguous:
        return np.ascontiguousarray(x).reshape(-1)  # packs into a fresh vector
    flat = x.reshape(-1)
    if np.may_share_memory(flat, work) and not same_memory(flat, work):
        return flat.copy()  # out overlaps x, but not exactly: read from a copy
    return flat


def _overlap(a, b):
    return a[0] < b[1] and b[0] < a[1]


def _check_segments(segments):
    if type(segments) is int and segments >= 1:  # the common case, first: latency
        return
    if isinstance(segments, bool) or not isinstance(segments, (int, np.integer)) \
            or segments < 1:
        raise ArgumentError(f"segments must be an integer >= 1, not {segments!r}")


def _check_check(check):
    if check == ALWAYS or check in (True, False):
        return
    raise ArgumentError(f"check must be True, False or {ALWAYS!r}, not {check!r}")


def _check_root(root, size):
    if type(root) is int and 0 <= root < size:  # the common case, first: latency
        return
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)) \
            or not 0 <= root < size:
        raise ArgumentError(f"root must be a rank in 0..{size - 1}, not {root!r}")


def _check_out(x, out):
    if out is None:
        return
    if not isinstance(out, np.ndarray):
        raise ShapeError(f"out must be a NumPy array, not {type(out).__name__}")
    if out.shape != x.shape or out.dtype != x.dtype:
        raise ShapeError(f"out has shape {out.shape} and dtype {out.dtype}; "
                         f"the input has shape {x.shape} and dtype {x.dtype}")
    if not out.flags.writeable:
        raise ShapeError("out is read-only")


def _on_device(arr) -> bool:
    return arr is not None and type(arr) is not np.ndarray \
        and hasattr(arr, "__cuda_array_interface__")
