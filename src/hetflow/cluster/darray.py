"""Distributed arrays: cut into blocks along one dimension over the ranks, with halos.

    u = cluster.asarray(grid)                # each rank keeps its block of rows (+ halo)
    v = cluster.zeros_like(u)                # the same distribution
    cluster.forall(interior(u, 1).shape, step, interior(v, 1), interior(u, 1),
                   interior(cshift(u, 0, -1), 1), ...)   # halos exchanged as needed
    full = v.gather()                        # the whole array on rank 0

A :class:`Distribution` cuts one dimension of extent n into contiguous blocks, one per
rank in rank order, with ``hetflow.partition`` semantics: a count gives sizes that
differ by at most one, larger blocks first; shares are rounded by largest remainder.
Arrays made ``like`` another share its distribution and move with it when the
partition changes (a rebalance moves rows between neighbouring ranks).

A :class:`DistArray` holds on each rank ``local``: its block plus ``halo`` rows on each
side along the distributed dimension (:mod:`hetflow.cluster.halo` fills them); ``block``
is the owned part. ``hetflow.cshift``, ``interior`` and ``section`` of a distributed array
or of such a view are :class:`DistView` objects (the array's ``__hetflow_view__``): the
same operators, checked over the global extent, which a launch turns into views of a
rank's local storage
(:mod:`hetflow.cluster.plan`). Making a distributed array is collective: every rank makes
the same arrays in the same order.
"""
from __future__ import annotations

import dataclasses
import itertools
import operator
import weakref
import zlib

import numpy as np

from hetflow.cluster import control, halo
from hetflow.cluster.launch import session as _session
from hetflow.collectives.ops import check_transferable, resolve_op
from hetflow.cuda_compat import cuda_module
from hetflow.errors import ArgumentError, ArgumentTypeError, CommError, ShapeError
from hetflow.index import operators as _ops
from hetflow.index.tiling import partition as _partition
from hetflow.index.views import View, checked_dim, extent_of
from hetflow.platform.devices import get_device
from hetflow.runtime.buffers import Buffer, numeric


def stand_in(shape, dtype=np.uint8) -> np.ndarray:
    """An array of ``shape`` that takes no memory: views over it check and transform
    global indices of a distributed array."""
    return np.broadcast_to(np.empty((), dtype), tuple(shape))


def bounds_of(sizes) -> tuple:
    """``(start, stop)`` of each of consecutive blocks of ``sizes`` rows, in order."""
    stops = list(itertools.accumulate(sizes))
    return tuple(zip([0] + stops[:-1], stops))


