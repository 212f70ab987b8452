"""What the ``wavefront`` call site (:mod:`hetflow.callsites`) runs: sweeps where element
(i, j) depends on (i-1, j) and (i, j-1).

``hetflow.wavefront(extent, kernel, *args)`` runs ``kernel(i, j, *args)`` at every index
of a 2-D extent with the results of the sequential loop ``for i: for j: kernel(i, j)``
(PRK's p2p, a Gauss-Seidel sweep), but in parallel: the extent is cut into tiles; the
tiles on one anti-diagonal of tiles run at once, and inside a tile the indices run in
the sequential order. A tile runs after the tiles above it and to its left.

That order is the sequential one for every element the kernel reads at ``(i - a, j - b)``
(updated before it) or at ``(i + a, j + b)`` (not yet updated), ``a, b >= 0``: the
5-point Gauss-Seidel stencil and p2p qualify. A read across the anti-diagonal,
``(i - 1, j + 1)`` or ``(i + 1, j - 1)``, may see a neighbouring tile's element before or
after its update: such kernels need tile=extent (one sequential tile).

The CPU runs the whole sweep in one compiled function: per anti-diagonal, its tiles are
shared out over the cores (Numba's threading layer), one region per diagonal. A GPU
runs one launch per anti-diagonal, a thread per tile (a correct path, not a fast one:
pass GPU arrays or ``hetflow.array`` buffers so that the data stays there between the
launches).
"""
from __future__ import annotations

import ast
import functools
import hashlib
import os
import sys
import threading
import types
from pathlib import Path

import numba

from ..errors import ArgumentError, ArgumentTypeError, HetflowError, KernelRaisedError, ShapeError
from ..kernels import Kernel
from . import cpu
from .blockgen import kernel_body
from .forall import forall, resolve_devices
from .launch import bind, normalize_extent

# Inside a tile the fewest rows and columns: smaller tiles cost more in synchronisation
# than their parallelism gains.
MIN_TILE = 16
# Tiles along each dimension per CPU core: enough diagonals full enough to keep every
# core busy, few enough that the one parallel region per diagonal stays cheap.
TILES_PER_CORE = 3
# Below this many indices a CPU sweep runs as one tile on the calling thread: waking the
# cores for every diagonal costs more than the sweep.
PARALLEL_MIN = 1 << 18
# A GPU: one thread per tile of this size (its launches run one anti-diagonal each).
GPU_TILE = (8, 8)


