"""Chase–Lev work-stealing deques of ``(min, max)`` chunks in shared NumPy arrays (SPEC §3.4).

Every deque of a loop lives in two flat ``int64`` arrays that all worker threads share:
``state`` (per deque: top index, bottom index, EMPTY token, each on its own cache line)
and ``buf`` (per deque: a circular buffer of ``capacity`` chunks, two words each). The
owner pushes and pops at the bottom; thieves take the top entry with a compare-and-swap
on the top index. A thief that loses that race gets ``ABORT`` and retries; ``EMPTY``
means no work.

The operations are ``@njit(nogil=True)`` functions, so Python threads calling them (and
the ``nogil`` chunk functions between them) really run at the same time on different
cores: the races the algorithm is built for really happen. Shared words are therefore
read and written only through the atomic intrinsics below, which emit LLVM atomic
instructions with explicit orderings; the fences and orderings follow Lê, Pop, Cohen and
Zappa Nardelli, "Correct and Efficient Work-Stealing for Weak Memory Models" (PPoPP
2013), the proven C11 version of Chase and Lev's deque.

Why the compare-and-swap is atomic: :func:`cas` emits LLVM ``cmpxchg seq_cst``, which
x86-64 compiles to ``lock cmpxchg``. The ``lock`` prefix holds the cache line for the
whole read-compare-write, so of several thieves (and an owner) racing for the same top
index exactly one sees its expected value and moves it; the others read the new value
and fail. Nothing here relies on the GIL: the callers release it.
"""
from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.core.extending import intrinsic

from ..errors import ArgumentError

# Status codes returned by pop_bottom / steal_top.
OK = 0      # a chunk was taken
EMPTY = 1   # the deque holds no chunk (or, for steal_top_adjacent, none that fits)
ABORT = 2   # a thief lost the compare-and-swap to another taker; retry

# Layout of one deque's row in ``state``: top, bottom and the EMPTY token sit 64 bytes
# apart so that thieves hammering ``top`` do not slow the owner's ``bottom`` updates.
TOP = 0
BOTTOM = 8
TOKEN = 16
STRIDE = 24


# -- atomic intrinsics on an element of a 1-D int64 array ------------------------------
def _typable(arr, idx):
    """Atomics are typed only for an aligned 1-D int64 array and an integer index
    (otherwise Numba reports a typing error at the call site)."""
    return (isinstance(arr, types.Array) and arr.ndim == 1 and arr.dtype == types.int64
            and arr.aligned and isinstance(idx, types.Integer))


def _element_pointer(context, builder, sig, args):
    arrty, idxty = sig.args[0], sig.args[1]
    ary = context.make_array(arrty)(context, builder, args[0])
    idx = context.cast(builder, args[1], idxty, types.intp)
    return cgutils.get_item_pointer(context, builder, arrty, ary, [idx])


def _load(ordering):
    @intrinsic
    def load(typingctx, arr, idx):
        if not _typable(arr, idx):
            return None

        def codegen(context, builder, sig, args):
            return builder.load_atomic(_element_pointer(context, builder, sig, args),
                                       ordering, 8)
        return types.int64(arr, idx), codegen
    return load


def _store(ordering):
    @intrinsic
    def store(typingctx, arr, idx, value):
        if not _typable(arr, idx):
            return None

        def codegen(context, builder, sig, args):
            val = context.cast(builder, args[2], sig.args[2], types.int64)
            builder.store_atomic(val, _element_pointer(context, builder, sig, args),
                                 ordering, 8)
            return context.get_dummy_value()
        return types.none(arr, idx, value), codegen
    return store


def _fence(ordering):
    @intrinsic
    def fence(typingctx):
        def codegen(context, builder, sig, args):
            builder.fence(ordering)
            return context.get_dummy_value()
        return types.none(), codegen
    return fence


