"""Traces, timelines, recordings and progress bars of co-executed loops.

Oracles: the run report's own event list and worker counters (the trace must say the
same thing, nothing lost or invented), the loop's mathematical result (chunk ranges in
the trace tile [0, n) exactly once; the kernel's output equals NumPy's), and the
structural rules of the Chrome trace event format (required keys per phase, monotone
timestamps per thread, properly nested spans).
"""
import argparse
import io
import json
import threading
import time
import warnings
from collections import Counter

import numpy as np
import pytest
from numba import njit

import hetflow
import hetflow.trace as ht
from hetflow.errors import ArgumentError, DeviceError
from hetflow.runtime.deque import fetch_add
from hetflow.runtime.steal import Worker, run_loop


@hetflow.kernel
def twice_plus_one(i, x, out):
    out[i] = 2.0 * x[i] + 1.0


@hetflow.kernel
def square(i, x, out):
    out[i] = x[i] * x[i]


@njit(nogil=True)
def count(lo, hi, counts):
    for i in range(lo, hi):
        fetch_add(counts, i, 1)


class ChunkFailed(Exception):
    """The failure injected into a synthetic worker."""


# -- building real reports -------------------------------------------------------------------
def forall_report(n=20_000, kernel=twice_plus_one):
    x = np.arange(n, dtype=np.float64)
    out = np.zeros(n)
    report = hetflow.forall(n, kernel, x, out, device="cpu0", schedule="steal")
    expected = 2.0 * x + 1.0 if kernel is twice_plus_one else x * x
    np.testing.assert_array_equal(out, expected)
    return report


def steal_and_failure_report(n=600):
    """A loop with certain steals and one certain failure.

    'owner' holds half the range and blocks in its first chunk until 'thief' (which
    starts with nothing, so every chunk it runs is stolen) has run one; the thief
    blocks in its first chunk until 'broken', holding the other half, has failed on
    its first chunk, whose ranges then go to the others.
    """
    counts = np.zeros(n, dtype=np.int64)
    thief_ran, broken_failed = threading.Event(), threading.Event()

    def owner(lo, hi):
        assert thief_ran.wait(timeout=30)
        count(lo, hi, counts)

    def thief(lo, hi):
        assert broken_failed.wait(timeout=30)
        count(lo, hi, counts)
        thief_ran.set()

    def broken(lo, hi):
        broken_failed.set()
        raise ChunkFailed("broken: ECC error on launch")

    workers = [Worker("owner", "cpu", owner, 8, "cpu0"), Worker("thief", "cpu", thief, 8, "cpu0"),
               Worker("broken", "gpu", broken, 16, "gpu0")]
    report = run_loop(n, workers, shares=[1, 0, 1])
    assert np.array_equal(counts, np.ones(n, dtype=np.int64))     # each index ran once
    assert len(report.failures) == 1
    return report


def many_lanes_report(n=4_000, cpus=16):
    """16 CPU workers and one GPU-like worker keeping two chunks in flight."""
    counts = np.zeros(n, dtype=np.int64)
    pending = []

    def launch(lo, hi):
        pending.append((lo, hi))

    def sync():
        for lo, hi in pending:
            count(lo, hi, counts)
        pending.clear()

    workers = [Worker("gpu0", "gpu", launch, 256, "gpu0", inflight=2, sync=sync)]
    workers += [Worker(f"cpu0/core{k}", "cpu", lambda lo, hi: count(lo, hi, counts), 32, "cpu0")
                for k in range(cpus)]
    report = run_loop(n, workers)
    assert np.array_equal(counts, np.ones(n, dtype=np.int64))
    return report


def gathered_steals_report(n=256):
    """A loop in which a GPU-like thief gathers adjacent entries: steals outnumber the
    stolen chunks.

    'cpu' (chunk 8) holds the whole range and blocks in its first chunk until 'gpu'
    (chunk 64, an empty queue) has run one; so the gpu's first steal takes the top
    entry and the seven adjacent below it (eight steals) as one chunk of 64.
    """
    counts = np.zeros(n, dtype=np.int64)
    gpu_ran = threading.Event()

    def cpu(lo, hi):
        assert gpu_ran.wait(timeout=30)
        count(lo, hi, counts)

    def gpu(lo, hi):
        count(lo, hi, counts)
        gpu_ran.set()

    report = run_loop(n, [Worker("cpu", "cpu", cpu, 8, "cpu0"), Worker("gpu", "gpu", gpu, 64, "gpu0")],
                      shares=[1, 0])
    assert np.array_equal(counts, np.ones(n, dtype=np.int64))
    return report


