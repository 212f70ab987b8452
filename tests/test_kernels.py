"""Kernels compiled per device and run with forall; oracle: NumPy."""
import numpy as np
import pytest

import hetflow
from hetflow.errors import ArgumentTypeError, KernelCompileError, ShapeError


@hetflow.kernel
def axpy(i, a, x, y, out):
    out[i] = a * x[i] + y[i]


@hetflow.kernel
def square(i, v):
    return v * v


@hetflow.kernel
def sum_of_squares(i, x, y, out):
    out[i] = square(i, x[i]) + square(i, y[i])


@hetflow.kernel
def outer(i, j, x, y, out):
    out[i, j] = x[i] * y[j]


@hetflow.kernel
def cube3(i, j, k, out):
    out[i, j, k] = i * 100 + j * 10 + k


@hetflow.kernel
def particle_step(i, p, dt):
    p[i].x = p[i].x + dt * p[i].v


def test_axpy_matches_numpy():
    rng = np.random.default_rng(0)
    x, y = rng.random(100_000), rng.random(100_000)
    out = np.empty_like(x)
    hetflow.forall(x.size, axpy, 2.5, x, y, out)
    np.testing.assert_allclose(out, 2.5 * x + y, rtol=0, atol=0)


def test_two_and_three_dimensional_launches():
    x, y = np.arange(70.0), np.arange(90.0)
    out = np.zeros((70, 90))
    hetflow.forall((70, 90), outer, x, y, out)
    np.testing.assert_array_equal(out, np.outer(x, y))
    c = np.zeros((3, 4, 5), dtype=np.int64)
    hetflow.forall(c.shape, cube3, c)
    i, j, k = np.indices(c.shape)
    np.testing.assert_array_equal(c, i * 100 + j * 10 + k)


def test_kernels_call_kernels():
    x, y = np.arange(10.0), np.arange(10.0, 20.0)
    out = np.empty(10)
    hetflow.forall(10, sum_of_squares, x, y, out)
    np.testing.assert_array_equal(out, x * x + y * y)


def test_structured_dtype():
    p = np.zeros(50, dtype=[("x", "f8"), ("v", "f8")])
    p["v"] = np.arange(50.0)
    hetflow.forall(50, particle_step, p, 0.5)
    np.testing.assert_array_equal(p["x"], 0.5 * np.arange(50.0))


def test_launch_extent_may_be_an_array():
    out = np.zeros((4, 6), dtype=np.int64)

    @hetflow.kernel
    def mark(i, j, out):
        out[i, j] = i * 6 + j

    hetflow.forall(out, mark, out)
    np.testing.assert_array_equal(out.ravel(), np.arange(24))


def test_empty_extent_runs_nothing():
    out = np.full(3, 7.0)
    hetflow.forall(0, axpy, 1.0, out, out, out)
    np.testing.assert_array_equal(out, 7.0)


def test_wrong_argument_count():
    with pytest.raises(ArgumentTypeError, match=r"kernel 'axpy' takes 4 data argument\(s\) \(a, x, y, out\).*3 were given"):
        hetflow.forall(4, axpy, 1.0, np.zeros(4), np.zeros(4))


def test_wrong_argument_kind():
    with pytest.raises(ArgumentTypeError, match="argument 'x': list is not an array"):
        hetflow.forall(4, axpy, 1.0, [1, 2, 3, 4], np.zeros(4), np.zeros(4))


def test_not_a_kernel():
    with pytest.raises(ArgumentTypeError, match="not a hetflow kernel"):
        hetflow.forall(4, lambda i: None)


def test_extent_larger_than_array():
    with pytest.raises(ShapeError, match=r"argument 'y': array of extent \(3,\) does not fit the launch extent \(4,\)"):
        hetflow.forall(4, axpy, 1.0, np.zeros(4), np.zeros(3), np.zeros(4))


def test_bad_extents():
    with pytest.raises(ShapeError, match="negative"):
        hetflow.forall(-1, axpy, 1.0, np.zeros(4), np.zeros(4), np.zeros(4))
    with pytest.raises(ShapeError, match="rank 0"):
        hetflow.forall((), axpy, 1.0, np.zeros(4), np.zeros(4), np.zeros(4))


def test_compile_error_names_kernel_file_line_and_message():
    @hetflow.kernel
    def broken(i, x):
        x[i] = undefined_name_here + 1  # noqa: F821

    with pytest.raises(KernelCompileError) as err:
        hetflow.forall(4, broken, np.zeros(4))
    msg = str(err.value)
    assert "kernel 'broken'" in msg and "test_kernels.py:" in msg and "undefined_name_here" in msg
    line = int(msg.split("test_kernels.py:")[1].split(")")[0])
    assert "undefined_name_here" in open(__file__).read().splitlines()[line - 1]


