"""Shared helpers for benchmarks: options, timing, targets, tables, JSON output, the MPI launcher."""
from __future__ import annotations

import argparse
import json
import math
import operator
import shutil
import sys
import time
from pathlib import Path
from typing import NamedTuple

from hetflow.errors import CommError


def at_least(least, kind=int):
    """An argparse ``type``: a ``kind`` (int or float) number no smaller than ``least``;
    another is a usage error naming it (``argument --size: must be at least 3; got -5``)."""
    return _bounded(kind, operator.ge, least, f"at least {least}")


def above(bound, kind=float):
    """An argparse ``type``: a ``kind`` number larger than ``bound``, as :func:`at_least`."""
    return _bounded(kind, operator.gt, bound, f"above {bound}")


def _bounded(kind, compare, bound, words):
    def parse(text):
        value = kind(text)
        if not (compare(value, bound) and math.isfinite(value)):
            raise argparse.ArgumentTypeError(
                f"must be {'a finite number ' if kind is float else ''}{words}; got {text}")
        return value

    # argparse names the type in its message for text that is no number ("invalid int value: 'x'")
    parse.__name__ = kind.__name__
    return parse


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


COMPARISONS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}


class Clause(NamedTuple):
    """One part of a row's target, as the table prints it, and whether the figure meets it."""
    text: str
    met: bool


def clause(figure: float, op: str, limit: float, unit: str = "x", label: str = "", note: str = "") -> Clause:
    """The target ``figure op limit``. ``unit``: "x" (a ratio), "s" (seconds: hetflow's
    time, or an overhead), "%" (a fraction) or "" (a plain number); ``label`` names the
    figure before the comparison ("overhead"), ``note`` follows the limit ("per task")."""
    text = " ".join(part for part in (label, op, _limit_text(limit, unit), note) if part)
    return Clause(text, bool(COMPARISONS[op](figure, limit)))


def _limit_text(limit: float, unit: str) -> str:
    """The limit as its target was written: a ratio or number as given (1.0x stays 1.0x),
    seconds in the unit that reads best, a fraction in percent."""
    if unit == "%":
        return f"{limit:.0%}"
    if unit == "s":
        scale, name = (1e6, "us") if limit < 1e-3 else (1e3, "ms") if limit < 1 else (1, "s")
        return f"{limit * scale:g} {name}"
    return f"{limit}{unit}"


def verdict(*clauses: Clause, info: str = "") -> dict:
    """A row's ``target`` and ``met`` fields: ``info`` (figures shown in the target column),
    then the clauses with "met" when every one holds, else "MISSED" and, where others hold,
    those that do not (a target may bound both the ratio and hetflow's time); ``met`` is
    None without clauses.
    An absolute time counts only on the machines docs/performance.md names, but is marked
    wherever it is measured: the figure is what it is."""
    if not clauses:
        return {"target": info, "met": None}
    met = all(c.met for c in clauses)
    missed = [c.text for c in clauses if not c.met]
    mark = "met" if met else "MISSED" + (f" ({', '.join(missed)})" if len(missed) < len(clauses) else "")
    text = f"{', '.join(c.text for c in clauses)}: {mark}"
    return {"target": f"{info}; {text}" if info else text, "met": met}


def report(rows, as_json: bool, title: str) -> None:
    """Print ``rows`` (dicts with name, baseline, hetflow, ratio and :func:`verdict`'s
    target and met) as a table or JSON."""
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