# -- structural checks of the Chrome trace format ------------------------------------------------
REQUIRED = {"X": {"name", "ph", "ts", "dur", "pid", "tid"}, "i": {"name", "ph", "ts", "pid", "tid", "s"},
            "M": {"name", "ph", "pid", "args"}, "s": {"name", "ph", "ts", "pid", "tid", "id"},
            "f": {"name", "ph", "ts", "pid", "tid", "id", "bp"}}


def check_structure(trace):
    """The rules a viewer relies on; returns the events after a JSON round trip."""
    trace = json.loads(json.dumps(trace))
    events = trace["traceEvents"]
    for ev in events:
        assert ev["ph"] in REQUIRED, ev
        assert REQUIRED[ev["ph"]] <= ev.keys(), ev
        if ev["ph"] != "M":
            assert isinstance(ev["ts"], (int, float)) and ev["ts"] >= 0
        if ev["ph"] == "X":
            assert ev["dur"] >= 0
    last = {}
    for ev in events:
        if ev["ph"] != "M":
            key = (ev["pid"], ev["tid"])
            assert ev["ts"] >= last.get(key, 0.0), f"ts goes back on thread {key}"
            last[key] = ev["ts"]
    # Spans on one thread are disjoint or nested (a GPU's chunks in flight nest), in ns.
    spans = {}
    for ev in events:
        if ev["ph"] == "X":
            ts, end = round(ev["ts"] * 1000), round((ev["ts"] + ev["dur"]) * 1000)
            spans.setdefault((ev["pid"], ev["tid"]), []).append((ts, end))
    for intervals in spans.values():
        open_ends = []
        for ts, end in sorted(intervals, key=lambda s: (s[0], -s[1])):
            while open_ends and open_ends[-1] <= ts:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1], "spans overlap without nesting"
            open_ends.append(end)
    # Flow arrows come in start/finish pairs.
    flows = Counter((ev["id"], ev["ph"]) for ev in events if ev["ph"] in "sf")
    assert all(flows[(i, "s")] == 1 and flows[(i, "f")] == 1 for i, _ in flows)
    return events


def thread_names(events):
    return {(ev["pid"], ev["tid"]): ev["args"]["name"] for ev in events
            if ev["ph"] == "M" and ev["name"] == "thread_name"}


def chunk_events(events):
    return [ev for ev in events if ev["ph"] == "X" and ev.get("cat") == "chunk"]


def assert_tiles(ranges, n):
    covered = 0
    for lo, hi in sorted(ranges):
        assert lo == covered and hi > lo
        covered = hi
    assert covered == n


# -- Chrome traces -----------------------------------------------------------------------------
def test_forall_report_as_chrome_trace_says_what_the_report_says():
    report = forall_report()
    events = check_structure(ht.to_chrome_trace(report))
    names = thread_names(events)
    chunks = chunk_events(events)
    assert len(chunks) == len(report.events)
    assert set(names[(c["pid"], c["tid"])] for c in chunks) <= {w.name for w in report.workers}
    assert {w.name for w in report.workers} <= set(names.values())     # every worker is a thread
    per_thread = Counter(names[(c["pid"], c["tid"])] for c in chunks)
    assert per_thread == Counter({w.name: w.chunks for w in report.workers if w.chunks})
    assert_tiles([(c["args"]["lo"], c["args"]["hi"]) for c in chunks], report.n)
    for c in chunks:
        assert c["name"] == f"chunk [{c['args']['lo']}, {c['args']['hi']})"
        assert c["args"]["indices"] == c["args"]["hi"] - c["args"]["lo"]
    by_range = {(e.lo, e.hi): e for e in report.events}
    for c in chunks:                                   # times are the report's, in microseconds
        e = by_range[(c["args"]["lo"], c["args"]["hi"])]
        assert c["ts"] == pytest.approx(e.t_start * 1e6, abs=2e-3)
        assert c["ts"] + c["dur"] == pytest.approx(e.t_end * 1e6, abs=2e-3)
    processes = {ev["pid"]: ev["args"]["name"] for ev in events if ev["name"] == "process_name"}
    assert set(processes.values()) == {"hetflow", "cpu0"}
    (loop,) = [ev for ev in events if ev.get("cat") == "loop"]
    assert loop["args"]["n"] == report.n and loop["args"]["chunks"] == len(report.events)


