"""A loop whose chunks would not fit its work-stealing deques is refused before it starts,
with the chunk size that fits; one that fits runs every index once."""
import numpy as np
import pytest

from hetflow.errors import ArgumentError, HetflowError
from hetflow.runtime import steal
from hetflow.runtime.steal import Worker, run_loop


def _counting(counts):
    def run_chunk(lo, hi):
        np.add.at(counts, np.arange(lo, hi), 1)
    return run_chunk


def test_a_tiny_chunk_over_a_huge_range_is_refused_with_the_chunk_size_that_fits():
    # Before: NumPy's MemoryError ("Unable to allocate 149. GiB ..."), or, below what
    # the host refuses at once, a swapping host while the chunks were laid out.
    with pytest.raises(ArgumentError) as info:
        run_loop(10**10, [Worker("core0", "cpu", lambda lo, hi: None, 1, "cpu0")])
    assert str(info.value) == (
        "a loop of 10000000000 indices: worker 'core0' would start with 10000000000 chunks of chunk_size=1 "
        "(its 10000000000 indices), but each of the loop's deques holds at most 16777216: give it a "
        "chunk_size of at least 597")


def test_a_steal_threshold_beyond_any_deque_is_refused():
    with pytest.raises(ArgumentError) as info:
        run_loop(10, [Worker(f"core{k}", "cpu", lambda lo, hi: None, 1, "cpu0") for k in range(2)],
                 steal_threshold=10**12)
    assert str(info.value) == ("steal_threshold=1000000000000 leaves no room in the loop's deques "
                               "(8388608 chunks each at most): give one below 8388605")


@pytest.mark.parametrize("schedule", ["steal", "static"])
def test_the_most_chunks_that_fit_run_every_index_once_and_one_more_is_refused(monkeypatch, schedule):
    monkeypatch.setattr(steal, "MAX_CHUNKS", 2 * 40)      # 40 entries per deque, 3 of them spare
    n = 2 * 37
    counts = np.zeros(n, dtype=np.int64)
    workers = [Worker(f"core{k}", "cpu", _counting(counts), 1, "cpu0") for k in range(2)]
    report = run_loop(n, workers, schedule=schedule)
    np.testing.assert_array_equal(counts, np.ones(n, dtype=np.int64))
    assert sum(w.indices for w in report.workers) == n
    with pytest.raises(ArgumentError, match=r"worker 'core0' would start with 38 chunks of chunk_size=1 "
                                            r"\(its 38 indices\), but each of the loop's "
                                            r"deques holds at most 40: give it a chunk_size of at least 2$"):
        run_loop(n + 2, workers, schedule=schedule)
    counts = np.zeros(n + 2, dtype=np.int64)
    workers = [Worker(f"core{k}", "cpu", _counting(counts), 2, "cpu0") for k in range(2)]
    run_loop(n + 2, workers, schedule=schedule)                # the chunk size the message gave
    np.testing.assert_array_equal(counts, np.ones(n + 2, dtype=np.int64))


def test_a_full_deque_is_reported_as_hetflows_bug_not_a_failed_event():
    loop = steal._Loop(4, [Worker("core0", "cpu", lambda lo, hi: None, 1, "cpu0")], "steal",
                       np.ones(1), "recover", False, 0)
    with pytest.raises(HetflowError) as info:
        loop._push_back(0, [(0, 1)] * (loop.deques.capacity + 1))
    assert type(info.value) is HetflowError
    assert str(info.value) == ("worker 'core0': its deque of 7 chunks is full, which the capacity set for "
                               "the loop rules out: a bug in hetflow's work stealing (please report it)")
