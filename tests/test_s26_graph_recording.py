"""Recording a call in a graph refuses what the call run at once refuses, with the same
error (type and message), where the check needs only what recording knows (shapes,
dtypes, kernels); hetflow.library.dot records instead of computing at capture; the
graph API used as a user would (runs with changed inputs, failed captures, graphs
reading other graphs' outputs)."""
import numpy as np
import pytest

import hetflow
from hetflow import library
from hetflow.errors import ArgumentError, HetflowError
from hetflow.ir.capture import current_graph


@hetflow.kernel
def plus(a, b):
    return a + b


@hetflow.kernel
def key_of_unknown(v):
    return no_such_function_s26(v)  # noqa: F821  (fails to compile)


@hetflow.kernel
def key_of_text(v):
    return "a"


@hetflow.kernel
def down(i, j, a):
    a[i, j] = a[i - 1, j] + 1.0 if i > 0 else 1.0


@hetflow.kernel
def take(i, x):
    return x[i]


@hetflow.kernel
def fill_default(i, x, value=2.5):
    x[i] = value


@hetflow.kernel
def scale(i, a, x, out):
    out[i] = a * x[i]


def _plain(i, j, a):
    """A plain function: no kernel."""


I8 = np.arange(6, dtype=np.int8)
F8 = np.arange(6.0)
GRID = np.zeros((4, 4))

BAD_CALLS = {
    "reduce identity beyond int8": lambda: hetflow.reduce(I8, plus, identity=1000),
    "reduce identity of text": lambda: hetflow.reduce(I8, plus, identity="a"),
    "reduce identity for a built-in": lambda: hetflow.reduce(I8, "sum", identity=0),
    "reduce xor of floats": lambda: hetflow.reduce(F8, "xor"),
    "reduce of no array": lambda: hetflow.reduce("abc", "sum"),
    "reduce min of no elements": lambda: hetflow.reduce(np.zeros(0), "min"),
    "reduce max of an empty axis": lambda: hetflow.reduce(np.zeros((3, 0)), "max", axis=-1),
    "reduce by a user op of no elements": lambda: hetflow.reduce(np.zeros((0, 2)), plus),
    "map-reduce argument count": lambda: hetflow.reduce(6, take, op="sum"),
    "map-reduce negative extent": lambda: hetflow.reduce(-3, take, I8, op="sum"),
    "scan identity beyond int8": lambda: hetflow.scan(I8, plus, inclusive=False, identity=1000),
    "scan identity of text": lambda: hetflow.scan(I8, plus, inclusive=False, identity="a"),
    "exclusive scan without identity": lambda: hetflow.scan(I8, plus, inclusive=False),
    "scan xor of floats": lambda: hetflow.scan(F8, "xor"),
    "sort key that does not compile": lambda: hetflow.sort(F8, key=key_of_unknown),
    "sort key returning text": lambda: hetflow.sort(F8, key=key_of_text),
    "sort of structured elements": lambda: hetflow.sort(np.zeros(3, dtype=[("a", "f8")])),
    "wavefront extent of rank 1": lambda: hetflow.wavefront(5, down, GRID),
    "wavefront extent of rank 3": lambda: hetflow.wavefront((2, 2, 2), down, GRID),
    "wavefront negative extent": lambda: hetflow.wavefront((-1, 4), down, GRID),
    "wavefront tile of side 0": lambda: hetflow.wavefront((4, 4), down, GRID, tile=(0, 1)),
    "wavefront of no kernel": lambda: hetflow.wavefront((4, 4), _plain, GRID),
    "wavefront argument count": lambda: hetflow.wavefront((4, 4), down),
    "forall argument count": lambda: hetflow.forall(6, take),
    "dot of unaligned vectors": lambda: library.dot(np.ones(3), np.ones(4)),
    "dot of text": lambda: library.dot(np.array(["a"]), np.array(["b"])),
    "dot of a matrix": lambda: library.dot(np.ones((2, 2)), np.ones(2)),
    "dot blocks 0": lambda: library.dot(np.ones(3), np.ones(3), blocks=0),
    "dot on no device": lambda: library.dot(np.ones(3), np.ones(3), device="nowhere9"),
}


