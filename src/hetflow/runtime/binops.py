"""Binary operations: the built-in ones, for call sites and collectives alike, and
user-defined ones of the ``reduce`` and ``scan`` call sites.

The built-in operations form one vocabulary, :data:`OPS`, used by ``reduce`` and
``scan`` and by the collectives of :mod:`hetflow.collectives` (``allreduce``, ``reduce``):

- ``sum``, ``prod``, ``min``, ``max``;
- ``and``, ``or``, ``xor``: bitwise on integers, logical on bools (also accepted under
  MPI's names ``band``, ``bor``, ``bxor``);
- ``land``, ``lor``, ``lxor``: logical, any nonzero integer counting as true.

Names are case-insensitive. Each built-in is also a hetflow kernel of two elements, so
the compiled paths (views, GPU) run the same code shape as a user-defined operation.

A user-defined operation of a call site is a hetflow kernel with two element parameters
returning the combined element, e.g. ``def maxabs(a, b): return a if abs(a) >= abs(b)
else b``. It must be associative; it is commutative unless the call site is told
otherwise, in which case partial results are combined strictly in index order.
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError
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


@kernel
def op_land(a, b):
    return (a != 0) & (b != 0)


@kernel
def op_lor(a, b):
    return (a != 0) | (b != 0)


@kernel
def op_lxor(a, b):
    return (a != 0) ^ (b != 0)


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """One built-in operation.

    ``kinds``: the element kinds (``numpy.dtype.kind``) a call site takes; its result
    has NumPy's type (sums of bools and small ints widen). ``in_place_kinds``: those a
    collective takes; it reduces in place, in the element type, where a sum of bools
    would turn into an or.
    """

    name: str
    aliases: tuple[str, ...]
    kernel: Kernel
    ufunc: str                # NumPy's (and CuPy's) name for it
    kinds: str
    in_place_kinds: str


OPS = {spec.name: spec for spec in (
    #      name    aliases    kernel   ufunc          kinds    in place
    OpSpec("sum",  (),        op_sum,  "add",         "biufc", "iufc"),
    OpSpec("prod", (),        op_prod, "multiply",    "biufc", "iufc"),
    OpSpec("min",  (),        op_min,  "minimum",     "biuf",  "biuf"),
    OpSpec("max",  (),        op_max,  "maximum",     "biuf",  "biuf"),
    OpSpec("and",  ("band",), op_and,  "bitwise_and", "biu",   "biu"),
    OpSpec("or",   ("bor",),  op_or,   "bitwise_or",  "biu",   "biu"),
    OpSpec("xor",  ("bxor",), op_xor,  "bitwise_xor", "biu",   "biu"),
    OpSpec("land", (),        op_land, "logical_and", "biu",   "biu"),
    OpSpec("lor",  (),        op_lor,  "logical_or",  "biu",   "biu"),
    OpSpec("lxor", (),        op_lxor, "logical_xor", "biu",   "biu"),
)}
"""The built-in operations by name, for call sites and collectives alike."""

SPELLINGS = {alias: spec for spec in OPS.values() for alias in (spec.name, *spec.aliases)}
"""Every accepted name, aliases included (lower case) -> its operation."""


def lookup(name: str) -> OpSpec | None:
    """The built-in operation called ``name`` (any case, aliases too), or None."""
    spec = SPELLINGS.get(name)
    return spec if spec is not None else SPELLINGS.get(name.lower())


def valid_names() -> str:
    """The built-in names and their aliases, for error messages."""
    specs = [s for s in OPS.values() if s.aliases]
    return (", ".join(map(repr, OPS)) + " (also " + ", ".join(repr(a) for s in specs for a in s.aliases)
            + " for " + ", ".join(repr(s.name) for s in specs) + ")")


def describe_kinds(kinds: str) -> str:
    """Element kinds in words: 'iu' -> 'signed integers, unsigned integers'."""
    return ", ".join(_KIND_WORDS[k] for k in kinds)


_KIND_WORDS = {"b": "bools", "i": "signed integers", "u": "unsigned integers", "f": "floats",
               "c": "complex numbers"}


@dataclasses.dataclass(frozen=True)
class BinaryOp:
    """An operation resolved for a call site: its kernel and what is known about it."""

    name: str                 # the built-in's name, or the user kernel's
    kernel: Kernel
    commutative: bool
    spec: OpSpec | None       # the built-in's entry in OPS; None for a user kernel
    label: str                # the name as the call site was given it, for messages

    @property
    def builtin(self) -> bool:
        return self.spec is not None

    def check(self, dtype: np.dtype) -> None:
        """ArgumentTypeError unless the operation applies to elements of ``dtype``."""
        if self.spec is None:
            return
        kinds = self.spec.kinds
        if dtype.names is not None or dtype.kind not in kinds:
            what = "structured elements" if dtype.names is not None else f"dtype {dtype}"
            raise ArgumentTypeError(f"op {self.label!r} does not apply to {what}; it takes {describe_kinds(kinds)}"
                                    + ("" if dtype.names is None else " (use a user-defined op kernel)"))

    def result_dtype(self, dtype: np.dtype) -> np.dtype:
        """The result's element type: NumPy's for built-ins, the input's for user ops."""
        return reduced_dtype(self.spec.ufunc, dtype) if self.spec is not None else dtype

    def acc_dtype(self, dtype: np.dtype) -> np.dtype:
        """The type compiled paths accumulate in: sums and products of float16/32 and
        complex64 accumulate in double precision (results are rounded once, at the end)."""
        res = self.result_dtype(dtype)
        if self.name in ("sum", "prod") and self.spec is not None:
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
        ident = self.ufunc(dtype).identity  # 0, 1, True, -1 (all bits): cast, wrapping
        if ident is not None:
            return np.array(ident).astype(res)[()]
        low = self.name == "max"
        t = res.type
        if res.kind == "b":
            return t(not low)
        if res.kind == "f":
            return t(-np.inf if low else np.inf)
        info = np.iinfo(res)
        return t(info.min if low else info.max)

    def ufunc(self, dtype: np.dtype):
        """The NumPy ufunc computing this built-in (on any of its dtypes)."""
        return getattr(np, self.spec.ufunc)


