"""The view operators of SPEC §1: co_map, project, cshift, interior, transpose, section.

Each is a frozen dataclass over ``View`` giving the four transforms and ``_lower``; the
functions at the end are the public spelling (``project(a, 1, 17)``).
"""
import itertools
import operator
from dataclasses import dataclass

import numpy as np

from hetflow.errors import ArgumentTypeError, IndexOutOfBoundsError, ShapeError
from hetflow.index.expr import Call, cyclic
from hetflow.index.lowering import function_key
from hetflow.index.space import extent, index, is_integer
from hetflow.index.views import (View, exact_params, checked_dim, extent_of, insert_at, integer_arg, make_view, rank,
                                 read_element, set_field, sparse_indices, tuple_arg,
                                 write_element)


# A co_map is checked when created at every index of an extent of up to this many
# indices, and at the corners of a larger one (where affine index functions reach their
# extremes): its other indices are checked only where the host reads or writes them.
CHECKED_INDICES = 1 << 22
_CHUNK = 1 << 16  # indices per vectorised call of f: bounded temporaries


def _check_integral(image, idx):
    """ArgumentTypeError unless every component of f's ``image`` of the index arrays
    ``idx`` is an integer array: NumPy would take a bool one as a mask, and refuse a float."""
    for d, c in enumerate(image):
        if c.dtype == bool or not np.issubdtype(c.dtype, np.integer):
            first = tuple(x[0].item() for x in image)
            raise ArgumentTypeError(f"co_map: f must return integer indices, but gives {c.dtype} ones "
                                    f"on dim {d} (f gives {first} at index {tuple(int(i[0]) for i in idx)})")


@dataclass(frozen=True, eq=False, repr=False)
class CoMap(View):
    """``view[idx] = parent[f(idx)]`` for a user index function ``f`` over ``size``."""

    f: object
    size: extent
    op = "co_map"

    def parameters(self):  # the function by its code and captured values: see function_key
        return function_key(self.f), self.size

    def _check(self, pext):
        set_field(self, "size", tuple_arg(self.op, "extent", self.size, extent))
        if not callable(self.f):
            raise ArgumentTypeError(f"co_map: f must be callable, got {self.f!r}")
        zero = index.zeros(self.size.rank)
        image = self.transform(zero)
        if len(image) != pext.rank:
            raise ShapeError(f"co_map: f maps the rank-{zero.rank} index {tuple(zero)} to "
                             f"the rank-{len(image)} index {tuple(image)}, but the parent "
                             f"has rank {pext.rank}")
        for idx, count in self._probes():
            self._check_images(idx, count, pext)
        return self.size

    def _probes(self):
        """``(index arrays, count)``: the indices creation checks, in C order (see
        CHECKED_INDICES), ``count`` at a time."""
        shape, size = tuple(self.size), self.size.size
        if size > CHECKED_INDICES:
            corners = np.array(list(itertools.product(*((0, n - 1) for n in shape))))
            yield tuple(corners.T), len(corners)
            return
        if not shape:  # rank 0: one index, ()
            yield (), 1
            return
        for lo in range(0, size, _CHUNK):
            hi = min(size, lo + _CHUNK)
            yield np.unravel_index(np.arange(lo, hi), shape), hi - lo

    def _check_images(self, idx, count, pext):
        """ShapeError naming the first of the indices ``idx`` (``count`` of them, one array
        per dim) that f maps outside the parent."""
        try:  # f must work elementwise on index arrays (the docstring of co_map says so)
            image = [np.broadcast_to(c, (count,)) for c in self.f(idx)]
        except (TypeError, ValueError) as exc:
            raise ArgumentTypeError(f"co_map: f must work elementwise on integer index arrays, as "
                                    f"creation calls it; it raised {type(exc).__name__}: {exc}") from exc
        _check_integral(image, idx)
        outside = np.zeros(count, bool)
        for c, n in zip(image, pext):
            outside |= (c < 0) | (c >= n)
        if outside.any():
            k = int(np.argmax(outside))  # the first in C order
            at = tuple(int(c[k]) for c in image)
            d = next(d for d, (v, n) in enumerate(zip(at, pext)) if not 0 <= v < n)
            raise ShapeError(f"co_map: f reaches parent index {at[d]} on dim {d}, outside the parent "
                             f"extent {tuple(pext)}, at index {tuple(int(c[k]) for c in idx)} (f gives {at})")

    def transform(self, idx):
        image = self.f(tuple(idx))
        if not isinstance(image, (tuple, list)):
            raise ArgumentTypeError(f"co_map: f must return an index tuple, got {image!r}")
        return tuple(image)

    def _transform_offset(self, off):
        return index(self.transform(off))

    def _transform_extent(self, ext):
        """The extent of the smallest box holding f's image of ``ext``."""
        if not extent(ext).size:
            return extent((0,) * rank(self.parent))
        image = self.transform(sparse_indices(np, ext))
        return extent(int(np.max(c)) - int(np.min(c)) + 1 for c in image)

    def _cotransform_extent(self, pext):
        return self.size

    def _check_reach(self, image, pext):
        for d, (c, n) in enumerate(zip(image, pext)):
            lo, hi = (int(c.min()), int(c.max())) if hasattr(c, "min") else (int(c), int(c))
            if lo < 0 or hi >= n:
                raise IndexOutOfBoundsError(
                    f"co_map: f reaches parent index {lo if lo < 0 else hi} on dim {d}, "
                    f"outside the parent extent {tuple(pext)}")

    def _descend(self, idx):
        out = super()._descend(idx)
        if all(getattr(c, "size", 1) for c in idx):
            self._check_reach(out[:rank(self.parent)], extent_of(self.parent))
        return out

    def _read(self, idx):
        image = self.transform(idx)
        self._check_reach(image, extent_of(self.parent))
        return read_element(self.parent, image)

    def _write(self, idx, value):
        image = self.transform(idx)
        self._check_reach(image, extent_of(self.parent))
        write_element(self.parent, image, value)

    def _lower(self, idx, ctx):
        name = ctx.function(self.f)
        prank = rank(self.parent)
        ctx.note(("co_map", self.f, len(idx), prank))
        return tuple(Call(name, idx, k) for k in range(prank))


