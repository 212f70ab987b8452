"""One forall over distributed arrays: which rank runs which rows, over which local views.

Owner computes: a launch row runs on the rank that owns the row it writes. Every
distributed argument is a chain of ``cshift``, ``interior`` and ``section`` over an
array distributed along dim 0, the launch's row dimension; along dim 0 such a chain
maps launch row i to global row ``i + offset``, taken modulo the extent where a cshift
wraps — which is what the periodic halos hold, so a rank reads whichever rows equal to
those modulo the extent its block and halo hold (``cshift(u, 0, n - 1)`` is the row
above, ``section(u, (n - 2,), (2,))`` the two above the first rank's block, periodically).
A rank's part of the launch is the same
kernel over its rows, each argument a view of the rank's local storage:
``storage[c:c + rows]`` (rows it reads, halo included) under the argument's operators
on the other dimensions, so the generated code is the same as for a one-process run.

A plan is checked for every rank — reads within block and halo, writes within the
block, cshifts along dim 0 wrapping only at the array's ends, and the extents as a
one-process launch checks them, on the global arrays — so a bad launch fails the same
way on every rank before any message is sent. What only a rank's own part finds (an
element type its device cannot run, a scalar where the kernel subscripts an array, a
kernel that does not compile or raises) and launches that differ between ranks are
settled after the part ran (:func:`hetflow.cluster.control.settle`), and before a halo
exchange: every rank raises the same error, also those that have no rows of the launch.
"""
from __future__ import annotations

import numpy as np

from hetflow.cluster import control, darray
from hetflow.errors import ArgumentTypeError, ShapeError
from hetflow.index import operators as _ops
from hetflow.index.views import is_view
from hetflow.kernels.kernel import Kernel
from hetflow.ir.capture import current_graph
from hetflow.runtime.buffers import Buffer
from hetflow.runtime.forall import forall as local_forall
from hetflow.runtime.launch import SCALARS, check_extent, normalize_extent