class Distribution:
    """Rank r owns rows ``bounds[r]`` of dimension ``dim`` (extent ``n``), and keeps
    ``halo`` more rows on each side."""

    bounds: tuple  # ``(start, stop)`` of every rank's block, in rank order

    def __init__(self, session, n: int, sizes, dim: int, halo_rows: int):
        self.session = session
        self.n, self.dim, self.halo = n, dim, halo_rows
        self.sizes = self.checked(sizes)
        self.version = 0
        self.plans: dict = {}  # launch plans over these blocks' arrays (hetflow.cluster.plan)
        self._arrays: list[weakref.ref] = []
        self.founder = None  # the name of the first array made on it: the same on every rank

    @property
    def min_rows(self) -> int:
        """The fewest rows a block may have: its halo must come from its neighbours."""
        return max(1, self.halo)

    @property
    def sizes(self) -> tuple:
        """Rows per rank."""
        return self._sizes

    @sizes.setter
    def sizes(self, sizes) -> None:
        self._sizes = sizes
        self.bounds = bounds_of(sizes)  # asked for by every launch and halo exchange: once per cut

    def checked(self, sizes) -> tuple:
        ranks = self.session.size
        try:
            sizes = tuple(operator.index(s) for s in sizes)
        except TypeError:  # a float would be cut silently, a string is no size
            raise ShapeError(f"a partition of {self.n} rows over {ranks} ranks needs {ranks} whole "
                             f"numbers of rows; got {sizes!r}") from None
        if len(sizes) != ranks or sum(sizes) != self.n:
            raise ShapeError(f"a partition of {self.n} rows over {ranks} ranks needs {ranks} "
                             f"sizes adding up to {self.n}; got {sizes}")
        for rank, size in enumerate(sizes):
            if size < self.min_rows:
                raise ShapeError(
                    f"distributing {self.n} rows over {ranks} ranks with a halo of "
                    f"{self.halo}: rank {rank} would get {size} rows, and every rank needs at "
                    f"least {self.min_rows} (use fewer ranks, a smaller halo or more rows)")
        return sizes

    def follow(self, arr) -> None:
        self._arrays.append(weakref.ref(arr))
        self.founder = self.founder or arr.name

    def arrays(self) -> list:
        """The live arrays on this distribution, in the order they were made."""
        return [a for a in (ref() for ref in self._arrays) if a is not None]

    def resize(self, sizes) -> bool:
        """Re-cut the blocks to ``sizes`` and move every array's rows to their new owners
        (collective: every rank passes the same ``sizes``). False when nothing changed."""
        try:
            sizes, failure = self.checked(sizes), None
        except ShapeError as exc:
            failure = exc
        # Rows cut differently on some rank would cross wrongly: the same error everywhere.
        control.settle(self.session.channel, (self.dim, self.n, None if failure else sizes), failure,
                       f"resizing the blocks of {self.n} rows")
        if sizes == self.sizes:
            return False
        old = self.bounds
        self.sizes = sizes
        for arr in self.arrays():
            arr._move(old, self.bounds)
        self.version += 1
        return True

    def apportion(self, weights) -> tuple:
        """Sizes proportional to ``weights`` (one per rank), each at least ``min_rows``."""
        if len(weights) != self.session.size:
            raise ShapeError(f"rebalancing needs one weight per rank ({self.session.size}); "
                             f"got {list(weights)}")
        return self.checked(apportion(self.n, weights, self.min_rows))

    def __repr__(self):
        return f"<Distribution dim={self.dim} n={self.n} sizes={self.sizes} halo={self.halo}>"


def cut(n: int, parts) -> tuple:
    """Block sizes of ``n`` rows: ``hetflow.partition``'s for a count or a list of shares."""
    return _partition(stand_in((n,)), parts, 0).sizes


def apportion(n: int, weights, min_rows: int) -> tuple:
    """Sizes of ``n`` rows in proportion to ``weights`` (positive), each at least
    ``min_rows``: a block under the minimum takes rows from the largest one."""
    weights = [float(w) for w in weights]
    if not all(w > 0 and np.isfinite(w) for w in weights):
        raise ShapeError(f"rows are apportioned by positive finite weights; got {weights}")
    sizes = list(cut(n, weights))
    for rank in range(len(sizes)):
        while sizes[rank] < min_rows:
            donor = max(range(len(sizes)), key=lambda q: sizes[q])
            if sizes[donor] <= min_rows:
                raise ShapeError(f"cannot give every one of {len(sizes)} ranks {min_rows} of {n} rows")
            sizes[donor] -= 1
            sizes[rank] += 1
    return tuple(sizes)


