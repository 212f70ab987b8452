"""What one work-stealing loop did: per-worker counters, chunk events and failures.

A :class:`RunReport` is self-contained (plain numbers and strings, no references to
workers, arrays or threads), so it can be kept, compared, dumped to JSON or turned into
a trace after the loop is gone.
"""
from __future__ import annotations

import dataclasses

DIRECTIONS = ("cpu->cpu", "cpu->gpu", "gpu->cpu", "gpu->gpu")
"""Steal directions, written ``thief kind -> victim kind``: ``'cpu->gpu'`` counts steals
by a CPU worker from a GPU's queue."""


@dataclasses.dataclass(frozen=True)
class ChunkEvent:
    """One range ``[lo, hi)`` run by ``worker`` between ``t_start`` and ``t_end``.

    Times are seconds since the loop started. For a worker with several chunks in flight
    (a GPU), ``t_start`` is the launch and ``t_end`` the synchronisation that completed
    it. ``stolen_from`` names the worker whose queue the range was stolen from, or None
    when it came from the worker's own queue.
    """

    worker: str
    lo: int
    hi: int
    t_start: float
    t_end: float
    stolen_from: str | None = None


@dataclasses.dataclass(frozen=True)
class FailureRecord:
    """A worker whose chunk function or synchronisation raised; it was removed.

    ``requeued`` lists the ranges it held (running or in flight) that went back to the
    queues for the other workers.
    """

    worker: str
    device_id: str
    error: str
    t: float
    requeued: tuple[tuple[int, int], ...]


def _zero_directions():
    return {d: 0 for d in DIRECTIONS}


@dataclasses.dataclass
class WorkerStats:
    """Counters of one worker. ``busy_s`` is time with work running (or in flight);
    ``idle_s`` the rest of the worker's lifetime (looking for work, waiting to stop)."""

    name: str
    kind: str
    device_id: str
    chunks: int = 0
    indices: int = 0
    steals_attempted: dict[str, int] = dataclasses.field(default_factory=_zero_directions)
    steals_succeeded: dict[str, int] = dataclasses.field(default_factory=_zero_directions)
    busy_s: float = 0.0
    idle_s: float = 0.0
    failed: bool = False

    @property
    def throughput(self) -> float:
        """Indices completed per second of busy time (0 when it ran nothing)."""
        return self.indices / self.busy_s if self.busy_s > 0 else 0.0

    @property
    def steals(self) -> int:
        """Successful steals, all directions together."""
        return sum(self.steals_succeeded.values())

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["throughput"] = self.throughput
        return out


@dataclasses.dataclass
class RunReport:
    """The outcome of one loop over ``[0, n)`` (see :func:`hetflow.runtime.steal.run_loop`)."""

    n: int
    schedule: str
    wall_s: float
    workers: list[WorkerStats]
    events: list[ChunkEvent] = dataclasses.field(default_factory=list)
    failures: list[FailureRecord] = dataclasses.field(default_factory=list)

    @property
    def by_name(self) -> dict[str, WorkerStats]:
        """The workers' stats keyed by worker name."""
        return {stats.name: stats for stats in self.workers}

    @property
    def steals(self) -> int:
        """Successful steals over all workers and directions."""
        return sum(s.steals for s in self.workers)

    def steals_by_direction(self) -> dict[str, int]:
        """Successful steals summed over workers, per direction."""
        totals = _zero_directions()
        for stats in self.workers:
            for direction, count in stats.steals_succeeded.items():
                totals[direction] += count
        return totals

    def summary(self) -> str:
        """A text table: one row per worker, then totals and failures."""
        head = ("worker", "kind", "device", "chunks", "indices", "steals ok/try",
                "busy s", "idle s", "idx/s", "status")
        rows = [head]
        for s in self.workers:
            rows.append((s.name, s.kind, s.device_id, str(s.chunks), str(s.indices),
                         f"{s.steals}/{sum(s.steals_attempted.values())}",
                         f"{s.busy_s:.4f}", f"{s.idle_s:.4f}", f"{s.throughput:.4g}",
                         "FAILED" if s.failed else "ok"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = ["  ".join(c.rjust(w) if i > 2 else c.ljust(w)
                           for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        directions = ", ".join(f"{d} {c}" for d, c in self.steals_by_direction().items() if c)
        lines.append(f"n={self.n} schedule={self.schedule} wall={self.wall_s:.4f}s "
                     f"steals: {directions or 'none'}")
        for f in self.failures:
            lines.append(f"failure: {f.worker} ({f.device_id}) at {f.t:.4f}s: {f.error}; "
                         f"{len(f.requeued)} range(s) re-queued")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """A JSON-ready dict of everything in the report."""
        return {
            "n": self.n,
            "schedule": self.schedule,
            "wall_s": self.wall_s,
            "workers": [s.to_dict() for s in self.workers],
            "events": [dataclasses.asdict(e) for e in self.events],
            "failures": [dataclasses.asdict(f) for f in self.failures],
        }


class LaunchReport(RunReport):
    """The report of a launch run whole on one device: one worker (named after the
    device), one chunk, no steals; ``schedule`` is ``'one-device'``. A CPU launch spread
    over several cores has one worker per core (``cpu0/core0``, ..., as co-execution
    names them) with the rows it ran; each one's busy time is the launch's (threads are
    not timed one by one).

    Such a launch costs a few microseconds, which building the worker and chunk
    records would add to every call: they are built when first read.
    """

    schedule = "one-device"

    def __init__(self, n: int, device, wall_s: float, pieces=None):
        self.n = n
        self.wall_s = wall_s
        self._device = device
        self._pieces = pieces  # the rows (lo, hi) each thread ran; None: one, all of them

    def __getattr__(self, name):  # only reached while the records are not built yet
        if name == "failures":  # none, unless a failed GPU handed the launch to a CPU (coexec._recover)
            self.failures = []
            return self.failures
        if name not in ("workers", "events"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        dev, n, wall = self._device, self.n, self.wall_s
        pieces = self._pieces if self._pieces and len(self._pieces) > 1 else None
        names = [f"{dev.id}/core{k}" for k in range(len(pieces))] if pieces else [dev.id]
        pieces = pieces or [(0, n)]
        self.workers = [WorkerStats(w, dev.kind, dev.id, chunks=1, indices=hi - lo, busy_s=wall)
                        for w, (lo, hi) in zip(names, pieces)]
        self.events = [ChunkEvent(w, lo, hi, 0.0, wall) for w, (lo, hi) in zip(names, pieces)]
        return self.__dict__[name]
