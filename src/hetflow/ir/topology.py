"""The machine as the interpreter sees it: devices (by kind), failed ones, and node count.

The topology starts from the platform's device table and changes through monitor
events (device added, removed, failed; node added, removed). Devices that the platform
does not have can be injected (``simulated_device``): the interpreter plans for them
like for any other, and the runner leaves them out when it launches work on this host.
"""
from __future__ import annotations

import threading

from ..errors import DeviceError
from ..platform.devices import Device, devices as platform_devices


class Topology:
    """Devices and nodes known to one interpreter; thread-safe, with a revision counter."""

    def __init__(self, devices=None, nodes: int = 1):
        self._devices: dict[str, object] = {}
        for dev in (platform_devices() if devices is None else devices):
            self._devices[dev.id] = dev
        self._failed: set[str] = set()
        self.nodes = int(nodes)
        self.revision = 0
        self._lock = threading.Lock()

    # -- queries ----------------------------------------------------------------------
    @property
    def devices(self) -> tuple:
        """Usable devices (failed ones left out), in the order they were added."""
        with self._lock:
            return tuple(d for i, d in self._devices.items() if i not in self._failed)

    @property
    def failed(self) -> frozenset:
        with self._lock:
            return frozenset(self._failed)

    def get(self, device_id: str):
        with self._lock:
            try:
                return self._devices[device_id]
            except KeyError:
                known = ", ".join(self._devices) or "none"
                raise DeviceError(f"no device {device_id!r} in the topology (devices: {known})") from None

    def count(self, kind: str = "device") -> int:
        """Usable devices of ``kind`` ('cpu', 'gpu', ...), all of them for 'device', or nodes."""
        if kind in ("node", "nodes"):
            return self.nodes
        return sum(1 for d in self.devices if kind in ("device", "devices", "any") or d.kind == kind)

    def kinds(self) -> frozenset:
        return frozenset(d.kind for d in self.devices)

    def of_kind(self, kind: str) -> tuple:
        return tuple(d for d in self.devices if d.kind == kind)

    # -- changes (called by the monitor when it applies events) ----------------------------
    def add(self, device) -> bool:
        with self._lock:
            known = device.id in self._devices and device.id not in self._failed
            self._devices[device.id] = device
            self._failed.discard(device.id)
            self.revision += 1
            return not known

    def remove(self, device_id: str) -> bool:
        with self._lock:
            self._failed.discard(device_id)
            found = self._devices.pop(device_id, None) is not None
            self.revision += 1
            return found

    def fail(self, device_id: str) -> bool:
        with self._lock:
            if device_id not in self._devices:
                return False
            self._failed.add(device_id)
            self.revision += 1
            return True

    def set_nodes(self, count: int) -> None:
        with self._lock:
            self.nodes = int(count)
            self.revision += 1

    def __repr__(self):
        return f"<Topology nodes={self.nodes} devices={[d.id for d in self.devices]}>"


def simulated_device(kind: str, ordinal: int = 0, **fields) -> Device:
    """A device record for a processor this host does not have (planning and tests)."""
    base = dict(id=f"{kind}{ordinal}", kind=kind, vendor="simulated", name=f"simulated {kind}",
                version="0", compute_units=1, simd_width=32 if kind == "gpu" else 4,
                global_memory=1 << 30, local_memory=48 << 10, fp64=True, atomics=True,
                host_shared=True, simulated=True, ordinal=ordinal, arch=f"sim-{kind}")
    base.update(fields)
    return Device(**base)


def description(device) -> tuple:
    """What a compiled variant depends on in a device: kind, vendor, architecture."""
    return (device.kind, getattr(device, "vendor", ""), getattr(device, "arch", "") or getattr(device, "version", ""))

