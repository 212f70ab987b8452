"""Events: the handles that enqueuing returns (SPEC §2 "Execution queue").

An :class:`Event` stands for one execution instance. Its ``status`` moves from
``'queued'`` to ``'running'`` to ``'complete'`` or ``'failed'``; an instance that
depends on a failed one ends ``'cancelled'`` without running. :class:`UserEvent` is an
event the application completes itself, to hold work back until something outside
hetflow happened.

All bookkeeping of the asynchronous runtime (event states, who waits for whom, the
ready lists of the queues) is guarded by one lock, :data:`LOCK`. One lock keeps the
hot path to one acquisition per enqueue and one per completed instance, and makes
cross-queue dependencies free of lock-ordering problems; the work itself always runs
outside it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import numbers
import threading
from time import perf_counter

from ..errors import ArgumentError, ArgumentTypeError, EventFailedError, HetflowTimeoutError

QUEUED, RUNNING, COMPLETE, FAILED, CANCELLED = "queued", "running", "complete", "failed", "cancelled"
DONE = frozenset((COMPLETE, FAILED, CANCELLED))

LOCK = threading.Lock()
_ids = itertools.count(1)


@contextlib.contextmanager
def locked(timeout: float | None, what: str):
    """Hold LOCK, giving up with HetflowTimeoutError after ``timeout`` seconds: a
    timeout holds whatever state the lock is in."""
    if not LOCK.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
        raise HetflowTimeoutError(f"{what}: the runtime's lock was not free within {timeout} s")
    try:
        yield
    finally:
        LOCK.release()


@dataclasses.dataclass(frozen=True)
class Profile:
    """Profiling record of an instance: ``time.perf_counter()`` seconds (None until
    reached), the device it ran on and the block/thread counts it used there (a CPU
    launch counts its row pieces as blocks of one thread). An instance split over
    devices has a tuple of device ids, no block/thread counts, and ``parts``: the row
    ranges each device ran, ``(device id, lo, hi)``, in the order they finished."""

    queued: float
    submitted: float | None
    started: float | None
    ended: float | None
    device: str | tuple | None
    blocks: int | None
    threads: int | None
    parts: tuple | None = None

    @property
    def duration(self) -> float | None:
        """Seconds from start to end, or None while not finished."""
        return None if self.ended is None or self.started is None else self.ended - self.started


class Event:
    """The handle of one execution instance; query it, wait on it.

    ``wait`` and ``exception`` take a timeout in seconds and raise
    :class:`~hetflow.errors.HetflowTimeoutError` when it passes first.
    """

    __slots__ = ("id", "status", "label", "queued", "submitted", "started", "ended", "device",
                 "blocks", "threads", "parts", "_error", "_waiter", "_needs", "_after", "_retrieved",
                 "__weakref__")

    def __init__(self, label: str):
        self.id = next(_ids)
        self.status = QUEUED
        self.label = label  # what it runs, for messages: "kernel 'axpy'"
        self.queued = perf_counter()
        self.submitted = self.started = self.ended = None
        self.device = self.blocks = self.threads = self.parts = None
        self._error = None
        self._waiter = None       # threading.Event, made only when someone blocks on us
        self._needs = None        # instances that need our result (strong dependents)
        self._after = None        # instances that only run after us (weak dependents)
        self._retrieved = False   # someone looked at our failure

    # -- queries ---------------------------------------------------------------------
    @property
    def done(self) -> bool:
        """True once complete, failed or cancelled."""
        return self.status in DONE

    @property
    def profile(self) -> Profile:
        return Profile(self.queued, self.submitted, self.started, self.ended, self.device,
                       self.blocks, self.threads, self.parts)

    def wait(self, timeout: float | None = None) -> None:
        """Block until the instance is done; raise its error if it failed or was cancelled."""
        error = self.exception(timeout)
        if error is not None:  # (a raise keeps the frames before: each wait's would pile up)
            raise error.with_traceback(None)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Block until done; return the EventFailedError (raised or cancelled), or None."""
        self._block(timeout)
        if self._error is not None and not self._retrieved:
            with LOCK:
                self._reported_locked()
        return self._error

    def _block(self, timeout: float | None) -> None:
        """Block until done (HetflowTimeoutError after ``timeout`` seconds, the wait for
        the lock included: one deadline, so a busy lock does not double the wait)."""
        timeout = timeout_seconds(timeout, self)
        if self.status in DONE:
            return
        deadline = None if timeout is None else perf_counter() + timeout
        with locked(timeout, str(self)):
            if self.status not in DONE and self._waiter is None:
                self._waiter = threading.Event()
        waiter = self._waiter
        left = None if deadline is None else max(0.0, deadline - perf_counter())
        if waiter is not None and not waiter.wait(left):
            raise HetflowTimeoutError(f"{self} did not finish within {timeout} s (still {self.status})")

    def _retire_locked(self, status: str) -> None:
        """Hook: the event is done (an execution instance lets go of its resources)."""

    def _reported_locked(self) -> None:
        """Its failure has reached the application: ``exception`` returned it, ``wait`` or
        a queue's ``finish`` raised it (caller holds LOCK)."""
        self._retrieved = True

    def __repr__(self):
        return f"<hetflow event {self.id} ({self.label}) {self.status}>"

    def __str__(self):
        return f"event {self.id} ({self.label})"


def timeout_seconds(timeout, what) -> float | None:
    """The ``timeout`` of a wait on ``what`` (an event, or words for messages) as threading
    takes it: None or a non-negative number of seconds, any beyond ``threading.TIMEOUT_MAX``
    (some 292 years; infinity too) meaning None (threading overflows on them); else an
    ArgumentTypeError (no number) or ArgumentError."""
    if timeout is None:
        return None
    kind_ok = isinstance(timeout, numbers.Real) and not isinstance(timeout, bool)
    if not kind_ok or not timeout >= 0:
        error = ArgumentError if kind_ok else ArgumentTypeError
        raise error(f"{what}: timeout must be None or a non-negative number of seconds, not {timeout!r}")
    return None if timeout > threading.TIMEOUT_MAX else float(timeout)