@dataclass(frozen=True, eq=False, repr=False)
class Project(View):
    """Fixes coordinate ``dim`` of the parent at ``value``: rank N -> N-1."""

    dim: int
    value: int
    op = "project"

    def parameters(self):
        return self.dim, self.value

    def _check(self, pext):
        set_field(self, "dim", checked_dim(self.op, self.dim, pext.rank))
        set_field(self, "value", integer_arg(self.op, "value", self.value))
        n = pext[self.dim]
        if not 0 <= self.value < n:
            raise ShapeError(f"project: value {self.value} is out of range [0, {n}) "
                             f"of dim {self.dim} (parent extent {tuple(pext)})")
        return self._cotransform_extent(pext)

    def transform(self, idx):
        return insert_at(idx, self.dim, self.value)

    def _transform_offset(self, off):
        return index(insert_at(off, self.dim, self.value))

    def _transform_extent(self, ext):
        return extent(insert_at(ext, self.dim, 1))

    def _cotransform_extent(self, pext):
        return extent(pext[:self.dim] + pext[self.dim + 1:])

    def _lower(self, idx, ctx):
        ctx.note(("project", self.dim, len(idx) + 1))
        return insert_at(idx, self.dim, ctx.number(self.value))


@dataclass(frozen=True, eq=False, repr=False)
class CShift(View):
    """Circular shift: ``view[.., i, ..] = parent[.., (i + shift) mod n, ..]``."""

    dim: int
    shift: int
    op = "cshift"

    def parameters(self):
        return self.dim, self.shift

    def _check(self, pext):
        set_field(self, "dim", checked_dim(self.op, self.dim, pext.rank))
        set_field(self, "shift", integer_arg(self.op, "shift", self.shift))
        return pext

    def _n(self):
        return extent_of(self.parent)[self.dim]

    def _shifted(self, t):
        t = list(t)
        n = self._n()
        if n:  # the shift reduced first: index arrays add it as int64
            t[self.dim] = (t[self.dim] + self.shift % n) % n
        return tuple(t)

    def transform(self, idx):
        return self._shifted(idx)

    def _transform_offset(self, off):
        return index(self._shifted(off))

    def _transform_extent(self, ext):
        return extent(ext)

    def _cotransform_extent(self, pext):
        return extent(pext)

    def _lower(self, idx, ctx):
        wrapped, mode = cyclic(idx[self.dim], self.shift, self._n(), ctx)
        ctx.note(("cshift", self.dim, len(idx), mode))
        return idx[:self.dim] + (wrapped,) + idx[self.dim + 1:]


