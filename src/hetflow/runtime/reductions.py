"""What the ``reduce`` call site (SPEC §1 "Call sites", :mod:`hetflow.callsites`) runs for
arrays, and what ``scan`` and ``sort`` share with it: operand and axis checks, picking the
device, and cutting work into blocks.

Two paths compute a reduction:

- the *library* path: a built-in op over a NumPy array on the CPU runs NumPy's ufunc
  reduction; over a CuPy array on a GPU, CuPy's (CUB) for sum, prod, min, max and
  the logical and/or of bools;
- the *compiled* path, for everything else (user-defined ops, views, host data given
  to a GPU, the bitwise ops on a GPU): a generated kernel (``blockgen``) folds
  contiguous blocks of the input in parallel with ``forall`` on the chosen device,
  then the per-block partial results are folded again, block by block, until one is
  left. Blocks and partials stay in index order at every level, so an op that is not
  commutative gets ``x0 op x1 op ... op xn-1``, only grouped differently.
"""
from __future__ import annotations

import cmath
import contextlib
import dataclasses
import math
import operator

import numpy as np

from ..cuda_compat import cupy_module
from ..errors import ArgumentError, ArgumentTypeError, ShapeError
from ..index import views as _views
from ..index.arrays import array_module
from . import binops, blockgen
from .cpu import INLINE_LIMIT
from ..platform.devices import cpu_device
from .forall import forall, resolve_devices
from .launch import element_problem, is_device_array, refuse_masked


# -- operands, axes, devices ------------------------------------------------------------
def operand(x, site: str):
    """``x`` if it is an array or a view of elements (not of tiles), else an error; a NumPy
    array subclass (``np.matrix``, ``np.memmap``) as a plain array over its memory, so
    that results are the same on every device; a masked array is refused."""
    if type(x) is np.ndarray:  # the common case, checked first: call sites are hot paths
        return x
    _views.require_indexable(x, site)
    if _views.is_view(x) and _views.element_extent_of(x).rank:
        raise ShapeError(f"{site}: {x!r} is a view of tiles; {site} each tile instead")
    refuse_masked(x, f"{site}: x is")
    return np.asarray(x) if isinstance(x, np.ndarray) else x


def compiled_operand(x, devs, site: str, name: str = "x"):
    """``x`` (``site``'s argument ``name``) as generated kernels on ``devs`` read it: a
    NumPy array in non-native byte order as a native copy (they only read it); an
    ArgumentTypeError naming it for elements some device of ``devs`` cannot take
    (float16 on a CPU, objects, long double), or a view of an array in non-native byte
    order."""
    if type(x) is np.ndarray and not x.dtype.isnative:
        x = x.astype(x.dtype.newbyteorder("="))
    dtype = np.dtype(x.dtype)
    problems = [element_problem(dtype, dev.kind, dev.id) for dev in devs]
    problem = next((p for p in problems if p is not None), None)
    if problem is not None:
        what = f"{name} (a view, reading its root array)" if _views.is_view(x) else name
        able = [dev.id for dev, p in zip(devs, problems) if p is None]
        alone = f"; or run it on {', '.join(able)} alone" if able else ""
        raise ArgumentTypeError(f"{site}: {what}: {problem}{alone}")
    return x


def normalize_axis(axis, rank: int, site: str):
    """``axis`` as an int in [0, rank) (negative ones count from the end), or None."""
    if axis is None:
        return None
    try:
        if isinstance(axis, bool):  # an int to Python, but NumPy refuses it: True is no axis 1
            raise TypeError
        axis = operator.index(axis)
    except TypeError:
        raise ShapeError(f"{site}: axis must be None or an integer, got {axis!r}") from None
    if not -rank <= axis < rank:
        raise ShapeError(f"{site}: axis {axis} is out of range for an operand of rank {rank}"
                         + (f" (valid: {-rank}..{rank - 1} or None)" if rank else " (only None is valid)"))
    return axis % rank


