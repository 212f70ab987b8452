"""The local interpreter of one rank: its part of the program, on its own devices.

From the central interpreter's partially materialised DIR (launches cut into pieces
with ``place`` and ``rows``, :mod:`hetflow.cluster.central`) it takes the pieces placed on
this rank and makes them runnable here (SPEC §4.4): each launch over views of the
rank's local storage (:mod:`hetflow.cluster.plan`), and a halo exchange before every
launch that reads halo rows written since they were last exchanged. Its own rules,
monitor and topology (this rank's CPU cores and GPUs) then fully materialise the DIR:
they place launches on the devices (the runtime's model co-executes them with work
stealing, or runs them on the fastest device alone), compile kernels the devices lack,
and re-adjust on local feedback — a device failing, another process taking part of a
device, a device that keeps running none of a launch (its copies outlast the loop on
the others). At report points it tells the
central interpreter what it measured: rows run per second its launches worked on its
devices, and the share of its devices still available (``rank.available``).
"""
from __future__ import annotations

import dataclasses
import itertools

from hetflow.cluster import halo
from hetflow.cluster.darray import as_view
from hetflow.cluster.plan import plan_for
from hetflow.ir import Compile, Interpreter, Monitor, NodePattern, Rule, RuleSet, Topology
from hetflow.ir.actions import compile_guard
from hetflow.ir.defaults import drop_idle_devices, drop_lost_devices, idle_devices
from hetflow.ir.graph import Node, Version
from hetflow.ir.runner import run_version
from hetflow.platform.devices import get_device

# The least share a busy device keeps: it still steals work when the other user leaves.
MIN_SHARE = 0.05
# Launches' work kept between reports before the finished ones are summed.
KEPT_WORK = 64


def _lacks_executable(ctx, match) -> bool:
    node = match.node
    ndim = len(node.extent)
    return any(compile_guard(node.kernel, d, ndim) not in ctx.cache for d in ctx.topology.devices)


def _utilizations(ctx) -> dict:
    """Device id -> the share of it that other work takes (0 when nothing was reported)."""
    return {d.id: float(ctx.variables.get(f"{d.id}.utilization", 0.0)) for d in ctx.topology.devices}


def _busy_shares(ctx, match):
    """The matched launch spread over this rank's devices in proportion to what other
    work leaves of each (None: already so)."""
    node = match.node
    used = _utilizations(ctx)
    idle = idle_devices(ctx, node, used)
    kept = [d for d in used if d not in idle] or list(used)  # drop-idle-devices keeps one too
    shares = {d: max(MIN_SHARE, 1.0 - used[d]) for d in kept}
    total = sum(shares.values())
    shares = {d: round(s / total, 6) for d, s in shares.items()}
    if node.attrs.get("shares") == shares:
        return None
    return node.with_attrs(devices=tuple(shares), shares=shares)


def _shared(ctx, match) -> bool:
    return len(ctx.topology.devices) > 1 and any(u > 0 for u in _utilizations(ctx).values())


def _my_devices(ctx, match):
    """The matched launch placed on every device of this rank, without shares: the
    runtime measures them and co-executes, or runs it on the fastest alone (a GPU keeping
    coherent blocks takes the whole stencil), as a one-process launch on several devices."""
    return match.node.with_attrs(devices=tuple(d.id for d in ctx.topology.devices))


def _availability(ctx, match) -> None:
    """``rank.available``: what other work leaves of this rank's devices, weighted by
    their measured throughput (equally until measured)."""
    weights = {d.id: float(ctx.variables.get(f"throughput.{d.id}", 1.0)) for d in ctx.topology.devices}
    total = sum(weights.values())
    if total <= 0:
        return None
    used = _utilizations(ctx)
    ctx.variables["rank.available"] = round(sum(w * (1.0 - used[d]) for d, w in weights.items()) / total, 6)
    return None


