"""Right-hand sides of rules: what a rule does to the DIR when its predicate holds.

Every action has ``apply(ctx, match)``; it rewrites ``ctx`` (the working version, the
variables, the rule set) and raises on error, in which case the interpreter undoes the
firing and disables the rule. Values written as strings are rule expressions (Python
expressions, see :mod:`hetflow.ir.expressions`), evaluated when the action runs
(``Partition(shares={"gpu": "1 - gpu.utilization", "cpu": "gpu.utilization"})``).
Constant parameters are checked when the action is made, with bounds
(:data:`MAX_PIECES`), so that a rule cannot ask for unbounded work.
"""
from __future__ import annotations

import abc
import dataclasses
import logging
import math
from typing import Callable, Mapping

import numpy as np

from .. import library
from ..errors import RuleError
from ..kernels.kernel import Kernel
from ..platform.repository import repository
from . import codegen, fusion
from .expressions import Expr, finite, parse
from .graph import Node
from .patterns import Match
from .topology import description

log = logging.getLogger("hetflow.ir")

# Most pieces a split may cut a launch into: one per node of a large cluster, and far
# fewer than would exhaust memory with Node objects.
MAX_PIECES = 65536


def _expr(value):
    """Strings become parsed expressions; other values stay constants."""
    return parse(value) if isinstance(value, str) else value


def _names(*values) -> set:
    return set().union(*(v.names() for v in values if isinstance(v, Expr)))


def _origin(source) -> str:
    """Where an expression was written (``file: rule 'r', key 'k': ``), or '' for a constant."""
    where = getattr(source, "where", None)
    return f"{where}: " if where is not None else ""


def _pieces(count, source) -> int:
    """``count`` as a number of pieces, or RuleError naming ``source`` (the expression)."""
    if (isinstance(count, bool) or not isinstance(count, (int, float))
            or not finite(count) or count != int(count) or not 1 <= count <= MAX_PIECES):
        given = "got" if source is None else f"{source} gave"
        raise RuleError(f"{_origin(source)}split needs a whole number of pieces from 1 to {MAX_PIECES}; "
                        f"{given} {count!r}")
    return int(count)


def check_share(key, share, source=None) -> float:
    """``share`` when it is a finite number >= 0, else RuleError naming the device ``key``
    (and ``source``, the expression that gave it)."""
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not (finite(share) and share >= 0):
        raise RuleError(f"{_origin(source)}partition: share of {key!r} must be a finite number >= 0; "
                        f"got {share!r}" + (f" from {source}" if source is not None else ""))
    return share


class Action(abc.ABC):
    """Base of the actions; subclasses are frozen dataclasses."""

    @abc.abstractmethod
    def apply(self, ctx, match: Match) -> None:
        """Change ``ctx`` for one binding of the rule's pattern."""

    def names(self) -> set:
        """Variables the action's expressions read."""
        return set()


def _nodes(ctx, match: Match, op: str | None = None) -> list[Node]:
    """The matched nodes as they are now (earlier actions of the rule may have swapped them)."""
    now = [ctx.current(n) for n in match.nodes]
    return [n for n in now if n is not None and (op is None or n.op == op)]


# -- graph rewrites ----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Fuse(Action):
    """Fuse the matched producer-consumer chain into one generated kernel."""

    def apply(self, ctx, match):
        if len(match.nodes) < 2:
            raise RuleError("fuse needs a chain of two nodes or more (match a Chain pattern)")
        chain = _nodes(ctx, match)
        if len(chain) == len(match.nodes):
            fusion.fuse(ctx, chain)


