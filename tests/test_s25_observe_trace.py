"""A co-executed run as a user sees it: the Chrome trace's format, the timeline's title,
and hetflow.last_report()."""
import json
from collections import defaultdict

import matplotlib
import numpy as np
import pytest

import hetflow

N = 512


@hetflow.kernel
def s25_axpy(i, a, x, y):
    y[i] = a * x[i] + y[i]


@hetflow.kernel
def scale(i, a, x):
    x[i] = a * x[i]


@pytest.fixture(scope="module")
def coexecuted(tmp_path_factory, request):
    """(recorder, forall's report, y, x) of a kernel's first launch, co-executed on cpu0 and
    gpu0 (later ones the performance model may give one device alone). Its tests run under
    the simulator alone (simgpu), which always has gpu0."""
    x, y = np.arange(N, dtype=np.float64), np.ones(N)
    with hetflow.trace.record() as rec, rec.phase("axpy"):
        report = hetflow.forall(N, s25_axpy, 2.0, x, y, device=["cpu0", "gpu0"], schedule="steal")
    return rec, report, y, x


@pytest.mark.simgpu
def test_last_report_is_the_last_launch_and_its_rows_add_up(coexecuted):
    rec, report, y, x = coexecuted
    np.testing.assert_allclose(y, 1.0 + 2.0 * x)
    assert hetflow.last_report() is report is rec.loops[-1].report and report.n == N
    assert {w.device_id for w in report.workers} == {"cpu0", "gpu0"}
    assert sum(w.indices for w in report.workers) == N
    covered = np.zeros(N, dtype=int)
    for e in report.events:
        covered[e.lo:e.hi] += 1
    assert (covered == 1).all()
    assert report.summary().splitlines()[-1].startswith(f"n={N} schedule=steal wall=")


@pytest.mark.simgpu
def test_the_chrome_trace_keeps_the_trace_event_format(coexecuted, tmp_path):
    rec, report, _, _ = coexecuted
    rec.save(tmp_path / "t.json")
    trace = json.loads((tmp_path / "t.json").read_text())
    events = trace["traceEvents"]
    assert trace["displayTimeUnit"] in ("ms", "ns")
    processes = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e["ph"] == "M" and e["name"] == "thread_name"}
    last_ts = defaultdict(float)
    for e in events:
        assert isinstance(e["name"], str) and e["name"] and isinstance(e["pid"], int)
        if e["ph"] == "M":
            continue
        lane = (e["pid"], e["tid"])
        assert lane in threads and e["pid"] in processes, e   # every lane used is named
        assert e["ts"] >= last_ts[lane] >= 0                   # microseconds, monotone per lane
        last_ts[lane] = e["ts"]
        if e["ph"] == "X":
            assert e["dur"] >= 0
        else:
            assert (e["ph"], e["cat"]) in {("i", "steal"), ("s", "steal"), ("f", "steal"), ("i", "failure")}, e
    # the lanes are the reports' workers, each under its device's process
    lanes = {(threads[(e["pid"], e["tid"])], processes[e["pid"]]) for e in events if e.get("cat") == "chunk"}
    assert lanes == {(w.name, w.device_id) for lp in rec.loops for w in lp.report.workers if w.chunks}
    assert {"hetflow", "cpu0", "gpu0"} == set(processes.values())  # (the GPU may have run no chunk)
    # every stolen chunk is an instant on the thief's lane and a flow from the victim's
    stolen = [e for e in events if e.get("cat") == "chunk" and e["args"]["stolen_from"]]
    marks = [e for e in events if e.get("cat") == "steal" and e["ph"] == "i"]
    starts = {e["id"]: e for e in events if e.get("cat") == "steal" and e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e.get("cat") == "steal" and e["ph"] == "f"}
    assert len(marks) == len(stolen) == len(starts) == len(ends) and starts.keys() == ends.keys()
    for flow, start in starts.items():
        assert threads[(start["pid"], start["tid"])] != threads[(ends[flow]["pid"], ends[flow]["tid"])]
    loops = [e for e in events if e.get("cat") == "loop"]
    assert [e["args"]["steals"] for e in loops] == [lp.report.steals for lp in rec.loops]
    assert [e["args"]["n"] for e in loops] == [N]


def test_the_timeline_title_names_the_loops_that_ran(tmp_path):
    x, y = np.arange(64, dtype=np.float64), np.ones(64)
    with hetflow.trace.record() as rec:
        hetflow.forall(64, s25_axpy, 2.0, x, y, device="cpu0")
        hetflow.forall(64, scale, 0.5, x, device="cpu0")
        hetflow.forall(64, s25_axpy, 2.0, x, y, device="cpu0")
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # the title as text, not glyph outlines
        rec.plot(tmp_path / "t.svg", title="three launches")
    svg = (tmp_path / "t.svg").read_text()
    assert "three launches" in svg and "3 loop(s): s25_axpy ×2, scale · 192 indices" in svg