def _raised(call) -> HetflowError:
    with pytest.raises(HetflowError) as info:
        call()
    return info.value


@pytest.mark.parametrize("name", sorted(BAD_CALLS))
def test_recording_refuses_what_the_call_refuses_with_the_same_error(name):
    eager = _raised(BAD_CALLS[name])
    with hetflow.graph("g") as g:
        recorded = _raised(BAD_CALLS[name])
        assert current_graph() is g  # the capture goes on after the refusal
    assert type(recorded) is type(eager)
    assert str(recorded) == str(eager)


def test_a_recorded_forall_takes_the_kernels_defaults_as_a_call_does():
    x = np.zeros(3)
    with hetflow.graph() as g:
        hetflow.forall(3, fill_default, x)
    g.run()
    assert x.tolist() == [2.5, 2.5, 2.5]


def test_checks_that_need_computed_values_wait_for_the_run():
    with hetflow.graph("late") as g:
        prefix = hetflow.scan(I8, "sum")                  # a result: no dtype until it runs
        total = hetflow.reduce(prefix, plus, identity=10 ** 30)
    with pytest.raises(HetflowError, match=r"^graph 'late' v0, node #1 reduce: reduce: identity=10+ is not an element"):
        g.run()
    assert np.asarray(prefix).tolist() == np.cumsum(I8).tolist()
    with pytest.raises(ArgumentError, match="has no value yet"):
        float(total)


# -- library.dot records -----------------------------------------------------------------

def test_dot_in_a_graph_follows_its_inputs_at_each_run():
    x, y = np.arange(5.0), np.linspace(1.0, 2.0, 5)
    with hetflow.graph() as g:
        d = library.dot(x, y, blocks=2)
    with pytest.raises(ArgumentError, match="has no value yet"):  # nothing computed at capture
        float(d)
    g.run()
    assert float(d) == pytest.approx(np.dot(x, y))
    x[:] = np.arange(5.0) ** 2
    g.run()
    assert float(d) == pytest.approx(np.dot(x, y))


def test_dot_reads_a_lazy_array_and_a_result_of_the_graph():
    x, y = np.arange(1.0, 6.0), np.ones(5)
    with hetflow.graph() as g:
        t = hetflow.zeros(5)
        hetflow.forall(5, library.add, x, y, t)      # t = x + y, fused away or not
        d = library.dot(t, y)
        prefix = hetflow.scan(x, "sum")
        e = library.dot(prefix, x)
    g.run()
    assert float(d) == pytest.approx(np.dot(x + y, y))
    assert float(e) == pytest.approx(np.dot(np.cumsum(x), x))
    x[:] = 2.0
    g.run()
    assert float(d) == pytest.approx(np.dot(x + y, y))
    assert float(e) == pytest.approx(np.dot(np.cumsum(x), x))


def test_dot_outside_a_graph_computes_at_once():
    assert library.dot([1, 2, 3], [4, 5, 6]) == np.dot([1, 2, 3], [4, 5, 6])


# -- the graph API as a user meets it ------------------------------------------------------

def test_a_failed_capture_leaves_no_graph_capturing():
    with pytest.raises(ValueError):
        with hetflow.graph("f") as g:
            hetflow.forall(4, scale, 2.0, F8[:4], np.zeros(4))
            raise ValueError("user code")
    assert current_graph() is None
    with pytest.raises(ArgumentError, match="capture of graph 'f' raised"):
        g.run()
    assert library.dot(np.ones(2), np.ones(2)) == 2.0  # computes again, not recorded


def test_a_graph_reads_the_outputs_of_another_each_run():
    x = np.arange(4.0)
    with hetflow.graph() as first:
        t = first.output(hetflow.zeros(4))
        hetflow.forall(4, scale, 2.0, x, t)
    with hetflow.graph() as second:
        u = second.output(hetflow.zeros(4))
        hetflow.forall(4, scale, 3.0, t, u)
        total = hetflow.reduce(u, "sum")
    for values in (np.arange(4.0), np.full(4, 5.0)):
        x[:] = values
        first.run()
        second.run()
        assert np.asarray(u).tolist() == (6.0 * values).tolist()
        assert float(total) == pytest.approx(6.0 * values.sum())
