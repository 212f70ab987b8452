"""The monitor: feedback about the machine and the program, as variables and events.

Variables are dotted names read by rule expressions: ``cpu.utilization``,
``gpu.utilization`` (the busiest GPU), ``gpu0.utilization`` (measured: by processes
other than this one), ``gpu0.device_utilization`` (all of it), ``free_memory`` (host
bytes available), ``gpu.free_memory``, ``throughput.cpu0`` (items per second from run
reports), ``input.size``, ``input.dtype``, ``complexity`` and anything a rule or the
program sets. Events record what happened since the last safe point:

====================  =====================================  ===========================
kind                  data                                   effect
====================  =====================================  ===========================
device_added          device (a device record)               added to the topology
device_removed        device (id or record)                  removed from the topology
device_failed         device (id or record)                  marked failed
node_added            count (optional; default +1)           node count changes
node_removed          count (optional; default -1)           node count changes
utilization           device (id), value in [0, 1]           ``<id>.utilization``, ``<kind>.utilization``
memory_pressure       free (bytes), device (optional)        ``free_memory`` / ``<id>.free_memory``
input_changed         size, dtype (optional)                 ``input.size``, ``input.dtype``
complexity_changed    value                                  ``complexity``
====================  =====================================  ===========================

Other kinds may be injected for user rules (``happened("my_event")``). Sources:
the scheduler's device sampler (psutil for the CPU and free memory, NVML through
nvidia-ml-py for GPUs; :mod:`hetflow.runtime.status`), the runner's run reports, and
``inject``/``set`` through the API. Modes:
``"event"`` (sources are sampled only when asked), ``"periodic"`` (sampled at safe
points once ``period`` seconds have passed) and ``"continuous"`` (a background thread
samples every ``period`` seconds until ``stop()``).
"""
from __future__ import annotations

import dataclasses
import logging
import math
import numbers
import threading
import time
import types
from typing import Mapping

import numpy as np
import psutil

from ..errors import ArgumentError, ArgumentTypeError
from ..platform.devices import devices as all_devices
from ..runtime.status import Sampler, _nvml
from .topology import Topology

log = logging.getLogger("hetflow.ir.monitor")

MODES = ("event", "periodic", "continuous")


@dataclasses.dataclass(frozen=True)
class MonitorEvent:
    """One piece of feedback: its kind, its data and when it arrived."""

    kind: str
    data: Mapping = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))
    time: float = dataclasses.field(default_factory=time.monotonic)


class StatusSource:
    """Every device's utilization and free memory, as :mod:`hetflow.runtime.status`
    samples them for the scheduler (psutil for the host, NVML for real GPUs). A GPU's
    ``utilization`` is by other processes: rules move work off a GPU that *others* use,
    and this process's own kernels must not chase it off its GPU (where NVML has no
    per-process samples, the whole device's utilization is all there is)."""

    name = "status"

    def __init__(self, devices=None):
        nvml = _nvml() is not None
        self._devices = tuple(d for d in (devices if devices is not None else all_devices())
                              if d.kind == "cpu" or (nvml and not d.simulated))
        self._sampler = Sampler(ttl=0.0)
        psutil.cpu_percent(interval=None)  # the first reading only starts the measurement

    def sample(self) -> dict:
        values = {}
        for d in self._devices:
            s = self._sampler.sample(d)
            free = s.memory_total - s.memory_used
            if d.kind == "cpu":
                values[f"{d.id}.utilization"] = s.utilization
                values["free_memory"] = free
                continue
            if s.utilization is None:  # NVML could not sample it this time
                continue
            values[f"{d.id}.utilization"] = s.utilization if s.others is None else s.others
            values[f"{d.id}.device_utilization"] = s.utilization
            values[f"{d.id}.free_memory"] = free
        return values


def default_sources() -> list:
    return [StatusSource()]


