"""Views: lazy indexables defined by an index transform on a parent (SPEC §1).

Every view is a small frozen dataclass holding its ``parent`` (an array or another view)
and its parameters; operators return new views and nothing is copied. A view supplies
the four transforms of the spec — ``transform`` (view index -> parent index),
``transform_offset``, ``transform_extent`` and ``cotransform_extent`` — and ``lower``,
the symbolic ``transform`` used when a kernel is compiled. ``transform`` works on
integers and, elementwise, on NumPy/CuPy integer arrays, which is how ``numpy()``
materialises a view with one fancy-index of the root.

The operators are in ``hetflow.index.operators``, tiles and partitions in
``hetflow.index.tiling``. A tile view has views as elements; its materialised form
holds each element's block, so ``numpy()`` has shape ``extent + element_extent``.
"""
import abc
import operator
from dataclasses import dataclass, fields, replace
from functools import cached_property

import numpy as np

from hetflow.errors import ArgumentTypeError, HetflowError, IndexOutOfBoundsError, ShapeError
from hetflow.index.arrays import _VIEW_TYPES, array_module, is_array, is_device_array, is_view, required_cupy
from hetflow.index.expr import LowerContext
from hetflow.index.space import extent, index, is_integer


# -- indexables ------------------------------------------------------------------
# Array types whose class declares an array interface, so that every instance is an array
# (NumPy, CuPy, Numba's device arrays), learned on first sight: checking one then costs a
# set lookup, not the hasattr that evaluates CuPy's __cuda_array_interface__ property.
_ARRAY_TYPES = {np.ndarray}


def require_indexable(x, op):
    """Reject anything that is neither an array nor a view, naming the operator."""
    kind = type(x)
    if kind in _VIEW_TYPES or kind in _ARRAY_TYPES:
        return
    if getattr(kind, "hetflow_distributed", False):
        raise ArgumentTypeError(f"{op}: got a distributed array ({kind.__name__}), which this process holds only "
                                f"a part of; use its own reductions (a.reduce(op), a.sum(), a.min(), a.max()), "
                                f"or gather it first (a.allgather())")
    if not is_array(x):
        raise ArgumentTypeError(f"{op}: expected an array or a view, got {kind.__name__}")
    if hasattr(kind, "__cuda_array_interface__") or hasattr(kind, "__array_interface__"):
        _ARRAY_TYPES.add(kind)


def rank(x):
    """Rank N of an array or a view."""
    require_indexable(x, "rank")
    return x.rank if is_view(x) else len(x.shape)


def extent_of(x):
    """Extent (shape) of an array or a view."""
    if type(x) in _VIEW_TYPES:
        return x.extent
    require_indexable(x, "extent_of")
    return array_extent(x)


def array_extent(a):
    """The extent of array ``a``; a NumPy shape is taken as it is (non-negative ints)."""
    return tuple.__new__(extent, a.shape) if type(a) is np.ndarray else extent(a.shape)


def root_of(x):
    """The array a view (or chain of views) finally reads; an array is its own root."""
    if type(x) in _VIEW_TYPES:
        return x.root
    require_indexable(x, "root_of")
    return x


def element_extent_of(x):
    """Extent of each element: () for arrays and most views, the tile's for tile views."""
    return x.element_extent if is_view(x) else extent()


def set_field(obj, name, value):
    """Normalise a field of a frozen dataclass during its ``__post_init__``."""
    obj.__dict__[name] = value  # what object.__setattr__ does, at a third of its cost


def checked_dim(op, dim, rank_, what="dim"):
    """``dim`` as an int in [0, rank_), else ShapeError naming the operator."""
    dim = integer_arg(op, what, dim)
    if not 0 <= dim < rank_:
        valid = f"valid 0..{rank_ - 1}" if rank_ else "it has no dimensions"
        raise ShapeError(f"{op}: {what} {dim} is out of range for a rank-{rank_} parent "
                         f"({valid})")
    return dim