def _shrunk(pext, delta):
    """``pext - 2 * delta`` as a plain tuple (both tuples of ints)."""
    return tuple([n - 2 * k for n, k in zip(pext, delta)])


@dataclass(frozen=True, eq=False, repr=False)
class Interior(View):
    """The parent without a border of ``delta`` (one per dimension) on each side.

    The index transform keeps the root's coordinate frame: view index ``i`` is parent
    index ``i + delta`` (offset ``+delta``, extent ``-2*delta``)."""

    delta: index
    op = "interior"

    def parameters(self):
        return (self.delta,)

    def _check(self, pext):
        if is_integer(self.delta):  # one delta for every dimension, or one per dimension
            delta = index._of((operator.index(self.delta),) * len(pext))
        else:
            delta = tuple_arg(self.op, "delta", self.delta, index)
        if len(delta) != len(pext):
            raise ShapeError(f"interior: delta {tuple(delta)} has rank {delta.rank}, "
                             f"the parent rank {pext.rank}")
        inner = _shrunk(pext, delta)
        if delta and min(*delta, *inner) < 0:
            self._reject(delta, pext)
        set_field(self, "delta", delta)
        return tuple.__new__(extent, inner)  # non-negative ints, as just checked

    def _reject(self, delta, pext):
        for d, (k, n) in enumerate(zip(delta, pext)):
            if k < 0:
                raise ShapeError(f"interior: delta {tuple(delta)} is negative on dim {d}")
            if n - 2 * k < 0:
                raise ShapeError(f"interior: delta {tuple(delta)} leaves a negative extent "
                                 f"on dim {d}: {n} - 2*{k} = {n - 2 * k}")

    def transform(self, idx):
        return tuple(i + k for i, k in zip(idx, self.delta))

    def _transform_offset(self, off):
        return index(off) + self.delta

    def _transform_extent(self, ext):
        return extent(ext) + 2 * self.delta

    def _cotransform_extent(self, pext):
        inner = _shrunk(pext, self.delta)
        if min(inner, default=0) < 0:
            self._reject(self.delta, pext)
        return extent._of(inner)

    def _lower(self, idx, ctx):
        ctx.note(("interior", len(idx)))
        return tuple(i + ctx.number(k) for i, k in zip(idx, self.delta))


@dataclass(frozen=True, eq=False, repr=False)
class Transpose(View):
    """Swaps dimensions ``d1`` and ``d2``."""

    d1: int
    d2: int
    op = "transpose"

    def parameters(self):
        return self.d1, self.d2

    def _check(self, pext):
        set_field(self, "d1", checked_dim(self.op, self.d1, pext.rank, "d1"))
        set_field(self, "d2", checked_dim(self.op, self.d2, pext.rank, "d2"))
        return self._cotransform_extent(pext)

    def transform(self, idx):
        t = list(idx)
        t[self.d1], t[self.d2] = t[self.d2], t[self.d1]
        return tuple(t)

    def _transform_offset(self, off):
        return index(self.transform(off))

    def _transform_extent(self, ext):
        return extent(self.transform(ext))

    def _cotransform_extent(self, pext):
        return extent(self.transform(pext))

    def _lower(self, idx, ctx):
        ctx.note(("transpose", self.d1, self.d2, len(idx)))
        return self.transform(idx)


