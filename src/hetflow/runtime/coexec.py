"""Co-execution: one forall run by the CPU cores and GPUs together (SPEC §3).

Each device gets its own executable of the kernel (the same source, compiled per
kind). The CPU contributes one worker per core, each running the ``nogil`` chunk
entry; each GPU one worker keeping chunks in flight on a CUDA stream. The workers
balance by work stealing (:mod:`hetflow.runtime.steal`), starting from shares that
the history-based performance model predicts.

Data on a GPU worker: arrays read or written only at the launch index (``x[i]``) move
per chunk, just the rows the GPU runs; every other array is copied to the GPU once.
After the loop, written arrays of the second kind are merged back row range by row
range, so each output element comes from the device that computed it.

Coherent arrays (:class:`hetflow.Buffer`) stay where they are: each device works on its
own copy, and before a chunk runs, the rows it reaches (:class:`Resident`) are made
current there; after the loop the rows each device wrote are current there alone. With
the same shares from one launch to the next, each device keeps its block of rows and
only the halo rows its views reach across the split, and the rows stolen, move.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time

import numpy as np

from ..index import views as _views
from ..index.lowering import lowering
from ..index.operators import section
from ..platform.cuda_compat import cuda_module
from . import cpu
from .gpu import FastEntry, core_stream, launch_rows
from .launch import SCALARS, Launch, bind, coherent, normalize_extent
from ..platform.repository import repository
from .perfmodel import device_key as _device_key, kernel_key as _kernel_key, perf_model
from .report import RunReport
from ..trace.recorder import notify as trace_notify
from .steal import Worker, cpu_chunk_size, gpu_chunk_size, run_loop

log = logging.getLogger(__name__)

_last = threading.local()


def last_report() -> RunReport | None:
    """The run report of this thread's last co-executed forall."""
    return getattr(_last, "report", None)


