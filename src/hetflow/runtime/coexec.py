"""Co-execution: one forall run by the CPU cores and GPUs together (SPEC §3).

Each device gets its own executable of the kernel (the same source, compiled per
kind). Each GPU contributes one worker keeping chunks in flight on a CUDA stream; a CPU
beside GPUs one worker for all its cores but one per GPU (a *team*: each of its chunks
runs over those cores at once through Numba's threading layer), and a CPU alone one
worker per core, each running the ``nogil`` chunk entry. The workers balance by work
stealing (:mod:`hetflow.runtime.steal`), starting from shares that the history-based
performance model predicts. Why a team beside GPUs: every worker is a Python thread
that takes the GIL around each chunk, and a GPU worker needs it for every chunk it
launches; beside 15 core workers (idle ones looking for work every 0.2 ms) its Python
ran 6-10x slower. On the H200 host, a loop the GPU alone ran in 25.3 ms took 26.9-27.1 ms
co-executed with the cores running 11.4% of it, 24.8-25.0 ms with the team (medians,
docs/performance.md). A CPU alone keeps one worker per core: there stealing between
cores evens out irregular rows (a team's chunk ends with its slowest piece). So does
checked mode (``boundscheck``), whose parallel pieces run on Python threads.

Data on a GPU worker: arrays read or written only at the launch index (``x[i]``) move
per chunk, just the rows the GPU runs; every other array is copied to the GPU once.
After the loop, written arrays of the second kind are merged back row range by row
range, so each output element comes from the device that computed it. Written arrays
are copied in too: a kernel that writes only where a condition holds leaves the other
elements as they were.

Faults: a GPU chunk's results *land* on the host only once the GPU finished it: its
rows come back into staging arrays and are copied home at ``sync``; whole copies merge
back after the loop, range by range, every written array of a range at once (a launch
with such an array merges all its written arrays so). A GPU that fails has exactly the
chunks whose results did not land re-run elsewhere, once; a failed merge re-runs on the
CPU just the ranges that did not come home. So ``out[i] = out[i] + 1`` applies once.

Coherent arrays (:class:`hetflow.Buffer`) stay where they are: each device works on its
own copy, and before a chunk runs, the rows it reaches (:class:`Resident`) are made
current there; after the loop the rows each device wrote are current there alone. With
the same shares from one launch to the next, each device keeps its block of rows and
only the halo rows its views reach across the split, and the rows stolen, move. A GPU
writes them in place, so a GPU that fails first waits for what it launched (those
chunks count as run); if even that fails, its unfinished chunks may have half-updated
the rows they read and write: those stop counting as current on the GPU and are re-run
from a copy where they still are, or, where there is none, the launch raises
DeviceError naming them (as it does when a failed merge would have to re-run rows
that only the GPU holds). After the loop a failed GPU's rows are copied home and its
copies no longer count. A launch the model runs on a GPU alone keeps this: if that GPU
fails, a CPU among the devices runs the rows whose results did not land
(:func:`_recover`).
"""
from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time

from ..errors import DeviceError
from ..index import views as _views
from ..index.lowering import lowering
from . import cpu
from .buffers import _minus, _union
from .gpu import Timing
from .launch import SCALARS, Launch, bind, coherent, host_arrays, is_device_array, normalize_extent
from .one_device import run_on
from .staging import GpuChunks, coalesce
from .perfmodel import device_key as _device_key, kernel_key as _kernel_key, perf_model
from .report import FailureRecord, LaunchReport, RunReport
from ..trace.recorder import notify as trace_notify
from .steal import Worker, cpu_chunk_size, gpu_chunk_size, run_loop

log = logging.getLogger(__name__)

_last = threading.local()


def last_report() -> RunReport | None:
    """The run report of this thread's last forall over several devices (a
    :class:`RunReport`, or a one-device report where it ran on one of them alone)."""
    return getattr(_last, "report", None)


@dataclasses.dataclass(frozen=True)
class Resident:
    """A coherent array that a co-executed launch touches through one argument."""

    buffer: object
    offset: int | None   # the root row a launch row reaches is row + offset; None: any row
    writes: bool
    reads: bool = True

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
        found.append(Resident(root, offset, plan.access.writes(name), plan.access.reads(name)))
    # a Buffer read through one argument and written through another is read and written
    read = {id(r.buffer) for r in found if r.reads}
    return [dataclasses.replace(r, reads=id(r.buffer) in read) for r in found]


