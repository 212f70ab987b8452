"""A failure on one rank raises the failing rank's hetflow class on every rank; misuse
by some ranks only (other values, shapes or dtypes for asarray, an array whose checks
fail on one rank, collectives called in other orders) fails every rank alike, promptly.

Runs over several ranks go through tests/mpi/s26_remote.py and tests/mpi/s26_sweep.py
under mpiexec, checked against NumPy.
"""
import pickle

import pytest
from test_distributed import run_script

from hetflow.cluster.control import remote_error
from hetflow.errors import CommError, CommTimeoutError, KernelRaisedError, RemoteError, ShapeError


@pytest.mark.parametrize("kind,cls", [("ShapeError", ShapeError), ("KernelRaisedError", KernelRaisedError),
                                      ("CommTimeoutError", CommTimeoutError)])
def test_another_ranks_hetflow_error_keeps_its_class(kind, cls):
    err = remote_error(2, kind, "what went wrong")
    assert isinstance(err, cls) and isinstance(err, RemoteError), type(err).__mro__
    assert str(err) == f"rank 2 raised {kind}: what went wrong"
    again = pickle.loads(pickle.dumps(err))  # its class is made at run time: pickled as hetflow's
    assert type(again) is cls and str(again) == str(err)


@pytest.mark.parametrize("kind", ["ValueError", "CommError", "RemoteError", "NoSuchError"])
def test_another_class_is_a_plain_remote_error_naming_it(kind):
    err = remote_error(1, kind, "odd")
    assert type(err) is RemoteError and isinstance(err, CommError)
    assert str(err) == f"rank 1 raised {kind}: odd"


@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["program", "shape", "foreign"])
@pytest.mark.parametrize("ranks", [2, 3])
def test_one_ranks_failure_raises_its_class_on_every_rank(mode, ranks):
    output = run_script(ranks, "s26_remote.py", mode, timeout=60)
    for rank in range(ranks):
        assert f"rank {rank}: {mode} ok" in output, output


@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["arrays", "world", "order"])
def test_misuse_on_some_ranks_fails_every_rank_naming_it(mode):
    output = run_script(3, "s26_sweep.py", mode, timeout=60)
    for rank in range(3):
        assert f"rank {rank}: {mode} ok" in output, output
