"""Placing ready execution instances on devices (SPEC §2 "Execution queue" 3-4).

Each device of a queue's context is a :class:`Lane`: its worker slots (threads) and a
priority heap of the instances placed on it. When an instance's dependencies are met
the :class:`Scheduler` places it, reading the execution status of the candidate
devices — instances running and queue depth (kept here), memory in use and
utilization (sampled by :mod:`~hetflow.runtime.status`) — and each lane's workers take
the highest-priority entry of their heap (FIFO among equal priorities).

Where an instance goes:

* **home device** — chosen at enqueue: the ``device`` asked for; else the GPU holding
  device-array arguments; else a real GPU for large launches (at least
  ``gpu_min_work`` indices); else the CPU.
* **busy GPU** — if the home GPU is busy with other work (:mod:`status`), the instance
  runs on the CPU instead (unless its data only lives on that GPU).
* **load threshold** — a device is *under threshold* while its queue depth
  ((queued + running) / slots) is below ``max_depth`` and its memory in use is below
  ``max_memory``. An instance without an explicit device goes home if home is under
  threshold, else to the least-loaded device under threshold, else home.
* **split** — a large instance (``split_min`` indices or more) whose written arrays are
  touched only in the row of the launch index (so rows are independent) is run over
  every usable device under threshold at once: co-executed by work stealing
  (:func:`~hetflow.runtime.coexec.co_forall`), which starts from the speed ratio its
  performance model predicts and moves rows between devices as they go. It takes a
  slot on its home device and counts as running on the others meanwhile.

The simulated GPU joins load balancing and splits only as the home device (it is
thousands of times slower than a core), unless ``balance_simulated`` (for tests).
"""
from __future__ import annotations

import heapq
import math
import numbers
import threading

from ..errors import ArgumentError
from .events import LOCK
from .status import Sampler, forced_busy


class Lane:
    """One device's worker slots and its ready instances: a heap of their keys (priority
    first, then enqueue order), the instance of each key in ``ready``, and in ``splits``
    the lanes a split instance runs on. Plain int keys, not ``(-priority, id, inst)``
    tuples: int comparisons are cheap, and a tuple per ready instance is one more object
    for the cyclic garbage collector to walk while thousands wait."""

    __slots__ = ("device", "slots", "heap", "ready", "splits", "cond", "idle", "claims", "running",
                 "threads", "cpu")

    def __init__(self, device, slots: int):
        self.device = device
        self.slots = slots
        self.cpu = device.kind == "cpu"
        self.heap = []
        self.ready = {}
        self.splits = {}
        self.cond = threading.Condition(LOCK)
        self.idle = 0       # workers waiting on cond and not yet notified
        self.claims = 0     # entries a worker about to pop will take itself (no wakeup)
        self.running = 0
        self.threads = []

    def push_locked(self, inst, split=None) -> None:
        """Queue a ready instance here, waking an idle worker unless one will take it anyway."""
        key = inst.id if inst.priority == 0 else (-inst.priority << 64) + inst.id  # ids stay below 2**64
        heapq.heappush(self.heap, key)
        self.ready[key] = inst
        if split is not None:
            self.splits[key] = split
        if self.claims:
            self.claims -= 1
        elif self.idle:
            self.idle -= 1
            self.cond.notify()

    @property
    def depth(self) -> float:
        return (len(self.heap) + self.running) / self.slots

    def __repr__(self):
        return f"<lane {self.device.id} slots={self.slots} queued={len(self.heap)} running={self.running}>"


class Scheduler:
    """Placement policy over a queue's lanes.

    ``max_depth``: queue depth (instances queued and running per slot) from which a device
    is over threshold. ``max_memory``: fraction of its memory in use from which it is.
    ``busy_utilization``: utilization by other processes from which a GPU is busy.
    ``gpu_min_work``: indices from which a launch's home is a GPU. ``split_min``: indices
    from which a launch may be split over devices. ``balance_simulated``: let the
    simulated GPU take part in balancing and splits. ``sampler``: the
    :class:`~hetflow.runtime.status.Sampler` to read device state with.
    """

    def __init__(self, lanes: list[Lane], *, max_depth: float = 2.0, max_memory: float = 0.95,
                 busy_utilization: float = 0.5, gpu_min_work: int = 1 << 18,
                 split_min: int = 1 << 20, balance_simulated: bool = False,
                 sampler: Sampler | None = None):
        for name, value in (("max_depth", max_depth), ("max_memory", max_memory),
                            ("busy_utilization", busy_utilization), ("gpu_min_work", gpu_min_work),
                            ("split_min", split_min)):
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
                raise ArgumentError(f"{name} must be a positive number, got {value!r}")
        self.lanes = lanes
        self.max_depth = max_depth
        self.max_memory = max_memory
        self.busy_utilization = busy_utilization
        self.gpu_min_work = gpu_min_work
        self.split_min = split_min
        self.sampler = sampler or Sampler()
        self.cpu = next((lane for lane in lanes if lane.cpu), None)
        self._by_id = {lane.device.id: lane for lane in lanes}
        self.balanced = tuple(lane for lane in lanes if balance_simulated or not lane.device.simulated)

    # -- enqueue time ----------------------------------------------------------------
    def lane(self, device_id: str) -> Lane | None:
        return self._by_id.get(device_id)

    def route(self, work: int, on_gpu, explicit: Lane | None) -> tuple[tuple, bool]:
        """(candidate lanes, home first; pinned) for an instance of ``work`` indices.

        ``on_gpu`` is the lane holding device-array arguments (None if none). A pinned
        instance may only leave its home for the CPU when home is busy.
        """
        if on_gpu is not None:
            return (on_gpu,), True
        if explicit is not None:
            fallback = (self.cpu,) if not explicit.cpu and self.cpu is not None else ()
            return (explicit, *fallback), True
        home = self.cpu or self.lanes[0]
        if work >= self.gpu_min_work:
            home = next((lane for lane in self.balanced if not lane.cpu), home)
        return (home, *(lane for lane in self.balanced if lane is not home)), False

    # -- ready time --------------------------------------------------------------------
    def busy(self, lane: Lane) -> bool:
        """True when ``lane``'s GPU is busy with other work (never for the CPU)."""
        if lane.cpu:
            return False
        forced = forced_busy(lane.device.id)
        if forced is not None:
            return forced
        others = self.sampler.sample(lane.device, lane.running).others
        return others is not None and others >= self.busy_utilization

    def under_threshold(self, lane: Lane) -> bool:
        if lane.depth >= self.max_depth:
            return False
        return self.sampler.sample(lane.device, lane.running).memory_fraction < self.max_memory

    def place_locked(self, inst) -> None:
        """Push ``inst`` onto the heap of the lane that runs it (caller holds LOCK); a
        split instance carries the devices it is co-executed on."""
        lanes = inst.lanes
        if len(lanes) == 1:
            lanes[0].push_locked(inst)
            return
        home = lanes[0]
        usable = [lane for lane in lanes if not self.busy(lane)] or [home]
        if inst.pinned:
            target = usable[0]  # home, or the CPU standing in for a busy GPU
        else:
            under = [lane for lane in usable if self.under_threshold(lane)]
            if inst.splittable and math.prod(inst.launch.extent) >= self.split_min and len(under) >= 2:
                first = home if home in under else under[0]
                first.push_locked(inst, tuple(under))
                return
            if home in under:
                target = home
            elif under:
                target = min(under, key=lambda lane: lane.depth)
            else:
                target = home if home in usable else usable[0]
        target.push_locked(inst)
