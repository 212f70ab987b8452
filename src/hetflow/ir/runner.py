"""Running one DIR version: each node goes to hetflow's runtime, in order.

``forall`` nodes call the runtime's ``forall`` with the node's placement (``devices``
and ``shares`` set by rules). The DIR may plan for devices this process cannot use
(simulated ones, another node's): those are left out here and the shares of the others
renormalised; with none left, the runtime picks the device as for an unplaced launch.
Other operations call the function recorded for them. Lazy arrays are materialised on
first use. Timings go to the monitor as throughput per device.
"""
from __future__ import annotations

import logging
import time
import weakref

from ..errors import HetflowError
from ..platform.devices import devices as platform_devices
from ..runtime.forall import forall
from ..runtime.gpu import Timing
from ..runtime.report import LaunchReport
from .graph import Node, Version
from .values import Handle, LazyArray, resolve

log = logging.getLogger("hetflow.ir")


# Co-executed launches a device may sit out in a row before drop-idle-devices takes it
# out of the launch's placement.
IDLE_RUNS = 3


def run_version(version: Version, monitor, graph: str = "graph", work: list | None = None) -> None:
    """Execute every node of ``version``; lazy arrays are (re)initialised first. A hetflow
    error of a node says which: ``graph 'g' v1, node #4 forall fused_a_b (from #1, #2): ...``.
    ``work``: a list that gets a :class:`LaunchWork` per launch."""
    for step in _steps(version):
        try:
            step.run(monitor, work)
        except HetflowError as exc:
            _name_node(exc, graph, version, step.node)
            raise


def _name_node(exc: HetflowError, graph: str, version: Version, node: Node) -> None:
    """Put the node that raised ``exc`` in front of its message (the same exception, so
    its type and attributes stay as the runtime made them)."""
    if not exc.args or not isinstance(exc.args[0], str):
        return
    origin = f" (from {', '.join(f'#{o}' for o in node.origin)})" if node.origin else ""
    what = node.op if node.name == node.op else f"{node.op} {node.name}"
    where = f"graph {graph!r} v{version.number}, node #{node.id} {what}{origin}"
    exc.args = (f"{where}: {exc.args[0]}",) + exc.args[1:]


# Steps of the versions run lately, made again when the device table changes: what does
# not change between runs of a version (placement, which arguments are lazy) is worked
# out once, so that running a version again costs little more than its launches.
_prepared: weakref.WeakKeyDictionary[Version, tuple] = weakref.WeakKeyDictionary()


def _steps(version: Version) -> tuple:
    table = platform_devices()
    done = _prepared.get(version)
    if done is None or done[0] is not table:
        done = (table, tuple(_step(node, table) for node in version.nodes))
        _prepared[version] = done
    return done[1]


def _step(node: Node, table):
    if node.op == "alloc":
        return _Alloc(node)
    if node.op == "forall":
        return _Forall(node, table)
    return _Call(node)


class LaunchWork:
    """How long one launch worked on its devices: its host time, or the GPU time of what
    it enqueued on its GPUs where that is more (a launch run on a GPU alone returns once
    enqueued). :meth:`seconds` is final once those GPUs finished it (:meth:`done`)."""

    __slots__ = ("timings", "wall")

    def __init__(self, gpus):
        self.timings = tuple(Timing(g) for g in gpus)
        self.wall = 0.0

    def stop(self, wall: float) -> "LaunchWork":
        """The launch returned after ``wall`` seconds of host time."""
        self.wall = wall
        for timing in self.timings:
            timing.stop()
        return self

    def done(self) -> bool:
        return all(t.seconds() is not None for t in self.timings)

    def seconds(self) -> float:
        return max([self.wall, *(t.seconds() or 0.0 for t in self.timings)])


class _Alloc:
    __slots__ = ("node",)

    def __init__(self, node):
        self.node = node

    def run(self, monitor, work=None) -> None:
        self.node.result.reset()