class GpuChunks:
    """A launch's data on one GPU, moved per chunk where the access pattern allows.

    Nothing moves at construction: ``setup`` runs in the GPU worker's thread while the
    CPU workers already compute. Arrays that cannot move per chunk are copied whole, in
    pieces of ``PIECE_BYTES``, and the GPU gives up as soon as the CPUs have finished the
    loop without it: a GPU whose copies take longer than the whole loop on the CPUs
    (a memory-bound stencil on host arrays) costs the loop at most one piece.
    """

    PIECE_BYTES = 8 << 20

    def __init__(self, launch: Launch, residents=()):
        self.launch = launch
        self.residents = residents
        self.staged_s = 0.0   # time spent making coherent arrays' rows current here
        self.device = launch.device
        self.cuda = cuda_module()
        self.stream = None
        self.streamed_in, self.streamed_out, self.merged = [], [], []
        self.dev_args = ()

    def _context(self):
        return self.cuda.gpus[self.device.ordinal]

    def setup(self, stopped=lambda: False) -> None:
        """Allocate and copy in what the chunks need (returns early once ``stopped()``)."""
        plan = self.launch.plan
        with self._context():
            self.stream = self.cuda.stream()
            self.core = None if self.device.simulated else core_stream(self.stream)
            dev_args, copies = [], {}

            def whole(host):  # one device copy per host array, shared by its views
                if stopped():
                    return None
                if id(host) not in copies:
                    copies[id(host)] = self._copy_in(host, stopped)
                return copies[id(host)]

            for name, arg in zip(plan.data, self.launch.args):
                root = _views.root_of(arg) if not isinstance(arg, SCALARS) else None
                if coherent(root):  # the Buffer's own copy here: rows move per chunk
                    dev = root.copy_on(self.device)
                    dev_args.extend([dev, *lowering(arg, f"{name}__p").params] if arg is not root else [dev])
                elif _views.is_view(arg):
                    dev = whole(arg.root)
                    if dev is None:
                        return
                    dev_args.extend([dev, *lowering(arg, f"{name}__p").params])
                    if plan.access.writes(name):
                        self.merged.append((arg, dev))
                elif isinstance(arg, np.ndarray):
                    if name in plan.access.rows and arg.flags.c_contiguous:
                        # allocated only: rows move with their chunk
                        dev = self.cuda.device_array(arg.shape, arg.dtype, stream=self.stream)
                        if plan.access.reads(name):
                            self.streamed_in.append((arg, dev))
                        if plan.access.writes(name):
                            self.streamed_out.append((arg, dev))
                    else:
                        dev = whole(arg)
                        if dev is None:
                            return
                        if plan.access.writes(name):
                            self.merged.append((arg, dev))
                    dev_args.append(dev)
                else:
                    dev_args.append(arg)
            self.dev_args = tuple(dev_args)
            # compile now, off the clock of the chunks: a first chunk that compiles would
            # teach the performance model a GPU a hundred times slower than it is
            FastEntry.of(self.launch, (0, 0, *self.launch.inner, *self.dev_args))

    def _copy_in(self, host, stopped):
        """A device copy of ``host``, made piece by piece; None if ``stopped()`` first."""
        host = np.ascontiguousarray(host)
        dev = self.cuda.device_array(host.shape, host.dtype, stream=self.stream)
        if host.ndim == 0 or host.nbytes <= self.PIECE_BYTES:
            dev.copy_to_device(host, stream=self.stream)
            self.stream.synchronize()
            return dev
        step = max(1, self.PIECE_BYTES * host.shape[0] // host.nbytes)
        for lo in range(0, host.shape[0], step):
            dev[lo:lo + step].copy_to_device(host[lo:lo + step], stream=self.stream)
            self.stream.synchronize()
            if stopped():
                return None
        return dev

    def run_chunk(self, lo: int, hi: int) -> None:
        if self.residents:
            began = time.perf_counter()
            for r in self.residents:
                r.buffer.acquire_rows(self.device, r.rows(lo, hi))
            self.staged_s += time.perf_counter() - began
        with self._context():
            for host, dev in self.streamed_in:
                dev[lo:hi].copy_to_device(host[lo:hi], stream=self.stream)
            launch_rows(self.launch, self.stream, lo, hi, self.dev_args, self.core)
            for host, dev in self.streamed_out:
                dev[lo:hi].copy_to_host(host[lo:hi], stream=self.stream)

    def sync(self) -> None:
        with self._context():
            self.stream.synchronize()

    def merge_back(self, ranges) -> None:
        """Copy home the rows this GPU computed of every written array copied whole:
        just those rows where they form a box of the array, else the whole copy."""
        if not self.merged or not ranges:
            return
        with self._context():
            for target, dev in self.merged:
                whole = None
                for lo, hi in _coalesce(ranges):
                    rows = _row_section(target, lo, hi)
                    home = target.root if _views.is_view(target) else target
                    box = rows.root_box() if _views.is_view(rows) else (slice(lo, hi),)
                    if box is not None:
                        part = dev[box[0]].copy_to_host(stream=self.stream)
                        self.stream.synchronize()
                        home[box] = part[(slice(None),) + box[1:]]
                        continue
                    if whole is None:
                        whole = dev.copy_to_host(stream=self.stream)
                        self.stream.synchronize()
                    idx = rows._root_index(np)
                    home[idx] = whole[idx]


def _coalesce(ranges):
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


@dataclasses.dataclass(frozen=True)
class Resident:
    """A coherent array that a co-executed launch touches through one argument."""

    buffer: object
    offset: int | None   # the root row a launch row reaches is row + offset; None: any row
    writes: bool

    def rows(self, lo: int, hi: int) -> list:
        """The root rows that launch rows ``[lo, hi)`` reach."""
        return [(lo + self.offset, hi + self.offset)] if self.offset is not None else self.buffer.all_rows


def residents(launch: Launch) -> list[Resident]:
    """The coherent arrays behind ``launch``'s arguments and the rows each chunk reaches:
    an argument indexed at the launch index alone reaches its own rows (a view: shifted
    by where its box starts in the root); any other reaches every row."""
    plan, found = launch.plan, []
    for name, arg in zip(plan.data, launch.args):
        root = _views.root_of(arg) if not isinstance(arg, SCALARS) else None
        if not coherent(root):
            continue
        offset = None
        if name in plan.access.rows:
            box = lowering(arg, f"{name}__p").box if arg is not root else (slice(0, None),)
            offset = box[0].start if box is not None else None
        found.append(Resident(root, offset, plan.access.writes(name)))
    return found


def _cpu_workers(launch: Launch, rows: int, count: int, held=()) -> list[Worker]:
    if held:  # the host copies of the coherent arrays; rows made current per chunk
        launch = dataclasses.replace(launch, entry_args=tuple(
            a.copy_on(launch.device) if coherent(a) else a for a in launch.entry_args))
    cpu.compile_launch(launch)
    run = cpu.chunk_runner(launch)
    if held:
        plain, device = run, launch.device

        def run(lo, hi):
            for r in held:
                r.buffer.acquire_rows(device, r.rows(lo, hi))
            plain(lo, hi)
    # A CPU chunk enters and leaves Python, taking the GIL, and 16 workers queue for it:
    # on a 16-core host, 5-row chunks of a 1024^2 stencil took 300 us for 5 us of work.
    # So a chunk holds at least what the runtime would run inline rather than spread.
    size = cpu_chunk_size(rows, count, minimum=cpu.least_rows(launch))
    return [Worker(f"{launch.device.id}/core{k}", "cpu", run, size, launch.device.id) for k in range(count)]


def _gpu_worker(launch: Launch, held=()) -> tuple[Worker, GpuChunks]:
    chunks = GpuChunks(launch, held)
    dev = launch.device
    per_row = max(1, math.prod(launch.inner))
    # The simulator runs a launch as OS threads: few, large chunks keep tests quick.
    threads = 64 if dev.simulated else gpu_chunk_size(dev.compute_units, dev.simd_width, 32, waves=4)
    size = max(1, threads // per_row)
    worker = Worker(dev.id, "gpu", chunks.run_chunk, size, dev.id, inflight=2, sync=chunks.sync,
                    setup=chunks.setup)
    return worker, chunks


def _worker_shares(shares, targets, workers) -> list[float]:
    """Per-device shares (one per target, in order) spread evenly over each device's workers."""
    from ..errors import ScheduleError

    shares = [float(s) for s in shares]
    if len(shares) != len(targets) or min(shares) < 0 or sum(shares) <= 0:
        raise ScheduleError(f"shares must be {len(targets)} non-negative numbers, one per device "
                            f"({', '.join(d.id for d in targets)}), not all zero; got {shares}")
    per_device = {d.id: s for d, s in zip(targets, shares)}
    counts = {d.id: sum(w.device_id == d.id for w in workers) for d in targets}
    return [per_device[w.device_id] / counts[w.device_id] for w in workers]


PROBE_EVERY = 32   # a kernel run alone is co-executed again every so often: speeds change
_launches_alone: dict[str, int] = {}


ALONE = "/alone"     # model entries of a device's rate running a whole launch by itself
TIME_GPU_EVERY = 8   # a GPU launch run alone is waited for (and timed) once in this many


def _alone(model, key, launches, counts, rows):
    """The launch to run alone instead of co-executing, when the history says one device
    finishes sooner than all of them together plus what co-execution costs beyond the
    work (a short memory-bound loop on a GPU: thread hand-offs outlast the loop); else None.
    A device's time alone comes from its launches alone: its rate in co-execution, in
    chunks, undersells a GPU that runs a whole launch at once; so each device runs one
    launch alone first, once co-execution has shown its cost."""
    rates = [model.throughput(key, _device_key(L.device)) for L in launches]
    overhead = model.overhead(key)
    if overhead is None or not all(rates):
        return None  # co-execute: that is how rates and overhead are learnt
    solo = [model.throughput(key, _device_key(L.device) + ALONE) for L in launches]
    if not all(solo):
        return launches[solo.index(None)]
    alone = [rows / r for r in solo]
    best = min(range(len(launches)), key=alone.__getitem__)
    together = rows / sum(r * c for r, c in zip(rates, counts)) + overhead
    if together < alone[best]:
        return None
    seen = _launches_alone[key] = _launches_alone.get(key, 0) + 1
    return None if seen % probe_interval(together, alone[best]) == 0 else launches[best]


def _run_alone(model, key, launch):
    """Run ``launch`` on its device alone and learn that device's rate alone: every time
    on a CPU, and on a GPU the first time and then once in ``TIME_GPU_EVERY`` launches
    (the timed launch waits for the GPU)."""
    from .forall import run_on

    name = _device_key(launch.device) + ALONE
    timed = (launch.device.kind == "cpu" or model.throughput(key, name) is None
             or _launches_alone.get(key, 0) % TIME_GPU_EVERY == 1)
    report = run_on(launch, wait=timed)
    if timed and report.wall_s > 0:
        model.observe(key, name, launch.extent[0] / report.wall_s)
    return report


def probe_interval(together: float, alone: float) -> int:
    """How many launches run alone between two co-executed ones (which measure again):
    seldom enough that probing costs a program about 5% of its time alone."""
    return max(PROBE_EVERY, int(20 * together / alone))


def _fastest(launches):
    return max(launches, key=lambda L: (L.device.kind == "gpu" and not L.device.simulated,
                                        L.device.compute_units))


def _mark_written(held, report, device_of) -> None:
    """The rows each device wrote are current on that device alone."""
    ran: dict = {}
    for e in report.events:
        ran.setdefault(device_of[e.worker], []).append((e.lo, e.hi))
    for r in held:
        if r.writes:
            for device, ranges in ran.items():
                rows = [p for lo, hi in _coalesce(ranges) for p in r.rows(lo, hi)]
                r.buffer.wrote_rows(device, rows)


def co_executable(launch: Launch) -> bool:
    """May this launch be split over devices? Only if every written array is written at
    the launch index alone, so each device's rows are its own."""
    return not _written_elsewhere(launch.plan)


def _written_elsewhere(plan) -> list:
    """Arrays the launch writes outside the rows of its launch index (scalars are never written)."""
    return [plan.data[k] for k in plan.written if plan.data[k] not in plan.access.rows]


def co_forall(extent, kernel, args, targets, *, schedule="steal", shares=None) -> RunReport:
    """Run one forall over every device of ``targets`` at once."""
    extent = normalize_extent(extent)
    rows = extent[0]
    launches = [bind(kernel, extent, args, dev) for dev in targets]
    if not co_executable(launches[0]):
        fastest, plan = _fastest(launches), launches[0].plan
        elsewhere = _written_elsewhere(plan)
        # Atomic updates are meant to land anywhere: only the devices' copies cannot be merged.
        level = logging.INFO if set(elsewhere) <= plan.access.atomic else logging.WARNING
        log.log(level, "kernel %s writes %s outside the rows of its launch index, so devices cannot "
                "split it; running it on %s alone", kernel.name, ", ".join(map(repr, elsewhere)),
                fastest.device.id)
        from .forall import run_on

        return run_on(fastest)
    held = residents(launches[0]) if launches[0].plan.buffers else []
    if any(r.writes and r.offset is None for r in held):  # written rows not known per chunk
        from .forall import run_on

        return run_on(_fastest(launches))
    # Each GPU's worker thread stages copies and launches: leave it a core of its own.
    n_gpus = sum(L.device.kind == "gpu" for L in launches)
    counts = [max(1, L.device.compute_units - n_gpus) if L.device.kind == "cpu" else 1 for L in launches]
    model = perf_model()
    key = _kernel_key(launches[0])
    if shares is None and schedule == "steal" and len(launches) > 1:
        alone = _alone(model, key, launches, counts, rows)
        if alone is not None:
            return _run_alone(model, key, alone)
    workers, gpu_parts = [], []
    for launch in launches:
        if launch.device.kind == "cpu":
            workers += _cpu_workers(launch, rows, counts[launches.index(launch)], held)
        else:
            worker, chunks = _gpu_worker(launch, held)
            workers.append(worker)
            gpu_parts.append((worker, chunks))
    device_keys = [_device_key(next(L.device for L in launches if L.device.id == w.device_id)) for w in workers]
    if shares is None:  # both schedules start from the predicted speed ratio
        shares = model.shares(key, device_keys)
    else:
        shares = _worker_shares(shares, targets, workers)
    report = run_loop(rows, workers, schedule=schedule, shares=shares)
    trace_notify(report, label=kernel.name)  # before merging back: the loop's end is now
    if held:
        _mark_written(held, report, {w.name: L.device for L in launches for w in workers
                                     if w.device_id == L.device.id})
    cpu_launch = next((L for L in launches if L.device.kind == "cpu"), None)
    for worker, chunks in gpu_parts:
        ranges = [(e.lo, e.hi) for e in report.events if e.worker == worker.name]
        try:
            chunks.merge_back(ranges)
        except Exception as exc:  # noqa: BLE001  the GPU died after computing: redo its rows
            if cpu_launch is None:
                raise
            log.warning("could not read results back from %s (%s); re-running its %d ranges on the CPU",
                        worker.device_id, exc, len(ranges))
            run = cpu.chunk_runner(cpu_launch)
            for lo, hi in ranges:
                run(lo, hi)
    by_worker = dict(zip((w.name for w in workers), device_keys))
    staged = {worker.name: chunks.staged_s for worker, chunks in gpu_parts if chunks.staged_s}
    model.update(key, report, device_key=lambda stats: None if stats.name in staged else by_worker[stats.name])
    for stats in report.workers:  # a GPU's rate without its copies: those count as overhead
        compute = stats.busy_s - staged.get(stats.name, 0.0)
        if stats.name in staged and not stats.failed and stats.indices and compute > 0:
            model.observe(key, by_worker[stats.name], stats.indices / compute)
    rate = sum(w.throughput for w in report.workers if not w.failed and w.indices > 0 and w.busy_s > 0)
    if rate > 0:
        model.observe_overhead(key, report.wall_s - rows / rate)
    _last.report = report
    return report