class DistArray:
    """An array distributed over the ranks of a session; see the module docstring.

    Made by :func:`empty`, :func:`zeros`, :func:`asarray` and the ``*_like`` functions
    (which check ``dtype`` and ``device``). Where a rank keeps its block (``device``):

    - ``'host'`` (or ``'cpu'``): host memory, a NumPy array;
    - a GPU id ('gpu0') or GPU device record: that GPU's memory (numba-cuda device
      arrays), for a rank computing on that GPU alone;
    - ``'coherent'``: a coherent array (``hetflow.array``) with a host copy and a copy
      on each GPU that works on it: a rank co-executing on its cores and GPUs keeps each
      device's rows on that device between launches, and only halo rows move;
    - None (the default): ``'coherent'`` on a rank that has a GPU of its own, else
      ``'host'`` (each rank decides for itself).

    Blocks on a GPU or coherent are distributed along dim 0 only.
    """

    hetflow_distributed = True  # what one process's call sites refuse by name (index.views)

    def __init__(self, distribution: Distribution, shape, dtype, device=None, coherent: bool = False):
        self.distribution = distribution
        self.session = distribution.session
        self.shape = tuple(int(s) for s in shape)
        self.dtype, self.device = dtype, device  # device: the GPU record holding the block, or None
        self.coherent = coherent
        self.serial = self.session.serial()
        self.name = f"darray{self.serial}"
        # The distribution too: an array made like another on one rank only would not
        # move with it there. The dtype itself, not its .str: structured dtypes of other
        # fields but one size share a .str ('|V16').
        _agree(self.session, self.name, (self.shape, self.dtype, distribution.dim,
                                         distribution.halo, distribution.sizes,
                                         None if self.device is None else "gpu",
                                         f"{distribution.founder or self.name}'s"))
        self.local = self._allocate(distribution.bounds[self.session.rank])
        self.staging = None  # page-locked halo rows of a coherent block on a GPU (halo._staging)
        distribution.follow(self)

    # -- geometry ------------------------------------------------------------------------
    @property
    def dim(self) -> int:
        return self.distribution.dim

    @property
    def halo(self) -> int:
        return self.distribution.halo

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def start(self) -> int:
        """The first global row (along ``dim``) this rank owns."""
        return self.distribution.bounds[self.session.rank][0]

    @property
    def stop(self) -> int:
        """One past the last global row this rank owns."""
        return self.distribution.bounds[self.session.rank][1]

    @property
    def owned(self) -> tuple:
        """The index of this rank's block in the global array (``x[a.owned]``)."""
        return (slice(None),) * self.dim + (slice(self.start, self.stop),)

    @property
    def block(self):
        """This rank's rows of the array, to read and write (a view of ``local`` without
        the halos; of a coherent array, its host rows, made current: a GPU copies them
        again when it next uses them)."""
        return halo.writing(self.local, *self._block_rows(), self.dim, overwrite=False)

    def _block_rows(self) -> tuple:
        """(first, end) of this rank's own rows in ``local``, between the halos."""
        return self.halo, self.halo + self.stop - self.start

    def _allocate(self, bounds):
        shape = list(self.shape)
        shape[self.dim] = bounds[1] - bounds[0] + 2 * self.halo
        if self.coherent:
            return Buffer(tuple(shape), self.dtype)
        if self.device is None:
            return np.empty(tuple(shape), self.dtype)

        with halo.on_gpu(self.device):
            return cuda_module().device_array(tuple(shape), self.dtype)

    def _writable_block(self):
        """This rank's rows of ``local`` to overwrite (halos left as they are)."""
        return halo.writing(self.local, *self._block_rows(), self.dim)

    def _readable_block(self):
        """This rank's rows of ``local`` to read (a coherent array's stay current on its GPU)."""
        return halo.reading(self.local, *self._block_rows(), self.dim)

    def _zero(self) -> None:
        """Set every element of ``local``, halos included, to zero."""
        if self.coherent:
            self.local.write(0)
        elif self.device is None:
            self.local[...] = 0
        else:
            with halo.on_gpu(self.device):
                self.local.copy_to_device(np.zeros(self.local.shape, self.dtype))

    def _host_block(self) -> np.ndarray:
        """This rank's block in host memory (a copy when it is on a GPU)."""
        if self.device is None:
            return self._readable_block()
        with halo.on_gpu(self.device):
            return self._readable_block().copy_to_host()

    def _move(self, old_bounds, new_bounds) -> None:
        storage = self._allocate(new_bounds[self.session.rank])
        halo.move_rows(self, old_bounds, new_bounds, storage)
        self.local = storage

    # -- communication -------------------------------------------------------------------
    def exchange_halos(self) -> None:
        """Fill the halo rows from the neighbouring ranks (collective)."""
        halo.exchange(self)

    def gather(self, root: int = 0):
        """The whole array as a NumPy array on ``root``; None on the other ranks (every
        rank calls it, with the same ``root``)."""
        _same_root(self.session.channel, root, f"{self.name}.gather")
        return self._gather(root)

    def _gather(self, root: int):
        channel = self.session.channel
        tag = halo.tag(control.MOVE_TAG, self.serial, halo.GATHERED)
        if channel.rank != root:
            batch = halo.Transfers(channel)
            batch.send(root, tag, self._host_block())
            batch.run(f"gathering {self.name} on rank {root}")
            return None
        out = np.empty(self.shape, self.dtype)
        batch = halo.Transfers(channel)
        for rank, (lo, hi) in enumerate(self.distribution.bounds):
            target = halo.slab(out, lo, hi, self.dim)
            if rank == root:
                target[...] = self._host_block()
            else:
                batch.recv(rank, tag, target)
        batch.run(f"gathering {self.name} on rank {root}")
        return out

    def allgather(self) -> np.ndarray:
        """The whole array as a NumPy array on every rank."""
        channel = self.session.channel
        whole = self._gather(0)
        if channel.size == 1:
            return whole
        tag = halo.tag(control.MOVE_TAG, self.serial, halo.SCATTERED)
        batch = halo.Transfers(channel)
        if channel.rank == 0:
            for rank in range(1, channel.size):
                batch.send(rank, tag, whole)
        else:
            whole = np.empty(self.shape, self.dtype)
            batch.recv(0, tag, whole)
        batch.run(f"sending {self.name} to every rank")
        return whole

    def reduce(self, op="sum"):
        """``op`` over every element of the array (on every rank): the block's own
        reduction, then the communicator's allreduce. ``op`` as for allreduce. An array
        with no elements gives the op's identity, as NumPy does (a sum is 0); ShapeError
        for an op with none (min, max, user ops)."""
        reduce_op = failure = None
        try:
            reduce_op = resolve_op(op)
            reduce_op.check(self.dtype)
        except ArgumentError as exc:
            failure = exc
        # An op that differs between ranks, or fails on some, fails all of them: the
        # others would wait for it in the allreduce.
        control.settle(self.session.channel, (self.name, reduce_op and reduce_op.name), failure,
                       f"{self.name}.reduce")
        if self.size == 0:  # every block is empty (each rank has rows; a row has no elements)
            return _identity(reduce_op, self.dtype, f"{self.name}.reduce: {self.name} {self.shape}")
        partial = _fold(self._host_block(), reduce_op, reduce_op.result_dtype(self.dtype))
        return self.session.comm.allreduce(partial, op=reduce_op)[0]

    def sum(self):
        return self.reduce("sum")

    def min(self):
        return self.reduce("min")

    def max(self):
        return self.reduce("max")

    def __array__(self, dtype=None, copy=None):
        # Without it NumPy wraps the array in a 0-d array of objects, silently.
        raise ArgumentTypeError(
            f"{self.name} is spread over the ranks: take {self.name}.gather() (every rank calls it; "
            f"the whole array on rank 0), .allgather() (on every rank) or .block (this rank's rows)")

    # -- views ---------------------------------------------------------------------------
    def __hetflow_view__(self, op, *params) -> "DistView":
        """``hetflow.cshift``/``interior``/``section`` of this array (see
        :func:`hetflow.index.views.make_view`)."""
        return _VIEWS[op](self, *params)

    def __repr__(self):
        where = self.device.id if self.device is not None else "coherent" if self.coherent else "host"
        return (f"<DistArray {self.name} {self.shape} {self.dtype} dim={self.dim} "
                f"rows {self.start}:{self.stop} of rank {self.session.rank} halo={self.halo} "
                f"on {where}>")


