"""Views and the reduce / scan / sort call sites against hand-written code and NumPy / CuPy.

Jacobi: one 5-point step ``v[1:-1, 1:-1] = (N + S + W + E) / 4`` on an n x n float64
grid, written as one hetflow kernel over ``interior`` and ``cshift`` views (the views
lower to index arithmetic: no copies), against a hand-written ``@njit(parallel=True)``
stencil (``prange`` over rows) and NumPy slicing. On a GPU (CuPy present): the same
kernel on CuPy arrays against a hand-written numba-cuda stencil and CuPy slicing.

Call sites: ``reduce(x, 'sum')`` of float32, ``scan(x, 'sum')`` and ``sort(x)`` of float64
against NumPy (``np.sum``, ``np.cumsum``, ``np.sort`` with its default, unstable kind —
hetflow's sort is stable) and, on a GPU, CuPy. One informative row runs the compiled
path: ``reduce`` of an ``interior`` view against NumPy's sum of the strided slice.

Map-reduce (``reduce(extent, kernel, *args)``): a dot product and the residual norm of
a 5-point Poisson stencil against hand-written ``prange`` reductions and NumPy (on a
GPU, CuPy). Wavefront: PRK's p2p sweep on an N x N grid (``--wavefront N``) against a
sequential Numba loop and PRK's NumPy program, which runs element by element in
Python: timed on a smaller grid and scaled by the number of elements.

Ratios are baseline time / hetflow time: above 1 means hetflow is faster. Contenders
run in alternating rounds (so a noisy neighbour slows both alike) and each one's best
round counts. Every hetflow result is checked against its baseline's before timing.
"""
from __future__ import annotations

import argparse
import os
import sys

import numba
import numpy as np

import hetflow
from hetflow import cshift, interior, reduce, scan, sort
from hetflow.cuda_compat import cuda_module, cupy_module

sys.path.append(os.path.dirname(__file__))
from _common import at_least, best_time, clause, fmt_s, race, report, verdict  # noqa: E402


@hetflow.kernel
def jacobi(i, j, new, north, south, west, east):
    new[i, j] = 0.25 * (north[i, j] + south[i, j] + west[i, j] + east[i, j])


def jacobi_views(u, v):
    """The kernel's arguments: v's interior, and u's interior shifted four ways."""
    return (interior(v, 1), interior(cshift(u, 0, -1), 1), interior(cshift(u, 0, 1), 1),
            interior(cshift(u, 1, -1), 1), interior(cshift(u, 1, 1), 1))


@numba.njit(parallel=True, nogil=True)
def numba_jacobi(u, v):
    n, m = u.shape
    for i in numba.prange(1, n - 1):
        for j in range(1, m - 1):
            v[i, j] = 0.25 * (u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1])


def numpy_jacobi(u, v):
    """NumPy or CuPy slicing (the same code for both)."""
    v[1:-1, 1:-1] = 0.25 * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:])


def row(name, t_base, t_het, least=None, note=""):
    """A table row; its target, if ``least``: the ratio at least ``least`` (``note`` after
    it), else ``note`` alone."""
    ratio = t_base / t_het
    judged = verdict(clause(ratio, ">=", least, note=note)) if least else verdict(info=note)
    return dict(name=name, baseline=fmt_s(t_base), hetflow=fmt_s(t_het), ratio=ratio, **judged)


def cpu_jacobi_rows(n, repeat):
    u = np.random.default_rng(0).random((n, n))
    v_het, v_nb, v_np = (u.copy() for _ in range(3))
    args = jacobi_views(u, v_het)
    extent = args[0].shape
    run_het = lambda: hetflow.forall(extent, jacobi, *args, device="cpu0")  # noqa: E731
    run_het()
    numba_jacobi(u, v_nb)
    numpy_jacobi(u, v_np)
    assert np.array_equal(v_het, v_nb) and np.allclose(v_het, v_np, rtol=1e-15, atol=0)
    # In pairs: the one after NumPy's single thread finds the threading layer's workers
    # asleep and the caches full of NumPy's temporaries (0.94x where the pair is 0.99x).
    t_het, t_nb = race(run_het, lambda: numba_jacobi(u, v_nb), repeat=repeat)
    t_np, t_het2 = race(lambda: numpy_jacobi(u, v_np), run_het, repeat=repeat)
    return [row(f"jacobi {n}x{n} f64 vs numba prange", t_nb, t_het, 0.9),
            row(f"jacobi {n}x{n} f64 vs numpy slicing", t_np, t_het2, 5)]


