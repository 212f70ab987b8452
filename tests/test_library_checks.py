"""hetflow.library.dot gives np.dot's result for 1-D operands of every numeric and bool
element type, and hetflow's errors for operands np.dot would refuse."""
import numpy as np
import pytest

import hetflow
from hetflow.errors import ArgumentTypeError, ShapeError
from hetflow.library import dot

RNG = np.random.default_rng(11)


def operands(dtype, n):
    if np.dtype(dtype).kind == "b":
        return RNG.random(n) < 0.3, RNG.random(n) < 0.3
    if np.dtype(dtype).kind == "c":
        return tuple((RNG.random(n) + 1j * RNG.random(n)).astype(dtype) for _ in range(2))
    info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else None
    if info is None:
        return tuple(RNG.random(n).astype(dtype) for _ in range(2))
    return tuple(RNG.integers(info.min, info.max, n, dtype=dtype, endpoint=True) for _ in range(2))


@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.uint8, np.int32, np.int64, np.uint64])
@pytest.mark.parametrize("blocks", [1, 3, 256])
def test_exact_types_equal_numpy(dtype, blocks):
    x, y = operands(dtype, 1000)
    got, want = dot(x, y, blocks=blocks), np.dot(x, y)
    assert (got, got.dtype) == (want, want.dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
def test_inexact_types_equal_numpy_to_rounding(dtype):
    x, y = operands(dtype, 1000)
    got, want = dot(x, y, blocks=7), np.dot(x, y)
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1000 * np.finfo(dtype).eps)


def test_int64_beyond_float64s_integers():
    x, y = np.array([2**53 + 1, 1]), np.array([1, 0])
    assert dot(x, y) == np.dot(x, y) == 2**53 + 1


@pytest.mark.parametrize("blocks", [1, 3])
def test_bools_are_a_logical_or(blocks):
    b = np.array([True, True, False])
    assert dot(b, b, blocks=blocks) is np.True_


def test_mixed_types_take_numpys_result_type():
    x, y = np.arange(5, dtype=np.int64), np.arange(5, dtype=np.uint64)
    got = dot(x, y)
    assert (got, got.dtype) == (np.dot(x, y), np.float64)


def test_lists_and_empty_operands():
    assert dot([1, 2, 3], [4, 5, 6]) == np.dot([1, 2, 3], [4, 5, 6])
    got = dot(np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert (got, got.dtype) == (0, np.int64)


def test_lengths_must_match():
    base = np.arange(10.0)
    with pytest.raises(ShapeError, match=r"dot: shapes \(10,\) and \(4,\) not aligned: 10 \(dim 0\) != 4"):
        dot(np.ones(10), base[:4])
    with pytest.raises(ShapeError, match=r"shapes \(4,\) and \(10,\) not aligned"):
        dot(base[:4], np.ones(10))


def test_operands_must_be_vectors_of_numbers():
    with pytest.raises(ShapeError, match=r"dot: x must be a vector \(1-D\); got shape \(3, 3\)"):
        dot(np.ones((3, 3)), np.ones(3))
    with pytest.raises(ShapeError, match=r"dot: y must be a vector \(1-D\); got shape \(\)"):
        dot(np.ones(3), 2.0)
    with pytest.raises(ArgumentTypeError, match="dot: x and y hold <U1 and float64; dot takes bools and numbers"):
        dot(["a", "b"], np.ones(2))


@pytest.mark.simgpu
def test_simulated_gpu_int64(gpu_device):
    x, y = np.array([2**53 + 1, 1, 3]), np.array([1, 0, 2])
    assert dot(x, y, blocks=2, device=gpu_device) == np.dot(x, y)


def test_precompile_still_builds_dot_partial():
    assert hetflow.library.precompile(dtypes=("float64",)) == len(hetflow.library.KERNELS)
