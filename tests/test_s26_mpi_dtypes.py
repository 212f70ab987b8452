"""Structured dtypes of one size but other fields are different dtypes across ranks
(cluster.asarray, cluster.zeros), and asarray from a root keeps x's fields.

The run over two ranks goes through tests/mpi/s26_dtypes.py under mpiexec, checked
against NumPy.
"""
import pytest
from test_distributed import run_script


@pytest.mark.mpi
def test_fields_that_differ_between_ranks_fail_every_rank_naming_the_dtypes():
    output = run_script(2, "s26_dtypes.py", "fields", timeout=60)
    for rank in range(2):
        assert f"rank {rank}: fields ok" in output, output
