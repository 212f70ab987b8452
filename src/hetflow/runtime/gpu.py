"""Running bound launches on an NVIDIA GPU (real, or Numba's CUDA simulator).

Launches here work on device data (CuPy / CUDA arrays, coherent arrays' GPU copies);
:mod:`hetflow.runtime.staging` stages host arrays for them. Chunks are grid-stride
launches over ``[lo, hi)`` rows.

On a real GPU the compiled entry is launched by :class:`FastEntry`: numba-cuda's
dispatcher spends 60-220 us of host time per call typing and wrapping its arguments
(measured on an H100 with CuPy arrays), while the plan already knows their types; the
entry is compiled once per plan and each launch only packs the numbers that change
(pointers, extents, scalars) into a buffer for the driver's ``cuLaunchKernel``.
"""
from __future__ import annotations

import contextlib
import ctypes
import threading
import time

import numba
from numba.core import types
from numba.core.errors import NumbaError

from ..errors import HetflowError, KernelRaisedError
from ..cuda_compat import cuda_module, cupy_module
from ..platform.executable import BLOCK_THREADS
from ..platform.repository import gpu_entry_jit
from .launch import Launch, is_device_array

THREADS = BLOCK_THREADS  # what the entries are compiled for (platform.executable)
SIM_THREADS = 16   # the simulator runs one OS thread per GPU thread: keep it small
MAX_GRID_X, MAX_GRID_Y = 2**31 - 1, 65535  # CUDA's grid limits
BLOCKS_2D = 8192


