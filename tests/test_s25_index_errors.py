"""Bad view parameters raise hetflow's errors naming the operator and the value.

Never a silent wrong view (a bool taken as 0 or 1, a bool co_map image taken as a NumPy
mask), nor Python's or NumPy's own IndexError or TypeError.
"""
import re

import numpy as np
import pytest

import hetflow
from hetflow import co_map, cshift, interior, partition, project, section, tile, transpose
from hetflow.errors import ArgumentTypeError, IndexOutOfBoundsError, ShapeError

A = np.arange(24.0).reshape(4, 6)

BAD = [
    # bools where an integer is expected: True is no position, dim or count
    (lambda: cshift(A, 0, True), ArgumentTypeError, "cshift: shift must be an integer, got True"),
    (lambda: cshift(A, False, 1), ArgumentTypeError, "cshift: dim must be an integer, got False"),
    (lambda: project(A, True, 1), ArgumentTypeError, "project: dim must be an integer, got True"),
    (lambda: project(A, 0, True), ArgumentTypeError, "project: value must be an integer, got True"),
    (lambda: transpose(A, 0, True), ArgumentTypeError, "transpose: d2 must be an integer, got True"),
    (lambda: section(A, (True, 0), (1, 2)), ArgumentTypeError,
     "section: bad offset: index components must be integers, got True"),
    (lambda: section(A, (0, 0), (1, True)), ArgumentTypeError,
     "section: bad extent: extent components must be integers, got True"),
    (lambda: interior(A, True), ArgumentTypeError,
     "interior: bad delta: index takes integers or one sequence of integers, got True"),
    (lambda: interior(A, (1, True)), ArgumentTypeError,
     "interior: bad delta: index components must be integers, got True"),
    (lambda: tile(A, (True, 2)), ArgumentTypeError,
     "tile: bad tile extent: extent components must be integers, got True"),
    (lambda: partition(A, True, 0), ArgumentTypeError,
     "partition: parts must be a count or a list of shares, got True"),
    (lambda: partition(A, 2, True), ArgumentTypeError, "partition: dim must be an integer, got True"),
    (lambda: partition(A, [True, True], 0), ShapeError,
     "partition: shares must be a non-empty list of positive finite numbers, got [True, True]"),
    (lambda: co_map(A, lambda i: (i[0], i[1]), (4, True)), ArgumentTypeError,
     "co_map: bad extent: extent components must be integers, got True"),
    (lambda: section(A, (0, 0), (2, 2))[True, 0], ArgumentTypeError,
     "section view: indices must be integers (use section() for ranges), got (True, 0)"),
    # floats and other non-integers
    (lambda: cshift(A, 0, 1.5), ArgumentTypeError, "cshift: shift must be an integer, got 1.5"),
    (lambda: project(A, 0, np.float64(1.0)), ArgumentTypeError, "project: value must be an integer, got"),
    (lambda: section(A, (0.0, 0), (1, 2)), ArgumentTypeError,
     "section: bad offset: index components must be integers, got 0.0"),
    (lambda: tile(A, (2.0, 3)), ArgumentTypeError,
     "tile: bad tile extent: extent components must be integers, got 2.0"),
    (lambda: partition(A, 2.0, 0), ArgumentTypeError,
     "partition: parts must be a count or a list of shares, got 2.0"),
    (lambda: partition(A, 2, 0)[1.0], ArgumentTypeError, "partition: part must be an integer, got 1.0"),
    (lambda: partition(A, 2, 0)["0"], ArgumentTypeError, "partition: part must be an integer, got '0'"),
    (lambda: partition(A, 2, 0)[True], ArgumentTypeError, "partition: part must be an integer, got True"),
    # co_map images that are no indices
    (lambda: co_map(A, lambda i: (i[0] * 0.5, i[1]), (4, 6)), ArgumentTypeError,
     "co_map: f must return integer indices, but gives float64 ones on dim 0 (f gives (0.0, 0) "
     "at index (0, 0))"),
    (lambda: co_map(A, lambda i: (i[0], i[1] > 2), (4, 6)), ArgumentTypeError,
     "co_map: f must return integer indices, but gives bool ones on dim 1 (f gives (0, False) "
     "at index (0, 0))"),
    (lambda: co_map(A, lambda i: (1.0, 2), ()), ArgumentTypeError,
     "co_map: f must return integer indices, but gives float64 ones on dim 0 (f gives (1.0, 2) "
     "at index ())"),
    # ranges, ranks and extents
    (lambda: section(A, (3, 0), (2, 6)), ShapeError,
     "section: offset (3, 0) + extent (2, 6) = (5, 6) exceeds the parent extent (4, 6) on dim 0"),
    (lambda: section(A, (0,), (2,)), ShapeError,
     "section: offset (0,) and extent (2,) must both have the parent's rank 2"),
    (lambda: section(A, (0, 0), (-1, 2)), ShapeError,
     "section: bad extent: extent components must be >= 0, got (-1, 2)"),
    (lambda: section(section(A, (1, 1), (2, 2)), (1, 1), (2, 2)), ShapeError,
     "section: offset (1, 1) + extent (2, 2) = (3, 3) exceeds the parent extent (2, 2) on dim 0"),
    (lambda: project(cshift(A, 1, 3), 1, 6), ShapeError,
     "project: value 6 is out of range [0, 6) of dim 1 (parent extent (4, 6))"),
    (lambda: transpose(A, 0, 2), ShapeError,
     "transpose: d2 2 is out of range for a rank-2 parent (valid 0..1)"),
    (lambda: interior(interior(A, 1), 2), ShapeError,
     "interior: delta (2, 2) leaves a negative extent on dim 0: 2 - 2*2 = -2"),
    (lambda: tile(A, (0, 2)), ShapeError, "tile: tile extent (0, 2) is 0 on dim 0"),
    (lambda: tile(A, (8, 2)), ShapeError,
     "tile: tile extent (8, 2) does not divide the parent extent (4, 6): dim 0"),
    (lambda: partition(A, 0, 0), ShapeError,
     "partition: 0 parts of dim 0 with extent 4: parts must be in [1, 4]"),
    (lambda: partition(A, 5, 0), ShapeError,
     "partition: 5 parts of dim 0 with extent 4: parts must be in [1, 4]"),
    (lambda: partition(A, 2, 0)[2], IndexOutOfBoundsError,
     "partition: part 2 does not exist; there are 2 parts"),
    # the transforms of SPEC §1, given an extent or offset of another rank
    (lambda: transpose(A, 0, 1).cotransform_extent((4,)), ShapeError,
     "transpose.cotransform_extent: extent (4,) has rank 1, not 2"),
    (lambda: project(A, 1, 2).cotransform_extent((4,)), ShapeError,
     "project.cotransform_extent: extent (4,) has rank 1, not 2"),
    (lambda: interior(A, 1).cotransform_extent((4,)), ShapeError,
     "interior.cotransform_extent: extent (4,) has rank 1, not 2"),
    (lambda: cshift(A, 1, 2).transform_extent((4, 6, 1)), ShapeError,
     "cshift.transform_extent: extent (4, 6, 1) has rank 3, not 2"),
    (lambda: project(A, 1, 2).transform_offset((0, 0)), ShapeError,
     "project.transform_offset: index (0, 0) has rank 2, not 1"),
    (lambda: section(A, (0, 0), (2, 2)).transform_offset((0.5, 0)), ArgumentTypeError,
     "section.transform_offset: bad index: index components must be integers, got 0.5"),
    (lambda: tile(A, (2, 3)).cotransform_extent((4.0, 6)), ArgumentTypeError,
     "tile.cotransform_extent: bad extent: extent components must be integers, got 4.0"),
    (lambda: interior(A, 1).cotransform_extent((1, 6)), ShapeError,
     "interior: delta (1, 1) leaves a negative extent on dim 0: 1 - 2*1 = -1"),
]