def _cpu_runner(launch: Launch, held=(), team: int = 0, started=None):
    """``run(lo, hi)``: rows ``[lo, hi)`` of ``launch`` on the CPU, over the host copies
    of the coherent arrays (``launch`` as :func:`_on_host` made it), whose rows it makes
    current first, then lists in ``started`` (if given); on ``team`` cores at once where
    that is not 0 (:func:`hetflow.runtime.cpu.team_runner`)."""
    cpu.compile_launch(launch)
    run = cpu.team_runner(launch, team) if team else cpu.chunk_runner(launch)
    if not held:
        return run
    device = launch.device

    def run_held(lo, hi):
        for r in held:
            r.buffer.acquire_rows(device, r.rows(lo, hi))
        if started is not None:
            started.append((lo, hi))
        run(lo, hi)
    return run_held


def _on_host(launch: Launch, held) -> Launch:
    """``launch`` over the host copies of its coherent arrays (``held``), if it has any."""
    if not held:
        return launch
    return dataclasses.replace(launch, entry_args=tuple(
        a.copy_on(launch.device) if coherent(a) else a for a in launch.entry_args))


def _cpu_workers(launch: Launch, rows: int, count: int, held=(), started=None) -> list[Worker]:
    """One worker per core (``count`` of them): a CPU co-executing alone."""
    run = _cpu_runner(_on_host(launch, held), held, started=started)
    # A CPU chunk enters and leaves Python, taking the GIL, and 16 workers queue for it:
    # on a 16-core host, 5-row chunks of a 1024^2 stencil took 300 us for 5 us of work.
    # So a chunk holds at least what the runtime would run inline rather than spread.
    size = cpu_chunk_size(rows, count, minimum=cpu.least_rows(launch))
    return [Worker(f"{launch.device.id}/core{k}", "cpu", run, size, launch.device.id) for k in range(count)]