def test_steals_and_failures_are_events_on_the_right_threads():
    report = steal_and_failure_report()
    events = check_structure(ht.to_chrome_trace(report))
    names = thread_names(events)
    where = {name: key for key, name in names.items()}
    chunks = chunk_events(events)
    assert len(chunks) == len(report.events)
    assert_tiles([(c["args"]["lo"], c["args"]["hi"]) for c in chunks], report.n)

    stolen = [e for e in report.events if e.stolen_from is not None]
    assert stolen
    def on(ev):
        return names[(ev["pid"], ev["tid"])]

    instants = [ev for ev in events if ev["ph"] == "i" and ev["cat"] == "steal"]
    assert sorted((on(ev), ev["args"]["victim"], ev["args"]["lo"]) for ev in instants) \
        == sorted((e.worker, e.stolen_from, e.lo) for e in stolen)
    starts = {ev["id"]: ev for ev in events if ev["ph"] == "s"}
    finishes = {ev["id"]: ev for ev in events if ev["ph"] == "f"}
    assert len(starts) == len(stolen)
    arrows = sorted((on(starts[i]), on(finishes[i])) for i in starts)
    assert arrows == sorted((e.stolen_from, e.worker) for e in stolen)     # victim -> thief

    (failure,) = [ev for ev in events if ev.get("cat") == "failure"]
    assert (failure["pid"], failure["tid"]) == where["broken"]
    assert "ECC error on launch" in failure["args"]["error"]
    assert failure["args"]["device_id"] == "gpu0"
    assert [tuple(r) for r in failure["args"]["requeued"]] == list(report.failures[0].requeued)
    process = {ev["pid"]: ev["args"]["name"] for ev in events if ev["name"] == "process_name"}
    labels = {process[ev["pid"]]: ev["args"]["labels"] for ev in events if ev["name"] == "process_labels"}
    assert labels == {"gpu0": "gpu", "cpu0": "cpu"}


def test_gpu_chunks_in_flight_nest_and_gpus_come_first():
    report = many_lanes_report()
    events = check_structure(ht.to_chrome_trace(report))
    contents = ht.read_chrome_trace(ht.to_chrome_trace(report))
    assert [lane.worker for lane in contents.lanes] == [w.name for w in report.workers]
    assert contents.lanes[0].kind == "gpu" and {lane.kind for lane in contents.lanes[1:]} == {"cpu"}
    assert len(chunk_events(events)) == len(report.events)


def test_reports_without_start_times_are_laid_end_to_end():
    first, second = forall_report(8_000), forall_report(12_000, square)
    events = check_structure(ht.to_chrome_trace([first, second]))
    loops = [ev for ev in events if ev.get("cat") == "loop"]
    assert [ev["args"]["n"] for ev in loops] == [8_000, 12_000]
    assert loops[0]["ts"] == 0.0
    assert loops[1]["ts"] == pytest.approx(first.wall_s * 1e6, abs=2e-3)
    assert len(chunk_events(events)) == len(first.events) + len(second.events)


def test_ranks_traces_merge_into_one_with_a_group_of_processes_per_rank(tmp_path):
    reports = [steal_and_failure_report(), many_lanes_report()]
    traces = []
    for rank, report in enumerate(reports):
        with ht.record() as rec:
            with rec.phase("start-up"):
                ht.notify(report, label="step")
        traces.append(rec.to_chrome_trace(rank=rank))
    merged = ht.merge_chrome_traces(traces)
    events = check_structure(merged)
    processes = {ev["args"]["name"] for ev in events if ev["name"] == "process_name"}
    assert processes == {"hetflow · rank 0", "rank 0 · cpu0", "rank 0 · gpu0",
                         "hetflow · rank 1", "rank 1 · cpu0", "rank 1 · gpu0"}
    assert merged["otherData"]["ranks"] == 2 and merged["otherData"]["loops"] == 2
    contents = ht.read_chrome_trace(merged)
    expected = [f"rank {r} · {w.name}" for r, report in enumerate(reports) for w in report.workers]
    assert sorted(lane.worker for lane in contents.lanes) == sorted(expected)
    assert sorted((s.group, s.steals) for s in contents.loops) \
        == [(f"rank {r}", reports[r].steals) for r in (0, 1)]
    assert sorted(s.group for s in contents.phases) == ["rank 0", "rank 1"]
    # every stolen chunk names a victim on its own rank
    for c in contents.chunks:
        rank = contents.lanes[c.lane].worker.split(" · ")[0]
        assert c.stolen_from is None or c.stolen_from.startswith(f"{rank} · ")
    stolen = sum(e.stolen_from is not None for report in reports for e in report.events)
    drawn = ht.plot_timeline(merged, tmp_path / "ranks.png")
    assert (drawn.lanes, drawn.stolen, drawn.steals, drawn.loops, drawn.phases) \
        == (len(expected), stolen, sum(r.steals for r in reports), 2, 2)
    with pytest.raises(ArgumentError, match="traces 0 and 1 both use process id 1: make each with "
                                         r"to_chrome_trace\(..., rank=r\)"):
        ht.merge_chrome_traces([ht.to_chrome_trace(reports[0]), ht.to_chrome_trace(reports[1])])
    with pytest.raises(ArgumentError, match="rank must be an integer >= 0 or None, got -1"):
        ht.to_chrome_trace(reports[0], rank=-1)