def cpu_callsite_rows(n_reduce, n_scan, n_view, repeat, sort_repeat):
    rng = np.random.default_rng(1)
    x32 = rng.random(n_reduce, dtype=np.float32)
    assert reduce(x32, "sum") == np.sum(x32)
    t_np, t_het = race(lambda: np.sum(x32), lambda: reduce(x32, "sum"), repeat=repeat)
    rows = [row(f"reduce sum {n_reduce:.0e} f32 vs np.sum", t_np, t_het, 0.9)]
    x32 = None  # frees it; rebound, not deleted: the lambdas above name it
    x = rng.random(n_scan)
    assert np.array_equal(scan(x, "sum"), np.cumsum(x))
    t_np, t_het = race(lambda: np.cumsum(x), lambda: scan(x, "sum"), repeat=repeat)
    rows.append(row(f"scan sum {n_scan:.0e} f64 vs np.cumsum", t_np, t_het, 0.8))
    assert np.array_equal(sort(x), np.sort(x))
    t_np, t_het = race(lambda: np.sort(x), lambda: sort(x), repeat=sort_repeat)
    rows.append(row(f"sort {n_scan:.0e} f64 (stable) vs np.sort", t_np, t_het, 0.8))
    a = rng.random((n_view, n_view))
    inner = interior(a, 1)
    assert np.isclose(reduce(inner, "sum"), a[1:-1, 1:-1].sum(), rtol=1e-12)
    t_np, t_het = race(lambda: a[1:-1, 1:-1].sum(), lambda: reduce(inner, "sum"), repeat=repeat)
    rows.append(row(f"reduce sum interior {n_view}^2 f64 vs np slice", t_np, t_het, note="(compiled path)"))
    return rows


# -- map-reduce: reduce(extent, kernel, *args) --------------------------------------------------------
@hetflow.kernel
def product(i, x, y):
    return x[i] * y[i]


@hetflow.kernel
def residual_sq(i, j, u, f, h2):
    """The squared residual of the 5-point Poisson stencil at interior point (i+1, j+1)."""
    r = f[i + 1, j + 1] - (4.0 * u[i + 1, j + 1] - u[i, j + 1] - u[i + 2, j + 1] - u[i + 1, j] - u[i + 1, j + 2]) / h2
    return r * r


@numba.njit(parallel=True, nogil=True)
def numba_dot(x, y):
    acc = 0.0
    for i in numba.prange(x.shape[0]):
        acc += x[i] * y[i]
    return acc


@numba.njit(parallel=True, nogil=True)
def numba_residual(u, f, h2):
    acc = 0.0
    for i in numba.prange(1, u.shape[0] - 1):
        for j in range(1, u.shape[1] - 1):
            r = f[i, j] - (4.0 * u[i, j] - u[i - 1, j] - u[i + 1, j] - u[i, j - 1] - u[i, j + 1]) / h2
            acc += r * r
    return acc


def numpy_residual(u, f, h2):
    """NumPy or CuPy slicing: the residual array, then its squared sum."""
    r = f[1:-1, 1:-1] - (4.0 * u[1:-1, 1:-1] - u[:-2, 1:-1] - u[2:, 1:-1] - u[1:-1, :-2] - u[1:-1, 2:]) / h2
    return (r * r).sum()


