"""Work stealing on CPU cores against a static split and Numba's ``prange``.

Two loops, each run by one hetflow CPU worker per core (a Numba ``nogil`` chunk
function per worker thread) and by the baselines, in one process, alternating the
contenders round by round and keeping each one's best round:

* ``irregular``: the rows of a Mandelbrot image over an off-centre window
  (x in [-2, 0.5], y in [0, 1.25]), so rows near the real axis cost far more than the
  rest and an equal split of the rows is unbalanced.
* ``uniform``: the same arithmetic for every element of a long vector.

Contenders: ``steal`` (``run_loop``, schedule='steal'), ``static`` (``run_loop``,
schedule='static': each worker runs its equal share), ``prange`` (a hand-written
``@njit(parallel=True)`` loop: Numba's default static division of the iterations) and
``prange/cs`` (the same after ``numba.set_parallel_chunksize`` with hetflow's chunk
size, shown for reference; what it changes depends on Numba's threading layer, printed
below the table). Ratios are speed ratios: baseline time / steal time,
above 1 means stealing is faster.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time

import numba
import numpy as np
from numba import njit, prange

from hetflow.errors import RuntimeFailure
from hetflow.runtime.steal import Worker, cpu_chunk_size, run_loop

TARGETS = {("irregular", "static"): 1.3, ("irregular", "prange"): 1.0,
           ("uniform", "prange"): 0.9}


# -- kernels ------------------------------------------------------------------------------
@njit(inline="always")
def _mandel_row(r, out, x0, y0, dx, dy, max_iter):
    ci = y0 + r * dy
    for c in range(out.shape[1]):
        cr = x0 + c * dx
        zr = 0.0
        zi = 0.0
        k = 0
        while k < max_iter and zr * zr + zi * zi <= 4.0:
            zr, zi = zr * zr - zi * zi + cr, 2.0 * zr * zi + ci
            k += 1
        out[r, c] = k


@njit(nogil=True)
def mandel_rows(lo, hi, out, x0, y0, dx, dy, max_iter):
    for r in range(lo, hi):
        _mandel_row(r, out, x0, y0, dx, dy, max_iter)


@njit(parallel=True)
def mandel_prange(out, x0, y0, dx, dy, max_iter):
    for r in prange(out.shape[0]):
        _mandel_row(r, out, x0, y0, dx, dy, max_iter)


@njit(inline="always")
def _uniform_elem(i, x, out):
    v = x[i]
    out[i] = math.sqrt(v) * math.sin(v) + math.cos(2.0 * v) * math.exp(-v * 1e-3)


@njit(nogil=True)
def uniform_chunk(lo, hi, x, out):
    for i in range(lo, hi):
        _uniform_elem(i, x, out)


@njit(parallel=True)
def uniform_prange(x, out):
    for i in prange(x.size):
        _uniform_elem(i, x, out)


# -- contenders ---------------------------------------------------------------------------
def _cpu_workers(count, chunk, run):
    return [Worker(f"core{i}", "cpu", run, chunk, "cpu0") for i in range(count)]


def _prange_chunked(fn, chunk):
    def run():
        old = numba.set_parallel_chunksize(chunk)
        try:
            fn()
        finally:
            numba.set_parallel_chunksize(old)
    return run


def irregular_case(args):
    size = args.size
    out = np.zeros((size, size), dtype=np.int32)
    x0, y0, dx, dy = -2.0, 0.0, 2.5 / size, 1.25 / size
    params = (x0, y0, dx, dy, args.max_iter)
    chunk = cpu_chunk_size(size, args.workers)
    workers = _cpu_workers(args.workers, chunk,
                           lambda lo, hi: mandel_rows(lo, hi, out, *params))
    contenders = {
        "steal": lambda: run_loop(size, workers, schedule="steal", report=False),
        "static": lambda: run_loop(size, workers, schedule="static", report=False),
        "prange": lambda: mandel_prange(out, *params),
        "prange/cs": _prange_chunked(lambda: mandel_prange(out, *params), chunk),
    }
    reference = np.zeros_like(out)
    mandel_rows(0, size, reference, *params)
    return "irregular", f"mandelbrot {size}x{size} rows, max_iter {args.max_iter}", \
        contenders, out, reference, chunk


def uniform_case(args):
    n = args.length
    x = np.random.default_rng(0).uniform(0.0, 100.0, n)
    out = np.zeros(n)
    chunk = cpu_chunk_size(n, args.workers)
    workers = _cpu_workers(args.workers, chunk, lambda lo, hi: uniform_chunk(lo, hi, x, out))
    contenders = {
        "steal": lambda: run_loop(n, workers, schedule="steal", report=False),
        "static": lambda: run_loop(n, workers, schedule="static", report=False),
        "prange": lambda: uniform_prange(x, out),
        "prange/cs": _prange_chunked(lambda: uniform_prange(x, out), chunk),
    }
    reference = np.zeros_like(out)
    uniform_chunk(0, n, x, reference)
    return "uniform", f"{n} elements", contenders, out, reference, chunk


def measure(case, args):
    """Best-of-rounds time per contender; every contender's result checked first."""
    name, what, contenders, out, reference, chunk = case
    for label, run in contenders.items():      # compile, warm up, check
        out[...] = 0
        run()
        if not np.array_equal(out, reference):
            raise RuntimeFailure(f"{name}: {label} computed a different result")
    best = {label: math.inf for label in contenders}
    for _ in range(args.rounds):
        for label, run in contenders.items():
            t = time.perf_counter()
            run()
            best[label] = min(best[label], time.perf_counter() - t)
    return {"case": name, "what": what, "workers": args.workers, "chunk": chunk,
            "seconds": best,
            "ratios": {b: best[b] / best["steal"] for b in contenders if b != "steal"}}


