"""A bound launch run whole on its one device: what ``forall`` does with one device, and
what co-execution falls back to where sharing a launch out does not pay."""
from __future__ import annotations

from time import perf_counter

from . import cpu, gpu, staging
from .buffers import acquired, wrote
from .report import LaunchReport
from ..trace.recorder import notify as trace_notify


def run_on(launch, wait: bool = False) -> LaunchReport:
    """Run a bound launch whole on its one device; its report. Coherent arrays' copies
    there are made current first, and what it wrote is marked current there alone.
    The report's time is the launch's own (copies excluded): on a GPU only the time to
    enqueue it, unless ``wait``, which waits for the GPU to finish it."""
    dev = launch.device
    buffers = launch.plan.buffers
    if buffers:
        try:
            launch = acquired(launch)
        except Exception as exc:
            if dev.kind != "gpu":
                raise
            staging.raise_failure(launch, exc, [])  # nothing of it ran
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