class Monitor:
    """Variables, pending events and the topology they change; safe to use from threads."""

    def __init__(self, topology: Topology | None = None, *, mode: str = "event", period: float = 1.0,
                 sources: list | None = None, utilization_step: float = 0.1,
                 memory_pressure: int | None = None):
        if mode not in MODES:
            raise ArgumentError(f"monitor mode must be one of {', '.join(MODES)}; got {mode!r}")
        self.topology = topology if topology is not None else Topology()
        self.mode, self.period = mode, _period(period)
        self.sources = default_sources() if sources is None else list(sources)
        self.utilization_step = utilization_step
        self.memory_pressure = (memory_pressure if memory_pressure is not None
                                else psutil.virtual_memory().total // 10)
        self._vars: dict[str, object] = {}
        self._stamps: dict[str, int] = {}
        self._pending: list[MonitorEvent] = []
        self._reported_util: dict[str, float] = {}
        self._lock = threading.RLock()
        self.revision = 0
        self._last_sample = -math.inf
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.sample()

    # -- variables -----------------------------------------------------------------------
    def set(self, name: str, value) -> bool:
        """Set a variable; True when its value changed."""
        if not isinstance(name, str) or not name:
            raise ArgumentError(f"a variable name must be a non-empty string; got {name!r}")
        with self._lock:
            if name in self._vars and _same(self._vars[name], value):
                return False
            self._vars[name] = value
            self.revision += 1
            self._stamps[name] = self.revision
            return True

    def get(self, name: str, default=None):
        with self._lock:
            return self._vars.get(name, default)

    def __getitem__(self, name: str):
        with self._lock:
            return self._vars[name]

    def snapshot(self) -> dict:
        with self._lock:
            return dict(self._vars)

    def changed_since(self, revision: int, names=None) -> bool:
        """Whether any variable (or any of ``names``) changed after ``revision``."""
        with self._lock:
            stamps = self._stamps.values() if names is None else (self._stamps.get(n, 0) for n in names)
            return any(s > revision for s in stamps)

    # -- events ------------------------------------------------------------------------
    def inject(self, event: MonitorEvent | str, **data) -> MonitorEvent:
        """Report an event (a MonitorEvent, or a kind and its data); returns the event."""
        if isinstance(event, str):
            event = MonitorEvent(event, types.MappingProxyType(dict(data)))
        elif data:
            raise ArgumentError("give either a MonitorEvent or a kind with data, not both")
        if not isinstance(event, MonitorEvent) or not isinstance(event.kind, str) or not event.kind:
            raise ArgumentError(f"an event needs a non-empty kind; got {event!r}")
        handler = _EFFECTS.get(event.kind)
        if handler is not None:
            handler(self, event.data)
        with self._lock:
            self._pending.append(event)
            self.revision += 1
        log.debug("event %s %s", event.kind, dict(event.data))
        return event

    def pending(self) -> tuple:
        with self._lock:
            return tuple(self._pending)

    def has_pending(self) -> bool:
        """Whether events arrived since the last drain (no lock: a list's length is atomic)."""
        return bool(self._pending)

    def drain(self) -> tuple:
        """The events since the last drain (the interpreter takes them at a safe point)."""
        with self._lock:
            events, self._pending = tuple(self._pending), []
            return events

    # -- sources -----------------------------------------------------------------------
    def sample(self) -> None:
        """Read every source now; utilization steps and memory pressure become events."""
        for source in self.sources:
            try:
                values = source.sample()
            except Exception as exc:  # a flaky sensor must not stop the program
                log.warning("monitor source %s failed: %s", getattr(source, "name", source), exc)
                continue
            for name, value in values.items():
                if name.endswith(".utilization") and name.count(".") == 1:
                    self._utilization(name[:-12], value, source=True)
                else:
                    self.set(name, value)
        free = self.get("free_memory")
        if free is not None and free < self.memory_pressure and self.get("memory.pressure") is not True:
            self.inject("memory_pressure", free=free)
        elif free is not None and free >= self.memory_pressure:
            self.set("memory.pressure", False)
        self._last_sample = time.monotonic()

    def poll(self) -> None:
        """A safe point: in periodic mode, sample when a period has passed."""
        if self.mode == "periodic" and time.monotonic() - self._last_sample >= self.period:
            self.sample()

    def start(self) -> "Monitor":
        """Continuous mode: sample from a background thread every ``period`` seconds."""
        if self.mode != "continuous":
            raise ArgumentError(f"start() needs mode='continuous'; this monitor is {self.mode!r}")
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="hetflow-monitor", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join()

    def _loop(self):
        while not self._stop.wait(self.period):
            self.sample()

    def __enter__(self):
        return self.start() if self.mode == "continuous" else self

    def __exit__(self, *exc):
        self.stop()

    # -- run reports ----------------------------------------------------------------------
    def record_run(self, shares: Mapping[str, float], items: int, seconds: float) -> None:
        """A launch of ``items`` indices took ``seconds``, split over devices by ``shares``."""
        if seconds <= 0 or items <= 0:
            return
        for device_id, share in shares.items():
            self.set(f"throughput.{device_id}", share * items / seconds)

    # -- event effects -------------------------------------------------------------------
    def _utilization(self, device_id: str, value, source: bool = False) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise ArgumentError(f"utilization of {device_id} must be a number in [0, 1]; got {value!r}")
        self.set(f"{device_id}.utilization", float(value))
        kind = next((d.kind for d in self.topology.devices if d.id == device_id), device_id.rstrip("0123456789"))
        peers = [self.get(f"{d.id}.utilization") for d in self.topology.of_kind(kind)]
        self.set(f"{kind}.utilization", max([float(value)] + [p for p in peers if p is not None]))
        # A sampled value becomes an event only when it moved by a step since the last one.
        last = self._reported_util.get(device_id)
        if not source or last is None:
            self._reported_util[device_id] = value
        elif abs(value - last) >= self.utilization_step:
            self.inject("utilization", device=device_id, value=float(value))


def _period(period) -> float:
    """``period``, checked to be a finite, positive number of seconds."""
    if isinstance(period, bool) or not isinstance(period, numbers.Real):
        raise ArgumentTypeError(f"monitor period must be a number of seconds; got {type(period).__name__} {period!r}")
    if not 0 < period < math.inf:
        raise ArgumentError(f"monitor period must be positive and finite (seconds); got {period!r}")
    return float(period)


def _same(a, b) -> bool:
    """Is ``b`` the value ``a`` was (a nan is the same as a nan: a source that keeps
    sampling one would otherwise make the rules due at every sample)."""
    try:
        return type(a) is type(b) and (bool(a == b) or _nan(a) and _nan(b))
    except (TypeError, ValueError):
        return a is b


def _nan(value) -> bool:
    return isinstance(value, numbers.Real) and math.isnan(value)


def _device_id(data, kind) -> str:
    dev = data.get("device")
    dev_id = getattr(dev, "id", dev)
    if not isinstance(dev_id, str):
        raise ArgumentError(f"{kind} event needs device=<id or device record>; got {dev!r}")
    return dev_id


def _device_added(mon: Monitor, data):
    dev = data.get("device")
    if not all(hasattr(dev, a) for a in ("id", "kind")):
        raise ArgumentError(f"device_added needs device=<a device record with id and kind>; got {dev!r}")
    mon.topology.add(dev)


def _device_removed(mon: Monitor, data):
    dev_id = _device_id(data, "device_removed")
    if not mon.topology.remove(dev_id):
        raise ArgumentError(f"device_removed names {dev_id!r}, which is not in the topology")


def _device_failed(mon: Monitor, data):
    dev_id = _device_id(data, "device_failed")
    if not mon.topology.fail(dev_id):
        raise ArgumentError(f"device_failed names {dev_id!r}, which is not in the topology")


def _nodes(delta):
    def effect(mon: Monitor, data):
        count = data.get("count", mon.topology.nodes + delta)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ArgumentError(f"node count must be an integer >= 1; got {count!r}")
        mon.topology.set_nodes(count)
    return effect


def _utilization_event(mon: Monitor, data):
    mon._utilization(_device_id(data, "utilization"), data.get("value"))


def _memory_pressure(mon: Monitor, data):
    free = data.get("free")
    if isinstance(free, bool) or not isinstance(free, (int, float)) or free < 0:
        raise ArgumentError(f"memory_pressure needs free=<bytes>; got {free!r}")
    where = data.get("device")
    mon.set(f"{getattr(where, 'id', where)}.free_memory" if where else "free_memory", free)
    mon.set("memory.pressure", True)


def _input_changed(mon: Monitor, data):
    if "size" not in data:
        raise ArgumentError("input_changed needs size=<number of elements>")
    mon.set("input.size", data["size"])
    if "dtype" in data:
        try:
            mon.set("input.dtype", np.dtype(data["dtype"]).name)
        except TypeError:
            raise ArgumentError(f"input_changed: {data['dtype']!r} is not a dtype") from None


def _complexity(mon: Monitor, data):
    if "value" not in data:
        raise ArgumentError("complexity_changed needs value=<number>")
    mon.set("complexity", data["value"])


_EFFECTS = {
    "device_added": _device_added,
    "device_removed": _device_removed,
    "device_failed": _device_failed,
    "node_added": _nodes(+1),
    "node_removed": _nodes(-1),
    "utilization": _utilization_event,
    "memory_pressure": _memory_pressure,
    "input_changed": _input_changed,
    "complexity_changed": _complexity,
}