@dataclasses.dataclass(frozen=True, eq=False)
class DistView:
    """A view over a distributed array: ``ops`` applied to ``base``, in order.

    ``ops`` are ``("cshift", dim, shift)``, ``("interior", delta)`` and
    ``("section", offset, extent)``; ``proxy`` is the same chain over a stand-in of the
    global array (the stand-in itself for no operators), which checks the parameters
    and gives the extent and transforms.
    """

    base: DistArray
    ops: tuple
    proxy: View | np.ndarray

    @property
    def shape(self) -> tuple:
        return tuple(extent_of(self.proxy))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def dtype(self):
        return self.base.dtype

    @property
    def root(self) -> DistArray:
        """The distributed array this view reads and writes."""
        return self.base

    __hetflow_view__ = DistArray.__hetflow_view__

    def __repr__(self):
        chain = ", ".join(f"{op[0]}{op[1:]}" for op in self.ops) or "identity"
        return f"<DistView {chain} of {self.base.name} extent={self.shape}>"


def is_distributed(x) -> bool:
    """True for distributed arrays and views of them."""
    return isinstance(x, (DistArray, DistView))


def as_view(x) -> DistView:
    """A distributed array as the identity view of itself; views as they are."""
    if isinstance(x, DistView):
        return x
    return DistView(x, (), stand_in(x.shape))


