"""Jacobi iteration for Laplace's equation, written with views.

    python examples/jacobi.py [--size 512] [--iterations 200] [--devices cpu0,gpu0]

Each step reads four shifted views of ``u`` and writes the interior of ``v``; no array
is copied to form the neighbours: the views lower to index arithmetic in the kernel.
"""
import argparse

import numpy as np

import hetflow
from hetflow import cshift, interior


@hetflow.kernel
def jacobi_step(i, j, new, north, south, west, east):
    new[i, j] = 0.25 * (north[i, j] + south[i, j] + west[i, j] + east[i, j])


def solve(n=256, iterations=100, device=None):
    """Boundary: top edge held at 1, the rest at 0. Returns the grid after ``iterations``."""
    u = np.zeros((n, n))
    u[0, :] = 1.0
    v = u.copy()
    for _ in range(iterations):
        hetflow.forall(interior(u, 1).shape, jacobi_step, interior(v, 1),
                       interior(cshift(u, 0, -1), 1), interior(cshift(u, 0, 1), 1),
                       interior(cshift(u, 1, -1), 1), interior(cshift(u, 1, 1), 1), device=device)
        u, v = v, u
    return u


def numpy_solve(n=256, iterations=100):
    u = np.zeros((n, n))
    u[0, :] = 1.0
    for _ in range(iterations):
        w = u.copy()
        w[1:-1, 1:-1] = 0.25 * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:])
        u = w
    return u


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=512)
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--devices", default=None, help="comma-separated device ids")
    a = p.parse_args()
    device = a.devices.split(",") if a.devices else None
    u = solve(a.size, a.iterations, device)
    err = np.max(np.abs(u - numpy_solve(a.size, a.iterations)))
    print(f"centre value {u[a.size // 2, a.size // 2]:.6f}; max |difference| from NumPy {err:.2e}")