def local_rules() -> RuleSet:
    """A rank's default local rules, highest priority first."""
    return RuleSet([
        Rule("drop-lost-devices", match=NodePattern(op="forall"), then=drop_lost_devices, priority=90,
             description="take removed or failed devices out of placements"),
        Rule("drop-idle-devices", when="defined('devices.idle') and devices.idle > 0",
             match=NodePattern(op="forall"), then=drop_idle_devices, priority=85,
             description="take a device that keeps running none of a launch out of it"),
        Rule("compile-missing", match=NodePattern(op="forall"), when=_lacks_executable, then=Compile(),
             priority=70, description="compile each kernel for the devices of this rank that lack it"),
        Rule("share-busy-devices", match=NodePattern(op="forall"), when=_shared, then=_busy_shares,
             priority=60, description="shares in proportion to what other work leaves of each device"),
        Rule("use-my-devices", match=NodePattern(op="forall", attrs={"devices": None}), then=_my_devices,
             priority=50, description="place launches on all of this rank's devices; the runtime's "
                                      "performance model splits them or picks the fastest alone"),
        Rule("availability", then=_availability, priority=40,
             description="report how much of this rank's devices other work leaves"),
    ])


class HaloExchange:
    """The function of a ``halo`` node: exchange ``arr``'s halo rows (``once``: only on
    the first iteration after the program was materialised or run was called)."""

    def __init__(self, arr, once: bool, owner: "LocalInterpreter"):
        self.arr, self.once, self.owner = arr, once, owner
        self.__name__ = f"halo_{arr.name}"

    def __call__(self, storage) -> None:
        if self.once and not self.owner.first_iteration:
            return
        halo.exchange(self.arr)


