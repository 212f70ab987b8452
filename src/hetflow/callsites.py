"""The call sites (SPEC §1) as users call them: ``hetflow.forall``, ``reduce``, ``scan``,
``sort``, ``wavefront``, and the allocations ``empty`` and ``zeros``.

Each asks :func:`hetflow.ir.capture.current_graph` first: inside ``with hetflow.graph()``
it records a DIR node and returns what the graph gives for it (None, a lazy array or a
handle, see :mod:`hetflow.ir.capture`); otherwise it calls the runtime, which knows
nothing of graphs. Capture lives here, above the runtime and the IR that drives it, so
that packages import one way (the layers: ``docs/architecture.md``).
"""
from __future__ import annotations

import numbers
import sys

import numpy as np

from . import library
from .index import arrays
from .errors import ArgumentTypeError
from .ir.capture import current_graph
from .ir.values import Handle, LazyArray, concrete
from .kernels import Kernel
from .runtime import binops, mapreduce, reductions, scan_sort
from .runtime import wavefront as _wavefront
from .runtime.forall import resolve_devices, run_forall
from .runtime.launch import normalize_extent
from .runtime.mapreduce import kernel_op, map_reduce

# hetflow.library's functions (dot) record inside a capture as these call sites do; the
# library is a layer below the IR, so it is handed the IR's question here.
library.record_with(current_graph)


def forall(extent, kernel, *args, device=None, schedule=None, shares=None, snapshot=False):
    """Run ``kernel`` at every index of ``extent`` (an int, a tuple, an array or a view).

    ``device``: None (the CPU, or the GPU holding GPU arguments), a device id, 'all'
    (every device), 'gpu' (every GPU, or the CPU on a machine without one), or a list of
    ids. With several devices the loop is co-executed by all their workers (CPU cores,
    GPU streams); ``schedule`` is 'steal' (the default there: work stealing from
    predicted shares) or 'static' (split once by ``shares`` or the prediction), and the
    report is also kept for ``hetflow.last_report()``. On one CPU device the rows are
    split evenly over its cores unless a ``schedule`` is named, which runs the same
    worker machinery on the cores alone; one GPU runs the launch whole either way.

    A launch that writes, through one argument, elements another argument (a view or a
    slice of the same array) reads at other indices raises ShapeError: devices run
    indices in no fixed order. ``snapshot=True`` gives it NumPy's meaning instead, reading copies of those
    arguments (:mod:`hetflow.runtime.aliasing`).

    Returns the run report (:class:`hetflow.runtime.report.RunReport`): per worker,
    chunks, indices, steals and busy time; a launch run whole on one device has one
    worker and schedule 'one-device'.
    """
    g = current_graph()
    if g is not None:  # capturing a DIR: record, run later (hetflow.graph)
        return g.record("forall", extent=extent, kernel=kernel, args=args, device=device, shares=shares,
                        schedule=schedule, snapshot=snapshot)
    try:
        return run_forall(extent, kernel, args, device, schedule, shares, snapshot)
    except ArgumentTypeError:
        # A graph's lazy array (g.output) stands for what the graph computed: looked for
        # only once the runtime refused an argument, so a launch's path stays as it is.
        given = concrete(args)
        if given is args:
            raise
    return run_forall(extent, kernel, given, device, schedule, shares, snapshot)


