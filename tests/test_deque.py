"""Chase–Lev deques and the atomic intrinsics under them (SPEC §3.4).

Oracles: ``collections.deque`` for the sequential semantics; for the concurrent ones,
the set of chunks pushed (each must come out exactly once) and plain arithmetic.
"""
import collections
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit
from numba.core.errors import TypingError

from hetflow.errors import ArgumentError
from hetflow.runtime import deque as dq
from hetflow.runtime.deque import ABORT, EMPTY, OK, DequeSet

# -- atomics ---------------------------------------------------------------------------


@njit(nogil=True)
def _add_many(arr, times):
    for k in range(times):
        dq.fetch_add(arr, k % arr.size, 1)


@njit(nogil=True)
def _cas_increment_many(arr, times):
    """Increment arr[0] ``times`` times with a CAS retry loop; return the failed CASes."""
    failures = 0
    for _ in range(times):
        while True:
            old = dq.atomic_load(arr, 0)
            if dq.cas(arr, 0, old, old + 1):
                break
            failures += 1
    return failures


@njit
def _cas_once(arr, i, expected, new):
    return dq.cas(arr, i, expected, new)


@njit
def _add_float(arr):
    return dq.fetch_add(arr, 0, 1)


def _run_threads(target, args_list):
    threads = [threading.Thread(target=target, args=args) for args in args_list]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_cas_swaps_only_on_expected_value():
    arr = np.array([5, 7], dtype=np.int64)
    assert _cas_once(arr, 1, 7, 9)
    assert arr.tolist() == [5, 9]
    assert not _cas_once(arr, 1, 7, 11)
    assert arr.tolist() == [5, 9]


def test_fetch_add_from_threads_loses_no_update():
    arr = np.zeros(3, dtype=np.int64)
    _run_threads(_add_many, [(arr, 30_000)] * 4)
    assert arr.tolist() == [40_000, 40_000, 40_000]


def test_cas_loop_from_threads_counts_exactly():
    arr = np.zeros(1, dtype=np.int64)
    _run_threads(_cas_increment_many, [(arr, 50_000)] * 4)
    assert arr[0] == 200_000


def test_atomics_reject_non_int64_arrays():
    with pytest.raises(TypingError):
        _add_float(np.zeros(2))


# -- sequential semantics ----------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.sampled_from(["push", "pop", "steal"]), max_size=60),
       capacity=st.integers(1, 6))
def test_single_thread_matches_a_double_ended_queue(ops, capacity):
    d = DequeSet(2, capacity)           # deque 1 must stay untouched by deque 0's traffic
    d.push(1, -5, -4)
    oracle = collections.deque()
    for k, op in enumerate(ops):
        if op == "push":
            pushed = d.push(0, 2 * k, 2 * k + 1)
            assert pushed == (len(oracle) < capacity)
            if pushed:
                oracle.append((2 * k, 2 * k + 1))
        else:
            status, lo, hi = d.pop(0) if op == "pop" else d.steal(0)
            if not oracle:
                assert status == EMPTY
            else:
                assert status == OK
                assert (lo, hi) == (oracle.pop() if op == "pop" else oracle.popleft())
        assert d.size(0) == len(oracle)
    assert d.size(1) == 1 and d.steal(1) == (OK, -5, -4)


def test_steal_top_adjacent_takes_only_touching_chunks():
    d = DequeSet(1, 8)
    for lo in (40, 30, 20):             # top is [40, 50)
        d.push(0, lo, lo + 10)
    args = (d.state, d.buf, d.capacity, 0)
    assert dq.steal_top_adjacent(*args, 60, 70) == (EMPTY, 60, 70)
    assert d.size(0) == 3
    assert dq.steal_top_adjacent(*args, 50, 60) == (OK, 40, 60)
    assert dq.steal_top_adjacent(*args, 40, 60) == (OK, 30, 60)
    assert dq.steal_top_adjacent(*args, 10, 20) == (OK, 10, 30)   # touching on the left
    assert dq.steal_top_adjacent(*args, 10, 30) == (EMPTY, 10, 30)


def test_empty_token_is_written_into_every_deque():
    d = DequeSet(3, 2)
    assert not any(d.has_empty_token(q) for q in range(3))
    d.write_empty_token()
    assert all(d.has_empty_token(q) for q in range(3))


def test_deque_set_rejects_bad_sizes():
    with pytest.raises(ArgumentError, match="at least one deque of capacity >= 1"):
        DequeSet(0, 4)
    with pytest.raises(ArgumentError, match="capacity=0"):
        DequeSet(2, 0)


# -- concurrency: one owner, several thieves --------------------------------------------


@njit(nogil=True)
def _owner(state, buf, capacity, total, pop_every, taken, taken_by_owner):
    """Push chunks [k, k + 1) for k < total, popping one every ``pop_every`` pushes (so the
    deque stays short and the last-element race with thieves is frequent); then drain."""
    k = 0
    while k < total:
        if dq.push_bottom(state, buf, capacity, 0, k, k + 1):
            k += 1
        if k % pop_every == 0 or k == total:
            status, lo, hi = dq.pop_bottom(state, buf, capacity, 0)
            if status == OK:
                dq.fetch_add(taken, lo, 1)
                taken_by_owner[0] += 1
    while True:
        status, lo, hi = dq.pop_bottom(state, buf, capacity, 0)
        if status != OK:
            break
        dq.fetch_add(taken, lo, 1)
        taken_by_owner[0] += 1
    dq.write_empty_token(state, 1)


@njit(nogil=True)
def _thief(state, buf, capacity, taken, counters):
    """Steal until the owner has written the EMPTY token; counters = [stolen, aborts]."""
    while not dq.has_empty_token(state, 0):
        status, lo, hi = dq.steal_top(state, buf, capacity, 0)
        if status == OK:
            dq.fetch_add(taken, lo, 1)
            counters[0] += 1
        elif status == ABORT:
            counters[1] += 1


@pytest.mark.parametrize("capacity,pop_every", [(4, 2), (64, 3), (1, 1)])
def test_owner_and_thieves_take_every_chunk_exactly_once(capacity, pop_every):
    total, thieves = 60_000, 3
    d = DequeSet(1, capacity)
    taken = np.zeros(total, dtype=np.int64)
    by_owner = np.zeros(1, dtype=np.int64)
    counters = [np.zeros(2, dtype=np.int64) for _ in range(thieves)]
    threads = [threading.Thread(target=_thief, args=(d.state, d.buf, capacity, taken, c))
               for c in counters]
    threads.append(threading.Thread(target=_owner, args=(d.state, d.buf, capacity, total,
                                                         pop_every, taken, by_owner)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert np.array_equal(taken, np.ones(total, dtype=np.int64))
    assert by_owner[0] + sum(int(c[0]) for c in counters) == total
    assert d.size(0) == 0