def integer_arg(op, what, value):
    """``value`` as an int, else ArgumentTypeError naming the operator and argument (a
    bool too: see ``space.is_integer``)."""
    if not is_integer(value):
        raise ArgumentTypeError(f"{op}: {what} must be an integer, got {value!r}")
    return operator.index(value)


def tuple_arg(op, what, value, kind):
    """``value`` as an ``index`` or ``extent`` (``kind``), else an error naming the operator."""
    try:
        return kind(value)
    except ArgumentTypeError as e:
        raise ArgumentTypeError(f"{op}: bad {what}: {e}") from None
    except ShapeError as e:
        raise ShapeError(f"{op}: bad {what}: {e}") from None


def insert_at(t, d, value):
    """Tuple ``t`` with ``value`` inserted before position ``d``."""
    return tuple(t[:d]) + (value,) + tuple(t[d:])


def sparse_indices(xp, shape):
    """Index arrays of ``shape`` that broadcast together (np.indices(shape, sparse=True))."""
    ones = (1,) * len(shape)
    return tuple(xp.arange(n).reshape(ones[:k] + (n,) + ones[k + 1:])
                 for k, n in enumerate(shape))


def read_element(x, idx):
    """``x[idx]`` for a checked index: through the view chain, or from the array."""
    return x._read(idx) if is_view(x) else x[idx]


def write_element(x, idx, value):
    """``x[idx] = value`` for a checked index, written through to the root."""
    if is_view(x):
        x._write(idx, value)
    else:
        x[idx] = value


def describe(x):
    """Short text for an indexable: a view's repr, or an array's type, dtype and shape."""
    if is_view(x):
        return repr(x)
    return f"{type(x).__name__}<{x.dtype}>{tuple(x.shape)}"


# -- view structures ------------------------------------------------------------------
class Structure:
    """What lowering a chain of views depends on: each operator's type and normalised
    ``parameters()`` down to the root's type and shape (not the root).

    Structures are interned: equal chains share one object, which hashes by identity, so
    launches key plans and lowerings by a view's structure at the cost of a pointer, and
    a view built again as before (every launch builds its views) takes the normalised
    fields and extent stored here instead of checking its parameters again."""

    __slots__ = ("key", "extent", "fields")

    def __init__(self, key, extent_, fields_):
        # fields: what a view of this structure holds besides its parent and root
        self.key, self.extent = key, extent_
        self.fields = {**fields_, "extent": extent_, "signature": self}

    def __repr__(self):
        return f"Structure{self.key!r}"


class Unshared(Structure):
    """The structure of a view over a co_map capturing unhashable values: nothing to share,
    so unhashable (``key`` None), and every cache keyed by it looks it up in vain."""

    __slots__ = ()
    __hash__ = None


# (view type, parameters, parent's structure or root description) -> Structure, both as
# given (integers only: see exact_params) and normalised. Bounded: a structure dropped here
# stays valid for the views holding it; an equal one made later only misses caches.
_STRUCTURES = {}
_STRUCTURES_LIMIT = 1 << 16


def exact_params(params):
    """Parameters that may key an interned structure as given: Python ints and tuples of
    them only (``1.0 == 1`` hashes alike, but a float delta must still be rejected)."""
    for p in params:
        if type(p) is not int and not (type(p) is tuple and all(type(q) is int for q in p)):
            return False
    return True


def _intern(view, below, given):
    """The structure of ``view`` (just checked and normalised), interned under its
    normalised key and, where they are exact, its parameters as given."""
    try:
        key = (type(view), view.parameters(), below)
        found = _STRUCTURES.get(key)
    except TypeError:  # a co_map function that captures unhashable values
        return Unshared(None, view.extent, {})
    if found is None:
        if len(_STRUCTURES) >= _STRUCTURES_LIMIT:
            _STRUCTURES.clear()
        state = view.__dict__
        found = _STRUCTURES[key] = Structure(
            key, state["extent"], {f.name: state[f.name] for f in fields(view)[1:]})
    if exact_params(given):
        _STRUCTURES[(type(view), given, below)] = found
    return found


