"""Collectives, the cluster layer and the demo misused under mpiexec, as a user would.

Scripts in tests/mpi/sweep_*.py run under mpiexec (marked ``mpi``); the demo's and the
example's refusals are read from the launcher's output. Each run ends long before the
comm timeout it is given, which the code before these fixes waited out (or printed its
error once per rank).
"""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from launcher import mpiexec as _mpiexec

import hetflow
from hetflow import collectives
from hetflow.errors import ArgumentError

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "mpi"


def _run(*words, ranks=None, env=None, cwd=None, timeout=60):
    """``mpiexec -n RANKS`` WORDS (WORDS already an MPMD line when RANKS is None), with this
    checkout's hetflow and a comm timeout of 20 s; (exit status, stdout, stderr)."""
    environment = dict(os.environ, HETFLOW_COMM_TIMEOUT="20", **(env or {}))
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(Path(hetflow.__file__).resolve().parents[1])]
        + [p for p in [environment.get("PYTHONPATH")] if p])
    launch = _mpiexec() + (["-n", str(ranks)] if ranks else [])
    try:
        proc = subprocess.run(launch + list(words), capture_output=True, text=True, timeout=timeout,
                              env=environment, cwd=cwd)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(launch + list(words))} still running after {timeout} s:\n"
                    f"{exc.stdout}{exc.stderr}")
    return proc.returncode, proc.stdout, proc.stderr


def _demo(*options):
    return [sys.executable, "-m", "hetflow", "demo", "--iterations", "2", *options]


def _errors(err):
    """The error lines the user saw, MPICH's own notes left out."""
    return [line for line in err.splitlines() if line and not line.startswith("MPICH: ")]


# -- collectives ------------------------------------------------------------------------------
@pytest.mark.mpi
def test_arrays_of_one_length_but_other_shapes_fail_on_every_rank_naming_the_shapes():
    """Before, a (2, 3) array on one rank and (3, 2) on another were reduced element by
    element in memory order, pairing elements of different indices, without a word."""
    code, out, err = _run(sys.executable, str(SCRIPTS / "sweep_collectives.py"), "shapes", ranks=3)
    assert code == 0, out + err
    assert all(f"rank {r}: shapes ok" in out for r in range(3)), out + err


@pytest.mark.mpi
def test_a_rank_that_never_calls_world_fails_the_first_call_within_its_timeout():
    """Before, world(timeout=2) waited in MPI_Comm_dup for ever."""
    code, out, err = _run(sys.executable, str(SCRIPTS / "sweep_collectives.py"), "first-call", ranks=3,
                          timeout=30)
    assert code == 0, out + err
    assert all(f"rank {r}: first-call ok" in out for r in range(3)), out + err


def test_a_bool_is_not_a_timeout():
    """Before, timeout=True was one second."""
    for call in (lambda: hetflow.world(timeout=True), lambda: collectives.world(timeout=False)):
        with pytest.raises(ArgumentError, match="timeout must be a positive number of seconds, not (True|False)"):
            call()
    assert hetflow.world(timeout=1.5).timeout == 1.5
    np.testing.assert_array_equal(hetflow.world(timeout=1).allreduce(np.arange(3)), np.arange(3))


# -- the demo under mpiexec: a refusal said once ------------------------------------------------
DEVICES_NOPE = "hetflow: error: DeviceError: --devices nope: no device with id 'nope'; devices are: cpu0"


def _said(lines, expected):
    """``lines`` are ``expected``, each as it is or, for the device lists, extended (the
    simulator adds its GPU)."""
    return len(lines) == len(expected) and all(a == b or (b.endswith("cpu0") and a.startswith(b + ", "))
                                               for a, b in zip(lines, expected))
SIZE_2 = "--size must be at least 3 (a grid with an interior point); got 2"


@pytest.mark.mpi
def test_a_bad_demo_option_every_rank_meets_is_said_once(tmp_path):
    """Before, every rank printed it."""
    code, out, err = _run(*_demo("--size", "16", "--devices", "nope"), ranks=3, cwd=tmp_path)
    assert code == 1 and out == "", out + err
    assert _said(_errors(err), [DEVICES_NOPE]), err


@pytest.mark.mpi
def test_a_command_line_argparse_refuses_is_said_once(tmp_path):
    """Before, every rank printed the usage and the error."""
    code, out, err = _run(*_demo("--size", "abc"), ranks=3, cwd=tmp_path)
    assert code == 2 and out == "", out + err
    lines = _errors(err)
    assert lines[-1] == "hetflow demo: error: argument --size: invalid int value: 'abc'", err
    assert sum(line.startswith("usage: hetflow demo") for line in lines) == 1, err


