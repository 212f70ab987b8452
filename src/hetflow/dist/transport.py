"""Non-blocking point-to-point transfers over MPI, waited on with a deadline.

Every wait is a polling loop over ``Request.Testall``: a peer that died or never
arrives turns into CommTimeoutError instead of a hang, and each poll also drives
MPI's progress engine (MPICH moves large messages only inside MPI calls unless
``MPIR_CVAR_ASYNC_PROGRESS`` is set; docs/collectives.md has the measurements).
"""
from __future__ import annotations

import os
import time

import numpy as np

from hetflow.errors import CommError, CommTimeoutError

# A wait spins on Testall and, every _SPINS_PER_LOOK polls, reads the clock (for the
# deadline) and yields the CPU. On a core of its own the yield returns at once; when
# cores are shared (more ranks than cores, or other programs) it hands the core to a
# peer that may be the one we wait for, instead of spinning out our time slice.
_SPINS_PER_LOOK = 16


class Link:
    """A duplicated MPI communicator shared by the Communicator objects over it.

    A timeout leaves messages in flight whose matching is unknown, so the link is
    marked broken and every later collective on it fails at once.
    """

    def __init__(self, mpi, comm):
        self.MPI = mpi
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.broken = None  # the reason, once a collective timed out
        self.buffers = {}  # reusable scratch, by role: faulting fresh pages is costly
        self.device_state = None  # gpu.DeviceState, built by the first GPU collective
        self.gpus_distinct = None  # whether every rank has a GPU of its own (NCCL needs it)
        self.watch = None  # watch(now), called during waits: CommError once a peer died (comm.Peers)

    def ensure_usable(self):
        if self.broken:
            raise CommError(f"communicator unusable: {self.broken}")

    def buffer(self, role: str, nbytes: int) -> np.ndarray:
        """A grow-only uint8 scratch buffer of at least ``nbytes`` for ``role``."""
        buf = self.buffers.get(role)
        if buf is None or buf.nbytes < nbytes:
            buf = np.empty(max(nbytes, 1), dtype=np.uint8)
            self.buffers[role] = buf
        return buf[:nbytes]


class Transport:
    """Posts Isend/Irecv of contiguous arrays and waits on them with a deadline."""

    def __init__(self, link: Link, timeout: float, collective: str):
        self.link = link
        self.timeout = timeout
        self.collective = collective

    def isend(self, arr: np.ndarray, dest: int, tag: int):
        return self.link.comm.Isend(_as_bytes(arr), dest, tag)

    def irecv(self, arr: np.ndarray, source: int, tag: int):
        return self.link.comm.Irecv(_as_bytes(arr), source, tag)

    def test(self, requests) -> bool:
        """One progress poll: True once every request has completed."""
        return self.link.MPI.Request.Testall(requests)

    def wait(self, requests, what) -> None:
        """Poll ``requests`` until done; CommTimeoutError after ``timeout`` seconds.

        ``what`` names the wait in the error: a string, or the schedule Step.
        """
        test = self.link.MPI.Request.Testall
        if test(requests):
            return
        deadline = time.monotonic() + self.timeout
        spins = 0
        while not test(requests):
            spins += 1
            if spins % _SPINS_PER_LOOK == 0:
                now = time.monotonic()
                if now > deadline:
                    self.fail(f"{_describe(what)}: no answer within {self.timeout:g} s; "
                              "the peer died or never made this call")
                if self.link.watch is not None:
                    self.link.watch(now)
                os.sched_yield()

    def fail(self, reason: str):
        self.link.broken = f"{self.collective} timed out ({reason})"
        raise CommTimeoutError(f"{self.collective} on rank {self.link.rank}: {reason}")


def _describe(what) -> str:
    if isinstance(what, str):
        return what
    return f"{what.phase} phase, step {what.k}, partner rank {what.partner}"


def _as_bytes(arr: np.ndarray) -> np.ndarray:
    # Everything travels as bytes: MPI needs no datatype for structured or float16
    # elements, and ranks have agreed on the dtype beforehand.
    if arr.dtype == np.uint8:
        return arr
    return arr.reshape(-1).view(np.uint8)