def targets(device, x, site: str) -> tuple:
    """The devices ``site`` runs on: one, or several co-executing its launches (host
    data only); GPU data cannot be handed to a CPU device."""
    devs = resolve_devices(device, (x,))
    if is_device_array(_views.root_of(x)):
        if len(devs) > 1:
            raise ArgumentError(f"{site}: the operand lives on a GPU; several devices "
                                f"({', '.join(d.id for d in devs)}) co-execute host data only")
        if devs[0].kind == "cpu":
            raise ArgumentError(f"{site}: the operand lives on a GPU but device {devs[0].id} is a CPU; "
                                f"run it on a GPU device or copy it with hetflow.asarray(x, device='cpu')")
    return devs


def current_gpu(devs):
    """A context in which the one GPU of ``devs`` is current (the previous one after it),
    so that the call site's temporaries, which CuPy allocates on the current GPU, land
    on the GPU its launches run on; nothing for a CPU, several devices or the simulator."""
    dev = devs[0]
    cp = cupy_module() if len(devs) == 1 and dev.kind == "gpu" and not dev.simulated else None
    return cp.cuda.Device(dev.ordinal) if cp is not None else contextlib.nullcontext()


def planner(devs):
    """The device whose blocks a launch over ``devs`` uses: the one device, or the CPU
    where several co-execute (its many small blocks are the units they share out)."""
    return devs[0] if len(devs) == 1 else cpu_device()


def folder(devs):
    """Where partial results are folded after a first level on ``devs``: the same one
    device, or the CPU (co-executed levels leave their partials on the host)."""
    return devs if len(devs) == 1 else (cpu_device(),)


def element(x):
    """The element of a rank-0 array or view, as a NumPy scalar."""
    if _views.is_view(x):
        return x.numpy()[()]
    return (x.get() if is_device_array(x) else x)[()]


# -- blocks ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Blocking:
    """How a flat range is cut into blocks on one kind of device.

    ``grain``: fewest elements in a block; ``most``: most blocks in one launch (0: 1024
    per compute unit, which fills a GPU); ``inline``: up to this many blocks, use one
    (a launch of that few indices runs on the calling thread anyway, so one sequential
    pass is cheapest).
    """

    grain: int
    most: int
    inline: int = 0


# A CPU launch of more than INLINE_LIMIT indices is spread over the CPU's threads.
BLOCKING = {
    "cpu": Blocking(grain=16, most=2 * INLINE_LIMIT, inline=INLINE_LIMIT),
    "gpu": Blocking(grain=256, most=0),
    "simulated": Blocking(grain=2, most=4),  # one OS thread per GPU thread: keep it tiny
}


