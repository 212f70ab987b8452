"""A launch's data on one GPU, staged from host arrays: moved per chunk where the access
pattern allows, else copied whole and merged back.

:class:`GpuChunks` serves a co-executed GPU worker (:mod:`hetflow.runtime.coexec`), one
chunk at a time, and a launch run whole on one GPU over host (NumPy) arrays
(:func:`run`: one chunk of every row). Device arrays (CuPy, Numba's, the simulator's)
and host arrays in CUDA managed memory are used in place; a coherent array's own GPU
copy is used with its rows made current per chunk (``residents``). Arguments over one
host memory share one GPU copy of it: a box of another argument's array is a part of
that one's copy; arrays that overlap otherwise (``a[::2]`` beside ``a``, ``a.T``,
``a[:-1]`` and ``a[1:]``) are strided views of one copy of the bytes they span, so that
what the kernel writes through one it reads through the others, as on the CPU (which
launches race there is for :mod:`hetflow.runtime.aliasing` to refuse, on every device).
"""
from __future__ import annotations

import logging
import threading
import time

import numpy as np

from ..index import views as _views
from ..index.managed import device_view
from ..index.operators import section
from ..cuda_compat import cuda_module, cupy_module
from ..errors import DeviceError, HetflowError, HostCopyWarning, warn_user
from . import gpu
from .gpu import FastEntry, device_pointer, entry_head, launch_rows, stream_pointer
from .hostpins import host_pins
from .launch import SCALARS, Launch, coherent, is_device_array, warn_scattered
from .steal import KERNEL_RAISED

log = logging.getLogger(__name__)

_TO_DEVICE, _TO_HOST = 1, 2  # cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost
# A launch run whole on one GPU over streamed host arrays runs in pieces of its rows: at
# most RUN_PIECES, each of at least PIECE_RUN_BYTES of its largest such array.
RUN_PIECES = 8
PIECE_RUN_BYTES = 16 << 20
# A shared copy of host bytes starts on the GPU at an address equal to theirs modulo this
# (CUDA allocations are aligned to it): each argument's elements keep their alignment.
SPAN_ALIGN = 256

# A NumPy argument this large that launches of one kernel copied to a GPU this many times
# earns a hint, once per process: hetflow.array would keep it there between launches.
HINT_BYTES = 16 << 20
HINT_COPIES = 3
_copies: dict = {}  # (kernel, parameter) -> launches that copied its NumPy array to a GPU
_hinted = threading.Event()


def hint_residency(launch: Launch, name: str, host: np.ndarray) -> None:
    """Count a copy of NumPy argument ``name`` to the launch's GPU; the third of a large
    one warns (HostCopyWarning), once per process."""
    if host.nbytes < HINT_BYTES or _hinted.is_set():
        return
    key = (launch.kernel.name, name)
    count = _copies[key] = _copies.get(key, 0) + 1
    if count >= HINT_COPIES and not _hinted.is_set():
        _hinted.set()
        warn_user(f"kernel {launch.kernel.name!r} argument {name!r}: {count} launches copied its "
                  f"{host.nbytes >> 20} MiB NumPy array to {launch.device.id}; hetflow.array(x) keeps "
                  f"it there between launches, moving only what changed", HostCopyWarning)


