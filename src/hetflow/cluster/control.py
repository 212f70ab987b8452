"""The control channel of a distributed run: waits with deadlines, abort notices, and
small object exchanges between ranks.

Each process of a run owns one :class:`Channel` over a private duplicate of the world
communicator, so its messages (halo rows, moved rows, control objects, abort notices)
never match the collectives' or the user's. Every wait polls its requests *and* the
abort notices: when a rank fails it posts a notice to every other rank
(:meth:`Channel.abort`), and a rank waiting anywhere in a distributed run raises the
failed rank's error instead of hanging: a RemoteError that is also of the failed rank's
hetflow class (``except ShapeError`` catches a ShapeError raised on another rank), naming
that rank and carrying its message (:func:`remote_error`). A wait that outlasts
``timeout`` seconds raises CommTimeoutError. Either way the channel is then *broken*:
requests still in flight are cancelled where MPI can, and every later use raises the
same error at once.

Ranks check that they made the same call with :meth:`Channel.agreed` (one tiny native
allreduce of a digest when they did); :func:`settle` turns a call that failed on some
ranks only, or that differs between ranks, into the same error on every rank.

:class:`LocalChannel` is the one-process channel of a run not started by an MPI
launcher: there is nobody to wait for.
"""
from __future__ import annotations

import functools
import os
import time

import numpy as np

from hetflow import errors
from hetflow.collectives.agreement import digest_of
from hetflow.errors import CommError, CommTimeoutError, RemoteError

# Tags of the channel's private communicator. Halo and row-moving tags are
# HALO_TAG/MOVE_TAG + 4 * (array serial mod TAG_SERIALS) + direction; all stay below
# 32767, the least tag upper bound MPI guarantees.
HALO_TAG = 1_000
MOVE_TAG = 17_000
TAG_SERIALS = 1_000
GATHER_TAG = 30_001
BCAST_TAG = 30_002
SEND_TAG = 30_003
ABORT_TAG = 30_100

_SPINS_PER_LOOK = 16
# A wait longer than this stops spinning and sleeps between looks: a rank idle for a
# while (waiting for a slower neighbour, or for its turn in a benchmark) gives its core
# back, at a cost in latency that is small next to the wait itself.
_SPIN_SECONDS = 5e-3
_NAP_SECONDS = 1e-4
# How long a failing rank waits for its abort notices to leave (they are small, so MPI
# sends them eagerly: they leave at once unless the peer is gone).
_NOTICE_SECONDS = 2.0


