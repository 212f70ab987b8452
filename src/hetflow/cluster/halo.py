"""Transfers between neighbouring ranks: halo exchange and moving rows on a rebalance.

A distributed array's local storage is its block of rows along the distributed
dimension with ``halo`` extra rows on each side (see :mod:`hetflow.cluster.darray`). The
halo on top holds the last rows of the previous rank's block, the one below the first
rows of the next rank's; the first and the last rank are neighbours (the array is
periodic, as ``cshift`` is). Exchanges are Isend/Irecv on the control channel, waited
on with its deadline and its watch for failure notices. Rows on a GPU travel through
host buffers; rows that are not contiguous are packed first. Rows of a coherent array
(a hetflow Buffer) whose sent rows are current on one of its GPU copies travel through
page-locked buffers with one wait each way, and the rows received go straight to that
GPU, where the next launch reads them (:func:`_exchange`); else through its host
copy: only the rows sent are brought there, and the rows received become current on
the host alone (:meth:`Buffer.host_rows`).
"""
from __future__ import annotations

import contextlib

import numpy as np

from hetflow.cluster import control
from hetflow.cuda_compat import cuda_module, cupy_module
from hetflow.runtime.buffers import Buffer

# Message kinds. With HALO_TAG: halo rows going to the previous rank, to the next one.
_UP, _DOWN = 0, 1
# With MOVE_TAG: rows moved to a new owner, blocks gathered to a root, arrays or blocks
# sent out from one.
MOVED, GATHERED, SCATTERED = 0, 1, 2


def tag(base: int, serial: int, kind: int) -> int:
    """The tag of one kind of message about the distributed object ``serial``."""
    return base + 4 * (serial % control.TAG_SERIALS) + kind


def slab(storage, lo: int, hi: int, dim: int):
    """Rows ``lo:hi`` of ``storage`` along ``dim`` (a view, not a copy)."""
    return storage[(slice(None),) * dim + (slice(lo, hi),)]


def reading(storage, lo: int, hi: int, dim: int):
    """Rows ``lo:hi`` of a block's storage to read: :func:`slab`, or for a coherent
    array (rows along dim 0) its host rows, made current."""
    if isinstance(storage, Buffer):
        return storage.host_rows(lo, hi)
    return slab(storage, lo, hi, dim)


def writing(storage, lo: int, hi: int, dim: int, overwrite: bool = True):
    """Rows ``lo:hi`` of a block's storage to write (``overwrite``: every element):
    :func:`slab`, or for a coherent array its host rows, current on the host alone
    from now on."""
    if isinstance(storage, Buffer):
        return storage.host_rows(lo, hi, write=True, overwrite=overwrite)
    return slab(storage, lo, hi, dim)


def is_device(storage) -> bool:
    return hasattr(storage, "__cuda_array_interface__") and not isinstance(storage, np.ndarray)


def on_gpu(device):
    """A context making GPU ``device`` current for the copies inside (None: host memory,
    nothing to do). A rank's process sees every GPU of its host; its blocks are on one."""
    if device is None:
        return contextlib.nullcontext()

    return cuda_module().gpus[device.ordinal]


class Transfers:
    """A batch of slab sends and receives on one channel, run together."""

    def __init__(self, channel):
        self.channel = channel
        self.requests = []
        self.unpack = []  # (target slab, host buffer) to copy in after the receives
        self.keep = []  # send buffers that must live until the sends complete
        self.peers = set()  # the ranks the batch waits for

    def recv(self, peer: int, tag_: int, target) -> None:
        if isinstance(target, np.ndarray) and target.flags.c_contiguous:
            buffer = target
        else:
            buffer = np.empty(target.shape, target.dtype)
            self.unpack.append((target, buffer))
        self.requests.append(self.channel.irecv(buffer, peer, tag_))
        self.peers.add(peer)

    def send(self, peer: int, tag_: int, source) -> None:
        if is_device(source):
            buffer = source.copy_to_host()
        else:
            buffer = np.ascontiguousarray(source)
        self.keep.append(buffer)
        self.requests.append(self.channel.isend(buffer, peer, tag_))
        self.peers.add(peer)

    def run(self, what: str) -> None:
        """Wait for every transfer (deadline, failure notices); unpack what arrived."""
        if self.requests:
            self.channel.wait(self.requests, what, peers=self.peers)
        for target, buffer in self.unpack:
            store(target, buffer)
        self.requests, self.unpack, self.keep, self.peers = [], [], [], set()


def store(target, values) -> None:
    """``target[...] = values`` for host or GPU slabs (values: a host or GPU array)."""
    if is_device(target):
        target.copy_to_device(values)
    else:
        target[...] = values


