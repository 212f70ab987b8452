"""Binary operations of the ``reduce`` and ``scan`` call sites: built-in and user-defined.

A built-in operation is named: 'sum', 'prod', 'min', 'max', 'and', 'or', 'xor'. The
last three are logical on bool elements and bitwise on integers. Each built-in is also
a hetflow kernel of two elements, so the compiled paths (views, GPU) run the same code
shape as a user-defined operation.

A user-defined operation is a hetflow kernel with two element parameters returning the
combined element, e.g. ``def maxabs(a, b): return a if abs(a) >= abs(b) else b``. It
must be associative; it is commutative unless the call site is told otherwise, in
which case partial results are combined strictly in index order.
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

from ..errors import DTypeError, KernelArgumentError, UnknownOpError
from ..kernels import Kernel, kernel


@kernel
def op_sum(a, b):
    return a + b


@kernel
def op_prod(a, b):
    return a * b


@kernel
def op_min(a, b):
    # a != a: a is NaN; NaN wins, as in NumPy.
    return a if a <= b or a != a else b


@kernel
def op_max(a, b):
    return a if a >= b or a != a else b


@kernel
def op_and(a, b):
    return a & b


@kernel
def op_or(a, b):
    return a | b


@kernel
def op_xor(a, b):
    return a ^ b


# name: (kernel, dtype kinds accepted, NumPy ufunc)
_BUILTINS = {
    "sum": (op_sum, "biufc", np.add),
    "prod": (op_prod, "biufc", np.multiply),
    "min": (op_min, "biuf", np.minimum),
    "max": (op_max, "biuf", np.maximum),
    "and": (op_and, "biu", None),
    "or": (op_or, "biu", None),
    "xor": (op_xor, "biu", None),
}
BUILTIN_NAMES = tuple(_BUILTINS)
_LOGICAL = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}
_BITWISE = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}
_KIND_WORDS = {"b": "bool", "i": "signed integers", "u": "unsigned integers", "f": "floats",
               "c": "complex numbers"}


@dataclasses.dataclass(frozen=True)
class BinaryOp:
    """An operation resolved for a call site: its kernel and what is known about it."""

    name: str                 # the built-in's name, or the user kernel's
    kernel: Kernel
    builtin: bool
    commutative: bool

    def check(self, dtype: np.dtype) -> None:
        """DTypeError unless the operation applies to elements of ``dtype``."""
        if not self.builtin:
            return
        kinds = _BUILTINS[self.name][1]
        if dtype.names is not None or dtype.kind not in kinds:
            what = "structured elements" if dtype.names is not None else f"dtype {dtype}"
            raise DTypeError(f"op {self.name!r} does not apply to {what}; it takes "
                             f"{', '.join(_KIND_WORDS[k] for k in kinds)}"
                             + ("" if dtype.names is None else " (use a user-defined op kernel)"))

    def result_dtype(self, dtype: np.dtype) -> np.dtype:
        """The result's element type: NumPy's for built-ins, the input's for user ops."""
        return _result_dtype(self.name, dtype) if self.builtin else dtype

    def acc_dtype(self, dtype: np.dtype) -> np.dtype:
        """The type compiled paths accumulate in: sums and products of float16/32 and
        complex64 accumulate in double precision (results are rounded once, at the end)."""
        res = self.result_dtype(dtype)
        if self.builtin and self.name in ("sum", "prod"):
            if res.kind == "f" and res.itemsize < 8:
                return np.dtype(np.float64)
            if res.kind == "c" and res.itemsize < 16:
                return np.dtype(np.complex128)
        return res

    def identity(self, dtype: np.dtype):
        """The identity element for ``dtype``'s result type (built-ins only).

        min and max have one for scans (+-inf, the integer limits) but a reduction of
        no elements by them is still an error, as in NumPy."""
        res = self.result_dtype(dtype)
        t = res.type
        if self.name in ("sum", "or", "xor"):
            return t(0)
        if self.name == "prod":
            return t(1)
        if self.name == "and":
            return t(True) if res.kind == "b" else np.array(-1).astype(res)[()]
        low = self.name == "max"
        if res.kind == "b":
            return t(not low)
        if res.kind == "f":
            return t(-np.inf if low else np.inf)
        info = np.iinfo(res)
        return t(info.min if low else info.max)

    def ufunc(self, dtype: np.dtype):
        """The NumPy ufunc computing this built-in on ``dtype``."""
        if self.name in _LOGICAL:
            return (_LOGICAL if dtype.kind == "b" else _BITWISE)[self.name]
        return _BUILTINS[self.name][2]


@functools.lru_cache(maxsize=None)
def _result_dtype(name: str, dtype: np.dtype) -> np.dtype:
    if name in ("sum", "prod"):  # NumPy widens small integers and bools
        return np.add.reduce(np.zeros(1, dtype)).dtype
    return dtype


_BUILTIN_OPS = {name: BinaryOp(name, entry[0], True, True) for name, entry in _BUILTINS.items()}


def resolve(op, commutative: bool = True) -> BinaryOp:
    """A name or a two-parameter kernel, as a BinaryOp; errors name what is valid."""
    if isinstance(op, str):
        builtin = _BUILTIN_OPS.get(op)
        if builtin is None:
            raise UnknownOpError(f"unknown op {op!r}; valid ops are {', '.join(map(repr, BUILTIN_NAMES))} "
                                 f"or a hetflow kernel of two elements")
        return builtin
    if not isinstance(op, Kernel):
        raise KernelArgumentError(f"op must be one of {', '.join(map(repr, BUILTIN_NAMES))} or a hetflow "
                                  f"kernel of two elements, not {type(op).__name__} {op!r}; decorate a "
                                  f"function with @hetflow.kernel")
    params = op.params
    if len(params) != 2:
        raise KernelArgumentError(f"op kernel {op.name!r} takes {len(params)} parameter(s) "
                                  f"({', '.join(params)}); a binary op takes exactly two elements (a, b)")
    return BinaryOp(op.name, op, False, bool(commutative))