@functools.lru_cache(maxsize=None)
def reduced_dtype(ufunc: str, dtype: np.dtype) -> np.dtype:
    """The element type of NumPy's reduction of ``dtype`` by ``ufunc``: sums of small
    integers and bools widen, logical ops give bools."""
    return getattr(np, ufunc).reduce(np.zeros(1, dtype)).dtype


_BUILTIN_OPS = {alias: BinaryOp(spec.name, spec.kernel, True, spec, alias) for alias, spec in SPELLINGS.items()}


def flag(value, name: str, site: str) -> bool:
    """``value`` of the switch ``name`` of ``site`` as a bool; ArgumentTypeError for
    anything but True or False (a NumPy bool too), whose truth would be a guess:
    ``inclusive="no"`` is true."""
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentTypeError(f"{site}: {name} must be True or False, got {value!r}")
    return bool(value)


def resolve(op, commutative: bool = True) -> BinaryOp:
    """A name or a two-parameter kernel, as a BinaryOp; errors name what is valid."""
    commutative = flag(commutative, "commutative", "reduce")  # only reduce lets a user choose
    if isinstance(op, str):
        builtin = _BUILTIN_OPS.get(op)
        if builtin is not None:
            return builtin
        spec = lookup(op)
        if spec is None:
            raise ArgumentError(f"unknown op {op!r}; valid ops are {valid_names()} "
                                f"or a hetflow kernel of two elements")
        return BinaryOp(spec.name, spec.kernel, True, spec, op)
    if not isinstance(op, Kernel):
        raise ArgumentTypeError(f"op must be one of {valid_names()} or a hetflow "
                                f"kernel of two elements, not {type(op).__name__} {op!r}; decorate a "
                                f"function with @hetflow.kernel")
    params = op.params
    if len(params) != 2:
        raise ArgumentTypeError(f"op kernel {op.name!r} takes {len(params)} parameter(s) "
                                f"({', '.join(params)}); a binary op takes exactly two elements (a, b)")
    return BinaryOp(op.name, op, commutative, None, op.name)
