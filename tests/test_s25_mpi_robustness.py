"""Distributed programs that fail on some ranks only, differ between ranks, or lose a
rank that ended early: every rank raises the same error, promptly.

The ranks' checks (hetflow.cluster.control.settle) are checked here in-process against a
channel that answers as the other ranks would; runs over several ranks go through
tests/mpi/s25_misuse.py and tests/mpi/s25_ended.py under mpiexec, checked against NumPy.
"""
import subprocess
import sys

import numpy as np
import pytest
from launcher import mpiexec
from test_distributed import SCRIPTS, _environment, run_script

from hetflow import cluster
from hetflow.cluster import control
from hetflow.errors import ArgumentTypeError, CommError, KernelRaisedError, ShapeError


class Answering:
    """A channel of ``len(everyone)`` ranks whose agreement finds ``everyone``'s facts."""

    def __init__(self, everyone):
        self.everyone, self.size = everyone, len(everyone)

    def agreed(self, facts):
        assert facts in self.everyone
        return None if all(f == self.everyone[0] for f in self.everyone) else self.everyone


def test_a_rank_that_got_through_raises_the_failing_ranks_error():
    failed = (None, ("ArgumentTypeError", "kernel 'copy' argument 'out': element type float16"))
    channel = Answering([failed, failed, (("copy", (3,)), None)])
    with pytest.raises(ArgumentTypeError) as caught:
        control.settle(channel, ("copy", (3,)), None, "distributed forall of 'copy'")
    assert str(caught.value) == ("distributed forall of 'copy' failed on ranks 0, 1 (of 3): kernel 'copy' "
                                 "argument 'out': element type float16")


def test_a_failing_rank_raises_the_same_error_from_its_own():
    own = KernelRaisedError("kernel 'k' raised ValueError in rows [0, 2): negative")
    channel = Answering([(None, ("KernelRaisedError", str(own))), (None, ("ValueError", "odd")), (("k",), None)])
    with pytest.raises(KernelRaisedError) as caught:
        control.settle(channel, ("k",), own, "distributed forall of 'k'")
    assert str(caught.value) == ("distributed forall of 'k' failed on ranks 0, 1 (of 3): rank 0: KernelRaisedError: "
                                 "kernel 'k' raised ValueError in rows [0, 2): negative; rank 1: ValueError: odd")
    assert caught.value.__cause__ is own


def test_a_foreign_error_is_a_comm_error_elsewhere_and_calls_that_differ_name_each_rank():
    channel = Answering([(("a",), None), (None, ("ZeroDivisionError", "division by zero"))])
    with pytest.raises(CommError, match=r"^f failed on rank 1 \(of 2\): ZeroDivisionError: division by zero$"):
        control.settle(channel, ("a",), None, "f")
    channel = Answering([(("a", 4), None), (("a", 5), None)])
    with pytest.raises(CommError, match=r"^f: the ranks made different calls \(rank 0: \('a', 4\); "
                                        r"rank 1: \('a', 5\)\)$"):
        control.settle(channel, ("a", 4), None, "f")


def test_ranks_that_agree_go_on_or_raise_their_own_error():
    channel = Answering([(("a",), None)] * 3)
    assert control.settle(channel, ("a",), None, "f") is None
    own = ShapeError("the same on every rank")
    channel = Answering([(None, ("ShapeError", str(own)))] * 3)
    with pytest.raises(ShapeError) as caught:
        control.settle(channel, None, own, "f")
    assert caught.value is own


@pytest.mark.parametrize("dtype,op,ufunc", [
    (np.float64, "sum", np.add), (np.float32, "prod", np.multiply), (np.int8, "sum", np.add),
    (np.uint16, "prod", np.multiply), (np.int32, "band", np.bitwise_and), (np.int32, "bor", np.bitwise_or),
    (np.bool_, "land", np.logical_and), (np.bool_, "lor", np.logical_or), (np.complex128, "sum", np.add)])
def test_an_array_with_no_elements_reduces_to_numpys_identity(dtype, op, ufunc):
    x = np.zeros((5, 0), dtype)
    got, want = cluster.asarray(x).reduce(op), ufunc.reduce(x, axis=None)
    assert got == want and got.dtype == want.dtype, (got, want)


@pytest.mark.parametrize("op", ["min", "max", lambda a, b, out: np.add(a, b, out=out)])
def test_an_array_with_no_elements_and_an_op_without_identity_is_refused(op):
    a = cluster.zeros((3, 0), dtype=np.int16)
    with pytest.raises(ValueError):  # NumPy refuses too
        np.minimum.reduce(np.zeros((3, 0)), axis=None)
    with pytest.raises(ShapeError, match=rf"^{a.name}\.reduce: {a.name} \(3, 0\) has no elements, and op '.*' has "
                                         r"no identity on int16 to give"):
        a.reduce(op)


@pytest.mark.parametrize("flag", [True, False, np.True_])
def test_a_bool_is_no_axis_to_distribute_along(flag):
    with pytest.raises(ArgumentTypeError, match=rf"distributed array: dim must be an integer, got {flag!r}"):
        cluster.zeros((4, 3), dim=flag)
    assert cluster.zeros((4, 3), dim=np.int64(1)).dim == 1


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 4])
def test_misuse_on_some_ranks_fails_every_rank_alike(ranks):
    output = run_script(ranks, "s25_misuse.py", timeout=240)
    for rank in range(ranks):
        assert f"rank {rank}: misuse ok" in output, output


@pytest.mark.mpi
def test_a_program_whose_part_fails_where_it_has_rows_stops_the_rank_without_rows():
    output = run_script(3, "s25_misuse.py", "program", timeout=120)
    for rank in range(3):
        assert f"rank {rank}: program ok" in output, output


def _ended(mode, ranks=3, timeout=60):
    """tests/mpi/s25_ended.py MODE under mpiexec with the default comm timeout (300 s):
    (exit status, output)."""
    env = _environment()
    env.pop("HETFLOW_COMM_TIMEOUT", None)
    cmd = mpiexec() + ["-n", str(ranks), sys.executable, str(SCRIPTS / "s25_ended.py"), mode]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=SCRIPTS)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(cmd)} still running after {timeout} s:\n{exc.stdout}{exc.stderr}")
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["exit1", "exit0", "halo"])
def test_a_rank_that_ends_early_fails_the_others_naming_it(mode):
    code, output = _ended(mode)
    for rank in (0, 2):
        assert f"rank {rank}: {mode} ok" in output, output
    assert (code != 0) == (mode == "exit1"), (code, output)  # the job's status is rank 1's


@pytest.mark.mpi
def test_ranks_that_end_after_their_last_call_fail_nobody():
    code, output = _ended("late")
    assert code == 0, output
    for rank in range(3):
        assert f"rank {rank}: late ok" in output, output
