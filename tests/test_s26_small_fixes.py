"""Small fixes: the ranks' agreement keeps a non-hetflow error's class in its message;
asarray from a root keeps a structured x's fields; values recorded by a graph capture
that raised say that the graph never runs."""
import numpy as np
import pytest
from test_s25_mpi_robustness import Answering

import hetflow
from hetflow import cluster
from hetflow.cluster import control
from hetflow.errors import ArgumentError, CommError, ShapeError


def test_one_kind_of_foreign_failure_on_the_ranks_names_its_class():
    foreign = (None, ("ZeroDivisionError", "division by zero"))
    channel = Answering([foreign, (("a",), None), foreign])
    with pytest.raises(CommError) as caught:
        control.settle(channel, ("a",), None, "f")
    assert str(caught.value) == "f failed on ranks 0, 2 (of 3): ZeroDivisionError: division by zero"
    # a hetflow class is the class raised: the message does not repeat it
    channel = Answering([(None, ("ShapeError", "no rows")), (("a",), None)])
    with pytest.raises(ShapeError) as caught:
        control.settle(channel, ("a",), None, "f")
    assert str(caught.value) == "f failed on rank 0 (of 2): no rows"


def test_asarray_from_a_root_keeps_a_structured_xs_fields():
    record = np.dtype([("a", "f8"), ("b", "i8")])
    x = np.zeros(5, record)
    x["a"], x["b"] = np.arange(5) / 4, np.arange(5) * 3
    got = cluster.asarray(x, root=0)
    assert got.dtype == record, got.dtype
    back = got.allgather()
    assert back["a"].tolist() == [0.0, 0.25, 0.5, 0.75, 1.0] and back["b"].tolist() == [0, 3, 6, 9, 12]


def capture_that_raises():
    with pytest.raises(ValueError):
        with hetflow.graph("f") as g:
            total = g.record("reduce", fn=np.sum, args=(np.arange(4.0),))
            t = hetflow.zeros(4)
            raise ValueError("user code")
    return total, t


def test_a_handle_of_a_capture_that_raised_says_the_graph_never_runs():
    total, _ = capture_that_raises()
    with pytest.raises(ArgumentError, match=r"^reduce0 \(result of reduce\) has no value yet: its graph's capture "
                                            r"raised, so the graph never runs; capture it again$"):
        float(total)


def test_a_lazy_array_of_a_capture_that_raised_says_the_graph_never_runs():
    _, t = capture_that_raises()
    with pytest.raises(ArgumentError, match=r"^lazy array t0 of graph 'f' has no value: its graph's capture "
                                            r"raised, so the graph never runs; capture it again$"):
        np.asarray(t)
