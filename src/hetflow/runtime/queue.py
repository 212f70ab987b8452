"""Execution queues (SPEC §2 "Execution queue").

``queue.enqueue(kernel, extent, *args)`` checks and binds the launch (every argument
error is raised right there), creates an *execution instance* — kernel, global size
(the extent), priority, the events it waits for; block/thread counts are chosen for
the device it lands on — and returns its :class:`~hetflow.runtime.events.Event` at
once. Dependencies are explicit (``wait_for``) and implicit, inferred from the data
(:mod:`~hetflow.runtime.deps`). When they are met the scheduler places the instance on
a device of the queue's context (:mod:`~hetflow.runtime.scheduler`), possibly split
over several, and that device's worker threads run it.

Failures: a kernel that raises marks its event ``'failed'`` with an
:class:`~hetflow.errors.EventFailedError` naming kernel and event; what depends on it
is ``'cancelled'`` (:class:`~hetflow.errors.EventFailedError`); unrelated work
goes on. ``finish()`` waits for everything, then raises the first failure nobody
retrieved through ``wait``/``exception`` (or a cancellation that a failure nobody
retrieved caused in another queue). A fault of hetflow's own while settling an
instance fails that instance the same way (``_Core.salvage_locked``) instead of stopping
the thread that ran it and leaving everything after it waiting.

Kernel objects: the runtime keeps a record per kernel (its label and access modes)
until :func:`release`; released while instances are pending, the kernel lives on
in those instances until the last of them is done, then goes (its launch plans live on
the kernel object itself).

The hot path is short on purpose: one bind and one lock acquisition per enqueue; a
worker completes an instance, releases its dependents and takes its next entry under
one lock acquisition, and runs a dependent it released itself without waking anyone.
A ready CPU instance predicted tiny (under ``RUN_HERE_S`` by one of its plan's last two
timed runs: see ``_tiny``) runs in the enqueuing thread when no other instance is ready
on its device, as Cilk runs a spawned task at once: handing a few microseconds of work
to a worker costs more than the work (a wake-up and the GIL handed over twice), and with
nothing ready before it no instance is overtaken. It may run beside the device's worker:
it is serial and short. ``enqueue`` then returns its event settled; everything else
(failures, dependents, profiles) is as on a worker. One that waits for nothing at all
(no ``wait_for``, no unfinished access to its data: ``deps.clear_locked``) runs while
the enqueuing thread holds LOCK, so that nothing can come to depend on it meanwhile:
completed, it leaves nothing for the dependency tracking to record and forget, which was
a fifth of a task's cost in a chain or a fan-out (a tiny run holds the lock about as
long as settling an instance does). When instances are ready, the
enqueuing thread helps the worker instead: it runs the first of them if that one is
tiny, so that a worker that fell behind once does not keep every later instance waiting.
A prediction that misses (a kernel whose time depends on a scalar argument) holds the
enqueuing thread for up to two runs, and where they waited for nothing the lock too (other
threads' enqueues and settling wait meanwhile); their times send the next ones to a worker.
"""
from __future__ import annotations

import inspect
import math
import numbers
import queue as stdqueue
import threading
import time
import weakref
from heapq import heappop, nsmallest
from time import perf_counter

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError, EventFailedError, HetflowTimeoutError, KernelError
from ..kernels.kernel import Kernel
from ..platform.context import Context
from ..platform.devices import Device
from . import coexec, cpu, gpu, staging, status
from .buffers import Buffer, acquired, wrote
from .deps import (READ, WRITE, check_cycle_locked, clear_locked, depend_locked, drop_locked, track_locked,
                   unpoison_locked, untrack_locked)
from .events import (COMPLETE, FAILED, LOCK, RUNNING, Event, UserEvent, failed_error, locked,
                     release_locked, settle_locked, start_locked, timeout_seconds)
from .forall import holding_gpu
from .launch import bind, is_device_array, normalize_extent
from .scheduler import Lane, Scheduler

# A ready CPU instance predicted (``_tiny``) to take less than this runs in the enqueuing
# thread (module docstring): less than what handing it to a worker costs. On the H200
# host a worker that ran some 400 of a fan-out's 10,000 one-index instances doubled the
# fan-out's time (the two threads wait for each other's GIL): about 250 us an instance
# moved. At 20 us, the fan-out's root instance, run once per 10,000 and so from a cold
# cache (20-50 us), went to the worker and took the instances waiting for it along.
RUN_HERE_S = 50e-6

