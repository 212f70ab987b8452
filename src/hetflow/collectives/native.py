"""The native path: MPI's own ``MPI_Allreduce``/``MPI_Reduce`` for built-in ops on
dtypes MPI reduces itself, and the prepared calls that repeat it with no overhead.

Every native call is non-blocking (``MPI_Iallreduce``/``MPI_Ireduce``), spun on with
``Request.Test`` and then waited on with the deadline: MPICH finishes a small
collective sooner that way than in its blocking call (2.8 against 3.0 µs for 8 bytes,
2 ranks, dev box), and a peer that never arrives turns into CommTimeoutError.

A :class:`NativeCall` is what a repeated small collective needs, prepared on its first
call (once all ranks have agreed on its arguments, :mod:`hetflow.collectives.agreement`):
the MPI op, the shape and dtype of the result. ``Communicator.allreduce`` and
``reduce`` look it up by (op, dtype, shape, segments, root) before anything else, so
a repeated call costs a dictionary lookup, a few comparisons and MPI's own call.
"""
from __future__ import annotations

import atexit
import functools
import logging

import numpy as np

from hetflow.collectives.ops import BuiltinOp
from hetflow.errors import CommError

# The MPI op of each built-in op, and the dtype kinds MPI's op takes (MPI-4.0 §6.9.2:
# no MIN/MAX on complex or C_BOOL, bitwise ops on integers only, no half floats). MIN
# and MAX of floats go through NanRule.
_MPI_OPS = {"sum": ("SUM", "iufc"), "prod": ("PROD", "iufc"), "min": ("MIN", "iuf"),
            "max": ("MAX", "iuf"), "and": ("BAND", "iu"), "or": ("BOR", "iu"),
            "xor": ("BXOR", "iu"), "land": ("LAND", "iub"), "lor": ("LOR", "iub"),
            "lxor": ("LXOR", "iub")}
_MPI_CHARS = frozenset("?bBhHiIlLqQfdFD")  # C types with a predefined MPI datatype

# Polls of a native request before the wait with its deadline takes over: a small
# collective between healthy ranks on quiet cores completes within them (about 10),
# without reading the clock. No more: the wait then yields the core between polls, which
# matters where ranks share cores (200 polls without yielding made an 8-byte allreduce
# 80 us instead of 10 on the loaded 2-core dev box).
_SPINS = 16

# Prepared calls kept per communicator (a program calls few distinct small
# collectives), and the most their buffers may hold: past either, all are dropped.
MAX_PREPARED = 256
MAX_PREPARED_BYTES = 64 << 20

# Where a call skipped the check: the words its errors end with.
_UNCHECKED = ("; its arguments had been agreed on in an earlier call and were not "
              "checked again: check='always' checks every call")

NATIVE, TREE = "native", "tree"
TREE_TAG = 1001  # apart from the schedule's tags (< 5 * 64) and agreement's (1000)

# Repeated allreduces up to this size take PersistentAllreduce. H100 host, 2 ranks:
# 0.84-1.25x MPI_Allreduce up to 2 KiB (MPI_Iallreduce: 0.52-0.79x), 0.84-0.87x from 4
# to 32 KiB (0.69-0.83x); from 64 KiB its two copies cost more than they save.
PERSISTENT_BYTES = 32 << 10

# Repeated reduces up to this size take TreeReduce rather than MPI_Ireduce; at 2 ranks
# all of them do (a tree of 2 is one message, the least any reduce can move). Dev box,
# 2 ranks, against MPI_Reduce: the tree 0.75-1.0x up to 2 KiB, 1.3-4x from 4 to 512
# KiB (MPICH's reduce faults a fresh temporary buffer per call); MPI_Ireduce 0.6-0.9x
# throughout. 3 or more ranks: MPICH's own choice for short reduces, up to 2 KiB; the
# bound is a guess until measured there (docs/collectives.md).
TREE_BYTES = 16 << 10

log = logging.getLogger("hetflow.collectives")
_DEBUG = logging.DEBUG


@functools.lru_cache(maxsize=256)
def mpi_op_name(reduce_op, dtype) -> str | None:
    """The name of MPI's predefined op computing ``reduce_op`` on ``dtype``, if any."""
    if not isinstance(reduce_op, BuiltinOp) or not dtype.isnative \
            or dtype.char not in _MPI_CHARS:
        return None
    mpi_name, kinds = _MPI_OPS[reduce_op.name]
    return mpi_name if dtype.kind in kinds else None


