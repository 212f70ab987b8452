"""Setting up a distributed run, and stopping every rank when one fails.

``mpiexec -n K python script.py`` needs nothing more: the first use of hetflow.cluster's
distributed layer (a distributed array, a program, :func:`run_distributed`) sets the
run up — the world communicator, the control channel, which ranks share a host, and the
cores and GPUs each rank uses. Run with plain ``python``, the same script is a run of
one process. Setting up is collective: every rank makes the same first call.

Cores: the ranks on one host split its cores evenly (``HETFLOW_CPU_THREADS`` sets the
count per rank instead). When every rank can have cores of its own, each is bound to
its share, so ranks never compete for a core; when they cannot (more ranks than
cores), nothing is bound and the session says ``oversubscribed``. The first session of
a process decides its share; sessions over sub-communicators made later keep it. GPUs:
GPU g of a host goes to the host's rank ``g mod (ranks on the host)``.

Failure: inside :func:`distributed` (or :func:`run_distributed`), an exception on one
rank is sent to all the others as an abort notice; at their next wait or safe point they
raise an error of its hetflow class (and RemoteError; a plain RemoteError for another
class) naming that rank and carrying its message, so no rank hangs.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import threading

from hetflow.collectives.comm import MPICommunicator, SelfCommunicator, world
from hetflow.cluster.control import Channel, LocalChannel, describe_step
from hetflow.collectives.transport import Transport
from hetflow.errors import ArgumentError, RemoteError
from hetflow.platform.devices import devices


class GuardedTransport(Transport):
    """The collectives' transport, whose waits also watch for failure notices."""

    def __init__(self, link, timeout, collective, channel: Channel):
        super().__init__(link, timeout, collective)
        self.channel = channel

    def wait(self, requests, what, test=None) -> None:
        self.channel.wait(requests, f"{self.collective}: {describe_step(what)}",
                          expired=self.fail, test=test)


class GuardedCommunicator(MPICommunicator):
    """A communicator over the world's processes whose collectives stop with
    RemoteError, instead of waiting out their timeout, when another rank failed."""

    def __init__(self, link, timeout: float, channel: Channel):
        super().__init__(link, timeout)
        self.channel = channel

    def _transport(self, collective):
        return GuardedTransport(self.link, self.timeout, collective, self.channel)

    def _wait(self, request, what):
        self._transport(what).wait([request], "waiting for all ranks")


@dataclasses.dataclass
class Session:
    """One process's place in a distributed run.

    ``comm``: the communicator (collectives); ``channel``: the control channel
    (point-to-point transfers, abort notices); ``host_rank``/``host_size``: this rank
    among the ranks on its host; ``cpu_threads``: the cores it computes with;
    ``cores``: the cores it is bound to (None: not bound); ``oversubscribed``: the
    host has fewer cores than its ranks need; ``devices``: the device ids it uses by
    default (its CPU cores and its GPUs).
    """

    comm: object
    channel: object
    host: str
    host_rank: int
    host_size: int
    cpu_threads: int
    cores: tuple | None
    oversubscribed: bool
    devices: tuple
    _serials: itertools.count = dataclasses.field(default_factory=itertools.count, repr=False)

    @property
    def rank(self) -> int:
        return self.channel.rank

    @property
    def size(self) -> int:
        return self.channel.size

    def serial(self) -> int:
        """The next number for a distributed object; equal on every rank, since every
        rank makes them in the same order."""
        return next(self._serials)


_sessions: dict = {}
_lock = threading.Lock()
_cores = None  # (threads, bound cores, oversubscribed): decided by the process's first session


def session(comm=None) -> Session:
    """The session of ``comm`` (default: all processes of this run), set up on first use."""
    if comm is None:
        comm = world()
    if isinstance(comm, Session):
        return comm
    if isinstance(comm, SelfCommunicator):
        key = ("self", comm.timeout)
    elif isinstance(comm, MPICommunicator):
        key = ("mpi", id(comm.link))
    else:
        raise ArgumentError(f"comm must be a hetflow communicator (hetflow.world()), "
                            f"not {type(comm).__name__}")
    with _lock:
        found = _sessions.get(key)
        if found is None:
            found = _sessions[key] = _start(comm)
        return found


