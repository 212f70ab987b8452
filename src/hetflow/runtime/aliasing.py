"""Arguments that alias: a launch writing, through one argument, elements that another
argument of the same array reads or writes at other indices.

Devices run a launch's indices in no fixed order, so such a launch means different things
on the CPU, on a GPU and co-executed, and NumPy's in-place expressions (which read
every right-hand side before writing) mean a third. hetflow refuses it: ``bind`` raises
ShapeError naming both arguments, unless the call site was asked for NumPy's meaning
(``forall(..., snapshot=True)``: :func:`snapshot` reads copies of the arguments that
overlap a written one).
What passes means the same on every device: a GPU launch over NumPy arrays stages
arguments over one host memory as views of one GPU copy of it, whatever their layouts
(:mod:`hetflow.runtime.staging`).

What counts. Two arguments may alias when they read one memory (one array, views of it,
NumPy slices of one array) and the launch writes through one of them. Launch index I
touches an argument the kernel subscripts only as ``x[i, j, ..., more]`` (the launch
indices first: ``aligned``) at its elements ``x[I, ...]``, any other argument anywhere in
the view. The pair is fine when no element is touched through both, or when both are
aligned and every element touched through both is touched at the same launch index
(``u[i] = u[i] + 1``, or ``interior(u, 1)`` read and written under the same map).
A kernel whose source cannot be read may touch any argument anywhere (its access says
every argument is read and written): any two of its arguments over one memory conflict.

Cost. Per launch, a scan for two arguments over one memory (``is`` comparisons); only
when one is found is the verdict looked up, cached in the launch plan by what it
depends on: the extent, which arguments share memory, and each one's view signature
(or shape, and address where it is a slice).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..errors import ShapeError
from ..index import views as _views
from ..kernels.kernel import Kernel

_VIEW_TYPES = _views._VIEW_TYPES
_PYTHON_SCALARS = frozenset((float, int, bool, complex))
_PER_PLAN = 256  # verdicts kept per launch plan (a sliding window makes a new one each step)


class Uses(NamedTuple):
    """What a launch does with its arguments: their names, access modes and the written
    positions (a launch plan has these too, and a cache of verdicts)."""

    data: list
    access: object
    written: tuple
    aliasing: dict | None = None  # no cache: snapshot decides afresh

    @classmethod
    def of(cls, kernel, ndim: int) -> "Uses":
        data = list(kernel.params[ndim:])
        access = kernel.access(ndim)
        return cls(data, access, tuple(k for k, name in enumerate(data) if access.writes(name)))


def check(kernel, extent: tuple, args: tuple, plan) -> None:
    """ShapeError when a written argument aliases another one (see the module);
    ``plan``: the launch's plan, or its :class:`Uses`."""
    views, ndarray = _VIEW_TYPES, np.ndarray
    for w in plan.written:
        r = args[w]  # _owner, inlined: launches run this loop
        if type(r) in views:
            r = r.root
        if type(r) is ndarray and r.base is not None:
            r = r.base
        n = 0  # arguments over r's memory, args[w] included (the cheapest loop: launches run it)
        for x in args:
            if x is r:
                n += 1
            elif type(x) is ndarray:
                n += x.base is r
            elif type(x) in views:
                x = x.root
                n += x is r or type(x) is ndarray and x.base is r
        if n > 1:
            pairs = conflicts(kernel, extent, args, plan)
            if pairs:
                raise ShapeError(_message(kernel, plan, args, *pairs[0]) + _advice(kernel))
            return


