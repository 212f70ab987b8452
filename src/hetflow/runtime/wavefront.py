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
from ..index import views as _views
from ..kernels import Kernel
from . import aliasing as _aliasing
from . import cpu
from .blockgen import kernel_body
from .buffers import acquired, wrote
from .forall import forall, resolve_devices
from .launch import bind, check_extent, normalize_extent, with_defaults

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
    args = _check_arguments(kernel, ext, args)
    tiles = tile_kernel(kernel)
    _check_aliasing(kernel, tiles, args)
    devs = resolve_devices(device, args)
    if len(devs) != 1:
        raise ArgumentError(f"wavefront runs on one device; got {len(devs)} "
                            f"({', '.join(d.id for d in devs)})")
    dev = devs[0]
    if 0 in ext:
        return None
    size = _tile(tile, ext, dev)
    if dev.kind == "gpu":
        for d in range(_diagonals(ext, size)):
            _gpu_diagonal(kernel, tiles, d, ext, size, args, dev)
        return None
    launch = bind(tiles, 1, (0, 0, *ext, *size, *args), dev)
    if not launch.plan.buffers:
        return _cpu_sweep(kernel, launch, ext, size)
    launch = acquired(launch)  # the Buffers' host copies, made current, as forall does
    try:
        return _cpu_sweep(kernel, launch, ext, size)
    finally:  # what ran wrote the host copies, in a sweep that raised too
        wrote(launch, launch.written)


def _check_arguments(kernel, ext: tuple, args: tuple) -> tuple:
    """``args`` completed by ``kernel``'s default values, checked as ``forall`` checks a
    launch of it over ``ext``: before anything runs, on every device, naming the kernel
    the user wrote (the tile kernel that runs takes other parameters)."""
    if not isinstance(kernel, Kernel) or not kernel.has_source:
        raise ArgumentTypeError(f"wavefront: {kernel!r} must be a hetflow kernel with readable source")
    if len(kernel.params) < 2:
        raise ArgumentTypeError(f"wavefront: kernel {kernel.name!r} takes {len(kernel.params)} parameter(s) "
                                f"({', '.join(kernel.params)}); it must take two index parameters (i, j), "
                                f"then its data arguments")
    args = with_defaults(kernel, 2, args)
    check_extent(kernel, ext, args)
    return args


def _check_aliasing(kernel, tiles, args: tuple) -> None:
    """ShapeError where an argument the kernel writes overlaps another one. The tiles of
    a diagonal run at once: the results are the sequential loop's only if what the kernel
    reads through one name of elements it writes through the other is at (i - a, j - b)
    or (i + a, j + b) of the writing index, which its source does not tell."""
    uses = _aliasing.Uses.of(tiles, 1)
    pairs = _aliasing.conflicts(tiles, (1,), (0,) * HEAD + args, uses)
    if not pairs:
        return
    data, how = kernel.params[2:], "writes" if pairs[0][1] in uses.written else "reads"
    w, k = (p - HEAD for p in pairs[0])
    raise ShapeError(
        f"wavefront: kernel {kernel.name!r} writes argument {data[w]!r} ({_views.describe(args[w])}) and "
        f"{how} argument {data[k]!r} ({_views.describe(args[k])}), which overlap in one array: tiles run at once keep "
        f"the sequential loop's order only where the kernel reads what it writes at (i - a, j - b) or "
        f"(i + a, j + b), which cannot be checked through two arguments; pass the array once, indexed at "
        f"offsets (a[i + 1, j + 1] = a[i, j + 1] + ...), or write into another array")