# -- kernel objects ----------------------------------------------------------------------
class _KernelRecord:
    """What the runtime keeps per kernel: its label and access modes per launch rank."""

    __slots__ = ("kernel", "label", "modes")

    def __init__(self, kernel: Kernel):
        self.kernel = kernel
        self.label = f"kernel {kernel.name!r}"
        self.modes: dict[int, tuple] = {}

    def learn(self, launch) -> tuple:
        """READ/WRITE masks of the data parameters for ``launch``'s rank."""
        ndim = len(launch.extent)
        access = launch.plan.access
        names = self.kernel.params[ndim:]
        modes = tuple((READ if access.reads(p) else 0) | (WRITE if access.writes(p) else 0) for p in names)
        self.modes[ndim] = modes
        return modes


_kernels: dict[int, _KernelRecord] = {}  # by id(kernel): a C-level hash (the record keeps it)
_released: "weakref.WeakSet[Kernel]" = weakref.WeakSet()


def _register(kernel) -> _KernelRecord:
    if not isinstance(kernel, Kernel):
        raise ArgumentTypeError(f"{kernel!r} is not a hetflow kernel; decorate it with @hetflow.kernel")
    if kernel in _released:
        raise KernelError(f"kernel {kernel.name!r} was released; it cannot be enqueued any more")
    with LOCK:
        return _kernels.setdefault(id(kernel), _KernelRecord(kernel))


def release(kernel: Kernel) -> None:
    """Release a kernel object: no new instances; the runtime drops it from its tables
    at once (pending instances keep the kernel until they are done)."""
    if not isinstance(kernel, Kernel):
        raise ArgumentTypeError(f"{kernel!r} is not a hetflow kernel")
    with LOCK:
        if kernel in _released:
            raise KernelError(f"kernel {kernel.name!r} was already released")
        _released.add(kernel)
        _kernels.pop(id(kernel), None)  # pending instances keep the kernel alive (their launch)


# -- execution instances ------------------------------------------------------------------
class Instance(Event):
    """One enqueued launch — what runs, where it may run, what it waits for — and the
    event that stands for it (one object: a runtime with thousands of pending instances
    is bound by Python's per-object costs)."""

    __slots__ = ("core", "launch", "modes", "priority", "pending", "doomed", "held", "poisons", "lanes",
                 "pinned", "splittable", "buffers")

    def __init__(self, core, label, launch, modes, priority, lanes, pinned, buffers):
        Event.__init__(self, label)  # not super(): one object fewer per enqueue
        self.core = core
        self.launch = launch     # bound for the home device (lanes[0]); its args as given
        self.modes = modes       # READ/WRITE mask per data argument
        self.priority = priority
        self.pending = 0         # dependencies not yet met
        self.doomed = None       # its error, if it depends strongly on a failure: cancelled
                                 # instead of run once it waits for nothing else
        self.held = None         # data it lets go of when done (deps.track_locked)
        self.poisons = None      # failed: keys of the records of the data it poisons (deps.untrack_locked)
        self.lanes = lanes       # where it may run, home first
        self.pinned = pinned
        self.buffers = buffers   # positions of Buffer arguments, or None
        self.splittable = False

    def _retire_locked(self, status: str) -> None:
        """Done (or cancelled): counts, let data and kernel go."""
        core = self.core
        if core is None:
            return
        if status is not COMPLETE:
            core.failed_locked(self)
        if self.held is not None:  # before the launch goes: its arguments keep the data alive
            self.poisons = untrack_locked(self, status is COMPLETE)
        if self.submitted is None:
            core.deferred.discard(self)
        self.core = self.launch = None
        core.outstanding.discard(self)
        if not core.outstanding:
            core.idle_locked()

    def _reported_locked(self) -> None:
        """Its failure was reported: the data it poisoned forget it (deps.unpoison_locked)."""
        self._retrieved = True
        if self.poisons is not None:
            unpoison_locked(self, self.poisons)
            self.poisons = None


