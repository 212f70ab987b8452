"""Managed (CUDA unified) memory: one host array that the CPU cores and a GPU both use in place.

``hetflow.empty(shape, device="managed")`` (and ``zeros``) returns a plain NumPy array
whose buffer is CUDA managed memory (``cuMemAllocManaged`` through numba-cuda). To
hetflow and to the user it is a host array: views, CPU kernels and NumPy work on it as
on any other. A launch on a real GPU passes its pointer to the kernel instead of copying
the array in and out: the driver migrates pages to whichever processor touches them.
That makes moving an iterative program between the CPU and a GPU (a rule changing a
launch's placement) cost one migration of the pages, not a copy per launch.

Under Numba's CUDA simulator, and where numba-cuda is absent, managed arrays are
ordinary host arrays and GPU launches copy them like any other.
"""
from __future__ import annotations

import numpy as np

from hetflow.errors import NoDeviceError
from hetflow.platform.cuda_compat import cuda_available, cuda_module, simulated


def managed(fill: str, shape, dtype) -> np.ndarray:
    """A new NumPy array in managed memory (``fill``: 'empty' or 'zeros')."""
    if not cuda_available():
        raise NoDeviceError("device='managed' needs CUDA managed memory: no CUDA GPU "
                            "(real or simulated) is available")
    if simulated():  # the simulator has no managed memory: its GPU reads host arrays anyway
        return getattr(np, fill)(shape, dtype=dtype)
    owner = cuda_module().managed_array(shape, dtype=dtype)
    array = np.asarray(owner)  # a plain ndarray whose base, the owner, keeps the memory alive
    if fill == "zeros":
        array[...] = 0
    return array


def _owner(array: np.ndarray):
    """The numba-cuda managed allocation under ``array``, or None."""
    managed_type = cuda_module().cudadrv.devicearray.ManagedNDArray
    base = array
    while isinstance(base, np.ndarray):
        if isinstance(base, managed_type):
            return base
        base = base.base
    return None


def device_view(array: np.ndarray):
    """A device array over ``array``'s own memory when it is managed (no copy), else None."""
    if simulated() or not isinstance(array, np.ndarray) or cuda_module() is None or _owner(array) is None:
        return None
    desc = {"shape": array.shape, "strides": array.strides, "data": (array.ctypes.data, False),
            "typestr": array.dtype.str, "version": 3}
    if array.dtype.fields is not None:
        desc["descr"] = array.dtype.descr
    return cuda_module().from_cuda_array_interface(desc, owner=array, sync=False)
