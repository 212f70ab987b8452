"""A wait on a peer that never answers sleeps with backoff instead of spinning a core
until its deadline (issue 23 item 7); oracle: the process's CPU time against wall time."""
import time

import pytest

from hetflow.collectives import transport
from hetflow.collectives.transport import Link, Transport
from hetflow.errors import CommTimeoutError


class _Never:
    """An MPI stand-in whose requests never complete (a dead peer)."""

    class Request:
        @staticmethod
        def Testall(requests):
            return False


class _Comm:
    def Get_rank(self):
        return 0

    def Get_size(self):
        return 2


def test_waiting_on_a_dead_peer_mostly_sleeps():
    link = Link(_Never, _Comm())
    wait = Transport(link, 1.0, "allreduce")
    wall, cpu = time.monotonic(), time.process_time()
    with pytest.raises(CommTimeoutError, match="no answer within 1 s"):
        wait.wait([object()], "waiting for rank 1")
    wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    assert wall >= 1.0
    # a spinning wait uses about one core for the whole second; this one spins for
    # _SPIN_S and then sleeps between polls
    assert cpu < 0.5 * wall, (cpu, wall)
    assert link.broken  # a timed-out link stays unusable


def test_a_late_answer_is_still_seen():
    answered_at = time.monotonic() + 3 * transport._SPIN_S  # past the spin: while backing off

    class Late(_Never):
        class Request:
            @staticmethod
            def Testall(requests):
                return time.monotonic() >= answered_at

    link = Link(Late, _Comm())
    Transport(link, 5.0, "bcast").wait([object()], "bcast")  # returns: no CommTimeoutError
    assert time.monotonic() >= answered_at and not link.broken