# -- the runtime state behind a queue ---------------------------------------------------
class _Core:
    """Lanes, counters and worker threads of one queue (kept apart from :class:`Queue`
    so that a queue nobody references can be collected and its workers stopped)."""

    def __init__(self, context: Context, slots, thresholds: dict, run_here: bool = True):
        self.context = context  # one reference of it is ours, released at close
        self.run_here_ok = run_here  # tiny instances may run in the enqueuing thread
        devices = context.devices
        if not devices:
            raise ArgumentError(f"{context!r} has no devices to run on")
        if isinstance(slots, dict) and set(slots) - {d.id for d in devices}:
            raise ArgumentError(f"slots name devices outside the queue's context: "
                                f"{', '.join(sorted(set(slots) - {d.id for d in devices}))}")
        self.lanes = [Lane(d, _slots(d, slots)) for d in devices]
        self.scheduler = Scheduler(self.lanes, **thresholds)
        self.single = self.lanes[0] if len(self.lanes) == 1 else None
        self.home = (self.single,) if self.single else None  # the lanes of every instance, if one
        # Where an instance goes once its dependencies are met (one device: no choice).
        self.ready_locked = self.single.push_locked if self.single else self.scheduler.place_locked
        # Instances enqueued and not yet done (a set, not a count: finish's timeout names them).
        self.outstanding: set[Instance] = set()
        self.deferred: set[Instance] = set()
        self.failures: list[Event] = []  # failures and cancellations finish() may report
        self.prune_failures_at = 32
        self.closed = False
        self.idle_cond = threading.Condition(LOCK)
        self.finishing = 0  # threads in finish(), waiting on idle_cond
        for lane in self.lanes:
            for k in range(lane.slots):
                t = threading.Thread(target=self.work, args=(lane,), daemon=True,
                                     name=f"hetflow-queue-{lane.device.id}-{k}")
                lane.threads.append(t)
                t.start()

    # -- routing (enqueue time) ---------------------------------------------------------
    def route(self, extent, args, device) -> tuple[tuple, bool]:
        sched = self.scheduler
        explicit = None
        if device is not None:
            explicit = sched.lane(_device_id(device))
            if explicit is None:
                raise ArgumentError(f"device {device!r} is not in this queue's context "
                                    f"({', '.join(lane.device.id for lane in self.lanes)})")
        on_gpu = None
        for pos, a in enumerate(args):
            root = a if type(a) is np.ndarray or is_device_array(a) else getattr(a, "root", None)
            if is_device_array(root):
                if explicit is not None and explicit.cpu:
                    raise ArgumentError(f"argument {pos} is a GPU array: it cannot run on {explicit.device.id}")
                holder = holding_gpu(root)  # (an explicit GPU that is not its holder: enqueue raises)
                on_gpu = explicit or (sched.lane(holder.id) if holder is not None else None)
                if on_gpu is None:
                    raise ArgumentError(f"argument {pos} is an array in the memory of "
                                        f"{holder.id if holder else 'a GPU'}, which is not in this queue's "
                                        f"context ({', '.join(lane.device.id for lane in self.lanes)})")
                break
        work = 1
        for e in normalize_extent(extent):
            work *= e
        return sched.route(work, on_gpu, explicit)

    # -- state changes (caller holds LOCK) --------------------------------------------
    def idle_locked(self) -> None:
        """Nothing is outstanding: wake finish(), and the workers of a closed queue."""
        if self.finishing:  # (notify_all costs microseconds: an idle queue is common)
            self.idle_cond.notify_all()
        if self.closed:
            self._wake_all_locked()

    def _wake_all_locked(self) -> None:
        for lane in self.lanes:
            lane.idle = 0
            lane.cond.notify_all()

    def failed_locked(self, event: Event) -> None:
        """Keep ``event``, failed or cancelled, for ``finish`` to report. Whenever the list
        doubles, those already reported through ``wait``/``exception`` go (finish has
        nothing left to do with them): a program that waits on each event and never calls
        finish must not keep every failed instance as long as the queue lives."""
        failures = self.failures
        failures.append(event)
        if len(failures) >= self.prune_failures_at:
            failures[:] = [e for e in failures if not e._retrieved]
            self.prune_failures_at = max(32, 2 * len(failures))

    def done_locked(self, lane: Lane, inst: Instance, split, error, shape) -> None:
        """``inst`` ran on ``lane`` (``ended`` set), or over the ``split`` lanes: record
        where and how, settle its event."""
        if split is None:
            inst.device = lane.device.id
            inst.blocks, inst.threads = shape
            if error is None:  # the common case: settle_locked(inst, COMPLETE, None) and
                inst.status = COMPLETE  # Instance._retire_locked, inlined
                if inst._waiter is not None:
                    inst._waiter.set()
                if inst.held is not None:  # before the launch goes: it keeps the data alive
                    untrack_locked(inst, True)
                inst.core = inst.launch = None
                self.outstanding.discard(inst)
                if not self.outstanding:
                    self.idle_locked()
                if inst._needs is not None or inst._after is not None:
                    release_locked(inst)
                return
        else:
            for other in split:
                if other is not lane:
                    other.running -= 1
            inst.device = tuple(other.device.id for other in split)
            inst.parts = shape
        if error is None:
            settle_locked(inst, COMPLETE, None)
        else:
            settle_locked(inst, FAILED, failed_error(inst, inst.device, error))

    def salvage_locked(self, lane: Lane, inst: Instance, exc: Exception) -> None:
        """Settling ``inst`` raised ``exc``: a fault in hetflow itself, not in the kernel.
        However far settling got, the instance ends failed (its data's state is unknown:
        what reads it is cancelled until the failure is reported), it no longer counts as
        outstanding and its dependents are released, so that nothing waits for it forever
        and ``finish()`` raises the fault; the thread goes on. (A fault that strikes again
        in this retirement or release still stops the thread.)"""
        error = EventFailedError(f"{inst} ran on {lane.device.id}, but hetflow failed to settle it: "
                                 f"{type(exc).__name__}: {exc}")
        error.__cause__ = exc
        inst.status, inst._error = FAILED, error
        if inst._waiter is not None:
            inst._waiter.set()
        if inst.core is not None:  # not retired yet: retired now, as failed (its data poisoned)
            inst._retire_locked(FAILED)
        elif inst not in self.failures:  # retired as complete
            self.failed_locked(inst)
        if inst._needs is not None or inst._after is not None:
            release_locked(inst)

    # -- workers ------------------------------------------------------------------------
    def work(self, lane: Lane) -> None:
        """A worker slot of ``lane``: take the best ready entry, run it, repeat."""
        heap, ready, splits, device = lane.heap, lane.ready, lane.splits, lane.device
        done_locked, execute, run_on_cpu = self.done_locked, self.execute, _run_on_cpu
        cores = device.compute_units if lane.cpu else 0  # 0: not a CPU, run through execute()
        inst = split = error = shape = ended = None
        LOCK.acquire()
        try:
            while True:
                if inst is not None:
                    lane.running -= 1
                    lane.claims = 1  # we take one of the entries this releases ourselves
                    inst.ended = ended
                    try:
                        done_locked(lane, inst, split, error, shape)
                    except Exception as exc:  # noqa: BLE001  (a fault of hetflow's, not the kernel's)
                        self.salvage_locked(lane, inst, exc)
                    lane.claims = 0
                    # Idle, hold no failure: its traceback's frames hold the launch's arrays.
                    inst = error = None
                while not heap:
                    if self.closed and not self.outstanding:
                        return
                    lane.idle += 1
                    lane.cond.wait()
                key = heappop(heap)  # the best ready entry (Lane.push_locked)
                inst = ready.pop(key)
                split = splits.pop(key, None) if splits else None
                inst.status, inst.started = RUNNING, perf_counter()
                lane.running += 1
                if split is not None:
                    for other in split:
                        if other is not lane:
                            other.running += 1
                LOCK.release()
                try:
                    if cores and split is None and inst.buffers is None and inst.launch.device is device:
                        error, shape, ended = run_on_cpu(inst.launch, cores)  # execute()'s common case
                    else:
                        error, shape = execute(lane, inst, split)
                        ended = perf_counter()
                finally:
                    LOCK.acquire()
        finally:
            LOCK.release()

    def execute(self, lane: Lane, inst: Instance, split) -> tuple:
        """Run an instance on ``lane``'s device, or co-executed over the ``split`` lanes:
        (error, (blocks, threads) or the split's parts)."""
        try:
            launch = inst.launch
            if split is not None:
                return None, _co_execute(launch, [other.device for other in split])
            device = lane.device
            buffers = inst.buffers
            if buffers is not None:
                launch = _with_buffers(inst, device)
            elif launch.device is not device:
                launch = bind(launch.kernel, launch.extent, launch.args, device)
            if lane.cpu:  # a CPU launch counts its row pieces as blocks of one thread
                shape = len(cpu.run(launch, device.compute_units)), 1
            else:
                staging.run(launch)
                shape = gpu.launch_shape(launch, launch.extent[0])
            if buffers is not None:
                wrote(launch, [k for k in buffers if inst.modes[k] & WRITE])
            return None, shape
        except Exception as exc:  # noqa: BLE001  (any kernel failure becomes the event's)
            return exc, (None, None)

    def run_here(self, lane: Lane, inst: Instance) -> None:
        """Run ``inst``, marked running on ``lane`` (a CPU), in this thread, then settle it
        as a worker would (module docstring)."""
        try:
            error, shape, ended = _run_on_cpu(inst.launch, lane.device.compute_units)
        except BaseException as exc:  # Ctrl-C: the instance fails (nothing waits for it forever)
            error, shape, ended = exc, (None, None), perf_counter()
            raise
        finally:
            with LOCK:
                lane.running -= 1
                inst.ended = ended
                try:
                    self.done_locked(lane, inst, None, error, shape)
                except Exception as exc:  # noqa: BLE001  (a fault of hetflow's, not the kernel's)
                    self.salvage_locked(lane, inst, exc)

    def run_now_locked(self, lane: Lane, inst: Instance, args, keys) -> Instance:
        """Run ``inst``, tiny and waiting for nothing, in this thread while holding LOCK,
        and settle it (module docstring); ``keys``: from :func:`clear_locked`. Holding
        the lock, nothing can come to depend on it meanwhile, so completed it leaves no
        trace in the data's records; failed, it is tracked and settled as a worker would."""
        inst.submitted, inst.started = inst.queued, perf_counter()
        try:
            error, shape, ended = _run_on_cpu(inst.launch, lane.device.compute_units)
        except BaseException as exc:  # Ctrl-C: the instance fails (its data may be half written)
            self._settle_now_locked(lane, inst, args, keys, exc, (None, None), perf_counter())
            raise
        self._settle_now_locked(lane, inst, args, keys, error, shape, ended)
        return inst

    def _settle_now_locked(self, lane: Lane, inst: Instance, args, keys, error, shape, ended) -> None:
        inst.ended = ended
        tracked = False
        try:
            if error is None:
                drop_locked(keys)
                inst.status, inst.device = COMPLETE, lane.device.id
                inst.blocks, inst.threads = shape
                inst.core = inst.launch = None
                return
            track_locked(inst, args, inst.modes)  # as if it had been tracked, then run
            self.outstanding.add(inst)
            tracked = True
            self.done_locked(lane, inst, None, error, shape)
        except Exception as exc:  # noqa: BLE001  (a fault of hetflow's, not the kernel's)
            if not tracked:  # its data's state is unknown: tracked, to be poisoned
                track_locked(inst, args, inst.modes)
                self.outstanding.add(inst)
            self.salvage_locked(lane, inst, exc)

    def _submit_locked(self, inst: Instance, now: float) -> None:
        """A deferred instance may start once its dependencies are over."""
        inst.submitted = now
        self.deferred.discard(inst)
        if inst.pending == 0:
            start_locked(inst)

    def close(self) -> None:
        """No more enqueues; cancel never-submitted deferred instances; workers stop once
        everything else is done. Idempotent."""
        with LOCK:
            if self.closed:
                return
            self.closed = True
            for inst in list(self.deferred):
                if inst.doomed is None:
                    inst.doomed = EventFailedError(f"{inst} was enqueued with defer=True and never "
                                                   f"submitted before its queue closed")
                self._submit_locked(inst, time.perf_counter())
            if not self.outstanding:
                self._wake_all_locked()
        self.context.release_if_alive()  # the application may have released our reference too