def snapshot(kernel, extent: tuple, args: tuple) -> tuple:
    """``args`` with a copy of each read-only argument that a written one aliases:
    NumPy's meaning, every read done before any write. Two written arguments that
    alias have no such meaning: ShapeError. Arguments ``bind`` would reject are
    left for it to reject."""
    if not isinstance(kernel, Kernel) or len(kernel.params) - len(extent) != len(args):
        return args
    plan = Uses.of(kernel, len(extent))
    pairs = conflicts(kernel, extent, args, plan)
    if not pairs:
        return args
    copied = list(args)
    for w, k in pairs:
        if k in plan.written:
            raise ShapeError(_message(kernel, plan, args, w, k) + "; snapshot=True copies only "
                             "arguments the kernel only reads")
        if copied[k] is args[k]:
            copied[k] = _copy(args[k])
    return tuple(copied)


def _owner(x):
    """The object owning the memory ``x`` reads: a view's root, or the NumPy array that
    array is a view of (slices of one array share their owner)."""
    if type(x) in _VIEW_TYPES:
        x = x.root
    return x.base if type(x) is np.ndarray and x.base is not None else x


def conflicts(kernel, extent: tuple, args: tuple, plan) -> tuple:
    """The pairs (written position, other position) of arguments that alias; cached in
    ``plan.aliasing`` by the extent, which arguments share memory (numbered in order of
    appearance) and what each one's footprint depends on (a view's signature, an
    array's shape; where an array is a slice of another, its address and strides)."""
    groups, key, seen = [], [extent], {}
    for a in args:
        t = type(a)
        if t in _PYTHON_SCALARS or isinstance(a, np.generic):
            groups.append(None)
            key.append(None)
            continue
        owner, root = _owner(a), _views.root_of(a)
        g = seen.setdefault(id(owner), len(seen))
        groups.append(g)
        key.append((g, a.signature if t in _VIEW_TYPES else tuple(a.shape),
                    None if root is owner else (_offset(root, owner), root.strides)))
    known = plan.aliasing
    try:
        found = None if known is None else known.get(key := tuple(key))
    except TypeError:  # a co_map function capturing unhashable values: decide afresh
        known = None
    if found is None:
        found = _conflicts(extent, args, plan, groups)
        if known is not None:
            if len(known) >= _PER_PLAN:
                del known[next(iter(known))]
            known[key] = found
    return found


def _conflicts(extent, args, plan, groups) -> tuple:
    access, data = plan.access, plan.data
    aligned = access.aligned
    found = []
    for w in plan.written:
        for k, g in enumerate(groups):
            if k == w or g is None or g != groups[w] or not access.modes.get(data[k]):
                continue
            if k in plan.written and k < w:
                continue  # the pair was seen from k's side
            both = data[w] in aligned and data[k] in aligned
            if _overlap(args[w], args[k], extent, both):
                found.append((w, k))
    return tuple(found)


def _overlap(a, b, extent, aligned: bool) -> bool:
    """Whether some element of the shared memory is touched through both ``a`` and ``b``
    (``aligned``: at different launch indices)."""
    root_a, root_b = _views.root_of(a), _views.root_of(b)
    if root_a is not root_b:  # slices of one array: compare addresses
        if root_a.dtype.itemsize != root_b.dtype.itemsize:
            return bool(np.may_share_memory(root_a, root_b))  # elements that half overlap
        return _overlap_exactly(a, b, extent, aligned, _address)
    box_a, box_b = _box(a, extent, aligned), _box(b, extent, aligned)
    if box_a is not None and box_b is not None:
        start_a, start_b = [s.start for s in box_a], [s.start for s in box_b]
        if any(s.start >= t.stop or t.start >= s.stop for s, t in zip(box_a, box_b)):
            return False
        return not (aligned and start_a[:len(extent)] == start_b[:len(extent)])
    return _overlap_exactly(a, b, extent, aligned, None)


def _box(x, extent, aligned: bool):
    """The touched elements of ``x`` as a box of its array (a slice per dimension), or None."""
    if type(x) in _VIEW_TYPES:
        box = x.root_box()
        if box is None or not aligned:
            return box
        return tuple(slice(s.start, s.start + min(s.stop - s.start, e)) for s, e in zip(box, extent)) \
            + box[len(extent):]
    shape = tuple(x.shape)
    reach = extent if aligned else ()
    return tuple(slice(0, min(n, reach[d]) if d < len(reach) else n) for d, n in enumerate(shape))


