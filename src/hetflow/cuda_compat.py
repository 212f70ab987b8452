"""Import numba.cuda (real or simulated) safely, whatever the NumPy version.

numba-cuda 0.30.x refers to ``np.row_stack`` at import time, which NumPy 2.5 removed;
``np.vstack`` is the same function, so we restore the alias before importing. The
shim is guarded: it only adds the name when it is missing.

numba-cuda also types every NumPy ufunc in a kernel but lowers only those in its own
table (``numba.cuda.ufuncs.ufunc_db``): ``np.sqrt(x[i])`` compiles on the CPU and fails
on a GPU with ``KeyError: <ufunc 'sqrt'>``. A kernel is written once for every device,
so the ufuncs that are one of CUDA's libdevice functions on floats are added to that
table, lowered by numba-cuda's own implementation of the ``math`` function.

This module sits below every other hetflow package (it imports none): what must happen
when numba-cuda is first imported, registers here (:func:`on_cuda_import`).
"""
import functools
import importlib.metadata
import importlib.util
import math
import os
import sys
import warnings

import numpy as np


def _patch_numpy():
    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack


def _use_numba_cuda():
    """Make ``numba.cuda`` the numba-cuda package wherever it is installed.

    numba-cuda replaces Numba's own deprecated CUDA target through a finder installed by
    a ``.pth`` file; where that file is not processed (a venv that adds another
    environment's site-packages by path, ``python -S``), ``numba.cuda`` would be the old
    target, which fails on hetflow's kernels ("Signature mismatch"). Installing the finder
    ourselves is what the ``.pth`` line does. It happens when this module is imported (so
    at ``import hetflow``): a user's own ``from numba import cuda`` after that gets
    numba-cuda too, not only hetflow's first :func:`cuda_module`.
    """
    if "numba.cuda" not in sys.modules:
        try:
            import _numba_cuda_redirector  # noqa: F401  (installs the finder on import)
        except ImportError:  # numba-cuda absent: numba.cuda is whatever Numba ships
            pass


_patch_numpy()
_use_numba_cuda()

# Called with numba.cuda once it is imported for a real GPU (hetflow.atomic's GPU versions).
_on_import: list = []


def on_cuda_import(hook) -> None:
    """Call ``hook(numba.cuda)`` when numba-cuda is imported for a real GPU: at once if it
    already is, else on the first :func:`cuda_module`. Not under the simulator."""
    _on_import.append(hook)
    if cuda_module.cache_info().currsize and not simulated():
        cuda = cuda_module()
        if cuda is not None:
            hook(cuda)


# Why there is no GPU backend, once cuda_module or cuda_available found none (for
# ``hetflow devices``); None while there is one, or before they were asked.
why_no_gpu: str | None = None


@functools.lru_cache(maxsize=1)
def cuda_module():
    """Return ``numba.cuda``, or None when numba-cuda is not installed, fails to import
    or cannot be set up for hetflow (then :data:`why_no_gpu` says which)."""
    global why_no_gpu
    if importlib.util.find_spec("numba_cuda") is None:
        # Numba's own deprecated CUDA target, which numba-cuda replaces, cannot run
        # hetflow's kernels: without numba-cuda a machine has no GPU backend (a CPU-only
        # install is `pip install hetflow`, without the cuda extra).
        why_no_gpu = "numba-cuda is not installed (pip install 'hetflow[cuda]')"
        return None
    try:
        from numba import cuda
    except Exception as exc:  # broken CUDA install: no GPU backend
        why_no_gpu = f"numba.cuda failed to import: {exc!r}"
        return None
    if not simulated():  # the simulator runs hetflow.atomic and NumPy as Python
        try:
            for hook in _on_import:
                hook(cuda)
        except Exception as exc:  # a numba-cuda whose API hetflow does not know: CPUs only
            why_no_gpu = f"numba-cuda {_version('numba-cuda')} could not be set up for hetflow: {exc!r}"
            warnings.warn(f"hetflow: {why_no_gpu}; GPUs are not used", RuntimeWarning, stacklevel=2)
            return None
        _add_math_ufuncs()
    return cuda


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


# NumPy ufuncs whose float loops are the ``math`` function of the same meaning (np.remainder
# is not math.remainder; np.absolute on floats is fabs).
UNARY_MATH_UFUNCS = {np.sqrt: math.sqrt, np.exp: math.exp, np.exp2: math.exp2, np.expm1: math.expm1,
                     np.log1p: math.log1p, np.fabs: math.fabs, np.absolute: math.fabs,
                     np.floor: math.floor, np.ceil: math.ceil, np.trunc: math.trunc}
BINARY_MATH_UFUNCS = {np.power: math.pow, np.fmod: math.fmod, np.copysign: math.copysign,
                      np.nextafter: math.nextafter}


def _add_math_ufuncs():
    """Add to numba-cuda's ufunc table the float32/float64 loops of the ufuncs above that
    it lacks (a newer numba-cuda may have them: its own entries stay)."""
    try:
        from numba.cuda import mathimpl, ufuncs
        table = ufuncs.ufunc_db()
    except (ImportError, AttributeError):  # another numba-cuda layout: leave it as it is
        return
    for group, impl_of in ((UNARY_MATH_UFUNCS, mathimpl.get_unary_impl_for_fn_and_ty),
                           (BINARY_MATH_UFUNCS, mathimpl.get_binary_impl_for_fn_and_ty)):
        for ufunc, fn in group.items():
            if ufunc in table:
                continue
            loops = ("ff->f", "dd->d") if ufunc.nin == 2 else ("f->f", "d->d")
            table[ufunc] = dict.fromkeys(loops, functools.partial(_lower_as, impl_of, fn))


def _lower_as(impl_of, fn, context, builder, sig, args):
    """Lower a ufunc's loop as numba-cuda lowers ``fn`` (a ``math`` function)."""
    return impl_of(fn, sig.args[0])(context, builder, sig, args)


def simulated():
    """True when numba.cuda runs on the CPU simulator (NUMBA_ENABLE_CUDASIM=1)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


@functools.lru_cache(maxsize=1)
def cuda_available():
    """True when a CUDA device (real or simulated) can run kernels."""
    global why_no_gpu
    cuda = cuda_module()
    if cuda is None:
        return False
    try:
        found = bool(cuda.is_available())
    except Exception as exc:  # driver errors mean no usable GPU
        why_no_gpu = f"the CUDA driver failed: {exc!r}"
        return False
    why_no_gpu = None if found else "numba-cuda found no CUDA driver or GPU"
    return found


@functools.lru_cache(maxsize=1)
def cupy_module():
    """Return CuPy when it imports and sees a real GPU, else None (checked once)."""
    if simulated():
        return None
    try:
        import cupy
        cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no CuPy, or no driver
        return None
    return cupy
