"""Run under mpiexec by tests/test_mpi_sweep.py: ``hetflow demo`` with one rank failing
mid-run. ``python sweep_demo.py R DEMO-ARGS...``: rank R raises ArgumentError where each
rank sums up its devices' work (after the steps); every other rank then stops with
RemoteError, which the demo leaves to rank R to report.
"""
import sys

from hetflow import collectives
from hetflow.cli import demo, main
from hetflow.errors import ArgumentError

failing = int(sys.argv[1])
summary_rows = demo.summary_rows


def failing_summary(recorder):
    if collectives.world().rank == failing:
        raise ArgumentError("injected failure")
    return summary_rows(recorder)


demo.summary_rows = failing_summary
sys.exit(main.main(sys.argv[2:]))
