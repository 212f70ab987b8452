"""The ``forall`` call site: run a kernel over every index of an extent.

``device`` may be None (the default device), a device id, a Device, a list of them, a
LogicalDevice or a Context. One device runs the whole launch; several co-execute it
with work stealing (see :mod:`hetflow.runtime.coexec`).
"""
from __future__ import annotations

import numpy as np

from ..errors import KernelArgumentError
from ..ir.capture import current_graph
from ..platform.context import Context
from ..platform.devices import Device, cpu_device, devices, get_device
from ..platform.matching import LogicalDevice
from . import cpu, gpu
from .buffers import acquired, wrote
from .launch import bind, is_device_array


def _default_devices(args) -> tuple[Device, ...]:
    """Data on a GPU runs on that GPU's kind of device; anything else on the CPU."""
    for a in args:
        if type(a) is not np.ndarray and (is_device_array(a) or is_device_array(getattr(a, "root", None))):
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
    if isinstance(device, (str, Device)):
        return (get_device(device) if isinstance(device, str) else device,)
    try:
        return tuple(get_device(d) if isinstance(d, str) else d for d in device)
    except TypeError:
        raise KernelArgumentError(f"device must be an id, a Device, a list, a LogicalDevice or a "
                                  f"Context; got {type(device).__name__}") from None


def run_on(launch) -> None:
    """Run a bound launch whole on its one device (coherent arrays' copies there made
    current first, and what it wrote marked current there alone after)."""
    if launch.plan.buffers:
        launch = acquired(launch)
    if launch.device.kind == "cpu":
        cpu.run(launch, launch.device.compute_units)
    else:
        gpu.run(launch)
    if launch.plan.buffers:
        wrote(launch, launch.written)


def forall(extent, kernel, *args, device=None, schedule=None, shares=None):
    """Run ``kernel`` at every index of ``extent`` (an int, a tuple, an array or a view).

    With several devices the loop is co-executed by all their workers (CPU cores, GPU
    streams); ``schedule`` is 'steal' (the default there: work stealing from predicted
    shares) or 'static' (split once by ``shares`` or the prediction), and the run report
    is returned (also kept for ``hetflow.last_report()``). On one CPU device the rows are
    split evenly over its cores unless a ``schedule`` is named, which runs the same
    worker machinery on the cores alone.
    """
    g = current_graph()
    if g is not None:  # capturing a DIR: record, run later (hetflow.graph)
        return g.record("forall", extent=extent, kernel=kernel, args=args, device=device, shares=shares,
                        schedule=schedule)
    if schedule not in (None, "steal", "static"):
        raise KernelArgumentError(f"schedule must be 'steal' or 'static', got {schedule!r}")
    targets = resolve_devices(device, args)
    if len(targets) > 1 or schedule is not None:
        from .coexec import co_forall

        return co_forall(extent, kernel, args, targets, schedule=schedule or "steal", shares=shares)
    run_on(bind(kernel, extent, args, targets[0]))
