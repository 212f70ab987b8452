"""The reduce, scan and sort call sites: oracle NumPy, or a sequential Python fold."""
import itertools

import numpy as np
import pytest

import hetflow
from hetflow import cshift, interior, reduce, scan, section, sort, tile, transpose
from hetflow.errors import ArgumentError, ArgumentTypeError, KernelCompileError, ShapeError
from hetflow.runtime import reductions
from hetflow.runtime.reductions import Blocking

RNG = np.random.default_rng(1234)


# -- user-defined operations and keys ---------------------------------------------------------
@hetflow.kernel
def maxabs(a, b):
    return a if abs(a) >= abs(b) else b


@hetflow.kernel
def leftmost_nonzero(a, b):
    """Associative, not commutative."""
    return a if a != 0 else b


@hetflow.kernel
def affine(p, q):
    """Composition of affine maps x -> re*x + im (apply p, then q): associative, not
    commutative; exact in floating point for re in {1, -1} and small integer im."""
    return complex(p.real * q.real, q.real * p.imag + q.imag)


@hetflow.kernel
def leftmost_max(a, b):
    """Structured elements: the record with the largest 'v', the left-most on ties."""
    return a if a["v"] >= b["v"] else b


@hetflow.kernel
def by_v(a):
    return a["v"]


@hetflow.kernel
def mod3(a):
    return a % 3


@hetflow.kernel
def as_pair(a):
    return (a, a)


@hetflow.kernel
def adds_text(a, b):
    return a + "x"


@hetflow.kernel
def one_param(a):
    return a


@hetflow.kernel
def three_params(a, b, c):
    return a + b + c


RECORD = np.dtype([("v", np.int32), ("tag", np.int64)])


def fold(fn, values):
    """Sequential left fold and its prefixes: the oracle for user-defined ops."""
    return list(itertools.accumulate(values, fn))


def affine_py(p, q):
    return complex(p.real * q.real, q.real * p.imag + q.imag)


def leftmost_nonzero_py(a, b):
    return a if a != 0 else b


def affine_data(n, seed=0):
    r = np.random.default_rng(seed)
    return r.choice([1.0, -1.0], n) + 1j * r.integers(-3, 4, n)


