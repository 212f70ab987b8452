"""Buffers ("streams", SPEC §2): memory objects with a host copy and per-device copies.

A :class:`Buffer` (made by ``hetflow.array(data)``) is passed to ``forall``, ``reduce``,
``scan``, ``sort`` and ``queue.enqueue`` like an array, and views over it work as
views over arrays do. The runtime keeps its
copies coherent by tracking which rows (ranges of the first dimension) of each copy
hold the current contents (the *valid* rows): before a launch runs rows on a device,
the rows it touches that are stale there are copied from a copy where they are valid
(through the host when that is another GPU); after it wrote rows on a device, those
rows are valid there alone. A launch on one device touches every row; a co-executed
launch (:mod:`hetflow.runtime.coexec`) touches per chunk the rows its views reach, so
each device keeps its block between launches and only halo and stolen rows move. The CPU works on the
host copy itself. Device copies are allocated on first use and kept for later launches,
so a chain of kernels on one GPU moves no data until the host asks for it.

The host reaches the contents through :meth:`Buffer.read` / :meth:`Buffer.numpy` (a
copy), ``np.asarray(buffer)`` (the host copy, read-only), :meth:`Buffer.write` and
:meth:`Buffer.map` (the host copy itself, writable); a GPU through :meth:`Buffer.cupy`
and DLPack. Each first waits for the instances enqueued before it that touch the
buffer, like any other access. GPU copies are CuPy arrays where CuPy runs (Numba's
device arrays under the simulator). ``moved`` counts the bytes copied each way.

A device that failed stops counting (:meth:`Buffer.forget`): the rows current only
there are copied home first. Rows that end up current on no copy (the device's memory
went with it) raise DeviceError naming them, never stale contents.
"""
from __future__ import annotations

import contextlib
import threading
import time

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError, DeviceError, HetflowError, IndexOutOfBoundsError
from ..cuda_compat import cuda_module, cupy_module
from ..index.arrays import DLPACK_CPU
from ..platform.devices import get_device
from . import deps
from .events import LOCK, timeout_seconds

HOST = "host"