def _root_key(root):
    """What a view's structure takes from its root: its type and shape, which views'
    checks and lowerings read. (Launches key the root's dtype and layout beside it.)"""
    return type(root), root.shape


# Root types seen without views of their own (``__hetflow_view__``): make_view builds
# views over them without probing the class.
_PLAIN_ROOTS = {np.ndarray}


def make_view(cls, parent, params, exact):
    """The view ``cls(parent, *params)``, or the one ``parent`` makes of itself.

    An array type with views of its own (a distributed array, :mod:`hetflow.cluster`)
    defines ``__hetflow_view__(self, op, *params)``, so that ``cshift``, ``interior`` and
    ``section`` are one API for every array, as NumPy's ``__array_function__`` lets
    NumPy's functions take other arrays.

    Every launch builds its views again: a view equal to one built before (same operator,
    parameters and parent structure) is filled from the interned structure without the
    dataclass's constructor and checks, at a third of their cost. Only parameters given
    as Python ints (``exact``, which each operator tells cheaply; see :func:`exact_params`)
    are looked up as given."""
    kind = type(parent)
    if kind in _VIEW_TYPES:
        root, below = parent.root, parent.signature
    elif kind in _PLAIN_ROOTS:
        root, below = parent, (kind, parent.shape)  # _root_key, inlined
    else:
        own = getattr(kind, "__hetflow_view__", None)
        if own is not None:
            return own(parent, cls.op, *params)
        return cls(parent, *params)  # checks the parent; its __post_init__ learns the type
    if exact:
        try:
            found = _STRUCTURES.get((cls, params, below))
        except TypeError:  # over a co_map capturing unhashable values
            found = None
        if found is not None:
            view = object.__new__(cls)
            state = view.__dict__
            state["parent"], state["root"] = parent, root
            state.update(found.fields)
            return view
    return cls(parent, *params)