def records(n, seed=0):
    r = np.random.default_rng(seed)
    out = np.empty(n, RECORD)
    out["v"] = r.integers(0, 4, n)  # many ties
    out["tag"] = np.arange(n)
    return out


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of a few elements on the CPU, so small inputs take the multi-block paths
    (partials, several combine levels, carries between scan blocks)."""
    monkeypatch.setitem(reductions.BLOCKING, "cpu", Blocking(grain=2, most=5))


# -- oracles for built-in operations ---------------------------------------------------------
def np_reduce(x, op, axis):
    if op in ("and", "or", "xor"):
        names = {"and": "all", "or": "any"}
        if x.dtype == bool and op in names:
            return getattr(np, names[op])(x, axis=axis)
        ufunc = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}[op]
        if x.dtype == bool:
            ufunc = np.logical_xor
        return ufunc.reduce(x, axis=axis)
    return {"sum": np.sum, "prod": np.prod, "min": np.min, "max": np.max}[op](x, axis=axis)


IDENTITY = {"sum": 0, "prod": 1, "or": 0, "xor": 0}


def np_scan(x, op, axis, inclusive):
    if axis is None:
        x, axis = x.reshape(-1), 0
    if op == "sum":
        inc = np.cumsum(x, axis=axis)
    elif op == "prod":
        inc = np.cumprod(x, axis=axis)
    else:
        ufunc = {"min": np.minimum, "max": np.maximum, "and": np.bitwise_and, "or": np.bitwise_or,
                 "xor": np.bitwise_xor}[op]
        if x.dtype == bool and op in ("and", "or", "xor"):
            ufunc = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}[op]
        inc = ufunc.accumulate(x, axis=axis)
    if inclusive:
        return inc
    first = np.take(inc, [0], axis=axis) if inc.shape[axis] else inc
    if op in IDENTITY:
        ident = IDENTITY[op]
    elif op == "and":
        ident = True if x.dtype == bool else np.array(-1).astype(x.dtype)
    elif x.dtype.kind == "f":
        ident = np.inf if op == "min" else -np.inf
    else:
        info = np.iinfo(x.dtype) if x.dtype != bool else None
        ident = (op == "min") if info is None else (info.max if op == "min" else info.min)
    head = np.full_like(first, ident) if inc.shape[axis] else first
    rest = np.take(inc, np.arange(inc.shape[axis] - 1), axis=axis)
    return np.concatenate([head, rest], axis=axis)


def data(shape, dtype, seed=0):
    r = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return r.random(shape) < 0.7
    if dtype.kind in "iu":
        lo = 0 if dtype.kind == "u" else -3
        return r.integers(lo, 4, shape).astype(dtype)
    if dtype.kind == "c":
        return (r.random(shape) + 1j * r.random(shape)).astype(dtype)
    return (r.random(shape) + 0.5).astype(dtype)  # products stay in range


def close(got, want, dtype):
    want = np.asarray(want)
    got_a = np.asarray(got)
    assert got_a.shape == want.shape
    assert got_a.dtype == want.dtype, (got_a.dtype, want.dtype)
    if np.dtype(dtype).kind in "fc":
        rtol = 1e-4 if np.dtype(dtype).itemsize <= 4 or np.dtype(dtype) == np.complex64 else 1e-10
        np.testing.assert_allclose(got_a, want, rtol=rtol)
    else:
        np.testing.assert_array_equal(got_a, want)


OPS_FOR = {
    "b": ["sum", "prod", "min", "max", "and", "or", "xor"],
    "i": ["sum", "prod", "min", "max", "and", "or", "xor"],
    "u": ["sum", "prod", "min", "max", "and", "or", "xor"],
    "f": ["sum", "prod", "min", "max"],
    "c": ["sum", "prod"],
}
DTYPES = [bool, np.int8, np.int32, np.uint16, np.int64, np.float32, np.float64, np.complex128]
CASES = [(dt, op) for dt in DTYPES for op in OPS_FOR[np.dtype(dt).kind]]


# -- reduce: arrays (NumPy's reductions on the CPU) ----------------------------------------------
@pytest.mark.parametrize("dtype,op", CASES)
@pytest.mark.parametrize("shape", [(1,), (7,), (5, 3), (3, 4, 5)])
def test_reduce_builtin_over_arrays_all_axes(dtype, op, shape):
    x = data(shape, dtype)
    for axis in [None, *range(len(shape)), -1]:
        close(reduce(x, op, axis=axis), np_reduce(x, op, axis), dtype)


@pytest.mark.parametrize("dtype,op", [c for c in CASES if c[1] not in ("min", "max")])
def test_reduce_of_empty_gives_the_identity(dtype, op):
    x = np.zeros(0, dtype)
    close(reduce(x, op), np_reduce(x, op, None), dtype)
    y = np.zeros((0, 3), dtype)
    close(reduce(y, op, axis=0), np_reduce(y, op, 0), dtype)


def test_reduce_of_a_rank0_array_is_its_element():
    assert reduce(np.array(2.5), "max") == 2.5
    assert reduce(np.array(3, np.int8), "sum").dtype == np.sum(np.array(3, np.int8)).dtype


def test_reduce_propagates_nan_like_numpy():
    x = np.array([1.0, np.nan, -2.0, 5.0])
    assert np.isnan(reduce(x, "min")) and np.isnan(reduce(interior(x, 1), "max"))


# -- reduce: views (compiled, no copy) -------------------------------------------------------------
def views_of(a):
    """(view, its NumPy meaning) for the four view kinds the tests cover."""
    return [
        (interior(a, 1), a[1:-1, 1:-1]),
        (cshift(a, 1, 4), np.roll(a, -4, axis=1)),
        (transpose(a, 0, 1), a.T),
        (section(a, (1, 2), (4, 3)), a[1:5, 2:5]),
    ]


@pytest.mark.parametrize("which", range(4), ids=["interior", "cshift", "transpose", "section"])
def test_reduce_builtin_over_views_every_axis(which):
    a = data((6, 7), np.float64, seed=which)
    view, meaning = views_of(a)[which]
    for op, axis in [("sum", None), ("min", 0), ("sum", 1)]:
        close(reduce(view, op, axis=axis), np_reduce(meaning, op, axis), np.float64)


@pytest.mark.parametrize("dtype,op", [(np.int32, o) for o in OPS_FOR["i"]] + [(bool, o) for o in OPS_FOR["b"]]
                         + [(np.uint16, "xor"), (np.complex128, "prod")])
def test_reduce_every_builtin_over_a_wrapping_cshift(dtype, op):
    a = data((5, 9), dtype, seed=3)
    close(reduce(cshift(a, 0, 2), op), np_reduce(np.roll(a, -2, axis=0), op, None), dtype)


def test_reduce_views_in_several_blocks(small_blocks):
    a = data((9, 11), np.int64, seed=5)
    for view, meaning in views_of(a):
        close(reduce(view, "sum"), meaning.sum(), np.int64)
        close(reduce(view, "max"), meaning.max(), np.int64)


def test_float32_sums_of_views_accumulate_in_double():
    a = RNG.random((300, 200)).astype(np.float32)
    got = reduce(interior(a, 2), "sum")
    assert got.dtype == np.float32
    exact = a[2:-2, 2:-2].astype(np.float64).sum()
    assert abs(float(got) - exact) <= 1e-6 * exact


def test_reduce_empty_view_and_empty_axis():
    a = np.ones((2, 5))
    assert reduce(interior(a, 1), "sum") == 0.0
    assert reduce(interior(a.astype(np.int8), 1), "or") == 0
    out = reduce(section(a, (0, 0), (0, 5)), "prod", axis=0)
    np.testing.assert_array_equal(out, np.ones(5))


def test_reduce_does_not_modify_its_operand():
    a = data((6, 7), np.float64)
    before = a.copy()
    reduce(cshift(a, 0, 1), maxabs)
    reduce(a, "sum", axis=1)
    np.testing.assert_array_equal(a, before)


# -- reduce: user-defined operations -----------------------------------------------------------------
def test_commutative_user_op_matches_numpy():
    x = RNG.standard_normal(1001)
    assert reduce(x, maxabs) == x[np.argmax(np.abs(x))]
    a = RNG.standard_normal((7, 5))
    np.testing.assert_array_equal(reduce(a, maxabs, axis=1), a[np.arange(7), np.argmax(np.abs(a), axis=1)])
    np.testing.assert_array_equal(reduce(transpose(a, 0, 1), maxabs, axis=0),
                                  a[np.arange(7), np.argmax(np.abs(a), axis=1)])


@pytest.mark.parametrize("n", [1, 2, 13, 64, 300])
def test_non_commutative_user_ops_keep_index_order(n, small_blocks):
    z = affine_data(n, seed=n)
    assert reduce(z, affine, commutative=False) == fold(affine_py, z)[-1]
    v = np.where(RNG.random(n) < 0.8, 0, RNG.integers(1, 9, n))
    assert reduce(v, leftmost_nonzero, commutative=False) == fold(leftmost_nonzero_py, v)[-1]


def test_non_commutative_user_op_on_many_threads():
    # More elements than the CPU runs inline: the blocks are spread over threads.
    z = affine_data(600_001, seed=7)
    assert reduce(z, affine, commutative=False) == fold(affine_py, z)[-1]


def test_non_commutative_user_op_along_axes_and_over_views(small_blocks):
    z = affine_data(35, seed=2).reshape(5, 7)
    for axis in (0, 1):
        want = np.apply_along_axis(lambda col: fold(affine_py, col)[-1], axis, z)
        np.testing.assert_array_equal(reduce(z, affine, axis=axis, commutative=False), want)
    rolled = np.roll(z, -3, axis=1)
    assert reduce(cshift(z, 1, 3), affine, commutative=False) == fold(affine_py, rolled.ravel())[-1]


def test_user_op_on_structured_elements(small_blocks):
    r = records(29, seed=4)
    best = reduce(r, leftmost_max, commutative=False)
    want = fold(lambda a, b: a if a["v"] >= b["v"] else b, list(r))[-1]
    assert best.dtype == RECORD and (best["v"], best["tag"]) == (want["v"], want["tag"])


def test_user_op_identity_for_empty_inputs():
    assert reduce(np.zeros(0, complex), affine, identity=1 + 0j) == 1 + 0j
    out = reduce(np.zeros((3, 0)), maxabs, axis=1, identity=0.0)
    np.testing.assert_array_equal(out, np.zeros(3))


# -- reduce: bad input -------------------------------------------------------------------------------
def test_unknown_op_names_the_op_and_the_valid_ones():
    with pytest.raises(ArgumentError, match=r"unknown op 'mean'.*'sum', 'prod', 'min', 'max', 'and', "
                                             r"'or', 'xor'"):
        reduce(np.ones(3), "mean")
    with pytest.raises(ArgumentError, match="'add'"):
        scan(np.ones(3), "add")


def test_op_must_be_a_name_or_a_kernel():
    with pytest.raises(ArgumentTypeError, match="op must be one of .* or a hetflow kernel.*@hetflow"):
        reduce(np.ones(3), lambda a, b: a + b)


@pytest.mark.parametrize("op,dtype,words", [("and", np.float64, "float64"), ("xor", np.float32, "float32"),
                                            ("or", np.complex128, "complex128"),
                                            ("min", np.complex128, "complex128"),
                                            ("sum", RECORD, "structured elements")])
def test_op_not_fitting_the_dtype(op, dtype, words):
    with pytest.raises(ArgumentTypeError, match=f"op '{op}' does not apply to .*{words}.*it takes"):
        reduce(np.zeros(3, dtype), op)
    with pytest.raises(ArgumentTypeError, match=f"op '{op}'"):
        scan(np.zeros(3, dtype), op)


@pytest.mark.parametrize("call", [
    lambda x: reduce(x, "sum", axis=2), lambda x: reduce(x, "sum", axis=-3), lambda x: scan(x, "sum", axis=2),
    lambda x: sort(x, axis=5), lambda x: reduce(interior(x, 1), "max", axis=2)])
def test_axis_out_of_range(call):
    with pytest.raises(ShapeError, match=r"axis -?\d is out of range for an operand of rank 2 "
                                         r"\(valid: -2..1 or None\)"):
        call(np.ones((4, 3)))


def test_axis_must_be_an_integer():
    with pytest.raises(ShapeError, match="axis must be None or an integer, got 1.5"):
        reduce(np.ones((4, 3)), "sum", axis=1.5)
    with pytest.raises(ShapeError, match="only None is valid"):
        reduce(np.array(1.0), "sum", axis=0)


@pytest.mark.parametrize("bad", [one_param, three_params])
def test_user_op_with_the_wrong_number_of_parameters(bad):
    with pytest.raises(ArgumentTypeError, match=rf"op kernel '{bad.name}' takes {len(bad.params)} "
                                                  r"parameter\(s\).*exactly two"):
        reduce(np.ones(3), bad)


@pytest.mark.parametrize("op", ["min", "max", maxabs])
def test_empty_reduction_without_identity(op):
    name = op if isinstance(op, str) else op.name
    with pytest.raises(ShapeError, match=f"op '{name}'.* has no identity, so it cannot reduce an empty op"):
        reduce(np.zeros(0), op)
    with pytest.raises(ShapeError, match="cannot reduce an empty axis 0 of shape"):
        reduce(interior(np.zeros((2, 4)), 1), op, axis=0)


def test_user_op_that_does_not_compile_is_named():
    with pytest.raises(KernelCompileError, match="kernel 'hf_reduce_adds_text_1d'.*failed to compile"):
        reduce(np.ones(4), adds_text)


def test_identity_is_for_user_ops_only():
    with pytest.raises(ArgumentTypeError, match="identity= is for user-defined ops; 'sum' has its own"):
        reduce(np.ones(3), "sum", identity=0)


def test_operand_must_be_an_array_or_a_view():
    with pytest.raises(ArgumentTypeError, match="reduce: expected an array or a view, got list"):
        reduce([1, 2, 3], "sum")
    with pytest.raises(ShapeError, match="view of tiles"):
        reduce(tile(np.ones((4, 4)), (2, 2)), "sum")


@pytest.mark.simgpu
def test_gpu_data_runs_on_one_gpu(gpu_device):
    from numba import cuda

    x = cuda.to_device(np.ones(3))
    with pytest.raises(ArgumentError, match="co-execute host data only"):
        reduce(x, "sum", device=["cpu0", gpu_device.id])


# -- scan -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,op", CASES)
@pytest.mark.parametrize("inclusive", [True, False])
def test_scan_builtin_over_arrays(dtype, op, inclusive):
    for shape in [(0,), (1,), (7,), (4, 5)]:
        x = data(shape, dtype, seed=len(shape))
        for axis in [None, *range(len(shape))]:
            close(scan(x, op, axis=axis, inclusive=inclusive), np_scan(x, op, axis, inclusive), dtype)


@pytest.mark.parametrize("which", range(4), ids=["interior", "cshift", "transpose", "section"])
def test_scan_builtin_over_views(which, small_blocks):
    a = data((6, 7), np.int32, seed=which)
    view, meaning = views_of(a)[which]
    for op, axis, inclusive in [("sum", None, True), ("max", None, False), ("sum", 0, False), ("min", 1, True)]:
        close(scan(view, op, axis=axis, inclusive=inclusive), np_scan(meaning, op, axis, inclusive), np.int32)


def test_scan_every_builtin_over_a_view():
    a = data((5, 6), np.uint16, seed=9)
    for op in OPS_FOR["u"]:
        for inclusive in (True, False):
            close(scan(cshift(a, 0, 1), op, inclusive=inclusive),
                  np_scan(np.roll(a, -1, axis=0), op, None, inclusive), np.uint16)


def test_scan_of_many_elements_on_threads():
    x = RNG.integers(-5, 6, 1_000_003).astype(np.int64)
    view = section(x, (1,), (1_000_000,))
    np.testing.assert_array_equal(scan(view, "sum"), np.cumsum(x[1:1_000_001]))
    np.testing.assert_array_equal(scan(view, "max", inclusive=False)[1:],
                                  np.maximum.accumulate(x[1:1_000_000]))


@pytest.mark.parametrize("n", [1, 2, 11, 40, 200])
def test_scan_non_commutative_user_op(n, small_blocks):
    z = affine_data(n, seed=n)
    want = fold(affine_py, z)
    np.testing.assert_array_equal(scan(z, affine), want)
    np.testing.assert_array_equal(scan(z, affine, inclusive=False, identity=1 + 0j), [1 + 0j] + want[:-1])
    grid = z[: n - n % 4].reshape(4, -1) if n >= 4 else z.reshape(1, -1)
    for axis in (0, 1):
        want = np.apply_along_axis(lambda col: fold(affine_py, col), axis, grid)
        np.testing.assert_array_equal(scan(grid, affine, axis=axis), want)


def test_scan_user_op_over_a_view_writes_a_new_array(small_blocks):
    v = np.where(RNG.random((6, 5)) < 0.7, 0, RNG.integers(1, 9, (6, 5)))
    before = v.copy()
    out = scan(transpose(v, 0, 1), leftmost_nonzero)
    np.testing.assert_array_equal(out, fold(leftmost_nonzero_py, v.T.ravel()))
    assert not np.shares_memory(out, v)
    np.testing.assert_array_equal(v, before)


def test_scan_of_empty_and_rank0():
    assert scan(interior(np.ones((2, 2)), 1), "sum").shape == (0,)
    np.testing.assert_array_equal(scan(np.array(4), "prod"), [4])
    np.testing.assert_array_equal(scan(np.array(4), "prod", inclusive=False), [1])


def test_exclusive_user_scan_needs_an_identity():
    with pytest.raises(ArgumentTypeError, match="exclusive scan with the user op 'affine' needs"):
        scan(affine_data(4), affine, inclusive=False)
    with pytest.raises(ArgumentTypeError, match="identity= is for user-defined ops"):
        scan(np.ones(3), "max", identity=0)


# -- sort -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.int16, np.uint8, np.float64, np.float32, bool])
def test_sort_arrays_like_numpy(dtype):
    x = data((6, 9), dtype, seed=2)
    if np.dtype(dtype).kind == "f":
        x[1, 3] = x[4, 0] = np.nan
    for axis in (-1, 0, 1, None):
        want = np.sort(x, axis=axis)
        np.testing.assert_array_equal(sort(x, axis=axis), want)
        flipped = np.flip(want, axis=0 if axis is None else axis)  # NaN first, as the largest
        np.testing.assert_array_equal(sort(x, axis=axis, descending=True), flipped)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_sort_of_floats_is_stable_for_signed_zeros_and_nan_payloads(dtype):
    # Equal floats that differ in their bits: a stable sort keeps them in input order.
    r = np.random.default_rng(6)
    a = r.choice([0.0, -0.0, 1.5, np.nan, -2.0], 999).astype(dtype)
    uint = np.uint64 if dtype == np.float64 else np.uint32
    bits = a.view(uint)
    nan = np.isnan(a)
    bits[nan] |= r.integers(0, 1 << 16, nan.sum()).astype(uint)  # distinct NaN payloads
    for descending in (False, True):
        src = np.flip(a) if descending else a
        want = np.sort(src, kind="stable")  # NumPy's stable sort: the oracle
        want = np.flip(want) if descending else want
        got = sort(a, descending=descending)
        np.testing.assert_array_equal(got.view(uint), want.view(uint))


def test_sort_views_into_new_arrays():
    a = data((6, 7), np.float64, seed=4)
    before = a.copy()
    for view, meaning in views_of(a):
        for axis in (0, 1, None):
            out = sort(view, axis=axis)
            np.testing.assert_array_equal(out, np.sort(meaning, axis=axis))
            assert not np.shares_memory(out, a)
    np.testing.assert_array_equal(a, before)


@pytest.mark.parametrize("descending", [False, True])
def test_sort_by_key_is_stable(descending):
    r = records(41, seed=8)
    got = sort(r, key=by_v, descending=descending)
    want = sorted(r.tolist(), key=lambda e: e[0], reverse=descending)  # Python's sort is stable
    assert got.tolist() == want
    x = RNG.integers(0, 50, (3, 20))
    got = sort(cshift(x, 1, 7), key=mod3, axis=1, descending=descending)
    rolled = np.roll(x, -7, axis=1)
    want = [sorted(row, key=lambda e: e % 3, reverse=descending) for row in rolled.tolist()]
    assert got.tolist() == want


def test_sort_by_key_along_axis_0_and_flattened():
    x = RNG.integers(0, 50, (8, 3))
    got = sort(x, key=mod3, axis=0)
    want = np.array([sorted(col, key=lambda e: e % 3) for col in x.T.tolist()]).T
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(sort(transpose(x, 0, 1), key=mod3, axis=None),
                                  sorted(x.T.ravel().tolist(), key=lambda e: e % 3))


def test_sort_empty():
    assert sort(np.zeros((0, 3)), axis=0).shape == (0, 3)
    assert sort(interior(np.ones((2, 5)), 1), key=mod3).shape == (0, 3)


def test_sort_bad_input():
    with pytest.raises(ArgumentTypeError, match="structured elements have no order of their own; pass key="):
        sort(records(3))
    with pytest.raises(ArgumentTypeError, match="key must be a hetflow kernel of one element, not func"):
        sort(np.ones(3), key=lambda a: a)
    with pytest.raises(ArgumentTypeError, match=r"key kernel 'maxabs' takes 2 parameter\(s\) \(a, b\)"):
        sort(np.ones(3), key=maxabs)
    with pytest.raises(ArgumentTypeError, match="key kernel 'as_pair' returns .* a key must be a number"):
        sort(np.ones(3), key=as_pair)
    with pytest.raises(KernelCompileError, match="key kernel 'by_v' does not compile for elements of dty"):
        sort(np.ones(3), key=by_v)
    with pytest.raises(ShapeError, match="sort: axis -1 is out of range for an operand of rank 0"):
        sort(np.array(1.0))


# -- inside a captured graph ----------------------------------------------------------------------
def test_call_sites_are_recorded_in_a_graph_and_run_with_it():
    from hetflow.errors import ArgumentError
    from hetflow.ir import RuleSet

    a = data((6, 7), np.float64, seed=12)
    with hetflow.graph() as g:
        total = reduce(interior(a, 1), "sum")
        prefix = scan(a, "max", axis=1, inclusive=False)
        ordered = sort(cshift(a, 0, 2), axis=0, descending=True)
        with pytest.raises(ArgumentError, match="no value yet"):
            float(total)
        with pytest.raises(ArgumentError, match="'median'"):
            reduce(a, "median")
    assert [n.op for n in g.current.nodes] == ["reduce", "scan", "sort"]
    g.run(rules=RuleSet())
    assert np.isclose(float(total), a[1:-1, 1:-1].sum(), rtol=1e-12)
    np.testing.assert_array_equal(prefix.result(), np_scan(a, "max", 1, False))
    np.testing.assert_array_equal(ordered.result(), np.flip(np.sort(np.roll(a, -2, axis=0), axis=0), axis=0))


# -- the simulated GPU (tiny launches) ---------------------------------------------------------------
@pytest.mark.simgpu
def test_simulated_gpu_reduce(gpu_device):
    x = data((13,), np.int32, seed=1)
    for op in OPS_FOR["i"]:
        close(reduce(x, op, device=gpu_device), np_reduce(x, op, None), np.int32)
    a = data((4, 5), np.float64)
    close(reduce(cshift(a, 0, 1), "sum", axis=1, device=gpu_device), np.roll(a, -1, 0).sum(1), np.float64)
    close(reduce(transpose(a, 0, 1), "max", device=gpu_device), a.max(), np.float64)


@pytest.mark.simgpu
def test_simulated_gpu_user_ops(gpu_device):
    z = affine_data(17, seed=3)
    assert reduce(z, affine, commutative=False, device=gpu_device) == fold(affine_py, z)[-1]
    x = RNG.standard_normal(15)
    assert reduce(interior(x, 1), maxabs, device=gpu_device) == x[1:-1][np.argmax(np.abs(x[1:-1]))]
    np.testing.assert_array_equal(scan(z, affine, device=gpu_device), fold(affine_py, z))


@pytest.mark.simgpu
def test_simulated_gpu_scan_and_sort(gpu_device):
    a = data((3, 5), np.int64, seed=6)
    close(scan(interior(a, (0, 1)), "sum", device=gpu_device), np.cumsum(a[:, 1:-1]), np.int64)
    close(scan(a, "min", axis=0, inclusive=False, device=gpu_device), np_scan(a, "min", 0, False), np.int64)
    got = sort(cshift(a, 1, 2), key=mod3, descending=True, device=gpu_device)
    want = [sorted(row, key=lambda e: e % 3, reverse=True) for row in np.roll(a, -2, axis=1).tolist()]
    assert got.tolist() == want


# -- a real GPU (CuPy data stays on the GPU) ------------------------------------------------------------
@pytest.fixture
def cp():
    from hetflow.cuda_compat import cupy_module

    module = cupy_module()
    if module is None:
        pytest.skip("needs CuPy")
    return module


@pytest.mark.gpu
def test_gpu_reduce_cupy_arrays_and_views(cp):
    for dtype, op in CASES:
        if np.dtype(dtype).kind == "c":
            continue
        x = data((37, 29), dtype, seed=5)
        d = cp.asarray(x)
        for axis in (None, 0, 1):
            got = reduce(d, op, axis=axis)
            assert isinstance(got, cp.ndarray)
            close(got.get(), np_reduce(x, op, axis), dtype)
        close(reduce(cshift(d, 1, 3), op).get(), np_reduce(np.roll(x, -3, 1), op, None), dtype)
    big = RNG.random(3_000_001).astype(np.float32)
    got = float(reduce(interior(cp.asarray(big), 1), "sum").get())
    assert abs(got - big[1:-1].astype(np.float64).sum()) <= 1e-5 * got


@pytest.mark.gpu
def test_gpu_user_ops(cp):
    z = affine_data(200_001, seed=11)
    assert complex(reduce(cp.asarray(z), affine, commutative=False).get()) == fold(affine_py, z)[-1]
    x = RNG.standard_normal(1_000_003)
    assert float(reduce(cp.asarray(x), maxabs).get()) == x[np.argmax(np.abs(x))]
    np.testing.assert_array_equal(scan(cp.asarray(z), affine).get(), fold(affine_py, z))
    assert reduce(z, affine, commutative=False, device="gpu0") == fold(affine_py, z)[-1]  # host data


@pytest.mark.gpu
def test_gpu_scan_and_sort(cp):
    x = RNG.integers(-9, 10, (300, 401)).astype(np.int32)
    d = cp.asarray(x)
    for op in ("sum", "max", "xor"):
        for axis in (None, 0, 1):
            for inclusive in (True, False):
                close(scan(d, op, axis=axis, inclusive=inclusive).get(), np_scan(x, op, axis, inclusive),
                      np.int64 if op == "sum" else np.int32)
    close(scan(interior(d, 1), "sum").get(), np.cumsum(x[1:-1, 1:-1]), np.int64)
    for axis in (-1, 0, None):
        np.testing.assert_array_equal(sort(d, axis=axis).get(), np.sort(x, axis=axis))
        np.testing.assert_array_equal(sort(transpose(d, 0, 1), axis=axis, descending=True).get(),
                                      np.flip(np.sort(x.T, axis=axis), axis=0 if axis is None else axis))
    got = sort(d, key=mod3, axis=1, descending=True).get()
    assert got.tolist() == [sorted(row, key=lambda e: e % 3, reverse=True) for row in x.tolist()]


@pytest.mark.gpu
def test_gpu_data_on_a_cpu_device_is_refused(cp):
    with pytest.raises(ArgumentError, match="lives on a GPU but device cpu0 is a CPU"):
        reduce(cp.ones(3), "sum", device="cpu0")


# -- reduce(x, op, axis, device): by position or by keyword -----------------------------------
def test_positional_axis_keeps_the_keyword_device():
    x = RNG.random((3, 4))
    np.testing.assert_allclose(reduce(x, "sum", 0, device="cpu0"), x.sum(axis=0))
    np.testing.assert_allclose(reduce(x, "sum", 1, "cpu0"), x.sum(axis=1))
    with pytest.raises(hetflow.errors.DeviceError, match="no device with id 'no-such-device'"):
        reduce(x, "sum", 0, device="no-such-device")


@pytest.mark.parametrize("args, kwargs, message", [
    ((0,), dict(axis=1), r"reduce\(\) got axis twice \(0 by position and axis=1\)"),
    ((None,), dict(axis=1), r"reduce\(\) got axis twice \(None by position and axis=1\)"),
    ((0, "cpu0"), dict(device="cpu0"), r"reduce\(\) got device twice \('cpu0' by position and device='cpu0'\)"),
])
def test_an_argument_given_by_position_and_keyword_is_refused(args, kwargs, message):
    x = RNG.random((3, 4))
    with pytest.raises(ArgumentTypeError, match=message):
        reduce(x, "sum", *args, **kwargs)
    with pytest.raises(ArgumentTypeError, match=message), hetflow.graph():
        reduce(x, "sum", *args, **kwargs)


def test_regrouped_products_can_overflow_where_the_sequential_fold_does_not():
    """As docs/guide/reductions.md says: a block's partial product overflows to inf,
    and 0 * inf is NaN, where NumPy's sequential fold stays 0."""
    x = np.concatenate([[1.0, 0.0], np.full(600, 1e200), [1.0]])
    with np.errstate(over="ignore", invalid="ignore"):
        assert np.prod(x[1:-1]) == 0.0
        assert np.isnan(reduce(interior(x, 1), "prod", device="cpu0"))