class Buffer:
    """A coherent array with copies on the host and on the devices that used it.

    ``Buffer(shape, dtype=float64)`` allocates a zero-filled buffer (``shape``: an int or a
    tuple of ints); ``Buffer(array)`` one holding a copy of ``array`` (``dtype`` converts).
    :meth:`holding` (``hetflow.array``) takes ints and tuples as data, as ``np.array`` does.
    ``len``, iteration, truth value, ``copy``/``deepcopy``/pickling (a new Buffer holding
    the contents) and :meth:`astype` behave as an ndarray's.
    """

    hetflow_coherent = True  # an array root for views (hetflow.index.arrays.is_array)

    def __init__(self, data, dtype=None):
        dtype = _dtype(dtype)
        shape = _shape(data)
        if shape is None:
            self._start(*_copy_of(data, dtype))
        elif any(d < 0 for d in shape):
            raise ArgumentError(f"Buffer shape {shape} has a negative dimension")
        else:
            dtype = numeric(np.float64 if dtype is None else dtype, f"Buffer of shape {shape}")
            try:
                self._start(np.zeros(shape, dtype=dtype))
            except ValueError as exc:  # NumPy: more bytes than an array may hold
                raise ArgumentError(f"Buffer shape {shape} of {dtype}: {exc}") from None

    @classmethod
    def holding(cls, data, dtype=None) -> "Buffer":
        """A buffer holding a copy of ``data``, read as ``np.array(data)`` reads it: an int
        is a 0-d buffer, a tuple of ints a 1-D one (never a shape)."""
        buffer = cls.__new__(cls)
        buffer._start(*_copy_of(data, _dtype(dtype)))
        return buffer

    def _start(self, host, gpu=None) -> None:
        """Hold ``host``, current there, or current only in ``gpu``'s copy: ``(id, ordinal,
        array)`` (``host`` then allocated, not filled)."""
        self._devices: dict[str, tuple] = {}  # device id -> (CUDA ordinal, device array)
        self._lock = threading.Lock()          # transfers; the runtime orders the rest
        self.moved = {"to_device": 0, "to_host": 0}  # bytes copied each way
        where = HOST
        if gpu is not None:
            where, ordinal, copy = gpu
            self._devices[where] = (ordinal, copy)
        self._host = host
        self.rows = host.shape[0] if host.ndim else 1   # a 0-d buffer moves as one row
        self._all = self.all_rows = [(0, self.rows)]
        self._valid: dict[str, list] = {where: self._all}  # copy -> its valid row ranges

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
    def size(self) -> int:
        return self._host.size

    @property
    def nbytes(self) -> int:
        return self._host.nbytes

    @property
    def valid(self) -> tuple[str, ...]:
        """Where the current contents are: ``'host'`` and/or device ids."""
        return tuple(sorted(c for c, r in self._valid.items() if r == self._all))

    @property
    def gpu_ordinals(self) -> tuple[int, ...]:
        """The ordinals of the GPUs holding a copy, current or not."""
        return tuple(ordinal for ordinal, _ in self._devices.values())

    def __repr__(self):
        return f"<hetflow Buffer {self.shape} {self.dtype} valid on {', '.join(self.valid)}>"

    def __str__(self):
        return str(self.__array__())

    def __len__(self):
        if not self.ndim:
            raise ArgumentTypeError(f"len() of a 0-d Buffer {self!r}")
        return len(self._host)

    def __iter__(self):
        """The elements (rows of a higher rank) of the current host copy, as NumPy yields them."""
        if not self.ndim:
            raise ArgumentTypeError(f"iteration over a 0-d Buffer {self!r}")
        return iter(self.__array__())

    def __bool__(self):
        """NumPy's truth value: that of the one element; ArgumentError for any other size."""
        if self.size != 1:
            raise ArgumentError(f"the truth value of a Buffer of {self.size} elements {self!r} is "
                                f"ambiguous: use a.numpy().any() or .all()")
        return bool(self.__array__().reshape(-1)[0])

    def __float__(self):
        return float(self._element("float()"))

    def __int__(self):
        return int(self._element("int()"))

    def __complex__(self):
        return complex(self._element("complex()"))

    def _element(self, what: str):
        """The element of a 0-d Buffer, as NumPy converts a 0-d array; ArgumentTypeError
        for any other rank."""
        if self.ndim:
            raise ArgumentTypeError(f"{what} of a Buffer of shape {self.shape} {self!r}: only a "
                                    f"0-d Buffer converts to a scalar")
        return self.__array__()[()]

    def __reduce__(self):
        # copy, deepcopy and pickle make a new Buffer holding the contents, as they copy an
        # ndarray: sharing the host and device copies with separate validity would go stale.
        return array, (self.read(),)

    # -- interoperation --------------------------------------------------------------------
    def __array__(self, dtype=None, copy=None):
        """The current host copy, read-only (write through :meth:`write` or :meth:`map`).
        ``copy=False`` (NumPy 2) raises ArgumentError where ``dtype`` needs a converted copy."""
        if copy is False and dtype is not None and np.dtype(dtype) != self.dtype:
            raise ArgumentError(f"{self!r} as {np.dtype(dtype)} needs a copy, but copy=False was asked")
        self._wait(write=False, timeout=None)
        with self._lock:
            self._to_host()
        out = self._host.view()
        out.flags.writeable = False
        if copy:
            out = out.copy()
        return out if dtype is None else out.astype(dtype, copy=False)

    def astype(self, dtype) -> "Buffer":
        """A new Buffer holding the contents converted to ``dtype``, as ``ndarray.astype``."""
        return Buffer.holding(self.read(), dtype)

    def __getitem__(self, key):
        with _numpy_errors(self, key):
            return self.__array__()[key]

    def __setitem__(self, key, value):
        """Write on the host, as NumPy does (:meth:`map`): a device copies the contents
        again when it next uses them."""
        with _numpy_errors(self, key):
            self.map()[key] = value

    def numpy(self) -> np.ndarray:
        """A NumPy copy of the contents."""
        return self.read()

    def cupy(self, device: str = "gpu0"):
        """The GPU copy on ``device`` itself, made current, as a CuPy array (no transfer
        when it is valid there). The caller may write it: the other copies become stale."""
        dev = get_device(device)
        if dev.kind != "gpu":
            raise ArgumentError(f"{self!r}.cupy({device!r}): {dev.id} is no GPU (the host copy: "
                                f"np.asarray, map())")
        self._wait(write=True, timeout=None)
        with self._lock:
            self._take(dev.id, self._all)
            self._valid = {dev.id: self._all}
            return self._devices[dev.id][1]

    def __dlpack_device__(self):
        gpu = next((d for d in self.valid if d != HOST), None)
        return self._devices[gpu][1].__dlpack_device__() if gpu else self._host.__dlpack_device__()

    def __dlpack__(self, **kwargs):
        """A GPU copy where one is current, else the host copy (the consumer may write:
        that copy becomes the only valid one); the host copy when the consumer asks for
        the CPU (``dl_device``, as ``np.from_dlpack(a, device="cpu")`` does)."""
        on_cpu = (kwargs.get("dl_device") or (None,))[0] == DLPACK_CPU
        gpu = None if on_cpu else next((d for d in self.valid if d != HOST), None)
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
        try:  # converted as NumPy's assignment converts it
            data = np.asarray(data, dtype=self.dtype)
        except (TypeError, ValueError) as exc:  # ragged sequences, text that is no number
            raise ArgumentTypeError(f"cannot write {type(data).__name__} data into {self!r}: {exc}") from None
        try:
            fits = np.broadcast_shapes(data.shape, self.shape) == self.shape
        except ValueError:
            fits = False
        if not fits:
            raise ArgumentError(f"cannot write data of shape {data.shape} into a Buffer of shape {self.shape}")
        self._wait(write=True, timeout=timeout, check=False)
        with self._lock:
            self._host[...] = data
            self._valid = {HOST: self._all}
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
            self._valid = {HOST: self._all}
        return self._host

    def host_rows(self, lo: int, hi: int, write: bool = False, overwrite: bool = False) -> np.ndarray:
        """Rows ``lo:hi`` of the host copy, made current there, once the instances that
        write them are done (and those that read them, with ``write``): read-only, or with
        ``write`` writable and current on the host alone (the devices copy those rows
        again when they next use them, as after :meth:`map`). ``overwrite``: the caller
        replaces every element, so the rows are not brought up to date first. What a
        distributed array's block and halo exchange use, moving no other rows."""
        self._check_rows(lo, hi, "host_rows")
        write = write or overwrite
        self._wait(write=write, timeout=None)
        with self._lock:
            if not overwrite:
                self._take(HOST, [(lo, hi)])
            if write:
                self._current_alone(HOST, [(lo, hi)])
        rows = self._host[lo:hi]
        rows.flags.writeable = write
        return rows

    def rows_out(self, ranges, out) -> str | None:
        """Rows ``ranges`` (``(lo, hi)`` pairs) copied from a GPU copy that holds them all
        current into the host arrays ``out``, one per range (page-locked: the copies then
        go at once), waited for together, once the instances that write them are done;
        the host copy does not change. That GPU's id, or None, having copied nothing,
        where no GPU copy holds them all. What a halo exchange sends from a GPU's block."""
        self._check_pieces(ranges, out, "rows_out")
        self._wait(write=False, timeout=None)
        wanted = _union(ranges, [])
        with self._lock:
            gpu = next((g for g in self._devices if not _minus(wanted, self._valid.get(g, []))), None)
            if gpu is not None:
                self._copy(gpu, ranges, to_host=True, hosts=out)
        return gpu

    def rows_in(self, gpu: str, ranges, values) -> None:
        """Rows ``ranges`` (disjoint ``(lo, hi)`` pairs) of GPU ``gpu``'s copy (one the
        buffer has) take the host arrays ``values``, one per range, copied together and
        waited for once, after the instances that touch them; they are current there
        alone (the host's rows go stale). What a halo exchange receives into a GPU's
        block, where the next launch reads it."""
        self._check_pieces(ranges, values, "rows_in")
        if gpu not in self._devices:
            raise ArgumentError(f"{self!r}.rows_in: it has no copy on {gpu!r} (its GPU copies: "
                                f"{', '.join(self._devices) or 'none'})")
        self._wait(write=True, timeout=None)
        with self._lock:
            self._copy(gpu, ranges, to_host=False, hosts=values)
            self._current_alone(gpu, _union(ranges, []))

    def copy_rows(self, source: "Buffer", lo: int, hi: int, to: int) -> None:
        """Rows ``lo:hi`` of ``source`` become rows ``to:to + hi - lo`` of this buffer,
        copied within each memory where they are current in ``source`` (a GPU's rows
        stay on that GPU: nothing crosses the bus). What a distributed array keeps of
        its block when its rows are cut again."""
        if source is self or source.shape[1:] != self.shape[1:] or source.dtype != self.dtype:
            raise ArgumentError(f"{self!r}.copy_rows: the source must be another Buffer of rows like "
                                f"this one's, not {source!r}")
        source._check_rows(lo, hi, "copy_rows")
        self._check_rows(to, to + hi - lo, "copy_rows")
        source._wait(write=False, timeout=None)
        self._wait(write=True, timeout=None)
        with source._lock, self._lock:
            source._check_current([(lo, hi)], None)
            for where, rows in list(source._valid.items()):
                for a, b in _intersect([(lo, hi)], rows):
                    self._copy_within(source, where, a, b, to + a - lo)
            for where in self._valid:  # current only where the rows were copied
                self._valid[where] = _minus(self._valid[where], [(to, to + hi - lo)])
            for where, rows in source._valid.items():
                got = [(to + a - lo, to + b - lo) for a, b in _intersect([(lo, hi)], rows)]
                self._valid[where] = _union(self._valid.get(where, []), got)

    def _check_pieces(self, ranges, arrays, site: str) -> None:
        """Raise unless ``arrays`` are host arrays, one per row range of ``ranges``, each
        shaped and typed as those rows."""
        if len(arrays) != len(ranges):
            raise ArgumentError(f"{self!r}.{site}: {len(ranges)} row ranges but {len(arrays)} host arrays")
        for (lo, hi), a in zip(ranges, arrays):
            self._check_rows(lo, hi, site)
            want = (hi - lo, *self.shape[1:])
            if not isinstance(a, np.ndarray) or a.shape != want or a.dtype != self.dtype:
                got = f"{a.shape} {a.dtype}" if isinstance(a, np.ndarray) else type(a).__name__
                raise ArgumentError(f"{self!r}.{site}: rows {lo}:{hi} need a NumPy array of shape {want} "
                                    f"and dtype {self.dtype}, not {got}")

    def _check_rows(self, lo: int, hi: int, site: str) -> None:
        if not (self.ndim and 0 <= lo <= hi <= self.rows):
            raise IndexOutOfBoundsError(f"{self!r}.{site}: rows {lo}:{hi} are not rows of it (0:{self.rows})")

    def _copy_within(self, source: "Buffer", where: str, lo: int, hi: int, to: int) -> None:
        """Rows ``lo:hi`` of ``source``'s copy on ``where`` into rows ``to:...`` of ours there."""
        end = to + hi - lo
        if where == HOST:
            self._host[to:end] = source._host[lo:hi]
            return
        ordinal, array = source._devices[where]
        self._allocate(where, ordinal)
        target = self._devices[where][1]
        cupy = cupy_module()
        with (cupy.cuda.Device(ordinal) if cupy is not None else cuda_module().gpus[ordinal]):
            if cupy is not None:
                target[to:end] = array[lo:hi]
            else:
                target[to:end].copy_to_device(array[lo:hi])

    def _wait(self, write: bool, timeout: float | None, check: bool = True) -> None:
        """Wait for earlier instances touching the buffer (writers; readers too when
        ``write``); with ``check``, raise the failure of the last writer if the
        application has not seen it yet (the contents are not valid)."""
        if timeout is not None:  # (the words of its error are made only when it is refused)
            timeout = timeout_seconds(timeout, repr(self))
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
        where = HOST if device.kind == "cpu" else device.id
        if self._valid.get(where) != self._all:  # iterative programs skip the lock
            with self._lock:
                self._take(where, self._all)
        return self._host if where == HOST else self._devices[where][1]

    def acquire_rows(self, device, ranges) -> None:
        """Make rows ``ranges`` (sorted, disjoint ``(lo, hi)``) current on ``device``."""
        if self.stale_rows(device, ranges):
            with self._lock:
                self._take(HOST if device.kind == "cpu" else device.id, ranges)

    def stale_rows(self, device, ranges) -> list:
        """The rows of ``ranges`` (sorted, disjoint) not current on ``device``'s copy."""
        return _minus(ranges, self._valid.get(HOST if device.kind == "cpu" else device.id, ()))

    def copy_on(self, device) -> object:
        """``device``'s copy as it is (allocated on first use), current or not."""
        if device.kind == "cpu":
            return self._host
        with self._lock:
            self._allocate(device.id, device.ordinal)
        return self._devices[device.id][1]

    def wrote(self, device) -> None:
        """An instance wrote the buffer on ``device``: only that copy is current now."""
        with self._lock:
            self._valid = {HOST if device.kind == "cpu" else device.id: self._all}

    def wrote_rows(self, device, ranges) -> None:
        """Rows ``ranges`` were written on ``device``: current there alone."""
        with self._lock:
            self._current_alone(HOST if device.kind == "cpu" else device.id, ranges)

    def _current_alone(self, where: str, ranges) -> None:
        """Rows ``ranges`` are current on ``where``'s copy alone (caller holds the lock)."""
        for copy in self._valid:
            if copy != where:
                self._valid[copy] = _minus(self._valid[copy], ranges)
        self._valid[where] = _union(self._valid.get(where, []), ranges)

    def forget_rows(self, device, ranges) -> None:
        """Rows ``ranges`` of ``device``'s copy may hold half-applied updates (it failed
        mid-launch): they stop counting as current there. DeviceError if that leaves
        them current nowhere."""
        with self._lock:
            self._valid[device.id] = _minus(self._valid.get(device.id, []), _union(ranges, []))
            self._check_current(_union(ranges, []), device)

    def forget(self, device) -> None:
        """``device`` failed: copy home the rows current only there, then stop counting
        its copy (DeviceError naming the rows if they cannot be copied)."""
        with self._lock:
            try:
                self._take(HOST, self._valid.get(device.id, []))
            except Exception as exc:  # the device's memory is gone with it
                only = self._valid.pop(device.id, [])
                self._devices.pop(device.id, None)
                for rows in self._valid.values():
                    only = _minus(only, rows)
                raise DeviceError(f"{self!r}: rows {only} were current only on {device.id}, which "
                                    f"failed, and cannot be copied home ({exc}): they are lost") from exc
            self._valid.pop(device.id, None)
            self._devices.pop(device.id, None)

    def _check_current(self, ranges, failed) -> None:
        """DeviceError if some of rows ``ranges`` are current on no copy."""
        lost = ranges
        for rows in self._valid.values():
            lost = _minus(lost, rows)
        if lost:
            where = f"on {failed.id}, which failed while a launch updated them in place" if failed else \
                "on a device that failed"
            raise DeviceError(f"{self!r}: rows {lost} were current only {where}: they are lost")

    def _to_host(self) -> None:
        self._take(HOST, self._all)

    def _take(self, where: str, ranges) -> None:
        """Copy the rows of ``ranges`` that are stale on ``where`` from copies where they
        are current (the host first; another GPU's rows come through the host)."""
        missing = _minus(ranges, self._valid.get(where, ()))
        if not missing:
            return
        if where != HOST:
            self._take(HOST, missing)
            self._allocate(where, int(where.removeprefix("gpu")))
            self._copy(where, missing, to_host=False)
        else:
            self._check_current(missing, None)
            left = missing
            for source, rows in list(self._valid.items()):
                pieces = _intersect(left, rows)
                if source != HOST and pieces:
                    self._copy(source, pieces, to_host=True)
                    left = _minus(left, pieces)
        self._valid[where] = _union(self._valid.get(where, []), missing)

    def _allocate(self, where: str, ordinal: int) -> None:
        if where not in self._devices:
            self._devices[where] = (ordinal, _allocate(cupy_module(), ordinal, self.shape, self.dtype))

    def _copy(self, gpu: str, ranges, to_host: bool, hosts=None) -> None:
        """Copy rows ``ranges`` between ``gpu``'s copy and the host copy, one piece per
        range, or host arrays ``hosts``, one per range: those pieces are enqueued on the
        current stream together and waited for once (a wait per piece costs a GPU's
        round trip, about 15 us on the H200 host)."""
        ordinal, array = self._devices[gpu]
        cupy = cupy_module()
        whole = self._host.ndim == 0
        with (cupy.cuda.Device(ordinal) if cupy is not None else cuda_module().gpus[ordinal]):
            stream = cupy.cuda.get_current_stream() if cupy is not None and hosts is not None else None
            for k, (lo, hi) in enumerate(ranges):
                host = hosts[k] if hosts is not None else self._host if whole else self._host[lo:hi]
                dev = array if whole else array[lo:hi]
                if cupy is not None:
                    dev.get(out=host, stream=stream, blocking=stream is None) if to_host else dev.set(host, stream)
                else:
                    dev.copy_to_host(host) if to_host else dev.copy_to_device(host)
                self.moved["to_host" if to_host else "to_device"] += host.nbytes
            if stream is not None:
                stream.synchronize()