def _extend(x, op, proxy) -> DistView:
    view = as_view(x)
    return DistView(view.base, view.ops + (op,), proxy)


def _cshift(x, dim, shift):
    proxy = _ops.cshift(as_view(x).proxy, dim, shift)  # checks the parameters
    return _extend(x, ("cshift", proxy.dim, proxy.shift), proxy)


def _interior(x, delta):
    proxy = _ops.interior(as_view(x).proxy, delta)
    return _extend(x, ("interior", tuple(proxy.delta)), proxy)


def _section(x, offset, extent):
    proxy = _ops.section(as_view(x).proxy, offset, extent)
    return _extend(x, ("section", tuple(proxy.start), tuple(proxy.size)), proxy)


# A distributed array's views, which ``hetflow.cshift``, ``interior`` and ``section`` ask
# it for: the same functions for every array (``hetflow.cluster.cshift`` is another name).
_VIEWS = {"cshift": _cshift, "interior": _interior, "section": _section}
cshift, interior, section = _ops.cshift, _ops.interior, _ops.section


# -- making distributed arrays -------------------------------------------------------------

def empty(shape, dtype=np.float64, *, dim=0, halo=1, parts=None, comm=None, device=None) -> DistArray:
    """A new distributed array, uninitialised, cut along ``dim`` over the ranks.

    ``parts``: None for even blocks, or one share per rank (``[3, 1]``: rank 0 gets
    three quarters); ``halo``: rows kept on each side of a block for views that reach
    into the neighbours' rows; ``comm``: a hetflow communicator (default: all processes);
    ``device``: where each rank keeps its block (see :class:`DistArray`).
    """
    current = _session(comm)
    return _made(current, lambda: (*_distribution(current, shape, dim, halo, parts), dtype, device))


def _distribution(current, shape, dim, halo_rows, parts) -> tuple:
    """(its Distribution over ``current``'s ranks, the shape): :func:`empty`'s checks."""
    shape = _shape(shape)
    if not shape:
        raise ShapeError("a distributed array needs at least one dimension")
    dim = checked_dim("distributed array", dim, len(shape))
    halo_rows = _count("halo", halo_rows)
    if parts is None:  # partition's even cut, which may leave a rank no rows: checked below
        q, r = divmod(shape[dim], current.size)
        sizes = (q + 1,) * r + (q,) * (current.size - r)
    else:
        if isinstance(parts, (str, bytes)) or np.ndim(parts) != 1:
            raise ArgumentTypeError(f"parts must be a list of shares, one per rank; got {parts!r}")
        if len(parts) != current.size:
            raise ShapeError(f"parts must give one share per rank ({current.size}); got {list(parts)}")
        sizes = cut(shape[dim], list(parts))
    return Distribution(current, shape[dim], sizes, dim, halo_rows), shape


def zeros(shape, dtype=np.float64, **kwargs) -> DistArray:
    """Like :func:`empty`, filled with zeros (halos included)."""
    out = empty(shape, dtype, **kwargs)
    out._zero()
    return out