class Channel:
    """Point-to-point messaging among ``size`` processes over an mpi4py communicator.

    ``comm``: the mpi4py communicator to use (a private duplicate); ``timeout``: the
    seconds any one wait may last; ``link``: the collectives' link, marked broken when
    this channel breaks so that collectives on it fail at once too.
    """

    def __init__(self, mpi, comm, timeout: float, link=None):
        self.MPI = mpi
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.timeout = timeout
        self.link = link
        self.broken: CommError | None = None
        # agreed()'s buffers: an allreduce left behind by a timeout may still write them
        self._stamp, self._seen = np.zeros(2, np.int64), np.zeros(2, np.int64)

    # -- waiting -----------------------------------------------------------------------
    def usable(self) -> None:
        """Raise the error that broke the channel, if one did."""
        if self.broken is not None:
            raise type(self.broken)(str(self.broken))

    def check(self) -> None:
        """A safe point: the failed rank's error (:func:`remote_error`) when another
        rank has failed."""
        self.usable()
        self._poll_notice(())

    def wait(self, requests, what: str, expired=None, test=None, peers=None) -> None:
        """Poll ``requests`` until all complete (``test()`` polls them, when not
        ``MPI_Testall``).

        :func:`remote_error` when a failure notice arrives first, CommTimeoutError after
        ``timeout`` seconds (``expired(reason)`` raises instead, when given), CommError
        when a rank it waits for ended (``peers``: those ranks; None: a call of every
        rank). ``what`` names the wait in the errors.
        """
        testall = self.MPI.Request.Testall
        self._until(test or (lambda: testall(requests)), what, requests, expired, peers)

    def _until(self, ready, what: str, requests=(), expired=None, peers=None):
        """Call ``ready()`` until it gives something true, and return that; watch for
        failure notices, ended ``peers`` and the deadline meanwhile (cancelling
        ``requests`` on any)."""
        self.usable()
        found = ready()
        if found:
            return found
        start = time.monotonic()
        spins = 0
        while True:
            found = ready()
            if found:
                return found
            spins += 1
            if spins % _SPINS_PER_LOOK:
                continue
            self._poll_notice(requests)
            now = time.monotonic()
            self._watch(now, requests, peers)
            if now - start > self.timeout:
                self._cancel(requests)
                reason = (f"{what}: no answer within {self.timeout:g} s; "
                          "the peer died or never made this call")
                self._break(CommTimeoutError(f"rank {self.rank}: {reason}"))
                if expired is not None:
                    expired(reason)  # raises its own error
                raise self.broken
            if now - start > _SPIN_SECONDS:
                time.sleep(_NAP_SECONDS)
            else:
                os.sched_yield()

    def _watch(self, now: float, requests, peers) -> None:
        """CommError (the channel broken) once the link's liveness check finds a dead
        peer, or one of ``peers`` ended (see :class:`hetflow.collectives.comm.Peers`)."""
        watch = None if self.link is None else self.link.watch
        if watch is None:
            return
        try:
            watch.look(now, peers)  # (this wait polls the abort notices itself)
        except CommError as error:
            self._cancel(requests)
            if self.broken is None:  # (another rank's notice, heard there, broke it already)
                self._break(error)
            raise

    def _poll_notice(self, requests) -> None:
        message = self.comm.improbe(self.MPI.ANY_SOURCE, ABORT_TAG)
        if message is None:
            return
        error = remote_error(*message.recv())
        self._cancel(requests)
        # Later uses refuse with a plain RemoteError: they are not the failed call.
        self._break(RemoteError(str(error)))
        raise error

    def _cancel(self, requests) -> None:
        # Receives cancel reliably; a large send whose receiver is gone may not, and is
        # left behind (MPI_Finalize does not wait for it), as is a collective's request
        # (the collectives' argument check and native path), which MPI cannot cancel.
        # (Test too may raise: MPICH at times reports a completed persistent collective
        # tested without a status as an error; the failure being raised is the news.)
        for request in requests:
            try:
                if request != self.MPI.REQUEST_NULL and not request.Test():
                    request.Cancel()
            except self.MPI.Exception:
                pass

    def _break(self, error: CommError) -> None:
        self.broken = error
        if self.link is not None:
            self.link.broken = str(error)

    # -- failure -----------------------------------------------------------------------
    def abort(self, exc: BaseException) -> None:
        """Tell every other rank that this one failed with ``exc`` (they raise
        :func:`remote_error` at their next wait or safe point); the channel is broken
        after. Nothing to tell when this rank's failure was another rank's."""
        if self.broken is not None and isinstance(self.broken, RemoteError):
            return  # another rank failed first: everyone has been told
        notice = (self.rank, type(exc).__name__, str(exc))
        requests = [self.comm.isend(notice, peer, ABORT_TAG)
                    for peer in range(self.size) if peer != self.rank]
        deadline = time.monotonic() + _NOTICE_SECONDS
        while not self.MPI.Request.Testall(requests) and time.monotonic() < deadline:
            time.sleep(_NAP_SECONDS)
        self.broken = CommError(f"rank {self.rank} failed ({type(exc).__name__}: {exc}); "
                                "the distributed run was stopped")
        if self.link is not None:
            self.link.broken = str(self.broken)

    # -- arrays ------------------------------------------------------------------------
    def isend(self, buf, dest: int, tag: int):
        """Post the send of a contiguous host array (as bytes); returns the request."""
        return self.comm.Isend(_bytes(buf), dest, tag)

    def irecv(self, buf, source: int, tag: int):
        """Post the receive of a contiguous host array (as bytes); returns the request."""
        return self.comm.Irecv(_bytes(buf), source, tag)

    # -- objects -----------------------------------------------------------------------
    def send(self, obj, dest: int, tag: int = SEND_TAG) -> None:
        """Send a picklable ``obj`` to ``dest`` and wait until it has left."""
        self.usable()
        self.wait([self.comm.isend(obj, dest, tag)], f"sending to rank {dest}", peers=(dest,))

    def recv(self, source: int, tag: int = SEND_TAG):
        """The next picklable object ``source`` sends with ``tag``."""
        message = self._until(lambda: self.comm.improbe(source, tag), f"receiving from rank {source}",
                              peers=(source,))
        return message.recv()

    # Control objects are small and few (a report per rank every few iterations), so the
    # root talks to every rank in turn rather than along a tree.
    def gather(self, obj, root: int = 0) -> list | None:
        """Every rank's ``obj`` as a list at ``root`` (None elsewhere)."""
        if self.rank != root:
            self.send(obj, root, GATHER_TAG)
            return None
        return [obj if r == root else self.recv(r, GATHER_TAG) for r in range(self.size)]

    def bcast(self, obj, root: int = 0):
        """``root``'s ``obj`` on every rank."""
        if self.rank != root:
            return self.recv(root, BCAST_TAG)
        self.usable()
        others = [r for r in range(self.size) if r != root]
        self.wait([self.comm.isend(obj, r, BCAST_TAG) for r in others], f"broadcasting from rank {root}",
                  peers=others)
        return obj

    def allgather(self, obj) -> list:
        """Every rank's ``obj``, as a list indexed by rank, on every rank."""
        return self.bcast(self.gather(obj, 0), 0)

    def barrier(self) -> None:
        """Return once every rank has called it (RemoteError when one failed instead)."""
        self.bcast(self.gather(None, 0), 0)

    def agreed(self, facts) -> list | None:
        """None when every rank passed equal ``facts``, else every rank's, by rank, on
        every rank (a call of every rank). Equal facts cost one tiny native allreduce of
        their digests; ``facts`` (a tuple, picklable) must print alike on every rank."""
        if self.link is not None and self.link.watch is not None:
            self.link.watch.calls += 1  # a call of every rank, as the collectives' are
        digest = digest_of(facts)
        self._stamp[0], self._stamp[1] = digest, -digest
        self.wait([self.comm.Iallreduce(self._stamp, self._seen, op=self.MPI.MAX)],
                  "checking that all ranks made the same call")
        if self._seen[0] == -self._seen[1]:
            return None
        return self.allgather(facts)