def block_plan(size: int, device) -> tuple[int, int]:
    """(number of blocks, elements per block) for ``size`` elements on ``device``."""
    kind = "simulated" if device.simulated else device.kind
    b = BLOCKING[kind]
    most = b.most or device.compute_units * 1024
    nblocks = size // b.grain
    if nblocks <= max(b.inline, 1):
        return 1, max(size, 1)
    nblocks = min(nblocks, most)
    block = -(-size // nblocks)
    return -(-size // block), block


def fold_blocks(x, op: binops.BinaryOp, acc: np.dtype, devs, xp, ordered: bool = True):
    """Fold every block of ``x`` (flat C order) into a 1-D array of partials in ``acc``
    elements, on the devices ``devs`` (several: co-executed); returns it and the block
    length. ``x``'s size must be positive.

    Blocks are contiguous, so partials are in index order; where ``ordered`` is false
    and the op is commutative, a GPU alone deals elements out round-robin instead."""
    shape = tuple(x.shape)
    size = math.prod(shape)
    nblocks, block = block_plan(size, planner(devs))
    cast = acc.name if acc != np.dtype(x.dtype) else None
    partial = xp.empty(nblocks, acc)
    if not ordered and op.commutative and len(devs) == 1 and devs[0].kind == "gpu" and nblocks > 1:
        kernel, step = blockgen.reduce_strided(len(shape), op.kernel, cast), nblocks
    else:
        kernel, step = blockgen.reduce_blocks(len(shape), op.kernel, cast, op.commutative), block
    forall(nblocks, kernel, x, size, step, *shape[1:], partial, device=devs)
    return partial, block


def _fold_all(x, op, acc, devs, xp):
    """The fold of all of ``x`` as a length-1 array of ``acc`` elements."""
    partial, _ = fold_blocks(x, op, acc, devs, xp, ordered=False)
    devs = folder(devs)
    while partial.shape[0] > 1:
        partial, _ = fold_blocks(partial, op, acc, devs, xp, ordered=False)
    return partial


# -- reduce ---------------------------------------------------------------------------------
def reduce(x, what=None, /, *args, op=None, axis=None, device=None, commutative=True, identity=None):
    """The array form of :func:`hetflow.reduce` (which documents it), run now."""
    op, axis, device = array_arguments(what, args, op, axis, device)
    op = binops.resolve(op, commutative)
    x = operand(x, "reduce")
    dtype = np.dtype(x.dtype)
    op.check(dtype)
    rank = len(x.shape)
    axis = normalize_axis(axis, rank, "reduce")
    devs = targets(device, x, "reduce")
    identity = check_identity(op, identity, dtype, "reduce")
    if rank == 0:
        value = element(x) if dtype.names is not None else op.result_dtype(dtype).type(element(x))
        return _scalar(value, x)
    if rank == 1:
        axis = None
    with current_gpu(devs):  # temporaries and results on the GPU the launches run on
        if (math.prod(x.shape) if axis is None else x.shape[axis]) == 0:
            return _empty_reduction(x, op, dtype, axis, identity)
        if op.builtin and not _views.is_view(x) and len(devs) == 1:
            result = _library_reduce(x, op, dtype, axis, devs[0])
            if result is not None:
                return result
        return _compiled_reduce(x, op, axis, devs)


def array_arguments(what, args, op, axis, device):
    """``(op, axis, device)`` of reduce's array form, ``reduce(x, op, axis, device)``, each
    given by position or by keyword, not both (as Python refuses it)."""
    if what is not None:
        if op is not None:
            raise ArgumentTypeError(f"reduce: op given twice ({what!r} and op={op!r})")
        op = what
    if len(args) > 2:
        raise ArgumentTypeError(f"reduce(x, op, axis, device) takes at most 4 positional arguments; "
                                f"got {2 + len(args)} (for a kernel, give an extent first)")
    given = {"axis": axis, "device": device}
    for name, value in zip(given, args):
        if given[name] is not None:
            raise ArgumentTypeError(f"reduce() got {name} twice ({value!r} by position and "
                                    f"{name}={given[name]!r})")
        given[name] = value
    return op, given["axis"], given["device"]


def check_identity(op: binops.BinaryOp, identity, dtype: np.dtype | None, site: str):
    """``site``'s ``identity=`` for ``op``: None if not given; ArgumentTypeError for a
    built-in op (it has its own); else the identity as an element of ``dtype``
    (:func:`identity_element`), or as given where ``dtype`` is None (not known yet)."""
    if identity is None:
        return None
    if op.builtin:
        raise ArgumentTypeError(f"{site}: identity= is for user-defined ops; {op.label!r} has its own")
    return identity if dtype is None else identity_element(identity, dtype, site)


def identity_element(identity, dtype: np.dtype, site: str):
    """A user op's ``identity=`` as an element of ``dtype``: ArgumentTypeError where it is
    none (a string, a sequence), or where converting it would change it (1.5 or 300 for
    int8 elements; 1e300, which float32 rounds to inf)."""
    value = None
    if not isinstance(identity, (str, bytes)):  # NumPy parses "1.5" into a float
        with contextlib.suppress(TypeError, ValueError, OverflowError), np.errstate(over="ignore"):
            value = np.asarray(identity, dtype=dtype)
    if value is None or value.ndim or not _same_element(value, identity, dtype):
        raise ArgumentTypeError(f"{site}: identity={identity!r} is not an element of dtype {dtype}")
    return value[()]


def _same_element(value, identity, dtype: np.dtype) -> bool:
    """Whether ``value``, ``identity`` converted to ``dtype``, is it: integers exactly,
    floats rounded but not overflowed to infinity."""
    if dtype.kind in "biu":
        return bool(value == identity)
    return dtype.kind not in "fc" or bool(np.isfinite(value)) or not cmath.isfinite(complex(identity))


def _scalar(value, x):
    """A reduction's scalar result: a NumPy scalar, or a 0-d array on the GPU for GPU data."""
    root = _views.root_of(x)
    return array_module(root).asarray(value) if is_device_array(root) else value


def _compiled_reduce(x, op, axis, devs):
    x = compiled_operand(x, devs, "reduce")
    dtype = np.dtype(x.dtype)
    xp = array_module(_views.root_of(x))
    res, acc = op.result_dtype(dtype), op.acc_dtype(dtype)
    if axis is None:
        value = _fold_all(x, op, acc, devs, xp)
        if xp is not np:
            return value.astype(res).reshape(())
        return value[0] if res.names is not None else res.type(value[0])
    out_shape = x.shape[:axis] + x.shape[axis + 1:]
    out = xp.empty(out_shape, res)
    if out.size:
        cast = acc.name if acc != dtype else None
        kernel = blockgen.reduce_axis(len(x.shape), axis, op.kernel, cast, op.commutative)
        forall(out_shape, kernel, x, x.shape[axis], out, device=devs)
    return out


def check_empty(shape: tuple, op, axis, identity) -> None:
    """What :func:`reduce` refuses of an operand of ``shape`` reduced along ``axis`` (as
    given): no elements to reduce and no identity to give (ShapeError). A graph records
    no reduction that would fail so when it runs."""
    if not shape:
        return
    axis = None if len(shape) == 1 else normalize_axis(axis, len(shape), "reduce")
    if identity is None and (math.prod(shape) if axis is None else shape[axis]) == 0:
        _identity_needed(op, axis, shape)


def _identity_needed(op, axis, shape) -> None:
    """ShapeError unless ``op`` has an identity to give for an empty reduction."""
    if not op.builtin or op.name in ("min", "max"):
        what = f"op {op.label!r}" + ("" if op.builtin else " (pass identity= for empty inputs)")
        raise ShapeError(f"reduce: {what} has no identity, so it cannot reduce an empty "
                         f"{'operand' if axis is None else f'axis {axis}'} of shape {tuple(shape)}")


def _empty_reduction(x, op, dtype, axis, identity):
    if identity is None:
        _identity_needed(op, axis, x.shape)
        identity = op.identity(dtype)
    if axis is None:
        return _scalar(identity, x)
    xp = array_module(_views.root_of(x))
    out = xp.empty(x.shape[:axis] + x.shape[axis + 1:], op.result_dtype(dtype))
    out[...] = identity
    return out


_CUPY_REDUCTIONS = {"sum": "sum", "prod": "prod", "min": "amin", "max": "amax"}
_CUPY_LOGICAL = {"and": "all", "or": "any"}


def _library_reduce(x, op, dtype, axis, dev):
    """NumPy / CuPy's reduction of an array, or None where the compiled path runs."""
    res = op.result_dtype(dtype)
    if dev.kind == "cpu":
        value = op.ufunc(dtype).reduce(x, axis=axis, dtype=res)
        return value if axis is not None else res.type(value)
    if not is_device_array(x):
        return None
    cp = array_module(x)
    name = _CUPY_REDUCTIONS.get(op.name) or (_CUPY_LOGICAL.get(op.name) if dtype.kind == "b" else None)
    if name is None:
        return None
    return getattr(cp, name)(x, axis=axis).astype(res, copy=False)  # (reduce made the GPU current)
