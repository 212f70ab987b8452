"""The kernel form of reduce (map-reduce in one pass): oracle NumPy, or a sequential fold."""
import numpy as np
import pytest

import hetflow
from hetflow import cshift, interior, reduce
from hetflow.errors import ArgumentTypeError, KernelCompileError, ShapeError
from hetflow.library import maxloc, minloc
from hetflow.runtime import reductions
from hetflow.runtime.reductions import Blocking

RNG = np.random.default_rng(22)


@hetflow.kernel
def product(i, x, y):
    return x[i] * y[i]


@hetflow.kernel
def value_at(i, x):
    return x[i], i


@hetflow.kernel
def residual_sq(i, j, u, f, h2):
    """The squared residual of a 5-point Laplacian at an interior point (views u, f)."""
    r = f[i, j] - (4.0 * u[i + 1, j + 1] - u[i, j + 1] - u[i + 2, j + 1] - u[i + 1, j] - u[i + 1, j + 2]) / h2
    return r * r


@hetflow.kernel
def is_negative(i, x):
    return x[i] < 0


@hetflow.kernel
def first_nonzero(a, b):
    """Associative, not commutative."""
    return a if a != 0 else b


@hetflow.kernel
def digit(i, d):
    return d[i]


@hetflow.kernel
def nothing(i, x):
    x[i] = 0.0


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of a few elements, so small extents take several levels of partials."""
    monkeypatch.setitem(reductions.BLOCKING, "cpu", Blocking(grain=2, most=5))


@pytest.mark.parametrize("n", [1, 7, 100, 100_003])
def test_dot_product_matches_numpy(n):
    x, y = RNG.random(n), RNG.random(n)
    assert np.isclose(reduce(n, product, x, y), x @ y, rtol=1e-12)


def test_default_op_is_sum_and_ints_widen_as_numpy():
    x = RNG.integers(-100, 100, 1000).astype(np.int8)
    got = reduce(x.size, digit, x)
    assert got == x.sum() and got.dtype == x.sum().dtype


def test_float32_values_accumulate_in_double():
    x = np.full(1 << 20, 0.1, np.float32)
    got = reduce(x.size, digit, x)
    assert got.dtype == np.float32 and got == np.float32(x.astype(np.float64).sum())


def test_bools_sum_to_a_count():
    x = RNG.standard_normal(5000)
    assert reduce(x.size, is_negative, x) == (x < 0).sum()
    assert reduce(x.size, is_negative, x, op="lor") == bool((x < 0).any())


@pytest.mark.parametrize("op", ["min", "max", "prod"])
def test_builtin_ops(op, small_blocks):
    x = RNG.random(77) + 0.5
    assert np.isclose(reduce(x.size, digit, x, op=op), getattr(np, op)(x), rtol=1e-12)


def test_two_dimensional_extent_over_views(small_blocks):
    n = 23
    u, f = RNG.random((n + 2, n + 2)), RNG.random((n + 2, n + 2))
    inner = interior(f, 1)
    got = reduce((n, n), residual_sq, u, inner, 0.5)
    lap = (4 * u[1:-1, 1:-1] - u[:-2, 1:-1] - u[2:, 1:-1] - u[1:-1, :-2] - u[1:-1, 2:]) / 0.5
    assert np.isclose(got, ((f[1:-1, 1:-1] - lap) ** 2).sum(), rtol=1e-12)


def test_view_argument_is_read_in_place():
    x = RNG.random(1000)
    assert reduce(x.size, digit, cshift(x, 0, 3), op=first_nonzero, commutative=False) == x[3]


@pytest.mark.parametrize("n", [5, 64, 1001])
def test_structured_result_min_and_max_location(n, small_blocks):
    x = RNG.integers(0, 5, n).astype(np.float64)  # many ties: the first index must win
    value, index = reduce(n, value_at, x, op=minloc)
    assert (value, index) == (x.min(), x.argmin())
    assert reduce(n, value_at, x, op=maxloc) == (x.max(), x.argmax())


def test_non_commutative_op_keeps_index_order(small_blocks):
    d = np.zeros(50, np.int64)
    d[[17, 31]] = [5, 9]
    assert reduce(d.size, digit, d, op=first_nonzero, commutative=False) == 5


def test_empty_extent():
    x = np.zeros(0)
    assert reduce(0, digit, x) == 0.0
    with pytest.raises(ShapeError, match="no identity"):
        reduce(0, digit, x, op="min")
    assert reduce(0, value_at, x, op=minloc, identity=(np.inf, -1)) == (np.inf, -1)


def test_array_form_still_works_with_op_positional_or_keyword():
    x = RNG.random((4, 5))
    assert np.isclose(reduce(x, "sum"), x.sum())
    assert np.allclose(reduce(x, op="max", axis=1), x.max(1))
    assert np.allclose(reduce(x, "min", 0), x.min(0))


def test_errors_name_the_problem():
    x = RNG.random(4)
    with pytest.raises(ArgumentTypeError, match="takes 1 index parameter"):
        reduce(4, product, x)
    with pytest.raises(ArgumentTypeError, match="returns none"):
        reduce(4, nothing, x)
    with pytest.raises(ArgumentTypeError, match="structured"):
        reduce(4, value_at, x, op="min")
    with pytest.raises(ArgumentTypeError, match="axis"):
        reduce(4, digit, x, axis=0)
    with pytest.raises(KernelCompileError, match="product"):
        reduce(4, product, x, "text")


def test_recorded_in_a_graph():
    x, y = RNG.random(10), RNG.random(10)
    with hetflow.graph() as g:
        h = reduce(10, product, x, y)
    g.run()
    assert np.isclose(h.result(), x @ y)


# -- the simulated GPU (tiny launches) -------------------------------------------------------------
@pytest.mark.simgpu
def test_simulated_gpu_map_reduce(gpu_device):
    x, y = RNG.random(40), RNG.random(40)
    assert np.isclose(reduce(40, product, x, y, device=gpu_device), x @ y, rtol=1e-12)
    x[[7, 30]] = -1.0
    assert reduce(40, value_at, x, op=minloc, device=gpu_device) == (-1.0, 7)
    n = 5
    u, f = RNG.random((n + 2, n + 2)), RNG.random((n + 2, n + 2))
    lap = (4 * u[1:-1, 1:-1] - u[:-2, 1:-1] - u[2:, 1:-1] - u[1:-1, :-2] - u[1:-1, 2:]) / 0.5
    got = reduce((n, n), residual_sq, u, interior(f, 1), 0.5, device=gpu_device)
    assert np.isclose(got, ((f[1:-1, 1:-1] - lap) ** 2).sum(), rtol=1e-12)


@pytest.mark.simgpu
def test_simulated_gpu_co_executes_with_the_cpu(gpu_device, small_blocks):
    devices = ["cpu0", gpu_device.id]
    x = RNG.integers(-50, 50, 60)
    assert reduce(x.size, digit, x, device=devices) == x.sum()
    d = np.zeros(60, np.int64)
    d[[25, 50]] = [3, 4]
    assert reduce(d.size, digit, d, op=first_nonzero, commutative=False, device=devices) == 3


# -- a real GPU (CuPy data stays on the GPU) ---------------------------------------------------------
@pytest.mark.gpu
def test_gpu_map_reduce_of_cupy_arrays():
    from hetflow.cuda_compat import cupy_module

    cp = cupy_module()
    if cp is None:
        pytest.skip("needs CuPy")
    n = 3_000_001
    x, y = RNG.random(n), RNG.random(n)
    assert np.isclose(reduce(n, product, cp.asarray(x), cp.asarray(y), device="gpu0"), x @ y, rtol=1e-12)
    x[[10, 2_000_000]] = -1.0
    assert reduce(n, value_at, cp.asarray(x), op=minloc, device="gpu0") == (-1.0, 10)
    m = 1000
    u, f = RNG.random((m + 2, m + 2)), RNG.random((m + 2, m + 2))
    lap = (4 * u[1:-1, 1:-1] - u[:-2, 1:-1] - u[2:, 1:-1] - u[1:-1, :-2] - u[1:-1, 2:]) / 0.5
    got = reduce((m, m), residual_sq, cp.asarray(u), interior(cp.asarray(f), 1), 0.5, device="gpu0")
    assert np.isclose(got, ((f[1:-1, 1:-1] - lap) ** 2).sum(), rtol=1e-11)
    d = RNG.integers(-50, 50, 100_003)
    assert reduce(d.size, digit, d, device=["cpu0", "gpu0"]) == d.sum()


@hetflow.kernel(boundscheck=True)
def next_one(i, x):
    return x[i + 1]


def test_a_checked_kernel_stays_checked_in_a_map_reduce():
    # The generated block kernel dropped the kernel's options: the read past x went unseen.
    x = np.ones(10)
    assert hetflow.reduce(9, next_one, x) == 9.0
    with pytest.raises(hetflow.errors.IndexOutOfBoundsError, match=r"indexed 'x' out of bounds: index 10"):
        hetflow.reduce(10, next_one, x)


# -- found by tests/test_reductions_oracle.py ----------------------------------------------------------
def test_empty_extent_identity_is_a_value_of_the_kernel():
    """identity= comes back as the kernel's value type, as a fold would: not as given."""
    got = reduce(0, digit, np.zeros(3, np.int32), op=first_nonzero, identity=0)
    assert got == 0 and type(got) is np.int32
    low, where = reduce(0, value_at, np.zeros(3), op=minloc, identity=(np.inf, -1))
    assert (low, where) == (np.inf, -1) and (type(low), type(where)) == (np.float64, np.int64)


@pytest.mark.parametrize("identity, message", [
    (2.5, r"reduce: identity=2.5 is not an element of dtype int32"),
    ((0, 1), r"reduce: identity=\(0, 1\) is not an element of dtype int32"),
])
def test_empty_extent_identity_that_is_no_value_is_refused(identity, message):
    with pytest.raises(ArgumentTypeError, match=message):
        reduce(0, digit, np.zeros(3, np.int32), op=first_nonzero, identity=identity)


def test_empty_extent_identity_of_a_tuple_value_needs_every_field():
    with pytest.raises(ArgumentTypeError, match=r"identity=\(1.0,\) is not a value of the kernel, a tuple of 2 "
                                                r"\(float64, int64\)"):
        reduce(0, value_at, np.zeros(3), op=minloc, identity=(1.0,))


def test_empty_extent_error_quotes_the_op_as_written():
    with pytest.raises(ShapeError, match=r"reduce: op 'MAX' has no identity, so it cannot reduce the empty extent"):
        reduce(0, digit, np.zeros(3), op="MAX")
    with pytest.raises(ArgumentTypeError, match="identity= is for user-defined ops; 'Prod' has its own"):
        reduce(3, digit, np.zeros(3), op="Prod", identity=1)