@dataclass(frozen=True, eq=False, repr=False)
class Section(View):
    """The box of the parent starting at ``start`` with extent ``size``."""

    start: index
    size: extent
    op = "section"

    def parameters(self):
        return self.start, self.size

    def _check(self, pext):
        start = tuple_arg(self.op, "offset", self.start, index)
        size = tuple_arg(self.op, "extent", self.size, extent)
        if not start.rank == size.rank == pext.rank:
            raise ShapeError(f"section: offset {tuple(start)} and extent {tuple(size)} "
                             f"must both have the parent's rank {pext.rank}")
        if not start >= 0:
            raise ShapeError(f"section: offset {tuple(start)} is negative")
        end = start + size
        for d, (e, n) in enumerate(zip(end, pext)):
            if e > n:
                raise ShapeError(f"section: offset {tuple(start)} + extent {tuple(size)} = "
                                 f"{tuple(end)} exceeds the parent extent {tuple(pext)} "
                                 f"on dim {d}")
        set_field(self, "start", start)
        set_field(self, "size", size)
        return size

    def transform(self, idx):
        return tuple(i + s for i, s in zip(idx, self.start))

    def _transform_offset(self, off):
        return index(off) + self.start

    def _transform_extent(self, ext):
        return extent(ext)

    def _cotransform_extent(self, pext):
        return self.size

    def _lower(self, idx, ctx):
        ctx.note(("section", len(idx)))
        return tuple(i + ctx.number(s) for i, s in zip(idx, self.start))


# -- the operators as functions ----------------------------------------------------------
def co_map(parent, f, extent):
    """The rank-M view ``v[idx] = parent[f(idx)]`` over ``extent``; ``f`` maps an index
    tuple to a parent index tuple, and must also work elementwise on integer arrays
    (plain arithmetic does). NumPy meaning: ``parent[f(np.indices(extent))]``.

    ShapeError, naming the first index, where ``f`` maps an index of ``extent`` outside
    the parent: every index is checked (by calling ``f`` on index arrays) up to
    ``CHECKED_INDICES`` of them, the corners of a larger extent."""
    return CoMap(parent, f, extent)


def project(parent, dim, value):
    """Fixes ``dim`` at ``value``. ``project(a, 1, 17)`` is NumPy's ``a[:, 17, :]``."""
    return Project(parent, dim, value)


def cshift(parent, dim, shift):
    """Circular shift by ``shift`` along ``dim``: NumPy's ``np.roll(a, -shift, axis=dim)``."""
    return make_view(CShift, parent, (dim, shift), type(dim) is int is type(shift))


def interior(parent, delta):
    """Drops a border of ``delta`` (an int, or one per dimension) on every side:
    NumPy's ``a[d0:n0-d0, d1:n1-d1]``. Interiors nest."""
    return make_view(Interior, parent, (delta,), type(delta) is int or exact_params((delta,)))


def transpose(parent, *dims):
    """``transpose(a, d1, d2)`` swaps dimensions ``d1`` and ``d2``: NumPy's
    ``np.swapaxes(a, d1, d2)``."""
    if len(dims) != 2:  # NumPy's transpose(a, axes) spelling, or its transpose(a)
        given = "".join(f", {d!r}" for d in dims)
        raise ArgumentTypeError(f"transpose swaps two dims, transpose(a, d1, d2) (NumPy's np.swapaxes(a, d1, "
                                f"d2)); got transpose(a{given})")
    return Transpose(parent, *dims)


def section(parent, offset, extent):
    """The box at ``offset`` with ``extent``: NumPy's ``a[o0:o0+e0, o1:o1+e1]``."""
    params = (offset, extent)
    return make_view(Section, parent, params, exact_params(params))
