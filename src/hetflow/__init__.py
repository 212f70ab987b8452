"""hetflow: data-parallel computing on heterogeneous machines.

Write a kernel once in Python; hetflow compiles it for every kind of device (CPU
cores through Numba, NVIDIA GPUs through numba-cuda), runs it over index spaces and
lazy views, and combines results across processes.
"""
from . import errors
from .errors import HetflowError  # the one exception class at top level; the rest are hetflow.errors.X
from .index import (Grid, asarray, co_map, cshift, extent, index, interior, partition, project, section,
                    tile, transpose)
from .kernels import Kernel, kernel
from . import atomic
from .platform import Context, Device, LogicalDevice, devices, get_device, select
from .ir import Monitor, Rule, RuleSet, graph
from .runtime.coexec import last_report
from .runtime.perfmodel import forget_performance_history
from .runtime.buffers import Buffer, array
from .runtime.events import Event, UserEvent
from .runtime.queue import Queue
from .callsites import empty, forall, reduce, scan, sort, wavefront, zeros
from . import library  # noqa: E402  (needs kernel and forall)
from . import cluster, collectives, trace  # noqa: E402
from .collectives import world  # noqa: E402

from ._version import __version__ as __version__

__all__ = ["Buffer", "Context", "atomic", "Device", "Event", "Grid", "HetflowError", "Kernel",
           "LogicalDevice", "Monitor", "Queue", "Rule", "RuleSet", "UserEvent", "array", "asarray",
           "cluster", "co_map", "collectives", "cshift", "devices", "empty", "errors", "extent",
           "forall", "forget_performance_history", "get_device", "graph", "index", "interior",
           "kernel", "last_report", "library", "partition", "project", "reduce", "scan", "section",
           "select", "sort", "tile", "trace", "transpose", "wavefront", "world", "zeros"]