@pytest.mark.mpi
def test_demo_problems_that_differ_by_rank_are_said_once_each_naming_the_rank(tmp_path):
    code, out, err = _run(*_demo("--size", "16", "--devices", "nope"), ":", "-n", "2",
                          *_demo("--size", "2"), cwd=tmp_path)
    assert code == 1 and out == "", out + err
    assert _said(_errors(err), [DEVICES_NOPE.replace("error: ", "error: rank 0: ", 1),
                                f"hetflow: error: rank 1: {SIZE_2}", f"hetflow: error: rank 2: {SIZE_2}"]), err


@pytest.mark.mpi
def test_ranks_given_another_grid_or_step_count_are_refused_before_the_run(tmp_path):
    """Before, a --size that differed was one error per rank, and an --iterations that
    differed waited for the comm timeout."""
    code, out, err = _run(*_demo("--size", "16", "--devices", "cpu0"), ":", "-n", "1",
                          sys.executable, "-m", "hetflow", "demo", "--size", "20", "--iterations", "4",
                          "--devices", "cpu0", cwd=tmp_path)
    assert code == 2 and out == "", out + err
    assert _errors(err) == ["hetflow: error: the ranks were given different --size (rank 0: 16, rank 1: 20); "
                            "--iterations (rank 0: 2, rank 1: 4): they run one grid together"], err


@pytest.mark.mpi
def test_a_demo_grid_with_fewer_rows_than_ranks_is_refused_once(tmp_path):
    code, out, err = _run(*_demo("--size", "3"), ranks=4, cwd=tmp_path)
    assert code == 2 and out == "", out + err
    assert _errors(err) == ["hetflow: error: --size 3 gives 4 ranks 3 rows: every rank needs at least one "
                            "(run at most 3 ranks, or a larger --size)"], err


@pytest.mark.mpi
def test_a_setting_one_rank_refuses_stops_every_rank_at_once(tmp_path):
    """Before, the refusing rank left alone and the others waited for it until the comm
    timeout (the test's 20 s)."""
    code, out, err = _run(*_demo("--size", "16"), ":", "-n", "1", "-env", "HETFLOW_CPU_THREADS", "many",
                          *_demo("--size", "16"), cwd=tmp_path, timeout=18)
    assert code == 1 and out == "", out + err
    assert _errors(err) == ["hetflow: error: ArgumentError: rank 1: HETFLOW_CPU_THREADS must be a whole "
                            "number >= 1, not 'many'"], err


@pytest.mark.mpi
def test_a_rank_failing_mid_run_is_the_one_that_says_so(tmp_path):
    """Before, the failing rank printed its error without its rank, and every other rank
    printed the RemoteError it stopped with."""
    code, out, err = _run(sys.executable, str(SCRIPTS / "sweep_demo.py"), "2", "demo", "--size", "16",
                          "--iterations", "2", "--devices", "cpu0", ranks=3, cwd=tmp_path)
    assert code == 1, out + err
    assert _errors(err) == ["hetflow: error: ArgumentError: rank 2: injected failure"], err


# -- the distributed heat example -----------------------------------------------------------------
@pytest.mark.mpi
def test_heat_example_with_fewer_rows_than_ranks_says_so_once():
    """Before, every rank printed a ShapeError traceback and the run was aborted."""
    code, out, err = _run(sys.executable, str(ROOT / "examples" / "heat_distributed.py"), "--size", "3",
                          ranks=4)
    assert code == 2, out + err
    assert [line for line in _errors(err) if "error" in line] == [
        "heat_distributed.py: error: --size 3 gives 4 ranks 3 rows: every rank needs at least one "
        "(run at most 3 ranks, or a larger --size)"], err
    assert "Traceback" not in err


@pytest.mark.mpi
def test_heat_example_with_a_row_count_the_ranks_do_not_divide_matches_numpy():
    """Odd grids and step counts, rows not divisible by the ranks: rank 0's max error
    against NumPy's steps is 0, and one step alone prints no empty partition list."""
    for ranks, size, steps in ((3, 11, 3), (2, 3, 1)):
        code, out, err = _run(sys.executable, str(ROOT / "examples" / "heat_distributed.py"), "--size",
                              str(size), "--iterations", str(steps), ranks=ranks)
        assert code == 0, out + err
        assert "max |error| vs NumPy: 0.000e+00" in out, out
        assert ("partitions" in out) == (steps > 1), out