# -- found by tests/test_reductions_oracle.py ----------------------------------------------------------
@pytest.mark.parametrize("axis", [None, 0, -1])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_of_a_buffer_is_numpy_sort_of_its_contents(axis, descending):
    """A hetflow.array Buffer is sorted as the array it holds (it has no reshape, no ==)."""
    a = np.array([[3.0, -0.0, np.nan, 1.0], [0.0, 2.0, -1.0, np.nan], [1.0, 1.0, -0.0, 0.0]])
    got = sort(hetflow.array(a), axis=axis, descending=descending)
    flat, ax = (a.reshape(-1), 0) if axis is None else (a, axis)
    want = np.sort(flat, axis=ax, kind="stable")
    if descending:  # equal elements (0.0, -0.0) in their order, NaNs first
        want = np.flip(np.sort(np.flip(flat, ax), axis=ax, kind="stable"), ax)
    assert got.tobytes() == want.tobytes()
    np.testing.assert_array_equal(sort(hetflow.array(a), axis=axis, key=mod3),
                                  sort(a, axis=axis, key=mod3))


@pytest.mark.parametrize("call, message", [
    (lambda: reduce(np.zeros(0), "MAX"), "reduce: op 'MAX' has no identity"),
    (lambda: reduce(np.zeros((2, 0)), "Min", axis=1), "reduce: op 'Min' has no identity"),
    (lambda: reduce(np.ones(3), "SUM", identity=0), "reduce: identity= is for user-defined ops; 'SUM' has"),
    (lambda: scan(np.ones(3, int), "Band", identity=0), "scan: identity= is for user-defined ops; 'Band' has"),
])
def test_errors_quote_the_op_as_it_was_written(call, message):
    with pytest.raises(ArgumentError, match=message):
        call()