class NanRule:
    """MIN and MAX of floats as NumPy's, where NaN wins: MPI's have no rule for NaN
    (MPICH's answer differed from rank to rank when one rank held one). The call reduces
    2n values instead of n, with MPI's own op: ``x`` with its NaNs as the op's identity
    (+inf for min, -inf for max: ``fmin``/``fmax`` drop NaNs), then a flag per element
    that the op makes "no rank had a NaN here" (``x == x``: 1, else 0, for MIN) or
    "some rank had one" (``x != x`` for MAX)."""

    def __init__(self, low: bool):
        self.drop, self.fill = (np.fmin, np.inf) if low else (np.fmax, -np.inf)
        self.flag, self.clear = (np.equal, 1.0) if low else (np.not_equal, 0.0)

    @staticmethod
    def buffers(x) -> tuple:
        """(2n values, their first n as x is shaped, the other n so, a mask so)."""
        buf = np.empty(2 * x.size, x.dtype)
        return buf, buf[:x.size].reshape(x.shape), buf[x.size:].reshape(x.shape), np.empty(x.shape, bool)

    def pack(self, x, values, flags) -> None:
        self.drop(x, self.fill, out=values)
        self.flag(x, x, out=flags)

    def unpack(self, values, flags, result, holes) -> None:
        """Store the reduced ``values`` into ``result``: NaN where ``flags`` say a rank had one."""
        np.copyto(result, values)
        np.not_equal(flags, self.clear, out=holes)
        np.copyto(result, np.nan, where=holes)


_NAN_RULES = {"min": NanRule(True), "max": NanRule(False)}


def nan_rule(reduce_op, dtype) -> NanRule | None:
    """The NanRule a native call of ``reduce_op`` on ``dtype`` goes through, if any."""
    return _NAN_RULES.get(reduce_op.name) if dtype.kind == "f" else None


def run(comm, name, x, reduce_op, root, out, to_all, is_root):
    """MPI's own collective on host array ``x``; the result where there is one."""
    link = comm.link
    result = out if out is not None else (np.empty(x.shape, x.dtype) if is_root else None)
    rule = nan_rule(reduce_op, x.dtype)
    if rule is not None:  # (packed: the result cannot overlap what is sent)
        send, values, flags, holes = rule.buffers(x)
        rule.pack(x, values, flags)
        recv, got, got_flags, _ = rule.buffers(x)
        op = getattr(link.MPI, mpi_op_name(reduce_op, x.dtype))
        finish(comm, name, start(link.comm, send, recv if result is not None else None, op, root, to_all))
        if result is not None:
            rule.unpack(got, got_flags, result, holes)
        return result
    recv = result
    if result is not None and not result.flags.c_contiguous:
        recv = np.empty(x.shape, x.dtype)  # MPI writes contiguous buffers only
    send = x if x.flags.c_contiguous else np.ascontiguousarray(x)
    if out is not None and may_overlap(send, recv):
        send = link.MPI.IN_PLACE if same_memory(send, recv) else send.copy()
    op = getattr(link.MPI, mpi_op_name(reduce_op, x.dtype))
    finish(comm, name, start(link.comm, send, recv, op, root, to_all))
    if recv is not result:
        result[...] = recv
    return result


def start(mpi_comm, send, recv, op, root, to_all):
    if to_all:
        return mpi_comm.Iallreduce(send, recv, op=op)
    return mpi_comm.Ireduce(send, recv, op=op, root=root)


def finish(comm, name, request):
    """Spin on ``request``, then wait on it with the communicator's deadline."""
    spins = _SPINS
    while not request.Test():
        spins -= 1
        if not spins:
            comm._transport(name).wait([request], f"native MPI_I{name}")
            return


def prepare(comm, name, x, reduce_op, root, to_all, general):
    """The prepared call that repeats an agreed native collective; ``general(x, out)``
    makes the call on the general path."""
    if not to_all and (x.nbytes <= TREE_BYTES or comm.size == 2):
        return TreeReduce(comm, name, x, reduce_op, root, to_all, general)  # NumPy's ufunc: NaN wins
    if nan_rule(reduce_op, x.dtype) is not None:
        return NanNativeCall(comm, name, x, reduce_op, root, to_all, general)
    if to_all and x.nbytes <= PERSISTENT_BYTES and hasattr(comm.link.comm, "Allreduce_init"):
        try:
            return PersistentAllreduce(comm, name, x, reduce_op, root, to_all, general)
        except (NotImplementedError, comm.link.MPI.Exception):  # an MPI before 4.0: none
            return NativeCall(comm, name, x, reduce_op, root, to_all, general)
    return NativeCall(comm, name, x, reduce_op, root, to_all, general)