def _device_id(device) -> str:
    """The id of one device named by ``device``, an id or a Device (one lane: no list)."""
    if isinstance(device, Device):
        return device.id
    if isinstance(device, str):
        return device
    raise ArgumentTypeError(f"device must be one device's id or a Device; got {type(device).__name__} "
                            f"{device!r}")


def _slots(device: Device, slots) -> int:
    if isinstance(slots, dict):
        n = slots.get(device.id)
    else:
        n = slots
    if n is None:
        # One slot per device: a large CPU launch already uses every core (cpu.run), and
        # small ones hold the GIL most of their time, so a second CPU worker mostly adds
        # GIL hand-offs between workers.
        return 1
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ArgumentError(f"slots for {device.id} must be a positive int, got {n!r}")
    return int(n)


def _with_buffers(inst: Instance, device):
    """The launch of ``inst`` on ``device`` with each Buffer's copy there made current."""
    launch = inst.launch
    if launch.device is not device:
        launch = bind(launch.kernel, launch.extent, launch.args, device)
    return acquired(launch)


def _co_execute(launch, devices) -> tuple:
    """Run a launch over several devices by work stealing; the rows each device ran:
    ``((device id, lo, hi), ...)``, in the order they finished."""
    report = coexec.co_forall(launch.extent, launch.kernel, launch.args, devices)
    by_worker = {w.name: w.device_id for w in report.workers}
    return tuple((by_worker[e.worker], e.lo, e.hi) for e in sorted(report.events, key=lambda e: e.t_end))


