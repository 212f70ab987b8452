"""DIR benchmark: a chain of four elementwise launches, fused by the rules vs as captured.

The program (10^7 float64 by default) is captured once per contender with
``hetflow.graph()``:

    t0 = 2 x;  t1 = t0 + 1;  t2 = t1 * t1;  y = t2 - x

* ``unfused``: the captured version run with no rules (``RuleSet()``): four launches,
  three intermediate arrays written and read back.
* ``fused``: the default rules fuse the chain into one generated kernel; the
  intermediates become local scalars and are never allocated.

Baselines in the same process: the unfused graph (the figure the target is about),
NumPy with preallocated outputs, and a hand-fused Numba ``prange`` loop. Ratios are
speed-ups of the fused graph (baseline time / fused time). Each section is a function
returning table rows; further sections (GPU, adaptive Jacobi) go in ``SECTIONS``.
"""
from __future__ import annotations

import argparse
import os
import sys

import numba
import numpy as np

import hetflow
from hetflow.ir import RuleSet
from hetflow.platform.cuda_compat import cuda_module, cupy_module

sys.path.append(os.path.dirname(__file__))
from _common import best_time, fmt_s, report  # noqa: E402


@hetflow.kernel
def dir_scale(i, a, x, out):
    out[i] = a * x[i]


@hetflow.kernel
def dir_shift(i, x, b, out):
    out[i] = x[i] + b


@hetflow.kernel
def dir_square(i, x, out):
    out[i] = x[i] * x[i]


@hetflow.kernel
def dir_sub(i, x, y, out):
    out[i] = x[i] - y[i]


@numba.njit(parallel=True, nogil=True)
def numba_chain(x, y):
    for i in numba.prange(x.shape[0]):
        t = 2.0 * x[i] + 1.0
        y[i] = t * t - x[i]


def chain_graph(n, x, y, name, device=None):
    """The four-launch program, captured (nothing runs here); intermediates on ``device``."""
    with hetflow.graph(name) as g:
        t0, t1, t2 = (hetflow.empty(n, device=device) for _ in range(3))
        hetflow.forall(n, dir_scale, 2.0, x, t0)
        hetflow.forall(n, dir_shift, t0, 1.0, t1)
        hetflow.forall(n, dir_square, t1, t2)
        hetflow.forall(n, dir_sub, t2, x, y)
    return g, (t0, t1, t2)


def check_fused(fused, temps) -> None:
    launches = sum(1 for node in fused.current.nodes if node.op == "forall")
    if launches != 1 or any(t.materialized for t in temps):
        raise RuntimeError(f"the chain was not fused as expected:\n{fused.describe()}")


def cpu_rows(n, repeat):
    x = np.random.default_rng(0).random(n)
    expected = (2.0 * x + 1.0) ** 2 - x
    y_plain, y_fused, y_np, y_nb = (np.empty(n) for _ in range(4))
    plain, _ = chain_graph(n, x, y_plain, "unfused")
    fused, temps = chain_graph(n, x, y_fused, "fused")
    no_rules = RuleSet()

    def numpy_chain():
        np.multiply(2.0, x, out=y_np)
        np.add(y_np, 1.0, out=y_np)
        np.multiply(y_np, y_np, out=y_np)
        np.subtract(y_np, x, out=y_np)

    t_plain = best_time(lambda: plain.run(rules=no_rules), repeat)
    t_fused = best_time(lambda: fused.run(), repeat)
    t_numpy = best_time(numpy_chain, repeat)
    t_numba = best_time(lambda: numba_chain(x, y_nb), repeat)
    for y in (y_plain, y_fused, y_np, y_nb):
        np.testing.assert_allclose(y, expected, rtol=1e-12)
    check_fused(fused, temps)
    return table("", n, t_fused, [("unfused graph", t_plain, ">= 2.5x"), ("numpy (out=)", t_numpy, ""),
                                  ("numba, fused by hand", t_numba, "")])


def table(prefix, n, t_fused, baselines):
    """Rows of the fused graph's time against each ``(name, seconds, target)`` baseline."""
    return [dict(name=f"{prefix}4 ops n={n:.0e} vs {name}", baseline=fmt_s(t), hetflow=fmt_s(t_fused),
                 ratio=t / t_fused, target=target) for name, t, target in baselines]


def real_gpu() -> bool:
    return any(d.kind == "gpu" and not d.simulated for d in hetflow.devices())


def gpu_rows(n, repeat):
    """The same chain on the first GPU: inputs, outputs and intermediates in GPU memory."""
    cp, cuda = cupy_module(), cuda_module()
    if cp is None or not real_gpu():
        return []

    @cuda.jit
    def cuda_chain(x, y):
        for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
            t = 2.0 * x[i] + 1.0
            y[i] = t * t - x[i]

    sync = cp.cuda.Device().synchronize
    x = cp.random.random(n)
    expected = (2.0 * x + 1.0) ** 2 - x
    y_plain, y_fused, y_cp, y_cu = (cp.empty(n) for _ in range(4))
    plain, _ = chain_graph(n, x, y_plain, "unfused-gpu", device="gpu0")
    fused, temps = chain_graph(n, x, y_fused, "fused-gpu", device="gpu0")
    no_rules = RuleSet()

    def cupy_chain():
        cp.multiply(2.0, x, out=y_cp)
        cp.add(y_cp, 1.0, out=y_cp)
        cp.multiply(y_cp, y_cp, out=y_cp)
        cp.subtract(y_cp, x, out=y_cp)

    blocks = cp.cuda.Device().attributes["MultiProcessorCount"] * 8
    t_plain = best_time(lambda: plain.run(rules=no_rules), repeat, sync=sync)
    t_fused = best_time(lambda: fused.run(), repeat, sync=sync)
    t_cp = best_time(cupy_chain, repeat, sync=sync)
    t_cu = best_time(lambda: cuda_chain[blocks, 256](x, y_cu), repeat, sync=sync)
    for y in (y_plain, y_fused, y_cp, y_cu):
        # FMA contraction on the GPU changes the last bits; the oracle is NumPy-style CuPy.
        cp.testing.assert_allclose(y, expected, rtol=1e-12)
    check_fused(fused, temps)
    return table("GPU ", n, t_fused, [("unfused graph", t_plain, ">= 2x"), ("cupy (out=)", t_cp, ""),
                                      ("numba-cuda, fused by hand", t_cu, "")])


SECTIONS = [cpu_rows, gpu_rows]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="hetflow bench dir", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true")
    p.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    p.add_argument("-n", type=int, default=None, help="elements (default 10^7; --quick: 10^5)")
    args = p.parse_args(argv)
    n = args.n or (10**5 if args.quick else 10**7)
    repeat = 2 if args.quick else 7
    rows = [row for section in SECTIONS for row in section(n, repeat)]
    cpu = hetflow.get_device("cpu0")
    report(rows, args.json, f"hetflow bench dir ({cpu.name}, {cpu.compute_units} cores); "
                            f"ratio = baseline time / fused graph time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
