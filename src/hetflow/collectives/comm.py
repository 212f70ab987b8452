"""Communicators: the processes a collective runs over.

``world()`` gives a communicator over MPI's ``COMM_WORLD`` when the process was started
by an MPI launcher (mpiexec, mpirun, srun), and a one-process communicator otherwise;
mpi4py is imported only in the first case, so a plain ``python`` run needs no MPI.

Every wait polls with a deadline (``timeout`` seconds, default ``HETFLOW_COMM_TIMEOUT``
or 300): a peer that died or never arrives raises CommTimeoutError instead of hanging.

Dead ranks. Under a launcher, an exception nobody catches (in the main thread or any
other) prints its traceback and aborts the whole run (``MPI_Abort``), as
``python -m mpi4py`` does, and a fatal signal prints the Python stack
(:mod:`faulthandler`) before the launcher tears the run down. A rank that dies without
a word (SIGKILL, the OOM killer) while others wait for it is noticed by
:class:`Peers`: waits check, twice a second, that the ranks on this host are still
running and that the launcher is still this process's parent, and raise CommError
naming the dead rank within about a second. (Ranks on other hosts are left to the
launcher, which ends the run when one of its processes dies.)

Ended ranks. A rank whose program ends (its script returns, or calls ``sys.exit``
with any code) while others still wait for it would leave them waiting: MPICH keeps
its process in ``MPI_Finalize`` until they end. On its way out it tells every other
rank how many calls of every rank it made; a wait for it (a collective it never
joined, a transfer with it) then raises CommError naming it within about a second.
"""
from __future__ import annotations

import abc
import atexit
import faulthandler
import functools
import os
import pickle
import sys
import threading
import time

import numpy as np

from hetflow.collectives import agreement, host, native
from hetflow.collectives.transport import Link, Transport
from hetflow.errors import ArgumentError, CommError

DEFAULT_TIMEOUT = 300.0

# Variables that MPI launchers set in the processes they start: MPICH/Intel (PMI_*),
# PMIx-based ones (Open MPI 5, srun --mpi=pmix), Open MPI, MVAPICH and Slurm's srun.
# Those naming the process's rank come first.
_RANK_VARIABLES = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID")
_LAUNCHER_VARIABLES = _RANK_VARIABLES + ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE")


def launched_by_mpi() -> bool:
    """True when an MPI launcher started this process."""
    return any(name in os.environ for name in _LAUNCHER_VARIABLES)


def launcher_rank() -> int | None:
    """This process's rank as its launcher set it in the environment (None where no
    launcher says), known without starting MPI."""
    for name in _RANK_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def world(timeout: float | None = None) -> "Communicator":
    """The communicator over all processes of this run (one process when not launched).

    ``timeout``: seconds a wait may last before CommTimeoutError; defaults to the
    environment variable HETFLOW_COMM_TIMEOUT, else 300. Under MPI the first call is
    collective (it duplicates COMM_WORLD): every process must make it, or the others'
    first call raises CommTimeoutError after ``timeout`` and their later ones CommError.
    """
    timeout = _resolve_timeout(timeout)
    if launched_by_mpi():
        return MPICommunicator(_world_link(timeout), timeout)
    return SelfCommunicator(timeout)


class _Threshold:
    """A path threshold of a communicator: setting it drops the prepared native calls,
    whose path it decided."""

    def __init__(self, default):
        self.default = default

    def __set_name__(self, owner, name):
        self.slot = "_" + name

    def __get__(self, comm, owner=None):
        return self.default if comm is None else comm.__dict__.get(self.slot, self.default)

    def __set__(self, comm, value):
        comm.__dict__[self.slot] = value
        comm._drop_prepared()