class LocalInterpreter:
    """One rank's interpreter: ``devices`` (ids or records) are its topology.

    ``rules``: its RuleSet (default :func:`local_rules`); ``monitor``: its monitor
    (default: one over ``devices`` with no sampled sources — feedback comes from run
    reports and ``monitor.inject``/``set``); ``blocks_on``: the GPU (device record)
    holding the rank's blocks, None for host memory; ``graph``: the captured program's
    name, which its errors give.
    """

    def __init__(self, rank: int, devices, *, rules: RuleSet | None = None, monitor: Monitor | None = None,
                 blocks_on=None, graph: str = "graph"):
        self.rank = rank
        self.graph = graph
        records = [get_device(d) if isinstance(d, str) else d for d in devices]
        self.monitor = monitor if monitor is not None else Monitor(Topology(records), sources=[])
        # A launch on a GPU returns once enqueued: a report waits for the GPUs (this
        # rank's, and the one holding its blocks) before reading what the launches took.
        gpus = {d.id: d for d in (*records, blocks_on) if d is not None and d.kind == "gpu"}
        self.gpus = [d for d in gpus.values() if not d.simulated]
        self.rules = rules if rules is not None else local_rules()
        self.interpreter = Interpreter(self.monitor, rules=self.rules, place=rank)
        self.versions: list[Version] = []
        self.first_iteration = True  # of a run: halos exchanged "once" are exchanged again
        self._warm = False  # whether an iteration ran since the parts were made: it is timed
        self._ids = itertools.count()  # the local DIR's own node ids (``origin``: the captured ones)
        self._rows = 0  # launch rows one iteration runs here
        # since the last report: rows run, seconds of the launches' work summed, the
        # LaunchWork of those whose GPUs may still be running them
        self._window = (0, 0.0, [])

    @property
    def current(self) -> Version | None:
        return self.versions[-1] if self.versions else None

    def add_rules(self, rules) -> None:
        """Rules sent by the central interpreter, added to this rank's own."""
        for rule in rules:
            if rule.name not in self.rules:
                self.rules.add(rule)

    def materialise(self, central: Version, bounds) -> Version:
        """This rank's runnable version of ``central``'s pieces under block ``bounds``."""
        mine = [n for n in central.nodes if n.attrs.get("place") == self.rank]
        plans = [(piece, plan_for(piece.attrs["whole"].extent, piece.attrs["whole"].kernel,
                                  piece.attrs["whole"].args)) for piece in mine]
        written = {_base(piece, k).serial for piece, plan in plans for k in plan.written}
        dirty, exchanged, nodes = set(written), set(), []
        for piece, plan in plans:
            whole = piece.attrs["whole"]
            plan.check(bounds)
            # The same on every rank: halo_arrays looks at every rank's rows.
            for arr in plan.halo_arrays(whole.args, bounds):
                if arr.serial in dirty or arr.serial not in exchanged:
                    nodes.append(self._halo_node(arr, once=arr.serial not in dirty))
                dirty.discard(arr.serial)
                exchanged.add(arr.serial)
            part = plan.localise(whole.args, self.rank, bounds)
            if part is not None:
                # the captured schedule holds for every rank's part (placement does not:
                # this rank's rules place its part on its own devices)
                schedule = {"schedule": whole.attrs["schedule"]} if "schedule" in whole.attrs else {}
                nodes.append(Node(next(self._ids), "forall", part[1], whole.modes, whole.kernel, part[0],
                                  attrs={"place": self.rank, "rows": piece.attrs["rows"],
                                         "piece": piece.attrs["piece"], **schedule},
                                  rules=whole.rules, origin=(whole.id,)))
            dirty |= {_base(piece, k).serial for k in plan.written}
        self._rows = sum(n.extent[0] for n in nodes if n.op == "forall")
        parent = self.current.number if self.current else None
        # Earlier versions keep their number and reason, not their nodes: those hold views
        # of the blocks as they were cut then, which would keep that memory (a GPU's too).
        self.versions = [dataclasses.replace(v, nodes=()) for v in self.versions]
        self.versions.append(Version(len(self.versions), tuple(nodes), parent,
                                     f"materialised central v{central.number} ({central.reason})"))
        self.first_iteration, self._warm = True, False
        self.adjust(force=True)
        return self.current

    def _halo_node(self, arr, once: bool) -> Node:
        return Node(next(self._ids), "halo", (arr.local,), ("rw",),
                    attrs={"fn": HaloExchange(arr, once, self), "name": f"halo({arr.name})",
                           "place": self.rank, "once": once})

    def adjust(self, force: bool = False) -> Version:
        """A safe point: evaluate the local rules when feedback arrived (or ``force``)."""
        if force or self.monitor.pending():
            adjusted = self.interpreter.adjust(self.current.nodes, self.rules, new_id=lambda: next(self._ids))
            if adjusted is not None:
                nodes, fired, events = adjusted
                reason = "rules: " + (", ".join(fired) or "none")
                if events:
                    reason += "; events: " + ", ".join(dict.fromkeys(e.kind for e in events))
                self.versions.append(Version(len(self.versions), nodes, self.current.number, reason))
        return self.current

    def run(self) -> None:
        """Run the current version once (one iteration of the program)."""
        work = []
        run_version(self.current, self.monitor, self.graph, work)
        # The first iteration of new parts loads kernels and makes device copies; later
        # ones count, also the first of each run() (a loop calling run(1) is measured).
        if self._warm:
            rows, seconds, pending = self._window
            pending += work
            if len(pending) > KEPT_WORK:  # sum the finished ones: each holds CUDA events
                seconds, pending = _fold(seconds, pending)
            self._window = (rows + self._rows, seconds, pending)
        self.first_iteration, self._warm = False, True

    def capacity(self, cpu_threads: int) -> dict:
        """A first guess of this rank's speed, before anything ran: a CPU core counts
        one, a GPU as many as its multiprocessors (measurement corrects it)."""
        devices = self.monitor.topology.devices
        capacity = sum(cpu_threads if d.kind == "cpu" else d.compute_units for d in devices)
        return {"capacity": max(1, capacity), "devices": [d.id for d in devices]}

    def report(self) -> dict:
        """Rows run since the last report, the seconds their launches worked on this
        rank's devices, and ``rank.available``. The launches' time alone, without halo
        exchanges and the host's time between launches, which cost every rank alike
        whatever its rows: counted in, they made a rank's rate grow with its rows (a GPU
        runs a step in tens of microseconds), and two equal GPUs were cut 4:1."""
        for gpu in self.gpus:
            gpu.synchronize()
        rows, seconds, pending = self._window
        self._window = (0, 0.0, [])
        return {"rows": rows, "seconds": seconds + sum(w.seconds() for w in pending),
                "available": float(self.monitor.get("rank.available", 1.0))}


def _fold(seconds: float, pending: list) -> tuple:
    """``seconds`` plus the work of the finished launches of ``pending``; the others."""
    kept = []
    for work in pending:
        if work.done():
            seconds += work.seconds()
        else:
            kept.append(work)
    return seconds, kept


def _base(piece, k):
    """The distributed array behind argument ``k`` of a piece's launch."""
    return as_view(piece.attrs["whole"].args[k]).base
