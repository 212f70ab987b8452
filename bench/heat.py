"""Heat diffusion with views: hetflow on cpu0, gpu0 and cpu0+gpu0 against CuPy slicing and
hand-written kernels (numba-cuda on the GPU, Numba prange on the CPU), data already where
it runs (CuPy arrays, hetflow arrays on the GPU).

One step: ``u[1:-1,1:-1] += alpha * (N + S + W + E - 4 C)`` into a second grid, 4096^2
float64 by default. Figures: Gcell/s, ratios (baseline time / hetflow time: above 1
hetflow is faster) and, on a GPU, the fraction of the memory-bandwidth bound (16 bytes
per cell per step; bandwidth from a device-to-device copy measured in the same run).
"""
from __future__ import annotations

import argparse
import os
import sys

import numba
import numpy as np

import hetflow
from hetflow import cshift, interior
from hetflow.cli.demo import ALPHA, heat_step
from hetflow.cuda_compat import cuda_module, cupy_module

sys.path.append(os.path.dirname(__file__))
from _common import at_least, best_time, clause, fmt_s, race, report, verdict  # noqa: E402


def hetflow_steps(u, v, steps, device):
    for _ in range(steps // 2):
        for src, dst in ((u, v), (v, u)):  # views built every step, as users write them
            hetflow.forall((src.shape[0] - 2, src.shape[1] - 2), heat_step, interior(dst, 1), interior(src, 1),
                           interior(cshift(src, 0, -1), 1), interior(cshift(src, 0, 1), 1),
                           interior(cshift(src, 1, -1), 1), interior(cshift(src, 1, 1), 1), ALPHA,
                           device=device)


def slicing_steps(u, v, steps):
    """NumPy or CuPy slicing (the same code for both)."""
    for _ in range(steps // 2):
        for src, dst in ((u, v), (v, u)):
            c = src[1:-1, 1:-1]
            dst[1:-1, 1:-1] = c + ALPHA * (src[:-2, 1:-1] + src[2:, 1:-1] + src[1:-1, :-2] + src[1:-1, 2:] - 4.0 * c)


@numba.njit(parallel=True, nogil=True)
def _prange_step(u, v, alpha):
    n, m = u.shape
    for i in numba.prange(1, n - 1):
        for j in range(1, m - 1):
            v[i, j] = u[i, j] + alpha * (u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - 4.0 * u[i, j])


def prange_steps(u, v, steps):
    for _ in range(steps // 2):
        _prange_step(u, v, ALPHA)
        _prange_step(v, u, ALPHA)


def row(name, base, het, cells, least=None, bound=None, least_of_bound=None):
    """A table row: Gcell/s (and the fraction of the bandwidth ``bound``, bytes per second)
    in the target column, and the targets: the ratio at least ``least``, the fraction of
    the bound at least ``least_of_bound``."""
    of_bound = 16 * cells / het / bound if bound else None
    info = f"{cells / het / 1e9:.2f} Gcell/s" + (f", {of_bound:.0%} of bound" if bound else "")
    clauses = [clause(base / het, ">=", least)] if least else []
    if least_of_bound:
        clauses.append(clause(of_bound, ">=", least_of_bound, "%", note="of bound"))
    return dict(name=name, baseline=fmt_s(base), hetflow=fmt_s(het), ratio=base / het, **verdict(*clauses, info=info))


def cpu_rows(n, steps):
    start = np.random.default_rng(0).random((n, n))
    cells = (n - 2) ** 2 * steps
    a, b, c, d, e, f, g, h = (start.copy() for _ in range(8))
    # Raced in pairs, rounds alternating: the one after NumPy's single thread would find
    # the threading layer's workers asleep.
    t_het, t_prange = race(lambda: hetflow_steps(a, b, steps, "cpu0"), lambda: prange_steps(c, d, steps), repeat=5)
    t_numpy, t_het2 = race(lambda: slicing_steps(e, f, steps), lambda: hetflow_steps(g, h, steps, "cpu0"), repeat=1)
    assert np.allclose(a, c) and np.allclose(e, g)  # each pair's contenders ran as often: same result
    return [row("cpu0 vs numba prange", t_prange, t_het, cells, 0.95),
            row("cpu0 vs numpy slicing", t_numpy, t_het2, cells)], t_het


def gpu_rows(n, steps, t_cpu):
    cp, cuda = cupy_module(), cuda_module()
    if cp is None:
        return []

    @cuda.jit
    def cuda_step(u, v, alpha):
        j, i = cuda.grid(2)
        if 0 < i < u.shape[0] - 1 and 0 < j < u.shape[1] - 1:
            v[i, j] = u[i, j] + alpha * (u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - 4.0 * u[i, j])

    def cuda_steps(u, v):
        blocks = ((n + 31) // 32, (n + 7) // 8)
        for _ in range(steps // 2):
            cuda_step[blocks, (32, 8)](u, v, ALPHA)
            cuda_step[blocks, (32, 8)](v, u, ALPHA)

    sync = cp.cuda.Device().synchronize
    start = np.random.default_rng(0).random((n, n))
    cells = (n - 2) ** 2 * steps
    x, y = cp.asarray(start), cp.empty((n, n))
    t_copy = best_time(lambda: cp.copyto(y, x), 5, sync=sync)
    bandwidth = 2 * x.nbytes / t_copy
    u1, v1 = cp.asarray(start), cp.asarray(start)
    u2, v2 = cp.asarray(start), cp.asarray(start)
    ha, hb = hetflow.array(start), hetflow.array(start)
    t_cupy, t_cuda, t_het = race(lambda: slicing_steps(u1, v1, steps), lambda: cuda_steps(u2, v2),
                                 lambda: hetflow_steps(ha, hb, steps, "gpu0"), repeat=5, sync=sync)
    hc, hd = hetflow.array(start), hetflow.array(start)
    t_both = best_time(lambda: hetflow_steps(hc, hd, steps, ["cpu0", "gpu0"]), 5, sync=sync)  # as often
    assert np.allclose(ha.numpy(), u2.get()) and np.allclose(ha.numpy(), u1.get())
    assert np.allclose(hc.numpy(), ha.numpy())
    best_single = min(t_het, t_cpu)
    # A long loop: cpu0+gpu0 runs the GPU alone but co-executes a launch now and then to
    # measure again, and on this stencil such a launch costs hundreds of steps alone.
    long_steps = steps * 200
    he, hf, hg, hh = (hetflow.array(start) for _ in range(4))
    t_long, t_long_both = race(lambda: hetflow_steps(he, hf, long_steps, "gpu0"),
                               lambda: hetflow_steps(hg, hh, long_steps, ["cpu0", "gpu0"]), repeat=1, sync=sync)
    assert np.allclose(he.numpy(), hg.numpy())
    return [
        dict(name="device-to-device copy (bandwidth)", baseline="", hetflow=fmt_s(t_copy), ratio=1.0,
             **verdict(info=f"{bandwidth / 1e9:.0f} GB/s")),
        row("gpu0 hetflow array vs numba-cuda", t_cuda, t_het, cells, 1.0, bandwidth, least_of_bound=0.5),
        row("gpu0 hetflow array vs cupy slicing", t_cupy, t_het, cells, 2, bandwidth),
        row("cpu0+gpu0 vs best single device", best_single, t_both, cells, 0.95, bandwidth),
        row(f"{long_steps} steps: cpu0+gpu0 vs gpu0", t_long, t_long_both, cells * 200, 0.95, bandwidth),
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="hetflow bench heat", description=__doc__)
    p.add_argument("--json", action="store_true")
    p.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    p.add_argument("--size", type=at_least(3), default=4096, help="grid side (a border around an interior)")
    p.add_argument("--steps", type=at_least(2), default=100,
                   help="steps (even: they go u -> v -> u; an odd count is rounded up)")
    args = p.parse_args(argv)
    n, steps = (130, 4) if args.quick else (args.size, args.steps + args.steps % 2)
    rows, t_cpu = cpu_rows(n, steps)
    rows += gpu_rows(n, steps, t_cpu)
    report(rows, args.json, f"hetflow bench heat ({n}^2 x {steps} steps, {hetflow.get_device('cpu0').name}, "
                            f"{hetflow.get_device('cpu0').compute_units} cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
