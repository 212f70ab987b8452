"""The interpreter: evaluates rules against the DIR, the machine and the feedback.

At a safe point (between runs or iterations of a program) the interpreter takes the
monitor's pending events and variables, and evaluates the rules in rounds: in each
round every enabled rule (highest priority first, then rules attached to nodes) is
matched against the current working version, and its actions run on each binding for
which its predicate holds. A round that changes nothing (graph, variables, rule set)
ends the evaluation; the changed graph becomes a new DIR version. Rounds are bounded:
rules that keep re-triggering each other raise RuleError naming them.

A firing is a transaction: when an action raises, its changes are undone, the rule is
disabled (``rule.error`` says why) and the error is logged; the program goes on with
what the other rules produced, or with the previous version.

An interpreter may have *children*: local interpreters with their own monitor and rule
set that see only the nodes placed on them (``place`` attribute), as in a hierarchy of
a central interpreter and one per node (they run after their parent, on its result).
"""
from __future__ import annotations

import logging
from typing import Callable

from ..errors import RuleError
from .actions import compile_guard
from .cache import VariantCache
from .expressions import Expr, UnknownName
from .graph import Node, freeze, replace_nodes
from .monitor import Monitor
from .patterns import Match, dtypes, work_size
from .ruleset import RuleSet

log = logging.getLogger("hetflow.ir")


class RuleContext:
    """What rules see and change during one evaluation."""

    def __init__(self, nodes, *, topology, variables: dict, rules: RuleSet, events=(),
                 cache: VariantCache, outputs=frozenset(), new_id: Callable[[], int], scope=None):
        self.nodes = tuple(nodes)
        self.topology = topology
        self.variables = variables
        self.rules = rules
        self.events = tuple(events)
        self.cache = cache
        self.outputs = frozenset(outputs)
        self.new_id = new_id
        self.scope = scope
        self._moved: dict[int, Node] = {}
        self._moves: list[tuple] = []   # (key, value before) of each _moved change, in order
        self._keep: list[Node] = []
        self._index = ((), {})          # (nodes, id(node) -> position) of the last nodes asked
        self._swapped: list[int] = []   # positions put() changed, in order
        self._rewrites = 0              # replace() calls: nodes reordered or cut

    # -- graph ---------------------------------------------------------------------------
    def visible(self) -> tuple:
        """The nodes this interpreter's rules are matched against (its place's, if scoped)."""
        if self.scope is None:
            return self.nodes
        return tuple(n for n in self.nodes if n.attrs.get("place") == self.scope)

    def _positions(self) -> dict[int, int]:
        # Kept with the tuple it indexes: a split into thousands of pieces asks for each.
        if self._index[0] is not self.nodes:
            self._index = (self.nodes, {id(n): k for k, n in enumerate(self.nodes)})
        return self._index[1]

    def present(self, node: Node) -> bool:
        return id(node) in self._positions()

    def current(self, node: Node) -> Node | None:
        """What ``node`` became after earlier actions swapped it (None: it was removed)."""
        while id(node) in self._moved:
            node = self._moved[id(node)]
        return node if self.present(node) else None

    def put(self, old: Node, new: Node) -> None:
        """Swap one node for another in place (same position in the order)."""
        positions = self._positions()
        k = positions.pop(id(old), None)
        if k is not None:
            self.nodes = self.nodes[:k] + (new,) + self.nodes[k + 1:]
            positions[id(new)] = k
            self._index = (self.nodes, positions)
            self._swapped.append(k)
        self._moves.append((id(old), self._moved.get(id(old))))
        self._moved[id(old)] = new
        self._keep.append(old)  # ids in _moved must stay unique while the evaluation lasts

    def replace(self, old: list, new: list) -> None:
        """Replace nodes by others, keeping the execution order valid."""
        self.nodes = replace_nodes(self.nodes, {n.id for n in old}, new)
        self._rewrites += 1

    # -- expressions ---------------------------------------------------------------------
    def evaluate(self, value, match: Match | None = None):
        """An action's value: expressions evaluated against this context, constants as they are."""
        return value.evaluate(Scope(self, match)) if isinstance(value, Expr) else value

    # -- transactions --------------------------------------------------------------------
    def state(self) -> tuple:
        """What :meth:`changed` compares with: cheap to take before every firing."""
        return (self.nodes, len(self._swapped), self._rewrites, freeze(self.variables), self.rules.revision)

    def changed(self, before: tuple) -> bool:
        """Whether the graph, the variables or the rule set differ from ``before``: only
        the nodes swapped since are compared, unless nodes were replaced (each firing
        on one of many pieces would otherwise compare them all)."""
        nodes, swapped, rewrites, variables, revision = before
        if revision != self.rules.revision or variables != freeze(self.variables):
            return True
        if self.nodes is nodes:
            return False
        if rewrites != self._rewrites:
            return tuple(n.signature() for n in self.nodes) != tuple(n.signature() for n in nodes)
        return any(nodes[k].signature() != self.nodes[k].signature() for k in set(self._swapped[swapped:]))

    def save(self) -> tuple:
        return (self.nodes, dict(self.variables), self.rules.snapshot(), len(self._moves))

    def restore(self, saved: tuple) -> None:
        self.nodes, variables, rules, moves = saved
        for key, before in reversed(self._moves[moves:]):
            if before is None:
                del self._moved[key]
            else:
                self._moved[key] = before
        del self._moves[moves:]
        self.variables.clear()
        self.variables.update(variables)
        self.rules.restore(rules)


