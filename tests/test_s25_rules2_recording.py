"""Inside hetflow.graph(), scan, sort, reduce and wavefront refuse while recording what
the call run now refuses (flags, axes, devices, sort keys), with the same error."""
import numpy as np
import pytest

import hetflow
from hetflow.errors import ArgumentTypeError, DeviceError, ShapeError


@hetflow.kernel
def add(a, b):
    return a + b


@hetflow.kernel
def two_params(a, b):
    return a


@hetflow.kernel
def element(i, j, x):
    return x[i, j]


@hetflow.kernel
def touch(i, j, x):
    x[i, j] = x[i, j] + 1.0


X = np.array([[3.0, 1.0, 2.0], [0.5, 4.0, -1.0]])

# (call, expected type, expected message): the eager call raises exactly this.
BAD = [
    (lambda x: hetflow.scan(x, "sum", inclusive="no"), ArgumentTypeError,
     "scan: inclusive must be True or False, got 'no'"),
    (lambda x: hetflow.scan(x, "sum", inclusive=None), ArgumentTypeError,
     "scan: inclusive must be True or False, got None"),
    (lambda x: hetflow.scan(x, "sum", axis=2), ShapeError,
     "scan: axis 2 is out of range for an operand of rank 2 (valid: -2..1 or None)"),
    (lambda x: hetflow.scan(x, "sum", axis="0"), ShapeError, "scan: axis must be None or an integer, got '0'"),
    (lambda x: hetflow.scan(x, "sum", device="cpu9"), DeviceError, None),
    (lambda x: hetflow.sort(x, descending=1), ArgumentTypeError, "sort: descending must be True or False, got 1"),
    (lambda x: hetflow.sort(x, axis=True), ShapeError, "sort: axis must be None or an integer, got True"),
    (lambda x: hetflow.sort(x, axis=-3), ShapeError,
     "sort: axis -3 is out of range for an operand of rank 2 (valid: -2..1 or None)"),
    (lambda x: hetflow.sort(x, key=abs), ArgumentTypeError,
     "sort: key must be a hetflow kernel of one element, not builtin_function_or_method <built-in function abs>; "
     "decorate it with @hetflow.kernel"),
    (lambda x: hetflow.sort(x, key=two_params), ArgumentTypeError,
     "sort: key kernel 'two_params' takes 2 parameter(s) (a, b); a key takes exactly one element"),
    (lambda x: hetflow.sort(x, device=[]), None, None),
    (lambda x: hetflow.reduce(x, "sum", axis=5), ShapeError,
     "reduce: axis 5 is out of range for an operand of rank 2 (valid: -2..1 or None)"),
    (lambda x: hetflow.reduce(x, "sum", 1.5), ShapeError, "reduce: axis must be None or an integer, got 1.5"),
    (lambda x: hetflow.reduce(x, "max", device="nowhere"), DeviceError, None),
    (lambda x: hetflow.reduce((2, 3), element, x, op="sum", device="cpu7"), DeviceError, None),
    (lambda x: hetflow.wavefront(x.shape, touch, x, device="gpu42"), DeviceError, None),
]


def eager_error(call):
    with pytest.raises(Exception) as info:
        call(X.copy())
    return info.value


@pytest.mark.parametrize("call, kind, message", BAD)
def test_recording_refuses_what_the_eager_call_refuses(call, kind, message):
    eager = eager_error(call)
    if kind is not None:
        assert type(eager) is kind
    if message is not None:
        assert str(eager) == message
    x = X.copy()
    with hetflow.graph() as g:
        with pytest.raises(type(eager)) as info:
            call(x)                                  # refused here, not in g.run()
    assert type(info.value) is type(eager) and str(info.value) == str(eager)
    assert not g.versions[0].nodes                   # nothing was recorded
    np.testing.assert_array_equal(x, X)


def test_a_lazy_array_has_its_rank_checked_while_recording():
    with hetflow.graph():
        t = hetflow.zeros((4, 2))
        with pytest.raises(ShapeError) as info:
            hetflow.scan(t, "sum", axis=2)
    assert str(info.value) == "scan: axis 2 is out of range for an operand of rank 2 (valid: -2..1 or None)"


@pytest.mark.parametrize("inclusive", [True, False, np.bool_(False)])
@pytest.mark.parametrize("axis", [None, 0, -1])
def test_recorded_scans_match_numpy(inclusive, axis):
    x = X.copy()
    with hetflow.graph() as g:
        got = hetflow.scan(x, "sum", axis=axis, inclusive=inclusive, device="cpu0")
    g.run()
    flat = x.reshape(-1) if axis is None else x
    want = np.cumsum(flat, axis=0 if axis is None else axis)
    if not inclusive:
        want = want - flat
    np.testing.assert_allclose(np.asarray(got), want)
    np.testing.assert_allclose(np.asarray(got), hetflow.scan(x, "sum", axis=axis, inclusive=inclusive))


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("axis", [None, 0, -1])
def test_recorded_sorts_match_numpy(descending, axis):
    x = X.copy()
    with hetflow.graph() as g:
        got = hetflow.sort(x, axis=axis, descending=descending, device="cpu0")
    g.run()
    want = np.sort(x, axis=axis)
    want = np.flip(want, axis=0 if axis is None else axis) if descending else want
    np.testing.assert_array_equal(np.asarray(got), want)
    np.testing.assert_array_equal(np.asarray(got), hetflow.sort(x, axis=axis, descending=descending))


def test_recorded_reductions_match_numpy():
    x = X.copy()
    with hetflow.graph() as g:
        rows = hetflow.reduce(x, "sum", axis=-1, device="cpu0")
        total = hetflow.reduce(x, "max", None, "cpu0")
        mapped = hetflow.reduce(x.shape, element, x, op="sum", device="cpu0")
    g.run()
    np.testing.assert_allclose(np.asarray(rows), x.sum(axis=-1))
    assert float(total) == x.max()
    assert float(mapped) == pytest.approx(x.sum())
