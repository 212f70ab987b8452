"""reduce/allreduce on GPU buffers (CuPy arrays, or anything with __cuda_array_interface__).

Between GPUs the schedule of :mod:`hetflow.collectives.schedule` runs over NCCL send/recv,
one NCCL communicator per process (one GPU each), its unique id broadcast over MPI.
Transfers go on a *communication* stream and reductions (CuPy element-wise ops, or
the user's op) on a *compute* stream; events order them, so segment j-1 is reduced
while segment j moves, with no host synchronisation inside the collective. The host
waits once at the end, polling an event against the timeout.

Without NCCL (or with HETFLOW_NCCL=0), and where ranks share a GPU (NCCL allows one
rank per GPU), data goes through host memory and the MPI engine.
"""
from __future__ import annotations

import os
import time

from hetflow.collectives import agreement, host, schedule
from hetflow.errors import ArgumentError, DeviceError, ShapeError
from hetflow.cuda_compat import cupy_module


# Each segment costs NCCL and kernel launches (~50 us of host time on an H200 host):
# halves are cut only into segments of at least this size (docs/collectives.md).
MIN_SEGMENT_BYTES = 32 << 20


def collective(comm, name, x, reduce_op, root, out, segments, check, to_all):
    """Entry point from :mod:`hetflow.collectives.host` for device arrays."""
    cp = _cupy()
    if not hasattr(x, "__cuda_array_interface__"):
        raise ShapeError(f"out is a GPU array but the input is {type(x).__name__}; "
                         "both must live on the GPU")
    x = cp.asarray(x)
    reduce_op.check(x.dtype)
    is_root = to_all or comm.rank == root
    out = _check_out(cp, x, out) if is_root else None
    with x.device:
        if comm.size > 1 and (_nccl() is None or not _gpus_distinct(comm, cp)):
            return _staged(comm, name, cp, x, reduce_op, root, out, segments, check,
                           to_all)
        small = host.is_small(comm, x.nbytes)
        if comm.size > 1 and check:
            head = agreement.header(name, x.shape, x.dtype, reduce_op,
                                    0 if to_all else root,
                                    (segments, comm.min_segment_bytes), "cuda",
                                    "small" if small else "pipelined")
            agreement.ensure_agreed(comm, comm._transport(name), head,
                                    always=check == host.ALWAYS)
        return _on_device(comm, name, cp, x, reduce_op, root, out, segments, to_all,
                          small, is_root)


def _on_device(comm, name, cp, x, reduce_op, root, out, segments, to_all, small, is_root):
    n = x.size
    steps = schedule.plan(comm.rank, comm.size, n, root, to_all, small)
    result = out if out is not None else (cp.empty(x.shape, x.dtype) if is_root else None)
    state = _state(comm, cp, x.device.id) if steps else None
    work = _flat_target(cp, state, result, x.dtype, n)
    source = _packed_source(cp, x, work)
    if not steps:
        if source.data.ptr != work.data.ptr:
            work[...] = source
    else:
        scratch_len = max((hi - lo for s in steps if s.reduce and s.recv
                           for lo, hi in [s.recv]), default=0)
        scratch = state.buffer("scratch", scratch_len * x.dtype.itemsize).view(x.dtype)
        DevicePipeline(state, comm._transport(name), reduce_op, source, work, scratch,
                       segments, comm.min_segment_bytes or MIN_SEGMENT_BYTES).run(steps)
    if result is not None and work.data.ptr != result.data.ptr:
        result[...] = work.reshape(result.shape)
    return result


def _staged(comm, name, cp, x, reduce_op, root, out, segments, check, to_all):
    """Without NCCL: through host memory and the MPI engine."""
    result = host.reduce_host(comm, name, cp.asnumpy(x), reduce_op, root, None,
                                     segments, check, to_all)
    if result is None:
        return None
    if out is None:
        return cp.asarray(result)
    out[...] = cp.asarray(result)
    return out


class DeviceState:
    """One process's NCCL communicator, streams and scratch buffers on its GPU."""

    def __init__(self, comm, cp, nccl, device_id):
        self.cp = cp
        self.nccl_module = nccl
        self.device_id = device_id
        uid = nccl.get_unique_id() if comm.rank == 0 else None
        uid = comm.bcast(uid, root=0)
        self.nccl = nccl.NcclCommunicator(comm.size, uid, comm.rank)
        self.comm_stream = cp.cuda.Stream(non_blocking=True)
        self.compute_stream = cp.cuda.Stream(non_blocking=True)
        # Events are re-recorded each time: a wait_event takes the state at the time
        # of the call, so one event per role suffices (no timing: cheaper to record).
        self.events = {role: cp.cuda.Event(disable_timing=True)
                       for role in ("ready", "reduced", "arrived", "done")}
        self.per_segment = []  # for fused steps, where segments are awaited one by one
        self.buffers = {}

    def segment_events(self, count):
        """``count`` reusable events, one per segment of a fused step."""
        while len(self.per_segment) < count:
            self.per_segment.append(self.cp.cuda.Event(disable_timing=True))
        return self.per_segment[:count]

    def record(self, role, stream):
        """Record the event for ``role`` on ``stream`` and return it."""
        event = self.events[role]
        event.record(stream)
        return event

    def buffer(self, role, nbytes):
        """A grow-only uint8 device buffer of at least ``nbytes`` for ``role``."""
        buf = self.buffers.get(role)
        if buf is None or buf.nbytes < nbytes:
            buf = self.cp.empty(max(nbytes, 1), dtype=self.cp.uint8)
            self.buffers[role] = buf
        return buf[:nbytes]