class Scope:
    """What an expression sees for one binding: the variables, ``node.<field>`` of the
    matched node, ``chain.length``, and the context's functions."""

    __slots__ = ("ctx", "match", "node")

    def __init__(self, ctx: RuleContext, match: Match | None):
        self.ctx, self.match = ctx, match
        self.node = match.node if match is not None else None

    def lookup(self, name: str):
        if self.node is not None and name.startswith("node."):
            return _node_variable(self.node, name[5:])
        if name == "chain.length" and self.match is not None:
            return len(self.match.nodes)
        return self.ctx.variables[name]

    def call(self, name: str, args: list):
        return _FUNCTIONS[name](self, *args)

    def count(self, kind) -> int:
        if not isinstance(kind, str):
            raise TypeError(f"count() takes a device kind, not {kind!r}")
        return self.ctx.topology.count(kind)

    def defined(self, name) -> bool:
        if not isinstance(name, str):
            raise TypeError(f"defined() takes a variable name, not {name!r}")
        try:
            self.lookup(name)
        except KeyError:
            return False
        return True

    def happened(self, kind) -> bool:
        return any(e.kind == kind for e in self.ctx.events)

    def compiled(self, target) -> bool:
        node, ctx = self.node, self.ctx
        if node is None or node.kernel is None:
            raise RuleError("compiled() needs a rule matched against a kernel launch")
        devs = [d for d in ctx.topology.devices if target in (d.id, d.kind)]
        ndim = len(node.extent)
        return bool(devs) and all(compile_guard(node.kernel, d, ndim) in ctx.cache for d in devs)


_FUNCTIONS = {"count": Scope.count, "defined": Scope.defined, "happened": Scope.happened,
              "compiled": Scope.compiled}


def _node_variable(node: Node, field: str):
    values = {
        "id": lambda: node.id,
        "op": lambda: node.op,
        "kernel": lambda: node.name,
        "size": lambda: work_size(node),
        "ndim": lambda: len(node.extent or ()),
        "dtype": lambda: (dtypes(node) or ("",))[0],
        "place": lambda: node.attrs.get("place", -1),
        "pieces": lambda: node.attrs.get("piece", (0, 1))[1],
        "devices": lambda: len(node.attrs.get("devices", ())),
        "nodes": lambda: node.attrs.get("nodes", 0),
    }
    if field not in values:
        raise KeyError(f"node.{field}")
    return values[field]()


