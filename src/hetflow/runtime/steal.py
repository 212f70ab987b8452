"""One data-parallel loop run by CPU cores and GPUs together, balanced by work stealing (SPEC §3).

:func:`run_loop` cuts ``[0, n)`` into chunks ``(min, max)`` — GPU chunks sized to the
GPU, CPU chunks smaller, each worker's own ``chunk_size`` — and spreads them over one
Chase–Lev deque per worker (:mod:`hetflow.runtime.deque`), evenly or by predicted speed
shares (:mod:`hetflow.runtime.perfmodel`). One Python thread per worker then pops from
its own deque and, when that is empty (or at most ``steal_threshold`` long), steals the
top entry of the other deques, visited in a fixed order: GPU queues first, then CPU
queues, skipping a queue whose owner would reach that entry before the thief finished it
(by each worker's measured time per index, and a GPU's latency per chunk): a core that
took a GPU's last chunks would keep the loop running long after the GPU ran dry.
Stealing is bidirectional. The chunk functions release the GIL (CPU: Numba ``nogil``
functions; GPU: asynchronous launches), so the workers really run at once. A GPU worker
keeps several chunks in flight and completes them one at a time (``Worker.retire``).

Two refinements keep mixed chunk sizes efficient without giving up exactly-once:
a worker that obtains a range larger than twice its own chunk size (a CPU that stole a
GPU chunk) runs one chunk of it and pushes the rest onto its own deque, where it can be
stolen back; a thief whose chunk size is larger than what it stole (a GPU stealing CPU
chunks) keeps taking the victim's top entry while that entry is adjacent and it would
finish them all before the victim finished the next, and runs the merged range as one
launch. And with many cores (``GIL_S`` per core above ``TAIL_S``),
a core whose chunks run shorter than ``GIL_S`` per core takes as many of its own
adjacent chunks at once as fill that time: every range costs the Python around it,
under the GIL, and many cores on short chunks queue for the GIL.

Nothing interrupts a ``run_chunk`` call, and one CPU chunk of a costly kernel may take
seconds (a chunk holds at least ``cpu.INLINE_LIMIT`` indices), so a worker without
``sync`` (a CPU core) runs its range in pieces of about ``SLICE_S`` seconds, by the time
per index of its last piece (a first range of ``_PROBE`` indices or more starts with a
``1/_PROBE`` piece), and looks for the EMPTY token between them. That token, while the
worker holds a range, can only come from a stop (Ctrl-C in the calling thread,
``faults='raise'``, a crash), so the worker drops the rest of its range and leaves: a stop
reaches every CPU worker within about ``SLICE_S``, a GPU worker after its chunk in flight.

The same pieces end a loop evenly. Once every deque is empty each core still runs the
range it holds, a chunk of many milliseconds, while a GPU that ran dry waits: the loop's
tail (16 ms on an H100 host). So under ``schedule='steal'`` a CPU worker's pieces last
no longer than the deques will take to run dry at every worker's measured speed (down
to ``TAIL_S``, or ``GIL_S`` per core where that is longer); once they have, while it
sees another worker idle, it pushes the rest of its range back onto its own deque before
each piece, where the idle worker steals it (the push is made while holding a range: the
termination argument below covers it).

Termination (SPEC §3.5) and why it is correct
---------------------------------------------
A worker that finds every queue empty in one traversal writes the EMPTY token into all
queues, and every worker stops when it sees the token in its own queue. Without faults
that rule alone is safe, because after the initial distribution nothing is ever added
to a queue: a queue seen empty stays empty, so a traversal that sees them all empty
proves every chunk has been taken, and the worker holding each one will run it.

Two things do add ranges later: the split remainder above, and the ranges a failed
worker held, which it pushes back onto its own deque so that the others run them. Both
are pushed by a worker that *holds* a range at that moment, so three shared counters
make the rule safe again:

* ``HELD`` counts ranges taken and not yet completed. A worker increments it *before*
  it tries to take, and decrements it after completing (or after pushing back) — so a
  range is at every instant in a queue or counted in ``HELD``.
* ``EPOCH`` is incremented after every push made after the start, before the pusher
  releases its hold.
* A terminating worker reads ``EPOCH``, traverses all queues, then reads ``HELD == 0``
  and ``EPOCH`` unchanged. At the moment it reads ``HELD == 0`` every unfinished range
  sits in a queue; none was pushed since the first ``EPOCH`` read (its pusher would have
  bumped ``EPOCH`` before dropping its hold, i.e. before ``HELD`` reached 0), so it sat
  in its queue during the whole traversal and would have been seen. Hence when the
  token is written all work is done, and every index ran exactly once (each range
  leaves a deque exactly once, see the CAS argument in :mod:`~hetflow.runtime.deque`).

Faults: when ``run_chunk`` or ``sync`` raises, the worker asks its ``salvage`` (if it
has one) how many of the ranges it holds, oldest first, landed all the same (a GPU whose
stream still completes what was launched before the failing chunk); it counts those as
run, pushes every other range it holds back onto its own deque, bumps ``EPOCH``, marks
itself dead, drops its hold, and leaves; the others steal its remaining chunks (even
under ``schedule='static'``, where only dead workers' queues may be stolen from). A range
is re-run only if its results did not land, so a read-modify-write kernel
(``out[i] += 1``) applies once per index: a GPU worker's results land at ``sync`` (see
:mod:`hetflow.runtime.coexec`), and a CPU chunk that fails has not run (a fault of its
kernel's code stops the loop instead, below). If every worker fails,
:class:`~hetflow.errors.DeviceError` is raised.
Only faults of the device are recovered so: an exception the kernel's own code raised
(:class:`~hetflow.errors.KernelRaisedError`, or checked mode's
:class:`~hetflow.errors.IndexOutOfBoundsError`) would raise on every device, so it stops
the loop and reaches the caller as it is.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import queue
import threading
import time
from typing import Callable

import numpy as np
from numba import njit

from ..errors import (ArgumentError, ArgumentTypeError, DeviceError, HetflowError, IndexOutOfBoundsError,
                      KernelRaisedError)
from .deque import (ABORT, EMPTY, OK, DequeSet, aligned_zeros, atomic_load, atomic_store,
                    fetch_add, has_empty_token, pop_bottom, push_bottom, size, steal_top,
                    steal_top_adjacent, write_empty_token)
from .report import ChunkEvent, FailureRecord, RunReport, WorkerStats

log = logging.getLogger(__name__)

STOP = 3            # acquire status: the EMPTY token is in this worker's queue
HELD = 0            # ctl word: ranges taken and not completed
EPOCH = 8           # ctl word: pushes made after the initial distribution
_MIN_BACKOFF = 2e-5
_MAX_BACKOFF = 2e-4
SLICE_S = 0.05      # about the longest run_chunk call of a CPU worker: see the module docstring
TAIL_S = 1e-3       # the same while another worker is idle: the rest of the range is given up
# Each range or piece a core runs costs it tens of microseconds of Python, with the GIL,
# before and after: a piece lasts at least this long per core (and at least TAIL_S), or
# the cores queue for the GIL. On a 32-core host, 1 ms pieces made a co-executed loop
# 1.7x slower than 3 ms ones, and 1.4 ms chunks made a loop on its cores alone 1.4-1.5x
# slower than running it without stealing.
GIL_S = 1e-4
_PROBE = 64         # the first piece of a large first range is 1/_PROBE of it
_WAKE_S = 0.05      # the calling thread's longest sleep while the workers run
# Entries of a loop's deques together (16 bytes each, 256 MiB): a forall's cores start
# with about 64 chunks each, a GPU with 16 to a few thousand; chunks of a few indices
# over billions would take more memory than the host has before the loop started.
MAX_CHUNKS = 1 << 24


@dataclasses.dataclass
class Worker:
    """One executor of chunks: a CPU core or a GPU (or one stream of a GPU).

    ``run_chunk(lo, hi)`` executes indices ``[lo, hi)``; a CPU worker's should release
    the GIL (a Numba ``nogil`` function). A GPU worker's may return before the work is
    done: give it ``sync`` (waits for everything launched) and ``inflight`` > 1, and up
    to ``inflight`` chunks are launched before ``sync`` is called; with ``retire`` too
    (waits for the oldest chunk in flight alone) the worker keeps ``inflight`` chunks in
    flight, completing them one at a time, so that the device never runs dry between
    them (``sync`` then completes the last ones). ``setup(stopped)``,
    if given, runs in the worker's thread before it takes any work (a GPU copying its
    data in); it should return early once ``stopped()`` says the loop is over, and if it
    raises, the worker fails and the others run its chunks. Meanwhile the other workers
    steal from its deque. ``salvage()``, if given, is called after ``run_chunk`` or
    ``sync`` raised: it returns how many of the ranges launched since the last ``sync``,
    oldest first, completed and landed anyway (the others are re-run elsewhere).
    """

    name: str
    kind: str
    run_chunk: Callable[[int, int], object]
    chunk_size: int
    device_id: str
    inflight: int = 1
    sync: Callable[[], object] | None = None
    setup: Callable[[Callable[[], bool]], object] | None = None
    salvage: Callable[[], int] | None = None
    retire: Callable[[], object] | None = None

    def __post_init__(self):
        if self.kind not in ("cpu", "gpu"):
            raise ArgumentError(f"worker {self.name!r}: kind must be 'cpu' or 'gpu', "
                                f"got {self.kind!r}")
        if not callable(self.run_chunk):
            raise ArgumentError(f"worker {self.name!r}: run_chunk must be callable")
        if not isinstance(self.chunk_size, (int, np.integer)) or self.chunk_size < 1:
            raise ArgumentError(f"worker {self.name!r}: chunk_size must be a positive "
                                f"integer, got {self.chunk_size!r}")
        if not isinstance(self.inflight, (int, np.integer)) or self.inflight < 1:
            raise ArgumentError(f"worker {self.name!r}: inflight must be a positive "
                                f"integer, got {self.inflight!r}")
        if (self.inflight > 1 or self.retire is not None) and self.sync is None:
            what = f"inflight={self.inflight}" if self.inflight > 1 else "retire"
            raise ArgumentError(f"worker {self.name!r}: {what} needs a sync callable to complete "
                                f"the chunks in flight")


def gpu_chunk_size(sm_count: int, warp_size: int, warps_per_sm: int, waves: int = 1) -> int:
    """A GPU chunk: ``waves`` full loads of the GPU's hardware threads (SMs x warp size x
    resident warps per SM), so every launch fills the device."""
    return max(1, sm_count * warp_size * warps_per_sm * waves)


def cpu_chunk_size(n: int, cpu_workers: int, per_worker: int = 64, minimum: int = 1) -> int:
    """A CPU chunk: about ``per_worker`` chunks per CPU worker's even share of ``n``,
    enough for stealing to even out irregular costs (a core runs its range in pieces
    that shrink at the loop's end, so a GPU that ran dry does not wait for a long
    chunk: the module docstring); never below ``minimum`` (which bounds the scheduling
    overhead per index)."""
    return max(minimum, 1, math.ceil(n / max(1, cpu_workers * per_worker)))


# -- the lock-free parts, run without the GIL ----------------------------------------------
@njit(nogil=True, cache=True)
def _worth_stealing(state, dead, per_index, latency, chunk_sizes, me, v, want):
    """Would ``me`` finish a chunk taken from the far end of ``v``'s deque before ``v``
    reached it? ``v`` reaches it after its range in hand and every chunk below it; a
    core that took a GPU's last chunks would run long after the GPU ran dry. ``me``
    finishes it after its latency too (a GPU's last chunk took that long from launch to
    done, beyond its size: a GPU loaded by another process queues each launch behind
    that work, and a core's last few rows, handed to it, ended the loop tens of ms
    late). Yes where either speed is not measured yet, and always from a failed worker."""
    return _finishes_first(state, dead, per_index, latency, chunk_sizes, me, v, min(want, chunk_sizes[v]))


@njit(nogil=True, cache=True)
def _finishes_first(state, dead, per_index, latency, chunk_sizes, me, v, rows):
    """Would ``me`` finish ``rows`` more indices, taken from the far end of ``v``'s deque,
    before ``v`` finished the entry they come from (after its range in hand and every
    entry below)? (See :func:`_worth_stealing`.)"""
    mine, theirs = per_index[me], per_index[v]
    if mine <= 0.0 or theirs <= 0.0 or atomic_load(dead, v) != 0:
        return True
    return latency[me] + rows * mine < (size(state, v) + 1) * chunk_sizes[v] * theirs


@njit(nogil=True, cache=True)
def _gather_own(state, buf, capacity, ctl, me, lo, hi, want):
    """Worker ``me``'s own range ``[lo, hi)`` grown by the next chunks of its deque while
    they follow on, up to ``want`` indices. (A chunk that does not follow on goes back:
    a push made while holding a range, so EPOCH is bumped.)"""
    while hi - lo < want:
        st, a, b = pop_bottom(state, buf, capacity, me)
        if st != OK:
            break
        if a != hi:
            push_bottom(state, buf, capacity, me, a, b)
            fetch_add(ctl, EPOCH, 1)
            break
        hi = b
    return lo, hi


@njit(nogil=True, cache=True)
def _acquire(state, buf, capacity, ctl, dead, steals, order, me, steal_live, want, low_water,
             per_index, latency, chunk_sizes, own_want):
    """Take a range for worker ``me``: ``(status, lo, hi, victim)``, status OK/EMPTY/STOP.

    Pops its own deque when it holds more than ``low_water`` chunks, else steals from
    the others in ``order`` (from live ones only when ``steal_live``, and only where it
    would finish the chunk first: ``_worth_stealing``; a dead worker's queue is always
    open), else pops what is left of its own. ``victim`` is -1 for an own chunk, which
    takes the chunks that follow it too, up to ``own_want`` indices.
    ``steals[2 * (me * nw + v)]`` counts CAS attempts on ``v``, ``+ 1`` wins.
    """
    if has_empty_token(state, me):
        return STOP, 0, 0, -1
    fetch_add(ctl, HELD, 1)            # before taking anything: see the module docstring
    lo = 0
    hi = 0
    if size(state, me) > low_water:
        st, lo, hi = pop_bottom(state, buf, capacity, me)
        if st == OK:
            lo, hi = _gather_own(state, buf, capacity, ctl, me, lo, hi, own_want)
            return OK, lo, hi, -1
    nw = order.size
    for k in range(nw):
        v = order[k]
        if v == me or (not steal_live and atomic_load(dead, v) == 0):
            continue
        if not _worth_stealing(state, dead, per_index, latency, chunk_sizes, me, v, want):
            continue
        row = 2 * (me * nw + v)
        st = ABORT
        while st == ABORT:             # another taker won the CAS on this entry: retry
            st, lo, hi = steal_top(state, buf, capacity, v)
            if st != EMPTY:
                steals[row] += 1
        if st == OK:
            steals[row + 1] += 1
            # Gather adjacent chunks up to our own chunk size, while we would finish them
            # all before their owner finished the next: a GPU that took a core's last
            # chunks at once ran them after its chunks in flight, the core idle meanwhile.
            while hi - lo < want and _finishes_first(state, dead, per_index, latency, chunk_sizes,
                                                     me, v, hi - lo + chunk_sizes[v]):
                st, lo, hi = steal_top_adjacent(state, buf, capacity, v, lo, hi)
                if st == EMPTY:
                    break
                steals[row] += 1
                if st == OK:
                    steals[row + 1] += 1
            return OK, lo, hi, v
    if low_water > 0:
        st, lo, hi = pop_bottom(state, buf, capacity, me)
        if st == OK:
            lo, hi = _gather_own(state, buf, capacity, ctl, me, lo, hi, own_want)
            return OK, lo, hi, -1
    fetch_add(ctl, HELD, -1)
    return EMPTY, 0, 0, -1


@njit(nogil=True, cache=True)
def _drain_seconds(state, dead, per_index, chunk_sizes):
    """About how long until every deque is empty, at the live workers' measured speeds
    (each entry counted as its owner's chunk size): 0 when they are, infinite while no
    speed is measured."""
    left = 0.0
    rate = 0.0
    for v in range(per_index.size):
        left += max(0, size(state, v)) * chunk_sizes[v]
        if per_index[v] > 0.0 and atomic_load(dead, v) == 0:
            rate += 1.0 / per_index[v]
    if left == 0.0:
        return 0.0
    return left / rate if rate > 0.0 else np.inf


@njit(nogil=True, cache=True)
def _try_terminate(state, ctl, order):
    """Write the EMPTY token into all queues if the loop is provably over (module docstring)."""
    epoch = atomic_load(ctl, EPOCH)
    for k in range(order.size):        # GPU queues first, then CPU queues
        if size(state, order[k]) > 0:
            return False
    if atomic_load(ctl, HELD) != 0 or atomic_load(ctl, EPOCH) != epoch:
        return False
    write_empty_token(state, order.size)
    return True


@njit(nogil=True, cache=True)
def _push_back(state, buf, capacity, ctl, me, ranges):
    """Push ``ranges`` (k x 2) onto ``me``'s deque, then bump EPOCH; False if it is full."""
    for i in range(ranges.shape[0]):
        if not push_bottom(state, buf, capacity, me, ranges[i, 0], ranges[i, 1]):
            return False
    fetch_add(ctl, EPOCH, 1)
    return True


@njit(nogil=True, cache=True)
def _release(ctl, count):
    fetch_add(ctl, HELD, -count)


@njit(nogil=True, cache=True)
def _mark_dead(dead, me):
    atomic_store(dead, me, 1)


# -- the initial distribution ------------------------------------------------------------
def check_shares(shares, count, per="worker"):
    """``shares`` as fractions summing to 1 (even ones for None): ``count`` finite,
    non-negative numbers, not all zero, one per ``per``."""
    if shares is None:
        return np.full(count, 1.0 / count)
    try:
        arr = np.asarray(shares)  # (a dict or a string: a 0-d array)
    except ValueError:  # ragged nesting
        arr = None
    if arr is None or arr.ndim != 1 or arr.dtype.kind not in "iuf":
        raise ArgumentTypeError(f"shares must be a list of numbers, one per {per}; got {shares!r}")
    if arr.shape != (count,):
        raise ArgumentError(f"shares must have one entry per {per} ({count}), "
                            f"got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0) or arr.sum() <= 0:
        raise ArgumentError(f"shares must be finite, non-negative and not all zero, got "
                            f"{arr.tolist()}")
    return arr / arr.sum()


def split_range(n: int, shares) -> list[tuple[int, int]]:
    """Contiguous ranges of ``[0, n)``, one per share: boundaries ``round(cumsum(shares) * n)``."""
    bounds = np.rint(np.cumsum(shares) * n).astype(np.int64)
    bounds[-1] = n
    starts = np.concatenate(([0], bounds[:-1]))
    return [(int(a), int(b)) for a, b in zip(starts, bounds)]


def _chunk_count(lo, hi, chunk_size):
    return -(-(hi - lo) // chunk_size)


def _too_many_chunks(n, workers, ranges, counts, spare, low_water, limit) -> str:
    """What to change when a deque would need more than ``limit`` entries (its initial
    chunks, ``low_water`` and ``spare``): the chunk size of the worker with the most
    chunks, or a steal_threshold that leaves no room for them."""
    if spare + low_water >= limit:
        return (f"steal_threshold={low_water} leaves no room in the loop's deques ({limit} chunks "
                f"each at most): give one below {limit - spare}")
    q = counts.index(max(counts))
    (lo, hi), w = ranges[q], workers[q]
    least = -(-(hi - lo) // (limit - spare - low_water))
    return (f"a loop of {n} indices: worker {w.name!r} would start with {counts[q]} chunks of "
            f"chunk_size={w.chunk_size} (its {hi - lo} indices), but each of the loop's deques holds "
            f"at most {limit}: give it a chunk_size of at least {least}")


@njit(nogil=True, cache=True)
def _distribute(state, buf, capacity, q, lo, hi, chunk_size):
    """Cut ``[lo, hi)`` into chunks of ``chunk_size`` onto deque ``q``, the last one on
    top so that the owner pops in ascending order and thieves take from the far end."""
    for k in range((hi - lo + chunk_size - 1) // chunk_size - 1, -1, -1):
        a = lo + k * chunk_size
        push_bottom(state, buf, capacity, q, a, min(a + chunk_size, hi))


def _piece(count: int, per_index: float | None, seconds: float = SLICE_S) -> int:
    """How many of ``count`` indices to run in one call of about ``seconds``, given the
    seconds per index measured so far (None: nothing measured yet)."""
    if per_index is None:
        return count // _PROBE if count >= _PROBE else count
    if per_index * count <= seconds:
        return count
    return max(1, int(seconds / per_index))


# -- one loop ------------------------------------------------------------------------------
class _Threads:
    """Worker threads kept between loops: a forall over 16 cores would otherwise start
    16 threads each time, which costs more than a small loop itself. An idle thread
    takes the next job; when none is idle, a new one starts (so loops running at the
    same time never wait for each other's threads)."""

    def __init__(self):
        self._idle: list[queue.SimpleQueue] = []
        self._lock = threading.Lock()

    def start(self, job, name: str) -> threading.Event:
        """Run ``job()`` on a kept thread; the returned event is set when it returns."""
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(inbox,), daemon=True).start()
        done = threading.Event()
        inbox.put((job, name, done))
        return done

    def _serve(self, inbox):
        while True:
            job, name, done = inbox.get()
            threading.current_thread().name = name
            try:
                job()
            except BaseException:        # keep the thread: its inbox goes back to the idle list
                log.exception("hetflow worker thread %s: job failed", name)
            finally:
                threading.current_thread().name = "hetflow-idle"
                # An idle thread must not keep the loop, and with it the user's arrays, alive.
                job = None
                with self._lock:
                    self._idle.append(inbox)
                done.set()


_THREADS = _Threads()


class _WorkerLog:
    """What one worker thread records; only that thread writes it while the loop runs."""

    def __init__(self):
        self.events: list[ChunkEvent] = []
        self.chunks = 0
        self.indices = 0
        self.busy = 0.0
        self.lifetime = 0.0
        self.failed = False


# What the kernel's code raised, not the device: running the rows elsewhere raises again.
KERNEL_RAISED = (KernelRaisedError, IndexOutOfBoundsError)


class _Loop:
    def __init__(self, n, workers, schedule, shares, faults, record_events, steal_threshold):
        self.workers = workers
        self.faults = faults
        self.record_events = record_events
        self.steal_live = schedule == "steal"
        self.low_water = steal_threshold if self.steal_live else 0
        nw = len(workers)
        # Fixed traversal order: GPU queues first, then CPU queues.
        self.order = np.array([i for i, w in enumerate(workers) if w.kind == "gpu"]
                              + [i for i, w in enumerate(workers) if w.kind == "cpu"],
                              dtype=np.int64)
        ranges = split_range(n, shares)
        # A deque holds at most its initial chunks (or low_water of them before its
        # owner steals), one split remainder, and the ranges its owner held when it failed.
        counts = [_chunk_count(lo, hi, w.chunk_size) for (lo, hi), w in zip(ranges, workers)]
        spare = max(w.inflight for w in workers) + 2
        capacity = max(counts) + self.low_water + spare
        if capacity > MAX_CHUNKS // nw:
            raise ArgumentError(_too_many_chunks(n, workers, ranges, counts, spare, self.low_water,
                                                 MAX_CHUNKS // nw))
        d = self.deques = DequeSet(nw, capacity)
        for q, ((lo, hi), w) in enumerate(zip(ranges, workers)):
            _distribute(d.state, d.buf, d.capacity, q, lo, hi, w.chunk_size)
        self.ctl = aligned_zeros(16)
        self.dead = aligned_zeros(nw)
        self.steals = np.zeros(2 * nw * nw, dtype=np.int64)
        # Seconds per index each worker took over its last completed ranges (0: none yet),
        # written by that worker alone; thieves read them (_worth_stealing).
        self.per_index = np.zeros(nw)
        # Seconds a GPU's last completed chunk took beyond its indices' time (launch to
        # done: what a chunk it steals costs however small; 0 for a core), the same way.
        self.latency = np.zeros(nw)
        # Whether each worker found nothing to take, last it looked (written by that
        # worker alone): a core holding a long range then gives the rest of it up.
        self.idle = [False] * nw
        self.chunk_sizes = np.array([w.chunk_size for w in workers], dtype=np.int64)
        # A core's shortest piece; the shortest range it takes of its own, where that
        # bound is the GIL's (0: a chunk, however short).
        cores = sum(w.sync is None for w in workers)
        self.least_s = max(TAIL_S, GIL_S * cores)
        self.gather_s = GIL_S * cores if GIL_S * cores > TAIL_S else 0.0
        self.logs = [_WorkerLog() for _ in workers]
        self.failures: list[tuple[float, int, BaseException, list]] = []
        self.crash: BaseException | None = None
        self.lock = threading.Lock()
        self.t0 = 0.0

    # The worker thread ---------------------------------------------------------------
    def work(self, me):
        log_ = self.logs[me]
        start = time.perf_counter()
        try:
            self._work(me, log_)
        except BaseException as exc:    # a bug, not a device failure: stop everyone
            with self.lock:
                self.crash = self.crash or exc
            self.deques.write_empty_token()
        finally:
            log_.lifetime = time.perf_counter() - start

    def _work(self, me, log_):
        w = self.workers[me]
        d = self.deques
        if w.setup is not None:
            try:
                w.setup(lambda: d.has_empty_token(me))
            except Exception as exc:
                return self._fail(me, [], exc)
        held = []                        # (lo, hi, victim, t_start) of ranges taken
        group_start = 0.0
        per_index = None                 # seconds per index of the last piece run (no sync)
        backoff = _MIN_BACKOFF
        while True:
            # With many cores, a core takes GIL_S per core's worth of its own chunks at once.
            keep = w.chunk_size
            if self.gather_s and w.sync is None and per_index:
                keep = max(keep, int(self.gather_s / per_index))
            st, lo, hi, victim = _acquire(d.state, d.buf, d.capacity, self.ctl, self.dead,
                                          self.steals, self.order, me, self.steal_live,
                                          w.chunk_size, self.low_water, self.per_index,
                                          self.latency, self.chunk_sizes, keep)
            if st == OK:
                backoff = _MIN_BACKOFF
                self.idle[me] = False
                if hi - lo > 2 * keep:
                    self._push_back(me, [(lo + keep, hi)])
                    hi = lo + keep
                t = time.perf_counter()
                if not held:
                    group_start = t
                held.append((lo, hi, victim, t))
                full = False
                try:
                    if w.sync is None:
                        per_index = self._run_pieces(me, log_, held, per_index)
                    else:
                        w.run_chunk(lo, hi)
                        full = len(held) >= w.inflight
                        if full:
                            (w.retire or w.sync)()
                except Exception as exc:
                    return self._fail(me, held, exc)
                if w.sync is None or full:
                    group_start = self._complete(me, log_, held, group_start, 1 if w.retire else None)
            elif st == EMPTY:
                if held:                 # nothing to launch: finish what is in flight
                    try:
                        w.sync()
                    except Exception as exc:
                        return self._fail(me, held, exc)
                    group_start = self._complete(me, log_, held, group_start)
                elif _try_terminate(d.state, self.ctl, self.order):
                    return
                else:
                    self.idle[me] = True
                    time.sleep(backoff)
                    backoff = min(2 * backoff, _MAX_BACKOFF)
            else:                        # STOP: the EMPTY token is in our queue
                if held:                 # only after faults='raise' stopped the loop
                    try:
                        w.sync()
                    except Exception as exc:
                        return self._fail(me, held, exc)
                    self._complete(me, log_, held, group_start)
                return

    def _run_pieces(self, me, log_, held, per_index):
        """Run the one range a worker without sync holds, piece by piece (module
        docstring); return the seconds per index of the last piece. Earlier pieces are
        logged as they end, and ``held`` keeps the last piece run, or, while a piece
        runs, that piece and the rest of the range, which is what a failure gives back.
        Under stealing, a piece lasts no longer than the deques will take to run dry;
        once they have, while another worker is idle, the rest of the range goes back
        onto this worker's deque before each piece, for that worker to steal. (Not
        before: an idle core that finds no chunk worth taking from a GPU's deque would
        have the others hand ranges back and forth.)"""
        run = self.workers[me].run_chunk
        lo, hi, victim, t = held[0]
        seconds, donate = SLICE_S, False
        while True:
            if self.steal_live:
                d = self.deques
                drain = _drain_seconds(d.state, self.dead, self.per_index, self.chunk_sizes)
                donate = drain == 0.0 and True in self.idle
                seconds = max(self.least_s, min(SLICE_S, drain))
            end = lo + _piece(hi - lo, per_index, seconds)
            if donate and hi - end >= end - lo:  # the rest is at least another piece
                self._push_back(me, [(end, hi)])
                hi = end
                held[0] = (lo, hi, victim, t)
            run(lo, end)
            now = time.perf_counter()
            per_index = self.per_index[me] = (now - t) / (end - lo)
            if end == hi or self.deques.has_empty_token(me):
                held[0] = (lo, end, victim, t)
                return per_index
            self._log(me, log_, [(lo, end, victim, t)], now)
            lo, t = end, now
            held[0] = (lo, hi, victim, t)

    def _complete(self, me, log_, held, group_start, oldest=None):
        """Count the ``oldest`` ranges held (all by default) as run, now: busy since
        ``group_start`` (the first launch of the group, or a GPU's last completion while
        it kept chunks in flight); returns now, the next group's start."""
        t_end = time.perf_counter()
        done = held[:oldest]
        log_.busy += t_end - group_start
        count = sum(hi - lo for lo, hi, *_ in done)
        if count and self.workers[me].sync is not None:  # a CPU's: per piece (_run_pieces)
            per_index = self.per_index[me] = (t_end - group_start) / count
            lo, hi, _, launched = done[0]
            self.latency[me] = max(0.0, t_end - launched - (hi - lo) * per_index)
        self._log(me, log_, done, t_end)
        _release(self.ctl, len(done))
        del held[:len(done)]
        return t_end

    def _log(self, me, log_, ranges, t_end):
        """Count ``ranges`` (held entries) as run, ending at ``t_end``."""
        for lo, hi, victim, t_start in ranges:
            log_.chunks += 1
            log_.indices += hi - lo
            if self.record_events:
                log_.events.append(ChunkEvent(
                    self.workers[me].name, lo, hi, t_start - self.t0, t_end - self.t0,
                    None if victim < 0 else self.workers[victim].name))

    def _push_back(self, me, ranges):
        d = self.deques
        if not _push_back(d.state, d.buf, d.capacity, self.ctl, me,
                          np.array(ranges, dtype=np.int64).reshape(-1, 2)):
            # The capacity (_Loop) leaves room for every push a worker makes: this is a
            # bug, and the ranges not pushed would never run.
            raise HetflowError(f"worker {self.workers[me].name!r}: its deque of {d.capacity} chunks "
                               f"is full, which the capacity set for the loop rules out: a bug in "
                               f"hetflow's work stealing (please report it)")

    def _fail(self, me, held, exc):
        """Give back the held ranges whose results did not land, leave the loop, and let
        the others finish them; an exception of the kernel's own code stops the loop
        instead (it is raised)."""
        if isinstance(exc, KERNEL_RAISED):
            raise exc
        w = self.workers[me]
        landed = w.salvage() if w.salvage is not None and held else 0
        if landed:
            self._log(me, self.logs[me], held[:landed], time.perf_counter())
        ranges = [(lo, hi) for lo, hi, _, _ in held[landed:]]
        self._push_back(me, ranges)      # re-queue first, then die, then drop the hold
        _mark_dead(self.dead, me)
        self.logs[me].failed = True
        with self.lock:
            self.failures.append((time.perf_counter() - self.t0, me, exc, ranges))
        # (the exception as text: a record kept by a handler would keep its frames alive)
        log.warning("worker %s on %s failed: %s; %d range(s) re-queued for the others",
                    w.name, w.device_id, repr(exc), len(ranges))
        if self.faults == "raise":
            self.deques.write_empty_token()
        _release(self.ctl, len(held))

    # The calling thread --------------------------------------------------------------
    def run(self):
        self.t0 = time.perf_counter()
        done = []
        try:
            for i in self.order:  # GPUs first: their first chunk has the longest way to go
                done.append(_THREADS.start(lambda i=int(i): self.work(i), f"hetflow-{self.workers[i].name}"))
            # Short sleeps: SIGINT may land on any thread (often one of the simulated
            # GPU's), and its handler runs here only when this thread runs again.
            waiting = list(done)
            while waiting:
                if waiting[-1].wait(_WAKE_S):
                    waiting.pop()
        except BaseException:            # Ctrl-C: stop the workers after their piece
            self.deques.write_empty_token()
            for d in done:
                d.wait()
            raise
        return time.perf_counter() - self.t0

    def report(self, n, schedule, wall):
        names = [w.name for w in self.workers]
        nw = len(self.workers)
        # Steals per thief and victim kind, summed by NumPy: with 16 workers a loop over the
        # pairs took half of the report's time (0.08 of 0.18 ms on the 2-core dev box).
        kinds = sorted({w.kind for w in self.workers})
        of_kind = np.array([[w.kind == k for k in kinds] for w in self.workers], dtype=np.int64)
        by_kind = np.einsum("tvc,vk->tkc", self.steals.reshape(nw, nw, 2), of_kind).tolist()
        stats = []
        for (w, lg), counts in zip(zip(self.workers, self.logs), by_kind):
            s = WorkerStats(w.name, w.kind, w.device_id, lg.chunks, lg.indices,
                            busy_s=lg.busy, idle_s=max(0.0, lg.lifetime - lg.busy),
                            failed=lg.failed)
            for k, (attempted, succeeded) in zip(kinds, counts):
                s.steals_attempted[f"{w.kind}->{k}"] += attempted
                s.steals_succeeded[f"{w.kind}->{k}"] += succeeded
            stats.append(s)
        events = sorted((e for lg in self.logs for e in lg.events), key=lambda e: e.t_start)
        failures = [FailureRecord(names[me], self.workers[me].device_id, repr(exc), t,
                                  tuple(ranges))
                    for t, me, exc, ranges in sorted(self.failures, key=lambda f: f[0])]
        return RunReport(n, schedule, wall, stats, events, failures)


def run_loop(n: int, workers, *, schedule: str = "steal", shares=None,
             faults: str = "recover", report: bool = True,
             steal_threshold: int = 0) -> RunReport:
    """Run indices ``[0, n)`` over ``workers``, every index exactly once; return a report.

    ``schedule='steal'`` balances by work stealing; ``'static'`` runs each worker's own
    chunks only (stealing only from failed workers). ``shares`` are the fractions of the
    range each worker starts with (equal when None; see
    :meth:`hetflow.runtime.perfmodel.PerfModel.shares`). A worker steals when its own
    deque holds at most ``steal_threshold`` chunks. ``faults='recover'`` moves a failed
    worker's chunks to the others (raising :class:`DeviceError` only if all fail);
    ``'raise'`` stops the loop at the first failure and raises; the exception carries
    the partial report as ``.report``. ``report=False`` skips
    the per-chunk events (counters are always kept). Chunks that would not fit the
    deques (:data:`MAX_CHUNKS` entries over all workers) are an ArgumentError naming
    the worker and the chunk size that fits, before anything runs.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ArgumentError(f"the loop length must be a non-negative integer, got {n!r}")
    workers = list(workers)
    if not workers:
        raise ArgumentError("run_loop needs at least one worker")
    if not all(isinstance(w, Worker) for w in workers):
        raise ArgumentError("workers must be hetflow.runtime.steal.Worker instances")
    if len({w.name for w in workers}) != len(workers):
        raise ArgumentError(f"worker names must be unique, got {[w.name for w in workers]}")
    if schedule not in ("steal", "static"):
        raise ArgumentError(f"schedule must be 'steal' or 'static', got {schedule!r}")
    if faults not in ("recover", "raise"):
        raise ArgumentError(f"faults must be 'recover' or 'raise', got {faults!r}")
    if not isinstance(steal_threshold, (int, np.integer)) or steal_threshold < 0:
        raise ArgumentError(f"steal_threshold must be a non-negative integer, "
                            f"got {steal_threshold!r}")
    loop = _Loop(int(n), workers, schedule, check_shares(shares, len(workers)), faults,
                 report, int(steal_threshold))
    wall = loop.run()
    if loop.crash is not None:
        raise loop.crash
    result = loop.report(int(n), schedule, wall)
    if loop.failures:
        t, me, exc, _ = min(loop.failures, key=lambda f: f[0])
        # The workers' exceptions hold their frames, and those the loop: dropped here,
        # the loop (and through its workers the launch's arrays) goes at once, not at
        # the garbage collector's next pass.
        loop.failures.clear()
        failed = [f"{w.name} ({w.device_id})" for w, lg in zip(workers, loop.logs) if lg.failed]
        err = None
        if faults == "raise":
            err = DeviceError(f"worker {workers[me].name} on {workers[me].device_id} "
                                f"failed: {exc!r}")
        elif len(failed) == len(workers):
            err = DeviceError(f"every worker failed: {', '.join(failed)}; first error: "
                                f"{exc!r}")
        if err is not None:
            err.report = result          # what ran before the loop gave up
            raise err from exc
    return result
