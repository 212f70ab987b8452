"""Running bound launches on the CPU: compile once per signature, then run.

The chunk entry is a Numba ``nogil`` function, so chunks run truly in parallel on the
work-stealing runtime's threads; a whole launch on one CPU goes through the parallel
entry instead (Numba's threading layer, as fast as a hand-written ``prange``).

A launch of few indices runs on the calling thread when its work is small too: the
cost of a row on one core is measured (the plan keeps the last two measures, the smaller
deciding; the performance model, :mod:`.perfmodel`, keeps a history), and a small launch
predicted to take ``INLINE_SECONDS`` or more is spread over the cores (1,000 rows each
scanning a million samples): on a pool of threads, or through the parallel entry where
it is predicted to take longer than ``PARALLEL_SECONDS``.
"""
from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from time import perf_counter

import numba
import numpy as np
from numba.core.dispatcher import Dispatcher
from numba.core.errors import NumbaError

from ..errors import HetflowError, KernelError, KernelRaisedError
from ..platform.repository import StoredCodeUnreadable, repository
from .launch import Launch, warn_scattered
from .perfmodel import device_key, kernel_key, perf_model

# Above this many indices a launch always runs over all cores (Numba's threading layer).
INLINE_LIMIT = 1 << 15
# Fewer indices run on the calling thread unless predicted to take this long there:
# handing pieces to other threads costs tens of microseconds.
INLINE_SECONDS = 200e-6
# Fewer indices whose work on one core is predicted to take longer than this run through
# Numba's threading layer too, as the largest do: threads of hetflow's own pool would
# contend with that layer's workers, which spin a while after a user's prange (OpenMP's).
PARALLEL_SECONDS = 2e-3
# The first launch of a plan times rows on the calling thread, doubling their number
# until they took this long, to learn the cost of a row before deciding on the rest.
PROBE_SECONDS = 20e-6
ONE_CORE = "/one-core"  # the model's entry of a kernel's rate on one core (rows/s)


def _signature(launch: Launch, head: tuple) -> tuple:
    return tuple(numba.typeof(a) for a in (*head, *launch.inner, *launch.entry_args))


def _compile(launch: Launch, which: str, sig: tuple):
    """Compile the executable's ``which`` ('entry' or 'parallel') for ``sig``; its
    compiled code for those types (Numba's entry point)."""
    exe = launch.executable
    try:
        return getattr(exe, which).compile(sig)
    except StoredCodeUnreadable as exc:
        # A truncated or foreign cache file (pickle, EOF, OS errors): drop that machine
        # code and compile afresh once rather than crash.
        repository().forget(exe, exc)
    except Exception as exc:  # noqa: BLE001  (Numba's compiler raises more than NumbaError)
        raise _compile_error(exe, launch, sig, exc)
    fresh = repository().executable(launch.kernel, launch.device, len(launch.extent), _lowerings(launch))
    launch.plan.executable, launch.plan.cpu_entry = fresh, None
    launch.plan.compiled = launch.plan.parallel_compiled = False
    try:
        return getattr(fresh, which).compile(sig)
    except Exception as exc:  # noqa: BLE001
        raise _compile_error(fresh, launch, sig, exc)


def _compile_error(exe, launch: Launch, sig: tuple, exc: Exception) -> Exception:
    """What to raise for ``exc``, raised compiling ``exe`` for ``sig``: hetflow's own
    errors as they are; a KernelCompileError naming the kernel, device and line, chained
    to ``exc`` where that is not Numba's own (Numba's internal errors keep their trace)."""
    if isinstance(exc, HetflowError):
        return exc
    if isinstance(exc, StoredCodeUnreadable):  # again, just after its cache was dropped
        return KernelError(f"kernel {launch.kernel.name!r}: the machine code stored in {exe.path} could not "
                           f"be read twice ({exc}); remove that folder")
    cause = None if isinstance(exc, NumbaError) else exc
    if isinstance(exc, NotImplementedError):  # Numba cannot lower a type (float16 on the CPU)
        exc = NumbaError(f"no CPU code for argument types {_names(sig)}: {type(exc).__name__}: {exc}")
    err = exe.compile_error(exc, launch.device, launch.kernel)
    err.__cause__, err.__suppress_context__ = cause, True
    return err


def _names(sig: tuple) -> str:
    return "(" + ", ".join(map(str, sig)) + ")"


def compile_launch(launch: Launch) -> None:
    """Compile (or load from the repository) the chunk entry for this launch's types.

    Where the plan's key fixes every argument's Numba type (NumPy arrays, also as view
    roots, and Python scalars; lowerings not made afresh), the plan keeps the compiled
    code itself: calling it skips the dispatcher's matching of argument types, 40% of a
    one-row launch's Numba call."""
    plan = launch.plan
    if not plan.compiled:
        compiled = _compile(launch, "entry", _signature(launch, (0, 0)))
        plan.cpu_entry = compiled if _typed_by_key(launch) else None
        plan.compiled = True


