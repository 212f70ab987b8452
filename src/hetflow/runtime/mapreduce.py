"""The kernel form of ``reduce``: map-reduce in one pass (``reduce(extent, kernel, *args)``).

The kernel is a hetflow kernel of the launch index and data arguments that *returns*
the value at that index, a number, a bool or a tuple of them::

    @hetflow.kernel
    def product(i, x, y):
        return x[i] * y[i]

    dot = hetflow.reduce(len(x), product, x, y)                  # op="sum"

Its values are never stored: one generated kernel (``blockgen.map_blocks``) computes
them and folds them, block by block, into one partial result per block, in a launch of
one index per block; the partials are folded again in index order (the same generated
code, reading them) until one is left. A tuple value is a structured result, folded by
a user op of two tuples, e.g. ``(value, index)`` pairs by ``library.minloc``.

The value's type is found before anything runs, by typing the kernel's body on the CPU
for the arguments' types; the partials are stored in that type (sums and products of
float32 and of small integers accumulate as ``reduce`` does on arrays).
"""
from __future__ import annotations

import math

import numba
import numpy as np
from numba.core import types
from numba.core.errors import NumbaError
from numba.np.numpy_support import as_dtype

from ..errors import ArgumentTypeError, KernelCompileError, ShapeError
from ..index import views as _views
from ..index.arrays import array_module
from ..kernels import Kernel
from ..platform.devices import cpu_device
from ..platform.repository import repository
from . import binops, blockgen
from .forall import forall, resolve_devices
from .launch import _arg_key as arg_key, check_extent, element_problem, is_device_array, normalize_extent, refuse_masked
from .reductions import block_plan, check_identity, current_gpu, folder, identity_element, planner


# CPU blocks of a map-reduce: at most this many per core.
CPU_BLOCKS_PER_CORE = 64


def kernel_op(op, axis):
    """The op of the kernel form, ``reduce(extent, kernel, *args, op="sum")``, which has no axis."""
    if axis is not None:
        raise ArgumentTypeError("reduce(extent, kernel, ...) folds every index of the extent; "
                                "axis= is for the array form")
    return "sum" if op is None else op


def map_reduce(extent, kernel, args, op, device, commutative, identity):
    """``op``'s fold of ``kernel(i, *args)`` over every index ``i`` of ``extent``: a NumPy
    scalar, or a tuple of them for a kernel returning tuples."""
    op = binops.resolve(op, commutative)
    ext = normalize_extent(extent)
    rank = len(ext)
    check_kernel(kernel, rank, args)
    _check_elements(kernel, args)
    dtypes = value_types(kernel, args, rank)
    check_extent(kernel, ext, args)  # the launch over blocks checks only the generated kernel's
    fields = 0 if isinstance(dtypes, np.dtype) else len(dtypes)
    value = dtypes if fields == 0 else np.dtype([(f"f{k}", d) for k, d in enumerate(dtypes)])
    op.check(value)
    check_identity(op, identity, None, "reduce")  # converted where the extent is empty (per field for tuples)
    size = math.prod(ext)
    if size == 0:
        return _empty(op, value, identity, ext)
    targets = resolve_devices(device, args)
    acc = op.acc_dtype(value) if fields == 0 else None
    cast = acc.name if acc is not None and acc != value else None
    with current_gpu(targets):  # the partials on the GPU the launches run on
        parts = _fold_level(kernel, ext, args, op, fields, (acc,) if fields == 0 else dtypes, cast, targets)
        targets = folder(targets)
        while parts[0].shape[0] > 1:  # the partials, folded in index order on one device
            parts = _fold_level(blockgen.gather(fields), parts[0].shape, parts, op, fields,
                                tuple(np.dtype(p.dtype) for p in parts), None, targets[:1])
        first = [_first(p) for p in parts]
    if fields == 0:
        return op.result_dtype(value).type(first[0])
    return tuple(first)