def test_write_and_read_back(tmp_path):
    report = steal_and_failure_report()
    path = ht.write_chrome_trace(tmp_path / "run.json", report)
    contents = ht.read_chrome_trace(path)
    assert json.loads(path.read_text())["otherData"]["generator"] == "hetflow.trace"
    assert sorted((contents.lanes[c.lane].worker, c.lo, c.hi, c.stolen_from) for c in contents.chunks) \
        == sorted((e.worker, e.lo, e.hi, e.stolen_from) for e in report.events)
    (failure,) = contents.failures
    assert contents.lanes[failure.lane].worker == "broken"
    assert failure.t == pytest.approx(report.failures[0].t, abs=1e-8)


@pytest.mark.parametrize("source, message", [
    (42, "expected a Recorder, a RunReport or a list of them, got int"),
    ([object()], "item 0 is a object, not a hetflow RunReport"),
])
def test_to_chrome_trace_rejects_what_is_not_a_report(source, message):
    with pytest.raises(ArgumentError, match=message):
        ht.to_chrome_trace(source)


@pytest.mark.parametrize("text, message", [
    ("{not json", "is not JSON"),
    ('{"events": []}', "is not a Chrome trace: expected a JSON object with a 'traceEvents' list"),
    ('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "pid": 1, "tid": 1}]}', "event 0 lacks dur"),
    ('{"traceEvents": [{"name": "a"}]}', "event 0 lacks ph"),
    ('{"traceEvents": [7]}', "event 0 is a number, not a JSON object"),
    ('{"traceEvents": [[1]]}', "event 0 is an array, not a JSON object"),
    ('{"traceEvents": [{"ph": "i", "name": "a", "ts": "soon", "pid": 1, "tid": 1}]}', "non-numeric 'ts'"),
    ('{"traceEvents": [{"ph": "M", "name": "thread_name", "pid": 1, "args": 3}]}',
     "args that are not an object"),
    ('{"traceEvents": [{"ph": "X", "cat": "chunk", "name": "c", "ts": 1, "dur": 1, "pid": 1, "tid": 1}]}',
     "chunk event 'c' lacks integer args lo/hi"),
])
def test_reading_bad_trace_files(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ArgumentError, match=message):
        ht.read_chrome_trace(path)


def test_reading_a_file_that_is_not_text(tmp_path):
    """A timeline image given for its trace: before, a UnicodeDecodeError (a traceback from
    ``hetflow trace``)."""
    path = tmp_path / "t.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    with pytest.raises(ArgumentError, match=r"t\.png is not a trace \(Chrome trace JSON\): it is not text"):
        ht.read_chrome_trace(path)


def test_reading_a_missing_file(tmp_path):
    with pytest.raises(ArgumentError, match="cannot read trace file .*missing.json: No such file"):
        ht.read_chrome_trace(tmp_path / "missing.json")


def test_writing_to_a_missing_directory(tmp_path):
    with pytest.raises(ArgumentError, match="cannot write the trace to .*nowhere"):
        ht.write_chrome_trace(tmp_path / "nowhere" / "run.json", forall_report(4_000))


# -- timelines ------------------------------------------------------------------------------------
def png_size(path):
    from matplotlib.image import imread

    return imread(path).shape