def _team_worker(launch: Launch, rows: int, cores: int, devices: int, held, compiled: list,
                 started=None) -> Worker:
    """A CPU's ``cores`` as one worker beside GPUs (module docstring); its model key is
    the CPU's with ``TEAM`` added. As many of them as its even share of the rows gives
    each ``least_rows``: with one, it runs the chunk entry alone. The parallel entry
    compiles in the worker's setup, in its own thread while the GPUs already run; the
    seconds that took go to ``compiled`` (not a cost of co-executing)."""
    least = cpu.least_rows(launch)
    threads = min(cores, rows // (devices * least))
    name, device = f"{launch.device.id}/cores", launch.device.id
    host = _on_host(launch, held)
    if threads <= 1:
        return Worker(name, "cpu", _cpu_runner(host, held, started=started),
                      cpu_chunk_size(rows, devices, minimum=least), device)

    def setup(stopped) -> None:
        began = time.perf_counter()
        cpu.compile_parallel(host)
        compiled.append(time.perf_counter() - began)
    # About 64 chunks of the CPU's even share of the loop, each of at least what the
    # runtime would run inline on each thread.
    size = cpu_chunk_size(rows, devices, minimum=threads * least)
    return Worker(name, "cpu", _cpu_runner(host, held, threads, started), size, device, setup=setup)


TEAM = "/cores"  # model entries of a CPU's rate as a team


GPU_WAVES = (16, 64)  # the fewest and most waves of a GPU's chunk (_gpu_worker)
GPU_CHUNKS = 16      # chunks of a whole launch, where those bounds allow


def _gpu_worker(launch: Launch, held=()) -> tuple[Worker, GpuChunks]:
    chunks = GpuChunks(launch, held)
    dev = launch.device
    per_row = max(1, math.prod(launch.inner))
    # The simulator runs a launch as OS threads: few, large chunks keep tests quick. On a
    # GPU, a sixteenth of the launch, from 16 to 64 waves: each chunk costs its worker
    # about 0.15 ms of Python (copies, launch, bookkeeping), for which it needs the GIL
    # that the cores' workers take too, while with host memory registered (hostpins) the
    # copies of 16 waves take only 0.4 ms (docs/performance.md).
    if dev.simulated:
        threads = 64
    else:
        wave = gpu_chunk_size(dev.compute_units, dev.simd_width, 32)
        threads = min(GPU_WAVES[1] * wave, max(GPU_WAVES[0] * wave, launch.extent[0] * per_row // GPU_CHUNKS))
    size = max(1, threads // per_row)
    worker = Worker(dev.id, "gpu", chunks.run_chunk, size, dev.id, inflight=chunks.INFLIGHT, sync=chunks.sync,
                    setup=chunks.setup, salvage=chunks.salvage, retire=chunks.retire)
    return worker, chunks


def _worker_shares(shares, targets, workers) -> list[float]:
    """Per-device shares (one per target, in order, as forall checked them) spread evenly
    over each device's workers."""
    per_device = {d.id: float(s) for d, s in zip(targets, shares)}
    counts = {d.id: sum(w.device_id == d.id for w in workers) for d in targets}
    return [per_device[w.device_id] / counts[w.device_id] for w in workers]


# A kernel that runs alone is co-executed again now and then, as speeds change
# (probe_interval): probing costs about PROBE_SHARE of a program's time alone, and comes
# at least once in PROBE_SECONDS of it.
PROBE_SHARE = 0.01
PROBE_SECONDS = 10.0
_launches_alone: dict[str, int] = {}  # kernel key -> launches alone since it last co-executed
_launches_together: dict[str, int] = {}  # kernel key -> co-executed since its fastest last ran alone
_retime: set = set()  # kernel keys whose next launch alone is timed (recheck_alone)
_probe_cost: dict[str, float] = {}    # kernel key -> wall time of its last co-executed launch


ALONE = "/alone"     # model entries of a device's rate running a whole launch by itself
STAGED = "/staged"   # the history of launches whose host arrays a GPU copies in and out
TIME_GPU_EVERY = 8   # a GPU launch run alone is waited for (and timed) once in this many


def _alone(model, key, targets, names, counts, rows):
    """The device to run the launch alone on instead of co-executing, when the history says
    it finishes sooner than all of them together plus what co-execution costs beyond the
    work (a short memory-bound loop on a GPU: thread hand-offs outlast the loop); else None.
    A GPU's time alone comes from its launches alone: its rate in co-execution, in
    chunks, undersells a GPU that runs a whole launch at once; so each GPU runs one
    launch alone first, once co-execution has shown its cost. A CPU's comes from its
    launches alone once it ran some, before that from its workers' rate together (running
    it alone just to learn would compile its whole-launch entry and take the CPU's time).
    A GPU that ran no rows co-executing (it compiled while the CPUs took them all) is
    measured alone too, and its rate alone stands in for the rate it has not shown."""
    estimate = _estimate(model, key, targets, names, counts, rows)
    if estimate is None:
        return None  # co-execute: that is how rates and overhead are learnt
    best, together, alone = estimate
    if together is None:
        return targets[best]  # a device whose rate alone must be measured
    if together < alone:
        return recheck_alone(key, targets[best], together, alone)
    seen = _launches_alone.get(key, 0) + 1
    if seen >= probe_interval(max(together, _probe_cost.get(key, 0.0)), alone):
        _launches_alone[key] = 0
        return None
    _launches_alone[key] = seen
    return targets[best]


_estimates: dict = {}  # (kernel key, worker keys, counts, rows) -> (model, its version, _estimate's answer)
ESTIMATES_KEPT = 1024  # (a loop of ever-changing extents must not grow it without end)


def _estimate(model, key, targets, names, counts, rows):
    """What :func:`_alone` reads from the model: None where it lacks the rates or the
    overhead to choose; ``(k, None, None)`` where device ``targets[k]`` must run alone to
    be measured; else ``(best, together, alone)``: the device fastest alone, the seconds
    co-executing would take (overhead included) and the seconds alone on it. Kept until
    the model changes: every launch asks, and the model changes once in several."""
    memo = (key, tuple(names), tuple(counts), rows)
    found = _estimates.get(memo)
    if found is not None and found[0] is model and found[1] == model.version:
        return found[2]
    version = model.version  # read first: a change meanwhile makes the next launch look again
    rates = model.throughputs(key, names)  # per worker: ``names`` are the workers' model keys
    overhead = model.overhead(key)
    answer = None
    if overhead is not None and all(r for d, r in zip(targets, rates) if d.kind == "cpu"):
        # A CPU alone runs as its workers do together: its rate in co-execution tells it. A
        # GPU alone must be measured (a launch that compiles there is timed again: _run_alone).
        solo = [s if s is not None or d.kind != "cpu" else r * c for d, s, r, c in
                zip(targets, model.throughputs(key, [_device_key(d) + ALONE for d in targets]), rates, counts)]
        if not all(solo):
            answer = solo.index(None), None, None
        else:
            rates = [r or s for r, s in zip(rates, solo)]
            alone = [rows / r for r in solo]
            best = min(range(len(targets)), key=alone.__getitem__)
            answer = best, rows / sum(r * c for r, c in zip(rates, counts)) + overhead, alone[best]
    if len(_estimates) >= ESTIMATES_KEPT:
        _estimates.clear()
    _estimates[memo] = (model, version, answer)
    return answer


def beyond_work(report, schedule: str) -> float | None:
    """Seconds a co-executed launch took beyond its work (None where no worker ran any):
    its wall time less the work's, which under stealing is every row at the workers'
    rates together, and under a static split the busiest worker's time. That split's
    imbalance is the split's (stealing evens it out), not a cost of co-executing: counted
    as one, a launch split badly by hand would teach the model to run the kernel alone."""
    running = [w for w in report.workers if not w.failed and w.indices > 0 and w.busy_s > 0]
    if not running:
        return None
    if schedule == "static":
        return report.wall_s - max(w.busy_s for w in running)
    return report.wall_s - report.n / sum(w.throughput for w in running)


_workers: dict = {}  # (kernel, targets, rank) -> _workers_of's answer


def _workers_of(kernel, targets: tuple, ndim: int) -> tuple:
    """``(GPUs, cores per device, team, workers per device, the workers' model keys)`` of
    a launch of ``kernel`` (rank ``ndim``) over ``targets``: worked out once, as every
    co-executed launch asks."""
    found = _workers.get((kernel, targets, ndim))
    if found is None:
        # Each GPU's worker thread stages copies and launches: leave it a core of its own.
        n_gpus = sum(d.kind == "gpu" for d in targets)
        cores = tuple(max(1, d.compute_units - n_gpus) if d.kind == "cpu" else 1 for d in targets)
        team = n_gpus > 0 and not kernel.boundscheck  # a CPU's cores as one worker (module docstring)
        counts = tuple(1 if team else c for c in cores)  # workers per device
        names = tuple(_device_key(d) + (TEAM if team and d.kind == "cpu" else "") for d in targets)
        if len(_workers) >= ESTIMATES_KEPT:
            _workers.clear()
        found = _workers[(kernel, targets, ndim)] = (n_gpus, cores, team, counts, names)
    return found


def history_key(kernel, ndim: int, args, n_gpus: int) -> str:
    """The model's key of a launch of ``kernel`` over ``args`` (rank ``ndim``) beside
    ``n_gpus`` GPUs: the kernel's own, apart for launches over host NumPy arrays, which a
    GPU copies in and out each time. A GPU's time alone there includes those copies,
    which data kept on it does not pay: one history for both would teach a program over
    coherent arrays that its GPU is slow alone (after a NumPy run of the same kernel), and
    it would co-execute for good."""
    key = _kernel_key(kernel, ndim)
    return key + STAGED if n_gpus and host_arrays(args) else key


def _compiles(launch) -> bool:
    """Whether running ``launch`` first compiles (or loads) its entry there: the first
    launch of its plan on that device, whose time teaches nothing of the device's speed."""
    plan = launch.plan
    return plan.fast_entry is False if launch.device.kind == "gpu" else not plan.compiled


def recheck_alone(key, device, together: float, alone: float):
    """None (co-execute), or now and then ``device``, the fastest alone, to run alone once
    and be timed again: a history that tells it slower alone than it is (timed while
    another program loaded it) would otherwise co-execute the kernel for good, never
    running it alone to learn otherwise. Rechecking costs at most ``PROBE_SHARE`` of the
    time co-executing where the history is right (a recheck costs ``alone - together``)."""
    seen = _launches_together.get(key, 0) + 1
    if seen * together * PROBE_SHARE < alone - together:
        _launches_together[key] = seen
        return None
    _launches_together[key] = 0
    _retime.add(key)
    return device


_timings: dict = {}  # kernel key -> (rows, gpu.Timing) of a GPU launch alone being timed


def _run_alone(model, key, launch):
    """Run ``launch`` on its device alone and learn that device's rate alone: every time
    on a CPU; on a GPU the first time (waiting for it) and then once in ``TIME_GPU_EVERY``
    launches, by CUDA events read at a later launch, so the host never waits. A launch
    that compiles its entry teaches nothing: the next one is timed instead."""
    name = _device_key(launch.device) + ALONE
    if launch.device.kind == "cpu" or model.throughput(key, name) is None or key in _retime:
        _retime.discard(key)
        compiles = _compiles(launch)  # (a GPU timed alone once, compiling, stayed "slow" for good)
        report = run_on(launch, wait=True)
        if report.wall_s > 0 and not compiles:
            model.observe(key, name, launch.extent[0] / report.wall_s)
        return report
    pending = _timings.get(key)
    if pending is not None:
        seconds = pending[1].seconds()
        if seconds is not None:
            del _timings[key]
            if seconds > 0:
                model.observe(key, name, pending[0] / seconds)
    if pending is not None or _launches_alone.get(key, 0) % TIME_GPU_EVERY != 1:
        return run_on(launch)
    timing = Timing(launch.device)
    report = run_on(launch)
    timing.stop()
    _timings[key] = (launch.extent[0], timing)
    return report


def _recover(launch, targets, exc: DeviceError):
    """After ``launch`` failed on the GPU the model ran it on alone: run the rows whose
    results did not reach the host (``exc.landed``) on a CPU among ``targets``, once,
    from the host copies; re-raise ``exc`` where that cannot be done exactly once (no
    CPU; device arrays that only that GPU holds; results that landed whole arrays at a
    time; rows written outside their own row)."""
    cpu_device = next((d for d in targets if d.kind == "cpu"), None)
    landed = getattr(exc, "landed", None)
    if cpu_device is None or landed is None or launch.device.kind != "gpu" \
            or any(is_device_array(_views.root_of(a)) for a in launch.args if not isinstance(a, SCALARS)):
        raise exc
    rows = launch.extent[0]
    redo = _minus([(0, rows)], coalesce(landed))
    held = residents(launch) if launch.plan.buffers else []
    if landed and (not co_executable(launch) or any(r.writes for r in held)):
        raise exc  # some results landed; the others are only re-run row by row with those
    gpu_device = launch.device
    for r in held:  # the launch may have half-updated them there: current elsewhere, or lost
        if r.writes:
            r.buffer.forget_rows(gpu_device, r.rows(0, rows))
    for buffer in {id(r.buffer): r.buffer for r in held}.values():
        buffer.forget(gpu_device)
    log.warning("%s; rows %s re-run on %s", exc, redo, cpu_device.id)
    cpu_launch = bind(launch.kernel, launch.extent, launch.args, cpu_device)
    if redo == [(0, rows)]:
        report = run_on(cpu_launch)
    else:
        began, run = time.perf_counter(), _cpu_runner(_on_host(cpu_launch, held), held)
        for lo, hi in redo:
            run(lo, hi)
        report = LaunchReport(sum(hi - lo for lo, hi in redo), cpu_device, time.perf_counter() - began)
    # the report says what happened: the GPU's failure, and the rows it handed over
    report.failures = [FailureRecord(gpu_device.id, gpu_device.id, repr(exc), 0.0, tuple(redo))]
    return report


def probe_interval(together: float, alone: float) -> int:
    """How many launches run alone between two co-executed ones (which measure again):
    seldom enough that probing costs a program ``PROBE_SHARE`` of its time alone, and
    often enough that a history gone wrong (a loaded machine) is corrected within
    ``PROBE_SECONDS``. ``together``: what a co-executed launch costs, the larger of the
    model's figure and the last one measured (on a memory-bound stencil, 300 times a
    launch alone on an H100, whose rows then cross the bus). A probe costs what it takes
    beyond the launch alone, which does the same work: where the two are close (one slow
    co-executed launch tipped the history), the next probe comes within a few launches."""
    return max(1, int(min((together - alone) / PROBE_SHARE, PROBE_SECONDS) / alone))


def _speed_rank(device):
    """Orders devices by expected speed: real GPUs first, then by compute units."""
    return device.kind == "gpu" and not device.simulated, device.compute_units


def fastest_device(devices):
    """The device expected to run a launch fastest alone: a real GPU, else the most units."""
    return max(devices, key=_speed_rank)


def _fastest(launches):
    return max(launches, key=lambda L: _speed_rank(L.device))


def _one_row_device(targets, extent):
    """The device for a launch of one row: a CPU for one index (sequential code runs
    on one GPU thread far slower), else the fastest device."""
    cpus = [d for d in targets if d.kind == "cpu"]
    if cpus and math.prod(extent) <= 1:
        return cpus[0]
    return fastest_device(targets)


def _mark_written(held, ran: dict) -> None:
    """The rows each device wrote (``ran``: device -> launch row ranges) are current on
    that device alone."""
    for r in held:
        if r.writes:
            for device, ranges in ran.items():
                rows = [p for lo, hi in coalesce(ranges) for p in r.rows(lo, hi)]
                r.buffer.wrote_rows(device, rows)


def _land(gpu_parts, report, cpu_launch, held, device_of) -> None:
    """After the loop: merge home what the GPUs computed, re-running on the CPU (once)
    the ranges whose results could not come home; then mark the coherent arrays' rows
    each device wrote, and bring home the rows of GPUs that failed (their copies no
    longer count)."""
    ran: dict = {}
    for e in report.events:
        ran.setdefault(device_of[e.worker], []).append((e.lo, e.hi))
    redo = []
    for worker, chunks in gpu_parts:
        ranges = [(e.lo, e.hi) for e in report.events if e.worker == worker.name]
        try:
            chunks.merge_back(ranges)
        except Exception as exc:  # noqa: BLE001  the GPU died after computing: redo the rest
            if cpu_launch is None or not chunks.merged:
                raise
            left = _minus(coalesce(ranges), coalesce(chunks.merged_home))
            log.warning("could not read results back from %s (%s); %d of its ranges are to re-run on the CPU",
                        worker.device_id, str(exc), len(left))
            redo += left
    lost = _not_redoable(held, redo, cpu_launch.device) if redo else None
    if redo and not lost:  # before the marks: the CPU takes rows still current on the host from there
        run = _cpu_runner(_on_host(cpu_launch, held), held)
        for lo, hi in redo:
            run(lo, hi)
        ran = {d: _minus(coalesce(r), coalesce(redo)) if d.kind == "gpu" else r for d, r in ran.items()}
        ran[cpu_launch.device] = ran.get(cpu_launch.device, []) + redo
    if held:
        _mark_written(held, ran)
    if lost:
        raise DeviceError(lost)
    failed = {f.device_id for f in report.failures}
    for worker, chunks in gpu_parts:
        if worker.device_id in failed:
            for buffer in {id(r.buffer): r.buffer for r in held}.values():
                buffer.forget(chunks.device)


def _settle(held, gpu_parts, cpu_device, cpu_started) -> None:
    """After a loop stopped by an exception (a kernel that raised, every worker failed):
    the rows each device started are current on that device alone, as its copy holds
    whatever the launch wrote there before it stopped, so that every device reads the
    same contents afterwards. A GPU that cannot finish its chunks keeps none of them."""
    started = {cpu_device: list(cpu_started)} if cpu_device is not None else {}
    for _, chunks in gpu_parts:
        try:
            chunks.sync()
        except Exception as exc:  # noqa: BLE001  the GPU is gone: its rows there no longer count
            log.warning("%s cannot finish the chunks it launched (%s)", chunks.device.id, str(exc))
            for r in held:
                if r.writes:
                    r.buffer.forget_rows(chunks.device, [p for lo, hi in chunks.started for p in r.rows(lo, hi)])
            continue
        started[chunks.device] = chunks.started
    _mark_written(held, started)


def _not_redoable(held, redo, cpu_device) -> str | None:
    """Why ``redo`` cannot be re-run on the CPU, if it cannot: that needs the rows it
    reads and writes of each coherent array as they were before the launch, on the host,
    not only on a GPU that updated them in place."""
    for r in held:
        stale = r.writes and r.reads and r.buffer.stale_rows(cpu_device, _union(
            [p for lo, hi in redo for p in r.rows(lo, hi)], []))
        if stale:
            return (f"cannot re-run rows {redo} on {cpu_device.id}: rows {stale} of {r.buffer!r} were "
                    f"updated in place on a GPU that failed before its other results came home")
    return None


def co_executable(launch: Launch) -> bool:
    """May this launch be split over devices? Only if every written array is written at
    the launch index alone, so each device's rows are its own (scalars are passed by
    value: no device's write can reach another)."""
    return not _written_elsewhere(launch.plan)


def _written_elsewhere(plan) -> list:
    """Arrays the launch writes outside the rows of its launch index (``plan.written``
    holds no scalar)."""
    return [plan.data[k] for k in plan.written if plan.data[k] not in plan.access.rows]


def co_forall(extent, kernel, args, targets, *, schedule="steal", shares=None):
    """Run one forall over every device of ``targets`` at once (or on one of them alone,
    where that is faster); its report is also this thread's :func:`last_report`."""
    report = _co_forall(extent, kernel, args, targets, schedule, shares)
    _last.report = report
    return report


def _co_forall(extent, kernel, args, targets, schedule, shares):
    extent = normalize_extent(extent)
    rows = extent[0]
    if rows <= 1:  # nothing to share out (a one-index launch of sequential code): one device
        return run_on(bind(kernel, extent, args, _one_row_device(targets, extent)))
    targets = tuple(targets)
    n_gpus, cores, team, counts, names = _workers_of(kernel, targets, len(extent))
    model = perf_model()
    key = history_key(kernel, len(extent), args, n_gpus)
    if shares is None and schedule == "steal" and len(targets) > 1:
        alone = _alone(model, key, targets, names, counts, rows)
        if alone is not None:  # decided before binding: the other devices' launches cost time
            launch = bind(kernel, extent, args, alone)
            try:
                return _run_alone(model, key, launch)
            except DeviceError as exc:
                return _recover(launch, targets, exc)
    began = time.perf_counter()
    launches = [bind(kernel, extent, args, dev) for dev in targets]
    if not co_executable(launches[0]):
        fastest, plan = _fastest(launches), launches[0].plan
        elsewhere = _written_elsewhere(plan)
        # Atomic updates are meant to land anywhere: only the devices' copies cannot be merged.
        level = logging.INFO if set(elsewhere) <= plan.access.atomic else logging.WARNING
        log.log(level, "kernel %s writes %s outside the rows of its launch index, so devices cannot "
                "split it; running it on %s alone", kernel.name, ", ".join(map(repr, elsewhere)),
                fastest.device.id)
        return run_on(fastest)
    held = residents(launches[0]) if launches[0].plan.buffers else []
    if any(r.writes and r.offset is None for r in held):  # written rows not known per chunk
        return run_on(_fastest(launches))
    workers, gpu_parts, compiled = [], [], []
    cpu_started = [] if any(r.writes for r in held) else None  # for _settle
    for launch, n in zip(launches, cores):
        if launch.device.kind == "gpu":
            worker, chunks = _gpu_worker(launch, held)
            workers.append(worker)
            gpu_parts.append((worker, chunks))
        elif team:
            workers.append(_team_worker(launch, rows, n, len(targets), held, compiled, cpu_started))
        else:
            workers += _cpu_workers(launch, rows, n, held, cpu_started)
    key_of = {L.device.id: name for L, name in zip(launches, names)}
    device_keys = [key_of[w.device_id] for w in workers]
    if shares is None:  # both schedules start from the predicted speed ratio
        shares = model.shares(key, device_keys)
    else:
        shares = _worker_shares(shares, targets, workers)
    cpu_launch = next((L for L in launches if L.device.kind == "cpu"), None)
    try:
        report = run_loop(rows, workers, schedule=schedule, shares=shares)
    except BaseException:
        if cpu_started is not None:
            _settle(held, gpu_parts, cpu_launch and cpu_launch.device, cpu_started)
        raise
    trace_notify(report, label=kernel.name)  # before merging back: the loop's end is now
    _land(gpu_parts, report, cpu_launch, held,
          {w.name: L.device for L in launches for w in workers if w.device_id == L.device.id})
    for worker, chunks in gpu_parts:
        if not report.by_name[worker.name].failed:
            chunks.release()
    by_worker = dict(zip((w.name for w in workers), device_keys))
    staged = {worker.name: chunks.staged_s for worker, chunks in gpu_parts if chunks.staged_s}
    model.update(key, report, device_key=lambda stats: None if stats.name in staged else by_worker[stats.name])
    for stats in report.workers:  # a GPU's rate without its copies: those count as overhead
        compute = stats.busy_s - staged.get(stats.name, 0.0)
        if stats.name in staged and not stats.failed and stats.indices and compute > 0:
            model.observe(key, by_worker[stats.name], stats.indices / compute)
    # a first launch compiles its GPU entry (and a team its parallel one) inside the loop:
    # not a cost of co-executing
    compiled = max([chunks.compile_s for _, chunks in gpu_parts] + compiled, default=0.0)
    beyond = beyond_work(report, schedule)
    if beyond is not None:
        model.observe_overhead(key, beyond - compiled)
    _probe_cost[key] = time.perf_counter() - began - compiled
    return report
