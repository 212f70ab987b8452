"""Non-blocking point-to-point transfers over MPI, waited on with a deadline.

Every wait is a polling loop over ``Request.Testall``, spinning at first and then
sleeping with a growing backoff: a peer that died or never arrives turns into
CommTimeoutError instead of a hang, without burning a core meanwhile, and each poll drives
MPI's progress engine (MPICH moves large messages only inside MPI calls unless
``MPIR_CVAR_ASYNC_PROGRESS`` is set; docs/collectives.md has the measurements).
"""
from __future__ import annotations

import functools
import os
import time

import numpy as np

from hetflow.errors import CommError, CommTimeoutError

# A wait spins on Testall and, every _SPINS_PER_LOOK polls, reads the clock (for the
# deadline) and yields the CPU. On a core of its own the yield returns at once; when
# cores are shared (more ranks than cores, or other programs) it hands the core to a
# peer that may be the one we wait for, instead of spinning out our time slice.
_SPINS_PER_LOOK = 16
# After _SPIN_S of that, a wait polls between sleeps growing from _MIN_SLEEP to _MAX_SLEEP:
# a peer that died (or is far behind) no longer costs a full core until the deadline. A
# healthy collective step ends within the spin (each poll drives MPI's progress engine).
_SPIN_S = 0.1
_MIN_SLEEP, _MAX_SLEEP = 50e-6, 2e-3


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

    def wait(self, requests, what, test=None) -> None:
        """Poll ``requests`` until done; CommTimeoutError after ``timeout`` seconds.

        ``what`` names the wait in the error: a string, or the schedule Step. ``test()``:
        how to poll them, when not ``MPI_Testall`` (see ``native.PersistentAllreduce``).
        """
        test = test or functools.partial(self.link.MPI.Request.Testall, requests)
        if test():
            return
        now = time.monotonic()
        deadline, spin_until = now + self.timeout, now + _SPIN_S
        spins, pause = 0, _MIN_SLEEP
        while not test():
            spins += 1
            if spins % _SPINS_PER_LOOK:
                continue
            now = time.monotonic()
            if now > deadline:
                self.fail(f"{_describe(what)}: no answer within {self.timeout:g} s; "
                          "the peer died or never made this call")
            if self.link.watch is not None:
                self.link.watch(now)
            if now < spin_until:
                os.sched_yield()
            else:  # backing off: sleep after every poll
                time.sleep(pause)
                pause = min(2 * pause, _MAX_SLEEP)
                spins = _SPINS_PER_LOOK - 1

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
