"""Run reports as Chrome / Perfetto traces (the "Trace Event Format"), and back.

Open the JSON in https://ui.perfetto.dev or ``chrome://tracing``. Layout:

* one *process* per device (GPUs first, the order in which the runtime visits queues),
  one *thread* per worker of that device (a CPU core, a GPU stream);
* each chunk ``[lo, hi)`` a complete event (``"ph": "X"``) on its worker's thread; a
  GPU's chunks in flight together overlap and show nested;
* each chunk taken from another worker's queue (a steal) an instant event on the
  thief's thread and a flow arrow from the victim's thread to the thief's;
* each worker failure an instant event on the failed worker's thread, with the error;
* a ``hetflow`` process above them with the loops (one span each, named by kernel or
  label, with the report's totals in ``args``) and the user's phases.

A distributed run's ranks each make their trace with ``rank=r``, which names every
process and worker after the rank (``hetflow · rank 1``, ``rank 1 · cpu0``,
``rank 1 · cpu0/core0``) and numbers them apart from the other ranks';
:func:`merge_chrome_traces` then puts them into one trace, a group of processes per rank.

Times are microseconds since recording began (``ts``/``dur``, three decimals).
:func:`read_chrome_trace` turns such a file back into lanes and spans, which is what
the timeline picture is drawn from, so a saved trace draws the same picture.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from .._version import __version__
from ..errors import ArgumentError
from .recorder import Phase, RecordedLoop, Recorder

HETFLOW_PROCESS = "hetflow"
_HETFLOW_PID = 1
_LOOPS_TID = 1
_PHASES_TID = 2
_RANK_PIDS = 1000         # process ids per rank: rank r's are r * 1000 + 1, ...
_RANK_FLOWS = 1 << 40     # flow ids per rank, likewise


# -- what goes in ------------------------------------------------------------------------
def _is_report(obj) -> bool:
    return all(hasattr(obj, a) for a in ("wall_s", "events", "workers", "failures"))


def _normalise(source) -> tuple[list[RecordedLoop], list[Phase], float]:
    """Loops with absolute starts, phases, and the clock's zero.

    Bare reports carry no start time: they are laid end to end in the order given.
    """
    if isinstance(source, Recorder):
        loops, phases = list(source.loops), list(source.phases)
        starts = [lp.start for lp in loops] + [p.start for p in phases]
        t0 = source.t0 if source.t0 is not None else min(starts, default=0.0)
        return loops, phases, min([t0, *starts])
    items = [source] if _is_report(source) or isinstance(source, RecordedLoop) else source
    try:
        items = list(items)
    except TypeError:
        raise ArgumentError(f"expected a Recorder, a RunReport or a list of them, got "
                            f"{type(source).__name__}") from None
    loops, clock = [], 0.0
    for k, item in enumerate(items):
        if isinstance(item, RecordedLoop):
            loops.append(item)
        elif _is_report(item):
            loops.append(RecordedLoop(str(getattr(item, "kernel", None) or f"loop {k}"), clock, item))
            clock += item.wall_s
        else:
            raise ArgumentError(f"item {k} is a {type(item).__name__}, not a hetflow RunReport")
    return loops, [], min((lp.start for lp in loops), default=0.0)


@dataclasses.dataclass(frozen=True)
class _Naming:
    """Names and numbers of one recording's processes, workers and flows: as they are
    for a process of its own (``rank`` None), else made unique among a run's ranks."""

    rank: int | None = None

    def __post_init__(self):
        if self.rank is not None and (isinstance(self.rank, bool) or not isinstance(self.rank, int)
                                      or self.rank < 0):
            raise ArgumentError(f"rank must be an integer >= 0 or None, got {self.rank!r}")

    @property
    def hetflow(self) -> str:
        return HETFLOW_PROCESS if self.rank is None else f"{HETFLOW_PROCESS} · rank {self.rank}"

    def __call__(self, name: str) -> str:
        """A device's or worker's name in the trace."""
        return name if self.rank is None else f"rank {self.rank} · {name}"

    @property
    def pid(self) -> int:
        """The hetflow process's id; the devices' follow it."""
        return (self.rank or 0) * _RANK_PIDS + _HETFLOW_PID

    def flow_ids(self):
        first = (self.rank or 0) * _RANK_FLOWS + 1
        return iter(range(first, first + _RANK_FLOWS - 1))