def test_timeline_draws_one_bar_per_chunk(tmp_path):
    report = steal_and_failure_report()
    drawn = ht.plot_timeline(report, tmp_path / "t.png")
    stolen = sum(e.stolen_from is not None for e in report.events)
    assert (drawn.lanes, drawn.bars, drawn.stolen, drawn.steals, drawn.failures, drawn.loops) \
        == (len(report.workers), len(report.events), stolen, report.steals, 1, 1)
    data = (tmp_path / "t.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    height, width, _ = png_size(tmp_path / "t.png")
    assert width > 1000 and height > 250


def test_timeline_of_sixteen_cpu_lanes_and_a_gpu(tmp_path):
    report = many_lanes_report()
    drawn = ht.plot_timeline(report, tmp_path / "many.png", title="16 cores + 1 GPU")
    assert drawn.lanes == 17 and drawn.bars == len(report.events)
    assert drawn.stolen == sum(e.stolen_from is not None for e in report.events)
    assert drawn.steals == report.steals
    height, _, _ = png_size(tmp_path / "many.png")
    assert height > png_size(ht.plot_timeline(forall_report(), tmp_path / "two.png").path)[0]


def test_timeline_counts_steals_as_the_run_report_does(tmp_path):
    """The picture's steal count is the run's table's (the reports' steals), also when a
    thief gathered several entries into one chunk; the stolen chunks are counted apart."""
    report = gathered_steals_report()
    stolen = sum(e.stolen_from is not None for e in report.events)
    assert report.steals > stolen                         # a steal gathered several entries
    with ht.record() as rec:
        ht.notify(report, label="gathered")
        ht.notify(report, label="again")
    live = rec.plot(tmp_path / "live.png")
    assert (live.steals, live.stolen) == (2 * report.steals, 2 * stolen)
    rec.save(tmp_path / "run.json")
    assert ht.plot_timeline(tmp_path / "run.json", tmp_path / "saved.png").steals == 2 * report.steals
    # Bare events say nothing of the reports: their stolen chunks are the count.
    events = [ev for ev in rec.to_chrome_trace()["traceEvents"] if ev.get("cat") != "loop"]
    assert ht.plot_timeline(events, tmp_path / "bare.png").steals == 2 * stolen


def test_timeline_window_draws_only_what_overlaps_it(tmp_path):
    report = many_lanes_report()
    # Midway between two chunk boundaries: a worker's next chunk starts at the very time
    # its last one ended, and at a boundary the window's ms would decide by rounding.
    times = sorted({t for e in report.events for t in (e.t_start, e.t_end)})
    cut = (times[len(times) // 2] + times[len(times) // 2 + 1]) / 2
    drawn = ht.plot_timeline(report, tmp_path / "w.png", window=(0.0, cut * 1e3))
    assert drawn.bars == sum(e.t_start <= cut for e in report.events)
    assert drawn.span_ms == pytest.approx(cut * 1e3)


def _phased_recording():
    """Two phases: a long first one, then three loops in "solve warm"."""
    with ht.record() as rec:
        with rec.phase("start-up"):
            forall_report(40_000)
        with rec.phase("solve warm"):
            for _ in range(3):
                forall_report(4_000)
    return rec


def test_timeline_zoom_adds_a_panel_of_a_phase_and_counts_the_whole_picture(tmp_path):
    rec = _phased_recording()
    whole = rec.plot(tmp_path / "whole.png")
    zoomed = rec.plot(tmp_path / "zoomed.png", zoom="solve warm")
    assert zoomed.bars == whole.bars and zoomed.span_ms == whole.span_ms  # the first panel's counts
    assert png_size(zoomed.path)[0] > 1.8 * png_size(whole.path)[0]       # a second panel below
    solve = next(p for p in rec.phases if p.name == "solve warm")
    by_range = rec.plot(tmp_path / "range.png", zoom=((solve.start - rec.t0) * 1e3, (solve.end - rec.t0) * 1e3))
    assert png_size(by_range.path)[0] > 1.8 * png_size(whole.path)[0]


@pytest.mark.parametrize("zoom, message", [
    ("nothing", r"no phase named 'nothing' to zoom to; the trace's phases: 'solve warm', 'start-up'"),
    ((5.0, 1.0), r"zoom must satisfy 0 <= start_ms < end_ms, got \(5.0, 1.0\)"),
    ((1.0,), "zoom must be two numbers"),
])
def test_timeline_bad_zoom(tmp_path, zoom, message):
    with pytest.raises(ArgumentError, match=message):
        _phased_recording().plot(tmp_path / "z.png", zoom=zoom)


def test_trace_command_zooms_to_a_phase_named_with_spaces_or_a_range(tmp_path, capsys):
    from hetflow.cli.main import main

    rec = _phased_recording()
    rec.save(tmp_path / "run.json")
    plain = png_size(rec.plot(tmp_path / "plain.png").path)[0]
    for k, zoom in enumerate((["solve warm"], ["0", "1"])):
        out = tmp_path / f"z{k}.png"
        assert main(["trace", str(tmp_path / "run.json"), "-o", str(out), "--zoom", *zoom]) == 0
        assert png_size(out)[0] > 1.8 * plain
    assert main(["trace", str(tmp_path / "run.json"), "--zoom", "solve"]) == 1
    assert "no phase named 'solve' to zoom to" in capsys.readouterr().err


@pytest.mark.parametrize("zoom", [["solve", "warm"], ["0", "1", "2"], ["1", "two"]])
def test_trace_command_zoom_takes_one_phase_or_two_numbers_and_says_so(tmp_path, capsys, zoom):
    """A phase's name unquoted, or a third number, is a usage error naming both forms."""
    from hetflow.cli.main import main

    _phased_recording().save(tmp_path / "run.json")
    with pytest.raises(SystemExit) as exc:
        main(["trace", str(tmp_path / "run.json"), "-o", str(tmp_path / "z.png"), "--zoom", *zoom])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "[--zoom PHASE | START_MS END_MS]" in err and "..." not in err   # one form or the other
    assert err.endswith("hetflow trace: error: argument --zoom: takes one phase's name (quoted if it holds "
                        f"spaces) or two numbers START_MS END_MS, got {len(zoom)} values: {' '.join(zoom)}\n")
    assert not (tmp_path / "z.png").exists()


def _gapped_recording():
    """Two loops a second apart on the recording's clock, nothing recorded between them,
    and the trace's last end in ms."""
    report = forall_report(4_000)
    rec = ht.Recorder()
    rec.add(report, label="first", start=0.0)
    rec.add(report, label="second", start=1.0)
    return rec, (1.0 + report.wall_s) * 1e3


@pytest.mark.parametrize("option", ["window", "zoom"])
def test_timeline_range_outside_the_trace_is_refused_naming_the_trace_s_span(tmp_path, option):
    rec, last = _gapped_recording()
    with pytest.raises(ArgumentError, match=rf"^{option} 5000-6000 ms holds no recorded event; the "
                                            rf"trace's events span 0-{last:.4g} ms$"):
        rec.plot(tmp_path / "out.png", **{option: (5000, 6000)})
    assert not (tmp_path / "out.png").exists()


@pytest.mark.parametrize("option", ["window", "zoom"])
def test_timeline_range_in_a_gap_of_the_trace_draws_with_a_warning(tmp_path, option):
    rec, last = _gapped_recording()
    with pytest.warns(UserWarning, match=rf"^{option} 500-600 ms holds no recorded event; the trace's "
                                         rf"events span 0-{last:.4g} ms: its panel is empty$"):
        drawn = rec.plot(tmp_path / "gap.png", **{option: (500, 600)})
    assert drawn.bars == (0 if option == "window" else len(rec.loops[0].report.events) * 2)
    with warnings.catch_warnings():                       # a range holding the first loop: no warning
        warnings.simplefilter("error")
        drawn = rec.plot(tmp_path / "first.png", **{option: (0, 500)})
    assert drawn.bars == len(rec.loops[0].report.events) * (1 if option == "window" else 2)


def test_trace_command_warns_of_an_empty_window_in_one_line_and_refuses_one_outside(tmp_path, capsys):
    from hetflow.cli.main import main

    rec, last = _gapped_recording()
    rec.save(tmp_path / "run.json")
    assert main(["trace", str(tmp_path / "run.json"), "--window", "500", "600"]) == 0
    out, err = capsys.readouterr()
    assert err == (f"hetflow: warning: window 500-600 ms holds no recorded event; the trace's events span "
                   f"0-{last:.4g} ms: its panel is empty\n")
    assert out.startswith(f"wrote {tmp_path / 'run.png'}: 0 chunks on ")
    assert main(["trace", str(tmp_path / "run.json"), "--zoom", "5000", "6000"]) == 1
    assert capsys.readouterr().err == (f"hetflow: error: ArgumentError: zoom 5000-6000 ms holds no recorded "
                                       f"event; the trace's events span 0-{last:.4g} ms\n")


@pytest.mark.parametrize("window, message", [
    ((5.0, 1.0), r"window must satisfy 0 <= start_ms < end_ms, got \(5.0, 1.0\)"),
    ("ab", "window must be two numbers"),
    ((1.0, 2.0, 3.0), "window must be two numbers"),
    ((0.0, float("inf")), r"window must end at a finite time, got \(0.0, inf\)"),
])
def test_timeline_bad_window(tmp_path, window, message):
    with pytest.raises(ArgumentError, match=message):
        ht.plot_timeline(forall_report(4_000), tmp_path / "w.png", window=window)


@pytest.mark.parametrize("option, value", [("width", 0), ("width", "wide"), ("dpi", -5)])
def test_timeline_bad_size(tmp_path, option, value):
    with pytest.raises(ArgumentError, match=f"{option} must be a positive number, got {value!r}"):
        ht.plot_timeline(forall_report(4_000), tmp_path / "t.png", **{option: value})


def test_timeline_bad_output(tmp_path):
    report = forall_report(4_000)
    with pytest.raises(ArgumentError, match="cannot write the timeline to .*nowhere"):
        ht.plot_timeline(report, tmp_path / "nowhere" / "t.png")
    with pytest.raises(ArgumentError, match="cannot write the timeline to .*t.nope: Format 'nope' is not"):
        ht.plot_timeline(report, tmp_path / "t.nope")


def test_timeline_without_a_suffix_is_a_png_and_says_so(tmp_path):
    drawn = ht.plot_timeline(forall_report(4_000), tmp_path / "t")
    assert drawn.path == tmp_path / "t.png" and not (tmp_path / "t").exists()
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_timeline_of_an_empty_recording_says_why(tmp_path):
    with ht.record() as rec:
        pass
    assert rec.loops == []
    with pytest.raises(ArgumentError, match="nothing to draw: the trace has no workers"):
        rec.plot(tmp_path / "empty.png")


def test_a_launch_on_one_device_is_recorded_too():
    with ht.record() as rec:
        hetflow.forall(100, twice_plus_one, np.zeros(100), np.zeros(100), device="cpu0")
    [loop] = rec.loops
    assert loop.label == "twice_plus_one" and loop.report.workers[0].device_id == "cpu0"


# -- the recorder ---------------------------------------------------------------------------------
def test_recorder_collects_several_foralls_on_one_clock():
    n = 6_000
    with ht.record() as rec:
        for it in range(3):
            with rec.phase(f"iteration {it}"):
                forall_report(n)
                with rec.label("squares"):
                    forall_report(n, square)
    forall_report(n)                                      # after recording: not collected
    assert len(rec.loops) == 6
    assert [lp.label for lp in rec.loops] == ["twice_plus_one", "squares"] * 3
    assert all(lp.report.n == n for lp in rec.loops)
    for a, b in zip(rec.loops, rec.loops[1:]):            # one after the other, no overlap
        assert a.start + a.report.wall_s <= b.start
    assert [p.name for p in rec.phases] == [f"iteration {k}" for k in range(3)]
    for k, phase in enumerate(rec.phases):                # each phase holds its two loops
        for lp in rec.loops[2 * k:2 * k + 2]:
            assert phase.start <= lp.start and lp.start + lp.report.wall_s <= phase.end
    events = check_structure(rec.to_chrome_trace())
    assert len(chunk_events(events)) == sum(len(lp.report.events) for lp in rec.loops)
    assert [ev["name"] for ev in events if ev.get("cat") == "loop"] == [lp.label for lp in rec.loops]
    assert [ev["name"] for ev in events if ev.get("cat") == "phase"] == [p.name for p in rec.phases]


def test_nested_phases_and_the_label_as_a_plain_call():
    rec = ht.Recorder()
    with rec:
        with rec.phase("solve"):
            with rec.phase("smooth"):
                ht.notify(steal_and_failure_report(), label="kernel name")
        rec.label("mine")
        ht.notify(steal_and_failure_report(), label="kernel name")
        rec.label(None)
        ht.notify(steal_and_failure_report())
    assert [(p.name, p.depth) for p in rec.phases] == [("smooth", 1), ("solve", 0)]
    assert [lp.label for lp in rec.loops] == ["kernel name", "mine", "loop 2"]
    outer, inner = rec.phases[1], rec.phases[0]
    assert outer.start <= inner.start and inner.end <= outer.end
    contents = ht.read_chrome_trace(rec.to_chrome_trace())
    assert sorted((p.name, p.depth) for p in contents.phases) == [("smooth", 1), ("solve", 0)]


def test_notify_reaches_every_active_recorder_and_only_those():
    report = steal_and_failure_report()
    ht.notify(report)                                     # nobody listening: nothing happens
    with ht.record() as outer:
        with ht.record() as inner:
            ht.notify(report, label="both")
        ht.notify(report, label="outer only")
    assert [lp.label for lp in outer.loops] == ["both", "outer only"]
    assert [lp.label for lp in inner.loops] == ["both"]
    assert not outer.active and "2 loop(s)" in repr(outer)


def test_a_loop_that_raised_can_be_added_by_hand(tmp_path):
    def broken(lo, hi):
        raise ChunkFailed("all workers broken")

    with ht.record() as rec:
        with pytest.raises(DeviceError) as info:
            run_loop(100, [Worker("a", "cpu", broken, 10, "cpu0"), Worker("b", "cpu", broken, 10, "cpu0")])
        rec.add(info.value.report, label="failed loop")
    drawn = rec.plot(tmp_path / "failed.png")
    assert (drawn.failures, drawn.bars, drawn.loops) == (2, 0, 1)


def test_recorder_misuse():
    rec = ht.record()
    with rec:
        with pytest.raises(ArgumentError, match="already recording"):
            rec.__enter__()
    with pytest.raises(ArgumentError, match="expected a hetflow RunReport, got dict"):
        rec.add({"wall_s": 1.0})
    with pytest.raises(ArgumentError, match="a loop label must be a string or None, got int"):
        rec.label(3)
    with pytest.raises(ArgumentError, match="a phase name must be a non-empty string, got ''"):
        rec.phase("")


# -- the ``hetflow trace`` command --------------------------------------------------------------------
def trace_parser():
    parser = argparse.ArgumentParser(prog="hetflow")
    ht.add_trace_command(parser.add_subparsers(dest="command", required=True))
    return parser


def test_trace_command_draws_a_saved_trace(tmp_path, capsys):
    report = steal_and_failure_report()
    with ht.record() as rec:
        ht.notify(report, label="steal test")
    rec.save(tmp_path / "run.json")
    args = trace_parser().parse_args(["trace", str(tmp_path / "run.json"), "-o", str(tmp_path / "run.png")])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert f"{len(report.events)} chunks on 3 workers" in out and "1 failure(s)" in out
    assert (tmp_path / "run.png").read_bytes()[:4] == b"\x89PNG"
    live = rec.plot(tmp_path / "live.png")
    saved = ht.plot_timeline(tmp_path / "run.json", tmp_path / "saved.png")
    assert dataclasses_equal_but_path(live, saved)


def dataclasses_equal_but_path(a, b):
    import dataclasses

    return dataclasses.replace(a, path=None) == dataclasses.replace(b, path=None)


def test_trace_command_default_output_and_window(tmp_path, capsys):
    ht.write_chrome_trace(tmp_path / "loop.json", many_lanes_report())
    args = trace_parser().parse_args(["trace", str(tmp_path / "loop.json"), "--window", "0", "0.5",
                                      "--title", "zoomed", "--width", "8"])
    assert args.func(args) == 0
    assert (tmp_path / "loop.png").exists()
    assert "in 0.5 ms" in capsys.readouterr().out


def test_trace_command_help_and_errors(tmp_path, capsys):
    with pytest.raises(SystemExit):
        trace_parser().parse_args(["trace", "--help"])
    help_text = capsys.readouterr().out
    assert "TRACE.json" in help_text and "-o IMAGE" in help_text and "rec.save" in help_text
    args = trace_parser().parse_args(["trace", str(tmp_path / "none.json")])
    with pytest.raises(ArgumentError, match="cannot read trace file"):
        args.func(args)


# -- progress ---------------------------------------------------------------------------------------
class CountingFile(io.StringIO):
    """A file that says it is a terminal (or not) and counts writes."""

    def __init__(self, tty):
        super().__init__()
        self.tty, self.writes = tty, 0

    def isatty(self):
        return self.tty

    def write(self, s):
        self.writes += 1
        return super().write(s)


def test_progress_is_silent_when_not_a_terminal():
    out = CountingFile(tty=False)
    with ht.progress(10, "quiet", file=out) as bar:
        for _ in range(10):
            bar.advance()
    assert out.getvalue() == "" and out.writes == 0
    assert bar.completed == 10 and not bar.visible


def test_progress_draws_on_a_terminal_or_when_forced():
    for out, force in ((CountingFile(tty=True), False), (CountingFile(tty=False), True)):
        with ht.progress(50, "solving", file=out, force=force) as bar:
            bar.advance(20)
            bar.advance(30)
        assert bar.visible
        assert "solving" in out.getvalue() and "50/50" in out.getvalue()


def test_progress_redraws_at_a_bounded_rate():
    out = CountingFile(tty=True)
    start = time.perf_counter()
    with ht.progress(200_000, "busy", file=out) as bar:
        for _ in range(200_000):
            bar.advance()
    elapsed = time.perf_counter() - start
    assert bar.completed == 200_000
    # One write per redraw, plus start and stop: at most ten redraws a second.
    assert out.writes <= 2 * (elapsed * 10 + 3)


def test_progress_counts_from_several_threads():
    with ht.progress(None, "threads", file=CountingFile(tty=False)) as bar:
        threads = [threading.Thread(target=lambda: [bar.advance() for _ in range(20_000)]) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert bar.completed == 80_000


@pytest.mark.parametrize("kwargs, message", [
    ({"total": -1}, "progress total must be a non-negative number or None, got -1"),
    ({"total": "ten"}, "progress total must be a non-negative number or None, got 'ten'"),
    ({"total": 3, "description": 5}, "progress description must be a string, got int"),
    ({"total": 3, "refresh_per_second": 0}, r"refresh_per_second must be in \(0, 60\], got 0"),
])
def test_progress_bad_arguments(kwargs, message):
    with pytest.raises(ArgumentError, match=message):
        with ht.progress(**kwargs):
            pass


def test_progress_cannot_go_back():
    with ht.progress(3, file=CountingFile(tty=False)) as bar:
        with pytest.raises(ArgumentError, match="non-negative amount, got -2"):
            bar.advance(-2)


def test_a_core_s_chunks_end_to_end_share_one_row_and_a_gpu_s_in_flight_do_not():
    from hetflow.trace.chrome import ChunkSpan
    from hetflow.trace.timeline import _slots

    # 0.1 + 0.2 is a rounding error past 0.3: the second chunk still follows the first
    core = [ChunkSpan(0, 0, 10, 0.1, 0.1 + 0.2, None), ChunkSpan(0, 10, 20, 0.3, 0.4, None)]
    assert core[0].end > core[1].start
    assert _slots(core)[1][0] == 1
    gpu = [ChunkSpan(1, 0, 10, 0.1, 0.3, None), ChunkSpan(1, 10, 20, 0.2, 0.4, None)]  # in flight together
    assert _slots(gpu)[1][1] == 2
