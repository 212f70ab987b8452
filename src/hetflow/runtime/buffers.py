"""Buffers ("streams", SPEC §2): memory objects with a host copy and per-device copies.

A :class:`Buffer` (made by ``hetflow.array(data)``) is passed to ``forall``, ``reduce``,
``scan``, ``sort`` and ``queue.enqueue`` like an array, and views over it work as
views over arrays do. The runtime keeps its
copies coherent by tracking which of them hold the current contents (the *valid*
copies): before an instance runs on a device, a stale copy there is refreshed from a
valid one (through the host when it comes from another GPU); after an instance wrote
the buffer on a device, that device's copy is the only valid one. The CPU works on the
host copy itself. Device copies are allocated on first use and kept for later launches,
so a chain of kernels on one GPU moves no data until the host asks for it.

The host reaches the contents through :meth:`Buffer.read` / :meth:`Buffer.numpy` (a
copy), ``np.asarray(buffer)`` (the host copy, read-only), :meth:`Buffer.write` and
:meth:`Buffer.map` (the host copy itself, writable); a GPU through :meth:`Buffer.cupy`
and DLPack. Each first waits for the instances enqueued before it that touch the
buffer, like any other access. GPU copies are CuPy arrays where CuPy runs (Numba's
device arrays under the simulator). ``moved`` counts the bytes copied each way.
"""
from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np

from ..errors import DTypeError, QueueError
from ..platform.cuda_compat import cuda_module, cupy_module
from . import deps
from .events import LOCK

HOST = "host"


