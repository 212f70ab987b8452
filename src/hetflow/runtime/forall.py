"""The ``forall`` call site: run a kernel over every index of an extent.

``device`` may be None (the default device), a device id, ``'all'`` (every device),
``'gpu'`` (every GPU, or the CPU where there is none), a Device, a list of them, a
LogicalDevice or a Context. One device runs the whole launch; several co-execute it
with work stealing (see :mod:`hetflow.runtime.coexec`). Either way the call returns
its run report.
"""
from __future__ import annotations

from time import perf_counter

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError
from ..ir.capture import current_graph
from ..platform.context import Context
from ..platform.devices import Device, cpu_device, devices, find_devices, get_device
from ..platform.matching import LogicalDevice
from . import aliasing, cpu, gpu, staging
from .buffers import acquired, wrote
from .launch import bind, is_device_array, normalize_extent
from .report import LaunchReport
from ..trace.recorder import notify as trace_notify


# Argument types that are never on a GPU: skipped without probing their attributes,
# which costs more than the rest of a small launch's device choice.
_HOST_TYPES = frozenset((np.ndarray, float, int, bool, complex))


def _default_devices(args) -> tuple[Device, ...]:
    """Data on a GPU runs on that GPU's kind of device; anything else on the CPU."""
    for a in args:
        if type(a) not in _HOST_TYPES and (is_device_array(a) or is_device_array(getattr(a, "root", None))):
            gpus = [d for d in devices() if d.kind == "gpu"]
            if gpus:
                return (gpus[0],)
    return (cpu_device(),)


def resolve_devices(device, args=()) -> tuple[Device, ...]:
    """The physical devices a call site runs on."""
    if device is None:
        return _default_devices(args)
    if isinstance(device, Context):
        return device.devices
    if isinstance(device, LogicalDevice):
        return device.devices
    if isinstance(device, str):
        return find_devices(device)
    if isinstance(device, Device):
        return (device,)
    if type(device) in (list, tuple) and all(type(d) is str for d in device):
        found = _resolved.get(tuple(device))  # ids name the same devices all along: looked up once
        if found:
            return found
    try:
        found = tuple(get_device(d) if isinstance(d, str) else d for d in device)
    except TypeError:
        raise ArgumentTypeError(f"device must be an id, 'all', 'gpu', a Device, a list of ids or "
                                f"Devices, a LogicalDevice or a Context; got {type(device).__name__}") from None
    if not found:
        raise ArgumentError(f"device {device!r} names no device; give at least one")
    if all(type(d) is str for d in device):
        _resolved[tuple(device)] = found
    return found


_resolved: dict = {}  # a list of device ids -> its devices


def run_on(launch, wait: bool = False) -> LaunchReport:
    """Run a bound launch whole on its one device; its report. Coherent arrays' copies
    there are made current first, and what it wrote is marked current there alone.
    The report's time is the launch's own (copies excluded): on a GPU only the time to
    enqueue it, unless ``wait``, which waits for the GPU to finish it."""
    dev = launch.device
    buffers = launch.plan.buffers
    if buffers:
        launch = acquired(launch)
    t0, pieces = perf_counter(), None
    if dev.kind == "cpu":
        pieces = cpu.run(launch, dev.compute_units)
    else:
        staging.run(launch)
        if wait and not dev.simulated:
            gpu.synchronize(dev)
    report = LaunchReport(launch.extent[0], dev, perf_counter() - t0, pieces)
    if buffers:
        wrote(launch, launch.written)
    trace_notify(report, label=launch.kernel.name)  # traces show launches on one device too
    return report


def forall(extent, kernel, *args, device=None, schedule=None, shares=None, snapshot=False):
    """Run ``kernel`` at every index of ``extent`` (an int, a tuple, an array or a view).

    ``device``: None (the CPU, or the GPU holding GPU arguments), a device id, 'all'
    (every device), 'gpu' (every GPU, or the CPU on a machine without one), or a list of
    ids. With several devices the loop is co-executed by all their workers (CPU cores,
    GPU streams); ``schedule`` is 'steal' (the default there: work stealing from
    predicted shares) or 'static' (split once by ``shares`` or the prediction), and the
    report is also kept for ``hetflow.last_report()``. On one CPU device the rows are
    split evenly over its cores unless a ``schedule`` is named, which runs the same
    worker machinery on the cores alone.

    A launch that writes, through one argument, elements another argument (a view or a
    slice of the same array) reads at other indices raises ShapeError: devices run
    indices in no fixed order. ``snapshot=True`` gives it NumPy's meaning instead, reading copies of those
    arguments (:mod:`hetflow.runtime.aliasing`).

    Returns the run report (:class:`hetflow.runtime.report.RunReport`): per worker,
    chunks, indices, steals and busy time; a launch run whole on one device has one
    worker and schedule 'one-device'.
    """
    g = current_graph()
    if g is not None:  # capturing a DIR: record, run later (hetflow.graph)
        return g.record("forall", extent=extent, kernel=kernel, args=args, device=device, shares=shares,
                        schedule=schedule, snapshot=snapshot)
    if snapshot:
        args = aliasing.snapshot(kernel, normalize_extent(extent), args)
    targets = _default_devices(args) if device is None else resolve_devices(device, args)
    if schedule is None and len(targets) == 1:
        return run_on(bind(kernel, extent, args, targets[0]))
    if schedule not in (None, "steal", "static"):
        raise ArgumentError(f"schedule must be 'steal' or 'static', got {schedule!r}")
    from .coexec import co_forall

    return co_forall(extent, kernel, args, targets, schedule=schedule or "steal", shares=shares)
