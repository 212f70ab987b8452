"""Smoke test: every benchmark in bench/ runs its ``--quick`` sizes and returns 0.

Each benchmark checks its own results against its baseline or NumPy and raises when
they differ, so a passing run means every contender computed the right answer; the
timings are only printed. Benchmarks started under ``mpiexec`` are left to tests/mpi.
"""
import importlib.util
import json
import pathlib

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
