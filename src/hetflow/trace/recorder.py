"""Collect the run reports of many loops, and user-marked phases, on one clock.

A :class:`~hetflow.runtime.report.RunReport` times its chunks from its own loop's start.
While a :class:`Recorder` is active, every co-executed forall hands its report to
:func:`notify`, which stamps it with the loop's absolute start (``time.perf_counter``),
so the 50 loops of a solver line up on one timeline::

    with hetflow.trace.record() as rec:
        for it in range(50):
            with rec.phase(f"iteration {it}"):
                hetflow.forall(n, step, u, v, device=["cpu0", "gpu0"])
    rec.save("solver.json")          # Chrome / Perfetto trace
    rec.plot("solver.png")           # timeline picture

This module imports only the standard library: the runtime calls :func:`notify` after
every co-executed loop, and with no recorder active that call is one global read.
"""
from __future__ import annotations

import dataclasses
import threading
import time

from ..errors import ArgumentError

_lock = threading.Lock()
_active: tuple[Recorder, ...] = ()   # replaced, never mutated: notify reads it unlocked


def notify(report, label: str | None = None) -> None:
    """Give ``report`` (just returned by a loop) to every active recorder.

    ``label`` names the loop (the kernel's name); the runtime passes it. Cheap when no
    recorder is active.
    """
    active = _active
    if not active:
        return
    now = time.perf_counter()
    for rec in active:
        rec.add(report, label=label, start=now - report.wall_s)


@dataclasses.dataclass(frozen=True)
class RecordedLoop:
    """One loop's report, with its label and absolute start (``time.perf_counter`` seconds)."""

    label: str
    start: float
    report: object


@dataclasses.dataclass(frozen=True)
class Phase:
    """A span the user marked with :meth:`Recorder.phase`; ``depth`` counts enclosing phases."""

    name: str
    start: float
    end: float
    depth: int


class _Label:
    """Returned by :meth:`Recorder.label`: the label is already set; leaving a ``with``
    block restores the one before."""

    def __init__(self, rec: Recorder, previous: str | None):
        self._rec, self._previous = rec, previous

    def __enter__(self):
        return self._rec

    def __exit__(self, *exc):
        self._rec._label = self._previous


class _PhaseSpan:
    def __init__(self, rec: Recorder, name: str):
        self._rec, self._name = rec, name

    def __enter__(self):
        rec = self._rec
        with rec._lock:
            self._depth = rec._depth
            rec._depth += 1
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        end = time.perf_counter()
        rec = self._rec
        with rec._lock:
            rec._depth -= 1
            rec.phases.append(Phase(self._name, self._start, end, self._depth))


class Recorder:
    """Collects every run report produced while it is active (see the module docstring).

    ``loops`` holds :class:`RecordedLoop` entries in the order the loops finished,
    ``phases`` the :class:`Phase` spans in the order they closed; ``t0`` is when
    recording began, the zero of the trace's clock.
    """

    def __init__(self):
        self.loops: list[RecordedLoop] = []
        self.phases: list[Phase] = []
        self.t0: float | None = None
        self._label: str | None = None
        self._depth = 0
        self._lock = threading.Lock()

    # -- activation ----------------------------------------------------------------------
    def __enter__(self) -> Recorder:
        global _active
        with _lock:
            if self in _active:
                raise ArgumentError("this recorder is already recording; use a new "
                                    "hetflow.trace.record() for a nested recording")
            if self.t0 is None:
                self.t0 = time.perf_counter()
            _active = _active + (self,)
        return self

    def __exit__(self, *exc) -> None:
        global _active
        with _lock:
            _active = tuple(r for r in _active if r is not self)

    @property
    def active(self) -> bool:
        return self in _active

    # -- what gets recorded ----------------------------------------------------------------
    def add(self, report, *, label: str | None = None, start: float | None = None) -> RecordedLoop:
        """Record ``report`` by hand (e.g. ``exc.report`` of a loop that raised).

        ``start`` is the loop's ``time.perf_counter`` start (default: it ended just now).
        The label is, first found: the one set by :meth:`label`, ``label``, the report's
        ``kernel`` attribute, ``"loop K"``.
        """
        for attr in ("wall_s", "events", "workers", "failures"):
            if not hasattr(report, attr):
                raise ArgumentError(f"expected a hetflow RunReport, got {type(report).__name__} "
                                    f"(no {attr!r} attribute)")
        if start is None:
            start = time.perf_counter() - report.wall_s
        with self._lock:
            name = (self._label or label or getattr(report, "kernel", None)
                    or f"loop {len(self.loops)}")
            if self.t0 is None:
                self.t0 = start
            loop = RecordedLoop(str(name), start, report)
            self.loops.append(loop)
        return loop

    def label(self, name: str | None) -> _Label:
        """Label the loops recorded from now on ``name`` (None: back to kernel names).

        Also a context manager: ``with rec.label("smoother"): ...`` restores the previous
        label on leaving.
        """
        if name is not None and not isinstance(name, str):
            raise ArgumentError(f"a loop label must be a string or None, got {type(name).__name__}")
        previous, self._label = self._label, name
        return _Label(self, previous)

    def phase(self, name: str) -> _PhaseSpan:
        """A context manager marking a span of the program (``"iteration 3"``) on the trace."""
        if not isinstance(name, str) or not name:
            raise ArgumentError(f"a phase name must be a non-empty string, got {name!r}")
        if self.t0 is None:
            self.t0 = time.perf_counter()
        return _PhaseSpan(self, name)

    # -- output ----------------------------------------------------------------------------
    def to_chrome_trace(self, *, rank: int | None = None) -> dict:
        """The recording as a Chrome / Perfetto trace (see :mod:`hetflow.trace.chrome`);
        ``rank``: this process's rank in a distributed run, for ``merge_chrome_traces``."""
        from .chrome import to_chrome_trace

        return to_chrome_trace(self, rank=rank)

    def save(self, path) -> None:
        """Write the recording as a Chrome trace JSON file (open it in ui.perfetto.dev)."""
        from .chrome import write_chrome_trace

        write_chrome_trace(path, self)

    def plot(self, path, **options):
        """Draw the recording's timeline into an image file; see :func:`~hetflow.trace.plot_timeline`."""
        from .timeline import plot_timeline

        return plot_timeline(self, path, **options)

    def __repr__(self) -> str:
        state = "recording" if self.active else "stopped"
        return f"<hetflow.trace.Recorder {state}: {len(self.loops)} loop(s), {len(self.phases)} phase(s)>"


def record() -> Recorder:
    """A new :class:`Recorder`; use it as ``with hetflow.trace.record() as rec:``."""
    return Recorder()
