"""``hetflow demo``: heat diffusion on a 2-D grid, on every local device, checked against NumPy."""
from __future__ import annotations

import time

import numpy as np

from .. import interior, cshift
from ..kernels import kernel
from ..platform.devices import devices
from ..runtime.forall import forall


@kernel
def heat_step(i, j, new, centre, north, south, west, east, alpha):
    """One explicit diffusion step on the interior, written with views."""
    new[i, j] = centre[i, j] + alpha * (north[i, j] + south[i, j] + west[i, j] + east[i, j] - 4.0 * centre[i, j])


def numpy_step(u, alpha):
    out = u.copy()
    c = u[1:-1, 1:-1]
    out[1:-1, 1:-1] = c + alpha * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] - 4.0 * c)
    return out


def initial(n):
    u = np.zeros((n, n))
    u[n // 4: n // 2, n // 4: n // 2] = 100.0
    return u


def solve(u, iterations, alpha, device):
    """Run ``iterations`` steps; ``u`` holds the result."""
    v = u.copy()
    for _ in range(iterations):
        forall(interior(v, 1).shape, heat_step,
               interior(v, 1), interior(u, 1),
               interior(cshift(u, 0, -1), 1), interior(cshift(u, 0, 1), 1),
               interior(cshift(u, 1, -1), 1), interior(cshift(u, 1, 1), 1),
               alpha, device=device)
        u, v = v, u
    return u


def add_arguments(p):
    p.add_argument("--size", type=int, default=512, help="grid points per side")
    p.add_argument("--iterations", type=int, default=50)
    p.add_argument("--devices", default=None, help="comma-separated device ids (default: all real devices)")


def run_demo(args) -> int:
    targets = args.devices.split(",") if args.devices else [d.id for d in devices() if not d.simulated]
    reference = initial(args.size)
    for _ in range(args.iterations):
        reference = numpy_step(reference, 0.1)
    ok = True
    print(f"heat diffusion {args.size}x{args.size}, {args.iterations} iterations")
    for dev in targets:
        t0 = time.perf_counter()
        u = solve(initial(args.size), args.iterations, 0.1, dev)
        dt = time.perf_counter() - t0
        err = float(np.max(np.abs(u - reference)))
        ok &= err <= 1e-9
        print(f"  {dev:6s} {dt:8.3f} s   max |error| vs NumPy {err:.2e}")
    print(f"residual: {float(np.sum(np.abs(numpy_step(reference, 0.1) - reference))):.6e}")
    print(f"verification: {'passed' if ok else 'failed'}")
    return 0 if ok else 1
