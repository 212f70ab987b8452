"""Buffers ("streams", SPEC §2): memory objects with a host copy and per-device copies.

A :class:`Buffer` is passed to ``queue.enqueue`` like an array. The runtime keeps its
copies coherent by tracking which of them hold the current contents (the *valid*
copies): before an instance runs on a device, a stale copy there is refreshed from a
valid one (through the host when it comes from another GPU); after an instance wrote
the buffer on a device, that device's copy is the only valid one. The CPU works on the
host copy itself. Device copies are allocated on first use and kept for later launches,
so a chain of kernels on one GPU moves no data until the host asks for it.

The host reaches the contents through :meth:`Buffer.read` (a copy),
:meth:`Buffer.write` and :meth:`Buffer.map` (the host copy itself). Each first waits
for the instances enqueued before it that touch the buffer, like any other access.
"""
from __future__ import annotations

import threading
import time

import numpy as np

from ..errors import DTypeError, QueueError
from ..platform.cuda_compat import cuda_module
from . import deps
from .events import LOCK

HOST = "host"


class Buffer:
    """A coherent array with copies on the host and on the devices that used it.

    ``Buffer(shape, dtype=float64)`` allocates a zero-filled buffer; ``Buffer(array)``
    one holding a copy of ``array`` (``dtype`` converts).
    """

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
        else:
            host = np.array(data, dtype=dtype, order="C", copy=True)
            if host.dtype == object:
                raise QueueError(f"Buffer needs numeric data, got {type(data).__name__} of objects")
        self._host = host
        self._devices: dict[str, tuple] = {}  # device id -> (CUDA ordinal, device array)
        self._valid = {HOST}
        self._lock = threading.Lock()          # transfers; the runtime orders the rest

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
        cuda = cuda_module()
        with cuda.gpus[device.ordinal]:
            if device.id not in self._devices:
                self._devices[device.id] = (device.ordinal, cuda.device_array(self.shape, self.dtype))
            if device.id not in self._valid:
                self._to_host()
                self._devices[device.id][1].copy_to_device(self._host)
                self._valid.add(device.id)

    def _to_host(self) -> None:
        if HOST in self._valid:
            return
        ordinal, array = self._devices[next(iter(self._valid))]
        with cuda_module().gpus[ordinal]:
            array.copy_to_host(self._host)
        self._valid.add(HOST)
