"""Random programs over co-execution, wavefronts and atomics against sequential oracles.

Co-executed launches (cpu0 + the simulated gpu0, tiny chunks so that the workers steal)
of kernels drawn from a small set, over extents of rank 1-3 (0, 1, primes, fewer rows
than workers), with arguments that are NumPy arrays, hetflow arrays and interior views
of either, equal NumPy's result, and run every index exactly once. Wavefronts of random
tiles over rectangular grids equal the sequential row-major loop. Atomics of every
element type equal NumPy on cpu0, the simulated GPU, co-executed and as plain Python.
"""
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numba.cuda.simulator.kernelapi import FakeCUDAAtomic

import hetflow
from hetflow import atomic, co_map, cshift, interior, section
from hetflow.kernels import atomic as atomic_impl
from hetflow.runtime import staging
from hetflow.runtime import wavefront as wavefront_rt

SLOW = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
BOTH = ["cpu0", "gpu0"]


# -- co-execution: random kernels, extents and arguments ------------------------------------
@hetflow.kernel
def ew1(i, x, out):
    out[i] = 2.0 * x[i] + 1.0


@hetflow.kernel
def ew2(i, j, x, out):
    out[i, j] = 2.0 * x[i, j] + 1.0


@hetflow.kernel
def ew3(i, j, k, x, out):
    out[i, j, k] = 2.0 * x[i, j, k] + 1.0


@hetflow.kernel
def guard1(i, x, out):
    if x[i] > 0.3:
        out[i] = out[i] + x[i]


@hetflow.kernel
def guard2(i, j, x, out):
    if x[i, j] > 0.3:
        out[i, j] = out[i, j] + x[i, j]


@hetflow.kernel
def stencil1(i, left, x, right, out):
    out[i] = left[i] + 10.0 * x[i] - 100.0 * right[i]


@hetflow.kernel
def stencil2(i, j, north, south, west, east, out):
    out[i, j] = north[i, j] + 2.0 * south[i, j] + 3.0 * west[i, j] - east[i, j]


@hetflow.kernel
def rows(i, x, m, out):
    for j in range(m):
        out[i, j] = x[i, j] + j


@hetflow.kernel
def count1(i, hits):
    hits[i] = hits[i] + 1


@hetflow.kernel
def count3(i, j, k, hits):
    hits[i, j, k] = hits[i, j, k] + 1


@hetflow.kernel
def atomic_count2(i, j, hits):
    atomic.add(hits, (i, j), 1)


def _rolled(x, axis, shift):
    return np.roll(x, -shift, axis=axis)


# name -> (rank, kernel, NumPy oracle (x, out) -> new out)
CASES = {
    "ew1": (1, ew1, lambda x, out: 2.0 * x + 1.0),
    "ew2": (2, ew2, lambda x, out: 2.0 * x + 1.0),
    "ew3": (3, ew3, lambda x, out: 2.0 * x + 1.0),
    "guard1": (1, guard1, lambda x, out: np.where(x > 0.3, out + x, out)),
    "guard2": (2, guard2, lambda x, out: np.where(x > 0.3, out + x, out)),
    "stencil1": (1, stencil1, lambda x, out: _rolled(x, 0, -1) + 10.0 * x - 100.0 * _rolled(x, 0, 1)),
    "stencil2": (2, stencil2, lambda x, out: _rolled(x, 0, -1) + 2.0 * _rolled(x, 0, 1)
                 + 3.0 * _rolled(x, 1, -1) - _rolled(x, 1, 1)),
    "rows": (2, rows, lambda x, out: x + np.arange(x.shape[1])),
}
PLACES = ["numpy", "array", "interior", "array_interior"]
ROWS = [0, 1, 2, 3, 5, 7, 13]


