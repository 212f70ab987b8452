"""Shared helpers for benchmarks: timing, tables, JSON output, the MPI launcher."""
from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from hetflow.errors import CommError


def best_time(fn, repeat=5, warmup=1, sync=None) -> float:
    """Best wall time of ``fn()`` over ``repeat`` runs after ``warmup`` runs (seconds)."""
    for _ in range(warmup):
        fn()
        if sync:
            sync()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        best = min(best, time.perf_counter() - t0)
    return best


def race(*fns, repeat, sync=None):
    """Best time of each of ``fns``, run in alternating rounds after one warm-up each.

    Each round starts with the next contender in turn, so that none always runs first or
    always after the same one. Race parallel code in pairs: one that runs after a
    single-threaded contender (NumPy) finds the threading layer's workers asleep."""
    best = [float("inf")] * len(fns)
    for r in range(repeat + 1):
        for k in (*range(r % len(fns), len(fns)), *range(r % len(fns))):
            fn = fns[k]
            t0 = time.perf_counter()
            fn()
            if sync:
                sync()
            if r:
                best[k] = min(best[k], time.perf_counter() - t0)
    return best


def per_call(fn, calls, repeat=5) -> float:
    """Seconds per call: the best of ``repeat`` means over ``calls`` calls each."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def report(rows, as_json: bool, title: str) -> None:
    """Print ``rows`` (dicts with name, baseline, hetflow, unit, ratio, target) as a table or JSON."""
    if as_json:
        print(json.dumps({"benchmark": title, "rows": rows}, indent=1))
        return
    print(title)
    print(f"{'case':44s} {'baseline':>14s} {'hetflow':>14s} {'ratio':>8s}  target")
    for r in rows:
        print(f"{r['name']:44s} {r['baseline']:>14s} {r['hetflow']:>14s} {r['ratio']:>8.2f}x  {r.get('target', '')}")


def fmt_s(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.2f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.3f} s"


def mpiexec() -> str:
    """The MPI launcher for benchmarks that start themselves under MPI: the one beside
    this Python (hetflow[mpi] installs MPICH's there, and mpi4py was built for it), else
    the first on PATH."""
    beside = Path(sys.executable).with_name("mpiexec")
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if found is None:
        raise CommError(f"no mpiexec beside {sys.executable} or on PATH: install hetflow[mpi] "
                        f"(MPICH from PyPI brings it) or put your MPI's mpiexec on PATH")
    return found
