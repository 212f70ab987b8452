"""Managed (CUDA unified) memory: one host array that the CPU cores and a GPU both use in place.

``hetflow.empty(shape, device="managed")`` (and ``zeros``) returns a plain NumPy array
whose buffer is CUDA managed memory (``cuMemAllocManaged`` through numba-cuda's context). To
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

from hetflow.errors import DeviceError
from hetflow.cuda_compat import cuda_available, cuda_module, simulated


class _ManagedMemory:
    """A managed allocation, exported to NumPy as bytes; the base of every managed array."""

    def __init__(self, nbytes: int):
        # The context's allocator (cuMemAllocManaged, attached globally) frees it with us.
        self.memory = cuda_module().current_context().memallocmanaged(max(nbytes, 1))
        self.__array_interface__ = {"data": (self.memory.device_ctypes_pointer.value, False),
                                    "shape": (nbytes,), "typestr": "|u1", "version": 3}


def managed(fill: str, shape, dtype) -> np.ndarray:
    """A new NumPy array in managed memory (``fill``: 'empty' or 'zeros')."""
    if not cuda_available():
        raise DeviceError("device='managed' needs CUDA managed memory: no CUDA GPU "
                          "(real or simulated) is available")
    if simulated():  # the simulator has no managed memory: its GPU reads host arrays anyway
        return getattr(np, fill)(shape, dtype=dtype)
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    array = np.asarray(_ManagedMemory(nbytes)).view(dtype).reshape(shape)
    if fill == "zeros":
        array[...] = 0
    return array


def _is_managed(array: np.ndarray) -> bool:
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, _ManagedMemory)


def device_view(array: np.ndarray):
    """A device array over ``array``'s own memory when it is managed (no copy), else None."""
    if simulated() or not isinstance(array, np.ndarray) or not _is_managed(array):
        return None
    desc = {"shape": array.shape, "strides": array.strides, "data": (array.ctypes.data, False),
            "typestr": array.dtype.str, "version": 3}
    if array.dtype.fields is not None:
        desc["descr"] = array.dtype.descr
    return cuda_module().from_cuda_array_interface(desc, owner=array, sync=False)