@dataclasses.dataclass
class _Thread:
    tid: int
    worker: str


@dataclasses.dataclass
class _Process:
    pid: int
    device_id: str
    kind: str
    threads: dict[str, _Thread] = dataclasses.field(default_factory=dict)


def _layout(loops, naming) -> dict[str, _Process]:
    """Processes (devices, GPUs first) and threads (workers) in order of appearance."""
    seen: dict[str, _Process] = {}
    for lp in loops:
        for w in lp.report.workers:
            proc = seen.setdefault(w.device_id, _Process(0, w.device_id, w.kind))
            proc.threads.setdefault(w.name, _Thread(0, w.name))
    ordered = sorted(seen.values(), key=lambda p: p.kind != "gpu")   # stable: keeps appearance
    tid = _PHASES_TID
    for pid, proc in enumerate(ordered, start=naming.pid + 1):
        proc.pid = pid
        for thread in proc.threads.values():
            tid += 1
            thread.tid = tid
    return {p.device_id: p for p in ordered}


# -- events ----------------------------------------------------------------------------------
def _meta(kind, pid, tid, **args):
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": args}


def _metadata(processes, with_phases, naming) -> list[dict]:
    pid = naming.pid
    out = [_meta("process_name", pid, 0, name=naming.hetflow),
           _meta("process_sort_index", pid, 0, sort_index=pid - _HETFLOW_PID),
           _meta("thread_name", pid, _LOOPS_TID, name="loops"),
           _meta("thread_sort_index", pid, _LOOPS_TID, sort_index=0)]
    if naming.rank is not None:  # the label the reader groups a rank's loops and phases by
        out.append(_meta("process_labels", pid, 0, labels=f"rank {naming.rank}"))
    if with_phases:
        out += [_meta("thread_name", pid, _PHASES_TID, name="phases"),
                _meta("thread_sort_index", pid, _PHASES_TID, sort_index=1)]
    for proc in processes.values():
        out += [_meta("process_name", proc.pid, 0, name=naming(proc.device_id)),
                _meta("process_labels", proc.pid, 0, labels=proc.kind),
                _meta("process_sort_index", proc.pid, 0, sort_index=proc.pid)]
        for k, thread in enumerate(proc.threads.values()):
            out += [_meta("thread_name", proc.pid, thread.tid, name=naming(thread.worker)),
                    _meta("thread_sort_index", proc.pid, thread.tid, sort_index=k)]
    return out


class _Clock:
    """Absolute ``perf_counter`` seconds to trace microseconds, rounded to nanoseconds.

    Chunks completed by one GPU synchronisation share their end time exactly; rounding
    the end (not the duration) keeps them exactly nested in the trace too.
    """

    def __init__(self, t0: float):
        self.t0 = t0

    def us(self, t: float) -> float:
        return round((t - self.t0) * 1e6, 3)

    def span(self, start: float, end: float) -> dict:
        ts = self.us(start)
        return {"ts": ts, "dur": max(0.0, round(self.us(end) - ts, 3))}


