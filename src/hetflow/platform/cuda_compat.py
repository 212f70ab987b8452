"""Import numba.cuda (real or simulated) safely, whatever the NumPy version.

numba-cuda 0.30.x refers to ``np.row_stack`` at import time, which NumPy 2.5 removed;
``np.vstack`` is the same function, so we restore the alias before importing. The
shim is guarded: it only adds the name when it is missing.
"""
import functools
import os
import sys

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
    ourselves is what the ``.pth`` line does.
    """
    if "numba.cuda" not in sys.modules:
        try:
            import _numba_cuda_redirector  # noqa: F401  (installs the finder on import)
        except ImportError:  # numba-cuda absent: numba.cuda is whatever Numba ships
            pass


@functools.lru_cache(maxsize=1)
def cuda_module():
    """Return ``numba.cuda``, or None when numba-cuda is not installed or fails to import."""
    _patch_numpy()
    _use_numba_cuda()
    try:
        from numba import cuda
    except Exception:  # numba-cuda absent, or broken CUDA install: no GPU backend
        return None
    if not simulated():  # the simulator runs hetflow.atomic as Python
        from ..kernels.atomic import register_cuda

        register_cuda(cuda)
    return cuda


def simulated():
    """True when numba.cuda runs on the CPU simulator (NUMBA_ENABLE_CUDASIM=1)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


@functools.lru_cache(maxsize=1)
def cuda_available():
    """True when a CUDA device (real or simulated) can run kernels."""
    cuda = cuda_module()
    if cuda is None:
        return False
    try:
        return bool(cuda.is_available())
    except Exception:  # driver errors mean no usable GPU
        return False


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