def reduce(x, what=None, /, *args, op=None, axis=None, device=None, commutative=True, identity=None):
    """Combine the elements of ``x`` with ``op``: all of them (``axis=None``) or along
    ``axis``; or, as ``reduce(extent, kernel, *args, op="sum")``, combine the values a
    kernel returns at every index of ``extent``, in one pass (:mod:`hetflow.runtime.mapreduce`).

    Array form: ``reduce(x, op, axis=None, device=None)``, ``op`` also by keyword.

    ``x``: a NumPy or CuPy array, or a view of one. ``op``: 'sum', 'prod', 'min', 'max',
    'and', 'or', 'xor' (logical on bools, bitwise on integers; floats are refused),
    'land', 'lor', 'lxor' (logical: any nonzero integer counts as true), or a
    hetflow kernel ``op(a, b)`` returning the combination of two elements. A user op
    must be associative. ``commutative=False`` says it is not commutative: elements and
    partial results are then combined strictly in index order (grouped differently
    from a sequential fold, which associativity allows). Commutative ops (all the
    built-ins) may be combined out of order: interleaved partial folds on a CPU, and
    round-robin dealing of elements to threads on a GPU (coalesced reads). A user op's
    result has the input's element type (structured elements included). ``identity``
    (user ops only) is returned for an empty input; without it an empty input is an
    error, as for min and max.

    Returns a NumPy scalar (``axis=None``) or a new array; for CuPy input, a 0-d or
    n-d CuPy array. Sums of ints and bools widen as in NumPy; the compiled path
    accumulates float32/float16 sums and products in float64.

    ``device``: one device, or several (host data only): the generated kernels' launches
    over blocks are then co-executed, each block exactly once, and the partials folded
    in index order on the CPU (the library path is not taken).

    No input is copied: views are lowered into the generated kernel (they never go
    through NumPy), and a GPU device given host data copies it to the GPU once.

    Kernel form: ``kernel(i, *args)`` (one index parameter per dimension of ``extent``)
    returns a number, a bool or a tuple of them; nothing is stored but one partial per
    block. Built-in ops take numbers and bools; tuples need a user op of two tuples
    (``hetflow.library.minloc`` and ``maxloc`` for ``(value, index)`` pairs). Returns a
    NumPy scalar, or a tuple of them. ``device`` may name several devices: the blocks
    are then co-executed as a ``forall`` (each exactly once) and their partials folded
    in index order.

    Inside ``with hetflow.graph()`` the reduction is recorded, not run: the result is
    a handle, readable after ``g.run()``.
    """
    if isinstance(what, Kernel) and _is_extent(x):
        op = kernel_op(op, axis)
        g = current_graph()
        if g is None:
            return map_reduce(x, what, args, op, device, commutative, identity)
        mapreduce.check_kernel(what, len(normalize_extent(x)), args)  # as map_reduce checks first
        call, options = (x, what, *args), dict(op=op, device=device, commutative=commutative, identity=identity)
        dtype = None  # what the kernel returns: known once it is compiled, when the graph runs
    else:
        op, axis, device = reductions.array_arguments(what, args, op, axis, device)
        g = current_graph()
        if g is None:
            return reductions.reduce(x, op, axis=axis, device=device, commutative=commutative, identity=identity)
        dtype = _dtype(x, "reduce")
        _check_axis(x, axis, "reduce")
        call, options = (x, op), dict(axis=axis, device=device, commutative=commutative, identity=identity)
    op_ = binops.resolve(op, commutative)  # a bad op fails here, not when the graph runs
    if dtype is not None:
        op_.check(dtype)
    reductions.check_identity(op_, identity, dtype, "reduce")
    if dtype is not None and getattr(x, "shape", None) is not None:  # the array form, its shape known
        reductions.check_empty(tuple(x.shape), op_, axis, identity)
    _check_device(device)
    return g.record("reduce", fn=reduce, args=call, kwargs=options)


def _is_extent(x) -> bool:
    """An int or a tuple of them: the extent of the kernel form, never an operand."""
    return isinstance(x, numbers.Integral) or (type(x) is tuple and all(isinstance(e, numbers.Integral) for e in x))


def scan(x, op, axis=None, inclusive=True, device=None, *, identity=None):
    """Prefix combinations of ``x`` by ``op``: ``out[k] = x[0] op ... op x[k]`` (inclusive)
    or ``x[0] op ... op x[k-1]`` with ``out[0]`` the identity (exclusive).

    ``op`` is one of reduce's built-in names or an associative hetflow kernel ``op(a, b)``
    (order is always kept: commutativity is not needed). ``axis=None`` scans all
    elements in C order into a 1-D result (as ``numpy.cumsum``); an int scans along that
    axis. An exclusive scan with a user op needs ``identity=``; built-ins know theirs
    (for min and max: +-inf, or the integer type's limits).

    Returns a new array (NumPy for host data, CuPy for GPU data) of NumPy's result
    type for built-ins (sums of small ints widen), the input's for user ops.
    ``device``: one device, or several (host data only), co-executing both passes over
    the blocks (each exactly once) with the block totals scanned on the CPU. Views are
    read through generated kernels: never materialised. Inside ``with hetflow.graph()``
    the scan is recorded, not run, and the result is a handle.
    """
    g = current_graph()
    if g is None:
        return scan_sort.scan(x, op, axis, inclusive, device, identity=identity)
    op_ = binops.resolve(op)  # a bad op fails here, not when the graph runs
    inclusive = binops.flag(inclusive, "inclusive", "scan")
    _check_axis(x, axis, "scan")
    dtype = _dtype(x, "scan")
    if dtype is not None:
        op_.check(dtype)
        scan_sort.scan_init(op_, dtype, inclusive, identity)  # the identity the run would refuse
    _check_device(device)
    return g.record("scan", fn=scan, args=(x, op), kwargs=dict(
        axis=axis, inclusive=inclusive, device=device, identity=identity))


