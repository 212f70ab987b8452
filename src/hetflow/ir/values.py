"""The data flowing along a graph's edges: lazy arrays, lazy results, and their roots.

A :class:`LazyArray` stands for an array allocated inside a captured graph: it has a
shape and a dtype but no memory until something needs it (a node that is not fused
away, or the user reading it after a run). A :class:`Handle` stands for the result of
a recorded operation (a reduction's scalar, a view of a lazy array): it has a value once
the graph has run.

Dependencies are found per *root*: two arguments conflict when they share the memory
they ultimately view (NumPy ``base`` chains, hetflow views' ``root``).
"""
from __future__ import annotations

import numbers

import numpy as np

from ..errors import ArgumentError

# A recorded value's ``capture``: 'capturing' (its graph's 'with' block is open),
# 'captured', or 'raised' (the block raised, so the graph never runs to give it a value).
RAISED = "its graph's capture raised, so the graph never runs; capture it again"


class LazyArray:
    """An array allocated inside a graph: shape and dtype now, memory on first need."""

    def __init__(self, shape, dtype, fill=None, factory=None, name: str = "", graph: str = "graph"):
        self.shape = tuple(int(s) for s in (shape if isinstance(shape, tuple) else
                                             (shape,) if isinstance(shape, numbers.Integral) else shape))
        self.dtype = np.dtype(dtype)
        self.fill = fill            # value written at every run (zeros: 0), or None (empty)
        self.factory = factory      # callable(shape, dtype) -> array; default numpy.empty
        self.name = name
        self.graph = graph          # the name of the graph that allocated it, for messages
        self._array = None
        self.capture = "capturing"  # set by the graph's capture when its 'with' block ends
        # 'pending' (never run) | 'ready' | 'fused' (not in the running version)
        self._state = "pending"
        self._fused_by = ""

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def materialized(self) -> bool:
        return self._array is not None

    def materialize(self):
        """The backing array, allocated (and filled) the first time it is needed."""
        what = f"lazy array {self.name} of graph {self.graph!r}"
        if self.capture == "capturing":
            raise ArgumentError(f"{what} has no value while its graph is being captured; "
                                f"read it after g.run()")
        if self.capture == "raised":
            raise ArgumentError(f"{what} has no value: {RAISED}")
        if self._state == "pending":
            raise ArgumentError(f"{what} has not been computed yet: run the graph first (g.run())")
        if self._state == "fused":
            raise ArgumentError(
                f"{what} was fused away ({self._fused_by}): no memory was allocated "
                f"for it; mark it with g.output({self.name}) before running to keep it")
        if self._array is None:
            make = self.factory or np.empty
            self._array = make(self.shape, self.dtype)
            if self.fill is not None:
                self._array[...] = self.fill
        return self._array

    def reset(self) -> None:
        """Start of a run: a zero-filled array is zeroed again, as the program said."""
        if self._array is not None and self.fill is not None:
            self._array[...] = self.fill

    def _live(self, live: bool, why: str = "") -> None:
        self._state = "ready" if live else "fused"
        self._fused_by = why

    def __array__(self, dtype=None, copy=None):
        arr = self.materialize()
        return arr if dtype is None else arr.astype(dtype)

    def __getitem__(self, key):
        return self.materialize()[key]

    def __len__(self):
        return self.shape[0]

    def __repr__(self):
        where = "allocated" if self._array is not None else "not allocated"
        return f"<LazyArray {self.name} {self.shape} {self.dtype} {where}>"


# Why a Handle has no value, by its capture.
_WHY_NO_RESULT = {
    "capturing": "a captured graph cannot read its own results while capturing; read it after g.run()",
    "captured": "its graph has not computed it: run the graph (g.run()); a run that raised before "
                "this operation leaves it without one",
    "raised": RAISED,
}


class Handle:
    """The result of a recorded operation; readable once the graph has run."""

    def __init__(self, op: str, name: str, alias=None):
        self.op = op
        self.name = name
        self.alias = alias          # the value whose memory this result views (views), else None
        self._value = None
        self._has_value = False
        self.capture = "capturing"  # set by the graph's capture when its 'with' block ends

    def set(self, value) -> None:
        self._value, self._has_value = value, True

    def result(self):
        """The value; ArgumentError before the graph has computed it."""
        if not self._has_value:
            raise ArgumentError(f"{self.name} (result of {self.op}) has no value yet: {_WHY_NO_RESULT[self.capture]}")
        return self._value

    def __float__(self):
        return float(self.result())

    def __int__(self):
        return int(self.result())

    def __bool__(self):
        return bool(self.result())

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.result(), dtype=dtype)

    def __repr__(self):
        state = repr(self._value) if self._has_value else "pending"
        return f"<Handle {self.name} = {state}>"


def is_data(obj) -> bool:
    """True for arguments that carry memory or a pending result (not plain scalars)."""
    return isinstance(obj, (LazyArray, Handle)) or (hasattr(obj, "shape") and not isinstance(obj, np.generic))


def root(obj):
    """The object owning the memory ``obj`` reads or writes (itself for lazy values)."""
    seen = 0
    while seen < 64:  # views of views: bounded walk, cycles cannot occur in practice
        seen += 1
        if isinstance(obj, Handle):
            if obj.alias is None:
                return obj
            obj = obj.alias
        elif isinstance(obj, np.ndarray) and isinstance(obj.base, np.ndarray):
            obj = obj.base
        elif getattr(obj, "root", None) is not None and not isinstance(obj, (np.ndarray, LazyArray)):
            obj = obj.root
        else:
            return obj
    return obj


def resolve(obj):
    """The concrete object a recorded argument stands for at run time."""
    if isinstance(obj, LazyArray):
        return obj.materialize()
    if isinstance(obj, Handle):
        return obj.result()
    return obj


def concrete(args: tuple) -> tuple:
    """``args`` of a launch that runs now (no graph capturing), lazy arrays and results of
    graphs replaced by what they computed; ArgumentError naming the graph for a lazy
    array it has not computed."""
    if not any(isinstance(a, (LazyArray, Handle)) for a in args):
        return args
    return tuple(resolve(a) for a in args)
