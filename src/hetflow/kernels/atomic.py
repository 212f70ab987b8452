"""Atomic updates of array elements inside kernels: ``hetflow.atomic``.

``add``, ``min`` and ``max`` update ``ary[idx]`` and ``cas`` compares and swaps it,
each as one indivisible step, and each returns the element's old value (as CUDA's
atomics do). ``idx`` is an integer for a 1-D array, a tuple of integers for an N-D one.
``ary`` may be a view a kernel is passed (a section, a transpose, a cshift...): every
view index names one element of its root, which the operation updates.
Element types: int32, int64, uint32, uint64, float32 and float64 (``cas``: the integer
ones). An operand is converted to the element type first (-1 into a uint32 array is
2**32 - 1, a float64 into a float32 array is rounded before the addition). ``min`` and
``max`` on floats ignore a NaN, the element's or the operand's (IEEE ``minNum``/``maxNum``).

The same functions compile for every device:

- CPU (Numba): LLVM ``atomicrmw`` / ``cmpxchg`` instructions, safe across every worker
  thread; an index outside the array raises IndexError (never wrapped, as on a GPU).
- GPU (numba-cuda): ``cuda.atomic``'s instructions (:func:`register_cuda`).
- Plain Python (a kernel called as a function, the CUDA simulator's threads): a lock.

Access analysis (:mod:`.access`) knows these calls: an array updated only through
them may be written at any index by a parallel launch without a warning.
"""
from __future__ import annotations

import builtins
import threading

from numba.core import cgutils, types
from numba.core.errors import TypingError
from numba.extending import intrinsic, overload

from ..cuda_compat import on_cuda_import
from .viewtypes import PyView, ViewType

_RMW_TYPES = ("int32", "int64", "uint32", "uint64", "float32", "float64")
_CAS_TYPES = ("int32", "int64", "uint32", "uint64")

_lock = threading.Lock()  # the plain-Python versions' atomicity


def _python_index(name: str, ary, idx, allowed=_RMW_TYPES):
    """``idx`` as NumPy indexes ``ary``, refused where compiled code refuses it: an
    element type the compiled atomics do not take (the simulator ran those), a wrong
    number of indices, a negative or too large one."""
    where = f"hetflow.atomic.{name}"
    if str(ary.dtype) not in allowed:
        raise TypeError(f"{where}: needs an array of {', '.join(allowed)}; got one of {ary.dtype}")
    parts = idx if isinstance(idx, tuple) else (idx,)
    if len(parts) != ary.ndim:
        raise IndexError(f"{where}: the index of a {ary.ndim}-D array must be {ary.ndim} integer(s); got {idx}")
    if any(k < 0 or k >= n for k, n in zip(parts, ary.shape)):
        raise IndexError(f"{where}: index {idx} is outside an array of shape {tuple(ary.shape)}")
    return parts


def _element(dtype, value):
    """``value`` as an element of ``dtype``, converted as compiled code converts an
    operand before it compares or adds: integers wrapped (NumPy refuses a Python int out
    of range, and compared -1 with a uint32 as -1), floats truncated toward zero into an
    integer type, a float64 rounded to float32."""
    if dtype.kind not in "iu":
        return dtype.type(value)
    bits = 8 * dtype.itemsize
    value = int(value) & ((1 << bits) - 1)
    return dtype.type(value - (1 << bits) if dtype.kind == "i" and value >> (bits - 1) else value)


def _nan(x) -> bool:
    return x != x


def add(ary, idx, val):
    """``ary[idx] += val`` atomically; returns the old ``ary[idx]``."""
    if isinstance(ary, PyView):
        return ary.atomic("add", idx, val)
    idx, val = _python_index("add", ary, idx), _element(ary.dtype, val)
    with _lock:
        old = ary[idx]
        ary[idx] = _element(ary.dtype, int(old) + int(val)) if ary.dtype.kind in "iu" else old + val
    return old


def min(ary, idx, val):  # noqa: A001  (hetflow.atomic.min, as cuda.atomic.min)
    """``ary[idx] = min(ary[idx], val)`` atomically (a NaN operand is ignored); returns
    the old ``ary[idx]``."""
    if isinstance(ary, PyView):
        return ary.atomic("min", idx, val)
    idx, val = _python_index("min", ary, idx), _element(ary.dtype, val)
    with _lock:
        old = ary[idx]
        if _nan(old) or val < old:
            ary[idx] = val
    return old