def _typed_by_key(launch: Launch) -> bool:
    """Does the plan's key fix the Numba type of every entry argument, and is the entry
    Numba's own dispatcher (a checked entry adds an error record to the arguments)?"""
    plan = launch.plan
    return not plan.fresh and not plan.buffers and isinstance(plan.executable.entry, Dispatcher) and all(
        type(a) in _KEYED or type(getattr(a, "root", None)) is np.ndarray for a in launch.args)


# Argument types whose Numba type the plan's key fixes (launch._key: an array's dtype,
# rank, contiguity, writability and alignment; a Python scalar's type).
_KEYED = frozenset((np.ndarray, float, int, bool, complex))


def entry_of(plan):
    """What runs a chunk of a plan's launches: its compiled code, or Numba's dispatcher."""
    return plan.cpu_entry or plan.executable.entry


def _lowerings(launch: Launch) -> dict:
    data = launch.kernel.params[len(launch.extent):]
    return {n: low for n, low in zip(data, launch.lowerings) if low is not None}


def chunk_runner(launch: Launch):
    """A callable ``run(lo, hi)`` executing rows ``[lo, hi)`` of the launch (GIL released);
    what the kernel raises comes out as a :class:`KernelRaisedError`."""
    entry = entry_of(launch.plan)
    tail = (*launch.inner, *launch.entry_args)

    def run(lo, hi):
        try:
            entry(lo, hi, *tail)
        except Exception as exc:
            raise _raised(launch, lo, hi, exc)
    return run


def _raised(launch: Launch, lo, hi, exc: Exception) -> Exception:
    """What to raise for ``exc`` out of the compiled code: a CPU has no faults of its own,
    so anything but hetflow's errors (checked mode's, already naming the kernel) is the
    kernel's, chained."""
    if isinstance(exc, HetflowError):
        return exc
    err = KernelRaisedError.of(launch.kernel.name, launch.device.id, lo, hi, exc)
    err.__cause__ = exc
    return err


# Numba's workqueue threading layer must not be entered by two threads at once.
_parallel_lock = threading.Lock()
_pool: list[ThreadPoolExecutor] = []  # threads running pieces of small heavy launches
_pool_lock = threading.Lock()


def run(launch: Launch, workers: int) -> list[tuple[int, int]]:
    """Run the whole launch: on the calling thread when its work is small, else over
    ``workers`` cores; returns the rows ``(lo, hi)`` each thread ran."""
    if not launch.plan.compiled:
        compile_launch(launch)
    rows = launch.extent[0]
    # the cheapest tests first: a one-row launch is common
    per_row = 0 if rows <= 1 or workers <= 1 else math.prod(launch.extent[1:])
    if per_row == 0:
        _inline(launch, 0, rows)
        return [(0, rows)]
    if rows * per_row > INLINE_LIMIT:
        return _parallel(launch, rows)
    lo, cost = 0, _row_cost(launch)
    if cost is None:  # first launch of this plan: time a few rows first
        lo, cost = _probe(launch, rows)
    if (rows - lo) * cost < INLINE_SECONDS:
        if lo < rows:
            began = perf_counter()
            _inline(launch, lo, rows)
            _learn(launch, rows - lo, perf_counter() - began)
        return [(0, rows)]
    if lo == 0 and rows * cost > PARALLEL_SECONDS and rows >= workers:  # (no probe ran rows)
        return _parallel(launch, rows)
    return ([(0, lo)] if lo else []) + _threads(launch, lo, rows, workers)