def place(kind, data):
    """(root, argument): ``data`` as a NumPy array, a hetflow array, or the interior
    view of either, whose root has a border of -7."""
    root = np.pad(data, 1, constant_values=-7.0) if kind.endswith("interior") else data.copy()
    if kind.startswith("array"):
        root = hetflow.array(root)
    return root, interior(root, 1) if kind.endswith("interior") else root


def logical(kind, root):
    """What ``place`` made of ``root`` now, and its border (None without one)."""
    host = np.asarray(root)
    if not kind.endswith("interior"):
        return host, None
    inner = tuple(slice(1, -1) for _ in range(host.ndim))
    border = host.copy()
    border[inner] = -7.0
    return host[inner], border


def arguments(name, x_arg, extent):
    """The kernel's input arguments over ``x_arg`` (a stencil's neighbours: cshift views;
    a row's length)."""
    if name == "stencil1":
        return cshift(x_arg, 0, -1), x_arg, cshift(x_arg, 0, 1)
    if name == "stencil2":
        return cshift(x_arg, 0, -1), cshift(x_arg, 0, 1), cshift(x_arg, 1, -1), cshift(x_arg, 1, 1)
    if name == "rows":
        return x_arg, extent[1]
    return (x_arg,)


@st.composite
def programs(draw):
    name = draw(st.sampled_from(sorted(CASES)))
    rank = CASES[name][0]
    extent = (draw(st.sampled_from(ROWS)),) + tuple(draw(st.sampled_from([0, 1, 2, 3])) for _ in range(rank - 1))
    # a stencil's cshift views wrap around the whole array: no interior under them
    x_place = "numpy" if name.startswith("stencil") else draw(st.sampled_from(PLACES))
    schedule = draw(st.sampled_from(["steal", "static"]))
    shares = draw(st.one_of(st.none(), st.tuples(st.floats(0.0, 1.0), st.floats(0.01, 1.0))))
    return {"name": name, "extent": extent, "x": x_place, "out": draw(st.sampled_from(PLACES)),
            "schedule": schedule, "shares": None if shares is None else list(shares),
            "seed": draw(st.integers(0, 2**16))}


@pytest.mark.simgpu
@settings(max_examples=40, **SLOW)
@given(programs())
def test_co_executed_random_kernels_equal_numpy(tiny_chunks, case):
    _, kernel, oracle = CASES[case["name"]]
    rng = np.random.default_rng(case["seed"])
    x, out = rng.standard_normal(case["extent"]), rng.standard_normal(case["extent"])
    want = oracle(x, out)
    _, x_arg = place(case["x"], x)
    out_root, out_arg = place(case["out"], out)
    launch = case["extent"][:1] if case["name"] == "rows" else case["extent"]   # rows: one index a row
    hetflow.forall(launch, kernel, *arguments(case["name"], x_arg, case["extent"]), out_arg, device=BOTH,
                   schedule=case["schedule"], shares=case["shares"])
    got, border = logical(case["out"], out_root)
    np.testing.assert_array_equal(got, want)
    if border is not None:
        np.testing.assert_array_equal(border[border != -7.0], [])


@pytest.mark.simgpu
@settings(max_examples=15, **SLOW)
@given(extent=st.tuples(st.sampled_from(ROWS), st.sampled_from([1, 2, 3]), st.sampled_from([1, 2])),
       coherent=st.booleans(), schedule=st.sampled_from(["steal", "static"]))
def test_every_index_runs_exactly_once(tiny_chunks, extent, coherent, schedule):
    hits = np.zeros(extent, np.int64)
    arg = hetflow.array(hits) if coherent else hits
    report = hetflow.forall(extent, count3, arg, device=BOTH, schedule=schedule)
    np.testing.assert_array_equal(np.asarray(arg), np.ones(extent, np.int64))
    if extent[0] > 1:
        assert sum(w.indices for w in report.workers) == extent[0]
    flat = np.zeros(extent[0], np.int64)
    hetflow.forall(extent[0], count1, flat, device=BOTH, schedule=schedule)
    np.testing.assert_array_equal(flat, np.ones(extent[0], np.int64))
    counted = np.zeros(extent[:2], np.uint32)
    hetflow.forall(extent[:2], atomic_count2, counted, device=BOTH, schedule=schedule)
    np.testing.assert_array_equal(counted, np.ones(extent[:2], np.uint32))