class LaunchPlan:
    """The rank-independent facts of one distributed launch (kernel, extent, arguments).

    ``positions``: the distributed arguments; ``offsets``: each one's row offset (a
    read's, modulo n: :meth:`reach` gives the rows a rank takes);
    ``written``/``read``: the positions the kernel writes and reads; ``offset``: the
    row offset of the first written argument, which decides the owners.
    """

    def __init__(self, kernel: Kernel, extent: tuple, args: tuple):
        self.kernel, self.extent = kernel, extent
        ndim = len(extent)
        data = kernel.params[ndim:]
        if len(data) != len(args):
            raise ArgumentTypeError(
                f"kernel {kernel.name!r} takes {len(data)} data argument(s) ({', '.join(data)}) "
                f"after its {ndim} index parameter(s), but {len(args)} were given")
        access = kernel.access(ndim)
        views = {k: darray.as_view(a) for k, a in enumerate(args) if darray.is_distributed(a)}
        self.names = {k: data[k] for k in views}
        self.positions = tuple(views)
        for k, arg in enumerate(args):
            if k not in views and not isinstance(arg, SCALARS):
                raise ShapeError(
                    f"distributed forall of {kernel.name!r}: argument {data[k]} is a "
                    f"{type(arg).__name__}, not a distributed array; every array of a distributed "
                    f"launch must be distributed (hetflow.cluster.asarray), scalars are passed as they are")
        self.distribution = _shared_distribution(kernel, {data[k]: v.base for k, v in views.items()})
        if self.distribution.dim != 0:
            raise ShapeError(f"distributed forall of {kernel.name!r}: arrays are distributed along "
                             f"dim {self.distribution.dim}; launches split rows, so distribute "
                             f"along dim 0")
        modes = {k: access.modes.get(data[k], "") for k in views}
        for k in views:
            if modes[k] and data[k] not in access.rows:
                raise ShapeError(
                    f"kernel {kernel.name!r} subscripts {data[k]} other than at the launch's row "
                    f"index ({data[k]}[i, ...]); on a distributed array, reach other rows through "
                    f"cshift, interior or section views")
        self.written = tuple(k for k in views if "w" in modes[k])
        self.read = tuple(k for k in views if "r" in modes[k])
        if not self.written:
            raise ShapeError(f"distributed forall of {kernel.name!r} writes no distributed array: "
                             f"nothing says which rank runs which rows")
        self.offsets = {k: self._offset(data[k], v, k in self.written) for k, v in views.items()}
        self.offset = self.offsets[self.written[0]]
        # what every rank must agree it launched (settle): equal on every rank for one launch
        self.facts = (kernel.name, kernel.source_hash, extent, tuple(
            (views[k].base.name, views[k].ops) if k in views else type(a).__name__
            for k, a in enumerate(args)))
        # The one-process launch's checks, on the global extents: a part's own check would
        # fail only on the ranks that have rows, leaving the others to wait for them.
        check_extent(kernel, extent, tuple(views[k].proxy if k in views else a for k, a in enumerate(args)))
        self._checked_for = None

    def _offset(self, name, view, written: bool) -> int:
        """Launch row i reads or writes global row ``i + offset`` (mod n where a cshift wraps)."""
        rows = self.extent[0]
        if view.shape[0] < rows:
            raise ShapeError(f"launch of {self.kernel.name!r} over {rows} rows, but {name} has "
                             f"only {view.shape[0]}")
        n = view.base.shape[0]
        true_rows = _global_rows(view.proxy, rows, len(self.extent))
        offset = int(true_rows[0]) if rows else 0
        wraps = true_rows - np.arange(rows) - offset  # multiples of n where a cshift wraps
        if written and np.any(wraps):
            raise ShapeError(f"{self.kernel.name!r} writes {name} through a cshift that wraps along "
                             f"dim 0; a distributed launch writes rows without wrapping")
        if np.any(wraps % n):
            raise ShapeError(f"{name}: a cshift along dim 0 wraps inside a part of the array, not at "
                             f"its ends; distributed views wrap only over whole rows of the array")
        return offset

    # -- per partition ---------------------------------------------------------------------
    def rows(self, bounds) -> tuple:
        """``(first, stop)`` launch rows of every rank under ``bounds`` (owner computes)."""
        n0 = self.extent[0]
        return tuple((min(max(s - self.offset, 0), n0), min(max(e - self.offset, 0), n0))
                     for s, e in bounds)

    def check(self, bounds) -> None:
        """ShapeError unless every rank's rows stay inside its block (writes) or its block
        and halo (reads) under ``bounds``."""
        key = tuple(bounds)
        if self._checked_for == key:
            return
        h = self.distribution.halo
        for rank, ((a, b), (s, e)) in enumerate(zip(self.rows(bounds), bounds)):
            if a == b:
                continue
            for k in dict.fromkeys(self.written + self.read):  # arguments the kernel touches
                lo, hi = self.reach(k, (a, b), (s, e))
                inside = (s, e - 1) if k in self.written else (s - h, e - 1 + h)
                if lo < inside[0] or hi > inside[1]:
                    what = "writes" if k in self.written else "reads"
                    n = self.distribution.n
                    raise ShapeError(
                        f"distributed forall of {self.kernel.name!r}: on rank {rank}, which owns rows "
                        f"{s}..{e - 1} with a halo of {h}, {self.names[k]} {what} rows "
                        f"{_rows_text(lo, hi, n)}; "
                        + ("writes must stay in the rank's own rows" if k in self.written else
                           f"give the array a halo of at least {_halo_for(lo, hi, (s, e), n)}"))
        self._checked_for = key

    def halo_arrays(self, args, bounds) -> list:
        """The distributed arrays whose halos some rank reads, in argument order."""
        found = {}
        for k in self.read:
            base = darray.as_view(args[k]).base
            for rows, (s, e) in zip(self.rows(bounds), bounds):
                lo, hi = self.reach(k, rows, (s, e))
                if rows[0] < rows[1] and (lo < s or hi >= e):
                    found[base.serial] = base
        return list(found.values())

    def localise(self, args, rank: int, bounds):
        """(local extent, local arguments) of ``rank``'s part; None when it has no rows."""
        a, b = self.rows(bounds)[rank]
        if a == b:
            return None
        start, h = bounds[rank][0], self.distribution.halo
        local = list(args)
        for k in self.positions:
            view = darray.as_view(args[k])
            first = self.reach(k, (a, b), bounds[rank])[0]
            local[k] = local_view(view, view.base.local, first - start + h, b - a)
        return (b - a,) + tuple(self.extent[1:]), tuple(local)

    def reach(self, k: int, rows: tuple, block: tuple) -> tuple:
        """(first, last) global rows, not wrapped, that launch ``rows`` touch through
        argument ``k`` on the rank owning ``block``. A read may take any rows equal to its
        own modulo n (the halos are periodic): those starting nearest above the top halo."""
        offset = self.offsets[k]
        if k not in self.written:
            low = block[0] - self.distribution.halo - rows[0]
            offset = low + (offset - low) % self.distribution.n
        return rows[0] + offset, rows[1] - 1 + offset


