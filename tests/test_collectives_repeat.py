"""Repeated collectives: the argument check once per signature, prepared native calls.

The scripts run under mpiexec (tests/mpi/repeat_check.py, marked ``mpi``); the
counts they print are of calls made, argument checks run and calls served by the
prepared native path, so a path that is never taken fails here.
"""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from launcher import mpiexec
from test_collectives import LAUNCHER_VARIABLES, run_mpi

from hetflow import collectives
from hetflow.collectives import host
from hetflow.errors import ArgumentError

# calls, argument checks, repetitions served by NativeCall and by TreeReduce, by ranks
COUNTS = {1: (432, 0, 0, 0), 2: (648, 319, 124, 248), 3: (864, 421, 244, 252),
          4: (1080, 523, 284, 336), 5: (1296, 625, 324, 420)}
# of the native repetitions, the allreduces run as persistent collectives
PERSISTENT = {1: 0, 2: 72, 3: 72, 4: 72, 5: 72}  # float min/max: NanNativeCall, not persistent


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 5])
def test_repetitions_are_checked_once_and_match_numpy(ranks):
    output = run_mpi(ranks, "repeat_check.py")
    calls, checks, natives, trees = COUNTS[ranks]
    assert (f"repeat ok: {calls} calls, {checks} checks, {natives} native and {trees} tree "
            f"repetitions on {ranks} ranks") in output, output
    # Small allreduces repeat as persistent collectives, freed before MPI finalizes.
    assert f"persistent repetitions: {PERSISTENT[ranks]}" in output, output
    assert "freeing inactive persistent request" not in output, output


@pytest.mark.mpi
@pytest.mark.parametrize("name", ["allreduce", "reduce"])
@pytest.mark.parametrize("ranks", [2, 3])
def test_an_absent_peer_of_a_prepared_call_times_out(name, ranks):
    output = run_mpi(ranks, "repeat_check.py", "absent", name)
    for rank in range(ranks):
        assert f"rank {rank}: absent {name} ok" in output, output


@pytest.mark.parametrize("check", [None, "yes", 2])
def test_check_takes_true_false_or_always(monkeypatch, check):
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    comm = collectives.world()
    for mode in (True, False, "always"):
        assert comm.allreduce(np.arange(3.0), check=mode).tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(ArgumentError, match="check must be True, False or 'always'"):
        comm.allreduce(np.arange(3.0), check=check)


@pytest.fixture
def fresh_crossovers():
    host.native_crossover.cache_clear()
    yield
    host.native_crossover.cache_clear()


def test_native_crossover_from_the_environment(monkeypatch, fresh_crossovers):
    monkeypatch.setenv("HETFLOW_COMM_NATIVE_BYTES", "12345")
    assert host.native_crossover("allreduce", 4) == host.native_crossover("reduce", 2) == 12345
    host.native_crossover.cache_clear()
    monkeypatch.setenv("HETFLOW_COMM_NATIVE_BYTES", "1 MiB")
    with pytest.raises(ArgumentError, match="HETFLOW_COMM_NATIVE_BYTES"):
        host.native_crossover("allreduce", 2)
    host.native_crossover.cache_clear()
    monkeypatch.delenv("HETFLOW_COMM_NATIVE_BYTES")
    assert host.native_crossover("allreduce", 2) == host.NATIVE_BYTES["allreduce"][2]
    assert host.native_crossover("reduce", 5) == host.NATIVE_BYTES["reduce"][3]


@pytest.mark.mpi
def test_bench_prints_paths_and_the_summary():
    bench = Path(__file__).resolve().parent.parent / "bench" / "allreduce.py"
    env = dict(os.environ, PYTHONPATH=str(Path(host.__file__).resolve().parents[2]))
    cmd = mpiexec() + ["-n", "2", sys.executable, str(bench), "--quick", "--max-bytes",
                       "4096"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " native " in proc.stdout, proc.stdout
    for what in ("allreduce", "reduce"):
        assert f"summary {what}: median speed" in proc.stdout, proc.stdout


@pytest.mark.mpi
def test_bench_times_object_collectives_beside_mpi4pys():
    bench = Path(__file__).resolve().parent.parent / "bench" / "allreduce.py"
    env = dict(os.environ, PYTHONPATH=str(Path(host.__file__).resolve().parents[2]))
    cmd = mpiexec() + ["-n", "2", sys.executable, str(bench), "--objects", "--quick"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()[2:]]
    assert [r[0] for r in rows] == ["barrier", "bcast", "allgather"], proc.stdout
    assert all(float(r[1]) > 0 and float(r[2]) > 0 and r[3].endswith("x") for r in rows), proc.stdout