def max(ary, idx, val):  # noqa: A001
    """``ary[idx] = max(ary[idx], val)`` atomically (a NaN operand is ignored); returns
    the old ``ary[idx]``."""
    if isinstance(ary, PyView):
        return ary.atomic("max", idx, val)
    idx, val = _python_index("max", ary, idx), _element(ary.dtype, val)
    with _lock:
        old = ary[idx]
        if _nan(old) or val > old:
            ary[idx] = val
    return old


def cas(ary, idx, expected, val):
    """Compare and swap: ``ary[idx] = val`` if ``ary[idx] == expected``, atomically;
    returns the old ``ary[idx]`` (equal to ``expected`` when the swap happened)."""
    if isinstance(ary, PyView):
        return ary.atomic("cas", idx, expected, val)
    idx = _python_index("cas", ary, idx, _CAS_TYPES)
    expected, val = _element(ary.dtype, expected), _element(ary.dtype, val)
    with _lock:
        old = ary[idx]
        if old == expected:
            ary[idx] = val
    return old


FUNCTIONS = (add, min, max, cas)


def _check(name: str, ary, idx, allowed) -> None:
    """TypingError unless ``ary`` is a writable array, or a view of one (a
    :class:`.viewtypes.ViewType`: a view, a checked array), of an ``allowed`` element type
    and ``idx`` one integer per axis (types of numba's or numba-cuda's type system)."""
    where = f"hetflow.atomic.{name}"
    view = isinstance(ary, ViewType) and ary.layout.is_view
    what = "a view" if view else "the array"
    array, ndim = (ary.root, ary.layout.rank) if isinstance(ary, ViewType) else (ary, getattr(ary, "ndim", 0))
    if not (hasattr(array, "dtype") and hasattr(array, "ndim")) or str(array.dtype) not in allowed:
        raise TypingError(f"{where}: needs an array of {', '.join(allowed)}; got {f'{what} of ' if view else ''}{array}")
    if not getattr(array, "mutable", True):
        raise TypingError(f"{where}: {what} is read-only")
    parts = list(idx) if hasattr(idx, "count") and hasattr(idx, "types") else [idx]
    if len(parts) != ndim or not builtins.all(type(t).__name__ in ("Integer", "IntegerLiteral") for t in parts):
        kind = f"{what}, a view of rank {ndim}," if view else f"a {ndim}-D array"
        raise TypingError(f"{where}: the index of {kind} must be {ndim} integer(s); got {idx}")


def _on_view(name: str, ary, idx):
    """The implementation of ``name`` on a view (or checked array) ``ary``, None on an
    array: its layout's, which computes the root index and updates the root element
    there (:meth:`.viewtypes.Layout.impl`)."""
    if isinstance(ary, ViewType):
        return ary.layout.impl(name, (True,) * ary.layout.rank, hasattr(idx, "count") and hasattr(idx, "types"))
    return None


# -- CPU: LLVM atomic instructions -------------------------------------------------------------
def _element_pointer(context, builder, aryty, ary, idxty, idx):
    """Pointer to ``ary[idx]``; IndexError (raised to the caller) outside the array."""
    array = context.make_array(aryty)(context, builder, ary)
    if isinstance(idxty, types.BaseTuple):
        parts = [context.cast(builder, builder.extract_value(idx, k), t, types.intp)
                 for k, t in enumerate(idxty)]
    else:
        parts = [context.cast(builder, idx, idxty, types.intp)]
    shape = cgutils.unpack_tuple(builder, array.shape, aryty.ndim)
    for k, n in zip(parts, shape):
        outside = builder.or_(builder.icmp_signed("<", k, k.type(0)), builder.icmp_signed(">=", k, n))
        with cgutils.if_unlikely(builder, outside):
            context.call_conv.return_user_exc(builder, IndexError, ("hetflow.atomic: index out of bounds",))
    strides = cgutils.unpack_tuple(builder, array.strides, aryty.ndim)
    return cgutils.get_item_pointer2(context, builder, array.data, shape, strides, aryty.layout, parts)


def _rmw_op(op: str, dtype) -> str:
    """The ``atomicrmw`` operation of ``op`` on ``dtype`` elements."""
    if isinstance(dtype, types.Float):
        return "f" + op
    if op == "add" or dtype.signed:
        return op
    return "u" + op


