"""Arrays as indexables: NumPy on the host, CuPy (or any ``__cuda_array_interface__``
object) on a GPU, with zero-copy interop between them and DLPack producers.

A ``device`` argument names where an array should live: ``None`` (leave it where it
is; new arrays go to the host), a device id (``"cpu0"``, ``"gpuN"``, as
``hetflow.devices()`` lists them), ``"gpu"`` (the current GPU), ``"cpu"`` or ``"host"``
(host memory), other libraries' names of a GPU (``"cuda"``, ``"cuda:N"``, ``"gpu:N"``,
an integer ordinal), or a device object with a ``kind`` attribute (``"cpu"`` or
``"gpu"``) and optionally an ``ordinal``. New arrays may also go to ``"managed"`` memory (see
:mod:`hetflow.index.managed`). Under Numba's CUDA simulator, whose GPU works on host
memory, an array placed on a GPU is a NumPy array (as a managed one is).
"""
import contextlib
import re

import numpy as np

from hetflow.errors import ArgumentTypeError, DeviceError, ShapeError
from hetflow.cuda_compat import cuda_module, cupy_module, simulated
from hetflow.index.managed import managed
from hetflow.index.space import extent

DLPACK_CPU, DLPACK_CUDA = 1, 2  # DLPack device types (DLDeviceType)


# GPU array types of the libraries whose every instance lives on a GPU (CuPy's, Numba's
# device arrays), learned on first sight: telling one then costs a set lookup, not the
# hasattr that evaluates CuPy's ``__cuda_array_interface__`` property (it builds a dict
# and asks for the current stream: microseconds, on every launch). Other libraries'
# types are asked each time (a PyTorch tensor has the property, but raises on the CPU).
_DEVICE_TYPES = set()
_GPU_LIBRARIES = frozenset(("cupy", "numba", "numba_cuda"))


def is_device_array(x) -> bool:
    """True for GPU arrays: anything exposing ``__cuda_array_interface__`` (CuPy's and
    Numba's device arrays; not the CUDA simulator's, which are host memory); never a
    NumPy array."""
    kind = type(x)
    if kind in _DEVICE_TYPES:
        return True
    if kind is np.ndarray or isinstance(x, np.ndarray) or not hasattr(x, "__cuda_array_interface__"):
        return False
    if kind.__module__.partition(".")[0] in _GPU_LIBRARIES:
        _DEVICE_TYPES.add(kind)
    return True


def gpu_ordinal(x) -> int | None:
    """The ordinal of the GPU whose memory holds device array ``x`` (CuPy's, Numba's, any
    with the CUDA array interface), or None where that cannot be told (the simulator's)."""
    device = getattr(x, "device", None)  # CuPy: a cupy.cuda.Device
    if isinstance(getattr(device, "id", None), int):
        return device.id
    data = getattr(x, "gpu_data", None)  # Numba's device arrays: a MemoryPointer in a context
    context = getattr(data, "context", None)
    if context is not None:
        return context.device.id
    interface = getattr(x, "__cuda_array_interface__", None)
    cp = cupy_module() if interface is not None else None
    if cp is None or not interface["data"][0]:
        return None
    return cp.cuda.runtime.pointerGetAttributes(interface["data"][0]).device


def is_host_array(x):
    """True for host arrays: NumPy arrays and ``__array_interface__`` exporters."""
    return isinstance(x, np.ndarray) or hasattr(x, "__array_interface__")


def is_array(x):
    """True for arrays that can be the root of a view (hetflow's coherent Buffers too)."""
    return is_device_array(x) or is_host_array(x) or getattr(type(x), "hetflow_coherent", False)


# Every concrete view class (filled in by View.__init_subclass__ in views.py, which builds on
# this module): a set lookup of the type is what the hot paths use, being several times
# cheaper than isinstance with an ABC.
_VIEW_TYPES = set()


def is_view(x):
    """True when ``x`` is a view."""
    return type(x) in _VIEW_TYPES


def required_cupy(why):
    """CuPy, or DeviceError saying that ``why`` needs it."""
    cupy = cupy_module()
    if cupy is None:
        raise DeviceError(f"{why} needs CuPy with a CUDA GPU, and none is available")
    return cupy


def array_module(x):
    """``numpy`` for host arrays, ``cupy`` for GPU arrays."""
    if is_device_array(x):
        return required_cupy("a GPU array")
    return np


