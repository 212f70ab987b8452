"""Repeated collectives: the argument check once per signature, prepared native calls.

The scripts run under mpiexec (tests/mpi/repeat_check.py, marked ``mpi``); the
counts they print are of calls made, argument checks run and calls served by the
prepared native path, so a path that is never taken fails here.
"""
import numpy as np
import pytest
from test_collectives import LAUNCHER_VARIABLES, run_mpi

from hetflow import collectives
from hetflow.errors import CommArgumentError

# calls, argument checks, prepared native calls, by rank count
COUNTS = {1: (432, 0, 0), 2: (648, 315, 372), 3: (864, 417, 496), 4: (1080, 519, 620),
          5: (1296, 621, 744)}


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 5])
def test_repetitions_are_checked_once_and_match_numpy(ranks):
    output = run_mpi(ranks, "repeat_check.py")
    calls, checks, prepared = COUNTS[ranks]
    assert (f"repeat ok: {calls} calls, {checks} checks, {prepared} prepared on {ranks} "
            "ranks") in output, output


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_an_absent_peer_of_a_prepared_call_times_out(ranks):
    output = run_mpi(ranks, "repeat_check.py", "absent")
    for rank in range(ranks):
        assert f"rank {rank}: absent ok" in output, output


@pytest.mark.parametrize("check", [None, "yes", 2])
def test_check_takes_true_false_or_always(monkeypatch, check):
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    comm = collectives.world()
    for mode in (True, False, "always"):
        assert comm.allreduce(np.arange(3.0), check=mode).tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(CommArgumentError, match="check must be True, False or 'always'"):
        comm.allreduce(np.arange(3.0), check=check)