def keep(target, source, lo: int, hi: int, to: int, dim: int) -> None:
    """Rows ``lo:hi`` of a block's storage ``source`` become rows ``to:...`` of
    ``target``, its storage under a new cut (a coherent array's rows stay in the memory
    where they are current)."""
    if isinstance(target, Buffer):
        target.copy_rows(source, lo, hi, to)
    else:
        store(slab(target, to, to + hi - lo, dim), slab(source, lo, hi, dim))


def exchange(arr) -> None:
    """Fill the halo rows of distributed array ``arr`` from its neighbours' blocks."""
    if arr.halo == 0:
        return
    with on_gpu(arr.device):
        _exchange(arr)


def _exchange(arr) -> None:
    h = arr.halo
    m = arr.stop - arr.start
    local, dim = arr.local, arr.dim
    sent, received = [(h, 2 * h), (m, m + h)], [(0, h), (m + h, m + 2 * h)]
    gpu = None
    if isinstance(local, Buffer) and local.gpu_ordinals:
        # A coherent block whose sent rows are current on one of its GPU copies: they
        # leave through page-locked buffers, copied with one wait, and the rows received
        # go straight to that GPU's copy, where the next launch reads them (the host's
        # stay stale), as hand-written code does it. Else through its host copy.
        up, down, above, below = _staging(arr, (h, *local.shape[1:]), local.gpu_ordinals[0])
        gpu = local.rows_out(sent, [up, down])
    if gpu is None:
        up, down = (reading(local, lo, hi, dim) for lo, hi in sent)
        above, below = (writing(local, lo, hi, dim) for lo, hi in received)
    _swap(arr, up, down, above, below)
    if gpu is not None:
        local.rows_in(gpu, received, [above, below])


def _swap(arr, up, down, above, below) -> None:
    """Send ``up`` to the previous rank and ``down`` to the next; receive into ``above``
    from the previous rank and into ``below`` from the next (one rank is both)."""
    channel = arr.session.channel
    if channel.size == 1:  # periodic onto itself
        store(above, down)
        store(below, up)
        return
    prev, after = (channel.rank - 1) % channel.size, (channel.rank + 1) % channel.size
    batch = Transfers(channel)
    batch.recv(prev, tag(control.HALO_TAG, arr.serial, _DOWN), above)
    batch.recv(after, tag(control.HALO_TAG, arr.serial, _UP), below)
    batch.send(prev, tag(control.HALO_TAG, arr.serial, _UP), up)
    batch.send(after, tag(control.HALO_TAG, arr.serial, _DOWN), down)
    batch.run(f"halo exchange of {arr.name} with ranks {prev} and {after}")


def _staging(arr, shape: tuple, ordinal: int) -> tuple:
    """Four host arrays of ``shape`` (``arr``'s halo rows: sent up, sent down, received
    from above, from below), page-locked where CuPy runs; made once per array, with GPU
    ``ordinal`` (its block's) current: page-locking with another current would open a
    context on that GPU too."""
    if arr.staging is None:
        cupy = cupy_module()
        if cupy is not None:
            import cupyx

            with cupy.cuda.Device(ordinal):
                arr.staging = tuple(cupyx.empty_pinned(shape, arr.dtype) for _ in range(4))
        else:
            arr.staging = tuple(np.empty(shape, arr.dtype) for _ in range(4))
    return arr.staging


def move_rows(arr, old_bounds, new_bounds, storage) -> None:
    """Fill ``storage`` (laid out for ``new_bounds``) with ``arr``'s rows, receiving
    from their old owners what this rank did not own, sending what it gave away."""
    with on_gpu(arr.device):
        _move_rows(arr, old_bounds, new_bounds, storage)


def _move_rows(arr, old_bounds, new_bounds, storage) -> None:
    channel = arr.session.channel
    me, h, dim = channel.rank, arr.halo, arr.dim
    old, new = old_bounds[me], new_bounds[me]
    batch = Transfers(channel)
    for peer in range(channel.size):
        # what I keep or receive: my new rows that ``peer`` owned before
        lo, hi = max(new[0], old_bounds[peer][0]), min(new[1], old_bounds[peer][1])
        if lo < hi and peer == me:
            keep(storage, arr.local, lo - old[0] + h, hi - old[0] + h, lo - new[0] + h, dim)
        elif lo < hi:
            batch.recv(peer, tag(control.MOVE_TAG, arr.serial, MOVED),
                       writing(storage, lo - new[0] + h, hi - new[0] + h, dim))
        # what I give away: my old rows that ``peer`` owns now
        lo, hi = max(old[0], new_bounds[peer][0]), min(old[1], new_bounds[peer][1])
        if lo < hi and peer != me:
            batch.send(peer, tag(control.MOVE_TAG, arr.serial, MOVED),
                       reading(arr.local, lo - old[0] + h, hi - old[0] + h, dim))
    batch.run(f"moving rows of {arr.name} to the new partition")
