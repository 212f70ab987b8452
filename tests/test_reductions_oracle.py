"""reduce, scan and sort on generated operands, against NumPy: values and dtypes.

Operands of every dtype the built-in ops take, of rank 0 to 3 (empty dimensions
included), laid out in C order, Fortran order, with steps (negative too), transposed,
as hetflow Buffers and as views (interior, cshift, transpose, section, a view of a
Buffer). Plain arrays on the CPU take NumPy's own reductions; everything else runs the
generated kernels, on cpu0 in small blocks (so that partials, levels and carries are
exercised), on the simulated gpu0 and co-executed on both (tiny operands there: the
simulator runs one OS thread per GPU thread).
"""
import contextlib
import math
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import hetflow
from hetflow.errors import ShapeError
from hetflow.runtime import reductions

DTYPES = [np.dtype(t) for t in (np.bool_, np.int8, np.uint8, np.int32, np.int64, np.uint64, np.float32,
                                np.float64, np.complex128)]
OPS = {  # op -> the element kinds the docs say it takes
    "sum": "biufc", "prod": "biufc", "min": "biuf", "max": "biuf",
    "and": "biu", "or": "biu", "xor": "biu", "land": "biu", "lor": "biu", "lxor": "biu",
}
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the simulator's int/float overflow


# -- the oracle: NumPy ----------------------------------------------------------------------------
_LOGICAL = {"land": np.logical_and, "lor": np.logical_or, "lxor": np.logical_xor}
_BITWISE = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}


def np_reduce(a, op, axis):
    """NumPy's reduction of ``a`` (a scalar for ``axis=None``); ValueError where NumPy has none."""
    if op in _LOGICAL:
        return _LOGICAL[op].reduce(a != 0, axis=axis)
    if op in _BITWISE:
        return _BITWISE[op].reduce(a.reshape(-1) if axis is None else a, axis=0 if axis is None else axis)
    return {"sum": np.sum, "prod": np.prod, "min": np.min, "max": np.max}[op](a, axis=axis)


def identity(op, dtype):
    """The first element of an exclusive scan, as the docs define it."""
    if op in ("sum", "or", "xor", "lor", "lxor"):
        return 0
    if op in ("prod", "land"):
        return 1
    if op == "and":
        return True if dtype.kind == "b" else np.array(-1).astype(dtype)  # all bits set
    low = op == "max"
    if dtype.kind == "b":
        return not low
    if dtype.kind == "f":
        return -np.inf if low else np.inf
    return np.iinfo(dtype).min if low else np.iinfo(dtype).max


def np_scan(a, op, axis, inclusive):
    """NumPy's cumulative ``op`` of ``a`` (flattened for ``axis=None``), exclusive by shifting."""
    if axis is None:
        a, axis = a.reshape(-1), 0
    if op == "sum":
        inc = np.cumsum(a, axis=axis)
    elif op == "prod":
        inc = np.cumprod(a, axis=axis)
    elif op in _LOGICAL:
        inc = _LOGICAL[op].accumulate(a != 0, axis=axis)
    else:
        inc = {"min": np.minimum, "max": np.maximum, **_BITWISE}[op].accumulate(a, axis=axis)
    if inclusive:
        return inc
    out = np.empty_like(inc)
    moved = np.moveaxis(out, axis, 0)
    if moved.shape[0]:
        moved[0] = identity(op, a.dtype)
        moved[1:] = np.moveaxis(inc, axis, 0)[:-1]
    return out