class Buffer:
    """A coherent array with copies on the host and on the devices that used it.

    ``Buffer(shape, dtype=float64)`` allocates a zero-filled buffer; ``Buffer(array)``
    one holding a copy of ``array`` (``dtype`` converts).
    """

    hetflow_coherent = True  # an array root for views (hetflow.index.arrays.is_array)

    def __init__(self, data, dtype=None):
        try:
            dtype = None if dtype is None else np.dtype(dtype)
        except TypeError:
            raise DTypeError(f"Buffer: {dtype!r} is not a NumPy dtype") from None
        if isinstance(data, (int, np.integer)) or (
                isinstance(data, tuple) and all(isinstance(d, (int, np.integer)) for d in data)):
            shape = (int(data),) if not isinstance(data, tuple) else tuple(int(d) for d in data)
            if any(d < 0 for d in shape):
                raise QueueError(f"Buffer shape {shape} has a negative dimension")
            host = np.zeros(shape, dtype=np.float64 if dtype is None else dtype)
        elif hasattr(data, "__cuda_array_interface__") and cupy_module() is not None:
            host = None  # a GPU array: its copy becomes the buffer's GPU copy, below
        else:
            host = np.array(data, dtype=dtype, order="C", copy=True)
            if host.dtype == object:
                raise QueueError(f"Buffer needs numeric data, got {type(data).__name__} of objects")
        self._devices: dict[str, tuple] = {}  # device id -> (CUDA ordinal, device array)
        self._valid = {HOST}
        self._lock = threading.Lock()          # transfers; the runtime orders the rest
        self.moved = {"to_device": 0, "to_host": 0}  # bytes copied each way
        if host is None:
            cupy = cupy_module()
            ordinal = data.device.id if hasattr(data, "device") else 0
            with cupy.cuda.Device(ordinal):
                copy = cupy.array(data, dtype=dtype, order="C", copy=True)
            host = np.empty(copy.shape, copy.dtype)
            self._devices[f"gpu{ordinal}"] = (ordinal, copy)
            self._valid = {f"gpu{ordinal}"}
        self._host = host

    # -- facts ---------------------------------------------------------------------------
    @property
    def shape(self) -> tuple:
        return self._host.shape

    @property
    def dtype(self):
        return self._host.dtype

    @property
    def ndim(self) -> int:
        return self._host.ndim

    @property
    def nbytes(self) -> int:
        return self._host.nbytes

    @property
    def valid(self) -> tuple[str, ...]:
        """Where the current contents are: ``'host'`` and/or device ids."""
        return tuple(sorted(self._valid))

    def __repr__(self):
        return f"<hetflow Buffer {self.shape} {self.dtype} valid on {', '.join(self.valid)}>"

    def __str__(self):
        return str(self.__array__())

    def __len__(self):
        return len(self._host)

    # -- interoperation --------------------------------------------------------------------
    def __array__(self, dtype=None, copy=None):
        """The current host copy, read-only (write through :meth:`write` or :meth:`map`)."""
        self._wait(write=False, timeout=None)
        with self._lock:
            self._to_host()
        out = self._host.view()
        out.flags.writeable = False
        if copy:
            out = out.copy()
        return out if dtype is None else out.astype(dtype, copy=False)

    def __getitem__(self, key):
        return self.__array__()[key]

    def numpy(self) -> np.ndarray:
        """A NumPy copy of the contents."""
        return self.read()

    def cupy(self, device: str = "gpu0"):
        """The GPU copy on ``device`` itself, made current, as a CuPy array (no transfer
        when it is valid there). The caller may write it: the other copies become stale."""
        from ..platform.devices import get_device

        dev = get_device(device)
        self._wait(write=True, timeout=None)
        with self._lock:
            self._to_device(dev)
            self._valid = {dev.id}
            return self._devices[dev.id][1]

    def __dlpack_device__(self):
        gpu = next((d for d in self._valid if d != HOST), None)
        return self._devices[gpu][1].__dlpack_device__() if gpu else self._host.__dlpack_device__()

    def __dlpack__(self, **kwargs):
        """A GPU copy where one is current, else the host copy (the consumer may write:
        that copy becomes the only valid one)."""
        gpu = next((d for d in self._valid if d != HOST), None)
        return (self.cupy(gpu) if gpu else self.map()).__dlpack__(**kwargs)

    # -- host access -------------------------------------------------------------------------
    def read(self, timeout: float | None = None) -> np.ndarray:
        """A copy of the contents, once the instances that write them are done."""
        self._wait(write=False, timeout=timeout)
        with self._lock:
            self._to_host()
            return self._host.copy()

    def write(self, data, timeout: float | None = None) -> None:
        """Replace the contents with ``data`` (broadcast to the buffer's shape), once the
        instances enqueued before that touch the buffer are done."""
        data = np.asarray(data)
        try:
            fits = np.broadcast_shapes(data.shape, self.shape) == self.shape
        except ValueError:
            fits = False
        if not fits:
            raise QueueError(f"cannot write data of shape {data.shape} into a Buffer of shape {self.shape}")
        self._wait(write=True, timeout=timeout, check=False)
        with self._lock:
            self._host[...] = data
            self._valid = {HOST}
        with LOCK:
            deps.host_wrote_locked(self)

    def map(self, timeout: float | None = None) -> np.ndarray:
        """The host copy itself, made current, for reading and writing in place.

        Device copies become stale (the host may write), so the next instance on a GPU
        copies the contents there again. Kernels take the Buffer, not the mapped array:
        the runtime orders instances by the Buffer.
        """
        self._wait(write=True, timeout=timeout)
        with self._lock:
            self._to_host()
            self._valid = {HOST}
        return self._host

    def _wait(self, write: bool, timeout: float | None, check: bool = True) -> None:
        """Wait for earlier instances touching the buffer (writers; readers too when
        ``write``); with ``check``, raise the failure of the last writer if the
        application has not seen it yet (the contents are not valid)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with LOCK:
            pending = deps.pending_locked(self, write)
        for event in pending:
            event._block(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if check:
            with LOCK:
                writer = deps.last_writer_locked(self)
            if writer is not None and deps.poisoned(writer):
                raise writer.exception()

    # -- runtime side ------------------------------------------------------------------------
    def acquire(self, device) -> object:
        """The copy ``device`` works on, made current (called by the runtime before a run)."""
        if device.kind == "cpu":
            if HOST in self._valid:  # the iterative case: no lock, nothing to move
                return self._host
        elif device.id in self._valid:
            return self._devices[device.id][1]
        with self._lock:
            if device.kind == "cpu":
                self._to_host()
                return self._host
            self._to_device(device)
            return self._devices[device.id][1]

    def wrote(self, device) -> None:
        """An instance wrote the buffer on ``device``: only that copy is current now."""
        with self._lock:
            self._valid = {HOST if device.kind == "cpu" else device.id}

    def _to_device(self, device) -> None:
        cupy = cupy_module()
        if device.id not in self._devices:
            self._devices[device.id] = (device.ordinal, _allocate(cupy, device, self.shape, self.dtype))
        if device.id not in self._valid:
            self._to_host()
            array = self._devices[device.id][1]
            if cupy is not None:
                with cupy.cuda.Device(device.ordinal):
                    array.set(self._host)
            else:
                with cuda_module().gpus[device.ordinal]:
                    array.copy_to_device(self._host)
            self.moved["to_device"] += self._host.nbytes
            self._valid.add(device.id)

    def _to_host(self) -> None:
        if HOST in self._valid:
            return
        ordinal, array = self._devices[next(iter(self._valid))]
        cupy = cupy_module()
        if cupy is not None:
            with cupy.cuda.Device(ordinal):
                array.get(out=self._host)
        else:
            with cuda_module().gpus[ordinal]:
                array.copy_to_host(self._host)
        self.moved["to_host"] += self._host.nbytes
        self._valid.add(HOST)


def _allocate(cupy, device, shape, dtype):
    """An uninitialised GPU array on ``device``: CuPy's where it runs, else Numba's."""
    if cupy is not None:
        with cupy.cuda.Device(device.ordinal):
            return cupy.empty(shape, dtype)
    with cuda_module().gpus[device.ordinal]:
        return cuda_module().device_array(shape, dtype)


def acquired(launch):
    """``launch`` with every Buffer among its entry arguments (plain or a view's root)
    replaced by its copy on the launch's device, made current."""
    device = launch.device
    entry = tuple(a.acquire(device) if type(a) is Buffer else a for a in launch.entry_args)
    return dataclasses.replace(launch, entry_args=entry)


def wrote(launch, written) -> None:
    """After ``launch`` ran: the Buffers behind the arguments at positions ``written``
    (plain or a view's root) are current on its device alone."""
    for k in written:
        root = getattr(launch.args[k], "root", launch.args[k])
        if type(root) is Buffer:
            root.wrote(launch.device)


def array(data, dtype=None) -> Buffer:
    """A coherent array holding a copy of ``data`` (NumPy, CuPy, anything array-like):
    the runtime moves it between host and devices only when a launch or a read needs it."""
    return Buffer(data, dtype)
