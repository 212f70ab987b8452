"""Host memory of NumPy arrays page-locked in place, so that GPU copies read and write it
directly.

A copy between a GPU and pageable memory goes through the driver's own page-locked
buffer, and hetflow's chunked copies through its (:class:`~hetflow.runtime.staging.PinnedPool`):
either way one CPU core copies every byte once more, at about 8 GB/s on the H100 host,
and that core's copying, not the bus (54 GB/s there), bounded a GPU working on host
arrays. Registering the array's memory with the driver (``cudaHostRegister``) lets the
copy engine move it without the extra copy; it costs about as much as copying the
memory once (80 ms per GiB there), so a registration is kept while the array lives and
serves every later launch: a loop that calls ``forall`` again and again over the same
NumPy arrays copies at the bus's speed from its second call on.

An array's owning buffer is registered in pieces of :data:`PIECE` bytes as copies reach
them, so a first launch does not wait for the whole array before its first chunk. A
piece is unregistered when its owner is garbage collected (a weak-reference callback,
which runs before NumPy frees the memory), never while the owner lives: a copy in flight
may be reading it. At most :attr:`HostPins.limit` bytes are registered; past it, and for
memory that is not a NumPy array's own or that the driver refuses (registered already
by someone else), :meth:`HostPins.segments` says no and the caller stages the copy as before.
"""
from __future__ import annotations

import logging
import mmap
import os
import threading
import weakref

import numpy as np

from ..cuda_compat import cupy_module

log = logging.getLogger(__name__)

PIECE = 64 << 20  # bytes registered at once (about 5 ms on the H100 host)
SMALLEST = 4 << 20  # arrays smaller than this are cheaper to stage than to register
_PORTABLE = 1  # cudaHostRegisterPortable: page-locked for every GPU's context


def owner_of(array: np.ndarray) -> np.ndarray | None:
    """The NumPy array that allocated ``array``'s memory (itself, or the end of its
    ``base`` chain), or None when the memory is not NumPy's own (a buffer of another
    object, a memory map): only NumPy's own is known to live exactly as long as its owner."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array if array.base is None and array.flags.owndata else None


def _memory_limit() -> int:
    """A quarter of the host's physical memory: page-locked memory cannot be swapped out."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
    except (ValueError, OSError, AttributeError):
        return 4 << 30


class _Owner:
    """The registered pieces of one owning array's buffer ``[address, end)``; piece ``k``
    is its part of ``[start + k * piece, start + (k + 1) * piece)``."""

    def __init__(self, address: int, nbytes: int, piece: int):
        self.address, self.end, self.piece = address, address + nbytes, piece
        self.start = address - address % piece
        self.pieces: dict[int, tuple[int, int] | None] = {}  # k -> (address, nbytes) registered, None: refused

    def span(self, k: int) -> tuple[int, int]:
        """Piece ``k``'s ``[lo, hi)`` inside the buffer."""
        return max(self.address, self.start + k * self.piece), min(self.end, self.start + (k + 1) * self.piece)


class HostPins:
    """Pieces of NumPy arrays' memory registered with a GPU driver, while their owners live.

    ``register(address, nbytes)`` page-locks memory (raises if it cannot),
    ``unregister(address)`` releases it, and ``memcpy`` copies to or from it; :func:`host_pins`
    gives the real ones (CuPy's ``cudaHostRegister``, ``cudaMemcpyAsync``).
    """

    def __init__(self, register, unregister, memcpy=None, limit: int | None = None, piece: int = PIECE):
        self._register, self._unregister = register, unregister
        self.memcpy = memcpy  # (dst, src, nbytes, kind, stream): an asynchronous copy
        self.limit = _memory_limit() if limit is None else limit
        self.piece = max(mmap.PAGESIZE, piece - piece % mmap.PAGESIZE)
        self.registered = 0  # bytes
        self._owners: dict[int, _Owner] = {}
        # Re-entrant: a collection inside segments() may run another owner's callback here.
        self._lock = threading.RLock()

    def segments(self, rows: np.ndarray) -> list[tuple[int, int]] | None:
        """``(address, nbytes)`` spans that make up the memory of ``rows`` (a C-contiguous
        array), each inside one registration (the driver refuses a copy that crosses
        two), registering the pieces of its owner's buffer that it lies in as needed;
        None where it cannot be registered (the module docstring says when): the
        caller stages the copy."""
        owner = owner_of(rows)
        if owner is None or owner.nbytes < SMALLEST or not rows.flags.c_contiguous:
            return None
        lo = rows.ctypes.data
        hi = lo + rows.nbytes
        with self._lock:
            entry = self._entry(owner)
            if entry is None:
                return None
            spans = []
            for k in range((lo - entry.start) // self.piece, (max(lo, hi - 1) - entry.start) // self.piece + 1):
                if not self._registered(entry, k):
                    return None
                a, b = entry.span(k)
                a, b = max(lo, a), min(hi, b)
                if b > a:
                    spans.append((a, b - a))
            return spans

    def _entry(self, owner: np.ndarray) -> _Owner | None:
        key = id(owner)
        entry = self._owners.get(key)
        if entry is None:
            # The weak reference also pins the memory in place: NumPy refuses to resize
            # an array that has one.
            try:
                weakref.finalize(owner, self._forget, key).atexit = False
            except TypeError:  # not weakly referenceable: nothing would tell us it died
                return None
            entry = self._owners[key] = _Owner(owner.ctypes.data, owner.nbytes, self.piece)
        return entry

    def _registered(self, entry: _Owner, k: int) -> bool:
        """Is piece ``k`` of ``entry`` registered? Registers it if it can."""
        if k in entry.pieces:
            return entry.pieces[k] is not None
        lo, hi = entry.span(k)
        if self.registered + hi - lo > self.limit:
            return False  # not remembered as refused: memory may be freed later
        try:
            self._register(lo, hi - lo)
        except Exception:  # noqa: BLE001  refused (registered by someone else): stage it
            entry.pieces[k] = None
            return False
        entry.pieces[k] = (lo, hi - lo)
        self.registered += hi - lo
        return True

    def _forget(self, key: int) -> None:
        """The owner ``key`` is being freed: unregister its pieces first."""
        with self._lock:
            entry = self._owners.pop(key, None)
            for piece in entry.pieces.values() if entry is not None else ():
                if piece is not None:
                    self.registered -= piece[1]
                    try:
                        self._unregister(piece[0])
                    except Exception as exc:  # noqa: BLE001  a callback must not raise
                        log.warning("could not unregister %d bytes of host memory at %#x: %s",
                                    piece[1], piece[0], exc)


_pins: HostPins | None = None
_pins_lock = threading.Lock()


def host_pins() -> HostPins | None:
    """The process's :class:`HostPins` over CuPy's ``cudaHostRegister``; None without CuPy."""
    global _pins
    if _pins is None:
        cupy = cupy_module()
        if cupy is None:
            return None
        runtime = cupy.cuda.runtime
        with _pins_lock:
            if _pins is None:
                _pins = HostPins(lambda address, nbytes: runtime.hostRegister(address, nbytes, _PORTABLE),
                                 runtime.hostUnregister, runtime.memcpyAsync)
    return _pins