def wavefront(extent, kernel, *args, tile=None, device=None):
    """:func:`hetflow.wavefront` (which documents it), run now."""
    ext = normalize_extent(extent)
    if len(ext) != 2:
        raise ShapeError(f"wavefront: the extent must have rank 2 (rows, columns); got {ext}")
    if not isinstance(kernel, Kernel) or not kernel.has_source:
        raise ArgumentTypeError(f"wavefront: {kernel!r} must be a hetflow kernel with readable source")
    devs = resolve_devices(device, args)
    if len(devs) != 1:
        raise ArgumentError(f"wavefront runs on one device; got {len(devs)} "
                            f"({', '.join(d.id for d in devs)})")
    dev = devs[0]
    if 0 in ext:
        return None
    h, w = _tile(tile, ext, dev)
    nt0, nt1 = -(-ext[0] // h), -(-ext[1] // w)
    tiles = tile_kernel(kernel)
    if dev.kind == "gpu":
        for d in range(nt0 + nt1 - 1):
            t0 = max(0, d - nt1 + 1)
            forall(min(d, nt0 - 1) + 1 - t0, tiles, d, t0, *ext, h, w, *args, device=dev)
        return None
    launch = bind(tiles, 1, (0, 0, *ext, h, w, *args), dev)
    cpu.compile_launch(launch)
    parts = min(numba.get_num_threads(), dev.compute_units)
    # One core, one tile, or a kernel that may raise (Numba's parallel regions lose an
    # exception, and a sweep in place cannot be run again to find it): in order here.
    if parts <= 1 or nt0 * nt1 == 1 or _may_raise(kernel):
        for d in range(nt0 + nt1 - 1):
            t0 = max(0, d - nt1 + 1)
            _run_diagonal(kernel, launch, (d, t0, *ext, h, w), min(d, nt0 - 1) + 1 - t0)
        return None
    sweep = _sweep(launch.executable, len(launch.entry_args) - 6)
    with _sweep_lock, cpu._parallel_lock:
        try:
            sweep(nt0, nt1, parts, *ext, h, w, *launch.entry_args[6:])
        except HetflowError:
            raise
        except Exception as exc:  # Numba's own failure (the kernel cannot raise here)
            raise KernelRaisedError.of(kernel.name, dev.id, None, None, exc) from exc
    return None


def _run_diagonal(kernel, launch, head, count):
    """The tiles ``[0, count)`` of one diagonal, in order, on the calling thread."""
    try:
        launch.executable.entry(0, count, *head, *launch.entry_args[6:])
    except HetflowError:  # checked mode's, naming the index
        raise
    except Exception as exc:
        raise KernelRaisedError.of(kernel.name, launch.device.id, None, None, exc) from exc


_sweep_lock = threading.Lock()


def _may_raise(kernel: Kernel) -> bool:
    """Checked mode, or a ``raise`` or ``assert`` in the kernel or a kernel it calls."""
    return kernel.boundscheck or any(isinstance(n, (ast.Raise, ast.Assert)) for n in ast.walk(kernel.definition)) \
        or any(_may_raise(sub) for sub in kernel.subkernels.values() if sub.has_source)


def _tile(tile, ext, dev) -> tuple[int, int]:
    if tile is not None:
        try:
            h, w = (int(t) for t in tile)
        except (TypeError, ValueError):
            raise ShapeError(f"wavefront: tile must be (rows, columns), got {tile!r}") from None
        if h < 1 or w < 1:
            raise ShapeError(f"wavefront: tile {tile!r} must have positive sides")
        return min(h, ext[0]), min(w, ext[1])
    if dev.kind == "gpu":
        return min(GPU_TILE[0], ext[0]), min(GPU_TILE[1], ext[1])
    if ext[0] * ext[1] < PARALLEL_MIN:
        return ext
    cores = min(numba.get_num_threads(), dev.compute_units)
    return tuple(min(n, max(MIN_TILE, -(-n // (TILES_PER_CORE * cores)))) for n in ext)


@functools.lru_cache(maxsize=128)
def tile_kernel(kernel: Kernel) -> Kernel:
    """A kernel over the tiles of one anti-diagonal ``d`` of tiles: tile ``t`` is the one
    in tile row ``t0 + t``; it runs ``kernel``'s body at each of its indices in order."""
    i, j = kernel.params[:2]
    data = kernel.params[2:]
    lines = [
        f"def wavefront_tiles(__hf_t, __hf_d, __hf_t0, __hf_n0, __hf_n1, __hf_h, __hf_w, {', '.join(data)}):",
        f"    def __hf_at({i}, {j}):",
        *("        " + line if line else "" for line in kernel_body(kernel).splitlines()),
        "    __hf_bi = __hf_t0 + __hf_t",
        "    __hf_i = __hf_bi * __hf_h",
        "    __hf_j0 = (__hf_d - __hf_bi) * __hf_w",
        # Never true, but it tells the compiler that the indices are not negative, so
        # that no access tests for a negative index (2.5x on p2p); range() loops lose
        # that knowledge, while loops keep it.
        "    if __hf_i < 0 or __hf_j0 < 0:",
        "        return",
        "    __hf_i1 = __hf_i + __hf_h",
        "    if __hf_i1 > __hf_n0:",
        "        __hf_i1 = __hf_n0",
        "    __hf_j1 = __hf_j0 + __hf_w",
        "    if __hf_j1 > __hf_n1:",
        "        __hf_j1 = __hf_n1",
        "    while __hf_i < __hf_i1:",
        "        __hf_j = __hf_j0",
        "        while __hf_j < __hf_j1:",
        "            __hf_at(__hf_i, __hf_j)",
        "            __hf_j += 1",
        "        __hf_i += 1",
    ]
    return Kernel.from_source(f"hf_wavefront_{kernel.name}", "\n".join(lines) + "\n", kernel.namespace())


_sweeps: dict = {}


def _sweep(exe, nargs: int):
    """The compiled sweep over every anti-diagonal for the tile kernel's executable
    ``exe``, whose entry takes ``nargs`` data arguments after its own: per diagonal, its
    tiles cut into ``parts`` even pieces run in parallel, then the next diagonal.

    Its text is a file beside the executable's, so that Numba caches its machine code
    there (compiling a parallel loop costs seconds)."""
    key = (exe.path, id(exe.entry), nargs)
    found = _sweeps.get(key)
    if found is None:
        found = _sweeps[key] = _compile_sweep(exe, nargs)
    return found


def _compile_sweep(exe, nargs: int):
    a = ", ".join(f"__hf_a{k}" for k in range(nargs))
    text = "\n".join([
        f"def __hf_sweep(__hf_nt0, __hf_nt1, __hf_parts, __hf_n0, __hf_n1, __hf_h, __hf_w, {a}):",
        "    for __hf_d in range(__hf_nt0 + __hf_nt1 - 1):",
        "        __hf_t0 = max(0, __hf_d - __hf_nt1 + 1)",
        "        __hf_n = min(__hf_d, __hf_nt0 - 1) + 1 - __hf_t0",
        "        __hf_p = min(__hf_parts, __hf_n)",
        "        for __hf_q in __hf_prange(__hf_p):",
        "            __hf_entry(__hf_n * __hf_q // __hf_p, __hf_n * (__hf_q + 1) // __hf_p, __hf_d, __hf_t0,",
        f"                       __hf_n0, __hf_n1, __hf_h, __hf_w, {a})",
    ]) + "\n"
    path = Path(exe.path) / f"sweep{nargs}.py"
    try:
        if not path.exists() or path.read_text() != text:
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(text)
            os.replace(tmp, path)  # whole, for another process reading it
        filename, cache = str(path), True
    except OSError:  # a read-only repository: compiled afresh in each process
        filename, cache = "<hetflow wavefront sweep>", False
    # A module of its own, which machine code loaded from the cache imports by name.
    module = types.ModuleType("hetflow_sweep_" + hashlib.sha1(filename.encode()).hexdigest()[:16])
    sys.modules[module.__name__] = module
    ns = module.__dict__
    ns.update(__hf_entry=exe.entry, __hf_prange=numba.prange)
    exec(compile(text, filename, "exec"), ns)
    return numba.njit(parallel=True, nogil=True, cache=cache)(ns["__hf_sweep"])