# -- one NumPy array through two arguments on a GPU -----------------------------------------
@hetflow.kernel
def write_then_read(i, x, out, seen):
    out[i] = x[i] + 1.0
    seen[i] = x[i]


def _over_one_array(how, a):
    """(x, out) over NumPy array ``a`` (of 11 elements): the same array, equal slices, a
    view and the array, a slice and a view of the same elements."""
    n = a.shape[0]
    return {"same": (a, a), "slice": (a, a[:]), "view_out": (a, section(a, (0,), (n,))),
            "view_in": (section(a, (0,), (n,)), a), "box": (interior(a, 1), a[1:-1])}[how]


@pytest.mark.simgpu
@pytest.mark.parametrize("how", ["same", "slice", "view_out", "view_in", "box"])
@pytest.mark.parametrize("device", ["gpu0", "both"])
def test_two_arguments_over_one_array_share_its_gpu_copy(tiny_chunks, how, device):
    """A read through one name after a write through the other sees the write on a GPU
    too: the rows moved into two GPU copies of one array read the old value there."""
    a, seen = np.arange(11.0), np.zeros(11)
    x, out = _over_one_array(how, a)
    n = 9 if how == "box" else 11
    kw = {"device": "gpu0"} if device == "gpu0" else {"device": BOTH, "schedule": "static", "shares": [0.5, 0.5]}
    hetflow.forall(n, write_then_read, x, out, seen, **kw)
    want = np.arange(11.0)
    rows = slice(1, 10) if how == "box" else slice(None)
    want[rows] += 1.0
    np.testing.assert_array_equal(a, want)
    np.testing.assert_array_equal(seen[:n], want[rows])   # the sequential loop's: x is out


@hetflow.kernel
def double(i, x, out):
    out[i] = 2.0 * x[i]


@pytest.mark.simgpu
@pytest.mark.parametrize("device", ["cpu0", "gpu0", ["cpu0", "gpu0"]])
def test_a_written_argument_overlapping_another_array_not_a_box_of_it_runs_as_on_the_cpu(device):
    """a[::-1] written beside a backwards co_map of a: both name a[5 - i] at index i, so
    each index reads the element it writes; one GPU copy of a serves both."""
    a = np.arange(6.0)
    backwards = co_map(a, lambda idx: (5 - idx[0],), (6,))
    hetflow.forall(6, double, backwards, a[::-1], device=device)
    np.testing.assert_array_equal(a, 2.0 * np.arange(6.0))


# -- outputs wider than the launch -----------------------------------------------------------
@hetflow.kernel
def overwrite2(i, j, x, out):
    out[i, j] = x[i, j] + 1.0


@pytest.mark.simgpu
@pytest.mark.parametrize("device", ["gpu0", "both"])
def test_columns_beyond_the_launch_come_back_unchanged(tiny_chunks, monkeypatch, device):
    """An (n, m) launch overwriting out[i, j] of an (n, m + 2) array: its rows move to
    the GPU too (they came back holding whatever the GPU's memory held: NaN here)."""
    empty = staging.GpuChunks._empty

    def poisoned(self, shape, dtype):
        dev = empty(self, shape, dtype)
        dev.copy_to_device(np.full(shape, np.nan, dtype))
        return dev

    monkeypatch.setattr(staging.GpuChunks, "_empty", poisoned)
    x, out = np.arange(18.0).reshape(6, 3), np.full((6, 5), 7.0)
    kw = {"device": "gpu0"} if device == "gpu0" else {"device": BOTH, "schedule": "static", "shares": [0.5, 0.5]}
    hetflow.forall((6, 3), overwrite2, x, out, **kw)
    want = np.full((6, 5), 7.0)
    want[:, :3] = x + 1.0
    np.testing.assert_array_equal(out, want)


