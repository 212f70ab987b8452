"""Index spaces: ``index<N>``, ``extent<N>`` and grids (SPEC §1).

An ``index`` is an N-tuple of integers and an ``extent`` an N-tuple of non-negative
integers (a shape). Both are tuples, so they hash, compare equal to plain tuples and
unpack like them, but arithmetic is elementwise (with a tuple of the same rank, or an
integer broadcast to every component) instead of concatenation:
``index(1, 2) + index(3, 4) == index(4, 6)``. The ordering operators are the
componentwise (product) order — ``idx < ext`` holds when every component of ``idx`` is
below the matching one of ``ext`` — so they test box membership, not sort order.
"""
import itertools
import math
import operator
from dataclasses import dataclass

from hetflow.errors import ArgumentTypeError, ShapeError


def _to_int(value, kind):
    if not is_integer(value):
        raise ArgumentTypeError(f"{kind} components must be integers, got {value!r}")
    return operator.index(value)


def is_integer(value):
    """True for Python's and NumPy's integers; False for a bool, which NumPy would take
    as a mask and Python as 0 or 1, neither a position."""
    if isinstance(value, bool):
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def _ints(values, kind):
    """``values`` (a tuple) as a tuple of ints; returned as it is when it already is one,
    the common case, so that building from a shape or another index costs no conversion."""
    for c in values:
        if type(c) is not int:
            return tuple(_to_int(c, kind) for c in values)
    return values


class _IntTuple(tuple):
    """Shared behaviour of ``index`` and ``extent``: elementwise integer arithmetic."""

    __slots__ = ()

    def __new__(cls, *components):
        if len(components) == 1:
            only = components[0]
            if type(only) is cls:  # immutable and already checked
                return only
            if isinstance(only, tuple) or not is_integer(only):
                try:
                    components = tuple(only)
                except TypeError:
                    raise ArgumentTypeError(
                        f"{cls.__name__} takes integers or one sequence of integers, "
                        f"got {only!r}") from None
        return cls._of(_ints(components, cls.__name__))

    @classmethod
    def _of(cls, ints):
        """An instance from a tuple of ints, without converting them again."""
        return tuple.__new__(cls, ints)

    @property
    def rank(self):
        """Number of components N."""
        return len(self)

    def _other(self, other, sym):
        if isinstance(other, tuple):
            if len(other) != len(self):
                raise ShapeError(f"{self!r} {sym} {other!r}: ranks {len(self)} and "
                                 f"{len(other)} differ")
            return other
        return (_to_int(other, type(self).__name__),) * len(self)

    def _zip(self, other, op, sym):
        return self._of(_ints(tuple(map(op, self, self._other(other, sym))), type(self).__name__))

    def __add__(self, other):
        return self._zip(other, operator.add, "+")

    def __radd__(self, other):
        return self._zip(other, operator.add, "+")

    def __sub__(self, other):
        return self._zip(other, operator.sub, "-")

    def __rsub__(self, other):
        diff = tuple(map(operator.sub, self._other(other, "-"), self))
        return self._of(_ints(diff, type(self).__name__))

    def __mul__(self, other):
        return self._zip(other, operator.mul, "*")

    __rmul__ = __mul__

    def __floordiv__(self, other):
        return self._zip(other, operator.floordiv, "//")

    def _all(self, other, op, sym):
        return all(op(a, b) for a, b in zip(self, self._other(other, sym)))

    def __lt__(self, other):
        return self._all(other, operator.lt, "<")

    def __le__(self, other):
        return self._all(other, operator.le, "<=")

    def __gt__(self, other):
        return self._all(other, operator.gt, ">")

    def __ge__(self, other):
        return self._all(other, operator.ge, ">=")

    def __repr__(self):
        return f"{type(self).__name__}{tuple.__repr__(tuple(self))}"


class index(_IntTuple):  # noqa: N801 - named as in the spec: index<N>
    """An N-tuple of integers: a position in an index space."""

    __slots__ = ()

    def __neg__(self):
        return index._of(tuple(-c for c in self))

    @classmethod
    def zeros(cls, rank):
        """The origin of a rank-N space."""
        return cls._of((0,) * rank)


class extent(_IntTuple):  # noqa: N801 - named as in the spec: extent<N>
    """An N-tuple of non-negative integers: the shape of a box of indices."""

    __slots__ = ()

    @classmethod
    def _of(cls, ints):
        """An instance from a tuple of ints, which must not be negative."""
        if ints and min(ints) < 0:
            raise ShapeError(f"extent components must be >= 0, got {tuple(ints)}")
        return tuple.__new__(cls, ints)

    @property
    def size(self):
        """Number of indices in the box (1 for rank 0)."""
        return math.prod(self)


@dataclass(frozen=True)
class Grid:
    """A box of indices: ``offset`` (its first corner) plus ``extent``."""

    offset: index
    extent: extent

    def __post_init__(self):
        object.__setattr__(self, "offset", index(self.offset))
        object.__setattr__(self, "extent", extent(self.extent))
        if self.offset.rank != self.extent.rank:
            raise ShapeError(f"Grid offset {tuple(self.offset)} and extent "
                             f"{tuple(self.extent)} have different ranks")

    @property
    def rank(self):
        return self.extent.rank

    @property
    def size(self):
        return self.extent.size

    @property
    def end(self):
        """The first index past the box in every dimension."""
        return self.offset + self.extent

    def __contains__(self, idx):
        idx = index(idx)
        return idx.rank == self.rank and self.offset <= idx < self.end

    def __iter__(self):
        """Every index of the box, last dimension fastest."""
        ranges = (range(o, o + e) for o, e in zip(self.offset, self.extent))
        return (index(i) for i in itertools.product(*ranges))