# -- closing queues nobody references -------------------------------------------------------
# A queue that dies in a reference cycle is finalised by the cyclic garbage collector,
# which may run in any thread, also in a worker that holds LOCK (or a context's lock):
# the finaliser must take no lock. It only hands the core to this closer thread
# (SimpleQueue.put is safe in finalisers), which closes it with no lock held.
_closing: "stdqueue.SimpleQueue[_Core]" = stdqueue.SimpleQueue()
_closer: list[threading.Thread] = []
_closer_lock = threading.Lock()


def _close_forever() -> None:
    while True:
        _closing.get().close()


def _start_closer() -> None:
    with _closer_lock:
        if not _closer:
            _closer.append(threading.Thread(target=_close_forever, daemon=True, name="hetflow-queue-closer"))
            _closer[0].start()


# -- the queue ------------------------------------------------------------------------------
_THRESHOLDS = frozenset(inspect.signature(Scheduler).parameters) - {"lanes"}


class Queue:
    """An execution queue on a context's devices.

    ``context``: a :class:`~hetflow.Context` (retained while the queue lives), or what
    ``Context(...)`` accepts (device ids, a Device, a list; None: every real device).
    ``slots``: worker threads per device, an int for all or ``{device_id: n}``
    (default 1). ``run_here``: whether tiny CPU instances may run in the thread that
    enqueues them (the module's docstring); False: ``enqueue`` never runs a kernel, every
    instance runs on a worker. Other keywords are the scheduler's thresholds
    (see :class:`~hetflow.runtime.scheduler.Scheduler`). As a context manager the queue
    finishes and closes on exit.
    """

    def __init__(self, context=None, *, slots=None, run_here: bool = True, **thresholds):
        unknown = set(thresholds) - _THRESHOLDS
        if unknown:
            raise ArgumentError(f"unknown Queue option(s) {', '.join(sorted(unknown))}; the scheduler "
                                f"takes {', '.join(sorted(_THRESHOLDS))}")
        if type(run_here) is not bool:
            raise ArgumentTypeError(f"run_here must be True or False, got {run_here!r}")
        if isinstance(context, Context):
            context.retain()
        else:
            context = Context(context)
        try:
            self._core = _Core(context, slots, thresholds, run_here)
        except BaseException:
            context.release()  # the reference this queue took
            raise
        _start_closer()
        weakref.finalize(self, _closing.put, self._core)

    # -- facts ---------------------------------------------------------------------------
    @property
    def context(self) -> Context:
        return self._core.context

    @property
    def devices(self) -> tuple[Device, ...]:
        return tuple(lane.device for lane in self._core.lanes)

    def status(self) -> dict[str, dict]:
        """Per device: instances running and queued, worker slots, busy, sampled state."""
        core = self._core
        sched = core.scheduler
        out = {}
        for lane in core.lanes:
            s = sched.sampler.sample(lane.device, lane.running)
            out[lane.device.id] = dict(running=lane.running, queued=len(lane.heap), slots=lane.slots,
                                       busy=sched.busy(lane), utilization=s.utilization,
                                       others=s.others, memory_used=s.memory_used,
                                       memory_total=s.memory_total)
        return out

    # -- enqueue -------------------------------------------------------------------------
    def enqueue(self, kernel, extent, *args, priority: int = 0, wait_for=(), device=None,
                defer: bool = False) -> Event:
        """Enqueue a launch of ``kernel`` over ``extent``; return its event at once.

        ``priority``: higher runs first among ready instances. ``wait_for``: events (or
        one event) to run after. ``device``: a device id or Device of the context to run
        on (a busy GPU still falls back to the CPU). ``defer``: create the instance
        but start it only at :meth:`submit` (others may already wait for it).
        """
        core = self._core
        if not core.closed:  # released (also by one release too many): InvalidContextError here
            core.context.check()
        rec = _kernels.get(id(kernel)) if type(kernel) is Kernel else None
        if rec is None:
            rec = _register(kernel)
        if type(priority) is not int:
            priority = _priority(priority)
        if wait_for:
            wait_for = _events(wait_for)
        if device is None and core.home is not None:
            lanes, pinned = core.home, True
        else:
            lanes, pinned = core.route(extent, args, device)
        launch = bind(kernel, extent, args, lanes[0].device)  # (GPU arrays of another GPU: raises)
        buffers = _buffer_positions(args) if launch.plan.buffers else None
        modes = rec.modes.get(len(launch.extent)) or rec.learn(launch)
        inst = Instance(core, rec.label, launch, modes, priority, lanes, pinned, buffers)
        if len(lanes) > 1:
            inst.splittable = _splittable(inst, buffers)
        here = None  # an instance this thread runs: its own, or the first ready on its CPU
        with LOCK:
            if core.closed:  # checked under the lock: a closing queue's workers may be gone
                raise ArgumentError("this queue is closed; create a new one")
            # (nothing below changes the lane's heap: one look serves both uses)
            tiny = core.run_here_ok and not lanes[0].heap and _tiny(lanes[0], inst)
            if tiny and not wait_for and not defer:
                keys = clear_locked(args, modes)
                if keys is not None:
                    return core.run_now_locked(lanes[0], inst, args, keys)
            for w in wait_for:
                depend_locked(inst, w, True)
            track_locked(inst, args, modes)
            core.outstanding.add(inst)
            if defer:  # (doomed too: held back as one whose dependency fails later would be)
                core.deferred.add(inst)
            else:
                inst.submitted = inst.queued
                if inst.pending == 0:
                    if inst.doomed is not None:
                        start_locked(inst)
                    elif tiny:
                        here = _start_here_locked(lanes[0], inst)  # (nothing ready before it)
                    else:  # start_locked()'s common case, inlined
                        core.ready_locked(inst)
            if here is None and lanes[0].heap and lanes[0].cpu and core.run_here_ok:
                here = _take_tiny_locked(lanes[0])  # help its worker (module docstring)
        if here is not None:
            core.run_here(lanes[0], here)
        return inst

    def submit(self, event: Event, wait_for=()) -> None:
        """Start a deferred instance, after ``wait_for`` events too.

        Raises ArgumentError when those events (transitively) wait for
        ``event`` itself (the instance then stays deferred), or when the queue is closed
        (closing cancelled what it held back). An instance whose dependency failed is
        held back all the same, and cancelled once submitted.
        """
        wait_for = _events(wait_for) if wait_for else ()
        with LOCK:
            if self._core.closed:
                raise ArgumentError(f"cannot submit {event}: this queue is closed")
            if isinstance(event, Instance) and event.submitted is not None:  # (done ones are no queue's)
                raise ArgumentError(f"{event} was already submitted (only defer=True instances are submitted)")
            if not isinstance(event, Instance) or event.core is not self._core:
                raise ArgumentError(f"{event!r} is not a pending instance of this queue")
            check_cycle_locked(event, wait_for)
            for w in wait_for:
                depend_locked(event, w, True)
            self._core._submit_locked(event, time.perf_counter())

    # -- waiting and closing ------------------------------------------------------------
    def finish(self, timeout: float | None = None) -> None:
        """Wait until every instance enqueued so far is done; then raise the first
        failure (EventFailedError) not yet retrieved from its event, or else the first
        cancellation whose cause was not either (a failure in another queue: this one's
        outputs were never computed; :func:`_unreported`). The failures and
        cancellations up to here then count as reported (see :mod:`~hetflow.runtime.deps`
        on poisoned data). ``timeout`` is checked as an event wait's is
        (:func:`~hetflow.runtime.events.timeout_seconds`)."""
        core = self._core
        timeout = timeout_seconds(timeout, "queue finish")
        deadline = None if timeout is None else time.monotonic() + timeout
        with locked(timeout, "queue finish"):
            if core.deferred:
                names = ", ".join(str(i) for i in sorted(core.deferred, key=lambda i: i.id))
                raise ArgumentError(f"finish() would wait forever: deferred instance(s) never submitted: "
                                    f"{names}; submit them first")
            core.finishing += 1
            try:
                while core.outstanding:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0 or not core.idle_cond.wait(left):
                        raise HetflowTimeoutError(f"queue finish: {len(core.outstanding)} instance(s) still "
                                                  f"pending after {timeout} s in {self!r}: {_stuck(core)}; "
                                                  f"wait on their events to see what holds them (a user "
                                                  f"event never set, a kernel that does not return)")
            finally:
                core.finishing -= 1
            unseen = [e for e in core.failures if _unreported(e)]
            for e in core.failures:  # reported now, with the cancellations they caused
                e._reported_locked()
            core.failures = []
        if unseen:  # a failure first: the cancellations it caused name it
            raise min(unseen, key=lambda e: e.status is not FAILED)._error.with_traceback(None)

    def close(self) -> None:
        """Stop accepting work; pending instances still run. Idempotent."""
        self._core.close()

    def __enter__(self) -> "Queue":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self.finish()
        finally:  # on an exception, close without waiting: pending work still runs
            self.close()

    # -- devices ----------------------------------------------------------------------------
    def set_device_busy(self, device, busy: bool | None = True) -> None:
        """Mark a device of this queue busy with other work (True), free (False), or
        measured again (None); see :func:`hetflow.runtime.status.set_busy`."""
        dev_id = _device_id(device)
        if self._core.scheduler.lane(dev_id) is None:
            raise ArgumentError(f"device {device!r} is not in this queue's context")
        status.set_busy(dev_id, busy)

    def __repr__(self):
        ids = ", ".join(lane.device.id for lane in self._core.lanes)
        return f"<hetflow Queue on {ids}{' (closed)' if self._core.closed else ''}>"