def least_rows(launch: Launch) -> int:
    """The fewest rows worth handing to another thread: those of ``INLINE_LIMIT``
    indices, or fewer where a row is known to cost more (``INLINE_SECONDS`` of work)."""
    rows = -(-INLINE_LIMIT // max(1, math.prod(launch.inner)))
    cost = _row_cost(launch)
    return max(1, min(rows, math.ceil(INLINE_SECONDS / cost)) if cost else rows)


def _inline(launch: Launch, lo: int, hi: int) -> None:
    extent, entry = launch.extent, entry_of(launch.plan)
    try:
        if len(extent) == 1:  # without unpacking an empty tuple: a one-index launch spends 1 us here
            entry(lo, hi, *launch.entry_args)
        else:
            entry(lo, hi, *extent[1:], *launch.entry_args)
    except Exception as exc:
        raise _raised(launch, lo, hi, exc)


def _probe(launch: Launch, rows: int) -> tuple[int, float]:
    """Run rows from 0 on this thread, doubling their number until the rows run took
    ``PROBE_SECONDS``; the rows run and the seconds per row of the last step (the
    first step's may hold one-time costs of a first call)."""
    lo, step, spent, steps = 0, 1, 0.0, 0
    while lo < rows and (steps < 2 or spent < PROBE_SECONDS):
        hi = min(rows, lo + step)
        began = perf_counter()
        _inline(launch, lo, hi)
        last, count = perf_counter() - began, hi - lo
        spent, steps = spent + last, steps + 1
        lo, step = hi, 2 * step
    return lo, _learn(launch, count, last)


def _row_cost(launch: Launch) -> float | None:
    """Seconds a row of this launch takes on one core: the smaller of the plan's last two
    measures (``_learn``), else the performance model's history, else None."""
    plan = launch.plan
    if plan.row_cost is None:
        rate = perf_model().throughput(kernel_key(launch.kernel, len(launch.extent)), device_key(launch.device) + ONE_CORE)
        plan.row_cost = 1.0 / rate if rate else None
    return plan.row_cost


def _learn(launch: Launch, rows: int, seconds: float) -> float:
    """Keep the measured cost of a row on the plan, deciding by the smaller of it and the
    last (one run that a loaded machine preempted does not send every later small launch
    to the pool); tell the model when it is news (the plan's first) or the run was long
    enough for its bookkeeping not to matter."""
    plan, cost = launch.plan, max(seconds, 1e-9) / max(rows, 1)
    first, last = plan.row_cost is None, plan.last_row_cost
    plan.row_cost, plan.last_row_cost = cost if last is None or cost < last else last, cost
    if first or seconds > 1e-3:
        perf_model().record(kernel_key(launch.kernel, len(launch.extent)), device_key(launch.device) + ONE_CORE, 1.0 / cost)
    return cost


def _parallel(launch: Launch, rows: int) -> list[tuple[int, int]]:
    """All rows over Numba's threading layer, one even piece per thread."""
    warn_scattered(launch)
    parts = min(numba.get_num_threads(), rows)
    _run_parallel(launch, parts, 0, rows, claim=False)
    return [(rows * p // parts, rows * (p + 1) // parts) for p in range(parts)]


def compile_parallel(launch: Launch) -> None:
    """Compile the launch's parallel entry (rows over Numba's threading layer) unless done."""
    if not launch.plan.parallel_compiled:
        _compile(launch, "parallel", _signature(launch, (1, 0, 0, 1)))
        launch.plan.parallel_compiled = True


def _run_parallel(launch: Launch, parts: int, lo: int, hi: int, claim: bool) -> None:
    """Rows ``[lo, hi)`` in ``parts`` even pieces over Numba's threading layer, each
    thread running the pieces it claims as it comes free (``claim``), else a fixed share
    of them (``kernels.codegen``). Where the kernel raised, its rows are run again as one
    chunk to raise its own exception with them (the launch has failed already: what it
    wrote is undefined either way)."""
    compile_parallel(launch)
    with _parallel_lock:
        try:
            failed = launch.executable.parallel(parts, int(claim), lo, hi, *launch.inner, *launch.entry_args)
        except HetflowError:  # checked mode's, naming the kernel
            raise
        except Exception:  # noqa: BLE001  (checked mode's pieces raise the kernel's exception)
            failed, parts = 0, 1
    if failed >= 0:
        a, b = lo + (hi - lo) * failed // parts, lo + (hi - lo) * (failed + 1) // parts
        chunk_runner(launch)(a, b)
        raise KernelRaisedError.of(launch.kernel.name, launch.device.id, a, b, RuntimeError(
            "it raised on one of Numba's threads, which lost the exception, and not when run again"))


TEAM_PARTS = 8  # pieces per thread of a team's range (Numba's threads claim them as they come free)


def team_runner(launch: Launch, threads: int):
    """``run(lo, hi)``: rows ``[lo, hi)`` over ``threads`` cores at once, through the
    parallel entry (compiled by :func:`compile_parallel`, or on its first call); the
    kernel's failure comes out as from :func:`chunk_runner`. So one worker of a
    co-executed loop stands for a CPU's cores: one Python thread, not one per core."""
    threads = max(1, min(threads, numba.config.NUMBA_NUM_THREADS))

    def run(lo, hi):
        numba.set_num_threads(threads)  # (Numba keeps it per thread: this worker's setting)
        _run_parallel(launch, min(TEAM_PARTS * threads, hi - lo), lo, hi, claim=True)
    return run


def _threads(launch: Launch, lo: int, hi: int, workers: int) -> list[tuple[int, int]]:
    """Rows ``[lo, hi)`` in even pieces on a pool of threads running the chunk entry
    (no parallel entry to compile for a launch this small)."""
    warn_scattered(launch)
    parts = min(workers, hi - lo)
    pieces = [(lo + (hi - lo) * p // parts, lo + (hi - lo) * (p + 1) // parts) for p in range(parts)]
    run_rows = chunk_runner(launch)

    def timed(piece):
        began = perf_counter()
        run_rows(*piece)
        return perf_counter() - began

    futures = [_executor().submit(timed, p) for p in pieces]
    wait(futures)  # every piece done before the first failure is raised
    _learn(launch, hi - lo, sum(f.result() for f in futures))
    return pieces


def _executor() -> ThreadPoolExecutor:
    with _pool_lock:
        if not _pool:
            _pool.append(ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="hetflow-cpu"))
        return _pool[0]