def _loop_events(k, lp, processes, clock, flow_ids, naming) -> list[dict]:
    report, start = lp.report, lp.start
    where = {w.name: processes[w.device_id] for w in report.workers}

    def place(worker):
        if worker not in where:
            raise ArgumentError(f"loop {lp.label!r}: event for worker {worker!r}, which is not "
                                f"among the report's workers {sorted(where)}")
        proc = where[worker]
        return {"pid": proc.pid, "tid": proc.threads[worker].tid}

    out = [{"name": lp.label, "cat": "loop", "ph": "X",
            **clock.span(start, start + report.wall_s), "pid": naming.pid, "tid": _LOOPS_TID,
            "args": {"loop": k, "n": report.n, "schedule": report.schedule,
                     "wall_ms": report.wall_s * 1e3, "chunks": len(report.events),
                     "steals": report.steals,
                     "steals_by_direction": report.steals_by_direction(),
                     "failures": len(report.failures)}}]
    for e in report.events:
        thief = place(e.worker)
        span = clock.span(start + e.t_start, start + e.t_end)
        out.append({"name": f"chunk [{e.lo}, {e.hi})", "cat": "chunk", "ph": "X", **span, **thief,
                    "args": {"lo": e.lo, "hi": e.hi, "indices": e.hi - e.lo,
                             "stolen_from": e.stolen_from and naming(e.stolen_from), "loop": lp.label}})
        if e.stolen_from is not None:
            victim = place(e.stolen_from)
            ts = span["ts"]
            flow = next(flow_ids)
            out += [{"name": f"steal from {naming(e.stolen_from)}", "cat": "steal", "ph": "i", "s": "t",
                     "ts": ts, **thief, "args": {"victim": naming(e.stolen_from), "lo": e.lo, "hi": e.hi}},
                    {"name": "steal", "cat": "steal", "ph": "s", "id": flow, "ts": ts, **victim},
                    {"name": "steal", "cat": "steal", "ph": "f", "bp": "e", "id": flow, "ts": ts,
                     **thief}]
    for f in report.failures:
        out.append({"name": f"{naming(f.worker)} failed", "cat": "failure", "ph": "i", "s": "t",
                    "ts": clock.us(start + f.t), **place(f.worker),
                    "args": {"error": f.error, "device_id": naming(f.device_id),
                             "requeued": [list(r) for r in f.requeued], "loop": lp.label}})
    return out


def _phase_event(p: Phase, clock, naming) -> dict:
    return {"name": p.name, "cat": "phase", "ph": "X", **clock.span(p.start, p.end),
            "pid": naming.pid, "tid": _PHASES_TID, "args": {"depth": p.depth}}


def _by_time(ev) -> tuple:
    """One global order by time, enclosing spans first: every thread's ts stays monotone."""
    return ev["ts"], -ev.get("dur", 0.0)


def to_chrome_trace(source, *, rank: int | None = None) -> dict:
    """A Chrome / Perfetto trace (a JSON-ready dict) of ``source``.

    ``source`` is a :class:`~hetflow.trace.Recorder`, a
    :class:`~hetflow.runtime.report.RunReport`, or a list of reports (laid end to end).
    ``rank``: this process's rank in a distributed run, for :func:`merge_chrome_traces`.
    """
    naming = _Naming(rank)
    loops, phases, t0 = _normalise(source)
    clock = _Clock(t0)
    processes = _layout(loops, naming)
    flow_ids = naming.flow_ids()
    timed = [ev for k, lp in enumerate(loops)
             for ev in _loop_events(k, lp, processes, clock, flow_ids, naming)]
    timed += [_phase_event(p, clock, naming) for p in phases]
    timed.sort(key=_by_time)
    other = {"generator": "hetflow.trace", "hetflow_version": __version__, "loops": len(loops),
             "clock": "microseconds since recording began"}
    if rank is not None:
        other["rank"] = rank
    return {"traceEvents": _metadata(processes, bool(phases), naming) + timed,
            "displayTimeUnit": "ms", "otherData": other}