# -- wavefronts -------------------------------------------------------------------------------
@hetflow.kernel
def three_deps(i, j, a):
    a[i + 1, j + 1] = a[i, j + 1] + 2.0 * a[i + 1, j] - 0.5 * a[i, j]


@hetflow.kernel
def lcs(i, j, s, t, table):
    if s[i] == t[j]:
        table[i + 1, j + 1] = table[i, j] + 1
    else:
        table[i + 1, j + 1] = max(table[i, j + 1], table[i + 1, j])


def sequential_three_deps(a, extent):
    for i in range(extent[0]):
        for j in range(extent[1]):
            a[i + 1, j + 1] = a[i, j + 1] + 2.0 * a[i + 1, j] - 0.5 * a[i, j]


def sequential_lcs(s, t, table):
    for i in range(len(s)):
        for j in range(len(t)):
            table[i + 1, j + 1] = table[i, j] + 1 if s[i] == t[j] else max(table[i, j + 1], table[i + 1, j])


@settings(max_examples=25, **SLOW)
@given(extent=st.tuples(st.integers(0, 11), st.integers(0, 11)),
       tile=st.one_of(st.none(), st.tuples(st.integers(1, 7), st.integers(1, 7))),
       device=st.sampled_from(["cpu0", "gpu0"]), coherent=st.booleans(), seed=st.integers(0, 2**16))
def test_wavefronts_equal_the_sequential_loop(monkeypatch, extent, tile, device, coherent, seed):
    if device == "gpu0" and not any(d.id == "gpu0" for d in hetflow.devices()):
        return
    monkeypatch.setattr(wavefront_rt, "PARALLEL_MIN", 1)   # default tiles over the cores too
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((extent[0] + 1, extent[1] + 1))
    want = a.copy()
    arg = hetflow.array(a) if coherent else a
    hetflow.wavefront(extent, three_deps, arg, tile=tile, device=device)
    sequential_three_deps(want, extent)
    np.testing.assert_array_equal(np.asarray(arg), want)
    s, t = rng.integers(0, 3, extent[0]), rng.integers(0, 3, extent[1])
    table, want = np.zeros((extent[0] + 1, extent[1] + 1), np.int64), np.zeros((extent[0] + 1, extent[1] + 1), np.int64)
    hetflow.wavefront(extent, lcs, s, t, table, tile=tile, device=device)
    sequential_lcs(s, t, want)
    np.testing.assert_array_equal(table, want)


# -- atomics ----------------------------------------------------------------------------------
DTYPES = [np.int32, np.int64, np.uint32, np.uint64, np.float32, np.float64]


@hetflow.kernel
def atomic_updates(i, bins, v, sums, lows, highs):
    b = bins[i]
    atomic.add(sums, b, v[i])
    atomic.min(lows, b, v[i])
    atomic.max(highs, (b,), v[i])


@hetflow.kernel
def claim(i, bins, owner, won):
    won[i] = atomic.cas(owner, bins[i], 0, i + 1) == 0


def _run_or_call(kernel, n, args, device):
    """``kernel`` over ``range(n)`` on ``device``, or called as plain Python (None)."""
    if device is None:
        for i in range(n):
            kernel(i, *args)
    elif device == "both":
        hetflow.forall(n, kernel, *args, device=BOTH, schedule="steal")
    else:
        hetflow.forall(n, kernel, *args, device=device)


ATOMIC_DEVICES = [None, "cpu0", pytest.param("gpu0", marks=pytest.mark.simgpu),
                  pytest.param("both", marks=pytest.mark.simgpu)]


