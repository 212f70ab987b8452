"""Running bound launches on an NVIDIA GPU (real, or Numba's CUDA simulator).

Host (NumPy) arrays are copied to the GPU once per launch and the ones the kernel
writes are copied back; CuPy / CUDA arrays, and host arrays in managed memory, are
used in place. Chunks are grid-stride
launches over ``[lo, hi)`` rows.
"""
from __future__ import annotations

import numpy as np
from numba.core.errors import NumbaError

from ..index.managed import device_view
from ..platform.cuda_compat import cuda_module
from .launch import Launch, is_device_array

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
        blocks, threads = launch_config(self.device, hi - lo, self.launch.inner)
        exe = self.launch.executable
        entry = exe.entry[blocks, threads, self.stream] if self.stream else exe.entry[blocks, threads]
        with self._context():
            try:
                entry(lo, hi, *self.launch.inner, *self.dev_args)
            except NumbaError as exc:
                raise exe.compile_error(exc, self.device, self.launch.kernel) from None

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
    """Run a whole launch on its GPU and copy written host arrays back."""
    g = GpuLaunch(launch)
    g.run_chunk(0, launch.extent[0])
    g.sync()
    g.copy_back()