def assert_matches(got, want, op, a):
    """``got`` is NumPy's ``want``: the same kind (scalar or array), dtype, shape and
    values; exact but for float and complex sums and products, which only round
    differently (scale: the magnitudes of ``a``'s finite elements)."""
    assert isinstance(got, np.ndarray) == isinstance(want, np.ndarray), (type(got), type(want))
    if not isinstance(want, np.ndarray):
        assert type(got) is type(want), (type(got), type(want))
    got, want = np.asarray(got), np.asarray(want)
    assert (got.dtype, got.shape) == (want.dtype, want.shape)
    if op in ("sum", "prod") and want.dtype.kind in "fc":
        size = abs(np.asarray(a, dtype=np.complex128).reshape(-1))
        size = size[np.isfinite(size)]
        scale = size.sum() if op == "sum" else np.maximum(size, 1).prod()
        rtol = 1e-5 if want.dtype.itemsize == 4 else 1e-12
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale)
    else:
        np.testing.assert_array_equal(got, want)  # NaNs where NumPy has them


# -- operands -----------------------------------------------------------------------------------
def elements(dtype):
    """Every integer (so sums and products wrap); floats whose sums and products stay in
    range in any grouping, with the specials (NaN, +-inf, -0.0)."""
    if dtype.kind == "f":
        width = 8 * dtype.itemsize
        return st.one_of(st.floats(0.5, 2, width=width), st.floats(-2, -0.5, width=width),
                         st.sampled_from([0.0, -0.0, 1.0, np.inf, -np.inf, np.nan]))
    if dtype.kind == "c":  # NaN parts, but no infinities: inf * 0 in products depends on grouping
        part = st.sampled_from([-2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, np.nan])
        return st.builds(complex, part, part)
    return None  # hypothesis' default: the whole range


def host_layouts(rank):
    """Names of the layouts an operand of ``rank`` can be given in as an array (no views)."""
    return ["C", "F", "steps", "swapped", "buffer"] if rank else ["C", "buffer"]


def view_layouts(shape):
    """Names of the views ``a`` can be given as."""
    rank = len(shape)
    names = ["interior", "buffer interior", "section"] if rank else []
    if rank and shape[-1]:
        names.append("cshift")
    if rank >= 2:
        names.append("transpose")
    return names


def laid_out(a, layout, draw):
    """``a`` (a NumPy array) given as ``layout``: an operand whose elements are ``a``'s."""
    rank = a.ndim
    if layout == "C":
        return a
    if layout == "F":
        return np.asfortranarray(a)
    if layout == "steps":  # every other element of a larger array, some axes backwards
        steps = [draw(st.sampled_from([2, -2])) for _ in range(rank)]
        big = np.ones(tuple(2 * n for n in a.shape), a.dtype)
        where = tuple(slice(None, None, s) for s in steps)
        big[where] = a
        return big[where]
    if layout == "swapped":
        return np.swapaxes(np.ascontiguousarray(np.swapaxes(a, 0, -1)), 0, -1)
    if layout == "buffer":
        return hetflow.array(a)
    if layout in ("interior", "buffer interior"):
        padded = np.pad(a, 1, constant_values=1)
        return hetflow.interior(hetflow.array(padded) if layout == "buffer interior" else padded, 1)
    if layout == "section":
        big = np.pad(a, [(1, 2)] * rank, constant_values=1)
        return hetflow.section(big, (1,) * rank, a.shape)
    if layout == "cshift":
        shift = draw(st.integers(-3, 3))
        return hetflow.cshift(np.roll(a, shift, axis=rank - 1), rank - 1, shift)
    assert layout == "transpose"
    return hetflow.transpose(np.ascontiguousarray(np.swapaxes(a, 0, 1)), 0, 1)


