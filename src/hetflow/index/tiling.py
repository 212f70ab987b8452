"""Tiles and partitions: views made of views (SPEC §1).

``tile`` is a view whose elements are equal sections of its parent; ``partition`` cuts
one dimension into disjoint, covering blocks to distribute data.
"""
import collections.abc
import itertools
import math
import numbers
import operator
from dataclasses import dataclass
from fractions import Fraction

from hetflow.errors import ArgumentTypeError, IndexOutOfBoundsError, ShapeError
from hetflow.index.operators import Section
from hetflow.index.space import extent, index, is_integer
from hetflow.index.views import (View, checked_dim, describe, element_extent_of, extent_of,
                                 integer_arg, require_indexable, set_field, tuple_arg)


@dataclass(frozen=True, eq=False, repr=False)
class Tile(View):
    """A view of tiles: ``t[i]`` is the section of extent ``tile_extent`` at ``i * tile_extent``.

    Its extent is the number of tiles per dimension. Materialised (``numpy()``) it has
    shape ``extent + tile_extent``: tile index first, then the index inside the tile.
    """

    tile_extent: extent
    op = "tile"

    def parameters(self):
        return (self.tile_extent,)

    def _check(self, pext):
        te = tuple_arg(self.op, "tile extent", self.tile_extent, extent)
        if te.rank != pext.rank:
            raise ShapeError(f"tile: tile extent {tuple(te)} has rank {te.rank}, the parent "
                             f"rank {pext.rank}")
        for d, (t, n) in enumerate(zip(te, pext)):
            if t < 1:
                raise ShapeError(f"tile: tile extent {tuple(te)} is 0 on dim {d}")
            if n % t:
                raise ShapeError(f"tile: tile extent {tuple(te)} does not divide the parent "
                                 f"extent {tuple(pext)}: dim {d} ({n} = {n // t}*{t} + {n % t}) "
                                 f"would leave a partial tile of {n % t}")
        set_field(self, "tile_extent", te)
        return self._cotransform_extent(pext)

    @property
    def element_extent(self):
        return extent(tuple(self.tile_extent) + tuple(element_extent_of(self.parent)))

    def transform(self, idx):
        """Tile index -> the parent index of the tile's origin."""
        return tuple(i * t for i, t in zip(idx, self.tile_extent))

    def _transform_offset(self, off):
        return index(off) * self.tile_extent

    def _transform_extent(self, ext):
        return extent(ext) * self.tile_extent

    def _cotransform_extent(self, pext):
        return extent(pext) // self.tile_extent

    def tile_at(self, idx):
        """The section of the parent that is tile ``idx``."""
        return Section(self.parent, self.transform(self._checked(idx)), self.tile_extent)

    def _read(self, idx):
        return Section(self.parent, self.transform(idx), self.tile_extent)

    def _write(self, idx, value):
        self._read(idx).assign(value)

    def _descend(self, idx):
        r = self.rank
        origins = self.transform(idx[:r])
        return tuple(o + k for o, k in zip(origins, idx[r:2 * r])) + tuple(idx[2 * r:])

    def _lower(self, idx, ctx):
        ctx.note(("tile", len(idx)))
        return tuple(i * ctx.number(t) for i, t in zip(idx, self.tile_extent))

    def _lower_full(self, idx, ctx):
        r = self.rank
        origins = self.lower(idx[:r], ctx)
        return tuple(o + k for o, k in zip(origins, idx[r:2 * r])) + tuple(idx[2 * r:])


@dataclass(frozen=True, eq=False)
class Partition(collections.abc.Sequence):
    """Disjoint sections of ``parent`` along ``dim`` with the given ``sizes``, in order,
    covering the dimension."""

    parent: object
    dim: int
    sizes: tuple

    def __post_init__(self):
        require_indexable(self.parent, "partition")
        pext = extent_of(self.parent)
        set_field(self, "dim", checked_dim("partition", self.dim, pext.rank))
        sizes = tuple(tuple_arg("partition", "sizes", self.sizes, extent))
        if sum(sizes) != pext[self.dim]:
            raise ShapeError(f"partition: sizes {sizes} add up to {sum(sizes)}, not to the "
                             f"extent {pext[self.dim]} of dim {self.dim}")
        set_field(self, "sizes", sizes)

    @property
    def bounds(self):
        """``(start, stop)`` of each part along ``dim``."""
        stops = tuple(itertools.accumulate(self.sizes))
        return tuple(zip((0,) + stops[:-1], stops))

    def __len__(self):
        return len(self.sizes)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return tuple(self[j] for j in range(*k.indices(len(self))))
        k = integer_arg("partition", "part", k)
        if not -len(self) <= k < len(self):
            raise IndexOutOfBoundsError(f"partition: part {k} does not exist; there are "
                                        f"{len(self)} parts")
        start, stop = self.bounds[k]
        pext = extent_of(self.parent)
        return Section(self.parent, index(start if d == self.dim else 0
                                          for d in range(pext.rank)),
                       extent(stop - start if d == self.dim else n
                              for d, n in enumerate(pext)))

    def __repr__(self):
        return f"partition({describe(self.parent)}, dim={self.dim}, sizes={self.sizes})"


def tile(parent, tile_extent):
    """The view of tiles of ``parent``; ``tile_extent`` must divide its extent."""
    return Tile(parent, tile_extent)


def partition(parent, parts, dim):
    """Cut ``dim`` of ``parent`` into disjoint covering sections.

    ``parts`` is a count (sizes then differ by at most 1, larger parts first; an empty
    dim is one empty part, as in NumPy's ``array_split``) or a list
    of relative shares such as ``[0.7, 0.3]``, rounded to integer sizes by largest
    remainder (a share too small may get an empty part).
    """
    require_indexable(parent, "partition")
    pext = extent_of(parent)
    dim = checked_dim("partition", dim, pext.rank)
    n = pext[dim]
    if isinstance(parts, collections.abc.Sequence):
        return Partition(parent, dim, _apportion(parts, n))
    if not is_integer(parts):
        raise ArgumentTypeError(f"partition: parts must be a count or a list of shares, "
                                f"got {parts!r}")
    k = operator.index(parts)
    if n == 0 and k != 1:  # an empty dim is one empty part, as in NumPy's array_split(a, 1)
        raise ShapeError(f"partition: {k} parts of dim {dim} with extent 0: an empty dim is cut into "
                         f"one empty part; parts must be 1")
    if n and not 1 <= k <= n:
        raise ShapeError(f"partition: {k} parts of dim {dim} with extent {n}: parts must be "
                         f"in [1, {n}] so that every part gets an index")
    q, r = divmod(n, k)
    return Partition(parent, dim, (q + 1,) * r + (q,) * (k - r))


def _apportion(shares, n):
    """Integer sizes adding up to ``n``, proportional to ``shares`` (largest remainder)."""
    if not shares or not all(isinstance(s, numbers.Real) and not isinstance(s, bool)
                             and math.isfinite(s) and s > 0 for s in shares):
        raise ShapeError(f"partition: shares must be a non-empty list of positive finite "
                         f"numbers, got {list(shares)}")
    exact = [Fraction(s) if isinstance(s, numbers.Rational) else Fraction(float(s))
             for s in shares]
    total = sum(exact)
    exact = [n * s / total for s in exact]
    sizes = [math.floor(e) for e in exact]
    by_remainder = sorted(range(len(exact)), key=lambda k: (sizes[k] - exact[k], k))
    for k in by_remainder[:n - sum(sizes)]:
        sizes[k] += 1
    return tuple(sizes)