class DevicePipeline:
    """Runs one process's steps with NCCL on one stream and reductions on another."""

    def __init__(self, state, transport, reduce_op, source, work, scratch, segments,
                 min_segment_bytes):
        self.state = state
        self.cp = state.cp
        self.transport = transport  # for its timeout, and to mark the link broken
        self.op = reduce_op
        self.source = source
        self.work = work
        self.scratch = scratch
        self.segments = segments
        self.min_segment_bytes = min_segment_bytes

    def run(self, steps):
        state = self.state
        comm_s, compute_s = state.comm_stream, state.compute_stream
        ready = state.record("ready", self.cp.cuda.get_current_stream())  # writes to x
        comm_s.wait_event(ready)
        compute_s.wait_event(ready)
        i = 0
        while i < len(steps):
            step = steps[i]
            # Sends read what the compute stream reduced; receives reuse the scratch
            # the compute stream read: the transfer waits for the reductions so far.
            comm_s.wait_event(state.record("reduced", compute_s))
            following = steps[i + 1] if i + 1 < len(steps) else None
            if _collects_what_was_distributed(step, following):
                self.fused_steps(step, following)
                i += 1
            elif step.pipelined:
                self.pipelined_step(step)
            else:
                self._transfer(step.send, self.source, step.recv, self.work, 0, step.partner)
            if step.reduce:
                self.source = self.work
            i += 1
        comm_s.wait_event(state.record("reduced", compute_s))
        self._wait(state.record("done", comm_s), steps[-1])

    def pipelined_step(self, step):
        """Segment j moves on the communication stream while j-1 is reduced."""
        sends = self._split(step.send)
        recvs = self._split(step.recv)
        if step.send and step.recv and host._overlap(step.send, step.recv):
            sends, recvs = sends and [step.send], recvs and [step.recv]
        base = step.recv[0] if step.recv else 0
        for j in range(max(len(sends), len(recvs))):
            send = sends[j] if j < len(sends) else None
            recv = recvs[j] if j < len(recvs) else None
            self._transfer(send, self.source, recv, self.scratch, base, step.partner)
            if recv is not None:
                self.state.compute_stream.wait_event(
                    self.state.record("arrived", self.state.comm_stream))
                lo, hi = recv
                with self.state.compute_stream:
                    self.op.combine(self.source[lo:hi], self.scratch[lo - base:hi - base],
                                    self.work[lo:hi], xp=self.cp)

    def fused_steps(self, distribution, collection):
        """The last distribution step and the first collection step, overlapped.

        Both are with the same partner: a segment of this process's block goes back
        to the partner (collection) as soon as it is reduced, while the next segment
        of the distribution step is still arriving; the reductions hide behind
        transfers and the collection no longer waits for the last one.
        """
        state = self.state
        sends = self._split(distribution.send)
        recvs = self._split(distribution.recv)
        base = distribution.recv[0]
        reduced = state.segment_events(max(len(sends), len(recvs)))
        partner = distribution.partner
        for j in range(max(len(sends), len(recvs))):
            self._transfer(_at(sends, j), self.source, _at(recvs, j), self.scratch, base,
                           partner)
            if j < len(recvs):
                state.compute_stream.wait_event(state.record("arrived", state.comm_stream))
                lo, hi = recvs[j]
                with state.compute_stream:
                    self.op.combine(self.source[lo:hi], self.scratch[lo - base:hi - base],
                                    self.work[lo:hi], xp=self.cp)
                reduced[j].record(state.compute_stream)
            if j > 0:
                self._collect(j - 1, sends, recvs, reduced, partner)
        self._collect(max(len(sends), len(recvs)) - 1, sends, recvs, reduced, partner)

    def _split(self, rng):
        if not rng:
            return []
        count = schedule.segment_count(rng, self.segments, self.work.itemsize,
                                       self.min_segment_bytes)
        return schedule.split(rng, count)

    def _collect(self, j, sends, recvs, reduced, partner):
        """Send reduced segment j of this block; receive the partner's segment j."""
        if j < 0:
            return
        if j < len(recvs):
            self.state.comm_stream.wait_event(reduced[j])
        self._transfer(_at(recvs, j), self.work, _at(sends, j), self.work, 0, partner)

    def _transfer(self, send, send_buf, recv, recv_buf, recv_base, partner):
        """Enqueue one send and/or receive (element ranges) on the communication stream."""
        nccl, comm = self.state.nccl_module, self.state.nccl
        stream = self.state.comm_stream.ptr
        itemsize = self.work.itemsize
        nccl.groupStart()
        try:
            if send is not None and send[1] > send[0]:
                comm.send(send_buf.data.ptr + send[0] * itemsize,
                          (send[1] - send[0]) * itemsize, nccl.NCCL_UINT8, partner, stream)
            if recv is not None and recv[1] > recv[0]:
                comm.recv(recv_buf.data.ptr + (recv[0] - recv_base) * itemsize,
                          (recv[1] - recv[0]) * itemsize, nccl.NCCL_UINT8, partner, stream)
        finally:
            nccl.groupEnd()

    def _wait(self, event, last_step):
        """Poll the final event; abort NCCL and raise CommTimeoutError past the timeout."""
        timeout = self.transport.timeout
        deadline = time.monotonic() + timeout
        while not event.done:
            os.sched_yield()  # not time.sleep(0): that sleeps a timer slack (~50 us)
            if time.monotonic() > deadline:
                self.state.nccl.abort()  # frees the streams stuck in NCCL kernels
                self.transport.fail(
                    f"GPU transfers did not finish within {timeout:g} s (last step: "
                    f"{last_step.phase} with rank {last_step.partner}); a peer died or "
                    "never made this call")