@pytest.mark.parametrize("call", [lambda x: reduce(x, "sum", axis=True), lambda x: scan(x, "max", axis=True),
                                  lambda x: sort(x, axis=False)])
def test_a_bool_is_no_axis(call):
    """NumPy refuses axis=True; it must not be taken as axis 1."""
    with pytest.raises(ShapeError, match=r"(reduce|scan|sort): axis must be None or an integer, got (True|False)"):
        call(np.arange(6).reshape(2, 3))


@pytest.mark.parametrize("call, message", [
    (lambda: reduce(np.zeros(0, np.int32), maxabs, identity=1.5), "reduce: identity=1.5 is not an element of "
                                                                   "dtype int32"),
    (lambda: reduce(np.zeros(0, np.uint8), maxabs, identity=-1), "reduce: identity=-1 is not an element of dtype "
                                                                 "uint8"),
    (lambda: reduce(np.zeros(0), maxabs, identity="x"), "reduce: identity='x' is not an element of dtype float64"),
    (lambda: reduce(np.zeros(0), maxabs, identity=[0.0]), r"reduce: identity=\[0.0\] is not an element"),
    (lambda: scan(np.ones(3, np.int8), leftmost_nonzero, inclusive=False, identity=300),
     "scan: identity=300 is not an element of dtype int8"),
    (lambda: scan(np.ones(3, np.int64), leftmost_nonzero, inclusive=False, identity=0.5),
     "scan: identity=0.5 is not an element of dtype int64"),
])
def test_an_identity_that_is_no_element_is_refused(call, message):
    """It was truncated (1.5 -> 1, silently) or raised NumPy's own OverflowError / ValueError."""
    with pytest.raises(ArgumentTypeError, match=message):
        call()


def test_an_identity_is_converted_to_the_element_type():
    got = reduce(np.zeros(0, np.int32), maxabs, identity=True)
    assert got == 1 and got.dtype == np.int32
    out = scan(np.array([0, 0, 3, 0], np.int8), leftmost_nonzero, inclusive=False, identity=0)
    assert out.dtype == np.int8 and out.tolist() == [0, 0, 0, 3]