def placement(node: Node, table=None) -> tuple[dict, dict]:
    """(keyword arguments for forall, shares of the devices used) for ``node``."""
    wanted = node.attrs.get("devices")
    if not wanted:
        return {}, {}
    known = {d.id for d in (table if table is not None else platform_devices())}
    usable = [d for d in wanted if d in known]
    if len(usable) < len(wanted):
        log.debug("node #%d: devices %s are not on this host; running on %s", node.id,
                  [d for d in wanted if d not in known], usable or "the default device")
    if not usable:
        return {}, {}
    planned = node.attrs.get("shares") or {d: 1.0 for d in usable}
    total = sum(planned.get(d, 0.0) for d in usable)
    shares = {d: planned.get(d, 0.0) / total for d in usable} if total > 0 else {d: 1 / len(usable) for d in usable}
    if len(usable) == 1:
        return {"device": usable[0]}, shares
    if not node.attrs.get("shares"):  # no rule planned a split: the runtime's model makes one
        return {"device": usable}, shares
    return {"device": usable, "shares": [shares[d] for d in usable]}, shares


class _Forall:
    __slots__ = ("gpus", "kwargs", "launch", "lazy", "node", "shares", "whole")

    def __init__(self, node, table):
        self.node, self.launch, self.whole = node, forall, LaunchReport
        self.kwargs, self.shares = placement(node, table)
        if "schedule" in node.attrs:
            self.kwargs["schedule"] = node.attrs["schedule"]
        if node.attrs.get("snapshot"):
            self.kwargs["snapshot"] = True
        self.lazy = any(isinstance(a, (LazyArray, Handle)) for a in node.args)
        placed = self.kwargs.get("device", ())
        placed = {placed} if isinstance(placed, str) else set(placed)
        self.gpus = tuple(d for d in table if d.id in placed and d.kind == "gpu")

    def run(self, monitor, work=None) -> None:
        node = self.node
        args = [resolve(a) for a in node.args] if self.lazy else node.args
        measure = LaunchWork(self.gpus) if work is not None else None
        start = time.perf_counter()
        report = self.launch(node.extent, node.kernel, *args, **self.kwargs)
        seconds = time.perf_counter() - start
        if measure is not None:
            work.append(measure.stop(seconds))
        # A launch run whole on one device counts by its planned shares; a co-executed one by
        # what each worker did.
        for failure in getattr(report, "failures", ()):  # what the rules of lost devices watch
            _device_failed(monitor, failure.device_id)
        workers = None if isinstance(report, self.whole) else getattr(report, "workers", None)
        if workers:
            per_device = _report_workers(monitor, workers)
            _count_idle(monitor, node.kernel.name, per_device)
        elif self.shares:
            monitor.record_run(self.shares, node.size, seconds)


def _device_failed(monitor, device_id: str) -> None:
    """A device failed during a launch (the runtime re-ran its rows elsewhere): a
    ``device_failed`` event, once per device, so that the rules drop it from placements."""
    if device_id not in monitor.topology.failed:
        monitor.inject("device_failed", device=device_id)


def _report_workers(monitor, workers) -> dict:
    """Throughput per device from a work-stealing run report (indices over busy time);
    returns device id -> indices it ran."""
    per_device: dict[str, list] = {}
    for stats in workers:
        done = per_device.setdefault(stats.device_id, [0, 0.0])
        done[0] += stats.indices
        done[1] = max(done[1], stats.busy_s)
    for device_id, (indices, busy) in per_device.items():
        if busy > 0:
            monitor.set(f"throughput.{device_id}", indices / busy)
    return {device_id: indices for device_id, (indices, _) in per_device.items()}


def _count_idle(monitor, kernel: str, ran: dict) -> None:
    """``idle.<kernel>.<device>``: consecutive co-executed launches of ``kernel`` in
    which the device ran no index while the others ran them all (a GPU whose copies
    outlast the loop on the CPU cores); ``devices.idle``: how many of those counts have
    reached :data:`IDLE_RUNS` (the default rule ``drop-idle-devices`` watches it)."""
    if len(ran) < 2 or not any(ran.values()):
        return
    for device_id, indices in ran.items():
        name = f"idle.{kernel}.{device_id}"
        before = monitor.get(name, 0)
        count = 0 if indices else before + 1
        monitor.set(name, count)
        if (before >= IDLE_RUNS) != (count >= IDLE_RUNS):
            monitor.set("devices.idle", monitor.get("devices.idle", 0) + (1 if count else -1))


class _Call:
    __slots__ = ("node",)

    def __init__(self, node):
        self.node = node

    def run(self, monitor, work=None) -> None:
        node = self.node
        # Keyword arguments ride at the end of ``args`` (so their memory has dependencies too).
        names = node.attrs.get("keywords", ())
        values = [resolve(a) for a in node.args]
        split = len(values) - len(names)
        value = node.attrs["fn"](*values[:split], **dict(zip(names, values[split:])))
        if node.result is not None:
            node.result.set(value)