@pytest.mark.parametrize("make, error, message", BAD, ids=[m[:60] for _, _, m in BAD])
def test_bad_view_parameters_raise_hetflow_errors_naming_operator_and_value(make, error, message):
    with pytest.raises(error, match="^" + re.escape(message)) as info:
        make()
    assert isinstance(info.value, hetflow.HetflowError)


def test_bool_co_map_image_is_not_taken_as_a_mask():
    """A bool image would select a masked subset: a view of extent 5 with 2 elements."""
    with pytest.raises(ArgumentTypeError, match="bool ones on dim 0"):
        co_map(np.arange(5.0), lambda i: (i[0] > 2,), (5,))


def test_transforms_of_the_right_rank_agree_with_numpy():
    """What each operator's four transforms give for a parent and view of NumPy's shapes."""
    b = np.zeros((4, 5, 6))
    v = project(b, 1, 2)
    assert v.cotransform_extent(b.shape) == b[:, 2, :].shape
    assert v.transform_extent(v.extent) == (4, 1, 6) and v.transform_offset((1, 3)) == (1, 2, 3)
    t = transpose(b, 0, 2)
    assert t.cotransform_extent(b.shape) == np.swapaxes(b, 0, 2).shape == t.transform_extent(b.shape)
    i = interior(b, (1, 2, 0))
    assert i.cotransform_extent(b.shape) == b[1:-1, 2:-2, :].shape
    assert i.transform_extent(i.extent) == b.shape and i.transform_offset((0, 0, 0)) == (1, 2, 0)
    s = section(b, (1, 0, 2), (2, 5, 3))
    assert s.cotransform_extent(b.shape) == b[1:3, 0:5, 2:5].shape and s.transform_offset((1, 1, 1)) == (2, 1, 3)
    g = tile(b, (2, 5, 3))
    assert g.cotransform_extent(b.shape) == (2, 1, 2) and g.transform_extent((2, 1, 2)) == b.shape
    c = cshift(b, 2, -9)
    assert c.cotransform_extent(b.shape) == np.roll(b, 9, axis=2).shape