def cpu_mapreduce_rows(n_dot, n_view, repeat):
    rng = np.random.default_rng(2)
    x, y = rng.random(n_dot), rng.random(n_dot)
    run_het = lambda: reduce(n_dot, product, x, y)  # noqa: E731
    assert np.isclose(run_het(), x @ y, rtol=1e-10) and np.isclose(numba_dot(x, y), x @ y, rtol=1e-10)
    # NumPy's x @ y is timed apart: BLAS threads spin on every core after each call, which
    # halved the thread-pool contenders when interleaved with them (numba prange included).
    t_het, t_nb = race(run_het, lambda: numba_dot(x, y), repeat=repeat)
    t_np, t_het2 = race(lambda: x @ y, run_het, repeat=repeat)
    rows = [row(f"map-reduce dot {n_dot:.0e} f64 vs numba prange", t_nb, t_het, 0.9),
            row(f"map-reduce dot {n_dot:.0e} f64 vs numpy x @ y", t_np, t_het2, note="(BLAS)")]
    x = y = None  # frees them; rebound, not deleted: lambdas name them
    u, f = rng.random((n_view, n_view)), rng.random((n_view, n_view))
    m = n_view - 2
    run_het = lambda: reduce((m, m), residual_sq, u, f, 0.25)  # noqa: E731
    want = numpy_residual(u, f, 0.25)
    assert np.isclose(run_het(), want, rtol=1e-10) and np.isclose(numba_residual(u, f, 0.25), want, rtol=1e-10)
    t_het, t_nb = race(run_het, lambda: numba_residual(u, f, 0.25), repeat=repeat)
    t_np, t_het2 = race(lambda: numpy_residual(u, f, 0.25), run_het, repeat=repeat)
    rows += [row(f"map-reduce residual {n_view}^2 vs numba prange", t_nb, t_het, 0.9),
             row(f"map-reduce residual {n_view}^2 vs numpy slicing", t_np, t_het2)]
    return rows


# -- wavefront: PRK's p2p sweep -----------------------------------------------------------------------
@hetflow.kernel
def p2p(i, j, a):
    a[i + 1, j + 1] = a[i, j + 1] + a[i + 1, j] - a[i, j]


@numba.njit(nogil=True)
def numba_p2p(a):
    for i in range(1, a.shape[0]):
        for j in range(1, a.shape[1]):
            a[i, j] = a[i - 1, j] + a[i, j - 1] - a[i - 1, j - 1]


def numpy_p2p(grid):
    """PRK's NumPy program (PYTHON/p2p-numpy.py): the sweep element by element."""
    m, n = grid.shape
    for i in range(1, m):
        for j in range(1, n):
            grid[i][j] = grid[i - 1][j] + grid[i][j - 1] - grid[i - 1][j - 1]


def p2p_grid(n):
    grid = np.zeros((n, n))
    grid[0, :], grid[:, 0] = np.arange(n), np.arange(n)
    return grid


def cpu_wavefront_rows(n, n_numpy, repeat):
    a_het, a_nb = p2p_grid(n), p2p_grid(n)
    run_het = lambda: hetflow.wavefront((n - 1, n - 1), p2p, a_het)  # noqa: E731
    run_het()
    numba_p2p(a_nb)
    assert np.array_equal(a_het, a_nb)
    t_het, t_nb = race(run_het, lambda: numba_p2p(a_nb), repeat=repeat)
    small = p2p_grid(n_numpy)
    t_np = best_time(lambda: numpy_p2p(small), repeat=1, warmup=0) * ((n - 1) / (n_numpy - 1)) ** 2
    return [row(f"wavefront p2p {n}^2 vs sequential numba", t_nb, t_het, 4, "(16 cores)"),
            row(f"wavefront p2p {n}^2 vs PRK numpy (from {n_numpy}^2)", t_np, t_het)]