class LocalChannel:
    """The channel of a one-process run: nothing to wait for, nobody to tell."""

    rank = 0
    size = 1

    def __init__(self, timeout: float):
        self.timeout = timeout

    def check(self) -> None:
        """Nothing can have failed elsewhere."""

    def abort(self, exc: BaseException) -> None:
        """Nobody to tell; the process may run again."""

    def gather(self, obj, root: int = 0) -> list:
        return [obj]

    def bcast(self, obj, root: int = 0):
        return obj

    def allgather(self, obj) -> list:
        return [obj]

    def barrier(self) -> None:
        return None

    def agreed(self, facts) -> None:
        """One rank always agrees with itself."""
        return None


def settle(channel, facts: tuple, failure: Exception | None, what: str) -> None:
    """Raise the same error on every rank unless all ranks passed equal ``facts`` and
    none failed (``failure``: this rank's exception, or None); a call of every rank.

    Ranks that all failed alike raise their own errors. Otherwise every rank raises the
    lowest failing rank's type of hetflow error (CommError for another type), naming the
    failing ranks and their messages (each with its class where that is no hetflow
    error's); or, where none failed, CommError naming each rank's ``facts``. ``what``
    names the call.
    """
    mine = (None, (type(failure).__name__, str(failure))) if failure is not None else (facts, None)
    everyone = channel.agreed(mine)
    if everyone is None:
        if failure is not None:
            raise failure
        return
    raise _disagreement(everyone, what, channel.size) from failure


def _disagreement(everyone: list, what: str, size: int) -> CommError:
    failed = {rank: failure for rank, (_, failure) in enumerate(everyone) if failure is not None}
    if not failed:
        calls = "; ".join(f"rank {rank}: {facts}" for rank, (facts, _) in enumerate(everyone))
        return CommError(f"{what}: the ranks made different calls ({calls})")
    ranks = ", ".join(map(str, failed))
    kinds = set(failed.values())
    if len(kinds) == 1:
        kind, message = kinds.pop()
        # A hetflow error's class is the one raised; another class would be lost.
        detail = message if _error_class(kind).__name__ == kind else f"{kind}: {message}"
    else:
        detail = "; ".join(f"rank {rank}: {kind}: {message}" for rank, (kind, message) in failed.items())
    return _error_class(next(iter(failed.values()))[0])(
        f"{what} failed on rank{'s' if len(failed) > 1 else ''} {ranks} (of {size}): {detail}")


def remote_error(rank: int, kind: str, text: str) -> RemoteError:
    """The error that rank ``rank``'s failure (an exception of class ``kind``, message
    ``text``) raises on the other ranks: a RemoteError that is also of hetflow's class
    ``kind``, so that every rank can catch the failing rank's type; a plain RemoteError
    where ``kind`` is no hetflow class (the message says which it was)."""
    return _remote_class(kind)(f"rank {rank} raised {kind}: {text}")


@functools.cache
def _remote_class(kind: str) -> type:
    found = _error_class(kind)
    if issubclass(RemoteError, found):  # CommError or no hetflow class: RemoteError says it all
        return RemoteError
    return type(found.__name__, (found, RemoteError), {
        "__doc__": f"A {found.__name__} raised on another rank (see control.remote_error).",
        "__module__": __name__, "__reduce__": _reduce_remote})


def _reduce_remote(error):
    # The class is made at run time: pickle rebuilds the error from its hetflow class.
    return _error_class(type(error).__name__), (str(error),)


def _error_class(name: str) -> type:
    """hetflow's error class called ``name``; CommError for a name that is none."""
    found = getattr(errors, name, None)
    return found if isinstance(found, type) and issubclass(found, errors.HetflowError) else CommError


def _bytes(buf: np.ndarray) -> np.ndarray:
    # Everything travels as bytes: MPI needs no datatype for structured elements, and
    # both sides agreed on the dtype when the array was made. Callers pass contiguous
    # buffers, so this is a view, never a copy.
    return buf.reshape(-1).view(np.uint8)


def describe_step(what) -> str:
    """A collective's wait as words: a string as it is, a schedule step by its fields."""
    if isinstance(what, str):
        return what
    return f"{what.phase} phase, step {what.k}, partner rank {what.partner}"