# -- the base view ------------------------------------------------------------------
@dataclass(frozen=True, eq=False, repr=False)
class View(abc.ABC):
    """A lazy indexable: ``view[idx] == parent[transform(idx)]``.

    Construction checks the parameters and sets, once, what every launch reads:
    ``extent`` (``cotransform_extent`` of the parent's), ``root`` (the array the chain
    reads) and ``signature``, its interned :class:`Structure`. Views of one signature share
    one lowering.
    """

    parent: object
    op = "view"  # the operator's name, for messages and repr

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _VIEW_TYPES.add(cls)

    def __post_init__(self):
        parent = self.parent
        if type(parent) in _VIEW_TYPES:
            root, below = parent.root, parent.signature
        else:
            require_indexable(parent, self.op)
            root, below = parent, _root_key(parent)
            if not hasattr(type(parent), "__hetflow_view__"):
                _PLAIN_ROOTS.add(type(parent))
        state = self.__dict__  # set_field, inlined: every launch builds views
        state["root"] = root
        params = self.parameters()
        try:
            found = _STRUCTURES.get((type(self), params, below)) if exact_params(params) else None
        except TypeError:  # over a co_map capturing unhashable values
            found = None
        if found is None:  # first of its kind: check and normalise the parameters
            pext = parent.extent if type(parent) in _VIEW_TYPES else array_extent(parent)
            state["extent"] = self._check(pext)
            found = state["signature"] = _intern(self, below, params)
        else:  # an equal view was checked before: take its normalised fields
            state.update(found.fields)

    def on_root(self, root):
        """The same chain of views over ``root`` (an array shaped as this chain's root)."""
        parent = self.parent.on_root(root) if is_view(self.parent) else root
        return replace(self, parent=parent)

    @abc.abstractmethod
    def _check(self, pext):
        """Normalise the parameters and reject impossible ones, given the parent's extent;
        return the view's extent (``cotransform_extent(pext)``)."""

    @abc.abstractmethod
    def transform(self, idx):
        """View index -> parent index (components may be integer arrays)."""

    def transform_offset(self, off):
        """View offset -> parent offset: where the view's origin lies in the parent."""
        return self._transform_offset(self._transform_arg("transform_offset", off, index, self.rank))

    def transform_extent(self, ext):
        """View extent -> the parent extent it spans."""
        return self._transform_extent(self._transform_arg("transform_extent", ext, extent, self.rank))

    def cotransform_extent(self, pext):
        """Parent extent -> the view's extent."""
        prank = rank(self.parent)
        return self._cotransform_extent(self._transform_arg("cotransform_extent", pext, extent, prank))

    def _transform_arg(self, method, value, kind, rank_):
        """``value`` as an ``index`` or ``extent`` (``kind``) of rank ``rank_``, else an
        error naming the operator and the transform."""
        where = f"{self.op}.{method}"
        value = tuple_arg(where, kind.__name__, value, kind)
        if value.rank != rank_:
            raise ShapeError(f"{where}: {kind.__name__} {tuple(value)} has rank {value.rank}, "
                             f"not {rank_}")
        return value

    @abc.abstractmethod
    def _transform_offset(self, off):
        """``transform_offset`` of an ``index`` of the view's rank."""

    @abc.abstractmethod
    def _transform_extent(self, ext):
        """``transform_extent`` of an ``extent`` of the view's rank."""

    @abc.abstractmethod
    def _cotransform_extent(self, pext):
        """``cotransform_extent`` of an ``extent`` of the parent's rank."""

    @abc.abstractmethod
    def _lower(self, idx, ctx):
        """Symbolic transform; ``ctx`` names the numbers and records the key."""

    @abc.abstractmethod
    def parameters(self):
        """The operator's own parameters (its fields after ``parent``), normalised and
        hashable: with its parent's, what the view's lowering depends on."""

    def lower(self, idx_exprs, ctx=None):
        """Symbolic ``transform``: view index expressions -> parent index expressions.

        Without a ``ctx`` (an ``expr.LowerContext``) numbers are literal constants and
        index bounds unknown, so a cshift lowers to a full remainder.
        """
        return self._lower(tuple(idx_exprs), ctx or LowerContext(literal=True))

    # -- geometry --------------------------------------------------------------
    @property
    def shape(self):
        return self.extent

    @property
    def rank(self):
        return self.extent.rank

    @property
    def dtype(self):
        return self.root.dtype

    @cached_property
    def element_extent(self):
        return element_extent_of(self.parent)

    @cached_property
    def offset(self):
        """The root index of the view's origin (``transform_offset`` chained upward)."""
        off, node = index.zeros(self.rank), self
        while is_view(node):
            off, node = node._transform_offset(off), node.parent
        return off

    @cached_property
    def root_extent(self):
        """The root extent seen from the view: ``transform_extent`` chained upward.

        For sections, projections, transposes and tiles this is the box of root indices
        the view covers; an interior adds its border back (the halo its elements see)."""
        ext, node = self.extent, self
        while is_view(node):
            ext, node = node._transform_extent(ext), node.parent
        return ext

    # -- element access -------------------------------------------------------
    def _checked(self, idx):
        idx = idx if isinstance(idx, tuple) else (idx,)
        try:
            idx = index(idx)
        except ArgumentTypeError:
            raise ArgumentTypeError(f"{self.op} view: indices must be integers (use section() "
                                    f"for ranges), got {idx!r}") from None
        if idx.rank != self.rank:
            raise ShapeError(f"{self.op} view of rank {self.rank} indexed with "
                             f"{idx.rank} components {tuple(idx)}")
        if not index.zeros(self.rank) <= idx < self.extent:
            raise IndexOutOfBoundsError(f"index {tuple(idx)} is outside the {self.op} "
                                        f"view's extent {tuple(self.extent)}")
        return tuple(idx)

    def __getitem__(self, idx):
        return self._read(self._checked(idx))

    def __setitem__(self, idx, value):
        idx = self._checked(idx)
        try:
            self._write(idx, value)
        except HetflowError:  # a co_map reaching outside, a coherent root's own
            raise
        except (TypeError, ValueError) as exc:  # NumPy's, converting the value
            raise ArgumentTypeError(f"{self.op} view: cannot write {value!r} at {idx}: {exc}") from None

    def _read(self, idx):
        return read_element(self.parent, self.transform(idx))

    def _write(self, idx, value):
        write_element(self.parent, self.transform(idx), value)

    def __len__(self):
        if self.rank == 0:
            raise ArgumentTypeError(f"len() of a rank-0 {self.op} view")
        return self.extent[0]

    def __iter__(self):
        """Rank 1 yields the elements; higher ranks yield ``project(self, 0, i)`` rows."""
        from hetflow.index.operators import project  # the operators build on this module
        if self.rank == 1:
            return (self._read((i,)) for i in range(len(self)))
        return (project(self, 0, i) for i in range(len(self)))

    # -- whole-view access -----------------------------------------------------
    def _descend(self, idx):
        """Full index (view components, then element components) -> the parent's."""
        return tuple(self.transform(idx[:self.rank])) + tuple(idx[self.rank:])

    def _lower_full(self, idx, ctx):
        """Symbolic ``_descend``."""
        return tuple(self.lower(idx[:self.rank], ctx)) + tuple(idx[self.rank:])

    def _root_index(self, xp):
        shape = tuple(self.extent) + tuple(self.element_extent)
        idx, node = sparse_indices(xp, shape), self
        while is_view(node):
            idx, node = node._descend(idx), node.parent
        return tuple(xp.broadcast_to(xp.asarray(c), shape) for c in idx)

    def root_box(self):
        """The view as a box of its root (a slice per root dimension), or None: see
        ``Lowering.box``. Boxes are read and written by slicing, not index arrays."""
        from hetflow.index.lowering import lowering  # lowering imports this module

        return lowering(self, "box_").box

    def _gather(self, xp):
        root = xp.asarray(self.root)
        if root.ndim == 0:  # root[()] would be a view of the root, not a copy
            return root.copy()
        box = self.root_box()
        if box is not None:
            return root[box].copy()
        return xp.asarray(root[self._root_index(xp)])

    def numpy(self):
        """A new NumPy array with the view's elements (GPU roots are read on the GPU)."""
        if is_device_array(self.root):
            return self._gather(array_module(self.root)).get()
        return self._gather(np)

    def cupy(self):
        """A new CuPy array with the view's elements."""
        if is_device_array(self.root):
            return self._gather(array_module(self.root))
        return required_cupy("view.cupy()").asarray(self._gather(np))

    def __array__(self, dtype=None, copy=None):
        if copy is False:
            raise ShapeError(f"a {self.op} view cannot become an array without a copy")
        out = self.numpy()
        return out if dtype is None else out.astype(dtype, copy=False)

    def assign(self, values):
        """Write ``values`` (broadcast to ``numpy()``'s shape) through to the root."""
        xp = array_module(self.root)
        values = self._assigned(xp, values)
        # a coherent Buffer's host copy, made current and the only valid one
        root = self.root.map() if hasattr(self.root, "map") else xp.asarray(self.root)
        box = None if root.ndim == 0 else self.root_box()
        if root.ndim == 0:
            root[()] = values
        elif box is not None:
            root[box] = values
        else:
            root[self._root_index(xp)] = values

    def _assigned(self, xp, values):
        """``values`` as the root's dtype, broadcast to ``numpy()``'s shape; hetflow's
        errors naming the view where NumPy's would not."""
        shape = tuple(self.extent) + tuple(self.element_extent)
        try:
            values = xp.asarray(values, dtype=self.root.dtype)
        except (TypeError, ValueError) as exc:
            raise ArgumentTypeError(f"{self.op} view assign: values cannot become "
                                    f"{self.root.dtype}: {exc}") from None
        try:
            return xp.broadcast_to(values, shape)
        except ValueError:
            raise ShapeError(f"{self.op} view assign: values of shape {tuple(values.shape)} do not "
                             f"broadcast to the view's shape {shape}") from None

    def __repr__(self):
        params = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)[1:])
        return f"{self.op}({describe(self.parent)}, {params})"