def gpu_rows(n, n_reduce, n_scan, repeat):
    cp, cuda = cupy_module(), cuda_module()
    if cp is None:
        return []

    @cuda.jit
    def cuda_jacobi(u, v):
        i, j = cuda.grid(2)
        if 1 <= i < u.shape[0] - 1 and 1 <= j < u.shape[1] - 1:
            v[i, j] = 0.25 * (u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1])

    sync = cp.cuda.Device().synchronize
    u = cp.random.random((n, n))
    v_het, v_cu, v_cp = (u.copy() for _ in range(3))
    args = jacobi_views(u, v_het)
    extent = args[0].shape
    run_het = lambda: hetflow.forall(extent, jacobi, *args, device="gpu0")  # noqa: E731
    threads = (16, 16)
    blocks = ((n + 15) // 16, (n + 15) // 16)
    run_het()
    cuda_jacobi[blocks, threads](u, v_cu)
    numpy_jacobi(u, v_cp)
    assert bool(cp.array_equal(v_het, v_cu)) and bool(cp.allclose(v_het, v_cp, rtol=1e-15, atol=0))
    t_het, t_cu, t_cp = race(run_het, lambda: cuda_jacobi[blocks, threads](u, v_cu),
                             lambda: numpy_jacobi(u, v_cp), repeat=repeat, sync=sync)
    rows = [row(f"GPU jacobi {n}x{n} f64 vs numba-cuda", t_cu, t_het, 0.9),
            row(f"GPU jacobi {n}x{n} f64 vs cupy slicing", t_cp, t_het, 2)]
    u = v_het = v_cu = v_cp = args = None  # frees them; rebound, not deleted: lambdas name them
    x32 = cp.random.random(n_reduce, dtype=cp.float32)
    assert float(reduce(x32, "sum")) == float(cp.sum(x32))
    t_cp, t_het = race(lambda: cp.sum(x32), lambda: reduce(x32, "sum"), repeat=repeat, sync=sync)
    rows.append(row(f"GPU reduce sum {n_reduce:.0e} f32 vs cp.sum", t_cp, t_het, 0.9))
    x32 = None
    x = cp.random.random(n_scan)
    assert bool(cp.allclose(scan(x, "sum"), cp.cumsum(x), rtol=1e-12)) and bool(cp.array_equal(sort(x), cp.sort(x)))
    t_cp, t_het = race(lambda: cp.cumsum(x), lambda: scan(x, "sum"), repeat=repeat, sync=sync)
    rows.append(row(f"GPU scan sum {n_scan:.0e} f64 vs cp.cumsum", t_cp, t_het, 0.8))
    t_cp, t_het = race(lambda: cp.sort(x), lambda: sort(x), repeat=repeat, sync=sync)
    rows.append(row(f"GPU sort {n_scan:.0e} f64 vs cp.sort", t_cp, t_het, 0.8))
    x = None
    y = cp.random.random(n_reduce // 2)
    x = cp.random.random(n_reduce // 2)
    run_het = lambda: reduce(x.size, product, x, y, device="gpu0")  # noqa: E731
    assert np.isclose(float(run_het()), float(cp.dot(x, y)), rtol=1e-10)
    t_cp, t_het = race(lambda: float(cp.dot(x, y)), lambda: float(run_het()), repeat=repeat, sync=sync)
    rows.append(row(f"GPU map-reduce dot {x.size:.0e} f64 vs cp.dot", t_cp, t_het, 1.0))
    x = y = None
    u, f = cp.random.random((n, n)), cp.random.random((n, n))
    run_het = lambda: reduce((n - 2, n - 2), residual_sq, u, f, 0.25, device="gpu0")  # noqa: E731
    assert np.isclose(float(run_het()), float(numpy_residual(u, f, 0.25)), rtol=1e-10)
    t_cp, t_het = race(lambda: float(numpy_residual(u, f, 0.25)), lambda: float(run_het()), repeat=repeat, sync=sync)
    rows.append(row(f"GPU map-reduce residual {n}^2 vs cupy slicing", t_cp, t_het, 1.0))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="hetflow bench views", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print results as JSON")
    p.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    p.add_argument("--wavefront", type=at_least(2), metavar="N", default=None,
                   help="side of the p2p wavefront grid (default 4000; 256 with --quick)")
    args = p.parse_args(argv)
    if args.quick:
        n, n_reduce, n_scan, n_view, repeat, sort_repeat = 256, 10**5, 10**4, 256, 2, 2
        n_dot, n_wave, n_numpy = 10**5, 256, 64
    else:
        n, n_reduce, n_scan, n_view, repeat, sort_repeat = 4096, 10**8, 10**7, 4096, 7, 5
        n_dot, n_wave, n_numpy = 2 * 10**7, 4000, 400
    n_wave = args.wavefront or n_wave
    # a Jacobi sweep takes milliseconds: four times the rounds, for a steadier best
    rows = cpu_jacobi_rows(n, 4 * repeat) + cpu_callsite_rows(n_reduce, n_scan, n_view, repeat, sort_repeat)
    rows += cpu_mapreduce_rows(n_dot, n_view, repeat) + cpu_wavefront_rows(n_wave, min(n_numpy, n_wave), repeat)
    rows += gpu_rows(n, n_reduce, n_scan, repeat)
    cpu = hetflow.get_device("cpu0")
    report(rows, args.json, f"hetflow bench views ({cpu.name}, {cpu.compute_units} cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