class Communicator(abc.ABC):
    """A group of ``size`` processes; this one is number ``rank``.

    ``native_bytes``: messages of built-in ops on dtypes MPI reduces, up to this size,
    go to MPI's own collective (default None: the measured crossover,
    ``host.NATIVE_BYTES``, by collective and rank count; 0 turns it off).
    ``small_bytes``: other messages up to this size (default 64 KiB, at most 256 KiB)
    take the small-message path, recursive doubling on whole vectors; larger ones the
    pipelined halving. ``min_segment_bytes``: no segment is cut smaller than this
    (default None: 1 MiB for host buffers, 32 MiB for GPU ones), so ``segments``
    applies to large messages only. All three must be the same on every rank (a
    difference is reported as CommError). ``reduce_thread``: on the pipelined
    path, built-in ops reduce in a helper thread while the calling thread moves data
    (default False; it pays where each rank has a spare core). ``last_path``: the path of this
    process's last collective (``host.choose_path``). ``timeout``: seconds
    any one wait may last.
    """

    rank: int = 0
    size: int = 1
    native_bytes = _Threshold(None)
    small_bytes = _Threshold(host.SMALL_BYTES)
    min_segment_bytes = _Threshold(None)
    reduce_thread: bool = False
    last_path: str | None = None

    def __init__(self, timeout: float):
        self.timeout = timeout
        self._agreed = set()  # argument heads all ranks agreed on (agreement.ensure_agreed)
        self._prepared = {}  # native calls ready to repeat, by host.prepared_key
        self._prepared_bytes = 0  # the buffers they keep

    def allreduce(self, x, op="sum", out=None, segments=2, check=True):
        """Reduce ``x`` element-wise over all processes; every process gets the result.

        ``op``: 'sum', 'prod', 'min', 'max', 'land', 'lor', 'lxor', 'band', 'bor',
        'bxor', a callable ``op(a, b, out)`` or a binary hetflow kernel. ``out``: an
        array of x's shape and dtype to hold the result (may be ``x`` itself).
        ``segments``: pieces each half is cut into, to overlap transfer and reduction.
        ``check``: verify that all ranks agree on length, dtype, op, root and segments
        before the data moves (one tiny native MPI_Iallreduce; CommError on
        every rank when they do not). True (the default) checks the first call of each
        such signature on this communicator and trusts its repetitions; 'always'
        checks every call; False none. Small messages of ops MPI cannot reduce
        natively are always checked: the check rides with their data. Below a
        measured size, built-in ops run MPI's own collective (``last_path`` says which
        path a call took). Returns the result (``out`` when given); NumPy in, NumPy
        out; CuPy in, CuPy out. Every rank must make the same collective calls in the
        same order, as in MPI.
        """
        return host.allreduce(self, x, op, out, segments, check)

    def reduce(self, x, op="sum", root=0, out=None, segments=2, check=True):
        """Like :meth:`allreduce`, but only ``root`` gets the result; others get None."""
        return host.reduce(self, x, op, root, out, segments, check)

    def _prepare(self, key, make):
        """Keep the native call ``make()`` for repetitions of ``key``."""
        if key not in self._prepared:
            call = make()
            if len(self._prepared) >= native.MAX_PREPARED \
                    or self._prepared_bytes + call.nbytes > native.MAX_PREPARED_BYTES:
                self._drop_prepared()
            self._prepared[key] = call
            self._prepared_bytes += call.nbytes

    def _drop_prepared(self):
        for call in self._prepared.values():
            call.free()
        self._prepared.clear()
        self._prepared_bytes = 0

    def _forget(self):
        """Forget every agreed head and the prepared calls resting on them."""
        self._agreed.clear()
        self._drop_prepared()

    # bcast, barrier and allgather check on every call that all ranks made the same one
    # (agreement.object_header): CommError on every rank, naming each rank's call.
    @abc.abstractmethod
    def bcast(self, obj, root=0):
        """``root``'s picklable ``obj``, on every process."""

    @abc.abstractmethod
    def barrier(self):
        """Return once every process has called it."""

    @abc.abstractmethod
    def allgather(self, obj) -> list:
        """Every process's picklable ``obj``, as a list indexed by rank."""

    def _ensure_usable(self):
        """Raise when an earlier failure left the communicator unusable."""

    def __repr__(self):
        return f"<{type(self).__name__} rank {self.rank} of {self.size}>"