def _shared_distribution(kernel, arrays: dict):
    """The one distribution of the launch's arrays (argument name -> array); ShapeError
    naming each argument's array when they differ."""
    distributions = {id(a.distribution): a.distribution for a in arrays.values()}
    if len(distributions) == 1:
        return next(iter(distributions.values()))
    sessions = {id(a.session) for a in arrays.values()}
    where = ", ".join(f"{name}: {a.name} over {a.session.size} rank(s), rows {a.distribution.sizes}"
                      for name, a in arrays.items())
    if len(sessions) > 1:
        raise ShapeError(f"distributed forall of {kernel.name!r}: its arrays belong to different "
                         f"communicators ({where}); make them all over one")
    raise ShapeError(f"distributed forall of {kernel.name!r}: its arrays are on {len(distributions)} "
                     f"different distributions ({where}); make them with *_like(...) or like= so that "
                     f"they share one")


def local_view(view, storage, first: int, rows: int):
    """``view``'s rows as a view of ``storage``: rows ``first:first + rows`` under the
    view's operators on the other dimensions (dim 0's are in ``first``)."""
    if isinstance(storage, Buffer):  # a coherent array is sliced by a view, never copied
        shape = tuple(storage.shape)
        x = _ops.section(storage, (first,) + (0,) * (len(shape) - 1), (rows,) + shape[1:])
    else:
        x = storage[first:first + rows]
    for op in view.ops:
        if op[0] == "cshift":
            if op[1] != 0:
                x = _ops.cshift(x, op[1], op[2])
        elif op[0] == "interior":
            delta = (0,) + tuple(op[1][1:])
            if any(delta):
                x = _ops.interior(x, delta)
        else:
            start, size = (0,) + tuple(op[1][1:]), (rows,) + tuple(op[2][1:])
            if any(start) or size != tuple(_extent(x)):
                x = _ops.section(x, start, size)
    return x


def _extent(x) -> tuple:
    return tuple(x.extent) if is_view(x) else tuple(x.shape)


def _halo_for(lo: int, hi: int, block: tuple, n: int) -> int:
    """The least halo holding rows ``lo..hi``, or rows equal to them modulo ``n``, around
    ``block`` (start, stop)."""
    s, e = block
    below = s - lo - (s - lo) % n  # the shift by whole periods taking lo nearest below s
    return min(max(s - lo - m, hi + m - e + 1, 0) for m in (below, below + n))


def _rows_text(lo: int, hi: int, n: int) -> str:
    """Rows ``lo..hi`` of a periodic dimension of ``n`` rows, as its row numbers."""
    if lo // n == hi // n:
        return f"{lo % n}..{hi % n}"
    return f"{lo % n}..{n - 1} and 0..{hi % n}"