def _tiny(lane: Lane, inst: Instance) -> bool:
    """Is ``inst`` predicted to take under ``RUN_HERE_S`` on ``lane``, a CPU it was bound
    for, without being split over devices? It has fewer indices than one of its plan's
    last two timed runs would run in that time at its rate (``_run_on_cpu`` keeps the
    bound). (Two: a run that an unrelated pause made slow does not send the next ones to
    a worker.)"""
    launch = inst.launch
    if not lane.cpu or inst.buffers is not None or inst.splittable or launch.device is not lane.device:
        return False
    return _indices(launch.extent) < launch.plan.tiny_below


def _stuck(core: _Core, shown: int = 3) -> str:
    """The first ``shown`` instances ``core`` has outstanding, with their state, for a
    message (caller holds LOCK)."""
    first = nsmallest(shown, core.outstanding, key=lambda i: i.id)
    names = "; ".join(f"{i}: {i.status}" + (f", waiting for {i.pending} event(s)" if i.pending else "")
                      for i in first)
    more = len(core.outstanding) - len(first)
    return names + (f"; and {more} more" if more else "")


def _indices(extent: tuple) -> int:
    """How many indices an extent holds (a 1-D one without ``math.prod``'s call: this
    runs per queued CPU launch)."""
    return extent[0] if len(extent) == 1 else math.prod(extent)


