"""Running bound launches on an NVIDIA GPU (real, or Numba's CUDA simulator).

Host (NumPy) arrays are copied to the GPU once per launch and the ones the kernel
writes are copied back; CuPy / CUDA arrays, and host arrays in managed memory, are
used in place. Chunks are grid-stride launches over ``[lo, hi)`` rows.

On a real GPU the compiled entry is launched by :class:`FastEntry`: numba-cuda's
dispatcher spends 60-220 us of host time per call typing and wrapping its arguments
(measured on an H100 with CuPy arrays), while the plan already knows their types; the
entry is compiled once per plan and each launch only packs the few numbers that change
(pointers, extents, scalars) for ``cuda.core.launch``.
"""
from __future__ import annotations

import ctypes
import threading

import numba
import numpy as np
from numba.core import types
from numba.core.errors import NumbaError

from ..errors import HetflowError, KernelRaisedError
from ..index.managed import device_view
from ..platform.cuda_compat import cuda_module, cupy_module
from .launch import Launch, is_device_array, warn_scattered

THREADS = 256
SIM_THREADS = 16   # the simulator runs one OS thread per GPU thread: keep it small
MAX_GRID_X, MAX_GRID_Y = 2**31 - 1, 65535  # CUDA's grid limits
BLOCKS_2D = 8192