def _global_rows(proxy, rows: int, ndim: int) -> np.ndarray:
    """The global row (dim 0) that each launch row reads through the view ``proxy``."""
    idx = (np.arange(rows),) + tuple(np.zeros(rows, np.int64) for _ in range(ndim - 1))
    node = proxy
    while is_view(node):
        idx, node = node.transform(idx), node.parent
    return np.asarray(idx[0]) + np.zeros(rows, np.int64)


def plan_for(extent, kernel, args) -> LaunchPlan:
    """The plan of this launch, cached on its distribution by kernel, extent and the
    structure of its arguments (which arrays, which operators)."""
    extent = normalize_extent(extent)
    if not isinstance(kernel, Kernel):
        raise ArgumentTypeError(f"{kernel!r} is not a hetflow kernel; decorate it with @hetflow.kernel")
    # a scalar's value does not change the plan (its type does: ranks agree on it); a host
    # array where one was is refused
    key = (id(kernel), kernel.source_hash, extent,
           tuple((darray.as_view(a).base.serial, darray.as_view(a).ops)
                 if darray.is_distributed(a) else type(a) if isinstance(a, SCALARS) else None for a in args))
    first = next((a for a in args if darray.is_distributed(a)), None)
    cache = darray.as_view(first).base.distribution.plans if first is not None else {}
    if key in cache:
        return cache[key]
    plan = LaunchPlan(kernel, extent, tuple(args))
    if len(cache) > 256:  # programs make few distinct launches; this bounds odd ones
        cache.clear()
    cache[key] = plan
    return plan


def forall(extent, kernel, *args, device=None, schedule=None, shares=None):
    """``hetflow.forall`` over distributed arrays and views: every rank runs its rows.

    Collective: every rank makes the same call. Halos that some rank reads are
    exchanged first. ``device``, ``schedule`` and ``shares`` apply to each rank's part
    (default: the GPU holding the blocks; for coherent blocks the rank's own devices,
    which the runtime's model splits the part over or picks one of; else the CPU).
    Without distributed arguments, or while a graph is being captured, this is
    ``hetflow.forall`` itself.
    """
    g = current_graph()
    if g is not None:  # as hetflow.forall records it
        return g.record("forall", extent=extent, kernel=kernel, args=args, device=device, shares=shares,
                        schedule=schedule)
    if not any(darray.is_distributed(a) for a in args):
        return local_forall(extent, kernel, *args, device=device, schedule=schedule, shares=shares)
    channel = darray.as_view(next(a for a in args if darray.is_distributed(a))).base.session.channel
    channel.check()  # a safe point: stop here if another rank failed
    what = f"distributed forall of {getattr(kernel, 'name', type(kernel).__name__)!r}"
    plan, halos, failure = None, (), None
    try:
        plan = plan_for(extent, kernel, args)
        plan.check(plan.distribution.bounds)
        halos = plan.halo_arrays(args, plan.distribution.bounds)
    except Exception as exc:  # a launch that differs between ranks may fail on some only
        failure = exc
    if failure is not None or halos:  # before transfers that would wait for a failed rank
        control.settle(channel, None if plan is None else plan.facts, failure, what)
    for arr in halos:
        arr.exchange_halos()
    result = None
    try:
        result = _run_part(plan, args, channel.rank, device, schedule, shares)
    except Exception as exc:  # the part's own checks, compiling and running: this rank's only
        failure = exc
    control.settle(channel, plan.facts, failure, what)
    return result


def _run_part(plan, args, rank: int, device, schedule, shares):
    """Run ``rank``'s part of the launch (nothing where it has no rows)."""
    part = plan.localise(args, rank, plan.distribution.bounds)
    if part is None:
        return None
    if device is None:
        base = darray.as_view(args[plan.written[0]]).base
        if base.coherent:  # the rank's own devices, split or not by the runtime's model
            device = list(base.session.devices)
        else:
            device = base.device.id if base.device is not None else None
    return local_forall(part[0], plan.kernel, *part[1], device=device, schedule=schedule, shares=shares)