def _rmw(op: str):
    @intrinsic
    def rmw(typingctx, ary, idx, val):
        sig = ary.dtype(ary, idx, ary.dtype)

        def codegen(context, builder, signature, args):
            aryty, idxty, _ = signature.args
            ptr = _element_pointer(context, builder, aryty, args[0], idxty, args[1])
            return builder.atomic_rmw(_rmw_op(op, aryty.dtype), ptr, args[2], "seq_cst")

        return sig, codegen
    return rmw


@intrinsic
def _cmpxchg(typingctx, ary, idx, expected, val):
    sig = ary.dtype(ary, idx, ary.dtype, ary.dtype)

    def codegen(context, builder, signature, args):
        aryty, idxty = signature.args[:2]
        ptr = _element_pointer(context, builder, aryty, args[0], idxty, args[1])
        pair = builder.cmpxchg(ptr, args[2], args[3], "seq_cst", "seq_cst")
        return builder.extract_value(pair, 0)

    return sig, codegen


def _overload_rmw(fn, allowed):
    rmw = _rmw(fn.__name__)

    @overload(fn, target="cpu")
    def cpu_impl(ary, idx, val):
        _check(fn.__name__, ary, idx, allowed)
        return _on_view(fn.__name__, ary, idx) or (lambda ary, idx, val: rmw(ary, idx, val))


for _fn in (add, min, max):
    _overload_rmw(_fn, _RMW_TYPES)


@overload(cas, target="cpu")
def _cas_cpu(ary, idx, expected, val):
    _check("cas", ary, idx, _CAS_TYPES)
    return _on_view("cas", ary, idx) or (lambda ary, idx, expected, val: _cmpxchg(ary, idx, expected, val))


# -- GPU: numba-cuda's atomics ------------------------------------------------------------------
_cuda_registered = []


def cuda_impls(cuda) -> dict:
    """Each function's implementations in device code over ``cuda`` (the imported
    ``numba.cuda``): (integer or N-D index, 1-tuple index of a 1-D array), as cuda.atomic
    takes the latter as an integer. Written out: device code reaches cuda.atomic only by
    attribute. ``min`` and ``max`` are cuda.atomic's ``nanmin`` and ``nanmax``: its
    ``min`` and ``max`` keep a NaN element (a float max over an array filled with NaN
    stayed NaN on a GPU, while the CPU's atomics ignore it)."""
    return {
        add: (lambda ary, idx, val: cuda.atomic.add(ary, idx, val),
              lambda ary, idx, val: cuda.atomic.add(ary, idx[0], val)),
        min: (lambda ary, idx, val: cuda.atomic.nanmin(ary, idx, val),
              lambda ary, idx, val: cuda.atomic.nanmin(ary, idx[0], val)),
        max: (lambda ary, idx, val: cuda.atomic.nanmax(ary, idx, val),
              lambda ary, idx, val: cuda.atomic.nanmax(ary, idx[0], val)),
        cas: (lambda ary, idx, expected, val: cuda.atomic.cas(ary, idx, expected, val),
              lambda ary, idx, expected, val: cuda.atomic.cas(ary, idx[0], expected, val)),
    }


def register_cuda(cuda) -> None:
    """Teach numba-cuda (``cuda``: the imported ``numba.cuda``) these functions as
    ``cuda.atomic``'s (:func:`cuda_impls`); once. Not for the simulator, which runs them
    as Python."""
    if _cuda_registered:
        return
    from numba.cuda.extending import overload as cuda_overload

    impls = cuda_impls(cuda)

    def pick(fn, ary, idx):
        return _on_view(fn.__name__, ary, idx) or impls[fn][1 if ary.ndim == 1 and hasattr(idx, "count") else 0]

    def rmw(fn):
        @cuda_overload(fn, target="cuda")
        def gpu_impl(ary, idx, val):
            _check(fn.__name__, ary, idx, _RMW_TYPES)
            return pick(fn, ary, idx)

    for fn in (add, min, max):
        rmw(fn)

    @cuda_overload(cas, target="cuda")
    def gpu_cas(ary, idx, expected, val):
        _check("cas", ary, idx, _CAS_TYPES)
        return pick(cas, ary, idx)

    _cuda_registered.append(cuda)


on_cuda_import(register_cuda)
