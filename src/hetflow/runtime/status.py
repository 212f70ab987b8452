"""Execution status of devices, as the scheduler reads it (SPEC §2 "Execution queue" 3-4).

The scheduler combines two kinds of facts before it places an instance: the runtime's
own load on each device (instances running, queue depth: kept by the queues, see
:mod:`~hetflow.runtime.scheduler`) and what the system reports about the device, which
this module samples:

* **memory in use** and **utilization** — psutil for the CPU; NVML (the ``pynvml``
  module of nvidia-ml-py, when importable) for real GPUs; the simulated GPU shares the
  host's memory and reports no utilization;
* **utilization by other processes** on a GPU — the per-process samples of
  ``nvmlDeviceGetProcessUtilization`` not belonging to this process. Where the driver
  gives no per-process samples, the device's utilization counts as others' only while
  this runtime runs nothing on it (our own kernels must not make a GPU look busy).

A GPU used by others above a threshold is **busy**: work meant for it goes to the CPU.
:func:`set_busy` overrides the measurement, for tests and for applications that know
better (a GPU that drives a display during rendering, say).

Samples are cached for ``ttl`` seconds: NVML calls cost tens of microseconds and the
scheduler may ask for every instance. The scheduler only asks when it has a choice to
make (more than one device), so a CPU-only queue never samples.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
import time

import psutil

from ..cuda_compat import cuda_module
from ..platform.devices import Device

log = logging.getLogger(__name__)

_forced: dict[str, bool] = {}


def set_busy(device_id: str, busy: bool | None = True) -> None:
    """Declare device ``device_id`` busy with other work (True), free (False), or
    measured again (None)."""
    if busy is None:
        _forced.pop(device_id, None)
    else:
        _forced[device_id] = bool(busy)


def forced_busy(device_id: str) -> bool | None:
    """The :func:`set_busy` override of a device, or None."""
    return _forced.get(device_id)


@dataclasses.dataclass(frozen=True)
class Sample:
    """One device's state as the system reports it (fractions in 0..1, None: unknown)."""

    device: str
    utilization: float | None
    others: float | None        # utilization by other processes (GPUs)
    memory_used: int
    memory_total: int
    at: float

    @property
    def memory_fraction(self) -> float:
        return self.memory_used / self.memory_total if self.memory_total else 0.0


class Sampler:
    """Cached samples of devices' memory and utilization."""

    def __init__(self, ttl: float = 0.1):
        self.ttl = ttl
        self._cache: dict[str, Sample] = {}
        self._lock = threading.Lock()  # one NVML/psutil query per device at a time

    def sample(self, device: Device, own_running: int = 0) -> Sample:
        """The device's state, at most ``ttl`` seconds old. ``own_running`` is how many of
        this runtime's instances run on it (see the module notes on utilization)."""
        s = self._cache.get(device.id)
        now = time.perf_counter()
        if s is not None and now - s.at < self.ttl:
            return s
        with self._lock:
            s = self._cache.get(device.id)
            if s is None or now - s.at >= self.ttl:
                s = self._cache[device.id] = _measure(device, own_running, now)
        return s


def _measure(device: Device, own_running: int, now: float) -> Sample:
    if device.kind == "gpu" and not device.simulated:
        nvml = _nvml()
        if nvml is not None:
            try:
                return _measure_nvml(nvml, device, own_running, now)
            except nvml.NVMLError as exc:  # a GPU that stops answering must not stop the scheduler
                log.warning("NVML could not sample %s: %s", device.id, exc)
        return Sample(device.id, None, None, 0, device.global_memory, now)
    mem = psutil.virtual_memory()
    util = psutil.cpu_percent(interval=None) / 100.0 if device.kind == "cpu" else None
    return Sample(device.id, util, None, mem.total - mem.available, mem.total, now)


@functools.lru_cache(maxsize=1)
def _nvml():
    """The initialised ``pynvml`` module, or None when NVML cannot be used."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # not installed, no driver: no GPU sampling
        return None
    return pynvml


@functools.lru_cache(maxsize=None)
def _handle(nvml, device: Device):
    """The NVML handle of a CUDA device, matched by UUID (CUDA and NVML number GPUs
    differently when CUDA_VISIBLE_DEVICES is set), else by ordinal. The UUID comes from
    the driver's device, not a context: sampling every GPU of the host must not open a
    context on each (an MPI rank uses one of them)."""
    try:
        uuid = str(cuda_module().cudadrv.driver.driver.get_device(device.ordinal).uuid)
        return nvml.nvmlDeviceGetHandleByUUID(uuid)
    except Exception:  # older numba-cuda without uuid, or an NVML without that GPU
        return nvml.nvmlDeviceGetHandleByIndex(device.ordinal)


def _measure_nvml(nvml, device: Device, own_running: int, now: float) -> Sample:
    h = _handle(nvml, device)
    mem = nvml.nvmlDeviceGetMemoryInfo(h)
    util = nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0
    others = _others_utilization(nvml, h)
    if others is None:
        others = util if own_running == 0 else 0.0
    return Sample(device.id, util, others, int(mem.used), int(mem.total), now)


def _others_utilization(nvml, handle) -> float | None:
    """Summed SM utilization of other processes over the last second, None if unknown."""
    since = time.time_ns() // 1000 - 1_000_000  # NVML time stamps are microseconds
    try:
        samples = nvml.nvmlDeviceGetProcessUtilization(handle, since)
    except nvml.NVMLError as exc:
        if getattr(exc, "value", None) == nvml.NVML_ERROR_NOT_FOUND:
            return 0.0  # no process ran a kernel in that window
        return None
    newest: dict[int, tuple[int, int]] = {}
    for s in samples:
        if s.pid != os.getpid() and s.timeStamp >= newest.get(s.pid, (-1, 0))[0]:
            newest[s.pid] = (s.timeStamp, s.smUtil)
    return min(1.0, sum(u for _, u in newest.values()) / 100.0)
