"""Capturing a program as a DIR: ``with hetflow.graph() as g: ...`` then ``g.run()``.

Inside the ``with`` block, hetflow's call sites (:mod:`hetflow.callsites`: ``forall``,
``reduce``, ``scan``, ``sort``, ``wavefront``) and allocations (``empty``, ``zeros``) do
not run: they ask
:func:`current_graph` and, when a graph is capturing, call :meth:`Graph.record`,
which adds a node and returns a lazy stand-in for the result. ``g.run()`` then
evaluates the rules at a safe point (producing new DIR versions when they change the
graph) and executes the current version; it can be called again, and
``g.run(iterations=N)`` runs N iterations with a safe point before each.

Lazy arrays allocated inside the graph are temporaries: the rules may fuse them away
(they are then never allocated). Mark the ones read after the run with ``g.output``.

The record API (what call sites pass):

- ``record("forall", extent=, kernel=, args=(), device=None, shares=None, schedule=None, snapshot=False)``
  -> None (``shares``: a dict by device id, or a list in the order of ``device``)
- ``record("alloc", shape=, dtype=float64, fill=None, factory=None, name=None)``
  -> a :class:`LazyArray` (``fill=0`` for zeros; ``factory(shape, dtype)`` allocates)
- ``record(op, fn=, args=(), kwargs=None, writes=(), alias=None)`` -> a :class:`Handle`
  for any other operation: ``fn(*args, **kwargs)`` runs it; ``writes`` lists the
  positions (or keyword names) of arguments it writes; ``alias`` the position (or
  name) of the argument the result is a view of (view creation). The arguments after
  a kernel among ``args`` (``(extent, kernel, *args)``) are read and written as its
  access says.
"""
from __future__ import annotations

import contextvars
import itertools
import numbers
import os

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError
from ..kernels.kernel import Kernel
from ..runtime.forall import check_schedule
from ..runtime.launch import normalize_extent, with_defaults
from . import graph as _graph
from .graph import Node, Version
from .interpreter import Interpreter
from .monitor import Monitor
from .rules import Rule
from .ruleset import RuleSet
from .runner import run_version
from .values import Handle, LazyArray, is_data, root

_current: contextvars.ContextVar = contextvars.ContextVar("hetflow_graph", default=None)


# current_graph() -> the graph being captured in this thread (None outside ``with
# hetflow.graph()``): the context variable's own getter, as every call site asks it first
# and a Python function around it costs a tenth of a small launch's binding.
current_graph = _current.get


def graph(name: str = "graph", *, monitor: Monitor | None = None,
          interpreter: Interpreter | None = None) -> "Graph":
    """A new graph to capture with ``with``; see :class:`Graph`."""
    return Graph(name, monitor=monitor, interpreter=interpreter)


def _device_ids(device) -> tuple:
    if device is None:
        return ()
    if isinstance(device, str):
        return (device,)
    if hasattr(device, "devices"):  # a Context or a LogicalDevice
        return tuple(d.id for d in device.devices)
    if hasattr(device, "id"):
        return (device.id,)
    return tuple(d if isinstance(d, str) else d.id for d in device)


def _kernel_modes(args: tuple, modes: tuple) -> tuple:
    """``modes`` with the arguments that follow a kernel among ``args`` (the form
    ``(extent, kernel, *args)`` of wavefront and of reduce's kernel form) read and
    written as the kernel's access says: a sweep writes its arrays in place, and a
    graph that took them as read would move it after launches reading them."""
    for k, arg in enumerate(args):
        if isinstance(arg, Kernel):
            data = args[k + 1:]
            ndim = len(arg.params) - len(data)
            if not data or ndim < 1:
                return modes  # an op (reduce's, scan's), or the wrong count: said when it runs
            access = arg.access(ndim)
            found = tuple(access.modes.get(p, "") if is_data(v) else "" for p, v in zip(arg.params[ndim:], data))
            return modes[:k + 1] + tuple(_union(a, b) for a, b in zip(modes[k + 1:], found)) + modes[len(args):]
    return modes


def _union(a: str, b: str) -> str:
    return "".join(m for m in "rw" if m in a or m in b)