class Interpreter:
    """Evaluates rule sets against DIR versions under a monitor's feedback."""

    def __init__(self, monitor: Monitor | None = None, *, rules: RuleSet | None = None,
                 cache: VariantCache | None = None, max_rounds: int = 16, place=None,
                 children=()):
        if max_rounds < 1:
            raise RuleError(f"max_rounds must be >= 1; got {max_rounds}")
        self.monitor = monitor if monitor is not None else Monitor()
        self.rules = rules
        self.cache = cache if cache is not None else VariantCache()
        self.max_rounds = max_rounds
        self.place = place
        self.children: list[Interpreter] = []
        for child in children:
            self.add_child(child)
        self._seen = None
        self._seen_revision = -1
        self._seen_names = None
        self._warned: set = set()

    @property
    def topology(self):
        return self.monitor.topology

    def add_child(self, child: "Interpreter") -> "Interpreter":
        """A local interpreter for the nodes placed on ``child.place``."""
        if child.place is None or child.rules is None:
            raise RuleError("a local interpreter needs place= and its own rules=")
        self.children.append(child)
        return child

    # -- when to evaluate -----------------------------------------------------------------
    def _key(self, nodes, rules) -> tuple:
        # Rule sets and nodes compare by identity: the same objects until replaced or rewritten.
        return (rules, rules.revision, self.topology.revision, tuple(nodes))

    def _names(self, nodes, rules):
        found = set()
        for rule in [*rules, *(r for n in nodes for r in n.rules)]:
            names = rule.names()
            if names is None:
                return None
            found |= names
        return found

    def due(self, nodes, rules: RuleSet | None = None) -> bool:
        """Whether anything the rules depend on changed since the last evaluation."""
        rules = rules if rules is not None else self.rules
        monitor = self.monitor
        if self._seen != self._key(nodes, rules) or monitor.has_pending():
            return True
        revision = monitor.revision
        if revision != self._seen_revision:
            if monitor.changed_since(self._seen_revision, self._seen_names):
                return True
            self._seen_revision = revision   # what changed is not read by the rules
        return any(child.due(nodes) for child in self.children)

    # -- evaluation -----------------------------------------------------------------------
    def adjust(self, nodes, rules: RuleSet | None = None, *, new_id: Callable[[], int],
               outputs=frozenset()) -> tuple[tuple, list[str], tuple] | None:
        """Evaluate the rules on ``nodes``; (new nodes, rules that changed them, events)
        when the graph changed, else None."""
        rules = rules if rules is not None else self.rules
        events = self.monitor.drain()
        variables = self.monitor.snapshot()
        ctx = RuleContext(nodes, topology=self.topology, variables=dict(variables), rules=rules,
                      events=events, cache=self.cache, outputs=outputs, new_id=new_id, scope=self.place)
        saved_rules = rules.snapshot()
        try:
            fired = self._fixpoint(ctx)
        except RuleError:
            rules.restore(saved_rules)
            raise
        for name, value in ctx.variables.items():
            # A value the rules left alone is not set again: a nan the monitor holds never
            # equals itself, and setting it at every safe point would make the next one due.
            if name not in variables or (value is not variables[name] and freeze(variables[name]) != freeze(value)):
                self.monitor.set(name, value)
        result_nodes = ctx.nodes
        for child in self.children:
            adjusted = child.adjust(result_nodes, new_id=new_id, outputs=outputs)
            if adjusted is not None:
                result_nodes = adjusted[0]
                fired += [f"{name}@{child.place}" for name in adjusted[1]]
                events += adjusted[2]
        if tuple(n.signature() for n in result_nodes) == tuple(n.signature() for n in nodes):
            self.mark_seen(nodes, rules)
            return None
        self.mark_seen(result_nodes, rules)
        return result_nodes, fired, events

    def mark_seen(self, nodes, rules=None) -> None:
        """Record that the rules were evaluated on ``nodes`` under the current feedback."""
        rules = rules if rules is not None else self.rules
        self._seen = self._key(nodes, rules)
        self._seen_revision = self.monitor.revision
        self._seen_names = self._names(nodes, rules)   # what due() watches until the next evaluation
        for child in self.children:
            child.mark_seen(nodes)

    def _candidates(self, ctx):
        for rule in list(ctx.rules):
            yield rule, None
        for node in ctx.visible():
            for rule in node.rules:
                yield rule, node

    def _fixpoint(self, ctx: RuleContext) -> list[str]:
        fired: list[str] = []
        for _ in range(self.max_rounds):
            changed = []
            for rule, anchor in self._candidates(ctx):
                if rule.enabled and (anchor is None or ctx.present(anchor)) and self._apply(ctx, rule, anchor):
                    changed.append(rule.name)
            if not changed:
                return fired
            fired.extend(n for n in changed if n not in fired)
        names = ", ".join(dict.fromkeys(changed))
        raise RuleError(f"rules kept re-triggering each other for {self.max_rounds} rounds "
                        f"without settling: {names}")

    def _apply(self, ctx: RuleContext, rule, anchor) -> bool:
        """Fire ``rule`` on each of its bindings; True when it changed anything."""
        changed = False
        try:
            matches = rule.matches(ctx, anchor)
        except Exception as exc:  # a broken pattern callback
            self._fail(rule, exc)
            return False
        for match in matches:
            if not all(ctx.present(n) for n in match.nodes):
                continue  # an earlier firing rewrote these nodes
            saved = ctx.save()
            try:
                if not rule.holds(ctx, match):  # (a predicate changes nothing)
                    continue
                before = ctx.state()
                rule.fire(ctx, match)
            except UnknownName as exc:
                ctx.restore(saved)
                self._unknown(rule, exc)
                continue
            except Exception as exc:  # any action error: undo it, disable the rule, go on
                ctx.restore(saved)
                self._fail(rule, exc)
                return changed
            if ctx.changed(before):
                changed = True
                log.info("rule %s changed the DIR (%s)", rule.name, _where(match))
        return changed

    def _fail(self, rule, exc: Exception) -> None:
        rule.disable(f"{type(exc).__name__}: {exc}")
        log.error("rule %s raised and was disabled; the DIR stays as it was: %s: %s",
                  rule.name, type(exc).__name__, exc)

    def _unknown(self, rule, exc: UnknownName) -> None:
        # A variable nobody has set yet: the predicate does not hold (said once per name).
        if (rule.name, exc.name) not in self._warned:
            self._warned.add((rule.name, exc.name))
            log.warning("rule %s reads %s, which is not set; the rule does not fire until it is",
                        rule.name, exc.name)


def _where(match: Match) -> str:
    return "whole graph" if not match.nodes else "nodes " + ", ".join(f"#{n.id}" for n in match.nodes)
