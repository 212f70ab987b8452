"""The central interpreter re-cuts on an imbalance it has seen twice, or on news.

Timing noise passes the threshold in one report now and then; a re-cut on it moves rows
for nothing. Oracle: the sizes apportion() gives for the reported speeds, computed here
from the reports, and the count of versions the interpreter made.
"""
import sys
from pathlib import Path

import pytest

from hetflow.cluster import central, darray

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import heat_distributed as heat  # noqa: E402

ROWS = 64


def interpreter(capacities):
    program, _, _ = heat.setup(ROWS)
    c = central.CentralInterpreter(program.nodes, len(capacities), ROWS, 1)
    c.capacities([{"capacity": k} for k in capacities])
    c.adjust()
    return c


def reported(c, rates, available=None):
    """Report ``rates`` (rows each rank ran per second) and adjust."""
    available = available or [1.0] * len(rates)
    c.report([{"rows": r, "seconds": 1.0, "available": a} for r, a in zip(rates, available)])
    return c.adjust()


def sizes(c):
    return c.description()["sizes"]


def test_equal_ranks_ignore_one_noisy_report_and_follow_two():
    c = interpreter([4, 4])
    assert sizes(c) == (32, 32)
    assert reported(c, [100, 60]).number == 1  # 25% imbalance once: the first cut stays
    assert not c.monitor["ranks.confirmed"]
    assert reported(c, [100, 100]).number == 1  # balanced: the count starts again
    assert reported(c, [100, 60]).number == 1
    version = reported(c, [100, 60])  # twice in a row under one cut: re-cut by speed
    assert version.number == 2 and "rebalance-ranks" in version.reason
    assert sizes(c) == darray.apportion(ROWS, [100, 60], 1) == (40, 24)
    # after the re-cut, one report past the threshold is again not enough
    assert reported(c, [60, 100]).number == 2


def test_the_first_rates_replace_a_guess_of_unequal_capacities_at_once():
    c = interpreter([16, 132])  # a rank of 16 cores, a rank with a GPU of 132 multiprocessors
    assert sizes(c) == darray.apportion(ROWS, [16, 132], 1) == (7, 57)
    version = reported(c, [1000, 1000])  # measured: both ranks run as many rows a second
    assert version.number == 2 and "rebalance-ranks" in version.reason
    assert sizes(c) == (32, 32)


@pytest.mark.parametrize("first", [True, False])
def test_a_changed_available_share_rebalances_at_once(first):
    c = interpreter([4, 4])
    if not first:
        assert reported(c, [100, 100]).number == 1
    version = reported(c, [100, 100], available=[1.0, 0.25])  # another process took rank 1's devices
    assert version.number == 2 and sizes(c) == darray.apportion(ROWS, [100, 25], 1)
