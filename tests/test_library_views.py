"""hetflow.library.dot takes views of rank 1 (hetflow.index.views) as it takes arrays:
its result is np.dot's of the views' NumPy values, in np.dot's type, exactly for
integers and bools."""
import numpy as np
import pytest

from hetflow import co_map, cshift, interior, project, section, tile
from hetflow.errors import ShapeError
from hetflow.library import dot

RNG = np.random.default_rng(17)

# Views of rank 1 over a vector of 12 elements.
VIEWS = {
    "interior": lambda v: interior(v[:10], 1),
    "section": lambda v: section(v, (3,), (8,)),
    "cshift of a section": lambda v: cshift(section(v, (0,), (8,)), 0, 3),  # wraps around
    "interior of a cshift": lambda v: interior(cshift(v, 0, -5), 2),
    "co_map reversal": lambda v: co_map(v, lambda idx: (10 - idx[0],), (8,)),
    "project of a column": lambda v: project(v.reshape(3, 4), 1, 2),  # strided: every 4th element
}


def operands(dtype, n=12):
    if np.dtype(dtype).kind == "b":
        return RNG.random(n) < 0.4, RNG.random(n) < 0.4
    if np.dtype(dtype).kind == "c":
        return tuple((RNG.random(n) + 1j * RNG.random(n)).astype(dtype) for _ in range(2))
    if np.dtype(dtype).kind == "f":
        return tuple(RNG.random(n).astype(dtype) for _ in range(2))
    info = np.iinfo(dtype)
    return tuple(RNG.integers(info.min, info.max, n, dtype=dtype, endpoint=True) for _ in range(2))


def test_int64_views_beyond_float64s_integers():
    x = np.array([0, 2**53 + 1, 7, 0])
    y = np.array([5, 1, 0, 3])
    got, want = dot(interior(x, 1), interior(y, 1)), np.dot(x[1:-1], y[1:-1])
    assert (got, got.dtype) == (want, want.dtype) == (2**53 + 1, np.int64)


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.int64, np.uint64])
def test_views_of_exact_types_equal_numpy(view, dtype):
    x, y = operands(dtype)
    xv, yv = VIEWS[view](x), VIEWS[view](y)
    got, want = dot(xv, yv, blocks=3), np.dot(xv.numpy(), yv.numpy())
    assert (got, got.dtype) == (want, want.dtype)


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("dtype", [np.float32, np.complex128])
def test_views_of_inexact_types_equal_numpy_to_rounding(view, dtype):
    x, y = operands(dtype)
    xv, yv = VIEWS[view](x), VIEWS[view](y)
    got, want = dot(xv, yv, blocks=3), np.dot(xv.numpy(), yv.numpy())
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=100 * np.finfo(dtype).eps)


def test_a_view_with_an_array_takes_numpys_result_type():
    x = np.arange(12, dtype=np.int64)
    y = np.arange(8, dtype=np.uint64)
    got, want = dot(interior(x[:10], 1), y), np.dot(x[1:9], y)
    assert (got, got.dtype) == (want, np.float64)
    got = dot(y.astype(np.int32), section(x, (2,), (8,)))
    assert (got, got.dtype) == (np.dot(y.astype(np.int32), x[2:10]), np.int64)


def test_empty_views():
    x = np.arange(2, dtype=np.int64)
    got = dot(interior(x, 1), interior(x, 1))
    assert (got, got.dtype) == (0, np.int64)


def test_view_lengths_must_match():
    with pytest.raises(ShapeError, match=r"dot: shapes \(8,\) and \(10,\) not aligned: 8 \(dim 0\) != 10"):
        dot(interior(np.ones(10), 1), np.ones(10))


def test_a_view_whose_elements_are_tiles_is_no_vector():
    x = np.arange(10.0)
    tiles = tile(x, (5,))  # two elements, each a tile of 5
    with pytest.raises(ValueError):  # nor does np.dot take its values
        np.dot(tiles.numpy(), tiles.numpy())
    with pytest.raises(ShapeError, match=r"dot: x must be a vector \(1-D\); got shape \(2, 5\)"):
        dot(tiles, tiles)
    with pytest.raises(ShapeError, match=r"dot: y must be a vector \(1-D\); got shape \(2, 2\)"):
        dot(np.ones(2), interior(np.ones((4, 4)), 1))


@pytest.mark.simgpu
def test_views_on_the_simulated_gpu(gpu_device):
    x = np.array([9, 2**53 + 1, 1, 3, 9])
    y = np.array([9, 1, 0, 2, 9])
    got = dot(interior(x, 1), cshift(interior(y, 1), 0, 0), blocks=2, device=gpu_device)
    assert (got, got.dtype) == (np.dot(x[1:-1], y[1:-1]), np.int64)