class SelfCommunicator(Communicator):
    """The one-process communicator of a run not started by an MPI launcher."""

    def bcast(self, obj, root=0):
        host._check_root(root, 1)
        return obj

    def barrier(self):
        return None

    def allgather(self, obj) -> list:
        return [obj]


class MPICommunicator(Communicator):
    """A communicator over a duplicate of MPI's COMM_WORLD (isolated from user traffic)."""

    def __init__(self, link: Link, timeout: float):
        super().__init__(timeout)
        self.link = link
        self.rank = link.rank
        self.size = link.size

    def allreduce(self, x, op="sum", out=None, segments=2, check=True):
        # A repetition of an agreed native call skips the general path: latency counts.
        # (Inline, not a helper: each Python call is ~2% of an 8-byte allreduce.) A key
        # that cannot be hashed (a user's op object, a list as root) has no prepared call:
        # the general path checks and runs it.
        self.link.watch.calls += 1
        if check is True and type(x) is np.ndarray:
            try:
                call = self._prepared.get((op, x.dtype, x.shape, segments, None))
            except TypeError:
                call = None
            if call is not None:
                return call.run(x, out)
        return host.allreduce(self, x, op, out, segments, check)

    def reduce(self, x, op="sum", root=0, out=None, segments=2, check=True):
        self.link.watch.calls += 1
        if check is True and type(x) is np.ndarray:
            try:
                call = self._prepared.get((op, x.dtype, x.shape, segments, root))
            except TypeError:  # as in allreduce
                call = None
            if call is not None:
                return call.run(x, out)
        return host.reduce(self, x, op, root, out, segments, check)

    allreduce.__doc__, reduce.__doc__ = Communicator.allreduce.__doc__, Communicator.reduce.__doc__

    @property
    def mpi_comm(self):
        """The underlying mpi4py communicator (a duplicate of COMM_WORLD)."""
        return self.link.comm

    def bcast(self, obj, root=0):
        host._check_root(root, self.size)
        self._ensure_usable()
        self.link.watch.calls += 1
        self._agree("bcast", root)
        payload = pickle.dumps(obj) if self.rank == root else b""
        length = np.array([len(payload)], dtype=np.int64)
        self._wait(self.link.comm.Ibcast(length, root), "bcast")
        data = np.frombuffer(payload, np.uint8).copy() if self.rank == root \
            else np.empty(int(length[0]), np.uint8)
        self._wait(self.link.comm.Ibcast(data, root), "bcast")
        return obj if self.rank == root else pickle.loads(data.tobytes())

    def barrier(self):
        self._ensure_usable()
        self.link.watch.calls += 1
        # The check is an allreduce, which no rank leaves before every rank entered it:
        # it is the barrier too (an MPI barrier after it would double the cost).
        self._agree("barrier")

    def allgather(self, obj) -> list:
        self._ensure_usable()
        self.link.watch.calls += 1
        self._agree("allgather")
        return self._gather_all(obj)

    def _gather_all(self, obj) -> list:
        """:meth:`allgather` without the check (the ranks know they are in step)."""
        mpi = self.link.MPI
        payload = np.frombuffer(pickle.dumps(obj), np.uint8)
        lengths = np.empty(self.size, dtype=np.int64)
        self._wait(self.link.comm.Iallgather(np.array([payload.size], np.int64), lengths),
                   "allgather")
        offsets = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        data = np.empty(int(lengths.sum()), np.uint8)
        self._wait(self.link.comm.Iallgatherv(
            [payload, mpi.BYTE], [data, (lengths, offsets), mpi.BYTE]), "allgather")
        return [pickle.loads(data[o:o + m].tobytes()) for o, m in zip(offsets, lengths)]

    def _agree(self, name, root=None):
        # Every call, unlike the reductions' repetitions: these carry pickles, not
        # latency-bound vectors, and one trusted call meeting another collective would
        # read its numbers as lengths.
        agreement.ensure_agreed(self, self._transport(name), agreement.object_header(name, root), always=True)

    def _transport(self, collective):
        return Transport(self.link, self.timeout, collective)

    def _buffer(self, role, nbytes):
        return self.link.buffer(role, nbytes)

    def _ensure_usable(self):
        self.link.ensure_usable()

    def _wait(self, request, what):
        Transport(self.link, self.timeout, what).wait([request], "waiting for all ranks")


