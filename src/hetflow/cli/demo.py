"""``hetflow demo``: the main job.

Heat diffusion on a 2-D grid, one explicit step written with ``interior`` and
``cshift`` views, captured as a DIR (two steps: u -> v, v -> u) and run under the
default adaptive rules, co-executed on every local device with work stealing; checked
against NumPy. Under ``mpiexec -n K hetflow demo`` the grid is split by rows over the
ranks (see :mod:`hetflow.dist`). Writes a Chrome/Perfetto trace and a timeline picture.
"""
from __future__ import annotations

import time

import numpy as np

from .. import trace
from ..index import cshift, interior
from ..ir import RuleSet, graph
from ..kernels import kernel
from ..platform.devices import devices, get_device

ALPHA = 0.1


@kernel
def heat_step(i, j, new, centre, north, south, west, east, alpha):
    """One explicit diffusion step on the interior, written with views."""
    new[i, j] = centre[i, j] + alpha * (north[i, j] + south[i, j] + west[i, j] + east[i, j] - 4.0 * centre[i, j])


def step_views(src, dst):
    """The arguments of one step from ``src`` into ``dst`` (all views: nothing copied)."""
    return (interior(dst, 1), interior(src, 1),
            interior(cshift(src, 0, -1), 1), interior(cshift(src, 0, 1), 1),
            interior(cshift(src, 1, -1), 1), interior(cshift(src, 1, 1), 1), ALPHA)


def numpy_step(u):
    out = u.copy()
    c = u[1:-1, 1:-1]
    out[1:-1, 1:-1] = c + ALPHA * (u[:-2, 1:-1] + u[2:, 1:-1] + u[1:-1, :-2] + u[1:-1, 2:] - 4.0 * c)
    return out


def initial(n):
    u = np.zeros((n, n))
    u[n // 4: n // 2, n // 4: n // 2] = 100.0
    u[n // 2: 3 * n // 4, n // 2: 3 * n // 4] = 50.0
    return u


def add_arguments(p):
    p.add_argument("--size", type=int, default=1024, help="grid points per side (default 1024)")
    p.add_argument("--iterations", type=int, default=100, help="diffusion steps (even; default 100)")
    p.add_argument("--devices", default=None,
                   help="comma-separated device ids (default: every real device found)")
    p.add_argument("--rules", default=None, help="a TOML rule file to use instead of the default rules")
    p.add_argument("--trace", default="hetflow-trace.json", help="where to write the Chrome/Perfetto trace")
    p.add_argument("--timeline", default="hetflow-timeline.png", help="where to draw the timeline")


def solve(u, iterations, targets, rules, on_iteration=lambda k: None):
    """Run ``iterations`` (even) steps on ``u`` in place; returns the graph that ran."""
    v = u.copy()
    with graph("heat") as g:
        shape = interior(u, 1).shape
        from ..runtime.forall import forall

        forall(shape, heat_step, *step_views(u, v), device=targets, schedule="steal")
        forall(shape, heat_step, *step_views(v, u), device=targets, schedule="steal")
    for k in range(iterations // 2):
        g.run(rules=rules)  # a safe point: the rules see the monitor's feedback first
        on_iteration(2 * (k + 1))
    return g


def summary_rows(recorder):
    """Per device: chunks, indices and steals over every recorded loop."""
    rows = {}
    for loop in recorder.loops:
        for w in loop.report.workers:
            r = rows.setdefault(w.device_id, {"kind": w.kind, "workers": set(), "chunks": 0,
                                             "indices": 0, "steals": 0, "busy": 0.0})
            r["workers"].add(w.name)
            r["chunks"] += w.chunks
            r["indices"] += w.indices
            r["steals"] += w.steals
            r["busy"] += w.busy_s
    return rows


def print_summary(rows, n, iterations, seconds):
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"heat diffusion {n}x{n}, {iterations} iterations, {seconds:.2f} s")
    for col in ("device", "kind", "workers", "chunks", "steals", "rows run", "share"):
        t.add_column(col, justify="right" if col not in ("device", "kind") else "left")
    total = sum(r["indices"] for r in rows.values()) or 1
    for dev, r in sorted(rows.items()):
        t.add_row(dev, r["kind"], str(len(r["workers"])), str(r["chunks"]), str(r["steals"]),
                  str(r["indices"]), f"{100 * r['indices'] / total:.1f}%")
    Console().print(t)
    cells = (n - 2) ** 2 * iterations
    print(f"throughput: {cells / seconds / 1e6:.1f} Mcell/s")


def run_demo(args) -> int:
    if args.iterations < 2 or args.iterations % 2:
        raise SystemExit("hetflow demo: --iterations must be even and >= 2")
    targets = ([get_device(d.strip()).id for d in args.devices.split(",")] if args.devices
               else [d.id for d in devices() if not d.simulated])
    rules = RuleSet.load(args.rules) if args.rules else RuleSet.default()
    n = args.size
    u = initial(n)
    reference = initial(n)
    print(f"devices: {', '.join(targets)}; rules: {args.rules or 'default'}")
    with trace.record() as rec, trace.progress(args.iterations, "diffusing") as bar:
        t0 = time.perf_counter()
        solve(u, args.iterations, targets, rules, on_iteration=lambda k: bar.advance(2))
        seconds = time.perf_counter() - t0
    for _ in range(args.iterations):
        reference = numpy_step(reference)
    print_summary(summary_rows(rec), n, args.iterations, seconds)
    error = float(np.max(np.abs(u - reference)))
    residual = float(np.sqrt(np.mean((numpy_step(u) - u) ** 2)))
    ok = error <= 1e-9 * max(1.0, float(np.max(np.abs(reference))))
    rec.save(args.trace)
    picture = rec.plot(args.timeline)
    print(f"trace: {args.trace} ({picture.bars} chunks on {picture.lanes} lanes); timeline: {args.timeline}")
    print(f"max |error| vs NumPy: {error:.3e}")
    print(f"residual: {residual:.6e}")
    print(f"verification: {'passed' if ok else 'failed'}")
    return 0 if ok else 1
