"""Random DAGs of launches through a queue give what running them one by one gives.

Each example draws a program: launches of a few kernels over a few arrays, with random
priorities, random explicit ``wait_for`` edges to earlier launches, and some deferred
launches submitted in a random order at the end. The queue runs it with several worker
slots (so independent instances really overlap); the oracle runs the same launches
with sequential ``hetflow.forall`` calls on copies of the arrays, in program order.

The test also checks the order itself against its own model of the dependencies
(read-after-write, write-after-read, write-after-write on each array, explicit edges,
taken transitively through the program): every instance must start after each one it
depends on ended, by the events' profiling times.
"""
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hetflow
from hetflow.runtime.queue import Queue

N = 8         # array length
ARRAYS = 4


@hetflow.kernel
def axpy(i, a, x, y):
    y[i] = a * y[i] + x[i]


@hetflow.kernel
def reverse_into(i, x, y):
    y[i] = x[x.shape[0] - 1 - i]


@hetflow.kernel
def bend(i, x):
    x[i] = 0.5 * x[i] * x[i] - 0.25


@hetflow.kernel
def diff(i, x, y, z):
    z[i] = x[i] - y[i]


# kernel, scalar argument or None, (read arrays, written arrays) as argument positions
KERNELS = {
    "axpy": (axpy, True, ((0, 1), (1,))),
    "reverse_into": (reverse_into, False, ((0,), (1,))),
    "bend": (bend, False, ((0,), (0,))),
    "diff": (diff, False, ((0, 1), (2,))),
}


@st.composite
def programs(draw):
    ops = []
    for k in range(draw(st.integers(1, 14))):
        name = draw(st.sampled_from(sorted(KERNELS)))
        kernel, has_scalar, (reads, writes) = KERNELS[name]
        arity = max(reads + writes) + 1
        arrays = draw(st.permutations(range(ARRAYS)))[:arity]  # distinct arrays per launch
        scalar = (draw(st.sampled_from([0.5, -0.5, 0.25])),) if has_scalar else ()
        waits = draw(st.lists(st.integers(0, k - 1), max_size=2, unique=True)) if k else []
        ops.append(dict(name=name, arrays=arrays, scalar=scalar,
                        reads={arrays[p] for p in reads}, writes={arrays[p] for p in writes},
                        priority=draw(st.integers(-2, 2)), waits=waits, defer=draw(st.booleans())
                        if k % 3 == 0 else False))
    submit_order = draw(st.permutations([k for k, op in enumerate(ops) if op["defer"]]))
    init = draw(st.lists(st.floats(-1, 1, allow_nan=False, width=32), min_size=ARRAYS * N,
                         max_size=ARRAYS * N))
    return ops, submit_order, np.array(init, dtype=np.float64).reshape(ARRAYS, N)


def must_follow(ops) -> list[set]:
    """For each launch, the earlier launches it must run after (directly)."""
    before = []
    for k, op in enumerate(ops):
        deps = set(op["waits"])
        for j in range(k):
            prev = ops[j]
            if (op["reads"] & prev["writes"] or op["writes"] & prev["reads"]
                    or op["writes"] & prev["writes"]):
                deps.add(j)
        before.append(deps)
    return before


def launch_args(op, arrays):
    return (*op["scalar"], *(arrays[a] for a in op["arrays"]))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_random_dag_matches_sequential_execution(program):
    ops, submit_order, init = program
    expected = [a.copy() for a in init]
    for op in ops:
        hetflow.forall(N, KERNELS[op["name"]][0], *launch_args(op, expected))

    arrays = [a.copy() for a in init]
    with Queue("cpu0", slots=3) as q:
        events = []
        for op in ops:
            events.append(q.enqueue(KERNELS[op["name"]][0], N, *launch_args(op, arrays),
                                    priority=op["priority"], wait_for=[events[j] for j in op["waits"]],
                                    defer=op["defer"]))
        for k in submit_order:
            q.submit(events[k])
    for got, want in zip(arrays, expected):
        np.testing.assert_array_equal(got, want)
    for k, deps in enumerate(must_follow(ops)):
        for j in deps:
            assert events[j].profile.ended <= events[k].profile.started, (j, k, ops[j], ops[k])