@dataclasses.dataclass(frozen=True)
class Split(Action):
    """Cut each matched launch into ``pieces`` along its outermost dimension.

    ``pieces`` is a number or an expression (default: one piece per node,
    ``count('node')``); with ``place`` piece k gets ``place=k`` (the process that
    runs it), and pieces cut one per node record the node count (``nodes``) so that
    ``resplit-on-node-change`` knows them. Splitting a split launch again re-cuts the
    original; a local interpreter (one with a place) leaves pieces cut by the level
    above alone. A piece runs the kernel itself on its rows of the arrays where
    :func:`codegen.row_sliced` allows (it keeps writing only the rows of its launch
    index, so devices can share it), else an offset kernel.
    """

    pieces: object = "count('node')"
    place: bool = True

    def __post_init__(self):
        pieces = _expr(self.pieces)
        object.__setattr__(self, "pieces", pieces if isinstance(pieces, Expr) else _pieces(pieces, None))
        if not isinstance(self.place, bool):
            raise RuleError(f"split: place must be True or False; got {self.place!r}")

    def names(self):
        return _names(self.pieces)

    def apply(self, ctx, match):
        count = _pieces(ctx.evaluate(self.pieces, match), self.pieces if isinstance(self.pieces, Expr) else None)
        for node in _nodes(ctx, match, "forall"):
            self._split(ctx, node, count)

    def _split(self, ctx, node: Node, count: int) -> None:
        if ctx.scope is not None and "whole" in node.attrs:
            # A local interpreter refines its own piece; cutting pieces is the level above's.
            log.debug("split: node #%d is a piece placed by the level above; left as it is", node.id)
            return
        current = node.attrs.get("piece", (0, 1))[1]
        if current == count and (current == 1 or ("place" in node.attrs) == self.place):
            return  # (asked of every piece: checked before looking through the graph)
        whole = node.attrs.get("whole", node)
        group = [n for n in ctx.nodes if n is whole or n.attrs.get("whole") is whole]
        if count == 1:
            ctx.replace(group, [whole])
            return
        if not whole.kernel.compilable:
            log.debug("split: kernel %s has no code to compile; left whole", whole.name)
            return
        piece = _row_piece(whole) or _offset_piece(ctx, whole)
        n0, per_node = whole.extent[0], self.place and count == ctx.topology.count("node")
        pieces = []
        for k in range(count):
            lo, hi = k * n0 // count, (k + 1) * n0 // count
            if lo == hi:
                continue  # more pieces than rows: an empty piece has nothing to run
            attrs = dict(whole.attrs, whole=whole, piece=(k, count))
            if self.place:
                attrs["place"] = k
            if per_node:
                attrs["nodes"] = count
            kernel, args, modes = piece(lo, hi)
            pieces.append(Node(id=ctx.new_id(), op="forall", args=args, modes=modes, kernel=kernel,
                               extent=(hi - lo,) + tuple(whole.extent[1:]), attrs=attrs,
                               rules=whole.rules, origin=whole.origin or (whole.id,)))
        ctx.replace(group, pieces)


def _row_piece(whole: Node):
    """``(lo, hi) -> (kernel, args, modes)`` running the kernel itself on rows
    ``[lo, hi)`` of the arrays it indexes by row; None when it cannot (see
    :func:`codegen.row_sliced`; only NumPy arrays are cut, lazy values have no rows yet)."""
    ndim = len(whole.extent)
    cut = codegen.row_sliced(whole.kernel, ndim)
    if cut is None:
        return None
    rows = [p in cut for p in whole.kernel.params[ndim:]]
    if not all(isinstance(a, np.ndarray) for a, r in zip(whole.args, rows) if r):
        return None
    return lambda lo, hi: (whole.kernel, tuple(a[lo:hi] if r else a for a, r in zip(whole.args, rows)),
                           whole.modes)


def _offset_piece(ctx, whole: Node):
    """``(lo, hi) -> (kernel, args, modes)`` running the offset kernel of ``whole``."""
    ndim = len(whole.extent)
    kernel = ctx.cache.get_or_build(
        ("offset", whole.kernel.name, whole.kernel.source_hash), (), (("ndim", ndim),),
        lambda: _offset_kernel(whole.kernel, ndim))
    return lambda lo, hi: (kernel, whole.args + (lo,), whole.modes + ("",))


def _offset_kernel(kernel, ndim):
    src, namespace = codegen.offset_source(kernel, ndim)
    return Kernel.from_source(f"{kernel.name}_at", src, namespace)