def cpu_section(args):
    numba.set_num_threads(args.workers)
    rows = [measure(irregular_case(args), args), measure(uniform_case(args), args)]
    for row in rows:
        row["threading_layer"] = numba.threading_layer()
    return rows


SECTIONS = {"cpu": cpu_section}


def _table(rows):
    labels = list(rows[0]["seconds"])
    head = ["case", "chunk"] + [f"{lb} ms" for lb in labels] + \
        [f"steal vs {lb}" for lb in labels if lb != "steal"]
    lines = [head]
    for r in rows:
        line = [r["case"], str(r["chunk"])] + [f"{r['seconds'][lb] * 1e3:.1f}" for lb in labels]
        for lb, ratio in r["ratios"].items():
            target = TARGETS.get((r["case"], lb))
            mark = "" if target is None else (f" (>= {target}: "
                                              f"{'met' if ratio >= target else 'MISSED'})")
            line.append(f"{ratio:.2f}x{mark}")
        lines.append(line)
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    text = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in lines]
    text.insert(1, "  ".join("-" * w for w in widths))
    text += [f"{r['case']}: {r['what']}, {r['workers']} workers, Numba threading layer "
             f"{r['threading_layer']}" for r in rows]
    return "\n".join(text)


def _parse(argv):
    p = argparse.ArgumentParser(prog="hetflow bench steal", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="CPU workers (and prange threads); default: one per core")
    p.add_argument("--size", type=int, default=2000, help="Mandelbrot image side")
    p.add_argument("--max-iter", type=int, default=256)
    p.add_argument("--length", type=int, default=1 << 23, help="uniform loop length")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds; the best counts")
    p.add_argument("--quick", action="store_true", help="tiny sizes, one round")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if not 1 <= args.workers <= numba.config.NUMBA_NUM_THREADS:
        p.error(f"--workers must lie in 1..{numba.config.NUMBA_NUM_THREADS} "
                f"(NUMBA_NUM_THREADS), got {args.workers}")
    if args.quick:
        args.size, args.max_iter, args.length, args.rounds = 96, 64, 1 << 14, 1
    return args


def main(argv=None) -> int:
    args = _parse(argv)
    rows = [row for section in SECTIONS.values() for row in section(args)]
    print(json.dumps(rows, indent=1) if args.json else _table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