relaxed_load = _load("monotonic")
acquire_load = _load("acquire")
atomic_load = _load("seq_cst")
relaxed_store = _store("monotonic")
atomic_store = _store("seq_cst")
fence_seq_cst = _fence("seq_cst")   # a locked no-op or mfence on x86-64
fence_release = _fence("release")   # a compiler barrier on x86-64 (stores are not reordered)


@intrinsic
def cas(typingctx, arr, idx, expected, new):
    """``arr[idx] == expected`` ? set it to ``new`` and return True : return False, atomically."""
    if not _typable(arr, idx):
        return None

    def codegen(context, builder, sig, args):
        ptr = _element_pointer(context, builder, sig, args)
        exp = context.cast(builder, args[2], sig.args[2], types.int64)
        new_val = context.cast(builder, args[3], sig.args[3], types.int64)
        pair = builder.cmpxchg(ptr, exp, new_val, "seq_cst", "seq_cst")
        return builder.extract_value(pair, 1)
    return types.boolean(arr, idx, expected, new), codegen


@intrinsic
def fetch_add(typingctx, arr, idx, delta):
    """Add ``delta`` to ``arr[idx]`` atomically (``lock xadd``); return the old value."""
    if not _typable(arr, idx):
        return None

    def codegen(context, builder, sig, args):
        ptr = _element_pointer(context, builder, sig, args)
        val = context.cast(builder, args[2], sig.args[2], types.int64)
        return builder.atomic_rmw("add", ptr, val, "seq_cst")
    return types.int64(arr, idx, delta), codegen


# -- the deque operations ------------------------------------------------------------------
@njit(nogil=True, cache=True)
def size(state, q):
    """Number of chunks in deque ``q`` (a snapshot; may be momentarily negative during a pop)."""
    base = q * STRIDE
    return atomic_load(state, base + BOTTOM) - atomic_load(state, base + TOP)


@njit(nogil=True, cache=True)
def push_bottom(state, buf, capacity, q, lo, hi):
    """Owner only: add chunk ``[lo, hi)`` at the bottom; False when the deque is full."""
    base = q * STRIDE
    b = relaxed_load(state, base + BOTTOM)
    t = acquire_load(state, base + TOP)
    if b - t >= capacity:
        return False
    slot = 2 * (q * capacity + b % capacity)
    relaxed_store(buf, slot, lo)
    relaxed_store(buf, slot + 1, hi)
    # The chunk's words must be visible before a thief can see the larger bottom.
    fence_release()
    relaxed_store(state, base + BOTTOM, b + 1)
    return True


@njit(nogil=True, cache=True)
def pop_bottom(state, buf, capacity, q):
    """Owner only: take the bottom chunk. Returns ``(status, lo, hi)``, status OK or EMPTY."""
    base = q * STRIDE
    b = relaxed_load(state, base + BOTTOM) - 1
    relaxed_store(state, base + BOTTOM, b)
    # Publish the reservation of slot b before reading top: a thief that reads top after
    # this fence sees the smaller bottom, so owner and thieves cannot both miss each other.
    fence_seq_cst()
    t = relaxed_load(state, base + TOP)
    if t > b:                       # it was empty: undo the reservation
        relaxed_store(state, base + BOTTOM, b + 1)
        return EMPTY, 0, 0
    slot = 2 * (q * capacity + b % capacity)
    lo = relaxed_load(buf, slot)
    hi = relaxed_load(buf, slot + 1)
    if t < b:                       # more than one chunk: no thief can reach slot b
        return OK, lo, hi
    # Last chunk (t == b): a thief may be taking the very same entry from the top. Both
    # sides then race on one compare-and-swap of top from t to t + 1; the lock-prefixed
    # cmpxchg lets exactly one win, so the chunk goes to exactly one of them. Either way
    # the deque is now empty and bottom returns to t + 1 == top.
    won = cas(state, base + TOP, t, t + 1)
    relaxed_store(state, base + BOTTOM, b + 1)
    if won:
        return OK, lo, hi
    return EMPTY, 0, 0