class NativeCall:
    """One native collective whose arguments every rank agreed on, ready to repeat.

    ``run(x, out)`` makes the call for a C-contiguous ``x`` of the prepared shape and
    dtype, and ``out`` None, ``x`` itself or a separate writable C-contiguous array of
    the same shape and dtype; anything else goes to ``general(x, out)``, the general
    path, as does every call on a communicator left unusable. Written flat:
    each Python call or attribute saved is ~2% of an 8-byte allreduce.
    """

    __slots__ = ("comm", "name", "post", "op", "in_place", "root", "to_all",
                 "is_root", "shape", "dtype", "what", "general")
    path = NATIVE
    nbytes = 0  # the buffers it keeps

    def __init__(self, comm, name, x, reduce_op, root, to_all, general):
        link = comm.link
        self.comm, self.name, self.general = comm, name, general
        self.post = link.comm.Iallreduce if to_all else link.comm.Ireduce
        self.op = getattr(link.MPI, mpi_op_name(reduce_op, x.dtype))
        self.in_place = link.MPI.IN_PLACE
        self.root, self.to_all = root, to_all
        self.is_root = to_all or comm.rank == root
        self.shape, self.dtype = x.shape, x.dtype
        self.what = (f"{name} of {x.nbytes} bytes ({x.dtype}, op {reduce_op.name}) "
                     f"on rank {comm.rank} of {comm.size}: {self.path} path")

    def run(self, x, out):
        comm = self.comm
        if comm.link.broken or not x.flags.c_contiguous:
            return self.general(x, out)
        send = x
        if not self.is_root:
            result = None  # out is significant at the root only, as in MPI
        elif out is None:
            result = np.empty(self.shape, self.dtype)
        elif out is x and x.flags.writeable:
            result, send = out, self.in_place
        elif type(out) is np.ndarray and out.shape == self.shape \
                and out.dtype == self.dtype and (flags := out.flags).c_contiguous \
                and flags.writeable and (x.base is None and out.base is None
                                         or not np.may_share_memory(x, out)):
            result = out  # may_overlap's test, inline
        else:
            return self.general(x, out)
        comm.last_path = self.path
        if log.isEnabledFor(_DEBUG):
            log.debug("%s", self.what)
        try:
            return self.call(send, result)
        except comm.link.MPI.Exception as exc:
            raise CommError(f"{self.name} on rank {comm.rank}: MPI failed ({exc})"
                            f"{_UNCHECKED}") from exc

    def call(self, send, result):
        if self.to_all:
            request = self.post(send, result, self.op)
        else:
            request = self.post(send, result, self.op, self.root)
        spins = _SPINS  # self.wait, inline
        while not request.Test():
            spins -= 1
            if not spins:
                self.wait(request)
                break
        return result

    def free(self):
        """Release what the call holds in MPI (nothing: its requests are per call)."""

    def wait(self, request):
        spins = _SPINS
        while not request.Test():
            spins -= 1
            if not spins:
                self.comm._transport(self.name).wait(
                    [request], f"{self.path} {self.name}{_UNCHECKED}")
                return


class NanNativeCall(NativeCall):
    """A native MIN or MAX of floats (:class:`NanRule`), over buffers of its own."""

    __slots__ = ("rule", "inbox", "outbox", "nbytes")

    def __init__(self, comm, name, x, reduce_op, root, to_all, general):
        super().__init__(comm, name, x, reduce_op, root, to_all, general)
        self.rule = nan_rule(reduce_op, x.dtype)
        self.inbox, self.outbox = NanRule.buffers(x), NanRule.buffers(x)
        self.nbytes = 4 * x.nbytes

    def call(self, send, result):
        inbox, outbox = self.inbox, self.outbox
        self.rule.pack(result if send is self.in_place else send, inbox[1], inbox[2])
        NativeCall.call(self, inbox[0], outbox[0])
        if result is not None:
            self.rule.unpack(outbox[1], outbox[2], result, outbox[3])
        return result


