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
import numbers
import os
import sys
import threading
import types
from pathlib import Path

import numba
import numpy as np

from ..errors import ArgumentError, ArgumentTypeError, HetflowError, KernelRaisedError, ShapeError
from ..index import views as _views
from ..kernels import Kernel
from . import aliasing as _aliasing
from . import cpu
from .blockgen import kernel_body
from .buffers import acquired, wrote
from .forall import forall, resolve_devices
from .launch import SCALARS, bind, check_extent, normalize_extent, with_defaults

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
    ext, args, tile = check(extent, kernel, args, tile)
    shared = _share_memory(args)  # only then can two arguments alias
    if shared:
        _check_aliasing(kernel, ext, args)
    devs = resolve_devices(device, args)
    if len(devs) != 1:
        raise ArgumentError(f"wavefront runs on one device; got {len(devs)} "
                            f"({', '.join(d.id for d in devs)})")
    dev = devs[0]
    if 0 in ext:
        return None
    tiles, args = _tile_launch(kernel, args) if shared else (tile_kernel(kernel), args)
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


def check(extent, kernel, args: tuple, tile) -> tuple:
    """``(extent, args, tile)`` of a sweep, checked before anything runs: a 2-D extent as
    a tuple, ``args`` as :func:`_check_arguments` completes them, ``tile`` as :func:`_check_tile`
    gives it."""
    ext = normalize_extent(extent)
    if len(ext) != 2:
        raise ShapeError(f"wavefront: the extent must have rank 2 (rows, columns); got {ext}")
    return ext, _check_arguments(kernel, ext, args), _check_tile(tile)


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


def _check_tile(tile) -> tuple[int, int] | None:
    """``tile`` as (rows, columns) of positive integers (Python's or NumPy's), or None:
    ``int()`` would truncate a float side (1.5 to 1) and take a bool for 0 or 1."""
    if tile is None:
        return None
    try:
        sides = None if isinstance(tile, (str, bytes)) else tuple(tile)
    except TypeError:  # not iterable (a number, a 0-d array)
        sides = None
    if sides is None:
        raise ArgumentTypeError(f"wavefront: tile must be (rows, columns), a pair of integers; "
                                f"got {type(tile).__name__} {tile!r}")
    if len(sides) != 2:
        raise ShapeError(f"wavefront: tile must be (rows, columns); got {tile!r}, of {len(sides)} side(s)")
    for s in sides:
        if isinstance(s, (bool, np.bool_)) or not isinstance(s, numbers.Integral):
            raise ArgumentTypeError(f"wavefront: tile {tile!r} has side {s!r} ({type(s).__name__}), "
                                    f"which is not an integer")
    if min(sides) < 1:
        raise ShapeError(f"wavefront: tile {tile!r} must have positive sides")
    return int(sides[0]), int(sides[1])


def _share_memory(args: tuple) -> bool:
    """Whether two arguments may read one memory: arrays or views over one object, or
    over NumPy arrays whose memory may overlap (a cheap test of their bounds)."""
    roots = [_views.root_of(a) for a in args if not isinstance(a, SCALARS)]
    return any(r is q or type(r) is np.ndarray and type(q) is np.ndarray and np.may_share_memory(r, q)
               for k, r in enumerate(roots) for q in roots[:k])


def _check_aliasing(kernel, ext: tuple, args: tuple) -> None:
    """ShapeError where ``forall`` would refuse a launch of ``kernel`` over ``ext`` for an
    argument it writes that overlaps another one (see :mod:`.aliasing`). What it accepts
    (``dst[i, j]`` written where ``src[i, j]`` is read, over one array) is safe here too:
    each index touches the shared elements at that index alone, in whatever order the
    tiles run; anything else through two names may meet a tile of the same diagonal
    before or after its update."""
    uses = _aliasing.Uses.of(kernel, 2)
    pairs = _aliasing.conflicts(kernel, ext, args, uses)
    if not pairs:
        return
    w, k = pairs[0]
    raise ShapeError(
        f"wavefront: {_pair(kernel, uses, args, w, k)}, which overlap in one array at different indices: tiles "
        f"run at once keep the sequential loop's order through two arguments only where each index reads and "
        f"writes their shared elements at that index alone; pass the array once, indexed at offsets "
        f"(a[i + 1, j + 1] = a[i, j + 1] + ...), or write into another array")


def _pair(kernel, uses, args: tuple, w: int, k: int) -> str:
    """What the kernel does with written argument ``w`` and argument ``k``, for a message."""
    data, how = uses.data, "writes" if k in uses.written else "reads"
    return (f"kernel {kernel.name!r} writes argument {data[w]!r} ({_views.describe(args[w])}) and {how} "
            f"argument {data[k]!r} ({_views.describe(args[k])})")


def _tile_launch(kernel, args: tuple) -> tuple:
    """(tile kernel, its data arguments): an argument that is the same array as an
    earlier one is passed once, its name in the body renamed to that one's (the tile
    kernel's launch, whose index is a tile, would refuse two arguments over one array).
    Other arguments over one array that ``forall`` accepts are an error here."""
    data = kernel.params[2:]
    merged = _merged(kernel, data, args)
    tiles = tile_kernel(kernel, tuple(merged.items()))
    args = tuple(a for name, a in zip(data, args) if name not in merged)
    uses = _aliasing.Uses.of(tiles, 1)
    pairs = _aliasing.conflicts(tiles, (1,), (0,) * HEAD + args, uses)
    if pairs:
        w, k = (p - HEAD for p in pairs[0])
        uses = uses._replace(data=uses.data[HEAD:], written=tuple(p - HEAD for p in uses.written))
        raise ShapeError(
            f"wavefront: {_pair(kernel, uses, args, w, k)}, which overlap in one array; each index touches "
            f"their shared elements at that index alone, as forall allows, but a wavefront runs two arguments "
            f"over one array only as one, where they are the same elements in the same shape and the kernel "
            f"binds neither name anew (an assignment, a loop, a lambda's parameter); pass one array or view "
            f"for both, or write into another array")
    return tiles, args


