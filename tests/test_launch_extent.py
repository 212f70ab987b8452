"""Launch extents are integers: floats, strings and bools are rejected, not truncated
or iterated (issue 23 item 5); oracle: the indices a kernel actually ran."""
import numpy as np
import pytest

import hetflow
from hetflow.errors import ArgumentTypeError


@hetflow.kernel
def mark(i, out):
    out[i] = 1.0


@pytest.mark.parametrize("extent", [(9.7,), 9.7, "10", (True,), True, (3, 2.0), (np.float64(4),)])
def test_non_integer_extent_is_rejected(extent):
    out = np.zeros(12)
    with pytest.raises(ArgumentTypeError):
        hetflow.forall(extent, mark, out)
    assert not out.any()  # checked before anything ran


def test_rejection_names_the_dimension():
    with pytest.raises(ArgumentTypeError, match=r"dimension 9.7 \(float\) is not an integer"):
        hetflow.forall((9.7,), mark, np.zeros(12))


@pytest.mark.parametrize("extent, ran", [(7, 7), (np.int64(5), 5), ((np.int32(3),), 3), ([4], 4),
                                         (np.zeros(6), 6)])
def test_integer_extents_run_that_many_indices(extent, ran):
    out = np.zeros(12)
    hetflow.forall(extent, mark, out)
    assert np.array_equal(out, (np.arange(12) < ran).astype(float))