class PersistentAllreduce(NativeCall):
    """A small allreduce whose arguments every rank agreed on, as an MPI-4 persistent
    collective (``MPI_Allreduce_init``) over buffers of its own: MPICH builds its
    schedule once, and a ``Start`` then costs less than an ``MPI_Iallreduce`` or even
    the blocking ``MPI_Allreduce`` (8 bytes, 2 ranks, dev box: 2.8 against 4.3-4.9 us,
    the copies in and out included). Its request is freed when the communicator drops
    its prepared calls, and at exit before MPI finalizes."""

    __slots__ = ("request", "status", "inbox", "outbox", "nbytes")

    def __init__(self, comm, name, x, reduce_op, root, to_all, general):
        super().__init__(comm, name, x, reduce_op, root, to_all, general)
        self.inbox, self.outbox = np.empty(x.shape, x.dtype), np.empty(x.shape, x.dtype)
        self.request = comm.link.comm.Allreduce_init(self.inbox, self.outbox, op=self.op)
        # MPICH's MPI_Test and MPI_Testall, given no status to fill, at times report an
        # error "in the status" of a completed persistent collective: it gets one.
        self.status = comm.link.MPI.Status()
        self.nbytes = 2 * x.nbytes
        _free_at_exit()
        _persistent.add(self)

    def call(self, send, result):
        self.inbox[...] = result if send is self.in_place else send
        request, status = self.request, self.status
        request.Start()
        spins = _SPINS
        while not request.Test(status):
            spins -= 1
            if not spins:
                self.comm._transport(self.name).wait(
                    [request], f"{self.path} {self.name}{_UNCHECKED}", lambda: request.Test(status))
                break
        result[...] = self.outbox
        return result

    def free(self):
        """Free the persistent request (MPI warns of any left at finalize)."""
        _persistent.discard(self)
        if not self.comm.link.broken:  # a timed-out request may still be active
            self.request.Free()


_persistent: set = set()  # PersistentAllreduce calls whose requests are not freed


@functools.cache
def _free_at_exit():
    """Free the persistent requests at exit: registered on the first one, after mpi4py
    registered its own finalization, so that it runs before MPI finalizes."""
    atexit.register(_free_persistent)


def _free_persistent():
    for call in list(_persistent):
        call.free()


class TreeReduce(NativeCall):
    """A small reduce whose arguments every rank agreed on, as a binomial tree of
    point-to-point messages (MPICH's own algorithm for short reduces): each rank
    receives from its children, in turn, combining with NumPy, and sends to its parent.

    MPICH's ``MPI_Ireduce`` builds a schedule per call and costs more than its
    blocking ``MPI_Reduce``, whose leaves return once they have sent; these messages
    let a leaf do the same, and every wait keeps its deadline.
    """

    __slots__ = ("ufunc", "parent", "children", "inbox", "partial", "send_to", "receives",
                 "nbytes")
    path = TREE

    def __init__(self, comm, name, x, reduce_op, root, to_all, general):
        super().__init__(comm, name, x, reduce_op, root, to_all, general)
        self.ufunc = getattr(np, reduce_op.ufunc_name)  # MPI's dtypes: never structured
        v, size = (comm.rank - root) % comm.size, comm.size
        self.parent, self.children, k = None, [], 1
        while k < size:  # children v + 1, v + 2, v + 4 ... below v's lowest set bit
            if v & k:
                self.parent = (v - k + root) % size
                break
            if v + k < size:
                self.children.append((v + k + root) % size)
            k <<= 1
        inner = self.children and self.parent is not None  # combines, then sends on
        self.inbox = np.empty(x.shape, x.dtype) if self.children else None
        self.partial = np.empty(x.shape, x.dtype) if inner else None
        self.nbytes = x.nbytes * (bool(self.children) + bool(inner))
        self.send_to = comm.link.comm.Isend
        # Persistent receives: the inbox and partners never change (a Start costs less
        # than an Irecv's argument parsing, on the root that sets the pace).
        self.receives = [comm.link.comm.Recv_init(self.inbox, child, TREE_TAG)
                         for child in self.children]

    def call(self, send, result):
        mine = result if send is self.in_place else send
        target = result if self.parent is None else self.partial
        for receive in self.receives:
            receive.Start()
            self.wait(receive)
            self.ufunc(mine, self.inbox, out=target)
            mine = target
        if self.parent is not None:
            self.wait(self.send_to(mine, self.parent, TREE_TAG))
        return result


def may_overlap(a, b):
    """Whether ``a`` and ``b`` may share bytes; two arrays that each own their memory
    cannot, and telling that first saves ``may_share_memory``'s cost on small calls."""
    return a is b or not (a.base is None and b.base is None) and np.may_share_memory(a, b)


def same_memory(a, b):
    """True when contiguous ``a`` and ``b`` are the very same bytes."""
    return (a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
            and a.nbytes == b.nbytes)
