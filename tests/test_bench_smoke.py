"""Smoke test: every benchmark in bench/ runs its ``--quick`` sizes and returns 0.

Each benchmark checks its own results against its baseline or NumPy and raises when
they differ, so a passing run means every contender computed the right answer; the
timings are only printed. Benchmarks started under ``mpiexec`` are left to tests/mpi,
but for one run of bench/distributed.py that checks which rows it calls oversubscribed.
Every row with a target says whether its figure met it: checked here on figures given
to the benchmarks' code, not measured.
"""
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

from hetflow.errors import CommError

BENCH = pathlib.Path(__file__).resolve().parent.parent / "bench"
NEEDS_MPI = {"allreduce", "distributed"}


def _benchmarks():
    return sorted(p.stem for p in BENCH.glob("*.py")
                  if not p.stem.startswith("_") and p.stem not in NEEDS_MPI)


def _load(name):
    spec = importlib.util.spec_from_file_location(f"hetflow_bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", _benchmarks())
def test_quick_run_prints_json_rows(name, capsys):
    module = _load(name)
    assert module.main(["--quick", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rows"], f"bench {name} reported no rows"
    for row in out["rows"]:
        assert row["ratio"] > 0
        assert row["met"] in (True, False, None), row
        assert row["target"].endswith(": met") == (row["met"] is True), row
        assert ("MISSED" in row["target"]) == (row["met"] is False), row


def test_steal_quick_prints_table(capsys):
    assert _load("steal").main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "irregular: steal vs static" in out and "uniform: steal vs prange" in out


def test_mpiexec_is_the_one_beside_python_then_the_one_on_path(tmp_path, monkeypatch):
    common = _load("_common")
    beside, elsewhere = tmp_path / "venv" / "bin", tmp_path / "elsewhere"
    beside.mkdir(parents=True)
    elsewhere.mkdir()
    monkeypatch.setattr(common.sys, "executable", str(beside / "python"))
    monkeypatch.setenv("PATH", str(elsewhere))
    with pytest.raises(CommError, match=r"no mpiexec beside .*venv/bin/python or on PATH: install hetflow\[mpi\]"):
        common.mpiexec()
    on_path = elsewhere / "mpiexec"
    on_path.write_text("#!/bin/sh\n")
    on_path.chmod(0o755)
    assert common.mpiexec() == str(on_path)
    (beside / "mpiexec").write_text("")
    assert common.mpiexec() == str(beside / "mpiexec")


# -- targets: "met" or "MISSED" from the figure ----------------------------------------------
def test_a_clause_compares_its_figure_with_its_limit_and_says_so():
    common = _load("_common")
    assert common.clause(0.9, ">=", 0.9) == (">= 0.9x", True)
    assert common.clause(0.8999, ">=", 0.9) == (">= 0.9x", False)
    assert common.clause(1.1, ">", 1.1) == ("> 1.1x", False)
    assert common.clause(4.99e-6, "<=", 5e-6, "s", note="per call") == ("<= 5 us per call", True)
    assert common.clause(21e-6, "<=", 20e-6, "s", label="overhead") == ("overhead <= 20 us", False)
    assert common.clause(1.5, "<", 2.0, "s", label="10000 rules") == ("10000 rules < 2 s", True)
    assert common.clause(0.49, ">=", 0.5, "%", note="of bound") == (">= 50% of bound", False)
    assert common.clause(0.81, ">=", 0.8, "", label="eff") == ("eff >= 0.8", True)


def test_a_verdict_is_met_only_when_every_clause_holds():
    common = _load("_common")
    ratio, per_task = common.clause(12.0, ">=", 10), common.clause(9e-6, "<=", 8e-6, "s", note="per task")
    assert common.verdict(ratio) == {"target": ">= 10x: met", "met": True}
    assert common.verdict(ratio, per_task) == {"target": ">= 10x, <= 8 us per task: MISSED (<= 8 us per task)",
                                               "met": False}
    slow = common.clause(9.0, ">=", 10)
    assert common.verdict(slow, per_task) == {"target": ">= 10x, <= 8 us per task: MISSED", "met": False}
    assert common.verdict(ratio, info="1.20 Gcell/s") == {"target": "1.20 Gcell/s; >= 10x: met", "met": True}
    assert common.verdict(info="(BLAS)") == {"target": "(BLAS)", "met": None}


def _queue_bench_with(monkeypatch, per_task):
    """bench/queue_bench.py whose passes take the given seconds per task:
    {"chain": (hetflow, dask), "fan-out": (hetflow, dask)}."""
    queue = _load("queue_bench")
    for what, het, base in (("chain", "hetflow_chain", "dask_chain"), ("fan-out", "hetflow_fanout", "dask_fanout")):
        t_het, t_dask = per_task[what]
        monkeypatch.setattr(queue, het, lambda q, n, t=t_het: n * t)
        monkeypatch.setattr(queue, base, lambda n, t=t_dask: n * t)
    return queue


def test_queue_rows_are_marked_from_both_figures(monkeypatch, capsys):
    per_task = {"chain": (5e-6, 60e-6), "fan-out": (9e-6, 200e-6)}  # 12x and 5 us; 22x but 9 us
    queue = _queue_bench_with(monkeypatch, per_task)
    assert queue.main(["--quick", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    for row, (t_het, t_dask) in zip(rows, per_task.values()):
        assert row["ratio"] == pytest.approx(t_dask / t_het)
        assert row["met"] == (t_dask / t_het >= 10 and t_het <= 8e-6)
    assert [r["target"] for r in rows] == [">= 10x, <= 8 us per task: met",
                                           ">= 10x, <= 8 us per task: MISSED (<= 8 us per task)"]
    assert queue.main(["--quick"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[2].endswith("12.00x  >= 10x, <= 8 us per task: met")
    assert table[3].endswith("22.22x  >= 10x, <= 8 us per task: MISSED (<= 8 us per task)")


def test_allreduce_rows_are_marked_against_issue_20s_targets():
    allreduce = _load("allreduce")

    def row(collective, nbytes, speed, bound=None):
        r = {"collective": collective, "bytes": nbytes, "speed_ratio": speed}
        return r if bound is None else {**r, "bound_fraction": bound}

    small, mid, big = row("allreduce", 8, 0.91), row("allreduce", 1 << 20, 1.1), row("allreduce", 8 << 20, 1.3, 0.6)
    assert allreduce._judged(small)["target"] == ">= 0.9x: met"
    assert allreduce._judged(mid)["target"] == ">= 1.2x: MISSED"
    assert allreduce._judged(big)["target"] == ">= 1.2x, busbw >= 0.7 of the bound: MISSED (busbw >= 0.7 of the bound)"
    assert allreduce._judged(row("reduce", 8 << 20, 1.3))["target"] == ">= 1.2x: met"  # no bound for reduce
    rows = [allreduce._judged(r) for r in (small, mid, big)]
    assert allreduce._summary(rows, "allreduce", judged=True).startswith(
        "summary allreduce: median speed 1.10x (>= 0.95x: met) over 3 sizes, lowest 0.91x at 8 bytes")
    assert allreduce._summary(rows, "allreduce", judged=True).endswith("; targets met at 1 of 3 sizes")
    assert "met" not in allreduce._summary(rows, "allreduce", judged=False)


# -- bench/distributed.py: which rows are oversubscribed ---------------------------------------
def test_a_group_is_oversubscribed_when_its_ranks_threads_outnumber_a_hosts_cores():
    distributed = _load("distributed")
    four_on_two_cores = [("a", 1, 2)] * 4
    assert [distributed.oversubscribed(four_on_two_cores, k) for k in (1, 2, 4)] == [False, False, True]
    assert distributed.oversubscribed([("a", 4, 2)], 1)  # one rank with more threads than cores
    two_hosts = [("a", 2, 4), ("a", 2, 4), ("b", 2, 3), ("b", 2, 3)]
    assert [distributed.oversubscribed(two_hosts, k) for k in (2, 3, 4)] == [False, False, True]


@pytest.mark.mpi
def test_distributed_bench_calls_only_the_rows_that_share_cores_oversubscribed():
    """Two ranks that each compute with every core: together they oversubscribe the host,
    one alone does not."""
    cores = len(os.sched_getaffinity(0))
    env = dict(os.environ, HETFLOW_CPU_THREADS=str(cores),
               PYTHONPATH=str(pathlib.Path(__file__).resolve().parents[1] / "src"))
    cmd = [_load("_common").mpiexec(), "-n", "2", sys.executable, str(BENCH / "distributed.py"), "--quick", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [r for r in json.loads(proc.stdout)["rows"] if ", cpu" in r["name"]]
    assert [(r["ranks"], r["oversubscribed"]) for r in rows] == [(1, False), (2, True)] * 2
    assert [r["name"].endswith("(oversubscribed)") for r in rows] == [False, True] * 2
    strong_2 = rows[1]
    assert strong_2["met"] == (strong_2["eff_hetflow"] >= 0.8)
    assert [r["met"] for r in rows if r is not strong_2] == [None] * 3