@pytest.mark.parametrize("device", ATOMIC_DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_atomics_of_every_type_equal_numpy(tiny_chunks, dtype, device):
    """Operands wider than the element (int64 into uint32, float64 into float32, negative
    ones into unsigned) are converted to it first, as compiled code converts them."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(7)
    n, nbins = 23, 4
    bins = rng.integers(0, nbins, n)
    v = rng.integers(-50, 50, n) if dtype.kind in "iu" else rng.standard_normal(n)
    element = v.astype(dtype)    # NumPy's conversion: integers wrapped, float64 rounded
    sums, lows, highs = np.zeros(nbins, dtype), np.full(nbins, 60, dtype), np.zeros(nbins, dtype)
    if dtype.kind == "f":
        lows[0] = highs[0] = np.nan    # a NaN element is replaced, as IEEE minNum/maxNum do
    want_sums, want_lows, want_highs = sums.copy(), lows.copy(), highs.copy()
    np.add.at(want_sums, bins, element)
    np.fmin.at(want_lows, bins, element)
    np.fmax.at(want_highs, bins, element)
    _run_or_call(atomic_updates, n, (bins, v, sums, lows, highs), device)
    if dtype.kind == "f":   # the order of additions rounds differently
        np.testing.assert_allclose(sums, want_sums, rtol=1e-5)
    else:
        np.testing.assert_array_equal(sums, want_sums)
    np.testing.assert_array_equal(lows, want_lows)
    np.testing.assert_array_equal(highs, want_highs)
    if dtype.kind in "iu":
        owner, won = np.zeros(nbins, dtype), np.zeros(n, np.bool_)
        _run_or_call(claim, n, (bins, owner, won), device)
        assert won.sum() == len(np.unique(bins))
        np.testing.assert_array_equal(bins[owner[np.unique(bins)].astype(np.int64) - 1], np.unique(bins))


@pytest.mark.parametrize("device", [None, "cpu0", pytest.param("gpu0", marks=pytest.mark.simgpu)])
def test_atomic_operands_convert_to_the_element_type_as_compiled_code_does(device):
    """Plain Python (the simulator's GPU) compared and stored the operand as it was: -1
    was below every uint32, a float64 was added to a float32 before rounding."""
    u = np.array([5, 5, 2**32 - 1], np.uint32)
    f = np.ones(1, np.float32)
    _run_or_call(convert_operands, 1, (u, f, np.array([-1]), np.array([2.0**-24 + 2.0**-50])), device)
    np.testing.assert_array_equal(u, np.array([5, 2**32 - 1, 7], np.uint32))   # min(5, -1 as uint32) is 5
    assert f[0] == np.float32(1) + np.float32(2.0**-24 + 2.0**-50) == 1.0      # the operand rounded first


@hetflow.kernel
def convert_operands(i, u, f, minus_one, tiny):
    atomic.min(u, 0, minus_one[0])
    atomic.max(u, 1, minus_one[0])
    atomic.cas(u, 2, minus_one[0], 7)
    atomic.add(f, 0, tiny[0])


@pytest.mark.parametrize("fn, ufunc", [(atomic_impl.min, np.fmin), (atomic_impl.max, np.fmax)])
def test_gpu_min_and_max_replace_a_nan_element_as_the_cpu_does(fn, ufunc):
    """On a GPU, cuda.atomic's min and max keep a NaN element (the simulator's model of
    them, FakeCUDAAtomic, does the same); hetflow's are its nanmin and nanmax."""
    impls = atomic_impl.cuda_impls(SimpleNamespace(atomic=FakeCUDAAtomic()))[fn]
    for impl, idx in zip(impls, [1, (1,)]):
        a = np.array([0.0, np.nan, 2.0])
        old = impl(a, idx, 3.0)
        assert np.isnan(old)
        np.testing.assert_array_equal(a, ufunc(np.array([0.0, np.nan, 2.0]), [0.0, 3.0, 2.0]))
        impl(a, idx, np.nan)    # a NaN operand is ignored
        np.testing.assert_array_equal(a, [0.0, 3.0, 2.0])
