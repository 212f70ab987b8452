"""reduce, scan, sort and library.dot refuse arguments whose meaning would be a guess:
switches that are not True or False, identities that change on conversion, block
counts that are no positive integer. What they accept still matches NumPy."""
import re

import numpy as np
import pytest

import hetflow
from hetflow.errors import ArgumentError, ArgumentTypeError
from hetflow.library import dot


@hetflow.kernel
def s25_add(a, b):
    return a + b


@hetflow.kernel
def s25_value(i, x):
    return x[i]


X = np.array([3.0, 1.0, 2.0, 5.0])


# -- switches: True or False ------------------------------------------------------------------
@pytest.mark.parametrize("value", ["no", "exclusive", 1, 0, None, 0.0])
def test_scan_refuses_an_inclusive_that_is_no_bool(value):
    with pytest.raises(ArgumentTypeError, match=f"scan: inclusive must be True or False, got {value!r}$"):
        hetflow.scan(X, "sum", inclusive=value)


def test_scan_takes_numpy_bools_for_inclusive():
    got = hetflow.scan(X, "sum", inclusive=np.False_)
    np.testing.assert_array_equal(got, np.concatenate([[0.0], np.cumsum(X)[:-1]]))


@pytest.mark.parametrize("value", ["no", "desc", 1, None])
def test_sort_refuses_a_descending_that_is_no_bool(value):
    with pytest.raises(ArgumentTypeError, match=f"sort: descending must be True or False, got {value!r}$"):
        hetflow.sort(X, descending=value)


@pytest.mark.parametrize("value", [np.True_, np.False_])
def test_sort_takes_numpy_bools_for_descending(value):
    want = np.sort(X)[::-1] if value else np.sort(X)
    np.testing.assert_array_equal(hetflow.sort(X, descending=value), want)


@pytest.mark.parametrize("form", ["array", "kernel"])
def test_reduce_refuses_a_commutative_that_is_no_bool(form):
    # commutative="no" was true: a non-commutative op would be folded out of order.
    call = ((X, s25_add) if form == "array" else (X.size, s25_value, X))
    kwargs = {} if form == "array" else {"op": s25_add}
    with pytest.raises(ArgumentTypeError, match="reduce: commutative must be True or False, got 'no'$"):
        hetflow.reduce(*call, commutative="no", device="cpu0", **kwargs)


def test_reduce_takes_a_numpy_bool_for_commutative():
    assert hetflow.reduce(X, s25_add, commutative=np.False_, device="cpu0") == X.sum()


# -- identity=: an element of the operand's type, unchanged -----------------------------------
@pytest.mark.parametrize("dtype, identity", [(np.float32, 1e300), (np.complex64, 1e300), (np.float32, -1e39),
                                             (np.float64, "1.5"), (np.int32, "1"), (np.float64, b"0")])
def test_an_identity_that_overflows_or_is_text_is_refused(dtype, identity):
    empty = np.zeros(0, dtype)
    message = re.escape(f"identity={identity!r} is not an element of dtype {np.dtype(dtype)}") + "$"
    with pytest.raises(ArgumentTypeError, match="reduce: " + message):
        hetflow.reduce(empty, s25_add, identity=identity)
    with pytest.raises(ArgumentTypeError, match="scan: " + message):
        hetflow.scan(np.ones(2, dtype), s25_add, inclusive=False, identity=identity)


@pytest.mark.parametrize("dtype, identity", [(np.float32, np.inf), (np.float32, 0.1), (np.float32, np.nan),
                                             (np.complex64, complex(1, -np.inf)), (np.float64, 1e300)])
def test_identities_that_round_or_are_infinite_are_taken(dtype, identity):
    got = hetflow.reduce(np.zeros(0, dtype), s25_add, identity=identity)
    want = np.asarray(identity, dtype)[()]
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, want)  # NaN where it is NaN


# -- library.dot: blocks= -----------------------------------------------------------------------
@pytest.mark.parametrize("blocks", [1.5, "2", True, None, 2.0])
def test_dot_refuses_blocks_that_are_no_integer(blocks):
    with pytest.raises(ArgumentTypeError, match=f"dot: blocks must be a positive integer, got {blocks!r}$"):
        dot(X, X, blocks=blocks)


@pytest.mark.parametrize("blocks", [0, -1])
def test_dot_refuses_fewer_than_one_block(blocks):
    with pytest.raises(ArgumentError, match=f"dot: blocks must be a positive integer, got {blocks}$"):
        dot(X, X, blocks=blocks)


@pytest.mark.parametrize("blocks", [1, np.int64(3), 1000])
def test_dot_with_any_positive_block_count_is_numpys(blocks):
    x, y = np.arange(-5, 6, dtype=np.int64), np.arange(11, dtype=np.int64) ** 2
    got = dot(x, y, blocks=blocks, device="cpu0")
    assert got == np.dot(x, y) and got.dtype == np.int64