def _fold_level(kernel, ext, args, op, fields, dtypes, cast, targets):
    """One launch folding ``kernel``'s values into per-block partial arrays (one per field)."""
    size = math.prod(ext)
    plan = planner(targets)
    nblocks, block = block_plan(size, plan)
    if plan.kind == "cpu" and nblocks > CPU_BLOCKS_PER_CORE * plan.compute_units:
        # A block's set-up (index decomposition, four chains to combine) is paid per
        # block: few large ones, still many more than cores for stealing to balance.
        block = -(-size // (CPU_BLOCKS_PER_CORE * plan.compute_units))
        nblocks = -(-size // block)
    xp = next((array_module(a) for a in args if is_device_array(a)), np) if len(targets) == 1 else np
    parts = [xp.empty(nblocks, d) for d in dtypes]
    mode = "ordered"
    if op.commutative and len(targets) == 1 and targets[0].kind == "gpu" and nblocks > 1:
        mode, block = "strided", nblocks
    elif op.commutative:
        mode = "lanes"
    gen = blockgen.map_blocks(kernel, len(ext), op.kernel, fields, cast, mode)
    forall(nblocks, gen, *args, size, block, *ext[1:], *parts, device=targets)
    return parts


def _first(p):
    return (p[:1].get() if is_device_array(p) else p)[0]


def _empty(op, value, identity, ext):
    if identity is not None:
        return _identity_value(identity, value)
    if not op.builtin or op.name in ("min", "max"):
        what = f"op {op.label!r}" + ("" if op.builtin else " (pass identity= for empty extents)")
        raise ShapeError(f"reduce: {what} has no identity, so it cannot reduce the empty extent {ext}")
    return op.identity(value)


def _identity_value(identity, value: np.dtype):
    """``identity=`` as a value of the kernel: a NumPy scalar, or a tuple of them."""
    if value.names is None:
        return identity_element(identity, value, "reduce")
    if not isinstance(identity, tuple) or len(identity) != len(value.names):
        raise ArgumentTypeError(f"reduce: identity={identity!r} is not a value of the kernel, a tuple of "
                                f"{len(value.names)} ({', '.join(str(value[n]) for n in value.names)})")
    return tuple(identity_element(v, value[n], "reduce") for v, n in zip(identity, value.names))


def check_kernel(kernel, rank: int, args) -> None:
    """ArgumentTypeError unless ``kernel`` is a hetflow kernel with readable source taking
    ``rank`` index parameters and then ``args``: what map-reduce refuses first."""
    if not isinstance(kernel, Kernel):
        raise ArgumentTypeError(f"reduce(extent, kernel, *args): kernel must be a hetflow kernel, "
                                f"not {type(kernel).__name__}")
    if not kernel.has_source:
        raise ArgumentTypeError(f"reduce: map kernel {kernel.name!r} has no readable source (defined in "
                                f"{kernel.filename or 'an exec'}); define it in a file or module")
    data = len(kernel.params) - rank
    if data != len(args):
        raise ArgumentTypeError(f"reduce: kernel {kernel.name!r} takes {rank} index parameter(s) and "
                                f"{max(data, 0)} argument(s) ({', '.join(kernel.params)}); got "
                                f"{len(args)} argument(s) for a rank-{rank} extent")


def _check_elements(kernel, args) -> None:
    """ArgumentTypeError for an array argument the map kernel cannot read: a masked one,
    or elements cpu0 cannot type (the kernel's value is typed there, whatever the device)."""
    for name, arg in zip(kernel.params[-len(args):] if args else (), args):
        refuse_masked(arg, f"reduce: kernel {kernel.name!r} argument {name!r}:")
        dtype = getattr(arg.root if _views.is_view(arg) else arg, "dtype", None)
        problem = element_problem(np.dtype(dtype), "cpu", "cpu0") if dtype is not None else None
        if problem is not None:
            where = "" if element_problem(np.dtype(dtype), "gpu", "gpu0") else \
                " (a map kernel's value is typed on cpu0, whatever the device)"
            raise ArgumentTypeError(f"reduce: kernel {kernel.name!r} argument {name!r}: {problem}{where}")


_value_types: dict[tuple, object] = {}


def value_types(kernel: Kernel, args, rank: int):
    """The dtype of ``kernel``'s value for these arguments, or a tuple of dtypes for a
    kernel returning tuples: its body typed by Numba for the arguments' types."""
    key = (kernel, rank, *map(_type_key, args))  # cheap: Numba's typeof costs ~20 us an array
    found = _value_types.get(key)
    if found is None:
        sig = (types.intp,) * rank + tuple(_numba_type(a) for a in args)
        fn = repository().device_function(kernel, cpu_device())
        try:
            fn.compile(sig)
        except NumbaError as exc:
            raise KernelCompileError(f"reduce: map kernel {kernel.name!r} does not compile for arguments "
                                     f"{sig[rank:]}: {exc}") from None
        found = _value_types[key] = _dtypes(kernel, fn.overloads[sig].signature.return_type)
    return found


def _type_key(a):
    """What decides ``a``'s Numba type (a view's: its element type and rank)."""
    if _views.is_view(a):
        return "view", np.dtype(a.dtype), len(a.shape)
    return arg_key(a)


def _numba_type(a):
    """The Numba type ``a`` has in a kernel: views and GPU arrays are typed as arrays."""
    if type(a) is np.ndarray or np.isscalar(a):
        return numba.typeof(a)
    if _views.is_view(a) or hasattr(a, "shape") and hasattr(a, "dtype"):
        return types.Array(numba.from_dtype(np.dtype(a.dtype)), len(a.shape), "A")
    return numba.typeof(a)


def _dtypes(kernel, t):
    if isinstance(t, types.BaseTuple) and len(t) and all(isinstance(e, (types.Number, types.Boolean)) for e in t):
        return tuple(as_dtype(e) for e in t)
    if isinstance(t, (types.Number, types.Boolean)):
        return as_dtype(t)
    raise ArgumentTypeError(f"reduce: map kernel {kernel.name!r} returns {t}; it must return a number, a bool "
                            f"or a tuple of them (the value at its index)")