_world = None  # the Link over COMM_WORLD's duplicate, or the CommError that kept it from being made
_world_lock = threading.Lock()


def _world_link(timeout: float) -> Link:
    """The process's one link over COMM_WORLD, made by the first call (collective)."""
    global _world
    with _world_lock:  # two threads' first calls would make two duplicates
        if _world is None:
            try:
                _world = _join_world(timeout)
            except CommError as exc:
                _world = exc  # a duplicate left half made cannot be made again
                raise
        if isinstance(_world, CommError):
            raise CommError(f"world() failed on its first call: {_world}")
        return _world


def _join_world(timeout: float) -> Link:
    """Duplicate COMM_WORLD and learn where every rank runs, each wait with the deadline:
    a rank that never makes its first call of world() is a CommTimeoutError, not a hang."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise CommError("started by an MPI launcher but mpi4py is not installed; "
                        "install hetflow[mpi]") from exc
    check_launch(MPI.COMM_WORLD.Get_size())
    abort_on_uncaught(MPI)
    duplicate, request = MPI.COMM_WORLD.Idup()
    notices, second = MPI.COMM_WORLD.Idup()  # Peers' own: no other message can match theirs
    Transport(Link(MPI, MPI.COMM_WORLD), timeout, "world()").wait(
        [request, second], "the first call of world() on every rank (it is collective: every rank must make it)")
    link = Link(MPI, duplicate)
    link.watch = Peers(link, notices)
    link.watch.locate(MPICommunicator(link, timeout).allgather(
        (MPI.Get_processor_name(), _pid_namespace(), os.getpid())))
    atexit.register(link.watch.leave)
    return link


def abort_on_uncaught(mpi) -> None:
    """Make an exception nobody catches, in any thread, print its traceback and abort
    every rank of the run (instead of leaving the others waiting for this one)."""
    rank, size = mpi.COMM_WORLD.Get_rank(), mpi.COMM_WORLD.Get_size()

    def abort(print_traceback, *args):
        try:
            print_traceback(*args)
            print(f"hetflow: rank {rank} raised an exception nobody caught; aborting all "
                  f"{size} ranks", file=sys.stderr, flush=True)
            time.sleep(0.2)  # the launcher forwards output on its own time: let it reach the user
        finally:
            mpi.COMM_WORLD.Abort(1)

    hook, thread_hook = sys.excepthook, threading.excepthook
    sys.excepthook = functools.partial(abort, hook)
    threading.excepthook = functools.partial(abort, thread_hook)
    if not faulthandler.is_enabled():
        faulthandler.enable()  # a fatal signal prints where each thread was


# How often a wait checks that the ranks on this host are alive (it costs a few system
# calls per rank).
_LOOK_SECONDS = 0.5
# An ended rank's last messages were sent before its notice; a wait for it gets this
# long to take them in before it fails.
_ENDED_GRACE = 0.5
# How long an ending rank waits for its notices to leave (small: sent eagerly).
_NOTICE_SECONDS = 1.0
_ENDED_TAG = 1


class Peers:
    """Called during waits: CommError once a rank on this host is no longer running,
    the launcher that started this process is gone, or a rank the wait needs ended.

    ``calls``: the calls of every rank (collectives, agreements) this rank has begun;
    an ending rank sends its count on ``notices`` (:meth:`leave`), so a wait in a call
    of every rank fails only where the ended rank never began it, and a transfer only
    where it is with the ended rank. ``stopped``: None, or called at every look of a
    wait to raise once the run was stopped elsewhere (hetflow.cluster's control channel
    sets it: another rank's failure then ends any collective's wait on this link, not
    only those of the cluster's own communicator).
    """

    def __init__(self, link: Link, notices):
        self.link = link
        self.notices = notices
        self.calls = 0
        self.local = []  # (rank, pid) of the other ranks on this host: locate()
        self.parent = os.getppid()
        self.next_look = 0.0
        self.ended = {}  # rank -> (its calls, when this rank heard it ended)
        self.stopped = None

    def locate(self, who: list) -> None:
        """Watch the processes of the ranks on this host; ``who``: (host, pid
        namespace, pid) per rank (only ranks whose pids mean something here count)."""
        here = who[self.link.rank][:2]
        self.local = [(rank, pid) for rank, (host, namespace, pid) in enumerate(who)
                      if (host, namespace) == here and rank != self.link.rank]

    def __call__(self, now: float, peers=None) -> None:
        """``peers``: the ranks the wait is for; None: a call of every rank."""
        if self.stopped is not None:
            self.stopped()
        self.look(now, peers)

    def look(self, now: float, peers=None) -> None:
        """The liveness checks of :meth:`__call__` without ``stopped`` (for a wait that
        polls the abort notices itself: hetflow.cluster's control channel)."""
        if now < self.next_look:
            return
        self.next_look = now + _LOOK_SECONDS
        for rank, pid in self.local:
            if not _running(pid):
                self._fail(f"rank {rank} (process {pid}) died; the run cannot go on without it")
        if os.getppid() != self.parent:
            self._fail(f"the launcher (process {self.parent}) is gone")
        self._hear(now)
        for rank, (calls, heard) in self.ended.items():
            missing = calls < self.calls if peers is None else rank in peers
            if missing and now - heard > _ENDED_GRACE:
                self._fail(f"rank {rank} ended its program (its script returned or called sys.exit) "
                           f"while this rank waits for it; the run cannot go on without it")

    def _hear(self, now: float) -> None:
        while True:
            message = self.notices.improbe(self.link.MPI.ANY_SOURCE, _ENDED_TAG)
            if message is None:
                return
            rank, calls = message.recv()
            self.ended.setdefault(rank, (calls, now))

    def leave(self) -> None:
        """Tell every other rank that this one's program ended, and how many calls of
        every rank it made (at exit: a wait for it then fails, naming it)."""
        mpi = self.link.MPI
        if mpi.Is_finalized():
            return
        requests = [self.notices.isend((self.link.rank, self.calls), peer, _ENDED_TAG)
                    for peer in range(self.link.size) if peer != self.link.rank]
        deadline = time.monotonic() + _NOTICE_SECONDS
        while not mpi.Request.Testall(requests) and time.monotonic() < deadline:
            time.sleep(1e-3)

    def _fail(self, reason: str):
        self.link.broken = reason
        raise CommError(f"rank {self.link.rank}: {reason}")


def _pid_namespace():
    """This process's pid namespace (containers on one host may share its name), or None."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def _running(pid: int) -> bool:
    """Is process ``pid`` alive (not gone, not a zombie waiting to be reaped)?"""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] != b"Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True


# What the launcher says the run's size is (set only by launchers, unlike SLURM_NTASKS,
# which a batch script's own process also sees).
_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def check_launch(mpi_size: int) -> None:
    """Raise CommError when the launcher started more processes than MPI joined: each
    process then runs alone, as if it were the whole run (an ``mpiexec`` of another MPI
    than the one mpi4py uses)."""
    for name in _SIZE_VARIABLES:
        announced = os.environ.get(name, "")
        if announced.isdigit() and int(announced) != mpi_size:
            raise CommError(
                f"the launcher started {announced} processes ({name}) but MPI joined {mpi_size}: "
                f"mpiexec belongs to another MPI than the one mpi4py was built for; run the "
                f"mpiexec of that MPI (with hetflow[mpi]: the one beside this Python)")


def _resolve_timeout(timeout) -> float:
    source = "timeout"
    if timeout is None:
        timeout = os.environ.get("HETFLOW_COMM_TIMEOUT", DEFAULT_TIMEOUT)
        source = "HETFLOW_COMM_TIMEOUT"
    try:
        value = float("nan") if isinstance(timeout, bool) else float(timeout)
    except (TypeError, ValueError):
        value = float("nan")
    if not value > 0:
        raise ArgumentError(f"{source} must be a positive number of seconds, "
                            f"not {timeout!r}")
    return value