def _take_tiny_locked(lane: Lane) -> Instance | None:
    """The entry at the head of a CPU lane's heap, taken (marked running) to run in the
    enqueuing thread if it is tiny and not to be split; else None."""
    key = lane.heap[0]
    inst = lane.ready[key]
    if key in lane.splits or not _tiny(lane, inst):
        return None
    heappop(lane.heap)
    del lane.ready[key]
    return _start_here_locked(lane, inst)


def _start_here_locked(lane: Lane, inst: Instance) -> Instance:
    """Mark ``inst`` running on ``lane``, to be run in the enqueuing thread."""
    lane.running += 1
    inst.status, inst.started = RUNNING, perf_counter()
    return inst


def _run_on_cpu(launch, cores: int) -> tuple:
    """Run a launch bound to a CPU of ``cores`` cores: (error, (blocks, threads), ended),
    the kernel's failure as the error. Unless it compiled, the run is timed for the next
    ones of its plan (``_tiny``)."""
    compiled, began = launch.plan.compiled, perf_counter()
    try:
        error, shape = None, (len(cpu.run(launch, cores)), 1)  # a CPU counts its row pieces as blocks
    except Exception as exc:  # noqa: BLE001  (any kernel failure becomes the event's)
        error, shape = exc, (None, None)
    ended = perf_counter()
    if compiled:  # (a run that compiles says nothing of the next one's time)
        # Tiny below the indices that would take RUN_HERE_S at this run's rate, or the last's.
        # (A conditional, not max(): this runs per queued CPU launch.)
        plan, seconds = launch.plan, ended - began
        below = 0.0
        if 0 < seconds < RUN_HERE_S:
            below = RUN_HERE_S * (_indices(launch.extent) or 1) / seconds
        last = plan.last_below
        plan.tiny_below, plan.last_below = below if below > last else last, below
    return error, shape, ended