def launch_config(device, rows: int, inner: tuple):
    """(blocks, threads) for ``rows`` rows.

    Rank 1 and rank > 2: one thread per index where the grid limits allow (the entries'
    grid-stride loops cover the rest). Rank 2 gets a 2-D grid, as its entry expects:
    columns on x in 128-wide warps (coalesced), two rows per block, and at most
    ``BLOCKS_2D`` blocks, each thread striding over rows; measured on an H100 with a
    4096^2 Jacobi this ran in 0.175 ms against 0.277 ms for one thread per index
    (32 x 8 blocks) and 0.343 ms for Numba's 16 x 16 idiom.
    """
    if len(inner) == 1:
        if device.simulated:
            return (1, 1), (8, 2)
        bx = max(1, min((inner[0] + 127) // 128, MAX_GRID_X))
        by = max(1, min((rows + 1) // 2, BLOCKS_2D // bx, MAX_GRID_Y))
        return (bx, by), (128, 2)
    if device.simulated:
        return 1, SIM_THREADS
    work = rows
    for e in inner:
        work *= e
    return max(1, min((work + THREADS - 1) // THREADS, MAX_GRID_X)), THREADS


def _array_type(a) -> types.Array:
    """Numba's type of a device array (CuPy's, Numba's, any with the CUDA array interface)."""
    flags = getattr(a, "flags", None)
    if flags is not None:
        layout = "C" if flags.c_contiguous else "F" if flags.f_contiguous else "A"
        return types.Array(numba.from_dtype(a.dtype), a.ndim, layout)
    return numba.typeof(a)


def _device_pointer(a) -> int:
    data = getattr(a, "data", None)
    ptr = getattr(data, "ptr", None)  # CuPy
    if ptr is not None:
        return ptr
    dptr = getattr(a, "device_ctypes_pointer", None)  # Numba's device arrays
    return dptr.value or 0 if dptr is not None else a.__cuda_array_interface__["data"][0]


def _pack_array(a, out: list) -> None:
    """Numba's array ABI: meminfo, parent, nitems, itemsize, data, shape, strides."""
    out += (0, 0, a.size, a.dtype.itemsize, _device_pointer(a), *a.shape, *a.strides)


_SCALARS = {types.float64: ctypes.c_double, types.float32: ctypes.c_float, types.boolean: bool}


def _packer(ty):
    """How one argument of Numba type ``ty`` becomes launch parameters (as numba-cuda's
    own ``_prepare_args`` does it), or None for types only the dispatcher handles."""
    if isinstance(ty, types.Array):
        return _pack_array
    if isinstance(ty, types.Integer):
        ctype = getattr(ctypes, f"c_{ty}")
        return lambda v, out: out.append(ctype(v))
    if ty in _SCALARS:
        conv = _SCALARS[ty]
        return lambda v, out: out.append(conv(v))
    if isinstance(ty, types.Complex):
        part = ctypes.c_double if ty == types.complex128 else ctypes.c_float
        return lambda v, out: out.extend((part(v.real), part(v.imag)))
    return None


class FastEntry:
    """A plan's entry compiled for its argument types, launched through ``cuda.core``."""

    def __init__(self, dispatcher, args: tuple):
        from cuda.core import LaunchConfig, launch

        sig = tuple(_array_type(a) if is_device_array(a) else numba.typeof(a) for a in args)
        self.packers = tuple(_packer(t) for t in sig)
        if None in self.packers:
            raise TypeError(f"no fast launch for argument types {sig}")
        self.kernel = dispatcher.compile(sig)._codelibrary.get_cufunc().kernel
        self._launch, self._config_type, self._configs = launch, LaunchConfig, {}

    @classmethod
    def of(cls, launch: Launch, args: tuple) -> "FastEntry | None":
        """The launch's plan's fast entry (built on first use), or None where the
        dispatcher must launch (the simulator, argument types it alone handles)."""
        plan = launch.plan
        fast = plan.fast_entry
        if fast is False:
            try:
                fast = None if launch.device.simulated else cls(launch.executable.entry, args)
            except (TypeError, AttributeError, ImportError):
                fast = None
            plan.fast_entry = fast
        return fast

    def __call__(self, blocks, threads, stream, args: tuple) -> None:
        config = self._configs.get((blocks, threads))
        if config is None:
            config = self._configs[(blocks, threads)] = self._config_type(grid=blocks, block=threads)
        params = []
        for pack, value in zip(self.packers, args):
            pack(value, params)
        self._launch(stream, config, self.kernel, *params)


def core_stream(stream):
    """``cuda.core``'s handle of a numba-cuda stream (None: the default stream)."""
    from numba.cuda.cudadrv.driver import _to_core_stream

    return _to_core_stream(stream if stream is not None else cuda_module().default_stream())


def launch_rows(launch: Launch, stream, lo: int, hi: int, dev_args: tuple, core=None) -> None:
    """Launch rows ``[lo, hi)`` of ``launch`` over ``dev_args`` (asynchronous on a real GPU).
    ``core`` is :func:`core_stream` of ``stream``, when the caller keeps it."""
    blocks, threads = launch_config(launch.device, hi - lo, launch.inner)
    args = (lo, hi, *launch.inner, *dev_args)
    exe = launch.executable
    try:
        fast = FastEntry.of(launch, args)
        if fast is not None:
            fast(blocks, threads, core if core is not None else core_stream(stream), args)
            return
        (exe.entry[blocks, threads, stream] if stream else exe.entry[blocks, threads])(*args)
    except NumbaError as exc:
        raise exe.compile_error(exc, launch.device, launch.kernel) from None
    except Exception as exc:
        if launch.device.simulated and not isinstance(exc, HetflowError):
            raise KernelRaisedError.of(launch.kernel.name, launch.device.id, lo, hi, exc) from exc
        raise  # a real GPU's kernel cannot raise: a driver error, a fault of the device


class GpuLaunch:
    """A launch's device-side arguments on one GPU, and how to run chunks of it."""

    def __init__(self, launch: Launch, stream=None):
        self.launch = launch
        self.device = launch.device
        self.cuda = cuda_module()
        self.stream = stream
        self._host_to_dev: dict[int, tuple[np.ndarray | None, object]] = {}  # None: managed
        with self._context():
            self.dev_args = tuple(self._to_device(a) for a in launch.entry_args)

    def _context(self):
        return self.cuda.gpus[self.device.ordinal]

    def _to_device(self, arg):
        if not isinstance(arg, np.ndarray) or is_device_array(arg):
            return arg
        known = self._host_to_dev.get(id(arg))
        if known is None:
            in_place = device_view(arg)
            if in_place is not None:  # managed memory: nothing to copy in or back
                self._host_to_dev[id(arg)] = (None, in_place)
                return in_place
            host = np.ascontiguousarray(arg)
            dev = self.cuda.to_device(host, stream=self.stream) if self.stream else self.cuda.to_device(host)
            known = (arg, dev)
            self._host_to_dev[id(arg)] = known
        return known[1]

    def run_chunk(self, lo: int, hi: int) -> None:
        """Launch rows ``[lo, hi)`` (asynchronous on a real GPU)."""
        with self._context():
            launch_rows(self.launch, self.stream, lo, hi, self.dev_args)

    def sync(self) -> None:
        with self._context():
            (self.stream or self.cuda).synchronize()

    def copy_back(self) -> None:
        """Copy the written host arrays back from the GPU."""
        written_roots = set()
        for k in self.launch.written:
            arg = self.launch.args[k]
            root = getattr(arg, "root", arg)
            written_roots.add(id(root))
        with self._context():
            for key, (host, dev) in self._host_to_dev.items():
                if key in written_roots and host is not None:
                    host[...] = dev.copy_to_host(stream=self.stream) if self.stream else dev.copy_to_host()


def run(launch: Launch) -> None:
    """Run a whole launch on its GPU. On device data it is only enqueued on the current
    stream (as a CuPy operation is): whatever reads the results next on that stream or
    on the host waits for it. Host arrays are copied in, and the written ones back."""
    warn_scattered(launch)
    if not launch.device.simulated and not any(type(a) is np.ndarray for a in launch.entry_args):
        _make_current(launch.device.ordinal)
        launch_rows(launch, None, 0, launch.extent[0], launch.entry_args, current_stream())
        return
    g = GpuLaunch(launch)
    g.run_chunk(0, launch.extent[0])
    g.sync()
    g.copy_back()


_thread = threading.local()


def _make_current(ordinal: int) -> None:
    """Make GPU ``ordinal``'s primary context (numba-cuda's and CuPy's) current in this
    thread; once per thread and GPU, as a context switch costs more than a launch."""
    if getattr(_thread, "ordinal", None) != ordinal:
        from cuda.core import Device

        Device(ordinal).set_current()
        _thread.ordinal = ordinal


def synchronize(device) -> None:
    """Wait for the work enqueued on ``device`` from this thread's current stream."""
    _make_current(device.ordinal)
    current_stream().sync()


_streams: dict = {}


def current_stream():
    """``cuda.core``'s handle of the stream CuPy works on in this thread (the default
    stream without CuPy), so launches stay ordered with the user's CuPy operations."""
    cupy = cupy_module()
    ptr = cupy.cuda.get_current_stream().ptr if cupy is not None else 0
    found = _streams.get(ptr)
    if found is None:
        from cuda.core import Stream

        found = _streams[ptr] = Stream.from_handle(ptr)
    return found