def launch_config(device, rows: int, inner: tuple, shift: int = 0):
    """(blocks, threads) for ``rows`` rows.

    Rank 1 and rank > 2: one thread per index where the grid limits allow (the entries'
    grid-stride loops cover the rest). Rank 2 gets a 2-D grid, as its entry expects:
    one thread per column on x in 128-wide warps (coalesced; 2^31 - 1 blocks of them
    cover any array that fits in memory), two rows per block, and at most ``BLOCKS_2D``
    blocks, each thread striding over rows; measured on an H100 with a 4096^2 Jacobi this
    ran in 0.175 ms against 0.277 ms for one thread per index (32 x 8 blocks) and
    0.343 ms for Numba's 16 x 16 idiom. Its x threads start ``shift`` columns early
    (:func:`column_shift`), which takes ``shift`` more threads.
    """
    if len(inner) == 1:  # the entry runs one column per x thread: the grid covers them all
        tx, ty = (8, 2) if device.simulated else (128, THREADS // 128)
        bx = max(1, -(-(inner[0] + shift) // tx))
        by = 1 if device.simulated else max(1, min((rows + 1) // 2, BLOCKS_2D // bx, MAX_GRID_Y))
        return (bx, by), (tx, ty)
    if device.simulated:
        return 1, SIM_THREADS
    work = rows
    for e in inner:
        work *= e
    return max(1, min((work + THREADS - 1) // THREADS, MAX_GRID_X)), THREADS


WARP = 32


def column_shift(launch: Launch) -> int:
    """How many columns early the x threads of a rank-2 GPU entry start, so that each
    warp stores an aligned run of the first written array's row: that array's root
    column offset (an ``interior`` view's 1) modulo a warp; 0 where its columns are no
    root column plus numbers. Stores misaligned by one column cost 12% of a 4096^2
    stencil on an H100 (100 steps in 11.29 ms, against 10.06 ms aligned). Per plan:
    its views' numbers are fixed by its key."""
    plan = launch.plan
    if plan.column_shift is None:
        low = plan.lowerings[plan.written[0]] if plan.written and plan.lowerings else None
        shifts = low.shifts if low is not None else None
        plan.column_shift = 0
        if shifts and shifts[-1][0] == 1:  # the root's last (contiguous) axis follows the launch's columns
            _, const, added = shifts[-1]
            plan.column_shift = (const + sum(low.params[j] for j in added)) % WARP
    return plan.column_shift


def launch_shape(launch: Launch, rows: int) -> tuple:
    """(blocks, threads) of ``rows`` rows of ``launch``: :func:`launch_config` with the
    launch's :func:`column_shift`."""
    inner = launch.inner
    return launch_config(launch.device, rows, inner, column_shift(launch) if len(inner) == 1 else 0)


def entry_head(launch: Launch, lo: int, hi: int) -> tuple:
    """The GPU entry's arguments before the data: rows ``[lo, hi)``, the inner extents
    and, for rank 2, the :func:`column_shift`."""
    inner = launch.inner
    return (lo, hi, inner[0], column_shift(launch)) if len(inner) == 1 else (lo, hi, *inner)


def _array_type(a) -> types.Array:
    """Numba's type of a device array (CuPy's, Numba's, any with the CUDA array interface)."""
    flags = getattr(a, "flags", None)
    if hasattr(flags, "c_contiguous"):  # CuPy's: read here, quicker than its interface dict
        layout = "C" if flags.c_contiguous else "F" if flags.f_contiguous else "A"
        return types.Array(numba.from_dtype(a.dtype), a.ndim, layout)
    return numba.typeof(a)  # Numba's own device arrays (whose flags are a dict), any other


def device_pointer(a) -> int:
    """The device address of a GPU array's first element (CuPy's, Numba's, any other's)."""
    data = getattr(a, "data", None)
    ptr = getattr(data, "ptr", None)  # CuPy
    if ptr is not None:
        return ptr
    dptr = getattr(a, "device_ctypes_pointer", None)  # Numba's device arrays
    return dptr.value or 0 if dptr is not None else a.__cuda_array_interface__["data"][0]


def _array_fields(a) -> tuple:
    """Numba's array ABI: meminfo, parent, nitems, itemsize, data, shape, strides."""
    return (0, 0, a.size, a.dtype.itemsize, device_pointer(a), *a.shape, *a.strides)


def _is_cupy(a) -> bool:
    """A CuPy array (or one alike): its fields are read from its attributes directly."""
    return hasattr(a, "itemsize") and isinstance(getattr(getattr(a, "data", None), "ptr", None), int)


# Each launch parameter gets an 8-byte slot (struct codes, padded): see FastEntry.
_SLOTS = {types.float64: "d", types.float32: "f4x", types.boolean: "?7x", types.int64: "q",
          types.uint64: "Q", types.int32: "i4x", types.uint32: "I4x", types.int16: "h6x",
          types.uint16: "H6x", types.int8: "b7x", types.uint8: "B7x"}


def _signature(args: tuple) -> tuple:
    """Numba's types of a launch's parameters (device arrays, scalars)."""
    return tuple(_array_type(a) if is_device_array(a) else numba.typeof(a) for a in args)


def _slots(ty) -> str | None:
    """The struct codes of the launch parameters one argument of Numba type ``ty``
    becomes (as numba-cuda's own ``_prepare_args`` lays them out), or None for types
    only the dispatcher handles."""
    if isinstance(ty, types.Array):
        return "QQqqQ" + "q" * (2 * ty.ndim)
    if isinstance(ty, types.Complex):
        return _SLOTS[ty.underlying_float] * 2
    return _SLOTS.get(ty)


def _filler(args: tuple, sig: tuple, head: int):
    """``fill(pack_into, buffer, h, a)``: packs the entry head ``h`` and the data
    arguments ``a`` (typed ``sig[head:]``) into ``buffer``, generated for these types as
    one call of ``pack_into`` (a loop over the arguments, building a list of ~40 values,
    cost as much host time as the driver's launch)."""
    lines, values = [], ["*h"]
    for k, (a, ty) in enumerate(zip(args[head:], sig[head:])):
        if isinstance(ty, types.Array):
            lines.append(f"    x{k} = a[{k}]")
            values.append(f"0, 0, x{k}.size, x{k}.itemsize, x{k}.data.ptr, *x{k}.shape, *x{k}.strides"
                          if _is_cupy(a) else f"*_array_fields(x{k})")
        elif isinstance(ty, types.Complex):
            values.append(f"a[{k}].real, a[{k}].imag")
        else:
            values.append(f"a[{k}]")
    source = "def fill(pack_into, buffer, h, a):\n" + "\n".join(lines) + \
        f"\n    pack_into(buffer, 0, {', '.join(values)})\n"
    namespace = {"_array_fields": _array_fields}
    exec(compile(source, "<hetflow.runtime.gpu fast entry>", "exec"), namespace)
    return namespace["fill"]


# Local memory a thread of an entry may use before its occupancy bound counts as costing
# more than it gives (platform.executable.BLOCKS_PER_SM): a few registers spilled.
SPILL_BYTES = 64


def _compiled(dispatcher, sig):
    """``dispatcher`` compiled for ``sig``; compiled again without its occupancy bound
    where the bound made it spill more than ``SPILL_BYTES`` (a kernel that needs its
    registers), once per process and entry (every plan of the entry shares it), not
    stored: the bounded code stays what the repository keeps."""
    compiled = dispatcher.compile(sig)
    if compiled.local_mem_per_thread > SPILL_BYTES and "launch_bounds" in dispatcher.targetoptions:
        unbounded = _UNBOUNDED.get(dispatcher)
        if unbounded is None:
            fastmath = dispatcher.targetoptions.get("fastmath", False)
            unbounded = _UNBOUNDED[dispatcher] = gpu_entry_jit(fastmath, bounded=False)(dispatcher.py_func)
        compiled = unbounded.compile(sig)  # numba-cuda keeps what it compiled per signature
    return compiled


_UNBOUNDED: dict = {}  # a bounded entry's dispatcher -> the same entry without the bound


@contextlib.contextmanager
def compile_errors(launch: Launch):
    """numba-cuda's failures to compile the launch's GPU entry, raised as hetflow's
    compile error naming kernel and device."""
    try:
        yield
    except NumbaError as exc:
        raise launch.executable.compile_error(exc, launch.device, launch.kernel) from None
    except NotImplementedError as exc:  # numba-cuda cannot lower something (a ufunc's integer loop)
        raise launch.executable.compile_error(NumbaError(f"NotImplementedError: {exc}"), launch.device,
                                              launch.kernel) from exc


class FastEntry:
    """A plan's entry compiled for its argument types, launched by the driver directly.

    numba-cuda's dispatcher types and wraps every argument on each call. Here the types
    are fixed: each launch packs the parameters' values into one buffer of 8-byte slots
    (an array is Numba's 5 + 2*ndim fields) whose slot addresses are made once, and calls
    ``cuLaunchKernel`` through CuPy's binding on the given stream.
    """

    def __init__(self, device, dispatcher, head: tuple, args: tuple):
        import struct

        from cupy.cuda import driver

        full = (*head, *args)
        self.sig = sig = _signature(full)
        slots = tuple(_slots(t) for t in sig)
        if None in slots:
            raise TypeError(f"no fast launch for argument types {sig}")
        self._fill = _filler(full, sig, len(head))
        self._pack_into = struct.Struct("<" + "".join(slots)).pack_into
        n = struct.calcsize("<" + "".join(slots)) // 8
        self._buffer = (ctypes.c_uint64 * n)()
        base = ctypes.addressof(self._buffer)
        self._pointers = (ctypes.c_void_p * n)(*range(base, base + 8 * n, 8))
        self._params = ctypes.addressof(self._pointers)
        self.compiled = _compiled(dispatcher, sig)  # numba-cuda's kernel (its registers, local memory)
        kernel = self.compiled._codelibrary.get_cufunc().kernel
        self._function = int(kernel.handle)
        self._launch = driver.launchKernel
        self._lock = threading.Lock()  # one buffer: filled and launched by one thread at a time
        self._device = device
        self._configs = {}  # (rows, inner) -> the grid and block dimensions
        self._wholes = {}   # a whole launch's extent -> (its dimensions, its entry head)

    @classmethod
    def of(cls, launch: Launch, head: tuple, args: tuple) -> "FastEntry | None":
        """The launch's plan's fast entry (built on first use), or None where the
        dispatcher must launch (the simulator, argument types it alone handles)."""
        plan = launch.plan
        fast = plan.fast_entry
        if fast is False:
            fast = plan.fast_entry = cls._built(launch, head, args)
        return fast

    @classmethod
    def fitting(cls, launch: Launch, head: tuple, args: tuple) -> "FastEntry | None":
        """:meth:`of`, or an entry of its own where ``args`` are typed otherwise than the
        plan's entry was built for: the device copies staging makes of one plan's host
        arrays are C-contiguous copies, parts of a larger copy or strided views of a shared
        one, as the launch's arguments overlap (an entry for another layout would index
        them wrongly)."""
        fast = cls.of(launch, head, args)
        if fast is None or fast.sig == _signature((*head, *args)):
            return fast
        return cls._built(launch, head, args)

    @classmethod
    def _built(cls, launch: Launch, head: tuple, args: tuple) -> "FastEntry | None":
        try:
            with compile_errors(launch):
                return None if launch.device.simulated else cls(launch.device, launch.executable.entry, head, args)
        except (TypeError, AttributeError, ImportError):
            return None

    def __call__(self, rows: int, inner: tuple, stream: int, head: tuple, args: tuple) -> None:
        """Launch ``rows`` rows of extent ``inner`` each on ``stream``: the entry's
        :func:`entry_head` ``head``, then its data arguments ``args``."""
        dims = self._configs.get((rows, inner))
        if dims is None:
            if len(self._configs) > 256:  # co-execution launches chunks of many sizes
                self._configs.clear()
            dims = self._configs[(rows, inner)] = self._dims(rows, inner, head)
        self._go(dims, stream, head, args)

    def whole(self, launch: Launch, stream: int) -> None:
        """Launch every row of ``launch`` on ``stream``: ``__call__`` for a whole launch,
        its dimensions and entry head kept per extent (a warm launch on device data
        costs tens of microseconds of host time, each step of it counted)."""
        extent = launch.extent
        found = self._wholes.get(extent)
        if found is None:
            if len(self._wholes) > 256:
                self._wholes.clear()
            head = entry_head(launch, 0, extent[0])
            found = self._wholes[extent] = (self._dims(extent[0], extent[1:], head), head)
        self._go(found[0], stream, found[1], launch.entry_args)

    def _dims(self, rows: int, inner: tuple, head: tuple) -> tuple:
        """The grid and block dimensions of ``rows`` rows (:func:`launch_config`)."""
        shift = head[3] if len(inner) == 1 else 0  # entry_head's column shift
        blocks, threads = launch_config(self._device, rows, inner, shift)
        return (*_dim3(blocks), *_dim3(threads))

    def _go(self, dims: tuple, stream: int, head: tuple, args: tuple) -> None:
        with self._lock:  # the driver copies the values during the call
            self._fill(self._pack_into, self._buffer, head, args)
            self._launch(self._function, *dims, 0, stream, self._params, 0)


def _dim3(d) -> tuple:
    d = (d,) if isinstance(d, int) else tuple(d)
    return d + (1,) * (3 - len(d))


def stream_pointer(stream) -> int:
    """The CUDA handle of a numba-cuda stream (None: the default stream, 0)."""
    if stream is None:
        return 0
    handle = stream.handle
    return (handle.value or 0) if isinstance(handle, ctypes.c_void_p) else int(handle)


# Numba's CUDA simulator keeps a launch's block and thread indices per OS thread and
# cannot run two launches at once (two queue slots on one simulated GPU failed with
# "'Thread' object has no attribute 'blockIdx'"): its launches take turns.
_SIMULATOR = threading.Lock()


def launch_rows(launch: Launch, stream, lo: int, hi: int, dev_args: tuple, pointer=None, fast=False) -> None:
    """Launch rows ``[lo, hi)`` of ``launch`` over ``dev_args`` (asynchronous on a real GPU)
    on numba-cuda's ``stream``; ``pointer``: its CUDA handle, when the caller knows it.
    ``fast``: the FastEntry to launch with, made for ``dev_args``' types (None: the
    dispatcher; False: the plan's)."""
    inner = launch.inner
    head = entry_head(launch, lo, hi)
    exe = launch.executable
    try:
        if fast is False:
            fast = launch.plan.fast_entry
        if fast is False:
            fast = FastEntry.of(launch, head, dev_args)
        if fast is not None:
            fast(hi - lo, inner, pointer if pointer is not None else stream_pointer(stream), head, dev_args)
            return
        blocks, threads = launch_shape(launch, hi - lo)
        with compile_errors(launch), (_SIMULATOR if launch.device.simulated else contextlib.nullcontext()):
            (exe.entry[blocks, threads, stream] if stream else exe.entry[blocks, threads])(*head, *dev_args)
    except Exception as exc:
        if launch.device.simulated and not isinstance(exc, HetflowError):
            raise KernelRaisedError.of(launch.kernel.name, launch.device.id, lo, hi, exc) from exc
        raise  # a real GPU's kernel cannot raise: a driver error, a fault of the device


def run(launch: Launch) -> None:
    """Run a whole launch over device data on its (real) GPU: only enqueued on the
    current stream (as a CuPy operation is), so whatever reads the results next on that
    stream or on the host waits for it. Host arrays: :func:`hetflow.runtime.staging.run`."""
    _make_current(launch.device.ordinal)
    fast = launch.plan.fast_entry
    if fast:  # built by an earlier launch of the plan (launch_rows builds it)
        fast.whole(launch, current_stream())
    else:
        launch_rows(launch, None, 0, launch.extent[0], launch.entry_args, current_stream())


_thread = threading.local()


def _make_current(ordinal: int) -> None:
    """Make GPU ``ordinal``'s primary context (numba-cuda's and CuPy's) current in this
    thread, and leave it so: a context switch costs more than a launch. What is current
    is read each time (CuPy's ``getDevice``, a fraction of a microsecond), since the
    application may have switched since (``with cupy.cuda.Device(k)``; without CuPy,
    the last switch made here is trusted)."""
    cupy = cupy_module()
    if getattr(_thread, "ordinal", None) != ordinal or cupy is not None and cupy.cuda.runtime.getDevice() != ordinal:
        from cuda.core import Device

        Device(ordinal).set_current()
        _thread.ordinal = ordinal


def synchronize(device) -> None:
    """Wait for the work enqueued on ``device`` from this thread's current stream."""
    _make_current(device.ordinal)
    cupy = cupy_module()
    if cupy is not None:
        cupy.cuda.get_current_stream().synchronize()
    else:
        cuda_module().default_stream().synchronize()


def current_stream() -> int:
    """The CUDA handle of the stream CuPy works on in this thread (the default stream
    without CuPy), so launches stay ordered with the user's CuPy operations."""
    cupy = cupy_module()
    return cupy.cuda.get_current_stream().ptr if cupy is not None else 0


class Timing:
    """The GPU time of work enqueued on this thread's current stream between construction
    and :meth:`stop`, read later without waiting (CUDA events); under the simulator, or
    without CuPy, the host's wall time once the work is done."""

    def __init__(self, device):
        self.device = device
        cupy = None if device.simulated else cupy_module()
        self._events = None
        if cupy is not None:
            _make_current(device.ordinal)
            self._stream = cupy.cuda.get_current_stream()
            self._events = cupy.cuda.Event(), cupy.cuda.Event()
            self._events[0].record(self._stream)
        self._t0 = time.perf_counter()
        self._seconds = None

    def stop(self) -> None:
        if self._events is not None:
            # on the device and stream it started on: the work timed may have left another
            # GPU current (an event records only on a stream of its own device)
            _make_current(self.device.ordinal)
            self._events[1].record(self._stream)
        else:
            if not self.device.simulated:  # the simulator has run the work already
                synchronize(self.device)
            self._seconds = time.perf_counter() - self._t0

    def seconds(self) -> float | None:
        """Seconds the work took, or None while the GPU has not finished it."""
        if self._events is not None and self._seconds is None and self._events[1].done:
            start, end = self._events
            self._seconds = cupy_module().cuda.get_elapsed_time(start, end) / 1e3
        return self._seconds