class UserEvent(Event):
    """An event completed by the application: instances waiting for it run only after
    :meth:`set_complete`; :meth:`set_failed` cancels them."""

    __slots__ = ()

    def __init__(self, label: str = "user event"):
        super().__init__(label)

    def set_complete(self) -> None:
        self._set(COMPLETE, None)

    def set_failed(self, exception: BaseException) -> None:
        """Mark the event failed with ``exception`` (kept as the cause of its error)."""
        if not isinstance(exception, BaseException):
            raise ArgumentTypeError(f"{self}: set_failed takes an exception, not {type(exception).__name__} "
                                    f"{exception!r}")
        error = EventFailedError(f"{self} failed: {_said(exception)}")
        error.__cause__, error.reason = exception, _said(exception)
        self._set(FAILED, error)

    def _set(self, status: str, error) -> None:
        with LOCK:
            if self.status in DONE:
                raise ArgumentError(f"{self} is already {self.status}; a user event is set once")
            settle_locked(self, status, error)


def add_dependent(current, inst):
    """A dependents slot (None, one instance, or a list: most events have at most one
    dependent of each kind, and a list per event would double the runtime's garbage
    collector load) with ``inst`` added."""
    if current is None:
        return inst
    if type(current) is list:
        current.append(inst)
        return current
    return [current, inst]


def dependents(slot) -> tuple | list:
    """The instances in a dependents slot."""
    return () if slot is None else slot if type(slot) is list else (slot,)


def settle_locked(event: Event, status: str, error) -> None:
    """Finish ``event`` and everything that follows from it (caller holds LOCK).

    Dependents whose last dependency this was become ready. A failure dooms the
    *strong* dependents (read-after-write and explicit ``wait_for``); the weak ones
    (write-after-read, write-after-write: only an ordering) just stop waiting on it.
    A doomed instance is cancelled when its *last* dependency is over, not at once: it
    keeps its place in the order, so a later writer of its data, ordered after it, still
    runs after the earlier work it was itself ordered after.
    """
    event.status, event._error = status, error
    if event._waiter is not None:
        event._waiter.set()
    event._retire_locked(status)
    if event._needs is not None or event._after is not None:
        release_locked(event)


def release_locked(event: Event) -> None:
    """Release the dependents of ``event``, just settled (caller holds LOCK; see
    :func:`settle_locked`), and settle the cancellations that follow. Iterative, so a
    chain of any length is fine."""
    cancelled = None  # doomed dependents released, settled in turn (a list, made on demand)
    while True:
        needs, after = event._needs, event._after
        if needs is not None:
            event._needs = None
            cancelled = _release_locked(needs, event if event.status is not COMPLETE else None,
                                        event._error, cancelled)
        if after is not None:
            event._after = None
            cancelled = _release_locked(after, None, None, cancelled)
        if not cancelled:
            return
        event = cancelled.pop()
        event.status, event._error = CANCELLED, event.doomed  # settle_locked's first half
        if event._waiter is not None:
            event._waiter.set()
        event._retire_locked(CANCELLED)


def _release_locked(slot, failed, error, cancelled):
    """One dependency of each queued instance in a dependents ``slot`` is over: met, or
    ``failed`` (the event that failed or was cancelled, with ``error``: dooms them).
    Those left waiting for nothing become ready; doomed ones are added to ``cancelled``
    (made on demand), which is returned."""
    for dep in (slot if type(slot) is list else (slot,)):  # dependents(), inlined
        if dep.status is QUEUED:
            if failed is not None and dep.doomed is None:
                dep.doomed = cancelled_error(dep, failed, error)
            dep.pending -= 1
            if dep.pending == 0 and dep.submitted is not None:
                if dep.doomed is None:  # start_locked(), inlined: once per instance
                    dep.core.ready_locked(dep)
                elif cancelled is None:
                    cancelled = [dep]
                else:
                    cancelled.append(dep)
    return cancelled


def start_locked(inst) -> None:
    """``inst`` waits for nothing any more: make it ready, or cancel it if it is doomed."""
    if inst.doomed is None:
        inst.core.ready_locked(inst)
    else:
        settle_locked(inst, CANCELLED, inst.doomed)


def cancelled_error(event: Event, cause: Event, cause_error) -> EventFailedError:
    """The error of ``event``, cancelled because ``cause`` failed or was cancelled: it
    says why the first one failed, in words (not as its cause: the failure's traceback
    would keep what its frames held alive as long as any cancelled event's error)."""
    root = getattr(cause_error, "failed_event", None)
    if root is not None:
        how = f"which was cancelled because {root} failed"
    else:
        how = "which failed" if cause.status is FAILED else "which was cancelled"
    reason = getattr(cause_error, "reason", None)
    error = EventFailedError(f"{event} was cancelled: it depends on {cause}, {how}"
                             + (f" ({reason})" if reason else ""))
    error.failed_event, error.reason = root or cause, reason
    return error


def failed_error(event: Event, device_ids, exc: BaseException) -> EventFailedError:
    """The error of an instance whose kernel raised ``exc``."""
    error = EventFailedError(f"{event} failed on {device_ids}: {_said(exc)}")
    error.__cause__, error.reason = exc, _said(exc)
    return error


def _said(exc: BaseException) -> str:
    """What ``exc`` says, with its class."""
    return f"{type(exc).__name__}: {exc}"