@st.composite
def shapes(draw, min_rank, max_rank, max_side, max_size):
    """Shapes of at most ``max_size`` elements; sides of up to ``max_side`` (rows of 8 and
    more take the CPU's four interleaved folds), 0 included."""
    shape = []
    for _ in range(draw(st.integers(min_rank, max_rank))):
        shape.append(draw(st.integers(0, min(max_side, max_size // max(math.prod(shape), 1)))))
    return tuple(shape)


@st.composite
def cases(draw, views, min_rank=0, max_rank=3, max_side=10, max_size=64, dtypes=DTYPES, ops=tuple(OPS)):
    """(operand, its NumPy array, op, axis): arrays in host layouts, or (``views``) views."""
    dtype = draw(st.sampled_from(dtypes))
    op = draw(st.sampled_from([o for o in ops if dtype.kind in OPS[o]]))
    shape = draw(shapes(max(min_rank, 1 if views else 0), max_rank, max_side, max_size))
    a = draw(hnp.arrays(dtype, shape, elements=elements(dtype)))
    layouts = view_layouts(shape) if views else host_layouts(len(shape))
    x = laid_out(a, draw(st.sampled_from(layouts)), draw)
    axis = draw(st.sampled_from([None, *range(-len(shape), len(shape))]))
    return x, a, op, axis


@contextlib.contextmanager
def cpu_blocks(small=True):
    """``small``: blocks of a few elements on the CPU, so that small operands fold several
    blocks and levels; else the CPU's own (one block, in four interleaved folds)."""
    small_blocks = {"cpu": reductions.Blocking(grain=2, most=5)} if small else {}
    with mock.patch.dict(reductions.BLOCKING, small_blocks):
        yield


def check_reduce(x, a, op, axis, device=None):
    try:
        want = np_reduce(a, op, axis)
    except ValueError:  # min or max of nothing: NumPy has no identity
        with pytest.raises(ShapeError, match=f"reduce: op '{op}' has no identity, so it cannot reduce an empty"):
            hetflow.reduce(x, op, axis=axis, device=device)
        return
    assert_matches(hetflow.reduce(x, op, axis=axis, device=device), want, op, a)


def check_scan(x, a, op, axis, inclusive, device=None):
    got = hetflow.scan(x, op, axis=axis, inclusive=inclusive, device=device)
    assert_matches(got, np_scan(a, op, axis, inclusive), op, a)


# -- reduce and scan ------------------------------------------------------------------------------
@settings(max_examples=250, **SETTINGS)
@given(cases(views=False), st.booleans())
def test_reduce_and_scan_of_arrays_match_numpy(case, inclusive):
    x, a, op, axis = case
    check_reduce(x, a, op, axis)
    check_scan(x, a, op, axis, inclusive)


@settings(max_examples=20, **SETTINGS)
@given(cases(views=True), st.booleans(), st.booleans())
def test_reduce_and_scan_of_views_match_numpy(case, inclusive, small):
    x, a, op, axis = case
    with cpu_blocks(small):
        check_reduce(x, a, op, axis)
        check_scan(x, a, op, axis, inclusive)


TINY = dict(max_rank=2, max_side=3, max_size=6)  # operands for the simulated GPU
DEVICES = {"default": None, "gpu0": "gpu0", "cpu0+gpu0": ["cpu0", "gpu0"]}


@pytest.mark.simgpu
@settings(max_examples=12, **SETTINGS)
@given(st.one_of(cases(views=False, **TINY), cases(views=True, **TINY)), st.booleans())
def test_reduce_and_scan_on_the_gpu_match_numpy(case, inclusive):
    x, a, op, axis = case
    check_reduce(x, a, op, axis, device="gpu0")
    check_scan(x, a, op, axis, inclusive, device="gpu0")


@pytest.mark.simgpu
@settings(max_examples=12, **SETTINGS)
@given(st.one_of(cases(views=False, **TINY), cases(views=True, **TINY)), st.booleans())
def test_reduce_and_scan_on_cpu_and_gpu_together_match_numpy(case, inclusive):
    x, a, op, axis = case
    with cpu_blocks():
        check_reduce(x, a, op, axis, device=["cpu0", "gpu0"])
        check_scan(x, a, op, axis, inclusive, device=["cpu0", "gpu0"])


@pytest.mark.simgpu
@pytest.mark.parametrize("where", sorted(DEVICES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op", ["min", "max"])
def test_nan_wins_wherever_it_is(op, dtype, where):
    """Min and max of floats with one NaN are NaN (as NumPy's), whichever block, lane or
    GPU thread the NaN falls to; the prefixes before it are not."""
    n = {"default": 13, "gpu0": 6, "cpu0+gpu0": 9}[where]
    for at in range(n):
        a = np.linspace(-2, 2, n, dtype=dtype)[::-1].copy()
        a[at] = np.nan
        for small in (True, False):
            with cpu_blocks(small):
                check_reduce(hetflow.interior(np.pad(a, 1), 1), a, op, None, DEVICES[where])
                check_scan(hetflow.cshift(np.roll(a, 1), 0, 1), a, op, None, True, DEVICES[where])


# -- map-reduce: the kernel form ------------------------------------------------------------------
@hetflow.kernel
def element_1d(i, x):
    return x[i]


@hetflow.kernel
def element_2d(i, j, x):
    return x[i, j]


@pytest.mark.simgpu
@settings(max_examples=25, **SETTINGS)
@given(st.data(), st.sampled_from(sorted(DEVICES)), st.booleans())
def test_map_reduce_of_elements_matches_numpy(data, where, small):
    """The fold of the values a kernel returns is NumPy's reduction of those values."""
    sizes = TINY if where != "default" else dict(max_rank=2, max_side=20, max_size=40)
    x, a, op, _ = data.draw(cases(views=data.draw(st.booleans()), min_rank=1, **sizes))
    kernel = element_1d if a.ndim == 1 else element_2d
    try:
        want = np_reduce(a, op, None)
    except ValueError:
        with pytest.raises(ShapeError, match=f"reduce: op '{op}' has no identity, so it cannot reduce the empty"):
            hetflow.reduce(a.shape, kernel, x, op=op, device=DEVICES[where])
        return
    with cpu_blocks(small):
        assert_matches(hetflow.reduce(a.shape, kernel, x, op=op, device=DEVICES[where]), want, op, a)


# -- sort --------------------------------------------------------------------------------------
def order_key(v):
    """NumPy's ascending order of one element: NaN last, -0.0 equal to 0.0; complex
    numbers by where their NaNs are (none, imaginary, real, both), then by their parts."""
    if isinstance(v, complex):
        (re_nan, re), (im_nan, im) = order_key(v.real), order_key(v.imag)
        return re_nan, im_nan, re, im
    return (1, 0.0) if v != v else (0, v)


def stable_sorted(a, axis, descending, key=lambda v: v):
    """A stable sort of ``a`` along ``axis`` (None: flattened) by Python's ``sorted``,
    whose ``reverse`` keeps equal elements in their order too."""
    if axis is None:
        a, axis = a.reshape(-1), 0
    lanes = np.moveaxis(a, axis, -1)
    out = np.empty_like(lanes)
    for outer in np.ndindex(lanes.shape[:-1]):
        lane = lanes[outer]
        order = sorted(range(lane.size), key=lambda k: order_key(key(lane[k].item())), reverse=descending)
        out[outer] = lane[order]
    return np.moveaxis(out, -1, axis)


@hetflow.kernel
def mod3(a):
    return a % 3


def assert_same_elements(got, want):
    """Bit for bit: -0.0 and 0.0 where they were, NaNs in place."""
    assert isinstance(got, np.ndarray) and (got.dtype, got.shape) == (want.dtype, want.shape)
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes(), (got, want)


@pytest.mark.simgpu
@settings(max_examples=60, **SETTINGS)
@given(st.data(), st.sampled_from(sorted(DEVICES)), st.booleans(), st.booleans())
def test_sort_matches_a_stable_sort(data, where, views, descending):
    """Ascending: NumPy's order (NaN last); descending: its reverse (NaN first), equal
    elements in their order both ways."""
    x, a, _, axis = data.draw(cases(views=views, **(TINY if where != "default" else {})))
    if axis is None and data.draw(st.booleans()):
        axis = -1  # sort's default
    if axis is not None and a.ndim == 0:
        with pytest.raises(ShapeError, match="sort: axis -?\\d is out of range for an operand of rank 0"):
            hetflow.sort(x, axis=axis, descending=descending, device=DEVICES[where])
        return
    got = hetflow.sort(x, axis=axis, descending=descending, device=DEVICES[where])
    assert_same_elements(got, stable_sorted(a, axis, descending))


@settings(max_examples=25, **SETTINGS)
@given(st.data(), st.booleans())
def test_sort_by_key_is_stable(data, descending):
    # not uint64: Numba computes uint64 % 3 (an int64) in float64, rounding the keys
    keyed = [d for d in DTYPES if d.kind in "iuf" and d != np.uint64]
    x, a, _, axis = data.draw(cases(views=data.draw(st.booleans()), dtypes=keyed))
    got = hetflow.sort(x, axis=axis, descending=descending, key=mod3)
    assert_same_elements(got, stable_sorted(a, axis, descending, key=lambda v: v % 3))


# -- user-defined operations ----------------------------------------------------------------------
@hetflow.kernel
def plus(a, b):
    """Commutative; in the element type, so it wraps as NumPy's add in that type."""
    return a + b


@hetflow.kernel
def first_nonzero(a, b):
    """Associative, not commutative: its folds must keep index order."""
    return a if a != 0 else b


USER_OPS = {  # name -> (kernel, commutative, the same op on NumPy scalars of the element type)
    "plus": (plus, True, lambda a, b: np.add(a, b, dtype=a.dtype)),
    "first_nonzero": (first_nonzero, False, lambda a, b: a if a != 0 else b),
}


def folds(lane, fn, start=None):
    """The prefixes of the left fold of ``lane`` by ``fn``, one element at a time, from
    ``start`` (None: from the first element)."""
    out, acc = [], start
    for v in lane:
        acc = v if acc is None else fn(acc, v)
        out.append(acc)
    return out


def sequential_scan(a, fn, axis, inclusive, identity=0):
    """The prefixes of ``a`` by ``fn`` along ``axis`` (None: flattened), exclusive ones
    starting from ``identity``."""
    if axis is None:
        a, axis = a.reshape(-1), 0
    lanes = np.moveaxis(a, axis, -1)
    out = np.empty_like(lanes)
    start = a.dtype.type(identity)
    for outer in np.ndindex(lanes.shape[:-1]):
        lane = lanes[outer]
        out[outer] = folds(lane, fn) if inclusive else ([start] + folds(lane, fn, start))[:lane.size]
    return np.moveaxis(out, -1, axis)


def sequential_reduce(a, fn, axis):
    """The last prefix (a NumPy scalar for ``axis=None`` and for rank 1); ``a`` not empty."""
    prefixes = sequential_scan(a, fn, axis, True)
    return prefixes[-1] if axis is None else np.take(prefixes, -1, axis=axis)


@pytest.mark.simgpu
@settings(max_examples=30, **SETTINGS)
@given(st.data(), st.sampled_from(sorted(USER_OPS)), st.sampled_from(sorted(DEVICES)), st.booleans())
def test_user_ops_match_a_sequential_fold(data, name, where, inclusive):
    kernel, commutative, fn = USER_OPS[name]
    ints = [np.dtype(t) for t in (np.int8, np.int32, np.uint64)]
    x, a, _, axis = data.draw(cases(views=data.draw(st.booleans()), min_rank=1, dtypes=ints,
                                    **(TINY if where != "default" else {})))
    device = DEVICES[where]
    with cpu_blocks(data.draw(st.booleans())), np.errstate(over="ignore"):
        if a.size:
            got = hetflow.reduce(x, kernel, axis=axis, device=device, commutative=commutative)
            assert_matches(got, sequential_reduce(a, fn, axis), name, a)
        got = hetflow.scan(x, kernel, axis=axis, inclusive=inclusive, device=device, identity=0)
        assert_matches(got, sequential_scan(a, fn, axis, inclusive), name, a)