@njit(nogil=True, cache=True)
def steal_top(state, buf, capacity, q):
    """Thief: take the top chunk. Returns ``(status, lo, hi)``, status OK, EMPTY or ABORT."""
    base = q * STRIDE
    t = acquire_load(state, base + TOP)
    # Read top before bottom, with a full fence between: pairs with the fence in
    # pop_bottom (see there).
    fence_seq_cst()
    b = acquire_load(state, base + BOTTOM)
    if t >= b:
        return EMPTY, 0, 0
    slot = 2 * (q * capacity + t % capacity)
    lo = relaxed_load(buf, slot)
    hi = relaxed_load(buf, slot + 1)
    # The words just read are only trusted if top still equals t: then no one has taken
    # entry t (and the owner cannot have overwritten its slot, since push_bottom keeps
    # bottom - top < capacity).
    if not cas(state, base + TOP, t, t + 1):
        return ABORT, 0, 0
    return OK, lo, hi


@njit(nogil=True, cache=True)
def steal_top_adjacent(state, buf, capacity, q, lo, hi):
    """Thief: take the top chunk only if it touches ``[lo, hi)``; return the merged range.

    Returns ``(status, lo, hi)``: OK with the union of both ranges, EMPTY when the deque
    is empty or its top chunk is not adjacent (nothing taken), ABORT when the race was lost.
    Lets a thief with a large chunk size (a GPU) gather several small neighbouring chunks
    into one launch without ever taking a chunk it would have to give back.
    """
    base = q * STRIDE
    t = acquire_load(state, base + TOP)
    fence_seq_cst()
    b = acquire_load(state, base + BOTTOM)
    if t >= b:
        return EMPTY, lo, hi
    slot = 2 * (q * capacity + t % capacity)
    x_lo = relaxed_load(buf, slot)
    x_hi = relaxed_load(buf, slot + 1)
    if x_hi != lo and x_lo != hi:
        return EMPTY, lo, hi
    if not cas(state, base + TOP, t, t + 1):
        return ABORT, lo, hi
    return OK, min(lo, x_lo), max(hi, x_hi)


@njit(nogil=True, cache=True)
def write_empty_token(state, count):
    """Write the EMPTY token into all ``count`` deques: the loop is over, workers stop."""
    for q in range(count):
        atomic_store(state, q * STRIDE + TOKEN, 1)


@njit(nogil=True, cache=True)
def has_empty_token(state, q):
    """True once the EMPTY token has been written into deque ``q``."""
    return atomic_load(state, q * STRIDE + TOKEN) != 0


def aligned_zeros(count, align=64):
    """A zeroed 1-D int64 array whose data starts on an ``align``-byte boundary."""
    raw = np.zeros(count + align // 8, dtype=np.int64)
    skip = (-raw.ctypes.data % align) // 8
    return raw[skip:skip + count]


class DequeSet:
    """``count`` Chase–Lev deques of ``capacity`` chunks each, in shared NumPy arrays.

    ``state`` and ``buf`` are what the ``nogil`` functions above operate on; the methods
    are conveniences for Python callers (one call of the matching function each).
    """

    def __init__(self, count: int, capacity: int):
        if count < 1 or capacity < 1:
            raise ArgumentError(f"need at least one deque of capacity >= 1, got count={count}, "
                             f"capacity={capacity}")
        self.count = count
        self.capacity = capacity
        self.state = aligned_zeros(count * STRIDE)
        self.buf = aligned_zeros(2 * count * capacity)

    def push(self, q: int, lo: int, hi: int) -> bool:
        return push_bottom(self.state, self.buf, self.capacity, q, lo, hi)

    def pop(self, q: int) -> tuple[int, int, int]:
        return pop_bottom(self.state, self.buf, self.capacity, q)

    def steal(self, q: int) -> tuple[int, int, int]:
        return steal_top(self.state, self.buf, self.capacity, q)

    def size(self, q: int) -> int:
        return size(self.state, q)

    def write_empty_token(self) -> None:
        write_empty_token(self.state, self.count)

    def has_empty_token(self, q: int) -> bool:
        return has_empty_token(self.state, q)