@dataclasses.dataclass(frozen=True)
class Substitute(Action):
    """Replace operations by name: a kernel (or op) name -> a replacement.

    For ``forall`` nodes the key is the kernel's name and the replacement a kernel with
    the same parameters; for other operations the key is the operation and the
    replacement the function to call. A string names an entry of ``hetflow.library``
    (or of the ``kernels`` given when a rule file is loaded).
    """

    mapping: tuple = ()
    kernels: tuple = ()

    def __init__(self, mapping: Mapping, kernels: Mapping | None = None):
        object.__setattr__(self, "mapping", tuple(dict(mapping).items()))
        object.__setattr__(self, "kernels", tuple((kernels or {}).items()))

    def _resolve(self, value):
        if not isinstance(value, str):
            return value
        named = dict(self.kernels)
        if value in named:
            return named[value]
        return library.get(value)

    def apply(self, ctx, match):
        mapping = dict(self.mapping)
        for node in _nodes(ctx, match):
            key = node.name if node.op == "forall" else node.op
            if key not in mapping:
                continue
            new = self._resolve(mapping[key])
            ctx.put(node, _substituted(node, new, key))


def _substituted(node: Node, new, key: str) -> Node:
    if node.op != "forall":
        if not callable(new):
            raise RuleError(f"substitute: replacement for {key!r} is not callable")
        return node.with_attrs(fn=new, substituted=key)
    if not isinstance(new, Kernel):
        raise RuleError(f"substitute: replacement for kernel {key!r} is {type(new).__name__}, not a kernel")
    ndim = len(node.extent)
    if len(new.params) != len(node.kernel.params):
        raise RuleError(f"substitute: kernel {new.name!r} takes {len(new.params) - ndim} data "
                        f"arguments, {key!r} takes {len(node.kernel.params) - ndim}")
    access = new.access(ndim)
    modes = tuple(access.modes.get(p, "") for p in new.params[ndim:])
    return node.evolve(kernel=new, modes=modes).with_attrs(substituted=key)


# -- placement and compilation ------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Partition(Action):
    """Spread each matched launch over devices with shares.

    ``shares`` maps device ids or kinds to numbers or expressions (a kind's share is
    divided evenly among its devices); shares are normalised to sum to 1 and devices
    missing from the topology are left out. Without ``shares``: evenly over the devices
    (of ``kinds``, if given).
    """

    shares: tuple = ()
    kinds: tuple | None = None

    def __init__(self, shares: Mapping | None = None, kinds=None):
        shares = {k: _expr(v) for k, v in (shares or {}).items()}
        for key, value in shares.items():
            if not isinstance(value, Expr):
                check_share(key, value)
        object.__setattr__(self, "shares", tuple(shares.items()))
        object.__setattr__(self, "kinds", tuple(kinds) if kinds is not None else None)

    def names(self):
        return _names(*(v for _, v in self.shares))

    def plan(self, ctx, match) -> dict[str, float]:
        topo = ctx.topology
        devices = [d for d in topo.devices if self.kinds is None or d.kind in self.kinds]
        if not self.shares:
            weights = {d.id: 1.0 for d in devices}
        else:
            weights = {}
            for key, value in self.shares:
                share = check_share(key, ctx.evaluate(value, match), value if isinstance(value, Expr) else None)
                targets = [d for d in devices if d.id == key] or [d for d in devices if d.kind == key]
                for dev in targets:
                    weights[dev.id] = weights.get(dev.id, 0.0) + share / len(targets)
        total = sum(weights.values())
        return {k: round(w / total, 6) for k, w in weights.items() if w > 0} if total > 0 else {}

    def apply(self, ctx, match):
        shares = self.plan(ctx, match)
        if not shares:
            log.debug("partition: no device with a positive share; placement unchanged")
            return
        for node in _nodes(ctx, match, "forall"):
            ctx.put(node, node.with_attrs(devices=tuple(shares), shares=shares))


def compile_guard(kernel, device, ndim: int) -> tuple:
    """The VariantCache key of ``kernel`` compiled for ``device`` and a rank-``ndim`` launch."""
    return (("compile", kernel.name, kernel.source_hash), description(device), (("ndim", ndim),))


def compile_variant(cache, kernel, device, ndim: int):
    """The executable of ``kernel`` for ``device``, from the cache or the code repository."""
    operation, device_key, conditions = compile_guard(kernel, device, ndim)
    return cache.get_or_build(operation, device_key, conditions,
                              lambda: repository().executable(kernel, device, ndim))


