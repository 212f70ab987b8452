"""Reduction operations for the collectives: built-in ones and user-defined ones.

An operation combines two arrays element by element, ``out = a op b``, and must be
associative and commutative: the collectives combine contributions in an order that
depends on the number of processes and on the root. ``out`` may be the same array as
``a`` or ``b`` (the collectives reduce in place into the kept segment).

Built-in operations are those of the call sites (:data:`hetflow.runtime.binops.OPS`,
the same names: ``sum prod min max and or xor land lor lxor``, with MPI's ``band bor
bxor`` for ``and or xor``), applied as NumPy (or CuPy) ufuncs with ``out=``; on
structured element types they are applied field by field. A user-defined operation is
either any callable ``op(a, b, out)`` or a hetflow kernel launched with ``hetflow.forall``:
``k(i, a, b, out)``, or the call sites' binary op ``k(a, b)`` returning the element.
"""
from __future__ import annotations

import abc

import numpy as np

from hetflow.errors import ArgumentError, ArgumentTypeError
from hetflow.kernels import Kernel
from hetflow.runtime import blockgen
from hetflow.runtime.binops import OPS, SPELLINGS, describe_kinds, lookup, reduced_dtype, valid_names
from hetflow.runtime.forall import forall

BUILTIN_OPS = tuple(OPS)


def check_transferable(dtype: np.dtype) -> None:
    """Raise ArgumentTypeError unless ``dtype`` can travel between processes as raw bytes."""
    if dtype.hasobject:
        raise ArgumentTypeError(
            f"dtype {dtype} holds Python objects, which cannot be sent as raw bytes")


class ReduceOp(abc.ABC):
    """A binary reduction ``combine(a, b, out)``; ``name`` identifies it across ranks."""

    name: str = ""

    def check(self, dtype: np.dtype) -> None:
        """Raise ArgumentTypeError when the operation does not fit ``dtype``."""
        check_transferable(dtype)

    @abc.abstractmethod
    def combine(self, a, b, out, xp=np) -> None:
        """Store ``a op b`` into ``out``; ``xp`` is numpy or cupy, matching the arrays."""

    def result_dtype(self, dtype: np.dtype) -> np.dtype:
        """The element type of a reduction of ``dtype``'s elements: ``dtype`` itself
        for user ops."""
        return dtype

    def __repr__(self):
        return f"<{type(self).__name__} {self.name}>"


class BuiltinOp(ReduceOp):
    """A predefined operation: a ufunc, applied field by field on structured dtypes.

    ``name`` is the operation's name in :data:`~hetflow.runtime.binops.OPS` (what ranks
    compare); messages quote ``label``, the name as the caller wrote it."""

    def __init__(self, spec, label: str):
        self.name, self.label = spec.name, label
        self.ufunc_name, self.kinds = spec.ufunc, spec.in_place_kinds
        self._fitting = set()  # dtypes already checked: collectives run in loops

    def check(self, dtype: np.dtype) -> None:
        if dtype in self._fitting:
            return
        check_transferable(dtype)
        for path, kind_dtype in _leaf_fields(dtype):
            if kind_dtype.kind not in self.kinds:
                where = f" (field {'.'.join(path)!r})" if path else ""
                raise ArgumentTypeError(
                    f"op {self.label!r} does not apply to dtype {kind_dtype}{where}; "
                    f"it takes {describe_kinds(self.kinds)}")
        self._fitting.add(dtype)

    def result_dtype(self, dtype: np.dtype) -> np.dtype:
        """NumPy's, for reducing all of an array (sums of small integers widen); a
        collective's own result keeps the input's type, as MPI's does."""
        return dtype if dtype.names is not None else reduced_dtype(self.ufunc_name, dtype)

    def combine(self, a, b, out, xp=np) -> None:
        ufunc = getattr(xp, self.ufunc_name)
        if a.dtype.names is None:
            ufunc(a, b, out=out)
            return
        for path, _ in _leaf_fields(a.dtype):
            ufunc(_field(a, path), _field(b, path), out=_field(out, path))


class CallableOp(ReduceOp):
    """A user function ``fn(a, b, out)`` on arrays of the collective's element type."""

    def __init__(self, fn):
        self.fn = fn
        self.name = _qualified_name(fn)

    def combine(self, a, b, out, xp=np) -> None:
        self.fn(a, b, out)


class KernelOp(ReduceOp):
    """A hetflow kernel run over the segment by forall: ``k(i, a, b, out)``, or a binary
    op ``k(a, b)`` returning the combined element, as ``hetflow.reduce`` and ``scan``
    take it (one user op for call sites and collectives)."""

    def __init__(self, kernel):
        self.kernel = blockgen.combine(kernel) if len(kernel.params) == 2 else kernel
        self.name = _qualified_name(kernel)

    def combine(self, a, b, out, xp=np) -> None:
        forall(out.shape[0], self.kernel, a, b, out)


_BUILTIN_OPS = {alias: BuiltinOp(spec, alias) for alias, spec in SPELLINGS.items()}


def resolve_op(op) -> ReduceOp:
    """Turn a name, a kernel, a callable or a ReduceOp into a ReduceOp."""
    builtin = _BUILTIN_OPS.get(op) if isinstance(op, str) else None
    if builtin is not None:
        return builtin
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str):
        spec = lookup(op)
        if spec is None:
            raise ArgumentError(
                f"unknown reduction op {op!r}; built-in ops are {valid_names()}, "
                "or pass a callable op(a, b, out) or a hetflow kernel")
        return BuiltinOp(spec, op)
    if isinstance(op, Kernel):
        return KernelOp(op)
    if callable(op):
        return CallableOp(op)
    raise ArgumentError(
        f"reduction op must be a name, a callable op(a, b, out) or a hetflow kernel, "
        f"not {type(op).__name__}")


def _qualified_name(fn) -> str:
    module = getattr(fn, "__module__", None) or ""
    for attr in ("__qualname__", "__name__", "name"):
        name = getattr(fn, attr, None)
        if isinstance(name, str):
            break
    else:
        name = type(fn).__qualname__
    return f"{module}.{name}" if module else name


def _leaf_fields(dtype: np.dtype, path: tuple = ()):
    """Yield (field path, base dtype) for every scalar leaf of a possibly nested dtype."""
    if dtype.subdtype is not None:  # a subarray field: its elements are the leaves
        dtype = dtype.base
    if dtype.names is None:
        yield path, dtype
        return
    for name in dtype.names:
        yield from _leaf_fields(dtype.fields[name][0], path + (name,))


def _field(arr, path):
    for name in path:
        arr = arr[name]
    return arr