def _allocate(cupy, ordinal, shape, dtype):
    """An uninitialised array on GPU ``ordinal``: CuPy's where it runs, else Numba's."""
    if cupy is not None:
        with cupy.cuda.Device(ordinal):
            return cupy.empty(shape, dtype)
    with cuda_module().gpus[ordinal]:
        return cuda_module().device_array(shape, dtype)


def _dtype(dtype):
    try:
        return None if dtype is None else np.dtype(dtype)
    except TypeError:
        raise ArgumentTypeError(f"Buffer: {dtype!r} is not a NumPy dtype") from None


def _shape(data) -> tuple | None:
    """``data`` as the shape of ``Buffer(shape)``: an int or a tuple of them (bools are
    data); None for data."""
    dims = data if isinstance(data, tuple) else (data,)
    if all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in dims):
        return tuple(int(d) for d in dims)
    return None


def _copy_of(data, dtype) -> tuple:
    """``(host, gpu)`` for :meth:`Buffer._start`: a host copy of ``data``, or for a GPU array
    a copy on its GPU (and a host array to copy it into)."""
    cupy = cupy_module() if hasattr(data, "__cuda_array_interface__") else None
    if cupy is not None:
        ordinal = data.device.id if hasattr(data, "device") else 0
        with cupy.cuda.Device(ordinal):
            copy = cupy.array(data, dtype=dtype, order="C", copy=True)
        return np.empty(copy.shape, copy.dtype), (f"gpu{ordinal}", ordinal, copy)
    try:
        host = np.array(data, dtype=dtype, order="C", copy=True)
    except (TypeError, ValueError) as exc:  # ragged sequences, text that is no number
        raise ArgumentError(f"Buffer cannot hold {type(data).__name__} data: {exc}") from None
    numeric(host.dtype, "Buffer", f"{type(data).__name__} of ")
    return host, None