def merge_chrome_traces(traces) -> dict:
    """One trace of a distributed run: the ranks' traces, each made by
    ``to_chrome_trace(..., rank=r)``, side by side.

    Each rank's clock starts when its recording began, so start the recordings together
    (after a barrier): the ranks then line up to within the barrier's skew.
    """
    traces = list(traces)
    meta, timed, owner = [], [], {}
    for k, trace in enumerate(traces):
        events = trace.get("traceEvents") if isinstance(trace, dict) else None
        if not isinstance(events, list):
            raise ArgumentError(f"trace {k} is not a Chrome trace (a dict with a 'traceEvents' list)")
        for ev in events:
            first = owner.setdefault(ev.get("pid"), k)
            if first != k:
                raise ArgumentError(f"traces {first} and {k} both use process id {ev.get('pid')}: "
                                    f"make each with to_chrome_trace(..., rank=r), r its own rank")
            (meta if ev.get("ph") == "M" else timed).append(ev)
    timed.sort(key=_by_time)
    loops = sum(t.get("otherData", {}).get("loops", 0) for t in traces)
    return {"traceEvents": meta + timed, "displayTimeUnit": "ms",
            "otherData": {"generator": "hetflow.trace", "hetflow_version": __version__, "loops": loops,
                          "ranks": len(traces), "clock": "microseconds since each rank's recording "
                                                         "began (the ranks began together)"}}


def _is_trace(source) -> bool:
    return isinstance(source, dict) and "traceEvents" in source


def write_chrome_trace(path, source) -> Path:
    """Write :func:`to_chrome_trace` of ``source`` (or ``source`` itself, when it is
    already a trace, such as :func:`merge_chrome_traces` returns) to ``path``; returns
    the path."""
    path = Path(os.fspath(path))
    trace = source if _is_trace(source) else to_chrome_trace(source)
    try:
        path.write_text(json.dumps(trace, separators=(",", ":")))
    except OSError as exc:
        raise ArgumentError(f"cannot write the trace to {path}: {exc.strerror or exc}") from exc
    return path


# -- reading back -------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Lane:
    """One worker's row: its name, its device and the device's kind ('cpu', 'gpu')."""

    worker: str
    device_id: str
    kind: str


@dataclasses.dataclass(frozen=True)
class ChunkSpan:
    """A chunk on ``lanes[lane]`` from ``start`` to ``end`` seconds."""

    lane: int
    lo: int
    hi: int
    start: float
    end: float
    stolen_from: str | None


@dataclasses.dataclass(frozen=True)
class FailureMark:
    lane: int
    t: float
    error: str


@dataclasses.dataclass(frozen=True)
class Span:
    """A loop or a phase: ``name`` from ``start`` to ``end`` seconds, ``depth`` for nesting;
    ``group``: the rank it ran on (``"rank 1"``) in a distributed run's trace, else "";
    ``steals``: a loop's steals as its run report counts them (None: not in the trace)."""

    name: str
    start: float
    end: float
    depth: int = 0
    group: str = ""
    steals: int | None = None


@dataclasses.dataclass
class TraceContents:
    """What a hetflow Chrome trace holds, in seconds since recording began."""

    lanes: list[Lane]
    chunks: list[ChunkSpan]
    failures: list[FailureMark]
    loops: list[Span]
    phases: list[Span]


_REQUIRED = {"X": ("name", "ts", "dur", "pid", "tid"), "i": ("name", "ts", "pid", "tid"),
             "M": ("name", "pid", "args")}


def _load(source):
    if isinstance(source, (str, os.PathLike)):
        path = Path(os.fspath(source))
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ArgumentError(f"cannot read trace file {path}: {exc.strerror or exc}") from exc
        except UnicodeDecodeError as exc:  # an image, say, given for its trace
            raise ArgumentError(f"{path} is not a trace (Chrome trace JSON): it is not text") from exc
        try:
            return json.loads(text), str(path)
        except json.JSONDecodeError as exc:
            raise ArgumentError(f"{path} is not JSON: {exc}") from exc
    return source, "the trace"


def _kind(value) -> str:
    """What a JSON value is, for a message: "a number", "an array", ..."""
    kinds = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array"}
    return kinds.get(type(value), "null" if value is None else f"a {type(value).__name__}")


