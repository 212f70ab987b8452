"""Jacobi iteration for Laplace's equation, written with views over coherent arrays.

    python examples/jacobi.py [--size 512] [--iterations 200] [--devices cpu0,gpu0]

Each step reads four shifted views of ``u`` and writes the interior of ``v``; no array
is copied to form the neighbours: the views lower to index arithmetic in the kernel.
The grids are coherent arrays (``hetflow.array``): each device keeps the rows it works
on between steps, so on a GPU the grid moves in once and out once, not at every step.
By default the loop runs on every real device of the machine (the CPU alone where there
is no GPU), balanced by the performance model and work stealing.
"""
import argparse
import sys
import time

import numpy as np

import hetflow
from hetflow import cshift, interior
from hetflow.cli.demo import device_ids


@hetflow.kernel
def jacobi_step(i, j, new, north, south, west, east):
    new[i, j] = 0.25 * (north[i, j] + south[i, j] + west[i, j] + east[i, j])


def initial(n):
    """Boundary: top edge held at 1, the rest at 0."""
    u = np.zeros((n, n))
    u[0, :] = 1.0
    return u


def solve(n=256, iterations=100, device=None):
    """The grid after ``iterations`` steps, as a NumPy array."""
    u, v = hetflow.array(initial(n)), hetflow.array(initial(n))  # v's border is u's: it never changes
    for _ in range(iterations):
        hetflow.forall(interior(u, 1).shape, jacobi_step, interior(v, 1),
                       interior(cshift(u, 0, -1), 1), interior(cshift(u, 0, 1), 1),
                       interior(cshift(u, 1, -1), 1), interior(cshift(u, 1, 1), 1), device=device)
        u, v = v, u
    return np.asarray(u)  # brings the host copy up to date


def numpy_solve(n=256, iterations=100):
    u = initial(n)
    for _ in range(iterations):
        w = u.copy()
        w[1:-1, 1:-1] = 0.25 * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:])
        u = w
    return u


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=512, help="grid points per side (at least 3; default 512)")
    p.add_argument("--iterations", type=int, default=200, help="Jacobi steps (at least 1; default 200)")
    p.add_argument("--devices", default=None,
                   help="comma-separated device ids (default: every real device found)")
    a = p.parse_args(argv)
    if a.size < 3:
        p.error(f"--size must be at least 3 (a grid with an interior point), got {a.size}")
    if a.iterations < 1:
        p.error(f"--iterations must be at least 1, got {a.iterations}")
    try:
        device = device_ids(a.devices) or [d.id for d in hetflow.devices() if not d.simulated]
    except hetflow.HetflowError as exc:
        p.error(str(exc))
    began = time.perf_counter()
    solve(a.size, 1, device)  # start-up: compiling (or loading the code repository's), first copies
    warm = time.perf_counter()
    u = solve(a.size, a.iterations, device)
    seconds = time.perf_counter() - warm
    err = np.max(np.abs(u - numpy_solve(a.size, a.iterations)))
    cells = (a.size - 2) ** 2 * a.iterations
    print(f"{a.size}x{a.size}, {a.iterations} iterations on {', '.join(device)}: start-up "
          f"{warm - began:.3f} s, then {seconds:.3f} s ({cells / seconds / 1e6:.1f} Mcell/s); heat "
          f"that entered through the top edge {u[1:-1, 1:-1].sum():.4f}; max |difference| from "
          f"NumPy {err:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
