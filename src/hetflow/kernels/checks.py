"""Checked mode (``boundscheck``): every subscript of a kernel's array parameters is
checked at run time, and an index outside the array raises
:class:`~hetflow.errors.IndexOutOfBoundsError` naming the kernel, the parameter, the
axis and the index.

In checked mode the kernel receives each array parameter as a checked value
(:mod:`.viewtypes`), whose subscripts call a helper defined here as text, compiled for
the target:

Both record the first failure in a small array the entry takes last (``__hf_err``:
flag, parameter, axis, index, extent):

- CPU: ``__hf_ix`` records it and raises :class:`OutOfBounds` with no arguments; the
  entry's wrapper reads the record into the named error. (An exception with run-time
  arguments cannot be raised from machine code that Numba loaded from its cache, in a
  later process: Numba fails to build the arguments' tuple.) Numba's own
  ``boundscheck`` is on as well, for subscripts the checked values do not see (arrays
  made in the kernel, rows taken from one): its ``IndexError`` becomes the error
  without a parameter name.
- GPU (numba-cuda has no boundscheck): ``__hf_ix`` / ``__hf_ok`` record it and skip the
  access; the entry's wrapper reads the record back after the launch.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from ..errors import IndexOutOfBoundsError

ERR = "__hf_err"      # the error record's parameter name in generated code
RECORD = 5            # flag, parameter position, axis, index, extent
RECORD_TYPE = numba.typeof(np.zeros(RECORD, np.int64))

CPU_HELPERS = '''
def __hf_ix(k, n, wrap, pid, axis, err):
    if k >= n or k < (-n if wrap else 0):
        err[0] = 1
        err[1] = pid
        err[2] = axis
        err[3] = k
        err[4] = n
        raise __hf_OutOfBounds
    return k
'''

# A failed load reads element 0 instead (its value is never seen: the launch raises);
# a failed store is skipped.
GPU_HELPERS = '''
def __hf_ok(k, n, wrap, pid, axis, err):
    if k < n and k >= (-n if wrap else 0):
        return True
    if __hf_cuda.atomic.cas(err, 0, 0, 1) == 0:
        err[1] = pid
        err[2] = axis
        err[3] = k
        err[4] = n
    return False


def __hf_ix(k, n, wrap, pid, axis, err):
    return k if __hf_ok(k, n, wrap, pid, axis, err) else k - k
'''

HELPERS = {"cpu": (CPU_HELPERS, ("__hf_ix",)), "gpu": (GPU_HELPERS, ("__hf_ok", "__hf_ix"))}


def enabled_by_env() -> bool:
    """``HETFLOW_BOUNDSCHECK`` set to anything but '', '0', 'false', 'no' or 'off'."""
    return os.environ.get("HETFLOW_BOUNDSCHECK", "").strip().lower() not in ("", "0", "false", "no", "off")


class OutOfBounds(Exception):
    """Raised by compiled CPU checks once the error record holds the failure."""


class Bounds:
    """What the error of a checked executable names: the kernel and its data parameters."""

    def __init__(self, kernel: str, params: tuple, views):
        self.kernel, self.params, self.views = kernel, tuple(params), frozenset(views)

    def error(self, pid, axis, index, extent) -> IndexOutOfBoundsError:
        name = self.params[pid]
        if name in self.views:
            what = f"view {name!r} out of bounds: root index {index} on axis {axis} of its root array"
        else:
            what = f"{name!r} out of bounds: index {index} on axis {axis}"
        return IndexOutOfBoundsError(f"kernel {self.kernel!r} indexed {what}, whose extent there is "
                                     f"{extent}", self.kernel, name, int(axis), int(index))

    def unnamed(self, exc: IndexError) -> IndexOutOfBoundsError:
        return IndexOutOfBoundsError(
            f"kernel {self.kernel!r} indexed an array out of bounds ({exc}): an array that is not "
            f"one of its parameters, a row taken from one, or one inside a kernel it calls", self.kernel)

    def raise_if(self, record) -> None:
        """Raise the failure an error record holds, if any."""
        if record[0]:
            raise self.error(*(int(v) for v in record[1:RECORD]))


class CheckedCpuEntry:
    """A CPU chunk entry whose failures come out as IndexOutOfBoundsError."""

    def __init__(self, dispatcher, bounds: Bounds):
        self.dispatcher, self.bounds = dispatcher, bounds

    def __call__(self, *args):
        record = np.zeros(RECORD, np.int64)
        try:
            return self.dispatcher(*args, record)
        except OutOfBounds:
            self.bounds.raise_if(record)
            raise  # unreachable: a raised OutOfBounds has filled the record
        except IndexError as exc:  # Numba's boundscheck
            raise self.bounds.unnamed(exc) from None

    def compile(self, sig):
        """Compile for the argument types ``sig`` and the error record's."""
        return self.dispatcher.compile((*sig, RECORD_TYPE))

    def __getattr__(self, name):  # stats, ...: the dispatcher's
        return getattr(self.dispatcher, name)


class CheckedCpuParallel:
    """Rows ``[lo, hi)`` of a checked launch in ``parts`` pieces, on threads running the
    chunk entry (Numba's parallel layer drops exceptions raised in its threads), a thread
    a piece (so ``claim`` changes nothing); what a piece raises is raised, so it returns
    -1 (no piece failed) as the parallel entry does."""

    def __init__(self, entry: CheckedCpuEntry):
        self.entry = entry

    def compile(self, sig):
        return self.entry.compile(sig[2:])  # (parts, claim, lo, hi, ...): the pieces' (lo, hi, ...)

    def __call__(self, parts, claim, lo, hi, *rest):
        with ThreadPoolExecutor(parts) as pool:
            pieces = [pool.submit(self.entry, lo + (hi - lo) * p // parts, lo + (hi - lo) * (p + 1) // parts, *rest)
                      for p in range(parts)]
        for piece in pieces:
            piece.result()
        return -1


class CheckedGpuEntry:
    """A GPU entry taking the error record as its last argument: a configured launch
    passes a fresh one, waits for the kernel and raises the failure it holds."""

    def __init__(self, kernel, bounds: Bounds, cuda):
        self.kernel, self.bounds, self.cuda = kernel, bounds, cuda

    def __getitem__(self, config):
        configured = self.kernel[config]
        stream = config[2] if len(config) > 2 else None
        cuda, bounds = self.cuda, self.bounds

        def launch(*args):
            fresh = np.zeros(RECORD, np.int64)
            err = cuda.to_device(fresh, stream=stream) if stream else cuda.to_device(fresh)
            configured(*args, err)
            record = err.copy_to_host(stream=stream) if stream else err.copy_to_host()
            if stream:
                stream.synchronize()
            bounds.raise_if(record)

        return launch

    def __getattr__(self, name):
        return getattr(self.kernel, name)