def empty_like(a: DistArray, dtype=None, shape=None) -> DistArray:
    """A new array on ``a``'s distribution (same ranks, blocks and halo; it moves with
    ``a`` on a rebalance). ``shape`` may differ from ``a``'s except along the
    distributed dimension."""
    if not isinstance(a, DistArray):
        raise ArgumentTypeError(f"empty_like needs a DistArray, not {type(a).__name__}")
    return _made(a.session, lambda: (a.distribution, _shape_like(a, shape),
                                     a.dtype if dtype is None else dtype,
                                     COHERENT if a.coherent else a.device or HOST))


def _shape_like(a: DistArray, shape) -> tuple:
    shape = a.shape if shape is None else _shape(shape)
    if len(shape) <= a.dim or shape[a.dim] != a.shape[a.dim]:
        raise ShapeError(f"an array on {a.name}'s distribution needs extent {a.shape[a.dim]} "
                         f"along dim {a.dim}; got shape {shape}")
    return shape


def zeros_like(a: DistArray, dtype=None, shape=None) -> DistArray:
    """Like :func:`empty_like`, filled with zeros."""
    out = empty_like(a, dtype, shape)
    out._zero()
    return out


# empty's keywords whose default is None
_NONE_BY_DEFAULT = ("parts", "comm", "device")
# Where a rank keeps its block, besides a GPU's id (see DistArray)
HOST, COHERENT = "host", "coherent"


def place_for(devices) -> str:
    """Where a rank computing on ``devices`` (ids: 'cpu0' and GPU ids) keeps its blocks:
    coherent where they hold a GPU (its rows stay on it between launches), else in host
    memory. (By id alone: looking the GPUs up would start CUDA.)"""
    return COHERENT if any(d != "cpu0" for d in devices) else HOST


def asarray(x, *, root=None, like=None, **kwargs) -> DistArray:
    """A distributed copy of the global array ``x``.

    ``root=None``: every rank passes the same ``x`` and keeps its block of it (no rows
    cross; one small allgather checks that every rank's ``x`` has the same shape, dtype
    and values, by a CRC-32 of its bytes, and raises CommError on every rank naming the
    ranks that differ). ``root=r``: only rank r's ``x`` counts (others may pass None);
    each rank is sent its block. ``like``: use that array's distribution (with it, ``parts``,
    ``comm`` and ``device`` may only be None, their default); other keywords as for
    :func:`empty`.
    """
    if like is not None:
        if not isinstance(like, DistArray):
            raise ArgumentTypeError(f"cluster.asarray: like must be a DistArray, not {type(like).__name__}")
        # They would be ignored: the array takes like's distribution and place. None, their
        # default, asks for nothing (a caller passing its own comm=None on).
        given = sorted(k for k, v in kwargs.items() if v is not None or k not in _NONE_BY_DEFAULT)
        if given:
            raise ArgumentError(f"cluster.asarray: like= gives the distribution; "
                                f"{', '.join(given)} cannot be given with it")
    current = _session(like.session if like is not None else kwargs.get("comm"))
    if root is not None:
        _same_root(current.channel, root, "cluster.asarray")
    x, shape, dtype = _source(current, x, root)
    out = empty_like(like, dtype, shape) if like is not None else empty(shape, dtype, **kwargs)
    with halo.on_gpu(out.device):
        if root is None:
            halo.store(out._writable_block(), np.ascontiguousarray(x[out.owned]))
        else:
            _scatter(out, x, root)
    return out


def _source(current, x, root) -> tuple:
    """(``x`` as an array where it counts, its shape, its dtype): every rank's ``x`` (root
    None) or root's. An ``x`` that is no array fails every rank, naming the rank whose it
    is: the others would wait for its rows."""
    if root is None:
        x, why = _as_array(x)
        facts = current.channel.allgather(why or (x.shape, x.dtype, _checksum(x)))
        whys = [f"rank {r} ({f})" for r, f in enumerate(facts) if isinstance(f, str)]
        if whys:
            raise ArgumentTypeError("cluster.asarray: x is not an array on " + "; ".join(whys))
        _same_source(facts)
        return x, x.shape, x.dtype
    facts = None
    if current.rank == root:
        x, why = _as_array(x)
        facts = why or (x.shape, x.dtype)
    facts = current.channel.bcast(facts, root)
    if isinstance(facts, str):
        raise ArgumentTypeError(f"cluster.asarray: x on rank {root}, the root, is not an array ({facts})")
    return x, facts[0], facts[1]