@dataclasses.dataclass(frozen=True)
class Compile(Action):
    """Compile each matched kernel for the devices (of ``kinds``) it lacks an executable for.

    The executable comes from the code repository (compiled from the kernel's function
    object when none is stored) and is kept in the interpreter's variant cache; the node
    records the devices it is compiled for in its ``compiled`` attribute.
    """

    kinds: tuple | None = None

    def __init__(self, kinds=None):
        object.__setattr__(self, "kinds", tuple(kinds) if kinds is not None else None)

    def apply(self, ctx, match):
        targets = [d for d in ctx.topology.devices if self.kinds is None or d.kind in self.kinds]
        for node in _nodes(ctx, match):
            if node.kernel is None:
                continue
            ndim = len(node.extent)
            for dev in targets:
                compile_variant(ctx.cache, node.kernel, dev, ndim)
            done = tuple(sorted(set(node.attrs.get("compiled", ())) | {d.id for d in targets}))
            ctx.put(node, node.with_attrs(compiled=done))


# -- variables and rules ------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Set(Action):
    """Set a variable to a value or an expression's value (rules reading it re-run);
    a float value must be finite, when the action is made and when it runs."""

    var: str
    value: object = None

    def __post_init__(self):
        if not isinstance(self.var, str) or not self.var:
            raise RuleError(f"set needs a variable name; got {self.var!r}")
        if _non_finite(self.value):
            raise RuleError(f"set {self.var!r}: value must be a finite number, a boolean or an expression; "
                            f"got {self.value!r}")
        object.__setattr__(self, "value", _expr(self.value))

    def names(self):
        return _names(self.value)

    def apply(self, ctx, match):
        value = ctx.evaluate(self.value, match)
        if _non_finite(value):  # an expression that overflowed ('x * 1e308'), or read a nan
            raise RuleError(f"{_origin(self.value)}set {self.var!r}: {self.value} gave {value!r}, "
                            f"not a finite number")
        ctx.variables[self.var] = value


def _non_finite(value) -> bool:
    """Whether ``value`` is a float (NumPy's too) that is nan or infinite: a variable
    holding nan never equals itself, so the rules reading it would never settle."""
    return isinstance(value, (float, np.floating)) and not math.isfinite(value)


@dataclasses.dataclass(frozen=True)
class AddRule(Action):
    """Add a rule to the active rule set (nothing when one of that name is there)."""

    rule: object

    def apply(self, ctx, match):
        if self.rule.name not in ctx.rules:
            ctx.rules.add(self.rule)


@dataclasses.dataclass(frozen=True)
class RemoveRule(Action):
    """Remove a rule from the active rule set (nothing when it is not there)."""

    name: str

    def apply(self, ctx, match):
        if self.name in ctx.rules:
            ctx.rules.remove(self.name)


@dataclasses.dataclass(frozen=True)
class ChangeRule(Action):
    """Change a rule of the active rule set: its priority, enabled flag, predicate or actions."""

    name: str
    changes: tuple = ()

    def __init__(self, name: str, **changes):
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "changes", tuple(changes.items()))

    def apply(self, ctx, match):
        rule = ctx.rules.get(self.name)
        if rule is None:
            raise RuleError(f"change_rule: no rule named {self.name!r}")
        new = rule.replace(**dict(self.changes))
        if new != rule:
            ctx.rules.replace(new)


@dataclasses.dataclass(frozen=True)
class Replace(Action):
    """A Python callback ``(ctx, match) -> None | Node | [Node]``: None means no rewrite.

    Callbacks run when the interpreter evaluates (graph, topology, rule set or events
    changed, or a variable the rule's expressions read); a callback that depends on
    other variables should read them in a condition (an expression or a callable).
    """

    fn: Callable

    def apply(self, ctx, match):
        result = self.fn(ctx, match)
        if result is None:
            return
        new = [result] if isinstance(result, Node) else list(result) if isinstance(result, (list, tuple)) else None
        if new is None or not all(isinstance(n, Node) for n in new):
            raise RuleError(f"rule callback {getattr(self.fn, '__name__', self.fn)!r} returned "
                            f"{result!r}; expected None, a Node or a list of Nodes")
        ctx.replace(_nodes(ctx, match), new)
