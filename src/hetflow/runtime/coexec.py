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
"""
from __future__ import annotations

import logging
import math
import threading

import numpy as np

from ..index import views as _views
from ..index.operators import section
from ..platform.cuda_compat import cuda_module
from . import cpu
from .gpu import launch_config
from .launch import SCALARS, Launch, bind, normalize_extent
from .perfmodel import PerfModel
from .report import RunReport
from ..trace.recorder import notify as trace_notify
from .steal import Worker, cpu_chunk_size, gpu_chunk_size, run_loop

log = logging.getLogger(__name__)

_last = threading.local()
_model_lock = threading.Lock()
_model: PerfModel | None = None


def last_report() -> RunReport | None:
    """The run report of this thread's last co-executed forall."""
    return getattr(_last, "report", None)


def perf_model() -> PerfModel:
    global _model
    with _model_lock:
        if _model is None or _model.path != PerfModel().path:
            _model = PerfModel()
        return _model


def _kernel_key(launch: Launch) -> str:
    return f"{launch.kernel.name}-{launch.kernel.source_hash[:12]}-{len(launch.extent)}d"


def _device_key(device) -> str:
    return f"{device.kind}:{device.name}:{device.arch}"


class GpuChunks:
    """A launch's data on one GPU, moved per chunk where the access pattern allows."""

    def __init__(self, launch: Launch):
        self.launch = launch
        self.device = launch.device
        self.cuda = cuda_module()
        plan = launch.plan
        data = plan.data
        with self._context():
            self.stream = self.cuda.stream()
            self.streamed_in, self.streamed_out, self.merged = [], [], []
            dev_args, host_seen = [], {}
            for name, arg in zip(data, launch.args):
                row_wise = (type(arg) is np.ndarray and name in plan.access.rows
                            and arg.flags.c_contiguous)
                if _views.is_view(arg):
                    root = arg.root
                    if id(root) not in host_seen:
                        host_seen[id(root)] = self.cuda.to_device(np.ascontiguousarray(root), stream=self.stream)
                    from ..index.lowering import lowering

                    dev_args.extend([host_seen[id(root)], *lowering(arg, f"{name}__p").params])
                    if plan.access.writes(name):
                        self.merged.append((arg, host_seen[id(root)]))
                elif isinstance(arg, np.ndarray):
                    if row_wise:  # allocated only; rows move with their chunk
                        dev = self.cuda.device_array(arg.shape, arg.dtype, stream=self.stream)
                        if plan.access.reads(name):
                            self.streamed_in.append((arg, dev))
                        if plan.access.writes(name):
                            self.streamed_out.append((arg, dev))
                    else:
                        dev = self.cuda.to_device(np.ascontiguousarray(arg), stream=self.stream)
                        if plan.access.writes(name):
                            self.merged.append((arg, dev))
                    dev_args.append(dev)
                else:
                    dev_args.append(arg)
            self.dev_args = tuple(dev_args)
            self.stream.synchronize()

    def _context(self):
        return self.cuda.gpus[self.device.ordinal]

    def run_chunk(self, lo: int, hi: int) -> None:
        with self._context():
            for host, dev in self.streamed_in:
                dev[lo:hi].copy_to_device(host[lo:hi], stream=self.stream)
            blocks, threads = launch_config(self.device, hi - lo, self.launch.inner)
            entry = self.launch.executable.entry[blocks, threads, self.stream]
            entry(lo, hi, *self.launch.inner, *self.dev_args)
            for host, dev in self.streamed_out:
                dev[lo:hi].copy_to_host(host[lo:hi], stream=self.stream)

    def sync(self) -> None:
        with self._context():
            self.stream.synchronize()

    def merge_back(self, ranges) -> None:
        """Copy the rows this GPU computed of every non-streamed written array home."""
        if not self.merged or not ranges:
            return
        with self._context():
            for target, dev in self.merged:
                result = dev.copy_to_host(stream=self.stream)
                self.stream.synchronize()
                for lo, hi in ranges:
                    _merge_rows(target, result, lo, hi)


def _merge_rows(target, result: np.ndarray, lo: int, hi: int) -> None:
    """target[rows lo:hi] = the same elements of ``result`` (a copy of target's root)."""
    if not _views.is_view(target):
        target[lo:hi] = result[lo:hi]
        return
    ext = tuple(target.extent)
    rows = section(target, (lo,) + (0,) * (len(ext) - 1), (hi - lo,) + ext[1:])
    idx = rows._root_index(np)
    target.root[idx] = result[idx]


def _cpu_workers(launch: Launch, rows: int, count: int) -> list[Worker]:
    cpu.compile_launch(launch)
    run = cpu.chunk_runner(launch)
    size = cpu_chunk_size(rows, count, minimum=max(1, 4096 // max(1, math.prod(launch.inner))))
    return [Worker(f"{launch.device.id}/core{k}", "cpu", run, size, launch.device.id) for k in range(count)]


def _gpu_worker(launch: Launch) -> tuple[Worker, GpuChunks]:
    chunks = GpuChunks(launch)
    dev = launch.device
    per_row = max(1, math.prod(launch.inner))
    # The simulator runs a launch as OS threads: few, large chunks keep tests quick.
    threads = 64 if dev.simulated else gpu_chunk_size(dev.compute_units, dev.simd_width, 32, waves=4)
    size = max(1, threads // per_row)
    worker = Worker(dev.id, "gpu", chunks.run_chunk, size, dev.id, inflight=2, sync=chunks.sync)
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


def co_executable(launch: Launch) -> bool:
    """May this launch be split over devices? Only if every written array is written at
    the launch index alone, so each device's rows are its own."""
    plan = launch.plan
    return all(name in plan.access.rows for k, name in enumerate(plan.data)
               if plan.access.writes(name))


def co_forall(extent, kernel, args, targets, *, schedule="steal", shares=None) -> RunReport:
    """Run one forall over every device of ``targets`` at once."""
    extent = normalize_extent(extent)
    rows = extent[0]
    launches = [bind(kernel, extent, args, dev) for dev in targets]
    if not co_executable(launches[0]):
        fastest = max(launches, key=lambda L: (L.device.kind == "gpu" and not L.device.simulated,
                                               L.device.compute_units))
        log.warning("kernel %s writes arrays at other indices than its launch index; running it "
                    "on %s alone", kernel.name, fastest.device.id)
        from .forall import run_on

        run_on(fastest)
        return None
    workers, gpu_parts = [], []
    # Each GPU's worker thread stages copies and launches: leave it a core of its own.
    n_gpus = sum(L.device.kind == "gpu" for L in launches)
    for launch in launches:
        if launch.device.kind == "cpu":
            workers += _cpu_workers(launch, rows, max(1, launch.device.compute_units - n_gpus))
        else:
            worker, chunks = _gpu_worker(launch)
            workers.append(worker)
            gpu_parts.append((worker, chunks))
    model = perf_model()
    key = _kernel_key(launches[0])
    device_keys = [_device_key(next(L.device for L in launches if L.device.id == w.device_id)) for w in workers]
    if shares is None:  # both schedules start from the predicted speed ratio
        shares = model.shares(key, device_keys)
    else:
        shares = _worker_shares(shares, targets, workers)
    report = run_loop(rows, workers, schedule=schedule, shares=shares)
    trace_notify(report, label=kernel.name)  # before merging back: the loop's end is now
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
    model.update(key, report, device_key=lambda stats: by_worker[stats.name])
    _last.report = report
    return report