def _same_source(facts: list) -> None:
    """CommError unless every rank's (shape, dtype, checksum) of x is the same: ranks with
    different x would make a mix of their blocks, or fail apart, each on its own shape."""
    if all(f == facts[0] for f in facts):
        return
    advice = "; pass root=r to take rank r's x only"
    if any(f[:2] != facts[0][:2] for f in facts):
        each = "; ".join(f"rank {r}: {shape} {dtype}" for r, (shape, dtype, _) in enumerate(facts))
        raise CommError(f"cluster.asarray: every rank must pass the same x, but its shape or dtype "
                        f"differs between ranks ({each}){advice}")
    groups = [[r for r, f in enumerate(facts) if f == kind] for kind in dict.fromkeys(facts)]
    alike = " | ".join(("ranks " if len(g) > 1 else "rank ") + ", ".join(map(str, g)) for g in groups)
    raise CommError(f"cluster.asarray: every rank must pass the same x, but its values differ between "
                    f"ranks ({alike}; alike within each group, by a CRC-32 of x's bytes){advice}")


def _checksum(x: np.ndarray, crc: int = 0) -> int | None:
    """CRC-32 of ``x``'s values in C order, continuing ``crc`` (field by field for
    structured elements, whose padding may hold anything); None for Python objects,
    which asarray refuses when it makes the array."""
    if x.dtype.hasobject:
        return None
    if x.dtype.names is None:
        return zlib.crc32(np.ascontiguousarray(x).reshape(-1).view(np.uint8), crc)
    for name in x.dtype.names:
        crc = _checksum(x[name], crc)
    return crc


def _as_array(x) -> tuple:
    """(``np.asarray(x)``, None), or (None, why not)."""
    try:
        return np.asarray(x), None
    except Exception as exc:  # whatever NumPy or x raised: the other ranks must hear of it
        return None, f"{type(exc).__name__}: {exc}"


def _scatter(out: DistArray, x, root: int) -> None:
    """Send each rank its block of ``x`` (significant on ``root`` only)."""
    channel = out.session.channel
    tag = halo.tag(control.MOVE_TAG, out.serial, halo.SCATTERED)
    batch = halo.Transfers(channel)
    if channel.rank == root:
        x = np.asarray(x)
        for rank, (lo, hi) in enumerate(out.distribution.bounds):
            if rank == root:
                halo.store(out._writable_block(), np.ascontiguousarray(halo.slab(x, lo, hi, out.dim)))
            else:
                batch.send(rank, tag, halo.slab(x, lo, hi, out.dim))
    else:
        batch.recv(root, tag, out._writable_block())
    batch.run(f"scattering {out.name} from rank {root}")


# -- helpers ---------------------------------------------------------------------------------

def _shape(shape) -> tuple:
    try:
        shape = (operator.index(shape),) if not hasattr(shape, "__iter__") else \
            tuple(operator.index(s) for s in shape)
    except TypeError:
        raise ArgumentTypeError(f"a shape must be an int or a tuple of ints; got {shape!r}") from None
    if any(s < 0 for s in shape):
        raise ShapeError(f"a shape must hold non-negative ints; got {shape!r}")
    return shape