def _start(comm) -> Session:
    global _cores
    if isinstance(comm, SelfCommunicator):
        channel, guarded, host = LocalChannel(comm.timeout), comm, os.uname().nodename
        hosts = [host]
    else:
        link = comm.link
        # A private duplicate: our tags can never match the collectives' or the user's.
        channel = Channel(link.MPI, link.comm.Dup(), comm.timeout, link)
        if link.watch is not None:  # (a link of one's own over a sub-communicator has none)
            # A wait in any collective on this link (world()'s too) hears abort notices.
            link.watch.stopped = channel.check
        guarded = GuardedCommunicator(link, comm.timeout, channel)
        host = link.MPI.Get_processor_name()
        # A setting one rank refuses stops every rank here, not that rank alone (the
        # others would wait for it until their timeout).
        hosts, problems = zip(*channel.allgather((host, None if _cores else _settings_problem())))
        if any(problems):
            raise ArgumentError("; ".join(f"rank {r}: {p}" for r, p in enumerate(problems) if p))
    host_ranks = [r for r, h in enumerate(hosts) if h == host]
    host_rank, host_size = host_ranks.index(channel.rank), len(host_ranks)
    if _cores is None:
        _cores = share_cores(host_rank, host_size)
    threads, cores, oversubscribed = _cores
    return Session(guarded, channel, host, host_rank, host_size, threads, cores, oversubscribed,
                   _own_devices(host_rank, host_size))


def share_cores(host_rank: int, host_size: int) -> tuple[int, tuple | None, bool]:
    """(threads, bound cores or None, oversubscribed) for rank ``host_rank`` of
    ``host_size`` on this host; binds the process and sets Numba's thread count."""
    import numba

    allowed = sorted(os.sched_getaffinity(0))
    setting = os.environ.get("HETFLOW_CPU_THREADS")
    threads = _threads_setting(setting) if setting else max(1, len(allowed) // host_size)
    oversubscribed = threads * host_size > len(allowed)
    cores = None
    if host_size > 1 and not oversubscribed:
        cores = tuple(allowed[host_rank * threads:(host_rank + 1) * threads])
        os.sched_setaffinity(0, cores)
        devices(refresh=True)  # cpu0's compute units are now this rank's share
    numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
    return threads, cores, oversubscribed


def _settings_problem() -> str | None:
    """What is wrong with this process's HETFLOW_CPU_THREADS, or None."""
    setting = os.environ.get("HETFLOW_CPU_THREADS")
    try:
        if setting:
            _threads_setting(setting)
    except ArgumentError as exc:
        return str(exc)
    return None


def _threads_setting(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ArgumentError(f"HETFLOW_CPU_THREADS must be a whole number >= 1, not {text!r}")
    return value


def _own_devices(host_rank: int, host_size: int) -> tuple:
    gpus = [d.id for d in devices() if d.kind == "gpu" and not d.simulated
            and d.ordinal % host_size == host_rank]
    return ("cpu0", *gpus)


@contextlib.contextmanager
def distributed(comm=None):
    """Run the ``with`` block on every rank; if it raises on one, stop them all.

    The raising rank tells the others and re-raises its exception; the others raise
    its error naming it (:func:`hetflow.cluster.control.remote_error`) at their next
    wait or safe point. When the
    block ends normally, every rank waits for the others to end it too, so no rank
    leaves while another is still failing. Yields the :class:`Session`.
    """
    current = session(comm)
    try:
        yield current
        current.channel.barrier()
    except RemoteError:
        raise  # another rank failed: it has told everyone
    except BaseException as exc:
        current.channel.abort(exc)
        raise


def run_distributed(fn, *args, comm=None, **kwargs):
    """``fn(*args, **kwargs)`` on every rank, inside :func:`distributed`; its result."""
    with distributed(comm):
        return fn(*args, **kwargs)