def _address(a) -> int:
    """Where a NumPy array's data starts."""
    return a.__array_interface__["data"][0]


def _offset(root, owner) -> int:
    """Where ``root`` starts in its owner's memory (where it starts, for an owner that
    is not an array)."""
    return _address(root) - (_address(owner) if type(owner) is np.ndarray else 0)


def _footprint(x, extent, aligned: bool, address):
    """(element, flat launch index) of every element ``x`` touches, the element as a
    flat index of its array (``address`` None) or by its address (``address(root)``
    where the array starts); the launch index is -1 where any may touch it (``aligned``
    False)."""
    root = _views.root_of(x)
    if type(x) in _VIEW_TYPES:
        idx = x._root_index(np)
    else:
        idx = np.indices(tuple(x.shape), sparse=True)
        idx = tuple(np.broadcast_to(c, tuple(x.shape)) for c in idx)
    shape = idx[0].shape
    if aligned:
        crop = tuple(slice(0, e) for e in extent)
        idx = tuple(c[crop] for c in idx)
        shape = idx[0].shape
        rows = shape[:len(extent)]
        launch = np.arange(int(np.prod(rows))).reshape(rows + (1,) * (len(shape) - len(rows)))
        launch = np.broadcast_to(launch, shape)
    else:
        launch = np.full(shape, -1)
    if address is not None:
        flat = address(root) + sum(c.astype(np.int64) * s for c, s in zip(idx, root.strides))
    else:
        flat = np.ravel_multi_index(idx, tuple(root.shape)) if idx else np.zeros(shape, np.intp)
    return np.broadcast_to(flat, shape).ravel(), launch.ravel()


def _overlap_exactly(a, b, extent, aligned: bool, address) -> bool:
    elems_a, at_a = _footprint(a, extent, aligned, address)
    elems_b, at_b = _footprint(b, extent, aligned, address)
    order = np.lexsort((at_a, elems_a))
    elems_a, at_a = elems_a[order], at_a[order]
    lo = np.searchsorted(elems_a, elems_b, "left")
    hi = np.searchsorted(elems_a, elems_b, "right")
    shared = hi > lo
    if not aligned or not shared.any():
        return bool(shared.any())
    lo, hi, at_b = lo[shared], hi[shared] - 1, at_b[shared]
    # a and b touch an element at one launch index only if a's first and last are b's
    return bool(np.any((at_a[lo] != at_b) | (at_a[hi] != at_b)))


def _copy(x):
    """A new array with ``x``'s elements (a view's on its root's device)."""
    if type(x) in _VIEW_TYPES:
        return x.cupy() if _views.is_device_array(x.root) else x.numpy()
    return x.copy() if hasattr(x, "copy") else np.array(x)  # a Buffer: its current host copy


_ADVICE = ("; write into another array, or pass snapshot=True to forall to read a copy of the read "
           "argument first (NumPy's meaning)")


def _advice(kernel) -> str:
    """What to do about a conflict: for a kernel without source that declares nothing,
    first say where its writes come from."""
    if kernel.has_source or kernel.writes is not None:
        return _ADVICE
    return ("; the kernel has no source Python can read (exec, python -c, stdin, the >>> prompt), so "
            "every argument counts as written: declare the ones it writes "
            "(@hetflow.kernel(writes=[...])), or define it in a file" + _ADVICE)


def _message(kernel, plan, args, w, k) -> str:
    how = "writes" if k in plan.written else "reads"
    data = plan.data
    return (f"kernel {kernel.name!r} writes argument {data[w]!r} ({_views.describe(args[w])}) and {how} "
            f"argument {data[k]!r} ({_views.describe(args[k])}), which overlap in one array at "
            f"different indices: the result would depend on the order the devices run the indices in")