def run(launch: Launch) -> None:
    """Run a whole launch on its GPU: on device data only enqueued (:func:`gpu.run`);
    host arrays are copied in, and the written ones back, before it returns. A launch
    without an index does nothing (copying an empty strided array in fails)."""
    if 0 in launch.extent:
        return
    warn_scattered(launch)
    if not launch.device.simulated and not launch.plan.host_arrays:
        try:
            gpu.run(launch)
        except Exception as exc:  # nothing of it reaches the host
            raise_failure(launch, exc, [])
        return
    rows = launch.extent[0]
    chunks = GpuChunks(launch, pinned=False)  # staged copies to pageable memory are synchronous
    try:
        chunks.setup()
        # Rows that move per chunk go in pieces over the two streams: while one piece's
        # results copy home, the next one's rows copy in (on registered memory). A piece
        # costs about 0.1 ms of host time: pieces of less than PIECE_RUN_BYTES gain less.
        streamed = [host.nbytes for host, *_ in chunks.streamed_in + chunks.streamed_out]
        pieces = max(1, min(RUN_PIECES, rows, max(streamed, default=0) // PIECE_RUN_BYTES))
        for k in range(pieces):
            if len(chunks.pending) == chunks.INFLIGHT:
                chunks.retire()
            chunks.run_chunk(rows * k // pieces, rows * (k + 1) // pieces)
        chunks.sync()
        chunks.landed = None  # from here on, whole arrays land: what did is not known
        chunks.copy_back()
    except Exception as exc:
        raise_failure(launch, exc, chunks.landed)
    chunks.release()


def raise_failure(launch: Launch, exc: BaseException, landed):
    """Raise, for ``exc`` that stopped a launch on its GPU: the kernel's own exception
    (or another of hetflow's) as it is; else a DeviceError naming the device and kernel
    (``exc`` itself if it is one), whose ``landed`` lists the row ranges whose results
    reached the host (None: not known), so that another device can run the rest
    (:mod:`hetflow.runtime.coexec`). Called while ``exc`` is being handled."""
    if isinstance(exc, KERNEL_RAISED) or (isinstance(exc, HetflowError) and not isinstance(exc, DeviceError)):
        raise exc
    if isinstance(exc, DeviceError):
        exc.landed = landed
        raise exc
    err = DeviceError(f"{launch.device.id} failed running kernel {launch.kernel.name!r}: {exc!r}")
    err.landed = landed
    raise err from exc


class PinnedPool:
    """Page-locked host buffers kept between co-executed launches, per GPU and size (a
    power of two): a GPU worker stages ~50 MB through them, and allocating that costs
    milliseconds per launch."""

    LIMIT = 1 << 30  # bytes kept at most

    def __init__(self):
        self._free, self._bytes, self._lock = {}, 0, threading.Lock()

    def take(self, cuda, ordinal: int, nbytes: int):
        """A page-locked byte array of at least ``nbytes``."""
        size = 1 << max(0, nbytes - 1).bit_length()
        with self._lock:
            found = self._free.get((ordinal, size))
            if found:
                self._bytes -= size
                return found.pop()
        return cuda.pinned_array(size, np.uint8)

    def give(self, ordinal: int, buffers) -> None:
        with self._lock:
            for buf in buffers:
                if self._bytes + buf.nbytes <= self.LIMIT:
                    self._free.setdefault((ordinal, buf.nbytes), []).append(buf)
                    self._bytes += buf.nbytes


PINNED = PinnedPool()


class StreamPool:
    """CUDA streams kept between launches, per GPU: making one costs 0.1-1 ms of a
    launch's host time (measured on an H100 host), and a launch of a 25 ms loop made two."""

    KEEP = 8  # streams kept per GPU at most

    def __init__(self):
        self._free, self._lock = {}, threading.Lock()

    def take(self, cuda, ordinal: int):
        with self._lock:
            free = self._free.get(ordinal)
            if free:
                return free.pop()
        return cuda.stream()

    def give(self, ordinal: int, streams) -> None:
        with self._lock:
            free = self._free.setdefault(ordinal, [])
            free.extend(streams[:max(0, self.KEEP - len(free))])


STREAMS = StreamPool()


class GpuChunks:
    """A launch's data on one GPU, moved per chunk where the access pattern allows.

    Nothing moves at construction: ``setup`` runs in the GPU worker's thread while the
    CPU workers already compute. Arrays that cannot move per chunk are copied whole, in
    pieces of ``PIECE_BYTES``, and the GPU gives up as soon as the CPUs have finished the
    loop without it: a GPU whose copies take longer than the whole loop on the CPUs
    (a memory-bound stencil on host arrays) costs the loop at most one piece.
    """

    PIECE_BYTES = 8 << 20
    # Rows of a chunk of at least this size move through page-locked buffers, so that
    # the copies are asynchronous: a copy to pageable memory returns only once it is
    # done, after the chunk's kernel, and left the GPU idle between chunks.
    PINNED_BYTES = 1 << 20
    INFLIGHT = 4  # chunks a co-executing GPU worker keeps in flight (steal.Worker.retire)

    def __init__(self, launch: Launch, residents=(), pinned=True):
        self.inside = _containers(launch)
        self.shared = _shared(launch, self.inside)
        self.spans = {}       # (lo, hi) of host bytes several arguments share -> their GPU copy
        self.homes = {}       # memory of a merged home array -> the (lo, hi) of its shared copy
        self.launch = launch
        self.pinned = pinned
        self.residents = residents
        self.staged_s = 0.0   # time spent making coherent arrays' rows current here
        self.compile_s = 0.0  # time spent compiling the entry (not a cost of co-execution)
        self.device = launch.device
        self.cuda = cuda_module()
        self.pins = None if self.device.simulated else host_pins()
        self.stream = None
        self.lanes = []
        self.streamed_in, self.streamed_out, self.merged = [], [], []
        self.pending = []     # (lo, hi, [(host, staged rows)], done) in flight, oldest first
        self.launched = 0     # chunks launched: the lane and slot of the next one
        self._done = {}       # slot -> the CUDA event a chunk of that slot records when done
        self.merged_home = []  # ranges merge_back brought home
        self.landed = []      # ranges whose staged results were stored home (retire, sync)
        self.started = []     # ranges whose coherent rows were made current here to run
        self.dev_args = ()
        self.fast = False     # the FastEntry fitting dev_args (None: the dispatcher): setup
        self._pins = {}       # (direction, array, slot in flight) -> page-locked rows

    def _context(self):
        return self.cuda.gpus[self.device.ordinal]

    def setup(self, stopped=lambda: False) -> None:
        """Allocate and copy in what the chunks need (returns early once ``stopped()``)."""
        plan = self.launch.plan
        with self._context():
            self._add_lane()
            self.stream, self.pointer = self.lanes[0]  # setup's and the merge's copies
            dev_args, copies = [], {}

            def whole(host):  # one device copy per host array, shared by its views
                if stopped():
                    return None
                # a box of a larger argument's array: a part of that one's copy
                outer, box = self.inside.get(_memory(host), (host, None))
                key = _memory(outer)
                if key not in copies:
                    bounds = self.shared.get(key)
                    copies[key] = self._copy_in(outer, stopped) if bounds is None else \
                        self._shared_copy(outer, bounds, stopped)
                dev = copies[key]
                return dev if dev is None or box is None else dev[box]

            def merge(name, arg, dev):  # a written array copied whole: merged back after the loop
                bounds = self.shared.get(_memory(self._outer(arg)))
                if bounds is not None:
                    # only what the launch touches: the rest of a row may be another argument's
                    # elements, which another device computed (co-executed)
                    if name in plan.access.aligned:
                        arg = _launched(arg, self.launch.extent)
                    self.homes[_memory(_views.root_of(arg))] = bounds
                self.merged.append((arg, dev))

            streamed = _streamed(plan, self.launch.args)
            for k, (name, arg) in enumerate(zip(plan.data, self.launch.args)):
                root = _views.root_of(arg) if not isinstance(arg, SCALARS) else None
                if coherent(root):  # the Buffer's own copy here: rows move per chunk
                    dev = root.copy_on(self.device)
                    dev_args.extend(self.launch.view_arguments(k, dev) if arg is not root else [dev])
                elif _views.is_view(arg) and _in_place(arg.root) is not None:
                    dev_args.extend(self.launch.view_arguments(k, _in_place(arg.root)))
                elif _views.is_view(arg):
                    hint_residency(self.launch, name, arg.root)
                    dev = whole(arg.root)
                    if dev is None:
                        return
                    dev_args.extend(self.launch.view_arguments(k, dev))
                    if plan.access.writes(name):
                        merge(name, arg, dev)
                elif _in_place(arg) is not None:
                    dev_args.append(_in_place(arg))
                elif isinstance(arg, np.ndarray):
                    hint_residency(self.launch, name, arg)
                    if name in streamed:
                        # allocated only: rows move with their chunk, written ones both
                        # ways (what the kernel leaves alone must come back unchanged),
                        # unless the kernel overwrites all of them
                        dev = self._empty(arg.shape, arg.dtype)
                        overwritten = _overwritten(plan.access, name, arg, self.launch.extent)
                        if not overwritten:
                            self.streamed_in.append((arg, dev))
                        if plan.access.writes(name):
                            self.streamed_out.append((arg, dev, overwritten))
                    else:
                        dev = whole(arg)
                        if dev is None:
                            return
                        if plan.access.writes(name):
                            merge(name, arg, dev)
                    dev_args.append(dev)
                else:
                    dev_args.append(arg)
            self.dev_args = tuple(dev_args)
            # compile now, off the clock of the chunks: a first chunk that compiles would
            # teach the performance model a GPU a hundred times slower than it is
            began = time.perf_counter()
            self.fast = FastEntry.fitting(self.launch, entry_head(self.launch, 0, 0), self.dev_args)
            self.compile_s = time.perf_counter() - began

    def _copy_in(self, host, stopped):
        """A device copy of ``host``, made piece by piece; None if ``stopped()`` first."""
        contiguous = np.ascontiguousarray(host)
        dev = self._empty(contiguous.shape, contiguous.dtype)
        # a temporary copy is not worth registering
        return dev if self._fill(dev, contiguous, contiguous is host, stopped) else None

    def _fill(self, dev, host, lent: bool, stopped) -> bool:
        """Copy contiguous ``host`` into ``dev`` piece by piece (straight from its memory
        where ``lent``, the caller's own); False if ``stopped()`` first."""
        if host.ndim == 0 or host.nbytes <= self.PIECE_BYTES:
            if not (lent and self._direct(host, dev, host, True, self.pointer)):
                dev.copy_to_device(host, stream=self.stream)
            self.stream.synchronize()
            return True
        step = max(1, self.PIECE_BYTES * host.shape[0] // host.nbytes)
        for lo in range(0, host.shape[0], step):
            rows = host[lo:lo + step]
            if not (lent and self._direct(host, dev, rows, True, self.pointer)):
                dev[lo:lo + step].copy_to_device(rows, stream=self.stream)
            self.stream.synchronize()
            if stopped():
                return False
        return True

    def _shared_copy(self, host, bounds, stopped):
        """``host``'s view of the one GPU copy of host bytes ``bounds`` that it shares with
        other arguments' arrays (copied for the first of them); None if ``stopped()``
        first."""
        span = self.spans.get(bounds)
        if span is None:
            lo, hi = bounds
            pad = lo % SPAN_ALIGN
            span = self._empty((pad + hi - lo,), np.uint8)[pad:]
            if not self._fill(span, _host_bytes(host, lo, hi), True, stopped):
                return None
            self.spans[bounds] = span
        offset = _address(host) - bounds[0]
        if self.device.simulated:  # the simulator's device array wraps a NumPy one
            return type(span)(np.ndarray(host.shape, host.dtype, span._ary, offset, host.strides))
        return self.cuda.cudadrv.devicearray.DeviceNDArray(
            host.shape, host.strides, host.dtype, gpu_data=span.gpu_data.view(offset))

    def _shared_home(self, home, bounds, fetched):
        """``home``'s elements as the GPU's shared copy of host bytes ``bounds`` holds
        them, copied home once per ``fetched`` (bounds -> the bytes)."""
        if bounds not in fetched:
            fetched[bounds] = self.spans[bounds].copy_to_host(stream=self.stream)
            self.stream.synchronize()
        return _layout(home, fetched[bounds], bounds[0])

    def _outer(self, arg):
        """The host array whose GPU copy (or part of a shared one) ``arg`` works on."""
        host = _views.root_of(arg)
        return self.inside.get(_memory(host), (host, None))[0]

    def _empty(self, shape, dtype):
        """A device array of ``shape`` and ``dtype`` on this GPU: from CuPy's memory pool
        where CuPy is there, whose blocks come back for the next launch (and the user's
        CuPy arrays) instead of the driver allocating a GiB again, which took 0.3-3.7 ms
        of each launch on an H100 host; else (or for records) numba-cuda's own."""
        cupy = None if self.device.simulated else cupy_module()
        try:
            if cupy is None or np.dtype(dtype).kind not in "biufc":  # CuPy has no records
                return self.cuda.device_array(shape, dtype, stream=self.stream)
            with cupy.cuda.Device(self.device.ordinal):
                owner = cupy.empty(shape, dtype)
        except Exception as exc:  # the allocator's own (CuPy's OutOfMemoryError, a driver error)
            nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            raise DeviceError(f"{self.device.id}: cannot allocate {nbytes} bytes for the copy of a "
                              f"{dtype} array of shape {tuple(shape)} that kernel "
                              f"{self.launch.kernel.name!r} needs there: {exc}") from exc
        # numba-cuda's view for its copies, keeping the CuPy array alive; nothing was
        # enqueued on the array yet, so no stream to wait for
        return self.cuda.as_cuda_array(owner, sync=False)

    def run_chunk(self, lo: int, hi: int) -> None:
        """Launch rows ``[lo, hi)``. Streamed rows move straight between the GPU and
        host memory registered for it (:mod:`hetflow.runtime.hostpins`), else through
        page-locked staging arrays. Results come back into staging arrays, copied home
        at :meth:`sync` (they land once the GPU finished), except those of an array the
        kernel overwrites without reading: re-running such rows elsewhere after a
        failure writes them again, so they may land as soon as they are copied."""
        if self.residents:
            began = time.perf_counter()
            for r in self.residents:
                r.buffer.acquire_rows(self.device, r.rows(lo, hi))
            self.started.append((lo, hi))
            self.staged_s += time.perf_counter() - began
        # A slot's pinned buffers and event are free again once its last chunk retired:
        # at most INFLIGHT chunks are in flight.
        slot = self.launched % self.INFLIGHT
        with self._context():
            if self.pending and len(self.lanes) == 1:
                self._add_lane()
            stream, pointer = self.lanes[self.launched % len(self.lanes)]
            self.launched += 1
            for k, (host, dev) in enumerate(self.streamed_in):
                rows = host[lo:hi]
                if self._direct(host, dev, rows, True, pointer):
                    continue
                pinned = self._pinned(("in", k, slot), rows)
                if pinned is not None:
                    pinned[...] = rows
                    rows = pinned
                dev[lo:hi].copy_to_device(rows, stream=stream)
            launch_rows(self.launch, stream, lo, hi, self.dev_args, pointer, self.fast)
            staged = []
            for k, (host, dev, overwritten) in enumerate(self.streamed_out):
                rows = host[lo:hi]
                if not (overwritten and self._direct(host, dev, rows, False, pointer)):
                    pinned = self._pinned(("out", k, slot), rows)
                    staged.append((host, dev[lo:hi].copy_to_host(pinned, stream=stream)))
            done = self._done.get(slot)
            if done is None:
                # (without timing: cheaper to record; the simulator's take no options)
                done = self._done[slot] = self.cuda.event() if self.device.simulated else \
                    self.cuda.event(timing=False)
            done.record(stream)
        self.pending.append((lo, hi, staged, done))

    def _add_lane(self) -> None:
        """Another stream for chunks: they alternate between two, so that one chunk's
        results copy home while the next one's rows copy in (the bus moves both ways
        at once). The second is made when a second chunk is in flight: a launch run as
        one chunk, each step of the demo, would pay for it in vain."""
        stream = STREAMS.take(self.cuda, self.device.ordinal)
        self.lanes.append((stream, None if self.device.simulated else stream_pointer(stream)))

    def _direct(self, host, dev, rows, to_device: bool, pointer) -> bool:
        """Enqueue on stream ``pointer`` the copy of ``rows`` of host array ``host`` to
        (or from) the same rows of its GPU copy ``dev`` (same layout) straight from
        (into) their memory, registered for it; False, with nothing enqueued, where it
        cannot be registered."""
        spans = self.pins.segments(rows) if self.pins is not None else None
        if spans is None:
            return False
        memcpy, offset = self.pins.memcpy, device_pointer(dev) - host.ctypes.data
        for address, nbytes in spans:  # one copy per registration: the driver refuses more
            if to_device:
                memcpy(address + offset, address, nbytes, _TO_DEVICE, pointer)
            else:
                memcpy(address, address + offset, nbytes, _TO_HOST, pointer)
        return True

    def _pinned(self, key, like):
        """A page-locked array shaped as ``like`` (rows of a streamed array), kept under
        ``key`` and grown as needed; None below ``PINNED_BYTES``."""
        if not self.pinned or like.nbytes < self.PINNED_BYTES:
            return None
        raw = self._pins.get(key)
        if raw is None or raw.nbytes < like.nbytes:
            if raw is not None:
                PINNED.give(self.device.ordinal, [raw])
            raw = self._pins[key] = PINNED.take(self.cuda, self.device.ordinal, like.nbytes)
        return raw[:like.nbytes].view(like.dtype).reshape(like.shape)

    def release(self) -> None:
        """Give the page-locked buffers and the streams back for later launches (after
        a clean loop: a failed GPU's copies into them may still be under way)."""
        PINNED.give(self.device.ordinal, self._pins.values())
        self._pins.clear()
        STREAMS.give(self.device.ordinal, [stream for stream, _ in self.lanes])
        self.lanes = []

    def sync(self) -> None:
        """Wait for the chunks in flight, then land their results."""
        with self._context():
            for stream, _ in self.lanes:
                stream.synchronize()
        for lo, hi, staged, _ in self.pending:
            _land(lo, hi, staged)
            self.landed.append((lo, hi))
        self.pending.clear()

    def retire(self) -> None:
        """Wait for the oldest chunk in flight, then land its results: the others keep
        the bus and the GPU busy meanwhile (waiting for all of them at once left both
        idle until the next chunks were launched)."""
        lo, hi, staged, done = self.pending[0]
        with self._context():
            done.synchronize()
        _land(lo, hi, staged)
        self.landed.append((lo, hi))
        del self.pending[0]

    def salvage(self) -> int:
        """After a failure: how many of the chunks in flight landed all the same (the
        stream still completes them). When it does not, the rows those chunks read and
        wrote of a coherent array may hold half-applied updates here: they stop counting
        as current on this GPU, and if they are current nowhere else they are lost
        (DeviceError)."""
        ran = len(self.pending)
        try:
            self.sync()
            return ran
        except Exception as exc:  # noqa: BLE001  the device is gone: nothing it did lands
            log.warning("%s cannot finish the chunks it launched (%s)", self.device.id, str(exc))
        for r in self.residents:
            if r.writes and r.reads:
                rows = [p for lo, hi, *_ in self.pending for p in r.rows(lo, hi)]
                r.buffer.forget_rows(self.device, rows)
        self.pending.clear()
        return 0

    def merge_back(self, ranges) -> None:
        """Copy home the rows this GPU computed of every written array copied whole:
        just those rows where they form a box of the array, else the whole copy. A range
        lands whole or not at all (every array's rows are fetched before any is stored);
        ``merged_home`` lists the ranges that landed."""
        if not self.merged or not ranges:
            return
        wholes = {}
        with self._context():
            for lo, hi in coalesce(ranges):
                parts = [self._fetch(target, dev, lo, hi, wholes) for target, dev in self.merged]
                for home, idx, values in parts:
                    home[idx] = values
                self.merged_home.append((lo, hi))

    def copy_back(self) -> None:
        """Copy home every written array copied whole, all of it (a launch run whole may
        write any of its rows, not only those of its launch indices)."""
        done, fetched = set(), {}
        with self._context():
            for target, dev in self.merged:
                home = _views.root_of(target)
                bounds = self.homes.get(_memory(home))
                if bounds is not None:
                    home[...] = self._shared_home(home, bounds, fetched)
                elif id(dev) not in done:
                    done.add(id(dev))
                    home[...] = dev.copy_to_host(stream=self.stream)
            self.stream.synchronize()

    def _fetch(self, target, dev, lo, hi, wholes):
        """(home array, index, values) of rows ``[lo, hi)`` of ``target`` on this GPU."""
        rows = _row_section(target, lo, hi)
        home = _views.root_of(target)
        box = rows.root_box() if _views.is_view(rows) else (slice(lo, hi),)
        bounds = self.homes.get(_memory(home))
        if bounds is not None:
            idx = box if box is not None else rows._root_index(np)
            return home, idx, self._shared_home(home, bounds, wholes)[idx]
        if box is not None:
            part = dev[box[0]].copy_to_host(stream=self.stream)
            self.stream.synchronize()
            return home, box, part[(slice(None),) + box[1:]]
        if id(dev) not in wholes:
            wholes[id(dev)] = dev.copy_to_host(stream=self.stream)
            self.stream.synchronize()
        idx = rows._root_index(np)
        return home, idx, wholes[id(dev)][idx]


def _land(lo: int, hi: int, staged) -> None:
    """Store a finished chunk's staged rows ``[lo, hi)`` home."""
    for host, rows in staged:
        host[lo:hi] = rows


def _in_place(array):
    """What the GPU works on in place for ``array``: a device array itself, a host array
    in CUDA managed memory through its device view; None for a host array to copy."""
    if is_device_array(array):
        return array
    return device_view(array) if isinstance(array, np.ndarray) else None


def _hosts(plan, args) -> list:
    """(name, host array) of each argument the GPU works on a copy of: a plain NumPy
    array, or the root of a view of one (managed memory and coherent arrays excluded)."""
    found = []
    for name, arg in zip(plan.data, args):
        host = arg.root if _views.is_view(arg) else arg
        if type(host) is np.ndarray and _in_place(host) is None:
            found.append((name, host))
    return found


def _memory(host: np.ndarray) -> tuple:
    """Host arrays equal in this (address, shape, strides, element type) are one array,
    however many arguments pass it: they share one GPU copy."""
    return host.__array_interface__["data"][0], host.shape, host.strides, host.dtype.str


def _aliased(plan, args) -> set:
    """Arguments whose host memory another argument's may share: copied whole, one GPU
    copy per array (a row moved per chunk into a copy of its own would not see, through
    one name, what the kernel wrote through the other)."""
    hosts = _hosts(plan, args)
    return {name for k, (name, host) in enumerate(hosts)
            for other, h in hosts[:k] + hosts[k + 1:] if np.may_share_memory(host, h)}


def _containers(launch: Launch) -> dict:
    """{memory of a host array: (a larger one, the box of it that the first is)} for each
    argument's array that is a box of another's (``a[1:-1]`` beside ``interior(a, 1)``):
    the GPU works on a part of the larger one's copy there."""
    hosts = _hosts(launch.plan, launch.args)
    arrays = sorted({_memory(h): h for _, h in hosts}.values(), key=lambda h: -h.nbytes)
    inside = {}
    for k, inner in enumerate(arrays):
        found = next(((outer, box) for outer in arrays[:k] if (box := _box(inner, outer)) is not None), None)
        if found is not None:
            inside[_memory(inner)] = found
    return inside


def _shared(launch: Launch, inside: dict) -> dict:
    """{memory of a host array: the bytes ``(lo, hi)`` of host memory whose one GPU copy
    it is a view of} for the arrays (boxes resolved by ``inside``) of arguments that share
    an element with another's otherwise, where the kernel writes one of the two
    (``a[:-1]`` and ``a[1:]``, ``a.T`` and ``a``): two copies of the shared elements would
    not see each other's writes. Such arrays are joined into groups; a group's bytes run
    from its lowest to its highest byte (overlapping arrays span no gap)."""
    plan = launch.plan
    hosts = _hosts(plan, launch.args)
    outers = {}  # memory -> the array whose copy its argument works on
    for _, host in hosts:
        outer = inside.get(_memory(host), (host, None))[0]
        outers[_memory(host)] = outer
    group = {}   # memory of an outer array -> the outer arrays of its group (one list per group)
    for k, (name, host) in enumerate(hosts):
        for other, h in hosts[:k]:
            a, b = outers[_memory(host)], outers[_memory(h)]
            if (plan.access.writes(name) or plan.access.writes(other)) and _memory(a) != _memory(b) \
                    and _overlap(host, h):
                ga, gb = group.get(_memory(a), [a]), group.get(_memory(b), [b])
                if ga is not gb:
                    ga.extend(gb)
                    for x in ga:
                        group[_memory(x)] = ga
    shared = {}
    for members in {id(g): g for g in group.values()}.values():
        bounds = [_bounds(x) for x in members]
        span = (min(lo for lo, _ in bounds), max(hi for _, hi in bounds))
        shared.update((_memory(x), span) for x in members)
    return shared


def _bounds(a: np.ndarray) -> tuple:
    """The host bytes ``[lo, hi)`` from ``a``'s lowest element to the end of its highest."""
    reach = [(n - 1) * s for n, s in zip(a.shape, a.strides)]
    start = _address(a)
    return start + sum(r for r in reach if r < 0), start + sum(r for r in reach if r > 0) + a.itemsize


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


class _Bytes:
    """Host bytes ``[lo, hi)`` of ``owner``'s memory, read-only, for ``np.asarray`` (the
    array made keeps this alive, and this ``owner``)."""

    def __init__(self, owner: np.ndarray, lo: int, hi: int):
        self.owner = owner
        self.__array_interface__ = {"data": (lo, True), "shape": (hi - lo,), "typestr": "|u1", "version": 3}


def _host_bytes(owner: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """A byte array of host memory ``[lo, hi)``, a part of ``owner``'s memory."""
    return np.asarray(_Bytes(owner, lo, hi))


def _layout(host: np.ndarray, copy: np.ndarray, lo: int) -> np.ndarray:
    """``host``'s elements in ``copy``, a copy of the host bytes from address ``lo``."""
    return np.ndarray(host.shape, host.dtype, copy, _address(host) - lo, host.strides)


def _launched(arg, extent: tuple):
    """The part of ``arg`` (touched only as ``x[i, j, ..., more]``) that a launch over
    ``extent`` touches: a plain array's first ``len(extent)`` axes cut to the extent's (a
    view's extent is the launch's there)."""
    if _views.is_view(arg) or arg.shape[:len(extent)] == tuple(extent):
        return arg
    return arg[tuple(slice(0, e) for e in extent)]


def _box(inner: np.ndarray, outer: np.ndarray):
    """Slices of ``outer`` that give ``inner`` (the same elements in the same layout), or
    None."""
    if inner.dtype != outer.dtype or inner.strides != outer.strides or not np.may_share_memory(inner, outer):
        return None
    offset = inner.__array_interface__["data"][0] - outer.__array_interface__["data"][0]
    starts = [0] * outer.ndim
    for axis in sorted(range(outer.ndim), key=lambda a: -outer.strides[a]):
        if outer.strides[axis] > 0:
            starts[axis], offset = divmod(offset, outer.strides[axis])
    box = tuple(slice(s, s + n) for s, n in zip(starts, inner.shape))
    if offset != 0 or min(starts, default=0) < 0:
        return None
    return box if _memory(outer[box]) == _memory(inner) else None


def _overlap(a: np.ndarray, b: np.ndarray) -> bool:
    """Do ``a`` and ``b`` share an element (exactly: ``a[::2]`` and ``a[1::2]`` do not)?"""
    try:
        return bool(np.shares_memory(a, b, max_work=1 << 16))
    except np.exceptions.TooHardError:  # undecided: as if they did
        return True


def _streamed(plan, args) -> set:
    """The plain arrays that move per chunk: C-contiguous ones touched only in their own
    row, whose memory no other argument shares. If some written argument is copied whole
    instead, none that is written moves per chunk, so that all written arrays of a range
    land together (at the merge)."""
    aliased = _aliased(plan, args)
    rowwise = {name for name, arg in zip(plan.data, args) if isinstance(arg, np.ndarray)
               and name in plan.access.rows and arg.flags.c_contiguous and _in_place(arg) is None
               and name not in aliased}
    whole = {name for name, arg in zip(plan.data, args) if name not in rowwise and (
        isinstance(arg, np.ndarray) and _in_place(arg) is None
        or _views.is_view(arg) and not coherent(_views.root_of(arg)) and _in_place(arg.root) is None)}
    if any(plan.access.writes(name) for name in whole):
        return {name for name in rowwise if not plan.access.writes(name)}
    return rowwise


def _overwritten(access, name: str, arg, extent: tuple) -> bool:
    """Does the launch overwrite every element of ``arg`` in the rows it runs, without
    reading it (``out[i] = ...`` at the top of the kernel; see ``Access.covered``)? Then
    its rows need not be copied in. Not where a row is wider than the launch's (an
    ``(n, m + 2)`` array of an ``(n, m)`` launch): its other columns must come back as
    they were."""
    return name in access.covered and not access.reads(name) and tuple(arg.shape[1:]) == tuple(extent[1:])


def coalesce(ranges):
    """Sorted ``(lo, hi)`` ranges with touching neighbours joined."""
    out = []
    for lo, hi in sorted(ranges):
        if out and out[-1][1] == lo:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def _row_section(target, lo: int, hi: int):
    """Rows ``[lo, hi)`` of ``target`` (a view of them, or the plain array's slice)."""
    if not _views.is_view(target):
        return target[lo:hi]
    ext = tuple(target.extent)
    return section(target, (lo,) + (0,) * (len(ext) - 1), (hi - lo,) + ext[1:])