def _tiles(ext: tuple, size: tuple) -> tuple[int, int]:
    """Rows and columns of tiles of ``size`` covering ``ext``."""
    return -(-ext[0] // size[0]), -(-ext[1] // size[1])


def _diagonals(ext: tuple, size: tuple) -> int:
    """How many anti-diagonals of tiles of ``size`` cover ``ext``."""
    return sum(_tiles(ext, size)) - 1


def _diagonal(d: int, ext: tuple, size: tuple) -> tuple[int, int]:
    """(first tile row, number of tiles) of anti-diagonal ``d``."""
    nt0, nt1 = _tiles(ext, size)
    t0 = max(0, d - nt1 + 1)
    return t0, min(d, nt0 - 1) + 1 - t0


def _cpu_sweep(kernel, launch, ext: tuple, size: tuple) -> None:
    """Every diagonal of the tile kernel's launch ``launch``, in order, on its CPU."""
    cpu.compile_launch(launch)
    parts = min(numba.get_num_threads(), launch.device.compute_units)
    # One core, one tile, or a kernel that may raise (Numba's parallel regions lose an
    # exception, and a sweep in place cannot be run again to find it): in order here.
    if parts <= 1 or size == ext or _may_raise(kernel):
        for d in range(_diagonals(ext, size)):
            t0, count = _diagonal(d, ext, size)
            _run_diagonal(kernel, launch, (d, t0, *ext, *size), count)
        return None
    sweep = _sweep(launch.executable, len(launch.entry_args) - HEAD)
    with _sweep_lock, cpu._parallel_lock:
        try:
            sweep(*_tiles(ext, size), parts, *ext, *size, *launch.entry_args[HEAD:])
        except HetflowError:
            raise
        except Exception as exc:  # Numba's own failure (the kernel cannot raise here)
            raise KernelRaisedError.of(kernel.name, launch.device.id, None, None, exc) from exc
    return None


def _run_diagonal(kernel, launch, head: tuple, count: int) -> None:
    """The tiles ``[0, count)`` of one diagonal, in order, on the calling thread."""
    try:
        launch.executable.entry(0, count, *head, *launch.entry_args[HEAD:])
    except HetflowError:  # checked mode's, naming the index
        raise
    except Exception as exc:
        raise KernelRaisedError.of(kernel.name, launch.device.id, None, None, exc) from exc


def _gpu_diagonal(kernel, tiles, d: int, ext: tuple, size: tuple, args: tuple, dev) -> None:
    """Diagonal ``d``: one GPU launch, a thread per tile. What the kernel raises names the
    grid's rows, not the launch's (its tiles)."""
    t0, count = _diagonal(d, ext, size)
    try:
        forall(count, tiles, d, t0, *ext, *size, *args, device=dev)
    except KernelRaisedError as exc:
        # The kernel's own exception (a simulated GPU's; a real GPU's kernel cannot raise).
        cause = exc.__cause__
        if exc.rows is None or cause is None:
            raise
        lo, hi = exc.rows
        raise KernelRaisedError.of(kernel.name, dev.id, (t0 + lo) * size[0], min((t0 + hi) * size[0], ext[0]),
                                   cause) from cause


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


# The tile kernel's parameters between its index and the user's data: the diagonal, its
# first tile row, the extent and the tile size.
HEAD_PARAMS = ("__hf_d", "__hf_t0", "__hf_n0", "__hf_n1", "__hf_h", "__hf_w")
HEAD = len(HEAD_PARAMS)


@functools.lru_cache(maxsize=128)
def tile_kernel(kernel: Kernel) -> Kernel:
    """A kernel over the tiles of one anti-diagonal ``d`` of tiles: tile ``t`` is the one
    in tile row ``t0 + t``; it runs ``kernel``'s body at each of its indices in order.

    It has ``kernel``'s name, so that what fails inside it (checked mode, a ``raise``, a
    compile error) names the kernel the user wrote, and its options (its data parameters
    are ``kernel``'s, so declared accesses hold for it too)."""
    i, j = kernel.params[:2]
    data = kernel.params[2:]
    lines = [
        f"def wavefront_tiles(__hf_t, {', '.join(HEAD_PARAMS + data)}):",
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
    reads = None if kernel.reads is None else kernel.reads | set(HEAD_PARAMS)
    return Kernel.from_source(kernel.name, "\n".join(lines) + "\n", kernel.namespace(),
                              boundscheck=kernel.boundscheck, fastmath=kernel.fastmath, inline=kernel.inline,
                              writes=kernel.writes, reads=reads)


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