def _check_event(k, ev, where) -> None:
    if not isinstance(ev, dict):
        raise ArgumentError(f"{where}: event {k} is {_kind(ev)}, not a JSON object")
    missing = [key for key in ("ph", *_REQUIRED.get(ev.get("ph"), ())) if key not in ev]
    if missing:
        raise ArgumentError(f"{where}: event {k} lacks {', '.join(missing)}: {str(ev)[:120]}")
    for key in ("ts", "dur"):
        if key in ev and (isinstance(ev[key], bool) or not isinstance(ev[key], (int, float))):
            raise ArgumentError(f"{where}: event {k} has a non-numeric {key!r}: {ev[key]!r}")
    if ev["ph"] == "M" and not isinstance(ev["args"], dict):
        raise ArgumentError(f"{where}: metadata event {k} has args that are not an object")


def _events(source) -> tuple[list[dict], str]:
    data, where = _load(source)
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ArgumentError(f"{where} is not a Chrome trace: expected a JSON object with a "
                            f"'traceEvents' list (or a list of events)")
    for k, ev in enumerate(events):
        _check_event(k, ev, where)
    return events, where


def is_hetflow_process(name) -> bool:
    """Whether a process of the trace is hetflow's own (loops, phases), not a device."""
    return name == HETFLOW_PROCESS or str(name).startswith(f"{HETFLOW_PROCESS} · ")


def _processes_and_threads(events):
    """Process names, process kinds (their labels) and thread names from the metadata."""
    names, kinds, threads = {}, {}, {}
    for ev in events:
        if ev["ph"] != "M":
            continue
        pid, args = ev["pid"], ev["args"]
        if ev["name"] == "process_name":
            names[pid] = str(args.get("name", pid))
        elif ev["name"] == "process_labels":
            kinds[pid] = str(args.get("labels", ""))
        elif ev["name"] == "thread_name":
            threads[(pid, ev.get("tid"))] = str(args.get("name", ev.get("tid")))
    return names, kinds, threads


def _chunk_range(ev, where) -> tuple[int, int]:
    args = ev.get("args") or {}
    try:
        return int(args["lo"]), int(args["hi"])
    except (KeyError, TypeError, ValueError):
        raise ArgumentError(f"{where}: chunk event {ev['name']!r} lacks integer args lo/hi") from None


def read_chrome_trace(source) -> TraceContents:
    """Lanes, chunks, failures, loops and phases of a trace written by :func:`to_chrome_trace`.

    ``source`` is a path to the JSON file or the already loaded dict.
    """
    events, where = _events(source)
    names, kinds, threads = _processes_and_threads(events)
    contents = TraceContents([], [], [], [], [])
    index = {}

    def lane(ev) -> int:
        pid, tid = ev["pid"], ev["tid"]
        if (pid, tid) not in index:
            index[(pid, tid)] = len(contents.lanes)
            contents.lanes.append(Lane(threads.get((pid, tid), f"tid {tid}"), names.get(pid, f"pid {pid}"),
                                       kinds.get(pid, "")))
        return index[(pid, tid)]

    for pid, tid in threads:                       # declared workers first, in trace order
        if not is_hetflow_process(names.get(pid)):
            lane({"pid": pid, "tid": tid})
    for ev in events:
        cat, ph, args, ts = ev.get("cat"), ev["ph"], ev.get("args") or {}, ev.get("ts", 0) * 1e-6
        if ph == "X" and cat == "chunk":
            lo, hi = _chunk_range(ev, where)
            contents.chunks.append(ChunkSpan(lane(ev), lo, hi, ts, ts + ev["dur"] * 1e-6,
                                             args.get("stolen_from")))
        elif ph == "i" and cat == "failure":
            contents.failures.append(FailureMark(lane(ev), ts, str(args.get("error", ev["name"]))))
        elif ph == "X" and cat in ("loop", "phase"):
            steals = args.get("steals") if cat == "loop" else None
            span = Span(ev["name"], ts, ts + ev["dur"] * 1e-6, int(args.get("depth", 0)),
                        kinds.get(ev["pid"], ""), None if steals is None else int(steals))
            (contents.loops if cat == "loop" else contents.phases).append(span)
    return contents