def _merged(kernel, data: tuple, args: tuple) -> dict:
    """{name: earlier name} for each data argument that is the same array as an earlier
    one's, where the body binds neither name (renamed, it would read another there)."""
    arrays = [k for k, a in enumerate(args) if not isinstance(a, SCALARS)]
    found = {}
    for n, k in enumerate(arrays):
        for e in arrays[:n]:
            if data[e] not in found and _same(args[e], args[k]):
                found[data[k]] = data[e]
                break
    bound = _bound(kernel) if found else frozenset()
    return {name: into for name, into in found.items() if name not in bound and into not in bound}


def _same(a, b) -> bool:
    """Whether ``a`` and ``b`` are one array: one object, views of one structure (so of
    one map, :class:`~hetflow.index.views.Structure`) over one root, or arrays and views
    over NumPy memory whose elements are the same, in the same shape."""
    if a is b:
        return True
    if _views.is_view(a) and _views.is_view(b) and a.signature is b.signature \
            and a.signature.key is not None and a.root is b.root:
        return True
    root_a, root_b = _views.root_of(a), _views.root_of(b)
    if type(root_a) is not np.ndarray or type(root_b) is not np.ndarray or not np.may_share_memory(root_a, root_b):
        return False
    (kind_a, at_a), (kind_b, at_b) = _elements(a, root_a), _elements(b, root_b)
    return kind_a == kind_b and np.array_equal(at_a, at_b)


def _elements(x, root: np.ndarray) -> tuple:
    """((dtype, writeable), the address of each element) of array or view ``x`` over
    NumPy array ``root`` (a view's elements that are tiles included)."""
    idx = x._root_index(np) if _views.is_view(x) else np.indices(x.shape, sparse=True)
    start = root.__array_interface__["data"][0]
    return (root.dtype, root.flags.writeable), start + sum(c.astype(np.int64) * s for c, s in zip(idx, root.strides))


@functools.lru_cache(maxsize=128)
def _bound(kernel: Kernel) -> frozenset:
    """Names the kernel's body binds: assigned, deleted, loop targets, parameters of the
    functions and lambdas in it."""
    fdef = kernel.definition
    own = set(map(id, fdef.args.args))
    return frozenset({n.id for n in ast.walk(fdef) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
                     | {n.arg for n in ast.walk(fdef) if isinstance(n, ast.arg) and id(n) not in own})


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
    """The tile size: ``tile`` (checked) cut to ``ext``, or the device's default."""
    if tile is not None:
        return min(tile[0], ext[0]), min(tile[1], ext[1])
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
def tile_kernel(kernel: Kernel, merged: tuple = ()) -> Kernel:
    """A kernel over the tiles of one anti-diagonal ``d`` of tiles: tile ``t`` is the one
    in tile row ``t0 + t``; it runs ``kernel``'s body at each of its indices in order.

    It has ``kernel``'s name, so that what fails inside it (checked mode, a ``raise``, a
    compile error) names the kernel the user wrote, and its options (its data parameters
    are ``kernel``'s, so declared accesses hold for it too). ``merged``: pairs (name,
    earlier name) of data parameters passed the same argument: the first is no parameter
    of the tile kernel, and its body reads and writes it through the second."""
    i, j = kernel.params[:2]
    renamed = dict(merged)
    data = tuple(p for p in kernel.params[2:] if p not in renamed)
    body = _body(kernel, renamed).splitlines()
    lines = [
        f"def wavefront_tiles(__hf_t, {', '.join(HEAD_PARAMS + data)}):",
        f"    def __hf_at({i}, {j}):",
        *("        " + line if line else "" for line in body),
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
    writes, reads = (None if names is None else {renamed.get(p, p) for p in names}
                     for names in (kernel.writes, kernel.reads))
    reads = None if reads is None else reads | set(HEAD_PARAMS)
    return Kernel.from_source(kernel.name, "\n".join(lines) + "\n", kernel.namespace(),
                              filename=kernel.filename, lines=_user_lines(kernel, len(lines), len(body)),
                              boundscheck=kernel.boundscheck, fastmath=kernel.fastmath, inline=kernel.inline,
                              writes=writes, reads=reads)


def _user_lines(kernel: Kernel, count: int, body: int) -> tuple:
    """The line in the user's file of each of the tile kernel's ``count`` lines: the
    kernel's ``body`` lines (its third line on) where they stand there, the lines
    around them its ``def``'s."""
    fdef, offset = kernel.definition, kernel.source.firstlineno - 1
    first = fdef.body[0].lineno + offset
    return (fdef.lineno + offset,) * 2 + tuple(range(first, first + body)) + \
        (fdef.lineno + offset,) * (count - 2 - body)


def _body(kernel: Kernel, renamed: dict) -> str:
    """``kernel``'s body, each name in ``renamed`` replaced by the one it maps to, in
    place: each line stays the line it was (errors name the user's lines)."""
    text = kernel_body(kernel)
    if not renamed:
        return text
    lines = [line.encode() for line in text.splitlines()]  # columns count UTF-8 bytes
    names = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Name) and n.id in renamed]
    for n in sorted(names, key=lambda n: (n.lineno, n.col_offset), reverse=True):  # later columns first
        line = lines[n.lineno - 1]
        lines[n.lineno - 1] = line[:n.col_offset] + renamed[n.id].encode() + line[n.end_col_offset:]
    return "\n".join(line.decode() for line in lines)


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