def test_library_kernels_match_numpy():
    lib = hetflow.library
    x, y = np.linspace(1, 2, 1000), np.linspace(3, 4, 1000)
    out = np.empty_like(x)
    for k, expect in [(lib.add, x + y), (lib.sub, x - y), (lib.mul, x * y), (lib.div, x / y)]:
        hetflow.forall(x.size, k, x, y, out)
        np.testing.assert_array_equal(out, expect)
    hetflow.forall(x.size, lib.scale, 3.0, x, out)
    np.testing.assert_array_equal(out, 3.0 * x)
    hetflow.forall(x.size, lib.fill, 5.0, out)
    np.testing.assert_array_equal(out, 5.0)
    hetflow.forall(x.size, lib.copy, y, out)
    np.testing.assert_array_equal(out, y)
    assert lib.dot(x, y) == pytest.approx(np.dot(x, y), rel=1e-12)


@pytest.mark.simgpu
def test_simulated_gpu_runs_kernels(gpu_device):
    x, y = np.arange(40.0), np.arange(40.0, 80.0)
    out = np.zeros(40)
    hetflow.forall(40, axpy, 2.0, x, y, out, device=gpu_device.id)
    np.testing.assert_array_equal(out, 2.0 * x + y)
    grid = np.zeros((5, 7))
    hetflow.forall((5, 7), outer, np.arange(5.0), np.arange(7.0), grid, device=gpu_device)
    np.testing.assert_array_equal(grid, np.outer(np.arange(5.0), np.arange(7.0)))
    hetflow.forall(10, sum_of_squares, x, y, out, device=gpu_device)
    np.testing.assert_array_equal(out[:10], x[:10] ** 2 + y[:10] ** 2)


@pytest.mark.gpu
def test_real_gpu_runs_kernels(gpu_device):
    rng = np.random.default_rng(1)
    x, y = rng.random(1_000_003), rng.random(1_000_003)
    out = np.zeros_like(x)
    hetflow.forall(x.size, axpy, 2.0, x, y, out, device=gpu_device)
    np.testing.assert_allclose(out, 2.0 * x + y, rtol=1e-15)
    grid = np.zeros((300, 200))
    hetflow.forall(grid.shape, outer, np.arange(300.0), np.arange(200.0), grid, device=gpu_device)
    np.testing.assert_array_equal(grid, np.outer(np.arange(300.0), np.arange(200.0)))
    p = np.zeros(1000, dtype=[("x", "f8"), ("v", "f8")])
    p["v"] = 1.0
    hetflow.forall(1000, particle_step, p, 0.25, device=gpu_device)
    np.testing.assert_array_equal(p["x"], 0.25)


@pytest.mark.gpu
def test_real_gpu_uses_cupy_arrays_in_place(gpu_device):
    cupy = pytest.importorskip("cupy")
    x = cupy.arange(1000, dtype=cupy.float64)
    out = cupy.zeros(1000)
    hetflow.forall(1000, axpy, 3.0, x, x, out)  # default device follows the CuPy data
    np.testing.assert_array_equal(out.get(), 4.0 * np.arange(1000.0))


def test_access_modes_follow_fields_and_calls():
    acc = particle_step.access(1)
    assert acc.modes == {"p": "rw", "dt": ""}
    assert axpy.access(1).modes == {"a": "", "x": "r", "y": "r", "out": "w"}
    assert sum_of_squares.access(1).modes == {"x": "r", "y": "r", "out": "w"}


def test_type_error_names_the_line():
    @hetflow.kernel
    def mistyped(i, x):
        x[i] = (1, 2) * x  # tuple times array: no such operation

    with pytest.raises(KernelCompileError) as err:
        hetflow.forall(4, mistyped, np.zeros(4))
    line = int(str(err.value).split("test_kernels.py:")[1].split(")")[0])
    assert "(1, 2) * x" in open(__file__).read().splitlines()[line - 1]


@hetflow.kernel
def add_two(a, b):
    return a + b


def test_a_call_with_too_few_arguments_names_its_line():
    # Numba reports this one only in its variables' places ("Var(..., file.py:N)"): the
    # message named the file without the line.
    @hetflow.kernel
    def short_call(i, x):
        x[i] = add_two(x[i])

    with pytest.raises(KernelCompileError) as err:
        hetflow.forall(4, short_call, np.zeros(4))
    line = int(str(err.value).split("test_kernels.py:")[1].split(")")[0])
    assert "add_two(x[i])" in open(__file__).read().splitlines()[line - 1]


@hetflow.kernel
def row_sums(r, m, n, out):
    acc = 0.0
    for c in range(n):
        acc += m[r, c]
    out[r] = acc


def test_row_ownership_and_scalars_in_calls():
    acc = row_sums.access(1)
    assert acc.rows == frozenset({"m", "out"}) and acc.modes["out"] == "w"
    acc2 = outer.access(2)
    assert acc2.rows == frozenset({"x", "out"})  # y is read at j, not at the row index
