"""Running bound launches on the CPU: compile once per signature, then chunks.

The entry point is a Numba ``nogil`` function, so chunks run truly in parallel on the
runtime's threads.
"""
from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor

import numba
from numba.core.errors import NumbaError

from ..platform.repository import repository
from .launch import Launch

# Below this many indices a launch runs on the calling thread: waking workers costs more.
INLINE_LIMIT = 1 << 15


def compile_launch(launch: Launch) -> None:
    """Compile (or load from the repository) the entry for this launch's argument types."""
    if launch.plan.compiled:
        return
    exe = launch.executable
    sig = tuple(numba.typeof(a) for a in (0, 0, *launch.inner, *launch.entry_args))
    try:
        exe.entry.compile(sig)
    except NumbaError as exc:
        raise exe.compile_error(exc, launch.device, launch.kernel) from None
    except Exception:  # noqa: BLE001
        # Anything but a compiler error here comes from reading stored machine code (a
        # truncated or foreign cache file: pickle, EOF, OS errors): drop the entry and
        # compile afresh once rather than crash; a second failure is raised as is.
        repository().forget(exe)
        fresh = repository().executable(launch.kernel, launch.device, len(launch.extent),
                                        _lowerings(launch))
        launch.plan.executable = fresh
        try:
            fresh.entry.compile(sig)
        except NumbaError as exc2:
            raise fresh.compile_error(exc2, launch.device, launch.kernel) from None
    launch.plan.compiled = True


def _lowerings(launch: Launch) -> dict:
    from ..index import views as _views
    from ..index.lowering import lowering

    data = launch.kernel.params[len(launch.extent):]
    return {n: lowering(a, f"{n}__p") for n, a in zip(data, launch.args) if _views.is_view(a)}


def chunk_runner(launch: Launch):
    """A callable ``run(lo, hi)`` executing rows ``[lo, hi)`` of the launch (GIL released)."""
    entry = launch.executable.entry
    tail = (*launch.inner, *launch.entry_args)
    return lambda lo, hi: entry(lo, hi, *tail)


@functools.lru_cache(maxsize=1)
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="hetflow-cpu")


def run(launch: Launch, workers: int) -> None:
    """Run the whole launch on ``workers`` CPU threads, rows split evenly."""
    compile_launch(launch)
    rows = launch.extent[0]
    run_chunk = chunk_runner(launch)
    total = rows
    for e in launch.inner:
        total *= e
    if total <= INLINE_LIMIT or workers <= 1 or rows <= 1:
        run_chunk(0, rows)
        return
    parts = min(workers, rows)
    bounds = [rows * k // parts for k in range(parts + 1)]
    futures = [_pool().submit(run_chunk, bounds[k], bounds[k + 1]) for k in range(1, parts)]
    run_chunk(bounds[0], bounds[1])
    for f in futures:
        f.result()

