"""Running bound launches on the CPU: compile once per signature, then run.

The chunk entry is a Numba ``nogil`` function, so chunks run truly in parallel on the
work-stealing runtime's threads; a whole launch on one CPU goes through the parallel
entry instead (Numba's threading layer, as fast as a hand-written ``prange``).
"""
from __future__ import annotations

import threading

import numba
from numba.core.errors import NumbaError

from ..errors import HetflowError, KernelRaisedError
from ..platform.repository import repository
from .launch import Launch

# Below this many indices a launch runs on the calling thread: waking workers costs more.
INLINE_LIMIT = 1 << 15


def _signature(launch: Launch, head: tuple) -> tuple:
    return tuple(numba.typeof(a) for a in (*head, *launch.inner, *launch.entry_args))


def _compile(launch: Launch, which: str, sig: tuple) -> None:
    """Compile the executable's ``which`` ('entry' or 'parallel') for ``sig``."""
    exe = launch.executable
    try:
        getattr(exe, which).compile(sig)
    except NumbaError as exc:
        raise exe.compile_error(exc, launch.device, launch.kernel) from None
    except NotImplementedError as exc:  # Numba cannot lower a type (float16 on the CPU): no cache fault
        raise exe.compile_error(NumbaError(f"no CPU code for argument types {_names(sig)}: "
                                           f"{type(exc).__name__}: {exc}"), launch.device, launch.kernel) from exc
    except Exception as exc:  # noqa: BLE001
        # Anything but a compiler error here comes from reading stored machine code (a
        # truncated or foreign cache file: pickle, EOF, OS errors): drop that machine code
        # and compile afresh once rather than crash; a second failure is raised as is.
        repository().forget(exe, exc)
        fresh = repository().executable(launch.kernel, launch.device, len(launch.extent),
                                        _lowerings(launch))
        launch.plan.executable = fresh
        launch.plan.compiled = launch.plan.parallel_compiled = False
        try:
            getattr(fresh, which).compile(sig)
        except NumbaError as exc2:
            raise fresh.compile_error(exc2, launch.device, launch.kernel) from None


def _names(sig: tuple) -> str:
    return "(" + ", ".join(map(str, sig)) + ")"


def compile_launch(launch: Launch) -> None:
    """Compile (or load from the repository) the chunk entry for this launch's types."""
    if not launch.plan.compiled:
        _compile(launch, "entry", _signature(launch, (0, 0)))
        launch.plan.compiled = True


def _lowerings(launch: Launch) -> dict:
    data = launch.kernel.params[len(launch.extent):]
    return {n: low for n, low in zip(data, launch.lowerings) if low is not None}


def chunk_runner(launch: Launch):
    """A callable ``run(lo, hi)`` executing rows ``[lo, hi)`` of the launch (GIL released);
    what the kernel raises comes out as a :class:`KernelRaisedError`."""
    entry = launch.executable.entry
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


def run(launch: Launch, workers: int) -> None:
    """Run the whole launch: inline when small, else over all cores with Numba's
    threading layer (one even piece of rows per thread, as a hand-written prange)."""
    plan = launch.plan
    if not plan.compiled:
        compile_launch(launch)
    extent = launch.extent
    rows = extent[0]
    inner = extent[1:]
    total = rows
    for e in inner:
        total *= e
    if total <= INLINE_LIMIT or workers <= 1 or rows <= 1:
        try:
            if inner:
                plan.executable.entry(0, rows, *inner, *launch.entry_args)
            else:  # 1-D: no argument tuple built from two
                plan.executable.entry(0, rows, *launch.entry_args)
        except Exception as exc:
            raise _raised(launch, 0, rows, exc)
        return
    parts = min(numba.get_num_threads(), rows)
    if not launch.plan.parallel_compiled:
        compile_launch(launch)
        _compile(launch, "parallel", _signature(launch, (parts, rows)))
        launch.plan.parallel_compiled = True
    with _parallel_lock:
        try:
            launch.executable.parallel(parts, rows, *launch.inner, *launch.entry_args)
            return
        except HetflowError:  # checked mode's, naming the kernel
            raise
        except Exception:     # the kernel raised: Numba's parallel layer loses it (a SystemError)
            pass
    # Run the launch again as one chunk to raise the kernel's own exception with its rows
    # (the launch has failed already: what it wrote is undefined either way).
    chunk_runner(launch)(0, rows)