def _unreported(event: Event) -> bool:
    """Is ``event`` (a failure or cancellation of a queue) one that ``finish`` raises: its
    error not retrieved, and for a cancellation, neither the failure behind it (one of
    another queue, say), unless that is a user event's, which the application set?"""
    if event._retrieved:
        return False
    if event.status is FAILED:
        return True
    root = getattr(event._error, "failed_event", None)
    return root is not None and not root._retrieved and not isinstance(root, UserEvent)


def _priority(priority) -> int:
    if isinstance(priority, bool) or not isinstance(priority, numbers.Integral):
        raise ArgumentError(f"priority must be an int, got {type(priority).__name__}")
    return int(priority)


def _events(wait_for) -> tuple:
    if isinstance(wait_for, Event):
        events = (wait_for,)
    else:
        try:
            events = tuple(wait_for)
        except TypeError:
            raise ArgumentError(f"wait_for must be an event or events, got {type(wait_for).__name__}") from None
    for e in events:
        if not isinstance(e, Event):
            raise ArgumentError(f"wait_for must hold hetflow events, got {type(e).__name__}")
        if type(e) is Event:  # nothing ever completes one: waiting for it would hang
            raise ArgumentError(f"wait_for holds {e}, made by calling hetflow.Event directly, which "
                                f"nothing completes; use the event enqueue returns, or a UserEvent")
    return events


def _buffer_positions(args) -> list:
    """Positions of the arguments that are Buffers or views of one."""
    return [k for k, a in enumerate(args) if type(getattr(a, "root", a)) is Buffer]


def _splittable(inst: Instance, buffers) -> bool:
    """May an instance with a choice of devices be split over several?"""
    # Rows are independent when every written array is touched only in the launch
    # index's row; Buffers keep one valid copy, so they never split.
    return (not inst.pinned and buffers is None and inst.launch.extent[0] > 1
            and coexec.co_executable(inst.launch))