def _placement(device):
    """(``"cpu"`` | ``"gpu"`` | None, GPU ordinal or None) for a ``device`` argument."""
    if device is None:
        return None, None
    if isinstance(device, int) and not isinstance(device, bool) and device >= 0:
        return "gpu", device  # a GPU ordinal, as CuPy numbers them
    if isinstance(device, str):
        # hetflow's ids ('cpu0', 'gpu1', as hetflow.devices() lists them) and other
        # libraries' names of the same devices ('cuda:1', 'gpu:1', 'host'), which users write
        kind, ordinal = re.fullmatch(r"([a-z]*):?(.*)", device.lower()).groups()
        kinds = {"cpu": "cpu", "host": "cpu", "gpu": "gpu", "cuda": "gpu"}
        where = kinds.get(kind)
        if where == "gpu" and (not ordinal or ordinal.isdigit()):
            return "gpu", int(ordinal) if ordinal else None
        if where == "cpu" and ordinal in ("", "0"):  # one CPU: cpu0
            return "cpu", None
    elif getattr(device, "kind", None) in ("cpu", "gpu"):
        return device.kind, getattr(device, "ordinal", None)
    raise ArgumentTypeError(f"unknown device {device!r}: use None, a device id ('cpu0', 'gpu0', ...), 'gpu' "
                            f"(the current GPU), 'cpu' or 'host', 'managed' (new arrays), a GPU ordinal, "
                            f"'cuda:N', or a Device")


def _on_gpu(ordinal):
    """(the array module of GPU ``ordinal`` (None: the current GPU), a context making it
    current): CuPy's; NumPy's and none under the simulator, whose GPU works on host memory."""
    if simulated() and cuda_module() is not None:
        _check_ordinal(ordinal, len(cuda_module().gpus))
        return np, contextlib.nullcontext()
    cupy = required_cupy("placing an array on a GPU")
    if ordinal is None:
        return cupy, contextlib.nullcontext()
    _check_ordinal(ordinal, cupy.cuda.runtime.getDeviceCount())
    return cupy, cupy.cuda.Device(ordinal)


def _check_ordinal(ordinal, count: int) -> None:
    if ordinal is not None and ordinal >= count:
        raise DeviceError(f"no GPU {ordinal} to place an array on: this machine has {count} "
                          f"(ordinals 0..{count - 1})")


def _from_dlpack(x):
    device_type = x.__dlpack_device__()[0]
    if device_type == DLPACK_CUDA:
        return required_cupy("a CUDA DLPack tensor").from_dlpack(x)
    if device_type == DLPACK_CPU:
        return np.from_dlpack(x)
    raise ArgumentTypeError(f"DLPack device type {device_type} of {type(x).__name__} is "
                            f"neither CPU ({DLPACK_CPU}) nor CUDA ({DLPACK_CUDA})")


def asarray(x, device=None, dtype=None):
    """``x`` as a NumPy array (host) or a CuPy array (GPU), copying only when needed.

    Arrays already in the right place are returned as they are; GPU arrays of other
    libraries are wrapped through ``__cuda_array_interface__`` and DLPack producers
    (``__dlpack__``) through ``from_dlpack``, both without copies. Views are
    materialised. Moving between host and GPU copies.
    """
    kind, ordinal = _placement(device)
    if is_view(x):
        x = x.cupy() if kind == "gpu" and not simulated() else x.numpy()
    elif hasattr(x, "__dlpack__") and not is_array(x):
        x = _from_dlpack(x)
    if kind == "gpu" or (kind is None and is_device_array(x)):
        cupy, where = _on_gpu(ordinal)
        with where:
            return cupy.asarray(x, dtype=dtype)
    if is_device_array(x):
        x = required_cupy("copying a GPU array to the host").asnumpy(x)
    return np.asarray(x, dtype=dtype)


def new_array_args(op, shape, dtype) -> tuple:
    """``(shape, dtype)`` of a new array, checked: ShapeError for a negative dimension,
    ArgumentTypeError for one that is no integer and for a dtype NumPy does not know,
    each naming ``op`` and the value (NumPy's own errors are not hetflow's)."""
    try:
        dims = tuple(extent(shape))
    except (ShapeError, ArgumentTypeError) as e:
        raise type(e)(f"{op}: bad shape {shape!r}: {e}") from None
    try:
        return dims, np.dtype(dtype)
    except TypeError:
        raise ArgumentTypeError(f"{op}: dtype {dtype!r} is not a NumPy dtype") from None


def _new(fill, shape, dtype, device):
    shape, dtype = new_array_args(fill, shape, dtype)
    if isinstance(device, str) and device.lower() == "managed":
        return managed(fill, shape, dtype)
    kind, ordinal = _placement(device)
    if kind == "gpu":
        cupy, where = _on_gpu(ordinal)
        with where:
            return getattr(cupy, fill)(shape, dtype=dtype)
    return getattr(np, fill)(shape, dtype=dtype)


def zeros(shape, dtype=np.float64, device=None):
    """A new zero-filled array of ``shape`` on the host, on a GPU via CuPy, or (``device=
    "managed"``) a host array in CUDA managed memory that GPU launches use in place."""
    return _new("zeros", shape, dtype, device)


def empty(shape, dtype=np.float64, device=None):
    """A new uninitialised array of ``shape``, placed as for :func:`zeros`."""
    return _new("empty", shape, dtype, device)