def numeric(dtype, where: str, given: str = ""):
    """``dtype``, or ArgumentError naming ``where`` unless kernels compute with it on every
    device (bool, integer, float or complex)."""
    dtype = np.dtype(dtype)
    if dtype.kind not in "biufc":
        what = "objects" if dtype.kind == "O" else f"dtype {dtype}"
        raise ArgumentError(f"{where} needs numeric data (bool, integer, float or complex), got {given}{what}")
    return dtype


@contextlib.contextmanager
def _numpy_errors(buffer, key):
    """NumPy's errors of ``buffer[key]`` (reading or writing the host copy) as hetflow's,
    naming the buffer and the key."""
    try:
        yield
    except HetflowError:  # the wait's and the mapping's own
        raise
    except IndexError as exc:
        raise IndexOutOfBoundsError(f"{buffer!r}[{key!r}]: {exc}") from None
    except (TypeError, ValueError) as exc:  # ArgumentTypeError is both, as NumPy's may be either
        raise ArgumentTypeError(f"{buffer!r}[{key!r}]: {exc}") from None


# -- row ranges: sorted lists of disjoint (lo, hi) ----------------------------------------
def _union(a, b) -> list:
    out = []
    for lo, hi in sorted([*a, *b]):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _intersect(a, b) -> list:
    out = []
    for lo, hi in a:
        for blo, bhi in b:
            if max(lo, blo) < min(hi, bhi):
                out.append((max(lo, blo), min(hi, bhi)))
    return out


