"""Recording in a graph and running at once share one check per call site (the runtime's
public ones): the same refusals, the same messages; elements that compiled code reads in
native byte order are typed so at recording too; a handle of a capture that raised says
that its graph will not compute it, not that it is still capturing."""
import contextlib

import numpy as np
import pytest

import hetflow
from hetflow.errors import ArgumentError, HetflowError, KernelCompileError


@hetflow.kernel
def plus(a, b):
    return a + b


@hetflow.kernel
def negated(v):
    return -v


@hetflow.kernel
def two_keys(a, b):
    return a


@hetflow.kernel
def take(i, x):
    return x[i]


@hetflow.kernel
def down(i, j, a):
    a[i, j] = a[i - 1, j] + 1.0 if i > 0 else 1.0


I8 = np.arange(6, dtype=np.int8)
GRID = np.zeros((4, 4))

BAD_CALLS = {
    "scan identity for a built-in": lambda: hetflow.scan(I8, "sum", identity=0),
    "inclusive scan identity beyond int8": lambda: hetflow.scan(I8, plus, identity=1000),
    "map-reduce identity for a built-in": lambda: hetflow.reduce(6, take, I8, op="max", identity=0),
    "sort key of two parameters": lambda: hetflow.sort(I8, key=two_keys),
    "sort key of no kernel": lambda: hetflow.sort(I8, key=abs),
    "wavefront tile of one side": lambda: hetflow.wavefront((4, 4), down, GRID, tile=(2,)),
    "wavefront tile of a float side": lambda: hetflow.wavefront((4, 4), down, GRID, tile=(2, 1.5)),
}


@pytest.mark.parametrize("name", sorted(BAD_CALLS))
def test_recording_and_running_at_once_refuse_alike(name):
    errors = []
    for capture in (contextlib.nullcontext(), hetflow.graph("g")):  # at once, then recorded
        with capture, pytest.raises(HetflowError) as info:
            BAD_CALLS[name]()
        errors.append((type(info.value), str(info.value)))
    assert errors[1] == errors[0]


def test_a_recorded_sort_keys_big_endian_elements_as_a_sort_at_once_does():
    x = np.array([3.0, -1.0, 2.0, 0.5], dtype=">f8")
    expected = x[np.argsort(-x, kind="stable")]
    assert hetflow.sort(x, key=negated).tolist() == expected.tolist()
    with hetflow.graph() as g:
        h = hetflow.sort(x, key=negated)
    g.run()
    assert np.asarray(h).tolist() == expected.tolist()


def test_a_handle_of_a_capture_that_raised_is_not_said_to_be_capturing():
    with pytest.raises(ValueError):
        with hetflow.graph("f") as g:
            total = hetflow.reduce(np.arange(4.0), "sum")
            raise ValueError("user code")
    with pytest.raises(ArgumentError) as info:
        float(total)
    assert "has no value yet" in str(info.value)
    assert "while capturing" not in str(info.value)
    with pytest.raises(ArgumentError, match="capture of graph 'f' raised"):
        g.run()


@pytest.mark.skipif(np.dtype(np.longdouble) == np.float64, reason="long double is double here")
def test_a_recorded_sort_keying_elements_of_no_compiled_type_raises_a_hetflow_error():
    with hetflow.graph():
        with pytest.raises(KernelCompileError, match=f"key kernel 'negated' does not compile for elements of "
                                                     f"dtype {np.dtype(np.longdouble)}"):
            hetflow.sort(np.ones(2, dtype=np.longdouble), key=negated)