def sort(x, axis=-1, descending=False, key=None, device=None):
    """A sorted copy of ``x`` along ``axis`` (None: all elements, flattened). Stable:
    elements with equal keys keep their order, in descending sorts too.

    ``key``: a hetflow kernel of one element returning its sort key (a number); the
    elements are ordered by key. Structured elements need a key. NaN keys sort as the
    largest: last ascending, first descending.

    ``x`` is never modified. A view is first copied into a new array by a generated
    kernel on the device (with no key, the sort then works on that copy); keys are
    computed by a generated kernel on the device (or co-executed on several devices,
    as ``device=[...]`` says); the ordering itself runs in NumPy
    for host data and in CuPy for GPU data, whatever the device. Inside
    ``with hetflow.graph()`` the sort is recorded, not run, and the result is a handle.
    """
    g = current_graph()
    if g is None:
        return scan_sort.sort(x, axis, descending, key, device)
    binops.flag(descending, "descending", "sort")
    dtype = _dtype(x, "sort")
    _check_axis(x, axis, "sort")
    scan_sort.check_elements(dtype, key)  # compiles the key for the elements, where they are known
    _check_device(device)
    return g.record("sort", fn=sort, args=(x,), kwargs=dict(axis=axis, descending=descending, key=key,
                                                            device=device))


def wavefront(extent, kernel, *args, tile=None, device=None):
    """Run ``kernel(i, j, *args)`` at every index of the 2-D ``extent`` with the results of
    the sequential row-major loop, tiles on one anti-diagonal in parallel.

    ``tile``: (rows, columns) of a tile, or None for the device's default (on the CPU,
    about ``hetflow.runtime.wavefront.TILES_PER_CORE`` tiles per core along each dimension; on a GPU ``GPU_TILE``).
    ``device``: one device (None: the CPU, or the GPU holding GPU arguments).
    Returns None; inside ``with hetflow.graph()`` the sweep is recorded instead.
    """
    g = current_graph()
    if g is None:
        return _wavefront.wavefront(extent, kernel, *args, tile=tile, device=device)
    _wavefront.check(extent, kernel, args, tile)
    _check_device(device)
    return g.record("wavefront", fn=wavefront, args=(extent, kernel, *args), kwargs=dict(tile=tile, device=device))


def _check_axis(x, axis, site: str) -> None:
    """What ``site`` run now would refuse of ``axis``, refused while recording, with the
    same message: a Handle has no shape until its graph runs, so its axis's type is
    checked now and its range then."""
    shape = getattr(x, "shape", None)
    reductions.normalize_axis(axis, sys.maxsize if shape is None else len(shape), site)


def _dtype(x, site: str):
    """The element type of ``x``, refusing what ``site`` run now refuses of ``x`` (no array,
    a view of tiles); None for a Handle, whose result the graph has not computed yet."""
    if isinstance(x, Handle):
        return None
    if not isinstance(x, LazyArray):
        x = reductions.operand(x, site)
    return np.dtype(x.dtype)


def _check_device(device) -> None:
    """A ``device=`` that the call run now would refuse (an unknown id, an empty list),
    refused while recording, with the same message."""
    if device is not None:
        resolve_devices(device)


def zeros(shape, dtype=np.float64, device=None):
    """:func:`hetflow.index.zeros`; inside ``with hetflow.graph()`` a lazy array that the
    graph allocates only if its rules do not fuse it away."""
    g = current_graph()
    if g is None:
        return arrays.zeros(shape, dtype, device)
    shape, dtype = arrays.new_array_args("zeros", shape, dtype)  # a bad one fails now, not in g.run()
    return g.record("alloc", shape=shape, dtype=dtype, fill=0, factory=lambda shp, dt: arrays.zeros(shp, dt, device))


def empty(shape, dtype=np.float64, device=None):
    """:func:`hetflow.index.empty`; inside ``with hetflow.graph()`` a lazy array, as for :func:`zeros`."""
    g = current_graph()
    if g is None:
        return arrays.empty(shape, dtype, device)
    shape, dtype = arrays.new_array_args("empty", shape, dtype)  # a bad one fails now, not in g.run()
    return g.record("alloc", shape=shape, dtype=dtype, fill=None, factory=lambda shp, dt: arrays.empty(shp, dt, device))