def _collects_what_was_distributed(step, following):
    """True when ``following`` sends back exactly the block ``step`` reduces.

    That is the last distribution step and the first collection step of allreduce.
    """
    return (following is not None and step.phase == schedule.DISTRIBUTION
            and following.phase == schedule.COLLECTION and following.partner == step.partner
            and following.send == step.recv and following.recv == step.send)


def _at(segments, j):
    return segments[j] if j < len(segments) else None


def _state(comm, cp, device_id):
    link = comm.link
    if link.device_state is None:
        link.device_state = DeviceState(comm, cp, _nccl(), device_id)
    elif link.device_state.device_id != device_id:
        raise ArgumentError(
            f"one GPU per process: this communicator's NCCL communicator is on device "
            f"{link.device_state.device_id}, the array on device {device_id}")
    return link.device_state


def _flat_target(cp, state, result, dtype, n):
    if result is not None and result.flags.c_contiguous:
        return result.reshape(-1)
    if result is not None or state is None:
        return cp.empty(n, dtype)
    return state.buffer("work", n * dtype.itemsize).view(dtype)


def _packed_source(cp, x, work):
    if not x.flags.c_contiguous:
        return cp.ascontiguousarray(x).reshape(-1)
    flat = x.reshape(-1)
    same = flat.data.ptr == work.data.ptr and flat.nbytes == work.nbytes
    if same or not cp.may_share_memory(flat, work):
        return flat
    return flat.copy()


def _check_out(cp, x, out):
    if out is None:
        return None
    if not isinstance(out, cp.ndarray):
        raise ShapeError(f"out must be a CuPy array like the input, not {type(out).__name__}")
    if out.shape != x.shape or out.dtype != x.dtype:
        raise ShapeError(f"out has shape {out.shape} and dtype {out.dtype}; "
                         f"the input has shape {x.shape} and dtype {x.dtype}")
    if out.device.id != x.device.id:
        raise ShapeError(f"out is on device {out.device.id}, the input on {x.device.id}")
    return out


def _cupy():
    cp = cupy_module()
    if cp is None:
        raise DeviceError("a GPU array was passed but CuPy with a working GPU is not "
                          "available; install cupy for your CUDA version")
    return cp


def _gpus_distinct(comm, cp):
    """Whether no two ranks use the same GPU; asked of all ranks once per communicator,
    so every rank takes the same path."""
    link = comm.link
    if link.gpus_distinct is None:
        bus_id = cp.cuda.runtime.deviceGetPCIBusId(cp.cuda.Device().id)
        ids = comm.allgather((os.uname().nodename, bus_id))
        link.gpus_distinct = len(set(ids)) == len(ids)
    return link.gpus_distinct


def _nccl():
    """cupy.cuda.nccl, or None when absent or disabled by HETFLOW_NCCL=0."""
    if os.environ.get("HETFLOW_NCCL", "1") == "0":
        return None
    try:
        from cupy.cuda import nccl
    except ImportError:
        return None
    return nccl if getattr(nccl, "available", False) else None