def _minus(a, b) -> list:
    """The rows of ``a`` that are not in ``b``."""
    out = []
    for lo, hi in a:
        for blo, bhi in b:
            if bhi <= lo or blo >= hi:
                continue
            if blo > lo:
                out.append((lo, blo))
            lo = max(lo, bhi)
            if lo >= hi:
                break
        if lo < hi:
            out.append((lo, hi))
    return out


def acquired(launch):
    """``launch`` with every Buffer among its entry arguments (plain or a view's root)
    replaced by its copy on the launch's device, made current."""
    device = launch.device
    return launch.on(tuple(a.acquire(device) if type(a) is Buffer else a for a in launch.entry_args))


def wrote(launch, written) -> None:
    """After ``launch`` ran: the Buffers behind the arguments at positions ``written``
    (plain or a view's root) are current on its device alone."""
    for k in written:
        root = getattr(launch.args[k], "root", launch.args[k])
        if type(root) is Buffer:
            root.wrote(launch.device)


def array(data, dtype=None) -> Buffer:
    """A coherent array holding a copy of ``data`` (NumPy, CuPy, anything array-like),
    read as ``np.array(data)`` reads it: ``array(5)`` is a 0-d array holding 5 and
    ``array((2, 3))`` a 1-D one holding 2 and 3 (``Buffer(shape)`` allocates by shape).
    The runtime moves it between host and devices only when a launch or a read needs it."""
    return Buffer.holding(data, dtype)