class Graph:
    """A captured program: its DIR versions, its interpreter, and how to run it."""

    def __init__(self, name: str = "graph", *, monitor: Monitor | None = None,
                 interpreter: Interpreter | None = None):
        if interpreter is not None and monitor is not None and interpreter.monitor is not monitor:
            raise ArgumentError("give either a monitor or an interpreter (which has its monitor), not both")
        self.name = name
        self.interpreter = interpreter if interpreter is not None else Interpreter(monitor)
        self.versions: list[Version] = []
        self.current: Version | None = None
        self.rules: RuleSet | None = None
        self._pending: list[Node] = []
        self._state = "new"
        self._token = None
        self._ids = itertools.count()
        self._names = _graph.Names()
        self._lazy: list[LazyArray] = []
        self._outputs: dict[int, object] = {}
        self._derived_with: RuleSet | None = None
        self._inputs = None
        self._bases = None
        self._input_key = None
        self._lazy_for = None

    @property
    def monitor(self) -> Monitor:
        return self.interpreter.monitor

    # -- capture -------------------------------------------------------------------------
    def __enter__(self) -> "Graph":
        if _current.get() is not None:
            raise ArgumentError("graphs do not nest: a graph is already being captured in this thread")
        if self._state != "new":
            raise ArgumentError(f"graph {self.name!r} was already captured; make a new one with hetflow.graph()")
        self._token = _current.set(self)
        self._state = "capturing"
        return self

    def __exit__(self, exc_type, exc, tb):
        _current.reset(self._token)
        ended = "captured" if exc_type is None else "raised"
        for node in self._pending:  # even by a capture that raised: a read says why it has no value
            if isinstance(node.result, (Handle, LazyArray)):
                node.result.capture = ended
        if exc_type is not None:
            self._state = "failed"
            return False
        self._state = "captured"
        self.versions = [Version(0, tuple(self._pending), None, "captured")]
        self.current = self.versions[0]
        return False

    def _new_id(self) -> int:
        return next(self._ids)

    def record(self, op: str, **attrs):
        """Add an operation to the graph being captured; see the module docstring."""
        if self._state != "capturing":
            raise ArgumentError(f"graph {self.name!r} is not capturing; record operations inside "
                                f"'with hetflow.graph() as g:'")
        if op == "forall":
            return self._record_forall(**attrs)
        if op == "alloc":
            return self._record_alloc(**attrs)
        return self._record_call(op, **attrs)

    def _record_forall(self, extent, kernel, args=(), device=None, shares=None, schedule=None, snapshot=False):
        if not isinstance(kernel, Kernel):
            raise ArgumentTypeError(f"{kernel!r} is not a hetflow kernel; decorate it with @hetflow.kernel")
        extent = normalize_extent(extent)
        ndim = len(extent)
        data = kernel.params[ndim:]
        args = with_defaults(kernel, ndim, tuple(args))  # the parameters left out take their defaults, as at once
        if len(data) != len(args):
            raise ArgumentTypeError(
                f"kernel {kernel.name!r} takes {len(data)} data argument(s) ({', '.join(data)}) after its "
                f"{ndim} index parameter(s) ({', '.join(kernel.params[:ndim])}), but {len(args)} were given")
        check_schedule(schedule)  # (its devices may be the interpreter topology's: checked when it runs)
        access = kernel.access(ndim)
        attrs = {}
        if device is not None:
            attrs["devices"] = _device_ids(device)
        if shares is not None:
            ids = attrs.get("devices", ())
            attrs["shares"] = dict(shares) if isinstance(shares, dict) else dict(zip(ids, shares))
        if schedule is not None:
            attrs["schedule"] = schedule
        if snapshot:
            attrs["snapshot"] = True
        self._add(Node(self._new_id(), "forall", tuple(args), tuple(access.modes.get(p, "") for p in data),
                       kernel=kernel, extent=extent, attrs=attrs))
        return None

    def _record_alloc(self, shape, dtype=np.float64, fill=None, factory=None, name=None):
        lazy = LazyArray(shape, dtype, fill=fill, factory=factory, name=name or f"t{len(self._lazy)}",
                         graph=self.name)
        self._lazy.append(lazy)
        kind = "zeros" if fill == 0 else "empty" if fill is None else "full"
        self._add(Node(self._new_id(), "alloc", result=lazy, attrs={"name": kind}))
        return lazy

    def _record_call(self, op, fn, args=(), kwargs=None, writes=(), alias=None):
        if not callable(fn):
            raise ArgumentError(f"record({op!r}): fn must be callable; got {fn!r}")
        kwargs = dict(kwargs or {})
        names = tuple(kwargs)
        values = tuple(args) + tuple(kwargs.values())
        positions = {**{k: k for k in range(len(args))}, **{n: len(args) + j for j, n in enumerate(names)}}
        try:
            written = {positions[w] for w in writes}
            aliased = None if alias is None else values[positions[alias]]
        except KeyError as exc:
            raise ArgumentError(f"record({op!r}): writes/alias name argument {exc.args[0]!r}, which was not given") from None
        modes = tuple(("rw" if k in written else "r") if is_data(v) else "" for k, v in enumerate(values))
        modes = _kernel_modes(args, modes)
        handle = Handle(op, f"{op}{sum(1 for n in self._pending if n.op == op)}", alias=aliased)
        attrs = {"fn": fn, "name": getattr(fn, "__name__", op)}
        if names:
            attrs["keywords"] = names
        self._add(Node(self._new_id(), op, values, modes, result=handle, attrs=attrs))
        return handle

    def _add(self, node: Node) -> None:
        self._pending.append(node)

    def empty(self, shape, dtype=np.float64) -> LazyArray:
        """A lazy uninitialised array of this graph (what hetflow.empty gives while capturing)."""
        return self.record("alloc", shape=shape, dtype=dtype)

    def zeros(self, shape, dtype=np.float64) -> LazyArray:
        """A lazy zero-filled array of this graph (what hetflow.zeros gives while capturing)."""
        return self.record("alloc", shape=shape, dtype=dtype, fill=0)

    def output(self, *arrays):
        """Mark lazy arrays as read after the run: they are kept (never fused away)."""
        for arr in arrays:
            if not isinstance(arr, LazyArray) or arr not in self._lazy:
                raise ArgumentError(f"output() takes lazy arrays allocated in graph {self.name!r}; got {arr!r}")
            if id(arr) not in self._outputs:
                self._outputs[id(arr)] = arr
                self._derived_with = None  # derive again: an earlier version may have fused it away
        return arrays[0] if len(arrays) == 1 else arrays

    def attach(self, rule: Rule, target=None) -> None:
        """Attach ``rule`` to a node: the last recorded one, a node id, or the node producing
        a lazy array or handle. Only while capturing."""
        if self._state != "capturing":
            raise ArgumentError("attach rules to nodes while capturing; afterwards, add them to a RuleSet")
        if not isinstance(rule, Rule):
            raise ArgumentError(f"attach() takes a Rule; got {type(rule).__name__}")
        if not self._pending:
            raise ArgumentError("attach(): nothing has been recorded yet")
        for k, node in enumerate(self._pending):
            if (target is None and k == len(self._pending) - 1) or node.id == target or (
                    target is not None and node.result is target):
                self._pending[k] = node.evolve(rules=node.rules + (rule,))
                return
        raise ArgumentError(f"attach(): no node {target!r} in graph {self.name!r}")

    # -- running ---------------------------------------------------------------------------
    def _ruleset(self, rules) -> RuleSet:
        if rules is None:
            if self.rules is None:
                self.rules = RuleSet.default()
            return self.rules
        if not isinstance(rules, RuleSet):
            hint = (f"; load the file once with hetflow.RuleSet.load({rules!r}) and pass that"
                    if isinstance(rules, (str, os.PathLike)) else "")
            raise ArgumentError(f"rules must be a RuleSet or None; got {type(rules).__name__}{hint}")
        return rules

    def _ready(self) -> None:
        if self._state == "capturing":
            raise ArgumentError(f"graph {self.name!r} is being captured: run or inspect it after its 'with' block")
        if self._state == "failed":
            raise ArgumentError(f"capture of graph {self.name!r} raised; nothing to run")
        if self._state == "new":
            raise ArgumentError(f"graph {self.name!r} is empty: capture it with 'with g:' first")

    def adjust(self, rules: RuleSet | None = None) -> Version:
        """A safe point without running: evaluate the rules if feedback arrived; the current version."""
        self._ready()
        ruleset = self._ruleset(rules)
        self.monitor.poll()
        if ruleset is not self._derived_with:
            self.current, self._derived_with = self.versions[0], ruleset
        self._check_inputs()
        if self.interpreter.due(self.current.nodes, ruleset):
            adjusted = self.interpreter.adjust(self.current.nodes, ruleset, new_id=self._new_id,
                                               outputs=frozenset(self._outputs))
            if adjusted is not None:
                nodes, fired, events = adjusted
                reason = "rules: " + (", ".join(fired) or "none")
                if events:
                    reason += "; events: " + ", ".join(dict.fromkeys(e.kind for e in events))
                self.current = Version(len(self.versions), nodes, self.current.number, reason)
                self.versions.append(self.current)
        return self.current

    def run(self, rules: RuleSet | None = None, iterations: int = 1) -> Version:
        """Run the program ``iterations`` times, with a safe point before each.

        ``rules=None`` uses the graph's rule set (``g.rules``, hetflow's defaults to begin
        with); ``RuleSet()`` runs with no rules. Passing another rule set than last time
        derives the versions again from the captured one. Returns the version that ran last.
        """
        if isinstance(iterations, bool) or not isinstance(iterations, numbers.Integral) or iterations < 1:
            raise ArgumentError(f"iterations must be an integer >= 1; got {iterations!r}")
        self._not_inside_capture()
        for _ in range(int(iterations)):
            version = self.adjust(rules)
            self._set_lazy_states(version)
            run_version(version, self.monitor, self.name)
        return self.current

    def _not_inside_capture(self) -> None:
        # Running while another graph records would run now what reads as part of that graph.
        outer = _current.get()
        if outer is not None and outer is not self:
            raise ArgumentError(f"graphs do not nest: graph {self.name!r} cannot run while graph "
                                f"{outer.name!r} is being captured; run it before or after that 'with' block")

    def _set_lazy_states(self, version: Version) -> None:
        # Outputs are only ever added: the version and their count say whether states hold.
        if self._lazy_for == (version, len(self._outputs)):
            return
        self._lazy_for = (version, len(self._outputs))
        live = version.lazy_arrays() | set(self._outputs)
        why = {name: f"fused into {n.name} in version {version.number}"
               for n in version.nodes for name in n.attrs.get("eliminated", ())}
        for lazy in self._lazy:
            lazy._live(id(lazy) in live, why.get(lazy.name, f"not used by version {version.number}"))

    def _check_inputs(self) -> None:
        """Input size/type feedback: the arrays from outside, as the monitor sees them."""
        if self._bases is None or self._bases[0] is not self.current:
            bases = {}
            for node in self.current.nodes:
                for arg in node.args:
                    if is_data(arg) and not isinstance(arg, (LazyArray, Handle)):
                        base = root(arg)
                        bases[id(base)] = base
            self._bases = (self.current, list(bases.values()))
        if not self._bases[1]:
            return
        # Fast path of a safe point: the same arrays with the same shapes and dtypes.
        key = tuple((getattr(b, "shape", ()), getattr(b, "dtype", "")) for b in self._bases[1])
        if key == self._input_key:
            return
        self._input_key = key
        inputs = tuple(sorted((tuple(getattr(b, "shape", ())), str(getattr(b, "dtype", "")))
                              for b in self._bases[1]))
        if inputs == self._inputs:
            return
        size = sum(int(np.prod(s, dtype=np.int64)) for s, _ in inputs)
        dtype = max(inputs, key=lambda e: int(np.prod(e[0], dtype=np.int64)))[1]
        if self._inputs is None:
            self.monitor.set("input.size", size)
            self.monitor.set("input.dtype", dtype)
        else:
            self.monitor.inject("input_changed", size=size, dtype=dtype)
        self._inputs = inputs

    # -- inspection ------------------------------------------------------------------------
    def version(self, which=None) -> Version:
        """A version by number (default: the current one)."""
        self._ready()
        if which is None:
            return self.current
        if isinstance(which, Version):
            return which
        if isinstance(which, bool) or not isinstance(which, numbers.Integral) or not 0 <= which < len(self.versions):
            raise ArgumentError(f"graph {self.name!r} has no version {which!r} "
                                f"(versions 0..{len(self.versions) - 1}){self._why_unchanged()}")
        return self.versions[int(which)]

    def _why_unchanged(self) -> str:
        """Why no rule has rewritten the graph yet, where one reason is certain: kernels
        without source (a REPL, ``exec``, ``python -``) cannot be fused."""
        if len(self.versions) > 1:
            return ""
        sourceless = sorted({n.kernel.name for n in self.versions[0].nodes
                             if isinstance(n.kernel, Kernel) and not n.kernel.has_source})
        if not sourceless:
            return ""
        return (f"; no rule has rewritten it, and kernel(s) {', '.join(sourceless)} cannot be fused "
                f"because their source is unavailable (defined in a REPL, exec or 'python -': "
                f"define them in a file)")

    def diff(self, a=None, b=None) -> str:
        """Nodes added, removed and changed from version ``a`` to ``b`` (default: the last change)."""
        new = self.version(b)
        old = self.version(a if a is not None else (new.parent if new.parent is not None else new.number))
        return _graph.diff(old, new, self._names)

    def to_dot(self, version=None) -> str:
        """Graphviz text of a version (default: the current one)."""
        return _graph.to_dot(self.version(version), self._names, self.name)

    def describe(self, version=None) -> str:
        """One line per node of a version, in execution order."""
        v = self.version(version)
        lines = [f"{self.name} v{v.number} ({v.reason})"]
        lines += ["  " + _graph.describe(n, self._names) for n in v.nodes]
        return "\n".join(lines)

    def __repr__(self):
        count = len(self.current.nodes) if self.current else len(self._pending)
        return f"<Graph {self.name} {self._state} nodes={count} versions={len(self.versions)}>"
