"""What the ``forall`` call site (:mod:`hetflow.callsites`) runs: a kernel over every index
of an extent.

``device`` may be None (the default device), a device id, ``'all'`` (every device),
``'gpu'`` (every GPU, or the CPU where there is none), a Device, a list of them, a
LogicalDevice or a Context. One device runs the whole launch; several co-execute it
with work stealing (see :mod:`hetflow.runtime.coexec`). Either way the call returns
its run report.

``shares`` are one number per device, in the order of the device list, and are checked
whatever runs. One device takes one positive number, which changes nothing: that device
runs every row (split evenly over its cores under a ``schedule``; a GPU alone ignores
the schedule and runs the launch whole).
"""
from __future__ import annotations

import numpy as np

from ..errors import ArgumentError
from ..index.arrays import gpu_ordinal
from ..platform.context import Context
from ..platform.devices import Device, cpu_device, device_list, find_devices, gpus
from ..platform.matching import LogicalDevice
from . import aliasing
from .coexec import co_forall
from .launch import bind, is_device_array, normalize_extent
from .one_device import run_on
from .steal import check_shares


# Argument types that are never on a GPU: skipped without probing their attributes,
# which costs more than the rest of a small launch's device choice.
_HOST_TYPES = frozenset((np.ndarray, float, int, bool, complex))


def _default_devices(args) -> tuple[Device, ...]:
    """Data on a GPU runs on the GPU holding it (the first such argument's); anything
    else on the CPU."""
    for a in args:
        if type(a) not in _HOST_TYPES:
            root = a if is_device_array(a) else getattr(a, "root", None)
            if is_device_array(root):
                gpu = holding_gpu(root)
                if gpu is not None:
                    return (gpu,)
    return (cpu_device(),)


def holding_gpu(array) -> Device | None:
    """The GPU whose memory holds device array ``array``: the first GPU where that cannot
    be told (the simulator's arrays); None on a machine without GPUs."""
    table = gpus()
    ordinal = gpu_ordinal(array) if len(table) > 1 else None
    return next((d for d in table if d.ordinal == ordinal), table[0] if table else None)


def resolve_devices(device, args=()) -> tuple[Device, ...]:
    """The physical devices a call site runs on."""
    if device is None:
        return _default_devices(args)
    if isinstance(device, (Context, LogicalDevice)):
        if not device.devices:
            raise ArgumentError(f"device {device!r} holds no device; give it at least one")
        return device.devices
    if isinstance(device, str):
        return find_devices(device)
    return device_list((device,) if isinstance(device, Device) else device, "device",
                       "an id, 'all', 'gpu', a Device, a list of ids or Devices, a LogicalDevice or a Context")


def check_schedule(schedule) -> None:
    """ArgumentError unless ``schedule`` is None, 'steal' or 'static' (also where a graph
    records a launch: its devices, though, may be a planning topology's, checked when it
    runs)."""
    if schedule not in (None, "steal", "static"):
        raise ArgumentError(f"schedule must be 'steal' or 'static', got {schedule!r}")


def _device_shares(shares, targets) -> np.ndarray:
    """``shares`` as fractions summing to 1, checked to be one finite, non-negative number
    per device of ``targets``, in order, not all zero."""
    count = len(targets)
    if hasattr(shares, "__len__") and not isinstance(shares, (str, dict)) and len(shares) != count:
        ids = ", ".join(d.id for d in targets)
        raise ArgumentError(f"shares must be {count} non-negative numbers, one per device ({ids}), not all "
                            f"zero; got {len(shares)} shares: {shares!r}")
    return check_shares(shares, count, per="device")


def forall(extent, kernel, *args, device=None, schedule=None, shares=None, snapshot=False):
    """:func:`hetflow.forall` (which documents it), run now."""
    return run_forall(extent, kernel, args, device, schedule, shares, snapshot)


def run_forall(extent, kernel, args, device, schedule, shares, snapshot):
    """:func:`forall` with every argument by position: what the call site calls, passing
    them on at less cost than by keyword (a warm launch takes a few microseconds)."""
    if snapshot:
        args = aliasing.snapshot(kernel, normalize_extent(extent), args)
    targets = _default_devices(args) if device is None else resolve_devices(device, args)
    if shares is not None:
        shares = _device_shares(shares, targets)
    if schedule is not None:
        check_schedule(schedule)
    # One device runs the launch whole; one CPU under a schedule runs the worker machinery
    # on its cores, while one GPU has no one to share rows with (chunks would only cost).
    if len(targets) == 1 and (schedule is None or targets[0].kind == "gpu"):
        return run_on(bind(kernel, extent, args, targets[0]))
    return co_forall(extent, kernel, args, targets, schedule=schedule or "steal", shares=shares)