def _count(what, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ShapeError(f"{what} must be a whole number >= 0; got {value!r}")
    return int(value)


def _same_root(channel, root, what: str) -> None:
    """CommError on every rank unless all passed the same ``root`` (a root that differs
    would cross the messages), then ArgumentError on every rank unless it is a rank."""
    roots = channel.allgather(int(root) if _is_rank(root, channel.size) else repr(root))
    if any(r != roots[0] for r in roots):
        raise CommError(f"ranks passed different roots to {what}: "
                        + "; ".join(f"rank {r}: root={v}" for r, v in enumerate(roots)))
    _check_root(root, channel.size)


def _is_rank(root, size) -> bool:
    return not isinstance(root, bool) and isinstance(root, (int, np.integer)) and 0 <= root < size


def _check_root(root, size) -> None:
    if not _is_rank(root, size):
        raise ArgumentError(f"root must be a rank in 0..{size - 1}, not {root!r}")


def _made(current, make) -> DistArray:
    """A new array of ``make()``'s (distribution, shape, dtype, device), checked on this
    rank; a call of every rank. Where the checks fail on some ranks only, every rank
    raises their error (control.settle), rather than the others waiting for them in
    the array's agreement."""
    try:
        distribution, shape, dtype, device = make()
        dtype, device, coherent = _element_and_place(current, dtype, device, distribution.dim)
        failure = None
    except Exception as exc:  # whatever it is, the other ranks must hear of it
        failure = exc
    control.settle(current.channel, (), failure, "making a distributed array")
    return DistArray(distribution, shape, dtype, device, coherent)


def _element_and_place(current, dtype, device, dim) -> tuple:
    """(the dtype, the GPU or None, whether coherent) of a new array distributed along
    ``dim`` on this rank of session ``current``."""
    dtype = _dtype(dtype)
    check_transferable(dtype)  # its rows cross between ranks as raw bytes
    if device is None:  # a rank with a GPU of its own co-executes on it: rows stay there
        device = place_for(current.devices) if dim == 0 and dtype.kind in "biufc" else HOST
    if isinstance(device, str) and device == COHERENT:
        if dim != 0:
            raise ShapeError("coherent arrays are distributed along dim 0 only (their rows move "
                             "between host and devices)")
        numeric(dtype, "a coherent distributed array")
        return dtype, None, True
    device = _gpu(device)
    if device is not None and dim != 0:
        raise ShapeError("arrays on a GPU are distributed along dim 0 only")
    return dtype, device, False


def _agree(current, name, description) -> None:
    """CommError on every rank unless all made the same array."""
    seen = current.channel.allgather(description)
    if any(d != seen[0] for d in seen):
        ranks = "; ".join(f"rank {r}: {d}" for r, d in enumerate(seen))
        raise CommError(f"ranks made different distributed arrays as {name} "
                        f"(shape, dtype, dim, halo, blocks, place, distribution): {ranks}")


def _dtype(dtype) -> np.dtype:
    try:
        return np.dtype(dtype)
    except TypeError:
        raise ArgumentTypeError(f"a distributed array's dtype must be a NumPy dtype; got {dtype!r}") from None


def _gpu(device):
    """None for host memory, else the GPU device record ``device`` names."""
    if isinstance(device, str) and device in ("cpu", "cpu0", HOST):
        return None

    record = get_device(device) if isinstance(device, str) else device
    if getattr(record, "kind", None) == "cpu":
        return None
    if getattr(record, "kind", None) != "gpu":
        raise ArgumentTypeError(f"device must be None, 'host', 'coherent', a GPU id or a GPU device; "
                                f"got {device!r}")
    return record


def _identity(reduce_op, dtype: np.dtype, what: str):
    """NumPy's reduction of no elements of ``dtype`` by ``reduce_op``: its identity, typed
    as NumPy's (a sum of int8 is an int64 0); ShapeError where it has none."""
    ufunc = getattr(np, getattr(reduce_op, "ufunc_name", ""), None)
    if ufunc is None or ufunc.identity is None or dtype.names is not None:
        raise ShapeError(f"{what} has no elements, and op {reduce_op.name!r} has no identity on {dtype} "
                         f"to give (NumPy refuses such a reduction too)")
    return ufunc.reduce(np.zeros(0, dtype))


def _fold(values: np.ndarray, reduce_op, dtype) -> np.ndarray:
    """A one-element array of ``dtype``: ``reduce_op`` over all of ``values`` (pairwise
    halving, in ``dtype``: a sum of int8 widens before it adds, as NumPy's does)."""
    work = np.array(values.reshape(-1), dtype=dtype)
    n = work.size
    while n > 1:
        half = n // 2
        reduce_op.combine(work[:half], work[n - half:n], work[:half])
        n -= half
    return work[:1]
